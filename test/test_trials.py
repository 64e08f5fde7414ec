"""Trial bags: recording, metadata, crash recovery, corrupt bags, resampling, robot checks (no ROS needed)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from mcpilco_core import recording
from mcpilco_core.config import load_robot_config
from mcpilco_core.recording.salvage import stored_messages
from mcpilco_core.recording.transitions import transitions_from_trajectory

TS = get_typestore(Stores.ROS2_JAZZY)
JS = TS.types["sensor_msgs/msg/JointState"]
HEADER = TS.types["std_msgs/msg/Header"]
TIME = TS.types["builtin_interfaces/msg/Time"]
T0 = 1_700_000_000_000_000_000  # ns
DT_NS = 2_000_000                # 500 Hz


def joint_state(ns: int, q=(), dq=(), effort=(), frame: str = "", names=("shoulder", "elbow")) -> bytes:
    msg = JS(header=HEADER(stamp=TIME(sec=ns // 10**9, nanosec=ns % 10**9), frame_id=frame), name=list(names),
             position=np.asarray(q, float), velocity=np.asarray(dq, float), effort=np.asarray(effort, float))
    return bytes(TS.serialize_cdr(msg, recording.JOINT_STATE_TYPE))


def write_stream(recorder, x: np.ndarray, applied: np.ndarray, commands: np.ndarray, modes, start: int = T0):
    """States x[k] at T0 + k*2 ms with effort applied[k] (torque over the step ending there), commands[k]
    answering state k."""
    for k in range(len(x)):
        ns = start + k * DT_NS
        recorder.write(recording.STATE_TOPIC, joint_state(ns, x[k, :2], x[k, 2:], applied[k]), ns)
        if k < len(commands):
            recorder.write(recording.COMMAND_TOPIC, joint_state(ns, effort=commands[k], frame=modes[k]), ns + 1000)


def simple_trial(n: int = 501, torque: float = 0.5):
    x = np.zeros((n, 4))
    x[:, 0] = np.arange(n) * 0.001
    x[:, 2] = 0.5
    applied = np.zeros((n, 2))
    applied[1:, 0] = torque
    commands = np.zeros((n - 1, 2))
    commands[:, 0] = torque
    return x, applied, commands, ["policy"] * (n - 1)


def record_session(root: Path, config, trials_count: int = 1, **kwargs) -> recording.SessionDirectory:
    session = recording.SessionDirectory.create(root, config)
    for _ in range(trials_count):
        recorder = session.start_trial("v1", **kwargs)
        write_stream(recorder, *simple_trial())
        session.finish_trial(recorder)
    return session


# --------------------------------------------------------------------------------------------------


def test_round_trip_100k_messages(tmp_path, pendubot_config):
    """100k JointState messages (50k states + 50k commands, 100 s at 500 Hz): write and read times."""
    n = 50_000
    messages = []
    for k in range(n):
        ns = T0 + k * DT_NS
        messages.append((recording.STATE_TOPIC, joint_state(ns, (1e-3 * k, 0.0), (0.5, 0.0), (0.25, 0.0)), ns))
        messages.append((recording.COMMAND_TOPIC, joint_state(ns, effort=(0.25, 0.0), frame="policy"), ns))
    start = time.perf_counter()
    recorder = recording.TrialRecorder(tmp_path / "bag")
    for topic, data, ns in messages:
        recorder.write(topic, data, ns)
    recorder.close()
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    trial = recording.load_trial(tmp_path / "bag", pendubot_config)
    read_s = time.perf_counter() - start
    print(f"\n100k messages: write {write_s:.2f} s, read + resample {read_s:.2f} s")
    assert recorder.counts == {"joint_states": n, "joint_commands": n, "diagnostics": 0}
    assert len(trial) == int((n - 1) * 0.002 / 0.02)
    np.testing.assert_allclose(trial.x[:, 0], trial.t * 0.5, atol=1e-9)
    np.testing.assert_allclose(trial.u[:, 0], 0.25)
    assert trial.valid.all() and set(trial.mode) == {"policy"}
    assert write_s < 20 and read_s < 40  # generous: 2 shared cores; benchmarks/bench_bags.py measures


@pytest.mark.parametrize("storage,version", [("mcap", 9), ("mcap", 8), ("sqlite3", 9), ("sqlite3", 8)])
def test_metadata_as_rosbag2_tools_expect(tmp_path, storage, version):
    recorder = recording.TrialRecorder(tmp_path / "bag", storage=storage, version=version,
                                    custom_data={"robot": "pendubot"})
    write_stream(recorder, *simple_trial(11))
    final = recorder.close()
    assert final == tmp_path / "bag" and not (tmp_path / "bag.partial").exists()
    info = yaml.safe_load((final / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert info["version"] == version
    assert info["storage_identifier"] == storage
    for name in info["relative_file_paths"]:
        assert (final / name).is_file()
    assert info["message_count"] == 21
    assert {"duration", "starting_time", "files", "compression_format", "compression_mode"} <= set(info)
    topics = {t["topic_metadata"]["name"]: t for t in info["topics_with_message_count"]}
    assert topics["joint_states"]["message_count"] == 11 and topics["joint_commands"]["message_count"] == 10
    meta = topics["joint_states"]["topic_metadata"]
    assert meta["type"] == "sensor_msgs/msg/JointState" and meta["serialization_format"] == "cdr"
    if version == 9:
        assert meta["type_description_hash"].startswith("RIHS01_")
    assert info["custom_data"]["mcpilco.robot"] == "pendubot"
    with Reader(final) as reader:
        assert reader.message_count == 21
        # the bag's message time is the receive time handed in (ns), as `ros2 bag play` replays it
        stamps = sorted(timestamp for _, timestamp, _ in reader.messages())
    assert stamps == sorted([T0 + k * DT_NS for k in range(11)] + [T0 + k * DT_NS + 1000 for k in range(10)])


def test_recorder_never_overwrites(tmp_path):
    recording.TrialRecorder(tmp_path / "bag").close()
    with pytest.raises(recording.TrialError, match="exists already"):
        recording.TrialRecorder(tmp_path / "bag")


def test_session_yaml_lists_trials(tmp_path, pendubot_config):
    session = record_session(tmp_path / "s", pendubot_config, trials_count=2)
    info = yaml.safe_load((tmp_path / "s" / "session.yaml").read_text())
    assert info["robot"] == "pendubot" and info["config"]["fingerprint"] == pendubot_config.fingerprint()
    assert [t["bag"] for t in info["trials"]] == ["trial_000", "trial_001"]
    assert all(t["status"] == "complete" and t["policy_version"] == "v1" for t in info["trials"])
    assert info["trials"][0]["messages"]["joint_states"] == 501
    assert session.bags() == [tmp_path / "s" / "trial_000", tmp_path / "s" / "trial_001"]
    loaded = recording.load_sessions([tmp_path / "s"], pendubot_config)
    assert [t.policy_version for t in loaded.trials] == ["v1", "v1"]      # in each bag too, for retrain's pool
    # reopening the session directory for another robot is refused (a session is one robot's)
    with pytest.raises(recording.TrialError, match="session of the pendubot, not the acrobot"):
        recording.SessionDirectory.create(tmp_path / "s", load_robot_config(Path(__file__).parent.parent / "config"
                                                                            / "acrobot.yaml"))


CRASH_SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from test_trials import joint_state, T0, DT_NS
    from mcpilco_core.config import load_robot_config
    from mcpilco_core import recording
    session = recording.SessionDirectory.create(Path(sys.argv[1]), load_robot_config(sys.argv[4]))
    recorder = session.start_trial("v2", storage=sys.argv[2], flush_period=0.02)
    k = 0
    while True:
        ns = T0 + k * DT_NS
        recorder.write("joint_states", joint_state(ns, (1e-3 * k, 0.0), (0.5, 0.0), (0.5, 0.0)), ns)
        recorder.write("joint_commands", joint_state(ns, effort=(0.5, 0.0), frame="policy"), ns)
        k += 1
        if k == 1000:
            recorder.flush()
            print("flushed", flush=True)
        if k % 50 == 0:
            time.sleep(0.001)
""")


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_crash_mid_trial_is_recoverable(tmp_path, pendubot_config, repo, storage):
    """SIGKILL the recorder mid-trial: trial 0 stays intact, trial 1 is detected and salvaged."""
    root = tmp_path / "s"
    record_session(root, pendubot_config)
    proc = subprocess.Popen([sys.executable, "-c", CRASH_SCRIPT, str(root), storage, str(repo / "test"),
                             str(repo / "config" / "pendubot.yaml")], stdout=subprocess.PIPE, text=True,
                            cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        assert proc.stdout.readline().strip() == "flushed"
        time.sleep(0.05)  # let it write past the flush: the kill lands mid-chunk
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    session = recording.SessionDirectory.open(root)
    assert session.partial_bags() == [root / "trial_001.partial"]
    loaded = recording.load_sessions([root], pendubot_config)
    assert len(loaded.trials) == 1 and "partial bag" in loaded.problems[0].reason
    assert recording.recover_session(root) == [root / "trial_001"]
    assert (root / "trial_001.crashed").is_dir()  # the original files are kept
    entry = recording.SessionDirectory.open(root).info["trials"][1]
    assert entry["status"] == "recovered" and entry["messages"]["joint_states"] >= 1000
    loaded = recording.load_sessions([root], pendubot_config)
    assert loaded.problems == [] and len(loaded.trials) == 2
    # the salvaged bag says what it is: recovered, and the policy version the trial ran (retrain's pool needs it)
    assert loaded.trials[1].policy_version == "v2"
    assert recording.read_bag(root / "trial_001").custom["recovered"] == "true"
    assert len(loaded.trials[1]) >= 1000 * 0.002 / 0.02 - 1
    np.testing.assert_allclose(loaded.trials[1].u[:, 0], 0.5)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_the_recorder_flushes_on_its_own_so_a_crash_loses_at_most_flush_period(tmp_path, storage):
    """What a crash leaves on disk, without anyone calling flush() (the crash test above flushes by hand): right
    after opening, a valid bag without messages; with flush_period 0, every message written so far."""
    opened = recording.TrialRecorder(tmp_path / "opened", storage=storage, flush_period=1e9)
    shutil.copytree(opened.partial, tmp_path / "opened_crash")           # the files as a crash right now leaves them
    assert list(stored_messages(tmp_path / "opened_crash")) == []      # readable storage, nothing lost yet
    opened.close()
    recorder = recording.TrialRecorder(tmp_path / "bag", storage=storage, flush_period=0.0)
    write_stream(recorder, *simple_trial(21))
    shutil.copytree(recorder.partial, tmp_path / "crash")
    counts = recording.salvage_bag(tmp_path / "crash", tmp_path / "salvaged")
    assert counts == {"joint_commands": 20, "joint_states": 21}
    recorder.close()


def _bag_without_commands(path: Path) -> None:
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        conn = writer.add_connection("joint_states", recording.JOINT_STATE_TYPE, typestore=TS)
        for k in range(20):
            writer.write(conn, T0 + k * DT_NS, joint_state(T0 + k * DT_NS, (0, 0), (0, 0), (0, 0)))


def test_corrupt_truncated_and_incomplete_bags_are_skipped(tmp_path, pendubot_config):
    root = tmp_path / "s"
    record_session(root, pendubot_config, trials_count=4)
    truncated = next((root / "trial_001").glob("*.mcap"))
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    garbage = next((root / "trial_002").glob("*.mcap"))
    garbage.write_bytes(b"not a bag at all" * 100)
    (root / "trial_003" / "metadata.yaml").write_text("rosbag2_bagfile_information: [unclosed")
    _bag_without_commands(root / "trial_004")
    (root / "trial_005").mkdir()
    (root / "trial_005" / "trial_005.mcap").write_bytes(b"")
    result = recording.load_sessions([root, tmp_path / "missing"], pendubot_config)
    assert [Path(t.source).name for t in result.trials] == ["trial_000"]
    reasons = {Path(p.path).name: p.reason for p in result.problems}
    assert set(reasons) == {"trial_001", "trial_002", "trial_003", "trial_004", "trial_005", "missing"}
    assert "unreadable" in reasons["trial_001"] and "unreadable" in reasons["trial_002"]
    assert "missing topic" in reasons["trial_004"] and "joint_commands" in reasons["trial_004"]
    assert "metadata.yaml" in reasons["trial_005"]
    assert all(p.path in str(p) for p in result.problems)


def test_resampling_averages_the_applied_torque(tmp_path, pendubot_config):
    """Torque = time-average of what the driver applied (not the command); gaps and passive torque invalidate."""
    n = 301  # 0.6 s at 500 Hz -> 30 intervals of 20 ms
    x = np.zeros((n, 4))
    x[:, 0] = np.arange(n) * 0.002 * 2.0     # q1 = 2 t
    x[:, 2] = 2.0
    applied = np.zeros((n, 2))
    applied[1:, 0] = np.where((np.arange(1, n) - 1) % 10 < 5, 1.0, 3.0)  # 1 N m then 3 N m in each interval
    applied[121:131, 1] = 2.0                # the disturbance PID pushed the passive joint in interval 12
    commands = np.full((n - 1, 2), [9.0, 0.0])  # asked 9 N m: the driver clipped it; the bag keeps the truth
    modes = ["policy"] * 100 + ["lqr"] * (n - 101)
    recorder = recording.TrialRecorder(tmp_path / "bag")
    keep = np.ones(n, bool)
    keep[201:209] = False                    # a 18 ms hole in the state stream inside interval 20
    for k in np.flatnonzero(keep):
        ns = T0 + int(k) * DT_NS
        recorder.write("joint_states", joint_state(ns, x[k, :2], x[k, 2:], applied[k]), ns)
        if k < n - 1:
            recorder.write("joint_commands", joint_state(ns, effort=commands[k], frame=modes[k]), ns)
    recorder.close()
    trial = recording.load_trial(tmp_path / "bag", pendubot_config)
    assert len(trial) == 30 and trial.period == 0.02
    np.testing.assert_allclose(trial.t, np.arange(31) * 0.02, atol=1e-12)
    np.testing.assert_allclose(trial.x[:, 0], 2.0 * trial.t, atol=1e-12)
    good = np.ones(30, bool)
    good[[12, 20]] = False
    np.testing.assert_allclose(trial.u[good, 0], 2.0, atol=1e-9)
    assert list(np.flatnonzero(~trial.valid)) == [12, 20]
    assert trial.mode[4] == "policy" and trial.mode[10] == "lqr"
    data = trial.transitions(pendubot_config.actuated_joint)
    assert len(data) == 28 and np.allclose(data.u, 2.0)
    previous = np.concatenate([[0.0], trial.u[:-1, 0]])[trial.valid]    # the period before, an invalid one's too
    assert np.array_equal(data.u_prev, previous) and previous[0] == 0.0 and previous[12] == pytest.approx(2.0)


def test_matches_the_learners_resampling_of_a_simulated_trial(tmp_path, pendubot_config):
    """A simulated trajectory written as a 500 Hz bag reads back as the learner's own transitions."""
    from mcpilco_core.control import build_controller
    from mcpilco_core.learning.learner import ExplorationController, run_on_robot

    explore = ExplorationController(pendubot_config, 3.0, np.random.default_rng(1))
    traj = run_on_robot(pendubot_config, explore, np.zeros(4), 1.0)
    del build_controller
    applied = np.vstack([np.zeros((1, 2)), traj.u])
    recorder = recording.TrialRecorder(tmp_path / "bag")
    write_stream(recorder, traj.x, applied, traj.u_cmd, ["policy"] * len(traj.u))
    recorder.close()
    trial = recording.load_trial(tmp_path / "bag", pendubot_config)
    expected = transitions_from_trajectory(traj.t, traj.x, traj.u, 0.02, 0)
    got = trial.transitions(0)
    np.testing.assert_allclose(got.x, expected.x, atol=1e-12)
    np.testing.assert_allclose(got.x_next, expected.x_next, atol=1e-12)
    np.testing.assert_allclose(got.u, expected.u, atol=1e-9)
    np.testing.assert_allclose(got.u_prev, expected.u_prev, atol=1e-9)     # the command before (delay-aware model)
    assert got.u_prev[0] == 0.0 and np.allclose(got.u_prev[1:], got.u[:-1], atol=1e-12)


def test_transitions_of_several_trials_keep_each_ones_previous_command():
    """LoadResult.transitions and the learner join trials with concat: each transition's u_prev (the delay-aware
    model's input) stays its own, and an unknown one (None) is taken equal to u."""
    first = recording.TransitionData(np.zeros((2, 4)), np.array([1.0, 2.0]), np.ones((2, 4)), np.array([0.0, 1.0]))
    second = recording.TransitionData(np.zeros((1, 4)), np.array([3.0]), np.ones((1, 4)))
    assert np.array_equal(second.u_prev, [3.0])
    joined = recording.TransitionData.empty().concat(first).concat(second)
    assert np.array_equal(joined.u, [1.0, 2.0, 3.0]) and np.array_equal(joined.u_prev, [0.0, 1.0, 3.0])


def test_mismatched_robot_is_refused(tmp_path, pendubot_config, acrobot_config):
    record_session(tmp_path / "acro", acrobot_config)
    record_session(tmp_path / "pendu", pendubot_config)
    result = recording.load_sessions([tmp_path / "acro", tmp_path / "pendu"], pendubot_config)
    assert len(result.trials) == 1
    assert "acrobot" in result.problems[0].reason and result.problems[0].path == str(tmp_path / "acro")
    # a bag without any robot label (ros2 bag record) whose torque is all on the elbow
    with Writer(tmp_path / "plain", version=8, storage_plugin=StoragePlugin.SQLITE3) as writer:
        states = writer.add_connection("joint_states", recording.JOINT_STATE_TYPE, typestore=TS)
        commands = writer.add_connection("joint_commands", recording.JOINT_STATE_TYPE, typestore=TS)
        for k in range(200):
            ns = T0 + k * DT_NS
            writer.write(states, ns, joint_state(ns, (0, 0), (0, 0), (0.0, 1.5)))
            writer.write(commands, ns, joint_state(ns, effort=(0.0, 1.5), frame="policy"))
    with pytest.raises(recording.TrialError, match="elbow.*other robot"):
        recording.load_trial(tmp_path / "plain", pendubot_config)
    assert len(recording.load_trial(tmp_path / "plain", acrobot_config)) == 19


def test_a_lone_bag_is_checked_by_its_own_metadata(tmp_path, pendubot_config):
    """Without a session.yaml beside it, a bag's robot and policy version come from its custom_data
    (``mcpilco.robot``, ``mcpilco.policy_version``): an acrobot bag copied among pendubot bags is refused."""
    for name, robot in (("acro", "acrobot"), ("pendu", "pendubot")):
        recorder = recording.TrialRecorder(tmp_path / "bags" / name, custom_data={"robot": robot,
                                                                                 "policy_version": "v7"})
        write_stream(recorder, *simple_trial(101))
        recorder.close()
    result = recording.load_sessions([tmp_path / "bags"], pendubot_config)
    assert [Path(t.source).name for t in result.trials] == ["pendu"] and result.trials[0].policy_version == "v7"
    assert len(result.problems) == 1 and "recorded on the acrobot" in result.problems[0].reason


def test_a_bag_whose_topics_have_other_types_is_refused_naming_them(tmp_path, pendubot_config):
    with Writer(tmp_path / "bag", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        states = writer.add_connection("joint_states", recording.JOINT_STATE_TYPE, typestore=TS)
        commands = writer.add_connection("joint_commands", recording.DIAGNOSTICS_TYPE, typestore=TS)
        empty = TS.types[recording.DIAGNOSTICS_TYPE](header=HEADER(stamp=TIME(sec=0, nanosec=0), frame_id=""),
                                                     status=[])
        for k in range(50):
            ns = T0 + k * DT_NS
            writer.write(states, ns, joint_state(ns, (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)))
            writer.write(commands, ns, bytes(TS.serialize_cdr(empty, recording.DIAGNOSTICS_TYPE)))
    with pytest.raises(recording.TrialError, match="joint_commands has type diagnostic_msgs/msg/DiagnosticArray"):
        recording.read_bag(tmp_path / "bag")


def test_messages_of_other_joints_are_ignored_not_the_whole_bag(tmp_path, pendubot_config):
    """Another node publishing joint_states of other joints (a gripper's) into the recording: those messages are
    skipped, the robot's own ones make the trial."""
    x, applied, commands, modes = simple_trial(101)
    recorder = recording.TrialRecorder(tmp_path / "bag")
    write_stream(recorder, x, applied, commands, modes)
    for k in range(0, 101, 10):
        ns = T0 + k * DT_NS + 500
        recorder.write(recording.STATE_TOPIC, joint_state(ns, (9.0, 9.0), (9.0, 9.0), (9.0, 9.0),
                                                          names=("finger", "wrist")), ns)
    raw = recording.read_bag(recorder.close())
    assert len(raw.state_t) == 101 and np.array_equal(raw.q, x[:, :2])
    trial = recording.load_trial(tmp_path / "bag", pendubot_config)
    assert trial.valid.all() and np.allclose(trial.u[:, 0], 0.5)


def test_ros2_bag_record_layout_reads(tmp_path, pendubot_config):
    """A folder of bags as `ros2 bag record` leaves them (no session.yaml, no custom data, joints reordered,
    diagnostics present, commands without a mode) loads too."""
    folder = tmp_path / "bags"
    folder.mkdir()
    diag_type = recording.DIAGNOSTICS_TYPE
    with Writer(folder / "rosbag2_2025_01_01-00_00_00", version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        states = writer.add_connection("joint_states", recording.JOINT_STATE_TYPE, typestore=TS)
        commands = writer.add_connection("joint_commands", recording.JOINT_STATE_TYPE, typestore=TS)
        diag = writer.add_connection("diagnostics", diag_type, typestore=TS)
        empty = TS.types[diag_type](header=HEADER(stamp=TIME(sec=0, nanosec=0), frame_id=""), status=[])
        writer.write(diag, T0, bytes(TS.serialize_cdr(empty, diag_type)))
        for k in range(100):
            ns = T0 + k * DT_NS
            writer.write(states, ns, joint_state(ns, (0.0, 0.1), (0.0, 0.2), (0.0, 0.7), names=("elbow", "shoulder")))
            writer.write(commands, ns, joint_state(ns, effort=(0.7, 0.0)))
    result = recording.load_sessions([folder], pendubot_config)
    assert result.problems == [] and len(result.trials) == 1
    trial = result.trials[0]
    np.testing.assert_allclose(trial.x[0], [0.1, 0.0, 0.2, 0.0])
    np.testing.assert_allclose(trial.u[:, 0], 0.7)
    assert set(trial.mode) == {recording.UNKNOWN_MODE}


def test_commands_with_their_joints_in_another_order_give_the_actuated_torque(tmp_path, pendubot_config):
    """States without effort: the torque is the commanded one, read by joint name as the states are (a
    `ros2 bag record` of a controller naming elbow first)."""
    recorder = recording.TrialRecorder(tmp_path / "bag")
    for k in range(101):
        ns = T0 + k * DT_NS
        recorder.write(recording.STATE_TOPIC, joint_state(ns, (0.0, 0.0), (0.0, 0.0)), ns)
        recorder.write(recording.COMMAND_TOPIC, joint_state(ns, effort=(0.0, 0.7), frame="policy",
                                                            names=("elbow", "shoulder")), ns + 1000)
    trial = recording.load_trial(recorder.close(), pendubot_config)
    assert trial.torque_source == recording.COMMAND_TOPIC and trial.valid.all()
    np.testing.assert_allclose(trial.u, [[0.7, 0.0]] * len(trial))


def test_without_state_efforts_the_newest_command_clipped_to_the_limits_is_the_torque(tmp_path, pendubot_config):
    """The commanded-torque fallback: interval i takes the newest command stamped at or before its start (each
    command answers the state before it here), clipped to the joint's torque limit; intervals before the first
    command have no torque to learn from and are not valid."""
    recorder = recording.TrialRecorder(tmp_path / "bag")
    for k in range(101):
        ns = T0 + k * DT_NS
        recorder.write(recording.STATE_TOPIC, joint_state(ns, (0.0, 0.0), (0.0, 0.0)), ns)
        if k >= 30:                                    # the controller's first command answers state 30
            torque = 9.0 if k == 49 else 0.01 * k      # 9 N m: above the pendubot's 6 N m limit
            recorder.write(recording.COMMAND_TOPIC, joint_state(ns + 1000, effort=(torque, 0.0), frame="policy"),
                           ns + 1000)
    trial = recording.load_trial(recorder.close(), pendubot_config)
    assert trial.torque_source == recording.COMMAND_TOPIC
    assert list(trial.valid) == [False] * 4 + [True] * 6
    np.testing.assert_allclose(trial.u[4:, 0], [0.39, 6.0, 0.59, 0.69, 0.79, 0.89])


def test_commands_arriving_out_of_stamp_order_are_used_by_their_stamps(tmp_path, pendubot_config):
    """The commanded torque (states without effort) and the mode come from the newest command stamped at or before
    each interval's start, whatever order the commands reached the recorder in."""
    recorder = recording.TrialRecorder(tmp_path / "bag")
    for k in range(101):
        ns = T0 + k * DT_NS
        recorder.write(recording.STATE_TOPIC, joint_state(ns, (0.0, 0.0), (0.0, 0.0)), ns)
    for k in reversed(range(101)):                     # the first stamp arrives last
        torque, mode = (1.0, "policy") if k < 50 else (2.0, "lqr")
        ns = T0 + k * DT_NS
        received = T0 + (101 - k) * DT_NS
        recorder.write(recording.COMMAND_TOPIC, joint_state(ns, effort=(torque, 0.0), frame=mode), received)
    trial = recording.load_trial(recorder.close(), pendubot_config)
    assert trial.torque_source == recording.COMMAND_TOPIC and trial.valid.all() and len(trial) == 10
    np.testing.assert_allclose(trial.u[:, 0], [1.0] * 5 + [2.0] * 5)
    assert list(trial.mode) == ["policy"] * 5 + ["lqr"] * 5


def test_a_command_with_a_non_finite_torque_is_dropped_with_a_note(tmp_path, pendubot_config):
    """States without effort: a NaN command is dropped (the one before it holds), not averaged into the data."""
    recorder = recording.TrialRecorder(tmp_path / "bag")
    for k in range(101):
        ns = T0 + k * DT_NS
        recorder.write(recording.STATE_TOPIC, joint_state(ns, (0.0, 0.0), (0.0, 0.0)), ns)
        torque = np.nan if k == 40 else 0.5
        recorder.write(recording.COMMAND_TOPIC, joint_state(ns, effort=(torque, 0.0), frame="policy"), ns + 1000)
    trial = recording.load_trial(recorder.close(), pendubot_config)
    assert "dropped 1 joint_commands message(s) with non-finite torques" in trial.notes
    assert trial.valid.all() and np.array_equal(trial.u[:, 0], [0.5] * 10)


def test_the_state_rate_recording_pairs_each_step_with_its_applied_and_commanded_torque(tmp_path, pendubot_config):
    """trial.states (what the robot's identification learns from): step k -> k+1 gets the effort of state k+1 (applied
    over the step ending there) and the command stamped with state k; a step whose own command is missing gets none
    (NaN), not an older one."""
    n = 101
    x, applied, _, _ = simple_trial(n)
    applied[1:, 0] = 0.01 * np.arange(1, n)           # a different torque every step
    recorder = recording.TrialRecorder(tmp_path / "bag")
    for k in range(n):
        ns = T0 + k * DT_NS
        recorder.write(recording.STATE_TOPIC, joint_state(ns, x[k, :2], x[k, 2:], applied[k]), ns)
        if k < n - 1 and not 50 <= k < 55:            # the controller answers state k with what acts over step k
            recorder.write(recording.COMMAND_TOPIC, joint_state(ns, effort=applied[k + 1], frame="policy"), ns + 1000)
    states = recording.load_trial(recorder.close(), pendubot_config).states
    assert states.valid.all() and states.dt == pytest.approx(0.002)
    np.testing.assert_allclose(states.effort[:, 0], applied[1:, 0])
    expected = applied[1:, 0].copy()
    expected[50:55] = np.nan
    np.testing.assert_allclose(states.command[:, 0], expected)


def test_fast_joint_state_parser_matches_rosbags():
    rng = np.random.default_rng(0)
    for _ in range(200):
        names = ["x" * int(rng.integers(0, 9)) for _ in range(int(rng.integers(0, 4)))]
        arrays = [rng.standard_normal(int(rng.integers(0, 4))) for _ in range(3)]
        frame = "f" * int(rng.integers(0, 9))
        data = joint_state(int(rng.integers(0, 2 * 10**18)), arrays[0], arrays[1], arrays[2], frame, names)
        parsed = recording.parse_joint_state(data)
        reference = TS.deserialize_cdr(data, recording.JOINT_STATE_TYPE)
        assert parsed.name == list(reference.name) and parsed.frame_id == reference.header.frame_id
        for mine, theirs in zip((parsed.position, parsed.velocity, parsed.effort),
                                (reference.position, reference.velocity, reference.effort)):
            assert np.array_equal(mine, theirs)


def test_header_stamp_is_read_from_raw_cdr_as_rosbags_reads_it_and_the_recorder_keeps_the_newest(tmp_path):
    """The trainer reports the newest state stamp it recorded (a session waits for a trial's final state with it)."""
    rng = np.random.default_rng(1)
    for ns in [0, 1, 999_999_999, 1_000_000_000, *rng.integers(0, 2 * 10**18, 50)]:
        ns = int(ns)
        msg = JS(header=HEADER(stamp=TIME(sec=ns // 10**9, nanosec=ns % 10**9), frame_id="policy"), name=["a"],
                 position=np.zeros(1), velocity=np.zeros(1), effort=np.zeros(1))
        for little in (True, False):
            assert recording.header_stamp_ns(bytes(TS.serialize_cdr(msg, recording.JOINT_STATE_TYPE,
                                                                    little_endian=little))) == ns
    assert recording.header_stamp_ns(b"\x00\x01\x00\x00") is None           # truncated
    assert recording.header_stamp_ns(b"junk that is not cdr") is None
    recorder = recording.TrialRecorder(tmp_path / "bag")
    assert recorder.last_stamp_ns == {}
    for k in (3, 5, 4):                                                       # out of order: the newest stays
        recorder.write(recording.STATE_TOPIC, joint_state(T0 + k * DT_NS, (0, 0), (0, 0)), T0)
    recorder.write(recording.COMMAND_TOPIC, joint_state(T0 + 9 * DT_NS, effort=(0, 0)), T0)
    recorder.write(recording.STATE_TOPIC, b"\x00\x01", T0)                  # stored, no stamp to read
    assert recorder.last_stamp_ns == {recording.STATE_TOPIC: T0 + 5 * DT_NS, recording.COMMAND_TOPIC: T0 + 9 * DT_NS}
    assert recorder.counts[recording.STATE_TOPIC] == 4
    recorder.close()


# --------------------------------------------------------------------------------------------------
# Bad samples (issue 13 item 4): non-finite, absurd, out of order or far-off stamps


def _bag_with(path: Path, x: np.ndarray, applied: np.ndarray, stamps: np.ndarray) -> Path:
    """States x[k] with effort applied[k] stamped stamps[k] (ns), written in this order; commands answer them."""
    recorder = recording.TrialRecorder(path)
    for k, ns in enumerate(stamps):
        ns = int(ns)
        recorder.write(recording.STATE_TOPIC, joint_state(ns, x[k, :2], x[k, 2:], applied[k]), T0 + k * DT_NS)
        recorder.write(recording.COMMAND_TOPIC, joint_state(ns, effort=applied[k], frame="policy"),
                       T0 + k * DT_NS + 1000)
    return recorder.close()


def test_bad_samples_are_dropped_with_a_count_and_the_intervals_they_touch_are_invalid(tmp_path, pendubot_config):
    x, applied, _, _ = simple_trial(501)                      # 1 s at 500 Hz: q1 = 0.5 t, 0.5 N m applied
    stamps = T0 + np.arange(501) * DT_NS
    # trial time of state k is (k - 1) * 2 ms (state 0 is dropped); interval i is [20 i, 20 i + 20) ms
    x[105, 0] = np.nan                                        # interval 10
    x[155, 3] = np.inf                                        # interval 15
    x[255, 2] = 1e200                                         # interval 25
    applied[305, 0] = -np.inf                                 # interval 30
    stamps[0] = 0                                             # one state stamped 0: once asked for 633 GiB
    stamps[405] = T0 - 10**9                                  # out of order, 1 s before the trial: interval 40
    stamps[455] = (2**31 - 1) * 10**9                         # out of order, year 2038: interval 45
    stamps[500] = T0 + 10**15                                 # the last one, 11 days later
    trial = recording.load_trial(_bag_with(tmp_path / "bag", x, applied, stamps), pendubot_config)
    assert np.isfinite(trial.x).all() and np.isfinite(trial.u).all()
    assert trial.t[-1] == pytest.approx(0.98) and len(trial) == 49          # the span of the good samples
    assert "4 joint_states sample(s) with non-finite or absurd values" in " ".join(trial.notes)
    assert "4 joint_states sample(s) stamped out of order or far outside the trial" in " ".join(trial.notes)
    assert list(np.flatnonzero(~trial.valid)) == [10, 15, 25, 30, 40, 45]
    np.testing.assert_allclose(trial.x[:, 0], 0.5 * (trial.t + 0.002), atol=1e-12)
    np.testing.assert_allclose(trial.u[trial.valid, 0], 0.5)


def test_a_lockstep_driver_republishing_its_first_state_is_no_fault(tmp_path, pendubot_config):
    """sim_driver_node in lockstep republishes its state while it waits for the controller's first command: the
    repeats (same stamp, same values) are merged silently, leave no hole, and the trial equals the one without them
    (a repeat with other values, or a stamp going back, is still dropped and reported)."""
    x, applied, _, _ = simple_trial(301)
    stamps = T0 + np.arange(301) * DT_NS
    clean = recording.load_trial(_bag_with(tmp_path / "clean", x, applied, stamps), pendubot_config)
    rep = np.r_[0, 0, 0, np.arange(301)]                  # state 0 three more times, as the driver does
    repeated = recording.load_trial(_bag_with(tmp_path / "rep", x[rep], applied[rep], stamps[rep]), pendubot_config)
    assert repeated.notes == clean.notes and not any("out of order" in n for n in repeated.notes)
    assert repeated.valid.all() and len(repeated) == len(clean)
    for name in ("t", "x", "u"):
        np.testing.assert_array_equal(getattr(repeated, name), getattr(clean, name))
    changed = x[rep].copy()
    changed[1, 0] += 0.1          # same stamp, other values: not a repeat, and the next one no longer repeats it
    odd = recording.load_trial(_bag_with(tmp_path / "odd", changed, applied[rep], stamps[rep]), pendubot_config)
    assert "2 joint_states sample(s) stamped out of order" in " ".join(odd.notes)


def test_friction_compensation_torque_on_the_passive_joint_keeps_the_data(tmp_path, pendubot_config, repo):
    """With the opt-in compensation the passive joint's motor cancels its friction (up to 0.19 N m for the
    pendubot's elbow): those intervals are the robot's dynamics and stay in the model's data; without the opt-in
    the same torque is not the robot's own dynamics and is dropped (a session once learnt from 46 of 900
    transitions that way). Beyond the compensation's limit an interval is dropped either way."""
    compensated = load_robot_config(repo / "config" / "pendubot_friction_compensation.yaml")
    x, applied, _, _ = simple_trial(501)
    applied[1:, 1] = 0.12 * np.arctan(100 * 0.5)           # elbow compensation at 0.5 rad/s: 0.18 N m
    applied[300:321, 1] = 0.6                                 # above the 0.5 N m limit for 40 ms from t = 0.6 s
    bag = _bag_with(tmp_path / "bag", x, applied, T0 + np.arange(501) * DT_NS)
    with_opt_in = recording.load_trial(bag, compensated)
    dropped = set(np.flatnonzero(~with_opt_in.valid))
    assert {30, 31} <= dropped <= {29, 30, 31, 32} and len(with_opt_in.valid) == 25 * 2
    np.testing.assert_allclose(with_opt_in.u[:29, 1], 0.12 * np.arctan(50.0))      # the model sees it
    without = recording.load_trial(bag, pendubot_config)
    assert not without.valid.any()


def test_a_bag_without_usable_states_is_skipped_with_the_reason(tmp_path, pendubot_config):
    x, applied, _, _ = simple_trial(101)
    x[:, 1] = np.nan
    _bag_with(tmp_path / "s" / "nan", x, applied, T0 + np.arange(101) * DT_NS)
    x, applied, _, _ = simple_trial(101)
    _bag_with(tmp_path / "s" / "long", x, applied, T0 + np.arange(101) * 10**11)   # 100 s apart: 10 000 s
    x, applied, _, _ = simple_trial(101)
    _bag_with(tmp_path / "s" / "good", x, applied, T0 + np.arange(101) * DT_NS)
    result = recording.load_sessions([tmp_path / "s"], pendubot_config)
    assert [Path(t.source).name for t in result.trials] == ["good"]
    reasons = {Path(p.path).name: p.reason for p in result.problems}
    assert "0 usable joint_states" in reasons["nan"] and "101 dropped" in reasons["nan"]
    assert "longer than" in reasons["long"] and "3600" in reasons["long"]
    x, applied, _, _ = simple_trial(9)                 # 9 states 10 ms apart: 80 ms, but below min_states (10)
    few = _bag_with(tmp_path / "few", x, applied, T0 + np.arange(9) * 5 * DT_NS)
    with pytest.raises(recording.TrialError, match="only 9 usable joint_states"):
        recording.load_trial(few, pendubot_config)


def test_a_state_without_effort_or_with_a_third_one_does_not_switch_the_trial_to_commanded_torque(
        tmp_path, pendubot_config):
    """The applied torque (0.5 N m, the states' effort) differs from the command (1 N m, a motor lag): one state
    without effort used to switch the whole trial to the commanded torque, silently; it is dropped with a note now,
    and a state with three efforts is refused as malformed (as the controller node refuses it)."""
    n = 501
    x, applied, _, _ = simple_trial(n)
    recorder = recording.TrialRecorder(tmp_path / "bag")
    for k in range(n):
        ns = T0 + k * DT_NS
        effort = () if k == 105 else (*applied[k], 9.0) if k == 205 else applied[k]
        recorder.write(recording.STATE_TOPIC, joint_state(ns, x[k, :2], x[k, 2:], effort), ns)
        recorder.write(recording.COMMAND_TOPIC, joint_state(ns, effort=(1.0, 0.0), frame="policy"), ns + 1000)
    recorder.write(recording.COMMAND_TOPIC, joint_state(T0 + n * DT_NS, effort=(1.0,), frame="policy"), T0 + n * DT_NS)
    trial = recording.load_trial(recorder.close(), pendubot_config)
    assert trial.torque_source == recording.STATE_TOPIC and trial.states is not None
    np.testing.assert_allclose(trial.u[trial.valid, 0], 0.5)
    assert "dropped 1 joint_states sample(s) without effort" in " ".join(trial.notes)
    assert list(np.flatnonzero(~trial.valid)) == [10]         # the interval around the state without effort
    raw = recording.read_bag(tmp_path / "bag")
    assert len(raw.state_t) == n - 1 and len(raw.command_t) == n   # the 3-effort state and 1-effort command refused


def _partial_with_damaged_chunk(root: Path, config, which: str) -> Path:
    """A session whose trial 0 is a partial MCAP bag (the recorder never closed) with one field of a chunk header
    damaged: the last chunk's compression-name length (``last``) or the first record's (``first``)."""
    import struct as st

    session = recording.SessionDirectory.create(root, config)
    recorder = session.start_trial("v1", flush_period=1e9)
    for k in range(1000):
        ns = T0 + k * DT_NS
        recorder.write(recording.STATE_TOPIC, joint_state(ns, (0.001 * k, 0.0), (0.5, 0.0), (0.5, 0.0)), ns)
        recorder.write(recording.COMMAND_TOPIC, joint_state(ns, effort=(0.5, 0.0), frame="policy"), ns + 1000)
        if k % 200 == 199:
            recorder.flush()
    mcap = next(recorder.partial.glob("*.mcap"))
    data = bytearray(mcap.read_bytes())
    pos, chunks = 8, []
    while pos + 9 <= len(data):
        if data[pos] == 0x06:
            chunks.append(pos)
        pos += 9 + st.unpack_from("<Q", data, pos + 1)[0]
    st.pack_into("<I", data, (chunks[-1] if which == "last" else chunks[0]) + 9 + 28, 0x7FFFFFFF)
    mcap.write_bytes(bytes(data))
    return root


@pytest.mark.parametrize("which", ["last", "first"])
def test_a_damaged_partial_bag_keeps_what_is_readable_and_is_never_left_out_silently(tmp_path, pendubot_config,
                                                                                     which):
    root = _partial_with_damaged_chunk(tmp_path / "s", pendubot_config, which)
    recovered = recording.recover_session(root)           # no exception, whatever the damage
    entry = recording.SessionDirectory.open(root).info["trials"][0]
    loaded = recording.load_sessions([root], pendubot_config)
    if which == "last":          # the chunks before the damaged one are salvaged
        assert recovered == [root / "trial_000"] and entry["status"] == "recovered"
        assert 600 <= entry["messages"]["joint_states"] < 1000
        assert len(loaded.trials) == 1 and loaded.problems == []
    else:                        # nothing readable: marked, and reported when the session is read
        assert recovered == [] and entry["status"] == "unrecoverable" and "trial_000.crashed" in entry["problem"]
        assert loaded.trials == [] and any("crashed trial with no salvaged bag" in p.reason for p in loaded.problems)
