"""benchmarks/bench_cost_alignment.py: the particle cost on an exact plant against the protocol's score."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from _bench_helpers import load_benchmark

from mcpilco_core.config import load_robot_config
from mcpilco_core.plant import DoublePendulum
from mcpilco_core.policy import load_policy, save_policy

ROOT = Path(__file__).resolve().parents[1]


def test_the_rollout_holds_the_torque_for_the_policy_period_on_the_plant():
    """The rollout is the plant integrated at 2 ms with the policy's torque held for its period, on the actuated
    joint only: with a zero policy, the plant's own free motion step by step."""
    bench = load_benchmark("bench_cost_alignment")
    robot = load_robot_config(ROOT / "config" / "pendubot.yaml")
    policy = load_policy(ROOT / "policies" / "pendubot.npz", robot="pendubot", torque_limit=robot.torque_limit)
    zero = replace(policy, weights=np.zeros_like(policy.weights))
    plant = DoublePendulum(robot.plant)
    x0 = np.array([[0.3, -0.2, 0.5, 1.0], [2.0, 0.1, -1.0, 0.0]])
    states = bench.plant_rollout(plant, zero, robot.actuated_joint, x0, 0.04)
    assert states.shape == (3, 2, 4)
    x = x0.copy()
    for _ in range(int(round(0.04 / 0.002))):
        x = plant.rk4_step(x, np.zeros((2, 2)), 0.002)
    np.testing.assert_allclose(states[-1], x, atol=1e-12)
    moved = bench.plant_rollout(plant, policy, robot.actuated_joint, x0, 0.04)
    assert not np.allclose(moved[-1], x)                        # the policy's torque acts


def test_the_supervised_rollout_is_the_protocols_controller_on_the_robot():
    """--supervised: each start is one run of the whole controller on the simulated robot (the same as
    learner.run_on_robot with a fresh controller), sampled every policy period; near the top the LQR holds it,
    where the policy alone on the plant lets it fall."""
    from mcpilco_core.control import build_controller
    from mcpilco_core.learning.learner import run_on_robot
    from mcpilco_core.simulation import load_robot_profile

    bench = load_benchmark("bench_cost_alignment")
    robot = load_robot_config(ROOT / "config" / "pendubot.yaml")
    policy = load_policy(ROOT / "policies" / "pendubot.npz", robot="pendubot", torque_limit=robot.torque_limit)
    profile = load_robot_profile("hardware_proxy_sensors")    # delay and motor lag on the config's own plant
    x0 = np.array([[np.pi - 0.05, 0.04, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0]])
    states = bench.supervised_rollout(robot, policy, profile, x0, 1.0)
    assert states.shape == (51, 2, 4)
    alone = run_on_robot(robot, build_controller(robot, policy), x0[1], 1.0, profile, seed=1)
    np.testing.assert_array_equal(states[:, 1], np.asarray(alone.x)[::10][:51])
    assert abs(states[-1, 0, 0] - np.pi) < 0.1            # caught and held at the top by the LQR


@pytest.mark.timeout(240)
def test_a_policy_that_swings_up_costs_less_and_scores_more_than_one_that_does_nothing(tmp_path, capsys):
    """End to end on the pendubot: the shipped policy against the same policy with zero weights (no torque). The
    shipped one must cost less on the plant and score more in the protocol, so the rank correlation is +1; the
    table, the statistics and the JSON say so."""
    bench = load_benchmark("bench_cost_alignment")
    shipped = ROOT / "policies" / "pendubot.npz"
    policy = load_policy(shipped, robot="pendubot")
    zero = save_policy(replace(policy, weights=np.zeros_like(policy.weights)), tmp_path / "zero.npz")
    out = tmp_path / "alignment.json"
    assert bench.main(["--robot", "pendubot", "--policies", str(shipped), str(zero), "--seeds", "3",
                       "--pool-seeds", "1000", "--starts", "24", "--horizon", "1.0", "--height-weight", "1",
                       "--catch-level", "4", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| policy | particle cost | protocol score |" in printed and "Spearman(-cost, score) +1.00" in printed
    result = json.loads(out.read_text())
    by_name = {Path(r["policy"]).name: r for r in result["rows"]}
    assert by_name["pendubot.npz"]["particle_cost"] < by_name["zero.npz"]["particle_cost"]
    assert by_name["pendubot.npz"]["score"] > 0.5 > by_name["zero.npz"]["score"]
    assert result["spearman_score_vs_minus_cost"] == 1.0 and result["score_range"] > 0.5


def test_fewer_than_two_policies_is_refused(capsys):
    bench = load_benchmark("bench_cost_alignment")
    with pytest.raises(SystemExit):
        bench.main(["--robot", "pendubot", "--policies", str(ROOT / "policies" / "pendubot.npz")])
    assert "at least two" in capsys.readouterr().err
