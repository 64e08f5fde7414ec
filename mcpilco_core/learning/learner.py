"""The MC-PILCO trial loop and its configuration (``config/train_*.yaml``).

Trial 0 explores with random torques. Every later trial k: fit the GP model on all data so far,
optimise the policy on particles drawn from the trial's initial-state distribution, run the policy on
the simulated robot through the supervisor (policy at 50 Hz, LQR inside its region of attraction,
damping over the speed threshold), add the data, optionally score it with the 60 s evaluation protocol.

Initial-state distribution of trial k (seed paper's curriculum): ``U(-gamma_k x_M, gamma_k x_M)`` around the
hanging rest state, ``gamma_k = clip((k - k_m) / K, 0, 1)``; optionally a fraction of the particles comes from
a pool of states the evaluation protocol hands over after its PID disturbances (fast, wound-up), which is what
a global policy must master. The trial itself starts from the box only (``trial_start_state``: a robot cannot
be put down at a moving state; disturbance trials reach those states through their window). Before 2026-11-26
night the offline trial starts also came from the pool.

All randomness derives from ``seed`` and the trial index, so a resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import (
    PLANT_MODELS_FILE,
    ConfigError,
    ConfigReader,
    PlantParameters,
    RobotConfig,
    load_plant_parameters,
    load_robot_config,
    read_yaml,
)
from ..control.exploration import ExplorationController, SupervisedExploration, trial_rng
from ..policy import PolicyError, load_policy
from ..recording.state_rate import StateRecording
from ..recording.transitions import TransitionData
from .compile import fresh_compilation
from .cost import CostSettings, lqr_metric, trial_cost, with_catch_model, with_height_term
from .gp import BACKWARD_PRECISIONS, PRIOR_INTEGRATORS, GPSettings, resolve_backward_precision
from .identified_robot import identify_robot
from .model import ROLLOUT_MODES, DynamicsModel
from .optimizer import (
    POLISH_MODELS,
    POLISH_POOLS,
    OptimizationResult,
    OptimizerSettings,
    PolishSettings,
    optimize_policy,
)
from .parallel import PARALLEL_MODES
from .torch_policy import TorchPolicy

LOG = logging.getLogger("mcpilco.learner")


# --------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class InitialStateSettings:
    """x_max: half-widths (rad, rad, rad/s, rad/s) of the nominal box; k_m, K: curriculum; floor: minimum
    half-widths; disturbance_fraction: share of particles/starts from post-disturbance states, used from
    trial ``disturbance_from_trial``; disturbance_seeds: protocol seeds whose disturbances build the pool
    (disjoint from the seeds used for scores). The pool is simulated on the learner's own model (the prior
    plant: what a user has before identification), never on the robot: it costs no robot time. After each trial
    the first ``pool_seeds_per_trial`` of them add the states the new policy meets on that model."""

    x_max: tuple[float, float, float, float] = (math.pi, math.pi, 0.01, 0.01)
    k_m: int = 5
    K: int = 10
    floor: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    disturbance_fraction: float = 0.0
    disturbance_from_trial: int = 5
    disturbance_seeds: tuple[int, ...] = (1000, 1001, 1002, 1003)
    disturbance_jitter: float = 0.05
    pool_seeds_per_trial: int = 3
    disturbance_trial_from: int = 0          # 0 = never; k >= 1: trials from k on begin with a reset PID window


@dataclass(frozen=True)
class TrainConfig:
    """Every option of a training run (see config/train_pendubot.yaml for their meaning and units)."""

    robot: RobotConfig
    source: str
    seed: int = 0
    device: str = "cpu"
    threads: int = 2
    parallel: str = "ops"            # how the threads are used: "ops" (intra-op) | "particles" | "processes"
    dtype: str = "float32"
    backward_matmul: str = "auto"           # "auto": bfloat16 where the CPU has native bfloat16 matmuls, else float32
    rollout: str = "fused"
    trials: int = 20
    exploration_duration: float = 3.0
    exploration_amplitude: float = 3.0
    trial_duration: float = 3.0
    horizon: float = 3.0
    particles: int = 400
    num_basis: int = 200
    center_dq_range: float = 2 * math.pi
    u_max: float | None = None                    # N m, policy output bound (None: the robot config's u_max)
    initial_lengthscales: tuple[float, ...] = (1.0,) * 6   # of phi = (dq1, dq2, cos q1, cos q2, sin q1, sin q2)
    initial_policy: str | None = None             # policy file the first optimisation starts from (None: random)
    gp: GPSettings = field(default_factory=GPSettings)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    cost: CostSettings = field(default_factory=CostSettings)
    initial_state: InitialStateSettings = field(default_factory=InitialStateSettings)
    evaluation_seeds: tuple[int, ...] = (100,)
    progress: bool = True
    prior_plant: PlantParameters | None = None    # the GP's prior model (None: the robot config's plant)
    prior_models_file: str | None = None          # the plant-models file prior_model is read from, when the training
                                                  # file names one (None: plant_models.yaml beside the robot config)
    robot_profile: str = "nominal"                # the simulated robot the trials run on (config/robot_profiles.yaml)
    polish: PolishSettings = field(default_factory=PolishSettings)   # `mcpilco polish` (no robot time)

    @property
    def model_robot(self) -> RobotConfig:
        """The robot as the learner models it: the robot config with the prior plant. The learner's prior mean and
        the particles' post-disturbance pool use it; the controller (LQR, ROA, damping) keeps the robot config's
        own plant, and the simulated robot is a robot profile: neither is read from here."""
        return self.robot if self.prior_plant is None else replace(self.robot, plant=self.prior_plant)

    @property
    def policy_u_max(self) -> float:
        """The policy's output bound (N m): ``policy.u_max`` of the training file, else the robot config's."""
        return self.robot.u_max if self.u_max is None else self.u_max

    @property
    def particle_threads(self) -> int:
        """Threads or processes that split the particles of an optimisation step (1 with ``parallel: ops``)."""
        return 1 if self.parallel == "ops" else self.threads

    @property
    def horizon_steps(self) -> int:
        return int(round(self.horizon / self.robot.policy_period))

    @property
    def backward_precision(self) -> str:
        """The backward matmul's precision as this machine runs it (``backward_matmul`` with ``auto`` resolved)."""
        return resolve_backward_precision(self.backward_matmul, self.dtype)

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float32 if self.dtype == "float32" else torch.float64

    def to_dict(self) -> dict:
        data = asdict(self)
        data["backward_matmul_as_run"] = self.backward_precision
        data["robot"] = {"robot": self.robot.robot, "source": self.robot.source,
                         "fingerprint": self.robot.fingerprint(),
                         "friction_compensation": self.robot.friction_compensation.enabled}
        return data


_TOP_KEYS = ["robot_config", "seed", "device", "threads", "parallel", "dtype", "backward_matmul", "rollout", "trials",
             "exploration", "trial_duration", "horizon", "particles", "policy", "gp", "optimizer", "cost",
             "initial_state", "evaluation", "progress", "prior_model", "prior_models_file", "robot_profile",
             "polish"]


def auto_threads() -> int:
    """``threads: auto``: OMP_NUM_THREADS when set (the trainer node limits its retraining process that way),
    else min(2, cores)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else min(2, os.cpu_count() or 1)


def read_train_mapping(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict:
    """A training YAML file as a mapping, with its ``base`` resolved.

    ``base: ../train_acrobot_u6.yaml`` (relative to the file) makes the file a small set of overrides on a whole
    recipe: mappings merge key by key, anything else (lists, numbers) replaces the base's value. ``robot_config``
    stays relative to the file that names it. Experiments live that way in ``config/experiments/``.
    """
    path = Path(path)
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(path, "<root>", "expected a mapping at the top level")
    if "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str) or not base:
        raise ConfigError(path, "base", f"expected a file name, got {base!r}")
    base_path = (path.parent / base).resolve()
    if base_path in _chain or base_path == path.resolve():
        raise ConfigError(path, "base", f"{base} includes itself")
    merged = read_train_mapping(base_path, _chain + (path.resolve(),))
    if "robot_config" in merged and "robot_config" not in data:
        if not isinstance(merged["robot_config"], str):   # checked here: it is rebased before the loader sees it
            raise ConfigError(base_path, "robot_config", f"expected a string, got {merged['robot_config']!r}")
        merged["robot_config"] = os.path.relpath(base_path.parent / merged["robot_config"], path.parent)
    inherited = merged.get("policy", {}).get("initial") if isinstance(merged.get("policy"), dict) else None
    own = data.get("policy", {}) if isinstance(data.get("policy"), dict) else {}
    if inherited and "initial" not in own and not Path(str(inherited)).is_absolute():   # relative to its own file
        merged["policy"] = {**merged["policy"],
                            "initial": os.path.relpath(base_path.parent / str(inherited), path.parent)}
    return _merge(merged, data)


def resolved_train_mapping(config: TrainConfig) -> tuple[dict, list[str]]:
    """The training file of ``config`` with its ``base`` merged in, the config's own seed (``--seed``), robot
    profile (``--robot-profile``), and initial policy and prior plant-models file as absolute paths, and notes on
    what differs from the file as written."""
    source = Path(config.source)
    written = read_yaml(source) or {}
    mapping = read_train_mapping(source)
    notes = ["its base merged in"] if "base" in written else []
    if mapping.get("seed", 0) != config.seed:
        mapping["seed"] = config.seed
        notes.append(f"seed {config.seed} from the command line")
    written_profile = profile_beside(str(mapping.get("robot_profile", "nominal")), source.parent)
    if written_profile != config.robot_profile:      # --robot-profile: the run must say which robot it learnt on
        profile = Path(config.robot_profile)
        mapping["robot_profile"] = str(profile.resolve()) if profile.is_file() else config.robot_profile
        notes.append(f"robot_profile {config.robot_profile} from the command line")
    if config.initial_policy:
        mapping["policy"] = {**mapping.get("policy", {}), "initial": config.initial_policy}
    if config.prior_models_file:       # written relative to the training file: absolute, so it loads from elsewhere
        mapping["prior_models_file"] = config.prior_models_file
    return mapping, notes


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_train_config(path: str | Path, robot: str | None = None,
                      robot_config: str | Path | None = None, robot_profile: str | None = None) -> TrainConfig:
    """Read and validate a training YAML file; errors name the file and the field.

    ``robot_config`` (the file's field) is resolved relative to the training file unless the argument
    ``robot_config`` replaces it (a run directory's copy, see ``RunDirectory.load_config``); ``robot`` (from
    ``--robot``) must match it.
    """
    path = Path(path)
    r = ConfigReader(read_train_mapping(path), path)
    r.reject_unknown(_TOP_KEYS)
    robot_path = path.parent / r.string("robot_config", f"{robot or 'pendubot'}.yaml")
    if robot_config is not None:
        robot_path = Path(robot_config)
    if not robot_path.is_file():
        raise ConfigError(path, "robot_config", f"no such robot config file: {robot_path}")
    robot_cfg = load_robot_config(robot_path)
    if robot is not None and robot_cfg.robot != robot:
        raise ConfigError(path, "robot_config", f"{robot_path} is for the {robot_cfg.robot}, not the {robot}")
    d = TrainConfig(robot=robot_cfg, source=str(path))
    threads = r.raw("threads", "auto")
    threads = auto_threads() if threads == "auto" else r.integer("threads", minimum=1)
    ex = r.sub("exploration")
    ex.reject_unknown(["duration", "amplitude"])
    pol = r.sub("policy")
    pol.reject_unknown(["num_basis", "center_dq_range", "u_max", "initial_lengthscales", "initial"])
    ev = r.sub("evaluation")
    ev.reject_unknown(["seeds"])
    prior_models_file = _prior_models_file(r, path)
    config = TrainConfig(
        robot=robot_cfg, source=str(path), seed=r.integer("seed", d.seed, minimum=0),
        device=r.string("device", d.device, choices=["cpu", "cuda"]), threads=threads,
        parallel=r.string("parallel", d.parallel, choices=list(PARALLEL_MODES)),
        dtype=r.string("dtype", d.dtype, choices=["float32", "float64"]),
        backward_matmul=r.string("backward_matmul", d.backward_matmul, choices=list(BACKWARD_PRECISIONS)),
        rollout=r.string("rollout", d.rollout, choices=list(ROLLOUT_MODES)),
        trials=r.integer("trials", d.trials, minimum=1),
        exploration_duration=ex.number("duration", d.exploration_duration, positive=True),
        exploration_amplitude=ex.number("amplitude", d.exploration_amplitude, nonnegative=True),
        trial_duration=r.number("trial_duration", d.trial_duration, positive=True),
        horizon=r.number("horizon", d.horizon, positive=True),
        particles=r.integer("particles", d.particles, minimum=1),
        num_basis=pol.integer("num_basis", d.num_basis, minimum=1),
        center_dq_range=pol.number("center_dq_range", d.center_dq_range, positive=True),
        u_max=pol.number("u_max", robot_cfg.u_max, positive=True),
        initial_lengthscales=pol.vector("initial_lengthscales", 6, d.initial_lengthscales, positive=True),
        initial_policy=_initial_policy(pol, path, robot_cfg),
        gp=_gp_settings(r.sub("gp")), optimizer=_optimizer_settings(r.sub("optimizer")),
        cost=_cost_settings(r.sub("cost"), robot_cfg),
        initial_state=_initial_state_settings(r.sub("initial_state")),
        evaluation_seeds=tuple(_int_list(ev, "seeds", list(d.evaluation_seeds))),
        progress=r.boolean("progress", d.progress), prior_plant=_prior_plant(r, robot_path, prior_models_file),
        prior_models_file=prior_models_file,
        robot_profile=_robot_profile(r, path, robot_profile), polish=_polish_settings(r.sub("polish")))
    if config.exploration_amplitude > robot_cfg.torque_limit:
        raise ConfigError(path, "exploration.amplitude", f"exceeds the torque limit {robot_cfg.torque_limit} N m")
    if config.u_max > robot_cfg.u_max:       # the controller clips the policy to the robot config's bound
        raise ConfigError(path, "policy.u_max", f"{config.u_max} N m exceeds the robot config's u_max "
                                                f"{robot_cfg.u_max} N m (torque limit {robot_cfg.torque_limit} N m)")
    if config.initial_policy is not None:    # every trial warm-starts from it, bound included: the same bound
        initial_bound = load_policy(config.initial_policy).u_max
        if initial_bound != config.u_max:
            raise ConfigError(path, "policy.initial", f"{config.initial_policy} is bounded at {initial_bound:g} N m, "
                                                      f"policy.u_max is {config.u_max:g} N m: the learner would "
                                                      "train with the file's bound; make them equal")
    if config.parallel != "ops" and config.device != "cpu":
        raise ConfigError(path, "parallel", f"{config.parallel!r} splits particles between CPU cores; "
                                            "use parallel: ops with device: cuda")
    if config.horizon_steps < 1:
        raise ConfigError(path, "horizon", "shorter than one policy period")
    return config


def _initial_policy(pol: ConfigReader, path: Path, robot_cfg: RobotConfig) -> str | None:
    """``policy.initial``: a policy file (relative to the training file) the first optimisation starts from, e.g.
    one optimised on the prior model alone (no robot time); checked now (robot, torque limit)."""
    name = pol.raw("initial", None)
    if name is None or name == "":
        return None
    file = Path(str(name))
    file = file if file.is_absolute() else path.parent / file
    try:
        load_policy(file, robot=robot_cfg.robot, torque_limit=robot_cfg.torque_limit)
    except (OSError, PolicyError, ValueError) as exc:
        raise ConfigError(path, pol.name("initial"), f"cannot use {file}: {exc}") from exc
    return str(file.resolve())


def profile_beside(spec: str, directory: Path) -> str:
    """A training file's ``robot_profile``: a YAML file beside it (relative to ``directory``) as its path, else the
    spec as written (a name, NAME:SEED, or a path from elsewhere)."""
    candidate = directory / spec
    return str(candidate) if candidate.suffix in (".yaml", ".yml") and candidate.is_file() else spec


def _robot_profile(r: ConfigReader, path: Path, override: str | None) -> str:
    """The simulated robot (a profile name, NAME:SEED, or a file relative to the training file), checked now."""
    from ..simulation import load_robot_profile

    spec = override if override is not None else profile_beside(r.string("robot_profile", "nominal"), path.parent)
    load_robot_profile(spec)          # raises ConfigError naming the profile file and field
    return spec


def _prior_plant(r: ConfigReader, robot_path: Path, models_file: str | None) -> PlantParameters | None:
    """``prior_model: model_1.0``: a model of the plant-models file beside the robot config (default: the robot
    config's own plant, e.g. model_1.1 -- what a user has before identifying the robot), or of
    ``prior_models_file`` (e.g. the plant of a design robot, ``mcpilco identify --mechanics --write
    design/robot.yaml``: the prior then has the links identified from the first trials; ``models_file``, see
    ``_prior_models_file``)."""
    if not r.has("prior_model"):
        return None
    return load_plant_parameters(models_file or robot_path.parent / PLANT_MODELS_FILE, r.string("prior_model"))


def _prior_models_file(r: ConfigReader, path: Path) -> str | None:
    """``prior_models_file``, relative to the training file, as an absolute path (None when not set)."""
    if not r.has("prior_models_file"):
        return None
    if not r.has("prior_model"):
        raise ConfigError(path, "prior_models_file", "names the file of prior_model, but prior_model is not set")
    models_file = (path.parent / r.string("prior_models_file")).resolve()
    if not models_file.is_file():
        raise ConfigError(path, "prior_models_file", f"no such plant-models file: {models_file}")
    return str(models_file)


def _int_list(reader: ConfigReader, key: str, default: list[int]) -> list[int]:
    """A list of protocol seeds: each in numpy's seed range 0 .. 2**32 - 1, checked now -- a seed out of it would
    stop the run only when it is first used, e.g. evaluation.seeds after the first trial's optimisation."""
    value = reader.raw(key, default)
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ConfigError(reader.source, reader.name(key), f"expected a list of integers, got {value!r}")
    for i, seed in enumerate(value):
        if not 0 <= seed < 2**32:
            raise ConfigError(reader.source, f"{reader.name(key)}[{i}]",
                              f"a seed must be in 0 .. 2**32 - 1, got {seed}")
    return value


def _gp_settings(r: ConfigReader) -> GPSettings:
    d = GPSettings()
    r.reject_unknown([f.name for f in fields(GPSettings)])
    identify = r.boolean("identify", d.identify)
    delay_aware = r.boolean("delay_aware", d.delay_aware)
    if delay_aware and not identify:
        raise ConfigError(r.source, r.name("delay_aware"), "needs gp.identify: true (the delay is identified with "
                          "the friction and rotor inertia)")
    return GPSettings(fit_steps=r.integer("fit_steps", d.fit_steps, minimum=0),
                      fit_lr=r.number("fit_lr", d.fit_lr, positive=True),
                      fit_points=r.integer("fit_points", d.fit_points, minimum=2),
                      max_points=r.integer("max_points", d.max_points, minimum=1),
                      sod_threshold=r.number("sod_threshold", d.sod_threshold, nonnegative=True),
                      noise_floor=r.number("noise_floor", d.noise_floor, positive=True),
                      warm_start=r.boolean("warm_start", d.warm_start),
                      prior=r.string("prior", d.prior, choices=PRIOR_INTEGRATORS),
                      identify=identify, delay_aware=delay_aware,
                      identify_robot=r.boolean("identify_robot", d.identify_robot),
                      lengthscale_floor=r.number("lengthscale_floor", d.lengthscale_floor, nonnegative=True),
                      mirror_data=r.boolean("mirror_data", d.mirror_data))


def _cost_settings(r: ConfigReader, robot: RobotConfig) -> CostSettings:
    r.reject_unknown(["lengthscales", "velocity_lengthscales", "roa_weight", "roa_scale", "catch_level",
                      "catch_sharpness", "height_weight", "height_scale"])
    velocity = r.vector("velocity_lengthscales", 2, positive=True) if r.has("velocity_lengthscales") else None
    weight = r.number("roa_weight", 0.0, nonnegative=True)
    scale = r.number("roa_scale", 1.0, positive=True)
    catch_level = r.number("catch_level", 0.0, nonnegative=True)      # V50 in units of the LQR's ROA level rho
    metric, rho = None, 1.0
    sharpness = r.number("catch_sharpness", 2.0, positive=True)
    if (weight > 0 or catch_level > 0) and robot.roa.enter_fraction <= 0:
        raise ConfigError(r.source, r.name("roa_weight" if weight > 0 else "catch_level"),
                          "rewards the LQR's region, but the robot config's LQR never takes over "
                          "(roa.enter_fraction: 0)")
    if weight > 0 or catch_level > 0:   # the supervisor's own LQR design and ROA level (cached beside its config)
        from ..control import build_controller

        supervisor = build_controller(robot)
        rho = supervisor.rho * robot.roa.enter_fraction * scale
        metric = lqr_metric(supervisor)
    cost = CostSettings(lengthscales=r.vector("lengthscales", 2, (3.0, 3.0), positive=True),
                        velocity_lengthscales=velocity, roa_weight=weight, roa_metric=metric,
                        roa_rho=float(rho), catch_sharpness=sharpness)  # type: ignore[arg-type]
    if catch_level > 0:
        cost = with_catch_model(cost, robot, catch_level, sharpness)
    return with_height_term(cost, r.number("height_weight", 0.0, nonnegative=True),
                            r.number("height_scale", 0.02, positive=True), robot.plant.l)


def _polish_settings(r: ConfigReader) -> PolishSettings:
    d = PolishSettings()
    r.reject_unknown([f.name for f in fields(PolishSettings)])
    return PolishSettings(steps=r.integer("steps", d.steps, minimum=1), lr=r.number("lr", d.lr, positive=True),
                          particles=r.integer("particles", d.particles, minimum=1),
                          seed=r.integer("seed", d.seed, minimum=0),
                          snapshot_every=r.integer("snapshot_every", d.snapshot_every, minimum=0),
                          height_weight=r.number("height_weight", d.height_weight, nonnegative=True),
                          height_scale=r.number("height_scale", d.height_scale, positive=True),
                          candidates=r.integer("candidates", d.candidates, minimum=1),
                          horizon=r.number("horizon", d.horizon, nonnegative=True),
                          u_max=r.number("u_max", d.u_max, nonnegative=True),
                          rounds=r.integer("rounds", d.rounds, minimum=1),
                          round_gain=r.number("round_gain", d.round_gain, nonnegative=True),
                          policy_period=r.number("policy_period", d.policy_period, nonnegative=True),
                          pool=r.string("pool", d.pool, choices=list(POLISH_POOLS)),
                          retries=r.integer("retries", d.retries, minimum=0),
                          robot_config=r.string("robot_config", d.robot_config),
                          add_basis=r.integer("add_basis", d.add_basis, minimum=0),
                          judge_seeds=r.integer("judge_seeds", d.judge_seeds, minimum=0),
                          confirm_seeds=r.integer("confirm_seeds", d.confirm_seeds, minimum=0),
                          first_round=r.integer("first_round", d.first_round, minimum=1),
                          judge_processes=r.integer("judge_processes", d.judge_processes, minimum=0),
                          velocity_lengthscale=r.number("velocity_lengthscale", d.velocity_lengthscale,
                                                        nonnegative=True),
                          judge_profile=r.string("judge_profile", d.judge_profile),
                          catch_level=r.number("catch_level", d.catch_level, nonnegative=True),
                          catch_sharpness=r.number("catch_sharpness", d.catch_sharpness, positive=True),
                          model=r.string("model", d.model, choices=list(POLISH_MODELS)))


def _optimizer_settings(r: ConfigReader) -> OptimizerSettings:
    d = OptimizerSettings()
    r.reject_unknown([f.name for f in fields(OptimizerSettings)])
    s = OptimizerSettings(
        lr=r.number("lr", d.lr, positive=True), lr_min=r.number("lr_min", d.lr_min, positive=True),
        lr_factor=r.number("lr_factor", d.lr_factor, positive=True),
        dropout=r.number("dropout", d.dropout, nonnegative=True),
        dropout_factor=r.number("dropout_factor", d.dropout_factor, nonnegative=True),
        max_steps_first=r.integer("max_steps_first", d.max_steps_first, minimum=1),
        max_steps=r.integer("max_steps", d.max_steps, minimum=1),
        smoothing=r.number("smoothing", d.smoothing, positive=True),
        ratio_threshold=r.number("ratio_threshold", d.ratio_threshold, nonnegative=True),
        patience=r.integer("patience", d.patience, minimum=1), min_steps=r.integer("min_steps", d.min_steps, minimum=0),
        snapshot_every=r.integer("snapshot_every", d.snapshot_every, minimum=0),
        snapshot_seeds=tuple(_int_list(r, "snapshot_seeds", list(d.snapshot_seeds))),
        snapshot_seconds=r.number("snapshot_seconds", d.snapshot_seconds, positive=True),
        starts_first=r.integer("starts_first", d.starts_first, minimum=1),
        snapshot_start=r.boolean("snapshot_start", d.snapshot_start),
        snapshot_fresh=r.boolean("snapshot_fresh", d.snapshot_fresh),
        restart_below=r.number("restart_below", d.restart_below, nonnegative=True),
        restart_from=r.integer("restart_from", d.restart_from, minimum=2),
        judge_processes=r.integer("judge_processes", d.judge_processes, minimum=1))
    if s.starts_first > 1 and s.snapshot_every <= 0:
        raise ConfigError(r.source, r.name("starts_first"), "more than one start needs snapshot_every > 0 (the "
                          "starts are compared by their best snapshot)")
    if s.restart_below > 0 and s.snapshot_every <= 0:
        raise ConfigError(r.source, r.name("restart_below"), "a restart needs snapshot_every > 0 (it is kept only "
                          "when the judge scores it above the warm start)")
    if s.restart_below > 1:
        raise ConfigError(r.source, r.name("restart_below"), "is a judge score (fraction of the time up): at most 1")
    if not s.dropout < 1.0:
        raise ConfigError(r.source, r.name("dropout"), "must be < 1")
    if not s.snapshot_seeds or min(s.snapshot_seeds) < 0:
        raise ConfigError(r.source, r.name("snapshot_seeds"), "must be a non-empty list of seeds >= 0")
    if s.lr_min > s.lr or s.lr_factor >= 1.0 or s.smoothing >= 1.0:
        raise ConfigError(r.source, r.prefix or "optimizer", "need lr_min <= lr, lr_factor < 1, smoothing < 1")
    return s


def _initial_state_settings(r: ConfigReader) -> InitialStateSettings:
    d = InitialStateSettings()
    r.reject_unknown([f.name for f in fields(InitialStateSettings)])
    fraction = r.number("disturbance_fraction", d.disturbance_fraction, nonnegative=True)
    if fraction > 1.0:
        raise ConfigError(r.source, r.name("disturbance_fraction"), "must be in [0, 1]")
    return InitialStateSettings(
        x_max=r.vector("x_max", 4, d.x_max, nonnegative=True),  # type: ignore[arg-type]
        k_m=r.integer("k_m", d.k_m, minimum=0), K=r.integer("K", d.K, minimum=1),
        floor=r.vector("floor", 4, d.floor, nonnegative=True),  # type: ignore[arg-type]
        disturbance_fraction=fraction,
        disturbance_from_trial=r.integer("disturbance_from_trial", d.disturbance_from_trial, minimum=0),
        disturbance_seeds=tuple(_int_list(r, "disturbance_seeds", list(d.disturbance_seeds))),
        disturbance_jitter=r.number("disturbance_jitter", d.disturbance_jitter, nonnegative=True),
        pool_seeds_per_trial=r.integer("pool_seeds_per_trial", d.pool_seeds_per_trial, minimum=0),
        disturbance_trial_from=r.integer("disturbance_trial_from", d.disturbance_trial_from, minimum=0))


# --------------------------------------------------------------------------------------------------
# Randomness and the initial-state distribution


def trial_generators(seed: int, trial: int) -> tuple[np.random.Generator, torch.Generator]:
    """Independent numpy and torch generators for one trial, from (seed, trial) only (resume-safe)."""
    sequence = np.random.SeedSequence([seed, trial])
    rng = trial_rng(seed, trial)                      # = default_rng(sequence), shared with the controller node
    torch_gen = torch.Generator().manual_seed(int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1)))
    return rng, torch_gen


def start_generator(seed: int, trial: int, start: int) -> torch.Generator:
    """The torch generator of the extra random start ``start`` >= 1 (``optimizer.starts_first``) of trial ``trial``:
    its own stream, from (seed, trial, start) only; start 0 uses the trial's generator (:func:`trial_generators`)."""
    sequence = np.random.SeedSequence([seed, trial, start])
    return torch.Generator().manual_seed(int(sequence.generate_state(1, np.uint64)[0] >> np.uint64(1)))


def trial_start_state(config: TrainConfig, trial: int) -> np.ndarray:
    """Where trial ``trial`` starts on the robot (rad, rad/s): a draw from the curriculum box only, from the
    trial's own generator. Never from the post-disturbance pool: a robot cannot be put down at a moving state
    (a disturbance trial's window makes those). ``mcpilco session`` and the offline learner use it alike."""
    rng, _ = trial_generators(config.seed, trial)
    return initial_distribution(config, trial, np.zeros((0, 4))).sample_numpy(1, rng)[0]


def curriculum_gamma(trial: int, k_m: int, K: int) -> float:
    """gamma_k = clip((k - k_m) / K, 0, 1) of the seed paper."""
    return float(np.clip((trial - k_m) / K, 0.0, 1.0))


@dataclass
class InitialStateDistribution:
    """Box ``U(-w, w)`` (w = max(gamma x_max, floor)) mixed with a pool of post-disturbance states."""

    half_width: np.ndarray
    pool: np.ndarray
    pool_fraction: float
    jitter: float

    def sample_numpy(self, n: int, rng: np.random.Generator) -> np.ndarray:
        x = rng.uniform(-1.0, 1.0, size=(n, 4)) * self.half_width
        if self.pool_fraction > 0 and len(self.pool):
            from_pool = rng.uniform(size=n) < self.pool_fraction
            picks = rng.integers(0, len(self.pool), size=int(from_pool.sum()))
            x[from_pool] = self.pool[picks] + self.jitter * rng.standard_normal((len(picks), 4))
        return x

    def sampler(self, device: str, dtype: torch.dtype):
        """A torch sampler (n, generator) -> (n, 4) for the optimiser (same distribution)."""
        half = torch.as_tensor(self.half_width, dtype=torch.float64)
        pool = torch.as_tensor(self.pool, dtype=torch.float64)

        def sample(n: int, generator: torch.Generator) -> torch.Tensor:
            x = (2 * torch.rand((n, 4), generator=generator, dtype=torch.float64) - 1) * half
            if self.pool_fraction > 0 and len(pool):
                mask = torch.rand(n, generator=generator, dtype=torch.float64) < self.pool_fraction
                picks = torch.randint(0, len(pool), (int(mask.sum()),), generator=generator)
                noise = torch.randn((len(picks), 4), generator=generator, dtype=torch.float64)
                x[mask] = pool[picks] + self.jitter * noise
            return x.to(device=device, dtype=dtype)

        return sample


def initial_distribution(config: TrainConfig, trial: int, pool: np.ndarray) -> InitialStateDistribution:
    s = config.initial_state
    gamma = curriculum_gamma(trial, s.k_m, s.K)
    half = np.maximum(gamma * np.asarray(s.x_max), np.asarray(s.floor))
    fraction = s.disturbance_fraction if trial >= s.disturbance_from_trial else 0.0
    return InitialStateDistribution(half, pool, fraction, s.disturbance_jitter)


# --------------------------------------------------------------------------------------------------
# The simulated robot


def run_on_robot(config: RobotConfig, controller, x0: np.ndarray, duration: float, profile=None, seed: int = 0,
                 disturbance_target: np.ndarray | None = None):
    """One trial on the simulated robot of ``profile`` (None: nominal; noise seeded by ``seed``); returns its
    Trajectory (true states ``x``, what the sensors reported in ``extras["x_measured"]``).

    ``disturbance_target`` (rad, both joints): the trial begins with the protocol's 0.2 s reset PID on both
    motors towards it (a *disturbance trial*: the data covers the fast states a global policy meets); the
    controller acts after it, and the passive joint gets exactly 0 outside the window. The window's steps are
    recorded with mode ``reset``.
    """
    from ..evaluation import RESET_TORQUE_LIMIT, DisturbanceWindow
    from ..plant import DoublePendulum
    from ..simulation import drive, load_robot_profile

    override = None
    if disturbance_target is not None:
        override = DisturbanceWindow(disturbance_target, DoublePendulum(config.plant), config.control_period)
    robot = load_robot_profile(profile).robot(config, seed, np.asarray(x0, dtype=np.float64), override=override,
                                              override_limits=(RESET_TORQUE_LIMIT, RESET_TORQUE_LIMIT))
    while override is not None and robot.in_override():     # the window first, then the trial's duration
        robot.step(None, "reset")
    return drive(robot, controller, int(round(duration / config.control_period)), True)


def recorded_trial(trajectory, config: RobotConfig):
    """A simulated trial as a session's bag of it reads (:class:`mcpilco_core.recording.TrialData`).

    The streams are the ones the lockstep simulated robot and the controller publish: state k stamped k steps
    after the start, with the measured state and the torque applied over the step that ended at it; a command per
    state; the states before and after a window's steps marked ``reset``. The bag reader's own ``resample`` turns
    them into the learner's data, so an offline run learns from the very numbers a session's retrain reads (the
    20 ms grid, the torque averaged over each interval, the window's intervals left out, the state it handed over,
    the state-rate recording) and an offline run and a session with the same settings are the same computation."""
    from ..recording.reader import RawTrial, resample
    from ..simulation import MODE_CODES

    names = {code: name for name, code in MODE_CODES.items()}
    x = np.asarray(trajectory.extras.get("x_measured", trajectory.x), float)
    u = np.asarray(trajectory.u, float)
    dt_ns = int(round(float(trajectory.dt) * 1e9))
    stamps = np.arange(len(x), dtype=np.int64) * dt_ns
    window = np.asarray(trajectory.mode) == MODE_CODES["reset"]
    marked = np.zeros(len(x), bool)
    marked[:-1] |= window                      # the state a window step starts from ...
    marked[1:] |= window                       # ... and the one it ends at
    raw = RawTrial("simulated trial", stamps, x[:, :2].copy(), x[:, 2:].copy(), np.vstack([np.zeros((1, 2)), u]),
                   stamps[:len(u)].copy(), np.asarray(trajectory.u_cmd, float).copy(),
                   [names.get(int(m), "other") for m in trajectory.mode], state_reset=marked)
    return resample(raw, config)


def learning_transitions(trajectory, config: RobotConfig) -> TransitionData:
    """The trial's transitions at the policy period, as a bag of it gives them (:func:`recorded_trial`): each
    one's previous command is the interval before it (a window's last one after a window), 0 at the start."""
    return recorded_trial(trajectory, config).transitions(config.actuated_joint)


def state_recording(trajectory, config: RobotConfig) -> StateRecording:
    """A trial at the state rate as its bag gives it (:func:`recorded_trial`): measured states, applied and
    commanded torques, a window's steps marked unusable."""
    return recorded_trial(trajectory, config).states


def disturbance_seed(seed: int, trial: int) -> int:
    """The seed of trial k's disturbance targets (``mcpilco session --sim`` hands it to the driver's window)."""
    return int(np.random.SeedSequence([seed, trial, 2]).generate_state(1)[0])


def disturbance_target(seed: int, trial: int) -> np.ndarray:
    """The target (rad, both joints) of trial k's disturbance window: the driver's first target for
    :func:`disturbance_seed` (``DisturbanceTargets``), so a session and ``mcpilco train`` disturb alike."""
    from ..evaluation import DisturbanceTargets

    return DisturbanceTargets(disturbance_seed(seed, trial)).next()


def trial_noise_seed(seed: int, trial: int) -> int:
    """The simulated robot's noise seed for one trial (from (seed, trial) only: resume-safe)."""
    return int(np.random.SeedSequence([seed, trial, 1]).generate_state(1)[0])


def robot_seconds(trajectory) -> float:
    """Seconds the robot ran in a trajectory: its steps times the control period (what a trial costs)."""
    return float(len(trajectory.u) * trajectory.dt)


def post_disturbance_states(controller, config: RobotConfig, seeds: tuple[int, ...] | list[int],
                            profile=None) -> tuple[np.ndarray, np.ndarray]:
    """States right after each PID disturbance of the evaluation protocol (M, 4), and each seed's score, on the
    simulated robot of ``profile`` (None: nominal, i.e. ``config.plant`` with ideal sensors and motors)."""
    from ..evaluation import evaluate_seed

    states, scores = [], []
    for seed in seeds:
        result = evaluate_seed(controller, config, seed, keep_trajectory=True, profile=profile)
        traj = result.trajectory
        for _, end in result.windows:
            states.append(traj.x[min(int(round(end / traj.dt)), len(traj.x) - 1)])
        scores.append(result.score)
    return np.asarray(states).reshape(-1, 4), np.asarray(scores)


# --------------------------------------------------------------------------------------------------
# The trial loop


@dataclass
class TrialRecord:
    """What one trial produced (the run directory stores it)."""

    index: int
    trajectory: Any
    x0: np.ndarray
    policy: Any | None = None                     # SumOfGaussiansPolicy (None for trial 0)
    model_arrays: dict | None = None
    optimization: OptimizationResult | None = None
    eval_scores: np.ndarray = field(default_factory=lambda: np.zeros(0))
    disturbance_states: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    timings: dict = field(default_factory=dict)
    robot_cost: float = float("nan")
    robot_time: float = 0.0                       # s the robot ran for learning in this trial (see summary())

    def summary(self) -> dict:
        opt = self.optimization
        return {"trial": self.index, "x0": self.x0.tolist(), "timings_s": self.timings,
                "optimization_steps": opt.steps if opt else 0,
                "final_model_cost": opt.cost[-1] if opt and opt.cost else None,
                "stop_reason": opt.stop_reason if opt else "",
                "snapshots": [list(s) for s in opt.snapshots] if opt else [],
                "kept_step": opt.kept_step if opt else None,
                "start_scores": list(opt.start_scores) if opt else [],
                "skipped_optimization_steps": opt.skipped_steps if opt else 0,
                # divergences the optimiser rolled back from: [history step, checkpoint step, why] (optimizer.py)
                "optimization_rollbacks": [list(r) for r in opt.rollbacks] if opt else [],
                "eval_scores": self.eval_scores.tolist(),
                "eval_score_mean": float(self.eval_scores.mean()) if self.eval_scores.size else None,
                "robot_cost": self.robot_cost, "robot_time_s": self.robot_time,
                "prior_plant_b_cf_Ir": self._model_array("prior_plant_b_cf_Ir"),
                "delay_aware": self._model_array("delay_aware"),             # gp.delay_aware: the command delay
                "delay_fraction": self._model_array("delay_fraction"),       # (fraction of the period) identified
                # gp.identify_robot: friction and Ir at the state rate; delay steps, dt, r, 4 noise stds, torque noise,
                # 2 residuals, windows (identified_robot.IdentifiedRobot.to_arrays)
                "identified_robot": ({"b_cf_Ir": self._model_array("robot_b_cf_Ir"),
                                      "sensors_motors": self._model_array("robot_sensors_motors")}
                                     if self._model_array("robot_b_cf_Ir") is not None else None)}

    def _model_array(self, key: str) -> list | None:
        if self.model_arrays is None or key not in self.model_arrays:
            return None
        return np.asarray(self.model_arrays[key]).tolist()


class Learner:
    """Runs MC-PILCO trials for one configuration; the state (data, model, policy) can be restored."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        # "particles" / "processes": each of `threads` Python threads / processes propagates a share of the
        # particles with single-threaded ops (parallel.py); "ops": torch splits each op across `threads` threads.
        torch.set_num_threads(1 if config.parallel != "ops" else config.threads)
        self.model = DynamicsModel(config.model_robot, config.gp, rollout_mode=config.rollout)
        self.data = TransitionData.empty()
        self.recordings: list[StateRecording] = []    # the trials at the state rate (gp.identify_robot)
        self.policy: TorchPolicy | None = None
        self.pool = np.zeros((0, 4))

    # ------------------------------------------------------------------ state
    def add_trajectory(self, trajectory):
        """Learn from a trial as its bag gives it (:func:`recorded_trial`); returns that recorded trial."""
        cfg = self.config.robot
        recorded = recorded_trial(trajectory, cfg)
        self.data = self.data.concat(recorded.transitions(cfg.actuated_joint))
        if self.config.gp.identify_robot and recorded.states is not None:
            self.recordings.append(recorded.states)
        return recorded

    def restore(self, records: list[TrialRecord], initial_pool: np.ndarray) -> None:
        """Rebuild the learner after the given (complete) trials, e.g. for --resume."""
        self.pool = initial_pool
        for record in records:
            self.add_trajectory(record.trajectory)
            if len(record.disturbance_states):
                self.pool = np.concatenate([self.pool, record.disturbance_states])
        last = records[-1]
        if last.model_arrays is not None:
            self.model.load_arrays(last.model_arrays, self.config.device, self.config.torch_dtype)
        if last.policy is not None:
            self.policy = TorchPolicy.from_numpy(last.policy, self.config.torch_dtype).to(self.config.device)

    # ------------------------------------------------------------------ trials
    def build_initial_pool(self) -> np.ndarray:
        """Post-disturbance states of the LQR + damping supervisor (no policy yet) on the pool seeds."""
        s = self.config.initial_state
        if s.disturbance_fraction <= 0 or not s.disturbance_seeds:
            return np.zeros((0, 4))
        from ..control import build_controller

        states, _ = post_disturbance_states(build_controller(self.config.robot), self.config.model_robot,
                                            s.disturbance_seeds)
        return states

    def exploration_trial(self) -> TrialRecord:
        """Trial 0: random torques. The torques come from a generator of their own, ``trial_rng(seed, 0)``, as
        the controller node's first exploration run (``exploration.seed`` = seed) draws them, and the supervisor's
        damping and safe modes override them as in the node: offline and ``mcpilco session`` explore alike.
        (Before 2026-11-26 night they shared the generator of x0; before 2026-11-27 afternoon offline exploration
        was never damped.)"""
        from ..control import build_controller

        cfg = self.config
        x0 = trial_start_state(cfg, 0)
        start = time.perf_counter()
        explorer = ExplorationController(cfg.robot, cfg.exploration_amplitude, trial_rng(cfg.seed, 0))
        # the supervisor watches as on the robot: damping and safe override exploration (the controller node's rule)
        controller = SupervisedExploration(build_controller(cfg.robot), explorer)
        traj = run_on_robot(cfg.robot, controller, x0, cfg.exploration_duration, cfg.robot_profile,
                            trial_noise_seed(cfg.seed, 0))
        self.add_trajectory(traj)
        return TrialRecord(0, traj, x0, timings={"robot": time.perf_counter() - start}, robot_time=robot_seconds(traj))

    def fit_and_optimize(self, k: int, description: str, metadata: dict | None = None) -> tuple:
        """MC-PILCO step k without running the policy: fit the model on all data, optimise the policy.

        Shared by :meth:`learning_trial` (simulated robot) and ``mcpilco retrain`` (real trials). Returns
        (numpy policy, OptimizationResult, timings in s, the trial's numpy generator, initial distribution).
        """
        cfg = self.config
        if cfg.rollout == "compiled":
            fresh_compilation()          # each trial compiles as a retrain's fresh process does (compile.py)
        rng, gen = trial_generators(cfg.seed, k)
        timings: dict[str, float] = {}
        start = time.perf_counter()
        self.model.fit(self.data, rng, cfg.device, cfg.torch_dtype)
        self.model.posterior.set_backward_precision(cfg.backward_precision)
        timings["model_fit"] = time.perf_counter() - start
        if cfg.gp.identify_robot:
            start = time.perf_counter()
            self.identify_robot(k)
            timings["robot_identification"] = time.perf_counter() - start
        if self.policy is None and cfg.initial_policy:
            initial = load_policy(cfg.initial_policy, robot=cfg.robot.robot, torque_limit=cfg.robot.torque_limit)
            self.policy = TorchPolicy.from_numpy(initial, cfg.torch_dtype).to(cfg.device)
        starts = cfg.optimizer.starts_first if self.policy is None else 1
        dist = initial_distribution(cfg, k, self.pool)
        max_steps = cfg.optimizer.max_steps_first if k <= 1 else cfg.optimizer.max_steps
        judge = self.protocol_judge(k)
        warm = self.policy is not None
        runs: list[tuple[TorchPolicy, OptimizationResult]] = []

        def run_start(i: int, label: str) -> None:
            generator = gen if i == 0 else start_generator(cfg.seed, k, i)
            if self.policy is None or i > 0:
                self.policy = TorchPolicy.random(cfg.num_basis, cfg.policy_u_max, generator, cfg.center_dq_range,
                                                 cfg.torch_dtype, cfg.initial_lengthscales).to(cfg.device)
            runs.append((self.policy, optimize_policy(
                self.policy, self.model, dist.sampler(cfg.device, cfg.torch_dtype), cfg.particles, cfg.horizon_steps,
                cfg.cost, cfg.optimizer, max_steps, generator, cfg.progress, description=label,
                particle_threads=cfg.particle_threads, particle_processes=cfg.parallel == "processes", judge=judge)))

        for i in range(starts):
            run_start(i, description if starts == 1 else f"{description}, start {i + 1}/{starts}")
        if warm and cfg.optimizer.restarts(k, runs[0][1].kept_score):
            LOG.info("trial %d: the warm start's best snapshot is judged %.3f (< restart_below %.3f): a fresh random "
                     "policy is optimised too", k, runs[0][1].kept_score, cfg.optimizer.restart_below)
            run_start(1, f"{description}, fresh restart")
        scores = [result.kept_score for _, result in runs]
        self.policy, result = runs[scores.index(max(scores))]          # ties keep the earlier start
        if len(runs) > 1:
            result.start_scores = scores
            if warm:
                LOG.info("trial %d: judge warm start %.3f, fresh restart %.3f: the %s kept", k, scores[0], scores[1],
                         "restart" if scores[1] > scores[0] else "warm start")
        timings["optimization"] = sum(r.wall_time for _, r in runs)    # every start's, judging included
        if result.snapshots:
            timings["snapshot_judge"] = sum(r.judge_time for _, r in runs)
        numpy_policy = self.policy.to_numpy(cfg.robot.robot, cfg.robot.policy_period,
                                            {"trial": k, "seed": cfg.seed, **(metadata or {})})
        return numpy_policy, result, timings, rng, dist

    def identify_robot(self, k: int) -> None:
        """``gp.identify_robot``: the robot behind the recordings so far (identified_robot.py), kept with the model
        for the protocol simulations; its own generator (the trial's streams stay as they were)."""
        cfg = self.config
        found = identify_robot(cfg.model_robot.plant, self.recordings, cfg.robot.actuated_joint,
                               cfg.robot.torque_limit, np.random.default_rng([cfg.seed, k, 4]))
        if found is None:
            kept = "keeps the last one identified" if self.model.robot is not None else "runs on the GP prior's plant"
            LOG.warning("trial %d: too few usable state-rate windows to identify the robot; the judge %s", k, kept)
            return
        self.model.robot = found
        LOG.info("trial %d: identified robot %s", k, found.summary())

    def protocol_judge(self, k: int = 1):
        """The optimiser's judge of trial k's snapshots (``optimizer.snapshot_every``; None when 0): the mean
        fraction of the time up over the evaluation protocol's seeds (``optimizer.judge_seeds(k)``) x
        ``snapshot_seconds`` simulated on the learner's own plant -- the model's prior with the friction and rotor
        inertia identified from the trials, ideal sensors and motors -- with the controller the policy will run in
        (its LQR and switching). A simulation of the model: no robot time."""
        from .protocol import protocol_judge

        opt = self.config.optimizer
        if opt.snapshot_every <= 0:
            return None
        return protocol_judge(self.config, self.model, opt.judge_seeds(k), opt.snapshot_seconds, opt.judge_processes)

    def learning_trial(self, k: int) -> TrialRecord:
        """Fit, optimise, run, evaluate (trial k >= 1)."""
        numpy_policy, result, timings, _, _ = self.fit_and_optimize(k, f"trial {k} policy")
        record = TrialRecord(k, None, trial_start_state(self.config, k), numpy_policy, self.model.to_arrays(), result)
        self._run_and_evaluate(record, timings)
        return record

    def _run_and_evaluate(self, record: TrialRecord, timings: dict) -> None:
        """Run trial k's policy on the robot (robot time), extend the particles' pool, score it for the report."""
        from ..control import build_controller

        cfg, s = self.config, self.config.initial_state
        start = time.perf_counter()
        controller = build_controller(cfg.robot, record.policy)
        target = None
        if 1 <= s.disturbance_trial_from <= record.index:    # the trial begins with a reset PID window
            target = disturbance_target(cfg.seed, record.index)
        record.trajectory = run_on_robot(cfg.robot, controller, record.x0, cfg.trial_duration, cfg.robot_profile,
                                         trial_noise_seed(cfg.seed, record.index), target)
        record.robot_time = robot_seconds(record.trajectory)
        recorded = self.add_trajectory(record.trajectory)
        handed_over = recorded.handed_over_states()               # as a session's retrain reads it
        record.robot_cost = trial_cost(recorded, cfg.cost)[0]     # the measured states, as a session reports them
        timings["robot"] = time.perf_counter() - start
        simulated = np.zeros((0, 4))
        if s.disturbance_fraction > 0 and s.pool_seeds_per_trial:
            start = time.perf_counter()      # on the learner's own model: no robot time
            simulated, _ = post_disturbance_states(build_controller(cfg.robot, record.policy), cfg.model_robot,
                                                   s.disturbance_seeds[:s.pool_seeds_per_trial])
            timings["pool"] = time.perf_counter() - start
        # the pool grows by the state the trial's window handed over (as measured) and the simulated ones
        record.disturbance_states = np.concatenate([handed_over, simulated])
        self.pool = np.concatenate([self.pool, record.disturbance_states])
        if cfg.evaluation_seeds:             # a report only: it feeds neither the learner nor any choice
            start = time.perf_counter()
            _, record.eval_scores = post_disturbance_states(build_controller(cfg.robot, record.policy), cfg.robot,
                                                            cfg.evaluation_seeds, cfg.robot_profile)
            timings["evaluation"] = time.perf_counter() - start
        record.timings = timings
