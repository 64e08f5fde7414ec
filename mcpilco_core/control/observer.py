"""The state observer: the measured state with its velocity noise filtered, in front of the supervisor (opt-in).

Why: a real robot's joint velocities are noisy (moteus differentiates its encoder; the hardware proxy adds 0.05 rad/s
of noise to each velocity), and the balancing LQR multiplies them by tens of N m s/rad, so the noise reaches the
motor as torque noise of a few N m. Near the top that costs catches: on the acrobot's design robot (identified from
its counted 3 s exploration trial: velocity noise 0.049 rad/s, position noise 7e-5 rad) the proxy acrobot scores 0.330
/ 0.348 on protocol seeds 200-211 / 212-223, and 0.383 / 0.376 with the same robot's sensors noise-free
(docs/learner.md, "Filtering the velocities").

How: each control period the last estimate is carried one period ahead on the robot config's plant (RK4, the torque
the motor applies: the last command through the motor's first-order lag ``u += r (u_cmd - u)``), then each joint's
(angle, velocity) is corrected by the steady-state Kalman gain of a double integrator whose acceleration is off by
white noise of std ``process_noise`` (what the model gets wrong: friction, lag, delay) and whose sensors have the
configured noise. Positions from an encoder are precise, so the corrected velocity leans on how the angle moved more
than on the noisy velocity reading. After a gap in the states (a disturbance window, a restart) the estimate starts
again from the measurement.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import solve_discrete_are

from ..config import ObserverConfig
from ..plant import DoublePendulum, wrap_angle

GAP_FACTOR = 1.5   # a state more than this many control periods after the last one restarts the estimate


def steady_state_gain(period: float, process_noise: float, position_noise: float,
                      velocity_noise: float) -> np.ndarray:
    """The 2x2 steady-state Kalman gain of one joint: correction of (angle rad, velocity rad/s) per innovation of
    (angle rad, velocity rad/s). Model: a double integrator over ``period`` s whose acceleration has white noise of
    std ``process_noise`` rad/s^2; measurements of both with std ``position_noise`` rad and ``velocity_noise`` rad/s."""
    transition = np.array([[1.0, period], [0.0, 1.0]])
    noise_input = np.array([[0.5 * period * period], [period]])
    process = noise_input @ noise_input.T * process_noise ** 2
    measurement = np.diag([position_noise ** 2, velocity_noise ** 2])
    predicted = solve_discrete_are(transition.T, np.eye(2), process, measurement)   # a-priori covariance
    return predicted @ np.linalg.inv(predicted + measurement)


class StateObserver:
    """The filtered state (module docstring) for each measured state; ``update`` once per control period."""

    def __init__(self, plant: DoublePendulum, settings: ObserverConfig, period: float) -> None:
        self.plant = plant
        self.settings = settings
        self.period = float(period)
        self.gain = steady_state_gain(self.period, settings.process_noise, settings.position_noise,
                                      settings.velocity_noise)
        self.reset()

    def reset(self) -> None:
        """Forget the estimate: the next state is taken as measured."""
        self._x: tuple[float, float, float, float] | None = None
        self._t = -math.inf
        self._applied = (0.0, 0.0)

    def update(self, measured: np.ndarray, t: float, command: np.ndarray) -> np.ndarray:
        """The estimate (4,) at time ``t`` (s) from the state ``measured`` (rad, rad/s) and ``command`` (2,) N m, the
        torques commanded at the previous state (they act from then until now)."""
        measured = np.asarray(measured, dtype=np.float64)
        if self._x is None or not 0.0 < t - self._t <= GAP_FACTOR * self.period:
            self._start(measured, t)
            return measured.copy()
        r = self.settings.motor_responsiveness
        applied = (self._applied[0] + r * (float(command[0]) - self._applied[0]),
                   self._applied[1] + r * (float(command[1]) - self._applied[1]))
        # over the time that passed: states come with jitter on a real-time path (a whole period assumed for a
        # state 0.2 ms late or early cost up to 1.2 rad/s of velocity error); a period to float precision (lockstep,
        # the evaluator) is taken as exactly one, so those stay equal bit for bit
        elapsed = t - self._t
        step = self.period if abs(elapsed - self.period) <= 1e-9 else elapsed
        predicted = self.plant.rk4_step_scalar(self._x, applied, step)
        if not all(map(math.isfinite, predicted)):
            self._start(measured, t)
            return measured.copy()
        estimate = list(predicted)
        k = self.gain
        for joint in range(2):
            angle_error = float(wrap_angle(measured[joint] - predicted[joint]))
            speed_error = float(measured[2 + joint]) - predicted[2 + joint]
            estimate[joint] += k[0, 0] * angle_error + k[0, 1] * speed_error
            estimate[2 + joint] += k[1, 0] * angle_error + k[1, 1] * speed_error
        self._x = (estimate[0], estimate[1], estimate[2], estimate[3])
        self._t = float(t)
        self._applied = applied
        return np.array(self._x)

    def _start(self, measured: np.ndarray, t: float) -> None:
        self._x = tuple(float(v) for v in measured)    # type: ignore[assignment]
        self._t = float(t)
        self._applied = (0.0, 0.0)
