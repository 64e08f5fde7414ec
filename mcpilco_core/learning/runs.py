"""Self-describing training run directories and the resumable training driver.

Layout of ``runs/NAME/``::

    run.json                 run id, robot, config hash, package version, creation time, robot time used
    train_config.yaml        the training configuration as given;  robot_config.yaml: the robot's
    log.txt                  human-readable log (appended on resume)
    trials/trial_000/        data.npz (simulator trajectory at 2 ms: t, x, u, u_cmd, mode, x_measured; x0),
                             summary.json (timings, costs, scores) -- written last: marks the trial complete
    trials/trial_KKK/        + policy.npz (own format), model.npz (GP hyperparameters and subsets),
                             optimization.npz (cost / lr / dropout per step), disturbance_states.npy
    policy.npz               the newest policy (copy of the last trial's)
    initial_policy.npz       the policy the first optimisation started from (only with policy.initial)
    learning_curves.png      optimisation cost per step (all trials) and evaluation score per trial

A trial directory is written under a temporary name and renamed when complete, so ``--resume`` restarts
after the last complete trial; every trial's randomness depends only on (seed, trial index).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml
from tqdm import tqdm

from .. import __version__
from ..config import copy_robot_config, read_yaml
from ..policy import load_policy, save_policy
from ..simulation import Trajectory
from . import gp
from .learner import Learner, TrainConfig, TrialRecord, load_train_config, read_train_mapping, resolved_train_mapping
from .optimizer import OptimizationResult

LOG = logging.getLogger("mcpilco.runs")
INITIAL_POLICY = "initial_policy.npz"   # a copy of the training file's policy.initial, when it names one
PRIOR_MODELS_FILE = "prior_plant_models.yaml"   # a copy of the training file's prior_models_file, when it names one


class RunError(RuntimeError):
    """The run directory cannot be used (exists without --resume, or belongs to another configuration)."""


def config_hash(path: str | Path) -> str:
    """The training file's hash: its bytes, or with a ``base`` the resolved settings (an edit of the base counts)."""
    if "base" not in (read_yaml(path) or {}):
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    resolved = json.dumps(read_train_mapping(path), sort_keys=True, default=str)
    return hashlib.sha256(resolved.encode()).hexdigest()[:16]


def profile_fingerprint(config: TrainConfig) -> str:
    """The simulated robot by what it is: its sensors, motors, seed and true plant (a named plant model read from
    its file), not the name or path it was given by. Why: a resumed run must continue on the same robot, and a
    profile file edited in place keeps its path."""
    from ..simulation import load_robot_profile

    profile = load_robot_profile(config.robot_profile)
    content = {key: value for key, value in dataclasses.asdict(profile).items()
               if key not in ("name", "description", "source", "plant_model", "plant_models_file")}
    content["plant"] = dataclasses.asdict(profile.plant_parameters(config.robot))
    content["plant"].pop("name", None)
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()[:16]


class RunDirectory:
    """One training run on disk (see module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.trials_dir = self.root / "trials"

    # ------------------------------------------------------------------ creation
    def create(self, config: TrainConfig, resume: bool) -> dict:
        """Create (or, with ``resume``, reopen and check) the directory; returns run.json's content.

        Refused with a :class:`RunError` naming the directory: a run without ``resume``; a non-empty directory
        without run.json (a session, a retrain directory, anything else: nothing in it is ever replaced); with
        ``resume``, a damaged run.json, another training configuration, robot config or robot profile (the
        message lists what changed)."""
        meta_path = self.root / "run.json"
        digest = config_hash(config.source)
        if meta_path.exists():
            if not resume:
                raise RunError(f"{self.root} already holds a run; pass --resume to continue it or choose --out")
            meta = read_json(meta_path, "run.json")
            if meta.get("config_hash") != digest:
                changes = _differences(meta.get("config"), _plain(config.to_dict()), skip=("source", "robot"))
                raise RunError(f"{self.root} was made with another configuration "
                               f"(hash {meta.get('config_hash')}, now {digest}"
                               + (f"; changed: {changes}" if changes else "") + ")")
            made_with = (meta.get("config") or {}).get("seed", config.seed)
            if made_with != config.seed:
                raise RunError(f"{self.root} was made with training seed {made_with}, now {config.seed}: resume it "
                               f"with --seed {made_with} or start a new run")
            before = {"robot config": meta.get("robot_fingerprint"),
                      "robot profile": (meta.get("config") or {}).get("robot_profile", "nominal")}
            now = {"robot config": config.robot.fingerprint(), "robot profile": config.robot_profile}
            made_on, runs_on = meta.get("robot_profile_fingerprint"), profile_fingerprint(config)
            if made_on == runs_on:           # the profile by what it is, not by the name or path it was given by
                before["robot profile"] = now["robot profile"]
            elif made_on is not None:
                now["robot profile"] = (f"{now['robot profile']} (its contents changed: fingerprint {made_on} -> "
                                        f"{runs_on})")
            changed = [f"{key}: {before[key]} -> {now[key]}" for key in now if before[key] != now[key]]
            if before["robot config"] != now["robot config"]:
                settings = self._robot_differences(config)
                if settings:
                    changed.append(f"robot settings changed: {settings}")
            if changed:
                raise RunError(f"{self.root} was made for another robot ({'; '.join(changed)}); "
                               "resume it as it was or start a new run")
            return meta
        if self.root.is_dir() and any(self.root.iterdir()):
            found = sorted(p.name for p in self.root.iterdir())
            shown = ", ".join(found[:6]) + (", ..." if len(found) > 6 else "")
            raise RunError(f"{self.root} is not empty and holds no run.json, so it is not a run directory "
                           f"(it holds {shown}); nothing was written: choose a new or empty --out")
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        self._copy_train_config(config)
        if config.robot.source:
            copy_robot_config(config.robot.source, self.root)
        meta = {"run_id": uuid.uuid4().hex[:12], "robot": config.robot.robot, "config_hash": digest,
                "robot_fingerprint": config.robot.fingerprint(), "package_version": __version__,
                "robot_profile_fingerprint": profile_fingerprint(config),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "config": config.to_dict()}
        meta_path.write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
        return meta

    def _robot_differences(self, config: TrainConfig) -> str:
        """The robot settings that differ from the run's copy of its robot config ("" if that copy is unreadable)."""
        from dataclasses import asdict

        from ..config import ConfigError, load_robot_config

        try:
            before = load_robot_config(self.root / "robot_config.yaml")
        except (ConfigError, OSError):
            return ""
        return _differences(_plain(asdict(before)), _plain(asdict(config.robot)), skip=("source",))

    def _copy_train_config(self, config: TrainConfig) -> None:
        """The training file as given, or with a ``base``, another ``seed`` (``mcpilco train --seed``), an
        initial policy (copied into the run as ``initial_policy.npz``) or a ``prior_models_file`` (copied as
        ``prior_plant_models.yaml``) the resolved settings (the run stays self-describing)."""
        target = self.root / "train_config.yaml"
        mapping, notes = resolved_train_mapping(config)
        if config.prior_models_file:       # the prior's plant-models file travels with the run, as the robot's does
            shutil.copyfile(config.prior_models_file, self.root / PRIOR_MODELS_FILE)
            mapping["prior_models_file"] = PRIOR_MODELS_FILE
            notes.append(f"prior_models_file {config.prior_models_file} copied into the run")
        if not notes and not config.initial_policy:
            shutil.copyfile(config.source, target)
            return
        if config.initial_policy:
            shutil.copyfile(config.initial_policy, self.root / INITIAL_POLICY)
            mapping["policy"]["initial"] = INITIAL_POLICY
            notes.append(f"policy.initial {config.initial_policy} copied into the run")
        header = f"# resolved from {config.source} ({'; '.join(notes)})\n"
        target.write_text(header + yaml.safe_dump(mapping, sort_keys=False), encoding="utf-8")

    def load_config(self) -> TrainConfig:
        """The run's training configuration from its own copies (train_config.yaml with robot_config.yaml)."""
        return load_train_config(self.root / "train_config.yaml", robot_config=self.root / "robot_config.yaml")

    def log(self, message: str) -> None:
        LOG.info(message)
        with open(self.root / "log.txt", "a", encoding="utf-8") as handle:
            handle.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {message}\n")

    # ------------------------------------------------------------------ trials
    def trial_path(self, k: int) -> Path:
        return self.trials_dir / f"trial_{k:03d}"

    def completed_trials(self) -> list[int]:
        """Indices of complete trials, consecutive from 0 (a gap ends the list)."""
        done = []
        while (self.trial_path(len(done)) / "summary.json").exists():
            done.append(len(done))
        return done

    def save_trial(self, record: TrialRecord, meta: dict) -> Path:
        final = self.trial_path(record.index)
        tmp = final.with_name(final.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        t = record.trajectory
        measured = t.extras.get("x_measured", t.x)          # what the learner fitted on (the sensors' view)
        np.savez(tmp / "data.npz", t=t.t, x=t.x, u=t.u, u_cmd=t.u_cmd, mode=t.mode, x0=record.x0, x_measured=measured)
        if record.policy is not None:
            save_policy(record.policy, tmp / "policy.npz", run_id=meta["run_id"], config_hash=meta["config_hash"],
                        trial=record.index)
        if record.model_arrays is not None:
            np.savez(tmp / "model.npz", **record.model_arrays)
        if record.optimization is not None:
            np.savez(tmp / "optimization.npz", **record.optimization.to_arrays(),
                     wall_time=record.optimization.wall_time)
        np.save(tmp / "disturbance_states.npy", record.disturbance_states)
        (tmp / "summary.json").write_text(json.dumps(record.summary(), indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        if record.policy is not None:
            shutil.copyfile(final / "policy.npz", self.root / "policy.npz")
        return final

    def update_robot_time(self, records: list[TrialRecord]) -> None:
        """run.json's account of robot time: every second the robot ran for learning, per trial and in total.

        Protocol runs that score a policy for the learning curve are a report, not robot time: they feed neither
        the model, nor the particles, nor any choice (``evaluation_seconds_reported`` says how much was run).
        """
        meta_path = self.root / "run.json"
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        meta["robot_time_s"] = {"total": float(sum(r.robot_time for r in records)),
                                "per_trial": [float(r.robot_time) for r in records],
                                "evaluation_seconds_reported": float(sum(60.0 * r.eval_scores.size for r in records))}
        tmp = meta_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(meta_path)

    def load_trial(self, k: int, robot: str) -> TrialRecord:
        """A complete trial's record from its files; a damaged file is a RunError naming it and what is wrong."""
        path = self.trial_path(k)
        with _reading(path / "data.npz"):
            with np.load(path / "data.npz") as d:
                traj = Trajectory(t=d["t"], x=d["x"], u=d["u"], u_cmd=d["u_cmd"], mode=d["mode"])
                if "x_measured" in d.files:                      # runs before robot profiles: the truth
                    traj.extras["x_measured"] = d["x_measured"]
                x0 = d["x0"]
            if traj.x.ndim != 2 or traj.x.shape[1:] != (4,) or len(traj.t) != len(traj.x) or len(x0) != 4:
                raise ValueError(f"arrays of inconsistent shapes (t {traj.t.shape}, x {traj.x.shape}, "
                                 f"x0 {np.shape(x0)})")
        record = TrialRecord(k, traj, x0)
        summary = read_json(path / "summary.json", "summary.json")
        with _reading(path / "summary.json"):
            record.eval_scores = np.asarray(summary.get("eval_scores", []), dtype=float)
            record.robot_cost = float(summary.get("robot_cost") or float("nan"))
            record.robot_time = float(summary.get("robot_time_s", len(traj.u) * traj.dt))   # older runs: the trial
            record.timings = dict(summary.get("timings_s", {}))
        if (path / "policy.npz").exists():
            with _reading(path / "policy.npz"):
                record.policy = load_policy(path / "policy.npz", robot=robot)
        if (path / "model.npz").exists():
            with _reading(path / "model.npz"):
                with np.load(path / "model.npz") as m:
                    record.model_arrays = {key: m[key] for key in m.files}
        if (path / "optimization.npz").exists():
            with _reading(path / "optimization.npz"):
                with np.load(path / "optimization.npz") as o:
                    record.optimization = OptimizationResult(cost=o["cost"].tolist(), lr=o["lr"].tolist(),
                                                             dropout=o["dropout"].tolist(), ratio=o["ratio"].tolist(),
                                                             wall_time=float(o["wall_time"]))
                    if "snapshots" in o.files:
                        record.optimization.snapshots = [(int(a), float(b)) for a, b in o["snapshots"]]
                        kept = int(o["kept_step"])
                        record.optimization.kept_step = kept if kept >= 0 else None
                    if "start_scores" in o.files:
                        record.optimization.start_scores = o["start_scores"].tolist()
        with _reading(path / "disturbance_states.npy"):
            record.disturbance_states = np.load(path / "disturbance_states.npy")
        return record

    # ------------------------------------------------------------------ plots
    def plot_learning_curves(self, records: list[TrialRecord]) -> Path:
        from ..plotting import pyplot

        plt = pyplot()
        fig, (ax_cost, ax_score) = plt.subplots(1, 2, figsize=(11, 4))
        offset = 0
        ax_judge = None
        for r in records:
            if r.optimization is not None and r.optimization.cost:
                steps = np.arange(offset, offset + r.optimization.steps)
                ax_cost.plot(steps, r.optimization.cost, lw=0.8, label=f"trial {r.index}")
                if r.optimization.snapshots:     # optimizer.snapshot_every: the judge's scores, the kept one starred
                    ax_judge = ax_judge or ax_cost.twinx()
                    at, score = np.asarray(r.optimization.snapshots, dtype=float).T
                    ax_judge.plot(offset + at, score, "k.-", lw=0.5, ms=3)
                    kept = dict(r.optimization.snapshots).get(r.optimization.kept_step)
                    if kept is not None:
                        ax_judge.plot(offset + r.optimization.kept_step, kept, "r*", ms=8)
                offset += r.optimization.steps
        ax_cost.set(xlabel="optimisation step (all trials)", ylabel="particle cost J", title="policy optimisation")
        if ax_judge is not None:
            ax_judge.set(ylabel="snapshot: protocol on the model (black; kept: red star)", ylim=(0, 1))
        # trial k's policy learnt from trials 0..k-1: it sits at the robot seconds spent before it ran
        learnt_from = np.cumsum([0.0] + [r.robot_time for r in records])[:-1]
        scored = [(learnt_from[i], float(r.eval_scores.mean())) for i, r in enumerate(records) if r.eval_scores.size]
        if scored:
            ax_score.plot(*zip(*scored), "o-")
            for (x, y), r in zip(scored, [r for r in records if r.eval_scores.size]):
                ax_score.annotate(str(r.index), (x, y), textcoords="offset points", xytext=(0, 5), fontsize=7)
        ax_score.set(xlabel="robot time the policy learnt from (s, counted)", ylabel="score (60 s protocol, a report)",
                     ylim=(0, 1), title="score against robot time (labels: trial)")
        from ..plotting import save_figure

        return save_figure(fig, self.root / "learning_curves.png")


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Any failure while reading ``path`` becomes a RunError naming the file and what is wrong."""
    try:
        yield
    except RunError:
        raise
    except Exception as exc:  # noqa: BLE001 -- numpy, zipfile, pickle-refusal, shape errors: all one message
        if isinstance(exc, KeyError):
            name = str(exc.args[0]).split(" is not a file")[0] if exc.args else "?"   # numpy: 'x is not a file...'
            what = f"array {name!r} missing"
        else:
            what = f"{type(exc).__name__}: {exc}"
        raise RunError(f"{path}: damaged or incomplete ({what}); move the trial directory away to redo the run "
                       "from there, or start a new run") from exc


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``; RunError naming the file if it is unreadable, not JSON or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"{path}: cannot read {what}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise RunError(f"{path}: {what} is damaged: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise RunError(f"{path}: {what} is damaged: not a JSON object (a {type(data).__name__})")
    return data


def _plain(data):
    """``data`` as JSON would store it (tuples -> lists, other objects -> str), to compare with run.json."""
    return json.loads(json.dumps(data, default=str))


def _differences(before, now, skip: tuple[str, ...] = (), prefix: str = "", limit: int = 12) -> str:
    """``key: old -> new`` for every setting that differs (dotted keys into nested sections)."""
    out: list[str] = []

    def walk(a, b, key: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for name in sorted(set(a) | set(b)):
                if not key and name in skip:
                    continue
                walk(a.get(name, "(absent)"), b.get(name, "(absent)"), f"{key}.{name}" if key else name)
        elif a != b:
            out.append(f"{key}: {a} -> {b}")

    walk(before if isinstance(before, dict) else {}, now, prefix)
    return ", ".join(out[:limit]) + (f", ... ({len(out)} in all)" if len(out) > limit else "")


def backward_precision_note(config: TrainConfig) -> str:
    """One log line: the backward matmul's precision on this machine, and a warning where bfloat16 is emulated."""
    precision = config.backward_precision
    note = f"backward matmul in {precision} (backward_matmul: {config.backward_matmul})"
    if precision == "bfloat16" and not gp.native_bfloat16_matmul():
        note += ("; WARNING: this CPU has no native bfloat16 matmul, so every optimisation step runs several times "
                 "slower than in float32 (backward_matmul: auto picks float32 here)")
    return note


def train(config: TrainConfig, out: str | Path, resume: bool = False) -> list[TrialRecord]:
    """Run (or continue) the trials of ``config`` in the run directory ``out``; returns every trial's record."""
    run = RunDirectory(out)
    meta = run.create(config, resume)
    learner = Learner(config)
    initial_pool = learner.build_initial_pool()
    done = run.completed_trials() if resume else []
    records = [run.load_trial(k, config.robot.robot) for k in done]
    if records:
        last = records[-1]
        for name, value in (("policy.npz", last.policy), ("model.npz", last.model_arrays)):
            if last.index > 0 and value is None:      # the next trial starts from them: never silently without
                raise RunError(f"{run.trial_path(last.index) / name}: missing; the run cannot resume from trial "
                               f"{last.index} without it")
        learner.restore(records, initial_pool)
        # a run killed between saving a trial and accounting for it: run.json and the root policy brought up to date
        run.update_robot_time(records)
        if last.index > 0:
            shutil.copyfile(run.trial_path(last.index) / "policy.npz", run.root / "policy.npz")
        run.log(f"resumed after trial {done[-1]}")
    else:
        learner.pool = initial_pool
        run.log(f"run {meta['run_id']}: {config.robot.robot}, {config.trials} trials, config {config.source}")
    run.log(backward_precision_note(config))
    bar = tqdm(range(len(records), config.trials), desc="trials", disable=not config.progress, unit="trial",
               initial=len(records), total=config.trials)
    for k in bar:
        record = learner.exploration_trial() if k == 0 else learner.learning_trial(k)
        run.save_trial(record, meta)
        records.append(record)
        run.update_robot_time(records)
        run.log(_describe(record))
        run.plot_learning_curves(records)
    return records


def _describe(record: TrialRecord) -> str:
    s = record.summary()
    parts = [f"trial {record.index} complete"]
    if s["optimization_steps"]:
        parts.append(f"{s['optimization_steps']} steps ({s['stop_reason']}), model cost {s['final_model_cost']:.3f}")
    elif s["stop_reason"]:                     # no step taken: a diverged optimisation kept its starting policy
        parts.append(f"0 steps ({s['stop_reason']})")
    parts.append(f"robot cost {record.robot_cost:.3f}, robot time {record.robot_time:.1f} s")
    if s["eval_score_mean"] is not None:
        parts.append(f"score {s['eval_score_mean']:.3f}")
    if s.get("prior_plant_b_cf_Ir"):
        b1, b2, cf1, cf2, ir = s["prior_plant_b_cf_Ir"]
        parts.append(f"prior b ({b1:.4f}, {b2:.4f}) N m s/rad, cf ({cf1:.3f}, {cf2:.3f}) N m, Ir {ir:.2e} kg m^2")
    if s.get("delay_aware"):
        parts.append(f"command delay {s['delay_fraction']:.3f} of the period")
    if s.get("identified_robot"):
        b1, b2, cf1, cf2, ir = s["identified_robot"]["b_cf_Ir"]
        steps, dt, r, *noise = s["identified_robot"]["sensors_motors"][:7]
        parts.append(f"robot b ({b1:.4f}, {b2:.4f}), cf ({cf1:.3f}, {cf2:.3f}), Ir {ir:.2e}, "
                     f"delay {steps:.0f} steps (the state {steps * dt * 1e3:g} ms old), r {r:.3f}, "
                     f"velocity noise ({noise[2]:.3f}, {noise[3]:.3f}) rad/s")
    parts.append("times " + ", ".join(f"{k} {v:.1f} s" for k, v in record.timings.items()))
    return "; ".join(parts)


def run_config(root: str | Path) -> TrainConfig:
    """The training config of a run directory, or of a session's (its retrain directory's copy)."""
    from .retrain import session_learning

    learning = session_learning(root)
    return (load_train_config(learning.retrain / "train_config.yaml") if learning is not None
            else RunDirectory(root).load_config())


def run_models(root: str | Path, config: TrainConfig) -> list[tuple[int, dict]]:
    """(k, arrays) of every model of a run or session, in order: the model fitted on trials 0..k-1, so trial k is
    held out for it (a run: trial k's ``model.npz``; a session: retrain i's ``models/model_i.npz``, k its
    ``retrain.json`` trial count)."""
    from .retrain import RetrainDirectory, session_learning

    learning = session_learning(root)
    if learning is None:
        run = RunDirectory(root)
        records = (run.load_trial(k, config.robot.robot) for k in run.completed_trials())
        return [(r.index, r.model_arrays) for r in records if r.model_arrays is not None]
    out = []
    for entry in RetrainDirectory(learning.retrain).history():       # model_NNN.npz is named by the retrain's index
        with np.load(learning.retrain / "models" / f"model_{int(entry['index']):03d}.npz") as arrays:
            out.append((int(entry["trials"]), {k: arrays[k] for k in arrays.files}))
    return out


def trial_transitions(root: str | Path, config: TrainConfig) -> list:
    """Every recorded trial of a run directory (``mcpilco train --out``) or a session's (``mcpilco session --out``, or
    a trainer's retrain directory: the sessions its newest retrain read), in trial order, each as the learner's
    transitions (``TransitionData``) at ``config``'s policy period: what a model is fitted on, and scored on."""
    from ..recording import load_sessions
    from .learner import learning_transitions
    from .retrain import session_learning

    learning = session_learning(root)
    if learning is not None:
        trials = load_sessions(list(learning.sessions), config.robot).trials
        return [trial.transitions(config.robot.actuated_joint) for trial in trials]
    run = RunDirectory(root)
    return [learning_transitions(run.load_trial(k, config.robot.robot).trajectory, config.robot)
            for k in run.completed_trials()]


def run_transitions(root: str | Path, config: TrainConfig):
    """:func:`trial_transitions` as one ``TransitionData``: every recorded trial of the run or session."""
    from ..recording.transitions import TransitionData

    data = TransitionData.empty()
    for trial in trial_transitions(root, config):
        data = data.concat(trial)
    return data


def run_state_recordings(root: str | Path) -> tuple[TrainConfig, list]:
    """(training config, every trial at the state rate in trial order) of a run directory (``mcpilco train
    --out``) or a session's (``mcpilco session --out``, or a trainer's retrain directory: the bags of the sessions
    its newest retrain read, None for one whose states carry no effort), e.g. to identify the robot from them."""
    from ..recording import load_sessions
    from .learner import state_recording
    from .retrain import session_learning

    root = Path(root)
    learning = session_learning(root)
    if learning is not None:
        config = load_train_config(learning.retrain / "train_config.yaml")
        trials = load_sessions(list(learning.sessions), config.robot).trials
        return config, [t.states for t in trials]
    run = RunDirectory(root)
    config = run.load_config()
    return config, [state_recording(run.load_trial(k, config.robot.robot).trajectory, config.robot)
                    for k in run.completed_trials()]
