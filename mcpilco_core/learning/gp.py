"""Gaussian-process regression for the dynamics model: one GP per joint, batched over joints.

Each joint's GP predicts the *residual* of the velocity change over one policy period (rad/s), i.e. the
part of Delta dq that the physics prior mean does not explain (see :mod:`mcpilco_core.learning.model`).

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
* Rollouts use the fused path (:class:`FastGP`, :func:`moments_forward` / :func:`moments_backward`): the
  kernel exponent ``xs.s - |xs|^2/2 - |s|^2/2`` is one batched matmul of augmented inputs ``[xs, -|xs|^2/2, 1]``
  with ``[s^T; 1; -|s|^2/2]`` followed by an in-place ``exp_``, and the gradient is written by hand (no
  autograd graph inside the GP). :meth:`GPPosterior.predict_reference` keeps the plain autograd version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn.functional import softplus

PRIOR_INTEGRATORS = ("euler", "rk4")
BACKWARD_PRECISIONS = ("auto", "float32", "bfloat16")


def native_bfloat16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (oneDNN's bfloat16 path: AVX-512 or AMX).

    Without it torch falls back to a scalar bfloat16 kernel: on an AVX2-only AMD EPYC the acrobot's optimisation
    step (200 particles x 100 steps x 150 GP points, 1 thread) took 0.68 s with the backward matmul in bfloat16
    against 0.19 s in float32 (``benchmarks/bench_learner.py --backward``), so there bfloat16 only costs.
    """
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):       # a torch build without the check: take the safe, exact path
        return False


def resolve_backward_precision(setting: str, dtype: str) -> str:
    """The precision the rollout's backward matmul runs in for a training config's ``backward_matmul`` and ``dtype``.

    ``auto`` is bfloat16 where the CPU has native bfloat16 matmuls and float32 elsewhere; bfloat16 is only ever used
    under float32 rollouts (float64 rollouts keep their own precision, returned as "float32" = the posterior's own).
    """
    if setting not in BACKWARD_PRECISIONS:
        raise ValueError(f"backward matmul precision must be one of {BACKWARD_PRECISIONS}, got {setting!r}")
    if dtype != "float32":
        return "float32"
    if setting == "auto":
        return "bfloat16" if native_bfloat16_matmul() else "float32"
    return setting


@dataclass(frozen=True)
class GPSettings:
    """Options of the GP model (validated by the learner's config loader).

    fit_steps / fit_lr: Adam on the marginal likelihood; fit_points: random subset used for the fit
    (exact likelihood costs O(n^3)); max_points: SoD cap per joint; sod_threshold: keep a sample when its
    predictive std > threshold * noise std; noise_floor: lower bound of the noise variance ((rad/s)^2).
    prior: how the physics prior mean integrates the forward dynamics over one policy period Ts: ``euler``
    (``Ts * M^-1(q)(B u - n)``, the seed paper) or ``rk4`` (one Runge-Kutta-4 step of the same dynamics with
    the torque held: at 15-20 rad/s the Euler prior is off by up to 4-8 rad/s per 20 ms step, which the GP
    cannot learn from sparse fast data; RK4 leaves a residual of < 0.3 rad/s there). identify: before each fit,
    the prior's viscous and Coulomb friction and rotor inertia are fitted to the data by least squares
    (identification.py; for a robot that is not the prior). identify_robot: also identify the robot at the state
    rate -- friction, rotor inertia, sensor delay, motor lag, noise (identified_robot.py) -- for the learner's
    simulations of the protocol (the snapshot judge, ``mcpilco select``'s ranking); the GP's prior is unchanged.
    delay_aware (needs identify): a robot whose sensors lag behind keeps applying the previous command for the first
    part a of each period between measured states, so a transition depends on a command that (x, u) does not hold.
    The fit identifies a with friction and Ir; the prior and the GP then see the effective torque u + a (u_prev - u),
    and the particles carry their previous command (model.py).
    lengthscale_floor: each lengthscale stays at or above this fraction of its input's standard deviation over the
    fit points (0 = no floor, as before 2026-11-27 evening). Why: with a small residual (signal 0.012 against noise
    0.0002 (rad/s)^2) the marginal likelihood shrinks a lengthscale trial after trial (warm-started) until the GP is
    a set of spikes, here 9e-6 for cos q1 on the proxy acrobot; its scaled inputs reach 1e5, and the float32
    rollout's expanded squared distance cancels catastrophically, so exp overflows and particles escape
    (docs/learner.md, "A diverging optimisation rolls back"; ``benchmarks/bench_escapes.py``).
    mirror_data: the GP also learns every transition's mirror image, (x, u, x') -> (-x, -u, -x') (the pendulum is
    symmetric about the vertical: ``TransitionData.mirrored``), so the model knows each swing's other side before
    the robot has been there. The identification still sees the recorded transitions alone.
    """

    fit_steps: int = 1500
    fit_lr: float = 0.01
    fit_points: int = 600
    max_points: int = 300
    sod_threshold: float = 0.5
    noise_floor: float = 1e-8
    warm_start: bool = True
    prior: str = "euler"
    identify: bool = False     # fit the prior's friction and rotor inertia to the data before each GP fit
    identify_robot: bool = False   # identify friction, Ir, delay, lag and noise at the state rate (protocol sims)
    delay_aware: bool = False      # with identify: fit the command delay too; prior and GP see u + a (u_prev - u)
    lengthscale_floor: float = 0.0  # x each input's std over the fit points; 0 = none
    mirror_data: bool = False      # the GP learns each transition's mirror image too


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
                        lr: float, progress: bool = False,
                        lengthscale_floor: float = 0.0) -> tuple[GPHyperparameters, list[float]]:
    """Adam on the marginal likelihood (float64); returns the fitted copy and the loss history.

    ``lengthscale_floor`` > 0: every lengthscale is kept at or above that fraction of its input's standard
    deviation over ``inputs`` (projected after each step; a warm start below it starts at it). See GPSettings."""
    fitted = hyper.detached()
    floor = None
    if lengthscale_floor > 0:
        spread = np.maximum(np.asarray(inputs, dtype=np.float64).std(axis=0), 1e-12)
        floor = torch.as_tensor(np.log(lengthscale_floor * spread), dtype=torch.float64)
        with torch.no_grad():
            fitted.raw_lengthscales.clamp_(min=floor)
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
        if floor is not None:
            with torch.no_grad():
                fitted.raw_lengthscales.clamp_(min=floor)
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
    _fast: FastGP | None = field(default=None, repr=False)

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

    def fast(self) -> FastGP:
        """The constants of the fused rollout path (built once per posterior and backward precision)."""
        if self.backward_matrix is None:
            self.set_backward_precision("float32")
        precision = self.backward_matrix.dtype
        if self._fast is None or self._fast.backward_matrix.dtype != precision:
            self._fast = FastGP.from_posterior(self, precision)
        return self._fast

    def predict(self, x: torch.Tensor, include_noise: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance of each output at inputs x (P, d) -> (P, n_out), (P, n_out).

        Differentiable in x (fused forward, hand-written backward). ``include_noise`` adds the noise
        variance (predictive distribution of y).
        """
        mean, var = _GPMoments.apply(x, self.fast(), include_noise)
        return mean.T, var.T

    def predict_reference(self, x: torch.Tensor, include_noise: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`predict` computed with plain autograd ops (the reference for tests and benchmarks)."""
        if self.backward_matrix is None:
            self.set_backward_precision("float32")
        xs = x.unsqueeze(0) * self.inv_lengthscales[:, None, :]                    # (n_out, P, d)
        cross = torch.baddbmm(-self.half_sq_norms[:, None, :], xs, self.scaled_inputs.transpose(1, 2))
        k = torch.exp((cross - 0.5 * (xs * xs).sum(-1, keepdim=True)).clamp_max(0.0))   # k / sf2 (n_out, P, n)
        out = _PackedProjection.apply(k, self.packed, self.backward_matrix)       # (n_out, P, n + 1)
        n = self.size
        w = out[..., :n]
        var = (self.signal[:, None] - (w * w).sum(-1)).clamp_min(0.0)
        if include_noise:
            var = var + self.noise[:, None]
        return out[..., n].T, var.T


_ALIGN = 16        # packed rows and staircase block edges on multiples of 16 elements (aligned matmul operands)
STAIRCASE_BLOCKS = 4
_EXP_FLOOR = {torch.float32: -87.0, torch.float64: -708.0, torch.bfloat16: -87.0}


def exp_floor(dtype: torch.dtype) -> float:
    """Exponents below this give exp() below the smallest normal number of ``dtype``: clamping them there
    changes kernel values by less than that number (float noise) and avoids exp's slow underflow path
    (10-20x slower per element on this CPU)."""
    return _EXP_FLOOR.get(dtype, -87.0)


@dataclass
class FastGP:
    """Constants of the fused rollout path of a :class:`GPPosterior` (see the module docstring).

    inv_lengthscales (n_out, d); kernel_points (n_out, d + 2, n) = [s^T; 1; -|s|^2/2] with s the scaled
    subset inputs; packed (n_out, n, width) = [sf2 L^-T | sf2 alpha | 0...] with ``width`` = n + 1 rounded up
    to a multiple of 16; backward_matrix (n_out, width, n) = packed^T in the backward precision;
    signal, noise (n_out, 1).

    ``L^-T`` is upper triangular, so the matmuls skip its zero blocks: output column block [lo, hi) of the
    forward product needs only the first ``hi`` kernel columns, and column block [lo, hi) of the backward
    product only the gradient columns from ``lo`` on (``forward_blocks`` / ``backward_blocks``: (lo, hi, the
    block's nonzero rows as a contiguous matrix), a staircase of ``STAIRCASE_BLOCKS`` column blocks: 5/8 of the
    full work with 4 blocks). Same sums, no approximation.
    """

    inv_lengthscales: torch.Tensor
    kernel_points: torch.Tensor
    packed: torch.Tensor
    backward_matrix: torch.Tensor
    signal: torch.Tensor
    noise: torch.Tensor
    n: int
    forward_blocks: list[tuple[int, int, torch.Tensor]]
    backward_blocks: list[tuple[int, int, torch.Tensor]]
    exp_floor: float

    @classmethod
    def from_posterior(cls, post: GPPosterior, precision: torch.dtype, blocks: int = STAIRCASE_BLOCKS) -> FastGP:
        n_out, n, d = post.scaled_inputs.shape
        width = -(-(n + 1) // _ALIGN) * _ALIGN
        packed = post.packed.new_zeros(n_out, n, width)
        packed[..., :n] = torch.triu(post.packed[..., :n])        # exactly triangular (it is, up to rounding)
        packed[..., n] = post.packed[..., n]
        points = torch.cat([post.scaled_inputs.transpose(1, 2), torch.ones_like(post.half_sq_norms)[:, None, :],
                            -post.half_sq_norms[:, None, :]], 1).contiguous()
        edges = sorted({min(n, round(b * n / blocks / _ALIGN) * _ALIGN) for b in range(blocks)} - {n})
        forward_blocks = [(lo, hi, packed[:, :hi, lo:hi].contiguous()) for lo, hi in zip(edges[:-1], edges[1:])]
        forward_blocks.append((edges[-1], width, packed[:, :, edges[-1]:].contiguous()))
        backward_matrix = packed.transpose(1, 2).to(precision).contiguous()
        backward_blocks = [(lo, hi, backward_matrix[:, lo:n + 1, lo:hi].contiguous())
                           for lo, hi in zip(edges, edges[1:] + [n])]
        return cls(inv_lengthscales=post.inv_lengthscales.contiguous(), kernel_points=points, packed=packed,
                   backward_matrix=backward_matrix,
                   signal=post.signal[:, None].contiguous(), noise=post.noise[:, None].contiguous(), n=n,
                   forward_blocks=forward_blocks, backward_blocks=backward_blocks,
                   exp_floor=exp_floor(post.packed.dtype))


def moments_forward(fast: FastGP, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """Mean (n_out, P) and explained-variance complement ``sf2 - |w|^2`` (n_out, P, not clamped) at the inputs
    x (d, P) (one row per input: the particle-major layout of the fused rollout), plus what
    :func:`moments_backward` needs. No autograd graph (call it inside a Function).

    Eager mode writes into preallocated slices (``out=``); under ``torch.compile`` the same is built with
    ``cat`` (the compiler plans the buffers itself)."""
    n_out, d = fast.inv_lengthscales.shape
    xs = x.unsqueeze(0) * fast.inv_lengthscales.unsqueeze(-1)                    # (n_out, d, P)
    z = torch.cat([xs, (xs * xs).sum(1, keepdim=True).mul_(-0.5), torch.ones_like(xs[:, :1])], 1)
    # -|xs - s|^2 / 2 expanded: it cancels, and for a tiny lengthscale (large scaled inputs) float32 can make it
    # positive and exp() overflow (docs/learner.md, "A diverging optimisation rolls back"); k <= sf2 holds exactly.
    k = torch.bmm(z.transpose(1, 2), fast.kernel_points).clamp_(fast.exp_floor, 0.0).exp_()   # k/sf2 (n_out, P, n)
    if torch.compiler.is_compiling():
        out = torch.cat([torch.bmm(k[..., :m.shape[1]], m) for _, _, m in fast.forward_blocks], -1)
    else:
        out = x.new_empty(n_out, x.shape[1], fast.packed.shape[2])
        for lo, hi, m in fast.forward_blocks:
            torch.bmm(k[..., :m.shape[1]], m, out=out[..., lo:hi])
    w_norm = torch.linalg.vector_norm(out[..., : fast.n], dim=-1)
    return out[..., fast.n], fast.signal - w_norm * w_norm, (z, k, out)


def moments_backward(fast: FastGP, saved: tuple, grad_mean: torch.Tensor, grad_var: torch.Tensor) -> torch.Tensor:
    """Gradient (d, P) w.r.t. the inputs of :func:`moments_forward` given the gradients (n_out, P) of its mean
    and of ``sf2 - |w|^2``. The big matmul runs in the precision of ``fast.backward_matrix``."""
    z, k, out = saved
    n, d = fast.n, z.shape[1] - 2
    if torch.compiler.is_compiling():
        g = torch.cat([out[..., :n] * (-2.0 * grad_var).unsqueeze(-1), grad_mean.unsqueeze(-1)], -1)
        g = g.to(fast.backward_blocks[0][2].dtype)
        grad_k = torch.cat([torch.bmm(g[..., lo:], m) for lo, _, m in fast.backward_blocks], -1)
    else:
        g = torch.mul(out, grad_var.mul(-2.0).unsqueeze(-1))     # d/dw of -|w|^2; zero padding stays zero
        g[..., n] = grad_mean
        g = g[..., :n + 1].to(fast.backward_blocks[0][2].dtype)
        grad_k = g.new_empty(k.shape)
        for lo, hi, m in fast.backward_blocks:
            torch.bmm(g[..., lo:], m, out=grad_k[..., lo:hi])
    grad_exponent = (grad_k if grad_k.dtype == k.dtype else grad_k.to(k.dtype)).mul_(k)
    grad_z = torch.bmm(fast.kernel_points, grad_exponent.transpose(1, 2))   # (n_out, d + 2, P)
    grad_xs = grad_z[:, :d] - z[:, :d] * grad_z[:, d:d + 1]
    return (grad_xs * fast.inv_lengthscales.unsqueeze(-1)).sum(0)


class _GPMoments(torch.autograd.Function):
    """Predictive mean and variance (n_out, P) at x (P, d) with the hand-written backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fast: FastGP, include_noise: bool):
        mean, var, saved = moments_forward(fast, x.T)
        ctx.fast, ctx.saved = fast, saved
        ctx.positive = var >= 0
        var = var.clamp_min(0.0)
        if include_noise:
            var = var + fast.noise
        return mean, var

    @staticmethod
    def backward(ctx, grad_mean: torch.Tensor, grad_var: torch.Tensor):
        grad_var = grad_var * ctx.positive
        return moments_backward(ctx.fast, ctx.saved, grad_mean.contiguous(), grad_var).T, None, None


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
