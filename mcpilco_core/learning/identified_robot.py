"""The robot as the learner knows it from its trials: the plant's friction and rotor inertia, the sensor delay, the
motor lag and the noise, identified at the state rate (500 Hz) from what the sensors reported and the motors did.

Why: the learner simulates the evaluation protocol on its own plant to judge policies without robot time (the
choice's ranking and the optimiser's snapshot judge, protocol.py). The friction that ``gp.identify`` fits for the
GP's prior comes from 20 ms transitions between *measured* states; there the 5 ms sensor delay is not modelled, and
the fit trades friction against it. On the hardware proxy the Coulomb friction it finds drifts from 0.14 to
0.05 N m over a run (true 0.16 / 0.12) while the viscous one grows twentyfold, so the judge runs an easier robot
than the real one and overrates (docs/learner.md). Fitted over 10-step windows at the state rate with the delay as
a whole number of steps, chosen by the fit's own residual, the same data give the proxy's friction and rotor
inertia within a few per cent and its delay exactly. The motor lag comes from the applied torque against the
command; the noise from the fit's residual.

A recording gives the measured states, the torque applied over each step (the drivers report it, the bag's
``joint_states`` effort) and the commanded torque (``joint_commands``): nothing of the simulated robot that a real
robot would not give.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from ..config import ConfigError, PlantParameters, load_plant_parameters
from ..plant import DoublePendulum
from ..recording.state_rate import StateRecording
from .identification import LOWER, SCALE, UPPER, parameters_of, with_parameters

WINDOW = 10            # state steps per fitted window (20 ms at 500 Hz: one policy period)
MAX_DELAY_STEPS = 5    # delays tried: 0 .. 5 state steps (0 .. 10 ms at 500 Hz)
MAX_WINDOWS = 1500     # windows per fit (a random subset): about a second per delay tried
MIN_WINDOWS = 50       # fewer usable windows: nothing identified
NOISE_SEED = 7919      # the identified robot's own noise streams (profile seed), apart from the simulated robots'
                       # profiles (seed 0): a judge must not replay the robot's very noise
MECHANICS_BOUNDS = (0.5, 1.5)   # opt-in ``mechanics``: factors on the prior's m1, m2, r1, r2, I1, I2
MECHANICS_SCALE = 0.05


@dataclass(frozen=True)
class IdentifiedRobot:
    """plant: the prior with b, cf, Ir fitted; delay: s (``delay_steps`` x dt; stored half a step more, so
    ``int(delay / dt)`` gives the steps back); motor_responsiveness: r in (0, 1]; measurement_noise: (4,) std (rad,
    rad, rad/s, rad/s); torque_noise: std on the actuated joint (N m); residual: the fit's RMS velocity error per
    joint (rad/s over one window); windows: how many windows the fit used."""

    plant: PlantParameters
    delay_steps: int
    dt: float
    motor_responsiveness: float
    measurement_noise: tuple[float, float, float, float]
    torque_noise: float
    residual: tuple[float, float]
    windows: int

    @property
    def delay(self) -> float:
        return (self.delay_steps + 0.5) * self.dt if self.delay_steps else 0.0

    def profile(self):
        """The simulated robot it describes (a :class:`RobotProfile` on the robot config's plant: pair it with
        ``replace(robot_config, plant=self.plant)``)."""
        from ..simulation import RobotProfile

        return RobotProfile(name="identified", measurement_noise=self.measurement_noise, delay=self.delay,
                            motor_responsiveness=self.motor_responsiveness, torque_noise_actuated=self.torque_noise,
                            seed=NOISE_SEED,
                            description="the robot as identified from the trials (friction, Ir, delay, lag, noise)")

    def to_arrays(self) -> dict[str, np.ndarray]:
        """For the model file (no pickle): ``robot_b_cf_Ir`` and ``robot_sensors_motors`` (delay steps, dt, r,
        4 noise stds, torque noise, 2 residuals, windows)."""
        return {"robot_b_cf_Ir": parameters_of(self.plant),
                "robot_sensors_motors": np.array([self.delay_steps, self.dt, self.motor_responsiveness,
                                                  *self.measurement_noise, self.torque_noise, *self.residual,
                                                  self.windows], dtype=float)}

    @classmethod
    def from_arrays(cls, prior: PlantParameters, arrays) -> IdentifiedRobot | None:
        """Inverse of :meth:`to_arrays` (None when the file holds no identified robot)."""
        if "robot_b_cf_Ir" not in arrays or "robot_sensors_motors" not in arrays:
            return None
        v = np.asarray(arrays["robot_sensors_motors"], dtype=float)
        return cls(with_parameters(prior, np.asarray(arrays["robot_b_cf_Ir"])), int(round(v[0])), float(v[1]),
                   float(v[2]), tuple(float(x) for x in v[3:7]), float(v[7]), (float(v[8]), float(v[9])),
                   int(round(v[10])))

    def summary(self) -> str:
        """One line for the logs."""
        p = self.plant
        noise = ", ".join(f"{v:.3g}" for v in self.measurement_noise)
        return (f"b {p.b[0]:.4f} / {p.b[1]:.4f} N m s/rad, cf {p.cf[0]:.3f} / {p.cf[1]:.3f} N m, Ir {p.Ir:.3g} kg m^2, "
                f"delay {self.delay_steps} steps (the state {self.delay_steps * self.dt * 1e3:g} ms old), "
                f"r {self.motor_responsiveness:.3f}, noise ({noise}), torque noise "
                f"{self.torque_noise:.3g} N m ({self.windows} windows)")

    def to_dict(self) -> dict:
        return {"b": list(self.plant.b), "cf": list(self.plant.cf), "Ir": self.plant.Ir,
                # the profile's delay: delay_steps = int(profile_delay_s / dt)
                "delay_steps": self.delay_steps, "profile_delay_s": self.delay,
                "dt": self.dt, "motor_responsiveness": self.motor_responsiveness,
                "measurement_noise": list(self.measurement_noise), "torque_noise": self.torque_noise,
                "residual": list(self.residual), "windows": self.windows}

    def transition_velocities(self, x: np.ndarray, u: np.ndarray, u_previous: np.ndarray, period: float,
                              actuated: int) -> np.ndarray:
        """Velocities (N, 2) one policy period after measured states ``x`` (N, 4) under the commands ``u`` (N,),
        the previous period's ``u_previous`` (N,), as this robot integrates them (:func:`delayed_velocities`)."""
        return delayed_velocities(self.plant, x, u, u_previous, period, self.dt, actuated, self.delay_steps,
                                  self.motor_responsiveness)


def delayed_velocities(plant: PlantParameters, x: np.ndarray, u: np.ndarray, u_previous: np.ndarray, period: float,
                       dt: float, actuated: int, delay_steps: int, responsiveness: float = 1.0) -> np.ndarray:
    """Velocities (N, 2) one policy period after measured states ``x`` (N, 4), as a robot with a sensor delay
    integrates them: the measured state is ``delay_steps`` steps of ``dt`` old, so over the steps that carry it to
    the next measured state the previous command ``u_previous`` still acts for ``delay_steps`` steps, then the new
    command ``u``; both pass the motor lag (applied += r (command - applied), from applied = ``u_previous``).

    Why: the GP's prior holds the torque over the period, which makes the 20 ms transition of a delayed robot
    depend on a command the model does not see. On the hardware proxy (2 steps, r 0.9) the true plant with the
    torque held misses by 0.14 / 0.28 rad/s (acrobot) and 0.21 / 0.32 rad/s (pendubot) per step; this way by
    0.10 / 0.16 and 0.13 / 0.18 (``benchmarks/bench_transition_delay.py``).
    """
    u, u_previous = np.asarray(u, dtype=float).reshape(-1), np.asarray(u_previous, dtype=float).reshape(-1)
    steps = int(round(period / dt))
    torques = np.zeros((len(u), steps, 2))
    applied = u_previous
    for j in range(steps):
        applied = applied + responsiveness * ((u_previous if j < delay_steps else u) - applied)
        torques[:, j, actuated] = applied
    return _simulate(plant, np.array(x, dtype=float), torques, dt)[:, 2:]


def _windows(recordings: list[StateRecording], rng: np.random.Generator) -> list[tuple[int, int]]:
    """(recording, k) of the windows every tried delay can use: all steps from k - MAX_DELAY_STEPS to k + WINDOW
    valid. One random subset of at most MAX_WINDOWS, shared by every delay, so their residuals compare on the
    same data."""
    picks = []
    for i, rec in enumerate(recordings):
        ok = np.concatenate([[0], np.cumsum(rec.valid)])   # ok[b] - ok[a]: valid steps in [a, b)
        k = np.arange(MAX_DELAY_STEPS, len(rec.effort) - WINDOW + 1)
        k = k[ok[k + WINDOW] - ok[k - MAX_DELAY_STEPS] == WINDOW + MAX_DELAY_STEPS]
        picks.extend((i, int(j)) for j in k)
    if len(picks) > MAX_WINDOWS:
        keep = np.sort(rng.choice(len(picks), MAX_WINDOWS, replace=False))
        picks = [picks[j] for j in keep]
    return picks


def _window_data(recordings: list[StateRecording], picks: list[tuple[int, int]], delay: int):
    """(start states (M, 4), applied torques (M, WINDOW, 2), end states (M, 4)) of the windows ``picks`` for a
    sensor ``delay`` (steps): the measured state k is the true state k - delay, so the torques applied over steps
    k - delay .. k - delay + WINDOW - 1 carry it to the measured state k + WINDOW."""
    starts = np.array([recordings[i].x[k] for i, k in picks])
    torques = np.array([recordings[i].effort[k - delay:k - delay + WINDOW] for i, k in picks])
    ends = np.array([recordings[i].x[k + WINDOW] for i, k in picks])
    return starts, torques, ends


def _simulate(plant: PlantParameters, starts: np.ndarray, torques: np.ndarray, dt: float) -> np.ndarray:
    model, x = DoublePendulum(plant), starts.copy()
    for j in range(torques.shape[1]):
        x = model.rk4_step(x, torques[:, j], dt)
    return x


def with_mechanics(plant: PlantParameters, factors: np.ndarray) -> PlantParameters:
    """``plant`` with its masses, centre-of-mass distances and inertias (m1, m2, r1, r2, I1, I2) times ``factors``;
    each inertia kept at least m r^2 (about the joint: at least the point mass's). The lengths stay: a ruler
    measures them."""
    f = np.asarray(factors, dtype=float)
    m = (plant.m[0] * f[0], plant.m[1] * f[1])
    r = (plant.r[0] * f[2], plant.r[1] * f[3])
    inertia = tuple(max(plant.I[j] * f[4 + j], m[j] * r[j] ** 2) for j in range(2))
    return replace(plant, m=tuple(float(v) for v in m), r=tuple(float(v) for v in r),
                   I=tuple(float(v) for v in inertia))


def _fit_plant(prior: PlantParameters, starts, torques, ends, dt: float,
               mechanics: bool = False) -> tuple[PlantParameters, np.ndarray]:
    """The prior's b, cf, Ir (and with ``mechanics`` its m, r, I as factors) fitted to the windows' end velocities.
    Only four combinations of m, r, I act on the motion (I1 + m2 l1^2, I2, m2 r2, m1 r1 + m2 l1): the fit moves
    the factors along those and leaves the rest at the prior's."""
    def plant_of(theta: np.ndarray) -> PlantParameters:
        plant = with_parameters(prior, theta[:5])
        return with_mechanics(plant, theta[5:]) if mechanics else plant

    def residual(theta: np.ndarray) -> np.ndarray:
        return (_simulate(plant_of(theta), starts, torques, dt)[:, 2:] - ends[:, 2:]).ravel()

    start, lower, upper, scale = np.clip(parameters_of(prior), LOWER, UPPER), LOWER, UPPER, SCALE
    if mechanics:
        ones = np.ones(6)                  # m1, m2, r1, r2, I1, I2 as factors on the prior's
        start, scale = np.append(start, ones), np.append(scale, MECHANICS_SCALE * ones)
        lower, upper = np.append(lower, MECHANICS_BOUNDS[0] * ones), np.append(upper, MECHANICS_BOUNDS[1] * ones)
    fit = least_squares(residual, start, bounds=(lower, upper), x_scale=scale, diff_step=1e-3,
                        max_nfev=120 if mechanics else 60)
    plant = plant_of(fit.x) if np.all(np.isfinite(fit.x)) else prior
    return plant, _simulate(plant, starts, torques, dt) - ends


def motor_lag(recordings: list[StateRecording], actuated: int, limit: float) -> tuple[float, float]:
    """(r, torque noise std in N m) from u_k - u_(k-1) = r (c_k - u_(k-1)) + noise on the actuated joint, over
    consecutive valid steps with a known command and neither torque at the limit. (1, 0) without such steps."""
    du, dc = [], []
    for rec in recordings:
        u, c = rec.effort[:, actuated], rec.command[:, actuated]
        ok = rec.valid[1:] & rec.valid[:-1] & np.isfinite(c[1:])
        ok &= (np.abs(u[1:]) < 0.999 * limit) & (np.abs(u[:-1]) < 0.999 * limit) & (np.abs(c[1:]) < 0.999 * limit)
        du.append((u[1:] - u[:-1])[ok])
        dc.append((c[1:] - u[:-1])[ok])
    du, dc = np.concatenate(du), np.concatenate(dc)
    if len(du) < 20 or float(dc @ dc) <= 1e-9:
        return 1.0, 0.0
    r = float(np.clip((dc @ du) / (dc @ dc), 1e-3, 1.0))
    return r, float(np.std(du - r * dc))


def identify_robot(prior: PlantParameters, recordings: list[StateRecording], actuated: int, torque_limit: float,
                   rng: np.random.Generator | None = None, mechanics: bool = False) -> IdentifiedRobot | None:
    """The robot behind ``recordings``: for each delay of 0 .. MAX_DELAY_STEPS state steps the prior's b, cf and Ir
    are fitted to 10-step windows (velocity after the window, rad/s); the delay whose fit leaves the least residual
    wins; every delay is fitted on the same windows. The measurement noise is the residual over sqrt(2) (noise at
    both ends of a window), per joint and coordinate; the motor lag and torque noise come from :func:`motor_lag`.
    ``recordings`` may hold None (a trial without effort). None without MIN_WINDOWS usable windows.

    ``mechanics`` (opt-in, for design robots: ``mcpilco identify --mechanics``): the masses, centre-of-mass distances
    and inertias are fitted too, as factors within MECHANICS_BOUNDS of the prior's. Why: a robot built with other
    links than the prior's drawing moves otherwise, and a design robot with the prior's mechanics judges controller
    settings on the wrong robot. The learner's own identification (``gp.identify_robot``) keeps the prior's
    mechanics: its model file stores b, cf and Ir only."""
    rng = rng or np.random.default_rng(0)
    recordings = [r for r in recordings if r is not None and len(r.effort) > WINDOW + MAX_DELAY_STEPS]
    picks = _windows(recordings, rng)
    if len(picks) < MIN_WINDOWS:
        return None
    dt = recordings[0].dt
    r, torque_noise = motor_lag(recordings, actuated, torque_limit)
    best: tuple[float, IdentifiedRobot] | None = None
    for delay in range(MAX_DELAY_STEPS + 1):
        plant, error = _fit_plant(prior, *_window_data(recordings, picks, delay), dt, mechanics)
        rms = np.sqrt(np.mean(error ** 2, axis=0))
        if best is not None and float(np.sum(rms[2:] ** 2)) >= best[0]:
            continue
        velocity = rms[2:] / math.sqrt(2.0)
        # a position's error after the window is the noise at both ends plus the start velocity's noise carried
        # over the window (velocity noise x WINDOW dt)
        position = np.sqrt(np.maximum(rms[:2] ** 2 - (velocity * WINDOW * dt) ** 2, 0.0) / 2.0)
        noise = tuple(float(v) for v in (*position, *velocity))
        robot = IdentifiedRobot(plant, delay, dt, r, noise, torque_noise, (float(rms[2]), float(rms[3])), len(picks))
        best = (float(np.sum(rms[2:] ** 2)), robot)
    return best[1]


def write_profile(robot: IdentifiedRobot, path: str | Path, description: str) -> Path:
    """Write ``robot`` as a robot profile file (config/robot_profiles.yaml's fields) and its plant as a model of the
    ``plant_models.yaml`` beside it (added to that file, or the file created): a design robot to choose controller
    settings on without robot time. Refuses to replace a file or a model of the same name (ValueError). Returns
    the plant models file."""
    path = Path(path)
    if path.exists():
        raise ValueError(f"{path} exists: choose another name")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", path.stem) or path.suffix not in (".yaml", ".yml"):
        raise ValueError(f"{path}: name the profile with letters, digits, '_', '-' and '.' and end it in .yaml "
                         "(its name becomes a YAML key of the plant models file)")
    models = path.parent / "plant_models.yaml"
    name = f"identified_{path.stem}"
    p = robot.plant
    block = (f"  {name}:   # {description}\n"
             + "".join(f"    {key}: {_yaml_value(getattr(p, key))}\n"
                       for key in ("m", "l", "r", "I", "Ir", "gr", "b", "cf", "g")))
    if models.exists():
        try:
            existing = yaml.safe_load(models.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{models}: not valid YAML ({' '.join(str(exc).split())}); fix it or write the profile "
                             "elsewhere") from exc
        if not isinstance(existing, dict):
            raise ValueError(f"{models}: not a plant models file (a mapping with 'models'); write the profile "
                             "elsewhere")
        if name in (existing.get("models") or {}):
            raise ValueError(f"{models} already holds a model {name!r}: choose another profile name")
        text = models.read_text(encoding="utf-8")
        models.write_text(text + ("" if text.endswith("\n") else "\n") + block, encoding="utf-8")
        try:                                     # appended under `models:` only if that is the file's last key
            load_plant_parameters(models, name)
        except ConfigError as exc:
            models.write_text(text, encoding="utf-8")
            raise ValueError(f"{models}: could not add the model {name} at its end ({exc}); left as it was") from exc
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        models.write_text("# Plant models of design robots (mcpilco identify --write)\nmodels:\n" + block,
                          encoding="utf-8")
    noise = ", ".join(f"{v:.6g}" for v in robot.measurement_noise)
    path.write_text(f"# {description} (mcpilco identify --write): the learner's own robot, a design robot\n"
                    f"description: {json.dumps(description)}\n"
                    f"plant_model: {name}\n"
                    f"measurement_noise: [{noise}]   # rad, rad, rad/s, rad/s\n"
                    f"delay: {robot.delay:.6g}               # s ({robot.delay_steps} steps of {robot.dt:g} s)\n"
                    f"motor_responsiveness: {robot.motor_responsiveness:.6g}\n"
                    f"torque_noise: {{actuated: {robot.torque_noise:.6g}, passive: 0.0}}   # N m\n"
                    "perturbation: 0.0\n"
                    f"seed: {NOISE_SEED}\n", encoding="utf-8")
    return models


def _yaml_value(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(repr(float(v)) for v in value) + "]"
    return repr(float(value))
