"""The swing-up policy: a sum of Gaussian basis functions squashed by tanh, and its files.

    u = u_M tanh( sum_i w_i / u_M exp(-|| (a_i - phi(x)) / l ||^2) ),   phi = (dq1, dq2, cos q1, cos q2, sin q1, sin q2)

Files: ``.npz`` archives with plain arrays and a JSON metadata string. They are read member by member with
bounded sizes (:data:`MAX_FILE_BYTES`, :data:`MAX_MEMBER_BYTES`): only the four members the format needs are
decompressed, each ``.npy`` header is checked against its member's size before any array is allocated, and no
pickle is ever read. RealAIGym's own ``.np`` MC-PILCO files are pickles written with ``dill``; they are read
through :class:`_ArraysOnlyUnpickler`, which rebuilds numeric numpy arrays (numpy's and dill's array
constructors, replaced by checked stand-ins) inside dicts and lists and admits nothing else callable.

Every failure while reading a policy, of whatever kind, is a :class:`PolicyError` whose message names the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import pickle
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .config import ACTUATED_JOINT

FORMAT = "mcpilco_policy"
FORMAT_VERSION = 1
FEATURE_ORDER = ("dq1", "dq2", "cos_q1", "cos_q2", "sin_q1", "sin_q2")
REALAIGYM_KEYS = ("log_lengthscales", "centers", "linear_weights")
NPZ_MEMBERS = ("centers", "log_lengthscales", "weights", "metadata")

MAX_FILE_BYTES = 64 * 2**20        # a policy file larger than this is refused before it is read
MAX_MEMBER_BYTES = 16 * 2**20      # declared (uncompressed) size bound of each array the format needs
MAX_ARRAY_ELEMENTS = 2**21         # elements of one array rebuilt from a RealAIGym pickle
MAX_BASIS = 20_000                 # basis functions: more cannot be evaluated at the control rate
STATE_BOX_SPEED = 100.0            # rad/s: the policy's output must be finite for every |dq| up to this
MAX_CONTROL_PERIOD = 1.0           # s: a policy period above this is not a control period
PERIOD_TOLERANCE = 1e-9            # s: a policy's period and the controller's must agree to this
REALAIGYM_PAIR_U_MAX = 6.0         # N m: RealAIGym's hardware stage ran the actuated element of a pair file
                                   # with u_max 6 (and 0.5 N m friction compensation on the passive joint)

logger = logging.getLogger(__name__)


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
    weights: (Nb,) w_i in N m; u_max: output bound (N m); control_period: s between two policy outputs.
    """

    centers: np.ndarray
    log_lengthscales: np.ndarray
    weights: np.ndarray
    u_max: float
    robot: str
    control_period: float = 0.02
    metadata: dict = field(default_factory=dict)
    source: str = field(default="", compare=False, repr=False)   # the file it was loaded from, for messages

    def __post_init__(self) -> None:
        self.centers = np.asarray(self.centers, dtype=np.float64)
        self.log_lengthscales = np.asarray(self.log_lengthscales, dtype=np.float64).reshape(-1)
        self.weights = np.asarray(self.weights, dtype=np.float64).reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            self._inv_lengthscales = np.exp(-self.log_lengthscales)
            self._scaled_centers = self.centers * self._inv_lengthscales

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Torque (N m) on the actuated joint for states (..., 4); shape (...)."""
        phi = features(np.asarray(x, dtype=np.float64)) * self._inv_lengthscales
        diff = phi[..., None, :] - self._scaled_centers
        activation = np.exp(-np.einsum("...ij,...ij->...i", diff, diff))
        return self.u_max * np.tanh(activation @ self.weights / self.u_max)

    def raw_sum(self, x: np.ndarray) -> np.ndarray:
        """sum_i w_i exp(-||(a_i - phi(x)) / l||^2) (N m) before the tanh bound, for states (..., 4)."""
        phi = features(np.asarray(x, dtype=np.float64)) * self._inv_lengthscales
        diff = phi[..., None, :] - self._scaled_centers
        return np.exp(-np.einsum("...ij,...ij->...i", diff, diff)) @ self.weights

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
                    torque_limit: float | None = None, policy_period: float | None = None) -> SumOfGaussiansPolicy:
    """Check shapes, finiteness, robot, bounds and period; raise PolicyError naming ``source``.

    ``policy_period`` (s) is the period the controller will run the policy at (``policy_period`` of the robot
    config): a policy written for another period is refused, it is not resampled. The output must be finite
    for every state with |dq| <= :data:`STATE_BOX_SPEED` (any angle): checked from the parameters (a bound that
    holds for the whole box) and on a fixed sample of states.
    """
    nb = policy.weights.shape[0]
    if policy.centers.ndim != 2 or policy.centers.shape != (nb, len(FEATURE_ORDER)):
        raise PolicyError(f"{source}: centers must have shape ({nb}, 6), got {policy.centers.shape}")
    if policy.log_lengthscales.shape != (len(FEATURE_ORDER),):
        raise PolicyError(f"{source}: log_lengthscales must have shape (6,), got {policy.log_lengthscales.shape}")
    if nb == 0:
        raise PolicyError(f"{source}: the policy has no basis functions")
    if nb > MAX_BASIS:
        raise PolicyError(f"{source}: {nb} basis functions, more than a controller evaluates in time ({MAX_BASIS})")
    for name in ("centers", "log_lengthscales", "weights"):
        if not np.all(np.isfinite(getattr(policy, name))):
            raise PolicyError(f"{source}: {name} contains NaN or infinite values")
    if not (isinstance(policy.u_max, (int, float)) and math.isfinite(policy.u_max) and policy.u_max > 0):
        raise PolicyError(f"{source}: u_max must be a positive number, got {policy.u_max}")
    if torque_limit is not None and policy.u_max > torque_limit + 1e-12:
        raise PolicyError(f"{source}: u_max {policy.u_max} N m exceeds the torque limit {torque_limit} N m")
    if policy.robot not in ACTUATED_JOINT:      # export reads a file without a robot to check it against
        raise PolicyError(f"{source}: unknown robot {policy.robot!r} (known: {sorted(ACTUATED_JOINT)})")
    if robot is not None and policy.robot != robot:
        raise PolicyError(f"{source}: policy was trained for the {policy.robot}, not the {robot}")
    period = policy.control_period
    if not (isinstance(period, (int, float)) and math.isfinite(period) and 0 < period <= MAX_CONTROL_PERIOD):
        raise PolicyError(f"{source}: control_period must be in (0, {MAX_CONTROL_PERIOD}] s, got {period}")
    if policy_period is not None:
        check_period(policy, policy_period, source)
    _check_finite_output(policy, source)
    return policy


def check_period(policy: SumOfGaussiansPolicy, policy_period: float, source: str | Path | None = None) -> None:
    """Refuse a policy written for another period than ``policy_period`` (s, the controller's): a policy is a
    closed loop at its own rate and is not resampled. ``source`` defaults to the file it was loaded from."""
    if abs(policy.control_period - policy_period) > PERIOD_TOLERANCE:
        source = source or policy.source or "<policy>"
        raise PolicyError(f"{source}: the policy runs every {policy.control_period} s but this controller every "
                          f"{policy_period} s (policy_period of the robot config); it is not resampled: set "
                          f"policy_period to {policy.control_period} or use a policy made for {policy_period} s")


def _check_finite_output(policy: SumOfGaussiansPolicy, source: str | Path) -> None:
    """Refuse parameters whose output can be NaN/inf for some state in the box (see :func:`validate_policy`).

    With finite scaled features (|phi_k| <= max(1, STATE_BOX_SPEED), times 1/l_k) and finite scaled centres, each
    squared distance is finite or +inf, so each activation is in [0, 1] and |raw sum| <= sum |w_i|: finite when
    that sum is. The sampled states check the formula itself.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        inv = np.exp(-policy.log_lengthscales)
        feature_bound = np.maximum(1.0, np.array([STATE_BOX_SPEED, STATE_BOX_SPEED, 1, 1, 1, 1])) * inv
        weight_sum = float(np.sum(np.abs(policy.weights)))
        problem = ""
        if not np.all(np.isfinite(feature_bound)):
            problem = (f"log_lengthscales {policy.log_lengthscales.min():.4g} too small: 1/l overflows for "
                       f"|dq| <= {STATE_BOX_SPEED:g} rad/s")
        elif not np.all(np.isfinite(policy.centers * inv)):
            problem = "centers / lengthscales overflow"
        elif not math.isfinite(weight_sum):
            problem = "the sum of |weights| overflows"
        else:
            rng = np.random.default_rng(0)
            q = rng.uniform(-math.pi, math.pi, (512, 2))
            dq = rng.uniform(-STATE_BOX_SPEED, STATE_BOX_SPEED, (512, 2))
            corners = np.array([[0, 0, s1, s2] for s1 in (-STATE_BOX_SPEED, 0, STATE_BOX_SPEED)
                                for s2 in (-STATE_BOX_SPEED, 0, STATE_BOX_SPEED)], dtype=float)
            states = np.concatenate([np.hstack([q, dq]), corners])
            out = np.concatenate([policy(chunk) for chunk in np.array_split(states, 32)])  # bounded memory
            if not np.all(np.isfinite(out)):
                problem = f"NaN/inf torque at state {states[~np.isfinite(out)][0].tolist()}"
    if problem:
        raise PolicyError(f"{source}: the policy's output is not finite over the states it will see "
                          f"(any angle, |dq| <= {STATE_BOX_SPEED:g} rad/s): {problem}")


# --------------------------------------------------------------------------------------------------
# Reading any policy file


def load_policy(path: str | Path, robot: str | None = None, torque_limit: float | None = None,
                policy_period: float | None = None) -> SumOfGaussiansPolicy:
    """Read and validate a policy file: our ``.npz`` format, or RealAIGym's ``.np`` pickle.

    RealAIGym files store neither the robot nor u_max nor a period: they are taken as ``robot`` (pendubot when
    None), 3 N m (6 N m for the actuated element of a two-element file) and ``policy_period`` (0.02 s when
    None). Any failure raises :class:`PolicyError` naming ``path``; see :func:`validate_policy` for the checks.
    """
    path = Path(path)
    try:
        return _load_policy(path, robot, torque_limit, policy_period)
    except PolicyError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a broken file provokes: report it, never crash a caller
        raise PolicyError(f"{path}: cannot read the policy: {type(exc).__name__}: {exc}") from exc


def _load_policy(path: Path, robot: str | None, torque_limit: float | None,
                 policy_period: float | None) -> SumOfGaussiansPolicy:
    if not path.is_file():
        raise PolicyError(f"{path}: no such policy file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise PolicyError(f"{path}: {size} bytes is larger than a policy file may be ({MAX_FILE_BYTES} bytes)")
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head.startswith(b"PK"):
        policy = _load_npz(path)
    elif head[:1] == b"\x80":
        policy = import_realaigym(path, robot or "pendubot",
                                  control_period=policy_period if policy_period is not None else 0.02)
    else:
        raise PolicyError(f"{path}: not a policy file (neither .npz nor a RealAIGym pickle)")
    policy.source = str(path)
    return validate_policy(policy, path, robot, torque_limit, policy_period)


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


def _load_npz(path: Path, max_member_bytes: int | None = None) -> SumOfGaussiansPolicy:
    """Read the four members the format needs (sizes bounded before decompressing) and the metadata."""
    bound = MAX_MEMBER_BYTES if max_member_bytes is None else max_member_bytes
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            members = {info.filename: info for info in archive.infolist()}
            missing = [name for name in NPZ_MEMBERS if name + ".npy" not in members]
            if missing:
                raise PolicyError(f"{path}: missing arrays {sorted(missing)}")
            for name in NPZ_MEMBERS:
                info = members[name + ".npy"]
                if info.file_size > bound:
                    raise PolicyError(f"{path}: array '{name}' declares {info.file_size} bytes, more than a policy "
                                      f"array may hold ({bound} bytes)")
                with archive.open(info) as member:
                    data = member.read(bound + 1)
                if len(data) > bound:
                    raise PolicyError(f"{path}: array '{name}' is larger than {bound} bytes")
                arrays[name] = _npy_from_bytes(data, f"{path}: array '{name}'")
    except PolicyError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise PolicyError(f"{path}: cannot read the policy archive: {exc}") from exc
    meta = _metadata(path, arrays["metadata"])
    for name in ("centers", "log_lengthscales", "weights"):
        if arrays[name].dtype.kind not in "biuf":
            raise PolicyError(f"{path}: array '{name}' must be numeric, got dtype {arrays[name].dtype}")
    for name in ("u_max", "control_period"):
        if isinstance(meta.get(name), (bool, str)):     # float() would take true as 1 N m and "3" as 3 N m
            raise PolicyError(f"{path}: metadata '{name}' must be a number, got {meta[name]!r}")
    try:
        u_max, period = float(meta["u_max"]), float(meta["control_period"])
        robot = meta["robot"]
    except KeyError as exc:
        raise PolicyError(f"{path}: metadata lacks the field {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{path}: metadata 'u_max' and 'control_period' must be numbers: {exc}") from exc
    if not isinstance(robot, str):
        raise PolicyError(f"{path}: metadata 'robot' must be a string, got {robot!r}")
    return SumOfGaussiansPolicy(centers=arrays["centers"], log_lengthscales=arrays["log_lengthscales"],
                                weights=arrays["weights"], u_max=u_max, robot=robot, control_period=period,
                                metadata=meta)


def _npy_from_bytes(data: bytes, what: str) -> np.ndarray:
    """An array from the bytes of a ``.npy`` member: the header's size must match the data (no allocation by
    a lying header), object dtypes are refused."""
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    else:
        raise PolicyError(f"{what}: unsupported .npy version {version}")
    if dtype.hasobject:
        raise PolicyError(f"{what}: object arrays are not allowed (dtype {dtype})")
    count = math.prod(shape)
    offset = stream.tell()
    if count * dtype.itemsize != len(data) - offset:
        raise PolicyError(f"{what}: header says {shape} {dtype} ({count * dtype.itemsize} bytes) but the member "
                          f"holds {len(data) - offset} bytes")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return array.reshape(shape, order="F" if fortran else "C").copy()


def _metadata(path: Path, array: np.ndarray) -> dict:
    """The JSON metadata dict, with its format fields checked."""
    if array.dtype.kind != "U" or array.shape != ():
        raise PolicyError(f"{path}: metadata must be a JSON string, got a {array.dtype} array of shape {array.shape}")
    try:
        meta = json.loads(str(array))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise PolicyError(f"{path}: metadata is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise PolicyError(f"{path}: metadata must be a JSON object, got {type(meta).__name__}")
    if meta.get("format") != FORMAT:
        raise PolicyError(f"{path}: not an {FORMAT} file")
    version = meta.get("format_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise PolicyError(f"{path}: metadata 'format_version' must be an integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise PolicyError(f"{path}: format version {version} is newer than this package reads ({FORMAT_VERSION}); "
                          f"update mcpilco_ros")
    order = meta.get("feature_order", list(FEATURE_ORDER))
    if not isinstance(order, list) or order != list(FEATURE_ORDER):
        raise PolicyError(f"{path}: metadata 'feature_order' must be {list(FEATURE_ORDER)}, got {order!r}")
    return meta


# --------------------------------------------------------------------------------------------------
# RealAIGym pickles (written with dill)

_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]     # numpy's ndarray reconstruction, found without import
_SCALAR = np.float64(0.0).__reduce__()[0]               # numpy's scalar constructor
NUMERIC_KINDS = "biuf"


def _numeric_dtype(dtype: Any, what: str) -> np.dtype:
    if not isinstance(dtype, np.dtype) or dtype.hasobject or dtype.kind not in NUMERIC_KINDS or dtype.names:
        raise pickle.UnpicklingError(f"{what}: only numeric arrays are allowed, got dtype {dtype!r}")
    return dtype


class _NdarrayName:
    """What the global ``numpy.ndarray`` unpickles to: a marker for ``_reconstruct``'s first argument, not
    callable (``numpy.ndarray(shape)`` through REDUCE or NEWOBJ would allocate any shape)."""


_NDARRAY = _NdarrayName()


class _StateCheckedArray(np.ndarray):
    """The arrays :func:`_safe_reconstruct` makes: their ``__setstate__`` (the BUILD opcode) checks the state
    first. Turned into plain ndarrays once the pickle is read."""

    def __setstate__(self, state: Any) -> None:
        _check_array_state(state)
        np.ndarray.__setstate__(self, state)


def _check_shape(shape: Any, what: str) -> tuple[int, ...]:
    if not (isinstance(shape, tuple) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                             for n in shape) and math.prod(shape) <= MAX_ARRAY_ELEMENTS):
        raise pickle.UnpicklingError(f"{what} with shape {shape!r} refused (at most {MAX_ARRAY_ELEMENTS} elements)")
    return shape


def _check_array_state(state: Any) -> None:
    """Numeric dtype, bounded shape, raw bytes of exactly the shape's size (no object lists)."""
    if not (isinstance(state, tuple) and len(state) == 5):
        raise pickle.UnpicklingError("unexpected array state refused")
    _, shape, dtype, _, data = state
    dtype = _numeric_dtype(dtype, "array")
    _check_shape(shape, "array state")
    if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
        raise pickle.UnpicklingError("array state whose data does not match its shape refused")


def _safe_reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    """numpy's ``_reconstruct`` for plain ndarrays only, with a bounded shape (it allocates the shape)."""
    if subtype is not _NDARRAY:
        raise pickle.UnpicklingError(f"array reconstruction of {subtype!r}: only numpy.ndarray is allowed")
    _check_shape(shape, "array reconstruction")
    if not isinstance(typecode, bytes) or len(typecode) > 8:
        raise pickle.UnpicklingError("array reconstruction with an unexpected type code refused")
    return _RECONSTRUCT(_StateCheckedArray, shape, typecode)


def _safe_dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    """``numpy.dtype`` for numeric type codes only (the pickled form: dtype('f8', False, True))."""
    if not (isinstance(spec, str) and len(spec) <= 4) or not isinstance(align, bool) or not isinstance(copy, bool):
        raise pickle.UnpicklingError(f"dtype {spec!r} refused")
    return _numeric_dtype(np.dtype(spec), "dtype")


def _safe_scalar(dtype: Any, data: Any = None) -> Any:
    """numpy's scalar constructor for numeric dtypes only."""
    _numeric_dtype(dtype, "scalar")
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise pickle.UnpicklingError("scalar with unexpected data refused")
    return _SCALAR(dtype, data)


def _safe_create_array(f: Any, args: Any, state: Any, npdict: Any = None) -> np.ndarray:
    """What ``dill._dill._create_array`` does for a plain ndarray: f(*args), then the state. Nothing else."""
    if f is not _safe_reconstruct or not isinstance(args, tuple) or len(args) != 3:
        raise pickle.UnpicklingError("dill array creation through anything but numpy's _reconstruct refused")
    if npdict:
        raise pickle.UnpicklingError("dill array with instance attributes refused")
    array = _safe_reconstruct(*args)
    array.__setstate__(state)
    return array


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild numeric numpy arrays and nothing else (a pickle can otherwise run any code).

    Every admitted global is replaced by a checked stand-in: numpy's ``_reconstruct`` (plain ndarray, bounded
    shape; the array's state is checked when it is set: numeric dtype, data bytes of exactly the shape's size),
    ``dtype`` (numeric type codes), ``scalar`` (numeric), ``ndarray`` (a marker, only valid as the argument
    of ``_reconstruct``) and dill's ``_create_array`` (its effect rebuilt here; dill is not imported).
    """

    _ALLOWED: dict[tuple[str, str], Any] = {
        ("numpy.core.multiarray", "_reconstruct"): _safe_reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _safe_reconstruct,
        ("numpy.core.multiarray", "scalar"): _safe_scalar,
        ("numpy._core.multiarray", "scalar"): _safe_scalar,
        ("numpy", "ndarray"): _NDARRAY,
        ("numpy", "dtype"): _safe_dtype,
        ("dill._dill", "_create_array"): _safe_create_array,
    }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused to load '{module}.{name}': only numpy arrays are allowed") from None


def _unpickle_arrays(path: Path) -> Any:
    """The pickle's content with every array a plain numeric ndarray (see :class:`_ArraysOnlyUnpickler`)."""
    with open(path, "rb") as handle:
        return _plain(_ArraysOnlyUnpickler(handle).load())


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {key: _plain(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(value) for value in obj]
    if isinstance(obj, np.ndarray):
        return np.array(obj.view(np.ndarray), copy=True)
    return obj


def _realaigym_arrays(data: Any, path: Path, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centers, log_lengthscales, linear_weights) of one RealAIGym policy dict, checked."""
    if not isinstance(data, dict) or not all(k in data for k in REALAIGYM_KEYS):
        raise PolicyError(f"{path}: {where} must be a dict with keys {list(REALAIGYM_KEYS)}")
    for key in REALAIGYM_KEYS:
        value = data[key]
        if not isinstance(value, np.ndarray) or value.dtype.kind not in NUMERIC_KINDS:
            raise PolicyError(f"{path}: {where}['{key}'] must be a numeric numpy array, got {type(value).__name__}")
    return data["centers"], data["log_lengthscales"], data["linear_weights"]


def import_realaigym(path: str | Path, robot: str, u_max: float | None = None,
                     control_period: float = 0.02) -> SumOfGaussiansPolicy:
    """Read a RealAIGym MC-PILCO ``.np`` file safely (a pickle written with dill; see the module docstring).

    - a dict (``log_lengthscales``, ``centers``, ``linear_weights``): one policy for the actuated joint, bound
      ``u_max`` (default 3 N m, as RealAIGym's simulation entries run them);
    - a list of two such dicts, one per joint (RealAIGym's hardware files: element j drives joint j, with
      u_max (6, 0.5) N m for the pendubot): the actuated joint's element is imported (``u_max`` default 6 N m)
      and the passive joint's output, a small friction-compensation torque, is dropped -- this package never
      torques the passive joint. A warning says so, and ``metadata['dropped']`` records it.

    The file stores no period: ``control_period`` (s) is what the caller runs it at (RealAIGym ran the two-element
    files at 33 Hz). Raises :class:`PolicyError` naming the file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PolicyError(f"{path}: {size} bytes is larger than a policy file may be ({MAX_FILE_BYTES} bytes)")
        data = _unpickle_arrays(path)
    except PolicyError:
        raise
    except pickle.UnpicklingError as exc:
        raise PolicyError(f"{path}: unsafe or invalid pickle: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - truncated or malformed pickles raise many kinds
        raise PolicyError(f"{path}: cannot read the RealAIGym policy: {type(exc).__name__}: {exc}") from exc
    metadata: dict[str, Any] = {"imported_from": str(path), "source_format": "realaigym"}
    if isinstance(data, dict):
        centers, log_lengthscales, weights = _realaigym_arrays(data, path, "the policy")
        bound = 3.0 if u_max is None else u_max
    elif isinstance(data, list) and len(data) == 2:
        from .config import JOINT_NAMES

        if robot not in ACTUATED_JOINT:
            raise PolicyError(f"{path}: unknown robot {robot!r} for a two-element (per-joint) policy file")
        act = ACTUATED_JOINT[robot]
        passive = 1 - act
        centers, log_lengthscales, weights = _realaigym_arrays(data[act], path, f"element {act}")
        _realaigym_arrays(data[passive], path, f"element {passive}")
        bound = REALAIGYM_PAIR_U_MAX if u_max is None else u_max
        dropped = (f"element {passive} of the file (the {JOINT_NAMES[passive]}'s friction-compensation policy, "
                   f"0.5 N m on RealAIGym's hardware) is dropped: the passive joint gets no torque here; "
                   f"element {act} ({JOINT_NAMES[act]}) is imported with u_max {bound} N m")
        metadata.update(dropped=dropped, realaigym_element=act)
        logger.warning("%s: two-element RealAIGym policy (one per joint): %s", path, dropped)
    else:
        raise PolicyError(f"{path}: expected a dict with keys {list(REALAIGYM_KEYS)} or a list of two such dicts "
                          f"(one per joint), got {type(data).__name__}"
                          + (f" of length {len(data)}" if isinstance(data, list) else ""))
    if centers.ndim != 2 or centers.size > MAX_ARRAY_ELEMENTS:
        raise PolicyError(f"{path}: centers must be a 2-d array, got shape {centers.shape}")
    return SumOfGaussiansPolicy(centers=centers, log_lengthscales=log_lengthscales, weights=weights, u_max=bound,
                                robot=robot, control_period=control_period, metadata=metadata)


# --------------------------------------------------------------------------------------------------
# The mirror image


# phi(-x) = MIRROR * phi(x): of the features only the cosines keep their sign
MIRROR = np.array([1.0 if name.startswith("cos_") else -1.0 for name in FEATURE_ORDER])


def mirrored(policy: SumOfGaussiansPolicy) -> SumOfGaussiansPolicy:
    """The policy's mirror image, pi'(x) = -pi(-x): the centres' dq and sin q coordinates and the weights negated.

    Why: the double pendulum is symmetric about the vertical (gravity, inertia and friction are; the torque limit
    is), so if x(t) is a motion under u(t), -x(t) is one under -u(t). pi' does from -x exactly what pi does from x: a
    different swing-up from the same state, learnt with no data of its own. The opt-in policy selection uses such
    policies as free candidates (config/acrobot_select.yaml). Metadata: ``mirrored_from``, the source's version."""
    return SumOfGaussiansPolicy(centers=policy.centers * MIRROR, log_lengthscales=policy.log_lengthscales.copy(),
                                weights=-policy.weights, u_max=policy.u_max, robot=policy.robot,
                                control_period=policy.control_period,
                                metadata={**policy.metadata, "mirrored_from": policy.version()})


# --------------------------------------------------------------------------------------------------
# Export for RealAIGym's runtime


def export_realaigym(policy: SumOfGaussiansPolicy, path: str | Path) -> Path:
    """Write the dict RealAIGym's MC-PILCO runtime loads with ``dill.load`` (u_max is not stored: it assumes 3 N m).

    The pickle is written opcode by opcode so that it names exactly the globals RealAIGym's own files name
    (``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype``): loadable with numpy 1.x and
    2.x, by ``pickle``/``dill`` and by :func:`import_realaigym`. Float64, little-endian, C order.
    """
    path = Path(path)
    data = {"log_lengthscales": policy.log_lengthscales, "centers": policy.centers,
            "linear_weights": policy.weights}
    out = bytearray(pickle.PROTO + b"\x03" + pickle.EMPTY_DICT + pickle.MARK)
    for key, array in data.items():
        out += _pickle_str(key) + _pickle_array(np.ascontiguousarray(array, dtype="<f8"))
    out += pickle.SETITEMS + pickle.STOP
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(bytes(out))
    tmp.replace(path)
    return path


def _pickle_str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw


def _pickle_global(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode("ascii")


def _pickle_int(value: int) -> bytes:
    return pickle.BININT + struct.pack("<i", value)


def _pickle_array(array: np.ndarray) -> bytes:
    """numpy's own reduction of a float64 array: _reconstruct(ndarray, (0,), b'b'), then BUILD with its state."""
    shape = pickle.MARK + b"".join(_pickle_int(n) for n in array.shape) + pickle.TUPLE
    dtype = (_pickle_global("numpy", "dtype") + _pickle_str("f8") + pickle.NEWFALSE + pickle.NEWTRUE
             + pickle.TUPLE3 + pickle.REDUCE
             + pickle.MARK + _pickle_int(3) + _pickle_str("<") + pickle.NONE * 3 + _pickle_int(-1) * 2
             + _pickle_int(0) + pickle.TUPLE + pickle.BUILD)
    data = array.tobytes()
    return (_pickle_global("numpy.core.multiarray", "_reconstruct")
            + _pickle_global("numpy", "ndarray") + _pickle_int(0) + pickle.TUPLE1
            + pickle.SHORT_BINBYTES + b"\x01b" + pickle.TUPLE3 + pickle.REDUCE
            + pickle.MARK + _pickle_int(1) + shape + dtype + pickle.NEWFALSE
            + pickle.BINBYTES + struct.pack("<I", len(data)) + data + pickle.TUPLE + pickle.BUILD)

