"""Hardware trials on disk: rosbag2 recording, session directories, crash recovery, and reading trials back.

No rclpy here (the trainer node hands in raw CDR bytes), so everything is testable without ROS.

**What a trial bag holds** (topics of DESIGN.md section 3, raw CDR exactly as received):

- ``joint_states`` (sensor_msgs/JointState): the driver's 500 Hz stream; position rad, velocity rad/s and, in
  ``effort``, the torque (N m) the driver actually applied over the step that ended at the header stamp;
- ``joint_commands`` (sensor_msgs/JointState): the controller's torques (N m); ``header.frame_id`` carries the
  supervisor mode (policy / lqr / damping / safe) that produced each command -- **this is the mode stream**:
  one mode per command, exact in time, no extra topic needed;
- ``diagnostics`` (diagnostic_msgs/DiagnosticArray), optional: for humans (loop timing, faults).

A bag made with ``ros2 bag record joint_states joint_commands [diagnostics]`` has the same content and reads the
same way. Message time in the bag is the receive time (ns); trial data uses the header stamps (measurement time).

**Session directory** (one per hardware session)::

    SESSION/session.yaml        robot, config (path + fingerprint), notes, one entry per trial (bag, times,
                                policy version used, status recording/complete/recovered)
    SESSION/robot_config.yaml   copy of the robot configuration used
    SESSION/trial_000/          rosbag2 bag (metadata.yaml + storage file); robot etc. also in custom_data
    SESSION/trial_001.partial/  a trial being recorded (or left by a crash: see recover_session)

A bag is written under ``trial_NNN.partial`` and renamed to ``trial_NNN`` when closed, so a complete name always
means a complete bag. The recorder flushes the storage every ``flush_period`` s, so a crash loses at most that
much; :func:`recover_session` salvages a partial bag into a new, valid bag and keeps the original files.

**Reading back**: :func:`load_sessions` turns every readable trial into :class:`TrialData` at the policy period
(states interpolated at the grid, torque = time-average of the applied torque over each interval); unreadable or
mismatched bags become :class:`BagProblem` entries (file + reason) and never stop the others.
"""

from __future__ import annotations

import logging
import math
import shutil
import sqlite3
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from .config import JOINT_NAMES, RobotConfig

LOG = logging.getLogger("mcpilco.trials")

STATE_TOPIC = "joint_states"
COMMAND_TOPIC = "joint_commands"
DIAGNOSTICS_TOPIC = "diagnostics"
JOINT_STATE_TYPE = "sensor_msgs/msg/JointState"
DIAGNOSTICS_TYPE = "diagnostic_msgs/msg/DiagnosticArray"
TOPIC_TYPES = {STATE_TOPIC: JOINT_STATE_TYPE, COMMAND_TOPIC: JOINT_STATE_TYPE, DIAGNOSTICS_TOPIC: DIAGNOSTICS_TYPE}
SESSION_FILE = "session.yaml"
PARTIAL_SUFFIX = ".partial"
CRASHED_SUFFIX = ".crashed"
STORAGES = ("mcap", "sqlite3")
BAG_VERSIONS = (8, 9)          # 8: readable by Humble's rosbag2; 9: Jazzy and newer
CUSTOM_PREFIX = "mcpilco."     # keys of the bag's metadata custom_data written by the recorder
UNKNOWN_MODE = "unknown"


class TrialError(ValueError):
    """A bag or session cannot be used; the message names the file and the reason."""


def _typestore(version: int = 9):
    """Message definitions for the bag's metadata: Humble's for version 8, Jazzy's (with type hashes) for 9."""
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_HUMBLE if version == 8 else Stores.ROS2_JAZZY)


def _atomic_write_yaml(path: Path, data: Any) -> None:
    """Write YAML through a temporary file + rename: a crash never leaves a half-written session.yaml."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    tmp.replace(path)


# --------------------------------------------------------------------------------------------------
# Recording


class TrialRecorder:
    """Writes one trial's raw CDR messages into a rosbag2 bag named ``final`` once closed.

    Messages go to ``final.partial`` first; :meth:`close` finishes the bag (metadata.yaml) and renames it.
    ``flush_period`` (s): the storage is flushed (mcap: pending chunk written; sqlite3: committed) at least this
    often, which bounds what a crash can lose. ``custom_data`` lands in the bag's metadata (strings only).
    """

    def __init__(self, final: str | Path, *, storage: str = "mcap", version: int = 9,
                 topics: Sequence[str] = (STATE_TOPIC, COMMAND_TOPIC, DIAGNOSTICS_TOPIC),
                 custom_data: dict[str, str] | None = None, flush_period: float = 1.0) -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        if storage not in STORAGES:
            raise TrialError(f"{final}: storage must be one of {list(STORAGES)}, got {storage!r}")
        if version not in BAG_VERSIONS:
            raise TrialError(f"{final}: bag version must be one of {list(BAG_VERSIONS)}, got {version!r}")
        self.final = Path(final)
        self.partial = self.final.with_name(self.final.name + PARTIAL_SUFFIX)
        for path in (self.final, self.partial):
            if path.exists():
                raise TrialError(f"{path}: exists already; a recorder never overwrites a bag")
        self.flush_period = float(flush_period)
        self.counts: dict[str, int] = {}
        plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
        self._writer = Writer(self.partial, version=version, storage_plugin=plugin)
        for key, value in (custom_data or {}).items():
            self._writer.set_custom_data(CUSTOM_PREFIX + key, str(value))
        self._writer.open()
        store = _typestore(version)
        self._connections = {}
        for topic in topics:
            if topic not in TOPIC_TYPES:
                raise TrialError(f"{final}: unknown topic {topic!r} (known: {sorted(TOPIC_TYPES)})")
            self._connections[topic] = self._writer.add_connection(topic, TOPIC_TYPES[topic], typestore=store)
            self.counts[topic] = 0
        self._last_flush = time.monotonic()
        self.closed = False
        self.flush()  # schemas and connections on disk at once: a crash right away is still recoverable

    def write(self, topic: str, data: bytes | memoryview, timestamp_ns: int) -> None:
        """Store one raw CDR message received at ``timestamp_ns`` (ns since the epoch)."""
        if self.closed:
            raise TrialError(f"{self.final}: the recorder is closed")
        self._writer.write(self._connections[topic], int(timestamp_ns), data)
        self.counts[topic] += 1
        if time.monotonic() - self._last_flush >= self.flush_period:
            self.flush()

    def flush(self) -> None:
        """Push buffered messages to disk (relies on rosbags 0.11's storage objects; a no-op if they change)."""
        storage = getattr(self._writer, "storage", None)
        if hasattr(storage, "close_chunk") and hasattr(storage, "bio"):      # mcap
            if storage.chunk.bio.tell():
                storage.close_chunk()
            storage.bio.flush()
        elif hasattr(storage, "conn"):                                        # sqlite3
            storage.conn.commit()
        self._last_flush = time.monotonic()

    def close(self) -> Path:
        """Finish the bag (index, metadata.yaml) and rename it to its final name; returns that path."""
        if self.closed:
            return self.final
        self._writer.close()
        self.closed = True
        self.partial.rename(self.final)
        return self.final

    @property
    def message_count(self) -> int:
        return sum(self.counts.values())


# --------------------------------------------------------------------------------------------------
# Sessions


@dataclass
class Session:
    """A session directory (see the module docstring); ``info`` is session.yaml's content."""

    root: Path
    info: dict

    @classmethod
    def create(cls, root: str | Path, config: RobotConfig, notes: str = "") -> Session:
        """Create ``root`` (or reopen it when it already is a session of the same robot)."""
        root = Path(root)
        path = root / SESSION_FILE
        if path.exists():
            session = cls.open(root)
            if session.robot != config.robot:
                raise TrialError(f"{path}: session of the {session.robot}, not the {config.robot}")
            return session
        root.mkdir(parents=True, exist_ok=True)
        if config.source and Path(config.source).is_file():
            shutil.copyfile(config.source, root / "robot_config.yaml")
        info = {"robot": config.robot, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "config": {"source": config.source, "fingerprint": config.fingerprint(),
                           "policy_period_s": config.policy_period, "control_period_s": config.control_period,
                           "plant_model": config.plant.name},
                "notes": notes, "trials": []}
        session = cls(root, info)
        session.save()
        return session

    @classmethod
    def open(cls, root: str | Path) -> Session:
        from .config import ConfigError, read_yaml

        root = Path(root)
        try:
            info = read_yaml(root / SESSION_FILE)
        except ConfigError as exc:
            raise TrialError(str(exc)) from exc
        if not isinstance(info, dict) or "robot" not in info:
            raise TrialError(f"{root / SESSION_FILE}: not a session file (no 'robot')")
        info.setdefault("trials", [])
        return cls(root, info)

    @property
    def robot(self) -> str:
        return str(self.info["robot"])

    def save(self) -> None:
        _atomic_write_yaml(self.root / SESSION_FILE, self.info)

    def next_index(self) -> int:
        """The first trial index not used by a bag, partial bag, crashed bag or session entry."""
        used = {int(t["index"]) for t in self.info["trials"]}
        for path in self.root.glob("trial_*"):
            digits = path.name[len("trial_"):].split(".")[0]
            if digits.isdigit():
                used.add(int(digits))
        return max(used, default=-1) + 1

    def bag_path(self, index: int) -> Path:
        return self.root / f"trial_{index:03d}"

    def start_trial(self, policy_version: str, policy_path: str = "", notes: str = "", *, storage: str = "mcap",
                    version: int = 9, flush_period: float = 1.0,
                    topics: Sequence[str] = (STATE_TOPIC, COMMAND_TOPIC, DIAGNOSTICS_TOPIC)) -> TrialRecorder:
        """Open the recorder of the next trial and note it in session.yaml as 'recording'."""
        index = self.next_index()
        final = self.bag_path(index)
        recorder = TrialRecorder(final, storage=storage, version=version, topics=topics, flush_period=flush_period,
                                 custom_data={"robot": self.robot, "trial": str(index),
                                              "policy_version": policy_version})
        self.info["trials"].append({"index": index, "bag": final.name, "status": "recording",
                                    "start": time.strftime("%Y-%m-%dT%H:%M:%S"), "start_unix_s": time.time(),
                                    "policy_version": policy_version, "policy_path": str(policy_path),
                                    "storage": storage, "bag_version": version, "notes": notes})
        self.save()
        return recorder

    def finish_trial(self, recorder: TrialRecorder, notes: str = "") -> dict:
        """Close the recorder's bag and complete its session.yaml entry (duration, message counts)."""
        path = recorder.close()
        entry = self._entry(path.name)
        entry.update({"status": "complete", "end": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "duration_s": round(time.time() - float(entry.get("start_unix_s", time.time())), 3),
                      "messages": dict(recorder.counts)})
        if notes:
            entry["notes"] = (str(entry.get("notes") or "") + " " + notes).strip()
        self.save()
        return entry

    def _entry(self, bag_name: str) -> dict:
        for entry in self.info["trials"]:
            if entry.get("bag") == bag_name:
                return entry
        entry = {"index": int(bag_name.split("_")[1].split(".")[0]), "bag": bag_name}
        self.info["trials"].append(entry)
        return entry

    def bags(self) -> list[Path]:
        """Complete trial bags in index order (partial and crashed ones excluded)."""
        return sorted(p for p in self.root.glob("trial_*") if p.is_dir() and "." not in p.name)

    def partial_bags(self) -> list[Path]:
        return sorted(p for p in self.root.glob(f"trial_*{PARTIAL_SUFFIX}") if p.is_dir())


def recover_session(root: str | Path) -> list[Path]:
    """Salvage every partial bag of a session (left by a crash) into a valid bag; returns the recovered bags.

    The original partial directory is kept, renamed ``trial_NNN.crashed``; session.yaml marks the trial
    'recovered' with the number of messages saved. A partial bag with nothing readable is only renamed.
    """
    session = Session.open(root)
    recovered = []
    for partial in session.partial_bags():
        final = partial.with_name(partial.name[: -len(PARTIAL_SUFFIX)])
        crashed = partial.with_name(final.name + CRASHED_SUFFIX)
        partial.rename(crashed)  # frees the partial name for the salvaged copy, keeps the original files
        entry = session._entry(final.name)
        entry["crashed_files"] = crashed.name
        try:
            counts = salvage_bag(crashed, final, custom_data={"robot": session.robot, "recovered": "true",
                                                              "policy_version": str(entry.get("policy_version", ""))})
        except TrialError as exc:
            LOG.warning("%s", exc)
            entry.update({"status": "unrecoverable", "problem": str(exc)})
        else:
            recovered.append(final)
            entry.update({"status": "recovered", "messages": counts})
        session.save()
    return recovered


def salvage_bag(partial: str | Path, final: str | Path, custom_data: dict[str, str] | None = None,
                version: int = 9) -> dict[str, int]:
    """Copy every complete message of a crashed bag directory (mcap or sqlite3) into a new bag ``final``."""
    partial = Path(partial)
    messages = list(_salvage_messages(partial))
    if not messages:
        raise TrialError(f"{partial}: nothing recoverable (no complete message on disk)")
    recorder = TrialRecorder(Path(final), storage="mcap", version=version, topics=sorted({m[0] for m in messages}),
                             custom_data=custom_data)
    for topic, timestamp, data in messages:
        recorder.write(topic, data, timestamp)
    recorder.close()
    return dict(recorder.counts)


def _salvage_messages(partial: Path) -> Iterator[tuple[str, int, bytes]]:
    files = sorted(partial.glob("*.mcap")) + sorted(partial.glob("*.db3"))
    if not files:
        raise TrialError(f"{partial}: no .mcap or .db3 storage file")
    for path in files:
        reader = _scan_mcap if path.suffix == ".mcap" else _scan_sqlite
        for topic, timestamp, data in reader(path):
            if topic in TOPIC_TYPES:
                yield topic, timestamp, data


def _scan_sqlite(path: Path) -> Iterator[tuple[str, int, bytes]]:
    """Messages of a sqlite3 bag whose writer died: sqlite rolls back the uncommitted tail on its own."""
    try:
        with sqlite3.connect(f"file:{path}", uri=True) as db:
            topics = dict(db.execute("SELECT id, name FROM topics"))
            rows = db.execute("SELECT topic_id, timestamp, data FROM messages ORDER BY timestamp").fetchall()
    except sqlite3.Error as exc:
        raise TrialError(f"{path}: unreadable sqlite3 storage: {exc}") from exc
    for topic_id, timestamp, data in rows:
        yield topics.get(topic_id, ""), int(timestamp), bytes(data)


_MCAP_MAGIC = b"\x89MCAP0\r\n"


def _scan_mcap(path: Path) -> Iterator[tuple[str, int, bytes]]:
    """Messages of an MCAP file cut off anywhere: records are read until the first incomplete one."""
    data = path.read_bytes()
    if not data.startswith(_MCAP_MAGIC):
        raise TrialError(f"{path}: not an MCAP file (bad magic)")
    channels: dict[int, str] = {}
    yield from _mcap_records(BytesIO(data[len(_MCAP_MAGIC):]), channels, top_level=True)


def _mcap_records(bio: BytesIO, channels: dict[int, str], top_level: bool) -> Iterator[tuple[str, int, bytes]]:
    while True:
        head = bio.read(9)
        if len(head) < 9:
            return
        op, size = head[0], struct.unpack("<Q", head[1:])[0]
        body = bio.read(size)
        if len(body) < size:
            return  # the record the crash cut off
        if op == 0x04:       # channel: id u16, schema u16, topic string
            (cid,) = struct.unpack_from("<H", body, 0)
            (length,) = struct.unpack_from("<I", body, 4)
            channels[cid] = body[8:8 + length].decode("utf-8", "replace")
        elif op == 0x05:     # message: channel u16, sequence u32, log time u64, publish time u64, data
            cid, _, log_time, _ = struct.unpack_from("<HIQQ", body, 0)
            yield channels.get(cid, ""), log_time, body[22:]
        elif op == 0x06 and top_level:   # chunk: times, sizes, crc, compression, records
            (comp_len,) = struct.unpack_from("<I", body, 28)
            compression = body[32:32 + comp_len].decode()
            offset = 32 + comp_len
            (rec_len,) = struct.unpack_from("<Q", body, offset)
            records = body[offset + 8: offset + 8 + rec_len]
            if compression == "zstd":
                records = _zstd().decompress(records)
            elif compression:
                return
            yield from _mcap_records(BytesIO(records), channels, top_level=False)


def _zstd():
    """The zstd module rosbags itself uses (Python 3.14's, or the backport it depends on)."""
    try:
        from compression import zstd  # type: ignore[import-not-found]
    except ImportError:
        from backports import zstd  # type: ignore[import-not-found,no-redef]
    return zstd


# --------------------------------------------------------------------------------------------------
# Reading bags back


@dataclass
class BagProblem:
    """A bag (or session) that was skipped, and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class RawTrial:
    """A bag's streams as arrays (header-stamp times in ns, SI units), before resampling.

    state_t (n,), q (n, 2) rad, dq (n, 2) rad/s, effort (n, 2) or (0, 2) N m (applied over the step ending at
    the stamp); command_t (m,), command_u (m, 2) N m, command_mode (m,) supervisor mode names.
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


@dataclass
class TrialData:
    """One trial at the policy period, as the learner uses it.

    t (N+1,) s since the first state; x (N+1, 4) states (q1, q2 rad, dq1, dq2 rad/s) at those times;
    u (N, 2) torque (N m) actually applied, averaged over [t_k, t_k+1); mode (N,) supervisor mode acting at t_k;
    valid (N,) transitions usable for the model (no gap in the state stream, no torque on the passive joint).
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

    def __len__(self) -> int:
        return int(self.u.shape[0])

    def transitions(self, actuated_joint: int):
        """The valid transitions as the learner's TransitionData (x, actuated torque, next x)."""
        from .model import TransitionData

        keep = self.valid
        return TransitionData(self.x[:-1][keep].copy(), self.u[keep, actuated_joint].copy(), self.x[1:][keep].copy())


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
    msg = _typestore(9).deserialize_cdr(buf, JOINT_STATE_TYPE)
    stamp = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
    return _JointState(stamp, msg.header.frame_id, list(msg.name), tuple(msg.position), tuple(msg.velocity),
                       tuple(msg.effort))


def _decode(path: Path, reader, connections) -> RawTrial:
    states: list[tuple] = []
    commands: list[tuple] = []
    problems = 0
    for connection, _, data in reader.messages(connections=connections):
        msg = parse_joint_state(data)
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
    if problems:
        LOG.warning("%s: %d message(s) with other joint names or lengths ignored", path, problems)
    return _raw_from_rows(str(path), states, commands)


def _joint_order(names: Sequence[str]) -> tuple[int, int] | None:
    names = list(names)
    if len(names) != 2 or set(names) != set(JOINT_NAMES):
        return None
    return names.index(JOINT_NAMES[0]), names.index(JOINT_NAMES[1])


def _state_row(msg: _JointState, order: tuple[int, int]) -> tuple | None:
    i, j = order
    if len(msg.position) != 2 or len(msg.velocity) != 2:
        return None
    effort = (float(msg.effort[i]), float(msg.effort[j])) if len(msg.effort) == 2 else (math.nan, math.nan)
    return (float(msg.position[i]), float(msg.position[j]), float(msg.velocity[i]), float(msg.velocity[j]),
            *effort)


def _raw_from_rows(path: str, states: list[tuple], commands: list[tuple]) -> RawTrial:
    s = np.array(states, dtype=np.float64).reshape(-1, 7)
    t_ns = np.array([r[0] for r in states], dtype=np.int64)
    order = np.argsort(t_ns, kind="stable")
    t_ns, s = t_ns[order], s[order]
    keep = np.concatenate([[True], np.diff(t_ns) > 0]) if len(t_ns) else np.zeros(0, bool)  # drop duplicates
    t_ns, s = t_ns[keep], s[keep]
    effort = s[:, 5:7] if len(s) and np.isfinite(s[:, 5:7]).all() else np.zeros((0, 2))
    c_ns = np.array([r[0] for r in commands], dtype=np.int64)
    corder = np.argsort(c_ns, kind="stable")
    cu = np.array([(r[1], r[2]) for r in commands], dtype=np.float64).reshape(-1, 2)[corder]
    modes = [commands[k][3] or UNKNOWN_MODE for k in corder]
    return RawTrial(path, t_ns, s[:, 1:3], s[:, 3:5], effort, c_ns[corder], cu, modes)


# --------------------------------------------------------------------------------------------------
# Resampling to the policy period


@dataclass(frozen=True)
class ResampleSettings:
    """max_gap: s, a hole in the state stream longer than this invalidates the intervals it touches;
    passive_tolerance: N m, more applied torque than this on the passive joint invalidates an interval (e.g. the
    simulated robot's disturbance PID); min_states: bags with fewer states are refused."""

    max_gap: float = 0.01
    passive_tolerance: float = 0.1
    min_states: int = 10


def resample(raw: RawTrial, config: RobotConfig, settings: ResampleSettings = ResampleSettings()) -> TrialData:
    """The trial at the policy period: states interpolated at the grid, applied torque averaged per interval."""
    if len(raw.state_t) < settings.min_states:
        raise TrialError(f"{raw.path}: only {len(raw.state_t)} usable joint_states message(s)")
    t = (raw.state_t - raw.state_t[0]) * 1e-9
    period = float(config.policy_period)
    n = int(math.floor(t[-1] / period + 1e-9))
    if n < 1:
        raise TrialError(f"{raw.path}: shorter than one policy period ({t[-1]:.4f} s < {period} s)")
    grid = np.arange(n + 1) * period
    x = np.column_stack([np.interp(grid, t, col) for col in (*raw.q.T, *raw.dq.T)])
    u, source, torque_valid = _interval_torque(raw, t, grid, config)
    valid = _gap_free(t, grid, settings.max_gap) & torque_valid
    valid &= np.abs(u[:, config.passive_joint]) <= settings.passive_tolerance
    mode = _interval_modes(raw, grid)
    return TrialData(robot=config.robot, period=period, t=grid, x=x, u=u, mode=mode, valid=valid, source=raw.path,
                     policy_version=raw.custom.get("policy_version", ""), torque_source=source)


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


def _gap_free(t: np.ndarray, grid: np.ndarray, max_gap: float) -> np.ndarray:
    """True for intervals [grid_k, grid_k+1] that no state-stream gap longer than ``max_gap`` s overlaps."""
    gaps = np.flatnonzero(np.diff(t) > max_gap)
    valid = np.ones(len(grid) - 1, bool)
    for g in gaps:
        first = max(int(np.searchsorted(grid, t[g], side="right")) - 1, 0)
        last = int(np.searchsorted(grid, t[g + 1], side="left"))
        valid[first:last] = False
    return valid


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
        from .model import TransitionData

        data = TransitionData.empty()
        for trial in self.trials:
            data = data.concat(trial.transitions(actuated_joint))
        return data


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
            robot = Session.open(path).robot
        except TrialError as exc:
            problems.append(BagProblem(str(path / SESSION_FILE), str(exc)))
    bags, problems = [], problems
    for child in sorted(path.iterdir()):
        if not child.is_dir() or child.name.endswith(CRASHED_SUFFIX):
            continue
        if child.name.endswith(PARTIAL_SUFFIX):
            problems.append(BagProblem(str(child), "partial bag left by a crash: run `mcpilco retrain` with "
                                                   "--recover (or mcpilco_core.trials.recover_session) first"))
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
    for problem in result.problems:
        LOG.warning("skipped %s", problem)
    return result
