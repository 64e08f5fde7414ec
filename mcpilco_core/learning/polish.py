"""Polishing a chosen policy on the run's newest model: more optimisation, no robot time.

Why: a trial's optimisation stops at its step cap (1000-1500 steps) with dropout still on (p = 0.25 halved at each
plateau) and with the particles of the recipe (200): it leaves a policy that is good with a quarter of its basis
functions dropped, not the best the model allows with all of them on. Optimising the chosen policy further on the
run's newest model -- a fixed learning rate, no dropout, more particles -- took the acrobot learnt under the counted
rules (training seed 0) from 0.273 to 0.439 on protocol seeds 0-9 (docs/learner.md, "Polishing the chosen policy").
It runs on the model only: the robot time of the result is the run's (and its choice's), nothing more.

The particles start as the run's next trial would: the training config's start distribution (the curriculum box and,
with ``initial_state.disturbance_fraction``, the post-disturbance states the run collected and those of the
learner's own model), the training cost and horizon. A fixed number of Adam steps: a trial's plateau rule is not
used (it would stop where the trial stopped). Every ``snapshot_every`` steps the policy is judged by the protocol
simulated on the learner's own robot (the trials' snapshot judge, :func:`protocol.protocol_judge`; no robot time),
the starting policy included, and the best is kept: a lower particle cost is not always a better policy (the
acrobot's training seed 1: cost 47.9 -> 46.7, protocol 0.244 -> 0.211 without the judge; with it, the start is
given back).

    mcpilco polish RUN                       # the selected policy (RUN/selection.json), else the newest
    mcpilco polish RUN --policy FILE --steps 1500 --out RUN/polish
    mcpilco polish RUN --candidates 3        # the choice's three best ranked, each polished, the best judged kept
    mcpilco polish RUN --policy-period 0.01  # the policy polished for 100 Hz on the model refitted at 10 ms
    mcpilco polish RUN --robot-config config/acrobot_catch.yaml   # judged with the controller it will run in
    mcpilco polish RUN --rounds 8 --judge-seeds 8 --confirm-seeds 16   # rounds picked on new seeds, kept on others

Writes ``OUT/policy.npz`` (metadata: what was polished, on which model, the kept step), ``OUT/polish.json``
(settings, cost per step, judged snapshots, wall time, robot time 0) and ``OUT/polish_curve.png``.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..config import whole_periods
from ..policy import load_policy, save_policy
from .cost import CostSettings, with_catch_model, with_height_term
from .model import DynamicsModel
from .optimizer import OptimizationResult, PolishSettings, optimize_policy
from .protocol import protocol_judge
from .retrain import session_learning
from .torch_policy import TorchPolicy

LOG = logging.getLogger(__name__)
POLISH_STREAM = 7_000_001     # the generators' stream id: apart from every trial's (seed, trial) streams


@dataclass
class PolishSource:
    """What a polish starts from: the training config, the newest model, the particles' start pool (M, 4), the
    policy file, and where they came from (for polish.json)."""

    config: object
    model: DynamicsModel
    pool: np.ndarray
    next_trial: int
    policy_file: Path
    model_from: str


@dataclass
class PolishResult:
    out: Path
    policy_file: Path
    optimization: OptimizationResult
    cost_before: float
    cost_after: float
    kept_step: int


def load_source(root: str | Path, policy_file: str | Path | None = None) -> PolishSource:
    """The newest model, start pool and policy of an offline run (``mcpilco train --out``) or a session
    (``mcpilco session``, or a trainer's retrain directory). Default policy: the selected one (RUN/selection.json,
    from ``mcpilco select``), else the newest."""
    root = Path(root)
    if session_learning(root) is not None:
        source = _session_source(root)
    else:
        source = _run_source(root)
    if policy_file is not None:
        source.policy_file = Path(policy_file)
    elif (root / "selection.json").is_file():
        source.policy_file = Path(json.loads((root / "selection.json").read_text())["selected_policy"])
    if not source.policy_file.is_file():
        raise ValueError(f"no policy file {source.policy_file}")
    return source


def at_policy_period(root: str | Path, source: PolishSource, period: float) -> PolishSource:
    """``source`` for a policy held ``period`` s (``polish.policy_period``; 0 or the run's own: ``source`` as it is).

    The model is refitted at that period on the run's (or session's) recorded trials, cut at the new period by the
    same reader that cut them at the run's (the trials are recorded at the state rate, so no robot time is added);
    the robot the learner identified at the state rate is kept (it does not depend on the period). The GP's fit
    has a generator of its own (the polish's stream), so the refit is the same every time."""
    config = source.config
    if period <= 0 or abs(period - config.robot.policy_period) < 1e-12:
        return source
    if not whole_periods(period, config.robot.control_period):
        raise ValueError(f"polish: a policy period of {period} s is not a whole number of control periods "
                         f"({config.robot.control_period} s)")
    if config.horizon < period:
        raise ValueError(f"polish: the horizon {config.horizon} s is shorter than the policy period {period} s")
    config = replace(config, robot=replace(config.robot, policy_period=float(period)))
    from .runs import run_transitions

    data = run_transitions(root, config)
    model = DynamicsModel(config.model_robot, config.gp, rollout_mode=config.rollout)
    LOG.info("polish: refitting the model at %g s on %d transitions (the run's trials, cut at the new period)",
             period, len(data))
    model.fit(data, np.random.default_rng([config.seed, POLISH_STREAM, 1]), config.device, config.torch_dtype)
    model.posterior.set_backward_precision(config.backward_precision)
    model.robot = source.model.robot
    return replace(source, config=config, model=model,
                   model_from=f"{source.model_from}'s trials, refitted at {period:g} s")


def _run_source(root: Path) -> PolishSource:
    from .learner import Learner
    from .runs import RunDirectory
    from .selection import newest_run_model, run_pool

    run = RunDirectory(root)
    config = run.load_config()
    trials = run.completed_trials()
    if not trials:
        raise ValueError(f"{root} holds no complete trial")
    model = newest_run_model(run, config, trials[-1], training=True)
    pool = np.concatenate([Learner(config).build_initial_pool(), run_pool(run, trials)])   # as the run's learner's
    return PolishSource(config, model, pool, trials[-1] + 1, root / "policy.npz", f"trial {trials[-1]}")


def _session_source(root: Path) -> PolishSource:
    from .selection import newest_session

    session = newest_session(root, training=True)
    return PolishSource(session.config, session.model, session.pool, len(session.trials), session.policies[-1],
                        session.models[-1].name)


def polish(source: PolishSource, settings: PolishSettings, out: str | Path, progress: bool = True,
           round_index: int | None = None) -> PolishResult:
    """Optimise ``source``'s policy on its model (module docstring) and write OUT/policy.npz, polish.json and
    polish_curve.png; ``round_index`` picks the judge's seeds (``PolishSettings.judge_seeds``; default
    ``settings.first_round``). No robot time."""
    from .learner import initial_distribution

    config = polish_config(source.config, settings)
    numpy_policy = load_policy(source.policy_file, robot=config.robot.robot,
                               torque_limit=config.robot.torque_limit)
    earlier = dict(dict(numpy_policy.metadata or {}).get("polished") or {})
    raised_from = earlier.get("u_max_raised_from")
    period_from = earlier.get("policy_period_changed_from")
    if abs(numpy_policy.control_period - config.robot.policy_period) > 1e-12:
        period_from = numpy_policy.control_period
    if settings.u_max > 0 and settings.u_max != numpy_policy.u_max:
        raised_from, numpy_policy = numpy_policy.u_max, replace(numpy_policy, u_max=settings.u_max)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1 if config.parallel != "ops" else config.threads)
    pool = (source.pool if settings.pool == "run" else
            policy_pool(config, numpy_policy, source.model if settings.pool == "judge" else None,
                        settings.judge_profile))
    sequence = np.random.SeedSequence([config.seed, POLISH_STREAM, settings.seed])
    added_from = None
    if settings.add_basis > 0:
        added_from = len(numpy_policy.weights)
        numpy_policy = with_added_basis(numpy_policy, pool, settings.add_basis,
                                        np.random.default_rng(sequence.spawn(1)[0]))
    policy = TorchPolicy.from_numpy(numpy_policy, config.torch_dtype).to(config.device)
    sampler = initial_distribution(config, source.next_trial, pool).sampler(config.device, config.torch_dtype)
    generator = torch.Generator().manual_seed(int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1)))
    optimizer = settings.optimizer(config.optimizer, settings.first_round if round_index is None else round_index)
    judge = (protocol_judge(config, source.model, optimizer.snapshot_seeds, optimizer.snapshot_seconds,
                            optimizer.judge_processes, settings.judge_profile)
             if settings.snapshot_every > 0 else None)
    cost = polish_cost(config, settings)
    horizon_steps = int(round(polish_horizon(config, settings) / config.robot.policy_period))
    start = time.perf_counter()
    model = polish_model(source.model, settings.model)
    result = optimize_policy(policy, model, sampler, settings.particles, horizon_steps, cost,
                             optimizer, settings.steps, generator, progress, description="polish",
                             particle_threads=config.particle_threads,
                             particle_processes=config.parallel == "processes", judge=judge)
    costs = np.asarray(result.cost, dtype=float)
    if not costs.size:
        raise RuntimeError(f"polish: no optimisation step succeeded ({result.stop_reason})")
    window = max(1, min(50, costs.size // 10))
    before, after = float(costs[:window].mean()), float(costs[-window:].mean())
    kept = result.steps if result.kept_step is None else result.kept_step
    metadata = {"polished": {"from": str(source.policy_file), "model": source.model_from, "steps": kept,
                             "settings": asdict(settings), "robot_time_s": 0.0,
                             **({} if raised_from is None else {"u_max_raised_from": raised_from}),
                             **({} if period_from is None else {"policy_period_changed_from": period_from}),
                             **({} if added_from is None else {"basis_added_to": added_from})}}
    policy_file = out / "policy.npz"
    save_policy(policy.to_numpy(config.robot.robot, config.robot.policy_period,
                                {**dict(numpy_policy.metadata or {}), **metadata}), policy_file)
    summary = {"source_policy": str(source.policy_file), "model": source.model_from, "settings": asdict(settings),
               "pool_states": int(len(pool)),
               "horizon_s": horizon_steps * config.robot.policy_period, "steps": result.steps,
               "skipped_steps": result.skipped_steps,
               "rollbacks": [list(r) for r in result.rollbacks], "stop_reason": result.stop_reason,
               "cost_first_steps": before, "cost_last_steps": after, "cost": costs.tolist(),
               "snapshots": [list(snapshot) for snapshot in result.snapshots], "kept_step": kept,
               "judge": None if judge is None else {"seeds": list(optimizer.snapshot_seeds),
                                                    "seconds_each": optimizer.snapshot_seconds,
                                                    "processes": optimizer.judge_processes,
                                                    "robot": _judge_robot(settings)},
               "wall_time_s": time.perf_counter() - start, "judge_time_s": result.judge_time, "robot_time_s": 0.0,
               "policy": str(policy_file)}
    (out / "polish.json").write_text(json.dumps(summary, indent=1))
    _plot(costs, result.snapshots, kept, out / "polish_curve.png", str(source.policy_file))
    LOG.info("polish: cost %.2f -> %.2f over %d steps (%.0f s), kept step %d%s, no robot time: %s", before, after,
             result.steps, summary["wall_time_s"], kept,
             f" (judge {result.kept_score:.3f}, start {result.snapshots[0][1]:.3f})" if result.snapshots else "",
             policy_file)
    return PolishResult(out, policy_file, result, before, after, kept)


def candidate_policies(root: str | Path, count: int) -> list[Path]:
    """The selected policy and the next best of ``mcpilco select``'s ranking (RUN/selection.json): ``count`` policy
    files at most, best first. Why: the polish judges only the policy it is given, and the choice's first is not
    always the one that polishes best (acrobot, training seed 1: its trial 7 kept its start at 0.21 on seeds 200-211,
    the second-ranked trial 8 polished to 0.29)."""
    root = Path(root)
    path = root / "selection.json"
    if not path.is_file():
        raise ValueError(f"{root}: no selection.json: run `mcpilco select {root}` before polishing several candidates")
    selection = json.loads(path.read_text())
    best = selection["selected_trial"]
    order = [best] + [k for k in selection.get("ranking", []) if k != best]
    files = selection.get("policies") or {}
    out = []
    for k in order[:count]:
        file = Path(files[str(k)]) if str(k) in files else root / "trials" / f"trial_{k:03d}" / "policy.npz"
        if not file.is_file():
            raise ValueError(f"{path}: no policy file for trial {k} ({file}): run `mcpilco select {root}` again")
        out.append(file)
    return out


def polish_candidates(source: PolishSource, settings: PolishSettings, files: list[Path], out: str | Path,
                      progress: bool = True) -> PolishResult:
    """Polish each of ``files`` (OUT/candidate_K/) and keep the one whose kept snapshot the judge scores highest
    (ties: the earlier, i.e. the better ranked): its policy.npz and polish_curve.png are copied to OUT, and
    OUT/polish.json is its report plus every candidate's (policy, kept step, judge score). No robot time."""
    out = Path(out)
    results = []
    for k, file in enumerate(files):
        source.policy_file = Path(file)
        LOG.info("polish: candidate %d of %d: %s", k + 1, len(files), file)
        results.append(polish(source, settings, out / f"candidate_{k}", progress))
    scores = [r.optimization.kept_score for r in results]
    best = int(np.argmax(scores))
    LOG.info("polish: kept candidate %d (%s, judge %.3f; the others %s)", best, files[best], scores[best],
             ", ".join(f"{s:.3f}" for s in scores))
    candidates = [{"policy": str(f), "kept_step": r.kept_step, "judge": score, "folder": str(r.out)}
                  for f, r, score in zip(files, results, scores)]
    return _publish(results[best], out, {"candidates": candidates, "chosen_candidate": best})


def polish_rounds(source: PolishSource, settings: PolishSettings, out: str | Path,
                  progress: bool = True) -> PolishResult:
    """Polish ``source``'s policy (OUT/round_K/, K from ``settings.first_round``, 1 by default), then again from each
    round's output (OUT/round_K+1/ ..., Adam
    restarted), while a round's kept snapshot beats its start by ``settings.round_gain`` on the judge (with
    ``settings.confirm_seeds``: on that many other seeds, :func:`confirm_round`). A round that does not is
    discarded; the next round starts from the last one kept with the next particle seed (seed + 1: other starts and
    noise), up to ``settings.retries`` such rounds in a row, then the rounds stop (retries 0: at the first).
    OUT/policy.npz is the last round kept (round 1 is kept as a single polish keeps it, the judge's best, the start
    included; with confirm_seeds only when it gains, else the start is given back), OUT/polish.json that round's
    report plus every round's (seed, start and kept judge, the confirming scores, kept step, kept or discarded).
    No robot time."""
    out = Path(out)
    source = replace(source)
    given, chosen, first, rows, seed, failures = source.policy_file, None, None, [], settings.seed, 0
    for k in range(settings.first_round, settings.first_round + settings.rounds):
        round_settings = replace(settings, seed=seed, add_basis=settings.add_basis if k == settings.first_round else 0)
        result = polish(source, round_settings, out / f"round_{k}", progress, round_index=k)
        first = result if first is None else first
        start_score, kept_score = result.optimization.snapshots[0][1], result.optimization.kept_score
        row = {"round": k, "seed": seed, "policy": str(source.policy_file),
               "judge_seeds": list(settings.judge_seeds_for(source.config.optimizer, k)),
               "judge_start": start_score, "judge_kept": kept_score, "kept_step": result.kept_step,
               "folder": str(result.out)}
        if settings.confirm_seeds:
            row.update(confirm_round(source, round_settings, k, result))
            confirm_start, confirm_kept = row["confirm_start"], row["confirm_kept"]
            gained = confirm_kept is not None and confirm_kept - confirm_start >= settings.round_gain
        else:
            gained = kept_score - start_score >= settings.round_gain
        row["kept"] = gained or (chosen is None and not settings.confirm_seeds)
        rows.append(row)
        if row["kept"]:
            chosen = result
            source.policy_file = result.policy_file
        failures = 0 if gained else failures + 1
        stop = failures > settings.retries
        confirmed = ("" if row.get("confirm_kept") is None else
                     f" (confirming seeds {row['confirm_start']:.3f} -> {row['confirm_kept']:.3f})")
        LOG.info("polish: round %d (seed %d) judge %.3f -> %.3f%s%s", k, seed, start_score, kept_score, confirmed,
                 "" if gained else f": gains less than {settings.round_gain:g}"
                 + (", the rounds stop" if stop else f", the next round tries seed {seed + 1}"))
        if stop:
            break
        seed = seed if gained else seed + 1
    if chosen is None:          # confirm_seeds and no round gained: the policy given is given back
        LOG.info("polish: no round gained on its confirming seeds: the policy given is kept (%s)", given)
        return _publish(replace(first, policy_file=given, kept_step=0), out, {"rounds": rows, "kept_step": 0})
    return _publish(chosen, out, {"rounds": rows})


def confirm_round(source: PolishSource, settings: PolishSettings, round_index: int, result: PolishResult) -> dict:
    """The round's start (``source.policy_file``) and its kept policy judged on the round's confirming seeds
    (``settings.confirm_seeds_for``), with the judge's controller and seconds: seeds the kept snapshot was not picked
    on, so the difference is not the maximum's luck. A round that kept its start is not judged again
    (``confirm_kept`` None: no gain). No robot time."""
    seeds = settings.confirm_seeds_for(round_index)
    if result.kept_step == 0:
        return {"confirm_seeds": list(seeds), "confirm_start": None, "confirm_kept": None}
    config = polish_config(source.config, settings)
    judge = protocol_judge(config, source.model, seeds, config.optimizer.snapshot_seconds,
                           settings.judge_processes_for(config.optimizer), settings.judge_profile)
    start, kept = (judge(_judged_policy(config, settings, file)) for file in (source.policy_file, result.policy_file))
    return {"confirm_seeds": list(seeds), "confirm_start": start, "confirm_kept": kept}


def _judge_robot(settings: PolishSettings) -> str:
    """What the judge ran on, for polish.json."""
    robot = f"robot profile {settings.judge_profile}" if settings.judge_profile else "the learner's own"
    return robot + " (no robot time)"


def _judged_policy(config, settings: PolishSettings, file: Path) -> TorchPolicy:
    """The policy in ``file`` as the polish judges it: its bound raised to ``settings.u_max`` when given."""
    policy = load_policy(file, robot=config.robot.robot, torque_limit=config.robot.torque_limit)
    if settings.u_max > 0:
        policy = replace(policy, u_max=settings.u_max)
    return TorchPolicy.from_numpy(policy, config.torch_dtype)


def _publish(chosen: PolishResult, out: Path, extra: dict) -> PolishResult:
    """Copy the chosen polish's policy file and polish_curve.png to OUT, and write OUT/polish.json: its report
    plus ``extra`` (every candidate's or round's row) and the policy's new path."""
    if Path(chosen.policy_file).resolve() != (out / "policy.npz").resolve():
        shutil.copyfile(chosen.policy_file, out / "policy.npz")
    shutil.copyfile(chosen.out / "polish_curve.png", out / "polish_curve.png")
    summary = {**json.loads((chosen.out / "polish.json").read_text()), **extra, "policy": str(out / "policy.npz")}
    (out / "polish.json").write_text(json.dumps(summary, indent=1))
    return replace(chosen, out=out, policy_file=out / "policy.npz")


def with_added_basis(policy, states: np.ndarray, count: int, rng: np.random.Generator):
    """``policy`` with ``count`` more basis functions centred on the features of ``states`` (M, 4) drawn by
    ``rng`` (without replacement while there are enough), each with weight 0: the same torques everywhere."""
    from ..policy import features

    states = np.asarray(states, dtype=np.float64).reshape(-1, 4)
    if len(states) == 0:
        raise ValueError("polish: add_basis needs post-disturbance states to centre the new basis functions on")
    rows = rng.choice(len(states), size=count, replace=count > len(states))
    return replace(policy, centers=np.vstack([policy.centers, features(states[rows])]),
                   weights=np.concatenate([policy.weights, np.zeros(count)]))


def policy_pool(config, numpy_policy, model: DynamicsModel | None = None, judge_profile: str = "") -> np.ndarray:
    """The states (M, 4) ``numpy_policy`` meets right after each of the protocol's disturbances, with the
    controller of ``config`` around it (the band's LQR, damping), on every pool seed
    (``initial_state.disturbance_seeds``): the hand-overs as the protocol produces them for this policy. Simulated
    on the prior's plant as the trials' own pool is (``config.model_robot``), or with ``model`` on the robot the
    judge runs on (:func:`protocol.on_model`, or ``judge_profile`` when named; several: each one's states, in
    the order named). No robot time."""
    from ..control import build_controller
    from .learner import post_disturbance_states
    from .protocol import judge_profiles, on_model

    seeds = config.initial_state.disturbance_seeds
    if not seeds:
        raise ValueError("polish: a policy pool needs initial_state.disturbance_seeds in the training config")
    policy = replace(numpy_policy, control_period=config.robot.policy_period)
    robots = ([(config.model_robot, None)] if model is None else
              [on_model(config, model, name) for name in judge_profiles(judge_profile)])
    states = np.concatenate([post_disturbance_states(build_controller(config.robot, policy), robot, seeds,
                                                     profile=profile)[0] for robot, profile in robots])
    LOG.info("polish: %d post-disturbance starts from the policy's own protocol on %s (seeds %s)", len(states),
             "the prior's plant" if model is None else "the judge's robot", ", ".join(str(s) for s in seeds))
    return states


def polish_config(config, settings: PolishSettings):
    """The training config the polish runs with: the run's, with ``settings.robot_config``'s robot config (the
    controller the policy will run in) when given, and its policy bound raised to ``settings.u_max`` when given
    (the judge's protocol clips the policy there, as the controller does)."""
    if settings.robot_config:      # the controller changes; the learner's prior plant (the pool's) does not
        config = replace(config, robot=_controller_config(config.robot, settings),
                         prior_plant=config.model_robot.plant)
    if settings.judge_profile:
        for name in _judge_profiles(settings.judge_profile):
            _check_judge_profile(name, config)
    if settings.u_max <= 0:
        return config
    if settings.u_max > config.robot.torque_limit:
        raise ValueError(f"polish: u_max {settings.u_max} N m exceeds the torque limit "
                         f"{config.robot.torque_limit} N m")
    return replace(config, robot=replace(config.robot, u_max=max(config.robot.u_max, settings.u_max)))


def _judge_profiles(spec: str) -> list[str]:
    """:func:`protocol.judge_profiles`, its error as the polish's setting."""
    from .protocol import judge_profiles

    try:
        return judge_profiles(spec)
    except ValueError as exc:
        raise ValueError(f"polish: {exc}") from exc


def _check_judge_profile(spec: str, config) -> None:
    """Refuse, before any work, a judge profile that does not load (its name, file and field in the message) or
    that is a true robot rather than a design robot. The judge, the confirming seeds and the "judge" pool are
    uncounted simulations: run on the robot the policy is for -- a built-in profile other than ``nominal`` (the
    user's prior), a file with the same plant and imperfections as one, a perturbed robot, or the run's own robot
    profile -- they would read that robot's true parameters outside the counted trials. A design robot is a file
    the user wrote or identified from counted trials (``mcpilco identify ... --write``)."""
    from ..config import ConfigError
    from ..simulation import load_robot_profile

    try:
        profile = load_robot_profile(spec)
    except (ConfigError, OSError, ValueError) as exc:
        raise ValueError(f"polish: judge_profile: {exc}") from exc
    if profile.perturbation:
        raise ValueError(f"polish: judge_profile: {spec!r} is a perturbed robot (perturbation "
                         f"{profile.perturbation:g}): a robot nobody identified, not a design robot; name a profile "
                         f"file identified from counted trials (mcpilco identify RUN --write FILE)")
    judged = _simulated_robot(profile, config.robot)
    for name in _true_robot_profiles(config):
        try:
            true_robot = _simulated_robot(load_robot_profile(name), config.robot)
        except (ConfigError, OSError, ValueError):      # the run's own profile file moved: nothing to compare
            continue
        if true_robot == judged:
            raise ValueError(f"polish: judge_profile: {spec!r} simulates the robot of profile {name!r} (its plant "
                             f"and imperfections): the judge would read the true robot outside the counted trials; "
                             f"name a design robot identified from them (mcpilco identify RUN --write FILE)")


def _true_robot_profiles(config) -> list[str]:
    """The profiles a judge may not simulate: every built-in robot profile except ``nominal`` (the prior), and the
    run's own robot profile unless it is ``nominal``."""
    from ..simulation import robot_profile_names

    names = [name for name in robot_profile_names() if name != "nominal"]
    own = str(config.robot_profile)
    head, _, tail = own.rpartition(":")
    if (head if tail.isdigit() else own) != "nominal":
        names.append(own)
    return names


def _simulated_robot(profile, robot) -> tuple:
    """What a profile simulates for ``robot``'s config, its names left out: (plant parameters, imperfections)."""
    return replace(profile.plant_parameters(robot), name=""), profile.imperfections(robot)


def _controller_config(robot, settings: PolishSettings):
    """The robot config named by ``settings.robot_config``; refused unless it is the run's robot at the polish's
    policy period (``settings.policy_period``, else the run's)."""
    from ..config import ConfigError, load_robot_config

    try:
        loaded = load_robot_config(settings.robot_config)
    except (ConfigError, OSError) as exc:
        raise ValueError(f"polish: robot config: {exc}") from exc
    period = settings.policy_period if settings.policy_period > 0 else robot.policy_period
    if loaded.robot != robot.robot:
        raise ValueError(f"polish: robot config {settings.robot_config} is for the {loaded.robot}, the run's robot is "
                         f"the {robot.robot}")
    if abs(loaded.policy_period - period) > 1e-12:
        raise ValueError(f"polish: robot config {settings.robot_config} runs the policy every "
                         f"{loaded.policy_period} s, the polish is for {period} s")
    return loaded


def polish_horizon(config, settings: PolishSettings) -> float:
    """The particles' rollout length of the polish (s): ``settings.horizon``, else the training config's."""
    horizon = settings.horizon if settings.horizon > 0 else config.horizon
    if horizon < config.robot.policy_period:
        raise ValueError(f"polish: the horizon {horizon} s is shorter than one policy period "
                         f"({config.robot.policy_period} s)")
    return horizon


def polish_cost(config, settings: PolishSettings) -> CostSettings:
    """The training cost, with the below-the-line term of ``settings.height_weight`` (the score's line of the
    controller's own plant) when that is > 0, and the velocity term's lengthscale ``settings.velocity_lengthscale``
    (rad/s, both joints) when that is > 0."""
    cost = config.cost
    if settings.velocity_lengthscale > 0:
        cost = replace(cost, velocity_lengthscales=(settings.velocity_lengthscale, settings.velocity_lengthscale))
    if settings.catch_level > 0:
        cost = with_catch_model(cost, config.robot, settings.catch_level, settings.catch_sharpness)
    return with_height_term(cost, settings.height_weight, settings.height_scale, config.robot.plant.l)


def polish_model(model: DynamicsModel, kind: str) -> DynamicsModel:
    """What the polish's particles roll out on (``polish.model``): the run's GP model (``gp``), its physics prior
    alone (``prior``: friction, rotor inertia and command delay as the 20 ms fit identified them with
    ``gp.identify``), or that prior with the friction and rotor inertia the learner identified at the state rate
    (``robot``, with ``gp.identify_robot``; the 20 ms fit's command delay kept). Why ``robot``: from a few seconds
    of trials the 20 ms least-squares fit trades the passive joint's Coulomb friction for viscous friction (a 9 s
    proxy run: b 0.020 N m s/rad and cf 0.147 N m for the proxy's 0.001 and 0.16), where the state-rate fit, which
    models the sensors' delay, the motor lag and the noise, finds 0.0000 and 0.163."""
    if kind == "gp":
        return model
    prior_only = physics_prior_model(model)
    if kind == "robot":
        if model.robot is None:
            raise ValueError("polish --model robot needs the robot identified at the state rate (gp.identify_robot: "
                             "true in the training config); this run's model has none")
        prior_only.set_prior_plant(model.robot.plant)      # the command delay stays the 20 ms fit's
    return prior_only


def physics_prior_model(model: DynamicsModel) -> DynamicsModel:
    """A copy of ``model`` whose particles follow its physics prior alone (``polish.model: prior``): the GP's mean
    and latent variance 0, its noise at ``gp.noise_floor``. The prior keeps what the fit identified (friction,
    rotor inertia, command delay with ``gp.identify``); ``model`` itself is unchanged."""
    if model.posterior is None:
        raise RuntimeError("the model has not been fitted")
    post = model.posterior
    prior_only = copy.copy(model)
    prior_only.posterior = replace(post, packed=torch.zeros_like(post.packed), signal=torch.zeros_like(post.signal),
                                   noise=torch.full_like(post.noise, model.settings.noise_floor),
                                   backward_matrix=None, _fast=None)
    if post.backward_matrix is not None:           # the same backward precision as the model's
        prior_only.posterior.set_backward_precision("bfloat16" if post.backward_matrix.dtype == torch.bfloat16
                                                    else "float32")
    return prior_only


def _plot(costs: np.ndarray, snapshots: list, kept: int, path: Path, title: str) -> Path:
    """The particle cost per step and, on the right axis, the judged snapshots (the kept one starred)."""
    from ..plotting import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(np.arange(1, costs.size + 1), costs, lw=0.6, color="0.6", label="per step")
    if costs.size >= 50:
        ax.plot(np.arange(50, costs.size + 1), np.convolve(costs, np.ones(50) / 50, "valid"), lw=1.2,
                label="mean of 50 steps")
    ax.set(xlabel="polish step", ylabel="particle cost J", title="polish of " + "/".join(Path(title).parts[-3:]))
    ax.legend(loc="upper right")
    if snapshots:
        judged = ax.twinx()
        at, score = np.asarray(snapshots, dtype=float).T
        judged.plot(at, score, "k.-", lw=0.5, ms=4)
        judged.plot(kept, dict(snapshots)[kept], "r*", ms=9)
        judged.set(ylabel="protocol on the model (kept: red star)", ylim=(0, 1))
    return save_figure(fig, path)


def settings_with(settings: PolishSettings, **overrides) -> PolishSettings:
    """``settings`` with the given fields replaced where not None (the command line's overrides)."""
    return replace(settings, **{k: v for k, v in overrides.items() if v is not None})
