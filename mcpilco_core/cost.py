"""The saturated distance cost of the seed paper (dimensionless, in [0, 1)).

    c(x) = 1 - exp( - sum_i ((|wrap(q_i)| - |g_i|) / l_i)^2 ),   goal g = (pi, 0)

Angles are wrapped to [-pi, pi) first, so multi-turn states cost the same as their wrapped twins and
``|q1|`` makes both directions of approach to the upright equal. The cost ignores velocities; reaching
the goal and *staying* there is what minimises its sum over the horizon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CostSettings:
    """lengthscales: l_i (rad) of the saturated distance, one per joint (the seed uses 3)."""

    lengthscales: tuple[float, float] = (3.0, 3.0)


def wrap(angle: torch.Tensor) -> torch.Tensor:
    """Angles (rad) wrapped to [-pi, pi)."""
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


def saturated_cost(states: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """Cost of states (..., 4) -> (...)."""
    d1 = (wrap(states[..., 0]).abs() - math.pi) / settings.lengthscales[0]
    d2 = wrap(states[..., 1]).abs() / settings.lengthscales[1]
    return 1.0 - torch.exp(-(d1 * d1 + d2 * d2))


def trajectory_cost(trajectory: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """Monte-Carlo estimate of J = sum_t E[c(x_t)] for particle states (T + 1, P, 4)."""
    return saturated_cost(trajectory, settings).mean(-1).sum()
