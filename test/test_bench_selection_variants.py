"""benchmarks/bench_selection_variants.py: its plain variant is the shipped selection, and each variant changes only
what it says."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from _bench_helpers import load_benchmark

from mcpilco_core.config import load_robot_config
from mcpilco_core.evaluation import evaluate_seed
from mcpilco_core.policy import load_policy

ROOT = Path(__file__).resolve().parents[1]
STATE = np.array([2.6, 0.4, 2.0, -3.0])     # rad, rad/s: on the way up, the policy in charge


def decision_values(bench, config, variant) -> list[float]:
    supervisor = bench.controller(config, variant)
    supervisor.step(STATE, 1.0)
    selection = supervisor.selection
    selection.start(supervisor.capture_state(), STATE, 1.0, supervisor._candidates, (0, 0.0))
    selection.finish()
    return selection.last_values


def test_the_variants_parse_and_bad_ones_are_refused():
    bench = load_benchmark("bench_selection_variants")
    assert bench.parse_variant("plain") == (0, 0.0)
    assert bench.parse_variant("delay:2") == (2, 0.0)
    assert bench.parse_variant("end:0.5") == (0, 0.5)
    for bad in ("delay:x", "end:", "plain:1", "lead:2"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_variant(bad)


def test_plain_is_the_shipped_selection_and_each_variant_changes_only_its_part():
    bench = load_benchmark("bench_selection_variants")
    config = load_robot_config(bench.CONFIG)
    design = str(bench.DESIGN_ROBOT)
    shipped = evaluate_seed(bench.build_controller(config, load_policy(str(bench.POLICY), robot="acrobot")), config,
                            200, duration=3.0, keep_trajectory=False, profile=design)
    assert bench.score((str(bench.CONFIG), 0.0, (0, 0.0), 200, design, 3.0, str(bench.POLICY))) == shipped.score
    plain = np.array(decision_values(bench, config, (0, 0.0)))
    reference = bench.build_controller(config, load_policy(str(bench.POLICY), robot="acrobot"))
    reference.step(STATE, 1.0)
    reference.selection.start(reference.capture_state(), STATE, 1.0, reference._candidates, (0, 0.0))
    reference.selection.finish()
    np.testing.assert_array_equal(plain, reference.selection.last_values)
    bonus = np.array(decision_values(bench, config, (0, 0.5))) - plain
    assert np.all(np.isclose(bonus, 0.0) | np.isclose(bonus, 0.5))
    assert np.isclose(bonus, 0.5).any()                   # from this state some candidates end caught
    assert not np.array_equal(np.array(decision_values(bench, config, (1, 0.0))), plain)   # the delay acts
