"""The driver loop and every safety path, against emulated moteus controllers on a python-can virtual bus."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcpilco_core.hardware.config import DriverConfig, TransportConfig, load_driver_config
from mcpilco_core.hardware.driver import DriverRunner, DriverSample, MissingControllerError, MoteusDriver
from mcpilco_core.hardware.emulator import EmulatedBus, VirtualCanEmulator, robot_bus
from mcpilco_core.hardware.safety import SafetyState
from mcpilco_core.plant import DoublePendulum

pytestmark = pytest.mark.timeout(20)
CONFIG = Path(__file__).resolve().parents[1] / "config"


def virtual_config(robot: str = "pendubot", can_timeout: float = 0.2, max_timeouts: int = 10,
                   **changes: object) -> DriverConfig:
    """The shipped config on a fresh virtual channel. Generous CAN, watchdog and command timeouts by default: the
    test machine's two cores are shared, and a scheduling stall must not trip the paths other tests are about (a
    command set once went stale before the driver's thread ran under load, so a test waiting for it to act timed
    out); the timeout tests set tight values themselves."""
    config = load_driver_config(CONFIG / f"moteus_driver_{robot}.yaml")
    transport = TransportConfig(kind="pythoncan", interface="virtual", channel=f"test-{uuid.uuid4().hex}",
                                can_timeout=can_timeout, max_consecutive_timeouts=max_timeouts)
    changes.setdefault("watchdog_timeout", 0.5)
    changes.setdefault("command_timeout", 1.0)
    return dataclasses.replace(config, transport=transport, **changes)


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` until it holds (AssertionError after ``timeout`` s). A predicate that reads a sample the
    driver's thread has not produced yet (IndexError on ``rig.samples[-1]``) counts as not yet: the thread may not
    have run its first cycle when the wait starts (seen once in a fresh-clone run)."""
    end = time.monotonic() + timeout
    while not _holds(predicate):
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def _holds(predicate: Callable[[], bool]) -> bool:
    try:
        return bool(predicate())
    except IndexError:
        return False


class Rig:
    """Emulated controllers (optionally on the plant) + the driver running in its own thread."""

    def __init__(self, config: DriverConfig, plant: bool = False, x0: tuple = (0.0, 0.0, 0.0, 0.0)) -> None:
        self.config = config
        model = DoublePendulum.from_yaml(CONFIG / f"{config.robot}.yaml") if plant else None
        self.bus: EmulatedBus = robot_bus(config, model, x0)
        self.emulator = VirtualCanEmulator(self.bus, config.transport.channel).start()
        self.samples: list = []
        self.driver = MoteusDriver(config)
        self.runner = DriverRunner(self.driver, self.samples.append)

    def motor(self, joint: int):  # noqa: ANN201 - test helper
        return self.bus.motor(self.config.joints[joint].can_id)

    def close(self) -> None:
        self.runner.stop()
        self.emulator.stop()


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic garbage collector off while rigs run. Why: a full collection of the whole test suite's heap holds
    the GIL for 0.3-1.5 s on a loaded 2-core machine; the driver sends nothing meanwhile and the emulated shoulder's
    0.5 s watchdog latches mode 11, a FAULT no test here is about (seen once in a full run; reproduced by holding the
    GIL 0.6 s). The nodes freeze their heap for the same reason (``run_node``: gc.freeze)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def closing_rigs(rigs: list[Rig]) -> Iterator[None]:
    """Every rig in ``rigs`` (filled meanwhile) closed at the end, the cyclic GC off while they run."""
    with no_cyclic_gc():
        try:
            yield
        finally:
            for rig in rigs:
                rig.close()


@pytest.fixture
def make_rig() -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(config: DriverConfig | None = None, start: bool = True, **kwargs: object) -> Rig:
        rig = Rig(config or virtual_config(), **kwargs)
        rigs.append(rig)
        if start:
            rig.runner.start()
        return rig

    with closing_rigs(rigs):
        yield make


def test_zero_torque_until_commands_then_actuated_only(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(plant=True)
    wait_for(lambda: len(rig.samples) > 20)
    assert rig.driver.safety.state is SafetyState.WAITING
    assert rig.motor(0).commands[0x022] == 0.0 and rig.motor(0).commands[0x023] == 0.0
    rig.driver.set_command((2.0, 3.0))                     # elbow (passive) torque must be dropped
    wait_for(lambda: rig.samples[-1].decision.state is SafetyState.ACTIVE)
    wait_for(lambda: rig.motor(0).commands[0x022] == pytest.approx(2.0))
    shoulder, elbow = rig.motor(0), rig.motor(1)
    assert elbow.mode == 0 and elbow.max_commanded_torque == 0.0 and rig.bus.rig.passive_torque_peak == 0.0
    assert all(f.writes == [] for f in list(elbow.frames)[1:])   # after the startup stop: queries only
    assert shoulder.commands[0x025] == 6.0 and shoulder.commands[0x027] == pytest.approx(0.5)
    sample = rig.samples[-1]
    assert sample.fresh and sample.motors[0].mode == 10 and sample.tau[0] == pytest.approx(2.0, abs=0.01)


def test_the_safety_check_gets_each_readings_can_transaction(make_rig: Callable[..., Rig]) -> None:
    """The position-jump check times two readings by the CAN transactions that brought them, not by the cycles
    that decide on them (a stalled cycle then a quick one looked like a jump: test_safety.py)."""
    rig = make_rig(plant=True, start=False)
    seen: list = []
    update = rig.driver.safety.update

    def spy(now, q, dq, modes, faults, measured=None):
        seen.append((now, measured))
        return update(now, q, dq, modes, faults, measured)

    rig.driver.safety.update = spy
    rig.runner.start()
    wait_for(lambda: len(seen) > 20)
    for (now, measured), (_, earlier) in zip(seen[2:], seen[1:]):
        assert measured is not None and len(measured) == 2
        for (since, until), (before_since, _) in zip(measured, earlier):
            assert before_since <= since <= until <= now         # the previous cycle's transaction, before now


def test_torque_is_clamped_to_the_joint_limit(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.driver.set_command((100.0, 0.0))
    wait_for(lambda: rig.motor(0).commands[0x022] == pytest.approx(6.0))
    rig.driver.set_command((-100.0, 0.0))
    wait_for(lambda: rig.motor(0).commands[0x022] == pytest.approx(-6.0))


def test_direction_and_gear_are_applied_to_commands_and_states(make_rig: Callable[..., Rig]) -> None:
    config = virtual_config()
    shoulder = dataclasses.replace(config.joints[0], direction=-1, gear_ratio=2.0, position_offset=0.5)
    rig = make_rig(dataclasses.replace(config, joints=(shoulder, config.joints[1])), start=False)
    rig.motor(0).position = 0.25                     # before the driver starts: a jump once running is a fault
    rig.runner.start()
    rig.driver.set_command((3.0, 0.0))
    wait_for(lambda: rig.motor(0).commands[0x022] == pytest.approx(-1.5))   # 3 N m / (-1 * 2)
    assert rig.motor(0).commands[0x025] == pytest.approx(3.0)                # 6 N m joint limit / gear 2
    wait_for(lambda: rig.samples[-1].q[0] == pytest.approx(0.5 - 2 * 3.14159265 * 0.25 / 2, abs=1e-4))


def test_stale_commands_give_zero_torque_and_resume(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(virtual_config(command_timeout=0.05))
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: rig.motor(0).commands[0x022] == pytest.approx(1.0))
    wait_for(lambda: rig.driver.safety.state is SafetyState.STALE)
    wait_for(lambda: rig.motor(0).commands[0x022] == 0.0)
    assert rig.motor(0).mode == 10                       # still fed with zero torque: no watchdog trip
    rig.driver.set_command((-1.0, 0.0))
    wait_for(lambda: rig.motor(0).commands[0x022] == pytest.approx(-1.0))


def test_firmware_watchdog_stops_the_motor_when_the_driver_dies() -> None:
    """The driver sends the watchdog timeout with every command; when its process dies mid-run (no stop sent), the
    moteus itself enters mode 11 and stops. What the driver last saw and sent is checked from its own last sample and
    the controller's registers, not from a state read after the death (under load the watchdog may already have
    tripped by then)."""
    config = virtual_config(watchdog_timeout=0.2)
    bus = robot_bus(config)
    with VirtualCanEmulator(bus, config.transport.channel):
        driver = MoteusDriver(config)

        async def run_then_die() -> DriverSample:
            await driver.start()
            for _ in range(20):
                driver.set_command((2.0, 0.0))
                sample = await driver.cycle()
            return sample                     # no shutdown: the process "dies" here

        last = asyncio.run(run_then_die())
        motor = bus.motor(1)
        assert last.fresh and last.decision.torques[0] == 2.0 and last.motors[0].mode == 10
        assert motor.commands[0x022] == pytest.approx(2.0) and motor.commands[0x027] == pytest.approx(0.2)
        wait_for(lambda: motor.mode == 11, timeout=2.0)
        assert motor.torque == 0.0            # damped stop at zero velocity


def test_fault_mode_stops_both_and_names_the_fault(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: rig.motor(0).mode == 10)
    rig.motor(1).inject_fault(33)
    wait_for(lambda: rig.driver.safety.state is SafetyState.FAULT)
    reason = rig.driver.safety.reason
    assert "elbow" in reason and "motor_driver_fault" in reason and "mode 1" in reason
    wait_for(lambda: rig.motor(0).mode == 0 and rig.motor(1).mode == 0)   # stop sent to both (clears the fault)
    rig.driver.set_command((1.0, 0.0))                                     # latched: no torque any more
    time.sleep(0.05)
    assert rig.motor(0).mode == 0 and rig.samples[-1].decision.stop


def test_timeout_mode_stops_both(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: rig.motor(0).mode == 10)
    with rig.bus.lock:
        rig.motor(0).mode = 11
    wait_for(lambda: rig.driver.safety.state is SafetyState.FAULT)
    assert "mode 11 (timeout)" in rig.driver.safety.reason
    wait_for(lambda: rig.motor(0).mode == 0)


@pytest.mark.parametrize("failure", ["dropped", "late"])
def test_can_timeout_stops_both(make_rig: Callable[..., Rig], failure: str) -> None:
    rig = make_rig(virtual_config(can_timeout=0.05, max_timeouts=1))
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: rig.motor(0).mode == 10)
    if failure == "dropped":
        rig.motor(1).drop_replies = 1
    else:
        rig.motor(1).reply_delay = 0.2            # longer than can_timeout (0.05 s)
    wait_for(lambda: rig.driver.safety.state is SafetyState.FAULT)
    assert "CAN timeout" in rig.driver.safety.reason and "virtual" in rig.driver.safety.reason
    rig.motor(1).reply_delay = 0.0
    wait_for(lambda: rig.motor(0).mode == 0 and rig.motor(1).mode == 0)
    assert rig.driver.stats.can_timeouts >= 1


@pytest.mark.parametrize("x0,what", [((0.0, 0.0, 30.0, 0.0), "velocity"), ((30.0, 0.0, 0.0, 0.0), "position")])
def test_limits_damp_then_stop(make_rig: Callable[..., Rig], x0: tuple, what: str) -> None:
    rig = make_rig(virtual_config(damping_duration=0.2, damping_gain=0.1), plant=True, x0=x0)
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: any(s.decision.state is SafetyState.DAMPING for s in rig.samples))
    damping = [s for s in rig.samples if s.decision.state is SafetyState.DAMPING]
    assert what in damping[0].decision.reason
    wait_for(lambda: rig.samples[-1].decision.state is SafetyState.STOPPED, timeout=3.0)
    samples = list(rig.samples)
    damping = [s for s in samples if s.decision.state is SafetyState.DAMPING]
    for prev, s in zip(samples, samples[1:]):   # decided on the previous measurement
        if s.decision.state is SafetyState.DAMPING:   # opposes the actuated joint's velocity; passive untouched
            assert s.decision.torques[1] == 0.0
            assert s.decision.torques[0] == pytest.approx(max(-6.0, min(6.0, -0.1 * prev.dq[0])), abs=1e-9)
    # order, not timing (the damping time is tested exactly with an injected clock in test_safety.py): one
    # uninterrupted stretch of damping, then stopped for good
    states = [s.decision.state for s in samples]
    first, last = states.index(SafetyState.DAMPING), len(states) - 1 - states[::-1].index(SafetyState.DAMPING)
    assert set(states[first:last + 1]) == {SafetyState.DAMPING}
    assert set(states[last + 1:]) == {SafetyState.STOPPED} and all(s.decision.stop for s in samples[last + 1:])
    assert not any(s.decision.stop for s in samples[:last + 1])
    wait_for(lambda: rig.motor(0).mode == 0)
    assert rig.bus.rig.passive_torque_peak == 0.0


def test_stop_request_latches(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: rig.motor(0).mode == 10)
    rig.driver.request_stop("~/stop service")
    wait_for(lambda: rig.motor(0).mode == 0)
    rig.driver.set_command((1.0, 0.0))
    time.sleep(0.05)
    assert rig.motor(0).mode == 0 and rig.driver.safety.reason == "~/stop service"
    n = len(rig.samples)
    wait_for(lambda: len(rig.samples) > n + 5)           # joint states keep flowing after a stop


def test_missing_controller_names_id_and_transport(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(start=False)
    rig.motor(1).silent = True
    with pytest.raises(MissingControllerError) as info:
        rig.runner.start()
    message = str(info.value)
    assert "CAN id 2" in message and "elbow" in message and rig.config.transport.channel in message
    assert rig.motor(0).mode == 0


def test_latched_fault_is_cleared_by_the_startup_stop(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(start=False)
    rig.motor(0).inject_fault(40)
    with rig.bus.lock:
        rig.motor(1).mode = 11
    rig.runner.start()
    # cleared: the loop may already have sent its zero-torque command (mode 10), never fault or timeout
    assert rig.motor(0).mode in (0, 10) and rig.motor(0).fault == 0 and rig.motor(1).mode == 0
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: rig.motor(0).mode == 10)


def test_exception_in_the_loop_stops_both(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(start=False)

    def explode(sample: object) -> None:
        rig.samples.append(sample)
        if len(rig.samples) == 30:
            raise RuntimeError("boom")

    rig.runner.on_sample = explode
    rig.runner.start()
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: not rig.runner.is_alive())
    assert isinstance(rig.runner.error, RuntimeError) and rig.runner.stopped_cleanly
    assert rig.motor(0).mode == 0 and rig.motor(1).mode == 0
    assert "boom" in rig.driver.safety.reason


def test_clean_stop_stops_both(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: rig.motor(0).mode == 10)
    rig.runner.stop()
    assert rig.runner.stopped_cleanly and rig.motor(0).mode == 0 and rig.motor(1).mode == 0


def test_acrobot_actuates_the_elbow_only(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(virtual_config("acrobot"), plant=True)
    rig.driver.set_command((4.0, -2.5))
    wait_for(lambda: rig.motor(1).commands[0x022] == pytest.approx(-2.5))
    assert rig.motor(0).mode == 0 and rig.motor(0).max_commanded_torque == 0.0
    assert rig.bus.rig.passive_torque_peak == 0.0


def test_opt_in_friction_compensation_reaches_the_passive_motor_bounded(make_rig: Callable[..., Rig]) -> None:
    """friction_compensation_limit > 0: the passive motor is torque-controlled, clamped to that limit (<= 0.5 N m);
    0 (default, the test above): only queried. A stop still stops both."""
    rig = make_rig(virtual_config(friction_compensation_limit=0.3))
    rig.driver.set_command((2.0, 0.2))
    wait_for(lambda: rig.motor(1).commands[0x022] == pytest.approx(0.2))
    assert rig.motor(1).commands[0x025] == pytest.approx(0.3) and rig.motor(0).commands[0x022] == pytest.approx(2.0)
    rig.driver.set_command((2.0, -3.0))                                          # clamped to the limit
    wait_for(lambda: rig.motor(1).commands[0x022] == pytest.approx(-0.3))
    assert rig.motor(1).max_commanded_torque <= 0.3 + 1e-6                      # (float32 on the wire)
    rig.driver.request_stop("test")
    wait_for(lambda: rig.motor(0).mode == 0 and rig.motor(1).mode == 0)


def test_friction_compensation_limit_is_bounded_by_the_config() -> None:
    from mcpilco_core.config import ConfigError, read_yaml, unwrap_ros_parameters
    from mcpilco_core.hardware.config import driver_config_from_mapping

    params = unwrap_ros_parameters(read_yaml(CONFIG / "moteus_driver_pendubot.yaml"), "x", "moteus_driver_node")
    assert driver_config_from_mapping(params, "x").friction_compensation_limit == 0.0
    with pytest.raises(ConfigError, match="friction_compensation_limit"):
        driver_config_from_mapping({**params, "friction_compensation_limit": 0.6}, "x")
