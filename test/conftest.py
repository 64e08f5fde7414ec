"""Test-session isolation: ROS discovery stays on this machine, every test process gets its own domain.

Set before anything imports rclpy (network hygiene, as tools/ros_env.sh). The README's test command also runs the
whole suite inside a private network namespace where ``unshare -n`` works.
"""

import os
import sys
import tempfile

# Imposed, not defaults: a domain, range or static peers exported for a robot would put the tests' nodes (a
# controller_node publishing joint_commands) into that robot's graph wherever unshare -n is not available.
if os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE") != "OFF":
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.pop("ROS_STATIC_PEERS", None)
if os.environ.get("ROS_DISTRO") == "humble":  # Humble's rcl knows ROS_LOCALHOST_ONLY, not the range (Iron and newer)
    os.environ["ROS_LOCALHOST_ONLY"] = "1"
os.environ["ROS_DOMAIN_ID"] = str(1 + os.getpid() % 99)  # 1-99: tests (demo 100-199, benchmarks 200-229)
os.environ.setdefault("ROS_LOG_DIR", tempfile.mkdtemp(prefix="mcpilco_ros_log_"))
os.environ.setdefault("AMENT_PREFIX_PATH", sys.prefix)
os.environ.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
os.environ.setdefault("MPLBACKEND", "Agg")
# Keep tests single-threaded in BLAS/torch: the CI machine has 2 cores shared with ROS executors.
os.environ.setdefault("OMP_NUM_THREADS", "1")

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
