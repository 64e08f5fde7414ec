"""The joint_states / joint_commands messages of the nodes: QoS, checks of incoming JointState messages,
and the commands and stamps that go out. Units: rad, rad/s, N m; stamps in integer nanoseconds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState

from mcpilco_core.config import JOINT_NAMES

# joint_states / joint_commands: reliable (a lost command is a lost control step) with a short queue
# (an old state is worthless); compatible with best-effort subscribers too.
CONTROL_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE)

def stamp_ns(msg: JointState) -> int:
    """Header stamp in integer nanoseconds (exact: used to match commands to states)."""
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def joint_order(names: Sequence[str]) -> tuple[int, int] | None:
    """Indices of (shoulder, elbow) in ``names``, or None unless the names are exactly these two."""
    if len(names) != 2:
        return None
    try:
        order = (list(names).index(JOINT_NAMES[0]), list(names).index(JOINT_NAMES[1]))
    except ValueError:
        return None
    return order


def state_from_message(msg: JointState) -> tuple[np.ndarray | None, str]:
    """(x = (q1, q2, dq1, dq2), '') from a joint_states message, or (None, reason) for a bad one.

    Reasons (the keys of the refused-message counters): names, lengths, nonfinite.
    """
    order = joint_order(msg.name)
    if order is None:
        return None, "names"
    if len(msg.position) != 2 or len(msg.velocity) != 2 or len(msg.effort) not in (0, 2):
        return None, "lengths"
    i, j = order
    x = np.array((msg.position[i], msg.position[j], msg.velocity[i], msg.velocity[j]), dtype=np.float64)
    if not np.isfinite(x).all():
        return None, "nonfinite"
    return x, ""


def effort_from_message(msg: JointState) -> tuple[tuple[float, float] | None, str]:
    """((tau_shoulder, tau_elbow), '') from a joint_commands message, or (None, reason)."""
    order = joint_order(msg.name)
    if order is None:
        return None, "names"
    if len(msg.effort) != 2:
        return None, "lengths"
    u = (float(msg.effort[order[0]]), float(msg.effort[order[1]]))
    if not (math.isfinite(u[0]) and math.isfinite(u[1])):
        return None, "nonfinite"
    return u, ""


def command_message(effort: Sequence[float], stamp: Any, frame_id: str = "") -> JointState:
    """A joint_commands message: names + effort (N m), stamped with the state it answers."""
    msg = JointState()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.name = list(JOINT_NAMES)
    msg.effort = [float(effort[0]), float(effort[1])]
    return msg


def stamp_from_ns(ns: int) -> Time:
    """Integer nanoseconds -> builtin_interfaces/Time."""
    sec, nanosec = divmod(int(ns), 1_000_000_000)
    return Time(sec=sec, nanosec=nanosec)
