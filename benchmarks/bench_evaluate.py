"""Benchmark: wall time of the 60 s evaluation protocol (10 seeds of the LQR + damping controller).

    python benchmarks/bench_evaluate.py [--robot pendubot] [--seeds 10]

Prints the wall time with 1 worker and with 2 workers, and the time per simulated step (RK4 + controller).
"""

from __future__ import annotations

import argparse
import time

from mcpilco_core.evaluation import ControllerSpec, config_path_for, evaluate_seeds, summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robot", default="pendubot", choices=("pendubot", "acrobot"))
    parser.add_argument("--controller", default="lqr")
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    spec = ControllerSpec(config_path_for(args.robot), args.controller)
    seeds = list(range(args.seeds))
    spec.build()  # ROA cache warm
    print(f"{'workers':>8} {'wall (s)':>9} {'per seed (s)':>13} {'per step (us)':>14}  mean score")
    for jobs in (1, 2):
        start = time.perf_counter()
        results = evaluate_seeds(spec, seeds, jobs=jobs)
        wall = time.perf_counter() - start
        per_step = wall * jobs / (len(seeds) * 30000) * 1e6
        print(f"{jobs:>8d} {wall:>9.2f} {wall / len(seeds):>13.3f} {per_step:>14.1f}  "
              f"{summarize(results)['mean']:.4f}")


if __name__ == "__main__":
    main()
