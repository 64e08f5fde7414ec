"""Does the balance dither's starting phase decide catches, and does the selection's model see which one will?

    python benchmarks/bench_dither_phase.py --robot acrobot --config config/acrobot_dither_select.yaml \
        --controller policies/acrobot_hardware_proxy.npz \
        --profile config/design_robots/acrobot_exploration_identified.yaml --seeds 200 201 202 203 204 205

The protocol runs on the robot of ``--profile`` with the loaded policy and the config's supervisor (its selection
off). From the state at the end of every reset window the robot is then run to the next window three times, each
seconds above the score's line counted: with the shake as configured; with it half a period on (its first push the
other way), with the same noise draws; and as configured with other noise draws. The first two say what the phase
is worth, the first and third what the noise alone moves (the better of two runs is always better than one). Last,
the config's selection model (its plant, step, lead, horizon; ``selection.dither_phases: 2``, no bank) predicts both
phases from the same state, and its pick (with the config's margin) is scored by the two robot runs. Units: s.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import RobotConfig, load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.evaluation import DT, Recovery, disturbance_recoveries, evaluate_seed  # noqa: E402
from mcpilco_core.plant import DoublePendulum  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402
from mcpilco_core.simulation import RobotProfile, drive, load_robot_profile, uptime  # noqa: E402

OTHER_NOISE = 7919   # added to a run's robot seed for the run with other noise draws


def with_selection(config: RobotConfig, phases: int) -> RobotConfig:
    """``config`` with its selection reduced to the loaded policy and ``phases`` dither phases (1 = off)."""
    return replace(config, selection=replace(config.selection, bank="", dither_phases=phases))


def time_above(config: RobotConfig, policy, profile: RobotProfile, robot_seed: int, x0: np.ndarray, steps: int,
               offset: float) -> float:
    """Seconds above the line (the protocol's count) in ``steps`` steps from ``x0``, the shake shifted by ``offset``
    s."""
    supervisor = build_controller(config, policy)
    supervisor.use_dither_offset(offset)
    traj = drive(profile.robot(config, robot_seed, x0), supervisor, steps, reset_controller=False)
    return uptime(traj.t, traj.x, DoublePendulum(config.plant))


def predicted(model: RobotConfig, policy, x0: np.ndarray) -> list[float]:
    """The selection model's seconds above the line for each phase, from ``x0`` (a decision as after a window)."""
    supervisor = build_controller(model, policy)
    supervisor.step(np.asarray(x0), 0.0)
    supervisor.selection.finish()
    return list(supervisor.selection.last_values)


def disturbances(config: RobotConfig, policy, profile: RobotProfile, seed: int,
                 windows: int | None = None) -> list[Recovery]:
    """The first ``windows`` (None = all) recoveries of the protocol run for ``seed``: hand-over state and length."""
    result = evaluate_seed(build_controller(config, policy), config, seed, profile=profile)
    return disturbance_recoveries(result, DoublePendulum(config.plant))[:windows]


def measure(config: RobotConfig, policy, profile: RobotProfile, seeds: list[int], windows: int | None = None,
            verbose: bool = False) -> np.ndarray:
    """Rows (configured, shifted, configured with other noise, predicted configured, predicted shifted) in s."""
    robot_config, model = with_selection(config, 1), with_selection(config, 2)
    half = 0.5 / config.dither.frequency
    rows = []
    for seed in seeds:
        for recovery in disturbances(robot_config, policy, profile, seed, windows):
            x0, steps = np.array(recovery.handover_state), int(round(recovery.length / DT))
            robot_seed = seed * 100 + recovery.index
            row = [time_above(robot_config, policy, profile, robot_seed, x0, steps, 0.0),
                   time_above(robot_config, policy, profile, robot_seed, x0, steps, half),
                   time_above(robot_config, policy, profile, robot_seed + OTHER_NOISE, x0, steps, 0.0),
                   *predicted(model, policy, x0)]
            rows.append(row)
            if verbose:
                print(seed, recovery.index, " ".join(f"{v:.2f}" for v in row), flush=True)
    return np.array(rows)


def summary(rows: np.ndarray, margin: float) -> dict[str, float]:
    """Mean seconds above the line per disturbance: each phase, the better of two, and the model's pick."""
    pick = rows[:, 4] > rows[:, 3] + margin
    return {"configured": rows[:, 0].mean(), "shifted": rows[:, 1].mean(),
            "better phase": rows[:, :2].max(axis=1).mean(),
            "better of two noise draws": rows[:, [0, 2]].max(axis=1).mean(),
            "the model's pick": np.where(pick, rows[:, 1], rows[:, 0]).mean(), "picked shifted": pick.mean()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--robot", default="acrobot")
    parser.add_argument("--config", type=Path, default=Path("config/acrobot_dither_select.yaml"))
    parser.add_argument("--controller", type=Path, default=Path("policies/acrobot_hardware_proxy.npz"))
    parser.add_argument("--profile", default="config/design_robots/acrobot_exploration_identified.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[200, 201])
    parser.add_argument("--verbose", action="store_true", help="a line per disturbance")
    args = parser.parse_args()
    config = load_robot_config(args.config)
    if config.dither.amplitude <= 0.0:
        parser.error(f"{args.config} has no balance dither (dither.amplitude 0)")
    policy = load_policy(args.controller, robot=args.robot, torque_limit=config.torque_limit)
    rows = measure(config, policy, load_robot_profile(args.profile), args.seeds, verbose=args.verbose)
    print(f"{len(rows)} disturbances; seconds above the line per disturbance:")
    for name, value in summary(rows, config.selection.margin).items():
        print(f"  {name:28s} {value:.3f}")


if __name__ == "__main__":
    main()
