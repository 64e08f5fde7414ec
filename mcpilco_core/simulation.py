"""The simulated robot: RK4 at a fixed step, zero-order-held torques, one step at a time.

:class:`SimulatedRobot` is the one place where a simulated step happens; :class:`Simulator` (closed loop
with a controller object, used by the evaluation protocol and the learner's trials) and
``mcpilco_ros.sim_driver_node`` (the same robot behind ROS messages and clocks) both drive it. One step:

1. the sensors report the measured state (:meth:`SimulatedRobot.measurement`; the true state unless the
   robot has :class:`Imperfections`);
2. an override (the evaluation protocol's reset PID) may take over both joints for this step; it receives the
   same measured state as a controller would;
3. the command passes the motor model (lag and torque noise, if any) and the torque limits: the passive
   joint's limit is 0, so it receives exactly zero torque outside override steps whatever a controller asks;
   a command that is not two finite numbers never reaches the plant (zero torque);
4. one RK4 step of ``dt`` with the applied torque held; everything is recorded if asked.

:meth:`SimulatedRobot.finish` returns the :class:`Trajectory` with its score (fraction of the time the end
effector was strictly above 0.9 (l1 + l2)). What the controller *asked* for the passive joint is recorded
(``u_cmd``) so tests and reports can check it.

Imperfections follow RealAIGym's simulator exactly (``Simulator.get_measurement`` /
``get_real_applied_u``; DESIGN.md section 8): with ``n = int(delay / dt) + 1`` the measurement at step k is
the true state of step ``max(0, k - (n - 1))`` when n > 1, plus Gaussian noise of per-coordinate std
``measurement_noise``; the applied torque is ``u = u_last + r (u_cmd - u_last)`` (u_last: the torque
applied at the previous step, 0 at the start), plus Gaussian noise of per-joint std ``torque_noise``, then
the limits. Random numbers come from an explicit ``np.random.Generator``, drawn in a fixed order per step
(4 measurement normals when the step's measurement is first needed, then 2 torque normals), so equal
generators give equal runs whoever drives the robot.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from .config import ConfigError, PlantParameters, RobotConfig, load_plant_parameters, plant_models, read_yaml
from .plant import DoublePendulum

MODE_CODES = {"policy": 0, "lqr": 1, "damping": 2, "safe": 3, "idle": 4, "reset": 5, "other": 6}
MODE_NAMES = {code: name for name, code in MODE_CODES.items()}
# joint_states.header.frame_id of a state measured inside a reset/disturbance window (the torque acting just before
# or just after it came from the window's PID, the passive joint torqued): the drivers mark them, the recording
# reader keeps the intervals around them from the model
RESET_FRAME = "reset"

# An override returns torques for both joints while it is active (e.g. the evaluation's reset PID),
# None otherwise. Arguments: step index, time (s), measured state (4-tuple: rad, rad/s). Called exactly
# once per step.
Override = Callable[[int, float, tuple], "np.ndarray | None"]


class SteppableController(Protocol):
    mode: str

    def reset(self) -> None: ...

    def step(self, x: np.ndarray, t: float) -> np.ndarray: ...


@dataclass(frozen=True)
class Imperfections:
    """Sensor and motor imperfections of a simulated robot (RealAIGym's semantics; all off by default).

    measurement_noise: (4,) std of Gaussian noise on the measured q1, q2 (rad), dq1, dq2 (rad/s);
    delay: measurement delay (s): the sensors report the state ``int(delay / dt)`` steps old;
    motor_responsiveness: r in (0, 1]: each step the applied torque moves the fraction r of the way from the
    previous applied torque to the command (1 = no lag);
    torque_noise: (2,) std of Gaussian noise added to the applied torque per joint (N m).
    """

    measurement_noise: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    delay: float = 0.0
    motor_responsiveness: float = 1.0
    torque_noise: tuple[float, float] = (0.0, 0.0)

    @property
    def is_ideal(self) -> bool:
        return self.ideal_sensors and self.ideal_motors

    @property
    def ideal_sensors(self) -> bool:
        return not any(self.measurement_noise) and self.delay == 0.0

    @property
    def ideal_motors(self) -> bool:
        return self.motor_responsiveness == 1.0 and not any(self.torque_noise)

    def delay_steps(self, dt: float) -> int:
        """How many steps old the measurement is: ``int(delay / dt)`` (RealAIGym: n = int(delay/dt) + 1)."""
        return int(self.delay / dt)


@dataclass
class Trajectory:
    """t: (N+1,) s; x: (N+1, 4) true states; u: (N, 2) applied torques (N m); u_cmd: (N, 2) what the
    controller asked (zeros where an override acted); mode: (N,) codes of MODE_CODES; score: fraction of
    the duration above the line (set by :meth:`SimulatedRobot.finish`); extras: ``x_measured`` (N+1, 4),
    the states the sensors reported."""

    t: np.ndarray
    x: np.ndarray
    u: np.ndarray
    u_cmd: np.ndarray
    mode: np.ndarray
    extras: dict = field(default_factory=dict)
    score: float | None = None

    @property
    def dt(self) -> float:
        return float(self.t[1] - self.t[0])


def intervals_above_line(x: np.ndarray, plant: DoublePendulum) -> np.ndarray:
    """(N,) for states (N+1, 4): whether each interval counts for the score (its first state strictly above)."""
    return plant.end_effector_height(x[:-1]) > plant.height_threshold


def uptime(t: np.ndarray, x: np.ndarray, plant: DoublePendulum) -> float:
    """Seconds during which the end effector is strictly above the line (interval start counts)."""
    return float(np.sum(np.diff(t)[intervals_above_line(x, plant)]))


def score_trajectory(t: np.ndarray, x: np.ndarray, plant: DoublePendulum, duration: float | None = None) -> float:
    """The protocol's score: uptime / duration (default: the trajectory's length in s)."""
    return uptime(t, x, plant) / (duration if duration is not None else float(t[-1] - t[0]))


def _clip(value: float, limit: float) -> float:
    return min(max(value, -limit), limit)


class SimulatedRobot:
    """The simulated double pendulum, one step at a time (see the module docstring).

    plant: the robot's true dynamics; torque_limits: (2,) N m per joint outside override steps (the passive
    joint's is 0); dt: step (s); x0: initial true state; override: e.g. the protocol's reset PID, limited to
    ``override_limits`` (N m) on both joints; imperfections and rng: sensors and motors (rng is required when
    they draw noise); record: keep every step for :meth:`finish` (off for an endless ROS run); score_plant:
    the geometry of the score line (default: plant; profiles score with the robot config's).
    """

    def __init__(self, plant: DoublePendulum, torque_limits: Sequence[float], dt: float = 0.002,
                 x0: Sequence[float] = (0.0, 0.0, 0.0, 0.0), *, override: Override | None = None,
                 override_limits: Sequence[float] = (6.0, 6.0), imperfections: Imperfections | None = None,
                 rng: np.random.Generator | None = None, record: bool = True,
                 score_plant: DoublePendulum | None = None) -> None:
        self.plant = plant
        self.score_plant = score_plant or plant
        self.limits = (float(torque_limits[0]), float(torque_limits[1]))
        self.override_limits = (float(override_limits[0]), float(override_limits[1]))
        self.dt = float(dt)
        self.override = override
        self.imperfections = imperfections or Imperfections()
        imp = self.imperfections
        if not 0.0 < imp.motor_responsiveness <= 1.0:
            raise ValueError(f"motor_responsiveness must be in (0, 1], got {imp.motor_responsiveness}")
        noisy = any(imp.measurement_noise) or any(imp.torque_noise)
        if noisy and rng is None:
            raise ValueError("a robot with measurement or torque noise needs an explicit np.random.Generator")
        self.rng = rng
        self._meas_std = np.asarray(imp.measurement_noise, dtype=np.float64) if any(imp.measurement_noise) else None
        self._torque_std = np.asarray(imp.torque_noise, dtype=np.float64) if any(imp.torque_noise) else None
        self._lag = imp.motor_responsiveness
        self._ideal_motors = imp.ideal_motors
        self._ideal_sensors = imp.ideal_sensors
        x = tuple(float(v) for v in x0)
        if len(x) != 4:
            raise ValueError(f"x0 must have 4 entries, got {len(x)}")
        self.x: tuple[float, float, float, float] = x   # true state at step k
        self.k = 0
        self.applied: tuple[float, float] = (0.0, 0.0)  # torque applied over the last step (N m)
        self.stopped = False                              # latched: zero torque on both joints, mode "safe"
        self._history: deque = deque([x], maxlen=imp.delay_steps(self.dt) + 1)
        self._measured_k = -1
        self._measured: tuple = x
        self._override_k = -1
        self._forced: np.ndarray | None = None
        self.record = bool(record)
        self._xs: list = [x]
        self._xm: list = []
        self._us: list = []
        self._ucmd: list = []
        self._modes: list = []

    @classmethod
    def from_profile(cls, profile: RobotProfile | str | Path | None, config: RobotConfig, seed: int = 0,
                     x0: Sequence[float] = (0.0, 0.0, 0.0, 0.0), **kwargs) -> SimulatedRobot:
        """The simulated robot of ``profile`` (a :class:`RobotProfile`, a name, ``NAME:SEED`` or a file; None =
        nominal) for the robot ``config``, its noise seeded by ``seed``; kwargs: override, override_limits,
        record (see :meth:`RobotProfile.robot`)."""
        return load_robot_profile(profile).robot(config, seed, x0, **kwargs)

    @property
    def t(self) -> float:
        """Time of the current step (s): k dt."""
        return self.k * self.dt

    def measurement(self) -> np.ndarray:
        """What the sensors report at the current step (4,): rad, rad/s. Drawn once per step."""
        return np.array(self._measure())

    def _measure(self) -> tuple:
        if self._measured_k != self.k:
            self._measured_k = self.k
            if self._ideal_sensors:
                self._measured = self.x
            else:
                seen = self._history[0]   # the state int(delay / dt) steps ago (the oldest one at the start)
                if self._meas_std is not None:
                    seen = tuple(float(v) for v in np.asarray(seen) + self.rng.standard_normal(4) * self._meas_std)
                self._measured = seen
            if self.record:
                self._xm.append(self._measured)
        return self._measured

    def in_override(self) -> bool:
        """Whether the override (e.g. a reset window) acts at the current step."""
        return self._override_now() is not None

    def rearm_override(self) -> None:
        """Ask the override again for the current step: call it after arming an override that was idle when
        the current step's override was already evaluated (e.g. a disturbance window started between a published
        state and its command). Only for overrides whose idle calls have no side effects."""
        self._override_k = -1

    def _override_now(self) -> np.ndarray | None:
        """The override's torques for the current step, or None; evaluated once per step (its clocks and the
        PID's history advance exactly once per step)."""
        if self._override_k != self.k:
            self._override_k = self.k
            measured = self._measure()
            self._forced = self.override(self.k, self.t, measured) if self.override is not None else None
        return self._forced

    def step(self, command: Sequence[float] | np.ndarray | None, mode: str = "other") -> np.ndarray:
        """Apply ``command`` (N m, both joints; ignored during an override step or after a stop) for one step
        of dt; returns the measurement of the new step. ``mode`` names who commanded (MODE_CODES)."""
        self._measure()
        forced = self._override_now()
        cmd, target = (0.0, 0.0), (0.0, 0.0)
        if forced is None and command is not None:
            values = np.asarray(command, dtype=np.float64)
            if values.shape == (2,):
                cmd = (float(values[0]), float(values[1]))
                if math.isfinite(cmd[0]) and math.isfinite(cmd[1]):
                    target = cmd   # a broken command never reaches the plant
        if self.stopped:
            target, limits, code = (0.0, 0.0), (0.0, 0.0), MODE_CODES["safe"]
        elif forced is not None:
            target, limits, code = (float(forced[0]), float(forced[1])), self.override_limits, MODE_CODES["reset"]
        else:
            limits, code = self.limits, MODE_CODES.get(mode, MODE_CODES["other"])
        u = self._motor(target, limits)
        if self.record:
            self._us.append(u)
            self._ucmd.append(cmd)
            self._modes.append(code)
        self.x = self.plant.rk4_step_scalar(self.x, u, self.dt)
        self.applied = u
        self.k += 1
        self._history.append(self.x)
        if self.record:
            self._xs.append(self.x)
        return self.measurement()

    def _motor(self, target: tuple[float, float], limits: tuple[float, float]) -> tuple[float, float]:
        """Motor model then limits: u = u_last + r (target - u_last), plus torque noise, clipped."""
        if self.stopped:
            return (0.0, 0.0)
        if self._ideal_motors:
            return (_clip(target[0], limits[0]), _clip(target[1], limits[1]))
        r = self._lag
        last = self.applied
        u0 = last[0] + r * (target[0] - last[0])
        u1 = last[1] + r * (target[1] - last[1])
        if self._torque_std is not None:
            noise = self.rng.standard_normal(2) * self._torque_std
            u0, u1 = u0 + float(noise[0]), u1 + float(noise[1])
        return (_clip(u0, limits[0]), _clip(u1, limits[1]))

    def finish(self, duration: float | None = None) -> Trajectory:
        """The recorded trajectory with its score over ``duration`` (s; default: the time simulated)."""
        if not self.record:
            raise RuntimeError("this SimulatedRobot was created with record=False")
        self._measure()
        n = self.k
        t = np.arange(n + 1) * self.dt
        xs = np.array(self._xs, dtype=np.float64).reshape(n + 1, 4)
        traj = Trajectory(t=t, x=xs, u=np.array(self._us, dtype=np.float64).reshape(n, 2),
                          u_cmd=np.array(self._ucmd, dtype=np.float64).reshape(n, 2),
                          mode=np.array(self._modes, dtype=np.int8),
                          extras={"x_measured": np.array(self._xm, dtype=np.float64).reshape(n + 1, 4)})
        if n > 0:
            traj.score = score_trajectory(t, xs, self.score_plant, duration if duration is not None else n * self.dt)
        return traj


class Simulator:
    """Runs a controller object against a :class:`SimulatedRobot` (see the module docstring)."""

    def __init__(self, plant: DoublePendulum, torque_limits: tuple[float, float], dt: float = 0.002,
                 imperfections: Imperfections | None = None, rng: np.random.Generator | None = None,
                 override_limits: tuple[float, float] = (6.0, 6.0)) -> None:
        self.plant = plant
        self.torque_limits = np.asarray(torque_limits, dtype=np.float64)
        self.override_limits = np.asarray(override_limits, dtype=np.float64)
        self.dt = float(dt)
        self.imperfections = imperfections or Imperfections()
        self.rng = rng

    def robot(self, x0: Sequence[float], override: Override | None = None) -> SimulatedRobot:
        """A fresh simulated robot with this simulator's settings."""
        return SimulatedRobot(self.plant, tuple(self.torque_limits), self.dt, x0, override=override,
                              override_limits=tuple(self.override_limits), imperfections=self.imperfections,
                              rng=self.rng)

    def run(self, controller: SteppableController, x0: np.ndarray, duration: float,
            override: Override | None = None, reset_controller: bool = True) -> Trajectory:
        """Simulate ``duration`` seconds from ``x0``; ``override`` may take over the torques at times. The
        controller is called at every step outside the override with the measured state and k dt."""
        robot = self.robot(x0, override)
        steps, simulated = simulated_time(duration, self.dt)
        return drive(robot, controller, steps, reset_controller, simulated)


def simulated_time(duration: float, dt: float) -> tuple[int, float]:
    """The whole number of ``dt`` steps that ``duration`` (s) runs, and the time they simulate (s): ``duration``
    itself when it is a whole number of steps (60 s at 2 ms), else steps * dt (0.003 s at 2 ms: 2 steps, 0.004 s).
    A score is uptime over the time simulated, never over a shorter one (scores above 1)."""
    steps = int(round(duration / dt))
    if math.isclose(steps * dt, duration, rel_tol=0.0, abs_tol=1e-9):
        return steps, duration
    return steps, steps * dt


def drive(robot: SimulatedRobot, controller: SteppableController, steps: int, reset_controller: bool = True,
          duration: float | None = None) -> Trajectory:
    """Run ``controller`` on ``robot`` for ``steps`` steps (it is not called during override steps); returns
    :meth:`SimulatedRobot.finish` (score over ``duration`` s, default steps dt)."""
    if reset_controller:
        controller.reset()
    after_window = False
    for _ in range(steps):
        if robot.in_override():
            robot.step(None, "reset")
            after_window = True
        else:
            if after_window:     # the hand-over after a window: afresh, as the controller node does (its state is
                controller.reset()   # marked "reset"), so that the evaluator and the node stay one computation
                after_window = False
            command = controller.step(robot.measurement(), robot.t)
            robot.step(command, controller.mode)
    return robot.finish(duration)


# --------------------------------------------------------------------------------------------------
# Robot profiles: the simulated robot configured apart from the controller's and the learner's model

PROFILES_FILE = "robot_profiles.yaml"
PROFILES_PLANT_MODELS = "plant_models.yaml"   # default plant_models_file, beside the profiles file
PROFILE_KEYS = ("description", "plant_model", "measurement_noise", "delay", "motor_responsiveness", "torque_noise",
                "perturbation", "seed")
PERTURBED_PARAMETERS = ("m", "l", "r", "I", "Ir", "b", "cf")   # drawn in this order, index by index


@dataclass(frozen=True)
class RobotProfile:
    """What the simulated robot is (config/robot_profiles.yaml documents every field).

    plant_model: None = the robot config's plant, else a model of ``plant_models_file``;
    measurement_noise: (4,) std (rad, rad, rad/s, rad/s); delay (s); motor_responsiveness in (0, 1];
    torque_noise_actuated / torque_noise_passive: std (N m); perturbation: each plant parameter is scaled by
    1 + U(-p, p) drawn from ``np.random.default_rng(seed)``; seed: also the first half of every run's noise
    seed (:meth:`noise_generator`).
    """

    name: str
    plant_model: str | None = None
    plant_models_file: str | None = None
    measurement_noise: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    delay: float = 0.0
    motor_responsiveness: float = 1.0
    torque_noise_actuated: float = 0.0
    torque_noise_passive: float = 0.0
    perturbation: float = 0.0
    seed: int = 0
    description: str = ""
    source: str | None = None

    @property
    def label(self) -> str:
        """The name, with the seed whenever it picks the robot (``perturbed:0``, ``perturbed:3``) or is not 0
        (``hardware_proxy:3``: another noise): a result file says which robot and noise it ran on, a perturbed one's
        seed 0 included."""
        return f"{self.name}:{self.seed}" if self.perturbation or self.seed else self.name

    def imperfections(self, config: RobotConfig) -> Imperfections:
        """Sensors and motors for ``config``'s robot (torque noise placed on its actuated/passive joint)."""
        torque = [0.0, 0.0]
        torque[config.actuated_joint] = self.torque_noise_actuated
        torque[config.passive_joint] = self.torque_noise_passive
        return Imperfections(measurement_noise=self.measurement_noise, delay=self.delay,
                             motor_responsiveness=self.motor_responsiveness, torque_noise=(torque[0], torque[1]))

    def plant_parameters(self, config: RobotConfig) -> PlantParameters:
        """The simulated robot's true plant: the named model (or the robot config's), perturbed if asked."""
        if self.plant_model is None:
            params = config.plant
        else:
            params = load_plant_parameters(self.plant_models_file or "", self.plant_model)
        if not self.perturbation:
            return params
        rng = np.random.default_rng(self.seed)
        changes: dict = {}
        for key in PERTURBED_PARAMETERS:
            value = getattr(params, key)
            if isinstance(value, tuple):
                changes[key] = tuple(float(v) * (1.0 + rng.uniform(-self.perturbation, self.perturbation))
                                     for v in value)
            else:
                changes[key] = float(value) * (1.0 + rng.uniform(-self.perturbation, self.perturbation))
        return replace(params, name=f"{params.name} perturbed {self.perturbation:g} seed {self.seed}", **changes)

    def noise_generator(self, seed: int) -> np.random.Generator:
        """The generator of a run with ``seed`` (the evaluation seed): ``np.random.default_rng([profile seed,
        seed])``."""
        return np.random.default_rng([int(self.seed), int(seed)])

    def robot(self, config: RobotConfig, seed: int = 0, x0: Sequence[float] = (0.0, 0.0, 0.0, 0.0), *,
              override: Override | None = None, override_limits: Sequence[float] = (6.0, 6.0),
              record: bool = True, dt: float | None = None) -> SimulatedRobot:
        """The simulated robot of this profile for ``config`` (its torque limits; dt default: its
        control_period), noise from :meth:`noise_generator` (``seed``); scored with the robot config's
        geometry (the protocol's line in joint space)."""
        imperfections = self.imperfections(config)
        rng = None if imperfections.is_ideal else self.noise_generator(seed)
        return SimulatedRobot(DoublePendulum(self.plant_parameters(config)), config.torque_limits,
                              config.control_period if dt is None else dt, x0, override=override,
                              override_limits=override_limits, imperfections=imperfections, rng=rng, record=record,
                              score_plant=DoublePendulum(config.plant))


NOMINAL = RobotProfile(name="nominal", description="the robot config's own plant, ideal sensors and motors")


def _number(value: object, source: str, name: str, low: float = 0.0, high: float = math.inf,
            low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ConfigError(source, name, f"expected a finite number, got {value!r}")
    value = float(value)
    if value < low or (low_open and value == low) or value > high:
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ConfigError(source, name, f"must be in {bounds}, got {value:g}")
    return value


def robot_profile_from_mapping(data: Mapping, name: str, source: str | Path, prefix: str = "",
                               plant_models_file: str | Path | None = None) -> RobotProfile:
    """Validate one profile's fields (errors name ``source`` and the dotted field)."""
    source = str(source)

    def field_name(key: str) -> str:
        return f"{prefix}.{key}" if prefix else key

    if not isinstance(data, Mapping):
        raise ConfigError(source, prefix or "<root>", f"expected a mapping of profile fields, got {data!r}")
    for key in data:
        if key not in PROFILE_KEYS:
            raise ConfigError(source, field_name(str(key)), f"unknown field (known: {list(PROFILE_KEYS)})")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(source, field_name("description"), f"expected a string, got {description!r}")
    model = data.get("plant_model", "robot")
    if not isinstance(model, str):
        raise ConfigError(source, field_name("plant_model"), f"expected a model name or 'robot', got {model!r}")
    models_path = None
    if model != "robot":
        models_path = Path(plant_models_file) if plant_models_file else Path(source).parent / PROFILES_PLANT_MODELS
        models = plant_models(models_path) if models_path.is_file() else {}
        if model not in models:
            raise ConfigError(source, field_name("plant_model"),
                              f"{model!r} is not 'robot' nor a model of {models_path} (known: {sorted(models)})")
    noise = data.get("measurement_noise", [0.0] * 4)
    if not isinstance(noise, Sequence) or isinstance(noise, str) or len(noise) != 4:
        raise ConfigError(source, field_name("measurement_noise"), f"expected a list of 4 numbers, got {noise!r}")
    noise = tuple(_number(v, source, f"{field_name('measurement_noise')}[{i}]") for i, v in enumerate(noise))
    torque = data.get("torque_noise", {})
    if not isinstance(torque, Mapping):
        raise ConfigError(source, field_name("torque_noise"),
                          f"expected {{actuated: N m, passive: N m}}, got {torque!r}")
    for key in torque:
        if key not in ("actuated", "passive"):
            raise ConfigError(source, f"{field_name('torque_noise')}.{key}", "unknown field (known: actuated, passive)")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(source, field_name("seed"), f"expected an integer >= 0, got {seed!r}")
    return RobotProfile(
        name=name, plant_model=None if model == "robot" else model,
        plant_models_file=str(models_path) if models_path else None, measurement_noise=noise,  # type: ignore[arg-type]
        delay=_number(data.get("delay", 0.0), source, field_name("delay"), 0.0, 1.0),
        motor_responsiveness=_number(data.get("motor_responsiveness", 1.0), source,
                                     field_name("motor_responsiveness"), 0.0, 1.0, low_open=True),
        torque_noise_actuated=_number(torque.get("actuated", 0.0), source, f"{field_name('torque_noise')}.actuated"),
        torque_noise_passive=_number(torque.get("passive", 0.0), source, f"{field_name('torque_noise')}.passive"),
        perturbation=_number(data.get("perturbation", 0.0), source, field_name("perturbation"), 0.0, 0.5),
        seed=seed, description=description, source=source)



def _profiles_document(profiles_file: str | Path | None) -> tuple[Path, Mapping]:
    """(path, contents) of the profiles file (``config/robot_profiles.yaml`` unless named), its top level checked."""
    if profiles_file is None:
        from .paths import config_dir

        profiles_file = config_dir() / PROFILES_FILE
    path = Path(profiles_file)
    data = read_yaml(path)
    if not isinstance(data, Mapping) or not isinstance(data.get("profiles"), Mapping):
        raise ConfigError(path, "profiles", "missing: expected a mapping of profile name -> fields")
    for key in data:
        if key not in ("profiles", "plant_models_file"):
            raise ConfigError(path, str(key), "unknown field (known: plant_models_file, profiles)")
    return path, data


def robot_profile_names(profiles_file: str | Path | None = None) -> list[str]:
    """The names of the built-in robot profiles (``config/robot_profiles.yaml``, or ``profiles_file``)."""
    return [str(name) for name in _profiles_document(profiles_file)[1]["profiles"]]


def load_robot_profile(spec: str | Path | RobotProfile | None = None,
                       profiles_file: str | Path | None = None) -> RobotProfile:
    """A robot profile by name (``config/robot_profiles.yaml``, or ``profiles_file``), ``NAME:SEED`` (the
    profile with another seed), or the path of a YAML file with one profile's fields. None = nominal."""
    if isinstance(spec, RobotProfile):
        return spec
    if spec is None:
        spec = "nominal"
    text = str(spec)
    seed = None
    head, sep, tail = text.rpartition(":")
    if sep and tail.isdigit():
        text, seed = head, int(tail)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(path, "<file>", "no such robot profile file")
        profile = robot_profile_from_mapping(read_yaml(path), path.stem, path)
    else:
        path, data = _profiles_document(profiles_file)
        if text not in data["profiles"]:
            raise ConfigError(path, f"profiles.{text}", f"unknown robot profile (known: {sorted(data['profiles'])})")
        models = data.get("plant_models_file", PROFILES_PLANT_MODELS)
        if not isinstance(models, str):
            raise ConfigError(path, "plant_models_file", f"expected a file name, got {models!r}")
        profile = robot_profile_from_mapping(data["profiles"][text], text, path, f"profiles.{text}",
                                             path.parent / models)
    return replace(profile, seed=seed) if seed is not None else profile
