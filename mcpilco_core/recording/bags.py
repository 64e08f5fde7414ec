"""Writing trial bags: rosbag2 (mcap or sqlite3, metadata version 8 or 9) from raw CDR bytes.

The topics and their types are the package's ROS interfaces (the README's interface table); no rclpy here: the
trainer node hands in the bytes it received. What a bag holds and how a session directory is laid out:
:mod:`mcpilco_core.recording`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

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


def header_stamp_ns(data: bytes | memoryview) -> int | None:
    """The ``header.stamp`` (ns) of a raw CDR message whose first field is a std_msgs/Header (JointState,
    DiagnosticArray), without deserialising it; None if ``data`` is too short or not CDR.

    Why: the trainer reports the newest state it recorded, so that whoever stops a trial can first wait for the
    robot's final state to arrive (it reaches the controller and the trainer in either order)."""
    raw = bytes(data[:12])
    if len(raw) < 12 or raw[0] != 0 or raw[1] not in (0, 1):
        return None
    order = "little" if raw[1] == 1 else "big"
    sec = int.from_bytes(raw[4:8], order, signed=True)
    nanosec = int.from_bytes(raw[8:12], order, signed=False)
    return sec * 1_000_000_000 + nanosec


def typestore(version: int = 9):
    """Message definitions for the bag's metadata: Humble's for version 8, Jazzy's (with type hashes) for 9."""
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_HUMBLE if version == 8 else Stores.ROS2_JAZZY)


def atomic_write_yaml(path: Path, data: Any) -> None:
    """Write YAML through a temporary file + rename: a crash never leaves a half-written session.yaml."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    tmp.replace(path)





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
        self.last_stamp_ns: dict[str, int] = {}     # per topic: the newest header stamp written (ns)
        plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
        self._writer = Writer(self.partial, version=version, storage_plugin=plugin)
        for key, value in (custom_data or {}).items():
            self._writer.set_custom_data(CUSTOM_PREFIX + key, str(value))
        self._writer.open()
        store = typestore(version)
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
        stamp = header_stamp_ns(data)
        if stamp is not None and stamp > self.last_stamp_ns.get(topic, -1):
            self.last_stamp_ns[topic] = stamp
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
