"""Torch twin of :class:`mcpilco_core.policy.SumOfGaussiansPolicy`, trained by the particle optimiser.

    u = u_M tanh( sum_i d_i w_i / u_M exp(-|| (a_i - phi(x)) / l ||^2) ),
    phi = (dq1, dq2, cos q1, cos q2, sin q1, sin q2)

d_i is an optional dropout mask on the basis outputs (scaled by 1 / (1 - p) while training). The numbers
equal the numpy runtime policy's for the same parameters; :meth:`to_numpy` / :meth:`from_numpy` convert.
"""

from __future__ import annotations

import math

import torch

from .policy import SumOfGaussiansPolicy


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
               dtype: torch.dtype = torch.float32) -> TorchPolicy:
        """The seed paper's initialisation: w ~ U[-u_M, u_M]; centres uniform in the image of phi with
        dq in [-dq_range, dq_range] (rad/s) and angles uniform on the circle; lengthscales = 1."""
        def uniform(*shape: int) -> torch.Tensor:
            return torch.rand(shape, generator=generator, dtype=torch.float64)

        dq = (2 * uniform(num_basis, 2) - 1) * dq_range
        angles = (2 * uniform(num_basis, 2) - 1) * math.pi
        centers = torch.cat([dq, torch.cos(angles), torch.sin(angles)], -1)
        weights = (2 * uniform(num_basis) - 1) * u_max
        return cls(centers.to(dtype), torch.zeros(6, dtype=dtype), weights.to(dtype), u_max)

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
