"""Four more balances for the acrobot on a passive shoulder with Coulomb friction, against the tuned dithered LQR
(issue 15). Prototypes: none is in the package, none beat it (docs/learner.md, "Four more balances that do not catch a
sliding shoulder").

Why: on the proxy the acrobot's limit is catching a sliding shoulder; the dithered LQR catches 59 % of the disturbances
on the design robot (`bench_recovery.py`). Each variant here changes one thing about the balance:

* ``--protocol`` (the protocol on the design robot, ``policies/acrobot_hardware_proxy.npz`` with
  ``config/acrobot_dither_tuned.yaml``; seeds ``--seeds``; no robot time):
  - **PWM shake**: the clipped sum ``clip(u_LQR + 6 N m square)`` averages to u_LQR / 2 over a period (one half is
    always clipped at the limit). A natural-sampling PWM, ``6 N m * sign(scale * u_LQR - 6 N m * triangle(f t))``,
    shakes as hard and averages to ``scale * u_LQR`` exactly.
  - **gain schedule**: the LQR's gains times ``far`` while V > ``level`` rho and times ``near`` below.
  - **equivalent damping**: the shake turns the shoulder's Coulomb friction into a viscous-like friction on average
    (b_eq = 2 F_c / (pi A) for a velocity shake of amplitude A); the LQR designed on the plant with a viscous b_eq on
    the shoulder and no Coulomb friction.
* ``--mppi`` (the catch test of ``bench_friction_catch.py``: starts at V = L rho, 6 s, caught = above the line the
  last 2 s): a sampling MPC (MPPI) in place of the LQR, planned every ``--period`` s on the design robot's identified
  plant (friction, rotor inertia) with ``--samples`` torque sequences of ``--horizon`` s (knots every ``--knot`` s,
  RK4 at ``--dt``), cost the LQR's Q along the way plus its cost-to-go at the end. Run on the design robot, on the
  same plant with ideal sensors and motors (the planner's model is then exact), and, planned on model_1.1, on the
  nominal robot (the harness check).

    python benchmarks/bench_balance_variants.py --protocol --seeds 200 201 202 203 204 205 206 207 208 209 210 211
    python benchmarks/bench_balance_variants.py --mppi --starts 4 --levels 0.5
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_friction_catch import DESIGN_PLANT, DESIGN_ROBOT, catch_rate, starts_at  # noqa: E402

from mcpilco_core.config import RobotConfig, load_plant_parameters, load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.control.lqr import design_lqr  # noqa: E402
from mcpilco_core.control.supervisor import Supervisor  # noqa: E402
from mcpilco_core.evaluation import evaluate_seed  # noqa: E402
from mcpilco_core.plant import GOAL, DoublePendulum, wrap_state  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402
from mcpilco_core.simulation import load_robot_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TUNED = ROOT / "config" / "acrobot_dither_tuned.yaml"
POLICY = ROOT / "policies" / "acrobot_hardware_proxy.npz"


def triangle(cycles: float) -> float:
    """A triangle wave in [-1, 1] of the phase ``cycles`` (1 = one period), 0 at phase 0, rising."""
    p = (cycles + 0.25) % 1.0
    return 4.0 * p - 1.0 if p < 0.5 else 3.0 - 4.0 * p


def pwm(u: float, cycles: float, limit: float) -> float:
    """Natural-sampling PWM: +limit while ``u`` is above the carrier ``limit * triangle(cycles)``, else -limit. Over
    one carrier period it averages to ``u`` for |u| <= limit (N m)."""
    return limit if u > limit * triangle(cycles) else -limit


class PwmShake(Supervisor):
    """The supervisor whose balance is ``limit * sign(scale * u_LQR - limit * triangle(f t))`` (its own dither off)."""

    def __init__(self, config: RobotConfig, design, rho: float, policy, frequency: float, scale: float) -> None:
        super().__init__(replace(config, dither=replace(config.dither, amplitude=0.0)), design, rho, policy)
        self.frequency, self.scale = frequency, scale

    def _balance_torque(self, err: np.ndarray, cost: float, t: float) -> float:
        u = self.scale * super()._balance_torque(err, cost, t)
        period = self.config.control_period
        elapsed = round((t - self._lqr_since) / period) * period
        return pwm(u, self.frequency * elapsed, self.config.torque_limit)


class ScheduledGains(Supervisor):
    """The supervisor whose LQR torque is scaled by ``far`` while V > ``level`` rho and by ``near`` below."""

    def __init__(self, config: RobotConfig, design, rho: float, policy, far: float, near: float,
                 level: float) -> None:
        super().__init__(config, design, rho, policy)
        self.far, self.near, self.level = far, near, level

    def _balance_torque(self, err: np.ndarray, cost: float, t: float) -> float:
        scale = self.near if cost < self.level * self.rho else self.far
        return scale * super()._balance_torque(err, cost, t)


def damped_design_gains(config: RobotConfig, b_eq: float) -> np.ndarray:
    """The config's LQR gains (times its gain_scale) designed on its plant with viscous ``b_eq`` (N m s/rad) on the
    shoulder and no Coulomb friction."""
    params = replace(config.plant, b=(b_eq, config.plant.b[1]), cf=(0.0, 0.0))
    design = design_lqr(DoublePendulum(params), config.actuated_joint, config.lqr.Q_diag, config.lqr.R)
    return design.K * np.asarray(config.lqr.gain_scale)[np.newaxis, :]


def protocol_score(controller, config: RobotConfig, seeds: list[int]) -> float:
    return float(np.mean([evaluate_seed(controller, config, s, keep_trajectory=False,
                                        profile=str(DESIGN_ROBOT)).score for s in seeds]))


def protocol_rows(args) -> None:
    config = load_robot_config(TUNED)
    policy = load_policy(str(POLICY), robot="acrobot", torque_limit=config.torque_limit)
    ref = build_controller(config, policy)
    design, rho = ref.design, ref.rho
    rows = [("acrobot_dither_tuned.yaml as it is", lambda: build_controller(config, policy))]
    rows += [(f"PWM shake {f:g} Hz, scale {s:g}",
              lambda f=f, s=s: PwmShake(config, design, rho, policy, f, s))
             for f in args.pwm_frequencies for s in args.pwm_scales]
    rows += [(f"gains x {far:g} beyond {level:g} rho, x {near:g} within",
              lambda far=far, near=near, level=level: ScheduledGains(config, design, rho, policy, far, near, level))
             for level in (1.0, 3.0) for far in (0.7, 1.0, 1.4) for near in (0.7, 1.4)]
    rows += [(f"LQR designed with shoulder damping b_eq {b:g} N m s/rad",
              lambda b=b: Supervisor(config, replace(design, K=damped_design_gains(config, b)), rho, policy))
             for b in args.damping]
    print(f"| balance (protocol on the design robot, seeds {args.seeds[0]}-{args.seeds[-1]}) | score |")
    print("|---|---|")
    for name, make in rows:
        print(f"| {name} | {protocol_score(make(), config, args.seeds):.3f} |", flush=True)


class Mppi:
    """A sampling MPC for the top (the controller API of ``simulation.drive``; passive joint 0 N m).

    Every ``period`` s: ``samples`` torque sequences (the last plan shifted, plus Gaussian noise of ``sigma`` N m per
    knot; the first sample noise-free), each simulated ``horizon`` s on ``plant``; weighted by exp(-cost / lam)."""

    mode = "lqr"

    def __init__(self, plant: DoublePendulum, S: np.ndarray, Q: np.ndarray, args, limit: float = 6.0) -> None:
        self.plant, self.S, self.Q, self.limit = plant, S, Q, limit
        self.samples, self.knot, self.dt = args.samples, args.knot, args.dt
        self.knots = int(round(args.horizon / args.knot))
        self.substeps = int(round(args.knot / args.dt))
        self.sigma, self.lam, self.period, self.seed = args.sigma, args.lam, args.period, args.seed
        self.reset()

    def reset(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.plan = np.zeros(self.knots)
        self.planned_at = -math.inf

    def _replan(self, x: np.ndarray) -> None:
        shift = int(round(self.period / self.knot))
        start = np.concatenate([self.plan[shift:], np.repeat(self.plan[-1:], shift)])
        noise = self.rng.normal(0.0, self.sigma, (self.samples, self.knots))
        noise[0] = 0.0
        u = np.clip(start + noise, -self.limit, self.limit)
        xs = np.repeat(x[np.newaxis, :], self.samples, 0)
        torques = np.zeros((self.samples, 2))
        cost = np.zeros(self.samples)
        for k in range(self.knots):
            torques[:, 1] = u[:, k]
            for _ in range(self.substeps):
                xs = self.plant.rk4_step(xs, torques, self.dt)
            e = wrap_state(xs) - GOAL
            cost += np.einsum("ki,ij,kj->k", e, self.Q, e) * self.knot
        e = wrap_state(xs) - GOAL
        cost += np.einsum("ki,ij,kj->k", e, self.S, e)
        cost = np.where(np.isfinite(cost), cost, np.inf)
        weights = np.exp(-(cost - cost.min()) / self.lam)
        self.plan = np.clip(weights @ u / weights.sum(), -self.limit, self.limit)

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        if t >= self.planned_at + self.period - 1e-9:
            self._replan(np.asarray(x, dtype=np.float64))
            self.planned_at = t
        k = min(int((t - self.planned_at) / self.knot + 1e-9), self.knots - 1)
        return np.array([0.0, self.plan[k]])


def mppi_rows(args) -> None:
    config = load_robot_config(TUNED)
    ref = build_controller(config)
    identified = DoublePendulum(load_plant_parameters(DESIGN_PLANT[1], DESIGN_PLANT[0]))
    design_robot = load_robot_profile(str(DESIGN_ROBOT))
    ideal = replace(design_robot, name="design robot, ideal sensors and motors", measurement_noise=(0.0,) * 4,
                    delay=0.0, motor_responsiveness=1.0, torque_noise_actuated=0.0)
    Q = np.diag(config.lqr.Q_diag)
    print("| catch from V / rho (starts each) | robot | " + " | ".join(f"{v:g}" for v in args.levels) + " |")
    print("|---|---|" + "---|" * len(args.levels))
    for robot, profile, plant in (("design robot", design_robot, identified), (ideal.name, ideal, identified),
                                  ("nominal (planned on model_1.1)", "nominal", DoublePendulum(config.plant))):
        for name, make in (("the tuned dithered LQR", lambda: build_controller(config)),
                           (f"MPPI, {args.samples} samples, {args.horizon:g} s, lam {args.lam:g}",
                            lambda plant=plant: Mppi(plant, ref.design.S, Q, args))):
            t0 = time.perf_counter()
            rates = [catch_rate(make, config, profile, starts_at(ref.design, ref.rho, level, args.starts))
                     for level in args.levels]
            print(f"| {name} ({args.starts}) | {robot} | " + " | ".join(f"{r:.2f}" for r in rates)
                  + f" |  <!-- {time.perf_counter() - t0:.0f} s -->", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", action="store_true", help="PWM shake, gain schedule, equivalent damping")
    parser.add_argument("--mppi", action="store_true", help="the sampling MPC in the catch test")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(200, 212)))
    parser.add_argument("--pwm-frequencies", type=float, nargs="+", default=[5.0, 7.355, 10.0, 15.0], help="Hz")
    parser.add_argument("--pwm-scales", type=float, nargs="+", default=[0.25, 0.35, 0.5, 1.0])
    parser.add_argument("--damping", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0], help="b_eq, N m s/rad")
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--levels", type=float, nargs="+", default=[0.5], help="V / rho")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--horizon", type=float, default=0.25, help="s")
    parser.add_argument("--knot", type=float, default=0.02, help="s")
    parser.add_argument("--dt", type=float, default=0.0025, help="s, the planner's RK4 step")
    parser.add_argument("--sigma", type=float, default=3.0, help="N m")
    parser.add_argument("--lam", type=float, default=0.03)
    parser.add_argument("--period", type=float, default=0.02, help="s between plans")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not (args.protocol or args.mppi):
        parser.error("choose --protocol and/or --mppi")
    for name in ("samples", "starts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    for name in ("horizon", "knot", "dt", "sigma", "lam", "period"):
        if not getattr(args, name) > 0.0:
            parser.error(f"--{name} must be positive")
    if args.knot < args.dt or args.horizon < args.knot or args.period < args.knot:
        parser.error("need --dt <= --knot <= --period and --knot <= --horizon")
    if args.protocol:
        protocol_rows(args)
    if args.mppi:
        mppi_rows(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
