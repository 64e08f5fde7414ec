"""The protocol against RealAIGym's own simulator: a fixed test signal through the whole 60 s run (seed 0),
compared step by step (1e-9) up to 0.23 s after the first reset window, then the 15 reset windows (which
steps) and RealAIGym's score line. Data: test/data/realaigym_trajectories/ (README there)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mcpilco_core.config import ROBOTS, load_robot_config
from mcpilco_core.evaluation import DT, evaluate_seed

DATA = Path(__file__).resolve().parent / "data" / "realaigym_trajectories"
CONFIG = Path(__file__).resolve().parent.parent / "config"


class TestSignal:
    """u_actuated = clip(2 sin(3 t) - 0.5 dq_actuated_measured, -6, 6), u_passive = 0, with t RealAIGym's
    clock (t += dt per step)."""

    __test__ = False
    mode = "other"

    def __init__(self, actuated: int) -> None:
        self.actuated = actuated
        self.reset()

    def reset(self) -> None:
        self.clock, self.k = 0.0, 0

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        k = int(round(t / DT))
        while self.k < k:
            self.clock += DT
            self.k += 1
        u = np.zeros(2)
        u[self.actuated] = min(max(2.0 * math.sin(3.0 * self.clock) - 0.5 * x[2 + self.actuated], -6.0), 6.0)
        return u


def replay(robot: str, **kwargs):
    config = load_robot_config(CONFIG / f"{robot}.yaml")
    return evaluate_seed(TestSignal(config.actuated_joint), config, 0, **kwargs)


def window_steps(result) -> list[list[int]]:
    return [[int(round(start / DT)), int(round((end - start) / DT))] for start, end in result.windows]


def score_line(robot: str, profile: str) -> tuple[float, float]:
    """RealAIGym's (uptime s, score) of the run."""
    summary = json.loads((DATA / "summary.json").read_text(encoding="utf-8"))
    header, values = summary[f"{robot}_{profile}_seed0.npz"]["score_csv"]
    assert header.split(",")[1:] == ["Uptime [s]", "RealAI Score"]
    _, up, score = (float(v) for v in values.split(","))
    return up, score


@pytest.mark.timeout(60)
@pytest.mark.parametrize("robot", ROBOTS)
def test_nominal_protocol_replays_realaigym(robot):
    reference = np.load(DATA / f"{robot}_nominal_seed0_head.npz")
    result = replay(robot)
    traj, n = result.trajectory, len(reference["x"])
    # step by step through the first reset window (101 steps from 1983) and 0.23 s beyond
    np.testing.assert_allclose(traj.x[:n], reference["x"], rtol=0.0, atol=1e-9)
    np.testing.assert_allclose(traj.u[:n], reference["u"], rtol=0.0, atol=1e-9)
    assert window_steps(result)[0] == [1983, 101]
    assert window_steps(result) == reference["windows"].tolist()
    up, score = score_line(robot, "nominal")
    assert result.uptime == pytest.approx(up, abs=1e-9) and result.score == pytest.approx(score, abs=1e-9)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("robot", ROBOTS)
def test_noise_free_hardware_proxy_replays_realaigym(robot):
    """model_1.0, 5 ms delay, motor responsiveness 0.9: the controller and the reset PID see the delayed state,
    the PID's torques pass the motor model. Exact through the first window and the step after it; there RealAIGym's
    motor model lets the passive joint's window torque decay (x 0.1 per step) while this robot gives the passive
    joint exactly 0 outside the windows (the hardware rule), so the runs part from the next state on."""
    reference = np.load(DATA / f"{robot}_proxy_nonoise_seed0_head.npz")
    result = replay(robot, profile="hardware_proxy_nonoise")
    traj = result.trajectory
    start, steps = reference["windows"][0]
    after = start + steps                       # 2084: the first step after the window
    actuated, passive = (0, 1) if robot == "pendubot" else (1, 0)
    np.testing.assert_allclose(traj.x[:after + 1], reference["x"][:after + 1], rtol=0.0, atol=1e-9)
    np.testing.assert_allclose(traj.u[:after], reference["u"][:after], rtol=0.0, atol=1e-9)
    # the step after the window: the actuated joint's lag from the PID's last torque matches ...
    assert traj.u[after, actuated] == pytest.approx(reference["u"][after, actuated], abs=1e-9)
    # ... the passive joint gets exactly 0 where RealAIGym's motor model leaves 0.1 x its last window torque
    assert traj.u[after, passive] == 0.0
    assert reference["u"][after, passive] == pytest.approx(0.1 * reference["u"][after - 1, passive], rel=1e-9)
    assert abs(reference["u"][after, passive]) > 0.01
    assert np.all(traj.u[traj.mode != 5, passive] == 0.0)
    assert window_steps(result) == reference["windows"].tolist()
    up, score = score_line(robot, "proxy_nonoise")
    assert result.uptime == pytest.approx(up, abs=1e-9) and result.score == pytest.approx(score, abs=1e-9)
