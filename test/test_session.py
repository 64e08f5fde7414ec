"""``mcpilco session --sim``: the whole hardware loop over ROS (simulated robot, controller, trainer as processes),
with the tiny training configuration: trial 0 explores, the trainer records, retrains, hot-reloads, trial 1 runs
the new policy, and the session ends with the learning curve and the final score. Also: Ctrl-C stops every node,
and the CLI registers the command without importing rclpy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("rclpy")
from _ros_helpers import REPO, ros_env, wait_for  # noqa: E402

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.evaluation import ControllerSpec, evaluate_seeds  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402
from mcpilco_core.recording import load_trial  # noqa: E402
from mcpilco_ros.sim_session import SessionOptions, SimSession  # noqa: E402

TINY = REPO / "config" / "train_tiny.yaml"

pytestmark = pytest.mark.timeout(110)


def test_two_trial_session_explores_records_retrains_reloads_and_scores(tmp_path):
    out = tmp_path / "run"
    session = SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=out, trials=2, eval_seeds=(100,),
                                     eval_duration=60.0, quiet=True))
    result = session.run()
    assert session.nodes.procs == {} and all(p.poll() is not None for p in session.nodes.started)
    assert len(session.nodes.started) == 4   # controller, trainer, one simulated robot per trial

    config = load_robot_config(REPO / "config" / "pendubot.yaml")
    explore, learned = (load_trial(out / "session" / f"trial_{k:03d}", config) for k in (0, 1))
    # trial 0: exploration torques on the shoulder only, within the training config's amplitude (3 N m)
    assert set(explore.mode) == {"explore"} and explore.policy_version == "none"
    assert np.all(explore.u[:, 1] == 0.0) and 2.0 < np.abs(explore.u[:, 0]).max() <= 3.0
    assert len(explore) == 100 and explore.valid.all()   # 2 s at 20 ms, the final state too: as offline
    # the very trial the offline learner runs for the same training config (same torques, same states, same length)
    from mcpilco_core.learning.learner import Learner, load_train_config

    offline = Learner(load_train_config(TINY)).exploration_trial().trajectory
    np.testing.assert_allclose(explore.x, offline.extras["x_measured"][::10], rtol=0, atol=1e-9)
    np.testing.assert_allclose(explore.u[:, 0], offline.u[::10, 0][:len(explore.u)], rtol=0, atol=1e-9)
    # trial 1: the retrained policy, hot-reloaded into the running controller
    retrains = json.loads((out / "retrain" / "retrain.json").read_text())["retrains"]
    assert len(retrains) == 1 and retrains[0]["trials"] == 1
    version = retrains[0]["policy_version"]
    assert set(learned.mode) <= {"policy", "lqr", "damping"} and "policy" in set(learned.mode)
    assert learned.policy_version == version and np.all(learned.u[:, 1] == 0.0)
    info = yaml.safe_load((out / "session" / "session.yaml").read_text())
    assert [t["status"] for t in info["trials"]] == ["complete", "complete"]

    assert [row["trial"] for row in result["trials"]] == [0, 1]
    # the final score is the whole protocol's on the final policy (seed 100, 60 s: under a second), not just any
    # number in [0, 1]; it depends on the policy (no controller at all scores 811 steps of 2 ms on that seed)
    robot_file = str(REPO / "config" / "pendubot.yaml")
    evaluated = evaluate_seeds(ControllerSpec(robot_file, str(out / "policy.npz")), [100])[0].score
    assert result["trials"][0]["eval_score"] is None and result["final_scores"] == [evaluated]
    assert result["final_score"] == evaluated == result["trials"][1]["eval_score"]
    no_controller = evaluate_seeds(ControllerSpec(robot_file, "zero"), [100])[0].score
    assert no_controller == pytest.approx(811 * 0.002 / 60.0, abs=1e-12) and evaluated != no_controller
    assert result["final_policy_version"] == version == load_policy(out / "policy.npz").version()
    assert all(0.0 < row["cost"] < 1.0 for row in result["trials"])
    assert (out / "learning_curve.png").stat().st_size > 10_000
    assert json.loads((out / "session.json").read_text())["final_score"] == result["final_score"]
    assert result["friction_compensation"] is False          # the opt-in is reported in session.json too
    # mcpilco polish reads a session as it reads a run: the newest retrain's model and policy, no robot time
    from mcpilco_core.learning.polish import PolishSettings, load_source, polish

    source = load_source(out)
    assert source.policy_file == sorted((out / "retrain" / "policies").glob("policy_*.npz"))[-1]
    assert source.next_trial == 2 and source.model_from == "model_000.npz"
    polished = polish(source, PolishSettings(steps=3, particles=8, snapshot_every=0), out / "polish", progress=False)
    assert polished.optimization.steps == 3
    assert json.loads((out / "polish" / "polish.json").read_text())["robot_time_s"] == 0.0
    # --policy-period refits a session's model on its bags' trials cut at the new period (twice the transitions)
    from mcpilco_core.learning.polish import at_policy_period
    from mcpilco_core.learning.runs import run_transitions

    faster = at_policy_period(out, source, 0.01)
    assert faster.model.period == 0.01 and faster.config.robot.policy_period == 0.01
    assert 1.8 * len(run_transitions(out, source.config)) <= len(run_transitions(out, faster.config))


@pytest.mark.timeout(600)
def test_a_session_and_an_offline_run_with_the_same_settings_are_the_same_computation(tmp_path):
    """Over ROS (bags, a retrain per trial in the trainer's process) and offline, on the hardware-proxy acrobot
    with disturbance trials, identification, the state-rate robot and the delay-aware model, and an exploration
    fast enough for the supervisor's damping to take over: every trial's states and torques, every model and every
    policy agree bit for bit, so "offline lands near the session" holds exactly."""
    from mcpilco_core.learning.runs import RunDirectory

    config = tmp_path / "proxy_tiny.yaml"
    config.write_text(yaml.safe_dump({
        "base": str(TINY), "robot_config": str(REPO / "config" / "acrobot_dither.yaml"), "seed": 1,
        "robot_profile": "hardware_proxy", "trials": 3, "exploration": {"duration": 2.0, "amplitude": 6.0},
        "initial_state": {"k_m": 5, "K": 10, "disturbance_trial_from": 1, "pool_seeds_per_trial": 1},
        "gp": {"identify": True, "identify_robot": True, "delay_aware": True}}))
    offline = tmp_path / "offline"
    train = subprocess.Popen([sys.executable, "-m", "mcpilco_ros.cli", "train", "--robot", "acrobot", "--config",
                              str(config), "--out", str(offline)], env=ros_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)   # beside the session: its nodes mostly wait
    out = tmp_path / "session"
    try:
        SimSession(SessionOptions(robot="acrobot", train_config=config, out=out, trials=3, eval_seeds=(100,),
                                  eval_duration=1.0, quiet=True)).run()
        output = train.communicate(timeout=300)[0]
    finally:
        if train.poll() is None:
            train.kill()
            train.wait()
    assert train.returncode == 0, output

    run = RunDirectory(offline)
    policies = sorted((out / "retrain" / "policies").glob("policy_*.npz"))
    models = sorted((out / "retrain" / "models").glob("model_*.npz"))
    assert len(policies) == len(models) == 2
    for k in range(3):
        recorded = np.load(out / "trials" / f"trial_{k:03d}.npz")
        simulated = np.load(run.root / "trials" / f"trial_{k:03d}" / "data.npz")
        for name in ("x", "x_measured", "u", "u_cmd"):
            assert np.array_equal(recorded[name], simulated[name]), (k, name)
    assert (np.load(out / "trials" / "trial_001.npz")["mode"] == 5).sum() == 100   # trial 1 began with a window
    assert (np.load(out / "trials" / "trial_000.npz")["mode"] == 2).sum() > 0      # the damping cut in on trial 0
    for k, (model, policy) in enumerate(zip(models, policies), start=1):
        offline_model = np.load(run.root / "trials" / f"trial_{k:03d}" / "model.npz")
        session_model = np.load(model)
        assert sorted(offline_model.files) == sorted(session_model.files)
        for name in offline_model.files:
            assert np.array_equal(offline_model[name], session_model[name]), (k, name)
        offline_policy, session_policy = np.load(run.root / "trials" / f"trial_{k:03d}" / "policy.npz"), np.load(policy)
        for name in ("centers", "log_lengthscales", "weights"):
            assert np.array_equal(offline_policy[name], session_policy[name]), (k, name)
    assert load_policy(out / "policy.npz").version() == load_policy(offline / "policy.npz").version()


def node_processes_of(out: Path) -> list[int]:
    """PIDs of live processes started with a params file under ``out`` (the session's node processes)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if str(out) in cmdline and "--params-file" in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_the_session_stops_every_node(tmp_path, sig):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mcpilco_ros.sim_session", "--sim", "--config", str(TINY), "--trials", "2",
           "--out", str(out)]
    proc = subprocess.Popen(cmd, env=ros_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "trial 0/1" in line:   # controller and trainer up, the simulated robot starting
                break
        assert node_processes_of(out), "no node process found while the session runs"
        proc.send_signal(sig)
        output = proc.communicate(timeout=60)[0]
        assert proc.returncode == 130, output
        assert "interrupted" in output
        aborted = json.loads((out / "session.json").read_text())     # the robot time spent is still counted
        assert aborted["status"] == "aborted" and "KeyboardInterrupt" in aborted["reason"]
        assert aborted["trials"] == [] and aborted["unfinished_trial"] == 0 and aborted["robot_time_s"] >= 0.0
        wait_for(lambda: not node_processes_of(out), 10, f"every node process ended ({node_processes_of(out)}): "
                 f"{output}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in node_processes_of(out):   # only if the test failed: never leave nodes behind
            os.kill(pid, signal.SIGKILL)


def test_cli_registers_session_without_importing_rclpy():
    code = ("import sys; from mcpilco_ros.cli import build_parser; "
            "build_parser().parse_args(['session', '--sim', '--out', 'x', '--trials', '2']); "
            "assert 'rclpy' not in sys.modules, 'rclpy imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_refuses_an_existing_session_and_too_few_trials(tmp_path):
    (tmp_path / "run" / "session").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds a session already"):
        SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path / "run", trials=2))
    with pytest.raises(ValueError, match="at least 2"):
        SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path / "new", trials=1))


def test_the_bag_closes_after_the_trainer_recorded_the_final_state_or_after_a_warning(tmp_path, monkeypatch):
    """The simulated robot exits once the controller answered its final state; the trainer may receive that
    state later. The session waits for the trainer's newest state stamp to reach the record's final stamp, and
    closes the bag without it (a warning, the trial kept) if it never comes."""
    from mcpilco_ros import sim_session
    from mcpilco_ros.sim_session import RosClient

    class Nodes:
        def check_alive(self, watched) -> None:
            pass

    monkeypatch.setattr(sim_session, "FINAL_STATE_TIMEOUT", 0.2)
    ros = RosClient.__new__(RosClient)
    ros.nodes, ros.watched, ros.status = Nodes(), (), {}
    session, said = SimSession.__new__(SimSession), []
    session.ros, session.say = ros, said.append
    record = tmp_path / "trial.npz"
    np.savez(record, u=np.zeros((100, 2)), final_state_stamp_ns=2_000_000_000)
    ros.status["trainer_node"] = {"last_state_stamp_ns": "2000000000"}
    session._wait_for_final_state(record, 0)
    assert said == []
    ros.status["trainer_node"] = {"last_state_stamp_ns": "1998000000"}
    started = time.monotonic()
    session._wait_for_final_state(record, 3)
    assert time.monotonic() - started >= 0.2
    assert len(said) == 1 and "trial 3's final state: not reached within 0.2 s" in said[0]
    assert "closed without" in said[0]
    np.savez(record, u=np.zeros((100, 2)), final_state_stamp_ns=-1)        # none published: nothing to wait for
    session._wait_for_final_state(record, 4)
    assert len(said) == 1


def test_an_unfinished_trial_without_its_record_counts_the_span_of_its_bag(tmp_path):
    """The simulated robot died before writing its record file: the trial's robot time is the span of the states
    its bag holds (0.5 s here), the bag closed by the trainer's shutdown or left partial by a trainer that died too."""
    from test_trials import joint_state

    from mcpilco_core import recording

    session = SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path / "run", trials=3,
                                        quiet=True))
    assert session._robot_time_of_unfinished_trial(1) is None                 # nothing says
    for k in (1, 2):
        recorder = recording.TrialRecorder(session.out / "session" / f"trial_{k:03d}", flush_period=0.0)
        for j in range(251):
            ns = 1_700_000_000_000_000_000 + j * 2_000_000
            recorder.write(recording.STATE_TOPIC, joint_state(ns, (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)), ns + 10**9)
        if k == 1:
            recorder.close()
    assert session._robot_time_of_unfinished_trial(1) == pytest.approx(0.5)   # the closed bag
    assert session._robot_time_of_unfinished_trial(2) == pytest.approx(0.5)   # the partial one
    recorder.close()


def test_a_session_that_fails_mid_way_still_counts_its_robot_time(tmp_path, monkeypatch):
    """Trial 0 ran (3 s), trial 1's simulated robot died after writing 0.5 s of its record: session.json says
    "aborted", why, and counts 3.5 s."""
    from mcpilco_ros import sim_session

    session = SimSession(SessionOptions(robot="pendubot", train_config=TINY, out=tmp_path / "run", trials=3,
                                        quiet=True))

    def run_trial(k, policy, version):  # noqa: ANN001, ANN202
        if k == 1:
            (session.out / "trials").mkdir(parents=True, exist_ok=True)
            np.savez(session.out / "trials" / "trial_001.npz", u=np.zeros((250, 2)))   # 250 steps of 2 ms
            raise sim_session.SessionError("simulated robot of trial 1 ended with code -9")
        return sim_session.TrialRow(k, "explore", "", "none", [0.0] * 4, 3.0, {}, 10, 0.5, 5.0, robot_time_s=3.0)

    class Ros:
        explore = None

        def set_bool(self, *args) -> None:  # noqa: ANN002
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(session, "start_nodes", lambda: setattr(session, "ros", Ros()))
    monkeypatch.setattr(session, "run_trial", run_trial)
    monkeypatch.setattr(session, "start_retrain", lambda k: 0)
    monkeypatch.setattr(session, "finish_retrain", lambda k, before, started: (Path("p.npz"), "v1", {}))
    with pytest.raises(sim_session.SessionError, match="code -9"):
        session.run()
    result = json.loads((session.out / "session.json").read_text())
    assert result["status"] == "aborted" and "code -9" in result["reason"]
    assert [row["trial"] for row in result["trials"]] == [0] and result["unfinished_trial"] == 1
    assert result["robot_time_s"] == pytest.approx(3.5)
    assert result["robot_time_breakdown_s"]["unfinished_trial"] == pytest.approx(0.5)
