"""The swing-up policy: a sum of Gaussian basis functions squashed by tanh, and its files.

    u = u_M tanh( sum_i w_i / u_M exp(-|| (a_i - phi(x)) / l ||^2) ),   phi = (dq1, dq2, cos q1, cos q2, sin q1, sin q2)

Files: ``.npz`` archives with plain arrays and a JSON metadata string, written and read with
``allow_pickle=False`` (no code runs on load). RealAIGym's own ``.np`` MC-PILCO files are pickled dicts;
they are read through :class:`_ArraysOnlyUnpickler`, which admits numpy arrays inside dicts and nothing else.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "mcpilco_policy"
FORMAT_VERSION = 1
FEATURE_ORDER = ("dq1", "dq2", "cos_q1", "cos_q2", "sin_q1", "sin_q2")
REALAIGYM_KEYS = ("log_lengthscales", "centers", "linear_weights")


class PolicyError(ValueError):
    """A policy file or policy object is invalid; the message names the file and the reason."""


def features(x: np.ndarray) -> np.ndarray:
    """phi(x) = (dq1, dq2, cos q1, cos q2, sin q1, sin q2) for states (..., 4)."""
    q, dq = x[..., :2], x[..., 2:]
    return np.concatenate([dq, np.cos(q), np.sin(q)], axis=-1)


@dataclass
class SumOfGaussiansPolicy:
    """Numpy evaluation of the MC-PILCO policy (the runtime side; the learner has a torch twin).

    centers: (Nb, 6) basis centres a_i in feature space; log_lengthscales: (6,) log of l;
    weights: (Nb,) w_i in N m; u_max: output bound (N m).
    """

    centers: np.ndarray
    log_lengthscales: np.ndarray
    weights: np.ndarray
    u_max: float
    robot: str
    control_period: float = 0.02
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.centers = np.asarray(self.centers, dtype=np.float64)
        self.log_lengthscales = np.asarray(self.log_lengthscales, dtype=np.float64).reshape(-1)
        self.weights = np.asarray(self.weights, dtype=np.float64).reshape(-1)
        self._inv_lengthscales = np.exp(-self.log_lengthscales)
        self._scaled_centers = self.centers * self._inv_lengthscales

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Torque (N m) on the actuated joint for states (..., 4); shape (...)."""
        phi = features(np.asarray(x, dtype=np.float64)) * self._inv_lengthscales
        diff = phi[..., None, :] - self._scaled_centers
        activation = np.exp(-np.einsum("...ij,...ij->...i", diff, diff))
        return self.u_max * np.tanh(activation @ self.weights / self.u_max)

    @property
    def num_basis(self) -> int:
        return int(self.weights.shape[0])

    def version(self) -> str:
        """Content hash (12 hex digits): identifies exactly which parameters are running."""
        digest = hashlib.sha256()
        for array in (self.centers, self.log_lengthscales, self.weights):
            digest.update(np.ascontiguousarray(array).tobytes())
        digest.update(repr((self.u_max, self.robot, self.control_period)).encode())
        return digest.hexdigest()[:12]


# --------------------------------------------------------------------------------------------------
# Validation


def validate_policy(policy: SumOfGaussiansPolicy, source: str | Path = "<policy>", robot: str | None = None,
                    torque_limit: float | None = None) -> SumOfGaussiansPolicy:
    """Check shapes, finiteness, robot and bounds; raise PolicyError naming ``source``."""
    nb = policy.weights.shape[0]
    if policy.centers.ndim != 2 or policy.centers.shape != (nb, len(FEATURE_ORDER)):
        raise PolicyError(f"{source}: centers must have shape ({nb}, 6), got {policy.centers.shape}")
    if policy.log_lengthscales.shape != (len(FEATURE_ORDER),):
        raise PolicyError(f"{source}: log_lengthscales must have shape (6,), got {policy.log_lengthscales.shape}")
    if nb == 0:
        raise PolicyError(f"{source}: the policy has no basis functions")
    for name in ("centers", "log_lengthscales", "weights"):
        if not np.all(np.isfinite(getattr(policy, name))):
            raise PolicyError(f"{source}: {name} contains NaN or infinite values")
    if not (math.isfinite(policy.u_max) and policy.u_max > 0):
        raise PolicyError(f"{source}: u_max must be a positive number, got {policy.u_max}")
    if torque_limit is not None and policy.u_max > torque_limit + 1e-12:
        raise PolicyError(f"{source}: u_max {policy.u_max} N m exceeds the torque limit {torque_limit} N m")
    if robot is not None and policy.robot != robot:
        raise PolicyError(f"{source}: policy was trained for the {policy.robot}, not the {robot}")
    if not (math.isfinite(policy.control_period) and policy.control_period > 0):
        raise PolicyError(f"{source}: control_period must be positive, got {policy.control_period}")
    return policy


# --------------------------------------------------------------------------------------------------
# Own format (.npz, no pickle)


def save_policy(policy: SumOfGaussiansPolicy, path: str | Path, **metadata: Any) -> Path:
    """Write ``policy`` to ``path`` (.npz). Extra keyword metadata (run id, config hash...) is stored too."""
    path = Path(path)
    meta = {**policy.metadata, **metadata, "format": FORMAT, "format_version": FORMAT_VERSION,
            "kind": "sum_of_gaussians", "robot": policy.robot, "u_max": policy.u_max,
            "control_period": policy.control_period, "feature_order": list(FEATURE_ORDER)}
    buffer = io.BytesIO()
    np.savez(buffer, centers=policy.centers, log_lengthscales=policy.log_lengthscales,
             weights=policy.weights, metadata=np.array(json.dumps(meta, sort_keys=True)))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(path)  # atomic: a reader never sees a half-written policy
    return path


def load_policy(path: str | Path, robot: str | None = None,
                torque_limit: float | None = None) -> SumOfGaussiansPolicy:
    """Read and validate a policy file: our ``.npz`` format, or RealAIGym's pickled ``.np`` dict.

    RealAIGym files do not store the robot or u_max: they are taken as ``robot`` and 3 N m.
    """
    path = Path(path)
    if not path.is_file():
        raise PolicyError(f"{path}: no such policy file")
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(b"PK"):
        policy = _load_npz(path)
    elif head[:1] == b"\x80":
        policy = import_realaigym(path, robot or "pendubot")
    else:
        raise PolicyError(f"{path}: not a policy file (neither .npz nor a RealAIGym pickle)")
    return validate_policy(policy, path, robot, torque_limit)


def _load_npz(path: Path) -> SumOfGaussiansPolicy:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as exc:  # zipfile/format errors of every kind: report, don't crash
        raise PolicyError(f"{path}: cannot read the policy archive: {exc}") from exc
    missing = {"centers", "log_lengthscales", "weights", "metadata"} - set(arrays)
    if missing:
        raise PolicyError(f"{path}: missing arrays {sorted(missing)}")
    try:
        meta = json.loads(str(arrays["metadata"]))
    except json.JSONDecodeError as exc:
        raise PolicyError(f"{path}: metadata is not valid JSON: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise PolicyError(f"{path}: not an {FORMAT} file")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise PolicyError(f"{path}: format version {meta.get('format_version')} is newer than this "
                          f"package reads ({FORMAT_VERSION}); update mcpilco_ros")
    if list(meta.get("feature_order", FEATURE_ORDER)) != list(FEATURE_ORDER):
        raise PolicyError(f"{path}: unexpected feature order {meta.get('feature_order')}")
    try:
        return SumOfGaussiansPolicy(centers=arrays["centers"], log_lengthscales=arrays["log_lengthscales"],
                                    weights=arrays["weights"], u_max=float(meta["u_max"]),
                                    robot=str(meta["robot"]), control_period=float(meta["control_period"]),
                                    metadata=meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyError(f"{path}: incomplete metadata: {exc}") from exc


# --------------------------------------------------------------------------------------------------
# RealAIGym pickled dicts


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild numpy arrays and nothing else (a pickle can otherwise run any code)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to load '{module}.{name}': only numpy arrays are allowed")


def import_realaigym(path: str | Path, robot: str, u_max: float = 3.0,
                     control_period: float = 0.02) -> SumOfGaussiansPolicy:
    """Read RealAIGym's MC-PILCO ``.np`` (pickled dict of arrays) safely."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            data = _ArraysOnlyUnpickler(handle).load()
    except pickle.UnpicklingError as exc:
        raise PolicyError(f"{path}: unsafe or invalid pickle: {exc}") from exc
    except Exception as exc:
        raise PolicyError(f"{path}: cannot read the RealAIGym policy: {exc}") from exc
    if not isinstance(data, dict) or not all(k in data for k in REALAIGYM_KEYS):
        raise PolicyError(f"{path}: expected a dict with keys {list(REALAIGYM_KEYS)}")
    if not all(isinstance(data[k], np.ndarray) for k in REALAIGYM_KEYS):
        raise PolicyError(f"{path}: the values of {list(REALAIGYM_KEYS)} must be numpy arrays")
    return SumOfGaussiansPolicy(centers=data["centers"], log_lengthscales=data["log_lengthscales"],
                                weights=data["linear_weights"], u_max=u_max, robot=robot,
                                control_period=control_period, metadata={"imported_from": str(path)})


def export_realaigym(policy: SumOfGaussiansPolicy, path: str | Path) -> Path:
    """Write the dict RealAIGym's MC-PILCO runtime loads (u_max is not stored there: it assumes 3 N m)."""
    path = Path(path)
    data = {"log_lengthscales": policy.log_lengthscales.copy(), "centers": policy.centers.copy(),
            "linear_weights": policy.weights.copy()}
    with open(path, "wb") as handle:
        pickle.dump(data, handle, protocol=4)
    return path
