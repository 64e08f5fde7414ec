"""Does choosing the trial by the run's own model (``mcpilco select``, no robot time) ship better policies than
shipping the last trial? For each run: the selected trial and the last one, both scored with the protocol on the
run's own robot config and robot profile.

    python benchmarks/bench_selection.py runs/pendubot_u6 runs/acrobot_u6_catch --seeds 10 11 12 13 14 15 16 17 18 19

Use seeds nobody looked at while choosing anything (the selection itself sees no protocol run at all).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.evaluation import ControllerSpec, evaluate_seeds  # noqa: E402
from mcpilco_core.learning.runs import RunDirectory  # noqa: E402
from mcpilco_core.learning.selection import select_policy  # noqa: E402


def score(run: RunDirectory, trial: int, profile: str, seeds: list[int], jobs: int) -> float:
    spec = ControllerSpec(str(run.root / "robot_config.yaml"), str(run.trial_path(trial) / "policy.npz"))
    return float(np.mean([r.score for r in evaluate_seeds(spec, seeds, jobs=jobs, profile=profile)]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10, 20)))
    parser.add_argument("--particles", type=int, default=600)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    print("| run | robot profile | trials | last trial: score | model's choice: trial, score |")
    print("|---|---|---|---|---|")
    for root in args.runs:
        run = RunDirectory(root)
        profile = run.load_config().robot_profile
        selection = select_policy(root, args.particles)
        last = max(selection.costs)
        last_score = score(run, last, profile, args.seeds, args.jobs)
        chosen = selection.best
        chosen_score = last_score if chosen == last else score(run, chosen, profile, args.seeds, args.jobs)
        print(f"| {root} | {profile} | {last + 1} | {last}: {last_score:.3f} | {chosen}: {chosen_score:.3f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
