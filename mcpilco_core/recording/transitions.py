"""Transitions at the policy period: what the learner fits its model on (numpy only).

Made from a simulator trajectory (:func:`transitions_from_trajectory`) or from recorded trials
(:meth:`~mcpilco_core.recording.reader.TrialData.transitions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TransitionData:
    """Transitions at the policy period: states x (N, 4), actuated torques u (N,) N m, next states (N, 4)."""

    x: np.ndarray
    u: np.ndarray
    x_next: np.ndarray

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @classmethod
    def empty(cls) -> TransitionData:
        return cls(np.zeros((0, 4)), np.zeros(0), np.zeros((0, 4)))

    def concat(self, other: TransitionData) -> TransitionData:
        return TransitionData(np.concatenate([self.x, other.x]), np.concatenate([self.u, other.u]),
                              np.concatenate([self.x_next, other.x_next]))


def transitions_from_trajectory(t: np.ndarray, x: np.ndarray, u: np.ndarray, period: float,
                                actuated_joint: int) -> TransitionData:
    """Resample a simulator trajectory (dt steps) into transitions of length ``period`` (s).

    The torque of a transition is the mean applied actuated torque over its interval (LQR and damping run
    at the fast rate, so it is not always constant inside one period).
    """
    dt = float(t[1] - t[0])
    stride = round(period / dt)
    if stride < 1 or abs(stride * dt - period) > 1e-9:
        raise ValueError(f"policy period {period} s is not a multiple of the trajectory step {dt} s")
    count = (len(u)) // stride
    if count == 0:
        return TransitionData.empty()
    idx = np.arange(count) * stride
    u_act = u[: count * stride, actuated_joint].reshape(count, stride).mean(axis=1)
    return TransitionData(x[idx].copy(), u_act, x[idx + stride].copy())
