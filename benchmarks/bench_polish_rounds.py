"""Does each round a polish keeps gain on seeds nobody chose on? For each ``mcpilco polish --rounds`` folder: the
policy the rounds hold at the start of every round (round k's start: the last round kept before it), and at the end
(OUT/policy.npz, when the rounds finished), scored with the protocol on report seeds; beside each, the round's own
judge (start -> kept, on the seeds its snapshot was picked on) and, with ``--confirm-seeds``, its confirming seeds.

    python benchmarks/bench_polish_rounds.py runs/R/fresh8_more runs/R/confirm --seeds $(seq -s ' ' 0 19) \
        --plot docs/img/acrobot_polish_rounds.png

The robot config is the run's (FOLDER/../robot_config.yaml) unless ``--robot-config`` names one. A stopped-by-hand
folder (no OUT/polish.json) is read from its rounds' own reports. Use report seeds: nothing may be chosen on them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.evaluation import ControllerSpec, evaluate_seeds  # noqa: E402
from mcpilco_core.plotting import pyplot, save_figure  # noqa: E402


def round_reports(folder: Path) -> list[dict]:
    """Every round's polish.json in ``folder`` (round_K, K from the polish's first round), in order, with its round
    number; the rounds' rows of OUT/polish.json (kept, confirming scores) merged in when the rounds finished."""
    rounds = sorted(folder.glob("round_*/polish.json"), key=lambda p: int(p.parent.name.split("_")[1]))
    reports = [{**json.loads(p.read_text()), "round": int(p.parent.name.split("_")[1])} for p in rounds]
    summary = folder / "polish.json"
    rows = json.loads(summary.read_text()).get("rounds", []) if summary.is_file() else []
    for report, row in zip(reports, rows):
        report["row"] = row
    return reports


def located(path: str, folder: Path) -> Path:
    """``path`` as recorded (relative to where the polish ran), found from ``folder`` or one of its parents."""
    for base in (Path.cwd(), folder, *folder.resolve().parents):
        if (base / path).is_file():
            return base / path
    raise FileNotFoundError(f"{folder}: the round's start {path} is not found from there or its parents")


def chain(folder: Path) -> list[Path]:
    """The policy file held at the start of each round, then at the end when the rounds finished."""
    points = [located(r["source_policy"], folder) for r in round_reports(folder)]
    if (folder / "polish.json").is_file():
        points.append(folder / "policy.npz")
    return points


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--robot-config", type=Path, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for folder in args.folders:
        config = args.robot_config or folder.parent / "robot_config.yaml"
        cache: dict[Path, float] = {}
        print(f"\n{folder} (robot config {config}; seeds {args.seeds[0]}-{args.seeds[-1]})")
        print("| round | particle seed | judge: start -> kept | confirming: start -> kept | kept | report: start |")
        print("|---|---|---|---|---|---|")
        reports = round_reports(folder)
        scores, numbers = [], [r["round"] for r in reports]
        numbers.append(numbers[-1] + 1 if numbers else 1)           # the end
        for k, policy in enumerate(chain(folder)):
            if policy.resolve() not in cache:
                results = evaluate_seeds(ControllerSpec(str(config), str(policy)), args.seeds, jobs=args.jobs)
                cache[policy.resolve()] = float(np.mean([r.score for r in results]))
            scores.append(cache[policy.resolve()])
            if k < len(reports):
                report, row = reports[k], reports[k].get("row", {})
                snapshots = dict((int(s), v) for s, v in report["snapshots"])
                confirm = ("" if row.get("confirm_kept") is None else
                           f"{row['confirm_start']:.3f} -> {row['confirm_kept']:.3f}")
                print(f"| {report['round']} | {report['settings']['seed']} | {snapshots[0]:.3f} -> "
                      f"{snapshots[report['kept_step']]:.3f} | {confirm} | {row.get('kept', '?')} | "
                      f"{scores[-1]:.3f} |", flush=True)
            else:
                print(f"| end | | | | | {scores[-1]:.3f} |", flush=True)
        confirm = reports[0]["settings"].get("confirm_seeds", 0) if reports else 0
        ax.plot(numbers[:len(scores)], scores, ".-",
                label="/".join(folder.parts[-2:]) + (f" (confirm seeds {confirm})" if confirm else " (no confirm)"))
    if args.plot:
        ax.set(xlabel="round (its start; the last point: the end)", ylabel=f"protocol, mean of {len(args.seeds)} seeds",
               title="the policy the polish's rounds hold, on report seeds")
        ax.legend(fontsize=7)
        print(f"plot: {save_figure(fig, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
