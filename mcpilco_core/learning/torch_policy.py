"""Torch twin of :class:`mcpilco_core.policy.SumOfGaussiansPolicy`, trained by the particle optimiser.

    u = u_M tanh( sum_i d_i w_i / u_M exp(-|| (a_i - phi(x)) / l ||^2) ),
    phi = (dq1, dq2, cos q1, cos q2, sin q1, sin q2)

d_i is an optional dropout mask on the basis outputs (scaled by 1 / (1 - p) while training). The numbers
equal the numpy runtime policy's for the same parameters; :meth:`to_numpy` / :meth:`from_numpy` convert.
"""

from __future__ import annotations

import math

import torch

from ..policy import SumOfGaussiansPolicy
from .compile import MaybeCompiled
from .gp import exp_floor


class TorchPolicy(torch.nn.Module):
    """Parameters: centers (Nb, 6), log_lengthscales (6,), weights (Nb,) N m; u_max (N m) is fixed."""

    def __init__(self, centers: torch.Tensor, log_lengthscales: torch.Tensor, weights: torch.Tensor,
                 u_max: float) -> None:
        super().__init__()
        self.centers = torch.nn.Parameter(centers.clone())
        self.log_lengthscales = torch.nn.Parameter(log_lengthscales.clone())
        self.weights = torch.nn.Parameter(weights.clone())
        self.u_max = float(u_max)
        self.mask: torch.Tensor | None = None

    @classmethod
    def random(cls, num_basis: int, u_max: float, generator: torch.Generator, dq_range: float = 2 * math.pi,
               dtype: torch.dtype = torch.float32, lengthscales: tuple[float, ...] = (1.0,) * 6) -> TorchPolicy:
        """The seed paper's initialisation: w ~ U[-u_M, u_M]; centres uniform in the image of phi with
        dq in [-dq_range, dq_range] (rad/s) and angles uniform on the circle; lengthscales = 1 (the default).

        A global policy faces speeds up to ~20 rad/s: with unit velocity lengthscales the basis functions hardly
        overlap there (the policy outputs ~0 and gets no gradient), so wider ``dq_range`` and velocity
        ``lengthscales`` (rad/s, then the angle features') are worth setting.
        """
        def uniform(*shape: int) -> torch.Tensor:
            return torch.rand(shape, generator=generator, dtype=torch.float64)

        dq = (2 * uniform(num_basis, 2) - 1) * dq_range
        angles = (2 * uniform(num_basis, 2) - 1) * math.pi
        centers = torch.cat([dq, torch.cos(angles), torch.sin(angles)], -1)
        weights = (2 * uniform(num_basis) - 1) * u_max
        log_ls = torch.log(torch.as_tensor(lengthscales, dtype=torch.float64))
        if log_ls.shape != (6,) or not bool(torch.isfinite(log_ls).all()):
            raise ValueError(f"lengthscales must be 6 positive numbers, got {lengthscales}")
        return cls(centers.to(dtype), log_ls.to(dtype), weights.to(dtype), u_max)

    @classmethod
    def from_numpy(cls, policy: SumOfGaussiansPolicy, dtype: torch.dtype = torch.float32) -> TorchPolicy:
        return cls(torch.as_tensor(policy.centers, dtype=dtype), torch.as_tensor(policy.log_lengthscales, dtype=dtype),
                   torch.as_tensor(policy.weights, dtype=dtype), policy.u_max)

    def to_numpy(self, robot: str, control_period: float, metadata: dict | None = None) -> SumOfGaussiansPolicy:
        """The runtime (numpy, float64) policy with exactly these parameters."""
        return SumOfGaussiansPolicy(centers=self.centers.detach().cpu().double().numpy(),
                                    log_lengthscales=self.log_lengthscales.detach().cpu().double().numpy(),
                                    weights=self.weights.detach().cpu().double().numpy(), u_max=self.u_max,
                                    robot=robot, control_period=control_period, metadata=dict(metadata or {}))

    def set_dropout(self, probability: float, generator: torch.Generator | None) -> None:
        """Draw a fresh dropout mask on the basis outputs (None/0 probability disables dropout)."""
        if probability <= 0.0 or generator is None:
            self.mask = None
            return
        keep = torch.rand(self.weights.shape, generator=generator, dtype=torch.float64) >= probability
        self.mask = (keep.to(self.weights.dtype) / (1.0 - probability)).to(self.weights.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Actuated torque (N m) for states (..., 4), shape (...)."""
        return self.forward_features(torch.cat([x[..., 2:], torch.cos(x[..., :2]), torch.sin(x[..., :2])], -1))

    def forward_features(self, phi: torch.Tensor) -> torch.Tensor:
        """Actuated torque (N m) for features phi = (dq1, dq2, cos q1, cos q2, sin q1, sin q2), (..., 6)."""
        inv = torch.exp(-self.log_lengthscales)
        z = phi * inv
        a = self.centers * inv
        sq = torch.addmm((a * a).sum(-1), z, a.T, alpha=-2.0) + (z * z).sum(-1, keepdim=True)
        weights = self.weights if self.mask is None else self.weights * self.mask
        return self.u_max * torch.tanh(torch.exp(-sq) @ weights * (1.0 / self.u_max))

    def rollout_parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """The parameter-only terms of the policy for a whole rollout, built once (with autograd) per rollout:
        (1/l (d,), augmented centres A (Nb, d + 2) = [2a, -1, -|a|^2] with a = c/l, masked weights (Nb,), u_max),
        so that -|z - a|^2 = A @ [z; |z|^2; 1]. Used by :func:`sum_of_gaussians_forward`."""
        inv = torch.exp(-self.log_lengthscales)
        a = self.centers * inv
        augmented = torch.cat([2.0 * a, -torch.ones_like(a[:, :1]), -(a * a).sum(-1, keepdim=True)], -1)
        weights = self.weights if self.mask is None else self.weights * self.mask
        return inv, augmented, weights, self.u_max

    def rollout_function(self, compiled: bool = False):
        """:meth:`forward_features` on features in rows (6, P) (the fused rollout's layout), as one autograd node
        per call with a hand-written backward (:class:`_SumOfGaussians`; through ``torch.compile`` if
        ``compiled``). Equal to :meth:`forward_features` up to rounding."""
        parts = self.rollout_parts()
        kernels = policy_kernels(compiled)

        def features_to_torque(rows: torch.Tensor) -> torch.Tensor:
            return _SumOfGaussians.apply(*parts, rows, kernels)

        return features_to_torque


def sum_of_gaussians_forward(rows: torch.Tensor, inv: torch.Tensor, augmented: torch.Tensor, weights: torch.Tensor,
                             u_max: float) -> tuple[torch.Tensor, tuple]:
    """u = u_max tanh(w . exp(A @ [z; |z|^2; 1]) / u_max), z = rows * inv for features rows (d, P), A (Nb, d + 2)
    as built by :meth:`TorchPolicy.rollout_function`; no autograd. Exponents are clamped at the log of the
    smallest normal float (values below are float noise, and exp's underflow path is 10-20x slower here)."""
    z = rows * inv.unsqueeze(-1)
    zz = torch.cat([z, (z * z).sum(0, keepdim=True), torch.ones_like(z[:1])])
    basis = torch.mm(augmented, zz).clamp_min_(exp_floor(rows.dtype)).exp_()   # (Nb, P)
    t = torch.tanh(torch.mv(basis.T, weights) / u_max)
    return t * u_max, (zz, basis, t)


def sum_of_gaussians_backward(rows: torch.Tensor, inv: torch.Tensor, augmented: torch.Tensor, weights: torch.Tensor,
                              saved: tuple, grad_u: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Gradients w.r.t. rows, inv, augmented and weights of :func:`sum_of_gaussians_forward`.

    With g = dL/ds per particle, the exponent gradient is ``basis * outer(w, g)``; it is never formed: the
    weight and centre gradients come from one ``basis @ [g zz; g]^T`` and the input gradient from
    ``g * ((w A)^T @ basis)`` (two passes over the (Nb, P) basis matrix instead of four)."""
    zz, basis, t = saved
    grad_s = grad_u * (1.0 - t * t)
    both = torch.mm(basis, torch.cat([zz * grad_s, grad_s.unsqueeze(0)]).T)      # (Nb, d + 3)
    grad_weights = both[:, -1]
    grad_augmented = both[:, :-1] * weights.unsqueeze(-1)
    grad_zz = torch.mm((augmented * weights.unsqueeze(-1)).T, basis).mul_(grad_s)  # (d + 2, P)
    d = rows.shape[0]
    grad_z = torch.addcmul(grad_zz[:d], zz[:d], grad_zz[d:d + 1], value=2.0)
    return grad_z * inv.unsqueeze(-1), (grad_z * rows).sum(1), grad_augmented, grad_weights


_KERNELS: dict[bool, tuple] = {}


def policy_kernels(compiled: bool) -> tuple:
    """(forward, backward) of :class:`_SumOfGaussians`, compiled or not (shared per process)."""
    if compiled not in _KERNELS:
        _KERNELS[compiled] = (MaybeCompiled(sum_of_gaussians_forward, compiled),
                              MaybeCompiled(sum_of_gaussians_backward, compiled))
    return _KERNELS[compiled]


class _SumOfGaussians(torch.autograd.Function):
    """:func:`sum_of_gaussians_forward` as one autograd node."""

    @staticmethod
    def forward(ctx, inv, augmented, weights, u_max, rows, kernels):
        u, saved = kernels[0](rows, inv, augmented, weights, u_max)
        ctx.save_for_backward(rows, inv, augmented, weights)
        ctx.saved, ctx.kernels = saved, kernels
        return u

    @staticmethod
    def backward(ctx, grad_u):
        rows, inv, augmented, weights = ctx.saved_tensors
        grad_rows, *grads = ctx.kernels[1](rows, inv, augmented, weights, ctx.saved, grad_u.contiguous())
        return (*grads, None, grad_rows, None)
