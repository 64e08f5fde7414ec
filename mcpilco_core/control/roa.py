"""Region-of-attraction (ROA) estimate of the saturated LQR, by closed-loop simulation.

Method (sampling-based falsification of sublevel sets of the cost-to-go V(x) = (x - g)^T S (x - g)):

1. Draw ``samples`` initial states with V uniform in (0, rho_max] and uniformly random directions
   (x0 = g + L^-T z with S = L L^T and |z|^2 = V), seeded.
2. Simulate all of them at once with the *real* closed loop: RK4 at the control period, LQR on the
   actuated joint only, saturated at the torque limit, zero torque on the passive joint.
3. A sample is stabilised when V(x(T)) < ``converged_cost`` after ``horizon`` seconds (and stays finite).
4. rho = the smallest V(x0) among the failures (the largest sublevel set containing no counterexample);
   rho_max when nothing failed (then the estimate is a lower bound: raise rho_max).
5. Refine: repeat 1-4 ``ROUNDS`` times, each round sampling V in (0, 2 rho] of the previous round (the
   samples are split between rounds), and keep the smallest failing V seen overall. Most of the
   sampling effort thus lands near the boundary, where counterexamples are.

The result depends only on the plant, the LQR weights, the torque limit and these settings, so it is
cached in ``<config>.roa.json`` beside the robot config (or the user cache when that is read-only),
keyed by a hash of all of them.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..config import (
    BalanceDitherConfig,
    CatchConfig,
    FrictionCompensationConfig,
    ObserverConfig,
    RoaConfig,
    RobotConfig,
    SelectionConfig,
)
from ..plant import DoublePendulum, wrap_state
from .lqr import LqrDesign


@dataclass(frozen=True)
class RoaEstimate:
    """rho (same units as V), how many samples were simulated and how many failed."""

    rho: float
    samples: int
    failures: int
    saturated: bool  # True when no sample failed: rho is only a lower bound

    def to_dict(self) -> dict:
        return asdict(self)


def sample_sublevel_states(design: LqrDesign, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """States with cost-to-go exactly ``values`` (shape (N,)) in uniformly random directions."""
    directions = rng.standard_normal((values.shape[0], 4))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    z = directions * np.sqrt(values)[:, None]
    chol = np.linalg.cholesky(design.S)          # S = L L^T
    offsets = np.linalg.solve(chol.T, z.T).T     # e = L^-T z  =>  e^T S e = |z|^2
    return design.goal + offsets


def simulate_lqr(plant: DoublePendulum, design: LqrDesign, x0: np.ndarray, torque_limit: float,
                 dt: float, horizon: float) -> np.ndarray:
    """Final states of the saturated LQR closed loop from many initial states at once (N, 4)."""
    x = np.array(x0, dtype=np.float64)
    k_row = design.K[design.actuated_joint]
    u = np.zeros((x.shape[0], 2))
    for _ in range(int(round(horizon / dt))):
        err = wrap_state(x) - design.goal
        u[:, design.actuated_joint] = np.clip(-(err @ k_row), -torque_limit, torque_limit)
        with np.errstate(all="ignore"):
            x = plant.rk4_step(x, u, dt)
        x[~np.isfinite(x).all(axis=1)] = np.nan
    return x


ROUNDS = 3


def _failing_values(plant: DoublePendulum, design: LqrDesign, torque_limit: float, settings: RoaConfig,
                    dt: float, upper: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """Cost-to-go values V(x0) of the sampled initial states that the closed loop fails to stabilise."""
    values = np.maximum(rng.uniform(0.0, upper, count), 1e-12)
    final = simulate_lqr(plant, design, sample_sublevel_states(design, values, rng), torque_limit, dt,
                         settings.horizon)
    with np.errstate(invalid="ignore"):
        final_cost = design.cost_to_go(wrap_state(final))
    return values[~(final_cost < settings.converged_cost)]  # NaN counts as failed


def estimate_roa(plant: DoublePendulum, design: LqrDesign, torque_limit: float, settings: RoaConfig,
                 dt: float) -> RoaEstimate:
    """Estimate rho as described in the module docstring."""
    rng = np.random.default_rng(settings.seed)
    rho, failures = float(settings.rho_max), 0
    per_round = max(1, settings.samples // ROUNDS)
    for _ in range(ROUNDS):
        failing = _failing_values(plant, design, torque_limit, settings, dt, min(settings.rho_max, 2.0 * rho),
                                  per_round, rng)
        failures += int(failing.size)
        if failing.size:
            rho = min(rho, float(failing.min()))
    return RoaEstimate(rho=rho, samples=per_round * ROUNDS, failures=failures, saturated=failures == 0)


# --------------------------------------------------------------------------------------------------
# Cache


def _cache_key(config: RobotConfig) -> str:
    """Fingerprint of the config without what does not change rho: the switching rules, the policy bound, the
    passive-joint friction compensation, the balance dither, the catch, the policy selection and the state observer (the
    estimate simulates the LQR alone on the config's plant, with exact states)."""
    from dataclasses import replace

    neutral = replace(config.roa, enter_fraction=RoaConfig.enter_fraction, exit_fraction=RoaConfig.exit_fraction,
                      reenter_below_line=RoaConfig.reenter_below_line)
    return replace(config, roa=neutral, u_max=RobotConfig.u_max,
                   friction_compensation=FrictionCompensationConfig(), dither=BalanceDitherConfig(),
                   catch=CatchConfig(), selection=SelectionConfig(), observer=ObserverConfig()).fingerprint()


def cache_paths(config: RobotConfig) -> list[Path]:
    """Where the estimate may be cached: beside the config file, then the user cache directory."""
    paths = []
    if config.source:
        source = Path(config.source)
        paths.append(source.with_name(source.stem + ".roa.json"))
    cache_home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    paths.append(cache_home / "mcpilco_ros" / "roa" / f"{config.robot}-{_cache_key(config)}.json")
    return paths


def _read_cache(path: Path, key: str) -> RoaEstimate | None:
    """The cached estimate of ``key`` in ``path``; None (estimate afresh) when absent, of another configuration
    or damaged -- a cache file that is not a JSON object, or whose rho is not a positive finite number, must not
    become the supervisor's switching level (a NaN or negative rho would silently never hand over to the LQR)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("fingerprint") != key:
            return None
        estimate = RoaEstimate(**data["estimate"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    rho = estimate.rho
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not math.isfinite(rho) or rho <= 0.0:
        return None
    return estimate


def _holds_another(path: Path, key: str) -> bool:
    """Whether ``path`` holds the estimate of another configuration. Many configurations share one source file
    (a ROS node's robot parameters name ``config/<robot>.yaml``, whatever their values), so the file beside it
    keeps the estimate it has (usually the one shipped with that file) and the others go to the user cache, which
    is keyed by fingerprint: no configuration evicts another's estimate, and the package's files stay as shipped."""
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("fingerprint") not in (None, key)
    except (OSError, ValueError, AttributeError):
        return False


def _write_cache(paths: list[Path], key: str, estimate: RoaEstimate) -> Path | None:
    text = json.dumps({"fingerprint": key, "estimate": estimate.to_dict(),
                       "method": "closed-loop simulation, see mcpilco_core/control/roa.py"}, indent=2)
    for path in paths:
        if _holds_another(path, key):
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
            tmp.write_text(text + "\n", encoding="utf-8")
            tmp.replace(path)
            return path
        except OSError:
            continue
    return None


def region_of_attraction(config: RobotConfig, plant: DoublePendulum, design: LqrDesign,
                         use_cache: bool = True) -> RoaEstimate:
    """rho for this robot configuration: the configured value, a cached estimate, or a fresh one."""
    if config.roa.rho is not None:
        return RoaEstimate(rho=config.roa.rho, samples=0, failures=0, saturated=False)
    key = _cache_key(config)
    paths = cache_paths(config)
    if use_cache:
        for path in paths:
            cached = _read_cache(path, key)
            if cached is not None:
                return cached
    estimate = estimate_roa(plant, design, config.torque_limit, config.roa, config.control_period)
    if use_cache:
        _write_cache(paths, key, estimate)
    return estimate
