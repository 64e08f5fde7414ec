"""The speed-integration dynamics model (MC-PILCO) with the forward-dynamics prior mean, and particle rollouts.

One transition covers one policy period Ts (s), with the torque held. Per joint i:

    dq'_i = dq_i + Delta_i,        q'_i = q_i + Ts dq_i + Ts/2 Delta_i,
    Delta_i ~ GP_i with prior mean  m(x, u) = Ts * M^-1(q) (B u - n(q, dq))  (the nominal plant).

The GP therefore learns only the residual Delta - m. With ``GPSettings.prior = "rk4"`` the prior is one
Runge-Kutta-4 step of the same dynamics over Ts instead (the Euler step is poor at Ts = 20 ms at high speed).
GP input: (dq1, dq2, cos q1, cos q2, sin q1, sin q2, u), u the actuated torque (N m): the policy's features
phi followed by u, so one sin/cos per step serves the policy, the GP and the prior.

Delay-aware (``GPSettings.delay_aware``): on a robot whose state reaches the controller a Ts late, the previous
command still acts for the first a Ts of every transition between measured states. The model then uses the
effective torque u + a (u_prev - u) in place of u, in the prior and in the GP's input, with a identified together
with friction and rotor inertia (:func:`~mcpilco_core.learning.identification.identify_prior`). The particles carry
their previous command through the rollout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..config import PlantParameters, RobotConfig
from ..plant import DoublePendulum
from ..recording.transitions import TransitionData
from .fused import PriorConstants, effective_torque, fused_rollout
from .gp import (
    GPHyperparameters,
    GPPosterior,
    GPSettings,
    build_posterior,
    fit_hyperparameters,
    select_subset,
)
from .identification import effective_torques, identify_prior, parameters_of, with_parameters
from .identified_robot import IdentifiedRobot


class NonFiniteParticlesError(FloatingPointError):
    """A rollout produced NaN/inf states; the message says at which step and how many particles."""


@dataclass
class DynamicsModel:
    """Speed-integration model of one robot: physics prior + per-joint GPs on the residual.

    period: Ts (s); the posterior is None until :meth:`fit` has run.
    """

    config: RobotConfig
    settings: GPSettings = field(default_factory=GPSettings)
    hyper: GPHyperparameters | None = None
    subsets: list[np.ndarray] | None = None
    posterior: GPPosterior | None = None
    fit_history: list[float] = field(default_factory=list)
    rollout_mode: str = "fused"
    robot: IdentifiedRobot | None = None      # gp.identify_robot: the robot as the learner identified it (set by
                                              # the learner from its state-rate recordings; saved with the model)

    def __post_init__(self) -> None:
        self.period = float(self.config.policy_period)
        self.actuated = int(self.config.actuated_joint)
        self.base_plant = self.config.plant      # the user's prior; gp.identify refits friction and Ir from here
        self.delay_fraction = 0.0                # gp.delay_aware: the command delay / Ts, identified in fit()
        self.set_prior_plant(self.config.plant)

    def set_prior_plant(self, plant: PlantParameters, delay_fraction: float | None = None) -> None:
        """Use ``plant`` (and the command delay ``delay_fraction`` x Ts, if given) as the physics prior (the GPs must
        be refitted: they learnt the old prior's residual)."""
        if delay_fraction is not None:
            self.delay_fraction = float(delay_fraction)
        self.config = replace(self.config, plant=plant)
        self.plant = DoublePendulum(plant)
        p = plant
        (m1, m2), (l1, _), (r1, r2), (i1, i2) = p.m, p.l, p.r, p.I
        self._constants = {"a": i1 + i2 + m2 * l1 * l1 + p.gr * p.gr * p.Ir + p.Ir, "h": m2 * l1 * r2,
                           "m12": i2 - p.gr * p.Ir, "m22": i2 + p.gr * p.gr * p.Ir,
                           "g1": p.g * (m1 * r1 + m2 * l1), "g2": p.g * m2 * r2}
        friction = tuple((i, float(b), float(cf)) for i, (b, cf) in enumerate(zip(p.b, p.cf)) if b or cf)
        self.prior_constants = PriorConstants(**self._constants, period=self.period, actuated=self.actuated,
                                              friction=friction, rk4=self.settings.prior == "rk4",
                                              delay=self.delay_fraction if self.settings.delay_aware else 0.0)

    # ------------------------------------------------------------------ features and prior
    @staticmethod
    def gp_inputs(x: np.ndarray, u: np.ndarray) -> np.ndarray:
        """(dq1, dq2, cos q1, cos q2, sin q1, sin q2, u) for states (..., 4) and torques (...)."""
        return np.concatenate([x[..., 2:], np.cos(x[..., :2]), np.sin(x[..., :2]), u[..., None]], -1)

    def torques(self, u: np.ndarray) -> np.ndarray:
        """Both joints' torques (..., 2) with ``u`` on the actuated joint and exactly 0 on the passive one."""
        both = np.zeros(u.shape + (2,))
        both[..., self.actuated] = u
        return both

    def prior_mean(self, x: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The prior of Delta dq (rad/s), shape (..., 2): Ts * forward dynamics of the nominal plant (Euler), or
        the velocity change of one RK4 step of length Ts with the torque held (``settings.prior == "rk4"``)."""
        torques = self.torques(u)
        if self.settings.prior == "rk4":
            return self.plant.rk4_step(x, torques, self.period)[..., 2:] - x[..., 2:]
        return self.period * self.plant.forward_dynamics(x, torques)

    def _prior_reference(self, q: torch.Tensor, dq: torch.Tensor, c: torch.Tensor, s: torch.Tensor,
                         u: torch.Tensor) -> torch.Tensor:
        """The prior (P, 2) on torch tensors with autograd (the reference of the fused rollout's prior)."""
        p1 = self._prior_from_trig(dq, c, s, u)
        if self.settings.prior != "rk4":
            return p1
        half = 0.5 * self.period

        def stage(q_i: torch.Tensor, dq_i: torch.Tensor) -> torch.Tensor:
            return self._prior_from_trig(dq_i, torch.cos(q_i), torch.sin(q_i), u)

        p2 = stage(q + half * dq, dq + 0.5 * p1)
        p3 = stage(q + half * (dq + 0.5 * p1), dq + 0.5 * p2)
        p4 = stage(q + self.period * (dq + 0.5 * p2), dq + p3)
        return (p1 + 2.0 * p2 + 2.0 * p3 + p4) / 6.0

    def _prior_from_trig(self, dq: torch.Tensor, c: torch.Tensor, s: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """:meth:`prior_mean` from precomputed cos q, sin q (P, 2) on torch tensors (fewer kernel launches).

        Same equations as :class:`DoublePendulum` (checked by a test); friction terms only if nonzero.
        """
        k = self._constants
        dq1, dq2 = dq[:, 0], dq[:, 1]
        c2, s1, s2 = c[:, 1], s[:, 0], s[:, 1]
        s12 = s1 * c2 + c[:, 0] * s2
        hs = k["h"] * s2
        g2 = -k["g2"] * s12
        rhs1 = g2 - k["g1"] * s1 + hs * (2.0 * dq1 + dq2) * dq2
        rhs2 = g2 - hs * dq1 * dq1
        if self.actuated == 0:
            rhs1 = rhs1 + u
        else:
            rhs2 = rhs2 + u
        p = self.config.plant
        for i, (b, cf) in enumerate(zip(p.b, p.cf)):
            if b or cf:
                friction = b * dq[:, i] + cf * torch.atan(100.0 * dq[:, i])
                rhs1, rhs2 = (rhs1 - friction, rhs2) if i == 0 else (rhs1, rhs2 - friction)
        m11 = k["a"] + (2.0 * k["h"]) * c2
        m12 = k["m12"] + k["h"] * c2
        scale = self.period / (m11 * k["m22"] - m12 * m12)
        return torch.stack([(k["m22"] * rhs1 - m12 * rhs2) * scale, (m11 * rhs2 - m12 * rhs1) * scale], -1)

    def effective_commands(self, data: TransitionData) -> np.ndarray:
        """The torque (N,) the model sees for each transition: u, or with ``gp.delay_aware`` u + a (u_prev - u)."""
        if not self.settings.delay_aware:
            return data.u
        return effective_torques(data.u, data.u_prev, self.delay_fraction)

    def residual_targets(self, data: TransitionData) -> tuple[np.ndarray, np.ndarray]:
        """GP inputs (N, 7) and residual targets Delta dq - prior (N, 2) of a data set."""
        delta = data.x_next[:, 2:] - data.x[:, 2:]
        u = self.effective_commands(data)
        return self.gp_inputs(data.x, u), delta - self.prior_mean(data.x, u)

    # ------------------------------------------------------------------ fitting
    def fit(self, data: TransitionData, rng: np.random.Generator, device: str = "cpu",
            dtype: torch.dtype = torch.float32) -> None:
        """Fit hyperparameters (warm start if enabled), choose the SoD subsets, cache the posterior; with
        ``gp.identify`` the prior's friction and rotor inertia are first fitted to ``data`` (identification.py)."""
        if self.settings.identify:
            plant, delay = identify_prior(self.base_plant, data, self.period, self.actuated,
                                          fit_delay=self.settings.delay_aware, delay_fraction=self.delay_fraction,
                                          rng=rng)
            self.set_prior_plant(plant, delay)
        if self.settings.mirror_data:
            data = data.concat(data.mirrored())
        inputs, targets = self.residual_targets(data)
        if self.hyper is None or not self.settings.warm_start:
            self.hyper = GPHyperparameters.initial(inputs, targets, self.settings.noise_floor)
        fit_idx = np.arange(len(inputs))
        if len(fit_idx) > self.settings.fit_points:
            fit_idx = np.sort(rng.choice(len(inputs), self.settings.fit_points, replace=False))
        self.hyper, self.fit_history = fit_hyperparameters(self.hyper, inputs[fit_idx], targets[fit_idx],
                                                           self.settings.fit_steps, self.settings.fit_lr,
                                                           lengthscale_floor=self.settings.lengthscale_floor)
        self.subsets = select_subset(inputs, self.hyper, self.settings.max_points, self.settings.sod_threshold)
        self._inputs, self._targets = inputs, targets
        self.posterior = build_posterior(self.hyper, inputs, targets, self.subsets, device, dtype)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to rebuild the fitted model (for the run directory; no pickle)."""
        if self.hyper is None or self.subsets is None:
            raise RuntimeError("the model has not been fitted")
        arrays = {f"hyper_{k}": v for k, v in self.hyper.to_arrays().items()}
        for j, idx in enumerate(self.subsets):
            arrays[f"subset_inputs_{j}"] = self._inputs[idx]
            arrays[f"subset_targets_{j}"] = self._targets[idx, j]
        arrays["fit_history"] = np.asarray(self.fit_history)
        arrays["prior"] = np.asarray(self.settings.prior)     # the residual targets depend on it
        arrays["prior_plant_b_cf_Ir"] = parameters_of(self.config.plant)   # and so on the (identified) prior plant
        arrays["delay_aware"] = np.asarray(self.settings.delay_aware)      # and the GP's input on the delay
        arrays["delay_fraction"] = np.asarray(self.delay_fraction)
        if self.robot is not None:                # gp.identify_robot: the robot as identified at the state rate
            arrays.update(self.robot.to_arrays())
        return arrays

    def load_arrays(self, arrays: dict, device: str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        """Inverse of :meth:`to_arrays`. Refuses a model fitted with another prior integrator (its GPs learnt
        the residual of that prior); models saved before the option existed used ``euler``."""
        prior = str(arrays["prior"]) if "prior" in arrays else "euler"
        if prior != self.settings.prior:
            raise ValueError(f"the saved model was fitted with the {prior!r} prior but the settings say "
                             f"gp.prior = {self.settings.prior!r}; use the run's own training config")
        delay_aware = bool(arrays["delay_aware"]) if "delay_aware" in arrays else False   # older models: not
        if delay_aware != self.settings.delay_aware:
            raise ValueError(f"the saved model was fitted with gp.delay_aware = {delay_aware} but the settings say "
                             f"{self.settings.delay_aware}; use the run's own training config")
        delay = float(arrays["delay_fraction"]) if "delay_fraction" in arrays else 0.0
        if "prior_plant_b_cf_Ir" in arrays:      # absent in models saved before gp.identify: the settings' prior stays
            self.set_prior_plant(with_parameters(self.base_plant, np.asarray(arrays["prior_plant_b_cf_Ir"])), delay)
        self.robot = IdentifiedRobot.from_arrays(self.base_plant, arrays)   # None before gp.identify_robot
        self.hyper = GPHyperparameters.from_arrays({k[6:]: v for k, v in arrays.items() if k.startswith("hyper_")})
        n_out = self.hyper.raw_signal.shape[0]
        inputs = np.concatenate([arrays[f"subset_inputs_{j}"] for j in range(n_out)])
        targets = np.zeros((len(inputs), n_out))
        subsets, start = [], 0
        for j in range(n_out):
            m = len(arrays[f"subset_inputs_{j}"])
            targets[start:start + m, j] = arrays[f"subset_targets_{j}"]
            subsets.append(np.arange(start, start + m))
            start += m
        self.subsets, self._inputs, self._targets = subsets, inputs, targets
        self.fit_history = list(np.asarray(arrays.get("fit_history", [])))
        self.posterior = build_posterior(self.hyper, inputs, targets, subsets, device, dtype)

    # ------------------------------------------------------------------ prediction
    def one_step_errors(self, data: TransitionData) -> dict[str, np.ndarray]:
        """Per-joint errors (rad/s) of the predicted velocity change over one policy period on ``data``: the
        prior alone, and the prior + the GP's mean (what the model learnt). Keys ``prior``, ``learned``: (N, 2)."""
        if self.posterior is None:
            raise RuntimeError("the model has not been fitted")
        inputs, residual = self.residual_targets(data)
        packed = self.posterior.packed
        mean, _ = self.posterior.predict(torch.as_tensor(inputs, dtype=packed.dtype, device=packed.device),
                                         include_noise=False)
        return {"prior": residual, "learned": residual - mean.detach().cpu().double().numpy()}

    def step(self, x: torch.Tensor, policy, noise: torch.Tensor | None) -> torch.Tensor:
        """One transition of particles x (P, 4) under ``policy`` (features phi (P, 6) -> torque (P,)).

        Samples with the standard normals ``noise`` (P, 2), reparameterised: Delta = mean + std * noise
        (noise None gives the mean). Returns the next states (P, 4). Plain autograd ops: the reference for the
        fused rollout (:mod:`mcpilco_core.learning.fused`), which computes the same. No previous command (see
        :meth:`step_after`).
        """
        return self.step_after(x, policy, noise, None)[0]

    def step_after(self, x: torch.Tensor, policy, noise: torch.Tensor | None,
                   previous: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step` after the command ``previous`` (P,) N m (None: none; it matters with ``gp.delay_aware``).
        Returns the next states (P, 4) and the policy's torque u (P,), the next step's previous command."""
        u, _, prior, mean, var = self.transition_parts(x, policy, previous)
        delta = prior + mean
        if noise is not None:
            delta = delta + torch.sqrt(var) * noise
        return self.advance(x, delta), u

    def advance(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The next states (P, 4) from x (P, 4) and the velocity change delta (P, 2) rad/s over one policy period:
        q' = q + Ts dq + Ts/2 delta, dq' = dq + delta."""
        return x + torch.cat([self.period * (x[:, 2:] + 0.5 * delta), delta], -1)

    def transition_parts(self, x: torch.Tensor, policy, previous: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """The parts of :meth:`step_after`'s transition from x (P, 4): the policy's torque u (P,), the effective
        torque (P,) N m, the prior's Delta dq (P, 2) and the GP's mean and variance (P, 2) (rad/s, (rad/s)^2).
        Apart so that a diagnosis can say which part went non-finite (``benchmarks/bench_escapes.py``)."""
        if self.posterior is None:
            raise RuntimeError("the model has not been fitted")
        q, dq = x[:, :2], x[:, 2:]
        c, s = torch.cos(q), torch.sin(q)
        phi = torch.cat([dq, c, s], -1)
        u = policy.forward_features(phi)
        u_eff = effective_torque(u, previous, self.prior_constants.delay)
        mean, var = self.posterior.predict_reference(torch.cat([phi, u_eff.unsqueeze(-1)], -1))
        return u, u_eff, self._prior_reference(q, dq, c, s, u_eff), mean, var


ROLLOUT_MODES = ("fused", "compiled", "reference")


def particle_noise(steps: int, particles: int, generator: torch.Generator | None, dtype: torch.dtype,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """The standard normals (steps, particles, 2) a sampled rollout uses (drawn on the CPU: reproducible)."""
    return torch.randn((steps, particles, 2), generator=generator, dtype=dtype, device="cpu").to(device)


_FLUSHING = threading.local()


@contextmanager
def denormals_flushed() -> Iterator[None]:
    """Flush subnormal floats to zero in this thread while particles are propagated and differentiated.

    Why: the GP kernel's exp(-d^2/2) of far-apart points underflows into subnormal float32 numbers (below 1.2e-38),
    and on Intel CPUs every multiply-add with a subnormal operand takes a microcode assist: a (2, 200, 150) x
    (2, 150, 48) bmm took 16 ms instead of 47 us, and the proxy acrobot's optimisation step 2 s instead of 0.2 s
    (Xeon with AMX, 2026-12-01; AMD EPYC pays little). Such values add nothing at float32's resolution next to the
    kernel's other terms. The flag is the calling thread's (x86 MXCSR: ``torch.set_flush_denormal``), so the numpy
    simulations of the protocol, which run outside, keep IEEE arithmetic; nested uses restore it once, at the end
    of the outermost. Torch's intra-op worker threads (``parallel: ops`` with several threads) are not covered."""
    depth = getattr(_FLUSHING, "depth", 0)
    if depth == 0:
        torch.set_flush_denormal(True)
    _FLUSHING.depth = depth + 1
    try:
        yield
    finally:
        _FLUSHING.depth = depth
        if depth == 0:
            torch.set_flush_denormal(False)


def rollout(model: DynamicsModel, policy, x0: torch.Tensor, steps: int, generator: torch.Generator | None,
            sample: bool = True, mode: str | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Propagate particles x0 (P, 4) for ``steps`` policy periods; returns states (steps + 1, P, 4).

    ``policy.forward_features(phi)`` gives the actuated torque (P,); a policy with ``rollout_parts()``
    (:class:`~mcpilco_core.learning.torch_policy.TorchPolicy`) supplies a faster equivalent once per rollout. Noise
    comes
    from ``generator`` (reparameterised, so the result is differentiable in the policy parameters and in x0), or is
    given as ``noise`` (steps, P, 2) (e.g. :func:`particle_noise` drawn once and split between threads).
    ``mode`` (default ``model.rollout_mode``): "fused" runs the rollout as one autograd node with a hand-written
    backward (:mod:`mcpilco_core.learning.fused`; one node per transition for a policy without ``rollout_parts()``),
    "compiled" the same through ``torch.compile`` (eager fallback), "reference" the plain-autograd
    :meth:`DynamicsModel.step`; all equal up to rounding.
    Raises NonFiniteParticlesError if any state is NaN/inf, naming the first bad step.
    """
    mode = model.rollout_mode if mode is None else mode
    if mode not in ROLLOUT_MODES:
        raise ValueError(f"rollout mode {mode!r} is not one of {ROLLOUT_MODES}")
    if model.posterior is None:
        raise RuntimeError("the model has not been fitted")
    if not sample:
        noise = None
    elif noise is None:
        noise = particle_noise(steps, x0.shape[0], generator, x0.dtype, x0.device)
    elif noise.shape != (steps, x0.shape[0], 2):
        raise ValueError(f"noise has shape {tuple(noise.shape)}, expected {(steps, x0.shape[0], 2)}")
    if mode == "reference":
        states = [x0]
        x, previous = x0, None
        for t in range(steps):
            x, previous = model.step_after(x, policy, None if noise is None else noise[t], previous)
            states.append(x)
        trajectory = torch.stack(states)
    else:
        noise_t = None if noise is None else noise.transpose(1, 2).contiguous()     # (steps, 2, P)
        trajectory = fused_rollout(model.posterior.fast(), model.prior_constants, policy, x0, steps, noise_t,
                                   compiled=mode == "compiled")
    check_finite(trajectory)
    return trajectory


def check_finite(trajectory: torch.Tensor) -> None:
    """Raise NonFiniteParticlesError if a particle state is NaN or infinite (never propagate silently)."""
    bad = ~torch.isfinite(trajectory.detach()).all(-1)
    if bool(bad.any()):
        steps = torch.nonzero(bad.any(-1)).flatten()
        raise NonFiniteParticlesError(
            f"{int(bad.sum())} non-finite particle states; first at step {int(steps[0])} "
            f"({int(bad[steps[0]].sum())} of {bad.shape[1]} particles)")
