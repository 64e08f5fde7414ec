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

Optionally (``catch_v50`` > 0) the rollout models the catch itself: the particles are simulated with the policy
alone, but on the robot the supervisor's LQR takes over near the top and, when it catches, the cost is 0 from then
on. Each step a particle is caught with probability h(x) = 1 / (1 + (V(x) / V50)^k) -- the saturated LQR's
measured catch rate from cost-to-go V (docs/learner.md: acrobot 91 / 73 / 40 / 16 % at V/rho = 1-2.4 / 2.4-4.8 /
4.8-9.6 / 9.6-19, i.e. V50 = 6 rho, k = 2) -- and each state's cost is weighted by the probability that the
particle has not been caught yet, s_t = prod_{k <= t} (1 - h(x_k)):

    J = sum_t E[ s_t c(x_t) ]

Unlike the additive ``roa_weight`` term (which rewards touching the basin for one step, after which the policy,
which cannot balance there, lets the particle fall through and pays for it), this rewards *arriving* where the
LQR catches, as the supervisor on the robot does: a caught particle costs nothing for the rest of the horizon.

Optionally (``height_weight`` w > 0) a term that is the protocol's own score: the score counts the time the end
effector is above the line 0.9 (l1 + l2), so with h(x) = -l1 cos q1 - l2 cos(q1 + q2) (m; the controller's own
plant's link lengths) and the smooth step sigma((line - h) / ``height_scale``),

    c(x) = ( c_seed(x) + w sigma((line - h(x)) / scale) ) / (1 + w)

The seed's broad distance gives the gradient far from the top (the step is flat there); the step tells the optimiser
exactly where the score starts counting: a state with the tip just above the line scores like the upright.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ..plant import EE_THRESHOLD_FRACTION


@dataclass(frozen=True)
class CostSettings:
    """lengthscales: l_i (rad) of the saturated distance, one per joint (the seed uses 3);
    velocity_lengthscales: lv_i (rad/s) of the optional velocity term (None: the seed's angle-only cost)."""

    lengthscales: tuple[float, float] = (3.0, 3.0)
    velocity_lengthscales: tuple[float, float] | None = None
    roa_weight: float = 0.0
    roa_metric: tuple[tuple[float, ...], ...] | None = None   # S (4x4) of the LQR design, V = e^T S e
    roa_rho: float = 1.0                                        # s * rho: the ROA level times roa_scale
    catch_v50: float = 0.0            # V at which the LQR catches half of the time (0: no catch model)
    catch_sharpness: float = 2.0      # k of the catch probability 1 / (1 + (V / V50)^k)
    height_weight: float = 0.0        # w of the below-the-line term (0: off)
    height_scale: float = 0.02        # m, width of its smooth step at the line
    link_lengths: tuple[float, float] = (0.0, 0.0)    # m, l1 and l2 of the controller's own plant
    height_line: float = 0.0          # m, the score's line above the shoulder (0.9 (l1 + l2))

    def __post_init__(self) -> None:
        if self.roa_weight < 0:
            raise ValueError("roa_weight must be >= 0")
        if self.roa_weight > 0 and self.roa_metric is None:
            raise ValueError("roa_weight > 0 needs roa_metric (the LQR's S)")
        if not (self.catch_v50 >= 0 and math.isfinite(self.catch_v50)):
            raise ValueError("catch_v50 must be >= 0 and finite")
        if self.catch_v50 > 0 and self.roa_metric is None:
            raise ValueError("catch_v50 > 0 needs roa_metric (the LQR's S)")
        if not self.catch_sharpness > 0:
            raise ValueError("catch_sharpness must be > 0")
        if not self.roa_rho > 0:
            raise ValueError("roa_rho must be > 0")
        if not (self.height_weight >= 0 and math.isfinite(self.height_weight)):
            raise ValueError("height_weight must be >= 0 and finite")
        if self.height_weight > 0 and not (self.height_scale > 0 and min(self.link_lengths) > 0
                                           and 0 < self.height_line < sum(self.link_lengths)):
            raise ValueError("height_weight > 0 needs height_scale > 0, link_lengths > 0 and a line between 0 "
                             "and l1 + l2")


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
    if settings.height_weight > 0:
        cost = (cost + settings.height_weight * below_line_cost(states, settings)) / (1.0 + settings.height_weight)
    return cost


def with_height_term(settings: CostSettings, weight: float, scale: float,
                     link_lengths: Sequence[float]) -> CostSettings:
    """``settings`` with the below-the-line term of weight ``weight`` and step width ``scale`` (m) on the links
    ``link_lengths`` (m, l1 and l2 of the controller's own plant; the line is the score's, 0.9 (l1 + l2)); weight 0:
    ``settings`` as they are."""
    if weight <= 0:
        return settings
    lengths = (float(link_lengths[0]), float(link_lengths[1]))
    return replace(settings, height_weight=float(weight), height_scale=float(scale), link_lengths=lengths,
                   height_line=EE_THRESHOLD_FRACTION * sum(lengths))


def lqr_metric(supervisor) -> tuple[tuple[float, ...], ...]:
    """S (4x4) of a supervisor's LQR design as the cost's ``roa_metric`` (V = e^T S e)."""
    return tuple(tuple(float(v) for v in row) for row in supervisor.design.S)


def with_catch_model(settings: CostSettings, robot, level: float, sharpness: float) -> CostSettings:
    """``settings`` with the catch model of the controller of robot config ``robot``: V its LQR's cost-to-go,
    V50 = ``level`` x its ROA level rho, k = ``sharpness``. Refused for a controller whose LQR never takes over."""
    from ..control import build_controller

    if robot.roa.enter_fraction <= 0:
        raise ValueError("the catch model needs a controller whose LQR takes over (roa.enter_fraction > 0)")
    supervisor = build_controller(robot)
    return replace(settings, roa_metric=lqr_metric(supervisor), catch_v50=float(level * supervisor.rho),
                   catch_sharpness=float(sharpness))


def below_line_cost(states: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """sigma((line - h(x)) / scale) for states (..., 4): about 1 below the score's line, 0 above it, a smooth step of
    width ``height_scale`` between; h = -l1 cos q1 - l2 cos(q1 + q2) the end effector's height (m)."""
    l1, l2 = settings.link_lengths
    height = -l1 * torch.cos(states[..., 0]) - l2 * torch.cos(states[..., 0] + states[..., 1])
    return torch.sigmoid((settings.height_line - height) / settings.height_scale)


def lqr_cost_to_go(states: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """V(x) = e^T S e of the wrapped error from the upright, states (..., 4) -> (...)."""
    metric = torch.as_tensor(settings.roa_metric, dtype=states.dtype, device=states.device)
    error = torch.stack([wrap(states[..., 0] - math.pi), wrap(states[..., 1]), states[..., 2], states[..., 3]], -1)
    return ((error @ metric) * error).sum(-1)


def roa_cost(states: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """1 - exp(-V(x) / (s rho)) for states (..., 4) (with s = 1: below 1 - 1/e exactly where the LQR takes over)."""
    return 1.0 - torch.exp(-lqr_cost_to_go(states, settings) / settings.roa_rho)


def catch_probability(states: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """h(x) = 1 / (1 + (V(x) / V50)^k): the chance that the supervisor's LQR catches from x (module docstring)."""
    ratio = lqr_cost_to_go(states, settings) / settings.catch_v50
    return 1.0 / (1.0 + ratio.clamp_min(0.0) ** settings.catch_sharpness)


def trajectory_cost(trajectory: torch.Tensor, settings: CostSettings) -> torch.Tensor:
    """Monte-Carlo estimate of J = sum_t E[c(x_t)] for particle states (T + 1, P, 4); with the catch model,
    J = sum_t E[s_t c(x_t)], s_t the probability that the particle has not been caught up to step t."""
    cost = saturated_cost(trajectory, settings)
    if settings.catch_v50 > 0:
        cost = cost * torch.cumprod(1.0 - catch_probability(trajectory, settings), dim=0)
    return cost.mean(-1).sum()


def trial_cost(trial, cost_settings) -> tuple[float, float]:
    """(sum, mean) of the saturated cost (dimensionless, each state in [0, 1)) over a recorded trial's states at
    the policy period. The sum is the ``robot_cost`` the learner reports for each of its simulated trials; the mean
    compares trials of different lengths (trial 0 usually explores longer). ``trial``: a ``trials.TrialData``."""
    cost = saturated_cost(torch.as_tensor(trial.x), cost_settings)
    return float(cost.sum()), float(cost.mean())
