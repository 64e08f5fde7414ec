"""Launch the pendubot (shoulder actuated, elbow passive): controller + simulated robot or moteus driver.

    ros2 launch mcpilco_ros pendubot.launch.py                       # simulated robot, armed at start
    ros2 launch mcpilco_ros pendubot.launch.py policy:=/path/to/policy.npz
    ros2 launch mcpilco_ros pendubot.launch.py hardware:=true        # moteus driver; arm with ~/enable
    ros2 launch mcpilco_ros pendubot.launch.py hardware:=true trainer:=true   # + trial recording and retraining

Arguments: hardware (false|true), policy (.npz file or a directory of exported policies; '' = LQR +
damping), config (robot params file, default config/pendubot.yaml), driver_config (moteus params file, default
config/moteus_driver_pendubot.yaml), trainer (false|true: also start trainer_node, which records trials into
rosbag2 and retrains between them, docs/sessions.md), trainer_config (its params file, default
config/trainer.yaml; give your own copy with this session's session_dir/run_dir/notes). Every node gets the
robot params file, so there is one source of truth.
On hardware the controller starts disarmed: call /controller_node/enable (std_srvs/SetBool) when ready.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from launch import LaunchDescription

ROBOT = "pendubot"
PACKAGE = "mcpilco_ros"


def generate_launch_description() -> LaunchDescription:
    config_dir = os.path.join(get_package_share_directory(PACKAGE), "config")
    hardware = LaunchConfiguration("hardware")
    config = LaunchConfiguration("config")
    policy = LaunchConfiguration("policy")
    driver_config = LaunchConfiguration("driver_config")
    trainer = LaunchConfiguration("trainer")
    trainer_config = LaunchConfiguration("trainer_config")

    def controller(armed: bool, condition) -> Node:
        # namespace="" makes the dict a node-specific override (launch_ros keys it by the full node name)
        return Node(package=PACKAGE, executable="controller_node", name="controller_node", namespace="",
                    output="screen", emulate_tty=True, condition=condition,
                    parameters=[config, {"policy": policy, "arm_on_start": armed}])

    return LaunchDescription([
        DeclareLaunchArgument("hardware", default_value="false", choices=["false", "true"],
                              description="true: moteus driver on the real robot; false: simulated robot"),
        DeclareLaunchArgument("config", default_value=os.path.join(config_dir, f"{ROBOT}.yaml"),
                              description="robot params file (plant, limits, controller settings)"),
        DeclareLaunchArgument("policy", default_value="",
                              description="policy .npz file or directory (newest *.npz); empty: LQR + damping"),
        DeclareLaunchArgument("driver_config", default_value=os.path.join(config_dir, f"moteus_driver_{ROBOT}.yaml"),
                              description="moteus driver params file (hardware:=true)"),
        DeclareLaunchArgument("trainer", default_value="false", choices=["false", "true"],
                              description="true: also start trainer_node (trial recording into rosbag2, retraining)"),
        DeclareLaunchArgument("trainer_config", default_value=os.path.join(config_dir, "trainer.yaml"),
                              description="trainer_node params file (trainer:=true): session_dir, run_dir, ..."),
        controller(True, UnlessCondition(hardware)),    # simulation: armed at start
        controller(False, IfCondition(hardware)),       # hardware: disarmed until ~/enable
        Node(package=PACKAGE, executable="sim_driver_node", name="sim_driver_node", namespace="", output="screen",
             emulate_tty=True, condition=UnlessCondition(hardware), parameters=[config]),
        Node(package=PACKAGE, executable="moteus_driver_node", name="moteus_driver_node", namespace="",
             output="screen", emulate_tty=True, condition=IfCondition(hardware), parameters=[driver_config]),
        Node(package=PACKAGE, executable="trainer_node", name="trainer_node", namespace="", output="screen",
             emulate_tty=True, condition=IfCondition(trainer), parameters=[config, trainer_config]),
    ])
