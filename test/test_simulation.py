"""The simulator: limits, the passive joint, zero-order hold through the supervisor, noise and delay options."""

import numpy as np

from mcpilco_core.plant import GOAL
from mcpilco_core.simulation import MODE_CODES, NoiseModel, Simulator


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


def test_noise_and_delay_are_seeded(pendubot_plant):
    noise = NoiseModel(measurement_std=(0.01, 0.01, 0.1, 0.1), torque_std=0.2, delay_steps=3)
    runs = []
    for _ in range(2):
        controller = Greedy()
        sim = Simulator(pendubot_plant, (6.0, 0.0), noise=noise, rng=np.random.default_rng(4))
        traj = sim.run(controller, GOAL, 0.05)
        runs.append((traj, np.array(controller.seen)))
    np.testing.assert_array_equal(runs[0][0].x, runs[1][0].x)
    traj, seen = runs[0]
    assert np.all(traj.u[:, 1] == 0.0)                      # torque noise never touches the passive joint
    # the controller saw a noisy, delayed state: close to the true state 3 steps earlier
    k = 10
    assert np.all(np.abs(seen[k] - traj.x[k - 3]) < 0.5) and not np.array_equal(seen[k], traj.x[k - 3])
