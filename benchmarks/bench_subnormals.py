"""What subnormal floats cost the learner on this CPU: one optimisation step's rollout and backward on a run's own
newest model, with subnormals flushed to zero (what the learner does since 2026-12-01, ``denormals_flushed``) and with
IEEE arithmetic, interleaved in one process so that the ratio holds on a loaded machine.

    python benchmarks/bench_subnormals.py runs/a0 [--particles 200] [--horizon 2.0] [--steps 5] [--json F]

Why: the GP kernel's exp(-d^2/2) of particles far from the GP's points underflows into subnormal float32 numbers; on
Intel CPUs each multiply-add with one takes a microcode assist. Prints the median wall time per step of each, their
ratio, the largest difference between the two costs (what flushing changes in the result), and a plain bmm of the
GP's shape with subnormal inputs against normal ones (the kernel alone).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.learning.cost import CostSettings, trajectory_cost  # noqa: E402
from mcpilco_core.learning.model import denormals_flushed, particle_noise, rollout  # noqa: E402
from mcpilco_core.learning.polish import load_source  # noqa: E402
from mcpilco_core.learning.torch_policy import TorchPolicy  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402


def one_step(model, policy, x0, noise, steps: int, cost: CostSettings, flushed: bool) -> tuple[float, float]:
    """(wall seconds, cost) of one step's rollout + backward."""
    policy.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with denormals_flushed() if flushed else nullcontext():
        loss = trajectory_cost(rollout(model, policy, x0, steps, None, noise=noise), cost)
        loss.backward()
    return time.perf_counter() - start, float(loss.detach())


def bmm_microseconds(scale: float, flushed: bool, repeats: int = 50) -> float:
    """A (2, 200, 150) x (2, 150, 48) float32 bmm (the GP's shape in the acrobot's rollout), inputs times ``scale``."""
    a, w = torch.rand(2, 200, 150) * scale, torch.rand(2, 150, 48)
    with denormals_flushed() if flushed else nullcontext():
        torch.bmm(a, w)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.bmm(a, w)
    return (time.perf_counter() - start) / repeats * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="run directory (mcpilco train --out) or session output")
    parser.add_argument("--policy", default=None, help="policy file (default: the run's newest or selected)")
    parser.add_argument("--particles", type=int, default=200)
    parser.add_argument("--horizon", type=float, default=2.0, help="s")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each kind (after one warm-up each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    source = load_source(args.run, args.policy)
    config, model = source.config, source.model
    policy = TorchPolicy.from_numpy(load_policy(source.policy_file, robot=config.robot.robot), dtype=torch.float32)
    generator = torch.Generator().manual_seed(args.seed)
    steps = int(round(args.horizon / config.robot.policy_period))
    picks = torch.randint(0, len(source.pool), (args.particles,), generator=generator)
    x0 = torch.as_tensor(source.pool[picks.numpy()], dtype=torch.float32)
    noise = particle_noise(steps, args.particles, generator, torch.float32, "cpu")
    cost = CostSettings(lengthscales=config.cost.lengthscales, velocity_lengthscales=config.cost.velocity_lengthscales)
    times: dict[bool, list[float]] = {True: [], False: []}
    costs: dict[bool, list[float]] = {True: [], False: []}
    for i in range(args.steps + 1):
        for flushed in (True, False):
            seconds, value = one_step(model, policy, x0, noise, steps, cost, flushed)
            if i:                                                      # the first of each is the warm-up
                times[flushed].append(seconds)
                costs[flushed].append(value)
    result = {"run": str(args.run), "particles": args.particles, "horizon_steps": steps,
              "rollout_mode": model.rollout_mode, "step_s_flushed": statistics.median(times[True]),
              "step_s_ieee": statistics.median(times[False]),
              "cost_difference": float(np.max(np.abs(np.subtract(costs[True], costs[False])))),
              "bmm_us_normal": bmm_microseconds(1.0, False), "bmm_us_subnormal": bmm_microseconds(1e-39, False),
              "bmm_us_subnormal_flushed": bmm_microseconds(1e-39, True)}
    result["ratio"] = result["step_s_ieee"] / result["step_s_flushed"]
    print(f"{args.run}: one step ({args.particles} particles x {steps} steps, {model.rollout_mode}) "
          f"{result['step_s_flushed']:.3f} s flushed, {result['step_s_ieee']:.3f} s IEEE: x{result['ratio']:.1f}; "
          f"cost differs by {result['cost_difference']:.2e}")
    print(f"bmm (2,200,150)x(2,150,48): {result['bmm_us_normal']:.0f} us normal inputs, "
          f"{result['bmm_us_subnormal']:.0f} us subnormal, {result['bmm_us_subnormal_flushed']:.0f} us flushed")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
