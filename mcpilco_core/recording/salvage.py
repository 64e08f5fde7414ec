"""Crash salvage: a partial bag left by a crash becomes a new, valid bag; the original files are kept."""

from __future__ import annotations

import logging
import sqlite3
import struct
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

from .bags import CRASHED_SUFFIX, PARTIAL_SUFFIX, TOPIC_TYPES, TrialError, TrialRecorder
from .session_directory import SessionDirectory

LOG = logging.getLogger("mcpilco.recording")


def recover_session(root: str | Path) -> list[Path]:
    """Salvage every partial bag of a session (left by a crash) into a valid bag; returns the recovered bags.

    The original partial directory is kept, renamed ``trial_NNN.crashed``; session.yaml marks the trial
    'recovered' with the number of messages saved. A partial bag with nothing readable is only renamed.
    """
    session = SessionDirectory.open(root)
    recovered = []
    for partial in session.partial_bags():
        final = partial.with_name(partial.name[: -len(PARTIAL_SUFFIX)])
        crashed = partial.with_name(final.name + CRASHED_SUFFIX)
        partial.rename(crashed)  # frees the partial name for the salvaged copy, keeps the original files
        entry = session.entry(final.name)
        entry["crashed_files"] = crashed.name
        try:
            counts = salvage_bag(crashed, final, custom_data={"robot": session.robot, "recovered": "true",
                                                              "policy_version": str(entry.get("policy_version", ""))})
        except Exception as exc:  # noqa: BLE001 -- whatever the damage, the trial is marked and the others go on
            problem = str(exc) if isinstance(exc, TrialError) else f"{crashed}: {type(exc).__name__}: {exc}"
            LOG.warning("%s", problem)
            entry.update({"status": "unrecoverable", "problem": problem})
        else:
            recovered.append(final)
            entry.update({"status": "recovered", "messages": counts})
        session.save()
    return recovered


def salvage_bag(partial: str | Path, final: str | Path, custom_data: dict[str, str] | None = None,
                version: int = 9) -> dict[str, int]:
    """Copy every complete message of a crashed bag directory (mcap or sqlite3) into a new bag ``final``."""
    partial = Path(partial)
    messages = list(stored_messages(partial))
    if not messages:
        raise TrialError(f"{partial}: nothing recoverable (no complete message on disk)")
    recorder = TrialRecorder(Path(final), storage="mcap", version=version, topics=sorted({m[0] for m in messages}),
                             custom_data=custom_data)
    for topic, timestamp, data in messages:
        recorder.write(topic, data, timestamp)
    recorder.close()
    return dict(recorder.counts)


def stored_messages(partial: Path) -> Iterator[tuple[str, int, bytes]]:
    """(topic, receive time in ns, raw CDR) of every message of this package's topics that a bag's storage files
    hold, read without metadata.yaml (a bag left ``.partial`` by a crash has none); TrialError without storage."""
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


def _scan_mcap(path: Path) -> list[tuple[str, int, bytes]]:
    """Messages of an MCAP file cut off or damaged anywhere: records are read until the first incomplete or
    unreadable one (a damaged chunk header, a chunk that does not decompress), and every message before it kept."""
    data = path.read_bytes()
    if not data.startswith(_MCAP_MAGIC):
        raise TrialError(f"{path}: not an MCAP file (bad magic)")
    channels: dict[int, str] = {}
    out: list[tuple[str, int, bytes]] = []
    try:
        for message in _mcap_records(BytesIO(data[len(_MCAP_MAGIC):]), channels, top_level=True):
            out.append(message)
    except Exception as exc:  # noqa: BLE001 -- struct, unicode, zstd or index errors of a damaged record
        LOG.warning("%s: stopped at a damaged record after %d message(s): %s: %s", path, len(out),
                    type(exc).__name__, exc)
    return out


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
