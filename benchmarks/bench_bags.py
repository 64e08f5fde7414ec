"""Bag write and read time for N JointState messages (half joint_states, half joint_commands; 500 Hz).

    python benchmarks/bench_bags.py [--messages 100000] [--storage mcap|sqlite3] [--version 8|9]

Write = TrialRecorder.write of pre-serialized CDR (what the trainer node does with raw subscriptions) + close.
Read = mcpilco_core.recording.load_trial: decode both streams and resample to the 20 ms policy period.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from rosbags.typesys import Stores, get_typestore

from mcpilco_core import recording
from mcpilco_core.config import load_robot_config
from mcpilco_core.paths import config_dir


def messages(count: int) -> list[tuple[str, bytes, int]]:
    store = get_typestore(Stores.ROS2_JAZZY)
    js, header, stamp = (store.types[n] for n in ("sensor_msgs/msg/JointState", "std_msgs/msg/Header",
                                                  "builtin_interfaces/msg/Time"))
    out = []
    t0 = time.time_ns()
    for k in range(count // 2):
        ns = t0 + k * 2_000_000
        head = header(stamp=stamp(sec=ns // 10**9, nanosec=ns % 10**9), frame_id="")
        state = js(header=head, name=["shoulder", "elbow"], position=np.array([1e-3 * k, 0.0]),
                   velocity=np.array([0.5, 0.0]), effort=np.array([0.25, 0.0]))
        head_cmd = header(stamp=head.stamp, frame_id="policy")
        command = js(header=head_cmd, name=["shoulder", "elbow"], position=np.zeros(0), velocity=np.zeros(0),
                     effort=np.array([0.25, 0.0]))
        out.append((recording.STATE_TOPIC, bytes(store.serialize_cdr(state, recording.JOINT_STATE_TYPE)), ns))
        out.append((recording.COMMAND_TOPIC, bytes(store.serialize_cdr(command, recording.JOINT_STATE_TYPE)), ns))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--storage", choices=recording.STORAGES, default="mcap")
    parser.add_argument("--version", type=int, choices=recording.BAG_VERSIONS, default=9)
    args = parser.parse_args()
    config = load_robot_config(config_dir() / "pendubot.yaml")
    data = messages(args.messages)
    with tempfile.TemporaryDirectory() as tmp:
        bag = Path(tmp) / "bag"
        start = time.perf_counter()
        recorder = recording.TrialRecorder(bag, storage=args.storage, version=args.version)
        for topic, raw, ns in data:
            recorder.write(topic, raw, ns)
        recorder.close()
        write_s = time.perf_counter() - start
        size = sum(p.stat().st_size for p in bag.iterdir())
        start = time.perf_counter()
        trial = recording.load_trial(bag, config)
        read_s = time.perf_counter() - start
    print(f"{len(data)} messages, {args.storage} v{args.version}, {size / 1e6:.1f} MB: write {write_s:.2f} s "
          f"({len(data) / write_s / 1e3:.0f} k msg/s), read + resample {read_s:.2f} s "
          f"({len(data) / read_s / 1e3:.0f} k msg/s) -> {len(trial)} transitions at {trial.period} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
