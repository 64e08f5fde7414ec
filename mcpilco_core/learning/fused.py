"""The fused particle rollout: the whole rollout is one autograd node with a hand-written backward.

:meth:`DynamicsModel.step <mcpilco_core.learning.model.DynamicsModel.step>` (the reference) builds each transition from
~100 small autograd ops (policy, prior mean, GP, sampling, integration, features), each a few microseconds of
dispatch forward and backward. Here the same equations run as plain tensor code without a graph
(:func:`policy_step_forward`), and their gradient is written out (:func:`policy_step_backward`,
:func:`prior_backward`, :func:`~mcpilco_core.learning.gp.moments_backward`,
:func:`~mcpilco_core.learning.torch_policy.sum_of_gaussians_backward`); :class:`PolicyRollout` runs all steps in one
node. The results equal the autograd reference up to rounding (tested in float64, gradients included).

``compiled=True`` additionally runs these functions through ``torch.compile`` (inductor: fused C++ loops for the
elementwise work); if compilation fails the eager functions are used (one warning), so it is always safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .compile import MaybeCompiled
from .gp import FastGP, moments_backward, moments_forward
from .torch_policy import sum_of_gaussians_backward, sum_of_gaussians_forward


class PriorConstants(NamedTuple):
    """Constants of the physics prior ``Ts M^-1(q)(B u - n(q, dq))`` (see :class:`~mcpilco_core.plant.DoublePendulum`).

    friction: (joint, viscous b, Coulomb cf) for the joints with nonzero friction. :meth:`as_tensors` gives the
    same with 0-dim tensors, which eager arithmetic handles ~3x faster than Python floats (no scalar wrapping).
    rk4: integrate the prior with one Runge-Kutta-4 step over ``period`` instead of one Euler step
    (:func:`rk4_prior_forward`). delay: the command delay as a fraction a of the period (``gp.delay_aware``; 0: none).
    The previous command still acts for a Ts, so a transition sees the torque u + a (u_prev - u)
    (:func:`effective_torque`). It stays a Python float.
    """

    a: float
    h: float
    m12: float
    m22: float
    g1: float
    g2: float
    period: float
    actuated: int
    friction: tuple[tuple[int, float, float], ...]
    rk4: bool = False
    delay: float = 0.0

    def as_tensors(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> PriorConstants:
        def t(value: float) -> torch.Tensor:
            return torch.tensor(value, dtype=dtype, device=device)

        return PriorConstants(*(t(v) for v in self[:7]), self.actuated,
                              tuple((i, t(b), t(cf)) for i, b, cf in self.friction), self.rk4, self.delay)


def effective_torque(u: torch.Tensor, previous: torch.Tensor | None, delay: float) -> torch.Tensor:
    """The torque a transition sees: u + a (u_prev - u) with a = ``delay`` (u itself without a previous command)."""
    if previous is None or not delay:
        return u
    return torch.lerp(u, previous, delay)


def prior_forward(rows: torch.Tensor, u: torch.Tensor, k: PriorConstants) -> tuple[torch.Tensor, tuple]:
    """The prior mean (2, P) from the features rows = (dq1, dq2, cos q1, cos q2, sin q1, sin q2) (6, P) and
    torques u (P,), and what :func:`prior_backward` needs."""
    dq1, dq2, c1, c2, s1, s2 = rows.unbind(0)
    s12 = torch.addcmul(s1 * c2, c1, s2)
    hs = k.h * s2
    t1 = (dq1 + dq1 + dq2) * dq2
    g2 = s12 * k.g2
    rhs1 = torch.addcmul(hs * t1, s1, k.g1, value=-1.0) - g2
    rhs2 = torch.addcmul(g2, hs * dq1, dq1).neg_()
    if k.actuated == 0:
        rhs1 = rhs1 + u
    else:
        rhs2 = rhs2 + u
    for i, b, cf in k.friction:
        friction = torch.addcmul(b * rows[i], cf, torch.atan(100.0 * rows[i]))
        if i == 0:
            rhs1 = rhs1 - friction
        else:
            rhs2 = rhs2 - friction
    m11 = torch.addcmul(k.a, c2, k.h + k.h)
    m12 = torch.addcmul(k.m12, c2, k.h)
    det = torch.addcmul(m11 * k.m22, m12, m12, value=-1.0)
    scale = k.period / det
    n1 = torch.addcmul(k.m22 * rhs1, m12, rhs2, value=-1.0)
    n2 = torch.addcmul(m11 * rhs2, m12, rhs1, value=-1.0)
    prior = torch.stack([n1, n2]).mul_(scale)
    return prior, (rows, t1, hs, rhs1, rhs2, m11, m12, det, scale, n1, n2)


def prior_backward(saved: tuple, grad: torch.Tensor, k: PriorConstants) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. the features (6, P) and u (P,) of :func:`prior_forward` given that of the prior (2, P)."""
    rows, t1, hs, rhs1, rhs2, m11, m12, det, scale, n1, n2 = saved
    dq1, dq2, c1, c2, s1, s2 = rows.unbind(0)
    gn1, gn2 = (grad * scale).unbind(0)
    g_det = torch.addcmul(gn1 * n1, gn2, n2).div_(det).neg_()
    g_rhs1 = torch.addcmul(k.m22 * gn1, m12, gn2, value=-1.0)
    g_rhs2 = torch.addcmul(m11 * gn2, m12, gn1, value=-1.0)
    g_m11 = torch.addcmul(rhs2 * gn2, g_det, k.m22)
    g_m12 = torch.addcmul(torch.addcmul(rhs2 * gn1, rhs1, gn2), m12, g_det, value=2.0).neg_()
    g_s12 = (g_rhs1 + g_rhs2) * k.g2
    g_s12.neg_()
    g_hs = torch.addcmul(g_rhs1 * t1, g_rhs2 * dq1, dq1, value=-1.0)
    g_dq1 = torch.addcmul(g_rhs1 * dq2, g_rhs2, dq1, value=-1.0).mul_(hs + hs)
    g_dq2 = (g_rhs1 * (hs + hs)).mul_(dq1 + dq2)
    g_c1 = g_s12 * s2
    g_c2 = torch.addcmul(torch.addcmul(g_s12 * s1, g_m11, k.h + k.h), g_m12, k.h)
    g_s1 = torch.addcmul(g_s12 * c2, g_rhs1, k.g1, value=-1.0)
    g_s2 = torch.addcmul(g_s12 * c1, g_hs, k.h)
    for i, b, cf in k.friction:
        dq = rows[i]
        g_friction = (g_rhs1 if i == 0 else g_rhs2) * (b + (100.0 * cf) / (1.0 + 1e4 * dq * dq))
        if i == 0:
            g_dq1 = g_dq1 - g_friction
        else:
            g_dq2 = g_dq2 - g_friction
    grad_u = g_rhs1 if k.actuated == 0 else g_rhs2
    return torch.stack([g_dq1, g_dq2, g_c1, g_c2, g_s1, g_s2]), grad_u


def _trig_rows(dq: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features (dq, cos q, sin q) (6, P) of an RK4 stage and its cos, sin (for the backward)."""
    c, s = torch.cos(q), torch.sin(q)
    return torch.cat([dq, c, s]), c, s


def rk4_prior_forward(q: torch.Tensor, rows: torch.Tensor, u: torch.Tensor,
                      k: PriorConstants) -> tuple[torch.Tensor, tuple]:
    """The RK4 prior of Delta dq (2, P): one Runge-Kutta-4 step of length Ts = ``k.period`` of the forward
    dynamics with u held, from angles q (2, P) and features rows (6, P) of the same state.

    Each stage's :func:`prior_forward` gives p_i = Ts a_i; stage states q_2 = q + Ts/2 dq, dq_2 = dq + p_1/2,
    q_3 = q + Ts/2 dq_2, dq_3 = dq + p_2/2, q_4 = q + Ts dq_3, dq_4 = dq + p_3; Delta dq = (p_1 + 2 p_2 + 2 p_3
    + p_4) / 6. Four times the work of the Euler prior (all elementwise on P-vectors).
    """
    dq = rows[:2]
    half = 0.5 * k.period
    p1, saved1 = prior_forward(rows, u, k)
    dq2 = torch.add(dq, p1, alpha=0.5)
    rows2, c2, s2 = _trig_rows(dq2, torch.add(q, dq, alpha=half))
    p2, saved2 = prior_forward(rows2, u, k)
    dq3 = torch.add(dq, p2, alpha=0.5)
    rows3, c3, s3 = _trig_rows(dq3, torch.add(q, dq2, alpha=half))
    p3, saved3 = prior_forward(rows3, u, k)
    rows4, c4, s4 = _trig_rows(dq + p3, torch.add(q, dq3, alpha=k.period))
    p4, saved4 = prior_forward(rows4, u, k)
    prior = (p1 + p4 + 2.0 * (p2 + p3)) / 6.0
    return prior, (saved1, saved2, saved3, saved4, (c2, s2), (c3, s3), (c4, s4))


def _stage_grads(grad_rows: torch.Tensor, trig: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(d/d dq, d/d q) of a stage from the gradient w.r.t. its features (dq, cos q, sin q)."""
    c, s = trig
    return grad_rows[:2], torch.addcmul(grad_rows[4:] * c, grad_rows[2:4], s, value=-1.0)


def rk4_prior_backward(saved: tuple, grad: torch.Tensor,
                       k: PriorConstants) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. q (2, P), rows (6, P) and u (P,) of :func:`rk4_prior_forward` given that of the prior."""
    saved1, saved2, saved3, saved4, trig2, trig3, trig4 = saved
    half = 0.5 * k.period
    g_p4 = grad / 6.0
    g_p23 = grad / 3.0
    rows4, g_u = prior_backward(saved4, g_p4, k)
    g_dq4, g_q = _stage_grads(rows4, trig4)                # q_4 = q + Ts dq_3, dq_4 = dq + p_3
    g_dq = g_dq4
    g_dq3_path = g_q * k.period
    rows3, g_u3 = prior_backward(saved3, g_p23 + g_dq4, k)
    g_dq3, g_q3 = _stage_grads(rows3, trig3)               # q_3 = q + Ts/2 dq_2, dq_3 = dq + p_2/2
    g_dq3 = g_dq3 + g_dq3_path
    g_q = g_q + g_q3
    g_dq = g_dq + g_dq3
    rows2, g_u2 = prior_backward(saved2, torch.add(g_p23, g_dq3, alpha=0.5), k)
    g_dq2, g_q2 = _stage_grads(rows2, trig2)               # q_2 = q + Ts/2 dq, dq_2 = dq + p_1/2
    g_dq2 = torch.add(g_dq2, g_q3, alpha=half)
    g_q = g_q + g_q2
    g_dq = torch.add(g_dq + g_dq2, g_q2, alpha=half)
    rows1, g_u1 = prior_backward(saved1, torch.add(g_p4, g_dq2, alpha=0.5), k)
    grad_rows = torch.cat([rows1[:2] + g_dq, rows1[2:]])
    return g_q, grad_rows, g_u + g_u1 + g_u2 + g_u3


def step_forward(x: torch.Tensor, phi: torch.Tensor, u: torch.Tensor, noise: torch.Tensor | None, fast: FastGP,
                 k: PriorConstants) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """One transition in the particle-major layout: states x (4, P), their features phi (6, P), torques u (P,),
    standard normals noise (2, P) (None: the mean). Returns the next states, their features and what
    :func:`step_backward` needs."""
    mean, var, gp_saved = moments_forward(fast, torch.cat([phi, u.unsqueeze(0)]))
    if k.rk4:
        prior, prior_saved = rk4_prior_forward(x[:2], phi, u, k)
    else:
        prior, prior_saved = prior_forward(phi, u, k)
    delta = prior + mean
    if noise is None:
        std = positive = None
    else:
        positive = var >= 0
        std = (var.clamp_min(0.0) + fast.noise).sqrt_()
        delta = torch.addcmul(delta, std, noise)
    dq = x[2:]
    q_next = x[:2] + k.period * torch.add(dq, delta, alpha=0.5)
    dq_next = dq + delta
    c, s = torch.cos(q_next), torch.sin(q_next)
    saved = (gp_saved, prior_saved, noise, std, positive, c, s)
    return torch.cat([q_next, dq_next]), torch.cat([dq_next, c, s]), saved


def step_backward(saved: tuple, grad_x: torch.Tensor, grad_phi: torch.Tensor, fast: FastGP,
                  k: PriorConstants) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. x (4, P), phi (6, P) and u (P,) of :func:`step_forward` given those of its outputs."""
    gp_saved, prior_saved, noise, std, positive, c, s = saved
    grad_q = torch.addcmul(torch.addcmul(grad_x[:2], grad_phi[2:4], s, value=-1.0), grad_phi[4:], c)
    grad_dq = grad_x[2:] + grad_phi[:2]
    grad_delta = torch.addcmul(grad_dq, grad_q, k.period, value=0.5)
    grad_x_in = torch.cat([grad_q, torch.addcmul(grad_dq, grad_q, k.period)])
    if noise is None:
        grad_var = torch.zeros_like(grad_delta)
    else:
        grad_var = (grad_delta * noise).mul_(positive).div_(std + std)
    grad_gp = moments_backward(fast, gp_saved, grad_delta, grad_var)
    if k.rk4:
        grad_q_prior, grad_phi_prior, grad_u_prior = rk4_prior_backward(prior_saved, grad_delta, k)
        grad_x_in = torch.cat([grad_q + grad_q_prior, grad_x_in[2:]])
    else:
        grad_phi_prior, grad_u_prior = prior_backward(prior_saved, grad_delta, k)
    return grad_x_in, grad_gp[:-1] + grad_phi_prior, grad_gp[-1] + grad_u_prior


def policy_step_forward(x: torch.Tensor, phi: torch.Tensor, policy: tuple, noise: torch.Tensor | None,
                        fast: FastGP, k: PriorConstants,
                        previous: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
    """:func:`step_forward` with the torque u from the sum-of-Gaussians policy (parameters ``policy`` =
    (inv, augmented, weights, u_max), see :meth:`~mcpilco_core.learning.torch_policy.TorchPolicy.rollout_parts`),
    delayed by ``k.delay`` behind the ``previous`` command (P,) (None: the first step). Returns the next states,
    their features, u (the next step's previous command) and what :func:`policy_step_backward` needs."""
    u, policy_saved = sum_of_gaussians_forward(phi, *policy)
    delayed = previous is not None and bool(k.delay)
    x_next, phi_next, saved = step_forward(x, phi, effective_torque(u, previous, k.delay), noise, fast, k)
    return x_next, phi_next, u, (policy_saved, saved, delayed)


def policy_step_backward(saved: tuple, grad_x: torch.Tensor, grad_phi: torch.Tensor, phi: torch.Tensor,
                         policy: tuple, fast: FastGP, k: PriorConstants,
                         grad_next_previous: torch.Tensor | None = None) -> tuple[torch.Tensor | None, ...]:
    """Gradients w.r.t. x, phi, the previous command (None if it did not act) and the policy tensors (inv, augmented,
    weights) of :func:`policy_step_forward`. ``grad_next_previous``: the gradient w.r.t. this step's u as the next
    step's previous command (None at the last step or without delay)."""
    policy_saved, step_saved, delayed = saved
    grad_x_in, grad_phi_in, grad_u = step_backward(step_saved, grad_x, grad_phi, fast, k)
    grad_previous = None
    if delayed:
        grad_previous = grad_u * k.delay
        grad_u = grad_u * (1.0 - k.delay)
    if grad_next_previous is not None:
        grad_u = grad_u + grad_next_previous
    grad_phi_policy, *grad_policy = sum_of_gaussians_backward(phi, *policy[:3], policy_saved, grad_u)
    return grad_x_in, grad_phi_in + grad_phi_policy, grad_previous, *grad_policy


_KERNELS: dict[tuple[bool, bool], tuple[MaybeCompiled, MaybeCompiled]] = {}


def step_kernels(compiled: bool, with_policy: bool = False) -> tuple[MaybeCompiled, MaybeCompiled]:
    """The (forward, backward) pair, shared per process so that compiled code is reused across rollouts."""
    key = (compiled, with_policy)
    if key not in _KERNELS:
        pair = (policy_step_forward, policy_step_backward) if with_policy else (step_forward, step_backward)
        _KERNELS[key] = (MaybeCompiled(pair[0], compiled), MaybeCompiled(pair[1], compiled))
    return _KERNELS[key]


class ParticleStep(torch.autograd.Function):
    """:func:`step_forward` as one autograd node: (x, phi, u, noise) -> (next states, next features)."""

    @staticmethod
    def forward(ctx, x, phi, u, noise, fast: FastGP, k: PriorConstants, kernels):
        x_next, phi_next, saved = kernels[0](x, phi, u, noise, fast, k)
        ctx.saved, ctx.fast, ctx.k, ctx.kernels = saved, fast, k, kernels
        return x_next, phi_next

    @staticmethod
    def backward(ctx, grad_x, grad_phi):
        grad_x_in, grad_phi_in, grad_u = ctx.kernels[1](ctx.saved, grad_x.contiguous(), grad_phi.contiguous(),
                                                        ctx.fast, ctx.k)
        return grad_x_in, grad_phi_in, grad_u, None, None, None, None


class PolicyRollout(torch.autograd.Function):
    """A whole rollout under the sum-of-Gaussians policy as one autograd node: (x0 (4, P), inv, augmented,
    weights) -> states (steps + 1, 4, P). The backward runs :func:`policy_step_backward` from the last step to
    the first and sums the policy gradients itself, so no per-step autograd bookkeeping remains."""

    @staticmethod
    def forward(ctx, x0, inv, augmented, weights, noise, steps: int, u_max: float, fast: FastGP,
                k: PriorConstants, kernels):
        policy = (inv, augmented, weights, u_max)
        states = x0.new_empty(steps + 1, *x0.shape)
        states[0] = x0
        c0, s0 = torch.cos(x0[:2]), torch.sin(x0[:2])
        x, phi = x0, torch.cat([x0[2:], c0, s0])
        ctx.trig0 = (c0, s0)
        saved = []
        previous = None                                  # the first step's previous command: none (no delay)
        for t in range(steps):
            x_next, phi_next, u, step_saved = kernels[0](x, phi, policy, None if noise is None else noise[t], fast,
                                                         k, previous)
            saved.append((phi, step_saved))
            states[t + 1] = x_next
            x, phi = x_next, phi_next
            previous = u if k.delay else None
        ctx.save_for_backward(inv, augmented, weights)
        ctx.saved, ctx.u_max, ctx.fast, ctx.k, ctx.kernels = saved, u_max, fast, k, kernels
        return states

    @staticmethod
    def backward(ctx, grad_states):
        inv, augmented, weights = ctx.saved_tensors
        policy = (inv, augmented, weights, ctx.u_max)
        grad_states = grad_states.contiguous()
        grad_x = grad_states[-1]
        grad_phi = torch.zeros_like(ctx.saved[0][0])
        grad_policy = None
        grad_previous = None                             # through u_t as step t + 1's previous command (delay)
        for t in range(len(ctx.saved) - 1, -1, -1):
            phi, step_saved = ctx.saved[t]
            grad_x, grad_phi, grad_previous, *grads = ctx.kernels[1](step_saved, grad_x, grad_phi, phi, policy,
                                                                     ctx.fast, ctx.k, grad_previous)
            grad_x = grad_x + grad_states[t]
            if grad_policy is None:
                grad_policy = grads
            else:
                for total, g in zip(grad_policy, grads):
                    total.add_(g)
            ctx.saved[t] = None                                   # free the step's activations as we go
        if grad_policy is None:
            grad_policy = [None, None, None]
        c0, s0 = ctx.trig0                                        # phi0 = [dq0, cos q0, sin q0] (built from x0 here)
        grad_q0 = torch.addcmul(torch.addcmul(grad_x[:2], grad_phi[2:4], s0, value=-1.0), grad_phi[4:], c0)
        grad_x0 = torch.cat([grad_q0, grad_x[2:] + grad_phi[:2]])
        return (grad_x0, *grad_policy, None, None, None, None, None, None)


def fused_rollout(fast: FastGP, k: PriorConstants, policy, x0: torch.Tensor, steps: int,
                  noise: torch.Tensor | None, compiled: bool = False) -> torch.Tensor:
    """States (steps + 1, P, 4) under the policy from x0 (P, 4); noise (steps, 2, P) or None (mean rollout).

    Internally particle-major: each state component is one contiguous row of P particles, so the small
    per-particle ops run on contiguous vectors; the result is a transposed view of the stacked rows. With a
    policy that has ``rollout_parts()`` (:class:`~mcpilco_core.learning.torch_policy.TorchPolicy`) the whole rollout is
    one autograd node (:class:`PolicyRollout`); any other policy is called through ``forward_features`` with
    its own autograd graph, and each transition is one node (:class:`ParticleStep`).
    """
    k = k.as_tensors(x0.dtype, x0.device)
    x = x0.T.contiguous()
    if hasattr(policy, "rollout_parts"):
        inv, augmented, weights, u_max = policy.rollout_parts()
        states = PolicyRollout.apply(x, inv, augmented, weights, noise, steps, u_max, fast, k,
                                     step_kernels(compiled, with_policy=True))
        return states.transpose(1, 2)
    kernels = step_kernels(compiled)
    phi = torch.cat([x[2:], torch.cos(x[:2]), torch.sin(x[:2])])
    states = [x]
    previous = None
    for t in range(steps):
        u = policy.forward_features(phi.T)
        x, phi = ParticleStep.apply(x, phi, effective_torque(u, previous, k.delay), None if noise is None else noise[t],
                                    fast, k, kernels)
        states.append(x)
        previous = u
    return torch.stack(states).transpose(1, 2)
