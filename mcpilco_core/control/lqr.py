"""LQR at the upright goal for the actuated joint only (continuous-time Riccati equation via scipy)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.linalg import solve_continuous_are

from ..config import ConfigError, RobotConfig
from ..plant import GOAL, DoublePendulum


@dataclass(frozen=True)
class LqrDesign:
    """Gains of ``u = -K (x - goal)`` (K is 2x4 with a zero row for the passive joint) and the
    Riccati solution S, whose quadratic form V(x) = (x - goal)^T S (x - goal) is the cost-to-go."""

    K: np.ndarray
    S: np.ndarray
    actuated_joint: int
    goal: np.ndarray

    def cost_to_go(self, x_wrapped: np.ndarray) -> np.ndarray:
        """V for (already wrapped) states (..., 4)."""
        e = np.asarray(x_wrapped, dtype=np.float64) - self.goal
        return np.einsum("...i,ij,...j->...", e, self.S, e)


def design_lqr(plant: DoublePendulum, actuated_joint: int, q_diag: tuple[float, ...], r: float) -> LqrDesign:
    """Solve the continuous-time algebraic Riccati equation for the plant linearised at the goal.

    Only the actuated joint's column of B is used, so the passive joint receives no torque.
    """
    a, b_full = plant.linearize(GOAL, (0.0, 0.0))
    b = b_full[:, [actuated_joint]]
    q = np.diag(np.asarray(q_diag, dtype=np.float64))
    r_mat = np.array([[float(r)]])
    s = solve_continuous_are(a, b, q, r_mat)
    k_act = np.linalg.solve(r_mat, b.T @ s)
    k = np.zeros((2, 4))
    k[actuated_joint] = k_act[0]
    return LqrDesign(K=k, S=s, actuated_joint=actuated_joint, goal=GOAL.copy())


def configured_lqr(plant: DoublePendulum, config: RobotConfig) -> LqrDesign:
    """The robot config's LQR: the Riccati design of its weights, its gains times ``lqr.gain_scale``.

    S (the cost-to-go that places the switching) stays the Riccati solution's, so a scaled design switches where the
    unscaled one does; only the feedback changes. Weights the file accepts one by one may still have no such design
    (e.g. ``Q_diag`` all zero: S is singular, V vanishes away from the goal): a ConfigError naming the file's ``lqr``
    section, not numpy's error from inside the Riccati solver or the ROA estimate."""
    try:
        design = design_lqr(plant, config.actuated_joint, config.lqr.Q_diag, config.lqr.R)
        np.linalg.cholesky(design.S)        # the cost-to-go V must be positive definite: it places the switching
    except np.linalg.LinAlgError as exc:
        raise ConfigError(config.source, "lqr", f"Q_diag {list(config.lqr.Q_diag)} and R {config.lqr.R} give no "
                                                f"LQR with a positive definite cost-to-go ({exc})") from exc
    scale = np.asarray(config.lqr.gain_scale, dtype=np.float64)
    if np.all(scale == 1.0):
        return design
    return replace(design, K=design.K * scale[np.newaxis, :])
