"""Speed and memory of the MC-PILCO learner (not a test: prints numbers for the README / docs/learner.md).

    python benchmarks/bench_learner.py                      # grid + whole trial (a few minutes)
    python benchmarks/bench_learner.py --grid-only --steps 3
    python benchmarks/bench_learner.py --single 400 300 --modes reference fused compiled   # one point, JSON line

Rollout modes (``rollout`` in the training config): ``reference`` = the plain-autograd code path (the old
implementation), ``fused`` = one autograd node per rollout with hand-written backward (default), ``compiled`` =
fused through torch.compile. At each point the modes run **interleaved in the same process** (reference step,
fused step, ..., repeated), so their ratio is meaningful on a loaded machine even when absolute times are not.

Each grid point runs in its own process; with ``--rss`` every mode also runs alone in a process of its own so
that its peak resident memory (ru_maxrss) is its own. Time per step = one policy-optimisation step (rollout of
P particles x H steps, backward, Adam), median and minimum of ``--steps`` timed steps after one warm-up; the
CPU time (process_time, all threads summed) is printed too because wall time on a shared machine mostly
measures the neighbours. The GP posterior is built on random inputs of the given size (speed depends on sizes
only). The whole trial = model fit on real simulator data (1500 Adam steps on 600 points, SoD to 300 per joint)
+ the measured step time x the step cap (extrapolated; said so).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.learning.cost import CostSettings, trajectory_cost  # noqa: E402
from mcpilco_core.learning.gp import (  # noqa: E402
    BACKWARD_PRECISIONS,
    GPHyperparameters,
    GPSettings,
    build_posterior,
    resolve_backward_precision,
)
from mcpilco_core.learning.model import DynamicsModel, particle_noise, rollout  # noqa: E402
from mcpilco_core.learning.parallel import ParticleProcesses, ParticleThreads  # noqa: E402
from mcpilco_core.learning.torch_policy import TorchPolicy  # noqa: E402
from mcpilco_core.recording.transitions import TransitionData, transitions_from_trajectory  # noqa: E402


def peak_rss_mb() -> float:
    """Peak RSS of this process plus that of its largest finished child (the ``+processes`` worker), MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (own + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024.0


def synthetic_model(gp_size: int, backward: str, seed: int = 0, delay: float = 0.0) -> DynamicsModel:
    config = load_robot_config(REPO / "config" / "pendubot.yaml")
    model = DynamicsModel(config, GPSettings(identify=bool(delay), delay_aware=bool(delay)))
    model.set_prior_plant(config.plant, delay)
    rng = np.random.default_rng(seed)
    n = 2 * gp_size
    x = np.concatenate([rng.uniform(-np.pi, np.pi, (n, 2)), rng.normal(0, 5, (n, 2))], 1)
    u = rng.uniform(-3, 3, n)
    inputs = model.gp_inputs(x, u)
    targets = 0.05 * rng.normal(size=(n, 2))
    hyper = GPHyperparameters.initial(inputs, targets)
    model.hyper, model.subsets = hyper, [np.arange(gp_size), np.arange(gp_size, n)]
    model.posterior = build_posterior(hyper, inputs, targets, model.subsets)
    model.posterior.set_backward_precision(backward)
    return model


def time_steps(particles: int, gp_size: int, horizon: int, steps: int, backward: str, modes: list[str]) -> dict:
    """Per mode: median / minimum wall and CPU time of one optimisation step (s), modes interleaved; peak RSS (MB).

    A mode ``M+particles`` is rollout mode M with ``parallel: particles``: the particles split between as many
    Python threads as torch had intra-op threads, each running single-threaded ops (parallel.ParticleThreads);
    ``M+processes`` the same with worker processes (``parallel: processes``, parallel.ParticleProcesses).
    ``M+delay``: rollout mode M of a delay-aware model (``gp.delay_aware``, command delay 0.2 of the period).
    """
    plain = synthetic_model(gp_size, backward)
    delayed = synthetic_model(gp_size, backward, delay=0.2)
    model = plain
    gen = torch.Generator().manual_seed(0)
    policy = TorchPolicy.random(200, 3.0, gen)
    opt = torch.optim.Adam(policy.parameters(), lr=0.01)
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    first: dict[str, float] = {}
    threads = torch.get_num_threads()
    pools: dict = {m: ParticleThreads(threads) for m in modes if m.endswith("+particles")}
    for m in modes:
        if m.endswith("+processes"):
            model.rollout_mode = m.removesuffix("+processes")
            pools[m] = ParticleProcesses(model, threads)
    for i in range(steps + 1):
        for mode in modes:
            if torch.get_num_threads() != (1 if mode in pools else threads):   # as in training: set once per run
                torch.set_num_threads(1 if mode in pools else threads)
            start, start_cpu = time.perf_counter(), time.process_time()
            policy.set_dropout(0.25, gen)
            opt.zero_grad()
            x0 = (2 * torch.rand((particles, 4), generator=gen) - 1) * torch.tensor([np.pi, np.pi, 0.01, 0.01])
            rollout_mode = mode.removesuffix("+particles").removesuffix("+processes").removesuffix("+delay")
            model = delayed if mode.endswith("+delay") else plain
            model.rollout_mode = rollout_mode
            if mode in pools:
                noise = particle_noise(horizon, particles, gen, x0.dtype)
                pools[mode].cost_and_gradients(model, policy, x0, noise, horizon, CostSettings())
            else:
                loss = trajectory_cost(rollout(model, policy, x0, horizon, gen, mode=rollout_mode), CostSettings())
                loss.backward()
            opt.step()
            if i:
                times[mode].append(time.perf_counter() - start)
                cpu[mode].append(time.process_time() - start_cpu)
            else:
                first[mode] = time.perf_counter() - start    # includes compilation for "compiled"
    base = modes[0]
    for pool in pools.values():
        pool.close()
    result = {"particles": particles, "gp_size": gp_size, "horizon": horizon, "backward": backward,
              "threads": threads, "peak_rss_mb": peak_rss_mb(), "modes": {}}
    for mode in modes:
        result["modes"][mode] = {
            "step_s": float(np.median(times[mode])), "step_min_s": float(np.min(times[mode])),
            "step_cpu_s": float(np.median(cpu[mode])), "step_cpu_min_s": float(np.min(cpu[mode])),
            "first_step_s": first[mode],
            "ratio_min_wall": float(np.min(times[mode]) / np.min(times[base])),
            "ratio_min_cpu": float(np.min(cpu[mode]) / np.min(cpu[base]))}
    return result


def trial_fit_time() -> dict:
    """Model fit on simulator data: 600 transitions of random torques, 1500 Adam steps, SoD to 300."""
    from mcpilco_core.learning.learner import ExplorationController, run_on_robot

    config = load_robot_config(REPO / "config" / "pendubot.yaml")
    rng = np.random.default_rng(0)
    model = DynamicsModel(config, GPSettings())
    data = TransitionData.empty()


    start = time.perf_counter()
    for _ in range(4):
        x0 = rng.uniform(-1, 1, 4) * [np.pi, np.pi, 1, 1]
        traj = run_on_robot(config, ExplorationController(config, 3.0, rng), x0, 3.0)
        data = data.concat(transitions_from_trajectory(traj.t, traj.x, traj.u, 0.02, config.actuated_joint))
    robot = time.perf_counter() - start
    start = time.perf_counter()
    model.fit(data, rng)
    return {"transitions": len(data), "fit_s": time.perf_counter() - start, "robot_12s_s": robot,
            "sod_sizes": [len(s) for s in model.subsets]}


def profile_steps(particles: int, gp_size: int, horizon: int, backward: str, modes: list[str], rows: int) -> None:
    """torch.profiler table (self CPU time, top ops) of two optimisation steps per mode, after one warm-up."""
    from torch.profiler import ProfilerActivity, profile

    model = synthetic_model(gp_size, backward)
    gen = torch.Generator().manual_seed(0)
    policy = TorchPolicy.random(200, 3.0, gen)
    for mode in modes:
        def step(mode: str = mode) -> None:
            policy.set_dropout(0.25, gen)
            x0 = (2 * torch.rand((particles, 4), generator=gen) - 1) * torch.tensor([np.pi, np.pi, 0.01, 0.01])
            trajectory_cost(rollout(model, policy, x0, horizon, gen, mode=mode), CostSettings()).backward()

        step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
            step()
        print(f"== {mode}: P={particles} GP={gp_size} H={horizon}, 2 steps, {torch.get_num_threads()} thread(s)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def run_single(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    print(json.dumps(time_steps(args.single[0], args.single[1], args.horizon, args.steps, args.backward, args.modes)))


def _subprocess(args: argparse.Namespace, particles: int, gp_size: int, modes: list[str], steps: int) -> dict:
    cmd = [sys.executable, __file__, "--single", str(particles), str(gp_size), "--backward", args.backward,
           "--steps", str(steps), "--horizon", str(args.horizon), "--threads", str(args.threads), "--modes", *modes]
    output = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def run_grid(args: argparse.Namespace) -> list[dict]:
    rows = []
    for particles in args.particles:
        for gp_size in args.gp_sizes:
            row = _subprocess(args, particles, gp_size, args.modes, args.steps)
            if args.rss:
                for mode in args.modes:
                    row["modes"][mode]["peak_rss_mb"] = _subprocess(args, particles, gp_size, [mode], 1)["peak_rss_mb"]
            rows.append(row)
            for mode, r in row["modes"].items():
                rss = f"  peak RSS {r['peak_rss_mb']:.0f} MB" if "peak_rss_mb" in r else ""
                print(f"P={particles:4d}  GP={gp_size:4d}/joint  H={args.horizon}  {mode:9s}  "
                      f"step {r['step_s']:.3f} s (min {r['step_min_s']:.3f}, CPU {r['step_cpu_s']:.3f}, "
                      f"min/min {r['ratio_min_wall']:.2f} of {args.modes[0]}){rss}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--single", type=int, nargs=2, metavar=("PARTICLES", "GP_SIZE"))
    parser.add_argument("--profile", type=int, nargs=2, metavar=("PARTICLES", "GP_SIZE"),
                        help="print a torch.profiler table per mode instead of timing")
    parser.add_argument("--particles", type=int, nargs="+", default=[100, 200, 400])
    parser.add_argument("--gp-sizes", type=int, nargs="+", default=[100, 300, 600])
    parser.add_argument("--modes", nargs="+", default=["reference", "fused"],
                        help="rollout modes, interleaved; ratios are relative to the first; M+delay: delay-aware")
    parser.add_argument("--backward", default="auto", choices=list(BACKWARD_PRECISIONS),
                        help="backward matmul precision; auto = the training default (bfloat16 where the CPU "
                             "multiplies it natively, else float32)")
    parser.add_argument("--rss", action="store_true", help="peak RSS of each mode in a process of its own")
    parser.add_argument("--horizon", type=int, default=150, help="rollout steps (150 = 3 s at 50 Hz)")
    parser.add_argument("--steps", type=int, default=5, help="timed optimisation steps per point")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grid-only", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.backward = resolve_backward_precision(args.backward, "float32")
    if args.profile:
        torch.set_num_threads(args.threads)
        profile_steps(args.profile[0], args.profile[1], args.horizon, args.backward, args.modes, 25)
        return
    if args.single:
        run_single(args)
        return
    torch.set_num_threads(args.threads)
    rows = run_grid(args)
    result = {"grid": rows, "threads": args.threads}
    if not args.grid_only:
        fit = trial_fit_time()
        target = [r for r in rows if r["particles"] == 400 and r["gp_size"] == 300]
        step = target[0]["modes"][args.modes[-1]]["step_s"] if target else float("nan")
        fit["trial_estimate_s"] = {str(n): fit["fit_s"] + n * step for n in (2000, 4000)}
        result["trial"] = fit
        print(f"model fit on {fit['transitions']} transitions: {fit['fit_s']:.1f} s (SoD {fit['sod_sizes']}); "
              f"whole trial at 400x150x300 ({args.modes[-1]}) ~ {fit['trial_estimate_s']['2000']:.0f} s (2000 steps), "
              f"{fit['trial_estimate_s']['4000']:.0f} s (4000 steps) [step time x cap, extrapolated]")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
