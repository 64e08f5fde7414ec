"""The evaluation protocol (RealAIGym simulation_v3) and its CLI."""

import json
import math

import numpy as np
import pytest

from mcpilco_core.evaluation import (
    DT,
    ControllerSpec,
    DisturbanceSchedule,
    ResetPerturbation,
    ResetPid,
    ZeroController,
    evaluate_seed,
    evaluate_seeds,
    score_trajectory,
    uptime,
)
from mcpilco_core.plant import GOAL
from mcpilco_ros import cli


def test_schedule_matches_numpy_global_rng():
    for seed in (0, 1, 42):
        np.random.seed(seed)
        table = np.random.rand(151, 4) * 2 * np.pi - np.pi
        times = np.linspace(3.75, 56.25, 15) + 2 * (np.random.rand(15) - 0.5)
        schedule = DisturbanceSchedule.from_seed(seed)
        np.testing.assert_array_equal(schedule.targets, table[:15, :2])
        np.testing.assert_array_equal(schedule.times, times)
    assert not np.array_equal(DisturbanceSchedule.from_seed(0).times, DisturbanceSchedule.from_seed(1).times)


def test_pid_history_is_never_cleared():
    pid = ResetPid()
    target = np.array([0.3, -0.3])
    first = pid.torque(np.zeros(2), target)
    np.testing.assert_allclose(first, 10.0 * target + 0.1 * target * 0.001)  # no derivative yet
    pid.torque(np.zeros(2), target)
    # third call: the derivative acts; a jump in the error saturates at 6 N m
    jump = pid.torque(np.zeros(2), np.array([3.0, -3.0]))
    np.testing.assert_allclose(jump, [6.0, -6.0])
    pid.torque(np.array([0.29, -0.29]), target)
    small = pid.torque(np.array([0.29, -0.29]), target)
    assert np.all(np.abs(small) < 6.0)


def test_reset_windows_follow_the_schedule(pendubot_plant):
    """Windows on RealAIGym's accumulated clock (t += dt): from the first step with t >= the reset time, for as
    long as t - t_start <= 0.2 s: 101 or 100 steps as the roundoff falls, exactly."""
    for seed in (0, 3):
        schedule = DisturbanceSchedule.from_seed(seed)
        perturbation = ResetPerturbation(schedule, pendubot_plant, DT)
        clock, now = [], 0.0
        for _ in range(30000):
            clock.append(now)
            now += DT
        expected = []
        for time in schedule.times:
            start = next(k for k, c in enumerate(clock) if c >= time)
            steps = sum(1 for c in clock[start:start + 110] if c - clock[start] <= 0.2)
            expected.append([start, steps])
        active = [k for k in range(30000) if perturbation.active_reset(k) is not None]
        seen = [[round(a / DT), round((b - a) / DT)] for a, b in perturbation.windows]
        assert seen == expected and len(active) == sum(n for _, n in expected)
        assert {n for _, n in expected} == {100, 101}


def test_reset_torque_includes_gravity_compensation(pendubot_plant):
    schedule = DisturbanceSchedule(times=np.array([0.0]), targets=np.array([[0.5, -0.2]]))
    perturbation = ResetPerturbation(schedule, pendubot_plant, DT)
    x = (0.5, -0.2, 0.0, 0.0)  # already at the target: only integral (0) and gravity remain
    u = perturbation(0, 0.0, x)
    np.testing.assert_allclose(u, -pendubot_plant.gravity_vector(np.array(x[:2])))
    assert perturbation(1, 100.0, x) is not None  # still inside its 0.2 s window (timer-based)


def test_uptime_on_constructed_trajectories(pendubot_plant):
    t = np.arange(30001) * DT
    upright = np.tile(GOAL, (30001, 1))
    hanging = np.zeros((30001, 4))
    assert score_trajectory(t, upright, pendubot_plant) == pytest.approx(1.0)
    assert score_trajectory(t, hanging, pendubot_plant) == 0.0
    half = hanging.copy()
    half[:15000] = GOAL
    assert uptime(t, half, pendubot_plant) == pytest.approx(30.0)
    # exactly on the line is not "strictly above": cos(q1) chosen so that the height is 0.45 m exactly
    on_line = np.zeros((30001, 4))
    on_line[:, 0] = math.acos(-0.45 / 0.5)
    height = pendubot_plant.end_effector_height(on_line[0])
    assert score_trajectory(t, on_line, pendubot_plant) == (1.0 if height > 0.45 else 0.0)


@pytest.mark.timeout(60)
def test_evaluate_seed_is_deterministic_and_passive_joint_zero(pendubot_config, acrobot_config):
    for config in (pendubot_config, acrobot_config):
        a = evaluate_seed(ZeroController(), config, seed=5, duration=12.0)
        b = evaluate_seed(ZeroController(), config, seed=5, duration=12.0)
        np.testing.assert_array_equal(a.trajectory.x, b.trajectory.x)
        traj = a.trajectory
        assert a.passive_max_torque == 0.0 and a.passive_max_applied_torque == 0.0
        resets = traj.mode == 5
        assert 0 < resets.sum() <= 3 * 101
        assert np.all(np.abs(traj.u[resets]) <= 6.0)
        assert np.all(traj.u[~resets] == 0.0)
        # the PID disturbs the pendulum: it moves after the first window
        assert np.max(np.abs(traj.x[:, 2:])) > 1.0


@pytest.mark.timeout(120)
def test_evaluate_lqr_full_protocol(repo):
    results = evaluate_seeds(ControllerSpec(str(repo / "config" / "acrobot.yaml"), "lqr"), [0, 1], jobs=2)
    assert [r.seed for r in results] == [0, 1]
    for r in results:
        assert 0.0 <= r.score <= 1.0 and r.passive_max_torque == 0.0
        assert len(r.windows) == 15
        assert r.mode_fractions["reset"] == pytest.approx(15 * 101 / 30000, abs=16 / 30000)


@pytest.mark.timeout(120)
def test_cli_evaluate_writes_json_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    code = cli.main(["evaluate", "--robot", "acrobot", "--controller", "lqr", "--seeds", "0", "1",
                     "--json", str(out_json), "--plot", str(out_png)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "seed    0" in printed and "seed    1" in printed and "+-" in printed
    data = json.loads(out_json.read_text())
    assert [s["seed"] for s in data["seeds"]] == [0, 1]
    for entry in data["seeds"]:
        assert {"score", "uptime", "passive_max_torque"} <= set(entry) and entry["passive_max_torque"] == 0.0
    assert out_png.stat().st_size > 10_000 and out_png.read_bytes()[:4] == b"\x89PNG"


def test_cli_errors_are_clear(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("robot: triplebot\n")
    assert cli.main(["evaluate", "--robot", "pendubot", "--config", str(bad)]) == 2
    assert "field 'robot'" in capsys.readouterr().err
    assert cli.main(["evaluate", "--robot", "pendubot", "--controller", str(tmp_path / "none.npz")]) == 2
    assert "no such policy file" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_cli_evaluate_robot_profile(tmp_path, capsys, pendubot_config):
    out_json = tmp_path / "r.json"
    code = cli.main(["evaluate", "--robot", "pendubot", "--controller", "zero", "--seeds", "2",
                     "--robot-profile", "hardware_proxy", "--json", str(out_json)])
    assert code == 0 and "robot profile hardware_proxy" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["robot_profile"] == "hardware_proxy" and data["seeds"][0]["robot_profile"] == "hardware_proxy"
    # the same numbers as the protocol called with the profile, and not those of the nominal robot
    proxy = evaluate_seed(ZeroController(), pendubot_config, 2, profile="hardware_proxy", keep_trajectory=False)
    nominal = evaluate_seed(ZeroController(), pendubot_config, 2, keep_trajectory=False)
    assert data["seeds"][0]["score"] == proxy.score and proxy.uptime != nominal.uptime
    bad = tmp_path / "bad.yaml"
    bad.write_text("delay: -1.0\n")
    assert cli.main(["evaluate", "--robot", "pendubot", "--robot-profile", str(bad)]) == 2
    assert "field 'delay'" in capsys.readouterr().err
