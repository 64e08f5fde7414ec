"""Where the time goes after each disturbance: per reset window, the time from the hand-over to above the line,
to *staying* above it (caught, by whichever controller) and to the balancing controller's mode, and the seconds
the disturbance cost below the line; which hand-over states fail.

    python benchmarks/bench_recovery.py --robot pendubot --controller policies/pendubot.npz --seeds 0 1 2 3 4 \
        --plot docs/img/pendubot_recoveries.png
    python benchmarks/bench_recovery.py --robot pendubot --config config/pendubot_dither.yaml \
        --controller policies/pendubot_hardware_proxy.npz --robot-profile hardware_proxy

Prints a summary table (markdown) and the slowest / failed recoveries with their hand-over states; ``--plot`` draws
the hand-over states coloured by the time to stay above the line, and the distributions of the times.
Every 0.1 s saved per disturbance is worth 15 x 0.1 / 60 = 0.025 of score. The table also splits the first arrivals:
the fraction whose first pass above the line came within the LQR's switching level (V < roa.enter_fraction rho, the
true state), and the fraction that did and still fell below the line on that pass (dropped by the balance, or a
dip under the line while it catches: the time to caught tells which); the rest of the misses are the swing-up's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.control import load_controller  # noqa: E402
from mcpilco_core.evaluation import (  # noqa: E402
    ControllerSpec,
    Recovery,
    arrivals_by_level,
    config_path_for,
    disturbance_recoveries,
    evaluate_seeds,
    roa_level,
    summarize_recoveries,
)
from mcpilco_core.plant import DoublePendulum  # noqa: E402


def summary_row(label: str, scores: list[float], recoveries: list[Recovery], enter_level: float | None = None) -> str:
    s = summarize_recoveries(recoveries, enter_level)
    return (f"| {label} | {np.mean(scores):.3f} | {s['n']} | {s['caught']:.2f} | {s['caught_on_first_arrival']:.2f} | "
            f"{s['first_pass_in_balance']:.2f} | {s['first_pass_lost_in_balance']:.2f} | "
            f"{s['passes']:.2f} | {s['time_to_line']:.2f} | {s['time_to_stay']:.2f} | {s['time_to_lqr']:.2f} | "
            f"{s['below_line']:.2f} |")


def plot(recoveries: list[Recovery], title: str, path: Path, enter_level: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_states, ax_times, ax_levels) = plt.subplots(1, 3, figsize=(16, 4.5))
    x0 = np.array([r.handover_state for r in recoveries])
    stay = np.array([r.time_to_stay for r in recoveries])
    ok = np.isfinite(stay)
    sc = ax_states.scatter(x0[ok, 0], x0[ok, 1], c=stay[ok], cmap="viridis", s=18, vmin=0, vmax=max(3.0, 1e-3))
    ax_states.scatter(x0[~ok, 0], x0[~ok, 1], marker="x", color="red", s=30, label="never stayed above the line")
    fig.colorbar(sc, ax=ax_states, label="time to stay above the line (s)")
    ax_states.set_xlabel("q1 at hand-over (rad)")
    ax_states.set_ylabel("q2 at hand-over (rad)")
    ax_states.set_xlim(-np.pi, np.pi)
    ax_states.set_ylim(-np.pi, np.pi)
    ax_states.legend(loc="lower right", fontsize=8)
    bins = np.linspace(0.0, 4.0, 41)
    for name, label in (("time_to_line", "to the line"), ("time_to_stay", "to staying above (caught)"),
                        ("below_line", "below the line, window included")):
        values = np.array([getattr(r, name) for r in recoveries])
        ax_times.hist(values[np.isfinite(values)], bins=bins, histtype="step", label=label)
    ax_times.set_xlabel("s after the hand-over")
    ax_times.set_ylabel("disturbances")
    ax_times.legend(fontsize=8)
    plot_first_pass_levels(ax_levels, recoveries, enter_level)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def plot_first_pass_levels(ax, recoveries: list[Recovery], enter_level: float) -> None:
    """Histogram of the first pass's least V/rho (log scale), caught on it or not, with the switching level: left of
    the line and not caught on it fell below the line in the balance's hands (dropped, or a dip while caught),
    right of it the swing-up missed."""
    levels = np.array([r.first_pass_level for r in recoveries], dtype=float)
    first = np.array([r.caught_on_first_arrival for r in recoveries])
    finite = np.isfinite(levels)
    floor = 1e-2                                  # V/rho below this is drawn at it (a log axis has no 0)
    bins = np.logspace(np.log10(floor), 4, 31)
    for mask, label in ((first, "caught on its first arrival"), (~first, "not caught on it")):
        ax.hist(np.clip(levels[finite & mask], floor, bins[-1]), bins=bins, histtype="step", label=label)
    ax.axvline(enter_level, color="black", linestyle="--", label=f"switching level ({enter_level:g} rho)")
    ax.set_xscale("log")
    ax.set_xlabel("least V/rho over the first pass above the line")
    ax.set_ylabel(f"disturbances ({np.count_nonzero(~finite)} never above the line)")
    ax.legend(fontsize=8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robot", required=True, choices=["pendubot", "acrobot"])
    parser.add_argument("--config", default=None, help="robot config (default: the bundled config/<robot>.yaml)")
    parser.add_argument("--controller", required=True, help="'lqr' or a policy file")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--robot-profile", default="nominal")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--worst", type=int, default=10, help="list this many slowest / failed recoveries")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    config_path = config_path_for(args.robot, args.config)
    config = load_robot_config(config_path)
    plant = DoublePendulum(config.plant)
    balance = load_controller(config_path)              # the LQR and its rho, as the supervisor switches on them
    level_of = roa_level(balance.design.S, balance.design.goal, balance.rho)
    results = evaluate_seeds(ControllerSpec(config_path, args.controller), args.seeds, jobs=args.jobs,
                             keep_trajectory=True, profile=args.robot_profile)
    recoveries = [r for result in results for r in disturbance_recoveries(result, plant, level_of)]
    label = f"{args.robot} / {Path(args.controller).name} / {args.robot_profile}"
    print("| controller | score | disturbances | caught | caught on the first arrival | first arrival within the "
          f"LQR's level ({config.roa.enter_fraction:g} rho) | ... and not caught on it | passes above the line "
          "(caught ones) | to line (s) | to caught (s) | to LQR (s) | below line per disturbance (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(summary_row(label, [r.score for r in results], recoveries, config.roa.enter_fraction))
    print("\nfirst arrivals by how close they came (medians; energy above the upright's at the closest state):")
    print("| first pass came | share | energy (J) | came at (s, to line) | caught | to caught (s) | LQR entries |")
    print("|---|---|---|---|---|---|---|")
    for g in arrivals_by_level(recoveries, config.roa.enter_fraction):
        print(f"| {g['group']} | {g['share']:.2f} | {g['energy']:+.2f} | {g['time_to_line']:.2f} | {g['caught']:.2f} | "
              f"{g['time_to_stay']:.2f} | {g['lqr_entries']:.1f} |")
    slow = sorted(recoveries, key=lambda r: -np.inf if not r.caught else -r.time_to_stay)[:args.worst]
    print("\nslowest / failed recoveries (hand-over state q1, q2 wrapped; rad, rad/s):")
    for r in slow:
        q1, q2, dq1, dq2 = r.handover_state
        print(f"  seed {r.seed:3d} #{r.index:2d} t {r.handover_time:5.2f}: x0 ({q1:+.2f}, {q2:+.2f}, {dq1:+6.2f}, "
              f"{dq2:+6.2f})  to line {r.time_to_line:5.2f}  to caught {r.time_to_stay:5.2f}  of {r.length:5.2f} s")
    if args.plot is not None:
        plot(recoveries, label, args.plot, config.roa.enter_fraction)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
