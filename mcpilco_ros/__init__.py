"""mcpilco_ros: thin rclpy nodes over mcpilco_core (controller, simulated robot, moteus driver, trainer)."""
