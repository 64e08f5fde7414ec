"""Balance on a robot that is not the model: catch rate of the supervisor's LQR (designed from the robot config's
plant) on a robot profile, from states at given levels of the LQR cost-to-go V (issue: the robot is not the model).

    python benchmarks/bench_balance.py --profiles nominal hardware_proxy --levels 0.5 1 4 --samples 200
    python benchmarks/bench_balance.py --design-sweep --samples 200      # can another LQR design catch on model_1.0?
    python benchmarks/bench_balance.py --robust-search                   # can any linear state feedback?
    python benchmarks/bench_balance.py --robots pendubot --dither-sweep   # the LQR plus a shake of the actuated joint
    python benchmarks/bench_balance.py --robots acrobot --dither-sweep --profile nominal --amplitudes 0 \
        --q-scales 0.1 1 10 --r-scales 0.1 1 10 --levels 2 4 8 16    # the LQR's weights alone (no shake)

A start is *caught* when, after ``--horizon`` s on the simulated robot (with its sensors and motors), the state is
within 0.2 rad (q1) / 0.3 rad (q2) of upright. Rows with
``compensation`` use the robot config's opt-in passive-joint friction compensation (model_1.0's friction); rows
``dither`` use config/<robot>_dither.yaml (the LQR plus the balance dither, no torque on the passive joint).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import (  # noqa: E402
    BalanceDitherConfig,
    FrictionCompensationConfig,
    load_plant_parameters,
    load_robot_config,
)
from mcpilco_core.control import build_controller, design_lqr  # noqa: E402
from mcpilco_core.control.roa import sample_sublevel_states, simulate_lqr  # noqa: E402
from mcpilco_core.plant import DoublePendulum, wrap_state  # noqa: E402
from mcpilco_core.simulation import drive, load_robot_profile  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "config"


def caught_fraction(config, profile, x0s: np.ndarray, horizon: float) -> float:
    supervisor = build_controller(config)
    caught = 0
    for i, x0 in enumerate(x0s):
        robot = load_robot_profile(profile).robot(config, i, x0)
        traj = drive(robot, supervisor, int(round(horizon / config.control_period)))
        err = wrap_state(traj.x[-1]) - supervisor.design.goal
        caught += bool(np.isfinite(err).all() and abs(err[0]) < 0.2 and abs(err[1]) < 0.3)
    return caught / len(x0s)


def design_sweep(robots: list[str], samples: int, horizon: float, seed: int) -> None:
    """LQR designs on model_1.0 without its Coulomb friction but with passive viscous damping c (a linear stand-in
    for the stick), Q and R scaled, each run (pure saturated LQR at 500 Hz) on model_1.0 from V = 0.5 rho."""
    friction = load_plant_parameters(CONFIG / "plant_models.yaml", "model_1.0")
    print("| robot | design: passive damping c (N m s/rad) | Q scale | R scale | caught at V = 0.5 rho |")
    print("|---|---|---|---|---|")
    for robot in robots:
        config = load_robot_config(CONFIG / f"{robot}.yaml")
        act = config.actuated_joint
        nominal = build_controller(config)
        x0 = sample_sublevel_states(nominal.design, np.full(samples, 0.5 * nominal.rho), np.random.default_rng(seed))
        for c in (0.0, 0.02, 0.1, 0.3, 0.5, 1.0, 2.0, 5.0, 12.0):
            for q_scale, r_scale in ((1.0, 1.0), (10.0, 1.0), (1.0, 10.0)):
                damping = [0.0, 0.0]
                damping[1 - act] = c
                model = dataclasses.replace(friction, cf=(0.0, 0.0), b=tuple(damping))
                design = design_lqr(DoublePendulum(model), act, tuple(np.array(config.lqr.Q_diag) * q_scale),
                                    config.lqr.R * r_scale)
                xf = simulate_lqr(DoublePendulum(friction), design, x0, config.torque_limit, config.control_period,
                                  horizon)
                err = wrap_state(xf) - design.goal
                ok = np.isfinite(err).all(axis=1) & (np.abs(err[:, 0]) < 0.2) & (np.abs(err[:, 1]) < 0.3)
                print(f"| {robot} | {c} | {q_scale} | {r_scale} | {ok.mean():.2f} |", flush=True)


def dither_sweep(robots: list[str], levels: list[float], samples: int, horizon: float, seed: int,
                 profile: str = "hardware_proxy", q_scales: tuple[float, ...] = (1.0,),
                 amplitudes: tuple[float, ...] = (0.0, 2.0, 3.0, 4.0, 5.0, 6.0),
                 frequencies: tuple[float, ...] = (3.0, 5.0, 8.0),
                 shapes: tuple[str, ...] = ("sine", "square"), r_scales: tuple[float, ...] = (1.0,),
                 passive_dampings: tuple[float, ...] = (0.0,)) -> None:
    """The robot config's LQR (always in charge; its Q and R scaled by each of ``q_scales`` / ``r_scales``, and
    designed with each of ``passive_dampings`` (N m s/rad) added as viscous friction on the passive joint of the
    design plant) plus a shake of amplitude A (N m) at f (Hz), sine or square, on the robot ``profile``: catch
    rate per start level (the levels of the unchanged LQR, so every row starts from the same states), best mean
    first."""
    print("| robot | Q scale | R scale | passive damping in the design (N m s/rad) | amplitude (N m) | "
          "frequency (Hz) | shape | " + " | ".join(f"V = {v} rho" for v in levels) + " | mean |")
    print("|---|---|---|---|---|---|---|" + "---|" * (len(levels) + 1))
    for robot in robots:
        config = load_robot_config(CONFIG / f"{robot}.yaml")
        supervisor = build_controller(config)
        # always in charge; a fixed rho skips the ROA estimate of each scaled design (it plays no part then)
        always = dataclasses.replace(config.roa, rho=supervisor.rho, enter_fraction=100.0, exit_fraction=100.0)
        rng = np.random.default_rng(seed)
        starts = {v: sample_sublevel_states(supervisor.design, np.full(samples, v * supervisor.rho), rng)
                  for v in levels}
        rows = []
        shakes = [(a, f, s) for a in amplitudes for f in frequencies for s in shapes
                  if a != 0.0 or (f, s) == (frequencies[0], shapes[0])]
        for q_scale, r_scale, c in itertools.product(q_scales, r_scales, passive_dampings):
            lqr = dataclasses.replace(config.lqr, Q_diag=tuple(float(q) * q_scale for q in config.lqr.Q_diag),
                                      R=config.lqr.R * r_scale)
            damping = list(config.plant.b)
            damping[config.passive_joint] += c
            plant = dataclasses.replace(config.plant, b=tuple(damping))
            for amplitude, frequency, shape in shakes:
                cfg = dataclasses.replace(config, roa=always, lqr=lqr, plant=plant,
                                          dither=BalanceDitherConfig(amplitude, frequency, shape))
                rates = [caught_fraction(cfg, profile, starts[v], horizon) for v in levels]
                rows.append((float(np.mean(rates)), (q_scale, r_scale, c, amplitude, frequency, shape), rates))
        for mean, (q_scale, r_scale, c, amplitude, frequency, shape), rates in sorted(rows, key=lambda r: -r[0]):
            print(f"| {robot} | {q_scale:g} | {r_scale:g} | {c:g} | {amplitude:g} | {frequency:g} | {shape} | "
                  + " | ".join(f"{r:.2f}" for r in rates) + f" | {mean:.2f} |", flush=True)


def robust_search(robots: list[str], restarts: int, seed: int) -> None:
    """Is there one linear state feedback u = -k x that stabilises the upright both when the passive joint slides
    (no damping) and when it sticks (Coulomb friction near zero speed acts like viscous damping of up to
    cf * 100 N m s/rad)? Linearise the robot config's plant with passive damping c on a grid and search k
    (Nelder-Mead from the LQR gain and random restarts) for the smallest worst-case spectral abscissa
    (max real part of the closed-loop eigenvalues, 1/s): > 0 means every k found is unstable for some c."""
    from scipy.optimize import minimize

    grids = {"sliding and sticking": (0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 6.0, 12.0, 20.0),
             "sliding only": (0.0,), "sticking only": (1.0, 3.0, 6.0, 12.0, 20.0)}
    rng = np.random.default_rng(seed)
    print("| robot | passive damping c (N m s/rad) | LQR's worst abscissa (1/s) | best k found | its worst abscissa |")
    print("|---|---|---|---|---|")
    for robot in robots:
        config = load_robot_config(CONFIG / f"{robot}.yaml")
        act = config.actuated_joint
        lqr_k = build_controller(config).design.K[act]
        for label, grid in grids.items():
            systems = []
            for c in grid:
                damping = [0.0, 0.0]
                damping[1 - act] = c
                a, b = DoublePendulum(dataclasses.replace(config.plant, b=tuple(damping))).linearize()
                systems.append((a, b[:, act]))

            def worst(k: np.ndarray, systems: list = systems) -> float:
                return max(float(np.linalg.eigvals(a - np.outer(b, k)).real.max()) for a, b in systems)

            best = None
            for i in range(restarts):
                start = lqr_k if i == 0 else lqr_k * np.exp(rng.normal(0.0, 1.0, 4)) * rng.choice([-1.0, 1.0], 4)
                found = minimize(worst, start, method="Nelder-Mead",
                                 options={"maxiter": 6000, "xatol": 1e-5, "fatol": 1e-7})
                best = found if best is None or found.fun < best.fun else best
            print(f"| {robot} | {label}: {', '.join(str(c) for c in grid)} | {worst(lqr_k):.2f} | "
                  f"{np.array2string(best.x, precision=1)} | {best.fun:.2f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--robots", nargs="+", default=["pendubot", "acrobot"])
    parser.add_argument("--profiles", nargs="+", default=["nominal", "hardware_proxy"])
    parser.add_argument("--levels", type=float, nargs="+", default=[0.5, 1.0, 4.0], help="V / rho of the starts")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--horizon", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--design-sweep", action="store_true", help="other LQR designs on model_1.0 (see above)")
    parser.add_argument("--robust-search", action="store_true", help="search one linear feedback for both regimes")
    parser.add_argument("--restarts", type=int, default=30, help="random restarts of --robust-search")
    parser.add_argument("--dither-sweep", action="store_true", help="the LQR plus a shake of the actuated joint")
    parser.add_argument("--profile", default="hardware_proxy", help="robot profile of --dither-sweep (a name or a "
                                                                    "file, e.g. config/design_robots/*.yaml)")
    parser.add_argument("--q-scales", type=float, nargs="+", default=[1.0],
                        help="--dither-sweep: also the LQR with its Q times each of these")
    parser.add_argument("--amplitudes", type=float, nargs="+", default=[0.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                        help="--dither-sweep: shake amplitudes (N m)")
    parser.add_argument("--frequencies", type=float, nargs="+", default=[3.0, 5.0, 8.0],
                        help="--dither-sweep: shake frequencies (Hz)")
    parser.add_argument("--shapes", nargs="+", choices=("sine", "square"), default=["sine", "square"])
    parser.add_argument("--r-scales", type=float, nargs="+", default=[1.0],
                        help="--dither-sweep: also the LQR with its R times each of these")
    parser.add_argument("--passive-dampings", type=float, nargs="+", default=[0.0],
                        help="--dither-sweep: also the LQR designed with this viscous damping (N m s/rad) added on "
                             "the passive joint (a linear stand-in for its friction under the shake)")
    args = parser.parse_args()
    if args.dither_sweep:
        dither_sweep(args.robots, args.levels, args.samples, args.horizon, args.seed, args.profile,
                     tuple(args.q_scales), tuple(args.amplitudes), tuple(args.frequencies), tuple(args.shapes),
                     tuple(args.r_scales), tuple(args.passive_dampings))
        return 0
    if args.robust_search:
        robust_search(args.robots, args.restarts, args.seed)
        return 0
    if args.design_sweep:
        design_sweep(args.robots, args.samples, args.horizon, args.seed)
        return 0
    friction = load_plant_parameters(CONFIG / "plant_models.yaml", "model_1.0")
    print("| robot | profile | compensation / dither | " + " | ".join(f"V = {v} rho" for v in args.levels) + " |")
    print("|---|---|---|" + "---|" * len(args.levels))
    for robot in args.robots:
        config = load_robot_config(CONFIG / f"{robot}.yaml")
        passive = config.passive_joint
        compensated = dataclasses.replace(config, friction_compensation=FrictionCompensationConfig(
            enabled=True, limit=0.5, coulomb=friction.cf[passive], viscous=friction.b[passive]))
        supervisor = build_controller(config)
        rng = np.random.default_rng(args.seed)
        starts = {v: sample_sublevel_states(supervisor.design, np.full(args.samples, v * supervisor.rho), rng)
                  for v in args.levels}
        dithered = load_robot_config(CONFIG / f"{robot}_dither.yaml")
        for profile in args.profiles:
            for label, cfg in (("off", config), ("on", compensated), ("dither", dithered)):
                if label != "off" and profile == "nominal":
                    continue
                rates = [caught_fraction(cfg, profile, starts[v], args.horizon) for v in args.levels]
                print(f"| {robot} | {profile} | {label} | " + " | ".join(f"{r:.2f}" for r in rates) + " |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
