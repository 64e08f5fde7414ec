"""benchmarks/bench_policy_selection.py: a variant is the config with its assignments, validated as the file would be,
and the timed controller steps the supervisor as the controller node does (command, then the decision's share)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _bench_helpers import load_benchmark

from mcpilco_core.config import ConfigError
from mcpilco_core.control import build_controller
from mcpilco_core.policy import load_policy
from mcpilco_core.simulation import drive, load_robot_profile

ROOT = Path(__file__).resolve().parents[1]




def test_a_variant_changes_only_its_assignments_and_bad_ones_are_refused():
    bench = load_benchmark("bench_policy_selection")
    config = bench.variant(ROOT / "config" / "acrobot_select.yaml", "selection.step=0.002,selection.lead=0.04")
    assert (config.selection.step, config.selection.lead, config.selection.horizon) == (0.002, 0.04, 2.5)
    banks = (ROOT / "policies" / "acrobot_bank", ROOT / "policies" / "acrobot_bank_mirrored")
    assert config.selection.bank == ":".join(str(bank.resolve()) for bank in banks)
    with pytest.raises(ConfigError, match=r"selection\.lead"):
        bench.variant(ROOT / "config" / "acrobot_select.yaml", "selection.lead=0.003")


def test_the_timed_controller_steps_as_the_node_does_and_keeps_each_steps_time():
    bench = load_benchmark("bench_policy_selection")
    config = bench.variant(ROOT / "config" / "acrobot_select.yaml", "selection.horizon=0.5")
    policy = load_policy(ROOT / "policies" / "acrobot.npz")
    timed = bench.Timed(build_controller(config, policy))
    plain = build_controller(config, policy)
    steps = 150
    a = drive(load_robot_profile("nominal").robot(config, 0), timed, steps)
    b = drive(load_robot_profile("nominal").robot(config, 0), plain, steps)
    np.testing.assert_array_equal(a.u, b.u)               # spreading the work changes nothing
    assert len(timed.times) == steps and timed.supervisor.selection.decisions >= 1
