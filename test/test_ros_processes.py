"""The console scripts as separate processes with ``--ros-args --params-file`` (what the launch files
start): the simulated robot balanced by the controller, refusal of bad parameter files, and the lockstep
protocol run that must reproduce ``mcpilco evaluate`` exactly."""

from __future__ import annotations

import math
import signal
import subprocess
import sys

import numpy as np
import pytest
import yaml

pytest.importorskip("rclpy")
from _ros_helpers import (  # noqa: E402
    CONFIG,
    Peer,
    console_script,
    joint_state,
    level,
    node_process,
    rig,
    ros_env,
    status_values,
    wait_for,
)
from rclpy.exceptions import InvalidHandle  # noqa: E402
from rclpy.node import Node  # noqa: E402
from std_srvs.srv import SetBool, Trigger  # noqa: E402

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.evaluation import evaluate_seed  # noqa: E402
from mcpilco_ros._ros_utils import OK, stamp_ns  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def params_file(path, sections: dict) -> str:
    path.write_text(yaml.safe_dump({n: {"ros__parameters": v} for n, v in sections.items()}), encoding="utf-8")
    return path


def test_a_closed_rig_leaves_no_node_and_no_participant_behind():
    """Every node of a closed rig is destroyed and so is its context (the DDS participant), even while the test
    still holds them: a participant left to the garbage collector went on announcing a trainer_node's services
    to the next test's processes, whose service call then went to that dead server (test_trainer_crash.py failed
    after test_trainer_node.py)."""
    with rig() as gone:
        nodes = [gone.add(Node(f"closed_rig_node_{k}", context=gone.context)) for k in range(3)]
        gone.start()
    for node in nodes:
        with pytest.raises(InvalidHandle):
            node.get_name()
    with pytest.raises(InvalidHandle), gone.context.handle:
        pass
    with rig() as present, rig() as r:
        present.add(Node("present_node", context=present.context))
        observer = r.add(Node("observer", context=r.context))
        present.start()
        r.start()
        wait_for(lambda: "present_node" in observer.get_node_names(), what="the other participant discovered")
        assert not [name for name in observer.get_node_names() if name.startswith("closed_rig_node")]


def test_controller_balances_the_simulated_robot_across_processes(tmp_path):
    overrides = params_file(tmp_path / "o.yaml", {
        # upright at rest: it stays there (slowly diverging) until the controller, armed by the test, holds it
        "sim_driver_node": {"initial_state": [math.pi, 0.0, 0.0, 0.0], "diagnostics_period": 0.2},
        "controller_node": {"diagnostics_period": 0.2}})
    robot = CONFIG / "pendubot.yaml"
    with node_process("sim_driver_node", robot, overrides, log=tmp_path / "sim.log"), \
            node_process("controller_node", robot, overrides, log=tmp_path / "controller.log"), rig() as r:
        observer = r.add(Peer(r.context, "unused_topic", "joint_states", name="observer"))
        commands = r.add(Peer(r.context, "unused_topic2", "joint_commands", name="command_observer"))
        enable = observer.create_client(SetBool, "/controller_node/enable")
        stop = observer.create_client(Trigger, "/sim_driver_node/stop")
        r.start()
        wait_for(lambda: len(observer.received) > 10, 20, "joint_states from the simulated robot")
        assert r.call(enable, SetBool.Request(data=True), timeout=20).success
        wait_for(lambda: len(commands.received) > 500, 20, "500 commands")
        answers = [c for c in commands.received[-100:] if c.header.frame_id != "safe"]  # not watchdog zeros
        assert answers
        newest = max(stamp_ns(c) for c in answers)      # its state may reach the observer after its answer does
        wait_for(lambda: any(stamp_ns(m) >= newest for m in observer.received), 10, "the states the commands answer")
        state_stamps = {stamp_ns(m) for m in observer.received}
        assert all(stamp_ns(c) in state_stamps for c in answers)  # each answers a state
        assert all(c.effort[1] == 0.0 for c in commands.received)
        last = observer.received[-1]
        assert abs(last.position[0] - math.pi) < 0.05 and abs(last.position[1]) < 0.05   # balanced upright
        wait_for(lambda: (st := observer.last_status("controller")) is not None and level(st) == OK
                 and status_values(st)["mode"] == "lqr", 10, "controller diagnostics: lqr, OK")
        wait_for(lambda: observer.last_status("simulated robot") is not None, 10, "simulated robot diagnostics")
        assert r.call(stop, Trigger.Request()).success
        count = len(observer.received)
        wait_for(lambda: len(observer.received) > count + 20, 10, "states after stop")
        assert tuple(observer.received[-1].effort) == (0.0, 0.0)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signalled_armed_controller_process_publishes_a_zero_command_on_its_way_out(tmp_path, sig):
    """run_node calls the node's on_shutdown on SIGINT and on SIGTERM (what a launch or systemd sends): the armed
    controller's last message is a zero command, so the driver stops at once; long before the controller's 10 s
    watchdog could publish one, and the process exits 0."""
    overrides = params_file(tmp_path / "o.yaml", {"controller_node": {"arm_on_start": True, "watchdog_timeout": 10.0}})
    log = tmp_path / "controller.log"
    with node_process("controller_node", CONFIG / "pendubot.yaml", overrides, log=log) as proc, rig() as r:
        peer = r.add(Peer(r.context, "joint_states", "joint_commands"))
        r.start()
        state = joint_state((math.pi + 0.05, -0.02), stamp_ns=1_000_000)    # upright: the LQR answers
        wait_for(lambda: len(peer.received) > 0 or peer.pub.publish(state), 30, "an answer from the controller process")
        count = len(peer.received)
        assert all(m.header.frame_id == "lqr" for m in peer.received)
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0, log.read_text()
        wait_for(lambda: len(peer.received) > count, 5, "the zero command on the way out")
        assert peer.received[-1].header.frame_id == "safe" and list(peer.received[-1].effort) == [0.0, 0.0]


def test_bad_parameter_file_exits_with_the_reason(tmp_path):
    bad = params_file(tmp_path / "bad.yaml", {"controller_node": {"watchdog_timeout": -1.0}})
    for name in ("controller_node", "sim_driver_node"):
        cmd = console_script(name) + ["--ros-args", "--params-file", str(CONFIG / "pendubot.yaml"),
                                      "--params-file", str(params_file(tmp_path / "t.yaml", {"/**": {
                                          "torque_limit": 2.0, "u_max": 3.0}}))]
        done = subprocess.run(cmd, env=ros_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "refusing to start" in done.stderr and "u_max" in done.stderr
    done = subprocess.run(console_script("controller_node") + ["--ros-args", "--params-file", str(bad)],
                          env=ros_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "watchdog_timeout" in done.stderr, done.stderr


@pytest.mark.parametrize("profile", ["nominal", "hardware_proxy"])
def test_lockstep_protocol_over_ros_reproduces_the_evaluator_exactly(tmp_path, profile):
    """Seed 3, 6 s (the first disturbance falls in 2.75-4.75 s): same states to the last bit, on the nominal robot
    and on the hardware proxy (delay, motor lag, measurement and torque noise seeded by the protocol seed)."""
    record = tmp_path / "run.npz"
    overrides = params_file(tmp_path / "o.yaml", {
        "controller_node": {"arm_on_start": True, "watchdog_timeout": 2.0},
        "sim_driver_node": {"mode": "lockstep", "lockstep_timeout": 2.0, "robot_profile": profile,
                            "protocol": {"enabled": True, "seed": 3, "publish_during_resets": False},
                            "duration": 6.0, "record_file": str(record), "exit_when_done": True}})
    robot = CONFIG / "pendubot.yaml"
    with node_process("controller_node", robot, overrides, log=tmp_path / "controller.log"), \
            node_process("sim_driver_node", robot, overrides, log=tmp_path / "sim.log") as sim:
        assert sim.wait(timeout=60) == 0, (tmp_path / "sim.log").read_text()
    data = np.load(record)
    config = load_robot_config(robot)
    reference = evaluate_seed(build_controller(config), config, 3, duration=6.0, profile=profile)
    assert int(data["lockstep_timeouts"]) == 0 and str(data["robot_profile"]) == profile
    assert len(reference.windows) == 1 and np.allclose(data["windows"], reference.windows)
    np.testing.assert_array_equal(data["x"], reference.trajectory.x)
    np.testing.assert_array_equal(data["x_measured"], reference.trajectory.extras["x_measured"])
    np.testing.assert_array_equal(data["u"], reference.trajectory.u)
    np.testing.assert_array_equal(data["mode"], reference.trajectory.mode)
    assert float(data["score"]) == reference.score
    if profile != "nominal":   # the controller saw delayed, noisy states and the motors lagged
        assert not np.array_equal(data["x_measured"], data["x"])
        assert np.any(data["u"][1:, 0] != data["u_cmd"][1:, 0])


def test_the_tests_keep_their_own_domain_and_localhost_whatever_the_shell_exported():
    """A ROS_DOMAIN_ID, discovery range or static peers exported for a robot must not reach the tests' nodes."""
    shell = {**ros_env(), "ROS_DOMAIN_ID": "0", "ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET",
             "ROS_STATIC_PEERS": "192.0.2.1", "ROS_DISTRO": "humble"}
    probe = ("import os, sys; sys.path.insert(0, 'test'); import conftest; "
             "print(os.environ['ROS_DOMAIN_ID'], os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'], "
             "os.environ.get('ROS_STATIC_PEERS'), os.environ.get('ROS_LOCALHOST_ONLY'))")
    done = subprocess.run([sys.executable, "-c", probe], env=shell, cwd=CONFIG.parent, capture_output=True, text=True,
                          timeout=60, check=True)
    domain, discovery, peers, localhost_only = done.stdout.split()
    assert 1 <= int(domain) <= 99 and discovery == "LOCALHOST" and peers == "None"
    assert localhost_only == "1"    # Humble's rcl ignores ROS_AUTOMATIC_DISCOVERY_RANGE


def test_demo_and_session_nodes_stay_on_this_machine_on_humble_too(monkeypatch):
    from mcpilco_ros.demo import ros_environment

    monkeypatch.delenv("ROS_LOCALHOST_ONLY", raising=False)
    monkeypatch.setenv("ROS_DISTRO", "jazzy")
    assert ros_environment()["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
    assert "ROS_LOCALHOST_ONLY" not in ros_environment()     # deprecated from Jazzy on: a warning in every node
    monkeypatch.setenv("ROS_DISTRO", "humble")
    assert ros_environment()["ROS_LOCALHOST_ONLY"] == "1"


def test_demo_and_session_nodes_log_beside_their_run_unless_the_caller_chose_a_log_folder(monkeypatch, tmp_path):
    from mcpilco_ros.demo import ros_environment

    monkeypatch.delenv("ROS_LOG_DIR", raising=False)
    env = ros_environment(tmp_path / "run" / "ros_log")
    assert env["ROS_LOG_DIR"] == str((tmp_path / "run" / "ros_log").resolve())
    assert (tmp_path / "run" / "ros_log").is_dir()
    monkeypatch.setenv("ROS_LOG_DIR", str(tmp_path / "mine"))
    assert ros_environment(tmp_path / "run" / "ros_log")["ROS_LOG_DIR"] == str(tmp_path / "mine")
