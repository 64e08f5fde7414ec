"""Configuration of the moteus hardware driver, validated from a ROS 2 params file or a plain mapping.

One file per robot (``config/moteus_driver_pendubot.yaml``, ``..._acrobot.yaml``) describes the CAN
transport and, per joint, how the moteus controller maps to the joint: CAN id, direction sign, position
offset, gear ratio and the safety limits. Every error names the file and the dotted field
(:class:`mcpilco_core.config.ConfigError`).

Units: joint side rad, rad/s, N m, s; the moteus side is revolutions (the library's unit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import (
    ACTUATED_JOINT,
    JOINT_NAMES,
    PASSIVE_COMPENSATION_MAX,
    ROS_OWN_PARAMETERS,
    TORQUE_LIMIT_MAX,
    ConfigError,
    ConfigReader,
    RobotJoints,
    plant_models,
    read_yaml,
    robot_setting,
    section,
    setting,
    setting_keys,
    unwrap_ros_parameters,
)

NODE_NAME = "moteus_driver_node"
TRANSPORT_KINDS = ("socketcan", "pythoncan", "fdcanusb", "pi3hat", "auto")
DISTURBANCE_TORQUE_MAX = 6.0   # N m: the protocol's reset PID limit, the most a disturbance window may use
PLANT_MODELS_FILE = "plant_models.yaml"


@dataclass(frozen=True)
class TransportConfig:
    """Which CAN transport the official moteus library opens, and how long one CAN call may take.

    kind: socketcan (python-can on a SocketCAN interface), pythoncan (any python-can interface, e.g.
    ``virtual`` for tests), fdcanusb (serial device ``path``; "" autodetects), pi3hat (needs
    ``moteus-pi3hat``), auto (the moteus library's own detection).
    """

    kind: str = setting("CAN transport: socketcan | pythoncan | fdcanusb | pi3hat | auto", "socketcan",
                        choices=TRANSPORT_KINDS)
    channel: str = setting("python-can / SocketCAN channel (kinds socketcan, pythoncan)", "can0")
    interface: str = setting("python-can interface name (kind pythoncan, e.g. virtual)", "socketcan")
    path: str = setting("fdcanusb serial device ('' = autodetect)", "")
    pi3hat_bus: int = setting("pi3hat CAN bus of both controllers", 1, low=1, high=5)
    disable_brs: bool = setting("turn CAN-FD bit-rate switching off (long or noisy cables)", False)
    can_timeout: float = setting("s, bound of every transport call (asyncio.wait_for)", 0.02, low=1e-4, high=1.0)
    # Above 1, a reply that comes after its call timed out can be taken for a later call's (moteus replies carry no
    # sequence number): that cycle then reports readings one call old as fresh. 1 (the default) stops first.
    max_consecutive_timeouts: int = setting("CAN calls in a row that may time out before both motors stop", 1,
                                            low=1, high=1000)

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
    can_id: int = setting("moteus CAN id (0x7f is broadcast)", kind=int, low=1, high=126)
    direction: int = setting("+1 or -1: sign between the moteus output and the joint angle", 1, low=-1, high=1,
                             choices=(1, -1))
    position_offset: float = setting("rad, joint angle when the controller reads 0 rev", 0.0, low=-100.0,
                                     high=100.0)
    gear_ratio: float = setting("external reduction between the moteus output and the joint", 1.0, positive=True,
                                high=1000.0)
    torque_limit: float = setting("N m at the joint; 0 for the passive joint", 0.0, low=0.0, high=TORQUE_LIMIT_MAX)
    velocity_limit: float = setting("rad/s, |dq| above this -> damping then stop", 25.0, positive=True, high=1e3)
    position_limit: float = setting("rad, |q| (multi-turn) above this -> damping then stop", 25.0, positive=True,
                                    high=1e3)


@dataclass(frozen=True)
class DisturbanceConfig:
    """Disturbance windows (``~/disturb``): 0.2 s of the evaluation protocol's reset PID plus gravity compensation
    on *both* motors towards a random target (the only time the passive joint's motor is torqued), bounded by
    ``torque_limit`` on both joints and still subject to the joints' velocity/position limits and every fault.

    The default limit is conservative (3 N m: the PID cannot hold the shoulder horizontal against gravity,
    about 3.8 N m); raise it towards the protocol's 6 N m once the robot's limits and stops are checked
    (docs/hardware.md). 0 refuses ``~/disturb``.
    """

    torque_limit: float = setting("N m on both joints during a disturbance window (<= 6, the protocol's; 0 = "
                                  "~/disturb refused)", 3.0, low=0.0, high=DISTURBANCE_TORQUE_MAX)
    seed: int = setting("seed of the windows' random targets U[-pi, pi) (both joints)", 0, low=0, high=2**32 - 1)
    plant_model: str = setting("plant model of config/plant_models.yaml for the window's gravity compensation "
                               "(model_1.0: identified on the hardware)", "model_1.0")


@dataclass(frozen=True)
class DriverConfig(RobotJoints):
    """Everything the moteus driver needs; loaded by :func:`load_driver_config`."""

    robot: str = robot_setting()
    joints: tuple[JointDriverConfig, JointDriverConfig] = section(JointDriverConfig, keys=JOINT_NAMES)
    transport: TransportConfig = section(TransportConfig)
    rate: float = setting("Hz, transport cycles and joint_states messages", 500.0, low=1.0, high=5000.0)
    command_timeout: float = setting("s without fresh joint_commands -> zero torque", 0.05, low=1e-3, high=1.0)
    watchdog_timeout: float = setting("s, moteus firmware watchdog sent with every torque command (at least two "
                                      "cycles)", 0.05, low=1e-3, high=1.0)
    damping_gain: float = setting("N m s/rad on the actuated joint after a limit violation", 0.5, low=0.0,
                                  high=100.0)
    friction_compensation_limit: float = setting(
        "N m, bound of the passive joint's torque for the controller's opt-in friction compensation (0 = off: the "
        "passive motor is only queried outside disturbance windows; at most 0.5, as RealAIGym allowed)", 0.0,
        low=0.0, high=PASSIVE_COMPENSATION_MAX)
    damping_duration: float = setting("s of damping after a limit violation, then both motors stop", 1.0,
                                      low=0.0, high=60.0)
    diagnostics_period: float = setting("s between diagnostics messages", 0.5, low=0.01, high=60.0)
    disturbance: DisturbanceConfig = section(DisturbanceConfig)
    source: str | None = None

    @property
    def period(self) -> float:
        """Cycle period (s)."""
        return 1.0 / self.rate

    @property
    def torque_limits(self) -> tuple[float, float]:
        return (self.joints[0].torque_limit, self.joints[1].torque_limit)


def _transport(reader: ConfigReader) -> TransportConfig:
    reader.reject_unknown(setting_keys(TransportConfig))
    values = reader.settings(TransportConfig, exclude=("channel",))
    # a python-can channel may be a number (e.g. ``channel: 0`` for some interfaces)
    return TransportConfig(channel=str(reader.raw("channel", TransportConfig.channel)), **values)


def _joint(reader: ConfigReader, name: str, actuated: bool) -> JointDriverConfig:
    reader.reject_unknown(setting_keys(JointDriverConfig))
    values = reader.settings(JointDriverConfig)
    torque_limit = values["torque_limit"]
    if not actuated and torque_limit != 0.0:
        raise ConfigError(reader.source, reader.name("torque_limit"),
                          f"the passive joint '{name}' must have torque_limit 0, got {torque_limit}")
    if actuated and torque_limit == 0.0:
        raise ConfigError(reader.source, reader.name("torque_limit"), f"the actuated joint '{name}' needs a limit > 0")
    return JointDriverConfig(name=name, **values)


def driver_config_from_mapping(params: Mapping[str, Any], source: str | Path | None = None) -> DriverConfig:
    """Validate a nested parameter mapping into a :class:`DriverConfig` (errors name ``source``)."""
    reader = ConfigReader(params, source)
    reader.reject_unknown(setting_keys(DriverConfig) + list(ROS_OWN_PARAMETERS))
    values = reader.settings(DriverConfig)
    robot = values["robot"]
    joints_reader = reader.sub("joints", required=True)
    joints_reader.reject_unknown(list(JOINT_NAMES))
    joints = tuple(_joint(joints_reader.sub(name, required=True), name, i == ACTUATED_JOINT[robot])
                   for i, name in enumerate(JOINT_NAMES))
    if joints[0].can_id == joints[1].can_id:
        raise ConfigError(source, "joints.elbow.can_id", f"same CAN id as the shoulder ({joints[0].can_id})")
    if values["watchdog_timeout"] < 2.0 / values["rate"]:
        raise ConfigError(source, "watchdog_timeout", f"must cover at least two cycles ({2.0 / values['rate']:.4f} s)")
    disturbance = _disturbance(reader.sub("disturbance"))
    actuated = joints[ACTUATED_JOINT[robot]]
    if disturbance.torque_limit > actuated.torque_limit:   # the window drives the actuated motor too
        raise ConfigError(source, "disturbance.torque_limit",
                          f"{disturbance.torque_limit} N m is above the torque_limit of the actuated joint "
                          f"'{actuated.name}' ({actuated.torque_limit} N m): lower it to at most that")
    return DriverConfig(joints=joints, transport=_transport(reader.sub("transport")),  # type: ignore[arg-type]
                        disturbance=disturbance, source=str(source) if source is not None else None, **values)


def _disturbance(reader: ConfigReader) -> DisturbanceConfig:
    reader.reject_unknown(setting_keys(DisturbanceConfig))
    values = reader.settings(DisturbanceConfig)
    models = plant_models_file()
    known = plant_models(models) if models.is_file() else {}
    if values["plant_model"] not in known:
        raise ConfigError(reader.source, reader.name("plant_model"),
                          f"{values['plant_model']!r} is not a model of {models} (known: {sorted(known)})")
    return DisturbanceConfig(**values)


def plant_models_file() -> Path:
    """The plant models file the disturbance window's gravity compensation reads (the package's config)."""
    from ..paths import config_dir

    return config_dir() / PLANT_MODELS_FILE


def load_driver_config(path: str | Path, node: str = NODE_NAME) -> DriverConfig:
    """Load a driver configuration file (ROS 2 params layout for ``node``, or plain YAML)."""
    path = Path(path)
    return driver_config_from_mapping(unwrap_ros_parameters(read_yaml(path), path, node), path)
