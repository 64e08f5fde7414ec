"""Loop timing of the simulated robot and the controller while a retrain runs (the trainer node's subprocess).

    python benchmarks/bench_retrain_loop.py [--phase 12] [--nice 10]

Starts sim_driver_node (realtime, 500 Hz) and controller_node (armed) as processes, listens to their
diagnostics, and reports the driver's tick period (p50/p99/max) and rate, and the controller's state period
and step compute time, first idle, then while `python -m mcpilco_core.learning.retrain retrain` runs back to back
at the given niceness on a session of simulated exploration trials (config/train_tiny.yaml).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def make_session(root: Path) -> None:
    from mcpilco_core import recording
    from mcpilco_core.config import load_robot_config
    from mcpilco_core.learning.learner import ExplorationController, run_on_robot
    from mcpilco_core.paths import config_dir

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))
    from test_trials import write_stream

    config = load_robot_config(config_dir() / "pendubot.yaml")
    session = recording.SessionDirectory.create(root, config)
    for seed in (1, 2, 3):
        traj = run_on_robot(config, ExplorationController(config, 3.0, np.random.default_rng(seed)), np.zeros(4), 2.0)
        recorder = session.start_trial("none")
        write_stream(recorder, traj.x, np.vstack([np.zeros((1, 2)), traj.u]), traj.u_cmd, ["policy"] * len(traj.u))
        session.finish_trial(recorder)


def listen(seconds: float, latest: dict) -> None:
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray

    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("bench_listener", context=context)

    def on_diag(msg: DiagnosticArray) -> None:
        for st in msg.status:
            latest[st.name.split(":")[0]] = {kv.key: kv.value for kv in st.values}

    node.create_subscription(DiagnosticArray, "diagnostics", on_diag, 10)
    executor = rclpy.executors.SingleThreadedExecutor(context=context)
    executor.add_node(node)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.1)
    executor.shutdown()
    node.destroy_node()
    context.try_shutdown()


def summary(latest: dict) -> str:
    sim, ctl = latest.get("sim_driver_node", {}), latest.get("controller_node", {})
    return (f"driver tick p50 {sim.get('period_p50_ms')} ms, p99 {sim.get('period_p99_ms')} ms, max "
            f"{sim.get('period_max_ms')} ms, rate {sim.get('rate_hz')} Hz; controller state period p99 "
            f"{ctl.get('state_period_p99_ms')} ms, max {ctl.get('state_period_max_ms')} ms, step p99 "
            f"{ctl.get('step_compute_p99_us')} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", type=float, default=12.0, help="s per phase (idle, retraining)")
    parser.add_argument("--nice", type=int, default=10)
    args = parser.parse_args()
    from mcpilco_core.paths import config_dir
    from mcpilco_ros.demo import _stop, node_command, ros_environment, write_overrides

    env = ros_environment()
    os.environ.update({k: env[k] for k in ("ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_DOMAIN_ID", "ROS_LOG_DIR")})
    tmp = Path(tempfile.mkdtemp(prefix="bench_retrain_loop_"))
    make_session(tmp / "session")
    params = [config_dir() / "pendubot.yaml", write_overrides(tmp / "p.yaml", {
        "controller_node": {"arm_on_start": True, "diagnostics_period": 0.5},
        "sim_driver_node": {"diagnostics_period": 0.5}})]
    quiet = subprocess.DEVNULL
    nodes = [subprocess.Popen(node_command(m, params), env=env, stdout=quiet, stderr=quiet)
             for m in ("sim_driver_node", "controller_node")]
    retrain_cmd = [sys.executable, "-m", "mcpilco_core.learning.retrain", "retrain", "--sessions", str(tmp / "session"),
                   "--out", str(tmp / "run"), "--config", str(config_dir() / "train_tiny.yaml"), "--warm-start"]
    try:
        latest: dict = {}
        listen(5.0, latest)          # warm-up: start-up spikes leave the driver's 10 s timing window
        latest.clear()
        listen(args.phase, latest)
        print(f"idle:       {summary(latest)}")
        latest.clear()
        import threading

        listener = threading.Thread(target=listen, args=(args.phase, latest))
        listener.start()
        runs = 0
        while listener.is_alive():   # retrains back to back for the whole phase
            proc = subprocess.Popen(retrain_cmd, env={**env, "OMP_NUM_THREADS": "1"}, stdout=quiet, stderr=quiet,
                                    preexec_fn=lambda: os.nice(args.nice))
            try:
                while proc.poll() is None and listener.is_alive():
                    time.sleep(0.1)
            finally:
                _stop(proc)
            runs += 1
        listener.join()
        print(f"retraining: {summary(latest)} (nice {args.nice}, {runs} retrain process(es))")
    finally:
        for proc in nodes:
            _stop(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
