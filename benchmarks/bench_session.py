"""A whole simulated hardware session over ROS (`mcpilco session --sim`) at a size that fits a short CPU budget.

    python benchmarks/bench_session.py [--trials 5] [--out runs/bench_session] [--scale small|full]

``--scale small`` (default) writes a reduced copy of config/train_pendubot.yaml into the output directory
(64 particles, 50 basis functions, 80 GP points per joint, <= 100 optimisation steps per retrain, 150 GP fit
steps; horizon, trial length, cost and curriculum unchanged) and runs it; ``full`` uses the file as it is (hours).
Prints each phase (the session's own progress output), then the learning curve, the final evaluation score
(60 s protocol) and the wall and CPU time of the whole run (this process and every node/retrain process).
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import yaml

SMALL = {"particles": 64, "policy": {"num_basis": 50},
         "gp": {"fit_steps": 150, "fit_points": 300, "max_points": 80},
         "optimizer": {"max_steps_first": 100, "max_steps": 100, "patience": 50}, "progress": False}


def small_config(out: Path) -> Path:
    """config/train_pendubot.yaml with the SMALL overrides, written to ``out`` (robot_config made absolute)."""
    from mcpilco_core.paths import config_dir

    source = config_dir() / "train_pendubot.yaml"
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    for key, value in SMALL.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    data["robot_config"] = str((source.parent / data["robot_config"]).resolve())
    out.mkdir(parents=True, exist_ok=True)
    path = out / "train_pendubot_small.yaml"
    path.write_text("# written by benchmarks/bench_session.py: config/train_pendubot.yaml, reduced\n"
                    + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    from mcpilco_core.paths import config_dir
    from mcpilco_ros.sim_session import SessionOptions, SimSession

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_session"))
    parser.add_argument("--scale", choices=["small", "full"], default="small")
    parser.add_argument("--eval-seeds", type=int, nargs="+", default=[100])
    args = parser.parse_args()
    config = small_config(args.out.parent / (args.out.name + "_config")) if args.scale == "small" \
        else config_dir() / "train_pendubot.yaml"
    start, cpu = time.perf_counter(), cpu_seconds()
    result = SimSession(SessionOptions(robot="pendubot", train_config=config, out=args.out, trials=args.trials,
                                    eval_seeds=tuple(args.eval_seeds))).run()
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    print("\ntrial  mode     policy         mean cost  eval score  trial s  retrain after s")
    for row in result["trials"]:
        score = "-" if row["eval_score"] is None else f"{row['eval_score']:.4f}"
        print(f"{row['trial']:>5d}  {row['mode']:<7s}  {row['policy_version']:<13s}  {row['cost']:9.3f}  "
              f"{score:>10s}  {row['timings_s']['trial']:7.1f}  {row['timings_s'].get('retrain_after', 0.0):15.1f}")
    print(f"final policy {result['final_policy_version']}: score {result['final_score']:.4f} "
          f"(seeds {result['eval_seeds']}); wall {wall:.0f} s, CPU {cpu:.0f} s (all processes); config {config}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
