"""How much of a 20 ms transition the torque-held prior cannot explain on a delayed robot: one-step velocity error
of physics predictions on a run's recorded trials, with the torque held over the period (what the GP's prior does)
and with the previous command acting for the identified sensor delay first (``delayed_velocities``).

    python benchmarks/bench_transition_delay.py runs/acrobot_proxy [runs/other ...] [--plant model_1.0]

A session works as a run (``mcpilco session --out``, or the trainer's ``run_dir``). Needs runs with
``gp.identify_robot`` (the newest model holds the robot identified at the state rate: its friction, rotor inertia,
delay and motor lag). Uses only what the trials recorded; ``--plant NAME`` adds a plant of config/plant_models.yaml
(a report: the simulated robot's own plant is not the learner's to read). The first transition of each trial is
left out (its previous command is the reset window's or none).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import load_plant_parameters  # noqa: E402
from mcpilco_core.learning.identification import identify_prior, predicted_velocities  # noqa: E402
from mcpilco_core.learning.identified_robot import delayed_velocities  # noqa: E402
from mcpilco_core.learning.model import DynamicsModel  # noqa: E402
from mcpilco_core.learning.runs import run_config, run_models, trial_transitions  # noqa: E402
from mcpilco_core.paths import config_dir  # noqa: E402
from mcpilco_core.recording.transitions import TransitionData  # noqa: E402


def recorded_transitions(root: Path, config) -> TransitionData:
    """Every trial's transitions but its first (its previous command is a reset window's or none), each with its
    previous command (``u_prev``)."""
    data = TransitionData.empty()
    for d in trial_transitions(root, config):
        data = data.concat(d.subset(np.arange(1, len(d))))
    return data


def rms(predicted: np.ndarray, data: TransitionData) -> np.ndarray:
    return np.sqrt(np.mean((predicted - data.x_next[:, 2:]) ** 2, axis=0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--plant", default=None, help="also a plant of config/plant_models.yaml (a report)")
    args = parser.parse_args(argv)
    for root in args.runs:
        config = run_config(root)
        model = DynamicsModel(config.model_robot, config.gp)
        model.load_arrays(run_models(root, config)[-1][1], "cpu")
        if model.robot is None:
            print(f"{root}: the run did not identify its robot (gp.identify_robot); skipped")
            continue
        robot, act, period = model.robot, config.robot.actuated_joint, config.robot.policy_period
        data = recorded_transitions(root, config)
        previous = data.u_prev
        plant, delay = identify_prior(model.base_plant, data, period, act, fit_delay=True,
                                      rng=np.random.default_rng(0))
        rows = [("the GP's prior (gp.identify's plant), torque held", predicted_velocities(model.config.plant, data,
                                                                                          period, act)),
                ("the identified robot's plant, torque held", predicted_velocities(robot.plant, data, period, act)),
                (f"the identified robot, previous command for its {robot.delay_steps} delay steps, r "
                 f"{robot.motor_responsiveness:.2f}", robot.transition_velocities(data.x, data.u, previous, period,
                                                                                  act)),
                (f"the 20 ms fit with the command delay (gp.delay_aware): a = {delay:.3f} of the period, u + a "
                 f"(u_prev - u) held", predicted_velocities(plant, data, period, act, delay))]
        if args.plant:
            plant = load_plant_parameters(config_dir() / "plant_models.yaml", args.plant)
            rows += [(f"{args.plant}, torque held (a report)", predicted_velocities(plant, data, period, act)),
                     (f"{args.plant}, with the identified delay and lag (a report)",
                      delayed_velocities(plant, data.x, data.u, previous, period, robot.dt, act, robot.delay_steps,
                                         robot.motor_responsiveness))]
        print(f"\n{root} ({config.robot.robot}, robot profile {config.robot_profile}): RMS one-step error of the "
              f"velocity after {period * 1e3:g} ms (rad/s), {len(data.u)} recorded transitions")
        print("| prediction | q1 | q2 |")
        print("|---|---|---|")
        for name, predicted in rows:
            e = rms(predicted, data)
            print(f"| {name} | {e[0]:.3f} | {e[1]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
