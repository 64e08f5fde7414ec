"""A session directory: one folder per hardware session, session.yaml + one bag per trial.

Layout: :mod:`mcpilco_core.recording`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError, RobotConfig, copy_robot_config, read_yaml
from .bags import (
    COMMAND_TOPIC,
    DIAGNOSTICS_TOPIC,
    PARTIAL_SUFFIX,
    SESSION_FILE,
    STATE_TOPIC,
    TrialError,
    TrialRecorder,
    atomic_write_yaml,
)


@dataclass
class SessionDirectory:
    """A session directory (see the module docstring); ``info`` is session.yaml's content."""

    root: Path
    info: dict

    @classmethod
    def create(cls, root: str | Path, config: RobotConfig, notes: str = "") -> SessionDirectory:
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
            copy_robot_config(config.source, root)       # with its plant-models files: the copy loads on its own
        info = {"robot": config.robot, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "config": {"source": config.source, "fingerprint": config.fingerprint(),
                           "policy_period_s": config.policy_period, "control_period_s": config.control_period,
                           "plant_model": config.plant.name,
                           "friction_compensation": config.friction_compensation.enabled},
                "notes": notes, "trials": []}
        session = cls(root, info)
        session.save()
        return session

    @classmethod
    def open(cls, root: str | Path) -> SessionDirectory:
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
    def friction_compensation(self) -> bool:
        """Whether the session's controller compensated the passive joint's friction (every bag says so)."""
        return bool(self.info.get("config", {}).get("friction_compensation", False))

    @property
    def robot(self) -> str:
        return str(self.info["robot"])

    def save(self) -> None:
        atomic_write_yaml(self.root / SESSION_FILE, self.info)

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
                                              "policy_version": policy_version,
                                              "friction_compensation": str(self.friction_compensation).lower()})
        self.info["trials"].append({"index": index, "bag": final.name, "status": "recording",
                                    "start": time.strftime("%Y-%m-%dT%H:%M:%S"), "start_unix_s": time.time(),
                                    "policy_version": policy_version, "policy_path": str(policy_path),
                                    "storage": storage, "bag_version": version, "notes": notes})
        self.save()
        return recorder

    def finish_trial(self, recorder: TrialRecorder, notes: str = "") -> dict:
        """Close the recorder's bag and complete its session.yaml entry (duration, message counts)."""
        path = recorder.close()
        entry = self.entry(path.name)
        entry.update({"status": "complete", "end": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "duration_s": round(time.time() - float(entry.get("start_unix_s", time.time())), 3),
                      "messages": dict(recorder.counts)})
        if notes:
            entry["notes"] = (str(entry.get("notes") or "") + " " + notes).strip()
        self.save()
        return entry

    def entry(self, bag_name: str) -> dict:
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
