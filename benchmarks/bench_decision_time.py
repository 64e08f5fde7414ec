"""What one decision of the opt-in selection costs on this computer, every decision timed (issue 15).

Why: the selection is real time only when a decision's simulations fit in its ``lead``. ``bench_policy_selection.py
--workers N`` runs the protocol paced on the wall clock and counts the late decisions, but it can time only the
decisions that came in time. This times every decision, from a fixed set of states (on the way up, low, half way,
spinning), each started afresh and waited for: in this process (as the evaluator computes them) and in ``--workers``
processes (as the ROS controller node does), so two code versions or two computers compare on the same work.

    python benchmarks/bench_decision_time.py --config config/acrobot_dither_select_phases.yaml \\
        --controller policies/acrobot_hardware_proxy_prior_catch.npz --workers 2 --repeats 2

Units: ms of wall time. Needs nothing but the config and the policy (no robot time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402

STATES = ((np.pi - 0.3, 0.5, 1.0, -1.0), (0.4, -0.2, 0.0, 0.0), (2.2, 0.4, 3.0, -1.0), (1.0, 1.0, 2.0, 2.0))
GAP = 100.0   # s between the states' times: each one is a fresh start (a decision at once)


def decision_times(config_path: str, policy_path: str, workers: int, repeats: int = 1) -> list[float]:
    """Wall time (s) of each decision from :data:`STATES`, ``repeats`` times over, computed in ``workers``
    processes (0: in this one)."""
    config = load_robot_config(config_path)
    policy = load_policy(policy_path, robot=config.robot, torque_limit=config.torque_limit)
    supervisor = build_controller(config, policy)
    if supervisor.selection is None:
        raise SystemExit(f"{config_path}: no selection (selection.bank is empty and dither_phases is 1)")
    times = []
    try:
        supervisor.start_selection_workers(workers, wait=True)
        for r in range(repeats):
            for i, x in enumerate(STATES):
                supervisor.step(np.array(x), GAP * (i + len(STATES) * r))
                start = time.perf_counter()
                supervisor.selection.finish()
                times.append(time.perf_counter() - start)
    finally:
        supervisor.close()
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--controller", required=True, help="the loaded policy (candidate 0)")
    parser.add_argument("--workers", type=int, nargs="*", default=[2], help="worker counts besides 0 (in the loop)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    print("| workers | each decision's wall time (ms) | min / median / max | sum |")
    print("|---|---|---|---|")
    for workers in (0, *args.workers):
        ms = [1e3 * t for t in decision_times(args.config, args.controller, workers, args.repeats)]
        print(f"| {workers} | {', '.join(f'{t:.0f}' for t in ms)} | {min(ms):.0f} / {np.median(ms):.0f} / "
              f"{max(ms):.0f} | {sum(ms):.0f} |", flush=True)


if __name__ == "__main__":
    main()
