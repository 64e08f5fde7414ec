"""What the sensor delay costs a policy, and whether predicting the state over it wins that back.

    python benchmarks/bench_delay_prediction.py --robot acrobot --config config/acrobot.yaml \
        --controller policies/acrobot.npz --profile hardware_proxy_sensors --seeds 0 1 2 3 4 5 6 7 8 9

The protocol on the robot of ``--profile``, once with the supervisor as it is and once fed the state *predicted*
over the delay: the delayed measurement integrated ``--delay-steps`` control periods forward on ``--plant`` (a model
of a plant models file, ``FILE:NAME``; default the robot config's plant) with the torques applied since -- the
supervisor's own commands passed through the motor lag ``--responsiveness`` (what a Smith predictor does). After a
gap (a reset window, whose torques the controller never sees) the measurement is used as it is until the history
is full again. ``--lqr-only``: the policy keeps the measured state (what a learner trained on delayed states saw);
only the balance gets the prediction. Prints the mean score (and std) of each. Units: s, N m.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import RobotConfig, load_plant_parameters, load_robot_config  # noqa: E402
from mcpilco_core.control import Supervisor, build_controller  # noqa: E402
from mcpilco_core.evaluation import evaluate_seed  # noqa: E402
from mcpilco_core.plant import DoublePendulum  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402


class DelayPredicted:
    """``supervisor`` fed the state predicted ``steps`` control periods ahead of each measurement (module docstring)."""

    def __init__(self, supervisor: Supervisor, plant: DoublePendulum, steps: int, responsiveness: float,
                 control_period: float, lqr_only: bool = False) -> None:
        self.supervisor, self.plant, self.steps = supervisor, plant, steps
        self.responsiveness, self.dt, self.lqr_only = responsiveness, control_period, lqr_only
        self.last_prediction: np.ndarray | None = None
        self.reset()

    @property
    def mode(self) -> str:
        return self.supervisor.mode

    def reset(self) -> None:
        self.supervisor.reset()
        self._applied: deque = deque(maxlen=self.steps)   # torques applied over the last steps (N m), oldest first
        self._last_applied: tuple[float, float] | None = None
        self._last_t = -np.inf

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        if not 0.0 < t - self._last_t <= 1.5 * self.dt:    # the first state, or after a gap: torques unknown
            self._applied.clear()
            self._last_applied = None
        self._last_t = t
        predicted = tuple(float(v) for v in x)
        if self.steps > 0 and len(self._applied) == self.steps:
            for u in self._applied:
                predicted = self.plant.rk4_step_scalar(predicted, u, self.dt)
        self.last_prediction = np.array(predicted)
        seen = np.asarray(x, dtype=float) if self.lqr_only and self.supervisor.mode != "lqr" else self.last_prediction
        u = self.supervisor.step(seen, t)
        command = (float(u[0]), float(u[1]))
        last, r = self._last_applied, self.responsiveness
        applied = command if last is None else (last[0] + r * (command[0] - last[0]),
                                                last[1] + r * (command[1] - last[1]))
        self._last_applied = applied
        if self.steps > 0:
            self._applied.append(applied)
        return u


def prediction_plant(config: RobotConfig, name: str) -> DoublePendulum:
    """``FILE:NAME`` of a plant models file, or '' for the robot config's plant."""
    if not name:
        return DoublePendulum(config.plant)
    path, model = name.rsplit(":", 1)
    return DoublePendulum(load_plant_parameters(path, model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--robot", default="acrobot")
    parser.add_argument("--config", type=Path, default=Path("config/acrobot.yaml"))
    parser.add_argument("--controller", type=Path, default=Path("policies/acrobot.npz"))
    parser.add_argument("--profile", default="hardware_proxy_sensors")
    parser.add_argument("--plant", default="", help="FILE:NAME of the prediction's plant ('' = the config's)")
    parser.add_argument("--delay-steps", type=int, default=2, help="control periods the measurement is late")
    parser.add_argument("--responsiveness", type=float, default=0.9, help="motor lag r per control period")
    parser.add_argument("--lqr-only", action="store_true", help="the policy keeps the measured state")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    args = parser.parse_args()
    config = load_robot_config(args.config)
    policy = load_policy(args.controller, robot=args.robot, torque_limit=config.torque_limit)
    plant = prediction_plant(config, args.plant)
    runs = (("measured state", 0), (f"state predicted {args.delay_steps} periods ahead", args.delay_steps))
    for label, steps in runs:
        scores = [evaluate_seed(DelayPredicted(build_controller(config, policy), plant, steps, args.responsiveness,
                                               config.control_period, args.lqr_only),
                                config, seed, profile=args.profile, keep_trajectory=False).score
                  for seed in args.seeds]
        print(f"{label:40s} {np.mean(scores):.4f} +- {np.std(scores):.4f} ({len(scores)} seeds)", flush=True)


if __name__ == "__main__":
    main()
