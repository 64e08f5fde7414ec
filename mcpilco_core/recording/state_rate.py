"""Trials at the state rate (500 Hz): what the sensors reported, the torque the motors applied and the one the
controller commanded, step by step. The learner identifies the robot's friction, sensor delay, motor lag and
noise from these (learning/identified_robot.py); the policy-period data the GP learns from is :class:`TrialData`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StateRecording:
    """One trial at the state rate. dt: s between states; x: (n+1, 4) measured states (rad, rad/s); effort: (n, 2)
    torque applied over step k -> k+1 (N m); command: (n, 2) torque commanded for that step (N m; NaN where not
    known); valid: (n,) the step is usable (outside reset and disturbance windows, no gap in the stream)."""

    dt: float
    x: np.ndarray
    effort: np.ndarray
    command: np.ndarray
    valid: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.effort)
        if self.x.shape != (n + 1, 4) or self.command.shape != (n, 2) or self.valid.shape != (n,):
            raise ValueError(f"state recording: x {self.x.shape}, effort {self.effort.shape}, command "
                             f"{self.command.shape}, valid {self.valid.shape} do not fit together")


def marked_runs(reset: np.ndarray) -> list[tuple[int, int]]:
    """The runs j0..j1 (inclusive) of consecutive reset-marked states."""
    marked = np.asarray(reset, bool).astype(np.int8)
    edges = np.diff(np.concatenate([[0], marked, [0]]))
    return [(int(j0), int(j1)) for j0, j1 in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1)]


def window_span(j0: int, j1: int, n: int) -> tuple[int, int]:
    """The states (a, b) between which the window torque of the marked run j0..j1 may have acted (n states in
    all). The state after a window's last step is always marked (both drivers mark it), so the window ends at j1;
    the state a window starts from may be unmarked (the lockstep driver can publish it before the window is
    armed), so the step into j0 counts as the window's too. A lone marked state's side is unknown: both steps."""
    if j1 > j0:
        return max(j0 - 1, 0), j1
    return max(j0 - 1, 0), min(j1 + 1, n - 1)


def window_steps(reset: np.ndarray) -> np.ndarray:
    """(n - 1,) True for the steps (state j to j + 1) a reset/disturbance window's torque acted over."""
    steps = np.zeros(max(len(reset) - 1, 0), bool)
    for j0, j1 in marked_runs(reset):
        a, b = window_span(j0, j1, len(reset))
        steps[a:b] = True
    return steps


def recording_from_bag(state_t_ns: np.ndarray, q: np.ndarray, dq: np.ndarray, effort: np.ndarray,
                       command_t_ns: np.ndarray, command_u: np.ndarray, reset: np.ndarray) -> StateRecording | None:
    """A recorded trial's streams (recording.reader.RawTrial's arrays): ``effort[j]`` acted over the step ending at
    state j; the command of a step is the newest one stamped at or before the state it answers (the controller
    stamps a command with its state; a command older than half a step at a state is not that step's: unknown).
    Steps whose interval is not the median one (a gap, a dropped state), a window's steps (:func:`window_span`) and
    steps next to a non-finite state are not valid. None when the states carry no effort."""
    if len(effort) != len(state_t_ns) or len(state_t_ns) < 3:
        return None
    t = (np.asarray(state_t_ns, np.int64) - int(state_t_ns[0])) * 1e-9
    steps = np.diff(t)
    dt = float(np.median(steps))
    valid = np.abs(steps - dt) < 0.25 * dt
    if len(reset):
        valid &= ~window_steps(reset)
    command = np.full((len(steps), 2), np.nan)
    if len(command_t_ns):
        order = np.argsort(command_t_ns, kind="stable")
        ct, cu = np.asarray(command_t_ns)[order], np.asarray(command_u, float)[order]
        stamps = np.asarray(state_t_ns[:-1], np.int64)
        idx = np.searchsorted(ct, stamps, side="right") - 1
        # only the command answering the step's own state: an older one (a dropped command, a stalled controller)
        # was not what the motors were asked for then
        fresh = (idx >= 0) & (stamps - ct[np.maximum(idx, 0)] < 0.5 * dt * 1e9)
        command[fresh] = cu[idx[fresh]]
    x = np.column_stack([q, dq]).astype(float)
    finite = np.isfinite(x).all(axis=1)
    return StateRecording(dt, x, np.asarray(effort[1:], float), command, valid & finite[:-1] & finite[1:])
