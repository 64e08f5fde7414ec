"""Retraining from recorded trials: ``mcpilco retrain`` and the function the trainer node runs in a subprocess.

``mcpilco retrain --sessions DIR [DIR ...] --out runs/NAME [--config config/train_pendubot.yaml] [--warm-start]``
reads every trial of the given sessions (or folders of ``ros2 bag record`` bags), fits the GP model on all their
transitions at the policy period, optimises the policy, and exports it as a new versioned file. Bad bags are
listed with the reason and skipped. The run directory keeps every result::

    runs/NAME/retrain.json                 one entry per retrain: sessions, trials, skipped bags, policy, timings
    runs/NAME/train_config.yaml            copy of the training configuration (first retrain)
    runs/NAME/policies/policy_NNN_<version>.npz   exported policies; a file is never overwritten
    runs/NAME/models/model_NNN.npz         the fitted GP model of retrain NNN (for --warm-start)
    runs/NAME/log.txt

``--warm-start`` continues from the newest model (GP hyperparameters) and policy in ``--out`` (or ``--policy``).
The controller node's ``policy`` parameter may name ``runs/NAME/policies``: it loads the newest file there on
``~/reload_policy``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import ROBOTS, ConfigError
from ..policy import PolicyError

LOG = logging.getLogger("mcpilco.retrain")
MIN_TRANSITIONS = 10


class RetrainError(RuntimeError):
    """Retraining cannot run (no usable trial, a run directory of another robot...); the message says why."""


@dataclass
class RetrainResult:
    """What one retrain produced: the exported policy file and its content version, and the bookkeeping."""

    index: int
    policy_path: Path
    policy_version: str
    trials: int
    transitions: int
    skipped: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    final_cost: float | None = None
    notes: dict[str, list[str]] = field(default_factory=dict)   # bag -> what was dropped from it
    snapshots: list[tuple[int, float]] = field(default_factory=list)   # optimizer.snapshot_every: (step, score)
    kept_step: int | None = None                                        # the snapshot exported (None: the last)
    start_scores: list[float] = field(default_factory=list)             # optimizer.starts_first > 1: each start's
    identified_robot: dict | None = None        # gp.identify_robot: IdentifiedRobot.to_dict() (also in the model)
    stop_reason: str = ""                       # why the optimisation stopped ("diverged ..." keeps a checkpoint)
    rollbacks: list[list] = field(default_factory=list)   # [history step, checkpoint step, why] (optimizer.py)

    def to_dict(self) -> dict:
        return {"index": self.index, "policy": str(self.policy_path), "policy_version": self.policy_version,
                "trials": self.trials, "transitions": self.transitions, "skipped": self.skipped,
                "notes": self.notes,
                "timings_s": self.timings, "final_model_cost": self.final_cost,
                "snapshots": [list(s) for s in self.snapshots], "kept_step": self.kept_step,
                "start_scores": self.start_scores, "identified_robot": self.identified_robot,
                "stop_reason": self.stop_reason, "optimization_rollbacks": self.rollbacks}


# --------------------------------------------------------------------------------------------------
# The run directory


def resolved_train_config(config) -> str:
    """The training file of ``config`` as YAML that loads on its own: its ``base`` merged in, ``robot_config`` and
    ``policy.initial`` as absolute paths (a verbatim copy of a file with ``base:`` would not load from here)."""
    import yaml

    from .learner import resolved_train_mapping

    mapping, _ = resolved_train_mapping(config)
    robot = config.robot.source or Path(config.source).parent / str(mapping.get("robot_config", ""))
    mapping["robot_config"] = str(Path(robot).resolve())
    return f"# resolved from {config.source}\n" + yaml.safe_dump(mapping, sort_keys=False)


class RetrainDirectory:
    """``runs/NAME`` of offline / between-trial retraining (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.policies = self.root / "policies"
        self.models = self.root / "models"

    def _read_history(self) -> dict:
        """retrain.json's content ({} if absent); RetrainError naming the file if it is damaged."""
        path = self.root / "retrain.json"
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RetrainError(f"{path}: damaged ({type(exc).__name__}: {exc})") from exc
        if not isinstance(data, dict) or not isinstance(data.get("retrains", []), list):
            raise RetrainError(f"{path}: damaged (not an object with a list of retrains)")
        return data

    def history(self) -> list[dict]:
        return self._read_history().get("retrains", [])

    def prepare(self, config) -> None:
        """Create the folders; refuse a training run or session directory (nothing there is ever replaced) and
        a directory that holds another robot's retrains."""
        for marker, kind in (("run.json", "a training run (mcpilco train)"), ("session.yaml", "a session")):
            if (self.root / marker).exists():
                raise RetrainError(f"{self.root} is {kind} ({marker}), not a retrain directory: choose another --out")
        history_path = self.root / "retrain.json"
        if history_path.is_file():
            robot = self._read_history().get("robot")
            if robot != config.robot.robot:
                raise RetrainError(f"{self.root}: holds retrains of the {robot}, not the {config.robot.robot}")
        self.policies.mkdir(parents=True, exist_ok=True)
        self.models.mkdir(parents=True, exist_ok=True)
        copy = self.root / "train_config.yaml"
        if not copy.exists():
            copy.write_text(resolved_train_config(config), encoding="utf-8")

    def append(self, robot: str, result: RetrainResult, extra: dict) -> None:
        history = self.history() + [{**result.to_dict(), **extra}]
        tmp = self.root / "retrain.json.tmp"
        tmp.write_text(json.dumps({"robot": robot, "retrains": history}, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.root / "retrain.json")

    def log(self, message: str) -> None:
        LOG.info(message)
        with open(self.root / "log.txt", "a", encoding="utf-8") as handle:
            handle.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {message}\n")

    def newest(self, folder: Path, pattern: str) -> Path | None:
        files = sorted(folder.glob(pattern)) if folder.is_dir() else []
        return files[-1] if files else None

    def next_index(self) -> int:
        used = [int(p.name.split("_")[1]) for p in self.policies.glob("policy_*.npz")
                if p.name.split("_")[1].isdigit()]
        return max(used + [len(self.history()) - 1], default=-1) + 1

    def export(self, policy, index: int, **metadata) -> Path:
        """Write ``policies/policy_NNN_<version>.npz`` without ever replacing an existing file."""
        from ..policy import save_policy

        staging = self.policies / f".policy_{index:03d}.staging"
        save_policy(policy, staging, **metadata)
        while True:
            final = self.policies / f"policy_{index:03d}_{policy.version()}.npz"
            try:
                os.link(staging, final)   # fails if final exists: never overwrite a policy
            except FileExistsError:
                index += 1
                continue
            staging.unlink()
            return final


@dataclass(frozen=True)
class SessionLearning:
    """Where a session's learning lives on disk: the retrain directory (``train_config.yaml``, ``models/``,
    ``policies/``, ``retrain.json``) and the session directories whose bags its newest retrain read, in that order.

    Why: ``mcpilco select``, ``identify`` and ``polish`` read both. ``mcpilco session --out`` keeps them together
    (OUT/retrain and OUT/session), but on the robot the trainer node's ``run_dir`` and ``session_dir`` are two
    folders of the team's choosing, and ``extra_sessions`` or ``mcpilco retrain --sessions A B`` add more days."""

    retrain: Path
    sessions: tuple[Path, ...]


def session_learning(root: str | Path) -> SessionLearning | None:
    """The :class:`SessionLearning` behind ``root``: a ``mcpilco session`` output, or a retrain directory
    (``trainer_node``'s ``run_dir``, ``mcpilco retrain --out``) whose ``retrain.json`` names its sessions; None for
    anything else (an offline run, ``mcpilco train --out``). RetrainError when the sessions cannot be found."""
    root = Path(root)
    if (root / "retrain").is_dir() and (root / "session").is_dir():
        return SessionLearning(root / "retrain", (root / "session",))
    if not (root / "retrain.json").is_file():
        return None
    history = RetrainDirectory(root).history()
    if not history:
        raise RetrainError(f"{root / 'retrain.json'}: no retrain yet")
    named = history[-1].get("sessions")
    if not isinstance(named, list) or not named:
        raise RetrainError(f"{root / 'retrain.json'}: retrain {len(history) - 1} names no session")
    return SessionLearning(root, tuple(_recorded_session(root, str(name)) for name in named))


def _recorded_session(root: Path, name: str) -> Path:
    """A session directory as ``retrain.json`` names it: absolute since 2026-12-01; before, as given to the retrain
    (relative to the directory it ran in), so a relative name is looked up from here, then beside the run."""
    path = Path(name)
    for candidate in ((path,) if path.is_absolute() else (path, root.parent / path)):
        if candidate.exists():          # a session directory, a folder of bags or one bag (retrain --sessions)
            return candidate
    raise RetrainError(f"{root / 'retrain.json'}: its newest retrain read the session {name}, which is not there "
                       f"(looked from {Path.cwd()}{'' if path.is_absolute() else f' and {root.parent}'}); "
                       "run this from the directory the trainer ran in, or move the session back")


# --------------------------------------------------------------------------------------------------
# Retraining


def optimize_policy_from_data(learner, trial_index: int):
    """Fit the GP model on ``learner.data`` and optimise ``learner.policy`` (created if None), MC-PILCO step k:
    ``Learner.fit_and_optimize`` (the robot here is the real one, between trials). Returns (numpy policy,
    model arrays, OptimizationResult, timings)."""
    policy, result, timings, _, _ = learner.fit_and_optimize(trial_index, f"retrain {trial_index} policy",
                                                             {"source": "retrain"})
    return policy, learner.model.to_arrays(), result, timings


def policy_files(folder: Path, extra: Path | None = None) -> dict[str, Path]:
    """Policy version -> file: the retrain directory's exported policies (``policy_NNN_<version>.npz``) and
    ``extra`` (a policy given by path, e.g. the shipped one a session started from)."""
    from ..policy import PolicyError, load_policy

    files = {path.stem.rsplit("_", 1)[-1]: path for path in sorted(folder.glob("policy_*_*.npz"))}
    if extra is not None:
        try:
            files.setdefault(load_policy(extra).version(), Path(extra))
        except (PolicyError, OSError, ValueError):
            pass                        # the warm start reports a bad file itself
    return files


def trial_pool_states(config, trials, policies: dict[str, Path], log=LOG.info) -> np.ndarray:
    """The particles' post-disturbance pool grown trial by trial as the offline learner grows it
    (``Learner._run_and_evaluate``): the states each trial's disturbance window handed over (as recorded), then,
    with ``pool_seeds_per_trial`` > 0, the post-disturbance states the trial's policy meets on the learner's own
    model (the first ``pool_seeds_per_trial`` pool seeds; no robot time). A trial whose policy file is not at hand
    (its version in ``policies``) adds only its recorded states, and the log says so."""
    from ..control import build_controller
    from ..policy import load_policy
    from .learner import post_disturbance_states

    s = config.initial_state
    simulate = s.disturbance_fraction > 0 and s.pool_seeds_per_trial > 0
    parts = [np.zeros((0, 4))]
    for trial in trials:
        parts.append(trial.handed_over_states())
        version = trial.policy_version
        if not simulate or version in ("", "none", "unknown"):
            continue
        path = policies.get(version)
        if path is None:
            log(f"{trial.source}: no file of its policy {version} here; its model pool states are left out")
            continue
        policy = load_policy(path, robot=config.robot.robot, torque_limit=config.robot.torque_limit)
        states, _ = post_disturbance_states(build_controller(config.robot, policy), config.model_robot,
                                            s.disturbance_seeds[:s.pool_seeds_per_trial])
        parts.append(states)
    return np.concatenate(parts)


def retrain(config, sessions: list[Path], out: str | Path, warm_start: bool = False,
            policy: Path | None = None, recover: bool = False) -> RetrainResult:
    """Load every trial of ``sessions``, fit + optimise, export a new versioned policy into ``out``."""
    from ..policy import load_policy
    from ..recording import load_sessions, recover_session
    from .learner import Learner
    from .torch_policy import TorchPolicy

    run = RetrainDirectory(out)
    run.prepare(config)
    if recover:
        for session in sessions:
            if (Path(session) / "session.yaml").is_file():
                for bag in recover_session(session):
                    run.log(f"recovered the partial bag {bag}")
    loaded = load_sessions(sessions, config.robot)
    skipped = [str(p) for p in loaded.problems]
    for problem in skipped:
        run.log(f"skipped {problem}")
    notes = {trial.source: list(trial.notes) for trial in loaded.trials if trial.notes}
    for source, lines in notes.items():
        for line in lines:
            run.log(f"{source}: {line}")
    data = loaded.transitions(config.robot.actuated_joint)
    if len(data) < MIN_TRANSITIONS:
        raise RetrainError(f"only {len(data)} usable transitions in {[str(s) for s in sessions]} "
                           f"({len(loaded.trials)} trial(s), {len(skipped)} skipped)")
    learner = Learner(config)
    learner.data = data
    learner.recordings = [trial.states for trial in loaded.trials if trial.states is not None]
    start = time.perf_counter()
    learner.pool = np.concatenate([learner.build_initial_pool(),
                                   trial_pool_states(config, loaded.trials, policy_files(run.policies, policy),
                                                     run.log)])
    pool_time = time.perf_counter() - start
    index = run.next_index()
    model_file = run.newest(run.models, "model_*.npz") if warm_start else None
    if model_file is not None:
        with np.load(model_file) as arrays:
            learner.model.load_arrays({k: arrays[k] for k in arrays.files}, config.device, config.torch_dtype)
    policy_file = policy or (run.newest(run.policies, "policy_*.npz") if warm_start else None)
    if policy_file is not None:
        start_policy = load_policy(policy_file, robot=config.robot.robot, torque_limit=config.robot.torque_limit)
        learner.policy = TorchPolicy.from_numpy(start_policy, config.torch_dtype).to(config.device)
    trial_index = max(len(loaded.trials), 1)
    new_policy, model_arrays, opt, timings = optimize_policy_from_data(learner, trial_index)
    timings["pool"] = pool_time
    np.savez(run.models / f"model_{index:03d}.npz", **model_arrays)
    path = run.export(new_policy, index, retrain=index, trials=len(loaded.trials))
    result = RetrainResult(index, path, new_policy.version(), len(loaded.trials), len(data), skipped, timings,
                           opt.cost[-1] if opt.cost else None, notes, list(opt.snapshots), opt.kept_step,
                           list(opt.start_scores),
                           learner.model.robot.to_dict() if learner.model.robot is not None else None,
                           opt.stop_reason, [list(r) for r in opt.rollbacks])
    run.append(config.robot.robot, result, {"sessions": [str(Path(s).resolve()) for s in sessions],
                                            "warm_start_model": str(model_file or ""),
                                            "warm_start_policy": str(policy_file or ""),
                                            "created": time.strftime("%Y-%m-%dT%H:%M:%S")})
    run.log(f"retrain {index}: {len(loaded.trials)} trials, {len(data)} transitions -> {path.name} "
            f"(version {result.policy_version}); " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    if learner.model.robot is not None:
        run.log(f"retrain {index}: identified robot {learner.model.robot.summary()}")
    if opt.rollbacks:
        run.log(f"retrain {index}: the optimisation rolled back {len(opt.rollbacks)} time(s); it stopped: "
                f"{opt.stop_reason}")
    return result


# --------------------------------------------------------------------------------------------------
# Session reports (``mcpilco session``): learning curve (a trial's cost: cost.trial_cost)


def plot_session_curve(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Learning curve of a session: cost of each recorded trial and evaluation score of each trial's policy.

    ``rows``: one dict per trial with ``trial``, ``cost`` (mean per state) and ``eval_score`` (None for trial 0,
    which explores); with ``robot_time_s`` (s the robot ran in the trial) in every row the x axis is robot
    seconds: a trial's cost at the robot time up to its end, a policy's score at the robot time of the trials it
    learned from (those before it).
    """
    from ..plotting import pyplot, save_figure

    plt = pyplot()
    fig, (ax_cost, ax_score) = plt.subplots(1, 2, figsize=(11, 4))
    timed = bool(rows) and all(r.get("robot_time_s") for r in rows)
    if timed:
        ends = np.cumsum([float(r["robot_time_s"]) for r in rows])
        x_cost = {r["trial"]: float(e) for r, e in zip(rows, ends)}
        x_score = {r["trial"]: float(e - r["robot_time_s"]) for r, e in zip(rows, ends)}
        x_label = "robot seconds (exploration + trials + disturbance windows)"
    else:
        x_cost = x_score = {r["trial"]: r["trial"] for r in rows}
        x_label = "trial (0 = exploration)"
    ax_cost.plot([x_cost[r["trial"]] for r in rows], [r["cost"] for r in rows], "o-")
    ax_cost.set(xlabel=x_label, ylabel="mean cost per state (policy period)",
                title="cost of each recorded trial", ylim=(0, 1))
    scored = [(x_score[r["trial"]], r["eval_score"]) for r in rows if r.get("eval_score") is not None]
    if scored:
        ax_score.plot(*zip(*scored), "o-")
    ax_score.set(xlabel=x_label.replace("robot seconds", "robot seconds learned from"),
                 ylabel="evaluation score (protocol)", ylim=(0, 1), title="score of each trial's policy")
    ax_score.set_xlim(ax_cost.get_xlim())
    for ax in (ax_cost, ax_score):
        if not timed:
            ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)

    return save_figure(fig, path, title)


# --------------------------------------------------------------------------------------------------
# Command line


def default_train_config(robot: str) -> Path:
    from ..paths import config_dir

    return config_dir() / f"train_{robot}.yaml"


def _add_retrain(subparsers) -> None:
    p = subparsers.add_parser("retrain", help="fit the model and optimise the policy from recorded trial bags",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("--sessions", type=Path, nargs="+", required=True,
                   help="session directories, folders of bags (ros2 bag record) or single bags")
    p.add_argument("--out", type=Path, required=True, help="retrain run directory, e.g. runs/pendubot_hw")
    p.add_argument("--robot", choices=ROBOTS, help="robot (default: the training config's)")
    p.add_argument("--config", type=Path, help="training YAML (default: the bundled config/train_<robot>.yaml)")
    p.add_argument("--warm-start", action="store_true", help="start from the newest model and policy in --out")
    p.add_argument("--policy", type=Path, help="start the optimisation from this policy file")
    p.add_argument("--recover", action="store_true", help="salvage partial bags left by a crash first")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line (for the trainer node)")
    p.set_defaults(func=_run_retrain)


def _run_retrain(args: argparse.Namespace) -> int:
    from .learner import load_train_config

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    config_path = args.config or default_train_config(args.robot or "pendubot")
    config = load_train_config(config_path, args.robot)
    try:
        result = retrain(config, args.sessions, args.out, args.warm_start, args.policy, args.recover)
    except RetrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict()), flush=True)
    else:
        for problem in result.skipped:
            print(f"skipped {problem}")
        for source, lines in result.notes.items():
            print("\n".join(f"{source}: {line}" for line in lines))
        print(f"retrain {result.index}: {result.trials} trials, {result.transitions} transitions -> "
              f"{result.policy_path} (version {result.policy_version})")
    return 0


def register(subparsers) -> None:
    """``mcpilco retrain`` (for mcpilco_ros.cli's COMMAND_MODULES)."""
    _add_retrain(subparsers)


def main(argv: list[str] | None = None) -> int:
    """``python -m mcpilco_core.learning.retrain retrain ...`` (what the trainer node's subprocess runs)."""
    parser = argparse.ArgumentParser(prog="python -m mcpilco_core.learning.retrain")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, PolicyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
