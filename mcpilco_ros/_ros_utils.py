"""Helpers shared by the mcpilco_ros nodes: parameters, the one node preamble, diagnostics, main().

Why one module: every node declares the same robot parameters (the ``/**`` section of ``config/<robot>.yaml``),
generated from the field metadata of mcpilco_core's config dataclasses (:func:`param_specs`), builds its
validated config the same way (:class:`ConfiguredNode`) and shuts down the same way (:func:`run_node`). The
JointState checks are in ``_messages``. The nodes themselves stay thin translations between messages and
``mcpilco_core`` calls.
"""

from __future__ import annotations

import gc
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import (
    InvalidParameterTypeException,
    InvalidParameterValueException,
    ParameterUninitializedException,
)
from rclpy.executors import SingleThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.parameter import Parameter

from mcpilco_core.config import (
    ROS_OWN_PARAMETERS,
    ConfigError,
    RobotConfig,
    SettingField,
    read_yaml,
    robot_config_from_mapping,
    robot_settings,
)
from mcpilco_core.paths import config_dir

# The message helpers live in _messages; the names stay importable from here for the tests and benchmarks.
from ._messages import CONTROL_QOS, command_message, effort_from_message, joint_order, stamp_ns, state_from_message

RCLError = _rclpy.RCLError  # what rclpy.init raises when rcl refuses its arguments

# OK / WARN / ERROR as plain ints (DiagnosticStatus uses bytes in some distributions).
OK, WARN, ERROR = (int.from_bytes(v, "little") if isinstance(v, bytes) else int(v)
                   for v in (DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR))


class ParameterError(ValueError):
    """A ROS parameter has an invalid value; the message names the parameter and the problem."""


# --------------------------------------------------------------------------------------------------
# Parameters

_ROS_TYPES = {float: Parameter.Type.DOUBLE, int: Parameter.Type.INTEGER, str: Parameter.Type.STRING,
              bool: Parameter.Type.BOOL}


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter: name, default (its type is the parameter's type), description (with
    units) and an optional inclusive range and set of choices.

    ``length``: a list of that many finite numbers. ``default`` MISSING (``dataclasses.MISSING``): declared
    with ``kind`` only, and left out of the values when
    the params file does not set it (mcpilco_core then says it is missing, or uses what it means to be absent,
    e.g. no inline plant). ``dynamic`` admits several types (e.g. ``roa.rho``: "auto" or a number; lists that
    may be written as integers), validated by mcpilco_core instead of by ROS."""

    name: str
    default: Any
    description: str
    low: float | None = None
    high: float | None = None
    dynamic: bool = False
    read_only: bool = True
    kind: type | None = None
    choices: tuple[Any, ...] | None = None
    constraints: str = ""
    length: int | None = None

    def descriptor(self) -> ParameterDescriptor:
        desc = ParameterDescriptor(description=self.description, read_only=self.read_only,
                                   dynamic_typing=self.dynamic)
        kind = self.kind or type(self.default)
        if self.low is not None and self.high is not None and not self.dynamic:
            if kind is int:
                desc.integer_range = [IntegerRange(from_value=int(self.low), to_value=int(self.high), step=0)]
            elif kind is float:
                desc.floating_point_range = [FloatingPointRange(from_value=float(self.low),
                                                                to_value=float(self.high), step=0.0)]
        text = self.constraints or (f"range [{self.low}, {self.high}]" if self.low is not None
                                    and self.high is not None else "")
        if self.choices is not None:
            text = "; ".join(t for t in (text, f"one of {list(self.choices)}") if t)
        desc.additional_constraints = text
        return desc

    def declare(self, node: Node) -> Any:
        """Declare the parameter on ``node``; its value (None when it has no default and is not set)."""
        desc = self.descriptor()
        if self.default is not MISSING:
            return node.declare_parameter(self.name, self.default, desc).value
        if self.dynamic:
            return node.declare_parameter(self.name, None, desc).value
        return node.declare_parameter(self.name, _ROS_TYPES[self.kind or float], desc).value


def param_specs(settings: Iterable[SettingField]) -> tuple[ParamSpec, ...]:
    """ParamSpecs generated from mcpilco_core's field metadata: the same description, range and choices the
    YAML loaders enforce. Lists and optional values are dynamically typed and checked by mcpilco_core."""
    specs = []
    for field in settings:
        info = field.setting
        default = list(field.default) if isinstance(field.default, tuple) else field.default
        specs.append(ParamSpec(field.name, default, info.description, info.low, info.high,
                               dynamic=info.kind is tuple or field.default is None, kind=info.kind,
                               choices=info.choices, constraints=info.range_text()))
    return tuple(specs)


def declare(node: Node, specs: Iterable[ParamSpec]) -> dict[str, Any]:
    """Declare ``specs`` on ``node`` and return their values; a bad override raises ParameterError.

    A parameter without a default that the params file does not set is left out of the values.
    """
    values: dict[str, Any] = {}
    for spec in specs:
        try:
            value = spec.declare(node)
        except InvalidParameterTypeException as exc:
            expected = (spec.kind or type(spec.default)).__name__
            raise ParameterError(f"parameter '{spec.name}': wrong type ({exc}); expected {expected}"
                                 f"{' (write 6.0, not 6)' if expected == 'float' else ''}") from exc
        except InvalidParameterValueException as exc:
            raise ParameterError(f"parameter '{spec.name}': {_value_problem(exc)} "
                                 f"(allowed range {spec.constraints or [spec.low, spec.high]})") from exc
        except ParameterUninitializedException as exc:
            raise ParameterError(f"parameter '{spec.name}': not set") from exc
        if value is None and spec.default is MISSING:
            continue
        if spec.choices is not None and value not in spec.choices:
            raise ParameterError(f"parameter '{spec.name}': must be one of {list(spec.choices)}, got {value!r}")
        if spec.length is not None and (len(value) != spec.length or not all(math.isfinite(v) for v in value)):
            raise ParameterError(f"parameter '{spec.name}': expected {spec.length} finite numbers, got {list(value)}")
        values[spec.name] = value
    return values


def _value_problem(exc: Exception) -> str:
    text = str(exc)
    return text.split("\n")[0]


def refuse_unknown_overrides(node: Node) -> None:
    """Refuse overrides (params file, ``-p``) that no declared parameter takes: a typo such as ``umax`` must not
    leave the default in force. ROS's own parameters and ``qos_overrides.*`` are fine."""
    overrides = getattr(node, "_parameter_overrides", {}) or {}
    unknown = sorted(name for name in overrides
                     if not node.has_parameter(name) and name not in ROS_OWN_PARAMETERS
                     and not name.startswith("qos_overrides."))
    if unknown:
        others = f"; also unknown: {unknown[1:]}" if len(unknown) > 1 else ""
        raise ParameterError(f"parameter '{unknown[0]}': unknown to {node.get_name()} (a typo?){others}")


def nest(flat: Mapping[str, Any]) -> dict:
    """{'lqr.R': 1} -> {'lqr': {'R': 1}}: the layout mcpilco_core's config readers take."""
    nested: dict = {}
    for key, value in flat.items():
        parts = key.split(".")
        target = nested
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = list(value) if isinstance(value, (list, tuple, np.ndarray)) else value
    return nested


def validated(build: Callable[..., Any], *args: Any) -> Any:
    """``build(*args)`` with a ConfigError from mcpilco_core's validation turned into a ParameterError naming
    the parameter (its dotted field)."""
    try:
        return build(*args)
    except ConfigError as exc:
        raise ParameterError(f"parameter '{exc.field}': {exc.problem}") from exc


def robot_config_from_parameters(values: Mapping[str, Any]) -> RobotConfig:
    """Validate the declared robot parameters into a RobotConfig (same rules as the YAML/CLI path).

    The config's ``source`` is ``config/<robot>.yaml`` of the package, so the ROA cache beside it is shared
    with the CLI when the values are that file's; other values keep their estimate in the user cache, keyed by
    fingerprint (``control.roa``), and never overwrite the file's.
    """
    base = config_dir()
    return validated(robot_config_from_mapping, nest(values), base / f"{values.get('robot')}.yaml", base)


@dataclass(frozen=True)
class ConfigSchema:
    """The parameters generated from one config dataclass, and how their values become that config."""

    parameters: tuple[ParamSpec, ...]
    build: Callable[[Mapping[str, Any]], Any]


# The robot parameters of config/<robot>.yaml's ``/**`` section, generated from the metadata of
# mcpilco_core.config's dataclasses (the moteus driver's come the same way from mcpilco_core.hardware.config).
ROBOT_PARAMETERS: tuple[ParamSpec, ...] = param_specs(robot_settings())
ROBOT_SCHEMA = ConfigSchema(ROBOT_PARAMETERS, robot_config_from_parameters)


# The period of the diagnostics timer of ConfiguredNode (the moteus driver's is part of its config).
DIAGNOSTICS_PERIOD = ParamSpec("diagnostics_period", 1.0, "s between diagnostics messages", 0.01, 60.0)


class ConfiguredNode(Node):
    """The one preamble of the package's nodes.

    Declares the parameters of ``schema`` (the robot's, or the moteus driver's) and the node's ``own``
    ParamSpecs, refuses overrides that none of them takes, validates the config into ``self.config`` (or takes
    ``config`` as given) and keeps the own values in ``self.p``. Creates the ``diagnostics`` publisher, and the
    ``done`` event and ``exit_code`` that :func:`run_node` watches. With ``diagnostics_timer`` it also declares
    ``diagnostics_period`` (s) and calls ``publish_diagnostics()`` that often once the node spins. Bad
    parameters raise ParameterError naming the parameter.
    """

    def __init__(self, name: str, own: Sequence[ParamSpec], schema: ConfigSchema = ROBOT_SCHEMA,
                 config: Any = None, diagnostics_timer: bool = True, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.title = name
        values = declare(self, schema.parameters)
        self.p = declare(self, (*own, DIAGNOSTICS_PERIOD) if diagnostics_timer else own)
        refuse_unknown_overrides(self)
        self.config = config if config is not None else schema.build(values)
        self.done = threading.Event()   # run_node() leaves when set
        self.exit_code = 0
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "diagnostics", 10)
        if diagnostics_timer:
            self.create_timer(float(self.p["diagnostics_period"]), self.publish_diagnostics)

    def publish_diagnostics(self) -> None:
        """The node's status on ``diagnostics`` (see :meth:`publish_status`); called every diagnostics_period."""
        raise NotImplementedError

    def diagnostics_array(self, statuses: Sequence[DiagnosticStatus], stamp: Any = None) -> DiagnosticArray:
        """A DiagnosticArray of ``statuses`` stamped ``stamp`` (default: now)."""
        array = DiagnosticArray()
        array.header.stamp = stamp if stamp is not None else self.get_clock().now().to_msg()
        array.status = list(statuses)
        return array

    def publish_status(self, what: str, level: int, message: str, values: Mapping[str, Any]) -> None:
        """Publish one status ``"<node>: <what>"`` (hardware id: the robot) on ``diagnostics``."""
        self.diagnostics_pub.publish(self.diagnostics_array(
            [status(f"{self.title}: {what}", self.config.robot, level, message, values)]))

    def on_shutdown(self) -> None:
        """Called by :func:`run_node` while the context is still up (e.g. to publish a zero command)."""


# --------------------------------------------------------------------------------------------------
# Diagnostics and timing


def key_values(values: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=str(k), value=_fmt(v)) for k, v in values.items()]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def status(name: str, hardware_id: str, level: int, message: str, values: Mapping[str, Any]) -> DiagnosticStatus:
    st = DiagnosticStatus()
    st.level = level.to_bytes(1, "little") if isinstance(DiagnosticStatus.OK, bytes) else level
    st.name = name
    st.hardware_id = hardware_id
    st.message = message
    st.values = key_values(values)
    return st


class RingStats:
    """The last ``size`` samples of a quantity (e.g. step compute time in s) and their percentiles."""

    def __init__(self, size: int = 2000) -> None:
        self._data = np.zeros(size)
        self._n = 0

    def add(self, value: float) -> None:
        self._data[self._n % len(self._data)] = value
        self._n += 1

    @property
    def count(self) -> int:
        return self._n

    def summary(self, scale: float = 1.0) -> dict[str, float]:
        """{'p50', 'p99', 'max', 'mean'} of the stored samples times ``scale`` (nan when empty)."""
        n = min(self._n, len(self._data))
        if n == 0:
            return {"p50": math.nan, "p99": math.nan, "max": math.nan, "mean": math.nan}
        data = self._data[:n] * scale
        p50, p99 = np.percentile(data, [50, 99])
        return {"p50": float(p50), "p99": float(p99), "max": float(data.max()), "mean": float(data.mean())}


# --------------------------------------------------------------------------------------------------
# main()


def check_params_files(args: Sequence[str]) -> None:
    """Read every ``--params-file`` of ``args`` before rcl does: a missing or malformed file (or one without
    the ``<node>: ros__parameters: {...}`` layout) raises ConfigError naming the file, instead of rcl's
    RCLError traceback."""
    ros_args = False
    for i, arg in enumerate(args):
        if arg == "--ros-args":
            ros_args = True
        elif arg == "--":
            ros_args = False
        elif ros_args and arg == "--params-file" and i + 1 < len(args):
            path = args[i + 1]
            data = read_yaml(path)
            if not isinstance(data, Mapping) or not data:
                raise ConfigError(path, "<root>", "expected a mapping '<node name or /**>: {ros__parameters: {...}}'")
            for node, section in data.items():
                params = section.get("ros__parameters") if isinstance(section, Mapping) else None
                if not isinstance(params, Mapping):
                    raise ConfigError(path, str(node), "expected 'ros__parameters:' holding a mapping of parameters")


def run_node(factory: Callable[[], Node], program: str, args: list[str] | None = None) -> int:
    """Create the node, spin a SingleThreadedExecutor until SIGINT/SIGTERM or the node asks to stop.

    Our own signal handlers (not rclpy's) let the node's ``on_shutdown()`` still publish (e.g. a zero command)
    before the context goes down. Returns the exit code: 0, or 2 when the node refused its parameters or a
    params file (named in the message on stderr).
    """
    args = list(args if args is not None else sys.argv)
    try:
        check_params_files(args)
        rclpy.init(args=args, signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    except (ConfigError, RCLError) as exc:
        # a ConfigError names the file (and the YAML error its line); of rcl's own message the first line does
        reason = " ".join(str(exc).split()) if isinstance(exc, ConfigError) else str(exc).splitlines()[0]
        print(f"{program}: refusing to start: {reason}", file=sys.stderr, flush=True)
        rclpy.try_shutdown()
        return 2
    stop = threading.Event()

    def _handler(signum: int, frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, _handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    node: Node | None = None
    executor: SingleThreadedExecutor | None = None
    code = 0
    try:
        try:
            node = factory()
        except (ParameterError, ConfigError, ValueError) as exc:
            print(f"{program}: refusing to start: {exc}", file=sys.stderr, flush=True)
            return 2
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        # Everything built so far (imports, the node, its policy and config) lives as long as the process: moved out
        # of the cyclic collector's reach, so that a full collection never walks it. Why: a full collection holds the
        # GIL, ~11-17 ms for these ~54k objects on an idle core here and several times that on a loaded one, and a
        # control loop paused that long misses its deadline (the moteus firmware watchdog is 50 ms).
        gc.freeze()
        done = getattr(node, "done", None)
        while not stop.is_set() and rclpy.ok() and not (done is not None and done.is_set()):
            executor.spin_once(timeout_sec=0.1)
        code = int(getattr(node, "exit_code", 0))
        if rclpy.ok() and hasattr(node, "on_shutdown"):
            node.on_shutdown()
    finally:
        gc.unfreeze()
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


__all__ = ["CONTROL_QOS", "DIAGNOSTICS_PERIOD", "ERROR", "OK", "ROBOT_PARAMETERS", "ROBOT_SCHEMA", "WARN",
           "ConfigSchema", "ConfiguredNode", "ParamSpec", "Parameter", "ParameterError", "RingStats",
           "check_params_files", "command_message", "declare", "effort_from_message", "joint_order", "nest",
           "param_specs", "refuse_unknown_overrides", "robot_config_from_parameters", "run_node", "stamp_ns",
           "state_from_message", "status", "validated"]
