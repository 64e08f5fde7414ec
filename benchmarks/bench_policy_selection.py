"""The opt-in policy selection (robot config section ``selection``): its score and what it costs each control step.

    python benchmarks/bench_policy_selection.py --robot acrobot --config config/acrobot_select.yaml \
        --controller policies/acrobot.npz --seeds 1000 1001 [--set selection.step=0.01,selection.lead=0.1 ...] \
        [--robot-profile hardware_proxy] [--workers 2]

For the config as it is and for each ``--set`` variant (comma-separated ``section.key=value``, validated as the file
would be), the protocol on each seed with the controller stepped as the ROS controller node steps it: ``step`` for
the command, then ``finish_step`` (a decision's share of work) after it. Prints the mean score, the decisions and
switches per run, and the computing time per control step of ``step + finish_step`` on this machine (median, 99th
percentile, maximum), against the control period every step must fit in; the candidates' simulations (a decision's
work) are spread evenly over its lead, so the maximum is what a decision costs a step.

With ``--workers N`` the decisions are computed in N worker processes (``selection.workers``) as the ROS controller
node computes them: the protocol runs paced at the control period on the wall clock (a 2 ms step every 2 ms, so a
60 s seed takes a minute), a decision not ready when due is dropped and counted as late, and the table's time per
step is the control loop's own (sending a decision, collecting its answers).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import load_robot_config, robot_config_from_mapping  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.evaluation import evaluate_seed  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402


class Timed:
    """The supervisor stepped as the controller node steps it, each control step's computing time kept (s)."""

    def __init__(self, supervisor, pace: float | None = None) -> None:
        self.supervisor = supervisor
        self.times: list[float] = []
        self.switches = 0
        self.pace = pace            # paced on the wall clock at the robot's time (None: as fast as it computes)
        self._next = None
        self.decision_times: list[float] = []   # s on the wall clock from a decision's start to its answers (workers)
        self._decision: tuple[int, float, int] | None = None    # (number, wall start, late count then)

    @property
    def mode(self) -> str:
        return self.supervisor.mode

    def reset(self) -> None:
        self.supervisor.reset()

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        if self.pace is not None:   # each state arrives when the robot's clock says (reset windows included)
            now = time.perf_counter()
            if self._next is None:
                self._next = now - t
            if self._next + t > now:
                time.sleep(self._next + t - now)
        start = time.perf_counter()
        before = self.supervisor.selected
        u = self.supervisor.step(x, t)
        self.switches += self.supervisor.selected != before
        if self.supervisor.plan_pending:
            self.supervisor.finish_step()
        self.times.append(time.perf_counter() - start)
        self._time_decision(start)
        return u

    def _time_decision(self, now: float) -> None:
        """With workers: the wall time from a decision's start until all its answers are in (checked once per step;
        one applied in the step its answers came is timed to that step's end; a dropped one is not timed)."""
        selection = self.supervisor.selection
        if selection is None or not selection.worker_count:
            return
        if self._decision is not None and self._decision[0] != selection.decisions or (
                self._decision is not None and (selection.ready or not selection.pending)):
            number, started, late = self._decision
            on_time = selection.ready if number == selection.decisions and selection.pending else \
                selection.late_decisions == late
            if on_time:
                self.decision_times.append(time.perf_counter() - started)
            self._decision = None
        if selection.pending and not selection.ready and self._decision is None:
            self._decision = (selection.decisions, now, selection.late_decisions)


def variant(path: Path, assignments: str):
    """The robot config of ``path`` with ``assignments`` (``a.b=v,...``) applied, validated as the file would be."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    params = data["/**"]["ros__parameters"]
    for item in filter(None, assignments.split(",")):
        key, value = item.split("=", 1)
        *parents, leaf = key.strip().split(".")
        node = params
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = yaml.safe_load(value)
    return robot_config_from_mapping(params, path, path.parent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--robot", default="acrobot")
    parser.add_argument("--config", type=Path, default=Path("config/acrobot_select.yaml"))
    parser.add_argument("--controller", type=Path, default=Path("policies/acrobot.npz"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1000, 1001])
    parser.add_argument("--set", dest="variants", action="append", default=[],
                        help="a variant of the config: section.key=value[,section.key=value...] (repeatable)")
    parser.add_argument("--robot-profile", default=None,
                        help="the simulated robot (a profile name or file, as mcpilco evaluate takes; default nominal)")
    parser.add_argument("--workers", type=int, default=0,
                        help="compute the decisions in this many worker processes, paced in real time (0: in the loop)")
    args = parser.parse_args()
    print("| config | score | decisions / switches per run | step + finish_step per control step: median / "
          "99th percentile / max (ms) | late decisions per run | a decision's wall time with workers: median / max "
          "(ms), of those that came in time (bench_decision_time.py times every one) |")
    print("|---|---|---|---|---|---|")
    for assignments in ["", *args.variants]:
        config = variant(args.config, assignments) if assignments else load_robot_config(args.config)
        policy = load_policy(args.controller, robot=args.robot, torque_limit=config.torque_limit)
        scores, decisions, switches, times, late, decision_times = [], [], [], [], [], []
        for seed in args.seeds:
            supervisor = build_controller(config, policy)
            supervisor.start_selection_workers(args.workers, wait=False)
            timed = Timed(supervisor, config.control_period if args.workers else None)
            gc.freeze()        # as the ROS nodes do after their setup (run_node): no full collection walks it
            scores.append(evaluate_seed(timed, config, seed, keep_trajectory=False,
                                        profile=args.robot_profile).score)
            supervisor.close()
            selection = supervisor.selection
            decisions.append(selection.decisions if selection is not None else 0)
            late.append(selection.late_decisions if selection is not None else 0)
            if selection is not None and selection.failure:
                sys.exit(f"selection workers failed: {selection.failure}")
            switches.append(timed.switches)
            times.extend(timed.times)
            decision_times.extend(timed.decision_times)
        ms = np.asarray(times) * 1e3
        wall = (f"{np.median(decision_times) * 1e3:.0f} / {np.max(decision_times) * 1e3:.0f} (lead "
                f"{config.selection.lead * 1e3:g}; {len(decision_times)} timed)" if decision_times else "-")
        print(f"| {assignments or args.config} | {np.mean(scores):.4f} | {np.mean(decisions):.0f} / "
              f"{np.mean(switches):.0f} | {np.median(ms):.3f} / {np.percentile(ms, 99):.2f} / {ms.max():.2f} "
              f"(period {config.control_period * 1e3:g}) | {np.mean(late):.1f} | {wall} |", flush=True)


if __name__ == "__main__":
    main()
