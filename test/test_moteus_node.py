"""moteus_driver_node over ROS: in-process against a virtual CAN bus, and as a separate process over a pty
speaking the fdcanusb protocol (signals, a missing controller, and LQR balancing end to end)."""

from __future__ import annotations

import contextlib
import math
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
from _ros_helpers import wait_for  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402
from std_srvs.srv import SetBool, Trigger  # noqa: E402

from mcpilco_core.hardware.config import load_driver_config  # noqa: E402
from mcpilco_core.hardware.emulator import FdcanusbPtyEmulator, VirtualCanEmulator, robot_bus  # noqa: E402
from mcpilco_core.plant import DoublePendulum  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config"



def params_file(tmp_path: Path, robot: str, transport: str, watchdog: float | None = None) -> Path:
    """The shipped driver params with the transport section (and optionally the watchdog) replaced."""
    text = (CONFIG / f"moteus_driver_{robot}.yaml").read_text()
    if watchdog is not None:
        text = text.replace("watchdog_timeout: 0.05", f"watchdog_timeout: {watchdog}")
    head, _, tail = text.partition("    transport:\n")
    joints = tail[tail.index("    joints:"):]
    path = tmp_path / f"driver_{robot}.yaml"
    path.write_text(head + "    transport:\n" + transport + joints)
    return path


class Probe:
    """A test node: joint_states / diagnostics counters, a joint_commands publisher, a ~/stop client."""

    def __init__(self) -> None:
        self.node = rclpy.create_node(f"probe_{uuid.uuid4().hex[:8]}")
        self.states: list[JointState] = []
        self.diagnostics: list[DiagnosticArray] = []
        self.node.create_subscription(JointState, "joint_states", self.states.append, 10)
        self.node.create_subscription(DiagnosticArray, "diagnostics", self.diagnostics.append, 10)
        self.commands = self.node.create_publisher(JointState, "joint_commands", 10)
        self.stop_client = self.node.create_client(Trigger, "/moteus_driver_node/stop")

    def command(self, effort: tuple[float, float]) -> None:
        msg = JointState()
        msg.header.stamp = self.node.get_clock().now().to_msg()
        msg.name = ["shoulder", "elbow"]
        msg.effort = [float(effort[0]), float(effort[1])]
        self.commands.publish(msg)


@pytest.fixture
def ros() -> Iterator[Callable[..., tuple[SingleThreadedExecutor, Probe]]]:
    started: list = []

    def start(args: list[str] | None = None, nodes: tuple = ()) -> tuple[SingleThreadedExecutor, Probe]:
        rclpy.init(args=args)
        probe = Probe()
        executor = SingleThreadedExecutor()
        for node in (probe.node, *nodes):
            executor.add_node(node)
        thread = threading.Thread(target=executor.spin, daemon=True)
        thread.start()
        started.append((executor, thread, probe))
        return executor, probe

    yield start
    for executor, thread, _ in started:
        executor.shutdown()
        thread.join(5.0)
    rclpy.try_shutdown()


@contextlib.contextmanager
def driver_node_in_process(path: Path, bus, channel: str) -> Iterator[tuple]:
    """moteus_driver_node (params file ``path``) against the emulated controllers ``bus`` on the virtual CAN
    ``channel``, spun with a :class:`Probe` in one executor thread; (node, probe) while it runs, all shut down after."""
    from mcpilco_ros.moteus_driver_node import MoteusDriverNode

    with VirtualCanEmulator(bus, channel):
        rclpy.init(args=["--ros-args", "--params-file", str(path)])
        node = MoteusDriverNode()
        executor, probe = SingleThreadedExecutor(), Probe()
        executor.add_node(node)
        executor.add_node(probe.node)
        thread = threading.Thread(target=executor.spin, daemon=True)
        thread.start()
        try:
            yield node, probe
        finally:
            executor.shutdown()
            thread.join(5.0)
            node.destroy_node()
            probe.node.destroy_node()
            rclpy.try_shutdown()


@pytest.mark.timeout(30)
def test_node_in_process_states_commands_diagnostics_stop(tmp_path: Path, ros: Callable) -> None:

    channel = f"node-{uuid.uuid4().hex}"
    path = params_file(tmp_path, "pendubot", f"      kind: pythoncan\n      interface: virtual\n      channel: "
                                            f"{channel}\n      can_timeout: 0.2\n      max_consecutive_timeouts: 20\n",
                       watchdog=0.5)
    config = load_driver_config(path)
    bus = robot_bus(config, DoublePendulum.from_yaml(CONFIG / "pendubot.yaml"), (0.2, 0.0, 0.0, 0.0))
    with driver_node_in_process(path, bus, channel) as (node, probe):
        shoulder, elbow = bus.motor(1), bus.motor(2)
        wait_for(lambda: len(probe.states) > 20, what="joint_states")
        msg = probe.states[-1]
        assert list(msg.name) == ["shoulder", "elbow"] and len(msg.position) == 2
        age = time.time() - (msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec)
        assert 0.0 <= age < 1.0                                   # stamped with the measurement time
        assert shoulder.commands[0x022] == 0.0                    # zero torque before any command
        wait_for(lambda: probe.commands.get_subscription_count() > 0, what="joint_commands matched")
        wait_for(lambda: (probe.command((1.25, 2.0)), shoulder.commands[0x022] == pytest.approx(1.25))[1],
                 what="command reaching the actuated motor")
        assert elbow.max_commanded_torque == 0.0 and bus.rig.passive_torque_peak == 0.0
        wait_for(lambda: any(len(d.status) == 3 for d in probe.diagnostics), what="diagnostics")
        diag = probe.diagnostics[-1]
        names = [s.name for s in diag.status]
        assert names == ["moteus_driver_node: loop", "moteus_driver_node: shoulder", "moteus_driver_node: elbow"]
        motor_keys = {kv.key for kv in diag.status[1].values}
        assert {"mode", "fault", "fault_name", "temperature_C", "voltage_V"} <= motor_keys
        loop = {kv.key: kv.value for kv in diag.status[0].values}
        assert {"rate_hz", "period_p50_ms", "period_p99_ms", "late_cycles", "rtt_p99_ms"} <= set(loop)
        assert probe.stop_client.wait_for_service(timeout_sec=5.0)
        future = probe.stop_client.call_async(Trigger.Request())
        wait_for(future.done, what="~/stop answer")
        assert future.result().success
        wait_for(lambda: shoulder.mode == 0 and elbow.mode == 0, what="both motors stopped")
        n = len(probe.states)
        probe.command((1.0, 0.0))
        wait_for(lambda: len(probe.states) > n + 10, what="joint_states after the stop")
        assert shoulder.mode == 0                                  # latched
    assert not node.runner.is_alive() and node.runner.stopped_cleanly


def _start_node(path: Path, module: str = "mcpilco_ros.moteus_driver_node",
                extra: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, "--ros-args", "--params-file", str(path), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(30)
def test_missing_controller_refused_with_id_and_transport(tmp_path: Path) -> None:
    bus = robot_bus(load_driver_config(CONFIG / "moteus_driver_pendubot.yaml"))
    bus.motor(2).silent = True
    with FdcanusbPtyEmulator(bus) as emulator:
        path = params_file(tmp_path, "pendubot", f"      kind: fdcanusb\n      path: {emulator.path}\n"
                                                 "      can_timeout: 0.1\n")
        proc = _start_node(path)
        out, _ = proc.communicate(timeout=25)
    assert proc.returncode == 2, out
    assert "CAN id 2" in out and "elbow" in out and emulator.path in out and "fdcanusb" in out


@pytest.mark.timeout(40)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cross_process_pty_and_signals_stop_both(tmp_path: Path, ros: Callable, sig: int) -> None:
    bus = robot_bus(load_driver_config(CONFIG / "moteus_driver_pendubot.yaml"))
    with FdcanusbPtyEmulator(bus) as emulator:
        bus.motor(1).inject_fault(33)                      # latched from "before": cleared by the startup stop
        # generous timeouts: the node process shares two cores with other test runs (the timeout paths
        # themselves are tested in-process in test_moteus_driver.py;
        # the motors' watchdog is the longest the config allows: see the end-to-end test below)
        path = params_file(tmp_path, "pendubot", f"      kind: fdcanusb\n      path: {emulator.path}\n"
                                                 "      can_timeout: 0.2\n      max_consecutive_timeouts: 20\n",
                           watchdog=1.0)
        proc = _start_node(path)
        try:
            _, probe = ros()
            wait_for(lambda: len(probe.states) > 10, timeout=20, what="joint_states from the node process")
            assert bus.motor(1).fault == 0
            wait_for(lambda: probe.commands.get_subscription_count() > 0, what="joint_commands matched")
            wait_for(lambda: (probe.command((-0.75, 0.0)), bus.motor(1).commands[0x022] == pytest.approx(-0.75))[1],
                     what="command over the pty")
            assert bus.motor(1).mode == 10 and emulator.lines_received > 20
            proc.send_signal(sig)
            out, _ = proc.communicate(timeout=10)
            assert proc.returncode == 0, out
            assert bus.motor(1).mode == 0 and bus.motor(2).mode == 0
            assert list(bus.motor(1).frames)[-1].writes[0][0] == 0x000      # the last frame was a stop
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def rig_report(bus, probe: Probe) -> str:
    """What the emulated motors and the nodes' diagnostics last said: the message of a failed wait, so a failure
    on a loaded CI machine says whether the driver latched a stop (e.g. a motor watchdog timeout after a stall)."""
    lines = ["motors: " + ", ".join(f"id {m.can_id} mode {m.mode} fault {m.fault} torque {m.torque:.3f}"
                                     for m in bus.motors) + f"; frames handled {bus.frames_handled}"]
    latest: dict[str, str] = {}
    for array in probe.diagnostics:
        for st in array.status:
            values = ", ".join(f"{kv.key}={kv.value}" for kv in st.values)
            latest[st.name] = f"{st.name}: {st.message} [{values}]"
    return "\n".join(lines + list(latest.values()))


@pytest.mark.timeout(80)
def test_end_to_end_lqr_balances_through_emulated_hardware(tmp_path: Path, ros: Callable) -> None:
    """controller_node (LQR) -> joint_commands -> moteus_driver_node -> fdcanusb pty -> emulated moteus + plant."""
    plant = DoublePendulum.from_yaml(CONFIG / "pendubot.yaml")
    x0 = (math.pi - 0.08, 0.1, 0.0, 0.0)
    # the plant runs at a quarter of wall-clock speed: three Python processes share two cores with other test
    # runs, and a stalled control loop must not be mistaken for a bad controller
    bus = robot_bus(load_driver_config(CONFIG / "moteus_driver_pendubot.yaml"), plant, x0, hold=True,
                    time_scale=0.25)
    with FdcanusbPtyEmulator(bus) as emulator:
        # three Python processes share this machine's two cores (with other test runs): generous timeouts, so a
        # scheduling stall is not mistaken for a dead driver (the safety tests cover the tight values). The
        # motors' watchdog is the longest the driver config allows: a driver process stalled longer than it
        # puts the shoulder in mode 11, and the driver latches a stop (as on the robot) that no command lifts.
        path = params_file(tmp_path, "pendubot", f"      kind: fdcanusb\n      path: {emulator.path}\n"
                                                 "      can_timeout: 0.2\n      max_consecutive_timeouts: 20\n",
                           watchdog=1.0)
        # the controller first, and the driver once it is up: their start-ups (imports, discovery) do not
        # compete for the cores while the driver's watchdog runs
        controller = _start_node(CONFIG / "pendubot.yaml", "mcpilco_ros.controller_node")
        driver = None
        try:
            _, probe = ros()
            enable = probe.node.create_client(SetBool, "/controller_node/enable")
            assert enable.wait_for_service(timeout_sec=30.0), "controller_node did not come up"
            driver = _start_node(path)
            try:
                wait_for(lambda: len(probe.states) > 10, timeout=20, what="joint_states from the driver process")
                future = enable.call_async(SetBool.Request(data=True))     # arm the controller, as on the robot
                wait_for(future.done, what="~/enable answer")
                assert future.result().success
                wait_for(lambda: not bus.rig.hold, timeout=30, what="the controller's first torque")
                t_release = bus.rig.t
                wait_for(lambda: bus.rig.t - t_release > 2.5, timeout=30, what="2.5 s (simulated) of balancing")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{rig_report(bus, probe)}") from None
            history = [(t, x) for t, x, _ in list(bus.rig.history) if t > t_release + 1.0]
            xs = np.array([x for _, x in history])
            assert len(xs) > 500
            heights = plant.end_effector_height(xs)
            assert heights.min() > plant.height_threshold, "the pendulum fell"
            assert np.abs(xs[-200:, 0] - math.pi).max() < 0.05 and np.abs(xs[-200:, 1]).max() < 0.05
            assert bus.rig.passive_torque_peak == 0.0 and bus.motor(2).mode == 0
            assert driver.poll() is None and controller.poll() is None
        finally:
            procs = [p for p in (controller, driver) if p is not None]
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            outs = [proc.communicate(timeout=10)[0] for proc in procs]
        assert driver.returncode == 0, outs[1]
        assert bus.motor(1).mode == 0
