"""What the GP learns: one-step prediction error of the prior alone vs the learned model, per joint, on trials the
model was not fitted on.

    python benchmarks/bench_model_error.py runs/pendubot_proxy [runs/other ...]
    python benchmarks/bench_model_error.py runs/a runs/b --on runs/c [runs/d ...]   # final models, other runs' trials

Trial k's model (trials/trial_k/model.npz) was fitted on trials 0..k-1 before trial k ran, so trial k's own data
(what its sensors measured, the reset window cut off) is held out for it. Prints, per run and trial, the RMS error
(rad/s) of the velocity change over one policy period for each joint: prior (the training config's prior model)
and learned (prior + GP mean). With ``--on``, each run's last model is scored instead on all trials of the runs
given there (recorded by other runs on the same robot: data none of the compared models was fitted on), so that
models of different settings compare on the same transitions.

A session works as a run (``mcpilco session --out``, or on the robot the trainer's ``run_dir``: the sessions its
newest retrain read): retrain i's model (``models/model_i.npz``) was fitted on the trials recorded before it
(``retrain.json``'s ``trials``), so the next trial is held out for it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.learning.model import DynamicsModel  # noqa: E402
from mcpilco_core.learning.runs import run_config, run_models, run_transitions, trial_transitions  # noqa: E402


def model_from(config, arrays: dict) -> DynamicsModel:
    model = DynamicsModel(config.model_robot, config.gp)
    model.load_arrays(arrays, "cpu")
    return model


def run_errors(root: Path) -> list[dict]:
    """Per model, its RMS one-step error (prior, learned; per joint, rad/s) on the trial recorded right after it."""
    config = run_config(root)
    trials = trial_transitions(root, config)
    rows = []
    for k, arrays in run_models(root, config):
        if k >= len(trials):
            continue                       # the newest model: no trial after it yet
        data = trials[k]
        errors = model_from(config, arrays).one_step_errors(data)
        rms = {name: np.sqrt(np.mean(e ** 2, axis=0)) for name, e in errors.items()}
        rows.append({"trial": k, "n": len(data), **{f"{name}_{j}": float(rms[name][j]) for name in rms
                                                    for j in range(2)}})
    return rows


def last_model_errors(root: Path, others: list[Path]) -> dict[str, np.ndarray]:
    """RMS error (per joint, rad/s) of the run's last model, prior and learned, on every trial of ``others``, and
    whether the model is delay-aware."""
    config = run_config(root)
    model = model_from(config, run_models(root, config)[-1][1])
    data = run_transitions(others[0], config)
    for other in others[1:]:
        data = data.concat(run_transitions(other, config))
    errors = model.one_step_errors(data)
    return {"n": len(data), "delay_aware": config.gp.delay_aware,
            **{name: np.sqrt(np.mean(e ** 2, axis=0)) for name, e in errors.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--on", type=Path, nargs="+", help="score the runs' last models on these runs' trials")
    args = parser.parse_args()
    if args.on:
        print(f"RMS one-step error of the velocity change (rad/s) of each run's last model on the trials of "
              f"{', '.join(str(p) for p in args.on)}")
        print("| run | gp.delay_aware | transitions | prior q1 | learned q1 | prior q2 | learned q2 |")
        print("|---|---|---|---|---|---|---|")
        for root in args.runs:
            e = last_model_errors(root, args.on)
            print(f"| {root} | {e['delay_aware']} | {e['n']} | {e['prior'][0]:.3f} | {e['learned'][0]:.3f} | "
                  f"{e['prior'][1]:.3f} | {e['learned'][1]:.3f} |")
        return 0
    for root in args.runs:
        config = run_config(root)
        print(f"\n{root} (robot {config.robot.robot}, robot profile {config.robot_profile}, prior "
              f"{config.model_robot.plant.name}): RMS one-step error of the velocity change (rad/s), held out")
        print("| trial | transitions | prior q1 | learned q1 | prior q2 | learned q2 |")
        print("|---|---|---|---|---|---|")
        for r in run_errors(root):
            print(f"| {r['trial']} | {r['n']} | {r['prior_0']:.3f} | {r['learned_0']:.3f} | {r['prior_1']:.3f} | "
                  f"{r['learned_1']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
