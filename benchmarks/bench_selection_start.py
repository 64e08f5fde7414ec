"""How far the opt-in selection's decisions start from the robot (issue 15): each decision's predicted start state
(the running option simulated over the lead from the measured state) against the simulated robot's true state at
the decision's due time, and at 2 ms steps before it.

Why: on a robot whose sensors are late, the measured state is the robot's state a delay ago. A selection that takes
it for the present one starts every candidate's simulation that much behind the robot: the errors at the due time
are then larger than against the true state a delay earlier. ``selection.predict_delay`` starts the decisions where
the robot is (docs/learner.md, "The dither's phase with the noisy finals, and the start predicted over the delay").
A diagnosis: it chooses nothing. No robot time (a simulated robot of any profile, e.g. a design robot).

    python benchmarks/bench_selection_start.py --config config/acrobot_dither_select_noisy.yaml \\
        --controller policies/acrobot_hardware_proxy_prior_catch.npz \\
        --robot-profile config/design_robots/acrobot_proxy_run_identified.yaml --seeds 1000

Units: rad, rad/s (angles wrapped to [-pi, pi)).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.evaluation import DURATION, evaluate_seed  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402

LAGS = (0, 1, 2, 3)     # 2 ms steps before the due time the true state is taken at


def start_errors(config_path: str, policy_path: str, profile: str, seed: int,
                 duration: float = DURATION) -> tuple[float, dict[int, np.ndarray]]:
    """One protocol run: its score and, per lag, the (decisions, 4) errors predicted start - true state."""
    config = load_robot_config(config_path)
    policy = load_policy(policy_path, robot=config.robot, torque_limit=config.torque_limit)
    supervisor = build_controller(config, policy)
    selection = supervisor.selection
    if selection is None:
        raise SystemExit(f"{config_path}: no selection (selection.bank is empty and dither_phases is 1)")
    starts: list[tuple[float, np.ndarray]] = []
    lead = selection._lead

    def recorded(state, x, t, command=(0.0, 0.0)):
        due = yield from lead(state, x, t, command)
        starts.append((due[1], np.array(due[0])))
        return due

    selection._lead = recorded
    result = evaluate_seed(supervisor, config, seed, duration=duration, profile=profile)
    trajectory = result.trajectory
    errors: dict[int, list[np.ndarray]] = {lag: [] for lag in LAGS}
    for t_due, x_due in starts:
        k = int(np.argmin(np.abs(trajectory.t - t_due)))
        if abs(trajectory.t[k] - t_due) > 1e-6 or k < max(LAGS):
            continue
        for lag in LAGS:
            error = x_due - trajectory.x[k - lag]
            error[:2] = (error[:2] + np.pi) % (2.0 * np.pi) - np.pi
            errors[lag].append(error)
    return result.score, {lag: np.array(values).reshape(-1, 4) for lag, values in errors.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="robot config with a selection")
    parser.add_argument("--controller", required=True, help="the loaded policy file (candidate 0)")
    parser.add_argument("--robot-profile", default="hardware_proxy")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1000])
    parser.add_argument("--duration", type=float, default=DURATION, help="s of protocol per seed")
    args = parser.parse_args()
    pooled: dict[int, list[np.ndarray]] = {lag: [] for lag in LAGS}
    for seed in args.seeds:
        score, errors = start_errors(args.config, args.controller, args.robot_profile, seed, args.duration)
        print(f"seed {seed}: score {score:.4f}, {len(errors[0])} decisions", flush=True)
        for lag in LAGS:
            pooled[lag].append(errors[lag])
    print("| true state at | median abs error q1, q2 (rad), dq1, dq2 (rad/s) | 90th percentile |")
    print("|---|---|---|")
    for lag in LAGS:
        values = np.abs(np.concatenate(pooled[lag]))
        median = ", ".join(f"{v:.4f}" for v in np.median(values, axis=0))
        p90 = ", ".join(f"{v:.3f}" for v in np.percentile(values, 90, axis=0))
        print(f"| due time - {2 * lag} ms | {median} | {p90} |")


if __name__ == "__main__":
    main()
