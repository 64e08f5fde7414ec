"""moteus hardware: driver configuration, unit conversions, torque commands, safety and the asyncio driver.

ROS-free (the node in ``mcpilco_ros.moteus_driver_node`` is a thin layer over :class:`MoteusDriver`).
``emulator`` holds an emulated moteus for tests; nothing here imports it.
"""

from .commands import FAULT_NAMES, fault_name, mode_name, query_command, stop_command, torque_command
from .config import DriverConfig, JointDriverConfig, TransportConfig, driver_config_from_mapping, load_driver_config
from .driver import DriverRunner, DriverSample, MissingControllerError, MoteusDriver
from .safety import SafetyDecision, SafetyState, SafetySupervisor

__all__ = ["FAULT_NAMES", "DriverConfig", "DriverRunner", "DriverSample", "JointDriverConfig",
           "MissingControllerError", "MoteusDriver", "SafetyDecision", "SafetyState", "SafetySupervisor",
           "TransportConfig", "driver_config_from_mapping", "fault_name", "load_driver_config", "mode_name",
           "query_command", "stop_command", "torque_command"]
