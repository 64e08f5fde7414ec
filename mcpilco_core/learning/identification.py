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


def predicted_velocities(plant: PlantParameters, data: TransitionData, period: float, actuated: int) -> np.ndarray:
    """Velocities (N, 2) after one period from each transition's start, the torque held (RK4 substeps)."""
    model = DoublePendulum(plant)
    torques = np.zeros((len(data.u), 2))
    torques[:, actuated] = data.u
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
    if len(data.u) < 10:
        return prior
    if len(data.u) > max_transitions:
        rng = rng or np.random.default_rng(0)
        keep = np.sort(rng.choice(len(data.u), max_transitions, replace=False))
        data = TransitionData(data.x[keep], data.u[keep], data.x_next[keep])
    measured = data.x_next[:, 2:]

    def residual(theta: np.ndarray) -> np.ndarray:
        return (predicted_velocities(with_parameters(prior, theta), data, period, actuated) - measured).ravel()

    start = np.clip(parameters_of(prior), LOWER, UPPER)
    fit = least_squares(residual, start, bounds=(LOWER, UPPER), x_scale=SCALE, diff_step=1e-3, max_nfev=60)
    if not np.all(np.isfinite(fit.x)):
        return prior
    return with_parameters(prior, fit.x)
