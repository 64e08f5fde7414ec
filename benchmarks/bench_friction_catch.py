"""Two more ways to catch the acrobot on a passive shoulder with Coulomb friction, against the dithered LQR (issue 15).

Why: on the proxy the acrobot's limit is catching a sliding shoulder (docs/learner.md, "The switching, the catch plan's
judge, and a balance on the stuck shoulder"). Both prototypes here are judged by the same catch test: starts at
V = L rho of ``config/acrobot_dither.yaml``'s design, 6 s on a design robot (identified from counted trials, so no robot
time), caught = the end effector above the score's line for the last 2 s.

* ``--plan``: the opt-in catch plan (iLQR, control/catch.py) planned on the design robot's identified plant (its
  friction F = b dq + cf atan(100 dq) and rotor inertia) in place of the controller's model_1.1, in charge of the
  whole band (``lqr_level`` 0), at several plan periods, with and without the shake. On the nominal robot the same
  plans are run as a check that the harness catches what it should.
* ``--balance-policy RUN``: a separate policy for the top, optimised by particles on RUN's own newest model (the
  learner's optimiser and cost; no robot time), its particles started in the band (V uniform in 0.1 ... 8 rho), then
  run alone (``config/acrobot_policy_only.yaml``: the LQR never takes over) from the catch test's starts. Started
  from RUN's chosen swing-up policy, or from 100 / 250 fresh basis functions centred near the top.
* ``--held-lqr``: whether a 50 Hz controller can balance at all: ``config/acrobot.yaml``'s LQR with its torque held
  20 ms (and a discrete LQR designed for that hold) on the nominal robot, against the same LQR at 500 Hz.

    mcpilco identify RUN --trials K --write runs/fc/design.yaml      # the design robot from RUN's counted trials
    python benchmarks/bench_friction_catch.py --plan --samples 8 --levels 0.5
    python benchmarks/bench_friction_catch.py --balance-policy RUN --design-robot runs/fc/design.yaml --samples 20
    python benchmarks/bench_friction_catch.py --held-lqr --samples 10 --levels 0.5 1 2   # is 50 Hz enough? (nominal)

Prototypes, not in the package: neither catches more than the dithered LQR (docs/learner.md, "The perturbed acrobots
to the end, a catch plan that knows the friction, and a learned balance policy").
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from scipy.linalg import expm, solve_discrete_are

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stuck_balance import run as above_line  # noqa: E402

from mcpilco_core.config import load_plant_parameters, load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.control.catch import build_catch  # noqa: E402
from mcpilco_core.control.roa import sample_sublevel_states  # noqa: E402
from mcpilco_core.control.supervisor import Supervisor  # noqa: E402
from mcpilco_core.learning.cost import with_height_term  # noqa: E402
from mcpilco_core.learning.optimizer import optimize_policy  # noqa: E402
from mcpilco_core.learning.polish import load_source  # noqa: E402
from mcpilco_core.learning.torch_policy import TorchPolicy  # noqa: E402
from mcpilco_core.plant import GOAL, DoublePendulum, wrap_state  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DITHER = ROOT / "config" / "acrobot_dither.yaml"
POLICY_ONLY = ROOT / "config" / "acrobot_policy_only.yaml"
DESIGN_ROBOT = ROOT / "config" / "design_robots" / "acrobot_exploration_identified.yaml"
DESIGN_PLANT = ("identified_acrobot_exploration_identified", ROOT / "config" / "design_robots" / "plant_models.yaml")
BAND = 8.0          # rho: the band the balance policy's particles start in (acrobot_dither.yaml's enter_fraction)


def catch_rate(make, config, profile: str, starts: np.ndarray) -> float:
    """The share of ``starts`` from which ``make()``'s controller keeps the end effector above the score's line for
    the last 2 s of 6 s on ``profile`` (bench_stuck_balance.py's catch test)."""
    return float(np.mean([above_line(make(), config, profile, x0, 6.0, i)[-1000:].all()
                          for i, x0 in enumerate(starts)]))


def starts_at(design, rho: float, level: float, samples: int) -> np.ndarray:
    return sample_sublevel_states(design, np.full(samples, level * rho), np.random.default_rng(5))


# ------------------------------------------------------------------------------------------ --plan
class PlannedOnPlant(Supervisor):
    """The supervisor whose catch plan runs on ``plan_plant`` instead of the robot config's plant (a benchmark-only
    swap of the private plan; the LQR, its ROA and the switching stay the config's)."""

    def __init__(self, config, design, rho: float, plan_plant: DoublePendulum) -> None:
        super().__init__(config, design, rho)
        self._catch = build_catch(plan_plant, design, config)


def plan_rows(args) -> None:
    base = load_robot_config(DITHER)
    ref = build_controller(base)
    identified = DoublePendulum(load_plant_parameters(DESIGN_PLANT[1], DESIGN_PLANT[0]))
    variants = [  # name, plan plant, shake, plan period (s), RK4 step (s), horizon (s)
        ("plan on the identified plant, 20 ms", identified, False, 0.02, 0.002, 0.8),
        ("⤷ with the shake", identified, True, 0.02, 0.002, 0.8),
        ("⤷ 10 ms", identified, False, 0.01, 0.002, 0.6),
        ("⤷ 4 ms", identified, False, 0.004, 0.002, 0.4),
        ("plan on model_1.1, 20 ms", DoublePendulum(base.plant), False, 0.02, 0.01, 0.8),
        ("⤷ 4 ms", DoublePendulum(base.plant), False, 0.004, 0.004, 0.4),
    ]

    def planned(plant, shake, period, step, horizon):
        config = replace(base, catch=replace(base.catch, enabled=True, lqr_level=0.0, period=period,
                                             integration_step=step, horizon=horizon),
                         dither=replace(base.dither, amplitude=base.dither.amplitude if shake else 0.0))
        return lambda: PlannedOnPlant(config, ref.design, ref.rho, plant)

    print("| catch from V / rho (starts each) | robot | " + " | ".join(f"{v:g}" for v in args.levels) + " |")
    print("|---|---|" + "---|" * len(args.levels))
    for robot, profile in (("design robot", str(DESIGN_ROBOT)), ("nominal", "nominal")):
        rows = [("the dithered LQR (acrobot_dither.yaml)", lambda: build_controller(base))]
        rows += [(name, planned(*spec)) for name, *spec in variants]
        for name, make in rows:
            t0 = time.perf_counter()
            rates = [catch_rate(make, base, profile, starts_at(ref.design, ref.rho, level, args.samples))
                     for level in args.levels]
            print(f"| {name} ({args.samples}) | {robot} | " + " | ".join(f"{r:.2f}" for r in rates)
                  + f" |  <!-- {time.perf_counter() - t0:.0f} s -->", flush=True)


# ------------------------------------------------------------------------------------------ --held-lqr
class HeldLqr:
    """u = -K e computed every ``hold`` control periods and held in between (a zero-order hold, as a policy's)."""

    mode = "lqr"

    def __init__(self, gains: np.ndarray, goal: np.ndarray, hold: int, limit: float) -> None:
        self.gains, self.goal, self.hold, self.limit = gains, goal, hold, limit
        self.reset()

    def reset(self) -> None:
        self.count, self.u = 0, 0.0

    def step(self, x: np.ndarray, t: float) -> np.ndarray:
        if self.count % self.hold == 0:
            self.u = float(np.clip(-self.gains @ (wrap_state(np.asarray(x)) - self.goal), -self.limit, self.limit))
        self.count += 1
        return np.array([0.0, self.u])


def discrete_lqr_gains(plant: DoublePendulum, config, period: float) -> np.ndarray:
    """The LQR of ``config``'s weights for the plant linearised at the top and sampled with a ``period`` s hold."""
    a, b_full = plant.linearize(GOAL, (0.0, 0.0))
    block = np.zeros((5, 5))
    block[:4, :4], block[:4, 4] = a, b_full[:, config.actuated_joint]
    sampled = expm(block * period)
    ad, bd = sampled[:4, :4], sampled[:4, 4:]
    q, r = np.diag(config.lqr.Q_diag) * period, np.array([[config.lqr.R * period]])
    p = solve_discrete_are(ad, bd, q, r)
    return np.linalg.solve(r + bd.T @ p @ bd, bd.T @ p @ ad).ravel()


def held_lqr_rows(args) -> None:
    config = load_robot_config(ROOT / "config" / "acrobot.yaml")
    ref = build_controller(config)
    plant = DoublePendulum(config.plant)
    gains = ref.design.K[config.actuated_joint]
    hold = round(config.policy_period / config.control_period)
    rows = [("the LQR at 500 Hz", gains, 1), (f"the LQR held {config.policy_period * 1e3:g} ms", gains, hold),
            ("a discrete LQR for that hold", discrete_lqr_gains(plant, config, config.policy_period), hold)]
    print("| catch from V / rho on the nominal robot (starts each) | " + " | ".join(f"{v:g}" for v in args.levels)
          + " |")
    print("|---|" + "---|" * len(args.levels))
    for name, k, n in rows:
        rates = [catch_rate(lambda k=k, n=n: HeldLqr(k, ref.design.goal, n, config.torque_limit), config, "nominal",
                            starts_at(ref.design, ref.rho, level, args.samples)) for level in args.levels]
        print(f"| {name} ({args.samples}) | " + " | ".join(f"{r:.2f}" for r in rates) + " |", flush=True)


# ------------------------------------------------------------------------------------------ --balance-policy
def band_sampler(design, rho: float, dtype: torch.dtype, seed: int):
    """Particles' starts: 4000 states at V uniform in [0.1, BAND] rho, drawn with replacement by the optimiser."""
    rng = np.random.default_rng(seed)
    pool = torch.as_tensor(sample_sublevel_states(design, rng.uniform(0.1, BAND, 4000) * rho, rng), dtype=dtype)

    def sample(n: int, generator: torch.Generator) -> torch.Tensor:
        return pool[torch.randint(0, len(pool), (n,), generator=generator)]

    return sample


def fresh_top_policy(num_basis: int, u_max: float, generator: torch.Generator, dtype: torch.dtype) -> TorchPolicy:
    """Basis functions centred near the top (q1 = pi +- 0.4 rad, q2 +- 0.8 rad, dq +- 3 rad/s), narrow in angle."""
    policy = TorchPolicy.random(num_basis, u_max, generator, dq_range=3.0, dtype=torch.float64,
                                lengthscales=(3.0, 3.0, 0.3, 0.3, 0.3, 0.3))
    q1 = math.pi + (2 * torch.rand(num_basis, generator=generator, dtype=torch.float64) - 1) * 0.4
    q2 = (2 * torch.rand(num_basis, generator=generator, dtype=torch.float64) - 1) * 0.8
    centers = policy.centers.data.double()
    centers[:, 2:] = torch.stack([torch.cos(q1), torch.cos(q2), torch.sin(q1), torch.sin(q2)], -1)
    return TorchPolicy(centers.to(dtype), policy.log_lengthscales.data.to(dtype),
                       (0.1 * policy.weights.data).to(dtype), u_max)


def train_balance(source, start: str, steps: int, seed: int, design, rho: float):
    """Optimise a balance policy on ``source``'s model (no robot time); returns the numpy policy and the cost."""
    config = source.config
    generator = torch.Generator().manual_seed(seed)
    swing_up = load_policy(source.policy_file, robot="acrobot", torque_limit=config.robot.torque_limit)
    if start == "swing-up":
        policy, lr = TorchPolicy.from_numpy(swing_up, config.torch_dtype), 0.003
    else:
        policy, lr = fresh_top_policy(int(start), swing_up.u_max, generator, config.torch_dtype), 0.01
    cost = with_height_term(replace(config.cost, lengthscales=(1.0, 1.0), velocity_lengthscales=(4.0, 4.0)),
                            1.0, 0.02, config.robot.plant.l)
    settings = replace(config.optimizer, lr=lr, dropout=0.0, snapshot_every=0)
    result = optimize_policy(policy, source.model, band_sampler(design, rho, config.torch_dtype, seed), 200,
                             int(round(1.5 / config.robot.policy_period)), cost, settings, steps, generator,
                             progress=False, description="balance")
    costs = np.asarray(result.cost)
    return policy.to_numpy("acrobot", config.robot.policy_period), (costs[:20].mean(), costs[-20:].mean(),
                                                                     result.steps)


def balance_rows(args) -> None:
    torch.set_num_threads(1)
    dither, only = load_robot_config(DITHER), load_robot_config(POLICY_ONLY)
    ref = build_controller(dither)
    source = load_source(args.balance_policy, args.balance_policy / "chosen.npz"
                         if (args.balance_policy / "chosen.npz").is_file() else None)
    swing_up = load_policy(source.policy_file, robot="acrobot", torque_limit=6.0)
    rows = [("the dithered LQR (acrobot_dither.yaml)", lambda: build_controller(dither)),
            ("the run's swing-up policy alone", lambda: build_controller(only, swing_up))]
    for start, steps in args.starts:
        t0 = time.perf_counter()
        policy, (before, after, done) = train_balance(source, start, steps, args.seed, ref.design, ref.rho)
        label = "from the swing-up policy" if start == "swing-up" else f"{start} fresh basis functions"
        rows.append((f"balance policy, {label}, {done} steps (particle cost {before:.1f} -> {after:.1f}, "
                     f"{time.perf_counter() - t0:.0f} s)", lambda p=policy: build_controller(only, p)))
    print("| catch from V / rho on the design robot (starts each) | " + " | ".join(f"{v:g}" for v in args.levels)
          + " |")
    print("|---|" + "---|" * len(args.levels))
    for name, make in rows:
        rates = [catch_rate(make, dither, str(args.design_robot), starts_at(ref.design, ref.rho, level, args.samples))
                 for level in args.levels]
        print(f"| {name} ({args.samples}) | " + " | ".join(f"{r:.2f}" for r in rates) + " |", flush=True)


def start_spec(text: str) -> tuple[str, int]:
    start, _, steps = text.partition(":")
    if start != "swing-up" and not start.isdigit():
        raise argparse.ArgumentTypeError(f"expected swing-up:STEPS or BASIS:STEPS, got {text!r}")
    return start, int(steps or 800)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", action="store_true", help="the catch plan on the identified plant")
    parser.add_argument("--held-lqr", action="store_true", help="the LQR held 20 ms on the nominal robot")
    parser.add_argument("--balance-policy", type=Path, metavar="RUN", help="a balance policy on RUN's model")
    parser.add_argument("--design-robot", type=Path, default=DESIGN_ROBOT, help="robot profile of the catch test "
                        "for --balance-policy (mcpilco identify RUN --write FILE)")
    parser.add_argument("--starts", type=start_spec, nargs="+",
                        default=[("swing-up", 400), ("100", 2800), ("250", 2500)],
                        help="balance policies to train: swing-up:STEPS (from RUN's chosen policy) or BASIS:STEPS")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--levels", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0], help="V / rho")
    parser.add_argument("--seed", type=int, default=0, help="particles and fresh basis functions")
    args = parser.parse_args(argv)
    if not (args.plan or args.held_lqr or args.balance_policy):
        parser.error("give --plan, --held-lqr and/or --balance-policy RUN")
    if args.plan:
        plan_rows(args)
    if args.held_lqr:
        held_lqr_rows(args)
    if args.balance_policy:
        balance_rows(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
