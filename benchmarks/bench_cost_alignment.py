"""Does the particle cost rank policies as the protocol does? For each policy: its particle cost (the learner's
saturated cost, with the optional velocity, line and catch terms, summed over the horizon and averaged over the
starts) on an exact simulation of the robot's plant, and its protocol score on that robot.

    python benchmarks/bench_cost_alignment.py --robot acrobot --config config/acrobot_dither_tuned.yaml \
        --robot-profile config/design_robots/acrobot_exploration_identified.yaml --velocity-lengthscale 6 \
        --height-weight 1 --policies policies/acrobot_hardware_proxy_nominal.npz policies/acrobot.npz ...

Why: a polish lowers the particle cost and keeps what the judge scores best. If the cost is flat where the score is
steep, the gradient can lose what the protocol rewards (the catch) while the cost hardly changes (docs/learner.md,
"Why polishing on a friction model loses on the friction robot"). This measures it on a perfect model of the plant,
so the model's own error is out of the picture.

With ``--supervised`` the rollouts are the whole controller (the policy, the switching LQR with its shake and
damping) on the full robot instead: what the particles would see if the supervisor ran in them.

The starts are the states right after the protocol's disturbances with the first policy on the robot (``--pool-seeds``,
the polish's "judge" pool), drawn with replacement (``--starts``, ``--start-seed``); every policy starts from the same
ones. The rollouts are the plant of ``--robot-profile`` alone (ideal sensors and motors), integrated with RK4 at the
protocol's 2 ms, each policy's torque held for its own period. The scores are the protocol on the full profile
(``--seeds``). Prints a markdown table, the Spearman rank correlation of -cost with the score, and the spreads
(the cost's relative range against the score's range); ``--json`` writes the same.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.evaluation import DT, config_path_for, fractions_up  # noqa: E402
from mcpilco_core.plant import DoublePendulum  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402
from mcpilco_core.simulation import load_robot_profile  # noqa: E402


def cost_settings(robot, args):
    """The learner's cost with the terms asked for (the catch model from the controller's own LQR and ROA)."""
    from mcpilco_core.learning.cost import CostSettings, with_catch_model, with_height_term

    velocity = (args.velocity_lengthscale,) * 2 if args.velocity_lengthscale > 0 else None
    cost = CostSettings(lengthscales=tuple(args.lengthscales), velocity_lengthscales=velocity)
    if args.catch_level > 0:
        cost = with_catch_model(cost, robot, args.catch_level, args.catch_sharpness)
    return with_height_term(cost, args.height_weight, 0.02, robot.plant.l)


def protocol_starts(policy, robot, profile, pool_seeds, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` states (n, 4) drawn with replacement from those right after the protocol's disturbances."""
    from mcpilco_core.learning.learner import post_disturbance_states

    states, _ = post_disturbance_states(build_controller(robot, policy), robot, pool_seeds, profile=profile)
    return states[rng.integers(0, len(states), n)]


def plant_rollout(plant: DoublePendulum, policy, actuated: int, x0: np.ndarray, horizon: float) -> np.ndarray:
    """States (T + 1, P, 4) every policy period over ``horizon`` s, the policy's torque held between (RK4 at DT)."""
    import torch

    from mcpilco_core.learning.torch_policy import TorchPolicy

    torch_policy = TorchPolicy.from_numpy(policy, torch.float64)
    substeps = max(1, int(round(policy.control_period / DT)))
    x, states = x0.astype(float).copy(), [x0.astype(float).copy()]
    for _ in range(int(round(horizon / policy.control_period))):
        phi = torch.as_tensor(np.concatenate([x[:, 2:], np.cos(x[:, :2]), np.sin(x[:, :2])], 1))
        with torch.no_grad():
            u = torch_policy.forward_features(phi).numpy()
        torques = np.zeros((len(x), 2))
        torques[:, actuated] = u
        for _ in range(substeps):
            x = plant.rk4_step(x, torques, DT)
        states.append(x.copy())
    return np.array(states)


def supervised_rollout(robot, policy, profile, x0: np.ndarray, horizon: float) -> np.ndarray:
    """States (T + 1, P, 4) every policy period over ``horizon`` s of the whole controller (the policy, the switching
    LQR, its shake and damping) on the full simulated robot of ``profile``, one run per start (noise seed = its
    index): what the particles would see if the supervisor ran in their rollouts."""
    from mcpilco_core.learning.learner import run_on_robot

    every = max(1, int(round(policy.control_period / robot.control_period)))
    steps = int(round(horizon / policy.control_period))
    controller, runs = build_controller(robot, policy), []
    for i, start in enumerate(x0):                       # each run resets the controller (simulation.drive)
        trajectory = run_on_robot(robot, controller, start, horizon, profile, seed=i)
        runs.append(np.asarray(trajectory.x)[: steps * every + 1: every])
    return np.stack(runs, 1)


def particle_cost(states: np.ndarray, cost) -> float:
    import torch

    from mcpilco_core.learning.cost import trajectory_cost

    return float(trajectory_cost(torch.as_tensor(states), cost))


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic) if len(a) > 2 else float(np.sign((a[1] - a[0]) * (b[1] - b[0])))


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--robot", choices=["pendubot", "acrobot"], required=True)
    p.add_argument("--config", default=None, help="robot config: the controller (default config/ROBOT.yaml)")
    p.add_argument("--policies", nargs="+", required=True, help="two or more policy files")
    p.add_argument("--robot-profile", default="nominal", help="the robot: its plant for the rollouts, all of it "
                                                              "for the protocol")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(200, 212)), help="protocol seeds of the score")
    p.add_argument("--pool-seeds", type=int, nargs="+", default=list(range(1000, 1010)),
                   help="protocol seeds whose post-disturbance states are the starts")
    p.add_argument("--starts", type=int, default=300)
    p.add_argument("--start-seed", type=int, default=0)
    p.add_argument("--horizon", type=float, default=2.0, help="s")
    p.add_argument("--lengthscales", type=float, nargs=2, default=[3.0, 3.0], help="rad, the saturated distance's")
    p.add_argument("--velocity-lengthscale", type=float, default=0.0, help="rad/s, both joints (0: no velocity term)")
    p.add_argument("--height-weight", type=float, default=0.0, help="the below-the-line term's weight (0: none)")
    p.add_argument("--catch-level", type=float, default=0.0, help="V50 of the catch model in units of rho (0: none)")
    p.add_argument("--catch-sharpness", type=float, default=4.0)
    p.add_argument("--supervised", action="store_true",
                   help="roll out the whole controller (policy, switching LQR, shake, damping) on the full robot "
                        "instead of the policy alone on the plant")
    p.add_argument("--jobs", type=int, default=1, help="processes for the protocol's seeds")
    p.add_argument("--json", default=None, help="write the table and the statistics here")
    args = p.parse_args(argv)
    if len(args.policies) < 2:
        p.error("--policies: at least two, to rank")
    if args.starts < 1 or args.horizon <= 0:
        p.error("--starts must be >= 1 and --horizon > 0")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    robot = load_robot_config(args.config or config_path_for(args.robot))
    profile = load_robot_profile(args.robot_profile)
    plant = DoublePendulum(profile.plant_parameters(robot))
    cost = cost_settings(robot, args)
    policies = [load_policy(p, robot=args.robot, torque_limit=robot.torque_limit) for p in args.policies]
    x0 = protocol_starts(policies[0], robot, profile, args.pool_seeds, args.starts,
                         np.random.default_rng(args.start_seed))
    rows = []
    for path, policy in zip(args.policies, policies):
        states = (supervised_rollout(robot, policy, profile, x0, args.horizon) if args.supervised else
                  plant_rollout(plant, policy, robot.actuated_joint, x0, args.horizon))
        scores = fractions_up(build_controller(robot, policy), robot, args.seeds, profile=profile,
                              processes=args.jobs)
        rows.append({"policy": path, "particle_cost": particle_cost(states, cost), "score": float(np.mean(scores)),
                     "score_std": float(np.std(scores))})
    costs, scores = [r["particle_cost"] for r in rows], [r["score"] for r in rows]
    stats = {"spearman_score_vs_minus_cost": spearman([-c for c in costs], scores),
             "cost_range_relative": (max(costs) - min(costs)) / max(abs(min(costs)), 1e-12),
             "score_range": max(scores) - min(scores)}
    print(f"robot profile {profile.label}, {args.starts} starts, {args.horizon:g} s, "
          f"{'the whole controller on the robot' if args.supervised else 'the policy alone on the plant'}; "
          f"seeds {args.seeds}")
    print("| policy | particle cost | protocol score |")
    print("|---|---|---|")
    for r in sorted(rows, key=lambda r: r["particle_cost"]):
        print(f"| {r['policy']} | {r['particle_cost']:.2f} | {r['score']:.3f} ± {r['score_std']:.3f} |")
    print(f"Spearman(-cost, score) {stats['spearman_score_vs_minus_cost']:+.2f}; the costs span "
          f"{100 * stats['cost_range_relative']:.1f} % of the lowest, the scores {stats['score_range']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "rows": rows, **stats}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
