"""CAN send failures and non-finite readings against the emulated moteus (issue 13, items 5 and 6).

SocketCAN raises ``can.CanOperationError`` (not an OSError) on ENOBUFS and bus-off: the driver loop must count it
as a CAN fault like a timeout, stop both motors after ``max_consecutive_timeouts`` in a row, keep running, and
``stop_motors`` must keep trying every motor. A NaN position or velocity from a moteus is a fault: both stop."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
from test_moteus_driver import Rig, closing_rigs, virtual_config, wait_for

from mcpilco_core.hardware.driver import MoteusDriver
from mcpilco_core.hardware.emulator import CanSendFaults, EmulatedBus, VirtualCanEmulator, robot_bus
from mcpilco_core.hardware.safety import SafetyState

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def make_rig() -> Iterator[Callable[..., Rig]]:
    """Started rigs (emulated controllers + the driver in its thread), closed after the test."""
    rigs: list[Rig] = []

    def make(config=None) -> Rig:  # noqa: ANN001 - a DriverConfig
        rig = Rig(config or virtual_config())
        rigs.append(rig)
        rig.runner.start()
        return rig

    with closing_rigs(rigs):
        yield make


def faults_of(rig: Rig) -> CanSendFaults:
    return CanSendFaults.on_transport(rig.driver.transport)


@pytest.mark.parametrize("kind", CanSendFaults.KINDS)
def test_a_few_send_errors_are_counted_and_the_loop_goes_on(make_rig: Callable[..., Rig], kind: str) -> None:
    rig = make_rig(virtual_config(max_timeouts=1000))
    rig.driver.set_command((1.0, 0.0))
    wait_for(lambda: rig.motor(0).mode == 10)
    faults = faults_of(rig)
    faults.inject(kind, count=3)
    wait_for(lambda: faults.raised == 3 and rig.driver.stats.can_errors >= 3)
    n = len(rig.samples)
    wait_for(lambda: len(rig.samples) > n + 10 and rig.samples[-1].fresh)      # the loop lives on
    assert rig.runner.is_alive() and rig.runner.error is None
    assert rig.driver.stats.can_timeouts >= 3
    assert rig.driver.safety.state not in (SafetyState.FAULT, SafetyState.STOPPED), \
        rig.driver.safety.reason                         # 3 < max_consecutive_timeouts; say what latched it if not


@pytest.mark.parametrize("kind", CanSendFaults.KINDS)
def test_sustained_send_errors_latch_a_fault_then_both_motors_are_stopped(make_rig: Callable[..., Rig],
                                                                          kind: str) -> None:
    rig = make_rig(virtual_config(max_timeouts=5))
    rig.driver.set_command((2.0, 0.0))
    wait_for(lambda: rig.motor(0).mode == 10)
    faults = faults_of(rig)
    faults.inject(kind)
    wait_for(lambda: rig.driver.safety.state is SafetyState.FAULT)
    reason = rig.driver.safety.reason
    assert "CAN error" in reason and "5 in a row" in reason and rig.config.transport.channel in reason
    assert rig.runner.is_alive()
    faults.clear()                                     # the bus comes back: the latched stop reaches both motors
    wait_for(lambda: rig.motor(0).mode == 0 and rig.motor(1).mode == 0)
    rig.driver.set_command((2.0, 0.0))
    n = len(rig.samples)
    wait_for(lambda: len(rig.samples) > n + 10)
    assert rig.motor(0).mode == 0                      # latched


def stop_under_faults(kind: str, count: float, can_id: int | None,
                      robot: str = "pendubot") -> tuple[bool, MoteusDriver, EmulatedBus]:
    """A driver applying 2 N m, then CAN send failures, then ``stop_motors`` (no loop running beside it)."""
    config = virtual_config(robot, max_timeouts=1000)
    bus = robot_bus(config)
    torqued = config.joints[config.actuated_joint].can_id
    with VirtualCanEmulator(bus, config.transport.channel):
        driver = MoteusDriver(config)

        async def scenario() -> bool:
            await driver.start()
            driver.set_command((2.0, 2.0))                  # the passive joint's share is dropped
            for _ in range(5):
                await driver.cycle()
            assert bus.motor(torqued).mode == 10 and bus.motor(torqued).torque == pytest.approx(2.0)
            CanSendFaults.on_transport(driver.transport).inject(kind, count, can_id)
            try:
                return await driver.stop_motors()
            finally:
                driver.transport.close()

        return asyncio.run(scenario()), driver, bus


@pytest.mark.parametrize("kind", CanSendFaults.KINDS)
def test_stop_motors_retries_after_send_errors(kind: str) -> None:
    stopped, driver, bus = stop_under_faults(kind, 2, None)       # the first two stop frames fail
    assert stopped and bus.motor(1).mode == 0 and bus.motor(2).mode == 0


def test_a_motor_that_cannot_be_reached_does_not_keep_the_other_from_stopping() -> None:
    stopped, driver, bus = stop_under_faults("bus_off", math.inf, 1)   # every frame to the shoulder fails
    assert not stopped and bus.motor(1).mode in (10, 11)                # (left to its firmware watchdog)
    stopped, driver, bus = stop_under_faults("enobufs", math.inf, 2)   # every frame to the elbow fails
    assert not stopped and bus.motor(1).mode == 0                       # the torqued shoulder is stopped anyway
    assert "CanOperationError" in driver.last_can_error and "105" in driver.last_can_error


def test_an_unreachable_shoulder_does_not_keep_the_acrobots_torqued_elbow_from_stopping() -> None:
    """The acrobot's torqued motor comes second in the order of the stops: every frame to the (passive) shoulder
    failing must not keep the elbow from being stopped."""
    stopped, driver, bus = stop_under_faults("bus_off", math.inf, 1, robot="acrobot")
    assert not stopped and bus.motor(2).mode == 0 and bus.motor(2).torque == 0.0


def test_a_nan_reading_is_a_fault_that_stops_both(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.driver.set_command((2.0, 0.0))
    wait_for(lambda: rig.motor(0).mode == 10)
    with rig.bus.lock:
        rig.motor(1).velocity = math.nan
    wait_for(lambda: rig.driver.safety.state is SafetyState.FAULT)
    assert "non-finite elbow velocity" in rig.driver.safety.reason
    wait_for(lambda: rig.motor(0).mode == 0 and rig.motor(1).mode == 0)
    wait_for(lambda: rig.samples[-1].decision.stop)   # the runner reports a cycle after sending its commands
    assert rig.runner.is_alive()


@pytest.mark.parametrize("what", ["position", "velocity"])
def test_a_nan_reading_never_passes_the_limits(what: str) -> None:
    from mcpilco_core.hardware.safety import SafetySupervisor

    supervisor = SafetySupervisor(virtual_config())
    supervisor.command((2.0, 0.0), 0.0)
    q, dq = [0.0, 0.0], [0.0, 0.0]
    (q if what == "position" else dq)[0] = math.nan
    decision = supervisor.update(0.001, q, dq, [10, 0], [0, 0])
    assert decision.stop and decision.torques == (0.0, 0.0) and decision.state is SafetyState.FAULT
    assert f"non-finite shoulder {what}" in decision.reason


class OneSilentController:
    """A transport that returns whatever replies arrived (as a pi3hat router does): after startup the elbow's
    controller (id 2) stops answering, the shoulder's goes on."""

    def __init__(self) -> None:
        self.calls = 0

    async def cycle(self, commands):  # noqa: ANN001, ANN201 - moteus.Command list -> replies
        import moteus

        self.calls += 1
        values = {moteus.Register.MODE: 0, moteus.Register.POSITION: 0.0, moteus.Register.VELOCITY: 0.0,
                  moteus.Register.TORQUE: 0.0, moteus.Register.FAULT: 0}
        return [SimpleNamespace(id=c.destination, values=dict(values)) for c in commands
                if c.destination == 1 or self.calls <= 2]

    def close(self) -> None:
        pass


def test_a_reply_missing_from_one_controller_is_a_failed_cycle() -> None:
    driver = MoteusDriver(virtual_config(max_timeouts=3), transport=OneSilentController())

    async def scenario() -> list:
        await driver.start()
        return [await driver.cycle() for _ in range(4)]

    samples = asyncio.run(scenario())
    assert not any(s.fresh for s in samples)                    # never taken for a measurement
    assert [m.replied for m in driver.motors] == [True, False]
    assert driver.stats.can_timeouts == 4 and driver.safety.state is SafetyState.FAULT
    assert "reply missing from id 2" in driver.safety.reason


class SlowToAnswer:
    """A transport whose first calls hang ``delay`` s (a stuck adapter), then every controller answers."""

    def __init__(self, delay: float) -> None:
        self.delay, self.calls = delay, 0

    async def cycle(self, commands):  # noqa: ANN001, ANN201 - moteus.Command list -> replies
        import moteus

        self.calls += 1
        if self.calls <= 2:
            await asyncio.sleep(self.delay)
        values = {moteus.Register.MODE: 0, moteus.Register.POSITION: 0.0, moteus.Register.VELOCITY: 0.0,
                  moteus.Register.TORQUE: 0.0, moteus.Register.FAULT: 0}
        return [SimpleNamespace(id=c.destination, values=dict(values)) for c in commands]

    def close(self) -> None:
        pass


def test_a_start_that_times_out_never_runs_the_loop_later() -> None:
    from mcpilco_core.hardware.driver import DriverRunner

    samples: list = []
    config = virtual_config(can_timeout=1.0)
    runner = DriverRunner(MoteusDriver(config, transport=SlowToAnswer(0.4)), samples.append)
    with pytest.raises(TimeoutError, match="did not start within 0.2 s") as info:
        runner.start(timeout=0.2)
    assert config.transport.channel in str(info.value)
    runner._thread.join(5.0)                 # the start completes later, stops both and leaves
    assert not runner.is_alive() and samples == [] and runner.stopped_cleanly
