"""The moteus driver's safety state machine (mcpilco_core/hardware/safety.py), deterministically.

No threads, no CAN, no wall clock: every input carries its own monotonic time (``update(now, ...)`` and
``command(torques, receive_time)``), driven here by a hand-advanced clock. Every transition, on both joints,
for both robots (shipped driver configs): WAITING -> ACTIVE -> STALE -> ACTIVE, limits -> DAMPING -> STOPPED,
controller fault / watchdog timeout -> FAULT, CAN timeout -> FAULT, ~/stop -> STOPPED, latching and reset.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from mcpilco_core.hardware.config import DriverConfig, load_driver_config
from mcpilco_core.hardware.safety import SafetyDecision, SafetyState, SafetySupervisor

CONFIG = Path(__file__).resolve().parents[1] / "config"
ROBOTS = ("pendubot", "acrobot")
JOINTS = (0, 1)
REST = ((0.0, 0.0), (0.0, 0.0))       # q (rad), dq (rad/s)
OK_MODES = (10, 10)                   # moteus mode 10: position (our torque mode), no fault
W, A, S, D, ST, F = (SafetyState.WAITING, SafetyState.ACTIVE, SafetyState.STALE, SafetyState.DAMPING,
                     SafetyState.STOPPED, SafetyState.FAULT)


class Clock:
    """A monotonic clock advanced by hand (s)."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def advance(self, dt: float) -> float:
        self.now += dt
        return self.now


class Machine:
    """A SafetySupervisor with a hand clock; ``step`` runs one driver cycle."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.clock = Clock()
        self.safety = SafetySupervisor(config)

    @property
    def act(self) -> int:
        return self.config.actuated_joint

    def command(self, torques: tuple[float, float]) -> None:
        self.safety.command(torques, self.clock.now)

    def step(self, q=REST[0], dq=REST[1], modes=OK_MODES, faults=(0, 0), dt: float = 0.002) -> SafetyDecision:
        return self.safety.update(self.clock.advance(dt), q, dq, modes, faults)


def driver_config(robot: str, **changes: object) -> DriverConfig:
    return dataclasses.replace(load_driver_config(CONFIG / f"moteus_driver_{robot}.yaml"), **changes)


@pytest.fixture(params=ROBOTS)
def machine(request: pytest.FixtureRequest) -> Machine:
    return Machine(driver_config(request.param))


def actuated(machine: Machine, tau: float) -> tuple[float, float]:
    out = [0.0, 0.0]
    out[machine.act] = tau
    return (out[0], out[1])


def test_shipped_configs_actuate_one_joint_and_give_the_passive_joint_no_torque() -> None:
    for robot, act in zip(ROBOTS, (0, 1)):
        config = driver_config(robot)
        assert config.actuated_joint == act
        assert config.joints[1 - act].torque_limit == 0.0 and config.joints[act].torque_limit > 0.0


def test_waiting_until_the_first_command_then_active(machine: Machine) -> None:
    for _ in range(3):
        d = machine.step()
        assert (d.state, d.torques, d.stop) == (W, (0.0, 0.0), False) and "no joint_commands" in d.reason
    machine.command(actuated(machine, 1.25))
    d = machine.step()
    assert (d.state, d.torques, d.stop, d.reason) == (A, actuated(machine, 1.25), False, "")
    assert machine.safety.state is A


def test_passive_joint_gets_exactly_zero_and_torque_is_clamped(machine: Machine) -> None:
    limit = machine.config.joints[machine.act].torque_limit
    cases = [((2.0, 3.0), None), ((-2.0, -3.0), None), ((100.0, 100.0), limit), ((-100.0, -100.0), -limit),
             ((float("nan"), float("inf")), 0.0)]
    for command, expected in cases:
        machine.command(command)
        d = machine.step()
        assert d.state is A
        assert d.torques[1 - machine.act] == 0.0                 # exactly, whatever was commanded
        want = command[machine.act] if expected is None else expected
        assert d.torques[machine.act] == want
    # passive nonzero (4 commands) + actuated beyond its limit (2); nan/inf become 0 before the clamp (none)
    assert machine.safety.clamped_commands == 6


@pytest.mark.parametrize("robot", ROBOTS)
def test_stale_after_command_timeout_then_active_again(robot: str) -> None:
    timeout = 0.0625                                               # binary-exact times: age == timeout exactly
    machine = Machine(driver_config(robot, command_timeout=timeout))
    machine.clock.now = received = 128.0
    machine.command(actuated(machine, 1.0))
    assert machine.safety.update(received + timeout, *REST, OK_MODES, (0, 0)).state is A   # age == timeout: fresh
    d = machine.safety.update(received + timeout + 1e-6, *REST, OK_MODES, (0, 0))
    assert (d.state, d.torques, d.stop) == (S, (0.0, 0.0), False) and "old" in d.reason
    machine.clock.now = received + 10.0
    assert machine.step().state is S                               # stays stale, never stops
    machine.command(actuated(machine, -0.5))                       # fresh commands: active again
    d = machine.step()
    assert (d.state, d.torques) == (A, actuated(machine, -0.5))


@pytest.mark.parametrize("robot", ROBOTS)
@pytest.mark.parametrize("joint", JOINTS)
@pytest.mark.parametrize("kind", ["velocity", "position"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_limit_on_either_joint_damps_for_the_configured_time_then_stops(robot: str, joint: int, kind: str,
                                                                         sign: float) -> None:
    m = Machine(driver_config(robot, damping_gain=0.5, damping_duration=0.2))
    jc = m.config.joints[joint]
    limit = jc.velocity_limit if kind == "velocity" else jc.position_limit
    q, dq = [0.0, 0.0], [3.0, -4.0]                                # actuated joint moving: damping opposes it
    m.command(actuated(m, 2.0))
    assert m.step(q, dq).state is A
    (dq if kind == "velocity" else q)[joint] = sign * limit        # exactly on the limit: still fine
    m.step(q, dq, dt=1.0)                                          # got there in 1 s (no position jump)...
    m.command(actuated(m, 2.0))                                    # ...with fresh commands
    assert m.step(q, dq).state is A
    (dq if kind == "velocity" else q)[joint] = sign * (limit + 0.01)
    d = m.step(q, dq)
    start = m.clock.now
    assert d.state is D and not d.stop
    assert jc.name in d.reason and kind in d.reason
    tau_max = m.config.joints[m.act].torque_limit
    expected = max(-tau_max, min(tau_max, -0.5 * dq[m.act]))
    assert d.torques == actuated(m, expected)                      # -gain * dq on the actuated joint, passive 0
    m.command(actuated(m, 5.0))                                    # commands are ignored while damping
    q[joint] = q[joint] if kind == "velocity" else sign * (limit - 0.01)
    dq = [1.0, 1.0]                                                # back inside the limits: damping goes on
    while m.clock.now + 0.002 < start + 0.2 - 1e-9:
        d = m.step(q, dq)
        assert d.state is D and d.torques == actuated(m, -0.5 * dq[m.act]) and not d.stop
    d = m.safety.update(start + 0.2, q, dq, OK_MODES, (0, 0))      # the damping time is up: stop, latched
    assert (d.state, d.torques, d.stop) == (ST, (0.0, 0.0), True)
    assert d.reason.startswith("stopped after damping") and jc.name in d.reason
    m.command(actuated(m, 1.0))
    assert m.step().state is ST and m.step(dt=100.0).stop
    m.safety.reset()
    assert m.step().state is W                                      # reset forgets the old command


def test_damping_torque_is_clamped_to_the_actuated_limit(machine: Machine) -> None:
    limit = machine.config.joints[machine.act].torque_limit
    dq = [0.0, 0.0]
    dq[machine.act] = machine.config.joints[machine.act].velocity_limit + 1.0
    machine.command(actuated(machine, 1.0))
    d = machine.step(REST[0], dq)
    assert d.state is D and d.torques == actuated(machine, -limit)


@pytest.mark.parametrize("robot", ROBOTS)
@pytest.mark.parametrize("joint", JOINTS)
@pytest.mark.parametrize("mode,mode_text", [(1, "fault"), (11, "timeout")])
@pytest.mark.parametrize("before", [W, A, S, D])
def test_controller_fault_or_timeout_on_either_joint_latches_a_fault(robot: str, joint: int, mode: int,
                                                                     mode_text: str, before: SafetyState) -> None:
    m = Machine(driver_config(robot))
    q, dq = [0.0, 0.0], [0.0, 0.0]
    if before is not W:
        m.command(actuated(m, 1.0))
    if before is S:
        m.clock.advance(1.0)
    if before is D:
        dq[m.act] = 100.0
    assert m.step(q, dq).state is before
    modes, faults = [10, 10], [0, 0]
    modes[joint], faults[joint] = mode, 33
    d = m.step(q, dq, modes, faults)
    jc = m.config.joints[joint]
    assert (d.state, d.torques, d.stop) == (F, (0.0, 0.0), True)
    assert f"{jc.name} (id {jc.can_id}) in mode {mode}" in d.reason and mode_text in d.reason
    assert "fault 33 (motor_driver_fault)" in d.reason
    m.command(actuated(m, 1.0))                                     # latched: healthy modes and commands change nothing
    for _ in range(3):
        assert m.step(q, [0.0, 0.0]) == d
    m.safety.request_stop("~/stop")                                # a later stop keeps the first reason
    assert m.step().reason == d.reason
    m.safety.reset()
    assert m.step().state is W


def test_fault_wins_over_a_limit_in_the_same_cycle(machine: Machine) -> None:
    machine.command(actuated(machine, 1.0))
    d = machine.step((100.0, 100.0), (100.0, 100.0), (1, 10), (35, 0))
    assert d.state is F and "encoder_fault" in d.reason


@pytest.mark.parametrize("before", [W, A, S, D])
def test_can_timeout_and_stop_request_latch_from_every_state(machine: Machine, before: SafetyState) -> None:
    for latch, state in ((machine.safety.report_fault, F), (machine.safety.request_stop, ST)):
        machine.safety.reset()
        dq = [0.0, 0.0]
        if before is not W:
            machine.command(actuated(machine, 1.0))
        if before is S:
            machine.clock.advance(1.0)
        if before is D:
            dq[machine.act] = 100.0
        assert machine.step(REST[0], dq).state is before
        latch("CAN timeout on virtual channel x: read")
        d = machine.step()
        assert (d.state, d.torques, d.stop, d.reason) == (state, (0.0, 0.0), True,
                                                          "CAN timeout on virtual channel x: read")
        machine.command(actuated(machine, 1.0))
        assert machine.step() == d
        other = machine.safety.request_stop if state is F else machine.safety.report_fault
        other("something later")                                   # the first latch and its reason stay
        assert machine.step() == d


def test_reset_clears_a_latch_and_needs_fresh_commands(machine: Machine) -> None:
    machine.command(actuated(machine, 1.0))
    assert machine.step().state is A
    machine.safety.request_stop("~/stop")
    assert machine.step().state is ST
    machine.safety.reset()
    d = machine.step()
    assert (d.state, d.torques, d.stop) == (W, (0.0, 0.0), False)
    machine.command(actuated(machine, 0.75))
    assert machine.step().torques == actuated(machine, 0.75)


@pytest.mark.parametrize("robot", ROBOTS)
@pytest.mark.parametrize("joint", JOINTS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_position_jump_no_motion_could_make_is_a_fault(robot: str, joint: int, sign: float) -> None:
    """A moteus that reset (brown-out) comes back with its multi-turn count lost: the joint angle jumps by a
    fraction of a turn between two cycles, either way. That is no motion (more than twice the velocity limit would
    allow), and running on with the wrong angle is not safe: both stopped, the joint named."""
    m = Machine(driver_config(robot))
    m.command(actuated(m, 2.0))
    limit = m.config.joints[joint].velocity_limit
    q = [0.0, 0.0]
    assert m.step(q).state is A
    q[joint] = sign * 0.9 * limit * 0.002                          # fast, but motion: fine
    assert m.step(q).state is A
    q[joint] += sign * 0.5 * limit * 0.010                         # after 10 ms without a cycle: still motion
    assert m.step(q, dt=0.010).state is A
    q[joint] += sign * 2.0 * math.pi / 6.0                         # a sixth of a turn in 2 ms
    d = m.step(q)
    assert (d.state, d.stop, d.torques) == (F, True, (0.0, 0.0))
    assert m.config.joints[joint].name in d.reason and "jumped" in d.reason
    m.safety.reset()                                               # a reset forgets the last positions too
    m.command(actuated(m, 2.0))
    assert m.step([5.0, -5.0]).state is A


@pytest.mark.parametrize("robot", ROBOTS)
def test_a_stalled_cycle_followed_by_a_quick_one_is_not_a_jump(robot: str) -> None:
    """Each cycle decides on the readings of the previous CAN transaction. A loop stalled for 6 ms (a loaded robot
    computer) starts a transaction late, and the next cycle follows 0.6 ms after it: 0.6 ms between the two
    decisions, 6.5 ms between the readings. Timed by the decisions, real motion (0.8 x the velocity limit) was a
    'jump' and stopped both (seen under load in test_moteus_driver.py); timed by the transactions it is motion,
    and a real jump still is a fault."""
    m = Machine(driver_config(robot))
    joint = m.act
    m.command(actuated(m, 2.0))
    speed = 0.8 * m.config.joints[joint].velocity_limit
    before = [(0.0, 0.0005)] * 2                        # transaction of the cycle at t = 0: 0 .. 0.5 ms
    stalled = [(0.006, 0.0065)] * 2                     # the next one, 6 ms late: 6 .. 6.5 ms
    assert m.safety.update(0.006, [0.0, 0.0], REST[1], OK_MODES, (0, 0), before).state is A
    q = [0.0, 0.0]
    q[joint] = speed * 0.006
    d = m.safety.update(0.0066, q, REST[1], OK_MODES, (0, 0), stalled)
    assert d.state is A, d.reason
    q[joint] += 2.0 * math.pi / 6.0                     # a sixth of a turn within the next 2 ms transaction
    d = m.safety.update(0.0086, q, REST[1], OK_MODES, (0, 0), [(0.0066, 0.0071)] * 2)
    assert d.state is F and "jumped" in d.reason


@pytest.mark.parametrize("robot", ROBOTS)
@pytest.mark.parametrize("joint", JOINTS)
def test_the_jump_bound_is_twice_the_velocity_limit_plus_five_hundredths_of_a_radian(robot: str, joint: int) -> None:
    """The bound of a jump between two cycles: 2 * velocity_limit * interval + 0.05 rad (docs/faults.md). Just under
    it is motion, either way; just over it is a fault."""
    m = Machine(driver_config(robot))
    m.command(actuated(m, 2.0))
    bound = 2.0 * m.config.joints[joint].velocity_limit * 0.002 + 0.05
    q = [0.0, 0.0]
    assert m.step(q).state is A
    for position in (0.99 * bound, 0.0, -0.99 * bound, 0.0):          # just under the bound, forward and back
        q[joint] = position
        assert m.step(q).state is A, m.safety.reason
    q[joint] = 1.01 * bound                                           # just over it
    d = m.step(q)
    assert (d.state, d.stop) == (F, True) and "jumped" in d.reason
