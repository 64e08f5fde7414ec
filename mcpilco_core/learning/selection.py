"""Choosing a run's policy: every trial's policy rolled out on the run's newest model, then (optionally) the few
best of them checked on the robot, that time counted.

Picking the trial to ship by scoring each trial's policy on the robot costs robot time (10 protocol runs of 60 s
per trial would be 10 minutes each); shipping the last trial wastes the run when it relapsed. The run's newest
model (fitted on every trial but the last) already knows the robot: roll every trial's policy out on it from the
same particles -- the post-disturbance starts the run collected, or the trial's own start distribution -- with the
same noise, and rank the policies by the particle estimate of J (the plain saturated cost of the training config,
without the catch model or the ROA term, so that the ranking does not depend on what was being optimised).
No robot time: the ranking runs nothing on the robot.

The model's ranking is a weak signal when the policies are close in model cost: on the hardware proxy a session's
model put a relapsed last trial first. A short robot check of the model's top few candidates settles that for a
little counted robot time: each runs ``seconds`` of the evaluation protocol (the same seeded disturbances for all)
on the robot, and the one up the longest ships. Those seconds are robot time; ``selection.json`` counts them, and
they come on top of the run's own (a real robot runs the same check with the controller node and the driver's
disturbance windows; the simulated one runs it here, on the run's robot profile).

    mcpilco select runs/NAME            # table of every trial's model cost, writes runs/NAME/selection.json
    mcpilco select runs/NAME --check 3  # + the model's best 3 checked for 20 s each on the robot (60 s counted)
    mcpilco select runs/NAME --export runs/NAME/selected_policy.npz
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ..policy import load_policy
from .cost import CostSettings, trajectory_cost
from .model import DynamicsModel, particle_noise, rollout
from .runs import RunDirectory
from .torch_policy import TorchPolicy


@dataclass(frozen=True)
class RobotCheck:
    """The robot check of the model's best ``count`` candidates: ``seconds`` (s) of the protocol each, disturbance
    schedule of ``seed`` (one for all, so they meet the same pushes), on ``profile`` (None: the run's robot)."""

    count: int
    seconds: float = 20.0
    seed: int = 1000
    profile: str | None = None

    def __post_init__(self) -> None:
        if self.count < 1 or not self.seconds > 0 or self.seed < 0:
            raise ValueError(f"robot check: need count >= 1, seconds > 0 and seed >= 0 (got {self.count}, "
                             f"{self.seconds}, {self.seed})")


@dataclass
class Selection:
    """Model costs of every trial's policy (trial index -> J, dimensionless) and the trial chosen: the one up the
    longest in the robot check when there was one (ties: the lower model cost), else the lowest model cost."""

    run: str
    model_trial: int
    particles: int
    horizon: float
    seed: int
    costs: dict[int, float] = field(default_factory=dict)
    files: dict[int, str] = field(default_factory=dict)     # trial index -> its policy file
    check: RobotCheck | None = None
    check_scores: dict[int, float] = field(default_factory=dict)   # trial index -> fraction of the check up

    def ranked(self) -> list[int]:
        """Trials by model cost, best first (ties: the later trial)."""
        return sorted(self.costs, key=lambda k: (self.costs[k], -k))

    @property
    def best(self) -> int:
        if self.check_scores:
            order = self.ranked()
            return max(self.check_scores, key=lambda k: (self.check_scores[k], -order.index(k)))
        return self.ranked()[0]

    @property
    def robot_time(self) -> float:
        """Seconds of robot time the choice took (the robot check; the model ranking takes none)."""
        return len(self.check_scores) * self.check.seconds if self.check else 0.0

    def to_dict(self) -> dict:
        check = None if self.check is None else {
            "count": self.check.count, "seconds_each": self.check.seconds, "seed": self.check.seed,
            "robot_profile": self.check.profile, "scores": {str(k): v for k, v in self.check_scores.items()}}
        return {"run": self.run, "model_trial": self.model_trial, "particles": self.particles,
                "horizon_s": self.horizon, "seed": self.seed, "robot_time_s": self.robot_time,
                "costs": {str(k): v for k, v in self.costs.items()}, "robot_check": check,
                "selected_trial": self.best, "selected_policy": self.files.get(self.best, "")}


def run_pool(run: RunDirectory, trials: list[int]) -> np.ndarray:
    """The post-disturbance states (M, 4) every trial of the run collected."""
    pools = [np.load(path) for k in trials if (path := run.trial_path(k) / "disturbance_states.npy").exists()]
    return np.concatenate([np.zeros((0, 4))] + pools)


def _rank(root: Path, model_trial: int, model: DynamicsModel, files: dict[int, Path], config, pool: np.ndarray,
          particles: int, horizon: float | None, seed: int, check: RobotCheck | None) -> Selection:
    """Every policy file rolled out on ``model`` from the same particles (drawn from ``pool``) and noise, ranked by
    the plain saturated cost of the training config; then the robot check, if asked."""
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
    if check is not None:
        check_on_robot(selection, config, check)
    return selection


def check_on_robot(selection: Selection, config, check: RobotCheck) -> None:
    """Run the model's best ``check.count`` policies for ``check.seconds`` of the protocol each on the robot
    (``check.profile``, or the run's), recording the fraction of the time each was up (counted robot time)."""
    from ..control import build_controller
    from ..evaluation import evaluate_seed

    profile = check.profile or config.robot_profile
    selection.check = replace(check, profile=profile)
    for k in selection.ranked()[: check.count]:
        policy = load_policy(selection.files[k], robot=config.robot.robot, torque_limit=config.robot.torque_limit)
        result = evaluate_seed(build_controller(config.robot, policy), config.robot, check.seed, check.seconds,
                               False, profile)
        selection.check_scores[k] = float(result.score)


def select_policy(root: str | Path, particles: int = 600, horizon: float | None = None,
                  seed: int = 0, check: RobotCheck | None = None) -> Selection:
    """Model cost of every trial's policy on the run's newest model (see the module docstring), then the robot
    check if asked; ``root`` may also be the output of ``mcpilco session`` (:func:`select_session_policy`)."""
    if (Path(root) / "retrain").is_dir() and (Path(root) / "session").is_dir():
        return select_session_policy(root, particles, horizon, seed, check)
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
    return _rank(run.root, trials[-1], model, files, config, run_pool(run, trials), particles, horizon, seed, check)


def select_session_policy(root: str | Path, particles: int = 600, horizon: float | None = None,
                          seed: int = 0, check: RobotCheck | None = None) -> Selection:
    """The same for a ``mcpilco session`` output (``retrain/`` policies and models, ``session/`` bags): every
    retrain's policy (trial k = retrain k, ``policy_{k-1:03d}_*.npz``) on the newest model, from the pool a retrain
    grows (:func:`retrain.trial_pool_states`: the states the session's windows handed over and those each trial's
    policy meets on the learner's model; no robot time), as the offline run's pool."""
    from ..recording import load_sessions
    from .learner import Learner, load_train_config
    from .retrain import policy_files, trial_pool_states

    root = Path(root)
    config = load_train_config(root / "retrain" / "train_config.yaml")
    models = sorted((root / "retrain" / "models").glob("model_*.npz"))
    policies = sorted((root / "retrain" / "policies").glob("policy_*.npz"))
    if not models or not policies:
        raise ValueError(f"{root}/retrain holds no model or no policy yet")
    model = DynamicsModel(config.model_robot, config.gp)
    with np.load(models[-1]) as arrays:
        model.load_arrays({k: arrays[k] for k in arrays.files}, "cpu", torch.float64)
    trials = load_sessions([root / "session"], config.robot).trials
    pool = np.concatenate([Learner(config).build_initial_pool(),
                           trial_pool_states(config, trials, policy_files(root / "retrain" / "policies"))])
    files = {int(path.name.split("_")[1]) + 1: path for path in policies}
    return _rank(root, len(models), model, files, config, pool, particles, horizon, seed, check)


def write_selection(selection: Selection, path: str | Path) -> None:
    Path(path).write_text(json.dumps(selection.to_dict(), indent=2) + "\n", encoding="utf-8")
