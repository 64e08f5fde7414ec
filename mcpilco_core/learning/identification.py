"""Identify the prior's friction and rotor inertia from the trials (least squares), before the GP fit.

Why: the prior a user starts from (model_1.1) has no friction and no rotor inertia. The GP could learn their
effect from the data, but Coulomb friction jumps at zero speed, and a smooth kernel needs many points to learn
that. Left to the GP, the residual stays at 0.1-0.25 rad/s per 20 ms step on the hardware proxy, and the policy
optimisation exploits that error. These few physical parameters enter the equations of motion in a known way. Fitted
to the recorded transitions, they take the prior's one-step error down to that of the true plant. The GP then
learns only what is left: delay, lag and noise.

Identified: viscous friction b (N m s/rad) and Coulomb friction cf (N m) of both joints, and the rotor inertia Ir
(kg m^2). Everything else keeps the user's prior values. Each transition is integrated over one period Ts with
RK4 substeps and the mean applied torque held, as the plant would be. Bounds keep the values physical.

With ``fit_delay`` (``gp.delay_aware``) one more number is fitted: the command delay as a fraction a of the period.
A robot whose state reaches the controller late keeps applying the previous command for the first a Ts of each
transition between measured states. Its velocity change is then, to first order, that of the torque
u + a (u_prev - u) held for the whole period (the delay-aware model's prior does the same).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy.optimize import least_squares

from ..config import PlantParameters
from ..plant import DoublePendulum
from ..recording.transitions import TransitionData

SUBSTEPS = 10                                   # RK4 substeps per policy period (2 ms at Ts = 20 ms)
LOWER = np.array([0.0, 0.0, 0.0, 0.0, 0.0])
UPPER = np.array([0.5, 0.5, 1.0, 1.0, 1e-3])    # b1, b2 (N m s/rad), cf1, cf2 (N m), Ir (kg m^2)
SCALE = np.array([0.01, 0.01, 0.1, 0.1, 1e-4])


def with_parameters(plant: PlantParameters, theta: np.ndarray) -> PlantParameters:
    """``plant`` with theta = (b1, b2, cf1, cf2, Ir)."""
    return replace(plant, b=(float(theta[0]), float(theta[1])), cf=(float(theta[2]), float(theta[3])),
                   Ir=float(theta[4]))


def parameters_of(plant: PlantParameters) -> np.ndarray:
    """theta = (b1, b2, cf1, cf2, Ir) of ``plant``."""
    return np.array([plant.b[0], plant.b[1], plant.cf[0], plant.cf[1], plant.Ir], dtype=float)


DELAY_BOUNDS = (0.0, 0.5)                       # command delay as a fraction of the period
DELAY_SCALE = 0.05


def effective_torques(u: np.ndarray, u_prev: np.ndarray, delay_fraction: float) -> np.ndarray:
    """The torque (N m) held over a period that changes the velocity as the previous command for ``delay_fraction``
    of it and then the new one do: u + a (u_prev - u)."""
    return u + delay_fraction * (u_prev - u)


def predicted_velocities(plant: PlantParameters, data: TransitionData, period: float, actuated: int,
                         delay_fraction: float = 0.0) -> np.ndarray:
    """Velocities (N, 2) after one period from each transition's start, the (effective) torque held (RK4 substeps)."""
    model = DoublePendulum(plant)
    torques = np.zeros((len(data.u), 2))
    torques[:, actuated] = effective_torques(data.u, data.u_prev, delay_fraction)
    x = np.array(data.x, dtype=float)
    for _ in range(SUBSTEPS):
        x = model.rk4_step(x, torques, period / SUBSTEPS)
    return x[:, 2:]


def identify_plant(prior: PlantParameters, data: TransitionData, period: float, actuated: int,
                   max_transitions: int = 3000, rng: np.random.Generator | None = None) -> PlantParameters:
    """The prior with friction and rotor inertia fitted to ``data`` (velocity error after one period, rad/s).

    At most ``max_transitions`` (a random subset, ``rng``) enter the fit, which keeps it to about a second. Starts
    from the prior's own values, clipped into the bounds.
    """
    return identify_prior(prior, data, period, actuated, fit_delay=False, max_transitions=max_transitions,
                          rng=rng)[0]


def identify_prior(prior: PlantParameters, data: TransitionData, period: float, actuated: int, fit_delay: bool,
                   delay_fraction: float = 0.0, max_transitions: int = 3000,
                   rng: np.random.Generator | None = None) -> tuple[PlantParameters, float]:
    """:func:`identify_plant`, and with ``fit_delay`` the command delay as a fraction of the period as well
    (starting from ``delay_fraction``); returns (plant, delay fraction). Too little data (< 10 transitions) or a
    failed fit returns the starting values."""
    if len(data.u) < 10:
        return prior, delay_fraction
    if len(data.u) > max_transitions:
        rng = rng or np.random.default_rng(0)
        data = data.subset(np.sort(rng.choice(len(data.u), max_transitions, replace=False)))
    measured = data.x_next[:, 2:]
    lower, upper, scale = LOWER, UPPER, SCALE
    start = np.clip(parameters_of(prior), LOWER, UPPER)
    if fit_delay:
        lower, upper = np.append(LOWER, DELAY_BOUNDS[0]), np.append(UPPER, DELAY_BOUNDS[1])
        scale, start = np.append(SCALE, DELAY_SCALE), np.append(start, np.clip(delay_fraction, *DELAY_BOUNDS))

    def residual(theta: np.ndarray) -> np.ndarray:
        delay = float(theta[5]) if fit_delay else delay_fraction
        return (predicted_velocities(with_parameters(prior, theta), data, period, actuated, delay)
                - measured).ravel()

    fit = least_squares(residual, start, bounds=(lower, upper), x_scale=scale, diff_step=1e-3, max_nfev=60)
    if not np.all(np.isfinite(fit.x)):
        return prior, delay_fraction
    return with_parameters(prior, fit.x), float(fit.x[5]) if fit_delay else delay_fraction
