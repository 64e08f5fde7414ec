"""Reading trials back: bags -> arrays -> transitions at the policy period (states interpolated at the grid,
torque = time-average of the applied torque over each interval). Unreadable or mismatched bags become
:class:`BagProblem` entries (file + reason) and never stop the others."""

from __future__ import annotations

import bisect
import logging
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..config import JOINT_NAMES, RobotConfig
from ..simulation import RESET_FRAME
from .bags import (
    COMMAND_TOPIC,
    CRASHED_SUFFIX,
    CUSTOM_PREFIX,
    JOINT_STATE_TYPE,
    PARTIAL_SUFFIX,
    SESSION_FILE,
    STATE_TOPIC,
    UNKNOWN_MODE,
    TrialError,
    typestore,
)
from .session_directory import SessionDirectory
from .state_rate import StateRecording, marked_runs, recording_from_bag, window_span
from .transitions import TransitionData

LOG = logging.getLogger("mcpilco.recording")


@dataclass
class BagProblem:
    """A bag (or session) that was skipped, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class RawTrial:
    """A bag's streams as arrays (header-stamp times in ns, SI units), in the order the bag received them, as
    recorded: nothing is dropped or sorted here (:func:`resample` checks the samples).

    state_t (n,), q (n, 2) rad, dq (n, 2) rad/s, effort (n, 2) or (0, 2) N m (applied over the step ending at
    the stamp; (0, 2) when most states carried no effort; NaN rows for the few that did not, marked in
    ``effort_missing`` (n,) and dropped by :func:`resample` with a note); command_t (m,), command_u (m, 2) N m,
    command_mode (m,) supervisor mode names; state_reset (n,) or (0,): the state's ``header.frame_id`` is ``"reset"``
    (``mcpilco_core.simulation.RESET_FRAME``: measured inside a reset or disturbance window, the passive joint
    torqued by the window's PID just before or after it).
    """

    path: str
    state_t: np.ndarray
    q: np.ndarray
    dq: np.ndarray
    effort: np.ndarray
    command_t: np.ndarray
    command_u: np.ndarray
    command_mode: list[str]
    custom: dict[str, str] = field(default_factory=dict)
    state_reset: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    effort_missing: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))


@dataclass
class TrialData:
    """One trial at the policy period, as the learner uses it.

    t (N+1,) s since the first state; x (N+1, 4) states (q1, q2 rad, dq1, dq2 rad/s) at those times;
    u (N, 2) torque (N m) actually applied, averaged over [t_k, t_k+1); mode (N,) supervisor mode acting at t_k
    ("reset" inside a reset/disturbance window); valid (N,) transitions usable for the model (no gap in the state
    stream, no torque on the passive joint, no reset/disturbance window).
    """

    robot: str
    period: float
    t: np.ndarray
    x: np.ndarray
    u: np.ndarray
    mode: np.ndarray
    valid: np.ndarray
    source: str
    policy_version: str = ""
    torque_source: str = STATE_TOPIC
    notes: list[str] = field(default_factory=list)
    states: StateRecording | None = None      # the trial at the state rate (None: the states carry no effort)

    def __len__(self) -> int:
        return int(self.u.shape[0])

    def transitions(self, actuated_joint: int):
        """The valid transitions as the learner's TransitionData (x, actuated torque, next x, and the torque of the
        period before, which also acts on a robot whose sensors lag; 0 before the trial's first period)."""
        u = self.u[:, actuated_joint]
        return TransitionData(self.x[:-1], u, self.x[1:], np.concatenate([[0.0], u[:-1]])).subset(self.valid)

    def handed_over_states(self) -> np.ndarray:
        """(M, 4) the states at the end of each reset / disturbance window of the trial: what the window handed
        over to the controller (the particles' post-disturbance pool learns from them)."""
        reset = np.asarray(self.mode) == "reset"
        ends = np.flatnonzero(reset[:-1] & ~reset[1:]) + 1 if reset.size else np.zeros(0, dtype=int)
        return self.x[ends].copy()


def read_bag(path: str | Path) -> RawTrial:
    """Read the joint_states / joint_commands streams of one bag; raises TrialError naming the file."""
    from rosbags.rosbag2 import Reader

    path = Path(path)
    if not (path / "metadata.yaml").is_file():
        hint = " (a partial bag: run recovery)" if path.name.endswith(PARTIAL_SUFFIX) else ""
        raise TrialError(f"{path}: not a complete rosbag2 bag (no metadata.yaml){hint}")
    try:
        with Reader(path) as reader:
            topics = {c.topic: c for c in reader.connections}
            missing = [t for t in (STATE_TOPIC, COMMAND_TOPIC) if t not in topics]
            if missing:
                raise TrialError(f"{path}: missing topic(s) {missing} (has {sorted(topics)})")
            for topic in (STATE_TOPIC, COMMAND_TOPIC):
                if topics[topic].msgtype != JOINT_STATE_TYPE:
                    raise TrialError(f"{path}: topic {topic} has type {topics[topic].msgtype}, "
                                     f"expected {JOINT_STATE_TYPE}")
            custom = _custom_data(path)
            raw = _decode(path, reader, [topics[STATE_TOPIC], topics[COMMAND_TOPIC]])
    except TrialError:
        raise
    except Exception as exc:  # rosbags raises several types for corrupt storage: report them all the same way
        raise TrialError(f"{path}: unreadable bag: {type(exc).__name__}: {exc}") from exc
    raw.custom = custom
    return raw


def _custom_data(path: Path) -> dict[str, str]:
    meta = yaml.safe_load((path / "metadata.yaml").read_text(encoding="utf-8")) or {}
    data = (meta.get("rosbag2_bagfile_information") or {}).get("custom_data") or {}
    return {k[len(CUSTOM_PREFIX):]: str(v) for k, v in data.items() if str(k).startswith(CUSTOM_PREFIX)}


@dataclass
class _JointState:
    """The fields of a sensor_msgs/JointState the reader needs (stamp in ns)."""

    stamp: int
    frame_id: str
    name: list[str]
    position: tuple[float, ...]
    velocity: tuple[float, ...]
    effort: tuple[float, ...]


def parse_joint_state(data: bytes | memoryview) -> _JointState:
    """Decode a little-endian CDR sensor_msgs/JointState (about 5x faster than a generic deserializer, which
    matters for 500 Hz streams); other encodings go through rosbags' deserializer."""
    buf = bytes(data)
    if buf[:2] != b"\x00\x01":
        return _generic_joint_state(buf)
    sec, nanosec, length = struct.unpack_from("<iII", buf, 4)
    pos = 16
    frame_id = buf[pos:pos + length - 1].decode()
    pos += length
    pos += -(pos - 4) % 4
    (count,) = struct.unpack_from("<I", buf, pos)
    pos += 4
    names = []
    for _ in range(count):
        pos += -(pos - 4) % 4
        (length,) = struct.unpack_from("<I", buf, pos)
        names.append(buf[pos + 4:pos + 3 + length].decode())
        pos += 4 + length
    arrays = []
    for _ in range(3):
        pos += -(pos - 4) % 4
        (count,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if count:
            pos += -(pos - 4) % 8
        arrays.append(struct.unpack_from(f"<{count}d", buf, pos))
        pos += 8 * count
    return _JointState(sec * 1_000_000_000 + nanosec, frame_id, names, *arrays)


def _generic_joint_state(buf: bytes) -> _JointState:
    msg = typestore(9).deserialize_cdr(buf, JOINT_STATE_TYPE)
    stamp = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
    return _JointState(stamp, msg.header.frame_id, list(msg.name), tuple(msg.position), tuple(msg.velocity),
                       tuple(msg.effort))


def _decode(path: Path, reader, connections) -> RawTrial:
    states: list[tuple] = []
    commands: list[tuple] = []
    problems = 0
    for connection, _, data in reader.messages(connections=connections):
        try:
            msg = parse_joint_state(data)
        except Exception:  # noqa: BLE001 -- a malformed CDR message (struct, unicode, index errors): skip it
            problems += 1
            continue
        order = _joint_order(msg.name)
        if order is None:
            problems += 1
            continue
        if connection.topic == STATE_TOPIC:
            row = _state_row(msg, order)
            if row is None:
                problems += 1
                continue
            states.append((msg.stamp, *row))
        elif len(msg.effort) == 2:
            commands.append((msg.stamp, float(msg.effort[order[0]]), float(msg.effort[order[1]]), msg.frame_id))
        else:                          # a command without its two torques
            problems += 1
    if problems:
        LOG.warning("%s: %d malformed message(s) or with other joint names or lengths ignored", path, problems)
    return _raw_from_rows(str(path), states, commands)


def _joint_order(names: Sequence[str]) -> tuple[int, int] | None:
    names = list(names)
    if len(names) != 2 or set(names) != set(JOINT_NAMES):
        return None
    return names.index(JOINT_NAMES[0]), names.index(JOINT_NAMES[1])


def _state_row(msg: _JointState, order: tuple[int, int]) -> tuple | None:
    i, j = order
    if len(msg.position) != 2 or len(msg.velocity) != 2 or len(msg.effort) not in (0, 2):
        return None
    has_effort = len(msg.effort) == 2
    effort = (float(msg.effort[i]), float(msg.effort[j])) if has_effort else (math.nan, math.nan)
    return (float(msg.position[i]), float(msg.position[j]), float(msg.velocity[i]), float(msg.velocity[j]),
            *effort, float(has_effort), float(msg.frame_id == RESET_FRAME))


def _raw_from_rows(path: str, states: list[tuple], commands: list[tuple]) -> RawTrial:
    s = np.array([r[1:] for r in states], dtype=np.float64).reshape(-1, 8)
    t_ns = np.array([r[0] for r in states], dtype=np.int64)
    has_effort = s[:, 6] > 0.0
    # the applied torque comes from the states when most carry it (the few that do not are dropped later, with a
    # note); one state without it must not switch a whole trial to the commanded torque
    mostly = bool(len(s)) and 2 * int(has_effort.sum()) >= len(s)
    effort = s[:, 4:6] if mostly else np.zeros((0, 2))
    missing = ~has_effort if mostly and not has_effort.all() else np.zeros(0, bool)
    c_ns = np.array([r[0] for r in commands], dtype=np.int64)
    cu = np.array([(r[1], r[2]) for r in commands], dtype=np.float64).reshape(-1, 2)
    modes = [r[3] or UNKNOWN_MODE for r in commands]
    return RawTrial(path, t_ns, s[:, 0:2], s[:, 2:4], effort, c_ns, cu, modes, state_reset=s[:, 7] > 0.0,
                    effort_missing=missing)


# --------------------------------------------------------------------------------------------------
# Resampling to the policy period


@dataclass(frozen=True)
class ResampleSettings:
    """max_gap: s, a hole in the state stream longer than this invalidates the intervals it touches;
    passive_tolerance: N m, more applied torque than this on the passive joint invalidates an interval (e.g. the
    simulated robot's disturbance PID); min_states: bags with fewer usable states are refused;
    max_position (rad), max_velocity (rad/s), max_effort (N m): a state beyond these (or not finite) is dropped;
    max_duration: s, a trial longer than this (after dropping bad stamps) is refused, which bounds the grid."""

    max_gap: float = 0.01
    passive_tolerance: float = 0.1
    min_states: int = 10
    max_position: float = 1e3
    max_velocity: float = 1e3
    max_effort: float = 1e3
    max_duration: float = 3600.0


@dataclass
class _CleanStates:
    """The usable states in stamp order; ``hole`` (n-1,) marks consecutive kept states with a dropped state
    between them (the intervals they span are not used for the model); ``notes`` says what was dropped."""

    t_ns: np.ndarray
    q: np.ndarray
    dq: np.ndarray
    effort: np.ndarray
    hole: np.ndarray
    notes: list[str]
    dropped: int
    reset: np.ndarray        # (n,) the state was measured inside a reset/disturbance window


def _increasing_subsequence(values: np.ndarray) -> np.ndarray:
    """Indices of a longest strictly increasing subsequence of ``values`` (O(n log n), the earliest on ties):
    the states whose stamps agree with the order they arrived in."""
    if len(values) < 2 or bool((np.diff(values) > 0).all()):
        return np.arange(len(values))            # the usual case: already in order
    tails: list[int] = []            # tails[k]: index ending the best increasing run of length k + 1
    tail_values: list[int] = []
    parent = [-1] * len(values)
    for i, v in enumerate(values.tolist()):
        k = bisect.bisect_left(tail_values, v)
        if k > 0:
            parent[i] = tails[k - 1]
        if k == len(tails):
            tails.append(i)
            tail_values.append(v)
        else:
            tails[k] = i
            tail_values[k] = v
    out = []
    i = tails[-1] if tails else -1
    while i >= 0:
        out.append(i)
        i = parent[i]
    return np.asarray(out[::-1], dtype=np.int64)


def _clean_states(raw: RawTrial, settings: ResampleSettings) -> _CleanStates:
    """Drop states with non-finite or absurd values, stamps out of arrival order, and stamps far outside the
    span the others cover (a state stamped 0, or years off); say how many of each."""
    n = len(raw.state_t)
    values = np.column_stack([raw.q, raw.dq]) if n else np.zeros((0, 4))
    bad = ~np.isfinite(values).all(axis=1)
    with np.errstate(invalid="ignore"):
        bad |= (np.abs(raw.q) > settings.max_position).any(axis=1)
        bad |= (np.abs(raw.dq) > settings.max_velocity).any(axis=1)
        if len(raw.effort):
            bad |= ~np.isfinite(raw.effort).all(axis=1) | (np.abs(raw.effort) > settings.max_effort).any(axis=1)
    # a repeat (the same stamp and values as the sample before it: a lockstep driver republishing its state while
    # it waits for the first command) is no fault: merged silently, and no hole in the data
    repeat = np.zeros(n, bool)
    if n > 1:
        repeat[1:] = (raw.state_t[1:] == raw.state_t[:-1]) & (values[1:] == values[:-1]).all(axis=1)
    repeat &= ~bad
    position = np.cumsum(~repeat)      # index of each sample once repeats are merged
    candidates = np.flatnonzero(~bad & ~repeat)
    keep = candidates[_increasing_subsequence(raw.state_t[candidates])] if len(candidates) else candidates
    if len(keep) > 2:
        # the span the states cover: stamps more than the trial's own length (+ 1 s) away from the median are off
        stamps = raw.state_t[keep]
        step = float(np.median(np.diff(stamps)))
        reach = 2.0 * len(keep) * step + 1e9
        keep = keep[np.abs((stamps - np.median(stamps)).astype(np.float64)) <= reach]
    missing = raw.effort_missing if len(raw.effort_missing) == n else np.zeros(n, bool)
    missing_dropped = int((bad & missing).sum())
    values_dropped = int(bad.sum()) - missing_dropped
    stamps_dropped = n - values_dropped - missing_dropped - int(repeat.sum()) - len(keep)
    notes = []
    if missing_dropped:
        notes.append(f"dropped {missing_dropped} joint_states sample(s) without effort (the others carry the "
                     "applied torque)")
    if values_dropped:
        notes.append(f"dropped {values_dropped} joint_states sample(s) with non-finite or absurd values "
                     f"(|q| > {settings.max_position:g} rad, |dq| > {settings.max_velocity:g} rad/s or "
                     f"|effort| > {settings.max_effort:g} N m)")
    if stamps_dropped:
        notes.append(f"dropped {stamps_dropped} joint_states sample(s) stamped out of order or far outside the "
                     "trial's time span")
    hole = np.diff(position[keep]) > 1 if len(keep) else np.zeros(0, bool)
    effort = raw.effort[keep] if len(raw.effort) else raw.effort
    reset = np.zeros(len(keep), bool)
    if len(raw.state_reset) == n and n:
        # a merged repeat is marked when any copy is (a lockstep driver may arm a window between two copies)
        marked = np.zeros(int(position[-1]) + 1, bool)
        np.logical_or.at(marked, position, raw.state_reset)
        reset = marked[position[keep]]
    return _CleanStates(raw.state_t[keep], raw.q[keep], raw.dq[keep], effort, hole, notes,
                        n - int(repeat.sum()) - len(keep), reset)


def _clean_commands(raw: RawTrial) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """Commands with finite torques, in stamp order (the stamp only picks the newest command at a time)."""
    finite = np.isfinite(raw.command_u).all(axis=1) if len(raw.command_u) else np.zeros(0, bool)
    idx = np.flatnonzero(finite)
    idx = idx[np.argsort(raw.command_t[idx], kind="stable")]
    notes = []
    if len(finite) - len(idx):
        notes.append(f"dropped {len(finite) - len(idx)} joint_commands message(s) with non-finite torques")
    return raw.command_t[idx], raw.command_u[idx], [raw.command_mode[k] for k in idx], notes


def resample(raw: RawTrial, config: RobotConfig, settings: ResampleSettings = ResampleSettings()) -> TrialData:
    """The trial at the policy period: states interpolated at the grid, applied torque averaged per interval.

    Bad states are dropped first (non-finite or absurd values, stamps out of order or far outside the trial:
    counted in the trial's ``notes``); the intervals around a dropped state are not used for the model, nor
    those of a reset/disturbance window (mode "reset"; see :func:`_outside_windows`). A trial
    with too few usable states, or longer than ``settings.max_duration``, raises TrialError with the reason.
    """
    clean = _clean_states(raw, settings)
    if len(clean.t_ns) < settings.min_states:
        dropped = f" ({clean.dropped} dropped: {'; '.join(clean.notes)})" if clean.dropped else ""
        raise TrialError(f"{raw.path}: only {len(clean.t_ns)} usable joint_states message(s){dropped}")
    command_t, command_u, command_mode, command_notes = _clean_commands(raw)
    raw = RawTrial(raw.path, clean.t_ns, clean.q, clean.dq, clean.effort, command_t, command_u, command_mode,
                   raw.custom, clean.reset)
    t = (raw.state_t - raw.state_t[0]) * 1e-9
    period = float(config.policy_period)
    if t[-1] > settings.max_duration:
        raise TrialError(f"{raw.path}: its usable states span {t[-1]:.0f} s, longer than max_duration "
                         f"{settings.max_duration:g} s")
    n = int(math.floor(t[-1] / period + 1e-9))
    if n < 1:
        raise TrialError(f"{raw.path}: shorter than one policy period ({t[-1]:.4f} s < {period} s)")
    grid = np.arange(n + 1) * period
    x = np.column_stack([np.interp(grid, t, col) for col in (*raw.q.T, *raw.dq.T)])
    # a state stamped on a grid point to the nanosecond is that point's state, not a float-rounded interpolation
    grid_ns = raw.state_t[0] + np.round(grid * 1e9).astype(np.int64)
    at = np.minimum(np.searchsorted(raw.state_t, grid_ns), len(raw.state_t) - 1)
    on_grid = raw.state_t[at] == grid_ns
    x[on_grid] = np.column_stack([raw.q, raw.dq])[at[on_grid]]
    u, source, torque_valid = _interval_torque(raw, t, grid, config)
    valid = _gap_free(t, grid, settings.max_gap, clean.hole) & torque_valid
    valid &= np.abs(u[:, config.passive_joint]) <= passive_tolerance(config, settings)
    mode = _interval_modes(raw, grid)
    outside = _outside_windows(t, grid, clean.reset)
    valid &= outside
    mode = np.where(outside, mode, "reset")
    notes = clean.notes + command_notes
    for note in notes:
        LOG.warning("%s: %s", raw.path, note)
    if not outside.all():          # what a disturbance trial is for: said, not warned
        notes.append(f"{int((~outside).sum())} interval(s) of {period * 1e3:g} ms in reset/disturbance windows "
                     f"(joint_states frame_id '{RESET_FRAME}') not used for the model")
        LOG.info("%s: %s", raw.path, notes[-1])
    states = recording_from_bag(raw.state_t, raw.q, raw.dq, raw.effort, raw.command_t, raw.command_u, clean.reset)
    return TrialData(robot=config.robot, period=period, t=grid, x=x, u=u, mode=mode, valid=valid, source=raw.path,
                     policy_version=raw.custom.get("policy_version", ""), torque_source=source, notes=notes,
                     states=states)


def _interval_torque(raw: RawTrial, t: np.ndarray, grid: np.ndarray,
                     config: RobotConfig) -> tuple[np.ndarray, str, np.ndarray]:
    """Mean applied torque over each grid interval, from the driver's effort (exact integral of the
    piecewise-constant torque), or -- when the states carry no effort -- from the commands clipped to the limits."""
    if len(raw.effort):
        # effort[j] acted over (t[j-1], t[j]]: its integral is piecewise linear in time, exact at any grid point
        cum = np.vstack([np.zeros(2), np.cumsum(raw.effort[1:] * np.diff(t)[:, None], axis=0)])
        at = np.column_stack([np.interp(grid, t, cum[:, j]) for j in range(2)])
        return np.diff(at, axis=0) / np.diff(grid)[:, None], STATE_TOPIC, np.ones(len(grid) - 1, bool)
    limits = np.asarray(config.torque_limits)
    n = len(grid) - 1
    if len(raw.command_t) == 0:
        return np.zeros((n, 2)), "none", np.zeros(n, bool)
    ct = (raw.command_t - raw.state_t[0]) * 1e-9
    cu = np.clip(raw.command_u, -limits, limits)
    idx = np.searchsorted(ct, grid[:-1], side="right") - 1
    u = np.where(idx[:, None] >= 0, cu[np.maximum(idx, 0)], 0.0)
    return u, COMMAND_TOPIC, idx >= 0


def _gap_free(t: np.ndarray, grid: np.ndarray, max_gap: float, hole: np.ndarray | None = None) -> np.ndarray:
    """True for intervals [grid_k, grid_k+1] that no state-stream gap longer than ``max_gap`` s overlaps, nor
    any gap ``hole`` marks (a dropped state: ``hole[j]`` for the gap between states j and j + 1)."""
    gaps = np.diff(t) > max_gap
    if hole is not None:
        gaps |= hole
    gaps = np.flatnonzero(gaps)
    valid = np.ones(len(grid) - 1, bool)
    for g in gaps:
        first = max(int(np.searchsorted(grid, t[g], side="right")) - 1, 0)
        last = int(np.searchsorted(grid, t[g + 1], side="left"))
        valid[first:last] = False
    return valid


def _outside_windows(t: np.ndarray, grid: np.ndarray, reset: np.ndarray) -> np.ndarray:
    """True for intervals [grid_k, grid_k+1] outside every reset/disturbance window: no interval overlapping the
    span (t[a], t[b]) of a marked run (:func:`window_span`) is used. The state a window hands over starts the
    first interval after it (1 ns of tolerance on the stamps' float seconds)."""
    outside = np.ones(len(grid) - 1, bool)
    if not len(reset) or not reset.any():
        return outside
    for j0, j1 in marked_runs(reset):
        a, b = window_span(j0, j1, len(t))
        first = max(int(np.searchsorted(grid, t[a] + 1e-9, side="right")) - 1, 0)
        last = int(np.searchsorted(grid, t[b] - 1e-9, side="left"))
        outside[first:last] = False
    return outside


def _interval_modes(raw: RawTrial, grid: np.ndarray) -> np.ndarray:
    """The mode of the newest command at each interval's start ('idle' before the first command)."""
    if len(raw.command_t) == 0:
        return np.full(len(grid) - 1, "idle", dtype=object)
    ct = (raw.command_t - raw.state_t[0]) * 1e-9
    idx = np.searchsorted(ct, grid[:-1] + 1e-9, side="right") - 1
    modes = np.asarray(raw.command_mode, dtype=object)
    return np.where(idx >= 0, modes[np.maximum(idx, 0)], "idle")


# --------------------------------------------------------------------------------------------------
# Many bags, many sessions


@dataclass
class LoadResult:
    """Trials that loaded, and the bags that were skipped with the reason."""

    trials: list[TrialData] = field(default_factory=list)
    problems: list[BagProblem] = field(default_factory=list)

    def transitions(self, actuated_joint: int):
        data = TransitionData.empty()
        for trial in self.trials:
            data = data.concat(trial.transitions(actuated_joint))
        return data

    def handed_over_states(self) -> np.ndarray:
        """(M, 4) every trial's :meth:`TrialData.handed_over_states`."""
        return np.concatenate([np.zeros((0, 4))] + [trial.handed_over_states() for trial in self.trials])


def find_bags(path: str | Path) -> tuple[list[Path], str | None, list[BagProblem]]:
    """Bags under ``path`` (a session, a folder of bags, or one bag), the session's robot, and problems found.

    Partial bags are reported (run :func:`recover_session`), never read silently.
    """
    path = Path(path)
    if (path / "metadata.yaml").is_file():
        return [path], None, []
    if not path.is_dir():
        return [], None, [BagProblem(str(path), "no such session or bag directory")]
    robot, problems = None, []
    if (path / SESSION_FILE).is_file():
        try:
            robot = SessionDirectory.open(path).robot
        except TrialError as exc:
            problems.append(BagProblem(str(path / SESSION_FILE), str(exc)))
    bags, problems = [], problems
    for child in sorted(path.iterdir()):
        if child.is_dir() and child.name.endswith(CRASHED_SUFFIX):
            if not (path / child.name[: -len(CRASHED_SUFFIX)]).is_dir():   # said, not silently left out
                problems.append(BagProblem(str(child), "a crashed trial with no salvaged bag: nothing readable was "
                                                       "recovered or the recovery failed (session.yaml says why)"))
            continue
        if not child.is_dir():
            continue
        if child.name.endswith(PARTIAL_SUFFIX):
            problems.append(BagProblem(str(child), "partial bag left by a crash: run `mcpilco retrain` with "
                                                   "--recover (or mcpilco_core.recording.recover_session) first"))
        elif (child / "metadata.yaml").is_file() or any(child.glob("*.mcap")) or any(child.glob("*.db3")):
            bags.append(child)
    if not bags and not problems:
        problems.append(BagProblem(str(path), "no rosbag2 bags found"))
    return bags, robot, problems


def load_trial(path: str | Path, config: RobotConfig, session_robot: str | None = None,
               settings: ResampleSettings = ResampleSettings()) -> TrialData:
    """Read and resample one bag, checking that it belongs to ``config.robot``."""
    raw = read_bag(path)
    robot = raw.custom.get("robot") or session_robot
    if robot is not None and robot != config.robot:
        raise TrialError(f"{path}: recorded on the {robot}, not the {config.robot}")
    trial = resample(raw, config, settings)
    _check_actuation(trial, config)
    return trial


def _check_actuation(trial: TrialData, config: RobotConfig) -> None:
    """A bag without a robot label (``ros2 bag record``) whose torque is all on the wrong joint is refused."""
    act, pas = np.abs(trial.u[:, config.actuated_joint]), np.abs(trial.u[:, config.passive_joint])
    if pas.size and np.median(pas) > 0.1 and np.median(pas) > 10.0 * max(float(np.median(act)), 1e-3):
        other = JOINT_NAMES[config.passive_joint]
        raise TrialError(f"{trial.source}: the torque is applied on the {other}, which is passive on the "
                         f"{config.robot}: recorded on the other robot?")


def passive_tolerance(config: RobotConfig, settings: ResampleSettings) -> float:
    """N m of applied passive-joint torque above which an interval is not the robot's own dynamics: the
    settings' tolerance, or with the opt-in friction compensation its limit (that torque only cancels the joint's
    friction and is part of the dynamics the model learns; the reset PID's torques stay out by their windows)."""
    compensation = config.friction_compensation
    return max(settings.passive_tolerance, compensation.limit) if compensation.enabled else settings.passive_tolerance


def load_sessions(paths: Iterable[str | Path], config: RobotConfig,
                  settings: ResampleSettings = ResampleSettings()) -> LoadResult:
    """Every trial of every session (or bag folder) in ``paths``; bad bags are listed in ``problems``."""
    result = LoadResult()
    for path in paths:
        bags, robot, problems = find_bags(path)
        result.problems.extend(problems)
        if robot is not None and robot != config.robot:
            result.problems.append(BagProblem(str(path), f"session of the {robot}, not the {config.robot}"))
            continue
        for bag in bags:
            try:
                result.trials.append(load_trial(bag, config, robot, settings))
            except TrialError as exc:
                result.problems.append(BagProblem(str(bag), str(exc).removeprefix(f"{bag}: ")))
            except Exception as exc:  # noqa: BLE001 -- a defect here must not stop the other bags either
                LOG.exception("%s: unexpected error while reading the bag", bag)
                result.problems.append(BagProblem(str(bag), f"unexpected error: {type(exc).__name__}: {exc}"))
    for problem in result.problems:
        LOG.warning("skipped %s", problem)
    return result
