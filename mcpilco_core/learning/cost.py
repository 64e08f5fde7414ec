"""The saturated distance cost of the seed paper (dimensionless, in [0, 1)).

    c(x) = 1 - exp( - sum_i ((|wrap(q_i)| - |g_i|) / l_i)^2 ),   goal g = (pi, 0)

Angles are wrapped to [-pi, pi) first, so multi-turn states cost the same as their wrapped twins and
``|q1|`` makes both directions of approach to the upright equal. The seed's cost ignores velocities;
reaching the goal and *staying* there is what minimises its sum over a long horizon. Optionally
(``velocity_lengthscales``) the exponent also gets ``sum_i (dq_i / lv_i)^2``: with the short horizons that
keep gradients through the chaotic fast states useful, the angle-only cost is minimised by keeping the
pendulum *spinning* through the top (measured: 86-130 turns in 60 s, no balancing); a velocity term makes
passing the top fast as costly as hanging.

Optionally (``roa_weight`` w > 0) a second term rewards what the supervisor can actually use: states inside the
LQR's region of attraction, where the LQR takes over and balances. With V(x) = e^T S e the LQR cost-to-go of the
wrapped error e = (wrap(q1 - pi), wrap(q2), dq1, dq2), rho the ROA level (the supervisor switches at V < rho)
and s = ``roa_scale``,

    c(x) = ( c_seed(x) + w (1 - exp(-V(x) / (s rho))) ) / (1 + w)

The acrobot's ROA is a thin ellipsoid (rho = 0.42 with S_11 = 1300: 0.02 rad of q1 alone leaves it), so with
s = 1 the term is a needle with no gradient anywhere a particle is; s of 10-100 widens it to states from which
the saturated LQR still catches some of the time (measured: 40 % at V = 2-4, 4 % at 8-16).

The seed's broad distance (l = 3 rad) barely distinguishes "near the top and slow enough to be caught" from
"near the top and too fast"; V measures exactly that, in the directions the LQR finds hard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CostSettings:
    """lengthscales: l_i (rad) of the saturated distance, one per joint (the seed uses 3);
    velocity_lengthscales: lv_i (rad/s) of the optional velocity term (None: the seed's angle-only cost)."""

    lengthscales: tuple[float, float] = (3.0, 3.0)
    velocity_lengthscales: tuple[float, float] | None = None
    roa_weight: float = 0.0
    roa_metric: tuple[tuple[float, ...], ...] | None = None   # S (4x4) of the LQR design, V = e^T S e
    roa_rho: float = 1.0                                        # s * rho: the ROA level times roa_scale

    def __post_init__(self) -> None:
        if self.roa_weight < 0:
            raise ValueError("roa_weight must be >= 0")
        if self.roa_weight > 0 and self.roa_metric is None:
            raise ValueError("roa_weight > 0 needs roa_metric (the LQR's S)")
        if not self.roa_rho > 0:
            raise ValueError("roa_rho must be > 0")


def wrap(angle: torch.Tensor) -> torch.Tensor:
    """Angles (rad) wrapped to [-pi, pi)."""
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


def saturated_cost(states: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """Cost of states (..., 4) -> (...)."""
    d1 = (wrap(states[..., 0]).abs() - math.pi) / settings.lengthscales[0]
    d2 = wrap(states[..., 1]).abs() / settings.lengthscales[1]
    exponent = d1 * d1 + d2 * d2
    if settings.velocity_lengthscales is not None:
        v1 = states[..., 2] / settings.velocity_lengthscales[0]
        v2 = states[..., 3] / settings.velocity_lengthscales[1]
        exponent = exponent + v1 * v1 + v2 * v2
    cost = 1.0 - torch.exp(-exponent)
    if settings.roa_weight > 0:
        cost = (cost + settings.roa_weight * roa_cost(states, settings)) / (1.0 + settings.roa_weight)
    return cost


def roa_cost(states: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """1 - exp(-V(x) / (s rho)) for states (..., 4) (with s = 1: below 1 - 1/e exactly where the LQR takes over)."""
    metric = torch.as_tensor(settings.roa_metric, dtype=states.dtype, device=states.device)
    error = torch.stack([wrap(states[..., 0] - math.pi), wrap(states[..., 1]), states[..., 2], states[..., 3]], -1)
    value = ((error @ metric) * error).sum(-1)
    return 1.0 - torch.exp(-value / settings.roa_rho)


def trajectory_cost(trajectory: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """Monte-Carlo estimate of J = sum_t E[c(x_t)] for particle states (T + 1, P, 4)."""
    return saturated_cost(trajectory, settings).mean(-1).sum()
