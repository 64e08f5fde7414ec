"""Launch the acrobot (elbow actuated, shoulder passive): controller + simulated robot or moteus driver [+ trainer].

    ros2 launch mcpilco_ros acrobot.launch.py                       # simulated robot, shipped policy, armed
    ros2 launch mcpilco_ros acrobot.launch.py policy:=/path/to/policy.npz
    ros2 launch mcpilco_ros acrobot.launch.py hardware:=true        # moteus driver; arm with ~/enable
    ros2 launch mcpilco_ros acrobot.launch.py hardware:=true trainer:=true   # + trial recording and retraining

Arguments and behaviour: mcpilco_ros/launch_description.py.
"""

from mcpilco_ros.launch_description import robot_launch_description

ROBOT = "acrobot"


def generate_launch_description():
    return robot_launch_description(ROBOT)
