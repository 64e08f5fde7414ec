"""Transitions at the policy period: what the learner fits its model on (numpy only).

Made from a simulator trajectory (:func:`transitions_from_trajectory`) or from recorded trials
(:meth:`~mcpilco_core.recording.reader.TrialData.transitions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TransitionData:
    """Transitions at the policy period: states x (N, 4), actuated torques u (N,) N m, next states (N, 4).

    u_prev (N,) N m: the actuated torque of the period before each transition. A robot whose sensors lag behind
    still applies it at the start of the transition (the delay-aware model, ``gp.delay_aware``, uses it). ``None``
    means unknown. It is then taken equal to u, so the previous command changes nothing.
    """

    x: np.ndarray
    u: np.ndarray
    x_next: np.ndarray
    u_prev: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.u_prev is None:
            self.u_prev = np.array(self.u, dtype=float, copy=True)
        if np.shape(self.u_prev) != np.shape(self.u):
            raise ValueError(f"u_prev has shape {np.shape(self.u_prev)}, u has {np.shape(self.u)}")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @classmethod
    def empty(cls) -> TransitionData:
        return cls(np.zeros((0, 4)), np.zeros(0), np.zeros((0, 4)), np.zeros(0))

    def concat(self, other: TransitionData) -> TransitionData:
        return TransitionData(np.concatenate([self.x, other.x]), np.concatenate([self.u, other.u]),
                              np.concatenate([self.x_next, other.x_next]), np.concatenate([self.u_prev, other.u_prev]))

    def mirrored(self) -> TransitionData:
        """The same transitions reflected about the vertical: every state, next state and torque negated.

        Why: the double pendulum is symmetric about the vertical (gravity, inertias, Coulomb and viscous friction,
        the torque limit), so if x(t) is a motion under u(t), -x(t) is one under -u(t). A recorded transition
        is then two: the learner's ``gp.mirror_data`` doubles what each second of robot time teaches the model.
        """
        return TransitionData(-self.x, -self.u, -self.x_next, -self.u_prev)

    def subset(self, index: np.ndarray) -> TransitionData:
        """The transitions at ``index`` (an index array or a boolean mask), copied."""
        return TransitionData(self.x[index].copy(), self.u[index].copy(), self.x_next[index].copy(),
                              self.u_prev[index].copy())


def transitions_from_trajectory(t: np.ndarray, x: np.ndarray, u: np.ndarray, period: float,
                                actuated_joint: int, previous: float = 0.0) -> TransitionData:
    """Resample a simulator trajectory (dt steps) into transitions of length ``period`` (s).

    The torque of a transition is the mean applied actuated torque over its interval (LQR and damping run
    at the fast rate, so it is not always constant inside one period). ``previous`` (N m): the mean actuated
    torque of the period before the trajectory starts, the first transition's ``u_prev`` (0: the motor was off).
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
    return TransitionData(x[idx].copy(), u_act, x[idx + stride].copy(), np.concatenate([[float(previous)], u_act[:-1]]))
