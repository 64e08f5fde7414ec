"""moteus_driver_node with non-finite values (issue 13, item 6): a NaN command is refused and zeroes the torque at
once; a NaN reading from a moteus stops both motors, is named in diagnostics, and never reaches joint_states."""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy")
from _ros_helpers import wait_for  # noqa: E402
from test_moteus_node import Probe, driver_node_in_process, params_file  # noqa: E402

from mcpilco_core.hardware.config import load_driver_config  # noqa: E402
from mcpilco_core.hardware.emulator import robot_bus  # noqa: E402


def loop_status(probe: Probe):
    for array in reversed(probe.diagnostics):
        for st in array.status:
            if st.name.endswith(": loop"):
                return st
    return None


def virtual_params(tmp_path: Path, can_timeout: float = 0.2, max_timeouts: int = 20) -> tuple[Path, str]:
    """A pendubot driver params file on a fresh python-can virtual channel (firmware watchdog 0.5 s); its channel."""
    channel = f"node-{uuid.uuid4().hex}"
    path = params_file(tmp_path, "pendubot", f"      kind: pythoncan\n      interface: virtual\n      channel: "
                                            f"{channel}\n      can_timeout: {can_timeout}\n      "
                                            f"max_consecutive_timeouts: {max_timeouts}\n", watchdog=0.5)
    return path, channel


def command_reaching_the_shoulder(probe: Probe, shoulder) -> None:
    """Wait until the node's topics are matched and a 1.5 N m command reaches the (actuated) shoulder's motor."""
    wait_for(lambda: len(probe.states) > 5 and probe.commands.get_subscription_count() > 0,
             what="joint_states and joint_commands matched")
    wait_for(lambda: (probe.command((1.5, 0.0)), shoulder.commands[0x022] == pytest.approx(1.5))[1],
             what="a command reaching the actuated motor")


@pytest.mark.timeout(40)
def test_nan_command_is_refused_with_zero_torque_and_a_nan_reading_stops_both(tmp_path: Path) -> None:
    path, channel = virtual_params(tmp_path)
    # the longest command timeout: the zero torque below comes from the refusal (state still active), not staleness
    path.write_text(path.read_text().replace("command_timeout: 0.05", "command_timeout: 1.0"))
    config = load_driver_config(path)
    assert config.command_timeout == 1.0
    bus = robot_bus(config)
    with driver_node_in_process(path, bus, channel) as (node, probe):
        shoulder, elbow = bus.motor(1), bus.motor(2)
        command_reaching_the_shoulder(probe, shoulder)
        probe.command((math.nan, 0.0))
        wait_for(lambda: node.refused_commands >= 1 and shoulder.commands[0x022] == 0.0,
                 what="the NaN command refused and the torque zeroed")
        assert shoulder.mode == 10 and node.driver.safety.state.value == "active"

        with bus.lock:
            elbow.velocity = math.nan                      # a broken encoder reading
        wait_for(lambda: shoulder.mode == 0 and elbow.mode == 0, what="both motors stopped")
        wait_for(lambda: node.nonfinite_states > 0, what="non-finite samples counted")
        wait_for(lambda: (st := loop_status(probe)) is not None and "non-finite elbow velocity" in st.message,
                 what="diagnostics naming the reading")
        assert loop_status(probe).level == b"\x02"         # ERROR
        n = len(probe.states)
        with bus.lock:
            elbow.velocity = 0.0                           # the readings recover: states flow again
        wait_for(lambda: len(probe.states) > n + 5, what="joint_states after the reading recovered")
        assert all(math.isfinite(v) for m in probe.states for v in (*m.position, *m.velocity, *m.effort))
        probe.command((1.5, 0.0))
        assert shoulder.mode == 0                           # latched fault


@pytest.mark.timeout(40)
def test_cycles_without_a_reply_are_not_published_as_measurements(tmp_path: Path) -> None:
    """A silent bus (cable pulled) leaves the driver with its last readings: they must not go out on joint_states
    with new stamps (the controller's watchdog and the trial bag must see the gap); diagnostics count them."""
    path, channel = virtual_params(tmp_path, can_timeout=0.02, max_timeouts=1)
    bus = robot_bus(load_driver_config(path))
    with driver_node_in_process(path, bus, channel) as (node, probe):
        wait_for(lambda: len(probe.states) > 5, what="joint_states")
        for motor in (bus.motor(1), bus.motor(2)):
            motor.silent = True                            # no replies any more
        wait_for(lambda: node.stale_states > 10, what="stale cycles counted")
        n = len(probe.states)
        wait_for(lambda: node.stale_states > 30, what="more stale cycles")
        assert len(probe.states) <= n + 1                  # at most one message already in flight
        assert node.driver.safety.state.value == "fault"
        wait_for(lambda: (st := loop_status(probe)) is not None and st.values and
                 any(kv.key == "stale_states" and int(kv.value) > 0 for kv in st.values),
                 what="diagnostics counting the stale cycles")


@pytest.mark.timeout(40)
def test_commands_that_stop_coming_are_stale_and_zero_the_torque(tmp_path: Path) -> None:
    """The node stamps each command with its arrival time: once commands stop (a dead controller), the torque goes to
    zero after command_timeout (here 0.25 s; 3 s allowed on a loaded machine) and comes back with fresh commands."""
    path, channel = virtual_params(tmp_path)
    path.write_text(path.read_text().replace("command_timeout: 0.05", "command_timeout: 0.25"))
    bus = robot_bus(load_driver_config(path))
    with driver_node_in_process(path, bus, channel) as (node, probe):
        shoulder = bus.motor(1)
        command_reaching_the_shoulder(probe, shoulder)
        wait_for(lambda: node.driver.safety.state.value == "stale" and shoulder.commands[0x022] == 0.0, timeout=3.0,
                 what="zero torque once the commands are stale")
        assert shoulder.mode == 10                          # fed with zero torque: no stop, no watchdog trip
        wait_for(lambda: (probe.command((-1.0, 0.0)), shoulder.commands[0x022] == pytest.approx(-1.0))[1],
                 what="fresh commands: torque again")


@pytest.mark.timeout(40)
def test_a_dead_driver_loop_stops_both_motors_and_ends_the_node_with_exit_code_1(tmp_path: Path) -> None:
    """An exception in the driver's loop (here: its cycle) stops both motors, and the node asks run_node to leave with
    exit code 1: a launch file or systemd must see that the driver died, not a clean exit."""
    path, channel = virtual_params(tmp_path)
    bus = robot_bus(load_driver_config(path))
    with driver_node_in_process(path, bus, channel) as (node, probe):
        shoulder = bus.motor(1)
        command_reaching_the_shoulder(probe, shoulder)
        assert not node.done.is_set() and node.exit_code == 0

        async def broken_cycle():
            raise RuntimeError("the CAN adapter went away")

        node.driver.cycle = broken_cycle
        wait_for(node.done.is_set, what="the node asking to leave")
        assert node.exit_code == 1 and "CAN adapter" in repr(node.runner.error)
        assert shoulder.mode == 0 and bus.motor(2).mode == 0 and node.runner.stopped_cleanly
