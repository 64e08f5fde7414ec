"""A balance for the acrobot that rests on its passive shoulder's friction, against the dithered LQR (issue 15).

Why: on the proxy the shoulder's Coulomb friction (0.16 N m atan(100 dq1): up to 0.25 N m, and like a 16 N m s/rad
damper below 0.01 rad/s) breaks the LQR. But it also holds link 1 wherever the torque on it is small, and link 2
alone can keep the whole centre of mass over the shoulder: with link 1 at delta from upright, link 2's absolute tilt

    phi*(delta) = -asin((g1 + kappa) sin(delta) / g2),   g1 = g (m1 r1 + m2 l1),  g2 = g m2 r2

leaves gravity's torque about the shoulder at -kappa sin(delta), which the friction holds. The elbow then balances
link 2 on a resting link 1, a fully actuated inverted pendulum: a PD on phi through the model's link-2 inertia and
gravity (ddq1 = 0 assumed). The controller is designed from the robot config's plant (model_1.1: masses, lengths);
it needs no friction value, only a shoulder that has some. A prototype, not in the package: it holds a resting
shoulder but cannot stop a sliding one, so it does not raise the protocol score (docs/learner.md, "The switching,
the catch plan's judge, and a balance on the stuck shoulder").

    python benchmarks/bench_stuck_balance.py --hold            # 10 s from stuck equilibria, on the proxy (a diagnostic)
    python benchmarks/bench_stuck_balance.py --from-lqr        # 8 s from states the dithered LQR holds, design robot
    python benchmarks/bench_stuck_balance.py --catch           # from V = 0.5 / 1 / 2 rho, design robot
    python benchmarks/bench_stuck_balance.py --protocol        # the supervisor with it once the shoulder rests
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.control.roa import sample_sublevel_states  # noqa: E402
from mcpilco_core.evaluation import MODE_CODES, evaluate_seed  # noqa: E402
from mcpilco_core.plant import DoublePendulum, wrap_angle  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402
from mcpilco_core.simulation import drive, load_robot_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "acrobot_dither.yaml"
POLICY = ROOT / "policies" / "acrobot_hardware_proxy.npz"
DESIGN_ROBOT = ROOT / "config" / "design_robots" / "acrobot_exploration_identified.yaml"


def tilts(x: np.ndarray) -> tuple[float, float]:
    """(delta, phi): link 1's and link 2's absolute angles from upright (rad)."""
    return float(wrap_angle(x[0] - math.pi)), float(wrap_angle(x[0] + x[1] - math.pi))


class StuckShoulderBalance:
    """The elbow torque (N m) that holds link 2 at phi*(delta) on a resting link 1 (module docstring)."""

    def __init__(self, plant: DoublePendulum, kp: float = 80.0, kd: float = 14.0, kappa: float = 0.5,
                 limit: float = 6.0) -> None:
        p = plant.params
        self.plant = plant
        self.g1 = p.g * (p.m[0] * p.r[0] + p.m[1] * p.l[0])     # N m per unit sin(delta)
        self.g2 = p.g * p.m[1] * p.r[1]                         # N m per unit sin(phi)
        self.kp, self.kd, self.kappa, self.limit = kp, kd, kappa, limit

    def target(self, delta: float) -> float:
        """phi* (rad): the centre of mass over the shoulder, less the restoring offset kappa (N m)."""
        return math.asin(min(1.0, max(-1.0, -(self.g1 + self.kappa) * math.sin(delta) / self.g2)))

    def torque(self, x: np.ndarray) -> float:
        delta, phi = tilts(x)
        ddq2 = self.kp * (self.target(delta) - phi) - self.kd * (x[2] + x[3])
        q = np.asarray(x[:2], dtype=np.float64)
        mass, gravity = self.plant.mass_matrix(q), self.plant.gravity_vector(q)
        coriolis = self.plant.coriolis_matrix(q, np.asarray(x[2:], dtype=np.float64))[1] @ x[2:]
        u = mass[1, 1] * ddq2 - gravity[1] + coriolis          # link 2's equation with ddq1 = 0
        return min(self.limit, max(-self.limit, u))


class Always:
    """The balance in charge at every state (the controller API of ``simulation.drive``)."""

    mode = "lqr"

    def __init__(self, balance: StuckShoulderBalance) -> None:
        self.balance = balance

    def reset(self) -> None:
        pass

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        return np.array([0.0, self.balance.torque(x)])


class WhenResting:
    """The supervisor as it is, with the balance in place once link 1 rests near the top: enter when |delta| < 0.15
    rad, |phi - phi*| < 0.15 rad and link 1's speed from its positions (clean; the measured speed is noisy) over
    ``short`` and ``long`` states is below 0.15 / 0.2 rad/s; leave past 0.3 rad, 0.4 rad or 0.6 rad/s."""

    def __init__(self, supervisor, balance: StuckShoulderBalance, any_mode: bool, short: int = 10,
                 long: int = 25) -> None:
        self.supervisor, self.balance, self.any_mode = supervisor, balance, any_mode
        self.short, self.long = short, long
        self.reset()

    @property
    def mode(self) -> str:
        return "lqr" if self.resting else self.supervisor.mode

    def reset(self) -> None:
        self.supervisor.reset()
        self.resting = False
        self.q1: list[float] = []
        self.entries = 0

    def _speed(self, n: int, dt: float = 0.002) -> float:
        h = self.q1[-n - 1:]
        return abs(h[-1] - h[0]) / (dt * (len(h) - 1)) if len(h) > 1 else math.inf

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        self.q1 = (self.q1 + [float(x[0])])[-self.long - 1:]
        delta, phi = tilts(x)
        off = abs(phi - self.balance.target(delta))
        if self.resting and (abs(delta) > 0.3 or off > 0.4 or self._speed(self.short) > 0.6):
            self.resting = False
            self.supervisor.reset()
        if not self.resting:
            u = self.supervisor.step(x, t)
            mode_ok = self.supervisor.mode == "lqr" or (self.any_mode and self.supervisor.mode == "policy")
            if not (mode_ok and abs(delta) < 0.15 and off < 0.15 and self._speed(self.short) < 0.15
                    and self._speed(self.long) < 0.2):
                return u
            self.resting, self.entries = True, self.entries + 1
        return np.array([0.0, self.balance.torque(x)])


def run(controller, config, profile, x0: np.ndarray, seconds: float, index: int) -> np.ndarray:
    """Per state of ``seconds`` on the robot ``profile`` from ``x0``: the end effector above the score's line."""
    robot = load_robot_profile(profile).robot(config, index, x0)
    plant = DoublePendulum(config.plant)
    x = drive(robot, controller, int(round(seconds / config.control_period))).x
    return plant.end_effector_height(x) > plant.height_threshold


def hold(config, plant, args) -> None:
    rng = np.random.default_rng(0)
    for spread, speeds in ((0.0, (0.0, 0.0)), (0.1, (0.05, 0.2))):
        held = 0
        for i in range(args.samples):
            balance = StuckShoulderBalance(plant, args.kp, args.kd, args.kappa)
            delta = rng.uniform(-0.1, 0.1)
            phi = balance.target(delta) + rng.uniform(-spread, spread)
            x0 = np.array([math.pi + delta, phi - delta, rng.normal(0, speeds[0]), rng.normal(0, speeds[1])])
            held += bool(run(Always(balance), config, "hardware_proxy", x0, 10.0, i).all())
        print(f"| hold 10 s on the proxy, phi off by up to {spread} rad, speeds sigma {speeds} rad/s | "
              f"{held} / {args.samples} |")


def held_states(config, policy, seeds, after: float) -> list[np.ndarray]:
    """States of the protocol on the design robot where the dithered LQR has been in charge ``after`` s."""
    states = []
    for seed in seeds:
        traj = evaluate_seed(build_controller(config, policy), config, seed, profile=str(DESIGN_ROBOT)).trajectory
        run_length = 0
        for k, lqr in enumerate(traj.mode == MODE_CODES["lqr"]):
            run_length = run_length + 1 if lqr else 0
            if run_length >= round(after / config.control_period) and run_length % 25 == 0:
                states.append(traj.x[k].copy())
    return states


def from_lqr(config, plant, policy, args) -> None:
    rng = np.random.default_rng(0)
    states = held_states(config, policy, (200, 201), 0.3)
    states = [states[i] for i in rng.choice(len(states), min(60, len(states)), replace=False)]
    for name, make in (("the dithered LQR", lambda: build_controller(config)),
                       ("the stuck-shoulder balance", lambda: Always(StuckShoulderBalance(plant, args.kp, args.kd,
                                                                                          args.kappa)))):
        held = np.mean([run(make(), config, str(DESIGN_ROBOT), x0, 8.0, i).all() for i, x0 in enumerate(states)])
        print(f"| hold 8 s from {len(states)} states the dithered LQR held 0.3 s, design robot: {name} | {held:.2f} |")


def catch(config, plant, args) -> None:
    design = build_controller(config)
    rng = np.random.default_rng(5)
    for level in (0.5, 1.0, 2.0):
        starts = sample_sublevel_states(design.design, np.full(args.samples, level * design.rho), rng)
        for name, make in (("the dithered LQR", lambda: build_controller(config)),
                           ("the stuck-shoulder balance",
                            lambda: Always(StuckShoulderBalance(plant, args.kp, args.kd, args.kappa)))):
            held = np.mean([run(make(), config, str(DESIGN_ROBOT), x0, 6.0, i)[-1000:].all()
                            for i, x0 in enumerate(starts)])
            print(f"| catch from V = {level} rho (above the line the last 2 s of 6), design robot: {name} | "
                  f"{held:.2f} |")


def protocol(config, plant, policy, args) -> None:
    seeds = range(200, 208)
    for label, any_mode in (("the supervisor", None), ("with the balance once resting, entered from the LQR", False),
                            ("with the balance once resting, entered from any mode", True)):
        scores, entries = [], 0
        for seed in seeds:
            controller = build_controller(config, policy)
            if any_mode is not None:
                controller = WhenResting(controller, StuckShoulderBalance(plant, args.kp, args.kd, args.kappa),
                                         any_mode)
            scores.append(evaluate_seed(controller, config, seed, profile=str(DESIGN_ROBOT),
                                        keep_trajectory=False).score)
            entries += getattr(controller, "entries", 0)
        print(f"| protocol, design robot, seeds 200-207: {label} | {np.mean(scores):.3f} ({entries} entries) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--from-lqr", action="store_true")
    parser.add_argument("--catch", action="store_true")
    parser.add_argument("--protocol", action="store_true")
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--kp", type=float, default=80.0, help="1/s^2, link 2's PD")
    parser.add_argument("--kd", type=float, default=14.0, help="1/s")
    parser.add_argument("--kappa", type=float, default=0.5, help="N m, gravity's restoring torque per unit sin(delta)")
    args = parser.parse_args(argv)
    config = load_robot_config(CONFIG)
    plant = DoublePendulum(config.plant)
    policy = load_policy(POLICY, robot="acrobot", torque_limit=config.torque_limit)
    print("| test | result |\n|---|---|")
    if args.hold:
        hold(config, plant, args)
    if args.from_lqr:
        from_lqr(config, plant, policy, args)
    if args.catch:
        catch(config, plant, args)
    if args.protocol:
        protocol(config, plant, policy, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
