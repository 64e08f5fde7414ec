"""The ``mcpilco`` command line: evaluate, roa, and the subcommands of the other layers.

It sits on top of everything (with the ROS nodes): each feature module exposes ``register(subparsers)`` that
adds its subcommand and sets ``func``. Nothing here imports rclpy; ``demo`` and ``session`` start ROS nodes as
subprocesses or import rclpy only when they run, so ``mcpilco evaluate`` works without ROS.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from mcpilco_core.config import ROBOTS, ConfigError
from mcpilco_core.hardware import hw_check
from mcpilco_core.learning import cli as learning_cli
from mcpilco_core.learning import retrain
from mcpilco_core.policy import PolicyError

from . import demo, sim_session

# OpenMP threads that spin while waiting make torch 20-40x slower on a busy 2-core machine (measured); this must
# be set before torch is first imported, which the subcommands do lazily.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")



# --------------------------------------------------------------------------------------------------
# evaluate


def _add_evaluate(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="run the 60 s global-policy protocol (RealAIGym simulation_v3)",
                              description="Evaluate a controller with the ICRA 2025 AI Olympics protocol: 60 s, "
                                          "15 random PID disturbances, score = time above 0.45 m / 60 s.")
    p.add_argument("--robot", choices=ROBOTS, required=True)
    p.add_argument("--config", type=Path, help="robot config (default: the bundled config/<robot>.yaml)")
    p.add_argument("--controller", default="lqr",
                   help="'lqr' (LQR + damping), 'zero' (no torque), or a policy file (.npz or RealAIGym .np)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--robot-profile", default="nominal",
                   help="the simulated robot: a profile of config/robot_profiles.yaml (nominal, hardware_proxy, "
                        "hardware_proxy_nonoise, perturbed), NAME:SEED, or a profile YAML file (default nominal)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--json", type=Path, help="write per-seed results and the summary here")
    p.add_argument("--plot", type=Path, help="write the first seed's time-series plot here (png/pdf/svg)")
    p.set_defaults(func=_run_evaluate)


def _evaluate_arguments_problem(args: argparse.Namespace) -> str:
    """What is wrong with ``mcpilco evaluate``'s arguments ('' = nothing)."""
    bad = [s for s in args.seeds if not 0 <= s < 2**32]
    if bad:
        return f"--seeds must be in 0 .. 2**32 - 1 (numpy's seeds), got {bad}"
    if args.plot is not None and args.plot.suffix.lower() not in (".png", ".pdf", ".svg"):
        return f"--plot {args.plot}: the file must end in .png, .pdf or .svg"
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None and path.is_dir():
            return f"{option} {path} is a folder: name a file"
    return ""


def _run_evaluate(args: argparse.Namespace) -> int:
    from mcpilco_core.evaluation import ControllerSpec, config_path_for, evaluate_seeds, summarize
    from mcpilco_core.simulation import load_robot_profile

    problem = _evaluate_arguments_problem(args)
    if problem:                      # said before the evaluation runs, not after it
        print(f"error: {problem}", file=sys.stderr)
        return 2
    spec = ControllerSpec(config_path_for(args.robot, args.config), args.controller)
    profile = load_robot_profile(args.robot_profile)
    config, _ = spec.build()
    if config.robot != args.robot:
        raise ConfigError(spec.config_path, "robot", f"is {config.robot!r} but --robot {args.robot} was given")
    start = time.perf_counter()
    results = evaluate_seeds(spec, args.seeds, jobs=args.jobs, keep_trajectory=args.plot is not None,
                             profile=profile)
    elapsed = time.perf_counter() - start
    for r in results:
        print(f"seed {r.seed:>4d}  score {r.score:.4f}  uptime {r.uptime:6.2f} s  "
              f"passive max |tau| {r.passive_max_torque:.3g} N m")
    summary = summarize(results)
    compensation = config.friction_compensation.enabled
    print(f"{args.robot} / {args.controller} / robot profile {profile.label}: score {summary['mean']:.4f} "
          f"+- {summary['std']:.4f} over {summary['n']} seed(s) ({elapsed:.1f} s)")
    if compensation:
        print(f"NOTE: passive-joint friction compensation was ON (<= {config.friction_compensation.limit} N m on "
              "the passive joint): report this score apart from scores without it")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"robot": args.robot, "controller": args.controller, "config": spec.config_path,
                   "robot_profile": profile.label, "friction_compensation": compensation,
                   "summary": summary, "seeds": [r.to_dict() for r in results], "wall_time_s": elapsed}
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if args.plot:
        from mcpilco_core.plant import DoublePendulum
        from mcpilco_core.plotting import plot_evaluation

        first = results[0]
        plot_evaluation(first.trajectory, DoublePendulum(config.plant), args.plot, windows=first.windows,
                        title=f"{args.robot} / {args.controller} / seed {first.seed}: score {first.score:.3f}")
        print(f"wrote {args.plot}")
    return 0


# --------------------------------------------------------------------------------------------------
# roa


def _add_roa(subparsers) -> None:
    p = subparsers.add_parser("roa", help="estimate (and cache) the LQR's region of attraction")
    p.add_argument("--robot", choices=ROBOTS, required=True)
    p.add_argument("--config", type=Path)
    p.add_argument("--recompute", action="store_true", help="ignore the cache")
    p.set_defaults(func=_run_roa)


def _run_roa(args: argparse.Namespace) -> int:
    from mcpilco_core.config import load_robot_config
    from mcpilco_core.control import configured_lqr, lqr_plant, region_of_attraction
    from mcpilco_core.control.roa import cache_paths
    from mcpilco_core.evaluation import config_path_for

    config = load_robot_config(config_path_for(args.robot, args.config))
    plant = lqr_plant(config)
    design = configured_lqr(plant, config)
    if args.recompute:
        for path in cache_paths(config):
            path.unlink(missing_ok=True)
    estimate = region_of_attraction(config, plant, design)
    print(f"{config.robot}: rho = {estimate.rho:.4f} ({estimate.failures} of {estimate.samples} sampled "
          f"states not stabilised{'; lower bound, raise roa.rho_max' if estimate.saturated else ''})")
    return 0


def register(subparsers) -> None:
    _add_evaluate(subparsers)
    _add_roa(subparsers)


# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcpilco", description="MC-PILCO global control of the RealAIGym "
                                                                 "double pendulum (pendubot / acrobot).")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    for module in (learning_cli, retrain, hw_check, demo, sim_session):
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, PolicyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
