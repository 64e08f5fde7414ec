"""benchmarks/bench_dither_phase.py: the three robot runs from a post-window state and the model's two predictions,
and the summary's arithmetic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _bench_helpers import load_benchmark

from mcpilco_core.config import load_robot_config
from mcpilco_core.policy import load_policy
from mcpilco_core.simulation import load_robot_profile

ROOT = Path(__file__).resolve().parents[1]


def test_the_summary_scores_the_models_pick_with_the_robot_runs():
    bench = load_benchmark("bench_dither_phase")
    rows = np.array([[1.0, 2.0, 1.5, 0.5, 0.9],      # the model picks shifted (0.9 > 0.5 + 0.1): 2.0
                     [1.0, 0.0, 0.5, 0.5, 0.55]])    # within the margin: configured, 1.0
    result = bench.summary(rows, margin=0.1)
    assert result["configured"] == 1.0 and result["shifted"] == 1.0
    assert result["better phase"] == 1.5 and result["better of two noise draws"] == 1.25
    assert result["the model's pick"] == 1.5 and result["picked shifted"] == 0.5


def test_one_disturbance_measured_on_the_design_robot():
    bench = load_benchmark("bench_dither_phase")
    config = load_robot_config(ROOT / "config" / "acrobot_dither_select.yaml")
    policy = load_policy(ROOT / "policies" / "acrobot_hardware_proxy.npz")
    profile = load_robot_profile(ROOT / "config" / "design_robots" / "acrobot_exploration_identified.yaml")
    rows = bench.measure(config, policy, profile, [200], windows=1)
    assert rows.shape == (1, 5)
    (recovery,) = bench.disturbances(bench.with_selection(config, 1), policy, profile, 200, windows=1)
    x0, steps = np.array(recovery.handover_state), int(round(recovery.length / 0.002))
    assert 0.0 <= rows[0, :3].min() and rows[0, :3].max() <= recovery.length
    robot_config = bench.with_selection(config, 1)
    assert rows[0, 0] == bench.time_above(robot_config, policy, profile, 20000, x0, steps, 0.0)   # reproducible
    assert rows[0, 3:].tolist() == pytest.approx(bench.predicted(bench.with_selection(config, 2), policy, x0))
