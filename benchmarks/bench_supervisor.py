"""What the supervisor around a policy can change: protocol scores of one policy with other LQR designs and
switching levels, or other damping settings (selection seeds: never score a choice on the seeds you report).

    python benchmarks/bench_supervisor.py --robot acrobot --controller policies/acrobot.npz --sweep lqr
    python benchmarks/bench_supervisor.py --robot acrobot --controller policies/acrobot.npz --sweep damping

``lqr``: Q's position and velocity weights scaled (x0.1 / 1 / 10), R 0.03 / 0.11 / 1.0, each with LQR
enter/exit at 2/3, 8/12 and 20/30 rho (rho estimated afresh for each design, no cache). ``damping``: speed-triggered
damping entering at 16 / 13 / 10 / 8 rad/s, leaving at 0.6 / 0.3 of that, gain 0.2 / 0.5 / 1.0 N m s/rad.
The first row is the robot config as it is.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import RobotConfig, load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.evaluation import config_path_for, evaluate_seed  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402

LQR_DESIGNS = [(1, 1, 0.11), (1, 1, 1.0), (1, 1, 0.03), (10, 1, 0.11), (1, 10, 0.11), (1, 0.1, 0.11),
               (10, 10, 0.11), (0.1, 0.1, 0.11)]          # (Q position scale, Q velocity scale, R)
SWITCHING = [(2.0, 3.0), (8.0, 12.0), (20.0, 30.0)]      # (enter, exit) fractions of rho


def lqr_variant(base: RobotConfig, q_pos: float, q_vel: float, r: float, enter: float, leave: float) -> RobotConfig:
    q = tuple(float(v) for v in np.array(base.lqr.Q_diag) * [q_pos, q_pos, q_vel, q_vel])
    return dataclasses.replace(base, lqr=dataclasses.replace(base.lqr, Q_diag=q, R=r),
                               roa=dataclasses.replace(base.roa, enter_fraction=enter, exit_fraction=leave))


def damping_variant(base: RobotConfig, enter: float, leave: float, gain: float) -> RobotConfig:
    return dataclasses.replace(base, damping=dataclasses.replace(base.damping, enter_speed=enter, exit_speed=leave,
                                                                 gain=gain))


def score(job: tuple[RobotConfig, str, int, bool]) -> tuple[float, float, float]:
    config, policy_path, seed, cached = job
    policy = load_policy(policy_path, robot=config.robot, torque_limit=config.torque_limit)
    controller = build_controller(config, policy, use_roa_cache=cached)
    result = evaluate_seed(controller, config, seed, keep_trajectory=False)
    return result.score, controller.rho, result.mode_fractions.get("lqr", 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robot", required=True, choices=["pendubot", "acrobot"])
    parser.add_argument("--config", default=None)
    parser.add_argument("--controller", required=True, help="a policy file")
    parser.add_argument("--sweep", required=True, choices=["lqr", "damping"])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(100, 120)))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    base = load_robot_config(config_path_for(args.robot, args.config))
    rows: list[tuple[str, RobotConfig, bool]] = [("the robot config", base, True)]
    if args.sweep == "lqr":
        rows += [(f"Q x ({q_pos}, {q_vel}), R {r}, enter/exit {e}/{x} rho", lqr_variant(base, q_pos, q_vel, r, e, x),
                  False) for q_pos, q_vel, r in LQR_DESIGNS for e, x in SWITCHING]
    else:
        rows += [(f"damping {e}/{e * f:g} rad/s, gain {g}", damping_variant(base, e, e * f, g), True)
                 for e in (16.0, 13.0, 10.0, 8.0) for f in (0.6, 0.3) for g in (0.2, 0.5, 1.0)]
    print(f"{args.robot} / {args.controller} / seeds {args.seeds[0]}..{args.seeds[-1]} ({len(args.seeds)})")
    print("| variant | rho | score | LQR share |")
    print("|---|---|---|---|")
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for label, config, cached in rows:
            start = time.perf_counter()
            results = list(pool.map(score, [(config, args.controller, s, cached) for s in args.seeds]))
            scores = np.array([r[0] for r in results])
            print(f"| {label} | {results[0][1]:.3f} | {scores.mean():.3f} ± {scores.std():.3f} | "
                  f"{np.mean([r[2] for r in results]):.2f} |  ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
