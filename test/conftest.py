"""Test-session isolation: ROS discovery stays on this machine, every test process gets its own domain.

Set before anything imports rclpy (network hygiene, as tools/ros_env.sh). The README's test command also runs the
whole suite inside a private network namespace where ``unshare -n`` works.
"""

import atexit
import os
import shutil
import sys
import tempfile

if "ROS_LOG_DIR" not in os.environ:     # the nodes' logs of this test run, removed when it ends
    os.environ["ROS_LOG_DIR"] = tempfile.mkdtemp(prefix="mcpilco_ros_log_")
    atexit.register(shutil.rmtree, os.environ["ROS_LOG_DIR"], True)
os.environ.setdefault("AMENT_PREFIX_PATH", sys.prefix)
os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
os.environ.setdefault("MPLBACKEND", "Agg")
# Keep tests single-threaded in BLAS/torch: the CI machine has 2 cores shared with ROS executors. Set before numpy
# is first imported (below: mcpilco_ros.demo).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from mcpilco_ros.demo import keep_discovery_local  # noqa: E402 - imports numpy, no rclpy

# Imposed, not defaults: a domain, range or static peers exported for a robot would put the tests' nodes (a
# controller_node publishing joint_commands) into that robot's graph wherever unshare -n is not available.
keep_discovery_local(os.environ, 1 + os.getpid() % 99)  # 1-99: tests (demo 100-199, benchmarks 200-229)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def pendubot_plant():
    from mcpilco_core.plant import DoublePendulum

    return DoublePendulum.from_yaml(REPO / "config" / "pendubot.yaml")


@pytest.fixture
def pendubot_config():
    from mcpilco_core.config import load_robot_config

    return load_robot_config(REPO / "config" / "pendubot.yaml")


@pytest.fixture
def acrobot_config():
    from mcpilco_core.config import load_robot_config

    return load_robot_config(REPO / "config" / "acrobot.yaml")
