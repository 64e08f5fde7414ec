"""The asyncio driver loop: owns the moteus transport, runs one CAN transaction per cycle, applies safety.

Each cycle (500 Hz by default) sends, in one ``transport.cycle``, the torque command to the actuated joint
(with a query) and a pure query to the passive one, then converts the replies to joint units. Only inside a
disturbance window (``request_disturbance``, :mod:`.disturbance`) do both motors get torque commands; when it
ends the passive motor is sent a stop. Every CAN
call is bounded by ``asyncio.wait_for`` (the python-can transport has no timeout of its own). The
:class:`SafetySupervisor` decides each cycle's torque; any latched stop sends a stop to both controllers
and the loop keeps querying them so joint states keep flowing.

:class:`DriverRunner` runs the loop in its own thread with its own event loop (the ROS node spins in
another thread) and guarantees that both motors are stopped however the loop ends.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import moteus
import numpy as np

from . import units
from .commands import query_command, stop_command, torque_command
from .config import DriverConfig
from .disturbance import DisturbanceStep, DisturbanceWindows
from .safety import LATCHED, SafetyDecision, SafetySupervisor
from .transport import driver_transport

STARTUP_ATTEMPTS = 3
# asyncio.wait_for raises asyncio.TimeoutError, an alias of the builtin only from Python 3.11 on.
CAN_TIMEOUT_ERRORS = (asyncio.TimeoutError, TimeoutError)
# What a failing CAN call raises besides a timeout: SocketCAN's ENOBUFS and bus-off come as
# can.CanOperationError (not an OSError), serial transports raise OSError, the library RuntimeError/ValueError.
# Every exception from inside the transport's cycle is a CAN fault: counted, and max_consecutive_timeouts
# of them in a row latch a stop; it never ends the loop.
CAN_ERRORS: tuple[type[Exception], ...] = (Exception,)


class MissingControllerError(RuntimeError):
    """A configured moteus controller did not answer at startup; the message names its id and the transport."""


@dataclass
class MotorStatus:
    """One controller's last reply, in moteus units (rev, rev/s, N m, V, deg C)."""

    can_id: int
    mode: int = 0
    fault: int = 0
    position: float = 0.0
    velocity: float = 0.0
    torque: float = 0.0
    voltage: float = math.nan
    temperature: float = math.nan
    replied: bool = False
    measured_from: float = math.nan   # s, monotonic: the CAN transaction that brought this reply began...
    measured_until: float = math.nan  # ...and ended (the reading was taken in between)


@dataclass
class LoopStats:
    """Loop timing over a rolling window: achieved rate, periods, late cycles and CAN round trips."""

    window: int = 2000
    periods: collections.deque = field(default_factory=collections.deque)
    round_trips: collections.deque = field(default_factory=collections.deque)
    cycles: int = 0
    late_cycles: int = 0
    can_timeouts: int = 0        # failed CAN transactions: no reply in time, or an error (counted in both)
    can_errors: int = 0          # of those, the ones that raised (ENOBUFS, bus-off, ...)
    last_start: float | None = None

    def cycle_started(self, now: float) -> None:
        if self.last_start is not None:
            self._push(self.periods, now - self.last_start)
        self.last_start = now
        self.cycles += 1

    def round_trip(self, seconds: float) -> None:
        self._push(self.round_trips, seconds)

    def _push(self, buffer: collections.deque, value: float) -> None:
        buffer.append(value)
        if len(buffer) > self.window:
            buffer.popleft()

    def summary(self) -> dict[str, float]:
        """rate_hz, period_p50_ms, period_p99_ms, rtt_p50_ms, rtt_p99_ms, late_cycles, can_timeouts, can_errors."""
        out: dict[str, float] = {"cycles": float(self.cycles), "late_cycles": float(self.late_cycles),
                                 "can_timeouts": float(self.can_timeouts), "can_errors": float(self.can_errors)}
        if self.periods:
            p = np.asarray(self.periods)
            out.update(rate_hz=1.0 / float(p.mean()), period_p50_ms=1e3 * float(np.percentile(p, 50)),
                       period_p99_ms=1e3 * float(np.percentile(p, 99)))
        if self.round_trips:
            r = np.asarray(self.round_trips)
            out.update(rtt_p50_ms=1e3 * float(np.percentile(r, 50)), rtt_p99_ms=1e3 * float(np.percentile(r, 99)))
        return out


@dataclass
class DriverSample:
    """One cycle's result in joint units (rad, rad/s, N m); ``stamp_ns`` is the wall-clock measurement time;
    ``disturbance``: this cycle's command came from a disturbance window (its torques are the decision's)."""

    stamp_ns: int
    monotonic: float
    q: tuple[float, float]
    dq: tuple[float, float]
    tau: tuple[float, float]
    motors: tuple[MotorStatus, MotorStatus]
    decision: SafetyDecision
    fresh: bool          # False when this cycle's CAN call failed (values are the previous ones)
    disturbance: DisturbanceStep | None = None


class MoteusDriver:
    """Torque control of both joints through the official moteus library (see the module docstring)."""

    def __init__(self, config: DriverConfig, transport: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.transport = transport
        self.clock = clock
        self.safety = SafetySupervisor(config)
        self.disturbance = DisturbanceWindows(config)
        self.stats = LoopStats()
        self.motors = tuple(MotorStatus(j.can_id) for j in config.joints)
        self._can_ids = tuple(j.can_id for j in config.joints)   # every cycle addresses both controllers
        self.controllers: list[moteus.Controller] = []
        self._stop_sent = False
        self._consecutive_timeouts = 0
        self._owns_transport = transport is None
        self.close_error: Exception | None = None
        self.last_can_error = ""     # the newest exception a CAN call raised ("" = none)

    # ------------------------------------------------------------------ startup and shutdown
    async def start(self) -> None:
        """Open the transport, stop both controllers (clears latched faults) and check both answer."""
        if self.transport is None:
            self.transport = driver_transport(self.config)
        self.controllers = [moteus.Controller(id=j.can_id, transport=self.transport) for j in self.config.joints]
        for index, joint in enumerate(self.config.joints):
            if not await self._startup_stop(index):
                raise MissingControllerError(
                    f"moteus controller for joint '{joint.name}' (CAN id {joint.can_id}) did not answer on "
                    f"{self.config.transport.describe()} ({STARTUP_ATTEMPTS} stop+query attempts, "
                    f"{self._startup_timeout():.3f} s each)")

    def _startup_timeout(self) -> float:
        return max(self.config.transport.can_timeout, 0.1)

    async def _startup_stop(self, index: int) -> bool:
        for _ in range(STARTUP_ATTEMPTS):
            sent = self.clock()
            try:
                results = await asyncio.wait_for(self.transport.cycle([stop_command(self.controllers[index])]),
                                                 self._startup_timeout())
            except CAN_ERRORS as exc:  # timeouts and send errors alike: try again
                self.last_can_error = f"{type(exc).__name__}: {exc}"
                continue
            if self._store_replies(results, (self._can_ids[index],), (sent, self.clock())):
                return True
        return False

    async def stop_motors(self, attempts: int = 3) -> bool:
        """Send a stop to every controller, each on its own and retried ``attempts`` times, so that a CAN error
        for one never keeps the other from being stopped. True when every controller acknowledged a stop."""
        if not self.controllers:
            return False
        stopped = [False] * len(self.controllers)
        for _ in range(attempts):
            for index, controller in enumerate(self.controllers):
                if stopped[index]:
                    continue
                try:
                    results = await asyncio.wait_for(self.transport.cycle([stop_command(controller)]),
                                                     max(self.config.transport.can_timeout, 0.05))
                except CAN_ERRORS as exc:
                    self.last_can_error = f"{type(exc).__name__}: {exc}"
                    continue
                by_id = {getattr(r, "id", None): r for r in results if hasattr(r, "values")}
                motor = self.motors[index]
                if motor.can_id in by_id:
                    update_motor(motor, by_id[motor.can_id].values)
                    stopped[index] = True
            if all(stopped):
                self._stop_sent = True
                return True
        return False

    async def shutdown(self, reason: str = "driver shutdown") -> bool:
        """Latch a stop, stop both motors, close the transport if this driver opened it."""
        self.safety.request_stop(reason)
        stopped = await self.stop_motors()
        if self._owns_transport and self.transport is not None:
            try:
                self.transport.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort once the motors are stopped
                self.close_error = exc
        return stopped

    # ------------------------------------------------------------------ inputs from the controller side
    def set_command(self, torques: Sequence[float], receive_time: float | None = None) -> None:
        """New joint torques (N m, order shoulder, elbow); thread-safe."""
        self.safety.command(torques, self.clock() if receive_time is None else receive_time)

    def request_stop(self, reason: str) -> None:
        """Latch a stop; the next cycle stops both motors. Thread-safe."""
        self.safety.request_stop(reason)

    def request_disturbance(self) -> tuple[bool, str]:
        """Arm a disturbance window from the next cycle (:mod:`.disturbance`); (accepted, JSON or why not).
        Thread-safe; refused after a latched stop or fault."""
        state, reason = self.safety.state, self.safety.reason
        return self.disturbance.request(reason or state.value if state in LATCHED else "")

    # ------------------------------------------------------------------ one cycle
    def joint_state(self) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
        """The last measured (q, dq, tau) in rad, rad/s, N m."""
        joints, motors = self.config.joints, self.motors
        q = tuple(units.joint_position(j, m.position) for j, m in zip(joints, motors))
        dq = tuple(units.joint_velocity(j, m.velocity) for j, m in zip(joints, motors))
        tau = tuple(units.joint_torque(j, m.torque) for j, m in zip(joints, motors))
        return q, dq, tau  # type: ignore[return-value]

    async def cycle(self) -> DriverSample:
        """Decide, send, receive: one CAN transaction for both controllers."""
        now = self.clock()
        self.stats.cycle_started(now)
        q, dq, _ = self.joint_state()
        measured = [(m.measured_from, m.measured_until) if math.isfinite(m.measured_from) else (now, now)
                    for m in self.motors]
        decision = self.safety.update(now, q, dq, [m.mode for m in self.motors], [m.fault for m in self.motors],
                                      measured)
        window = self.disturbance.step(decision, q, dq)
        if window is not None:
            decision = dataclasses.replace(decision, torques=window.torques,
                                           reason=f"disturbance window {window.index}")
        releasing = self.disturbance.release_pending
        commands, stopping = self._commands(decision, window)
        fresh = await self._transact(commands)
        if fresh and stopping:
            self._stop_sent = True
        if fresh and releasing and window is None:   # the passive motor's stop (or a stop of both) went out
            self.disturbance.released()
        q, dq, tau = self.joint_state()
        t_end = self.clock()
        stamp_ns = time.time_ns() - int(0.5e9 * (t_end - now))
        return DriverSample(stamp_ns, t_end, q, dq, tau, self.motors, decision, fresh,  # type: ignore[arg-type]
                            window)

    def _commands(self, decision: SafetyDecision, window: DisturbanceStep | None = None) -> tuple[list, bool]:
        if decision.stop:
            if not self._stop_sent:
                return [stop_command(c) for c in self.controllers], True
            return [query_command(c) for c in self.controllers], False
        if window is not None:   # both motors, bounded by the disturbance torque limits (per joint)
            return [torque_command(c, units.motor_torque(j, tau), limit / j.gear_ratio, self.config.watchdog_timeout)
                    for c, j, tau, limit in zip(self.controllers, self.config.joints, window.torques,
                                                self.disturbance.limits)], False
        act = self.config.actuated_joint
        joint = self.config.joints[act]
        commands = [query_command(c) for c in self.controllers]
        if self.disturbance.release_pending:   # a window ended: the passive motor is stopped (zero torque)
            passive = self.config.passive_joint
            commands[passive] = stop_command(self.controllers[passive])
        commands[act] = torque_command(self.controllers[act], units.motor_torque(joint, decision.torques[act]),
                                       joint.torque_limit / joint.gear_ratio, self.config.watchdog_timeout)
        compensation = self.config.friction_compensation_limit
        if compensation > 0.0 and not self.disturbance.release_pending:   # opt-in: the passive joint's friction
            passive = self.config.passive_joint
            pjoint = self.config.joints[passive]
            commands[passive] = torque_command(self.controllers[passive],
                                               units.motor_torque(pjoint, decision.torques[passive]),
                                               compensation / pjoint.gear_ratio, self.config.watchdog_timeout)
        return commands, False

    async def _transact(self, commands: list) -> bool:
        t0 = time.perf_counter()
        sent = self.clock()
        try:
            results = await asyncio.wait_for(self.transport.cycle(commands), self.config.transport.can_timeout)
        except CAN_TIMEOUT_ERRORS:
            return self._timed_out(f"no reply within {self.config.transport.can_timeout * 1e3:.1f} ms")
        except CAN_ERRORS as exc:  # ENOBUFS, bus-off, anything raised inside the CAN call: a CAN fault
            self.last_can_error = f"{type(exc).__name__}: {exc}"
            self.stats.can_errors += 1
            return self._timed_out(self.last_can_error, "CAN error")
        self.stats.round_trip(time.perf_counter() - t0)
        replied = self._store_replies(results, self._can_ids, (sent, self.clock()))
        if not replied:
            return self._timed_out("reply missing from " + ", ".join(
                f"id {m.can_id}" for m in self.motors if not m.replied))
        self._consecutive_timeouts = 0
        return True

    def _timed_out(self, what: str, kind: str = "CAN timeout") -> bool:
        """A failed transaction (``kind``: CAN timeout or CAN error): counted; ``max_consecutive_timeouts`` in a
        row latch a fault (both motors stopped)."""
        self.stats.can_timeouts += 1
        self._consecutive_timeouts += 1
        if self._consecutive_timeouts >= self.config.transport.max_consecutive_timeouts:
            self.safety.report_fault(f"{kind} on {self.config.transport.describe()} "
                                     f"({self._consecutive_timeouts} in a row): {what}")
        return False

    def _store_replies(self, results: Sequence[Any], addressed: Collection[int],
                       transaction: tuple[float, float]) -> bool:
        """Copy replies into :attr:`motors` with the ``transaction``'s monotonic start and end (s: each reading was
        taken in between); True when every controller addressed this time (CAN ids) replied.

        Why by id: a transport that returns whatever arrived in time (a pi3hat router does) may bring one reply of
        two; counting that as a good cycle would freeze the silent motor's mode, fault and position unseen."""
        by_id = {getattr(r, "id", None): r for r in results if hasattr(r, "values")}
        for motor in self.motors:
            motor.replied = motor.can_id in by_id
            if motor.replied:
                update_motor(motor, by_id[motor.can_id].values)
                motor.measured_from, motor.measured_until = transaction
        return all(can_id in by_id for can_id in addressed)

    # ------------------------------------------------------------------ the periodic loop
    async def run(self, stop_event: asyncio.Event, on_sample: Callable[[DriverSample], None] | None = None) -> None:
        """Cycle at the configured rate until ``stop_event`` is set; late cycles are counted and re-synced."""
        period = self.config.period
        next_time = self.clock()
        while not stop_event.is_set():
            sample = await self.cycle()
            if on_sample is not None:
                on_sample(sample)
            next_time += period
            delay = next_time - self.clock()
            if delay < 0.0:
                self.stats.late_cycles += 1
                if delay < -period:
                    next_time = self.clock()
                delay = 0.0
            await asyncio.sleep(delay)


def update_motor(motor: MotorStatus, values: dict) -> None:
    """Copy a moteus reply's registers (mode, fault, position, velocity, torque) into ``motor``."""
    reg = moteus.Register
    motor.mode = int(values.get(reg.MODE, motor.mode))
    motor.fault = int(values.get(reg.FAULT, motor.fault))
    motor.position = float(values.get(reg.POSITION, motor.position))
    motor.velocity = float(values.get(reg.VELOCITY, motor.velocity))
    motor.torque = float(values.get(reg.TORQUE, motor.torque))
    motor.voltage = float(values.get(reg.VOLTAGE, motor.voltage))
    motor.temperature = float(values.get(reg.TEMPERATURE, motor.temperature))


class DriverRunner:
    """Runs a :class:`MoteusDriver` in a dedicated thread with its own asyncio loop.

    ``start()`` returns once the controllers answered (or raises :class:`MissingControllerError`);
    ``stop()`` ends the loop; both motors are stopped on every way out of the loop (stop, exception).
    """

    def __init__(self, driver: MoteusDriver, on_sample: Callable[[DriverSample], None] | None = None) -> None:
        self.driver = driver
        self.on_sample = on_sample
        self.loop = asyncio.new_event_loop()
        self._stop_event: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="moteus_driver", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._abandoned = False       # start() gave up waiting: a start that completes later must not run the loop
        self.stopped_cleanly = False

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        if not self._started.wait(timeout):
            self._abandoned = True
            raise TimeoutError(f"moteus driver did not start within {timeout:g} s "
                               f"({self.driver.config.transport.describe()}): the transport hangs")
        if self._error is not None:
            self._thread.join(timeout)
            raise self._error

    def stop(self, timeout: float = 5.0) -> None:
        if self._stop_event is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop_event.set)
        self._thread.join(timeout)

    @property
    def error(self) -> BaseException | None:
        """The exception that ended the loop, if any."""
        return self._error

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._run())
        finally:
            self.loop.close()

    async def _run(self) -> None:
        self._stop_event = asyncio.Event()
        try:
            await self.driver.start()
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._started.set()
            await self.driver.shutdown("startup failed")
            return
        self._started.set()
        if self._abandoned:           # nobody waits for this loop any more: stop both and leave
            self.stopped_cleanly = await self.driver.shutdown("start abandoned after its timeout")
            return
        reason = "driver stopped"
        try:
            await self.driver.run(self._stop_event, self.on_sample)
        except BaseException as exc:  # noqa: BLE001 - any error ends in a stop of both motors
            self._error = exc
            reason = f"exception in driver loop: {exc!r}"
        finally:
            self.stopped_cleanly = await self.driver.shutdown(reason)
