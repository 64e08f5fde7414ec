"""Choosing a run's policy without the robot: every trial's policy rolled out on the run's newest model.

Picking the trial to ship by scoring each trial's policy on the robot costs robot time (10 protocol runs of 60 s
per trial would be 10 minutes each); shipping the last trial wastes the run when it relapsed. The run's newest
model (fitted on every trial but the last) already knows the robot: roll every trial's policy out on it from the
same particles -- the post-disturbance starts the run collected, or the trial's own start distribution -- with the
same noise, and rank the policies by the particle estimate of J (the plain saturated cost of the training config,
without the catch model or the ROA term, so that the ranking does not depend on what was being optimised).
No robot time: nothing here runs the robot.

    mcpilco select runs/NAME            # table of every trial's model cost, writes runs/NAME/selection.json
    mcpilco select runs/NAME --export runs/NAME/selected_policy.npz
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..policy import load_policy
from .cost import CostSettings, trajectory_cost
from .model import DynamicsModel, particle_noise, rollout
from .runs import RunDirectory
from .torch_policy import TorchPolicy


@dataclass
class Selection:
    """Model costs of every trial's policy (trial index -> J, dimensionless) and the trial with the lowest."""

    run: str
    model_trial: int
    particles: int
    horizon: float
    seed: int
    costs: dict[int, float] = field(default_factory=dict)
    files: dict[int, str] = field(default_factory=dict)     # trial index -> its policy file

    @property
    def best(self) -> int:
        return min(self.costs, key=lambda k: (self.costs[k], -k))   # ties: the later trial

    def to_dict(self) -> dict:
        return {"run": self.run, "model_trial": self.model_trial, "particles": self.particles,
                "horizon_s": self.horizon, "seed": self.seed, "robot_time_s": 0.0,
                "costs": {str(k): v for k, v in self.costs.items()}, "selected_trial": self.best,
                "selected_policy": self.files.get(self.best, "")}


def run_pool(run: RunDirectory, trials: list[int]) -> np.ndarray:
    """The post-disturbance states (M, 4) every trial of the run collected."""
    pools = [np.load(path) for k in trials if (path := run.trial_path(k) / "disturbance_states.npy").exists()]
    return np.concatenate([np.zeros((0, 4))] + pools)


def _rank(root: Path, model_trial: int, model: DynamicsModel, files: dict[int, Path], config, pool: np.ndarray,
          particles: int, horizon: float | None, seed: int) -> Selection:
    """Every policy file rolled out on ``model`` from the same particles (drawn from ``pool``) and noise, ranked by
    the plain saturated cost of the training config."""
    if not len(pool):
        raise ValueError(f"{root} holds no post-disturbance states to start the particles from "
                         "(initial_state.disturbance_fraction was 0)")
    horizon = config.horizon if horizon is None else horizon
    steps = int(round(horizon / config.robot.policy_period))
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(pool), (particles,), generator=generator)
    x0 = torch.as_tensor(pool[picks.numpy()], dtype=torch.float64)
    noise = particle_noise(steps, particles, generator, torch.float64, "cpu")
    cost = CostSettings(lengthscales=config.cost.lengthscales, velocity_lengthscales=config.cost.velocity_lengthscales)
    selection = Selection(str(root), model_trial, particles, horizon, seed)
    for k, path in files.items():
        policy = TorchPolicy.from_numpy(load_policy(path, robot=config.robot.robot), dtype=torch.float64)
        with torch.no_grad():
            states = rollout(model, policy, x0, steps, None, noise=noise, mode="reference")
        selection.costs[k] = float(trajectory_cost(states, cost))
        selection.files[k] = str(path)
    return selection


def select_policy(root: str | Path, particles: int = 600, horizon: float | None = None,
                  seed: int = 0) -> Selection:
    """Model cost of every trial's policy on the run's newest model (see the module docstring); ``root`` may
    also be the output of ``mcpilco session`` (:func:`select_session_policy`)."""
    if (Path(root) / "retrain").is_dir() and (Path(root) / "session").is_dir():
        return select_session_policy(root, particles, horizon, seed)
    run = RunDirectory(root)
    config = run.load_config()
    trials = run.completed_trials()
    candidates = [k for k in trials if (run.trial_path(k) / "policy.npz").exists()]
    if not candidates:
        raise ValueError(f"{run.root} holds no trial with a policy")
    newest = run.load_trial(trials[-1], config.robot.robot)
    if newest.model_arrays is None:
        raise ValueError(f"{run.root}: its last trial holds no model")
    model = DynamicsModel(config.model_robot, config.gp)
    model.load_arrays(newest.model_arrays, "cpu", torch.float64)
    files = {k: run.trial_path(k) / "policy.npz" for k in candidates}   # the trials' data and models are not needed
    return _rank(run.root, trials[-1], model, files, config, run_pool(run, trials), particles, horizon, seed)


def select_session_policy(root: str | Path, particles: int = 600, horizon: float | None = None,
                          seed: int = 0) -> Selection:
    """The same for a ``mcpilco session`` output (``retrain/`` policies and models, ``session/`` bags): every
    retrain's policy (trial k = retrain k, ``policy_{k-1:03d}_*.npz``) on the newest model, from the post-disturbance
    states the session's windows handed over plus those the learner simulates on its prior model (no robot time)."""
    from ..recording import load_sessions
    from .learner import Learner, load_train_config

    root = Path(root)
    config = load_train_config(root / "retrain" / "train_config.yaml")
    models = sorted((root / "retrain" / "models").glob("model_*.npz"))
    policies = sorted((root / "retrain" / "policies").glob("policy_*.npz"))
    if not models or not policies:
        raise ValueError(f"{root}/retrain holds no model or no policy yet")
    model = DynamicsModel(config.model_robot, config.gp)
    with np.load(models[-1]) as arrays:
        model.load_arrays({k: arrays[k] for k in arrays.files}, "cpu", torch.float64)
    pool = np.concatenate([Learner(config).build_initial_pool(),
                           load_sessions([root / "session"], config.robot).handed_over_states()])
    files = {int(path.name.split("_")[1]) + 1: path for path in policies}
    return _rank(root, len(models), model, files, config, pool, particles, horizon, seed)


def write_selection(selection: Selection, path: str | Path) -> None:
    Path(path).write_text(json.dumps(selection.to_dict(), indent=2) + "\n", encoding="utf-8")
