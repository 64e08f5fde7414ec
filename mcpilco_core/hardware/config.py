"""Configuration of the moteus hardware driver, validated from a ROS 2 params file or a plain mapping.

One file per robot (``config/moteus_driver_pendubot.yaml``, ``..._acrobot.yaml``) describes the CAN
transport and, per joint, how the moteus controller maps to the joint: CAN id, direction sign, position
offset, gear ratio and the safety limits. Every error names the file and the dotted field
(:class:`mcpilco_core.config.ConfigError`).

Units: joint side rad, rad/s, N m, s; the moteus side is revolutions (the library's unit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import (
    ACTUATED_JOINT,
    JOINT_NAMES,
    ROBOTS,
    ConfigError,
    RobotJoints,
    _Reader,
    read_yaml,
    unwrap_ros_parameters,
)

NODE_NAME = "moteus_driver_node"
TRANSPORT_KINDS = ("socketcan", "pythoncan", "fdcanusb", "pi3hat", "auto")


@dataclass(frozen=True)
class TransportConfig:
    """Which CAN transport the official moteus library opens, and how long one CAN call may take.

    kind: socketcan (python-can on a SocketCAN interface), pythoncan (any python-can interface, e.g.
    ``virtual`` for tests), fdcanusb (serial device ``path``; "" autodetects), pi3hat (needs
    ``moteus-pi3hat``), auto (the moteus library's own detection).
    """

    kind: str = "socketcan"
    channel: str = "can0"           # python-can channel (socketcan / pythoncan)
    interface: str = "socketcan"    # python-can interface name (pythoncan)
    path: str = ""                  # fdcanusb serial device; "" = autodetect
    pi3hat_bus: int = 1             # pi3hat CAN bus of both controllers
    disable_brs: bool = False       # CAN-FD bit-rate switching off (long or noisy cables)
    can_timeout: float = 0.02       # s, bound of every transport call (asyncio.wait_for)
    max_consecutive_timeouts: int = 1  # CAN calls in a row that may time out before both motors stop

    def describe(self) -> str:
        """Human-readable transport name for error messages and diagnostics."""
        if self.kind == "socketcan":
            return f"socketcan channel '{self.channel}'"
        if self.kind == "pythoncan":
            return f"python-can interface '{self.interface}' channel '{self.channel}'"
        if self.kind == "fdcanusb":
            return f"fdcanusb '{self.path or 'autodetect'}'"
        if self.kind == "pi3hat":
            return f"pi3hat bus {self.pi3hat_bus}"
        return "moteus auto-detected transport"


@dataclass(frozen=True)
class JointDriverConfig:
    """One joint's moteus controller: addressing, unit mapping and limits.

    joint angle (rad) = direction * 2 pi * motor_rev / gear_ratio + position_offset;
    joint torque (N m) = direction * gear_ratio * motor torque (N m at the moteus output).
    """

    name: str
    can_id: int
    direction: int = 1                 # +1 or -1
    position_offset: float = 0.0       # rad, joint angle when the controller reads 0 rev
    gear_ratio: float = 1.0            # external reduction between moteus output and joint
    torque_limit: float = 0.0          # N m at the joint; 0 for the passive joint
    velocity_limit: float = 25.0       # rad/s, |dq| above this -> damping then stop
    position_limit: float = 25.0       # rad, |q| (multi-turn) above this -> damping then stop


@dataclass(frozen=True)
class DriverConfig(RobotJoints):
    """Everything the moteus driver needs; loaded by :func:`load_driver_config`."""

    robot: str
    joints: tuple[JointDriverConfig, JointDriverConfig]
    transport: TransportConfig = field(default_factory=TransportConfig)
    rate: float = 500.0                # Hz, transport cycles and joint_states messages
    command_timeout: float = 0.05      # s without fresh joint_commands -> zero torque
    watchdog_timeout: float = 0.05     # s, moteus firmware watchdog sent with every torque command
    damping_gain: float = 0.5          # N m s/rad on the actuated joint after a limit violation
    damping_duration: float = 1.0      # s of damping before both motors are stopped
    diagnostics_period: float = 0.5    # s between diagnostics messages
    source: str | None = None

    @property
    def period(self) -> float:
        """Cycle period (s)."""
        return 1.0 / self.rate

    @property
    def torque_limits(self) -> tuple[float, float]:
        return (self.joints[0].torque_limit, self.joints[1].torque_limit)


def _transport(reader: _Reader) -> TransportConfig:
    reader.reject_unknown(list(TransportConfig.__dataclass_fields__))
    d = TransportConfig()
    kind = reader.string("kind", d.kind, choices=TRANSPORT_KINDS)
    can_timeout = reader.number("can_timeout", d.can_timeout, positive=True)
    return TransportConfig(
        kind=kind, channel=str(reader.raw("channel", d.channel)),
        interface=reader.string("interface", d.interface), path=reader.string("path", d.path),
        pi3hat_bus=reader.integer("pi3hat_bus", d.pi3hat_bus, minimum=1),
        disable_brs=reader.boolean("disable_brs", d.disable_brs), can_timeout=can_timeout,
        max_consecutive_timeouts=reader.integer("max_consecutive_timeouts", d.max_consecutive_timeouts, minimum=1),
    )


def _joint(reader: _Reader, name: str, actuated: bool) -> JointDriverConfig:
    reader.reject_unknown([f for f in JointDriverConfig.__dataclass_fields__ if f != "name"])
    can_id = reader.integer("can_id", minimum=1)
    if can_id > 126:
        raise ConfigError(reader.source, reader.name("can_id"), f"must be <= 126 (0x7f is broadcast), got {can_id}")
    direction = reader.integer("direction", 1)
    if direction not in (1, -1):
        raise ConfigError(reader.source, reader.name("direction"), f"must be 1 or -1, got {direction}")
    torque_limit = reader.number("torque_limit", nonnegative=True)
    if not actuated and torque_limit != 0.0:
        raise ConfigError(reader.source, reader.name("torque_limit"),
                          f"the passive joint '{name}' must have torque_limit 0, got {torque_limit}")
    if actuated and torque_limit == 0.0:
        raise ConfigError(reader.source, reader.name("torque_limit"), f"the actuated joint '{name}' needs a limit > 0")
    return JointDriverConfig(
        name=name, can_id=can_id, direction=direction,
        position_offset=reader.number("position_offset", 0.0),
        gear_ratio=reader.number("gear_ratio", 1.0, positive=True), torque_limit=torque_limit,
        velocity_limit=reader.number("velocity_limit", 25.0, positive=True),
        position_limit=reader.number("position_limit", 25.0, positive=True),
    )


def driver_config_from_mapping(params: Mapping[str, Any], source: str | Path | None = None) -> DriverConfig:
    """Validate a nested parameter mapping into a :class:`DriverConfig` (errors name ``source``)."""
    reader = _Reader(params, source)
    known = ["robot", "joints", "transport", "rate", "command_timeout", "watchdog_timeout",
             "damping_gain", "damping_duration", "diagnostics_period", "use_sim_time"]
    reader.reject_unknown(known)
    robot = reader.string("robot", choices=ROBOTS)
    joints_reader = reader.sub("joints", required=True)
    joints_reader.reject_unknown(list(JOINT_NAMES))
    joints = tuple(_joint(joints_reader.sub(name, required=True), name, i == ACTUATED_JOINT[robot])
                   for i, name in enumerate(JOINT_NAMES))
    if joints[0].can_id == joints[1].can_id:
        raise ConfigError(source, "joints.elbow.can_id", f"same CAN id as the shoulder ({joints[0].can_id})")
    rate = reader.number("rate", 500.0, positive=True)
    command_timeout = reader.number("command_timeout", 0.05, positive=True)
    watchdog = reader.number("watchdog_timeout", 0.05, positive=True)
    if watchdog < 2.0 / rate:
        raise ConfigError(source, "watchdog_timeout", f"must cover at least two cycles ({2.0 / rate:.4f} s)")
    return DriverConfig(
        robot=robot, joints=joints, transport=_transport(reader.sub("transport")),  # type: ignore[arg-type]
        rate=rate, command_timeout=command_timeout, watchdog_timeout=watchdog,
        damping_gain=reader.number("damping_gain", 0.5, nonnegative=True),
        damping_duration=reader.number("damping_duration", 1.0, nonnegative=True),
        diagnostics_period=reader.number("diagnostics_period", 0.5, positive=True),
        source=str(source) if source is not None else None,
    )


def load_driver_config(path: str | Path, node: str = NODE_NAME) -> DriverConfig:
    """Load a driver configuration file (ROS 2 params layout for ``node``, or plain YAML)."""
    path = Path(path)
    return driver_config_from_mapping(unwrap_ros_parameters(read_yaml(path), path, node), path)
