"""The catch against the LQR, from the states where a policy hands over (issue 12: the acrobot's catch).

    python benchmarks/bench_catch.py --robot acrobot --controller policies/acrobot.npz --seeds 200 201 202 203 204 205

1. Runs the protocol with ``--config`` (the LQR alone in the band) and records every state where the supervisor
   switched from the policy to the balancing band.
2. From each of those states, 3 s on ``--robot-profile`` with the band's controller always in charge: the LQR
   alone, then the catch of ``--catch-config`` (caught = within 0.2 / 0.3 rad of upright at the end).
3. The plans' computing time (this machine, while the protocol runs with the catch): median, 99th percentile and
   maximum, against the plan's period, which each plan must fit in.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import RobotConfig, load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.control.catch import CatchController  # noqa: E402
from mcpilco_core.evaluation import evaluate_seed  # noqa: E402
from mcpilco_core.plant import wrap_state  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402
from mcpilco_core.simulation import drive, load_robot_profile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class HandOvers:
    """Wraps a supervisor and keeps the states where it went from ``policy`` to ``lqr`` (the band)."""

    def __init__(self, supervisor) -> None:
        self.supervisor = supervisor
        self.states: list[np.ndarray] = []
        self._last = "idle"

    @property
    def mode(self) -> str:
        return self.supervisor.mode

    def reset(self) -> None:
        self.supervisor.reset()
        self._last = "idle"

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        u = self.supervisor.step(x, t)
        if self.supervisor.mode == "lqr" and self._last == "policy":
            self.states.append(np.array(x, dtype=np.float64))
        self._last = self.supervisor.mode
        return u


def always_in_band(config: RobotConfig, rho: float) -> RobotConfig:
    roa = dataclasses.replace(config.roa, rho=rho, enter_fraction=1000.0, exit_fraction=1000.0)
    return dataclasses.replace(config, roa=roa)


def caught_fraction(config: RobotConfig, profile: str, starts: list[np.ndarray]) -> float:
    caught = 0
    for i, x0 in enumerate(starts):
        supervisor = build_controller(config)
        trajectory = drive(load_robot_profile(profile).robot(config, i, x0), supervisor, int(round(3.0 / 0.002)))
        error = wrap_state(trajectory.x[-1]) - supervisor.design.goal
        caught += bool(np.isfinite(error).all() and abs(error[0]) < 0.2 and abs(error[1]) < 0.3)
    return caught / max(len(starts), 1)


def plan_times(config: RobotConfig, policy, profile: str, seed: int) -> np.ndarray:
    """Seconds per plan while the protocol runs once with the catch (wall clock of this machine)."""
    times: list[float] = []
    solve = CatchController._solve

    def timed(self: CatchController, predicted: tuple) -> None:
        start = time.perf_counter()
        solve(self, predicted)
        times.append(time.perf_counter() - start)

    CatchController._solve = timed
    try:
        evaluate_seed(build_controller(config, policy), config, seed, keep_trajectory=False, profile=profile)
    finally:
        CatchController._solve = solve
    return np.array(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robot", default="acrobot", choices=("pendubot", "acrobot"))
    parser.add_argument("--config", default=None, help="robot config of the hand-overs (default config/<robot>.yaml)")
    parser.add_argument("--catch-config", default=None,
                        help="robot config with the catch (default config/<robot>_catch.yaml)")
    parser.add_argument("--controller", default=None, help="policy file (default policies/<robot>.npz)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[200, 201, 202, 203, 204, 205])
    parser.add_argument("--robot-profile", default="nominal")
    args = parser.parse_args()
    config = load_robot_config(args.config or REPO / "config" / f"{args.robot}.yaml")
    with_catch = load_robot_config(args.catch_config or REPO / "config" / f"{args.robot}_catch.yaml")
    policy = load_policy(args.controller or REPO / "policies" / f"{args.robot}.npz", robot=args.robot,
                         torque_limit=config.torque_limit)
    watcher = HandOvers(build_controller(config, policy))
    for seed in args.seeds:
        evaluate_seed(watcher, config, seed, keep_trajectory=False, profile=args.robot_profile)
    rho = watcher.supervisor.rho
    levels = [float(watcher.supervisor.design.cost_to_go(wrap_state(x))) / rho for x in watcher.states]
    print(f"{len(watcher.states)} hand-overs on seeds {args.seeds} ({args.robot_profile}); V / rho "
          f"{np.min(levels):.1f}-{np.max(levels):.1f}")
    print("| band's controller (3 s, always in charge) | caught |")
    print("|---|---|")
    for label, cfg in (("LQR alone", config), ("catch", with_catch)):
        rate = caught_fraction(always_in_band(cfg, rho), args.robot_profile, watcher.states)
        print(f"| {label} ({Path(cfg.source).name}) | {rate:.2f} |")
    times = plan_times(with_catch, policy, args.robot_profile, args.seeds[0]) * 1e3
    print(f"\nplans on seed {args.seeds[0]}: {len(times)}, median {np.median(times):.1f} ms, 99th percentile "
          f"{np.percentile(times, 99):.1f} ms, max {times.max():.1f} ms (period {with_catch.catch.period * 1e3:g} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
