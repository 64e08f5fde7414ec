"""``mcpilco train`` and ``mcpilco export``: the learner's subcommands (registered by mcpilco_ros.cli)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..config import ROBOTS, ConfigError
from .retrain import RetrainError

RUN_HELP = ("run directory (mcpilco train --out), session output (mcpilco session --out) or retrain directory "
            "(the trainer node's run_dir, mcpilco retrain --out; its retrain.json names the sessions it read)")


def register(subparsers) -> None:
    """Add the ``train`` and ``export`` subcommands."""
    p = subparsers.add_parser("train", help="learn a swing-up policy with MC-PILCO (writes a run directory)",
                              description="Run MC-PILCO trials on the simulated robot. The run directory holds "
                                          "the config, every trial's data, model and policy, learning curves "
                                          "and a log; --resume continues after the last complete trial.")
    p.add_argument("--robot", choices=ROBOTS, required=True)
    p.add_argument("--config", type=Path, required=True, help="training YAML, e.g. config/train_pendubot.yaml")
    p.add_argument("--out", type=Path, required=True, help="run directory, e.g. runs/pendubot_seed0")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--trials", type=int, help="override the number of trials of the config")
    p.add_argument("--seed", type=int, help="override the training seed of the config (every random draw of the run "
                                            "derives from it: three seeds of one recipe say how reliable it is)")
    p.add_argument("--robot-profile", help="the simulated robot the trials run on (config/robot_profiles.yaml: "
                                            "nominal, hardware_proxy, perturbed:SEED, or a file); default: the "
                                            "training config's robot_profile")
    p.set_defaults(func=_run_train)

    p = subparsers.add_parser("select", help="rank a run's trial policies on its newest model (no robot time), "
                                             "optionally check the best few on the robot (counted)",
                              description="Roll every trial's policy out on the run's newest GP model from the "
                                          "post-disturbance starts the run collected (same particles, same noise) "
                                          "for its model cost, and run the evaluation protocol on the model's plant "
                                          "(the prior with the friction identified from the trials); rank them by "
                                          "that protocol score (--rank protocol, the default) or the model cost "
                                          "(--rank cost): choosing the policy to ship without running the robot. "
                                          "With --check K, the best K then run "
                                          "--check-seconds of the evaluation protocol each on the robot (counted "
                                          "robot time) and the one up the longest is chosen. Writes "
                                          "RUN/selection.json.")
    p.add_argument("run", type=Path, help=RUN_HELP)
    p.add_argument("--particles", type=int, default=600)
    p.add_argument("--horizon", type=float, default=None, help="s (default: the run's training horizon)")
    p.add_argument("--seed", type=int, default=0, help="seed of the particles and their noise")
    p.add_argument("--export", type=Path, default=None,
                   help="copy the selected trial's policy here (selection.json records it; a later select without "
                        "--export warns when that file no longer holds the choice); an existing file only with "
                        "--force")
    p.add_argument("--force", action="store_true", help="let --export replace an existing file")
    p.add_argument("--rank", choices=("protocol", "cost"), default="protocol",
                   help="rank by the protocol simulated on the model's plant (no robot time) or by the model cost")
    p.add_argument("--protocol-seconds", type=float, default=60.0, help="s of the protocol on the model per seed")
    p.add_argument("--protocol-seeds", type=int, nargs="+", default=[2000, 2001, 2002, 2003],
                   help="disturbance schedules of the protocol on the model (keep them apart from those you report)")
    p.add_argument("--protocol-robot", choices=("model", "plant", "identified"), default="model",
                   help="the learner's robot the protocol runs on: what the newest model holds (model: the robot "
                        "identified at the state rate with gp.identify_robot, else the prior's plant with ideal "
                        "sensors and motors), the prior's plant always (plant), or the robot identified now from "
                        "all the run's recorded trials, anew (identified: friction, Ir, sensor delay, motor lag, "
                        "noise)")
    p.add_argument("--check", type=int, default=0, metavar="K",
                   help="check the best K ranked policies on the robot (0 = off; counted robot time)")
    p.add_argument("--check-seconds", type=float, default=20.0, help="s of the protocol per checked policy")
    p.add_argument("--check-seed", type=int, default=1000,
                   help="seed of the check's disturbance schedule (keep it apart from the seeds you report)")
    p.add_argument("--check-tolerance", type=tolerance_arg, default=0.15,
                   help="stop the check at the first candidate whose robot score is at least its score on the model "
                        "(same seconds, same seed) minus this; 'none': check all K and take the best robot score")
    p.add_argument("--robot-profile", default=None,
                   help="the simulated robot the check runs on (default: the run's robot profile; required with "
                        "--check for a retrain directory, whose trials may come from a real robot)")
    p.set_defaults(func=_run_select)

    p = subparsers.add_parser("polish", help="optimise a run's chosen policy further on its newest model "
                                             "(no robot time)",
                              description="Run more Adam steps on the run's (or session's) chosen policy on its "
                                          "newest GP model: a fixed learning rate, no dropout, more particles, "
                                          "from the start distribution of the run's next trial. Settings: the "
                                          "training config's polish section (defaults 1500 steps, lr 0.001, 400 "
                                          "particles), the options below override them. Every 250 steps the policy "
                                          "is judged by the protocol simulated on the learner's own robot (the "
                                          "trials' snapshot judge), the starting policy included, and the best is "
                                          "kept: when nothing beats the start, the output is the policy given. "
                                          "Writes OUT/policy.npz, OUT/polish.json and OUT/polish_curve.png. No robot "
                                          "time.")
    p.add_argument("run", type=Path, help=RUN_HELP)
    p.add_argument("--policy", type=Path, default=None,
                   help="policy to polish (default: the selected one, RUN/selection.json, else the newest)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: RUN/polish; an earlier polish "
                   "there is replaced, never the policy being polished)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--particles", type=int, default=None)
    p.add_argument("--seed", type=int, default=None, help="seed of the particles' starts and noise")
    p.add_argument("--height-weight", type=float, default=None,
                   help="weight of the below-the-line term added to the training cost (the protocol's score line; "
                        "0: the training cost as it is)")
    p.add_argument("--height-scale", type=float, default=None, help="m, width of that term's step at the line")
    p.add_argument("--candidates", type=int, default=None,
                   help="polish the selected policy and the next best of mcpilco select's ranking, this many in all "
                        "(each in OUT/candidate_K), and keep the one the judge scores highest")
    p.add_argument("--horizon", type=float, default=None,
                   help="s, the particles' rollout length for the polish (default: the training horizon)")
    p.add_argument("--u-max", type=float, default=None,
                   help="N m, raise the policy's output bound to this for the polish (same weights; at most the "
                        "torque limit; default: the policy's own bound)")
    p.add_argument("--rounds", type=int, default=None,
                   help="polish again from the kept policy while a round's judge gains at least --round-gain over "
                        "its start, this many rounds at most (each in OUT/round_K)")
    p.add_argument("--round-gain", type=float, default=None, help="the judge's gain a round must reach (default 0.005)")
    p.add_argument("--policy-period", type=float, default=None,
                   help="s, polish the policy for this rate: the model is refitted at this period on the run's "
                        "recorded trials, the policy keeps its weights (default: the run's period); run the result "
                        "with a robot config whose policy_period is this")
    p.add_argument("--retries", type=int, default=None,
                   help="after a round that gains too little, try the next particle seed this many rounds in a row "
                        "before the rounds stop (default 0)")
    p.add_argument("--pool", choices=["run", "policy", "judge"], default=None,
                   help="the particles' post-disturbance starts: the run's pool (default), or the states the policy "
                        "being polished meets after the protocol's disturbances on the prior's plant (policy) or "
                        "on the robot the judge runs on (judge; no robot time)")
    p.add_argument("--robot-config", default=None,
                   help="robot config the polished policy will run with (default: the run's): the judge's protocol "
                        "and --pool policy run its controller (switching, LQR, catch) around the policy")
    p.add_argument("--add-basis", type=int, default=None,
                   help="add this many basis functions before the polish, centred on post-disturbance starts, "
                        "weight 0 (the policy unchanged until optimised; default 0)")
    p.add_argument("--judge-seeds", type=int, default=None,
                   help="judge each round on this many protocol seeds, new ones every round, the round's start "
                        "judged again on them (default 0: the training's snapshot seeds in every round)")
    p.add_argument("--confirm-seeds", type=int, default=None,
                   help="decide whether a round gained on this many other protocol seeds, new ones every round: its "
                        "start and its kept snapshot judged there (default 0: on the seeds the snapshot was picked "
                        "on); a first round that does not gain gives the start back")
    p.add_argument("--first-round", type=int, default=None,
                   help="number the rounds from this one (OUT/round_K, and the judge's and confirming seeds of round "
                        "K): to continue an earlier polish on seeds its rounds did not use (default 1)")
    p.add_argument("--judge-processes", type=int, default=None,
                   help="run the judge's protocol seeds in this many worker processes (the same scores in less wall "
                        "time; default: the run's optimizer.judge_processes)")
    p.add_argument("--velocity-lengthscale", type=float, default=None,
                   help="rad/s, the cost's velocity term for the polish, both joints (default: the training cost's; "
                        "smaller: passing the top fast costs more)")
    p.add_argument("--judge-profile", default=None, nargs="+", metavar="PROFILE",
                   help="robot profile the judge, the confirming seeds and --pool judge run on (a name or a profile "
                        "file, e.g. a design robot from mcpilco identify --write; default: the learner's own robot); "
                        "several: the judge scores the mean over them, the pool holds each one's states; "
                        "a true robot is refused: a built-in profile other than nominal, a copy of one, a perturbed "
                        "robot, the run's own robot profile")
    p.add_argument("--catch-level", type=float, default=None,
                   help="the catch model in the cost: V50 in units of the polish's controller's ROA level rho (a "
                        "particle caught with chance 1 / (1 + (V / V50)^k) per step costs nothing after; default 0: "
                        "off)")
    p.add_argument("--catch-sharpness", type=float, default=None, help="k of the catch model (default 4)")
    p.add_argument("--model", choices=["gp", "prior", "robot"], default=None,
                   help="what the particles roll out on: the run's GP model (default), its physics prior alone "
                        "(the identified plant with gp.identify; the GP's residual and noise off), or that prior "
                        "with the friction and rotor inertia identified at the state rate (robot: needs "
                        "gp.identify_robot)")
    p.set_defaults(func=_run_polish)

    p = subparsers.add_parser("identify", help="identify the robot from a run's or a session's recorded trials: "
                                            "friction, rotor inertia, sensor delay, motor lag, noise (no robot time)",
                              description="Fits, at the state rate, the training config's prior's viscous and "
                                          "Coulomb friction and rotor inertia with the sensor delay (whole steps), "
                                          "the motor lag (applied against commanded torque) and the noise, from "
                                          "what the trials recorded (learning/identified_robot.py). --write turns "
                                          "it into a robot profile file: a design robot to choose controller "
                                          "settings on without robot time (e.g. bench_balance.py --profile).")
    p.add_argument("run", type=Path, help=RUN_HELP)
    p.add_argument("--trials", type=int, default=None, metavar="K", help="only trials 0..K (default: all)")
    p.add_argument("--write", type=Path, default=None, metavar="PROFILE.yaml",
                   help="write a robot profile file; its plant goes into plant_models.yaml beside it (added)")
    p.add_argument("--mechanics", action="store_true",
                   help="fit the links' masses, centre-of-mass distances and inertias too (within 0.5-1.5 times the "
                        "prior's; the lengths are not fitted but taken from the prior: measure them and name a "
                        "prior with them, prior_model + prior_models_file): for a robot whose links differ from the "
                        "prior's")
    p.set_defaults(func=_run_identify)

    p = subparsers.add_parser("mirror", help="write a policy's mirror image, pi'(x) = -pi(x mirrored): a free "
                                          "candidate for the policy selection",
                              description="The double pendulum is symmetric about the vertical, so the mirror image "
                                          "of a policy does from the mirrored state what the policy does from the "
                                          "state (policy.mirrored). No data, no robot time.")
    p.add_argument("policy", type=Path, help="policy file (.npz of this package)")
    p.add_argument("out", type=Path, help="output .npz")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    p.set_defaults(func=_run_mirror)

    p = subparsers.add_parser("export", help="convert a policy file (e.g. to RealAIGym's .np)")
    p.add_argument("policy", type=Path, help="policy file (.npz of this package, or a run's policy.npz)")
    p.add_argument("--realaigym", type=Path, required=True, help="output: RealAIGym MC-PILCO pickle (.np)")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    p.set_defaults(func=_run_export)


def _run_train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .learner import load_train_config
    from .runs import RunError, train

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    config = load_train_config(args.config, args.robot, robot_profile=args.robot_profile)
    if args.trials is not None:
        if args.trials < 1:
            print(f"error: --trials must be >= 1 (trial 0 explores), got {args.trials}", file=sys.stderr)
            return 2
        config = replace(config, trials=args.trials)
    if args.seed is not None:
        if args.seed < 0:
            print(f"error: --seed must be >= 0, got {args.seed}", file=sys.stderr)
            return 2
        config = replace(config, seed=args.seed)
    try:
        records = train(config, args.out, resume=args.resume)
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(records)} trials in {args.out}; newest policy: {args.out / 'policy.npz'}")
    return 0


def tolerance_arg(text: str) -> float | None:
    """``--check-tolerance``: a number, or 'none' (no confirmation: the best robot score)."""
    return None if text.strip().lower() == "none" else float(text)


def _retrain_directory(root: Path) -> bool:
    """``root`` is a trainer's (or ``mcpilco retrain``'s) directory, not a ``mcpilco session`` output: what a
    hardware session writes. False when it cannot tell (the selection then says what is wrong)."""
    from .retrain import session_learning

    try:
        learning = session_learning(root)
    except RetrainError:
        return False
    return learning is not None and learning.retrain == Path(root)


def _run_select(args: argparse.Namespace) -> int:
    import shutil

    from .runs import RunError
    from .selection import ModelProtocol, RobotCheck, select_policy, write_selection

    if args.particles < 1 or (args.horizon is not None and not args.horizon > 0):
        print("error: --particles must be >= 1 and --horizon > 0", file=sys.stderr)
        return 2
    if args.export is not None and not _export_target_ok(args.run, Path(args.export), args.force):
        return 2
    if args.check and args.robot_profile is None and _retrain_directory(args.run):
        print(f"error: {args.run} is a retrain directory: its trials came from the trainer node, maybe on a real "
              "robot, and --check runs the protocol on a simulated one. Check the candidates on your robot (each with "
              "policy:= and the driver's disturbance windows; docs/hardware.md), or name the simulated robot with "
              "--robot-profile", file=sys.stderr)
        return 2
    try:
        check = (RobotCheck(args.check, args.check_seconds, args.check_seed, args.robot_profile, args.check_tolerance)
                 if args.check else None)
        protocol = (ModelProtocol(tuple(args.protocol_seeds), args.protocol_seconds, args.protocol_robot)
                    if args.rank == "protocol" else None)
        selection = select_policy(args.run, args.particles, args.horizon, args.seed, check, protocol)
    except (RunError, RetrainError, ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.run}: model of trial {selection.model_trial}, {selection.particles} particles from the run's "
          f"post-disturbance states, {selection.horizon:g} s (no robot time)")
    if selection.protocol is not None:
        print(f"protocol on the model's plant (b {selection.protocol_plant['b']}, cf {selection.protocol_plant['cf']}, "
              f"Ir {selection.protocol_plant['Ir']:.3g}): {len(selection.protocol.seeds)} x "
              f"{selection.protocol.seconds:g} s per policy (no robot time)")
        if "identified_robot" in selection.protocol_plant:
            robot = selection.protocol_plant["identified_robot"]
            print(f"  the robot identified from the trials: delay {robot['delay_steps']} steps, motor "
                  f"responsiveness {robot['motor_responsiveness']:.3f}, measurement noise "
                  f"{[round(v, 4) for v in robot['measurement_noise']]}, torque noise {robot['torque_noise']:.3g} N m")
    for k in selection.ranked():
        on_model = (f"  protocol on model {selection.protocol_scores[k]:.3f}" if k in selection.protocol_scores
                    else "")
        checked = (f"  robot check {selection.check_scores[k]:.3f}" if k in selection.check_scores else "")
        if k in selection.check_predictions:
            checked += f" (on model {selection.check_predictions[k]:.3f})"
        print(f"  trial {k:3d}{on_model}  model cost {selection.costs[k]:8.3f}{checked}"
              f"{'  <- selected' if k == selection.best else ''}")
    if selection.check is not None:
        confirmed = ("none confirmed: the best robot score" if selection.confirmed is None
                     else f"trial {selection.confirmed} confirmed")
        if selection.check.tolerance is not None:
            print(f"robot check in rank order until robot >= model - {selection.check.tolerance:g}: {confirmed}")
        print(f"robot check: {len(selection.check_scores)} x {selection.check.seconds:g} s of the protocol (seed "
              f"{selection.check.seed}, robot profile {selection.check.profile}) = {selection.robot_time:g} s of "
              "robot time, on top of the run's")
    earlier = _earlier_selection(args.run / "selection.json")
    previous, checks = _export_record(earlier), _check_history(earlier)
    if selection.robot_time > 0.0:
        checks.append({"robot_time_s": selection.robot_time, "count": len(selection.check_scores),
                       "robot_profile": selection.check.profile if selection.check else None,
                       "selected_trial": selection.best})
    if checks:
        print(f"robot checks of this run so far: {sum(c['robot_time_s'] for c in checks):g} s in {len(checks)} "
              "select command(s) (selection.json's robot_checks)")
    export = {"path": str(Path(args.export).resolve()), "trial": selection.best} if args.export else previous
    # the record first: the robot time of the check is never lost to a failing copy
    write_selection(selection, args.run / "selection.json", export, checks)
    if args.export is not None:
        try:
            shutil.copyfile(selection.files[selection.best], args.export)
        except OSError as exc:
            print(f"error: could not export trial {selection.best} to {args.export}: {exc} (selection.json is "
                  "written)", file=sys.stderr)
            return 2
        print(f"selected trial {selection.best}: {args.export}")
    elif previous is not None and previous["trial"] != selection.best and Path(previous["path"]).is_file():
        print(f"WARNING: {previous['path']} still holds trial {previous['trial']}, an earlier selection's choice; this "
              f"one chose trial {selection.best}: pass --export {previous['path']} --force to replace it",
              file=sys.stderr)
    return 0


def _export_target_ok(run: Path, target: Path, force: bool = False) -> bool:
    """--export must name a new file (an existing one only with --force) in an existing folder, never one of the
    run's own files."""
    problem = ""
    if not target.parent.is_dir():
        problem = f"the folder {target.parent} does not exist"
    elif target.is_dir():
        problem = "it is a folder"
    elif target.exists() and not force:
        problem = "exists; pass --force to replace it"
    elif target.resolve().is_relative_to(Path(run).resolve() / "trials"):
        problem = "it is inside the run's trials (a trial's own policy)"
    if problem:
        print(f"error: --export {target}: {problem}", file=sys.stderr)
    return not problem


def _earlier_selection(path: Path) -> dict:
    """An earlier select's selection.json ({} when there is none or it is damaged: nothing to carry over)."""
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return old if isinstance(old, dict) else {}


def _check_history(old: dict) -> list[dict]:
    """The robot checks earlier ``select`` commands on this run spent (selection.json's ``robot_checks``; a file
    of before that list: its one ``robot_time_s``). Why: every select rewrites selection.json, and the robot time
    of a check made before must stay counted."""
    history = old.get("robot_checks")
    if isinstance(history, list):
        return [c for c in history if isinstance(c, dict) and isinstance(c.get("robot_time_s"), (int, float))]
    seconds = old.get("robot_time_s")
    if isinstance(seconds, (int, float)) and seconds > 0:
        return [{"robot_time_s": float(seconds), "selected_trial": old.get("selected_trial")}]
    return []


def _export_record(old: dict) -> dict | None:
    """The policy file an earlier ``select --export`` wrote and the trial it holds (selection.json's ``export``), so
    that a later selection without --export says when that file no longer holds the choice. None when unknown."""
    record = old.get("export")
    if isinstance(record, dict) and isinstance(record.get("path"), str) and isinstance(record.get("trial"), int):
        return {"path": record["path"], "trial": record["trial"]}
    return None


def _run_polish(args: argparse.Namespace) -> int:
    from .polish import (
        at_policy_period,
        candidate_policies,
        load_source,
        polish,
        polish_candidates,
        polish_config,
        polish_horizon,
        polish_model,
        polish_rounds,
        settings_with,
    )
    from .runs import RunError

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        source = load_source(args.run, args.policy)
        settings = settings_with(source.config.polish, steps=args.steps, lr=args.lr, particles=args.particles,
                                 seed=args.seed, height_weight=args.height_weight, height_scale=args.height_scale,
                                 candidates=args.candidates, horizon=args.horizon, u_max=args.u_max,
                                 rounds=args.rounds, round_gain=args.round_gain, policy_period=args.policy_period,
                                 pool=args.pool, retries=args.retries, robot_config=args.robot_config,
                                 add_basis=args.add_basis, judge_seeds=args.judge_seeds,
                                 confirm_seeds=args.confirm_seeds, first_round=args.first_round,
                                 judge_processes=args.judge_processes,
                                 velocity_lengthscale=args.velocity_lengthscale,
                                 judge_profile=None if args.judge_profile is None else ",".join(args.judge_profile),
                                 catch_level=args.catch_level, catch_sharpness=args.catch_sharpness,
                                 model=args.model)
        polish_horizon(source.config, settings)
        polish_config(source.config, settings)
        out = args.out or args.run / "polish"
        if Path(source.policy_file).resolve().is_relative_to(Path(out).resolve()):
            raise ValueError(f"the policy to polish, {source.policy_file}, is inside the output folder {out}: it "
                             "would be overwritten; pass another --out")
        if settings.candidates > 1 and args.policy is not None:
            raise ValueError("--policy names one policy: it cannot be combined with several candidates")
        if settings.candidates > 1 and settings.rounds > 1:
            raise ValueError("several candidates and several rounds: polish the candidates first, then the rounds "
                             "with --policy OUT/policy.npz")
        files = candidate_policies(args.run, settings.candidates) if settings.candidates > 1 else []
        source = at_policy_period(args.run, source, settings.policy_period)     # refits the model: after the checks
        horizon = polish_horizon(source.config, settings)
        polish_model(source.model, settings.model)          # refuses --model robot without gp.identify_robot
    except (RunError, RetrainError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"polishing {source.policy_file} on the model of {source.model_from}: {settings.steps} steps, lr "
          f"{settings.lr:g}, {settings.particles} particles, no dropout"
          + (f", below-the-line term weight {settings.height_weight:g}" if settings.height_weight > 0 else "")
          + (f", policy bound raised to {settings.u_max:g} N m" if settings.u_max > 0 else "")
          + (", starts from the policy's own post-disturbance states" if settings.pool != "run" else "")
          + (" on the judge's robot" if settings.pool == "judge" else "")
          + (f", for the controller of {settings.robot_config}" if settings.robot_config else "")
          + (f", {settings.add_basis} basis functions added" if settings.add_basis else "")
          + (f", judged on {settings.judge_seeds} new seeds each round" if settings.judge_seeds else "")
          + (f", each round's gain confirmed on {settings.confirm_seeds} other seeds" if settings.confirm_seeds else "")
          + (f", velocity term {settings.velocity_lengthscale:g} rad/s" if settings.velocity_lengthscale > 0 else "")
          + (f", the judge on robot profile {settings.judge_profile}" if settings.judge_profile else "")
          + (f", catch model at {settings.catch_level:g} rho (k {settings.catch_sharpness:g})"
             if settings.catch_level > 0 else "")
          + (", on the physics prior alone (the GP off)" if settings.model == "prior" else "")
          + (", on the physics prior with the robot's state-rate friction and rotor inertia (the GP off)"
             if settings.model == "robot" else "")
          + f", policy period {source.config.robot.policy_period:g} s, horizon {horizon:g} s (no robot time)")
    if files:
        print(f"{len(files)} candidates: " + ", ".join(str(f) for f in files))
        result = polish_candidates(source, settings, files, out, progress=source.config.progress)
    elif settings.rounds > 1:
        result = polish_rounds(source, settings, out, progress=source.config.progress)
    else:
        result = polish(source, settings, out, progress=source.config.progress)
    print(f"particle cost {result.cost_before:.2f} -> {result.cost_after:.2f} over {result.optimization.steps} steps "
          f"({result.optimization.wall_time:.0f} s): {result.policy_file}"
          + (" (the policy given, kept: nothing judged better)" if result.kept_step == 0 else ""))
    return 0


def _run_identify(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from .identified_robot import identify_robot, write_profile
    from .runs import RunError, run_state_recordings

    try:
        config, recordings = run_state_recordings(args.run)
    except (RunError, RetrainError, ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.trials is not None:
        if args.trials < 0:
            print(f"error: --trials must be >= 0 (trials 0 .. K), got {args.trials}", file=sys.stderr)
            return 2
        recordings = recordings[: args.trials + 1]
    found = identify_robot(config.model_robot.plant, recordings, config.robot.actuated_joint, config.robot.torque_limit,
                           mechanics=args.mechanics)
    if found is None:
        print(f"error: {args.run}: too few usable state-rate windows in {len(recordings)} trial(s) to identify the "
              "robot (the states need the driver's effort)", file=sys.stderr)
        return 2
    print(f"{args.run}: {len(recordings)} trial(s), prior {config.model_robot.plant.name}: {found.summary()}")
    if args.mechanics:
        p = found.plant
        print(f"  mechanics: m {p.m[0]:.4g} / {p.m[1]:.4g} kg, r {p.r[0]:.4g} / {p.r[1]:.4g} m, "
              f"I {p.I[0]:.4g} / {p.I[1]:.4g} kg m^2 (lengths {p.l[0]:g} / {p.l[1]:g} m, the prior's: the fit takes "
              "them as given: measure the robot's and put them in the prior's plant file)")
    if args.write is not None:
        try:
            models = write_profile(found, args.write, f"identified from {args.run} ({len(recordings)} trial(s))")
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote the robot profile {args.write} (plant model in {models})")
    return 0


def _run_mirror(args: argparse.Namespace) -> int:
    from ..policy import PolicyError, load_policy, mirrored, save_policy

    if args.out.suffix != ".npz" or args.out.is_dir() or not args.out.parent.is_dir():
        print(f"error: {args.out}: name a .npz file in an existing folder", file=sys.stderr)
        return 2
    if args.out.exists() and not args.force:
        print(f"error: {args.out} exists; pass --force to replace it", file=sys.stderr)
        return 2
    try:
        policy = load_policy(args.policy)
    except (PolicyError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    image = mirrored(policy)
    save_policy(image, args.out)
    print(f"wrote {args.out}: the mirror image of {args.policy} ({policy.robot}, version {image.version()})")
    return 0


def _run_export(args: argparse.Namespace) -> int:
    from ..policy import export_realaigym, load_policy

    if not args.realaigym.parent.is_dir() or args.realaigym.is_dir():   # said now, not as an OSError traceback
        problem = "it is a folder" if args.realaigym.is_dir() else f"the folder {args.realaigym.parent} does not exist"
        print(f"error: --realaigym {args.realaigym}: {problem}", file=sys.stderr)
        return 2
    if args.realaigym.exists() and not args.force:
        print(f"error: {args.realaigym} exists; pass --force to replace it", file=sys.stderr)
        return 2
    policy = load_policy(args.policy)
    if abs(policy.u_max - 3.0) > 1e-12:
        print(f"warning: u_max is {policy.u_max} N m but RealAIGym's loader assumes 3 N m", file=sys.stderr)
    export_realaigym(policy, args.realaigym)
    print(f"wrote {args.realaigym} ({policy.robot}, {policy.num_basis} basis functions)")
    return 0
