"""Closed-loop simulation of the double pendulum: RK4 at a fixed step, zero-order-held torques.

The controller is called at every integration step (2 ms by default) and keeps its own rates (the
supervisor holds the 50 Hz policy output; LQR and damping run at every step). The simulator enforces
the robot's torque limits, so the passive joint receives exactly zero torque whatever a controller
asks; what the controller *asked* for the passive joint is recorded so tests and reports can check it.

Optional measurement noise, torque noise and measurement delay exist for robustness studies; all
randomness comes from an explicit ``np.random.Generator``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .plant import DoublePendulum

MODE_CODES = {"policy": 0, "lqr": 1, "damping": 2, "safe": 3, "idle": 4, "reset": 5, "other": 6}
MODE_NAMES = {code: name for name, code in MODE_CODES.items()}

# An override returns torques for both joints while it is active (e.g. the evaluation's reset PID),
# None otherwise. Arguments: step index, time (s), true state.
Override = Callable[[int, float, tuple], "np.ndarray | None"]


class SteppableController(Protocol):
    mode: str

    def reset(self) -> None: ...

    def step(self, x: np.ndarray, t: float) -> np.ndarray: ...


@dataclass(frozen=True)
class NoiseModel:
    """Imperfections for robustness studies (all zero by default = the evaluation protocol).

    measurement_std: (4,) std of additive Gaussian noise on the measured state (rad, rad/s);
    torque_std: std of additive noise on the actuated torque (N m);
    delay_steps: the controller sees the state from this many steps ago.
    """

    measurement_std: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    torque_std: float = 0.0
    delay_steps: int = 0

    @property
    def is_ideal(self) -> bool:
        return not any(self.measurement_std) and self.torque_std == 0.0 and self.delay_steps == 0


@dataclass
class Trajectory:
    """t: (N+1,) s; x: (N+1, 4) true states; u: (N, 2) applied torques (N m); u_cmd: (N, 2) what the
    controller asked (zeros where an override acted); mode: (N,) codes of MODE_CODES."""

    t: np.ndarray
    x: np.ndarray
    u: np.ndarray
    u_cmd: np.ndarray
    mode: np.ndarray
    extras: dict = field(default_factory=dict)

    @property
    def dt(self) -> float:
        return float(self.t[1] - self.t[0])


class Simulator:
    """Runs a controller against the plant (see module docstring)."""

    def __init__(self, plant: DoublePendulum, torque_limits: tuple[float, float], dt: float = 0.002,
                 noise: NoiseModel | None = None, rng: np.random.Generator | None = None,
                 override_limits: tuple[float, float] = (6.0, 6.0)) -> None:
        self.plant = plant
        self.torque_limits = np.asarray(torque_limits, dtype=np.float64)
        self.override_limits = np.asarray(override_limits, dtype=np.float64)
        self.dt = float(dt)
        self.noise = noise or NoiseModel()
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def run(self, controller: SteppableController, x0: np.ndarray, duration: float,
            override: Override | None = None, reset_controller: bool = True) -> Trajectory:
        """Simulate ``duration`` seconds from ``x0``; ``override`` may take over the torques at times."""
        n = int(round(duration / self.dt))
        t = np.arange(n + 1) * self.dt
        xs = np.empty((n + 1, 4))
        us = np.zeros((n, 2))
        u_cmd = np.zeros((n, 2))
        modes = np.empty(n, dtype=np.int8)
        x = tuple(float(v) for v in x0)
        xs[0] = x
        if reset_controller:
            controller.reset()
        for k in range(n):
            forced = override(k, t[k], x) if override is not None else None
            if forced is not None:
                u = np.clip(forced, -self.override_limits, self.override_limits)
                modes[k] = MODE_CODES["reset"]
            else:
                command = np.asarray(controller.step(self._measure(xs, k), float(t[k])), dtype=np.float64)
                u_cmd[k] = command
                u = self._apply_limits(command)
                modes[k] = MODE_CODES.get(controller.mode, MODE_CODES["other"])
            us[k] = u
            x = self.plant.rk4_step_scalar(x, (u[0], u[1]), self.dt)
            xs[k + 1] = x
        return Trajectory(t=t, x=xs, u=us, u_cmd=u_cmd, mode=modes)

    def _measure(self, xs: np.ndarray, k: int) -> np.ndarray:
        if self.noise.is_ideal:
            return xs[k].copy()
        measured = xs[max(0, k - self.noise.delay_steps)].copy()
        return measured + self.rng.standard_normal(4) * np.asarray(self.noise.measurement_std)

    def _apply_limits(self, command: np.ndarray) -> np.ndarray:
        if command.shape != (2,) or not np.isfinite(command).all():
            return np.zeros(2)  # a broken command never reaches the plant
        u = command.copy()
        if self.noise.torque_std:
            u += self.rng.standard_normal(2) * self.noise.torque_std * (self.torque_limits > 0)
        return np.clip(u, -self.torque_limits, self.torque_limits)
