"""Retraining from recorded trial bags (mcpilco retrain): real learner, tiny configuration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_trials import DT_NS, T0, joint_state, write_stream

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


def test_retrain_learns_from_the_actuated_joints_torque_and_the_trials_recordings(tmp_path, pendubot_config,
                                                                                   tiny_config, monkeypatch):
    """What the learner is handed before it fits: the sessions' transitions with the actuated joint's torque (the
    shoulder on the pendubot; the elbow's is 0) and every trial at the state rate."""
    from mcpilco_core.learning import retrain as retrain_module
    from mcpilco_core.learning.learner import load_train_config

    simulated_session(tmp_path / "s", pendubot_config)
    seen = {}

    def capture(learner, trial_index):  # noqa: ANN001, ANN202
        seen.update(data=learner.data, recordings=learner.recordings)
        raise RuntimeError("captured")

    monkeypatch.setattr(retrain_module, "optimize_policy_from_data", capture)
    with pytest.raises(RuntimeError, match="captured"):
        retrain_module.retrain(load_train_config(tiny_config), [tmp_path / "s"], tmp_path / "run")
    loaded = recording.load_sessions([tmp_path / "s"], pendubot_config)
    expected = loaded.transitions(pendubot_config.actuated_joint)
    assert len(seen["data"]) == len(expected) == 100 and np.abs(expected.u).max() > 0.5
    for name in ("x", "u", "x_next", "u_prev"):
        np.testing.assert_array_equal(getattr(seen["data"], name), getattr(expected, name))
    assert len(seen["recordings"]) == 2


def test_retrain_refuses_without_usable_trials(tmp_path, tiny_config, capsys):
    (tmp_path / "empty").mkdir()
    code = retrain_main(["retrain", "--sessions", str(tmp_path / "empty"), "--out", str(tmp_path / "run"),
                         "--config", str(tiny_config)])
    assert code == 2 and "usable transitions" in capsys.readouterr().err


def _bad_trial(session: recording.SessionDirectory, config, seed: int, spoil) -> None:
    """A simulated trial of the session in which ``spoil(x, stamps)`` changed some states or stamps."""
    traj = run_on_robot(config, ExplorationController(config, 3.0, np.random.default_rng(seed)), np.zeros(4), 1.0)
    x, applied = traj.x.copy(), np.vstack([np.zeros((1, 2)), traj.u])
    stamps = T0 + np.arange(len(x)) * DT_NS
    spoil(x, stamps)
    recorder = session.start_trial("none")
    for k in range(len(x)):
        recorder.write(recording.STATE_TOPIC, joint_state(int(stamps[k]), x[k, :2], x[k, 2:], applied[k]),
                       T0 + k * DT_NS)
        if k < len(traj.u_cmd):
            recorder.write(recording.COMMAND_TOPIC, joint_state(int(stamps[k]), effort=traj.u_cmd[k], frame="policy"),
                           T0 + k * DT_NS + 1000)
    session.finish_trial(recorder)


def test_bags_with_nan_inf_huge_values_or_a_zero_stamp_never_stop_retraining(tmp_path, pendubot_config,
                                                                             tiny_config, capsys):
    """Issue 13 item 4: each of these once stopped ``mcpilco retrain`` (Cholesky failure, 633 GiB grid)."""
    session = simulated_session(tmp_path / "s", pendubot_config, seeds=(1,))
    _bad_trial(session, pendubot_config, 2, lambda x, t: x.__setitem__((100, 2), np.nan))
    _bad_trial(session, pendubot_config, 3, lambda x, t: x.__setitem__((200, 0), np.inf))
    _bad_trial(session, pendubot_config, 4, lambda x, t: x.__setitem__((300, 3), 1e200))
    _bad_trial(session, pendubot_config, 5, lambda x, t: t.__setitem__(250, 0))
    _bad_trial(session, pendubot_config, 6, lambda x, t: x.__setitem__((slice(None), 1), np.nan))   # nothing left
    out = tmp_path / "run"
    args = ["retrain", "--sessions", str(session.root), "--out", str(out), "--config", str(tiny_config), "--json"]
    assert retrain_main(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["trials"] == 5 and 5 * 48 <= result["transitions"] < 5 * 50
    assert len(result["skipped"]) == 1 and "trial_005" in result["skipped"][0]
    assert "0 usable joint_states" in result["skipped"][0]
    notes = {Path(source).name: text for source, text in result["notes"].items()}
    assert sorted(notes) == ["trial_001", "trial_002", "trial_003", "trial_004"]
    assert "1 joint_states sample(s) with non-finite or absurd values" in notes["trial_001"][0]
    assert "1 joint_states sample(s) stamped out of order" in notes["trial_004"][0]
    assert "trial_004" in (out / "log.txt").read_text()
    assert np.isfinite(load_policy(result["policy"], robot="pendubot").weights).all()


def test_retrain_refuses_a_run_or_session_directory_and_names_a_damaged_history(tmp_path, pendubot_config,
                                                                                tiny_config, capsys):
    session = simulated_session(tmp_path / "s", pendubot_config, seeds=(1,))
    before = sorted(p.name for p in session.root.iterdir())
    for out in (session.root, tmp_path / "run"):
        if out.name == "run":
            out.mkdir()
            (out / "run.json").write_text("{}")
        code = retrain_main(["retrain", "--sessions", str(session.root), "--out", str(out), "--config",
                             str(tiny_config)])
        assert code == 2 and f"{out} is a" in capsys.readouterr().err
    assert sorted(p.name for p in session.root.iterdir()) == before
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "retrain.json").write_text("{damaged")
    code = retrain_main(["retrain", "--sessions", str(session.root), "--out", str(tmp_path / "r"), "--config",
                         str(tiny_config)])
    assert code == 2 and "retrain.json: damaged" in capsys.readouterr().err


def test_a_session_output_is_ranked_on_its_newest_model_and_its_config_copy_loads_on_its_own(
        tmp_path, pendubot_config, tiny_config, capsys, monkeypatch):
    """``mcpilco select`` on a ``mcpilco session`` output (retrain/ + session/): every retrain's policy on the
    newest model, no robot time; the retrain directory's copy of a training file with ``base`` loads on its own."""
    from mcpilco_core.learning.learner import load_train_config
    from mcpilco_core.learning.selection import RobotCheck, select_policy
    from mcpilco_ros import cli

    derived = tmp_path / "derived.yaml"
    derived.write_text(f"base: {tiny_config}\n"
                       "initial_state: {disturbance_fraction: 0.5, disturbance_seeds: [1000]}\n")
    out = tmp_path / "out"
    simulated_session(out / "session", pendubot_config)
    args = ["retrain", "--sessions", str(out / "session"), "--out", str(out / "retrain"), "--config", str(derived)]
    assert retrain_main(args) == 0 and retrain_main(args + ["--warm-start"]) == 0
    copy = load_train_config(out / "retrain" / "train_config.yaml")
    assert copy.initial_state.disturbance_fraction == 0.5 and copy.robot.robot == "pendubot"
    from mcpilco_core.learning import retrain as retrain_module

    grown, real = [], retrain_module.trial_pool_states
    monkeypatch.setattr(retrain_module, "trial_pool_states",
                        lambda *args, **kwargs: grown.append(args) or real(*args, **kwargs))
    selection = select_policy(out, particles=16, horizon=0.2)
    assert sorted(selection.costs) == [1, 2] and selection.model_trial == 2
    # the particles start from the pool a retrain grows, over every trial of the session (as the offline run's)
    assert len(grown) == 1 and len(grown[0][1]) == 2 and set(grown[0][2]) >= {Path(f).stem.rsplit("_", 1)[-1]
                                                                                  for f in selection.files.values()}
    assert Path(selection.files[selection.best]).parent == out / "retrain" / "policies"
    capsys.readouterr()
    exported = tmp_path / "chosen.npz"
    assert cli.main(["select", str(out), "--particles", "16", "--horizon", "0.2", "--export", str(exported)]) == 0
    assert exported.read_bytes() == Path(selection.files[selection.best]).read_bytes()
    assert json.loads((out / "selection.json").read_text())["selected_trial"] == selection.best
    checked = select_policy(out, particles=16, horizon=0.2, check=RobotCheck(1, 0.5, 3, "hardware_proxy"))
    assert list(checked.check_scores) == checked.ranked()[:1] and checked.robot_time == 0.5
    assert checked.best == checked.ranked()[0] and checked.check.profile == "hardware_proxy"


def test_select_identify_and_polish_read_a_trainers_retrain_directory_and_the_sessions_it_names(
        tmp_path, pendubot_config, tiny_config, capsys, monkeypatch):
    """On the robot the trainer's ``run_dir`` and ``session_dir`` are two folders of the team's choosing (and
    ``mcpilco retrain --sessions A B`` reads several days): select, identify and polish take the retrain directory
    and read every session its newest retrain read, named in retrain.json (absolute; an older relative name from
    where the retrain ran). A session that is gone is named in the error. ``select --check`` on such a directory
    needs the simulated robot named: its trials may come from a real one."""
    from mcpilco_core.learning.polish import load_source
    from mcpilco_core.learning.retrain import RetrainError, session_learning
    from mcpilco_core.learning.runs import run_state_recordings
    from mcpilco_core.learning.selection import newest_session, select_policy
    from mcpilco_ros import cli

    day1 = simulated_session(tmp_path / "sessions" / "day1", pendubot_config, seeds=(1,)).root
    day2 = simulated_session(tmp_path / "sessions" / "day2", pendubot_config, seeds=(2, 3)).root
    run = tmp_path / "runs" / "hw"
    derived = tmp_path / "derived.yaml"
    derived.write_text(f"base: {tiny_config}\n"
                       "initial_state: {disturbance_fraction: 0.5, disturbance_seeds: [1000]}\n")
    monkeypatch.chdir(tmp_path)                 # the retrain is given relative paths, as a team's launch would
    base = ["retrain", "--out", "runs/hw", "--config", str(derived)]
    assert retrain_main(base + ["--sessions", "sessions/day1"]) == 0
    assert retrain_main(base + ["--sessions", "sessions/day1", "sessions/day2", "--warm-start"]) == 0
    history = json.loads((run / "retrain.json").read_text())["retrains"]
    assert history[-1]["sessions"] == [str(day1.resolve()), str(day2.resolve())]
    assert session_learning(run).sessions == (day1.resolve(), day2.resolve()) and session_learning(run).retrain == run
    assert session_learning(tmp_path / "sessions") is None                     # neither layout

    assert len(newest_session(run).trials) == 3                                  # both days, in order
    config, recordings = run_state_recordings(run)
    assert len(recordings) == 3 and config.robot.robot == "pendubot"
    selection = select_policy(run, particles=16, horizon=0.2)
    assert sorted(selection.costs) == [1, 2]
    capsys.readouterr()
    assert cli.main(["select", str(run), "--particles", "16", "--horizon", "0.2"]) == 0
    # the check would run on a simulated robot: on a trainer's directory only when the user names that robot
    assert cli.main(["select", str(run), "--particles", "16", "--horizon", "0.2", "--check", "1"]) == 2
    assert "--check runs the protocol on a simulated one" in capsys.readouterr().err
    assert cli.main(["select", str(run), "--particles", "16", "--horizon", "0.2", "--check", "1",
                     "--check-seconds", "0.5", "--robot-profile", "nominal"]) == 0
    assert json.loads((run / "selection.json").read_text())["robot_checks"][0]["robot_profile"] == "nominal"
    assert cli.main(["select", str(run), "--particles", "16", "--horizon", "0.2"]) == 0
    source = load_source(run)                   # the choice selection.json records, the newest model
    assert source.policy_file == Path(selection.files[selection.best]) and source.next_trial == 3
    assert cli.main(["identify", str(run), "--trials", "0"]) == 0
    assert "1 trial(s)" in capsys.readouterr().out
    # what the GP learnt, held out (benchmarks/bench_model_error.py): retrain 0 (fitted on day 1's one trial) on
    # the next trial, day 2's first; retrain 1 read all three, so nothing is held out for it yet
    from _bench_helpers import load_benchmark

    bench = load_benchmark("bench_model_error")
    (row,) = bench.run_errors(run)
    assert row["trial"] == 1 and row["n"] == 50 and all(np.isfinite(row[k]) for k in row)
    errors = bench.last_model_errors(run, [run])          # the newest model on the data it was fitted on
    assert errors["n"] == 150 and errors["learned"][0] < errors["prior"][0]

    # a retrain.json of before 2026-12-01 named its sessions as given: found from where the retrain ran
    old = json.loads((run / "retrain.json").read_text())
    old["retrains"][-1]["sessions"] = ["sessions/day1", "sessions/day2"]
    (run / "retrain.json").write_text(json.dumps(old))
    assert session_learning(run).sessions == (Path("sessions/day1"), Path("sessions/day2"))
    monkeypatch.chdir(run)                      # ... or beside the run: runs/sessions/day1 is not there
    with pytest.raises(RetrainError, match="read the session sessions/day1, which is not there"):
        session_learning(run)
    assert cli.main(["select", str(run), "--particles", "16", "--horizon", "0.2"]) == 2
    assert cli.main(["identify", str(run)]) == 2
    assert cli.main(["polish", str(run), "--steps", "1"]) == 2
    assert capsys.readouterr().err.count("which is not there") == 3


def test_retrain_grows_the_particles_pool_trial_by_trial_as_the_offline_learner(repo, tmp_path):
    """Each trial adds what its window handed over, then the post-disturbance states its policy meets on the
    learner's model (pool_seeds_per_trial seeds), found by the trial's policy version; a trial whose policy file
    is not at hand adds only its recorded states, and the log says which."""
    from dataclasses import dataclass, replace

    from mcpilco_core.control import build_controller
    from mcpilco_core.learning.learner import load_train_config, post_disturbance_states
    from mcpilco_core.learning.retrain import policy_files, trial_pool_states

    @dataclass
    class Trial:                        # what trial_pool_states reads of a recording.TrialData
        source: str
        policy_version: str
        handed: np.ndarray

        def handed_over_states(self) -> np.ndarray:
            return self.handed

    config = load_train_config(repo / "config" / "train_tiny.yaml", "pendubot")
    config = replace(config, initial_state=replace(config.initial_state, disturbance_fraction=0.5,
                                                   disturbance_seeds=(1000, 1001), pool_seeds_per_trial=1))
    policy = load_policy(repo / "policies" / "pendubot.npz", robot="pendubot")
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / f"policy_000_{policy.version()}.npz").write_bytes((repo / "policies" / "pendubot.npz").read_bytes())
    handed = np.full((1, 4), 0.25)
    trials = [Trial("trial_000", "none", np.zeros((0, 4))), Trial("trial_001", policy.version(), handed),
              Trial("trial_002", "0123456789ab", handed + 1.0)]
    said: list[str] = []
    pool = trial_pool_states(config, trials, policy_files(folder), said.append)
    simulated, _ = post_disturbance_states(build_controller(config.robot, policy), config.model_robot, (1000,))
    assert len(simulated) > 5
    np.testing.assert_array_equal(pool, np.concatenate([handed, simulated, handed + 1.0]))
    assert len(said) == 1 and "trial_002" in said[0] and "0123456789ab" in said[0]
    without = replace(config, initial_state=replace(config.initial_state, pool_seeds_per_trial=0))
    np.testing.assert_array_equal(trial_pool_states(without, trials, policy_files(folder)),
                                  np.concatenate([handed, handed + 1.0]))


def test_retrain_keeps_the_best_judged_snapshot_and_says_so(tmp_path, pendubot_config, tiny_config, capsys):
    """optimizer.snapshot_every in a retrain (what a session runs): the exported policy is the best-judged snapshot
    and retrain.json records every snapshot's score."""
    data = yaml.safe_load(tiny_config.read_text())
    data["optimizer"].update(snapshot_every=2, snapshot_seeds=[3000], snapshot_seconds=2.0)
    tiny_config.write_text(yaml.safe_dump(data))
    session = simulated_session(tmp_path / "s", pendubot_config)
    out = tmp_path / "run"
    assert retrain_main(["retrain", "--sessions", str(session.root), "--out", str(out), "--config",
                         str(tiny_config), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    steps = [step for step, _ in result["snapshots"]]
    assert steps == [0, 2, 4, 5] and result["kept_step"] in steps
    assert dict(result["snapshots"])[result["kept_step"]] == max(score for _, score in result["snapshots"])
    assert result["timings_s"]["snapshot_judge"] > 0
    history = json.loads((out / "retrain.json").read_text())
    assert history["retrains"][0]["kept_step"] == result["kept_step"]


def test_retrain_identifies_the_robot_from_the_bags_and_records_it(tmp_path, pendubot_config, tiny_config, capsys):
    """gp.identify_robot in a retrain (what a session runs): the robot behind real bags of a hardware-proxy robot
    (measured states, the driver's effort, the controller's commands), in retrain.json, the log and the model."""
    data = yaml.safe_load(tiny_config.read_text())
    data["gp"]["identify_robot"] = True
    tiny_config.write_text(yaml.safe_dump(data))
    session = recording.SessionDirectory.create(tmp_path / "s", pendubot_config)
    for seed in (1, 2):
        explorer = ExplorationController(pendubot_config, 3.0, np.random.default_rng(seed))
        traj = run_on_robot(pendubot_config, explorer, np.zeros(4), 1.5, "hardware_proxy", seed)
        recorder = session.start_trial("none")
        write_stream(recorder, traj.extras["x_measured"], np.vstack([np.zeros((1, 2)), traj.u]), traj.u_cmd,
                     ["policy"] * len(traj.u))
        session.finish_trial(recorder)
    out = tmp_path / "run"
    assert retrain_main(["retrain", "--sessions", str(session.root), "--out", str(out), "--config",
                         str(tiny_config), "--json"]) == 0
    robot = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["identified_robot"]
    assert robot["delay_steps"] == 2 and robot["motor_responsiveness"] == pytest.approx(0.9, abs=0.01)
    assert robot["cf"] == pytest.approx([0.16, 0.12], rel=0.1)
    assert json.loads((out / "retrain.json").read_text())["retrains"][0]["identified_robot"] == robot
    assert "identified robot" in (out / "log.txt").read_text()
    with np.load(out / "models" / "model_000.npz") as arrays:
        assert arrays["robot_sensors_motors"][0] == 2
    # what the delay does to a 20 ms step, on the retrain directory's bags (benchmarks/bench_transition_delay.py):
    # the identified robot with its delay explains the recorded steps far better than the torque-held prior
    from _bench_helpers import load_benchmark

    assert load_benchmark("bench_transition_delay").main([str(out)]) == 0
    rows = {line.split(" | ")[0].strip("| "): [float(v) for v in line.strip(" |\n").split(" | ")[1:]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| the ")}
    held, delayed = rows["the identified robot's plant, torque held"], rows[
        "the identified robot, previous command for its 2 delay steps, r 0.90"]
    assert delayed[0] < 0.7 * held[0] and delayed[1] < 0.7 * held[1]


def test_a_diverging_retrain_still_exports_the_warm_start_policy_and_says_so(tmp_path, pendubot_config, tiny_config,
                                                                             capsys, monkeypatch):
    """The particles escape at every step of the second retrain (what ended a full-size acrobot session at trial 9):
    it rolls back, stops as diverged and exports the policy it started from, so a session goes on."""
    from mcpilco_core.learning import optimizer
    from mcpilco_core.learning.model import NonFiniteParticlesError

    session = simulated_session(tmp_path / "s", pendubot_config)
    out = tmp_path / "run"
    args = ["retrain", "--sessions", str(session.root), "--out", str(out), "--config", str(tiny_config), "--json"]
    assert retrain_main(args) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    def escaped(*args, **kwargs):
        raise NonFiniteParticlesError("3 non-finite particle states; first at step 2 (1 of 8 particles)")

    monkeypatch.setattr(optimizer, "rollout", escaped)
    data = yaml.safe_load(tiny_config.read_text())
    data["optimizer"].update(max_steps=200)            # room for the rollbacks
    tiny_config.write_text(yaml.safe_dump(data))
    assert retrain_main(args + ["--warm-start"]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["stop_reason"].startswith("diverged") and len(second["optimization_rollbacks"]) == 4
    started, exported = load_policy(first["policy"], robot="pendubot"), load_policy(second["policy"], robot="pendubot")
    x = np.random.default_rng(0).normal(size=(20, 4))
    np.testing.assert_array_equal(exported(x), started(x))
    assert json.loads((out / "retrain.json").read_text())["retrains"][1]["stop_reason"] == second["stop_reason"]
    assert "rolled back 4 time(s)" in (out / "log.txt").read_text()
