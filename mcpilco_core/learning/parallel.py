"""Splitting the particles of one policy-optimisation step between cores.

The particles are independent, so J = sum_i (P_i / P) J_i over shares of the particles, and its gradient is the
same weighted sum: every split gives the one-share result up to float rounding (tested). Two ways to run the
shares at once, each share with single-threaded torch ops (on small machines the per-op synchronisation of
torch's intra-op threads costs more than it gains):

- :class:`ParticleThreads` (``parallel: particles``): one Python thread per share. Torch's eager ops release
  the GIL, but the kernels that ``torch.compile`` generates do not, so with ``rollout: compiled`` part of the
  step (~0.1 s of 0.38 s at 400 x 150 x 300, measured) still runs one thread at a time.
- :class:`ParticleProcesses` (``parallel: processes``): the calling thread runs the first share and spawned
  worker processes the others; nothing is serialised. Each worker receives the model's posterior once (exact
  copies of its tensors) and per step the policy parameters, the dropout mask, its initial states and noise
  (~0.25 MB), and sends back its cost and gradients.
"""

from __future__ import annotations

import multiprocessing
import signal
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields

import numpy as np
import torch

from .cost import CostSettings, trajectory_cost
from .gp import GPPosterior
from .model import DynamicsModel, NonFiniteParticlesError, denormals_flushed, rollout
from .torch_policy import TorchPolicy

PARALLEL_MODES = ("ops", "particles", "processes")


def share_cost_and_gradients(model: DynamicsModel, policy: TorchPolicy, x0: torch.Tensor, noise: torch.Tensor,
                             steps_horizon: int, cost: CostSettings, weight: float) -> tuple[float, list]:
    """weight * J of one share of the particles and its gradient w.r.t. the policy parameters."""
    with denormals_flushed():
        trajectory = rollout(model, policy, x0, steps_horizon, None, noise=noise)
        loss = trajectory_cost(trajectory, cost) * weight
        grads = list(torch.autograd.grad(loss, list(policy.parameters())))
    return float(loss.detach()), grads


def _shares(particles: int, count: int) -> list[torch.Tensor]:
    return [idx for idx in torch.arange(particles).tensor_split(count) if len(idx)]


def _accumulate(policy: TorchPolicy, results: list[tuple[float, list]]) -> float:
    for i, param in enumerate(policy.parameters()):
        param.grad = sum(torch.as_tensor(grads[i], dtype=param.dtype, device=param.device) for _, grads in results)
    return sum(value for value, _ in results)


class ParticleThreads:
    """Propagate the particles of one optimisation step in ``threads`` shares at once, one Python thread each."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="particles")

    def cost_and_gradients(self, model: DynamicsModel, policy: TorchPolicy, x0: torch.Tensor, noise: torch.Tensor,
                           steps_horizon: int, cost: CostSettings) -> float:
        """J of all particles; the summed gradient is left in the parameters' ``.grad``."""
        model.posterior.fast()                            # build the shared constants once, before the threads
        futures = [self.pool.submit(share_cost_and_gradients, model, policy, x0[idx], noise[:, idx], steps_horizon,
                                    cost, len(idx) / x0.shape[0]) for idx in _shares(x0.shape[0], self.threads)]
        return _accumulate(policy, [f.result() for f in futures])   # re-raises a worker's NonFiniteParticlesError

    def close(self) -> None:
        self.pool.shutdown(wait=True)


# ---------------------------------------------------------------------------------------------------- processes
def _posterior_arrays(posterior: GPPosterior) -> dict:
    """The posterior's fields (tensors as numpy arrays), without the derived backward matrix and fast constants."""
    values = {f.name: getattr(posterior, f.name) for f in fields(GPPosterior)
              if f.name not in ("backward_matrix", "_fast")}
    return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in values.items()}


def _worker(conn, config, settings, rollout_mode: str, posterior: dict, backward: str, delay_fraction: float) -> None:
    """Worker process: rebuild the model from the posterior's tensors (and the prior from the parent's plant and
    command delay), then answer step requests until "stop"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)        # the parent decides when to stop (Ctrl-C reaches both)
    torch.set_num_threads(1)
    model = DynamicsModel(config, settings, rollout_mode=rollout_mode)
    model.set_prior_plant(config.plant, delay_fraction)
    model.posterior = GPPosterior(**{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                     for k, v in posterior.items()})
    model.posterior.set_backward_precision(backward)
    while True:
        message = conn.recv()
        if message[0] == "stop":
            break
        _, params, mask, u_max, x0, noise, steps_horizon, cost, weight = message
        policy = TorchPolicy(*(torch.from_numpy(p) for p in params), u_max)
        policy.mask = None if mask is None else torch.from_numpy(mask)
        try:
            value, grads = share_cost_and_gradients(model, policy, torch.from_numpy(x0), torch.from_numpy(noise),
                                                    steps_horizon, cost, weight)
            conn.send(("ok", value, [g.numpy() for g in grads]))
        except NonFiniteParticlesError as exc:
            conn.send(("non-finite", str(exc)))
        except Exception:                                # noqa: BLE001 - reported to the parent, which raises
            conn.send(("error", traceback.format_exc()))
    conn.close()


class ParticleProcesses:
    """Propagate the particles of one optimisation step in ``workers`` shares at once: the first in the calling
    thread, the others in spawned processes (started here, for one model; CPU tensors only)."""

    def __init__(self, model: DynamicsModel, workers: int) -> None:
        if model.posterior is None:
            raise RuntimeError("the model has not been fitted")
        if model.posterior.packed.device.type != "cpu":
            raise ValueError("parallel: processes runs on the CPU; use parallel: ops with device: cuda")
        self.workers = workers
        backward = str(model.posterior.fast().backward_matrix.dtype).removeprefix("torch.")
        context = multiprocessing.get_context("spawn")    # never fork a process with OpenMP threads
        self.connections, self.processes = [], []
        for i in range(workers - 1):
            parent, child = context.Pipe()
            process = context.Process(target=_worker, name=f"particles-{i + 1}", daemon=True,
                                      args=(child, model.config, model.settings, model.rollout_mode,
                                            _posterior_arrays(model.posterior), backward, model.delay_fraction))
            process.start()
            child.close()
            self.connections.append(parent)
            self.processes.append(process)

    def cost_and_gradients(self, model: DynamicsModel, policy: TorchPolicy, x0: torch.Tensor, noise: torch.Tensor,
                           steps_horizon: int, cost: CostSettings) -> float:
        """J of all particles; the summed gradient is left in the parameters' ``.grad``."""
        shares = _shares(x0.shape[0], self.workers)
        params = [p.detach().numpy() for p in policy.parameters()]
        mask = None if policy.mask is None else policy.mask.numpy()
        for conn, process, idx in zip(self.connections, self.processes, shares[1:]):
            try:
                conn.send(("step", params, mask, policy.u_max, x0[idx].numpy(), noise[:, idx].numpy(),
                           steps_horizon, cost, len(idx) / x0.shape[0]))
            except (BrokenPipeError, ConnectionResetError):
                raise self._died(process) from None
        results, failure = [], None
        try:
            results.append(share_cost_and_gradients(model, policy, x0[shares[0]], noise[:, shares[0]], steps_horizon,
                                                    cost, len(shares[0]) / x0.shape[0]))
        except NonFiniteParticlesError as exc:
            failure = exc                                 # still collect the workers' answers (keep the pipes in step)
        for conn, process in zip(self.connections[:len(shares) - 1], self.processes):
            try:
                answer = conn.recv()
            except (EOFError, ConnectionResetError):
                raise self._died(process) from None
            if answer[0] == "ok":
                results.append((answer[1], answer[2]))
            elif answer[0] == "non-finite":
                failure = failure or NonFiniteParticlesError(answer[1])
            else:
                raise RuntimeError(f"particle worker {process.name} failed:\n{answer[1]}")
        if failure is not None:
            raise failure
        return _accumulate(policy, results)

    @staticmethod
    def _died(process) -> RuntimeError:
        process.join(timeout=1.0)
        return RuntimeError(f"particle worker {process.name} died (exit code {process.exitcode})")

    def close(self) -> None:
        for conn in self.connections:
            try:
                conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for process in self.processes:
            process.join(timeout=5.0)
            if process.is_alive():
                process.terminate()
                process.join()
        for conn in self.connections:
            conn.close()
        self.connections, self.processes = [], []
