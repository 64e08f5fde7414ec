"""Disturbance trials on the (simulated) robot: ``sim_driver_node``'s ``~/disturb`` runs one window of the
protocol's reset PID (mcpilco_core.evaluation.DisturbanceWindow) towards a seeded random target, bounded by its
own torque limit, marked in diagnostics and in joint_states (frame_id "reset"); outside it the passive joint
gets exactly 0. The same window offline (the learner's run_on_robot) gives the same numbers."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from mcpilco_core.config import load_robot_config
from mcpilco_core.evaluation import (
    DisturbanceSchedule,
    DisturbanceTargets,
    DisturbanceWindow,
    ResetPerturbation,
)
from mcpilco_core.plant import DoublePendulum
from mcpilco_core.simulation import MODE_CODES, RESET_FRAME, load_robot_profile

pytest.importorskip("rclpy")
from _ros_helpers import CONFIG, Peer, rig, status_values, wait_for  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402

from mcpilco_ros._messages import CONTROL_QOS  # noqa: E402
from mcpilco_ros._ros_utils import ParameterError, stamp_ns  # noqa: E402
from mcpilco_ros.sim_driver_node import SimDriverNode  # noqa: E402

pytestmark = pytest.mark.timeout(60)
PENDUBOT = load_robot_config(CONFIG / "pendubot.yaml")


def test_window_is_the_protocols_reset_pid_from_its_start_step():
    """100 steps of 2 ms, the same torques as ResetPerturbation's one-entry schedule, shifted to its start."""
    plant = DoublePendulum(PENDUBOT.plant)
    target = np.array([1.0, -2.0])
    window = DisturbanceWindow(target, plant, 0.002, start=7)
    reference = ResetPerturbation(DisturbanceSchedule(times=np.zeros(1), targets=target.reshape(1, 2)), plant, 0.002)
    rng = np.random.default_rng(0)
    assert window(6, 0.0, (0.0, 0.0, 0.0, 0.0)) is None and window.steps == 0 and not window.active
    for k in range(7, 7 + 120):
        x = tuple(rng.normal(size=4))
        u, expected = window(k, k * 0.002, x), reference(k - 7, 0.0, x)
        if expected is None:
            assert u is None
        else:
            np.testing.assert_array_equal(u, expected)
    assert window.steps == 100 and window.finished and window(200, 0.0, (0.0,) * 4) is None
    targets = DisturbanceTargets(3)
    first = targets.next()
    assert np.all(np.abs(first) <= np.pi) and targets.count == 1
    np.testing.assert_array_equal(first, np.random.default_rng(3).uniform(-np.pi, np.pi, 2))


class AnsweringPeer(Peer):
    """Answers every state at once with the same command (what a controller does in lockstep)."""

    def __init__(self, context, effort=(5.0, 7.0)) -> None:
        super().__init__(context, "joint_commands", "joint_states", name="answering_peer")
        self.effort = effort
        self.answering = False
        self.create_subscription(JointState, "joint_states", self._answer, CONTROL_QOS)

    def _answer(self, msg: JointState) -> None:
        if self.answering:
            answer = JointState()
            answer.header.stamp = msg.header.stamp
            answer.name = ["shoulder", "elbow"]
            answer.effort = [float(v) for v in self.effort]
            self.pub.publish(answer)


def make_sim(context, **overrides) -> SimDriverNode:
    params = {"diagnostics_period": 0.1, **overrides}
    return SimDriverNode(context=context, cli_args=["--ros-args", "--params-file", str(CONFIG / "pendubot.yaml")],
                         parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])


def offline(x0, target, limit: float, steps: int, command=(5.0, 7.0), profile: str = "nominal"):
    """The same disturbance trial without ROS: the window from x0, then ``steps`` steps of ``command``."""
    window = DisturbanceWindow(target, DoublePendulum(PENDUBOT.plant), PENDUBOT.control_period)
    robot = load_robot_profile(profile).robot(PENDUBOT, 0, x0, override=window, override_limits=(limit, limit))
    while robot.in_override():
        robot.step(None, "reset")
    for _ in range(steps):
        robot.step(command, "other")
    return robot.finish()


def test_sim_driver_disturb_runs_one_bounded_marked_window_then_the_passive_joint_gets_zero(tmp_path):
    x0 = [0.2, 0.0, 0.0, 0.0]
    record = tmp_path / "trial.npz"
    with rig() as r:
        sim = r.add(make_sim(r.context, mode="lockstep", initial_state=x0, duration=0.1, record_file=str(record),
                             **{"disturbance.seed": 3, "disturbance.torque_limit": 4.0}))
        peer = r.add(AnsweringPeer(r.context))
        client = peer.create_client(Trigger, "/sim_driver_node/disturb")
        r.start()
        wait_for(lambda: len(peer.received) >= 1, what="state 0")
        answer = r.call(client, Trigger.Request())
        assert answer.success, answer.message
        info = json.loads(answer.message)
        expected_target = DisturbanceTargets(3).next()
        assert info["index"] == 0 and info["seed"] == 3 and info["torque_limit"] == 4.0 and info["start_step"] == 0
        np.testing.assert_array_equal(info["target"], expected_target)
        again = r.call(client, Trigger.Request())
        assert not again.success and "still running" in again.message

        def diagnostics_say(active: bool, windows: int):
            def predicate():
                st = peer.last_status("sim_driver_node")
                values = status_values(st) if st is not None else {}
                return values.get("disturbance_active") == str(active) and \
                    values.get("disturbance_windows") == str(windows)
            return predicate

        wait_for(diagnostics_say(True, 1), what="diagnostics: window armed")
        assert "disturbance window 0" in peer.last_status("sim_driver_node").message
        peer.answering = True
        peer.pub.publish(JointState(name=["shoulder", "elbow"], effort=[5.0, 7.0]))   # answers state 0 (stamp 0)
        wait_for(lambda: sim.finished, what="trial over (window + 0.1 s)")
        wait_for(diagnostics_say(False, 1), what="diagnostics: window over")

    data = np.load(record)
    mode, u = data["mode"], data["u"]
    window = mode == MODE_CODES["reset"]
    assert window[:100].all() and not window[100:].any() and len(mode) == 100 + 50   # duration after the window
    assert np.abs(u[window]).max() == 4.0 and np.abs(u[window, 1]).max() > 0.5     # bounded; the passive torqued
    assert np.all(u[~window, 1] == 0.0) and np.all(u[~window, 0] == 5.0)           # then exactly 0 / the command
    np.testing.assert_array_equal(data["disturbance_windows"], [[0, 100]])
    np.testing.assert_array_equal(data["disturbance_targets"], [expected_target])
    reference = offline(x0, expected_target, 4.0, 50)
    np.testing.assert_array_equal(data["x"], reference.x)
    np.testing.assert_array_equal(u, reference.u)
    # joint_states: every state a window step led to or leaves from is marked, none after it
    frames = {stamp_ns(m) // 2_000_000: m.header.frame_id for m in peer.received}
    assert all(frames[k] == RESET_FRAME for k in range(1, 101))
    assert all(frames[k] == "" for k in range(101, 150))   # the last state (150) is not published


@pytest.mark.parametrize("overrides, words", [
    ({"protocol.enabled": True}, "protocol"),
    ({"disturbance.torque_limit": 0.0}, "torque_limit is 0"),
])
def test_sim_driver_refuses_a_window_it_cannot_run(overrides, words):
    with rig() as r:
        sim = r.add(make_sim(r.context, mode="lockstep", **overrides))
        ok, message = sim.start_disturbance()
        assert not ok and words in message and sim.window is None


def test_sim_driver_refuses_a_window_after_stop_and_a_limit_above_6():
    with rig() as r:
        sim = r.add(make_sim(r.context, mode="lockstep"))
        sim.robot.stopped = True
        ok, message = sim.start_disturbance()
        assert not ok and "stopped" in message
        with pytest.raises(ParameterError, match="disturbance.torque_limit"):
            make_sim(r.context, **{"disturbance.torque_limit": 6.5})


def test_reader_keeps_reset_marked_states_and_their_neighbours_from_the_model(tmp_path):
    """States marked frame_id "reset" invalidate every 20 ms interval that overlaps (t[j0-1], t[j1]) of a marked
    run j0..j1 (the state after a window is always marked, the one it starts from maybe not), or (t[j-1], t[j+1])
    of a lone marked state, even when the effort recorded on the passive joint is 0 (e.g. a bag without effort or a
    tiny PID torque)."""
    from test_trials import DT_NS, T0, joint_state

    from mcpilco_core import recording

    n = 301
    x = np.zeros((n, 4))
    x[:, 0] = np.arange(n) * 0.001
    recorder = recording.TrialRecorder(tmp_path / "bag")
    marked = set(range(53, 58)) | {100}
    for k in range(n):
        ns = T0 + k * DT_NS
        frame = RESET_FRAME if k in marked else ""
        recorder.write(recording.STATE_TOPIC, joint_state(ns, x[k, :2], x[k, 2:], (0.5, 0.0), frame=frame), ns)
        recorder.write(recording.COMMAND_TOPIC, joint_state(ns, effort=(0.5, 0.0), frame="policy"), ns + 1000)
    recorder.close()
    trial = recording.load_trial(tmp_path / "bag", PENDUBOT)
    assert len(trial) == 30
    assert list(np.flatnonzero(~trial.valid)) == [5, 9, 10]          # (0.104, 0.114) s and (0.198, 0.202) s
    assert list(np.flatnonzero(trial.mode == "reset")) == [5, 9, 10]
    assert "3 interval(s) of 20 ms in reset/disturbance windows" in " ".join(trial.notes)
    assert len(trial.transitions(PENDUBOT.actuated_joint)) == 27
    handed = trial.handed_over_states()                     # the states where each marked run's intervals end
    np.testing.assert_array_equal(handed, trial.x[[6, 11]])
    assert recording.LoadResult([trial, trial]).handed_over_states().shape == (4, 4)


def make_trainer(context, tmp_path, **overrides):
    from mcpilco_ros.trainer_node import TrainerNode

    params = {"session_dir": str(tmp_path / "session"), "run_dir": str(tmp_path / "run"),
              "diagnostics_period": 0.1, "controller": "", "flush_period": 0.05, **overrides}
    return TrainerNode(context=context, cli_args=["--ros-args", "--params-file", str(CONFIG / "pendubot.yaml")],
                       parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])


def test_trainer_disturbance_trial_records_the_window_marked_and_notes_it_in_session_yaml(tmp_path):
    """~/start_disturbance_trial: recording first, then the driver's ~/disturb; the bag's window never reaches
    the model, the trial's session.yaml entry holds the driver's answer."""
    import yaml

    from mcpilco_core import recording

    with rig() as r:
        # lockstep_timeout: an answer later than this (wall time) steps the robot with zero torque; on a loaded
        # 2-core machine the default 0.1 s was exceeded once in a while (0.45 N m in one 20 ms interval)
        sim = r.add(make_sim(r.context, mode="lockstep", initial_state=[0.2, 0.0, 0.0, 0.0], duration=0.3,
                             lockstep_timeout=1.0, **{"disturbance.seed": 5}))
        trainer = r.add(make_trainer(r.context, tmp_path))
        peer = r.add(AnsweringPeer(r.context, effort=(0.5, 0.0)))
        start = peer.create_client(Trigger, "/trainer_node/start_disturbance_trial")
        stop = peer.create_client(Trigger, "/trainer_node/stop_trial")
        r.start()
        wait_for(lambda: trainer.disturbance_client() is not None, what="trainer sees the driver's ~/disturb")
        answer = r.call(start, Trigger.Request())
        assert answer.success and "disturbance window requested from /sim_driver_node/disturb" in answer.message
        wait_for(lambda: trainer.disturbance_answers == 1, what="the driver's answer")
        assert trainer.disturbance_requests == 1 and json.loads(trainer.last_disturbance)["seed"] == 5
        wait_for(lambda: trainer.recorder.counts.get(recording.STATE_TOPIC, 0) > 0, what="recording states")
        peer.answering = True
        peer.pub.publish(JointState(name=["shoulder", "elbow"], effort=[0.5, 0.0]))
        wait_for(lambda: sim.finished, what="trial over")
        wait_for(lambda: trainer.recorder.counts.get(recording.STATE_TOPIC, 0) >= 250, what="states recorded")
        assert r.call(stop, Trigger.Request()).success
    info = yaml.safe_load((tmp_path / "session" / "session.yaml").read_text())
    window = info["trials"][0]["disturbance"]
    assert window["status"] == "accepted" and window["index"] == 0 and window["start_step"] == 0
    np.testing.assert_array_equal(window["target"], DisturbanceTargets(5).next())
    trial = recording.load_trial(tmp_path / "session" / "trial_000", PENDUBOT)
    # the window: states 1..100 marked (state 0 went out before the window was armed), its 100 steps (state 0 to
    # 100) out: intervals 0..9 (to 0.2 s); the state it handed over starts the data
    assert list(np.flatnonzero(~trial.valid)) == list(range(10)) and set(trial.mode[:10]) == {"reset"}
    assert len(trial) >= 24 and np.all(trial.u[10:, 1] == 0.0) and np.allclose(trial.u[10:, 0], 0.5)
    np.testing.assert_array_equal(trial.handed_over_states(), trial.x[[10]])


def test_trainer_refuses_a_disturbance_trial_without_a_driver_before_recording(tmp_path):
    with rig() as r:
        trainer = r.add(make_trainer(r.context, tmp_path, driver="nobody", disturbance_trials=True))
        ok, message = trainer.start_trial()
        assert not ok and "/nobody/disturb" in message and trainer.recorder is None
        ok, message = trainer.start_trial(disturb=True)
        assert not ok and not trainer.session.bags() and trainer.session.info["trials"] == []
        ok, message = trainer.start_trial(disturb=False)        # a plain trial still records
        assert ok and trainer.recorder is not None
        trainer.stop_trial()


class SilentDriver(Node):
    """A driver named sim_driver_node whose ~/disturb starts a window (shown in its diagnostics at once) but whose
    answer comes only when released: what a DDS service does when it drops the response (a just-started server
    on a loaded machine). Runs in its own rig: its callback blocks its executor."""

    def __init__(self, context, show_window: bool, earlier: bool = False) -> None:
        super().__init__("sim_driver_node", context=context)
        self.show_window, self.requests, self.release = show_window, 0, threading.Event()
        self.earlier = earlier      # diagnostics show an earlier trial driver's window: only the JSON changes
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "diagnostics", 10)
        self.create_service(Trigger, "~/disturb", self._on_disturb)
        self.create_timer(0.05, self._publish)

    def _on_disturb(self, request, response):
        self.requests += 1
        self._publish()
        self.release.wait(timeout=20.0)
        response.success, response.message = True, json.dumps({"index": 0, "late": True})
        return response

    def _publish(self) -> None:
        shown = self.show_window and self.requests > 0
        answer = json.dumps({"index": 0, "target": [0.1, -0.2], "seed": 9, "torque_limit": 6.0}) if shown else ""
        values = {"disturbance_windows": str(int(shown)), "disturbance_last": answer}
        if self.earlier and not shown:
            values = {"disturbance_windows": "1", "disturbance_last": json.dumps({"index": 0, "target": [2.0, 1.0],
                                                                                  "seed": 8, "torque_limit": 6.0})}
        self.diagnostics_pub.publish(DiagnosticArray(status=[DiagnosticStatus(
            name="sim_driver_node: simulated robot", values=[KeyValue(key=k, value=v) for k, v in values.items()])]))


@pytest.mark.parametrize("show_window, earlier", [(True, False), (True, True), (False, False), (False, True)],
                         ids=["window-in-diagnostics", "after-an-earlier-driver", "nothing", "nothing-new"])
def test_trainer_settles_a_lost_disturb_answer_from_the_drivers_diagnostics(tmp_path, show_window, earlier):
    """A lost ~/disturb answer: the driver's diagnostics name the window (accepted, answered_by diagnostics), or
    after 10 x disturb_answer_timeout a refusal names the silence; the call is made once, a late answer ignored."""
    import yaml

    with rig() as r, rig() as d:
        driver = d.add(SilentDriver(d.context, show_window, earlier))
        trainer = r.add(make_trainer(r.context, tmp_path, disturb_answer_timeout=0.3))
        r.start()
        d.start()
        try:
            wait_for(lambda: trainer.disturbance_client() is not None and "sim_driver_node" in trainer.driver_status,
                     what="trainer sees the driver")
            ok, message = trainer.start_trial(disturb=True)
            assert ok
            wait_for(lambda: trainer.disturbance_answers == 1, what="the trainer settling the call")
            assert driver.requests == 1 and trainer.disturbance_requests == 1
            settled = trainer.last_disturbance
            if show_window:
                assert json.loads(settled)["target"] == [0.1, -0.2]
            else:
                assert "no answer from /sim_driver_node/disturb within" in settled
        finally:
            driver.release.set()
        time.sleep(0.5)      # the late answer arrives and is ignored
        assert trainer.disturbance_answers == 1 and trainer.last_disturbance == settled
        trainer.stop_trial()
    window = yaml.safe_load((tmp_path / "session" / "session.yaml").read_text())["trials"][0]["disturbance"]
    if show_window:
        assert window["status"] == "accepted" and window["answered_by"] == "diagnostics" and window["seed"] == 9
    else:
        assert window["status"] == "refused" and "no new window in its diagnostics" in window["reason"]
