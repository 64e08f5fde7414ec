"""mcpilco_core: the ROS-free heart of mcpilco_ros (plant, simulation, evaluation, control, learning).

This package never imports rclpy, so everything here runs and is tested without ROS.
"""

__version__ = "0.1.0"
