"""Recording trials (the recording layer): rosbag2 bags, session directories, crash recovery, reading back.

No rclpy here (the trainer node hands in raw CDR bytes), so everything is testable without ROS.

**What a trial bag holds** (the ROS interfaces of the README, raw CDR exactly as received):

- ``joint_states`` (sensor_msgs/JointState): the driver's 500 Hz stream; position rad, velocity rad/s and, in
  ``effort``, the torque (N m) the driver actually applied over the step that ended at the header stamp;
- ``joint_commands`` (sensor_msgs/JointState): the controller's torques (N m); ``header.frame_id`` carries the
  supervisor mode (policy / lqr / damping / safe) that produced each command -- **this is the mode stream**:
  one mode per command, exact in time, no extra topic needed;
- ``diagnostics`` (diagnostic_msgs/DiagnosticArray), optional: for humans (loop timing, faults).

A bag made with ``ros2 bag record joint_states joint_commands [diagnostics]`` has the same content and reads the
same way. Message time in the bag is the receive time (ns); trial data uses the header stamps (measurement time).

**Session directory** (one per hardware session)::

    SESSION/session.yaml        robot, config (path + fingerprint), notes, one entry per trial (bag, times,
                                policy version used, status recording/complete/recovered)
    SESSION/robot_config.yaml   copy of the robot configuration used, with the plant-models files it names
                                (config.copy_robot_config: the copy loads on its own)
    SESSION/trial_000/          rosbag2 bag (metadata.yaml + storage file); robot etc. also in custom_data
    SESSION/trial_001.partial/  a trial being recorded (or left by a crash: see recover_session)

A bag is written under ``trial_NNN.partial`` and renamed to ``trial_NNN`` when closed, so a complete name always
means a complete bag. The recorder flushes the storage every ``flush_period`` s, so a crash loses at most that
much; :func:`recover_session` salvages a partial bag into a new, valid bag and keeps the original files.

**Reading back**: :func:`load_sessions` turns every readable trial into :class:`TrialData` at the policy period
(states interpolated at the grid, torque = time-average of the applied torque over each interval); unreadable or
mismatched bags become :class:`BagProblem` entries (file + reason) and never stop the others.
"""

from .bags import (
    BAG_VERSIONS,
    COMMAND_TOPIC,
    CRASHED_SUFFIX,
    DIAGNOSTICS_TOPIC,
    DIAGNOSTICS_TYPE,
    JOINT_STATE_TYPE,
    PARTIAL_SUFFIX,
    SESSION_FILE,
    STATE_TOPIC,
    STORAGES,
    UNKNOWN_MODE,
    TrialError,
    TrialRecorder,
    header_stamp_ns,
)
from .reader import (
    BagProblem,
    LoadResult,
    RawTrial,
    ResampleSettings,
    TrialData,
    find_bags,
    load_sessions,
    load_trial,
    parse_joint_state,
    read_bag,
    resample,
)
from .salvage import recover_session, salvage_bag
from .session_directory import SessionDirectory
from .transitions import TransitionData, transitions_from_trajectory

__all__ = [
    "BAG_VERSIONS", "COMMAND_TOPIC", "CRASHED_SUFFIX", "DIAGNOSTICS_TOPIC", "DIAGNOSTICS_TYPE", "JOINT_STATE_TYPE",
    "PARTIAL_SUFFIX", "SESSION_FILE", "STATE_TOPIC", "STORAGES", "UNKNOWN_MODE", "BagProblem", "LoadResult",
    "RawTrial", "ResampleSettings", "SessionDirectory", "TransitionData", "TrialData", "TrialError", "TrialRecorder",
    "find_bags", "header_stamp_ns", "load_sessions", "load_trial", "parse_joint_state", "read_bag", "recover_session",
    "resample", "salvage_bag", "transitions_from_trajectory",
]
