"""The driver's safety state machine: the one place that decides which torque reaches the motors.

Inputs every cycle: the measured joint state, the controllers' modes and fault codes, and the newest
``joint_commands`` (torques and the monotonic time they arrived). Output: joint torques (N m) and whether
both motors must be stopped. Rules, in order:

1. latched stop (``~/stop``, a fault, a CAN timeout, the end of a damping phase) -> stop both, forever
   (until :meth:`SafetySupervisor.reset`);
2. a controller in mode 1 (fault) or 11 (watchdog timeout) -> fault: stop both, naming the fault; a NaN or
   infinite position or velocity reading -> fault too (``abs(nan) > limit`` is False: the limits below cannot
   see it), naming the joint and the value; a position that moved between two cycles by more than twice the
   joint's velocity limit allows (+ ``JUMP_MARGIN``) -> fault: a controller that reset (its multi-turn count lost)
   or an encoder fault, never motion;
3. velocity or position (multi-turn) limit exceeded -> software damping ``-gain * dq`` on the actuated joint
   for ``damping_duration`` s, then stop both;
4. no command received yet -> zero torque (commands are the enable signal: the controller only publishes
   when enabled);
5. newest command older than ``command_timeout`` -> zero torque until fresh commands arrive;
6. otherwise the commanded torque, clamped per joint; the passive joint gets exactly 0 -- unless the driver
   config's opt-in ``friction_compensation_limit`` (<= 0.5 N m) bounds what the controller's friction
   compensation may put there.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from .commands import FAULT_MODES, fault_name, mode_name
from .config import DriverConfig


class SafetyState(enum.Enum):
    WAITING = "waiting"      # no command yet: zero torque
    ACTIVE = "active"        # commanded torque (clamped)
    STALE = "stale"          # commands stopped arriving: zero torque
    DAMPING = "damping"      # a limit was exceeded: software damping, then stop
    STOPPED = "stopped"      # latched stop (request, end of damping)
    FAULT = "fault"          # latched stop after a controller fault, timeout or CAN timeout


LATCHED = (SafetyState.STOPPED, SafetyState.FAULT)
JUMP_MARGIN = 0.05   # rad a position may move between two cycles beyond twice the velocity limit times their interval


@dataclass(frozen=True)
class SafetyDecision:
    """What to do this cycle: joint torques (N m) or stop both motors; ``reason`` explains non-active states."""

    state: SafetyState
    torques: tuple[float, float]
    stop: bool
    reason: str = ""


class SafetySupervisor:
    """Thread-safe: commands and stop requests may come from the ROS thread, updates from the CAN loop."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._command: tuple[float, float] = (0.0, 0.0)
        self._command_time: float | None = None
        self._state = SafetyState.WAITING
        self._reason = ""
        self._damping_until = 0.0
        self._last_q: tuple[float, ...] | None = None     # the previous cycle's positions (rad) and, per joint,
        self._last_q_from: tuple[float, ...] = ()          # the earliest time (s) each of them can have been taken
        self.clamped_commands = 0

    # ------------------------------------------------------------------ inputs
    def command(self, torques: Sequence[float], receive_time: float) -> None:
        """A new joint_commands message: torques (N m, joint order shoulder, elbow), monotonic receive time (s)."""
        values = tuple(float(t) if math.isfinite(float(t)) else 0.0 for t in torques)
        with self._lock:
            self._command = (values[0], values[1])
            self._command_time = receive_time

    def request_stop(self, reason: str) -> None:
        """Latch a stop (``~/stop``, shutdown)."""
        self._latch(SafetyState.STOPPED, reason)

    def report_fault(self, reason: str) -> None:
        """Latch a fault (CAN timeout, exception in the loop)."""
        self._latch(SafetyState.FAULT, reason)

    def reset(self) -> None:
        """Clear a latched stop and forget old commands (zero torque until fresh ones arrive)."""
        with self._lock:
            self._state, self._reason, self._command_time = SafetyState.WAITING, "", None
            self._last_q = None

    def _latch(self, state: SafetyState, reason: str) -> None:
        with self._lock:
            if self._state not in LATCHED:
                self._state, self._reason = state, reason

    @property
    def state(self) -> SafetyState:
        return self._state

    @property
    def reason(self) -> str:
        return self._reason

    # ------------------------------------------------------------------ the decision
    def update(self, now: float, q: Sequence[float], dq: Sequence[float],
               modes: Sequence[int], faults: Sequence[int],
               measured: Sequence[tuple[float, float]] | None = None) -> SafetyDecision:
        """Decide this cycle's torques from the measured state (rad, rad/s) at monotonic time ``now`` (s).

        ``measured``: per joint, the monotonic interval (s) in which its reading was taken (the CAN transaction
        that brought it); default: at ``now``. The position-jump check allows the motion of the longest time that
        can lie between two readings, so a slow transaction followed by a quick one is not taken for a jump."""
        with self._lock:
            self._check_faults(modes, faults)
            self._check_finite(q, dq)
            self._check_jump(q, measured if measured is not None else [(now, now)] * len(q))
            if self._state in LATCHED:
                return SafetyDecision(self._state, (0.0, 0.0), True, self._reason)
            self._check_limits(now, q, dq)
            if self._state is SafetyState.DAMPING:
                return self._damping(now, dq)
            return self._commanded(now)

    def _check_faults(self, modes: Sequence[int], faults: Sequence[int]) -> None:
        if self._state in LATCHED:
            return
        for joint, mode, fault in zip(self.config.joints, modes, faults):
            if mode in FAULT_MODES:
                self._state = SafetyState.FAULT
                self._reason = (f"{joint.name} (id {joint.can_id}) in mode {mode} ({mode_name(mode)}), "
                                f"fault {fault} ({fault_name(fault)})")
                return

    def _check_finite(self, q: Sequence[float], dq: Sequence[float]) -> None:
        if self._state in LATCHED:
            return
        for joint, qi, dqi in zip(self.config.joints, q, dq):
            for what, value, unit in (("position", qi, "rad"), ("velocity", dqi, "rad/s")):
                if not math.isfinite(value):
                    self._state = SafetyState.FAULT
                    self._reason = (f"non-finite {joint.name} {what} reading ({value} {unit}, id {joint.can_id}): "
                                    f"encoder or bus fault")
                    return

    def _check_jump(self, q: Sequence[float], measured: Sequence[tuple[float, float]]) -> None:
        last, last_from = self._last_q, self._last_q_from
        self._last_q, self._last_q_from = tuple(float(v) for v in q), tuple(float(m[0]) for m in measured)
        if self._state in LATCHED or last is None:
            return
        for joint, qi, before, (_, until), since in zip(self.config.joints, q, last, measured, last_from):
            elapsed = max(until - since, 0.0)      # the longest time between the two readings
            if abs(qi - before) > 2.0 * joint.velocity_limit * elapsed + JUMP_MARGIN:
                self._state = SafetyState.FAULT
                self._reason = (f"{joint.name} position jumped {qi - before:+.3f} rad in {elapsed * 1e3:.1f} ms, more "
                                f"than twice its velocity limit ({joint.velocity_limit:g} rad/s) allows: a controller "
                                f"that reset (id {joint.can_id}) or an encoder fault")
                return

    def _check_limits(self, now: float, q: Sequence[float], dq: Sequence[float]) -> None:
        if self._state is SafetyState.DAMPING:
            return
        for joint, qi, dqi in zip(self.config.joints, q, dq):
            problem = ""
            if abs(dqi) > joint.velocity_limit:
                problem = f"{joint.name} velocity {dqi:.2f} rad/s beyond limit {joint.velocity_limit}"
            elif abs(qi) > joint.position_limit:
                problem = f"{joint.name} position {qi:.2f} rad beyond limit {joint.position_limit}"
            if problem:
                self._state, self._reason = SafetyState.DAMPING, problem
                self._damping_until = now + self.config.damping_duration
                return

    def _damping(self, now: float, dq: Sequence[float]) -> SafetyDecision:
        if now >= self._damping_until:
            self._state = SafetyState.STOPPED
            self._reason = f"stopped after damping ({self._reason})"
            return SafetyDecision(self._state, (0.0, 0.0), True, self._reason)
        act = self.config.actuated_joint
        limit = self.config.joints[act].torque_limit
        torques = [0.0, 0.0]
        torques[act] = min(max(-self.config.damping_gain * dq[act], -limit), limit)
        return SafetyDecision(SafetyState.DAMPING, (torques[0], torques[1]), False, self._reason)

    def _commanded(self, now: float) -> SafetyDecision:
        if self._command_time is None:
            self._state, self._reason = SafetyState.WAITING, "no joint_commands yet"
            return SafetyDecision(self._state, (0.0, 0.0), False, self._reason)
        age = now - self._command_time
        if age > self.config.command_timeout:
            self._state, self._reason = SafetyState.STALE, f"last joint_commands {age:.3f} s old"
            return SafetyDecision(self._state, (0.0, 0.0), False, self._reason)
        self._state, self._reason = SafetyState.ACTIVE, ""
        return SafetyDecision(self._state, self._clamp(self._command), False)

    def _clamp(self, command: tuple[float, float]) -> tuple[float, float]:
        out = []
        for i, (joint, tau) in enumerate(zip(self.config.joints, command)):
            # exactly 0 on the passive joint, unless the opt-in friction compensation gives it a (<= 0.5 N m) bound
            limit = self.config.friction_compensation_limit if i == self.config.passive_joint else joint.torque_limit
            clamped = min(max(tau, -limit), limit) if limit > 0.0 else 0.0
            if clamped != tau:
                self.clamped_commands += 1
            out.append(clamped)
        return (out[0], out[1])
