"""Choosing a run's policy: every trial's policy rolled out on the run's newest model, then (optionally) the few
best of them checked on the robot, that time counted.

Picking the trial to ship by scoring each trial's policy on the robot costs robot time (10 protocol runs of 60 s
per trial would be 10 minutes each); shipping the last trial wastes the run when it relapsed. The run's newest
model (fitted on every trial but the last) already knows the robot: roll every trial's policy out on it from the
same particles -- the post-disturbance starts the run collected, or the trial's own start distribution -- with the
same noise, and rank the policies by the particle estimate of J (the plain saturated cost of the training config,
without the catch model or the ROA term, so that the ranking does not depend on what was being optimised).
No robot time: the ranking runs nothing on the robot.

That particle cost barely separates the trials of a hardware-proxy run (39-42 for policies scoring 0.27-0.66), so
the ranking now comes first from the *protocol on the model* (:class:`ModelProtocol`): the evaluation protocol
(disturbances, reset PID, the controller's policy/LQR switching) simulated on the learner's own plant -- the newest
model's prior, with the friction and rotor inertia ``gp.identify`` fitted to the recorded trials, ideal sensors and
motors. It is a simulation of the model, never of the robot: no robot time. On five hardware-proxy runs its
scores followed the proxy's per trial (docs/learner.md, "Choosing by the protocol on the model"); the particle cost
stays in the table and breaks ties.

The model's ranking is a weak signal when the policies are close in model cost: on the hardware proxy a session's
model put a relapsed last trial first. A short robot check of the best-ranked candidates settles that for a
little counted robot time: each runs ``seconds`` of the evaluation protocol (the same seeded disturbances for all)
on the robot, in rank order, until the robot confirms what the model predicts for that same check
(:class:`RobotCheck`; without a tolerance all run and the one up the longest ships). Those seconds are robot time;
``selection.json`` counts them, and they come on top of the run's own (a real robot runs the same check with the
controller node and the driver's disturbance windows; the simulated one runs it here, on the run's robot profile).

    mcpilco select runs/NAME             # every trial's protocol score on the model and model cost -> selection.json
    mcpilco select runs/NAME --rank cost # the particle cost alone (how runs were chosen before)
    mcpilco select runs/NAME --check 3   # + the best 3, in rank order, 20 s each on the robot until one is
                                         #   confirmed (20-60 s counted)
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
from .identified_robot import identify_robot
from .model import DynamicsModel, denormals_flushed, particle_noise, rollout
from .protocol import on_model, protocol_scores
from .runs import RunDirectory, run_state_recordings
from .torch_policy import TorchPolicy

MAX_PROTOCOL_SECONDS = 3600.0   # s: one protocol run of a check or of the model's protocol (the protocol is 60 s)


@dataclass(frozen=True)
class RobotCheck:
    """The robot check of the best-ranked ``count`` candidates: ``seconds`` (s) of the protocol each, disturbance
    schedule of ``seed`` (one for all, so they meet the same pushes), on ``profile`` (None: the run's robot).

    ``tolerance`` (fraction of the time up): the check *confirms* the ranking. Candidates run in rank order, each
    also simulated on the model's plant for the same seconds and seed (no robot time); the first whose robot score
    is at least its model score minus ``tolerance`` is chosen and the check stops there, so a confirmed first
    candidate costs ``seconds`` of robot time, not ``count`` x ``seconds``. If none is confirmed: the best robot
    score. Why: a 20 s check is a noisy measurement (its score on one seed moves by 0.05-0.1 between policies
    the 240 s protocol on the model ranks 0.02 apart), good at catching a policy that fails on the robot (robot
    0.0 where the model says 0.45) and poor at ordering good ones. 0.15 is about 2.5 x the spread of a 20 s score
    on the model itself (0.05-0.06 over 40 seeds; docs/learner.md). None: every candidate runs and the best robot
    score wins (how runs were chosen before)."""

    count: int
    seconds: float = 20.0
    seed: int = 1000
    profile: str | None = None
    tolerance: float | None = 0.15

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 < self.seconds <= MAX_PROTOCOL_SECONDS or self.seed < 0:
            raise ValueError(f"robot check: need count >= 1, seconds > 0 and seed >= 0 (got {self.count}, "
                             f"{self.seconds}, {self.seed})")
        if self.tolerance is not None and not self.tolerance >= 0:
            raise ValueError(f"robot check: the tolerance must be >= 0 or None, got {self.tolerance}")


LEARNER_ROBOTS = ("model", "plant", "identified")


@dataclass(frozen=True)
class ModelProtocol:
    """The evaluation protocol simulated on the learner's plant (module docstring): ``seconds`` (s) for each
    disturbance schedule of ``seeds``; the mean fraction of the time up ranks the policies. No robot time.

    robot: which learner's robot it runs on (protocol.on_model): ``model`` = what the newest model holds (the
    robot identified at the state rate when the run had ``gp.identify_robot``, else the GP prior's plant with
    ideal sensors and motors); ``plant`` = the GP prior's plant, ideal, always; ``identified`` = the robot
    identified anew from all the run's recorded trials (identified_robot.py), whatever the model holds."""

    seeds: tuple[int, ...] = (2000, 2001, 2002, 2003)
    seconds: float = 60.0
    robot: str = "model"

    def __post_init__(self) -> None:
        if not self.seeds or any(s < 0 for s in self.seeds) or not 0 < self.seconds <= MAX_PROTOCOL_SECONDS:
            raise ValueError(f"protocol on the model: need seeds >= 0 (at least one) and seconds > 0 (got "
                             f"{list(self.seeds)}, {self.seconds})")
        if self.robot not in LEARNER_ROBOTS:
            raise ValueError(f"protocol on the model: robot must be one of {LEARNER_ROBOTS}, got {self.robot!r}")


@dataclass
class Selection:
    """Every trial's policy scored without the robot -- its protocol score on the model (trial index -> fraction
    of the time up) when asked, and its model cost (J, dimensionless) -- and the trial chosen: the one up the
    longest in the robot check when there was one (ties: the better ranked), else the best ranked. Ranked by the
    protocol score (ties: the lower model cost), or by the model cost alone when no protocol ran."""

    run: str
    model_trial: int
    particles: int
    horizon: float
    seed: int
    costs: dict[int, float] = field(default_factory=dict)
    files: dict[int, str] = field(default_factory=dict)     # trial index -> its policy file
    check: RobotCheck | None = None
    check_scores: dict[int, float] = field(default_factory=dict)   # trial index -> fraction of the check up
    check_predictions: dict[int, float] = field(default_factory=dict)   # the same check on the model's plant
    protocol: ModelProtocol | None = None
    protocol_scores: dict[int, float] = field(default_factory=dict)  # trial index -> mean fraction up on the model
    protocol_plant: dict[str, list[float] | float] = field(default_factory=dict)   # the model's b, cf, Ir

    def ranked(self) -> list[int]:
        """Trials best first: by protocol score on the model if it ran, then by model cost (ties: the later
        trial)."""
        if self.protocol_scores:
            return sorted(self.costs, key=lambda k: (-self.protocol_scores[k], self.costs[k], -k))
        return sorted(self.costs, key=lambda k: (self.costs[k], -k))

    @property
    def best(self) -> int:
        if self.check_scores:
            if (confirmed := self.confirmed) is not None:
                return confirmed
            order = self.ranked()
            return max(self.check_scores, key=lambda k: (self.check_scores[k], -order.index(k)))
        return self.ranked()[0]

    @property
    def confirmed(self) -> int | None:
        """The best-ranked checked trial whose robot score confirms its model score (:class:`RobotCheck`), if any."""
        if self.check is None or self.check.tolerance is None:
            return None
        for k in self.ranked():
            if k in self.check_scores and k in self.check_predictions and \
                    self.check_scores[k] >= self.check_predictions[k] - self.check.tolerance:
                return k
        return None

    @property
    def robot_time(self) -> float:
        """Seconds of robot time the choice took (the robot check; the model ranking takes none)."""
        return len(self.check_scores) * self.check.seconds if self.check else 0.0

    def to_dict(self) -> dict:
        check = None if self.check is None else {
            "count": self.check.count, "seconds_each": self.check.seconds, "seed": self.check.seed,
            "robot_profile": self.check.profile, "tolerance": self.check.tolerance,
            "scores": {str(k): v for k, v in self.check_scores.items()},
            "on_model": {str(k): v for k, v in self.check_predictions.items()}, "confirmed": self.confirmed}
        protocol = None if self.protocol is None else {
            "seeds": list(self.protocol.seeds), "seconds_each": self.protocol.seconds, "robot": self.protocol.robot,
            "plant": self.protocol_plant,
            "scores": {str(k): v for k, v in self.protocol_scores.items()}}
        return {"run": self.run, "model_trial": self.model_trial, "particles": self.particles,
                "horizon_s": self.horizon, "seed": self.seed, "robot_time_s": self.robot_time,
                "ranked_by": "protocol on the model" if self.protocol_scores else "model cost",
                "costs": {str(k): v for k, v in self.costs.items()}, "protocol_on_model": protocol,
                "ranking": self.ranked(), "policies": {str(k): str(v) for k, v in self.files.items()},
                "robot_check": check,
                "selected_trial": self.best, "selected_policy": self.files.get(self.best, "")}


def run_pool(run: RunDirectory, trials: list[int]) -> np.ndarray:
    """The post-disturbance states (M, 4) every trial of the run collected."""
    pools = [np.load(path) for k in trials if (path := run.trial_path(k) / "disturbance_states.npy").exists()]
    return np.concatenate([np.zeros((0, 4))] + pools)


def _rank(root: Path, model_trial: int, model: DynamicsModel, files: dict[int, Path], config, pool: np.ndarray,
          particles: int, horizon: float | None, seed: int, check: RobotCheck | None,
          protocol: ModelProtocol | None) -> Selection:
    """Every policy file rolled out on ``model`` from the same particles (drawn from ``pool``) and noise, costed by
    the plain saturated cost of the training config; the protocol on ``model``'s plant, if asked; then the robot
    check, if asked."""
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
        with torch.no_grad(), denormals_flushed():
            states = rollout(model, policy, x0, steps, None, noise=noise, mode="reference")
        selection.costs[k] = float(trajectory_cost(states, cost))
        selection.files[k] = str(path)
    if protocol is not None:
        protocol_on_model(selection, config, model, protocol)
    if check is not None:
        check_on_robot(selection, config, check, model)
    return selection


def protocol_on_model(selection: Selection, config, model: DynamicsModel, protocol: ModelProtocol) -> None:
    """Score every policy of ``selection`` by the protocol simulated on the learner's own robot (:func:`on_model`:
    the model's plant with ideal sensors and motors, or the robot identified at the state rate): the controller
    is the run's own (its LQR designed as the robot config says); only the simulated robot is the learner's. No
    robot time."""
    robot, profile = on_model(config, model)
    selection.protocol = protocol
    selection.protocol_plant = {"b": list(robot.plant.b), "cf": list(robot.plant.cf), "Ir": robot.plant.Ir,
                                **({"identified_robot": model.robot.to_dict()} if model.robot is not None else {})}
    for k, path in selection.files.items():
        scores = protocol_scores(config, path, robot, protocol.seeds, protocol.seconds, profile,
                                 config.optimizer.judge_processes)
        selection.protocol_scores[k] = float(np.mean(scores))


def check_on_robot(selection: Selection, config, check: RobotCheck, model: DynamicsModel) -> None:
    """Run the best-ranked ``check.count`` policies for ``check.seconds`` of the protocol each on the robot
    (``check.profile``, or the run's), recording the fraction of the time each was up (counted robot time); with a
    tolerance, each is first simulated on ``model``'s plant (no robot time) and the check stops at the first the
    robot confirms (:class:`RobotCheck`)."""
    profile = check.profile or config.robot_profile
    selection.check = replace(check, profile=profile)
    robot, learner_profile = on_model(config, model)
    for k in selection.ranked()[: check.count]:
        path = selection.files[k]
        if check.tolerance is not None:
            (selection.check_predictions[k],) = protocol_scores(config, path, robot, (check.seed,),
                                                                check.seconds, learner_profile)
        (selection.check_scores[k],) = protocol_scores(config, path, config.robot, (check.seed,), check.seconds,
                                                       profile)
        if selection.confirmed is not None:
            break


def select_policy(root: str | Path, particles: int = 600, horizon: float | None = None,
                  seed: int = 0, check: RobotCheck | None = None,
                  protocol: ModelProtocol | None = ModelProtocol()) -> Selection:
    """Every trial's policy scored on the run's newest model (see the module docstring: the protocol on the model
    unless ``protocol`` is None, and the model cost), then the robot check if asked; ``root`` may also be the
    output of ``mcpilco session`` or a trainer's retrain directory (:func:`select_session_policy`)."""
    from .retrain import session_learning

    if session_learning(root) is not None:
        return select_session_policy(root, particles, horizon, seed, check, protocol)
    run = RunDirectory(root)
    config = run.load_config()
    trials = run.completed_trials()
    candidates = [k for k in trials if (run.trial_path(k) / "policy.npz").exists()]
    if not candidates:
        raise ValueError(f"{run.root} holds no trial with a policy")
    model = newest_run_model(run, config, trials[-1])
    files = {k: run.trial_path(k) / "policy.npz" for k in candidates}   # the trials' data and models are not needed
    choose_learner_robot(model, config, protocol, lambda: run_state_recordings(run.root)[1])
    return _rank(run.root, trials[-1], model, files, config, run_pool(run, trials), particles, horizon, seed, check,
                 protocol)


def select_session_policy(root: str | Path, particles: int = 600, horizon: float | None = None,
                          seed: int = 0, check: RobotCheck | None = None,
                          protocol: ModelProtocol | None = ModelProtocol()) -> Selection:
    """The same for a session (:func:`retrain.session_learning`: its retrain's policies and models, its bags): every
    retrain's policy (trial k = retrain k, ``policy_{k-1:03d}_*.npz``) on the newest model, from the pool a retrain
    grows (:func:`retrain.trial_pool_states`: the states the session's windows handed over and those each trial's
    policy meets on the learner's model; no robot time), as the offline run's pool."""
    session = newest_session(root)
    config, trials = session.config, session.trials
    files = {int(path.name.split("_")[1]) + 1: path for path in session.policies}
    choose_learner_robot(session.model, config, protocol, lambda: [t.states for t in trials])   # the bags read above
    return _rank(Path(root), len(session.models), session.model, files, config, session.pool, particles, horizon,
                 seed, check, protocol)


def _model_from_arrays(config, arrays: dict, training: bool) -> DynamicsModel:
    """A model from saved arrays: in float64 on the CPU for ranking (``training`` False), or as the training config
    runs its rollouts (device, dtype, rollout mode) for optimising further (``mcpilco polish``)."""
    model = DynamicsModel(config.model_robot, config.gp, rollout_mode=config.rollout if training else "fused")
    model.load_arrays(arrays, *((config.device, config.torch_dtype) if training else ("cpu", torch.float64)))
    return model


def newest_run_model(run: RunDirectory, config, trial: int, training: bool = False) -> DynamicsModel:
    """The model an offline run's trial ``trial`` (its newest) holds (:func:`_model_from_arrays`); only that trial
    is read."""
    newest = run.load_trial(trial, config.robot.robot)
    if newest.model_arrays is None:
        raise ValueError(f"{run.root}: its last trial holds no model")
    return _model_from_arrays(config, newest.model_arrays, training)


@dataclass
class NewestSession:
    """What a ``mcpilco session`` output holds for choosing and polishing: its training config, its newest model,
    every retrain's model and policy file, its trials (read from the bags) and the particles' start pool (the
    learner's initial pool and what each trial's policy met, as a retrain grows it)."""

    config: object
    model: DynamicsModel
    models: list[Path]
    policies: list[Path]
    trials: list
    pool: np.ndarray


def newest_session(root: str | Path, training: bool = False) -> NewestSession:
    """A session's newest model (:func:`_model_from_arrays`), its policies, trials and pool (:class:`NewestSession`);
    ``root``: a ``mcpilco session`` output or a retrain directory (:func:`retrain.session_learning`)."""
    from ..recording import load_sessions
    from .learner import Learner, load_train_config
    from .retrain import policy_files, session_learning, trial_pool_states

    learning = session_learning(root)
    if learning is None:
        raise ValueError(f"{root} is neither a session's output (mcpilco session --out) nor a retrain directory "
                         "(retrain.json)")
    retrain = learning.retrain
    config = load_train_config(retrain / "train_config.yaml")
    models = sorted((retrain / "models").glob("model_*.npz"))
    policies = sorted((retrain / "policies").glob("policy_*.npz"))
    if not models or not policies:
        raise ValueError(f"{retrain} holds no model or no policy yet")
    with np.load(models[-1]) as arrays:
        model = _model_from_arrays(config, {k: arrays[k] for k in arrays.files}, training)
    trials = load_sessions(list(learning.sessions), config.robot).trials
    pool = np.concatenate([Learner(config).build_initial_pool(),
                           trial_pool_states(config, trials, policy_files(retrain / "policies"))])
    return NewestSession(config, model, models, policies, trials, pool)


def choose_learner_robot(model: DynamicsModel, config, protocol: ModelProtocol | None, recordings) -> None:
    """Set ``model.robot`` as ``protocol.robot`` asks (:class:`ModelProtocol`); ``recordings()`` gives the run's
    trials at the state rate when the robot is to be identified now."""
    if protocol is None or protocol.robot == "model":
        return
    if protocol.robot == "plant":
        model.robot = None
    else:
        model.robot = identify_robot(config.model_robot.plant, recordings(), config.robot.actuated_joint,
                                     config.robot.torque_limit)
        if model.robot is None:
            raise ValueError("the run's trials hold too few usable state-rate windows to identify the robot")


def write_selection(selection: Selection, path: str | Path, export: dict | None = None,
                    robot_checks: list[dict] | None = None) -> None:
    """selection.json; ``export``: the file the choice was last copied to and its trial (``select --export``);
    ``robot_checks``: every robot check of the run's select commands so far, this one's included, and their sum
    ``robot_time_all_checks_s`` (robot time counted on top of the run's)."""
    checks = list(robot_checks or [])
    record = {**selection.to_dict(), "export": export, "robot_checks": checks,
              "robot_time_all_checks_s": float(sum(c["robot_time_s"] for c in checks))}
    Path(path).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
