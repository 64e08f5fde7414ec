"""ROS runtime timing: state -> command latency, controller step compute time, simulated robot rate.

    python benchmarks/bench_ros_latency.py [--seconds 10] [--json out/bench/ros_latency.json]

1. in-process latency: this process publishes joint_states at 500 Hz to a ControllerNode spun by the same
   SingleThreadedExecutor and times each joint_commands answer (matched by stamp; perf_counter);
2. cross-process latency: the same against ``controller_node`` started as its own process;
3. step compute: ``Supervisor.step`` alone, in each mode (LQR near upright, policy with a 200-basis policy,
   damping), p50/p99/max;
4. the simulated robot: ``sim_driver_node`` (realtime) as its own process; its achieved rate and period
   jitter as seen by a subscriber here (receipt intervals) and from its own diagnostics (timer periods).

Numbers depend on the machine and its load; the README quotes them with the machine named.
Discovery stays on localhost and a private domain id is used (as in the tests).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mcpilco_ros.demo import keep_discovery_local  # imports no rclpy

# Imposed, as in test/conftest.py: a benchmark's nodes never join a robot's graph from an exported domain or range.
keep_discovery_local(os.environ, 200 + os.getpid() % 30)
os.environ.setdefault("ROS_LOG_DIR", tempfile.mkdtemp(prefix="mcpilco_bench_log_"))
os.environ.setdefault("AMENT_PREFIX_PATH", sys.prefix)

import numpy as np  # noqa: E402
import rclpy  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402

from mcpilco_core.config import load_robot_config  # noqa: E402
from mcpilco_core.control import build_controller  # noqa: E402
from mcpilco_core.paths import config_dir  # noqa: E402
from mcpilco_core.policy import SumOfGaussiansPolicy  # noqa: E402
from mcpilco_ros._ros_utils import CONTROL_QOS, stamp_ns  # noqa: E402
from mcpilco_ros.controller_node import ControllerNode  # noqa: E402

UPRIGHT = (math.pi + 0.02, -0.01, 0.0, 0.0)


def percentiles(samples_s: list[float]) -> dict[str, float]:
    a = np.asarray(samples_s) * 1e6
    return {"n": int(a.size), "p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "max_us": float(a.max()), "mean_us": float(a.mean())}


class Prober(Node):
    """Publishes states at a fixed rate and times the answers."""

    def __init__(self, context) -> None:
        super().__init__("latency_prober", context=context)
        self.pub = self.create_publisher(JointState, "joint_states", CONTROL_QOS)
        self.sent: dict[int, float] = {}
        self.latency: list[float] = []
        self.create_subscription(JointState, "joint_commands", self._on_command, CONTROL_QOS)
        self.k = 0

    def send(self) -> None:
        self.k += 1
        msg = JointState()
        ns = self.k * 2_000_000
        msg.header.stamp.sec, msg.header.stamp.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
        msg.name = ["shoulder", "elbow"]
        msg.position = [UPRIGHT[0], UPRIGHT[1]]
        msg.velocity = [0.0, 0.0]
        self.sent[ns] = time.perf_counter()
        self.pub.publish(msg)

    def _on_command(self, msg: JointState) -> None:
        sent = self.sent.pop(stamp_ns(msg), None)
        if sent is not None:
            self.latency.append(time.perf_counter() - sent)


def spin_until(executor, predicate, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not predicate() and time.monotonic() < end:
        executor.spin_once(timeout_sec=0.01)


def drive(executor, prober: Prober, seconds: float, period: float = 0.002) -> None:
    """Publish at 1/period from a timer on the same executor (a 500 Hz driver)."""
    timer = prober.create_timer(period, prober.send)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.01)
    timer.cancel()
    spin_until(executor, lambda: not prober.sent, 1.0)


def in_process_latency(seconds: float) -> dict:
    context = rclpy.Context()
    rclpy.init(context=context)
    executor = SingleThreadedExecutor(context=context)
    try:
        controller = ControllerNode(context=context, cli_args=["--ros-args", "--params-file",
                                                               str(config_dir() / "pendubot.yaml")],
                                    parameter_overrides=[Parameter("arm_on_start", value=True),
                                                         Parameter("watchdog_timeout", value=1.0)])
        prober = Prober(context)
        executor.add_node(controller)
        executor.add_node(prober)
        spin_until(executor, lambda: prober.pub.get_subscription_count() and controller.command_pub
                   .get_subscription_count(), 10)
        drive(executor, prober, seconds)
        result = percentiles(prober.latency[50:])
        result["answered"] = len(prober.latency)
        result["sent"] = prober.k
        result["node_step_compute"] = controller.step_time.summary(1e6)
        return result
    finally:
        executor.shutdown()
        context.try_shutdown()


def cross_process_latency(seconds: float) -> dict:
    context = rclpy.Context()
    rclpy.init(context=context)
    executor = SingleThreadedExecutor(context=context)
    overrides = Path(tempfile.mkdtemp()) / "o.yaml"
    overrides.write_text("controller_node:\n  ros__parameters:\n    arm_on_start: true\n    watchdog_timeout: 1.0\n")
    proc = subprocess.Popen([sys.executable, "-m", "mcpilco_ros.controller_node", "--ros-args", "--params-file",
                             str(config_dir() / "pendubot.yaml"), "--params-file", str(overrides)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        prober = Prober(context)
        executor.add_node(prober)
        spin_until(executor, lambda: prober.pub.get_subscription_count() and prober.count_publishers(
            "joint_commands"), 60)
        # the controller answers only once it is fully up: wait for a first answer
        spin_until(executor, lambda: (prober.send() or True) and bool(prober.latency), 30)
        prober.latency.clear()
        prober.sent.clear()
        drive(executor, prober, seconds)
        result = percentiles(prober.latency[50:])
        result["answered"] = len(prober.latency)
        return result
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        executor.shutdown()
        context.try_shutdown()


def step_compute(n: int = 20000) -> dict:
    config = load_robot_config(config_dir() / "pendubot.yaml")
    rng = np.random.default_rng(0)
    policy = SumOfGaussiansPolicy(rng.normal(size=(200, 6)), np.zeros(6), rng.normal(size=200), 3.0, "pendubot")
    supervisor = build_controller(config, policy)
    out = {}
    states = {"lqr": np.array(UPRIGHT), "policy": np.array([0.3, 0.1, 1.0, -0.5]),
              "damping": np.array([0.3, 0.1, 25.0, -5.0])}
    for mode, x in states.items():
        supervisor.reset()
        times = []
        for k in range(n):
            start = time.perf_counter()
            supervisor.step(x, k * 0.002)
            times.append(time.perf_counter() - start)
        assert supervisor.mode == mode, (mode, supervisor.mode)
        out[mode] = percentiles(times)
    # policy evaluated at every call (no hold): the worst case of a policy tick
    times = []
    for _ in range(2000):
        start = time.perf_counter()
        policy(states["policy"])
        times.append(time.perf_counter() - start)
    out["policy_evaluation_only"] = percentiles(times)
    return out


def sim_rate(seconds: float) -> dict:
    context = rclpy.Context()
    rclpy.init(context=context)
    executor = SingleThreadedExecutor(context=context)
    overrides = Path(tempfile.mkdtemp()) / "o.yaml"
    overrides.write_text("sim_driver_node:\n  ros__parameters:\n    diagnostics_period: 0.5\n")
    proc = subprocess.Popen([sys.executable, "-m", "mcpilco_ros.sim_driver_node", "--ros-args", "--params-file",
                             str(config_dir() / "pendubot.yaml"), "--params-file", str(overrides)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        node = Node("rate_observer", context=context)
        arrivals: list[float] = []
        stamps: list[int] = []
        diagnostics: list[DiagnosticArray] = []
        node.create_subscription(JointState, "joint_states",
                                 lambda m: (arrivals.append(time.perf_counter()), stamps.append(stamp_ns(m))),
                                 CONTROL_QOS)
        node.create_subscription(DiagnosticArray, "diagnostics", diagnostics.append, 10)
        executor.add_node(node)
        spin_until(executor, lambda: len(arrivals) > 500, 60)
        arrivals.clear()
        stamps.clear()
        spin_until(executor, lambda: False, seconds)
        intervals = np.diff(arrivals)
        stamp_intervals = np.diff(stamps) * 1e-9
        own = {}
        for array in reversed(diagnostics):
            for st in array.status:
                if "simulated robot" in st.name:
                    own = {kv.key: kv.value for kv in st.values}
                    break
            if own:
                break
        return {"messages": len(arrivals), "rate_hz_received": float(1.0 / intervals.mean()),
                "rate_hz_stamps": float(1.0 / stamp_intervals.mean()),
                "period_std_us_stamps": float(stamp_intervals.std() * 1e6),
                "period_p99_abs_dev_us_stamps": float(np.percentile(np.abs(stamp_intervals - 0.002), 99) * 1e6),
                "period_max_ms_stamps": float(stamp_intervals.max() * 1e3),
                "receipt_interval": percentiles(list(intervals)),
                "sim_own_diagnostics": {k: own.get(k) for k in ("rate_hz", "period_p50_ms", "period_p99_ms",
                                                                 "period_max_ms")}}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        executor.shutdown()
        context.try_shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="s of 500 Hz traffic per measurement")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results = {"machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()}}
    results["step_compute"] = step_compute()
    results["in_process"] = in_process_latency(args.seconds)
    results["cross_process"] = cross_process_latency(args.seconds)
    results["sim_rate"] = sim_rate(args.seconds)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    raise SystemExit(main())
