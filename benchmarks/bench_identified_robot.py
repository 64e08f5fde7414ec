"""What the learner identifies about the robot from a run's recorded trials, against the simulated robot's truth.

For each run (``mcpilco train --out`` or ``mcpilco session --out``), the GP prior's friction as ``gp.identify``
fitted it (20 ms transitions between measured states; from the newest model) next to the robot identified at the
state rate (learning/identified_robot.py: friction, rotor inertia, sensor delay, motor lag, noise), and the truth
of the robot profile the run learnt on:

    python benchmarks/bench_identified_robot.py runs/offline_s0 runs/session_s0 [--trials 0 3 11] [--profile P]

``--trials K ...``: identify from trials 0..K only (as the learner did after trial K), one row per K.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.learning.identified_robot import identify_robot  # noqa: E402
from mcpilco_core.learning.runs import run_state_recordings  # noqa: E402
from mcpilco_core.simulation import load_robot_profile  # noqa: E402


def gp_prior_of(root: Path) -> list | None:
    """b1, b2, cf1, cf2, Ir of the newest model's GP prior (``gp.identify``), or None."""
    models = sorted((root / "retrain" / "models").glob("model_*.npz")) or sorted(root.glob("trials/*/model.npz"))
    if not models:
        return None
    with np.load(models[-1]) as arrays:
        return arrays["prior_plant_b_cf_Ir"].tolist() if "prior_plant_b_cf_Ir" in arrays.files else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--trials", type=int, nargs="*", default=None, help="identify from trials 0..K (each K)")
    parser.add_argument("--profile", default=None,
                        help="the robot profile the runs learnt on (default: each run's own train_config.yaml)")
    args = parser.parse_args()
    print("| run | from trials | what | b1, b2 (N m s/rad) | cf1, cf2 (N m) | Ir (kg m^2) | delay (steps) | r | "
          "velocity noise (rad/s) | torque noise (N m) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for root in args.runs:
        config, recordings = run_state_recordings(root)
        prior = gp_prior_of(root)
        profile = load_robot_profile(args.profile or config.robot_profile)
        truth = profile.plant_parameters(config.robot)
        delay = profile.imperfections(config.robot).delay_steps(config.robot.control_period)
        noise = profile.measurement_noise
        print(f"| {root.name} | – | the robot ({profile.label}) | {truth.b[0]:.4f}, {truth.b[1]:.4f} | "
              f"{truth.cf[0]:.3f}, {truth.cf[1]:.3f} | {truth.Ir:.2e} | {delay} | {profile.motor_responsiveness:g} | "
              f"{noise[2]:g}, {noise[3]:g} | {profile.torque_noise_actuated:g} |")
        if prior is not None:
            print(f"| {root.name} | all | GP prior (`gp.identify`, 20 ms) | {prior[0]:.4f}, {prior[1]:.4f} | "
                  f"{prior[2]:.3f}, {prior[3]:.3f} | {prior[4]:.2e} | – | – | – | – |")
        for last in args.trials if args.trials is not None else [len(recordings) - 1]:
            found = identify_robot(config.model_robot.plant, [r for r in recordings[:last + 1] if r is not None],
                                   config.robot.actuated_joint, config.robot.torque_limit)
            if found is None:
                print(f"| {root.name} | 0–{last} | too few usable windows | | | | | | | |")
                continue
            p, n = found.plant, found.measurement_noise
            print(f"| {root.name} | 0–{last} | state rate (`gp.identify_robot`) | {p.b[0]:.4f}, {p.b[1]:.4f} | "
                  f"{p.cf[0]:.3f}, {p.cf[1]:.3f} | {p.Ir:.2e} | {found.delay_steps} | "
                  f"{found.motor_responsiveness:.3f} | {n[2]:.3f}, {n[3]:.3f} | {found.torque_noise:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
