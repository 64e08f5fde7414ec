"""Helpers for the ROS tests: an isolated rclpy context spun by a SingleThreadedExecutor in a thread,
a test node that plays the other side of an interface, and condition waits (never bare sleeps)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState

from mcpilco_ros._ros_utils import CONTROL_QOS

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config"


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.005)


class Rig:
    """A running context: nodes added to a SingleThreadedExecutor spinning in a background thread."""

    def __init__(self) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self._thread: threading.Thread | None = None

    def add(self, node: Node) -> Node:
        self.executor.add_node(node)
        return node

    def start(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=0.02)

    def close(self) -> None:
        """Stop and join the spinning thread, shut the executor down, destroy the nodes, then the context and its
        DDS participant (now, not at some later garbage collection: a participant left alive keeps announcing its
        nodes' endpoints to the next test's processes in this domain)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
        nodes = list(self.executor.get_nodes())   # before shutdown(), which forgets them
        self.executor.shutdown()
        for node in nodes:
            node.destroy_node()
        self.context.try_shutdown()
        self.context.handle.destroy_when_not_in_use()   # Context.destroy() does this, but Humble's rclpy lacks it

    def call(self, client, request, timeout: float = 10.0):
        """Call a service (its server spins in this rig) and return the response."""
        assert client.wait_for_service(timeout_sec=timeout), f"service {client.srv_name} not available"
        future = client.call_async(request)
        wait_for(future.done, timeout, f"answer of {client.srv_name}")
        return future.result()


@contextmanager
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.close()


class Peer(Node):
    """The other side: publishes on ``pub_topic`` and records what arrives on ``sub_topic`` and diagnostics."""

    def __init__(self, context, pub_topic: str, sub_topic: str, name: str = "test_peer") -> None:
        super().__init__(name, context=context)
        self.pub = self.create_publisher(JointState, pub_topic, CONTROL_QOS)
        self.received: list[JointState] = []
        self.diagnostics: list[DiagnosticArray] = []
        self.create_subscription(JointState, sub_topic, self.received.append, CONTROL_QOS)
        self.create_subscription(DiagnosticArray, "diagnostics", self.diagnostics.append, 10)

    def last_status(self, name_part: str):
        for array in reversed(self.diagnostics):
            for st in array.status:
                if name_part in st.name:
                    return st
        return None


def joint_state(q=(0.0, 0.0), dq=(0.0, 0.0), stamp_ns: int = 0, names=("shoulder", "elbow"),
                effort=None) -> JointState:
    msg = JointState()
    msg.header.stamp.sec = stamp_ns // 1_000_000_000
    msg.header.stamp.nanosec = stamp_ns % 1_000_000_000
    msg.name = list(names)
    msg.position = [float(v) for v in q]
    msg.velocity = [float(v) for v in dq]
    if effort is not None:
        msg.effort = [float(v) for v in effort]
    return msg


def status_values(st) -> dict[str, str]:
    return {kv.key: kv.value for kv in st.values}


def level(st) -> int:
    value = st.level
    return int.from_bytes(value, "little") if isinstance(value, bytes) else int(value)


def ros_env() -> dict[str, str]:
    """The environment for node subprocesses: this test process's isolated ROS settings."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def console_script(name: str) -> list[str]:
    """The installed console script ``name`` (beside this interpreter), else ``python -m`` of its module."""
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", f"mcpilco_ros.{name}"]


@contextmanager
def node_process(name: str, *params_files: Path, log: Path | None = None) -> Iterator[subprocess.Popen]:
    """Start a node console script with ``--ros-args --params-file ...``; always stopped at the end."""
    cmd = console_script(name) + ["--ros-args"]
    for path in params_files:
        cmd += ["--params-file", str(path)]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=ros_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log is not None:
            out.close()
