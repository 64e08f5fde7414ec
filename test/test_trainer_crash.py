"""trainer_node as a separate process, killed with SIGKILL in the middle of a trial: every earlier trial stays
intact, the restarted node recovers the partial bag (session.yaml status ``recovered``, the original files kept
as ``trial_NNN.crashed``), ``mcpilco retrain --recover`` salvages one left behind, and a retrain that fails
leaves the controller on its old policy."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("rclpy")
from _ros_helpers import CONFIG, REPO, Peer, node_process, rig, ros_env, status_values, wait_for  # noqa: E402
from rclpy.node import Node  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402
from test_trainer_node import state  # noqa: E402
from test_trials_retrain import simulated_session, tiny_config  # noqa: E402,F401

from mcpilco_core import recording  # noqa: E402
from mcpilco_core.policy import load_policy  # noqa: E402
from mcpilco_ros.trainer_node import RECORD_QOS  # noqa: E402

pytestmark = pytest.mark.timeout(180)
ROBOT = CONFIG / "pendubot.yaml"
STREAM = 300          # joint_states (and as many joint_commands) recorded before the kill


def params_file(path: Path, sections: dict) -> Path:
    path.write_text(yaml.safe_dump({n: {"ros__parameters": v} for n, v in sections.items()}), encoding="utf-8")
    return path


def trainer_params(tmp_path: Path, train_config: Path, **extra) -> Path:
    return params_file(tmp_path / "trainer.yaml", {"trainer_node": {
        "session_dir": str(tmp_path / "session"), "run_dir": str(tmp_path / "run"), "train_config": str(train_config),
        "controller": "", "flush_period": 0.05, "diagnostics_period": 0.1, "retrain_nice": 0, **extra}})


class FakeRobot(Node):
    """Publishes joint_states / joint_commands like a driver and controller; calls the trainer's services."""

    def __init__(self, context) -> None:
        super().__init__("fake_robot", context=context)
        self.states = self.create_publisher(JointState, "joint_states", RECORD_QOS)
        self.commands = self.create_publisher(JointState, "joint_commands", RECORD_QOS)
        self.start = self.create_client(Trigger, "/trainer_node/start_trial")
        self.retrain = self.create_client(Trigger, "/trainer_node/retrain")

    def stream(self, count: int) -> None:
        for k in range(count):
            self.states.publish(state(k))
            self.commands.publish(state(k, "policy", with_position=False))


def on_disk(partial: Path, scratch: Path) -> dict:
    """Message counts a salvage of the partial bag would keep now (a copy is salvaged; the original untouched)."""
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        shutil.copytree(partial, scratch / "copy")
        return recording.salvage_bag(scratch / "copy", scratch / "out")
    except Exception:   # noqa: BLE001 - a bag being written: not readable yet
        return {}


def record_until_flushed_then_kill(r, robot: FakeRobot, trainer: subprocess.Popen, session: Path,
                                   tmp_path: Path) -> str:
    """Start a trial, stream STREAM messages per topic, wait until they are on disk, SIGKILL the trainer."""
    wait_for(lambda: robot.states.get_subscription_count() >= 1 and robot.commands.get_subscription_count() >= 1,
             20, "trainer subscribed")
    answer = r.call(robot.start, Trigger.Request(), timeout=20)
    assert answer.success, answer.message
    name = answer.message.split("trial_")[1][:3]
    robot.stream(STREAM)
    partial = session / f"trial_{name}.partial"
    wait_for(lambda: on_disk(partial, tmp_path / "scratch").get("joint_states") == STREAM, 20,
             f"{STREAM} joint_states flushed into {partial.name}")
    trainer.send_signal(signal.SIGKILL)
    assert trainer.wait(timeout=10) == -signal.SIGKILL
    assert partial.is_dir()
    return f"trial_{name}"


def trial_arrays(path: Path, config) -> tuple:
    trial = recording.load_trial(path, config)
    return trial.x, trial.u, tuple(trial.mode)


def test_sigkilled_trainer_node_is_recovered_at_restart_and_by_retrain_recover(tmp_path, pendubot_config,
                                                                              tiny_config):  # noqa: F811
    session = tmp_path / "session"
    simulated_session(session, pendubot_config)                    # trial_000, trial_001: complete
    before = {name: trial_arrays(session / name, pendubot_config) for name in ("trial_000", "trial_001")}
    params = trainer_params(tmp_path, tiny_config)
    # one ROS context per trainer process: a fresh participant never sees the killed node's stale services
    with node_process("trainer_node", ROBOT, params, log=tmp_path / "trainer1.log") as trainer, rig() as r:
        robot = r.add(FakeRobot(r.context))
        r.start()
        killed = record_until_flushed_then_kill(r, robot, trainer, session, tmp_path)
    assert killed == "trial_002"
    info = yaml.safe_load((session / "session.yaml").read_text())
    assert [t["status"] for t in info["trials"]] == ["complete", "complete", "recording"]

    # restart: the node salvages the partial bag before it does anything else ...
    with node_process("trainer_node", ROBOT, params, log=tmp_path / "trainer2.log") as trainer, rig() as r:
        robot = r.add(FakeRobot(r.context))
        r.start()
        wait_for(lambda: (session / "trial_002").is_dir() and yaml.safe_load(
            (session / "session.yaml").read_text())["trials"][2]["status"] == "recovered", 30,
            "trial_002 recovered by the restarted trainer")
        entry = yaml.safe_load((session / "session.yaml").read_text())["trials"][2]
        assert entry["messages"]["joint_states"] == STREAM and entry["messages"]["joint_commands"] == STREAM
        assert entry["crashed_files"] == "trial_002.crashed" and (session / "trial_002.crashed").is_dir()
        assert not (session / "trial_002.partial").exists()
        recovered = recording.load_trial(session / "trial_002", pendubot_config)
        assert len(recovered) > 0 and set(recovered.mode) == {"policy"}
        # ... and goes on recording with the next index; killed again mid-trial
        assert record_until_flushed_then_kill(r, robot, trainer, session, tmp_path) == "trial_003"
    info = yaml.safe_load((session / "session.yaml").read_text())
    assert [t["status"] for t in info["trials"]] == ["complete", "complete", "recovered", "recording"]
    for name, arrays in before.items():                            # earlier trials untouched by both crashes
        for a, b in zip(arrays, trial_arrays(session / name, pendubot_config)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # offline: mcpilco retrain --recover salvages trial_003 first, then learns from all four trials
    done = subprocess.run([sys.executable, "-m", "mcpilco_ros.cli", "retrain", "--sessions", str(session),
                           "--out", str(tmp_path / "offline"), "--config", str(tiny_config), "--recover", "--json"],
                          capture_output=True, text=True, timeout=150, env=ros_env(), cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["trials"] == 4 and not result["skipped"]
    info = yaml.safe_load((session / "session.yaml").read_text())
    assert [t["status"] for t in info["trials"]] == ["complete", "complete", "recovered", "recovered"]
    assert info["trials"][3]["messages"]["joint_states"] == STREAM
    assert (session / "trial_003.crashed").is_dir() and (session / "trial_003").is_dir()
    assert "recovered the partial bag" in (tmp_path / "offline" / "log.txt").read_text()
    load_policy(result["policy"], robot="pendubot")


def test_failing_retrain_leaves_the_controller_on_its_old_policy(tmp_path, tiny_config):  # noqa: F811
    """A retrain that fails (no usable trials in the session) never touches the controller, even with an older
    exported policy waiting in the run directory."""
    shipped = REPO / "policies" / "pendubot.npz"
    old_version = load_policy(shipped).version()
    (tmp_path / "run" / "policies").mkdir(parents=True)
    other = load_policy(shipped)
    other.weights[:] = 0.5 * other.weights                         # a different, valid policy: another version
    from mcpilco_core.policy import save_policy

    save_policy(other, tmp_path / "run" / "policies" / "policy_000_old.npz")
    assert load_policy(tmp_path / "run" / "policies" / "policy_000_old.npz").version() != old_version
    params = trainer_params(tmp_path, tiny_config, controller="controller_node")
    controller_params = params_file(tmp_path / "controller.yaml", {"controller_node": {
        "policy": str(shipped), "diagnostics_period": 0.1}})
    with node_process("controller_node", ROBOT, controller_params, log=tmp_path / "controller.log"), \
            node_process("trainer_node", ROBOT, params, log=tmp_path / "trainer.log"), rig() as r:
        robot = r.add(FakeRobot(r.context))
        observer = r.add(Peer(r.context, "unused", "unused_states", name="observer"))
        r.start()

        def status(name: str) -> dict:
            st = observer.last_status(name)
            return status_values(st) if st is not None else {}

        wait_for(lambda: status("trainer").get("controller_policy_version") == old_version, 30,
                 "the trainer heard the controller's policy version")
        answer = r.call(robot.retrain, Trigger.Request(), timeout=20)
        assert answer.success, answer.message
        wait_for(lambda: status("trainer").get("retrains_finished") == "1", 120, "the retrain ended")
        trainer = status("trainer")
        assert trainer["last_retrain"].startswith("failed") and trainer["last_policy"] == ""
        assert trainer["last_reload"] == ""                        # the controller was never asked to reload
        assert "usable transitions" in Path(trainer["last_retrain"].rsplit("see ", 1)[1]).read_text()
        observer.diagnostics.clear()
        wait_for(lambda: status("controller") != {}, 10, "fresh controller diagnostics")
        controller = status("controller")
        assert controller["policy_version"] == old_version and controller["policy_path"] == str(shipped)
