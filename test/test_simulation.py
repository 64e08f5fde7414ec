"""The simulated robot: limits, the passive joint, overrides, and RealAIGym's delay, noise and motor lag on
hand-computed steps."""

import numpy as np
import pytest

from mcpilco_core.plant import GOAL
from mcpilco_core.simulation import MODE_CODES, Imperfections, SimulatedRobot, Simulator


class Greedy:
    """A controller that asks for too much torque on both joints (and NaN every 7th step)."""

    mode = "policy"

    def __init__(self):
        self.seen = []

    def reset(self):
        self.seen.clear()

    def step(self, x, t):
        self.seen.append(np.array(x))
        if len(self.seen) % 7 == 0:
            return np.array([np.nan, 1.0])
        return np.array([50.0, -50.0])


def test_limits_and_passive_joint(pendubot_plant):
    sim = Simulator(pendubot_plant, (6.0, 0.0))
    controller = Greedy()
    traj = sim.run(controller, np.zeros(4), 0.1)
    assert np.all(traj.u[:, 1] == 0.0)                      # the passive joint never gets torque
    assert np.all(np.abs(traj.u[:, 0]) <= 6.0)
    assert np.all(traj.u[6::7] == 0.0)                      # a non-finite command never reaches the plant
    assert np.max(np.abs(traj.u_cmd[:, 1])) == 50.0         # ...but what was asked is recorded
    assert np.all(traj.mode == MODE_CODES["policy"])
    assert traj.x.shape == (51, 4) and traj.u.shape == (50, 2)


def test_override_takes_over(pendubot_plant):
    sim = Simulator(pendubot_plant, (6.0, 0.0))
    traj = sim.run(Greedy(), np.zeros(4), 0.02, override=lambda k, t, x: np.array([10.0, -10.0]) if k < 5 else None)
    assert np.all(traj.mode[:5] == MODE_CODES["reset"]) and np.all(traj.u[:5] == [6.0, -6.0])
    assert np.all(traj.mode[5:] == MODE_CODES["policy"])


class Recorder:
    """Sends a fixed torque sequence and records what it was shown."""

    mode = "policy"

    def __init__(self, commands):
        self.commands = commands
        self.seen = []

    def reset(self):
        self.seen.clear()

    def step(self, x, t):
        self.seen.append(np.array(x))
        return self.commands[len(self.seen) - 1]


def test_delay_noise_and_lag_follow_the_formulas(pendubot_plant):
    """delay 5 ms at 2 ms: the state 2 steps old (n = int(0.005/0.002) + 1 = 3); noise added to it; torque
    u = u_last + r (u_cmd - u_last), plus noise, then the limits (the passive joint's is 0)."""
    imperfections = Imperfections(measurement_noise=(0.01, 0.02, 0.05, 0.06), delay=0.005,
                                  motor_responsiveness=0.9, torque_noise=(0.02, 0.5))
    commands = [np.array([1.0, 3.0]), np.array([2.0, 0.0]), np.array([-8.0, 0.0]), np.array([0.5, 0.0]),
                np.array([0.5, 0.0]), np.array([0.5, 0.0])]
    controller = Recorder(commands)
    sim = Simulator(pendubot_plant, (6.0, 0.0), imperfections=imperfections, rng=np.random.default_rng(7))
    traj = sim.run(controller, GOAL, 6 * 0.002)
    # the same normals, drawn in the documented order: 4 for the measurement, then 2 for the torque, per step
    normals = np.random.default_rng(7).standard_normal(6 * 6 + 4).tolist()
    meas_std, torque_std = np.array(imperfections.measurement_noise), np.array(imperfections.torque_noise)
    u_last = np.zeros(2)
    for k in range(6):
        z = np.array(normals[6 * k: 6 * k + 4])
        expected_seen = traj.x[max(0, k - 2)] + z * meas_std
        np.testing.assert_array_equal(controller.seen[k], expected_seen)
        np.testing.assert_array_equal(traj.extras["x_measured"][k], expected_seen)
        lagged = u_last + 0.9 * (commands[k] - u_last)
        noisy = lagged + np.array(normals[6 * k + 4: 6 * k + 6]) * torque_std
        expected_u = np.array([min(max(noisy[0], -6.0), 6.0), 0.0])
        np.testing.assert_array_equal(traj.u[k], expected_u)
        u_last = expected_u
    assert traj.u[2, 0] == -6.0                      # the lag does not save a too-large command from the limit
    assert np.all(traj.u[:, 1] == 0.0)               # noise and lag never reach the passive joint
    # the plant integrates exactly the applied torque
    np.testing.assert_array_equal(traj.x[1], pendubot_plant.rk4_step_scalar(tuple(GOAL), tuple(traj.u[0]), 0.002))


def test_ideal_robot_reports_the_true_state_and_needs_no_rng(pendubot_plant):
    robot = SimulatedRobot(pendubot_plant, (6.0, 0.0), x0=(0.1, 0.2, 0.3, 0.4))
    np.testing.assert_array_equal(robot.measurement(), [0.1, 0.2, 0.3, 0.4])
    seen = robot.step((2.0, 1.0), "policy")
    np.testing.assert_array_equal(seen, robot.x)
    assert robot.applied == (2.0, 0.0) and robot.k == 1
    with pytest.raises(ValueError, match="Generator"):
        SimulatedRobot(pendubot_plant, (6.0, 0.0), imperfections=Imperfections(torque_noise=(0.1, 0.0)))


def test_noisy_runs_are_seeded(pendubot_plant):
    imperfections = Imperfections(measurement_noise=(0.01, 0.01, 0.1, 0.1), delay=0.005, motor_responsiveness=0.9,
                                  torque_noise=(0.2, 0.0))
    runs = [Simulator(pendubot_plant, (6.0, 0.0), imperfections=imperfections,
                      rng=np.random.default_rng(seed)).run(Greedy(), GOAL, 0.05) for seed in (4, 4, 5)]
    np.testing.assert_array_equal(runs[0].x, runs[1].x)
    assert not np.array_equal(runs[0].x, runs[2].x)
