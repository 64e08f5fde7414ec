"""YAML configuration: one source of truth for the plant, the limits and the controllers.

The robot files in ``config/`` are ROS 2 parameter files (``<node or /**>: ros__parameters: {...}``) so
the ROS nodes can take them with ``--ros-args --params-file``; the non-ROS CLI reads the very same files
through :func:`load_robot_config`. Every value is validated into a frozen dataclass, and every error
names the file and the dotted field it is about.

The schema is written once, on the dataclasses: each configurable field carries a :class:`Setting` (its
meaning with the unit, its type and its valid range) made with :func:`setting`. The loaders here and in
``hardware/config.py`` read and check every field through that metadata (:meth:`ConfigReader.settings`), and
the ROS nodes generate their parameter declarations and descriptors from it (:func:`settings_of`,
``mcpilco_ros/_ros_utils.py``), so a range is the same whether a file is read by the CLI or by a node.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

ROBOTS = ("pendubot", "acrobot")
ACTUATED_JOINT = {"pendubot": 0, "acrobot": 1}
JOINT_NAMES = ("shoulder", "elbow")
# Parameters every ROS node has by itself; a params file may set them in any section.
ROS_OWN_PARAMETERS = ("use_sim_time", "start_type_description_service")


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names the file and the field."""

    def __init__(self, source: str | Path | None, field_name: str, problem: str) -> None:
        self.source = str(source) if source is not None else "<config>"
        self.field = field_name
        self.problem = problem
        super().__init__(f"{self.source}: field '{field_name}': {problem}")

    def __reduce__(self):
        """Picklable with its fields, so that an error raised in a worker process (``evaluate_seeds(jobs=2)``)
        reaches the caller as itself instead of breaking the pool."""
        return (type(self), (self.source, self.field, self.problem))


# --------------------------------------------------------------------------------------------------
# Field metadata: the schema, written once on the dataclasses

_SETTING = "mcpilco.setting"
_SECTION = "mcpilco.section"


@dataclass(frozen=True)
class Setting:
    """What one configuration field means and which values it takes.

    description: the meaning, with the unit. kind: ``float``, ``int``, ``bool``, ``str`` or ``tuple`` (a list of
    ``length`` floats). low / high: bounds of a number, or of every element of a list (None: unbounded);
    inclusive, except that ``low_open`` makes the lower bound exclusive (value > low, e.g. "positive").
    choices: the only values allowed (strings, or e.g. ``(1, -1)``).
    """

    description: str
    kind: type = float
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[Any, ...] | None = None
    length: int | None = None

    def range_text(self) -> str:
        """The bounds as an interval, e.g. ``(0.0, 50.0]`` or ``>= 0.0`` ('' when unbounded)."""
        if self.low is not None and self.high is not None:
            return f"{'(' if self.low_open else '['}{self.low}, {self.high}]"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        return f"<= {self.high}" if self.high is not None else ""

    def problem(self, value: float) -> str | None:
        """Why ``value`` is outside the bounds or choices (None when it is fine)."""
        if self.choices is not None and value not in self.choices:
            return f"must be one of {list(self.choices)}"
        below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        if below and self.low == 0.0:
            return "must be positive" if self.low_open else "must be non-negative"
        if below or (self.high is not None and value > self.high):
            text = self.range_text()
            return f"must be in {text}" if self.low is not None and self.high is not None else f"must be {text}"
        return None

    def check(self, value: Any, source: str | Path | None, name: str) -> None:
        """Raise ConfigError naming ``source`` and ``name`` when ``value`` is out of range."""
        problem = self.problem(value)
        if problem is not None:
            raise ConfigError(source, name, f"{problem}, got {value!r}")


def setting(description: str, default: Any = MISSING, *, kind: type | None = None, low: float | None = None,
            high: float | None = None, positive: bool = False, choices: Sequence[Any] | None = None,
            length: int | None = None) -> Any:
    """A dataclass field with its :class:`Setting` (``positive``: low = 0, exclusive).

    ``kind`` and ``length`` are taken from ``default`` when it is given (else ``kind`` is float).
    """
    if kind is None:
        no_default = default is MISSING or default is None
        kind = float if no_default else tuple if isinstance(default, tuple) else type(default)
    if kind is tuple and length is None:
        length = len(default)
    if positive:
        low = 0.0
    info = Setting(description, kind, low, high, positive, tuple(choices) if choices is not None else None, length)
    if default is MISSING:
        return field(metadata={_SETTING: info})
    return field(default=default, metadata={_SETTING: info})


def section(cls: type, *, required: bool = False, keys: Sequence[str] | None = None,
            optional_fields: bool = False) -> Any:
    """A dataclass field holding the nested config ``cls`` (a mapping ``name: {...}`` in the file).

    ``keys``: the field is a tuple with one ``cls`` per key (e.g. one per joint: ``joints.shoulder.*``).
    ``optional_fields``: the section is used only when given (e.g. an inline ``plant``), so none of its fields
    has a default in the schema.
    """
    metadata = {_SECTION: (cls, tuple(keys) if keys else None, optional_fields)}
    if required or keys:
        return field(metadata=metadata)
    return field(default_factory=cls, metadata=metadata)


@dataclass(frozen=True)
class SettingField:
    """One entry of a generated schema: dotted ``name``, ``default`` (``dataclasses.MISSING`` when the file
    must give it) and its :class:`Setting`."""

    name: str
    default: Any
    setting: Setting

    @property
    def required(self) -> bool:
        return self.default is MISSING


def _default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return MISSING


def settings_of(cls: type, prefix: str = "", *, optional: bool = False) -> tuple[SettingField, ...]:
    """Every setting of the dataclass ``cls``, nested sections flattened to dotted names (``lqr.R``).

    ``optional``: report every default as MISSING (fields of a section that is used only when given).
    """
    out: list[SettingField] = []
    for f in fields(cls):
        if _SECTION in f.metadata:
            sub, keys, optional_fields = f.metadata[_SECTION]
            for key in keys or (None,):
                name = f"{prefix}{f.name}." + (f"{key}." if key is not None else "")
                out.extend(settings_of(sub, name, optional=optional or optional_fields))
        elif _SETTING in f.metadata:
            out.append(SettingField(prefix + f.name, MISSING if optional else _default(f), f.metadata[_SETTING]))
    return tuple(out)


def setting_keys(cls: type) -> list[str]:
    """The keys a mapping for ``cls`` may hold: its settings and sections."""
    return [f.name for f in fields(cls) if _SETTING in f.metadata or _SECTION in f.metadata]


# --------------------------------------------------------------------------------------------------
# Reading typed values (each raises ConfigError naming the file and the field)


class ConfigReader:
    """Reads typed values out of a nested mapping, remembering the file and the dotted field path.

    Used by every loader of the package (robot, driver and training configs): ``source`` is the file named in
    errors, ``prefix`` the dotted path of this mapping inside it.
    """

    def __init__(self, data: Mapping[str, Any], source: str | Path | None, prefix: str = "") -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(source, prefix or "<root>", f"expected a mapping, got {type(data).__name__}")
        self.data = data
        self.source = source
        self.prefix = prefix

    def name(self, key: str) -> str:
        """The dotted field name of ``key`` in the file."""
        return f"{self.prefix}.{key}" if self.prefix else key

    def has(self, key: str) -> bool:
        return key in self.data

    def sub(self, key: str, required: bool = False) -> ConfigReader:
        """A reader of the nested mapping ``key`` (empty when absent and not ``required``)."""
        if key not in self.data:
            if required:
                raise ConfigError(self.source, self.name(key), "missing")
            return ConfigReader({}, self.source, self.name(key))
        return ConfigReader(self.data[key], self.source, self.name(key))

    def raw(self, key: str, default: Any = ...) -> Any:
        """The value as written (``default`` when absent; ``...``: required)."""
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

    def value(self, key: str, info: Setting, default: Any = ...) -> Any:
        """``key`` read as ``info.kind`` and checked against ``info``'s range and choices."""
        if info.kind is bool:
            return self.boolean(key, default)
        if info.kind is str:
            return self.string(key, default, info.choices)
        if info.kind is tuple:
            values = self.vector(key, info.length or 0, default)
            for i, v in enumerate(values):
                info.check(v, self.source, f"{self.name(key)}[{i}]")
            return values
        value = self.integer(key, default) if info.kind is int else self.number(key, default)
        info.check(value, self.source, self.name(key))
        return value

    def settings(self, cls: type, exclude: Sequence[str] = ()) -> dict[str, Any]:
        """Every setting of the dataclass ``cls`` (not its sections, not ``exclude``), read and checked through
        its metadata; absent ones take the dataclass default, or are an error when it has none."""
        values = {}
        for f in fields(cls):
            if _SETTING in f.metadata and f.name not in exclude:
                default = _default(f)
                values[f.name] = self.value(f.name, f.metadata[_SETTING], ... if default is MISSING else default)
        return values

    def reject_unknown(self, known: Sequence[str]) -> None:
        """An error naming the first key that is not in ``known`` (a typo must not be ignored)."""
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
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "<file>", f"not UTF-8 text: {exc}") from exc
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
    _reject_values_outside_parameters(data, source)
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


def _reject_values_outside_parameters(data: Mapping, source: str | Path | None, prefix: str = "") -> None:
    """A value among the node names of a ROS params file (e.g. ``u_max`` indented beside ``ros__parameters``
    instead of under it) is an error naming it: rcl refuses such a file, so the CLI must not read it with that
    setting silently left out. Mappings there are node names or namespaces and are walked in turn."""
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if key == "ros__parameters":
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(source, name, "a value outside ros__parameters (ROS refuses this file): indent it "
                                            "under a node's ros__parameters")
        _reject_values_outside_parameters(value, source, name)


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
    I: link inertias about the joint axes (kg m^2, at least m r^2); Ir: motor rotor inertia (kg m^2);
    gr: gear ratio; b: viscous friction (N m s/rad); cf: Coulomb friction (N m); g: gravity (m/s^2).
    """

    name: str
    m: tuple[float, float] = setting("kg, link masses", kind=tuple, length=2, positive=True)
    l: tuple[float, float] = setting("m, link lengths", kind=tuple, length=2, positive=True)  # noqa: E741
    r: tuple[float, float] = setting("m, centre-of-mass distances from the joints", kind=tuple, length=2,
                                     low=0.0)
    I: tuple[float, float] = setting("kg m^2, link inertias about the joint axes (at least m r^2)",  # noqa: E741
                                     kind=tuple, length=2, positive=True)
    Ir: float = setting("kg m^2, motor rotor inertia", 0.0, low=0.0, high=1.0)
    gr: float = setting("gear ratio of the motor", 1.0, positive=True, high=1000.0)
    b: tuple[float, float] = setting("N m s/rad, viscous friction of the joints", (0.0, 0.0), low=0.0)
    cf: tuple[float, float] = setting("N m, Coulomb friction of the joints", (0.0, 0.0), low=0.0)
    g: float = setting("m/s^2, gravity", 9.81, positive=True, high=100.0)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], name: str, source: str | Path | None = None,
                     prefix: str = "") -> PlantParameters:
        reader = ConfigReader(data, source, prefix)
        reader.reject_unknown(setting_keys(cls))
        values = reader.settings(cls)
        for i in range(2):
            # the inertia about the joint axis is I_cm + m r^2 (parallel axes): below m r^2 the mass matrix
            # is not positive definite and the dynamics have no solution
            least = values["m"][i] * values["r"][i] ** 2
            if values["I"][i] < least * (1.0 - 1e-12):
                raise ConfigError(source, f"{reader.name('I')}[{i}]",
                                  f"must be >= m*r^2 = {least:.6g} kg m^2 (the inertia about the joint axis "
                                  f"includes the centre-of-mass offset), got {values['I'][i]}")
        return cls(name=name, **values)


def plant_models(path: str | Path) -> Mapping[str, Any]:
    """The ``models`` mapping of a plant-models YAML file; ConfigError naming it when the file is empty, a list or
    has no ``models`` mapping (a caller that only checks a name must not crash on ``None.get``)."""
    data = read_yaml(path)
    if not isinstance(data, Mapping) or "models" not in data or not isinstance(data["models"], Mapping):
        raise ConfigError(path, "models", "missing: expected a mapping of model name -> parameters")
    return data["models"]


def load_plant_parameters(path: str | Path, model: str) -> PlantParameters:
    """Load one named model (e.g. ``model_1.1``) from a plant-models YAML file."""
    models = plant_models(path)
    if model not in models:
        raise ConfigError(path, f"models.{model}", f"unknown plant model (known: {sorted(models)})")
    return PlantParameters.from_mapping(models[model], model, path, f"models.{model}")


# --------------------------------------------------------------------------------------------------
# Controller settings


@dataclass(frozen=True)
class LqrConfig:
    """LQR at the upright goal: weights of the continuous-time Riccati equation."""

    Q_diag: tuple[float, float, float, float] = setting(
        "LQR state weights of q1, q2 (1/rad^2), dq1, dq2 (s^2/rad^2)", (0.97, 0.93, 0.39, 0.26), low=0.0, high=1e6)
    R: float = setting("LQR torque weight, 1/(N m)^2", 0.11, positive=True, high=1e6)
    gain_scale: tuple[float, float, float, float] = setting(
        "factors on the LQR's gains of q1, q2, dq1, dq2 (1 = the Riccati solution's; other values e.g. tuned for the "
        "catch on a design robot)", (1.0, 1.0, 1.0, 1.0), positive=True, high=10.0)
    plant_model: str = setting("the plant the LQR and its ROA estimate are designed on: a model of plant_models_file, "
                               "e.g. one with the robot's measured links ('' = the robot config's plant, which also "
                               "places the score's line and drives the reset)", "")
    plant_models_file: str = setting("plant models YAML of plant_model, relative to the robot file",
                                     "plant_models.yaml")
    plant: PlantParameters | None = None     # plant_model's parameters, resolved when the file is read (None: '')


@dataclass(frozen=True)
class RoaConfig:
    """Region-of-attraction estimate of the LQR by closed-loop simulation (see control/roa.py)."""

    rho: float | None = setting("LQR region-of-attraction level V(x) < rho: 'auto' (estimated by simulation, "
                                "cached) or a positive number", None, kind=float, positive=True, high=1e9)
    samples: int = setting("initial states simulated for the ROA estimate", 2000, low=1, high=10_000_000)
    rho_max: float = setting("largest ROA level probed", 50.0, positive=True, high=1e9)
    horizon: float = setting("s of closed-loop simulation per ROA sample", 3.0, positive=True, high=600.0)
    converged_cost: float = setting("cost-to-go V(x_T) below which a sample counts as stabilised", 1e-3,
                                    positive=True, high=1e6)
    seed: int = setting("random seed of the ROA estimate", 0, low=0, high=2**31 - 1)
    enter_fraction: float = setting("the LQR takes over when V < enter_fraction * rho (0: never, for a robot the "
                                    "LQR's model does not describe)", 1.0, low=0.0, high=100.0)
    exit_fraction: float = setting("the LQR hands back when V > exit_fraction * rho (hysteresis, "
                                   ">= enter_fraction)", 1.5, low=0.0, high=100.0)
    reenter_below_line: bool = setting("after the LQR hands back (a lost catch), it takes over again only once the "
                                       "end effector has been below the score line: the policy swings up afresh "
                                       "instead of the LQR re-entering on the way down (off by default)", False)


@dataclass(frozen=True)
class DampingConfig:
    """Damping u = -gain * dq_actuated on the actuated joint while the pendulum spins too fast."""

    enabled: bool = setting("damp the actuated joint while the pendulum spins too fast", True)
    enter_speed: float = setting("rad/s, max |dq| above this engages damping", 20.0, positive=True, high=1e4)
    exit_speed: float = setting("rad/s, max |dq| below this releases damping (<= enter_speed)", 12.0,
                                positive=True, high=1e4)
    gain: float = setting("N m s/rad, damping gain", 0.5, low=0.0, high=1e3)


TORQUE_LIMIT_MAX = 50.0  # N m: no motor of the RealAIGym double pendulum comes near this


@dataclass(frozen=True)
class BalanceDitherConfig:
    """A periodic torque added on the actuated joint while the LQR balances (off by default).

    Why: Coulomb friction on the passive joint makes it stick near the top, and a stuck joint needs feedback of
    the opposite sign to a sliding one, so no linear balancing controller holds both (docs/learner.md, "Balance
    on the proxy"). Shaking the actuated joint keeps the passive one sliding -- with no torque on the passive
    joint. The shake's phase starts when the LQR takes over; the sum is clipped to the torque limit. Units: N m, Hz.
    """

    amplitude: float = setting("N m, amplitude of the shake added to the LQR's torque (0: off)", 0.0, low=0.0,
                               high=TORQUE_LIMIT_MAX)
    frequency: float = setting("Hz, frequency of the shake", 5.0, positive=True, high=250.0)
    shape: str = setting("waveform of the shake: sine | square", "sine", choices=("sine", "square"))

    def torque(self, elapsed: float) -> float:
        """The shake (N m) ``elapsed`` s after the LQR took over; 0 when off."""
        if self.amplitude <= 0.0:
            return 0.0
        phase = math.sin(2.0 * math.pi * self.frequency * elapsed)
        if self.shape == "square":
            return self.amplitude if phase >= 0.0 else -self.amplitude
        return self.amplitude * phase


@dataclass(frozen=True)
class CatchConfig:
    """The catch: a receding-horizon plan (iLQR on the config's plant) in place of the LQR in the outer part of the
    balancing band, lqr_level * rho <= V < exit_fraction * rho (off by default; control/catch.py says why).

    Each plan is solved one ``period`` ahead from the model's prediction, so its computation (~6 ms here) never
    delays a command: ``period`` must leave the computer that much time. Units: s.
    """

    enabled: bool = setting("plan the catch instead of the LQR in the outer band (off: the LQR alone)", False)
    period: float = setting("s, the plan's step: its torque is held this long, and the next plan must be solved "
                            "within it", 0.02, positive=True, high=1.0)
    horizon: float = setting("s, how far each plan looks ahead", 0.8, positive=True, high=10.0)
    integration_step: float = setting("s, longest RK4 step of the plan's model", 0.01, positive=True, high=1.0)
    iterations: int = setting("iLQR iterations per plan (each plan starts from the LQR's run on the model)", 2, low=1,
                              high=1000)
    lqr_level: float = setting("the LQR alone below V = lqr_level * rho (it catches there; 500 Hz feedback)", 1.0,
                               low=0.0, high=100.0)


BANK_SEPARATOR = ":"   # between the directories of ``selection.bank``, as in PATH


@dataclass(frozen=True)
class SelectionConfig:
    """Opt-in: several swing-up policies, the one to run chosen by simulating each, through the supervisor, on the
    config's plant, and keeping the one that stays above the score's line longest (control/selection.py says why and
    how); with ``dither_phases`` > 1, the balance dither's starting phase chosen with it. Off by default (``bank: ''``,
    ``dither_phases: 1``). Each decision's computation is spread evenly over ``lead``, so ``lead`` must leave the
    computer time for (lead + (candidates x dither_phases + (finalists + 1) x noise_samples) x horizon) / step
    simulated steps at most. Units: s, rad, rad/s, N m.
    """

    bank: str = setting("directory of the other candidate policies (its *.npz files, by name; relative to the robot "
                        "file), or several separated by ':' as in PATH (candidates in that order); the loaded policy "
                        "is candidate 0; '' = none (then the selection is off unless dither_phases > 1)", "")
    horizon: float = setting("s, how long each candidate is simulated", 2.5, positive=True, high=60.0)
    interval: float = setting("s between decisions while a policy is in charge (and one whenever the states resume "
                              "after a gap)", 0.5, positive=True, high=3600.0)
    lead: float = setting("s, a decision is made for the state predicted this far ahead and applied then; its "
                          "computation is spread over it", 0.04, positive=True, high=10.0)
    margin: float = setting("s above the line a candidate must gain over the running one to replace it", 0.02,
                            low=0.0, high=60.0)
    step: float = setting("s, the simulations' RK4 step, at which their supervisor runs too (a whole number of "
                          "control periods that divides lead and policy_period: longer = less computation, a "
                          "coarser prediction)", 0.002, positive=True, high=0.1)
    plant_model: str = setting("the plant the candidates are simulated on: a model of plant_models_file, e.g. one "
                               "identified from the robot's trials ('' = the robot config's plant)", "")
    plant_models_file: str = setting("plant models YAML of plant_model, relative to the robot file",
                                     "plant_models.yaml")
    dither_phases: int = setting("starting phases of the balance dither tried with each candidate, evenly spaced over "
                                 "its period (1 = the configured phase only; 2 = first push up or down); the work "
                                 "grows with it", 1, low=1, high=8)
    delay: float = setting("s, the sensors' delay in the simulations: their supervisor sees the model's state "
                           "int(delay / step) steps old, as the robot's controller does (its identified delay; 0 = "
                           "the exact state)", 0.0, low=0.0, high=1.0)
    predict_delay: bool = setting("with delay > 0: take the measured state for the robot's state delay ago, so each "
                                  "decision's model first catches up with the robot over the delay (the last command "
                                  "held) and its supervisor sees states that old from the start (off: the measured "
                                  "state is taken for the present one)", False)
    noise_samples: int = setting("noisy simulations of each finalist (0 = off: the noise-free simulations alone "
                                 "decide); the finalists' values are then the mean time above the line of these, with "
                                 "the sensors' and the torque's noise below (the same noise for every finalist); the "
                                 "work grows by finalists x noise_samples simulations", 0, low=0, high=64)
    finalists: int = setting("the options with the longest noise-free time above the line that are simulated again "
                             "with noise (the running one is always among them)", 3, low=1, high=64)
    measurement_noise: tuple[float, float, float, float] = setting(
        "std of the readings' noise in the noisy simulations, q1, q2 (rad), dq1, dq2 (rad/s): the robot's, e.g. as "
        "identified from its trials", (0.0, 0.0, 0.0, 0.0), low=0.0, high=100.0)
    torque_noise: float = setting("N m, std of the noise on the actuated joint's torque in the noisy simulations",
                                  0.0, low=0.0, high=100.0)
    workers: int = setting("processes that compute the decisions beside a real-time controller (the ROS controller "
                           "node), each on its own core (0 = in the control loop, spread over the lead); a decision "
                           "not ready when due is dropped there and the running policy goes on. The evaluator "
                           "computes the same decisions in its own process", 0, low=0, high=16)
    plant: PlantParameters | None = None     # plant_model's parameters, resolved when the file is read (None: '')

    @property
    def enabled(self) -> bool:
        return bool(self.bank) or self.dither_phases > 1


@dataclass(frozen=True)
class ObserverConfig:
    """Opt-in: the supervisor acts on a filtered state (control/observer.py says why and how). Off by default: the
    measured state as it comes. Units: rad, rad/s, rad/s^2."""

    enabled: bool = setting("filter the measured state before the controller acts on it (off: as measured)", False)
    process_noise: float = setting("rad/s^2, std of what the plant's prediction gets wrong in the acceleration "
                                   "(smaller = a smoother, slower estimate)", 10.0, positive=True, high=1e6)
    position_noise: float = setting("rad, std of the angle readings' noise", 1e-4, positive=True, high=1.0)
    velocity_noise: float = setting("rad/s, std of the velocity readings' noise", 0.05, positive=True, high=100.0)
    motor_responsiveness: float = setting("r of the motor's lag u += r (u_cmd - u) per control period, in the "
                                          "prediction (1 = none)", 1.0, positive=True, high=1.0)


PASSIVE_COMPENSATION_MAX = 0.5  # N m: RealAIGym's hardware stage allowed this much on the passive joint


@dataclass(frozen=True)
class FrictionCompensationConfig:
    """Opt-in: the passive joint's own motor cancels that joint's friction, and nothing else.

    RealAIGym's hardware stage allowed up to 0.5 N m on the passive joint for this, and every real-robot entry
    used it. Off by default: with it off the passive joint gets exactly 0, always. Torque (N m) on the passive
    joint: clip(viscous dq + coulomb arctan(steepness dq), -limit, limit), dq its measured velocity (rad/s).
    """

    enabled: bool = setting("cancel the passive joint's friction with its motor (off: exactly 0 N m there)", False)
    limit: float = setting("N m, bound of the compensation torque on the passive joint", 0.5, low=0.0,
                           high=PASSIVE_COMPENSATION_MAX)
    coulomb: float = setting("N m, the passive joint's Coulomb friction to cancel", 0.0, low=0.0,
                             high=PASSIVE_COMPENSATION_MAX)
    viscous: float = setting("N m s/rad, the passive joint's viscous friction to cancel", 0.0, low=0.0, high=1.0)
    steepness: float = setting("s/rad, k of coulomb * arctan(k dq) (RealAIGym's friction model: 100)", 100.0,
                               positive=True, high=1e4)

    def torque(self, dq: float) -> float:
        """The compensation torque (N m) for the passive joint's velocity ``dq`` (rad/s); 0 when disabled."""
        if not self.enabled or not math.isfinite(dq):
            return 0.0
        u = self.viscous * dq + self.coulomb * math.atan(self.steepness * dq)
        return min(max(u, -self.limit), self.limit)


class RobotJoints:
    """Which joint is actuated, derived from ``self.robot`` (shared by the robot and driver configs)."""

    robot: str

    @property
    def actuated_joint(self) -> int:
        return ACTUATED_JOINT[self.robot]

    @property
    def passive_joint(self) -> int:
        return 1 - self.actuated_joint


def robot_setting() -> Any:
    """The ``robot`` field of the robot and driver configs."""
    return setting("which robot: 'pendubot' (shoulder actuated) or 'acrobot' (elbow actuated)", kind=str,
                   choices=ROBOTS)




@dataclass(frozen=True)
class RobotConfig(RobotJoints):
    """Everything a controller needs to know about one robot; loaded by :func:`load_robot_config`."""

    robot: str = robot_setting()
    plant: PlantParameters = section(PlantParameters, required=True, optional_fields=True)
    torque_limit: float = setting("N m, torque limit of the actuated joint (the passive joint always gets 0)",
                                  positive=True, high=TORQUE_LIMIT_MAX)
    policy_period: float = setting("s, swing-up policy period (its output is held in between)", 0.02,
                                   low=1e-4, high=1.0)
    control_period: float = setting("s, state period: LQR and damping run on every state; the simulated "
                                    "robot's RK4 step", 0.002, low=1e-4, high=0.1)
    u_max: float = setting("N m, bound of the swing-up policy's output (<= torque_limit)", 3.0, positive=True,
                           high=TORQUE_LIMIT_MAX)
    lqr: LqrConfig = section(LqrConfig)
    roa: RoaConfig = section(RoaConfig)
    damping: DampingConfig = section(DampingConfig)
    friction_compensation: FrictionCompensationConfig = section(FrictionCompensationConfig)
    dither: BalanceDitherConfig = section(BalanceDitherConfig)
    catch: CatchConfig = section(CatchConfig)
    selection: SelectionConfig = section(SelectionConfig)
    observer: ObserverConfig = section(ObserverConfig)
    source: str | None = None

    @property
    def torque_limits(self) -> tuple[float, float]:
        """Per-joint limits (N m); the passive joint's is exactly zero (the compensation limit when the opt-in
        friction compensation is on)."""
        limits = [0.0, 0.0]
        limits[self.actuated_joint] = self.torque_limit
        if self.friction_compensation.enabled:
            limits[self.passive_joint] = self.friction_compensation.limit
        return (limits[0], limits[1])

    def fingerprint(self) -> str:
        """A short hash of everything that changes the controller's behaviour (for caches)."""
        data = asdict(self)
        data.pop("source", None)
        if tuple(self.lqr.gain_scale) == (1.0, 1.0, 1.0, 1.0):   # the Riccati gains: as before the option existed
            data["lqr"].pop("gain_scale")
        for key in ("plant_model", "plant_models_file"):         # the LQR's plant counts by its parameters
            data["lqr"].pop(key)
        if self.lqr.plant is None:                                 # the config's plant: as before the option existed
            data["lqr"].pop("plant")
        if not self.friction_compensation.enabled:      # off: the same controller as before the option existed
            data.pop("friction_compensation")
        if self.dither.amplitude <= 0.0:                # off: likewise
            data.pop("dither")
        if not self.catch.enabled:                      # off: likewise
            data.pop("catch")
        if not self.selection.enabled:                  # off: likewise
            data.pop("selection")
        if not self.observer.enabled:                   # off: likewise
            data.pop("observer")
        if not self.roa.reenter_below_line:             # off: likewise
            data["roa"].pop("reenter_below_line")
        text = json.dumps(data, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


PLANT_MODELS_FILE = "plant_models.yaml"
# Where the plant comes from when it is not given inline as ``plant: {m: ..., ...}``.
PLANT_SOURCE_SETTINGS = (
    SettingField("plant_model", MISSING, Setting("plant model name in plant_models_file (model_1.1 = simulation, "
                                                 "model_1.0 = identified hardware); not needed with an inline "
                                                 "plant", str)),
    SettingField("plant_models_file", PLANT_MODELS_FILE,
                 Setting("plant models YAML, relative to the robot file's directory", str)),
)


def robot_settings() -> tuple[SettingField, ...]:
    """Every parameter a robot file may set (the ``/**`` section of ``config/<robot>.yaml``): the plant's
    source, then the settings of :class:`RobotConfig` (an inline plant as the optional ``plant.*``)."""
    own = settings_of(RobotConfig)
    return own[:1] + PLANT_SOURCE_SETTINGS + own[1:]


def robot_config_from_mapping(params: Mapping[str, Any], source: str | Path | None = None,
                              base_dir: str | Path | None = None) -> RobotConfig:
    """Validate a (nested) parameter mapping into a :class:`RobotConfig`.

    ``plant_model`` names a model in ``plant_models_file`` (resolved relative to ``base_dir``), or
    ``plant`` gives the parameters inline. An unknown key is an error naming it (a typo such as ``umax``
    must not leave the default in force).
    """
    reader = ConfigReader(params, source)
    reader.reject_unknown(setting_keys(RobotConfig) + [s.name for s in PLANT_SOURCE_SETTINGS]
                          + list(ROS_OWN_PARAMETERS))
    values = reader.settings(RobotConfig)
    plant_source = {s.name: s for s in PLANT_SOURCE_SETTINGS}
    if reader.has("plant"):
        plant = PlantParameters.from_mapping(reader.raw("plant"),
                                             reader.value("plant_model", plant_source["plant_model"].setting,
                                                          "inline"), source, "plant")
    else:
        model = reader.value("plant_model", plant_source["plant_model"].setting)
        models_file = _models_file(source, "plant_models_file", base_dir,
                                   reader.value("plant_models_file", plant_source["plant_models_file"].setting,
                                                PLANT_MODELS_FILE))
        plant = load_plant_parameters(models_file, model)
    if values["u_max"] > values["torque_limit"]:
        raise ConfigError(source, "u_max", f"policy bound {values['u_max']} exceeds torque_limit "
                                           f"{values['torque_limit']}")
    if values["policy_period"] < values["control_period"]:
        raise ConfigError(source, "policy_period", "must not be shorter than control_period")
    if not whole_periods(values["policy_period"], values["control_period"]):
        raise ConfigError(source, "policy_period", f"{values['policy_period']} s is not a whole number of "
                                                   f"control periods ({values['control_period']} s)")
    dither = _section(reader, "dither", BalanceDitherConfig)
    if dither.amplitude > values["torque_limit"]:
        raise ConfigError(source, "dither.amplitude", f"{dither.amplitude} N m exceeds torque_limit "
                                                      f"{values['torque_limit']} N m")
    nyquist = 0.5 / values["control_period"]
    if dither.frequency >= nyquist:   # sampled at the control rate, such a shake is off or a DC offset
        raise ConfigError(source, "dither.frequency", f"{dither.frequency:g} Hz is not below half the control "
                                                      f"rate ({nyquist:g} Hz): the shake would vanish or turn into "
                                                      "an offset")
    roa = _roa_config(reader.sub("roa"))
    catch = _catch_config(reader, values["control_period"], roa)
    selection = _selection_config(reader, values["control_period"], values["policy_period"], catch, dither,
                                  base_dir)
    return RobotConfig(plant=plant, lqr=_lqr_config(reader, base_dir), roa=roa,
                       damping=_damping_config(reader.sub("damping")),
                       friction_compensation=_section(reader, "friction_compensation", FrictionCompensationConfig),
                       dither=dither, catch=catch, selection=selection,
                       observer=_section(reader, "observer", ObserverConfig),
                       source=str(source) if source is not None else None, **values)


def whole_periods(period: float, control_period: float) -> bool:
    """Whether ``period`` (s) is one or more whole control periods: the controller acts only when a state comes."""
    periods = period / control_period
    return abs(periods - round(periods)) <= 1e-6 and round(periods) >= 1


def _lqr_config(reader: ConfigReader, base_dir: Path | None) -> LqrConfig:
    """The ``lqr`` section, its ``plant_model`` read from ``plant_models_file`` (relative to the robot file)."""
    lqr = _section(reader, "lqr", LqrConfig)
    return replace(lqr, plant=_section_plant(reader.source, "lqr", base_dir, lqr.plant_model, lqr.plant_models_file))


def _catch_config(reader: ConfigReader, control_period: float, roa: RoaConfig) -> CatchConfig:
    catch = _section(reader, "catch", CatchConfig)
    source = reader.source
    if not whole_periods(catch.period, control_period):
        raise ConfigError(source, "catch.period", f"{catch.period} s is not a whole number of control periods "
                                                  f"({control_period} s)")
    if catch.horizon < catch.period:
        raise ConfigError(source, "catch.horizon", f"{catch.horizon} s is shorter than catch.period "
                                                   f"({catch.period} s)")
    if catch.enabled and catch.lqr_level > roa.exit_fraction:
        raise ConfigError(source, "catch.lqr_level", f"{catch.lqr_level} exceeds roa.exit_fraction "
                                                     f"({roa.exit_fraction}): the plan would never act")
    return catch


def _beside(base_dir: str | Path | None, value: str) -> Path:
    """A path a robot file names: as given when absolute, else relative to the robot file's directory."""
    path = Path(value)
    return path if path.is_absolute() else Path(base_dir or ".") / path


def _models_file(source: str | Path | None, field_name: str, base_dir: str | Path | None, value: str) -> Path:
    """The plant models YAML the robot file's ``field_name`` names (:func:`_beside`); ConfigError when missing."""
    path = _beside(base_dir, value)
    if not path.is_file():
        raise ConfigError(source, field_name, f"no such file: {path}")
    return path


def _selection_config(reader: ConfigReader, control_period: float, policy_period: float, catch: CatchConfig,
                      dither: BalanceDitherConfig, base_dir: str | Path | None) -> SelectionConfig:
    selection = _section(reader, "selection", SelectionConfig)
    source = reader.source
    if not whole_periods(selection.lead, control_period):
        raise ConfigError(source, "selection.lead", f"{selection.lead} s is not a whole number of control periods "
                                                    f"({control_period} s)")
    for name, period in (("lead", selection.lead), ("policy_period", policy_period)):
        if not whole_periods(period, selection.step):
            raise ConfigError(source, "selection.step", f"{selection.step} s does not divide {name} ({period} s)")
    if not whole_periods(selection.step, control_period):
        raise ConfigError(source, "selection.step", f"{selection.step} s is not a whole number of control periods "
                                                    f"({control_period} s)")
    if selection.predict_delay and int(selection.delay / selection.step) < 1:
        raise ConfigError(source, "selection.predict_delay", f"a delay of {selection.delay} s is no whole simulation "
                          f"step ({selection.step} s) to predict over: set selection.delay, or false")
    if selection.dither_phases > 1 and dither.amplitude <= 0.0:
        raise ConfigError(source, "selection.dither_phases", f"{selection.dither_phases} phases of a balance dither "
                          "that is off (dither.amplitude 0): set 1, or turn the dither on")
    if not selection.enabled:
        return selection
    if catch.enabled:
        raise ConfigError(source, "selection.bank" if selection.bank else "selection.dither_phases",
                          "the selection does not run with the catch plan (catch.enabled): its simulations would have "
                          "to solve the plans too")
    parts = selection.bank.split(BANK_SEPARATOR) if selection.bank else []
    if any(not part.strip() for part in parts):
        raise ConfigError(source, "selection.bank", f"an empty directory name in {selection.bank!r} (directories are "
                                                    f"separated by {BANK_SEPARATOR!r})")
    banks = [_beside(base_dir, part.strip()) for part in parts]
    for bank in banks:
        if not bank.is_dir():
            raise ConfigError(source, "selection.bank", f"no such directory: {bank}")
    return replace(selection, bank=BANK_SEPARATOR.join(str(bank.resolve()) for bank in banks),
                   plant=_section_plant(source, "selection", base_dir, selection.plant_model,
                                        selection.plant_models_file))


def _section_plant(source: str | Path | None, section: str, base_dir: str | Path | None, model: str,
                   models_file: str) -> PlantParameters | None:
    """The plant a section names by ``plant_model`` in ``plant_models_file`` (relative to the robot file; None when
    ``model`` is ''); ConfigError naming ``<section>.plant_model`` or ``<section>.plant_models_file``."""
    if not model:
        return None
    path = _models_file(source, f"{section}.plant_models_file", base_dir, models_file)
    try:
        return load_plant_parameters(path, model)
    except ConfigError as exc:
        raise ConfigError(source, f"{section}.plant_model", str(exc)) from exc


def _section(reader: ConfigReader, key: str, cls: type) -> Any:
    """The nested config ``cls`` from ``reader``'s mapping ``key``: unknown keys refused, settings checked."""
    sub = reader.sub(key)
    sub.reject_unknown(setting_keys(cls))
    return cls(**sub.settings(cls))


def _roa_config(reader: ConfigReader) -> RoaConfig:
    reader.reject_unknown(setting_keys(RoaConfig))
    values = reader.settings(RoaConfig, exclude=("rho",))
    rho = reader.raw("rho", None)
    if rho not in ("auto", None):
        rho = reader.value("rho", RoaConfig.__dataclass_fields__["rho"].metadata[_SETTING])
    else:
        rho = None
    if values["exit_fraction"] < values["enter_fraction"]:
        raise ConfigError(reader.source, reader.name("exit_fraction"), "must be >= enter_fraction")
    return RoaConfig(rho=rho, **values)


def _damping_config(reader: ConfigReader) -> DampingConfig:
    reader.reject_unknown(setting_keys(DampingConfig))
    values = reader.settings(DampingConfig)
    if values["exit_speed"] > values["enter_speed"]:
        raise ConfigError(reader.source, reader.name("exit_speed"), "must be <= enter_speed (hysteresis)")
    return DampingConfig(**values)


def load_robot_config(path: str | Path, node: str | None = None) -> RobotConfig:
    """Load a robot configuration file (ROS 2 params layout or plain YAML)."""
    path = Path(path)
    params = unwrap_ros_parameters(read_yaml(path), path, node)
    return robot_config_from_mapping(params, path, path.parent)


def copy_robot_config(source: str | Path, directory: str | Path) -> Path:
    """Copy a robot config into ``directory`` as ``robot_config.yaml`` with what it names by a relative path: the
    plant-models files (its own plant's, and the ``lqr`` and ``selection`` sections' when they name a plant) and the
    selection's bank of candidate policies, so that the copy loads on its own (``mcpilco evaluate --config
    RUN/robot_config.yaml``, ``RunDirectory.load_config``). Returns the copy's path.

    Runs and session directories keep such a copy: the robot a policy was learnt or recorded with stays readable
    after the repository's files have changed or gone. The copy is the file byte for byte, except with a bank: then
    its policies are copied to ``selection_bank/`` and the copy names them there (rewritten YAML, a header says so)."""
    source, directory = Path(source), Path(directory)
    target = directory / "robot_config.yaml"
    data = read_yaml(source)
    params = unwrap_ros_parameters(data, source)
    names = [] if "plant" in params else [params.get("plant_models_file", PLANT_MODELS_FILE)]
    for section_name in ("lqr", "selection"):
        sub = params.get(section_name)
        if isinstance(sub, Mapping) and sub.get("plant_model"):
            names.append(sub.get("plant_models_file", PLANT_MODELS_FILE))
    for name in map(Path, map(str, names)):
        if not name.is_absolute() and (source.parent / name).is_file():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source.parent / name, directory / name)
    bank = _copy_selection_bank(params, source.parent, directory)
    if bank is None:
        shutil.copyfile(source, target)
        return target
    for mapping in [data, *(v["ros__parameters"] for v in data.values()
                            if isinstance(v, Mapping) and isinstance(v.get("ros__parameters"), Mapping))]:
        if isinstance(mapping.get("selection"), Mapping) and "bank" in mapping["selection"]:
            mapping["selection"]["bank"] = bank
    header = f"# copied from {source}; selection.bank's policies copied into {SELECTION_BANK_DIR}/\n"
    target.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return target


SELECTION_BANK_DIR = "selection_bank"


def _copy_selection_bank(params: Mapping[str, Any], base_dir: Path, directory: Path) -> str | None:
    """Copy each directory of ``selection.bank`` (its ``*.npz`` files, in order) to ``directory/selection_bank/
    NN_name``; the bank setting naming the copies, or None when there is no bank or one of its directories is
    missing (the copy then stays the file as it is, which reports the missing directory when loaded)."""
    selection = params.get("selection")
    bank = selection.get("bank") if isinstance(selection, Mapping) else None
    if not bank or not isinstance(bank, str):
        return None
    sources = [_beside(base_dir, part.strip()) for part in bank.split(BANK_SEPARATOR)]
    if not all(part.is_dir() for part in sources):
        return None
    copies = []
    for index, part in enumerate(sources):
        name = f"{SELECTION_BANK_DIR}/{index:02d}_{part.resolve().name}"
        (directory / name).mkdir(parents=True, exist_ok=True)
        for policy in sorted(part.glob("*.npz")):
            shutil.copyfile(policy, directory / name / policy.name)
        copies.append(name)
    return BANK_SEPARATOR.join(copies)
