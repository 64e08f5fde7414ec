"""Run directories as an adversary leaves them (issue 13 items 7 and 8): ``mcpilco train --out`` never writes into
a directory that is not a run, ``--resume`` names a damaged file and what is wrong with it, a changed configuration
is refused with the difference; ``mcpilco export`` never replaces a file unless asked."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from mcpilco_core.learning.learner import load_train_config
from mcpilco_core.learning.runs import RunDirectory, RunError, train
from mcpilco_ros import cli

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(120)


def _fast_config(folder: Path, **changes) -> Path:
    """config/train_tiny.yaml, smaller still (2 trials in a few seconds)."""
    data = yaml.safe_load((REPO / "config" / "train_tiny.yaml").read_text())
    data.update(robot_config=str(REPO / "config" / "pendubot.yaml"), horizon=0.2, particles=8, trial_duration=0.4,
                exploration={"duration": 0.6, "amplitude": 3.0},
                gp={"fit_steps": 3, "fit_points": 30, "max_points": 20},
                optimizer={"max_steps_first": 3, "max_steps": 3, "patience": 3, "smoothing": 0.9},
                policy={"num_basis": 5})
    data.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, Path]:
    """(config file, run directory) of a finished 2-trial run; tests copy the directory before spoiling it."""
    root = tmp_path_factory.mktemp("run")
    config = _fast_config(root / "config")
    train(load_train_config(config), root / "run")
    return config, root / "run"


@pytest.fixture
def run_copy(finished_run, tmp_path) -> tuple[Path, Path]:
    config, run = finished_run
    shutil.copytree(run, tmp_path / "run")
    return config, tmp_path / "run"


# --------------------------------------------------------------------------------------------------
# Item 7: --out never overwrites what is not a run


def _session_like(folder: Path) -> dict[str, bytes]:
    """A session directory's files, an earlier trial's data.npz and a retrain directory's training config."""
    files = {"robot_config.yaml": b"# my session's robot config\n", "session.yaml": b"robot: pendubot\n",
             "train_config.yaml": b"# retrain directory's config\n", "trials/trial_000/data.npz": b"precious"}
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return files


@pytest.mark.parametrize("resume", [False, True])
def test_train_refuses_a_non_empty_directory_that_is_not_a_run(tmp_path, resume):
    out = tmp_path / "session"
    files = _session_like(out)
    config = load_train_config(_fast_config(tmp_path / "config"))
    with pytest.raises(RunError, match=f"{out}.*not empty.*no run.json"):
        train(config, out, resume=resume)
    for name, data in files.items():                  # nothing replaced, nothing added
        assert (out / name).read_bytes() == data
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == sorted(files)


def test_cli_train_into_a_session_directory_exits_2_naming_it(tmp_path, capsys):
    out = tmp_path / "session"
    files = _session_like(out)
    config = _fast_config(tmp_path / "config")
    assert cli.main(["train", "--robot", "pendubot", "--config", str(config), "--out", str(out)]) == 2
    assert str(out) in capsys.readouterr().err
    assert all((out / name).read_bytes() == data for name, data in files.items())


def test_train_accepts_an_empty_or_new_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    config = load_train_config(_fast_config(tmp_path / "config"))
    for out in (tmp_path / "empty", tmp_path / "new" / "run"):
        RunDirectory(out).create(config, resume=False)
        assert (out / "run.json").is_file()


def test_export_never_replaces_a_file_unless_forced(finished_run, tmp_path, capsys):
    _, run = finished_run
    target = tmp_path / "policy.np"
    target.write_bytes(b"an earlier export")
    args = ["export", str(run / "policy.npz"), "--realaigym", str(target)]
    assert cli.main(args) == 2
    assert "exists" in capsys.readouterr().err and target.read_bytes() == b"an earlier export"
    assert cli.main(args + ["--force"]) == 0
    assert target.read_bytes() != b"an earlier export"


# --------------------------------------------------------------------------------------------------
# Item 8: --resume names the damaged file and what is wrong


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _without_key(path: Path, key: str) -> None:
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files if k != key}
    np.savez(path, **arrays)


DAMAGE = {
    "run.json not JSON": ("run.json", lambda p: p.write_text("{not json"), "run.json.*not valid JSON"),
    "run.json a list": ("run.json", lambda p: p.write_text("[1, 2]"), "run.json.*not a JSON object"),
    "run.json empty": ("run.json", lambda p: p.write_bytes(b""), "run.json"),
    "summary truncated": ("trials/trial_001/summary.json", _truncate, "trial_001/summary.json.*not valid JSON"),
    "summary a string": ("trials/trial_000/summary.json", lambda p: p.write_text('"done"'),
                         "trial_000/summary.json.*not a JSON object"),
    "summary bad score": ("trials/trial_000/summary.json", lambda p: p.write_text('{"eval_scores": ["x"]}'),
                          "trial_000/summary.json"),
    "data truncated": ("trials/trial_000/data.npz", _truncate, "trial_000/data.npz"),
    "data garbage": ("trials/trial_001/data.npz", lambda p: p.write_bytes(b"\0" * 100), "trial_001/data.npz"),
    "data without x": ("trials/trial_001/data.npz", lambda p: _without_key(p, "x"), "trial_001/data.npz.*'x'"),
    "policy truncated": ("trials/trial_001/policy.npz", _truncate, "trial_001/policy.npz"),
    "model truncated": ("trials/trial_001/model.npz", _truncate, "trial_001/model.npz"),
    "optimisation without cost": ("trials/trial_001/optimization.npz", lambda p: _without_key(p, "cost"),
                                  "trial_001/optimization.npz.*'cost'"),
    "pool truncated": ("trials/trial_001/disturbance_states.npy", _truncate, "trial_001/disturbance_states.npy"),
    "model missing": ("trials/trial_001/model.npz", lambda p: p.unlink(), "trial_001/model.npz: missing"),
    "policy missing": ("trials/trial_001/policy.npz", lambda p: p.unlink(), "trial_001/policy.npz: missing"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_resume_names_the_damaged_file(run_copy, case):
    config, run = run_copy
    name, spoil, pattern = DAMAGE[case]
    spoil(run / name)
    with pytest.raises(RunError, match=pattern) as error:
        train(load_train_config(config), run, resume=True)
    assert str(run) in str(error.value)


def test_resume_brings_a_stale_robot_time_account_up_to_date(run_copy):
    """Killed between saving trial 1 and accounting for it: run.json says one trial; --resume of the finished run
    (nothing left to train) counts both again, and the run's policy.npz is trial 1's."""
    config, run = run_copy
    meta = json.loads((run / "run.json").read_text())
    full = meta["robot_time_s"]
    meta["robot_time_s"] = {**full, "total": full["per_trial"][0], "per_trial": full["per_trial"][:1]}
    (run / "run.json").write_text(json.dumps(meta))
    (run / "policy.npz").unlink()
    train(load_train_config(config), run, resume=True)
    assert json.loads((run / "run.json").read_text())["robot_time_s"] == full
    assert (run / "policy.npz").read_bytes() == (run / "trials" / "trial_001" / "policy.npz").read_bytes()


def test_a_damaged_run_json_without_resume_is_refused_as_a_run(run_copy):
    config, run = run_copy
    (run / "run.json").write_text("{not json")
    with pytest.raises(RunError, match="--resume"):
        train(load_train_config(config), run)


def test_cli_resume_of_a_damaged_run_exits_2_naming_the_file(run_copy, capsys):
    config, run = run_copy
    _truncate(run / "trials" / "trial_000" / "data.npz")
    args = ["train", "--robot", "pendubot", "--config", str(config), "--out", str(run), "--resume"]
    assert cli.main(args) == 2
    assert "trial_000/data.npz" in capsys.readouterr().err


def test_resume_with_a_changed_configuration_says_what_changed(run_copy, tmp_path):
    config, run = run_copy
    changed = _fast_config(tmp_path / "changed", particles=12, seed=4)
    with pytest.raises(RunError, match="another configuration") as error:
        train(load_train_config(changed), run, resume=True)
    message = str(error.value)
    assert "particles: 8 -> 12" in message and "seed: 3 -> 4" in message and "horizon" not in message


def test_resume_with_a_changed_robot_config_says_what_changed(run_copy, tmp_path):
    config, run = run_copy
    (tmp_path / "robot").mkdir()
    for name in ("pendubot.yaml", "plant_models.yaml"):
        shutil.copy(REPO / "config" / name, tmp_path / "robot" / name)
    robot = tmp_path / "robot" / "pendubot.yaml"
    robot.write_text(robot.read_text().replace("torque_limit: 6.0", "torque_limit: 4.0")
                     .replace("u_max: 6.0", "u_max: 4.0"))           # the policy's bound may not exceed the limit
    with pytest.raises(RunError, match=r"another robot.*torque_limit: 6\.0 -> 4\.0") as error:
        train(load_train_config(config, robot_config=robot), run, resume=True)
    assert "u_max: 6.0 -> 4.0" in str(error.value) and "policy_period" not in str(error.value)
    assert json.loads((run / "run.json").read_text())["robot_fingerprint"]      # untouched


def test_a_robot_profile_from_the_command_line_is_kept_in_the_run(tmp_path):
    """``mcpilco train --robot-profile perturbed:2``: the run's train_config.yaml names that robot, so a later
    ``mcpilco select --check`` (or a resume) runs on the robot the run learnt on, not the file's."""
    config = _fast_config(tmp_path / "config")
    out = tmp_path / "run"
    assert cli.main(["train", "--robot", "pendubot", "--config", str(config), "--out", str(out), "--trials", "1",
                     "--robot-profile", "perturbed:2"]) == 0
    text = (out / "train_config.yaml").read_text()
    assert yaml.safe_load(text)["robot_profile"] == "perturbed:2" and "robot_profile perturbed:2 from" in text
    assert RunDirectory(out).load_config().robot_profile == "perturbed:2"
    assert json.loads((out / "run.json").read_text())["config"]["robot_profile"] == "perturbed:2"


def test_a_seed_from_the_command_line_is_kept_in_the_run_and_resume_needs_it(tmp_path, capsys):
    """``mcpilco train --seed N``: the run's train_config.yaml and run.json hold N (self-describing); a --resume
    with another seed is refused naming both, one with the same seed continues."""
    config = _fast_config(tmp_path / "config")                   # seed 3 in the file
    out = tmp_path / "run"
    args = ["train", "--robot", "pendubot", "--config", str(config), "--out", str(out), "--trials", "1"]
    assert cli.main(args + ["--seed", "7"]) == 0
    copied = yaml.safe_load((out / "train_config.yaml").read_text())
    assert copied["seed"] == 7 and "seed 7 from the command line" in (out / "train_config.yaml").read_text()
    assert json.loads((out / "run.json").read_text())["config"]["seed"] == 7
    capsys.readouterr()
    assert cli.main(args + ["--resume", "--trials", "2"]) == 2          # the file's seed 3, not the run's 7
    assert "made with training seed 7, now 3" in capsys.readouterr().err
    assert cli.main(args + ["--resume", "--trials", "2", "--seed", "7"]) == 0
    assert (out / "trials" / "trial_001").is_dir()
    assert cli.main(args + ["--seed", "-1", "--out", str(tmp_path / "other")]) == 2
    # the same file without --seed: copied as it is
    assert cli.main(["train", "--robot", "pendubot", "--config", str(config), "--out", str(tmp_path / "plain"),
                     "--trials", "1"]) == 0
    assert (tmp_path / "plain" / "train_config.yaml").read_text() == config.read_text()


def test_cli_train_refuses_fewer_than_one_trial(tmp_path, capsys):
    args = ["train", "--robot", "pendubot", "--config", str(_fast_config(tmp_path / "config")), "--out",
            str(tmp_path / "run")]
    for trials in ("0", "-1"):
        assert cli.main(args + ["--trials", trials]) == 2
        assert "--trials must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()          # nothing written


def test_resume_knows_the_robot_profile_by_its_contents_not_its_path(tmp_path, monkeypatch):
    """Given as a relative path, then as the absolute one: the same robot, resumed. Edited in place (same path):
    another robot, refused, saying so."""
    config = _fast_config(tmp_path / "config")
    profile = tmp_path / "robots" / "noisy.yaml"
    profile.parent.mkdir()
    profile.write_text("description: a noisy robot\nmeasurement_noise: [0, 0, 0.05, 0.05]\n")
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    train(replace(load_train_config(config, robot_profile="robots/noisy.yaml"), trials=1), run)
    train(replace(load_train_config(config, robot_profile=str(profile)), trials=2), run, resume=True)
    assert len(list((run / "trials").iterdir())) == 2
    profile.write_text("description: a noisy robot\nmeasurement_noise: [0, 0, 0.05, 0.05]\ndelay: 0.03\n")
    with pytest.raises(RunError, match="its contents changed"):
        train(replace(load_train_config(config, robot_profile=str(profile)), trials=3), run, resume=True)
