"""Unit conversions between the moteus side (revolutions, rev/s, N m at the controller output) and the
joint side (rad, rad/s, N m at the joint), with the per-joint direction sign, offset and gear ratio.

joint angle q = direction * 2 pi * rev / gear + offset; joint torque = direction * gear * motor torque.
"""

from __future__ import annotations

import math

from .config import JointDriverConfig

TWO_PI = 2.0 * math.pi


def joint_position(joint: JointDriverConfig, motor_rev: float) -> float:
    """Motor position (rev) -> joint angle (rad)."""
    return joint.direction * TWO_PI * motor_rev / joint.gear_ratio + joint.position_offset


def motor_position(joint: JointDriverConfig, q: float) -> float:
    """Joint angle (rad) -> motor position (rev); inverse of :func:`joint_position`."""
    return (q - joint.position_offset) * joint.gear_ratio / (joint.direction * TWO_PI)


def joint_velocity(joint: JointDriverConfig, motor_rev_s: float) -> float:
    """Motor velocity (rev/s) -> joint velocity (rad/s)."""
    return joint.direction * TWO_PI * motor_rev_s / joint.gear_ratio


def motor_velocity(joint: JointDriverConfig, dq: float) -> float:
    """Joint velocity (rad/s) -> motor velocity (rev/s)."""
    return dq * joint.gear_ratio / (joint.direction * TWO_PI)


def joint_torque(joint: JointDriverConfig, motor_nm: float) -> float:
    """Torque at the moteus output (N m) -> torque at the joint (N m)."""
    return joint.direction * joint.gear_ratio * motor_nm


def motor_torque(joint: JointDriverConfig, tau: float) -> float:
    """Torque wanted at the joint (N m) -> feed-forward torque for the moteus (N m)."""
    return tau / (joint.direction * joint.gear_ratio)
