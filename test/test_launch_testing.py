"""The real launch files under ROS's own launch tools (machines with a ROS 2 install and this package built
with colcon; skipped here, where launch/launch_ros/launch_testing cannot be installed)."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("launch_testing")
pytest.importorskip("launch_ros")
import rclpy  # noqa: E402
from ament_index_python.packages import get_package_share_directory  # noqa: E402
from launch.launch_description_sources import PythonLaunchDescriptionSource  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402

import launch  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("robot", ["pendubot", "acrobot"])
def test_simulation_launch_balances_and_commands_flow(robot):
    """ros2 launch mcpilco_ros <robot>.launch.py: commands answer states, the passive joint gets 0."""
    share = get_package_share_directory("mcpilco_ros")
    description = launch.LaunchDescription([launch.actions.IncludeLaunchDescription(
        PythonLaunchDescriptionSource(f"{share}/launch/{robot}.launch.py"),
        launch_arguments={"hardware": "false"}.items())])
    service = launch.LaunchService()
    service.include_launch_description(description)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    context = rclpy.Context()
    rclpy.init(context=context)
    executor = SingleThreadedExecutor(context=context)
    node = rclpy.create_node("launch_observer", context=context)
    commands: list[JointState] = []
    node.create_subscription(JointState, "joint_commands", commands.append, 10)
    executor.add_node(node)
    try:
        end = time.monotonic() + 60
        while len(commands) < 200 and time.monotonic() < end:
            executor.spin_once(timeout_sec=0.05)
        assert len(commands) >= 200, "no joint_commands from the launched controller"
        passive = 1 if robot == "pendubot" else 0
        assert all(c.effort[passive] == 0.0 for c in commands)
    finally:
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
        service.shutdown()
        thread.join(timeout=30)
