"""Emulated moteus controllers for tests and demos (nothing in the shipped runtime imports this module).

The emulator speaks the moteus register protocol as documented in the moteus reference manual, decoded
here independently of the library: the frames the unmodified ``moteus`` library builds are parsed
(write / read subframes, int8 / int16 / int32 / float32 resolutions, NaN sentinels, NOP padding) and
queries are answered in the real reply format (one reply subframe per read subframe, padded to a CAN-FD
length with 0x50). Behaviour modelled, per controller:

- mode 0 (stop) clears faults and the timeout latch; mode 10 (position) resets the command registers to
  their defaults (position 0 rev, velocity 0, feed-forward 0, kp/kd scale 1, maximum torque and watchdog =
  the controller's configuration) and then applies the written ones;
- torque = kp kp_scale (p_cmd - p) + kd kd_scale (v_cmd - v) + feed-forward, clipped to the maximum torque
  (no position term when p_cmd is NaN);
- the watchdog: no command for ``watchdog_timeout`` s (0, the register's default = the configured default;
  NaN = no timeout: moteus reference, register 0x027) -> mode 11,
  latched until a stop; while latched (mode 11 or fault mode 1) position commands are ignored;
- fault injection (mode 1 + fault code), dropped replies, late replies.

Send failures of the driver's own CAN interface (SocketCAN's ENOBUFS and bus-off, an exception inside the CAN
call) are injected on the driver side by :class:`CanSendFaults`.

Front ends: :class:`VirtualCanEmulator` (python-can ``virtual`` bus, in-process) and
:class:`FdcanusbPtyEmulator` (a pseudo terminal speaking the fdcanusb text protocol, for other processes).
:class:`PendulumRig` couples two emulated motors to the :class:`DoublePendulum` plant (fixed-step RK4).
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import select
import struct
import sys
import threading
import time
import tty
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import units
from .config import DriverConfig

# ---------------------------------------------------------------------------------------------- registers
MODE, POSITION, VELOCITY, TORQUE = 0x000, 0x001, 0x002, 0x003
VOLTAGE, TEMPERATURE, FAULT = 0x00D, 0x00E, 0x00F
CMD_POSITION, CMD_VELOCITY, CMD_FF_TORQUE, CMD_KP_SCALE, CMD_KD_SCALE = 0x020, 0x021, 0x022, 0x023, 0x024
CMD_MAX_TORQUE, CMD_STOP_POSITION, CMD_TIMEOUT = 0x025, 0x026, 0x027
SET_OUTPUT_NEAREST, SET_OUTPUT_EXACT = 0x130, 0x131
UUID_FIRST, UUID_MASK_FIRST, UUID_MASK_CAPABLE = 0x150, 0x154, 0x158
MODEL_NUMBER, FIRMWARE_VERSION, REGISTER_MAP_VERSION = 0x100, 0x101, 0x102

_POS = (0.01, 0.0001, 0.00001)
_VEL = (0.1, 0.00025, 0.00001)
_TRQ = (0.5, 0.01, 0.001)
_PWM = (1.0 / 127.0, 1.0 / 32767.0, 1.0 / 2147483647.0)
_TIME = (0.01, 0.001, 0.000001)
_VOLT = (0.5, 0.1, 0.001)
_TEMP = (1.0, 0.1, 0.001)
_CUR = (1.0, 0.1, 0.001)
SCALES: dict[int, tuple[float, float, float]] = {
    POSITION: _POS, VELOCITY: _VEL, TORQUE: _TRQ, 0x004: _CUR, 0x005: _CUR, 0x006: _POS, 0x007: (10.0, 0.05, 0.0001),
    0x00A: _TEMP, VOLTAGE: _VOLT, TEMPERATURE: _TEMP, CMD_POSITION: _POS, CMD_VELOCITY: _VEL, CMD_FF_TORQUE: _TRQ,
    CMD_KP_SCALE: _PWM, CMD_KD_SCALE: _PWM, CMD_MAX_TORQUE: _TRQ, CMD_STOP_POSITION: _POS, CMD_TIMEOUT: _TIME,
    0x028: _VEL, 0x029: (0.05, 0.001, 0.00001), 0x02A: _VOLT, 0x02B: _PWM, 0x02C: _CUR,
    SET_OUTPUT_NEAREST: _POS, SET_OUTPUT_EXACT: _POS,
}
_FORMATS = (struct.Struct("<b"), struct.Struct("<h"), struct.Struct("<i"), struct.Struct("<f"))
_INT_MAX = (127, 32767, 2147483647)
NOP = 0x50
READ_ERROR = 0x31
CAN_FD_LENGTHS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 48, 64)
COMMAND_DEFAULTS = {CMD_POSITION: 0.0, CMD_VELOCITY: 0.0, CMD_FF_TORQUE: 0.0, CMD_KP_SCALE: 1.0,
                    CMD_KD_SCALE: 1.0, CMD_MAX_TORQUE: math.nan, CMD_STOP_POSITION: math.nan,
                    CMD_TIMEOUT: 0.0}
ACTIVE_MODES = (10, 12, 13, 15)


# ---------------------------------------------------------------------------------------------- codec
def _varuint(data: bytes, offset: int) -> tuple[int, int]:
    value, shift = 0, 0
    for i in range(5):
        if offset + i >= len(data):
            raise ValueError("truncated varuint")
        byte = data[offset + i]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, offset + i + 1
    raise ValueError("varuint too long")


def _encode_varuint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@dataclass
class DecodedFrame:
    """A request: register writes (register, resolution, raw value) and read blocks (start, count, resolution)."""

    writes: list[tuple[int, int, Any]] = field(default_factory=list)
    reads: list[tuple[int, int, int]] = field(default_factory=list)


def decode_request(data: bytes) -> DecodedFrame:
    """Parse write and read subframes; NOP (0x50) padding is skipped; parsing stops at anything else."""
    frame, i = DecodedFrame(), 0
    while i < len(data):
        cmd = data[i]
        i += 1
        if cmd == NOP:
            continue
        upper, resolution, count = cmd & 0xF0, (cmd >> 2) & 0x03, cmd & 0x03
        if upper not in (0x00, 0x10):
            break
        if count == 0:
            count, i = _varuint(data, i)
        register, i = _varuint(data, i)
        if upper == 0x10:
            frame.reads.append((register, count, resolution))
            continue
        fmt = _FORMATS[resolution]
        for k in range(count):
            frame.writes.append((register + k, resolution, fmt.unpack_from(data, i)[0]))
            i += fmt.size
    return frame


def raw_to_value(register: int, resolution: int, raw: Any) -> float:
    """Wire value -> physical value (the most negative integer is NaN for scaled registers)."""
    scales = SCALES.get(register)
    if scales is None or resolution == 3:
        return float(raw)
    if raw == -_INT_MAX[resolution] - 1:
        return math.nan
    return raw * scales[resolution]


def value_to_raw(register: int, resolution: int, value: float) -> Any:
    """Physical value -> wire value, saturating like the firmware (NaN -> the most negative integer)."""
    if resolution == 3:
        return float(value)
    scales = SCALES.get(register)
    limit = _INT_MAX[resolution]
    if scales is None:
        return int(max(-limit - 1, min(limit, int(value))))
    if not math.isfinite(value):
        return -limit - 1
    return int(max(-limit, min(limit, value / scales[resolution])))


def encode_reply(blocks: Sequence[tuple[int, int, Sequence[float] | None]]) -> bytes:
    """Reply subframes: per block (start register, resolution, values), or a read error when values is None."""
    out = bytearray()
    for register, resolution, values in blocks:
        if values is None:
            out += bytes([READ_ERROR]) + _encode_varuint(register) + _encode_varuint(1)
            continue
        count = len(values)
        if count <= 3:
            out.append(0x20 | (resolution << 2) | count)
        else:
            out.append(0x20 | (resolution << 2))
            out += _encode_varuint(count)
        out += _encode_varuint(register)
        fmt = _FORMATS[resolution]
        for k, value in enumerate(values):
            out += fmt.pack(value_to_raw(register + k, resolution, value))
    return bytes(out)


def pad_can_fd(data: bytes) -> bytes:
    """Pad to the next valid CAN-FD length with NOPs (0x50), as the firmware does."""
    size = next(n for n in CAN_FD_LENGTHS if n >= len(data))
    return data + bytes([NOP]) * (size - len(data))


# ---------------------------------------------------------------------------------------------- one controller
@dataclass
class MotorParams:
    """The emulated controller's configuration (moteus config values, moteus units)."""

    kp: float = 4.0                 # N m / rev (servo.pid_position.kp)
    kd: float = 0.1                 # N m / (rev/s) (servo.pid_position.kd)
    max_torque: float = 10.0        # N m, hardware torque bound
    default_timeout: float = 0.1    # s, servo.default_timeout_s (the watchdog when a command sends 0 or none)
    voltage: float = 24.0           # V bus voltage reported
    temperature: float = 30.0       # deg C board temperature reported


class EmulatedMotor:
    """Register-level model of one moteus controller (thread-safe use through :class:`EmulatedBus`)."""

    def __init__(self, can_id: int, params: MotorParams | None = None, uuid: bytes | None = None) -> None:
        self.can_id = can_id
        self.params = params or MotorParams()
        self.uuid = uuid or bytes([can_id] * 16)
        self.mode = 0
        self.fault = 0
        self.position = 0.0        # rev
        self.velocity = 0.0        # rev/s
        self.torque = 0.0          # N m, last applied
        self.commands: dict[int, float] = dict(COMMAND_DEFAULTS)
        self.last_command_time = 0.0
        self.reply_delay = 0.0     # s, replies go out this late
        self.drop_replies = 0      # the next N replies are dropped
        self.silent = False        # never answer (a controller that is not there)
        self.frames: deque = deque(maxlen=200)   # decoded requests, newest last (for tests)
        self.max_commanded_torque = 0.0          # largest |torque| this controller ever applied

    # -------------------------------------------------------------- test hooks
    def inject_fault(self, code: int) -> None:
        """Enter fault mode 1 with ``code`` (e.g. 33 motor driver fault); a stop clears it."""
        self.mode, self.fault, self.torque = 1, code, 0.0

    # -------------------------------------------------------------- protocol
    def process(self, data: bytes, reply_required: bool, now: float) -> bytes | None:
        """Handle one request frame; the reply payload (unpadded) when one is required."""
        frame = decode_request(data)
        if not self._addressed(frame):
            return None
        self.frames.append(frame)
        self._apply_writes(frame.writes, now)
        self.output_torque()
        if not reply_required or self.silent:
            return None
        return encode_reply([(start, res, self._read_block(start, count)) for start, count, res in frame.reads])

    def _addressed(self, frame: DecodedFrame) -> bool:
        masks = [(reg, raw) for reg, _, raw in frame.writes if UUID_MASK_FIRST <= reg < UUID_MASK_FIRST + 4]
        for reg, raw in masks:
            k = reg - UUID_MASK_FIRST
            if struct.pack("<i", int(raw)) != self.uuid[4 * k:4 * k + 4]:
                return False
        return True

    def _apply_writes(self, writes: list[tuple[int, int, Any]], now: float) -> None:
        values = {reg: raw_to_value(reg, res, raw) for reg, res, raw in writes}
        if MODE in values:
            if not self._set_mode(int(values.pop(MODE)), now):
                return
        elif any(reg in COMMAND_DEFAULTS for reg in values) and self.mode in ACTIVE_MODES:
            self.last_command_time = now
        for reg, value in values.items():
            if reg in COMMAND_DEFAULTS:
                self.commands[reg] = value
            elif reg in (SET_OUTPUT_NEAREST, SET_OUTPUT_EXACT):
                self.position = value

    def _set_mode(self, mode: int, now: float) -> bool:
        """Apply a MODE write; False when the controller ignores the command (latched fault or timeout)."""
        if mode == 0:
            self.mode, self.fault, self.torque = 0, 0, 0.0
            return True
        if self.mode in (1, 11):
            return False
        self.mode = mode
        self.commands = dict(COMMAND_DEFAULTS)
        self.last_command_time = now
        return True

    def _read_block(self, start: int, count: int) -> list[float] | None:
        values = [self._read(start + k) for k in range(count)]
        return None if any(v is None for v in values) else values  # type: ignore[return-value]

    def _read(self, register: int) -> float | None:
        known = {MODE: self.mode, POSITION: self.position, VELOCITY: self.velocity, TORQUE: self.torque,
                 VOLTAGE: self.params.voltage, TEMPERATURE: self.params.temperature, FAULT: self.fault,
                 MODEL_NUMBER: 0x0000, FIRMWARE_VERSION: 0x010A00, REGISTER_MAP_VERSION: 5,
                 UUID_MASK_CAPABLE: 1}
        if register in known:
            return float(known[register])
        if register in self.commands:
            return self.commands[register]
        if UUID_FIRST <= register < UUID_FIRST + 4:
            k = register - UUID_FIRST
            return float(struct.unpack("<i", self.uuid[4 * k:4 * k + 4])[0])
        if register < 0x080:
            return 0.0
        return None

    # -------------------------------------------------------------- dynamics
    def check_watchdog(self, now: float) -> None:
        """Enter mode 11 (latched) when the last command is older than the watchdog timeout."""
        if self.mode not in ACTIVE_MODES:
            return
        timeout = self.commands[CMD_TIMEOUT]
        if math.isnan(timeout):          # NaN (or the integer sentinel): this command has no enforced timeout
            return
        if timeout == 0.0:               # 0 (the register's default): the configured servo.default_timeout_s
            timeout = self.params.default_timeout
        if timeout > 0.0 and now - self.last_command_time > timeout:
            self.mode = 11

    def output_torque(self) -> float:
        """Torque this controller applies now (N m at its output), given its mode and measured state."""
        p, c = self.params, self.commands
        if self.mode == 10:
            limit = p.max_torque if math.isnan(c[CMD_MAX_TORQUE]) else min(abs(c[CMD_MAX_TORQUE]), p.max_torque)
            p_err = 0.0 if math.isnan(c[CMD_POSITION]) else c[CMD_POSITION] - self.position
            v_cmd = 0.0 if math.isnan(c[CMD_VELOCITY]) else c[CMD_VELOCITY]
            ff = 0.0 if math.isnan(c[CMD_FF_TORQUE]) else c[CMD_FF_TORQUE]
            tau = p.kp * c[CMD_KP_SCALE] * p_err + p.kd * c[CMD_KD_SCALE] * (v_cmd - self.velocity) + ff
        elif self.mode in (11, 12, 15):   # timeout / zero velocity / brake: damped stop
            limit, tau = p.max_torque, -p.kd * self.velocity
        else:
            limit, tau = 0.0, 0.0
        self.torque = min(max(tau, -limit), limit)
        self.max_commanded_torque = max(self.max_commanded_torque, abs(self.torque))
        return self.torque


# ---------------------------------------------------------------------------------------------- plant coupling
class PendulumRig:
    """Two emulated motors driving the double pendulum: fixed-step RK4 in real (monotonic) time.

    The passive joint's motor torque is applied through ``passive_torque_limit`` (0 = the real mechanism:
    the passive joint has no usable actuator); ``passive_torque_peak`` records what it was asked for.
    ``hold`` keeps the pendulum still (an operator's hand) until the actuated motor first applies torque, so
    slow-starting processes find it where it was put. ``time_scale`` < 1 runs the plant slower than the wall
    clock (simulated s per wall s), so tests on a loaded machine keep the control loop fast relative to the
    dynamics; watchdogs and timeouts stay in wall time. ``t`` is simulated time (s).
    """

    def __init__(self, plant: Any, config: DriverConfig, motors: Sequence[EmulatedMotor],
                 x0: Sequence[float] = (0.0, 0.0, 0.0, 0.0), dt: float = 0.001,
                 passive_torque_limit: float = 0.0, hold: bool = False, time_scale: float = 1.0) -> None:
        self.plant, self.config, self.motors, self.dt = plant, config, list(motors), dt
        self.hold = hold
        self.time_scale = time_scale
        self._wall: float | None = None
        self._budget = 0.0
        self.x: tuple[float, float, float, float] = tuple(float(v) for v in x0)  # type: ignore[assignment]
        self.t = 0.0
        self.passive_torque_limit = passive_torque_limit
        self.passive_torque_peak = 0.0
        self.history: deque = deque(maxlen=200000)   # (t, x, u) for tests
        self._sync()

    def _sync(self) -> None:
        for i, (joint, motor) in enumerate(zip(self.config.joints, self.motors)):
            motor.position = units.motor_position(joint, self.x[i])
            motor.velocity = units.motor_velocity(joint, self.x[2 + i])

    def joint_torques(self) -> tuple[float, float]:
        u = [units.joint_torque(j, m.output_torque()) for j, m in zip(self.config.joints, self.motors)]
        passive = self.config.passive_joint
        self.passive_torque_peak = max(self.passive_torque_peak, abs(u[passive]))
        lim = self.passive_torque_limit
        u[passive] = min(max(u[passive], -lim), lim)
        return (u[0], u[1])

    def advance(self, now: float) -> None:
        """Integrate up to ``now`` (s, monotonic) in steps of dt with the torque held over each step."""
        if self._wall is None or (self.hold and self.motors[self.config.actuated_joint].torque == 0.0):
            self._wall = now
            return
        self.hold = False
        self._budget += (now - self._wall) * self.time_scale
        self._wall = now
        steps = int(self._budget / self.dt)
        self._budget -= steps * self.dt
        if steps > 2000:   # the process stalled: do not try to catch up more than 2000 steps
            steps, self._budget = 2000, 0.0
        for _ in range(steps):
            u = self.joint_torques()
            self.x = self.plant.rk4_step_scalar(self.x, u, self.dt)
            self.t += self.dt
            self._sync()
            self.history.append((self.t, self.x, u))


# ---------------------------------------------------------------------------------------------- the bus
class EmulatedBus:
    """Routes frames to emulated controllers by arbitration id ``(0x8000 if reply) | (source << 8) | dest``.

    Replies go out as ``(prefix << 16) | (controller id << 8) | requester`` like the firmware's.
    """

    def __init__(self, motors: Sequence[EmulatedMotor], rig: PendulumRig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.motors = list(motors)
        self.rig = rig
        self.clock = clock
        self.lock = threading.RLock()
        self.frames_handled = 0

    def motor(self, can_id: int) -> EmulatedMotor:
        return next(m for m in self.motors if m.can_id == can_id)

    def tick(self) -> None:
        """Advance the plant and the watchdogs to now."""
        with self.lock:
            now = self.clock()
            if self.rig is not None:
                self.rig.advance(now)
            for motor in self.motors:
                motor.check_watchdog(now)
                if self.rig is None:
                    motor.output_torque()

    def handle(self, arbitration_id: int, data: bytes) -> list[tuple[float, int, bytes]]:
        """One received frame -> replies as (send time s, arbitration id, padded payload)."""
        with self.lock:
            self.tick()
            now = self.clock()
            self.frames_handled += 1
            dest, source = arbitration_id & 0x7F, (arbitration_id >> 8) & 0x7F
            reply_required, prefix = bool(arbitration_id & 0x8000), (arbitration_id >> 16) & 0x1FFF
            replies = []
            for motor in self.motors:
                if dest not in (motor.can_id, 0x7F) or motor.silent:
                    continue
                payload = motor.process(bytes(data), reply_required, now)
                if payload is None:
                    continue
                if motor.drop_replies > 0:
                    motor.drop_replies -= 1
                    continue
                reply_id = (prefix << 16) | (motor.can_id << 8) | source
                replies.append((now + motor.reply_delay, reply_id, pad_can_fd(payload)))
            return replies


def robot_bus(config: DriverConfig, plant: Any = None, x0: Sequence[float] = (0.0, 0.0, 0.0, 0.0),
              params: MotorParams | None = None, dt: float = 0.001, hold: bool = False,
              time_scale: float = 1.0) -> EmulatedBus:
    """Emulated controllers with the CAN ids of ``config``, coupled to ``plant`` when given."""
    motors = [EmulatedMotor(j.can_id, params) for j in config.joints]
    rig = PendulumRig(plant, config, motors, x0, dt, hold=hold, time_scale=time_scale) if plant is not None else None
    return EmulatedBus(motors, rig)


# ---------------------------------------------------------------------------------------------- front ends
class _Frontend:
    """A thread that receives frames, asks the bus for replies and sends them when due."""

    def __init__(self, bus: EmulatedBus) -> None:
        self.bus = bus
        self._pending: list[tuple[float, int, int, bytes]] = []
        self._seq = 0
        self._running = False
        self._thread: threading.Thread | None = None

    def start(self) -> _Frontend:
        self._open()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._running = False
        if self._thread is not None:
            self._thread.join(2.0)
        self._close()

    def __enter__(self) -> _Frontend:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _queue(self, replies: list[tuple[float, int, bytes]]) -> None:
        for due, arb, payload in replies:
            self._seq += 1
            heapq.heappush(self._pending, (due, self._seq, arb, payload))

    def _flush_due(self) -> None:
        now = self.bus.clock()
        while self._pending and self._pending[0][0] <= now:
            _, _, arb, payload = heapq.heappop(self._pending)
            self._send(arb, payload)

    def _wait_time(self) -> float:
        wait = 0.002
        if self._pending:
            wait = min(wait, max(0.0, self._pending[0][0] - self.bus.clock()))
        return wait

    def _loop(self) -> None:
        while self._running:
            self._receive(self._wait_time())
            self._flush_due()
            self.bus.tick()

    def _open(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _receive(self, timeout: float) -> None:
        raise NotImplementedError

    def _send(self, arbitration_id: int, payload: bytes) -> None:
        raise NotImplementedError


class VirtualCanEmulator(_Frontend):
    """The emulated controllers on a python-can ``virtual`` channel (same process as the driver)."""

    def __init__(self, bus: EmulatedBus, channel: str) -> None:
        super().__init__(bus)
        self.channel = channel
        self._can: Any = None

    def _open(self) -> None:
        import can

        self._can = can.Bus(interface="virtual", channel=self.channel, receive_own_messages=False)

    def _close(self) -> None:
        if self._can is not None:
            self._can.shutdown()

    def _receive(self, timeout: float) -> None:
        msg = self._can.recv(timeout)
        if msg is not None and not msg.is_error_frame:
            self._queue(self.bus.handle(msg.arbitration_id, bytes(msg.data)))

    def _send(self, arbitration_id: int, payload: bytes) -> None:
        import can

        self._can.send(can.Message(arbitration_id=arbitration_id, data=payload, is_extended_id=arbitration_id > 0x7FF,
                                   is_fd=True, bitrate_switch=True))


def _crc8_table() -> list[int]:
    table = []
    for nibble in range(16):
        crc = nibble << 4
        for _ in range(4):
            crc = ((crc << 1) ^ 0x97) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
        table.append(crc)
    return table


_CRC8 = _crc8_table()


def crc8(data: bytes) -> int:
    """CRC-8 (polynomial 0x97) of the fdcanusb / moteus UART line checksum."""
    crc = 0
    for byte in data:
        crc = _CRC8[((crc >> 4) ^ (byte >> 4)) & 0x0F] ^ ((crc << 4) & 0xFF)
        crc = _CRC8[((crc >> 4) ^ (byte & 0x0F)) & 0x0F] ^ ((crc << 4) & 0xFF)
    return crc


class FdcanusbPtyEmulator(_Frontend):
    """The emulated controllers behind a pseudo terminal that speaks the fdcanusb text protocol.

    ``can send <id hex> <data hex> [flags]`` is answered ``OK`` and each reply frame is emitted as
    ``rcv <id hex> <data hex> [E] B F``; lines carrying a ``*XX`` checksum get checksummed answers (the
    library enables checksums when the device is not a USB fdcanusb, as with a pty).
    """

    def __init__(self, bus: EmulatedBus) -> None:
        super().__init__(bus)
        self.path = ""
        self._master = -1
        self._slave = -1
        self._buffer = b""
        self._checksums = False
        self.lines_received = 0

    def _open(self) -> None:
        self._master, self._slave = os.openpty()
        tty.setraw(self._slave)
        self.path = os.ttyname(self._slave)

    def _close(self) -> None:
        for fd in (self._master, self._slave):
            if fd >= 0:
                os.close(fd)
        self._master = self._slave = -1

    def _receive(self, timeout: float) -> None:
        ready, _, _ = select.select([self._master], [], [], timeout)
        if not ready:
            return
        try:
            self._buffer += os.read(self._master, 4096)
        except OSError:
            return
        while True:
            cut = min((i for i in (self._buffer.find(b"\n"), self._buffer.find(b"\r")) if i >= 0), default=-1)
            if cut < 0:
                return
            line, self._buffer = self._buffer[:cut], self._buffer[cut + 1:]
            if line.strip():
                self._line(line.strip())

    def _line(self, line: bytes) -> None:
        self.lines_received += 1
        star = line.rfind(b"*")
        if star >= 0 and star + 3 == len(line):
            if crc8(line[:star]) != int(line[star + 1:], 16):
                self._write(b"ERR checksum mismatch")
                return
            self._checksums = True
            line = line[:star].rstrip()
        fields = line.split()
        if fields[:2] == [b"can", b"send"] and len(fields) >= 4:
            self._write(b"OK")
            self._queue(self.bus.handle(int(fields[2], 16), bytes.fromhex(fields[3].decode())))
        elif fields[:1] in ([b"can"], [b"conf"]):
            self._write(b"OK")
        else:
            self._write(b"ERR unknown command")

    def _send(self, arbitration_id: int, payload: bytes) -> None:
        flags = (" E" if arbitration_id > 0x7FF else "") + " B F"
        self._write(f"rcv {arbitration_id:X} {payload.hex().upper()}{flags}".encode())

    def _write(self, line: bytes) -> None:
        if self._checksums:
            line = line + b" "
            line = line + f"*{crc8(line):02X}".encode()
        try:
            os.write(self._master, line + b"\n")
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """Serve emulated controllers behind a pty (prints its path), optionally coupled to the plant."""
    from ..plant import DoublePendulum
    from .config import load_driver_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver-config", required=True, help="moteus driver params file (CAN ids, mapping)")
    parser.add_argument("--robot-config", help="robot params file: couple the motors to its plant")
    parser.add_argument("--x0", type=float, nargs=4, default=(0.0, 0.0, 0.0, 0.0), help="initial state")
    parser.add_argument("--hold", action="store_true", help="hold the pendulum until the first torque")
    parser.add_argument("--duration", type=float, default=math.inf, help="s to serve (default: until killed)")
    args = parser.parse_args(argv)
    config = load_driver_config(args.driver_config)
    plant = DoublePendulum.from_yaml(args.robot_config) if args.robot_config else None
    with FdcanusbPtyEmulator(robot_bus(config, plant, args.x0, hold=args.hold)) as emulator:
        print(emulator.path, flush=True)
        end = time.monotonic() + args.duration
        try:
            while time.monotonic() < end:
                time.sleep(0.1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------------------------------------- driver-side faults
class CanSendFaults:
    """Makes the driver's python-can bus fail its sends, as SocketCAN does (wraps ``bus.send``).

    ``inject(kind, count, can_id)``: the next ``count`` sends (``math.inf``: until :meth:`clear`), optionally only
    those to ``can_id``, raise -- ``enobufs``: ``can.CanOperationError`` errno 105 (transmit queue full),
    ``bus_off``: ``can.CanOperationError`` errno 100 (network down: the controller went bus-off),
    ``exception``: a ``ValueError`` from inside the call. Thread-safe enough for tests: the driver's thread sends,
    the test thread injects.
    """

    KINDS = ("enobufs", "bus_off", "exception")

    def __init__(self, bus: Any) -> None:
        self.bus = bus
        self._send = bus.send
        self.kind: str | None = None
        self.remaining: float = 0
        self.can_id: int | None = None
        self.raised = 0
        bus.send = self._faulty_send

    @classmethod
    def on_transport(cls, transport: Any) -> CanSendFaults:
        """The injector for a ``moteus.PythonCan`` transport (its one device's python-can bus; moteus internals)."""
        return cls(transport._transport.devices()[0]._can)

    def inject(self, kind: str, count: float = math.inf, can_id: int | None = None) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        self.kind, self.remaining, self.can_id = kind, count, can_id

    def clear(self) -> None:
        self.kind, self.remaining = None, 0

    def _faulty_send(self, msg: Any, timeout: float | None = None) -> None:
        target = msg.arbitration_id & 0x7F
        if self.kind is not None and self.remaining > 0 and self.can_id in (None, target):
            self.remaining -= 1
            self.raised += 1
            raise self._error(self.kind)
        return self._send(msg, timeout)

    @staticmethod
    def _error(kind: str) -> Exception:
        import can

        if kind == "enobufs":
            return can.CanOperationError("Failed to transmit: [Errno 105] No buffer space available", 105)
        if kind == "bus_off":
            return can.CanOperationError("Failed to transmit: [Errno 100] Network is down", 100)
        return ValueError("injected failure inside the CAN call")
