"""Random exploration torques (MC-PILCO's trial 0), without torch: the controller node runs this on the robot.

The numpy generator of trial k comes from ``SeedSequence([seed, k])`` (:func:`trial_rng`), so the controller node's
exploration on the simulated robot and on the real one, and the offline learner's trial 0, draw the same torques for
the same seed. On the robot the supervisor keeps watching while it explores: its damping (too fast) and safe modes
override the exploration torque (:func:`exploration_command`); the offline learner explores through the same rule
(:class:`SupervisedExploration`), so an offline run and a session explore alike.
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


# Supervisor modes that override exploration: safety first.
OVERRIDING_MODES = ("damping", "safe")


def exploration_command(supervisor_u: np.ndarray, supervisor_mode: str, explorer: ExplorationController,
                        x: np.ndarray, t: float) -> tuple[np.ndarray, str]:
    """(torque in N m, mode) while exploring: the supervisor's own command when it damps or stops (the explorer
    is not stepped then), else the exploration torque on the actuated joint, clipped to the torque limit, and
    exactly 0 on the passive joint (mode ``explore``)."""
    if supervisor_mode in OVERRIDING_MODES:
        return supervisor_u, supervisor_mode
    config = explorer.config
    u = np.zeros(2)
    u[config.actuated_joint] = float(np.clip(explorer.step(x, t)[config.actuated_joint], -config.torque_limit,
                                             config.torque_limit))
    return u, "explore"


class SupervisedExploration:
    """Exploration as the controller node runs it (:func:`exploration_command`): ``supervisor`` (a controller
    with ``step(x, t)``, ``mode`` and ``reset()``, e.g. ``build_controller(config)``) sees every state."""

    def __init__(self, supervisor, explorer: ExplorationController) -> None:
        self.supervisor, self.explorer = supervisor, explorer
        self.mode = "explore"

    def reset(self) -> None:
        self.supervisor.reset()
        self.explorer.reset()
        self.mode = "explore"

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        u = self.supervisor.step(x, t)
        u, self.mode = exploration_command(u, self.supervisor.mode, self.explorer, x, t)
        return u
