"""YAML configuration: one source of truth for the plant, the limits and the controllers.

The robot files in ``config/`` are ROS 2 parameter files (``<node or /**>: ros__parameters: {...}``) so
the ROS nodes can take them with ``--ros-args --params-file``; the non-ROS CLI reads the very same files
through :func:`load_robot_config`. Every value is validated into a frozen dataclass, and every error
names the file and the dotted field it is about.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

ROBOTS = ("pendubot", "acrobot")
ACTUATED_JOINT = {"pendubot": 0, "acrobot": 1}
JOINT_NAMES = ("shoulder", "elbow")


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the file and the field."""

    def __init__(self, source: str | Path | None, field_name: str, problem: str) -> None:
        self.source = str(source) if source is not None else "<config>"
        self.field = field_name
        self.problem = problem
        super().__init__(f"{self.source}: field '{field_name}': {problem}")


# --------------------------------------------------------------------------------------------------
# Small validators (each raises ConfigError naming the field)


class _Reader:
    """Reads typed values out of a nested mapping, remembering the file and the field path."""

    def __init__(self, data: Mapping[str, Any], source: str | Path | None, prefix: str = "") -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(source, prefix or "<root>", f"expected a mapping, got {type(data).__name__}")
        self.data = data
        self.source = source
        self.prefix = prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def has(self, key: str) -> bool:
        return key in self.data

    def sub(self, key: str, required: bool = False) -> _Reader:
        if key not in self.data:
            if required:
                raise ConfigError(self.source, self.name(key), "missing")
            return _Reader({}, self.source, self.name(key))
        return _Reader(self.data[key], self.source, self.name(key))

    def raw(self, key: str, default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise ConfigError(self.source, self.name(key), "missing")
            return default
        return self.data[key]

    def number(self, key: str, default: Any = ..., *, positive: bool = False,
               nonnegative: bool = False, allow_none: bool = False) -> float:
        value = self.raw(key, default)
        if value is None and allow_none:
            return None  # type: ignore[return-value]
        return _check_number(value, self.source, self.name(key), positive, nonnegative)

    def integer(self, key: str, default: Any = ..., *, minimum: int | None = None) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.source, self.name(key), f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(self.source, self.name(key), f"must be >= {minimum}, got {value}")
        return value

    def vector(self, key: str, length: int, default: Any = ..., *, positive: bool = False,
               nonnegative: bool = False) -> tuple[float, ...]:
        value = self.raw(key, default)
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or len(value) != length:
            raise ConfigError(self.source, self.name(key), f"expected a list of {length} numbers, got {value!r}")
        return tuple(_check_number(v, self.source, f"{self.name(key)}[{i}]", positive, nonnegative)
                     for i, v in enumerate(value))

    def string(self, key: str, default: Any = ..., choices: Sequence[str] | None = None) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise ConfigError(self.source, self.name(key), f"expected a string, got {value!r}")
        if choices is not None and value not in choices:
            raise ConfigError(self.source, self.name(key), f"must be one of {list(choices)}, got {value!r}")
        return value

    def boolean(self, key: str, default: Any = ...) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.source, self.name(key), f"expected true or false, got {value!r}")
        return value

    def reject_unknown(self, known: Sequence[str]) -> None:
        for key in self.data:
            if key not in known:
                raise ConfigError(self.source, self.name(str(key)), f"unknown key (known: {sorted(known)})")


def _check_number(value: Any, source: Any, name: str, positive: bool, nonnegative: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(source, name, f"expected a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(source, name, f"must be finite, got {value}")
    if positive and value <= 0.0:
        raise ConfigError(source, name, f"must be positive, got {value}")
    if nonnegative and value < 0.0:
        raise ConfigError(source, name, f"must be non-negative, got {value}")
    return value


# --------------------------------------------------------------------------------------------------
# YAML files


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file; a missing or malformed file raises ConfigError naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(path, "<file>", f"cannot read: {exc.strerror or exc}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(path, "<file>", f"not valid YAML: {exc}") from exc


def unwrap_ros_parameters(data: Any, source: str | Path | None, node: str | None = None) -> dict:
    """Return the parameters of a ROS 2 params file (``/**`` merged with ``node``), or a plain mapping.

    A plain YAML mapping without ``ros__parameters`` is returned unchanged, so hand-written files
    need not use the ROS layout.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(source, "<root>", "expected a mapping at the top level")
    sections = {k: v for k, v in data.items() if isinstance(v, Mapping) and "ros__parameters" in v}
    if not sections:
        return dict(data)
    merged: dict = {}
    for key in ("/**", node):
        if key is not None and key in sections:
            params = sections[key]["ros__parameters"]
            if not isinstance(params, Mapping):
                raise ConfigError(source, f"{key}.ros__parameters", "expected a mapping")
            _deep_update(merged, params)
    if not merged:
        raise ConfigError(source, "<root>", f"no '/**' or '{node}' section with ros__parameters")
    return merged


def _deep_update(target: dict, update: Mapping) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = dict(value) if isinstance(value, Mapping) else value


# --------------------------------------------------------------------------------------------------
# Plant parameters


@dataclass(frozen=True)
class PlantParameters:
    """Physical parameters of the double pendulum (SI units; RealAIGym design C.1 conventions).

    m: link masses (kg); l: link lengths (m); r: centre-of-mass distances from the joint (m);
    I: link inertias about the joint axes (kg m^2); Ir: motor rotor inertia (kg m^2); gr: gear ratio;
    b: viscous friction (N m s/rad); cf: Coulomb friction (N m); g: gravity (m/s^2).
    """

    name: str
    m: tuple[float, float]
    l: tuple[float, float]  # noqa: E741 - the paper's symbol
    r: tuple[float, float]
    I: tuple[float, float]  # noqa: E741
    Ir: float
    gr: float
    b: tuple[float, float]
    cf: tuple[float, float]
    g: float

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], name: str, source: str | Path | None = None,
                     prefix: str = "") -> PlantParameters:
        reader = _Reader(data, source, prefix)
        reader.reject_unknown([f.name for f in fields(cls) if f.name != "name"])
        return cls(
            name=name,
            m=reader.vector("m", 2, positive=True),  # type: ignore[arg-type]
            l=reader.vector("l", 2, positive=True),  # type: ignore[arg-type]
            r=reader.vector("r", 2, nonnegative=True),  # type: ignore[arg-type]
            I=reader.vector("I", 2, positive=True),  # type: ignore[arg-type]
            Ir=reader.number("Ir", 0.0, nonnegative=True),
            gr=reader.number("gr", 1.0, positive=True),
            b=reader.vector("b", 2, (0.0, 0.0), nonnegative=True),  # type: ignore[arg-type]
            cf=reader.vector("cf", 2, (0.0, 0.0), nonnegative=True),  # type: ignore[arg-type]
            g=reader.number("g", 9.81, positive=True),
        )


def load_plant_parameters(path: str | Path, model: str) -> PlantParameters:
    """Load one named model (e.g. ``model_1.1``) from a plant-models YAML file."""
    data = read_yaml(path)
    if not isinstance(data, Mapping) or "models" not in data or not isinstance(data["models"], Mapping):
        raise ConfigError(path, "models", "missing: expected a mapping of model name -> parameters")
    models = data["models"]
    if model not in models:
        raise ConfigError(path, f"models.{model}", f"unknown plant model (known: {sorted(models)})")
    return PlantParameters.from_mapping(models[model], model, path, f"models.{model}")


# --------------------------------------------------------------------------------------------------
# Controller settings


@dataclass(frozen=True)
class LqrConfig:
    """LQR at the upright goal: weights of the continuous-time Riccati equation."""

    Q_diag: tuple[float, float, float, float] = (0.97, 0.93, 0.39, 0.26)
    R: float = 0.11


@dataclass(frozen=True)
class RoaConfig:
    """Region-of-attraction estimate of the LQR by closed-loop simulation (see control/roa.py)."""

    rho: float | None = None          # fixed value; None = estimate (cached)
    samples: int = 2000               # initial states simulated
    rho_max: float = 50.0             # largest sublevel value probed
    horizon: float = 3.0              # s of closed-loop simulation per sample
    converged_cost: float = 1e-3      # V(x_T) below this counts as stabilised
    seed: int = 0
    enter_fraction: float = 1.0       # switch to LQR when V < enter_fraction * rho
    exit_fraction: float = 1.5        # leave LQR when V > exit_fraction * rho (hysteresis)


@dataclass(frozen=True)
class DampingConfig:
    """Damping u = -gain * dq_actuated on the actuated joint while the pendulum spins too fast."""

    enabled: bool = True
    enter_speed: float = 20.0         # rad/s: max |dq| above this engages damping
    exit_speed: float = 12.0          # rad/s: max |dq| below this releases it (hysteresis)
    gain: float = 0.5                 # N m s/rad


class RobotJoints:
    """Which joint is actuated, derived from ``self.robot`` (shared by the robot and driver configs)."""

    robot: str

    @property
    def actuated_joint(self) -> int:
        return ACTUATED_JOINT[self.robot]

    @property
    def passive_joint(self) -> int:
        return 1 - self.actuated_joint


@dataclass(frozen=True)
class RobotConfig(RobotJoints):
    """Everything a controller needs to know about one robot; loaded by :func:`load_robot_config`."""

    robot: str
    plant: PlantParameters
    torque_limit: float                       # N m on the actuated joint
    policy_period: float = 0.02               # s (50 Hz)
    control_period: float = 0.002             # s (state rate: LQR and damping)
    u_max: float = 3.0                        # N m, policy output bound
    lqr: LqrConfig = field(default_factory=LqrConfig)
    roa: RoaConfig = field(default_factory=RoaConfig)
    damping: DampingConfig = field(default_factory=DampingConfig)
    source: str | None = None

    @property
    def torque_limits(self) -> tuple[float, float]:
        """Per-joint limits (N m); the passive joint's is exactly zero."""
        limits = [0.0, 0.0]
        limits[self.actuated_joint] = self.torque_limit
        return (limits[0], limits[1])

    def fingerprint(self) -> str:
        """A short hash of everything that changes the controller's behaviour (for caches)."""
        data = asdict(self)
        data.pop("source", None)
        text = json.dumps(data, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


PLANT_MODELS_FILE = "plant_models.yaml"


def robot_config_from_mapping(params: Mapping[str, Any], source: str | Path | None = None,
                              base_dir: str | Path | None = None) -> RobotConfig:
    """Validate a (nested) parameter mapping into a :class:`RobotConfig`.

    ``plant_model`` names a model in ``plant_models_file`` (resolved relative to ``base_dir``), or
    ``plant`` gives the parameters inline.
    """
    reader = _Reader(params, source)
    robot = reader.string("robot", choices=ROBOTS)
    if reader.has("plant"):
        plant = PlantParameters.from_mapping(reader.raw("plant"), reader.string("plant_model", "inline"),
                                             source, "plant")
    else:
        model = reader.string("plant_model")
        models_file = Path(reader.string("plant_models_file", PLANT_MODELS_FILE))
        if not models_file.is_absolute():
            models_file = Path(base_dir or ".") / models_file
        plant = load_plant_parameters(models_file, model)
    torque_limit = reader.number("torque_limit", positive=True)
    u_max = reader.number("u_max", 3.0, positive=True)
    if u_max > torque_limit:
        raise ConfigError(source, "u_max", f"policy bound {u_max} exceeds torque_limit {torque_limit}")
    control_period = reader.number("control_period", 0.002, positive=True)
    policy_period = reader.number("policy_period", 0.02, positive=True)
    if policy_period < control_period:
        raise ConfigError(source, "policy_period", "must not be shorter than control_period")
    return RobotConfig(
        robot=robot, plant=plant, torque_limit=torque_limit, policy_period=policy_period,
        control_period=control_period, u_max=u_max,
        lqr=_lqr_config(reader.sub("lqr")), roa=_roa_config(reader.sub("roa")),
        damping=_damping_config(reader.sub("damping")),
        source=str(source) if source is not None else None,
    )


def _lqr_config(reader: _Reader) -> LqrConfig:
    reader.reject_unknown(["Q_diag", "R"])
    default = LqrConfig()
    return LqrConfig(Q_diag=reader.vector("Q_diag", 4, default.Q_diag, nonnegative=True),  # type: ignore[arg-type]
                     R=reader.number("R", default.R, positive=True))


def _roa_config(reader: _Reader) -> RoaConfig:
    reader.reject_unknown([f.name for f in fields(RoaConfig)])
    d = RoaConfig()
    rho = reader.raw("rho", None)
    if rho in ("auto", None):
        rho = None
    else:
        rho = reader.number("rho", positive=True)
    enter = reader.number("enter_fraction", d.enter_fraction, positive=True)
    exit_ = reader.number("exit_fraction", d.exit_fraction, positive=True)
    if exit_ < enter:
        raise ConfigError(reader.source, reader.name("exit_fraction"), "must be >= enter_fraction")
    return RoaConfig(rho=rho, samples=reader.integer("samples", d.samples, minimum=1),
                     rho_max=reader.number("rho_max", d.rho_max, positive=True),
                     horizon=reader.number("horizon", d.horizon, positive=True),
                     converged_cost=reader.number("converged_cost", d.converged_cost, positive=True),
                     seed=reader.integer("seed", d.seed, minimum=0),
                     enter_fraction=enter, exit_fraction=exit_)


def _damping_config(reader: _Reader) -> DampingConfig:
    reader.reject_unknown([f.name for f in fields(DampingConfig)])
    d = DampingConfig()
    enter = reader.number("enter_speed", d.enter_speed, positive=True)
    exit_ = reader.number("exit_speed", d.exit_speed, positive=True)
    if exit_ > enter:
        raise ConfigError(reader.source, reader.name("exit_speed"), "must be <= enter_speed (hysteresis)")
    return DampingConfig(enabled=reader.boolean("enabled", d.enabled), enter_speed=enter,
                         exit_speed=exit_, gain=reader.number("gain", d.gain, nonnegative=True))


def load_robot_config(path: str | Path, node: str | None = None) -> RobotConfig:
    """Load a robot configuration file (ROS 2 params layout or plain YAML)."""
    path = Path(path)
    params = unwrap_ros_parameters(read_yaml(path), path, node)
    return robot_config_from_mapping(params, path, path.parent)
