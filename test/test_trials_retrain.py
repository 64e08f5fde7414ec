"""Retraining from recorded trial bags (mcpilco retrain): real learner, tiny configuration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_trials import write_stream

from mcpilco_core import recording
from mcpilco_core.learning.learner import ExplorationController, run_on_robot
from mcpilco_core.learning.retrain import main as retrain_main
from mcpilco_core.policy import load_policy


def simulated_session(root: Path, config, seeds=(1, 2)) -> recording.SessionDirectory:
    """A session whose bags hold simulated exploration trials (the sim driver's stream: effort = applied)."""
    session = recording.SessionDirectory.create(root, config)
    for seed in seeds:
        traj = run_on_robot(config, ExplorationController(config, 3.0, np.random.default_rng(seed)), np.zeros(4), 1.0)
        recorder = session.start_trial("none")
        write_stream(recorder, traj.x, np.vstack([np.zeros((1, 2)), traj.u]), traj.u_cmd, ["policy"] * len(traj.u))
        session.finish_trial(recorder)
    return session


@pytest.fixture
def tiny_config(tmp_path, repo) -> Path:
    data = yaml.safe_load((repo / "config" / "train_tiny.yaml").read_text())
    data.update(robot_config=str(repo / "config" / "pendubot.yaml"), horizon=0.2, particles=8,
                gp={"fit_steps": 5, "fit_points": 60, "max_points": 30},
                optimizer={"max_steps_first": 5, "max_steps": 5, "patience": 3, "smoothing": 0.9},
                policy={"num_basis": 10})
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_retrain_exports_versioned_policies_and_skips_bad_bags(tmp_path, pendubot_config, tiny_config, capsys):
    session = simulated_session(tmp_path / "s", pendubot_config)
    (tmp_path / "s" / "trial_009").mkdir()  # a broken bag: reported, not fatal
    (tmp_path / "s" / "trial_009" / "trial_009.mcap").write_bytes(b"\x89MCAP0\r\ntruncated")
    out = tmp_path / "run"
    args = ["retrain", "--sessions", str(session.root), "--out", str(out), "--config", str(tiny_config), "--json"]
    assert retrain_main(args) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["trials"] == 2 and first["transitions"] == 2 * 50
    assert any("trial_009" in s for s in first["skipped"])
    assert retrain_main(args + ["--warm-start"]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    files = sorted(p.name for p in (out / "policies").glob("*.npz"))
    assert len(files) == 2 and files[0].startswith("policy_000_") and files[1].startswith("policy_001_")
    for result in (first, second):
        policy = load_policy(result["policy"], robot="pendubot")
        assert policy.version() == result["policy_version"]
    history = json.loads((out / "retrain.json").read_text())
    assert history["robot"] == "pendubot" and len(history["retrains"]) == 2
    assert history["retrains"][1]["warm_start_model"].endswith("model_000.npz")


def test_retrain_refuses_without_usable_trials(tmp_path, tiny_config, capsys):
    (tmp_path / "empty").mkdir()
    code = retrain_main(["retrain", "--sessions", str(tmp_path / "empty"), "--out", str(tmp_path / "run"),
                         "--config", str(tiny_config)])
    assert code == 2 and "usable transitions" in capsys.readouterr().err
