"""Helpers shared by the mcpilco_ros nodes: parameters, JointState checks, diagnostics, main().

Why one module: every node declares the same robot parameters (the ``/**`` section of
``config/<robot>.yaml``), checks incoming JointState messages the same way, and shuts down the same way.
The nodes themselves stay thin translations between messages and ``mcpilco_core`` calls.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import (
    InvalidParameterTypeException,
    InvalidParameterValueException,
    ParameterUninitializedException,
)
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState

from mcpilco_core.config import (
    JOINT_NAMES,
    ConfigError,
    DampingConfig,
    LqrConfig,
    RoaConfig,
    RobotConfig,
    robot_config_from_mapping,
)
from mcpilco_core.paths import config_dir, policies_dir

# joint_states / joint_commands: reliable (a lost command is a lost control step) with a short queue
# (an old state is worthless); compatible with best-effort subscribers too.
CONTROL_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE)

# OK / WARN / ERROR as plain ints (DiagnosticStatus uses bytes in some distributions).
OK, WARN, ERROR = (int.from_bytes(v, "little") if isinstance(v, bytes) else int(v)
                   for v in (DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR))


class ParameterError(ValueError):
    """A ROS parameter has an invalid value; the message names the parameter and the problem."""


# --------------------------------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter: name, default (its type is the parameter's type), description (with
    units) and an optional inclusive range. ``dynamic`` admits several types (e.g. ``roa.rho``:
    "auto" or a number), validated by mcpilco_core instead of by ROS."""

    name: str
    default: Any
    description: str
    low: float | None = None
    high: float | None = None
    dynamic: bool = False
    read_only: bool = True

    def descriptor(self) -> ParameterDescriptor:
        desc = ParameterDescriptor(description=self.description, read_only=self.read_only,
                                   dynamic_typing=self.dynamic)
        if self.low is not None and self.high is not None and not self.dynamic:
            if isinstance(self.default, bool):
                pass
            elif isinstance(self.default, int):
                desc.integer_range = [IntegerRange(from_value=int(self.low), to_value=int(self.high), step=0)]
            elif isinstance(self.default, float):
                desc.floating_point_range = [FloatingPointRange(from_value=float(self.low),
                                                                to_value=float(self.high), step=0.0)]
            desc.additional_constraints = f"range [{self.low}, {self.high}]"
        return desc


_LQR, _ROA, _DAMP = LqrConfig(), RoaConfig(), DampingConfig()
_ROBOT_DEFAULTS = {f.name: f.default for f in fields(RobotConfig) if not callable(getattr(f, "default", None))}

# The robot parameters of config/<robot>.yaml's ``/**`` section, defaults taken from the config dataclasses.
ROBOT_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("robot", "pendubot", "which robot: 'pendubot' (shoulder actuated) or 'acrobot' (elbow actuated)"),
    ParamSpec("plant_model", "model_1.1", "plant model name in plant_models_file (model_1.0 = identified hardware)"),
    ParamSpec("plant_models_file", "plant_models.yaml", "plant models YAML, relative to the package's config dir"),
    ParamSpec("torque_limit", 6.0, "N m, torque limit of the actuated joint (the passive joint always gets 0)",
              0.0, 50.0),
    ParamSpec("u_max", float(_ROBOT_DEFAULTS["u_max"]), "N m, bound of the swing-up policy's output", 0.0, 50.0),
    ParamSpec("policy_period", float(_ROBOT_DEFAULTS["policy_period"]),
              "s, swing-up policy period (its output is held in between)", 1e-4, 1.0),
    ParamSpec("control_period", float(_ROBOT_DEFAULTS["control_period"]),
              "s, state period: LQR and damping run on every state; the simulated robot's RK4 step", 1e-4, 0.1),
    ParamSpec("lqr.Q_diag", [float(v) for v in _LQR.Q_diag], "LQR state weights (4 non-negative numbers)"),
    ParamSpec("lqr.R", float(_LQR.R), "LQR torque weight", 1e-9, 1e6),
    ParamSpec("roa.rho", "auto", "LQR region-of-attraction level: 'auto' (estimated, cached) or a positive number",
              dynamic=True),
    ParamSpec("roa.samples", int(_ROA.samples), "initial states simulated for the ROA estimate", 1, 10_000_000),
    ParamSpec("roa.rho_max", float(_ROA.rho_max), "largest ROA level probed", 0.0, 1e9),
    ParamSpec("roa.horizon", float(_ROA.horizon), "s of closed-loop simulation per ROA sample", 0.0, 600.0),
    ParamSpec("roa.converged_cost", float(_ROA.converged_cost), "cost-to-go counted as stabilised", 0.0, 1e6),
    ParamSpec("roa.seed", int(_ROA.seed), "random seed of the ROA estimate", 0, 2**31 - 1),
    ParamSpec("roa.enter_fraction", float(_ROA.enter_fraction), "LQR takes over when V < enter_fraction * rho",
              0.0, 100.0),
    ParamSpec("roa.exit_fraction", float(_ROA.exit_fraction), "LQR hands back when V > exit_fraction * rho",
              0.0, 100.0),
    ParamSpec("damping.enabled", bool(_DAMP.enabled), "damp the actuated joint while the pendulum spins too fast"),
    ParamSpec("damping.enter_speed", float(_DAMP.enter_speed), "rad/s, max |dq| above this engages damping",
              0.0, 1e4),
    ParamSpec("damping.exit_speed", float(_DAMP.exit_speed), "rad/s, max |dq| below this releases damping",
              0.0, 1e4),
    ParamSpec("damping.gain", float(_DAMP.gain), "N m s/rad, damping gain", 0.0, 1e3),
)


def declare(node: Node, specs: Iterable[ParamSpec]) -> dict[str, Any]:
    """Declare ``specs`` on ``node`` and return their values; a bad override raises ParameterError."""
    values: dict[str, Any] = {}
    for spec in specs:
        try:
            param = node.declare_parameter(spec.name, spec.default, spec.descriptor())
            values[spec.name] = param.value
        except InvalidParameterTypeException as exc:
            expected = type(spec.default).__name__
            raise ParameterError(f"parameter '{spec.name}': wrong type ({exc}); expected {expected}"
                                 f"{' (write 6.0, not 6)' if expected == 'float' else ''}") from exc
        except InvalidParameterValueException as exc:
            raise ParameterError(f"parameter '{spec.name}': {_value_problem(exc)} "
                                 f"(allowed range [{spec.low}, {spec.high}])") from exc
        except ParameterUninitializedException as exc:
            raise ParameterError(f"parameter '{spec.name}': not set") from exc
    return values


def _value_problem(exc: Exception) -> str:
    text = str(exc)
    return text.split("\n")[0]


def warn_unknown_overrides(node: Node, known: Iterable[str]) -> list[str]:
    """Log (and return) overrides from the params file that no declared parameter takes: likely typos."""
    overrides = getattr(node, "_parameter_overrides", {}) or {}
    known_set = set(known) | {"use_sim_time", "start_type_description_service"}
    unknown = sorted(name for name in overrides if name not in known_set)
    if unknown:
        node.get_logger().warning(f"ignoring unknown parameters (typos?): {unknown}")
    return unknown


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


def robot_config_from_parameters(values: Mapping[str, Any]) -> RobotConfig:
    """Validate the declared robot parameters into a RobotConfig (same rules as the YAML/CLI path).

    The config's ``source`` is ``config/<robot>.yaml`` of the package, so the ROA cache beside it is shared
    with the CLI (the cache is keyed by the configuration's fingerprint, so different values never collide).
    """
    base = config_dir()
    robot = values.get("robot")
    source = base / f"{robot}.yaml"
    try:
        return robot_config_from_mapping(nest(values), source, base)
    except ConfigError as exc:
        raise ParameterError(f"parameter '{exc.field}': {exc.problem}") from exc


def resolve_policy_path(value: str) -> tuple[Path | None, str]:
    """The policy file a ``policy`` parameter names: (path or None, explanation).

    '' -> none (LQR + damping). A file -> that file. A directory -> its newest ``*.npz`` (what the trainer
    exports). Relative paths are tried against the working directory, then the package's policies dir.
    Raises ParameterError when the named file or directory does not exist.
    """
    value = value.strip()
    if not value:
        return None, "no policy configured: LQR + damping only"
    path = Path(value).expanduser()
    if not path.is_absolute() and not path.exists():
        candidate = policies_dir() / path
        if candidate.exists():
            path = candidate
    if path.is_dir():
        newest = sorted(path.glob("*.npz"), key=lambda p: (p.stat().st_mtime, p.name))
        if not newest:
            return None, f"policy directory {path} has no *.npz policy yet: LQR + damping only"
        return newest[-1], f"newest policy in {path}"
    if not path.exists():
        raise ParameterError(f"parameter 'policy': {value}: no such file or directory")
    return path, "policy file"


# --------------------------------------------------------------------------------------------------
# JointState checks


def stamp_ns(msg: JointState) -> int:
    """Header stamp in integer nanoseconds (exact: used to match commands to states)."""
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def joint_order(names: Sequence[str]) -> tuple[int, int] | None:
    """Indices of (shoulder, elbow) in ``names``, or None unless the names are exactly these two."""
    if len(names) != 2:
        return None
    try:
        order = (list(names).index(JOINT_NAMES[0]), list(names).index(JOINT_NAMES[1]))
    except ValueError:
        return None
    return order


def state_from_message(msg: JointState) -> tuple[np.ndarray | None, str]:
    """(x = (q1, q2, dq1, dq2), '') from a joint_states message, or (None, reason) for a bad one.

    Reasons (the keys of the refused-message counters): names, lengths, nonfinite.
    """
    order = joint_order(msg.name)
    if order is None:
        return None, "names"
    if len(msg.position) != 2 or len(msg.velocity) != 2 or len(msg.effort) not in (0, 2):
        return None, "lengths"
    i, j = order
    x = np.array((msg.position[i], msg.position[j], msg.velocity[i], msg.velocity[j]), dtype=np.float64)
    if not np.isfinite(x).all():
        return None, "nonfinite"
    return x, ""


def effort_from_message(msg: JointState) -> tuple[tuple[float, float] | None, str]:
    """((tau_shoulder, tau_elbow), '') from a joint_commands message, or (None, reason)."""
    order = joint_order(msg.name)
    if order is None:
        return None, "names"
    if len(msg.effort) != 2:
        return None, "lengths"
    u = (float(msg.effort[order[0]]), float(msg.effort[order[1]]))
    if not (math.isfinite(u[0]) and math.isfinite(u[1])):
        return None, "nonfinite"
    return u, ""


def command_message(effort: Sequence[float], stamp: Any, frame_id: str = "") -> JointState:
    """A joint_commands message: names + effort (N m), stamped with the state it answers."""
    msg = JointState()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.name = list(JOINT_NAMES)
    msg.effort = [float(effort[0]), float(effort[1])]
    return msg


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


def run_node(factory: Callable[[], Node], program: str, args: list[str] | None = None,
             on_shutdown: Callable[[Node], None] | None = None) -> int:
    """Create the node, spin a SingleThreadedExecutor until SIGINT/SIGTERM or the node asks to stop.

    Our own signal handlers (not rclpy's) let ``on_shutdown`` still publish (e.g. a zero command) before
    the context goes down. Returns the exit code: 0, or 2 when the node refused its parameters.
    """
    rclpy.init(args=args if args is not None else sys.argv,
               signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
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
        done = getattr(node, "done", None)
        while not stop.is_set() and rclpy.ok() and not (done is not None and done.is_set()):
            executor.spin_once(timeout_sec=0.1)
        code = int(getattr(node, "exit_code", 0))
        if on_shutdown is not None and rclpy.ok():
            on_shutdown(node)
    finally:
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


__all__ = ["CONTROL_QOS", "ERROR", "OK", "ParamSpec", "Parameter", "ParameterError", "ROBOT_PARAMETERS",
           "RingStats", "WARN", "command_message", "declare", "effort_from_message", "joint_order", "nest",
           "resolve_policy_path", "robot_config_from_parameters", "run_node", "stamp_ns", "state_from_message",
           "status", "warn_unknown_overrides"]
