"""Gaussian-process regression for the dynamics model: one GP per joint, batched over joints.

Each joint's GP predicts the *residual* of the velocity change over one policy period (rad/s), i.e. the
part of Delta dq that the physics prior mean does not explain (see :mod:`mcpilco_core.model`).

* Kernel: squared exponential with one lengthscale per input (SE-ARD),
  ``k(a, b) = sf2 exp(-0.5 sum_j ((a_j - b_j) / l_j)^2)``.
* Hyperparameters live as unconstrained raw tensors: lengthscales through ``exp``, signal and noise
  variances through ``softplus`` (plus a floor on the noise so the Cholesky stays well conditioned).
  They are fitted in float64 on the exact negative log marginal likelihood with Adam.
* Subset of Data (SoD): greedy, newest data first; a sample joins the subset if the GP's predictive std
  there (given the subset so far) exceeds ``sod_threshold`` x the noise std, until ``max_points``.
* After a fit, :class:`GPPosterior` caches, per joint, ``alpha = (K + s2 I)^-1 y`` and ``L^-T`` (L the
  Cholesky factor) packed into one matrix ``[sf2 L^-T | sf2 alpha]`` so that one batched matmul per
  rollout step gives both the predictive mean and the whitened vector whose squared norm is the explained
  variance. Joints with smaller subsets are zero-padded (zero rows contribute nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.functional import softplus


@dataclass(frozen=True)
class GPSettings:
    """Options of the GP model (validated by the learner's config loader).

    fit_steps / fit_lr: Adam on the marginal likelihood; fit_points: random subset used for the fit
    (exact likelihood costs O(n^3)); max_points: SoD cap per joint; sod_threshold: keep a sample when its
    predictive std > threshold * noise std; noise_floor: lower bound of the noise variance ((rad/s)^2).
    """

    fit_steps: int = 1500
    fit_lr: float = 0.01
    fit_points: int = 600
    max_points: int = 300
    sod_threshold: float = 0.5
    noise_floor: float = 1e-8
    warm_start: bool = True


def _inv_softplus(value: np.ndarray) -> np.ndarray:
    value = np.asarray(value, dtype=np.float64)
    return value + np.log(-np.expm1(-value))


class GPHyperparameters:
    """Raw (unconstrained) float64 hyperparameters of ``n_out`` independent SE-ARD GPs on ``n_in`` inputs."""

    def __init__(self, raw_lengthscales: torch.Tensor, raw_signal: torch.Tensor, raw_noise: torch.Tensor,
                 noise_floor: float = 1e-8) -> None:
        self.raw_lengthscales = raw_lengthscales  # (n_out, n_in): log lengthscales
        self.raw_signal = raw_signal              # (n_out,): inverse-softplus of sf2
        self.raw_noise = raw_noise                # (n_out,): inverse-softplus of (s2 - floor)
        self.noise_floor = float(noise_floor)

    @classmethod
    def initial(cls, inputs: np.ndarray, residuals: np.ndarray, noise_floor: float = 1e-8) -> GPHyperparameters:
        """Data-driven start: lengthscales = input std, sf2 = residual variance, noise = 1% of it."""
        std_in = np.maximum(inputs.std(axis=0), 1e-2)
        var_out = np.maximum(residuals.var(axis=0), 1e-6)
        n_out = residuals.shape[1]
        return cls(torch.tensor(np.tile(np.log(std_in), (n_out, 1))),
                   torch.tensor(_inv_softplus(var_out)),
                   torch.tensor(_inv_softplus(np.maximum(0.01 * var_out - noise_floor, 1e-10))),
                   noise_floor)

    def lengthscales(self) -> torch.Tensor:
        return torch.exp(self.raw_lengthscales)

    def signal_variance(self) -> torch.Tensor:
        return softplus(self.raw_signal)

    def noise_variance(self) -> torch.Tensor:
        return softplus(self.raw_noise) + self.noise_floor

    def parameters(self) -> list[torch.Tensor]:
        return [self.raw_lengthscales, self.raw_signal, self.raw_noise]

    def detached(self) -> GPHyperparameters:
        return GPHyperparameters(*(p.detach().clone() for p in self.parameters()), noise_floor=self.noise_floor)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"raw_lengthscales": self.raw_lengthscales.detach().numpy().copy(),
                "raw_signal": self.raw_signal.detach().numpy().copy(),
                "raw_noise": self.raw_noise.detach().numpy().copy(),
                "noise_floor": np.array(self.noise_floor)}

    @classmethod
    def from_arrays(cls, arrays: dict) -> GPHyperparameters:
        return cls(torch.tensor(np.asarray(arrays["raw_lengthscales"], dtype=np.float64)),
                   torch.tensor(np.asarray(arrays["raw_signal"], dtype=np.float64)),
                   torch.tensor(np.asarray(arrays["raw_noise"], dtype=np.float64)),
                   float(arrays["noise_floor"]))


def se_kernel(a: torch.Tensor, b: torch.Tensor, lengthscales: torch.Tensor, signal: torch.Tensor) -> torch.Tensor:
    """SE-ARD kernel matrices, batched over outputs: a (n_out, n, d), b (n_out, m, d) -> (n_out, n, m)."""
    a_s = a / lengthscales[:, None, :]
    b_s = b / lengthscales[:, None, :]
    sq = (a_s * a_s).sum(-1)[:, :, None] + (b_s * b_s).sum(-1)[:, None, :] - 2.0 * a_s @ b_s.transpose(1, 2)
    return signal[:, None, None] * torch.exp(-0.5 * sq.clamp_min(0.0))


def negative_log_marginal_likelihood(hyper: GPHyperparameters, inputs: torch.Tensor,
                                     targets: torch.Tensor) -> torch.Tensor:
    """Sum over outputs of -log p(y | X, theta), per sample (so the learning rate is scale-free).

    inputs (n, d), targets (n, n_out), float64.
    """
    n, n_out = targets.shape
    x = inputs.expand(n_out, n, inputs.shape[1])
    k = se_kernel(x, x, hyper.lengthscales(), hyper.signal_variance())
    k = k + hyper.noise_variance()[:, None, None] * torch.eye(n, dtype=k.dtype)
    chol = torch.linalg.cholesky(k)
    y = targets.T.unsqueeze(-1)                                   # (n_out, n, 1)
    alpha = torch.cholesky_solve(y, chol)
    fit = 0.5 * (y * alpha).sum((1, 2))
    logdet = torch.log(torch.diagonal(chol, dim1=1, dim2=2)).sum(-1)
    return ((fit + logdet).sum() + 0.5 * n * n_out * math.log(2 * math.pi)) / n


def fit_hyperparameters(hyper: GPHyperparameters, inputs: np.ndarray, targets: np.ndarray, steps: int,
                        lr: float, progress: bool = False) -> tuple[GPHyperparameters, list[float]]:
    """Adam on the marginal likelihood (float64); returns the fitted copy and the loss history."""
    fitted = hyper.detached()
    for p in fitted.parameters():
        p.requires_grad_(True)
    x = torch.as_tensor(inputs, dtype=torch.float64)
    y = torch.as_tensor(targets, dtype=torch.float64)
    optimizer = torch.optim.Adam(fitted.parameters(), lr=lr)
    history: list[float] = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = negative_log_marginal_likelihood(fitted, x, y)
        loss.backward()
        optimizer.step()
        history.append(float(loss.detach()))
    return fitted.detached(), history


def select_subset(inputs: np.ndarray, hyper: GPHyperparameters, max_points: int, threshold: float,
                  order: np.ndarray | None = None) -> list[np.ndarray]:
    """Greedy Subset of Data per output (see module docstring); returns the chosen indices per output.

    ``order`` is the scan order (default: newest sample first, so recent trials are always represented
    when the cap is reached). Cost O(N * max_points^2) per output via incremental Cholesky columns.
    """
    n = inputs.shape[0]
    order = np.arange(n)[::-1] if order is None else np.asarray(order)
    ls = hyper.lengthscales().detach().numpy()
    sf2 = hyper.signal_variance().detach().numpy()
    s2 = hyper.noise_variance().detach().numpy()
    chosen = []
    for j in range(ls.shape[0]):
        chosen.append(_greedy_subset(inputs / ls[j], float(sf2[j]), float(s2[j]), order, max_points,
                                     threshold * threshold * float(s2[j])))
    return chosen


def _greedy_subset(xs: np.ndarray, sf2: float, s2: float, order: np.ndarray, cap: int,
                   min_var: float) -> np.ndarray:
    """One output's greedy SoD on scaled inputs ``xs`` (n, d)."""
    n = xs.shape[0]
    var = np.full(n, sf2)                  # predictive variance of f at every sample, given the subset
    rows = np.zeros((min(cap, n), n))      # rows of L^-1 K(subset, all)
    kept: list[int] = []
    for i in order:
        if len(kept) >= cap:
            break
        if var[i] <= min_var:
            continue
        diag = math.sqrt(var[i] + s2)
        k_i = sf2 * np.exp(-0.5 * ((xs - xs[i]) ** 2).sum(-1))
        m = len(kept)
        new_row = (k_i - rows[:m, i] @ rows[:m]) / diag
        rows[m] = new_row
        var -= new_row * new_row
        kept.append(int(i))
    return np.array(sorted(kept), dtype=np.int64)


@dataclass
class GPPosterior:
    """Cached posterior of the per-joint GPs, ready for batched rollouts on one device and dtype.

    scaled_inputs (n_out, n, d): subset inputs divided by the lengthscales (zero-padded);
    half_sq_norms (n_out, n): 0.5 |scaled input|^2; inv_lengthscales (n_out, d);
    packed (n_out, n, n + 1): [sf2 L^-T | sf2 alpha] (zero rows for padding);
    signal (n_out,), noise (n_out,): sf2 and s2.
    """

    scaled_inputs: torch.Tensor
    half_sq_norms: torch.Tensor
    inv_lengthscales: torch.Tensor
    packed: torch.Tensor
    signal: torch.Tensor
    noise: torch.Tensor
    sizes: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(self.packed.shape[1])

    backward_matrix: torch.Tensor | None = None

    def set_backward_precision(self, precision: str) -> None:
        """'float32' (or the posterior's own dtype) or 'bfloat16' for the backward matmul of :meth:`predict`.

        The backward pass of the rollout needs ``dL/dk = dL/dout @ packed^T``, one (P x n) by (n x n)
        matmul per step and joint, as large as the forward one. Gradients tolerate bfloat16 (relative
        error ~4e-3, far below the Monte-Carlo noise of the gradient); the forward pass never uses it
        because the variance ``sf2 - |w|^2`` cancels.
        """
        if precision == "bfloat16":
            self.backward_matrix = self.packed.transpose(1, 2).to(torch.bfloat16).contiguous()
        else:
            self.backward_matrix = self.packed.transpose(1, 2).contiguous()

    def predict(self, x: torch.Tensor, include_noise: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance of each output at inputs x (P, d) -> (P, n_out), (P, n_out).

        Differentiable in x. ``include_noise`` adds the noise variance (predictive distribution of y).
        """
        if self.backward_matrix is None:
            self.set_backward_precision("float32")
        xs = x.unsqueeze(0) * self.inv_lengthscales[:, None, :]                    # (n_out, P, d)
        cross = torch.baddbmm(-self.half_sq_norms[:, None, :], xs, self.scaled_inputs.transpose(1, 2))
        k = torch.exp(cross - 0.5 * (xs * xs).sum(-1, keepdim=True))              # k / sf2, (n_out, P, n)
        out = _PackedProjection.apply(k, self.packed, self.backward_matrix)       # (n_out, P, n + 1)
        n = self.size
        w = out[..., :n]
        var = (self.signal[:, None] - (w * w).sum(-1)).clamp_min(0.0)
        if include_noise:
            var = var + self.noise[:, None]
        return out[..., n].T, var.T


class _PackedProjection(torch.autograd.Function):
    """``k @ packed`` whose backward uses a precomputed (possibly bfloat16) ``packed^T``; packed is constant."""

    @staticmethod
    def forward(ctx, k: torch.Tensor, packed: torch.Tensor, backward_matrix: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(backward_matrix)
        ctx.out_dtype = k.dtype
        return torch.bmm(k, packed)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (matrix,) = ctx.saved_tensors
        grad_k = torch.bmm(grad_out.to(matrix.dtype), matrix).to(ctx.out_dtype)
        return grad_k, None, None


def build_posterior(hyper: GPHyperparameters, inputs: np.ndarray, targets: np.ndarray,
                    subsets: list[np.ndarray], device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> GPPosterior:
    """Factorise once (float64) and pack the per-joint posterior for fast rollouts (see module doc)."""
    ls = hyper.lengthscales().detach().to(torch.float64)
    sf2 = hyper.signal_variance().detach().to(torch.float64)
    s2 = hyper.noise_variance().detach().to(torch.float64)
    n_out, d = ls.shape
    n = max(1, max(len(s) for s in subsets))
    scaled = torch.zeros(n_out, n, d, dtype=torch.float64)
    packed = torch.zeros(n_out, n, n + 1, dtype=torch.float64)
    for j, idx in enumerate(subsets):
        m = len(idx)
        if m == 0:
            continue
        x = torch.as_tensor(inputs[idx], dtype=torch.float64)
        y = torch.as_tensor(targets[idx, j], dtype=torch.float64)
        xs = x / ls[j]
        k = sf2[j] * torch.exp(-0.5 * torch.cdist(xs, xs).pow(2)) + s2[j] * torch.eye(m, dtype=torch.float64)
        chol = torch.linalg.cholesky(k)
        eye = torch.eye(m, dtype=torch.float64)
        l_inv = torch.linalg.solve_triangular(chol, eye, upper=False)
        alpha = torch.cholesky_solve(y[:, None], chol)[:, 0]
        scaled[j, :m] = xs
        packed[j, :m, :m] = sf2[j] * l_inv.T
        packed[j, :m, n] = sf2[j] * alpha
    half = 0.5 * (scaled ** 2).sum(-1)
    return GPPosterior(scaled_inputs=scaled.to(device, dtype), half_sq_norms=half.to(device, dtype),
                       inv_lengthscales=(1.0 / ls).to(device, dtype), packed=packed.to(device, dtype),
                       signal=sf2.to(device, dtype), noise=s2.to(device, dtype),
                       sizes=tuple(len(s) for s in subsets))
