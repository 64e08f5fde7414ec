"""Why particles escape (non-finite states) in a run's policy optimisation: roll the policy a trial started from out
on that trial's model, step by step without the finite check, and name the part of the transition that went
non-finite first (the GP's mean or variance of an output, or the prior); print the model's fitted lengthscales and
how far the scaled inputs reach (beyond about 1e3 the float32 kernel's expanded squared distance loses all
precision; docs/learner.md, "A diverging optimisation rolls back").

    python benchmarks/bench_escapes.py runs/a0 --trial 10 --rollouts 10

No robot time: the run's own model and policies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpilco_core.learning.learner import initial_distribution  # noqa: E402
from mcpilco_core.learning.model import DynamicsModel  # noqa: E402
from mcpilco_core.learning.runs import RunDirectory  # noqa: E402
from mcpilco_core.learning.selection import run_pool  # noqa: E402
from mcpilco_core.learning.torch_policy import TorchPolicy  # noqa: E402
from mcpilco_core.policy import FEATURE_ORDER, load_policy  # noqa: E402

GP_INPUTS = FEATURE_ORDER + ("u",)
OUTPUTS = ("Δdq1", "Δdq2")


def first_escape(model: DynamicsModel, policy: TorchPolicy, x: torch.Tensor, steps: int,
                 generator: torch.Generator) -> str | None:
    """The first non-finite transition of one rollout from the particles ``x`` (P, 4), described; None if none."""
    previous = None
    for t in range(steps):
        u, u_eff, prior, mean, var = model.transition_parts(x, policy, previous)
        delta = prior + mean + torch.sqrt(var) * torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        bad = ~torch.isfinite(delta).all(-1)
        if bool(bad.any()):
            p = int(torch.nonzero(bad)[0])
            parts = [f"{name} of {OUTPUTS[j]}" for name, part in (("prior", prior), ("GP mean", mean),
                                                                  ("GP variance", var))
                     for j in range(2) if not bool(torch.isfinite(part[p, j]))]
            return (f"step {t}, particle {p} of {x.shape[0]}: state {np.round(x[p].numpy(), 2).tolist()} "
                    f"(rad, rad/s), torque {float(u_eff[p]):.2f} N m; non-finite: {', '.join(parts)}")
        x = model.advance(x, delta)
        previous = u
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an offline run directory (mcpilco train --out)")
    parser.add_argument("--trial", type=int, required=True, help="the trial whose optimisation met escapes (>= 2)")
    parser.add_argument("--rollouts", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    run = RunDirectory(args.run)
    config = run.load_config()
    record = run.load_trial(args.trial, config.robot.robot)
    if record.model_arrays is None:
        raise SystemExit(f"{args.run}: trial {args.trial} holds no model")
    model = DynamicsModel(config.model_robot, config.gp)
    model.load_arrays(record.model_arrays, "cpu", torch.float32)
    policy = TorchPolicy.from_numpy(load_policy(run.trial_path(args.trial - 1) / "policy.npz"), torch.float32)
    sample = initial_distribution(config, args.trial, run_pool(run, list(range(args.trial)))).sampler(
        "cpu", torch.float32)
    generator = torch.Generator().manual_seed(args.seed)
    post = model.posterior
    print(f"trial {args.trial}'s model, trial {args.trial - 1}'s policy, {config.particles} particles x "
          f"{config.horizon_steps} steps, float32")
    print("| output | " + " | ".join(f"lengthscale {n}" for n in GP_INPUTS) + " | largest scaled input |")
    print("|---|" + "---|" * (len(GP_INPUTS) + 1))
    for j, name in enumerate(OUTPUTS):
        ls = 1.0 / post.inv_lengthscales[j].double().numpy()
        print(f"| {name} | " + " | ".join(f"{v:.3g}" for v in ls)
              + f" | {float(post.scaled_inputs[j].abs().max()):.3g} |")
    escaped = 0
    with torch.no_grad():
        for i in range(args.rollouts):
            found = first_escape(model, policy, sample(config.particles, generator), config.horizon_steps, generator)
            escaped += found is not None
            print(f"rollout {i}: {found or 'all particles finite'}")
    print(f"{escaped} of {args.rollouts} rollouts escaped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
