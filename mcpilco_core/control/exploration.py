"""Random exploration torques (MC-PILCO's trial 0), without torch: the controller node runs this on the robot.

The numpy generator of trial k comes from ``SeedSequence([seed, k])`` (:func:`trial_rng`), so the controller node's
exploration on the simulated robot and on the real one draw the same torques for the same seed. The offline
learner's trial 0 (``Learner.exploration_trial``) draws its start state from that stream first, so its torques are
another sequence of the same distribution: an offline run and a session with the same seed do not explore alike.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import RobotConfig


def trial_rng(seed: int, trial: int) -> np.random.Generator:
    """The numpy generator of trial ``trial`` of a run with ``seed`` (depends on nothing else; resume-safe)."""
    return np.random.default_rng(np.random.SeedSequence([seed, trial]))


class ExplorationController:
    """Uniform random actuated torque in [-amplitude, amplitude] N m, held for one policy period.

    The passive joint gets exactly 0. ``amplitude`` is not clipped here: callers check it against the torque
    limit (the node refuses a larger one at start).
    """

    mode = "policy"

    def __init__(self, config: RobotConfig, amplitude: float, rng: np.random.Generator) -> None:
        self.config, self.amplitude, self.rng = config, amplitude, rng
        self.reset()

    def reset(self) -> None:
        self._next_time = -math.inf
        self._u = np.zeros(2)

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        if t >= self._next_time - 1e-9:
            self._u = np.zeros(2)
            self._u[self.config.actuated_joint] = self.rng.uniform(-self.amplitude, self.amplitude)
            self._next_time = t + self.config.policy_period
        return self._u.copy()
