"""Accuracy of the physics prior integrators against the simulator (not a test: prints the docs' table).

    python benchmarks/bench_prior.py [--robot pendubot] [--samples 4000]

For random angles, actuated torques in [-3, 3] N m and velocities uniform in +-v, compares the velocity change
over one policy period Ts = 20 ms of the simulator (ten RK4 steps of 2 ms, torque held) with the priors: one
Euler step (the seed paper's Ts * forward dynamics), 2 and 4 Euler sub-steps, and one RK4 step over Ts
(``gp.prior: rk4``). Prints mean / max |error| (rad/s) per velocity range.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from mcpilco_core.config import load_robot_config
from mcpilco_core.learning.gp import GPSettings
from mcpilco_core.learning.model import DynamicsModel

REPO = Path(__file__).resolve().parent.parent


def euler_substeps(model: DynamicsModel, x: np.ndarray, torques: np.ndarray, n: int) -> np.ndarray:
    """Velocity change of n semi-implicit Euler steps of Ts / n."""
    y, h = x.copy(), model.period / n
    for _ in range(n):
        dq = y[:, 2:] + h * model.plant.forward_dynamics(y, torques)
        y = np.concatenate([y[:, :2] + h * dq, dq], 1)
    return y[:, 2:] - x[:, 2:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robot", default="pendubot", choices=("pendubot", "acrobot"))
    parser.add_argument("--samples", type=int, default=4000)
    args = parser.parse_args()
    config = load_robot_config(REPO / "config" / f"{args.robot}.yaml")
    euler, rk4 = DynamicsModel(config), DynamicsModel(config, GPSettings(prior="rk4"))
    rng = np.random.default_rng(0)
    print(f"{'+-v (rad/s)':>11} {'Euler':>14} {'2 sub-steps':>14} {'4 sub-steps':>14} {'RK4 over Ts':>14} "
          f"{'std(dDq)':>9}")
    for v in (3.0, 8.0, 15.0, 20.0):
        n = args.samples
        x = np.concatenate([rng.uniform(-np.pi, np.pi, (n, 2)), rng.uniform(-v, v, (n, 2))], 1)
        u = rng.uniform(-3, 3, n)
        torques = euler.torques(u)
        fine = x.copy()
        for _ in range(round(euler.period / config.control_period)):
            fine = euler.plant.rk4_step(fine, torques, config.control_period)
        true = fine[:, 2:] - x[:, 2:]
        cells = [euler.prior_mean(x, u), euler_substeps(euler, x, torques, 2), euler_substeps(euler, x, torques, 4),
                 rk4.prior_mean(x, u)]
        text = " ".join(f"{np.abs(c - true).mean():>6.4f} / {np.abs(c - true).max():<5.3f}" for c in cells)
        print(f"{v:>11.0f} {text} {true.std():>9.2f}")


if __name__ == "__main__":
    main()
