"""``mcpilco hw-check``: find both moteus controllers and report their state, before any run on the robot.

Reads the driver's params file (``config/moteus_driver_<robot>.yaml``), opens its transport with the
official moteus library, stops and queries each controller (a stop also clears a latched fault) and prints
mode, fault, position (rev and joint rad), velocity, bus voltage and temperature. Only with ``--pulse`` it
then applies a small torque pulse to the actuated joint (bounded: at most 1 N m and 1 s, and never above the
joint's torque limit; the firmware watchdog is armed on every command) and reports how far the joint moved,
which checks wiring, direction sign and torque path in one go. Exit status 0 when both controllers answered
without fault, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any, TextIO

import moteus

from ..paths import config_dir
from . import units
from .commands import fault_name, mode_name, stop_command, torque_command
from .config import DriverConfig, load_driver_config
from .driver import CAN_TIMEOUT_ERRORS, MotorStatus, update_motor
from .transport import TransportError, driver_transport

PULSE_TORQUE_MAX = 1.0      # N m, hard bound of --pulse-torque
PULSE_DURATION_MAX = 1.0    # s, hard bound of --pulse-duration
QUERY_TIMEOUT = 0.1         # s per query


def register(subparsers: Any) -> None:
    """Add the ``hw-check`` subcommand to the ``mcpilco`` CLI."""
    p = subparsers.add_parser("hw-check", help="find both moteus controllers; print mode, faults, positions, "
                                               "voltage, temperature; --pulse: small torque pulse")
    p.add_argument("--robot", choices=("pendubot", "acrobot"), default="pendubot",
                   help="robot whose driver config to use (default: pendubot)")
    p.add_argument("--config", type=Path, help="driver params file (default: config/moteus_driver_<robot>.yaml)")
    p.add_argument("--transport", choices=("socketcan", "pythoncan", "fdcanusb", "pi3hat", "auto"),
                   help="override transport.kind")
    p.add_argument("--channel", help="override transport.channel (socketcan / pythoncan)")
    p.add_argument("--interface", help="override transport.interface (pythoncan)")
    p.add_argument("--path", help="override transport.path (fdcanusb)")
    p.add_argument("--pulse", action="store_true", help="apply a small torque pulse to the actuated joint")
    p.add_argument("--pulse-torque", type=float, default=0.3,
                   help=f"N m at the joint (|value| <= {PULSE_TORQUE_MAX} and the torque limit; default 0.3)")
    p.add_argument("--pulse-duration", type=float, default=0.2,
                   help=f"s (<= {PULSE_DURATION_MAX}; default 0.2)")
    p.set_defaults(func=run_hw_check)


def _config(args: argparse.Namespace) -> DriverConfig:
    path = args.config or config_dir() / f"moteus_driver_{args.robot}.yaml"
    config = load_driver_config(path)
    overrides = {k: v for k, v in (("kind", args.transport), ("channel", args.channel),
                                   ("interface", args.interface), ("path", args.path)) if v is not None}
    if overrides:
        config = dataclasses.replace(config, transport=dataclasses.replace(config.transport, **overrides))
    return config


def run_hw_check(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """The ``hw-check`` command: 0 when both controllers answered without a fault (and the pulse worked)."""
    out = out or sys.stdout
    config = _config(args)
    torque = math.copysign(min(abs(args.pulse_torque), PULSE_TORQUE_MAX, config.joints[config.actuated_joint]
                               .torque_limit), args.pulse_torque)
    duration = min(max(args.pulse_duration, 0.0), PULSE_DURATION_MAX)
    try:
        return asyncio.run(hw_check(config, out, pulse=(torque, duration) if args.pulse else None))
    except TransportError as exc:
        print(f"error: {exc}", file=out)
        return 1


async def hw_check(config: DriverConfig, out: TextIO, pulse: tuple[float, float] | None = None,
                   transport: Any = None) -> int:
    """Query both controllers on the configured transport (and run the optional pulse); prints a report."""
    own = transport is None
    transport = transport or driver_transport(config)
    try:
        controllers = [moteus.Controller(id=j.can_id, transport=transport) for j in config.joints]
        print(f"transport: {config.transport.describe()}", file=out)
        statuses = [await _stop_and_query(c) for c in controllers]
        _print_table(config, statuses, out)
        ok = all(s is not None and s.mode not in (1, 11) for s in statuses)
        if ok and pulse is not None:
            ok = await _pulse(config, transport, controllers, pulse, out)
        print("hw-check: OK" if ok else "hw-check: FAILED", file=out)
        return 0 if ok else 1
    finally:
        if own:
            transport.close()


async def _stop_and_query(controller: moteus.Controller, attempts: int = 3) -> MotorStatus | None:
    """Stop (clears a latched fault) with a query; None when the controller never answers."""
    for _ in range(attempts):
        try:
            result = await asyncio.wait_for(controller.execute(stop_command(controller)), QUERY_TIMEOUT)
        except CAN_TIMEOUT_ERRORS:
            continue
        if result is not None:
            status = MotorStatus(controller.id)
            update_motor(status, result.values)
            status.replied = True
            return status
    return None


def _print_table(config: DriverConfig, statuses: list[MotorStatus | None], out: TextIO) -> None:
    print(f"{'joint':9} {'id':>3} {'mode':>14} {'fault':>22} {'pos rev':>9} {'q rad':>8} {'vel rev/s':>9} "
          f"{'V':>6} {'T degC':>6}", file=out)
    for joint, s in zip(config.joints, statuses):
        if s is None:
            print(f"{joint.name:9} {joint.can_id:>3} MISSING: no answer on {config.transport.describe()}", file=out)
            continue
        q = units.joint_position(joint, s.position)
        print(f"{joint.name:9} {joint.can_id:>3} {mode_name(s.mode):>14} {fault_name(s.fault):>22} "
              f"{s.position:9.4f} {q:8.3f} {s.velocity:9.3f} {s.voltage:6.1f} {s.temperature:6.1f}", file=out)


async def _pulse(config: DriverConfig, transport: Any, controllers: list[moteus.Controller],
                 pulse: tuple[float, float], out: TextIO) -> bool:
    """Bounded torque pulse on the actuated joint at 100 Hz, then a stop; prints the joint's motion."""
    torque, duration = pulse
    act = config.actuated_joint
    joint, controller = config.joints[act], controllers[act]
    status = MotorStatus(joint.can_id)
    start_q: float | None = None
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    ok = True
    try:
        while loop.time() < end:
            cmd = torque_command(controller, units.motor_torque(joint, torque), joint.torque_limit / joint.gear_ratio,
                                 watchdog_timeout=0.1)
            result = await asyncio.wait_for(controller.execute(cmd), QUERY_TIMEOUT)
            update_motor(status, result.values)
            start_q = units.joint_position(joint, status.position) if start_q is None else start_q
            if status.mode in (1, 11):
                print(f"pulse aborted: {mode_name(status.mode)}, fault {fault_name(status.fault)}", file=out)
                ok = False
                break
            await asyncio.sleep(0.01)
    except CAN_TIMEOUT_ERRORS:
        print("pulse aborted: CAN timeout", file=out)
        ok = False
    finally:
        await _stop_and_query(controller)
    moved = units.joint_position(joint, status.position) - (start_q or 0.0)
    print(f"pulse: {torque:+.2f} N m on {joint.name} for {duration:.2f} s: joint moved {moved:+.4f} rad "
          f"(expect the sign of the torque)", file=out)
    return ok
