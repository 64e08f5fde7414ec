"""trainer_node in-process: start/stop trial -> bag, fixed trial length, retrain in a subprocess -> new versioned
policy -> controller's parameter set + ~/reload_policy. The retrain uses the real learner (tiny settings)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import yaml

pytest.importorskip("rclpy")
from _ros_helpers import CONFIG, rig, wait_for  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402
from test_trials_retrain import simulated_session, tiny_config  # noqa: E402,F401

from mcpilco_core import recording  # noqa: E402
from mcpilco_ros.controller_node import ControllerNode  # noqa: E402
from mcpilco_ros.trainer_node import RECORD_QOS, TrainerNode  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def make_trainer(context, tmp_path, **overrides) -> TrainerNode:
    params = {"session_dir": str(tmp_path / "session"), "run_dir": str(tmp_path / "run"),
              "diagnostics_period": 0.1, "controller": "", "flush_period": 0.05, **overrides}
    return TrainerNode(context=context, cli_args=["--ros-args", "--params-file", str(CONFIG / "pendubot.yaml")],
                       parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])


def state(k: int, frame: str = "", effort=(0.5, 0.0), with_position: bool = True) -> JointState:
    msg = JointState()
    ns = 1_000_000_000 + k * 2_000_000
    msg.header.stamp.sec, msg.header.stamp.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
    msg.header.frame_id = frame
    msg.name = ["shoulder", "elbow"]
    if with_position:
        msg.position, msg.velocity = [1e-3 * k, 0.0], [0.5, 0.0]
    msg.effort = list(effort)
    return msg


class Publisher:
    def __init__(self, r) -> None:
        from rclpy.node import Node

        self.node = r.add(Node("fake_robot", context=r.context))
        self.states = self.node.create_publisher(JointState, "joint_states", RECORD_QOS)
        self.commands = self.node.create_publisher(JointState, "joint_commands", RECORD_QOS)
        self.start = self.node.create_client(Trigger, "/trainer_node/start_trial")
        self.stop = self.node.create_client(Trigger, "/trainer_node/stop_trial")
        self.retrain = self.node.create_client(Trigger, "/trainer_node/retrain")

    def stream(self, count: int) -> None:
        for k in range(count):
            self.states.publish(state(k))
            self.commands.publish(state(k, "policy", with_position=False))


def test_start_stop_trial_records_a_bag(tmp_path, pendubot_config):
    with rig() as r:
        trainer = r.add(make_trainer(r.context, tmp_path))
        robot = Publisher(r)
        r.start()
        wait_for(lambda: robot.states.get_subscription_count() >= 1 and robot.commands.get_subscription_count() >= 1,
                 what="trainer subscribed")
        assert not r.call(robot.stop, Trigger.Request()).success  # nothing recording yet
        answer = r.call(robot.start, Trigger.Request())
        assert answer.success and "trial_000" in answer.message
        assert not r.call(robot.start, Trigger.Request()).success  # one trial at a time
        robot.stream(300)
        wait_for(lambda: trainer.recorder.counts["joint_states"] == 300
                 and trainer.recorder.counts["joint_commands"] == 300, what="300 + 300 messages recorded")
        # diagnostics name the newest state stamp recorded (a session waits for a trial's final state with it)
        published = []
        trainer.publish_status = lambda *args: published.append(args[-1])
        trainer.publish_diagnostics()
        assert published[-1]["states_recorded"] == 300
        assert published[-1]["last_state_stamp_ns"] == 1_000_000_000 + 299 * 2_000_000
        answer = r.call(robot.stop, Trigger.Request())
        assert answer.success, answer.message
    bag = tmp_path / "session" / "trial_000"
    trial = recording.load_trial(bag, pendubot_config)
    assert len(trial) == 29 and np.allclose(trial.u[:, 0], 0.5) and set(trial.mode) == {"policy"}
    info = yaml.safe_load((tmp_path / "session" / "session.yaml").read_text())
    assert info["trials"][0]["status"] == "complete" and info["trials"][0]["messages"]["joint_states"] == 300


def test_fixed_trial_length_stops_by_itself(tmp_path):
    with rig() as r:
        trainer = r.add(make_trainer(r.context, tmp_path, trial_duration=0.3, storage="sqlite3", bag_version=8))
        robot = Publisher(r)
        r.start()
        assert r.call(robot.start, Trigger.Request()).success
        wait_for(lambda: trainer.recorder is None, timeout=10, what="trial stopped after trial_duration")
    info = yaml.safe_load((tmp_path / "session" / "trial_000" / "metadata.yaml").read_text())
    assert info["rosbag2_bagfile_information"]["version"] == 8
    assert info["rosbag2_bagfile_information"]["storage_identifier"] == "sqlite3"


def test_a_trial_stopped_by_hand_leaves_no_timer_to_cut_the_next_one_short(tmp_path):
    """trial_duration 1 s: trial 0 is stopped by hand at once, trial 1 starts 0.5 s later and runs its full 1 s
    (trial 0's timer, had it lived on, would stop it after 0.5 s)."""
    with rig() as r:
        trainer = r.add(make_trainer(r.context, tmp_path, trial_duration=1.0))
        robot = Publisher(r)
        r.start()
        assert r.call(robot.start, Trigger.Request()).success
        assert r.call(robot.stop, Trigger.Request()).success
        time.sleep(0.5)
        assert r.call(robot.start, Trigger.Request()).success
        started = time.monotonic()
        wait_for(lambda: trainer.recorder is None, timeout=10, what="trial 1 stopped after trial_duration")
        assert time.monotonic() - started > 0.8
    assert (tmp_path / "session" / "trial_001" / "metadata.yaml").is_file()


def test_retrain_exports_a_new_policy_and_the_controller_reloads_it(tmp_path, pendubot_config, tiny_config):  # noqa: F811
    simulated_session(tmp_path / "session", pendubot_config)
    with rig() as r:
        controller = r.add(ControllerNode(
            context=r.context, cli_args=["--ros-args", "--params-file", str(CONFIG / "pendubot.yaml")],
            parameter_overrides=[Parameter("diagnostics_period", value=0.05)]))
        trainer = r.add(make_trainer(r.context, tmp_path, controller="controller_node",
                                     train_config=str(tiny_config), retrain_nice=0))
        robot = Publisher(r)
        r.start()
        assert controller.policy_version == "none"
        wait_for(lambda: trainer.controller_policy_version == "none", what="trainer heard the controller")
        answer = r.call(robot.retrain, Trigger.Request())
        assert answer.success, answer.message
        assert not r.call(robot.retrain, Trigger.Request()).success  # one retrain at a time
        # the trainer's executor stays responsive while the learner runs in its own process: a service call is
        # answered before that process ends (order, not a time limit; timing: benchmarks/bench_retrain_loop.py)
        learner = trainer.retrain_proc
        assert learner is not None and learner.poll() is None
        assert r.call(robot.start, Trigger.Request()).success
        assert learner.poll() is None and trainer.retrain_proc is learner and trainer.recorder is not None
        assert r.call(robot.stop, Trigger.Request()).success
        wait_for(lambda: controller.policy_version != "none", timeout=70, what="controller reloaded the policy")
        history = json.loads((tmp_path / "run" / "retrain.json").read_text())
        exported = history["retrains"][0]
        assert exported["policy_version"] == controller.policy_version
        assert str(controller.policy_path) == str((tmp_path / "run" / "policies").resolve() /
                                                  f"policy_000_{controller.policy_version}.npz")
        wait_for(lambda: "loaded" in trainer.last_reload, what="trainer got the reload answer")


def test_trainer_yaml_sets_exactly_the_declared_parameters(repo):
    from mcpilco_ros._ros_utils import DIAGNOSTICS_PERIOD
    from mcpilco_ros.trainer_node import TRAINER_PARAMETERS

    values = yaml.safe_load((repo / "config" / "trainer.yaml").read_text())["trainer_node"]["ros__parameters"]
    specs = TRAINER_PARAMETERS + (DIAGNOSTICS_PERIOD,)   # the node preamble declares diagnostics_period
    assert set(values) == {spec.name for spec in specs}
    for spec in specs:
        assert type(values[spec.name]) is type(spec.default), spec.name


def test_refuses_bad_parameters(tmp_path):
    from mcpilco_ros._ros_utils import ParameterError

    with rig() as r:
        with pytest.raises(ParameterError, match="storage"):
            make_trainer(r.context, tmp_path, storage="zip")
        with pytest.raises(ParameterError, match="train_config"):
            make_trainer(r.context, tmp_path / "b", train_config=str(tmp_path / "missing.yaml"))


def test_shutdown_mid_trial_completes_the_bag_without_starting_a_retrain(tmp_path, pendubot_config):
    """With retrain_after_trial on, closing the trial at shutdown used to start a retrain only to terminate it at
    once (a 'failed' retrain in the log); the bag is completed and nothing else starts."""
    with rig() as r:
        trainer = r.add(make_trainer(r.context, tmp_path, retrain_after_trial=True))
        robot = Publisher(r)
        r.start()
        wait_for(lambda: robot.states.get_subscription_count() >= 1, what="trainer subscribed")
        assert r.call(robot.start, Trigger.Request()).success
        robot.stream(100)
        wait_for(lambda: trainer.recorder.counts["joint_states"] == 100, what="100 states recorded")
        trainer.on_shutdown()
        assert trainer.recorder is None and trainer.retrain_proc is None
    info = yaml.safe_load((tmp_path / "session" / "session.yaml").read_text())
    assert info["trials"][0]["status"] == "complete" and info["trials"][0]["messages"]["joint_states"] == 100
