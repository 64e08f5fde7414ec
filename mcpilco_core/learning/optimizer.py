"""Policy optimisation on the model: Adam on the Monte-Carlo cost with MC-PILCO's schedules.

Every step re-samples the initial particles and the model noise, so the gradient is stochastic. The
learning rate is halved at each plateau (down to ``lr_min``) and the dropout probability is scaled down
with it; at a plateau with the learning rate already at its minimum the optimisation stops.

Plateau detection (the smoothed-ratio rule): with the per-step cost change dJ_k = J_k - J_{k-1}, keep
exponential moving averages of dJ and dJ^2; the ratio r = |mean(dJ)| / std(dJ) measures how much of the
cost change is trend rather than noise. r below ``ratio_threshold`` for ``patience`` consecutive steps is
a plateau. ``max_steps`` caps the number of steps regardless.

Keeping the best iterate (``snapshot_every`` > 0 and a ``judge``): the particle cost the steps minimise ranks a
hardware-proxy run's policies poorly (docs/learner.md), and the last iterate is sometimes much worse than one met
on the way, or than the warm start itself. So every ``snapshot_every`` steps, at the start (the warm-start
policy) and at the end, the policy is handed to ``judge`` (higher is better; the learner's judge simulates the
evaluation protocol on its own identified plant, no robot time), and the best-judged parameters are the result.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from tqdm import tqdm

from .cost import CostSettings, trajectory_cost
from .model import DynamicsModel, NonFiniteParticlesError, denormals_flushed, particle_noise, rollout
from .parallel import ParticleProcesses, ParticleThreads
from .torch_policy import TorchPolicy

LOG = logging.getLogger(__name__)

__all__ = ["OptimizationResult", "OptimizerSettings", "ParticleProcesses", "ParticleThreads", "PlateauMonitor",
           "optimize_policy"]


@dataclass(frozen=True)
class OptimizerSettings:
    """lr / lr_min (Adam learning rates), lr_factor (multiplier at a plateau), dropout (initial p),
    dropout_factor (multiplier of p at a plateau), max_steps_first / max_steps (caps for trial 1 / later),
    smoothing (EMA factor of the ratio rule), ratio_threshold, patience (steps), min_steps, snapshot_every (steps
    between judged snapshots; 0 = keep the last iterate, as before); snapshot_seeds / snapshot_seconds (s): the
    protocol runs the learner's judge simulates on its plant per snapshot (other seeds than ``mcpilco select``'s
    2000-2003, so that the choice among trials does not re-use the noise the snapshots were picked on);
    starts_first: random starting policies optimised in the first optimisation of a run (the learner keeps the one
    whose best snapshot the judge scores highest; > 1 needs snapshot_every > 0). Why: the first policy decides the
    basin the warm-started trials stay in (docs/learner.md); snapshot_start: the starting policy is a snapshot too
    (True: a trial may keep its predecessor's policy when no step beats it; False: every trial ends with a policy of
    its own, the best of its steps); snapshot_fresh: each trial judges on seeds of its own (:meth:`judge_seeds`:
    trial k on the snapshot seeds shifted by k - 1 times their count), the start re-judged on them. Why: a trial
    keeps its best-judged snapshot, so its score is the judge's maximum; judged again on the same seeds, the next
    trial's start carries that overrating as its bar. Measured (acrobot, three training seeds): it does not stop
    the repeated policies -- there the training's own steps (lr 0.01, dropout) judge below the warm start
    (docs/learner.md, "A judge that is not its own bar"); the polish's ``judge_seeds`` is where it helps;
    restart_below / restart_from: a warm-started trial (from trial restart_from on) whose kept snapshot the judge
    scores below restart_below also optimises a fresh random policy on the same model and keeps whichever the judge
    scores higher (0: never; needs snapshot_every > 0). Why: a warm start stays in its basin, and a run whose early
    policies never learnt the swing-up keeps polishing one that does not (acrobot training seed 1 kept one policy,
    judged 0.10-0.18, from trial 4 to 11), while a random start on a later model has that model to learn from. No
    robot time: both are judged on the learner's own robot. judge_processes: the judge's protocol runs go to that
    many worker processes (1: in this process). The same scores, so the same run; why: while the judge runs, the
    optimisation waits: with 8 seeds of 60 s per snapshot, a fifth of a polish round (2 processes: 8 % shorter)."""

    lr: float = 0.01
    lr_min: float = 0.0025
    lr_factor: float = 0.5
    dropout: float = 0.25
    dropout_factor: float = 0.5
    max_steps_first: int = 2000
    max_steps: int = 4000
    smoothing: float = 0.99
    ratio_threshold: float = 0.08
    patience: int = 200
    min_steps: int = 0
    snapshot_every: int = 0
    snapshot_seeds: tuple[int, ...] = (3000, 3001, 3002, 3003)
    snapshot_seconds: float = 60.0
    starts_first: int = 1
    snapshot_start: bool = True
    snapshot_fresh: bool = False
    restart_below: float = 0.0
    restart_from: int = 2
    judge_processes: int = 1

    def restarts(self, trial: int, warm_score: float) -> bool:
        """Whether warm-started trial ``trial``, whose kept snapshot the judge scored ``warm_score``, also optimises a
        fresh random policy (``restart_below``)."""
        return self.restart_below > 0 and trial >= self.restart_from and warm_score < self.restart_below

    def judge_seeds(self, trial: int) -> tuple[int, ...]:
        """The protocol seeds trial ``trial`` (from 1; a polish's round) judges its snapshots on:
        ``snapshot_seeds``, or with ``snapshot_fresh`` those seeds shifted by (trial - 1) times their count."""
        if trial < 1:
            raise ValueError(f"trials and rounds count from 1, got {trial}")
        if not self.snapshot_fresh:
            return tuple(self.snapshot_seeds)
        shift = len(self.snapshot_seeds) * (trial - 1)
        return tuple(int(s) + shift for s in self.snapshot_seeds)


POLISH_POOLS = ("run", "policy", "judge")
POLISH_MODELS = ("gp", "prior", "robot")  # what the polish's particles roll out on (PolishSettings.model)
CONFIRM_FIRST_SEED = 5000   # the polish's confirming seeds: apart from the snapshot judge's (3000 on), the choice's
                            # (200 on) and the reports' (0-29)


@dataclass(frozen=True)
class PolishSettings:
    """steps: Adam steps (a fixed count); lr: the fixed learning rate; particles per step; seed of the particles'
    starts and noise (with the training seed); snapshot_every: steps between judged snapshots (0: keep the last
    step); height_weight, height_scale (m): the below-the-line term added to the training cost for the polish
    (``cost.height_weight``, mcpilco_core/learning/cost.py; 0: the training cost as it is); candidates: how many
    policies of the choice's ranking are polished (the selected one and the next best), the best judged kept;
    horizon (s): the particles' rollout length (0: the training horizon). Why a longer one: the acrobot's catch
    takes 2.3 s after a disturbance, longer than its 2 s training horizon, so the training cost never sees
    whether a particle ends caught or coasting through the top; u_max (N m): the policy's output bound raised to
    this (0: the policy's own), with the same weights, so the policy is unchanged where it was not saturated and
    may now push harder (at most the torque limit; the judge runs the robot config with this bound). Why: the
    pendubot's 3 N m policy polished with 6 N m reached the line sooner, 0.752 -> 0.775 on protocol seeds 0-9;
    rounds: polish again from the kept policy, Adam restarted, while a round's judge gains at least round_gain
    over its start (a later round that gains less is discarded: that gain is the judge's noise; the first round is
    kept as a single polish keeps it); retries: after such a round, this many more rounds in a row may try the
    next particle seed from the last kept policy before the rounds stop (0: they stop at the first).
    Why: the shipped policies' judges kept rising over 2-3 such rounds (acrobot 0.478 -> 0.491 -> 0.519);
    policy_period (s): polish the policy for this rate (0: the run's): the model is refitted at this period from the
    run's recorded trials (the same data, cut at the new period: the trials are recorded at the state rate) and the
    policy keeps its weights, now held for this period. Why: the acrobot's 50 Hz policy run at 83-100 Hz scored
    0.52-0.53 instead of 0.49 on the choosing seeds (the pendubot's: unchanged);
    pool: where the particles' post-disturbance starts come from: "run" (the run's pool: the states the learner's
    model met with the trials' policies) or "policy" (the states the policy being polished meets after the
    protocol's disturbances on the learner's model, ``initial_state.disturbance_seeds``; no robot time; each round
    its own) or "judge" (the same on the robot the judge runs on, :func:`protocol.on_model`: with
    ``gp.identify_robot`` the robot identified at the state rate, its friction, delay, motor lag and noise). Why:
    the protocol hands the policy the states it leaves when disturbed, mostly near the top for a policy that
    balances, where the run's pool holds what the trials' weaker policies left; "judge" because on a robot that is
    not the prior (the proxy's friction) the prior's plant hands over elsewhere;
    robot_config: the robot config file the polished policy will run with ('' = the run's; a path as given, from
    the working directory): the judge's protocol and the "policy" pool run its controller (switching, LQR, the
    catch) around the policy; same robot, same policy period; the learner's prior plant stays the run's. Why:
    the acrobot's opt-in catch (acrobot_catch.yaml) takes hand-overs the LQR drops, so a policy polished for it may
    hand over differently;
    add_basis: this many basis functions added before the polish (rounds: before the first), centred on states of
    the particles' post-disturbance pool, with weight 0 -- the policy is unchanged until the optimiser moves them.
    Why: the policy's 200 centres were placed for the swing-up from rest; the protocol hands over fast states
    where few of them reach;
    judge_seeds: 0 = the snapshots are judged on the training's snapshot seeds, the same in every round; N > 0 = on
    N seeds per round, new ones each round (round k: the first snapshot seed + N (k - 1) ... + N k - 1), the
    round's start judged again on them. Why: a round keeps the best of its judged snapshots, so the kept score is
    the judge's maximum and overrates the policy; on the same seeds the next round's start carries that overrating
    as its bar, and the rounds stop at a lucky snapshot (acrobot, training seed 1: judge 0.358, seeds 0-9 0.276);
    confirm_seeds: 0 = a round counts as a gain when its kept snapshot beats its start by ``round_gain`` on the
    judge's seeds, the ones it was picked on; N > 0 = on N other seeds, new each round (round k:
    ``CONFIRM_FIRST_SEED`` + N (k - 1) ... + N k - 1), the start and the kept snapshot both judged there, and a
    first round that does not gain there is not kept either (the start is given back). Why: the best of 13
    snapshots beats the start on the seeds it was picked on by noise alone, so rounds judged on new seeds were
    kept while the policy got worse (acrobot, training seed 0 polished on: 0.377 -> 0.337 on seeds 0-9);
    first_round: the number of the first round (its folder OUT/round_K and its judge's and confirming seeds; a single
    polish is that round). Why: a polish continued from an earlier one's output with ``first_round`` = the rounds
    already run + 1 judges and confirms on seeds the earlier rounds did not use; from 1 again it would re-use them
    with other policies. judge_processes: the worker processes of the judge's and the confirming seeds' protocol runs
    (0: the training's ``optimizer.judge_processes``; the same scores either way).
    velocity_lengthscale (rad/s): the cost's velocity term for the polish, lv for both joints (0: the training
    cost's). Why: the nominal acrobot polished once with 6 in place of 12 (passing the top fast costs more) is the
    best single policy on the proxy's sliding shoulder (0.51 alone, every policy learnt there 0.39-0.43).
    judge_profile: the robot profile the judge, the confirming seeds and the "judge" pool run on (a name of
    config/robot_profiles.yaml or a profile file, e.g. a design robot written by ``mcpilco identify --write``;
    '' = the learner's own robot, :func:`protocol.on_model`), with the polish's robot config as the controller;
    several separated by commas (``--judge-profile A B``): the judge scores the mean over them on the same seeds and
    the pool holds each one's states (:func:`protocol.judge_profiles`).
    Why: a policy polished on the prior's model (free) for a robot with friction is best picked on that robot's
    design robot; the prior's judge keeps what suits the prior. A true robot is refused (``polish_config``): a
    built-in profile other than nominal, a file simulating the same robot, a perturbed robot, the run's own robot
    profile -- the judge is not counted, so it must not read the robot the policy is for.
    catch_level: the catch model in the polish's cost (cost.py): a particle is caught by the balance with the
    probability 1 / (1 + (V / V50)^k) per step and costs nothing from then on, V50 = catch_level x rho and V the
    cost-to-go of the polish's own controller (its LQR and ROA level: ``robot_config``'s); 0 = off.
    catch_sharpness: k. Why: on the friction robot the plain cost is flat where the protocol is steep (2 % of cost
    between 0.51 and 0.40 on the design robot); with the catch model at 8 rho, k = 4, it ranks seven acrobot
    policies as the protocol does (Spearman 0.93 against 0.68; ``benchmarks/bench_cost_alignment.py``).
    model: what the particles roll out on: ``gp`` (the run's newest model, default) or ``prior`` (its physics prior
    alone, the GP's residual, variance and fitted noise off, the particles' noise at ``gp.noise_floor``: with
    ``gp.identify`` the plant identified from the trials, its friction, rotor inertia and command delay). Why: on
    the proxy the GP is fitted to noisy, delayed velocities and learns no better one-step prediction than the
    identified prior (RMS 0.099 / 0.173 against 0.099 / 0.169 rad/s on the acrobot run pm0), and its polishes lost
    on the design robot; with the identified prior and the catch model the polish gained 0.04 on the 3 s design
    robot that judged it, but not on the proxy nor on a design robot identified from 22 s (docs/learner.md): the
    judge's robot must be as good as the model.
    No dropout: the polish tunes the policy that runs on the robot, every basis function on.

    The snapshots are judged as a trial's are (``optimizer.snapshot_seeds`` x ``snapshot_seconds`` of the protocol
    simulated on the learner's own robot, no robot time), the starting policy included: the polish keeps the best,
    and gives back the policy it was given when no snapshot beats it. Why: a lower particle cost does not always
    mean a better policy on the protocol (acrobot, training seed 1: 47.9 -> 46.7 while the protocol fell from 0.24
    to 0.21)."""

    steps: int = 1500
    lr: float = 0.001
    particles: int = 400
    seed: int = 0
    snapshot_every: int = 250
    height_weight: float = 0.0
    height_scale: float = 0.02
    candidates: int = 1
    horizon: float = 0.0
    u_max: float = 0.0
    rounds: int = 1
    round_gain: float = 0.005
    policy_period: float = 0.0
    pool: str = "run"
    retries: int = 0
    robot_config: str = ""
    add_basis: int = 0
    judge_seeds: int = 0
    confirm_seeds: int = 0
    first_round: int = 1
    judge_processes: int = 0
    velocity_lengthscale: float = 0.0
    judge_profile: str = ""
    catch_level: float = 0.0
    catch_sharpness: float = 4.0
    model: str = "gp"

    def __post_init__(self) -> None:
        if not (self.catch_level >= 0.0 and math.isfinite(self.catch_level)):
            raise ValueError(f"polish: catch_level must be a finite number >= 0 (units of the controller's ROA "
                             f"level rho; 0: no catch model), got {self.catch_level}")
        if not (self.catch_sharpness > 0.0 and math.isfinite(self.catch_sharpness)):
            raise ValueError(f"polish: catch_sharpness must be a finite number > 0, got {self.catch_sharpness}")
        if self.model not in POLISH_MODELS:
            raise ValueError(f"polish: model must be one of {', '.join(POLISH_MODELS)}, got {self.model!r}")
        if not self.velocity_lengthscale >= 0.0 or math.isinf(self.velocity_lengthscale):
            raise ValueError(f"polish: velocity_lengthscale must be a finite number >= 0 (rad/s; 0: the training "
                             f"cost's), got {self.velocity_lengthscale}")
        if self.first_round < 1:
            raise ValueError(f"polish: first_round must be >= 1 (rounds count from 1), got {self.first_round}")
        if self.judge_processes < 0:
            raise ValueError(f"polish: judge_processes must be >= 0 (0: the training's optimizer.judge_processes), got "
                             f"{self.judge_processes}")
        if self.confirm_seeds < 0:
            raise ValueError(f"polish: confirm_seeds must be >= 0 (0: a round's gain is judged on the seeds its "
                             f"snapshot was picked on), got {self.confirm_seeds}")
        if self.judge_seeds < 0:
            raise ValueError(f"polish: judge_seeds must be >= 0 (0: the training's snapshot seeds), got "
                             f"{self.judge_seeds}")
        if self.pool not in POLISH_POOLS:
            raise ValueError(f"polish: pool must be one of {', '.join(POLISH_POOLS)}, got {self.pool!r}")
        if self.add_basis < 0:
            raise ValueError(f"polish: add_basis must be >= 0, got {self.add_basis}")
        if self.retries < 0:
            raise ValueError(f"polish: retries must be >= 0, got {self.retries}")
        if self.rounds < 1 or (self.rounds > 1 and self.snapshot_every < 1):
            raise ValueError(f"polish: need rounds >= 1, and snapshot_every >= 1 to judge several (got {self.rounds}, "
                             f"{self.snapshot_every})")
        if not (self.round_gain >= 0 and np.isfinite(self.round_gain)):
            raise ValueError(f"polish: round_gain must be >= 0 and finite, got {self.round_gain}")
        if not (self.u_max >= 0 and np.isfinite(self.u_max)):
            raise ValueError(f"polish: u_max must be >= 0 N m and finite (0: the policy's own bound), got {self.u_max}")
        if not (self.horizon >= 0 and np.isfinite(self.horizon)):
            raise ValueError(f"polish: the horizon must be >= 0 s and finite (0: the training horizon), got "
                             f"{self.horizon}")
        if self.candidates < 1 or (self.candidates > 1 and self.snapshot_every < 1):
            raise ValueError(f"polish: need candidates >= 1, and snapshot_every >= 1 to compare several (got "
                             f"{self.candidates}, {self.snapshot_every})")
        if not (self.height_weight >= 0 and np.isfinite(self.height_weight) and self.height_scale > 0
                and np.isfinite(self.height_scale)):
            raise ValueError(f"polish: need height_weight >= 0 and height_scale > 0, finite (got "
                             f"{self.height_weight}, {self.height_scale})")
        if self.steps < 1 or self.particles < 1 or self.seed < 0 or self.snapshot_every < 0:
            raise ValueError(f"polish: need steps >= 1, particles >= 1, seed >= 0 and snapshot_every >= 0 (got "
                             f"{self.steps}, {self.particles}, {self.seed}, {self.snapshot_every})")
        if not (self.lr > 0 and np.isfinite(self.lr)):
            raise ValueError(f"polish: the learning rate must be > 0 and finite, got {self.lr}")

    def optimizer(self, training: OptimizerSettings, round_index: int = 1) -> OptimizerSettings:
        """The optimiser's settings: fixed lr (lr_min = lr), no dropout, no plateau stop before ``steps``, snapshots
        judged on :meth:`judge_seeds_for` ``round_index`` (1 = the first round, or a single polish) and the
        training's snapshot seconds, the start among them."""
        return OptimizerSettings(lr=self.lr, lr_min=self.lr, dropout=0.0, dropout_factor=0.0, max_steps=self.steps,
                                 max_steps_first=self.steps, min_steps=self.steps + 1,
                                 snapshot_every=self.snapshot_every,
                                 snapshot_seeds=self.judge_seeds_for(training, round_index),
                                 snapshot_seconds=training.snapshot_seconds, snapshot_start=True,
                                 judge_processes=self.judge_processes_for(training))

    def judge_processes_for(self, training: OptimizerSettings) -> int:
        """The judge's worker processes (the snapshots' and the confirming seeds'): ``judge_processes``, or the
        training's ``optimizer.judge_processes`` when it is 0."""
        return self.judge_processes or training.judge_processes

    def judge_seeds_for(self, training: OptimizerSettings, round_index: int = 1) -> tuple[int, ...]:
        """The protocol seeds the judge runs in round ``round_index`` (from 1): the training's snapshot seeds when
        ``judge_seeds`` is 0, else ``judge_seeds`` consecutive seeds from the first snapshot seed, new each round."""
        if self.judge_seeds == 0:
            return replace(training, snapshot_fresh=False).judge_seeds(round_index)
        first = int(training.snapshot_seeds[0])
        block = replace(training, snapshot_seeds=tuple(range(first, first + self.judge_seeds)), snapshot_fresh=True)
        return block.judge_seeds(round_index)

    def confirm_seeds_for(self, round_index: int) -> tuple[int, ...]:
        """The protocol seeds on which round ``round_index`` (from 1) decides whether it gained: ``confirm_seeds``
        consecutive seeds from ``CONFIRM_FIRST_SEED``, new each round (the shift of
        :meth:`OptimizerSettings.judge_seeds`); () when ``confirm_seeds`` is 0."""
        block = tuple(range(CONFIRM_FIRST_SEED, CONFIRM_FIRST_SEED + self.confirm_seeds))
        return OptimizerSettings(snapshot_seeds=block, snapshot_fresh=True).judge_seeds(round_index)


@dataclass
class OptimizationResult:
    """Per-step history: cost (J at the step), lr, dropout p; steps run; wall time (s); why it stopped; the judged
    snapshots (step, judge's score; step 0 = the starting policy) and the step whose parameters were kept (None:
    the last)."""

    cost: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    dropout: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    wall_time: float = 0.0
    stop_reason: str = ""
    skipped_steps: int = 0
    snapshots: list[tuple[int, float]] = field(default_factory=list)
    kept_step: int | None = None
    judge_time: float = 0.0
    start_scores: list[float] = field(default_factory=list)   # starts_first > 1 or a restart: each start's best
                                                              # snapshot score (a restart: [warm start, fresh])
    rollbacks: list[tuple[int, int, str]] = field(default_factory=list)  # (step, checkpoint step it went back to, why)

    @property
    def steps(self) -> int:
        return len(self.cost)

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {"cost": np.asarray(self.cost), "lr": np.asarray(self.lr), "dropout": np.asarray(self.dropout),
                  "ratio": np.asarray(self.ratio)}
        if self.snapshots:
            arrays["snapshots"] = np.asarray(self.snapshots, dtype=np.float64).reshape(-1, 2)
            arrays["kept_step"] = np.asarray(self.kept_step if self.kept_step is not None else -1)
        if self.start_scores:
            arrays["start_scores"] = np.asarray(self.start_scores, dtype=np.float64)
        if self.rollbacks:
            arrays["rollbacks"] = np.asarray([r[:2] for r in self.rollbacks], dtype=np.int64).reshape(-1, 2)
        return arrays

    @property
    def kept_score(self) -> float:
        """The judge's score of the kept snapshot (-inf without snapshots)."""
        return max((score for _, score in self.snapshots), default=-math.inf)


def parameters_copy(policy: TorchPolicy) -> dict[str, torch.Tensor]:
    """A detached copy of the policy's state (for :meth:`TorchPolicy.load_state_dict` later)."""
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


class BestSnapshot:
    """The best-judged parameters met so far (:func:`optimize_policy`); ``judge`` maps the policy to a score
    (higher is better) and is called with dropout off."""

    def __init__(self, policy: TorchPolicy, judge: Callable[[TorchPolicy], float], result: OptimizationResult) -> None:
        self.policy, self.judge, self.result = policy, judge, result
        self.state: dict[str, torch.Tensor] | None = None

    def consider(self, step: int) -> None:
        start = time.perf_counter()
        self.policy.set_dropout(0.0, None)
        with torch.no_grad():
            score = float(self.judge(self.policy))
        if score > self.result.kept_score:      # ties keep the earlier snapshot
            self.result.kept_step = step
            self.state = parameters_copy(self.policy)
        self.result.snapshots.append((step, score))
        self.result.judge_time += time.perf_counter() - start

    def restore(self) -> None:
        if self.state is not None:
            self.policy.load_state_dict(self.state)


class PlateauMonitor:
    """The smoothed-ratio plateau rule (see module docstring)."""

    def __init__(self, smoothing: float, threshold: float, patience: int) -> None:
        self.smoothing, self.threshold, self.patience = smoothing, threshold, patience
        self.reset()

    def reset(self) -> None:
        self.previous: float | None = None
        self.mean = 0.0
        self.square = 0.0
        self.weight = 0.0
        self.below = 0
        self.ratio = math.inf

    def update(self, cost: float) -> bool:
        """Feed J_k; True when a plateau is detected (then the counter restarts)."""
        if self.previous is not None:
            change = cost - self.previous
            a = self.smoothing
            self.mean = a * self.mean + (1 - a) * change
            self.square = a * self.square + (1 - a) * change * change
            self.weight = a * self.weight + (1 - a)
            mean = self.mean / self.weight
            var = max(self.square / self.weight - mean * mean, 1e-30)
            self.ratio = abs(mean) / math.sqrt(var)
            self.below = self.below + 1 if self.ratio < self.threshold else 0
        self.previous = cost
        if self.below >= self.patience:
            self.below = 0
            return True
        return False


MAX_SKIPPED_IN_A_ROW = 20  # consecutive steps with escaped particles or non-finite gradients before a rollback
CHECKPOINT_EVERY = 50      # successful steps between the parameter checkpoints a rollback returns to
MAX_ROLLBACKS = 3          # rollbacks before the optimisation stops as diverged


class Checkpoints:
    """The parameters at step 0 and every ``CHECKPOINT_EVERY`` successful steps, the last two kept: a rollback
    returns to the older one, taken ``CHECKPOINT_EVERY`` to 2 x ``CHECKPOINT_EVERY`` steps before the divergence
    was seen (the newer one may already lie on the way out)."""

    def __init__(self, policy: TorchPolicy) -> None:
        self.policy = policy
        self.kept: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.take(0)

    def take(self, step: int) -> None:
        self.kept = (self.kept + [(step, parameters_copy(self.policy))])[-2:]

    def roll_back(self) -> int:
        """Load the older checkpoint's parameters; it becomes the only one. Returns its step."""
        step, state = self.kept[0]
        self.policy.load_state_dict(state)
        self.kept = self.kept[:1]
        return step


def optimize_policy(policy: TorchPolicy, model: DynamicsModel,
                    sample_x0: Callable[[int, torch.Generator], torch.Tensor], particles: int,
                    steps_horizon: int, cost: CostSettings, settings: OptimizerSettings,
                    max_steps: int, generator: torch.Generator, progress: bool = True,
                    description: str = "policy", particle_threads: int = 1,
                    particle_processes: bool = False,
                    judge: Callable[[TorchPolicy], float] | None = None) -> OptimizationResult:
    """Minimise the particle estimate of J over the policy parameters in place; return the history.

    sample_x0(n, generator) draws the initial particles (n, 4) on the rollout device and dtype.
    ``particle_threads`` > 1 splits each step's particles between that many threads (:class:`ParticleThreads`),
    or with ``particle_processes`` between this thread and worker processes (:class:`ParticleProcesses`); the
    random draws (initial states, noise) are the same as with one thread. With ``settings.snapshot_every`` > 0 and
    a ``judge``, the policy ends with the best-judged snapshot's parameters (module docstring). A divergence rolls
    back and, when it persists, stops with ``stop_reason`` "diverged ..." (module docstring); it never raises.
    """
    opt = torch.optim.Adam(policy.parameters(), lr=settings.lr)
    monitor = PlateauMonitor(settings.smoothing, settings.ratio_threshold, settings.patience)
    lr, dropout = settings.lr, settings.dropout
    result = OptimizationResult()
    skipped_in_a_row = 0
    threads: ParticleThreads | ParticleProcesses | None = None
    if particle_threads > 1:
        threads = (ParticleProcesses(model, particle_threads) if particle_processes
                   else ParticleThreads(particle_threads))
    start = time.perf_counter()
    best = BestSnapshot(policy, judge, result) if judge is not None and settings.snapshot_every > 0 else None
    if best is not None and settings.snapshot_start:
        best.consider(0)
    checkpoints = Checkpoints(policy)
    bar = tqdm(total=max_steps, desc=description, disable=not progress, leave=False, unit="step")
    try:
        for step in range(max_steps):
            policy.set_dropout(dropout, generator)
            opt.zero_grad(set_to_none=True)
            x0 = sample_x0(particles, generator)
            noise = particle_noise(steps_horizon, particles, generator, x0.dtype, x0.device)
            try:
                if threads is None:
                    with denormals_flushed():
                        loss = trajectory_cost(rollout(model, policy, x0, steps_horizon, None, noise=noise), cost)
                        loss.backward()
                    value = float(loss.detach())
                else:
                    value = threads.cost_and_gradients(model, policy, x0, noise, steps_horizon, cost)
            except NonFiniteParticlesError as exc:
                # A particle escaped (seen: a spike GP lengthscale overflowing the float32 kernel, docs/learner.md):
                # skip this step's update, never propagate; roll back when it keeps happening (module docstring).
                failure = str(exc)
            else:
                failure = None if all(bool(torch.isfinite(p.grad).all()) for p in policy.parameters()
                                      if p.grad is not None) else "non-finite policy gradient"
            if failure is not None:
                result.skipped_steps += 1       # a non-finite gradient would make the parameters NaN
                skipped_in_a_row += 1
                if skipped_in_a_row <= MAX_SKIPPED_IN_A_ROW:
                    continue
                why = f"{failure} ({skipped_in_a_row} steps in a row)"
                back_to = checkpoints.roll_back()
                result.rollbacks.append((result.steps, back_to, why))
                if len(result.rollbacks) > MAX_ROLLBACKS:
                    result.stop_reason = (f"diverged: {why}; {MAX_ROLLBACKS} rollbacks, kept the parameters of "
                                          f"step {back_to}")
                    LOG.warning("%s: optimisation %s", description, result.stop_reason)
                    break
                lr = max(lr * settings.lr_factor, settings.lr_min)
                opt = torch.optim.Adam(policy.parameters(), lr=lr)     # fresh moments: the old ones led out
                monitor.reset()
                skipped_in_a_row = 0
                LOG.warning("%s: %s at step %d; rolled back to step %d, learning rate %.4g", description, why,
                            result.steps, back_to, lr)
                continue
            skipped_in_a_row = 0
            opt.step()
            result.cost.append(value)
            result.lr.append(lr)
            result.dropout.append(dropout)
            plateau = monitor.update(value)
            result.ratio.append(monitor.ratio)
            bar.update(1)
            bar.set_postfix(cost=f"{value:.2f}", lr=f"{lr:.4g}")
            if result.steps % CHECKPOINT_EVERY == 0:
                checkpoints.take(result.steps)
            if best is not None and result.steps % settings.snapshot_every == 0:
                best.consider(result.steps)
                LOG.info("%s: step %d of at most %d, cost %.2f, judged %.3f (kept: step %s, %.3f), %.0f s",
                         description, result.steps, max_steps, value, result.snapshots[-1][1], result.kept_step,
                         result.kept_score, time.perf_counter() - start)
            if plateau and step + 1 >= settings.min_steps:
                if lr <= settings.lr_min * (1 + 1e-9):
                    result.stop_reason = "plateau at the minimum learning rate"
                    break
                lr = max(lr * settings.lr_factor, settings.lr_min)
                dropout *= settings.dropout_factor
                for group in opt.param_groups:
                    group["lr"] = lr
        else:
            result.stop_reason = "step cap"
        if best is not None:
            if not result.snapshots or result.snapshots[-1][0] != result.steps:
                best.consider(result.steps)
            best.restore()
    finally:
        bar.close()
        policy.set_dropout(0.0, None)
        if threads is not None:
            threads.close()
    result.wall_time = time.perf_counter() - start
    return result
