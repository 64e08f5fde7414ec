"""Benchmark: score every trial policy of training runs on the evaluation protocol, to pick the one to ship.

    python benchmarks/bench_policies.py runs/pendubot_rk4 [runs/other ...] [--seeds 200 201 ...] [--jobs 2]
        [--json out.json]

Selection happens on seeds that are *not* the scored ones (default 200-209; the README's scores use 0-9), so
picking the best trial does not overfit the reported number. Besides the score, the table shows what the
controller did: the fraction of time in LQR mode (balancing) and the most revolutions the first joint wound up
(a policy that keeps the pendulum spinning also crosses the 0.45 m line once per turn, and scores a little
without ever balancing), and how long the policy needs from hanging rest until the LQR takes over.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from mcpilco_core.evaluation import ControllerSpec, evaluate_seeds
from mcpilco_core.simulation import MODE_CODES


def trial_policies(run: Path) -> list[tuple[str, Path]]:
    """(label, policy file) of every trial of a run directory that has a policy (or the file itself)."""
    if run.is_file():      # runs/NAME/trials/trial_007/policy.npz -> NAME/trial_007 (labels must be unique)
        parts = run.parts[-4:]
        label = f"{parts[0]}/{parts[2]}" if len(parts) == 4 and parts[1] == "trials" else "/".join(run.parts[-2:])
        return [(label, run)]
    return [(f"{run.name}/{p.parent.name}", p) for p in sorted((run / "trials").glob("trial_*/policy.npz"))]


def describe(spec: ControllerSpec, seeds: list[int], jobs: int) -> dict:
    results = evaluate_seeds(spec, seeds, jobs=jobs, keep_trajectory=True)
    scores = np.array([r.score for r in results])
    turns = max(float(np.abs(r.trajectory.x[:, 0]).max()) / (2 * math.pi) for r in results)
    lqr = float(np.mean([r.mode_fractions.get("lqr", 0.0) for r in results]))
    first = results[0].trajectory                   # hanging rest until the first disturbance (>= 2.75 s)
    before = first.mode[: int(round(2.75 / first.dt))] == MODE_CODES["lqr"]
    lqr_from_rest = float(first.t[np.argmax(before)]) if before.any() else math.nan
    return {"mean": float(scores.mean()), "std": float(scores.std()), "min": float(scores.min()),
            "lqr_from_rest_s": lqr_from_rest, "lqr_fraction": lqr, "max_turns_q1": turns,
            "passive_max_torque": max(r.passive_max_torque for r in results), "scores": scores.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories or policy files")
    parser.add_argument("--config", help="robot config (default: the run's robot_config.yaml)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(200, 210)))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write all results here")
    args = parser.parse_args()
    rows = {}
    print(f"{'policy':<40} {'mean':>6} {'std':>6} {'min':>6} {'LQR':>5} {'turns':>6} {'rest→LQR':>9}"
          f"  (seeds {args.seeds[0]}..{args.seeds[-1]})")
    for run in args.runs:
        config = args.config or str((run if run.is_dir() else run.parent) / "robot_config.yaml")
        for label, policy in trial_policies(run):
            start = time.perf_counter()
            row = describe(ControllerSpec(config, str(policy)), args.seeds, args.jobs)
            rows[label] = {"policy": str(policy), **row, "wall_s": time.perf_counter() - start}
            print(f"{label:<40} {row['mean']:>6.3f} {row['std']:>6.3f} {row['min']:>6.3f} "
                  f"{row['lqr_fraction']:>5.2f} {row['max_turns_q1']:>6.1f} {row['lqr_from_rest_s']:>8.2f}s",
                  flush=True)
    if rows:
        best = max(rows, key=lambda k: rows[k]["mean"])
        print(f"best: {best} ({rows[best]['mean']:.3f})")
    if args.json:
        args.json.write_text(json.dumps({"seeds": args.seeds, "policies": rows}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
