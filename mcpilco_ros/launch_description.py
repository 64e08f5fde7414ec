"""The launch description shared by launch/pendubot.launch.py and launch/acrobot.launch.py.

Arguments: hardware (false|true), policy (.npz file or a directory of exported policies; default: the shipped
policies/<robot>.npz when there is one, '' = LQR + damping only), config (robot params file, default
config/<robot>.yaml), driver_config (moteus params file, default config/moteus_driver_<robot>.yaml), trainer
(false|true: also start trainer_node, which records trials into rosbag2 and retrains between them,
docs/sessions.md), trainer_config (its params file, default config/trainer.yaml; give your own copy with this
session's session_dir/run_dir/notes). Every node gets the robot params file, so there is one source of truth.
On hardware the controller starts disarmed: call /controller_node/enable (std_srvs/SetBool) when ready.

The ``launch`` packages are imported inside the function: this module is importable without them.
"""

from __future__ import annotations

import os

PACKAGE = "mcpilco_ros"


def robot_launch_description(robot: str):
    """LaunchDescription for ``robot``: controller + simulated robot (or moteus driver) [+ trainer]."""
    from ament_index_python.packages import get_package_share_directory
    from launch.actions import DeclareLaunchArgument
    from launch.conditions import IfCondition, UnlessCondition
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    from launch import LaunchDescription

    share = get_package_share_directory(PACKAGE)
    config_dir = os.path.join(share, "config")
    shipped = os.path.join(share, "policies", f"{robot}.npz")
    hardware = LaunchConfiguration("hardware")
    config = LaunchConfiguration("config")
    trainer = LaunchConfiguration("trainer")

    def node(executable: str, condition, parameters: list) -> Node:
        # namespace="" makes inline dicts node-specific overrides (launch_ros keys them by the full node name)
        return Node(package=PACKAGE, executable=executable, name=executable, namespace="", output="screen",
                    emulate_tty=True, condition=condition, parameters=parameters)

    def controller(armed: bool, condition) -> Node:
        return node("controller_node", condition,
                    [config, {"policy": LaunchConfiguration("policy"), "arm_on_start": armed}])

    return LaunchDescription([
        DeclareLaunchArgument("hardware", default_value="false", choices=["false", "true"],
                              description="true: moteus driver on the real robot; false: simulated robot"),
        DeclareLaunchArgument("config", default_value=os.path.join(config_dir, f"{robot}.yaml"),
                              description="robot params file (plant, limits, controller settings)"),
        DeclareLaunchArgument("policy", default_value=shipped if os.path.isfile(shipped) else "",
                              description="policy .npz file or directory (newest *.npz); empty: LQR + damping"),
        DeclareLaunchArgument("driver_config", default_value=os.path.join(config_dir, f"moteus_driver_{robot}.yaml"),
                              description="moteus driver params file (hardware:=true)"),
        DeclareLaunchArgument("trainer", default_value="false", choices=["false", "true"],
                              description="true: also start trainer_node (trial recording into rosbag2, retraining)"),
        DeclareLaunchArgument("trainer_config", default_value=os.path.join(config_dir, "trainer.yaml"),
                              description="trainer_node params file (trainer:=true): session_dir, run_dir, ..."),
        controller(True, UnlessCondition(hardware)),    # simulation: armed at start
        controller(False, IfCondition(hardware)),       # hardware: disarmed until ~/enable
        node("sim_driver_node", UnlessCondition(hardware), [config]),
        node("moteus_driver_node", IfCondition(hardware), [LaunchConfiguration("driver_config")]),
        node("trainer_node", IfCondition(trainer), [config, LaunchConfiguration("trainer_config")]),
    ])
