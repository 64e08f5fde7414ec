"""Experiment: how well one policy optimisation learns on a run's model, for a given horizon, cost and lr.

    python benchmarks/bench_optimisation.py runs/pendubot_rk4 --trial 2 --horizon 1.5 --steps 1500 \
        [--velocity-lengthscale 12] [--lr 0.01] [--particles 200] [--pool-fraction 0.7] [--out policy.npz]

Loads the run's data and the model of ``--trial`` (with the post-disturbance pool as the run had it), starts a
fresh policy with the run's initialisation, and runs ``--steps`` Adam steps on the run's initial-state
distribution of the next trial with the given horizon and cost, without the plateau rule. Prints the training
cost at the start and the end and a fixed yardstick: the 3 s particle cost of the seed's angle-only cost from
400 fixed initial states, before and after (the model is near-exact with ``gp.prior: rk4``, so this tracks the
robot). Score the saved policy with ``python benchmarks/bench_policies.py OUT --config config/ROBOT.yaml``.
This is how the horizon and the velocity term of the RK4 training configs were chosen (docs/learner.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from mcpilco_core.learning.cost import CostSettings, trajectory_cost
from mcpilco_core.learning.learner import Learner, initial_distribution, trial_generators
from mcpilco_core.learning.model import rollout
from mcpilco_core.learning.optimizer import optimize_policy
from mcpilco_core.learning.runs import RunDirectory
from mcpilco_core.learning.torch_policy import TorchPolicy
from mcpilco_core.policy import save_policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--trial", type=int, help="model of this trial (default: the last complete one)")
    parser.add_argument("--horizon", type=float, required=True, help="s")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--particles", type=int, default=200)
    parser.add_argument("--pool-fraction", type=float, help="default: the run's")
    parser.add_argument("--velocity-lengthscale", type=float, help="rad/s (default: the run's cost)")
    parser.add_argument("--seed", type=int, default=99)
    parser.add_argument("--out", type=Path, help="write the optimised policy here (.npz)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = RunDirectory(args.run)
    config = run.load_config()
    done = [k for k in run.completed_trials() if args.trial is None or k <= args.trial]
    learner = Learner(config)
    learner.restore([run.load_trial(k, config.robot.robot) for k in done], learner.build_initial_pool())
    dist = initial_distribution(config, done[-1] + 1, learner.pool)
    if args.pool_fraction is not None:
        dist.pool_fraction = args.pool_fraction
    cost = config.cost
    if args.velocity_lengthscale is not None:
        cost = CostSettings(cost.lengthscales, (args.velocity_lengthscale,) * 2)
    _, gen = trial_generators(0, args.seed)
    policy = TorchPolicy.random(config.num_basis, config.policy_u_max, gen, config.center_dq_range,
                                config.torch_dtype, config.initial_lengthscales)
    sampler = dist.sampler("cpu", config.torch_dtype)
    x_fixed = sampler(400, torch.Generator().manual_seed(5))
    seed_cost = CostSettings(cost.lengthscales)

    def yardstick() -> float:
        with torch.no_grad():
            trajectory = rollout(learner.model, policy, x_fixed, 150, torch.Generator().manual_seed(1))
            return float(trajectory_cost(trajectory, seed_cost))

    before, start = yardstick(), time.perf_counter()
    settings = dataclasses.replace(config.optimizer, lr=args.lr, min_steps=10 ** 9)
    result = optimize_policy(policy, learner.model, sampler, args.particles, round(args.horizon / 0.02), cost,
                             settings, args.steps, gen, progress=False)
    costs = np.asarray(result.cost)
    print(f"horizon {args.horizon} s, {args.particles} particles, lr {args.lr}, pool {dist.pool_fraction}, "
          f"velocity lengthscales {cost.velocity_lengthscales}: 3 s yardstick {before:.1f} -> {yardstick():.1f}; "
          f"training cost {costs[:30].mean():.2f} -> {costs[-30:].mean():.2f}; "
          f"{args.steps} steps in {time.perf_counter() - start:.0f} s")
    if args.out:
        save_policy(policy.to_numpy(config.robot.robot, config.robot.policy_period,
                                    {"experiment": {k: str(v) for k, v in vars(args).items()}}),
                    args.out)


if __name__ == "__main__":
    main()
