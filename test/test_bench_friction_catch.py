"""benchmarks/bench_friction_catch.py: its harness catches what it should on the nominal robot, the held controller
holds its torque, the plan-swap keeps the config's LQR, and bad arguments are refused."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from _bench_helpers import load_benchmark


def test_the_held_lqr_holds_its_torque_and_catches_near_the_top(capsys):
    bench = load_benchmark("bench_friction_catch")
    held = bench.HeldLqr(np.array([0.0, 0.0, 1.0, 0.0]), np.zeros(4), hold=3, limit=6.0)
    torques = [held.step(np.array([0.0, 0.0, v, 0.0]), 0.0)[1] for v in (1.0, 2.0, 3.0, 4.0)]
    assert torques == [-1.0, -1.0, -1.0, -4.0]                     # computed every 3rd step, held in between
    assert held.step(np.array([0.0, 0.0, 0.0, 0.0]), 0.0)[0] == 0.0   # the passive shoulder: 0
    assert bench.main(["--held-lqr", "--samples", "2", "--levels", "0.5"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| the") or "discrete" in line]
    assert len(rows) == 3 and all(row.endswith("| 1.00 |") for row in rows), rows


def test_the_plan_swap_keeps_the_config_lqr_and_plans_on_the_plant_given():
    bench = load_benchmark("bench_friction_catch")
    from dataclasses import replace

    from mcpilco_core.config import load_robot_config
    from mcpilco_core.control import build_controller
    from mcpilco_core.plant import DoublePendulum

    base = load_robot_config(bench.DITHER)
    ref = build_controller(base)
    config = replace(base, catch=replace(base.catch, enabled=True, lqr_level=0.0))
    plant = DoublePendulum(base.plant)
    swapped = bench.PlannedOnPlant(config, ref.design, ref.rho, plant)
    assert swapped.rho == ref.rho and np.array_equal(swapped.design.K, ref.design.K)
    assert swapped._catch.planner.plant is plant


def test_bad_arguments_are_refused():
    bench = load_benchmark("bench_friction_catch")
    assert bench.start_spec("swing-up:10") == ("swing-up", 10) and bench.start_spec("100") == ("100", 800)
    with pytest.raises(argparse.ArgumentTypeError):
        bench.start_spec("lots:10")
    with pytest.raises(SystemExit):
        bench.main([])
