"""benchmarks/bench_delay_prediction.py: on a robot whose only imperfections are a whole-step delay and motor lag
(no noise), the state predicted from the delayed measurement with the model and the torques applied since is the
robot's true state; without prediction the controller is the supervisor itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _bench_helpers import load_benchmark

from mcpilco_core.config import load_robot_config
from mcpilco_core.control import build_controller
from mcpilco_core.policy import load_policy
from mcpilco_core.simulation import load_robot_profile

ROOT = Path(__file__).resolve().parents[1]


def test_the_prediction_is_the_true_state_and_no_prediction_changes_nothing():
    bench = load_benchmark("bench_delay_prediction")
    config = load_robot_config(ROOT / "config" / "acrobot.yaml")
    policy = load_policy(ROOT / "policies" / "acrobot.npz")
    profile = load_robot_profile("hardware_proxy_sensors")           # 5 ms: 2 periods late, r 0.9, no noise
    imperfections = profile.imperfections(config)
    assert imperfections.delay_steps(config.control_period) == 2
    controller = bench.DelayPredicted(build_controller(config, policy), bench.prediction_plant(config, ""), 2,
                                      imperfections.motor_responsiveness, config.control_period)
    robot = profile.robot(config, 0)
    controller.reset()
    errors = []
    for _ in range(400):
        command = controller.step(robot.measurement(), robot.t)
        errors.append(np.abs(controller.last_prediction - np.array(robot.x)).max())
        robot.step(command, controller.mode)
    # The history is full after 2 steps; the first command is taken as applied at once, while the robot's motor
    # started from 0 N m: that error shrinks by 1 - r = 0.1 a step, then the prediction is the true state.
    assert errors[2] > 1e-3 and errors[3] < errors[2] / 5 and max(errors[16:]) < 1e-12
    assert np.abs(np.array(robot.x)).max() > 0.1                     # it moved: the prediction had work to do
    plain = bench.DelayPredicted(build_controller(config, policy), bench.prediction_plant(config, ""), 0, 0.9,
                                 config.control_period)
    reference = build_controller(config, policy)
    for k in range(50):
        x, t = np.array([0.1 * k, 0.0, 0.2, -0.1]), k * config.control_period
        np.testing.assert_array_equal(plain.step(x, t), reference.step(x, t))
