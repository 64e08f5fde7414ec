"""moteus_driver_node: the real robot's driver, torque control of both joints over CAN-FD.

A thin layer over :class:`mcpilco_core.hardware.MoteusDriver`: the driver's asyncio loop owns the moteus
transport in its own thread (:class:`DriverRunner`), rclpy spins a SingleThreadedExecutor in the main thread.

- publishes ``joint_states`` (names shoulder/elbow; rad, rad/s, N m; stamp = measurement time) every cycle
  (``rate``, 500 Hz) and ``diagnostics`` every ``diagnostics_period`` s (per motor: mode, fault, temperature,
  bus voltage; loop: safety state, achieved rate, period p50/p99, late cycles, CAN timeouts and round trip);
- takes ``joint_commands`` (effort, N m): they are also the enable signal, no torque before the first one and
  zero torque when they stop for ``command_timeout`` s (the controller publishes only while enabled);
- ``~/stop`` (std_srvs/Trigger) stops both motors (latched until the node restarts);
- ``~/disturb`` (std_srvs/Trigger) runs one disturbance window (:mod:`mcpilco_core.hardware.disturbance`): 0.2 s
  of the evaluation protocol's reset PID plus gravity compensation on *both* motors towards a seeded random
  target, bounded by ``disturbance.torque_limit`` on both joints, still stopped by every fault and ended by the
  velocity/position limits; the answer's message is JSON (window index, target rad, seed, torque limit);
  diagnostics name it (``disturbance_*`` keys); every ``joint_states`` message of a cycle that commanded the
  window, or follows one, has ``header.frame_id = "reset"`` (else ""), so the recording reader keeps those
  intervals from the model. Outside a window the passive motor gets queries and stops only: exactly 0.

Both motors are stopped on every exit path: ``~/stop``, SIGINT, SIGTERM, an exception in the loop or in the
node; at startup a stop clears latched faults and a missing controller is refused with its id and transport.
"""

from __future__ import annotations

import math
import sys
import time

from diagnostic_msgs.msg import DiagnosticArray
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger

from mcpilco_core.config import JOINT_NAMES, settings_of
from mcpilco_core.hardware import (
    DriverRunner,
    DriverSample,
    MissingControllerError,
    MoteusDriver,
    SafetyState,
    driver_config_from_mapping,
    fault_name,
    mode_name,
)
from mcpilco_core.hardware.config import DriverConfig
from mcpilco_core.hardware.transport import TransportError
from mcpilco_core.simulation import RESET_FRAME

from ._messages import CONTROL_QOS, effort_from_message, stamp_from_ns
from ._ros_utils import (
    ERROR,
    OK,
    WARN,
    ConfigSchema,
    ConfiguredNode,
    ParamSpec,
    nest,
    param_specs,
    run_node,
    status,
    validated,
)

NODE_NAME = "moteus_driver_node"

# Generated from the metadata of mcpilco_core.hardware.config's dataclasses: the ranges hw-check enforces.
DRIVER_PARAMETERS: tuple[ParamSpec, ...] = param_specs(settings_of(DriverConfig))


def driver_config_from_parameters(values: dict) -> DriverConfig:
    """Validate the declared parameters with the same rules as the YAML path (errors name the parameter)."""
    return validated(driver_config_from_mapping, nest(values), f"<parameters of {NODE_NAME}>")


DRIVER_SCHEMA = ConfigSchema(DRIVER_PARAMETERS, driver_config_from_parameters)


class MoteusDriverNode(ConfiguredNode):
    """See the module docstring."""

    def __init__(self, driver: MoteusDriver | None = None, **kwargs) -> None:
        # diagnostics come with the samples, every config.diagnostics_period s (no timer)
        super().__init__(NODE_NAME, (), DRIVER_SCHEMA, driver.config if driver is not None else None,
                         diagnostics_timer=False, **kwargs)
        self.refused_commands = 0
        self.nonfinite_states = 0       # samples with a NaN/inf reading: never published (the driver stops both)
        self.stale_states = 0           # cycles without a reply (CAN timeout or error): not published, so the
                                        # controller's watchdog and the bag see the gap
        self._last_diagnostics = 0.0
        self.state_pub = self.create_publisher(JointState, "joint_states", CONTROL_QOS)
        self.create_subscription(JointState, "joint_commands", self._on_command, CONTROL_QOS)
        self.create_service(Trigger, "~/stop", self._on_stop)
        self.create_service(Trigger, "~/disturb", self._on_disturb)
        self._previous_in_window = False
        self.create_timer(0.1, self._watch_runner)
        self.driver = driver or MoteusDriver(self.config)
        self.runner = DriverRunner(self.driver, self._on_sample)
        try:
            self.runner.start()
        except (MissingControllerError, TransportError, TimeoutError) as exc:
            raise ValueError(str(exc)) from exc
        self.get_logger().info(f"{self.config.robot}: both moteus controllers answer on "
                               f"{self.config.transport.describe()}; {self.config.rate:g} Hz; zero torque until "
                               f"joint_commands arrive")

    # ------------------------------------------------------------------ ROS inputs
    def _on_command(self, msg: JointState) -> None:
        effort, problem = effort_from_message(msg)
        if effort is None:
            self.refused_commands += 1
            if problem == "nonfinite":   # a controller computing NaN has failed: zero torque now, not at the timeout
                self.driver.set_command((0.0, 0.0), time.monotonic())
            if self.refused_commands in (1, 10, 100, 1000):
                self.get_logger().warning(f"refused joint_commands ({problem}); {self.refused_commands} so far")
            return
        self.driver.set_command(effort, time.monotonic())

    def _on_stop(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        self.driver.request_stop("~/stop service called")
        self.get_logger().warning("~/stop: stopping both motors (latched until restart)")
        response.success, response.message = True, "both motors stopped (latched until the driver restarts)"
        return response

    def _on_disturb(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = self.driver.request_disturbance()
        log = self.get_logger().info if response.success else self.get_logger().warning
        log(f"~/disturb: {response.message}")
        return response

    def _watch_runner(self) -> None:
        if not self.runner.is_alive() and not self.done.is_set():
            self.get_logger().error(f"driver loop ended: {self.runner.error!r}; motors stopped: "
                                    f"{self.runner.stopped_cleanly}")
            self.exit_code = 1
            self.done.set()

    # ------------------------------------------------------------------ outputs (called in the driver thread)
    def _on_sample(self, sample: DriverSample) -> None:
        msg = JointState()
        msg.header.stamp = stamp_from_ns(sample.stamp_ns)
        msg.name = list(JOINT_NAMES)
        msg.position, msg.velocity, msg.effort = list(sample.q), list(sample.dq), list(sample.tau)
        in_window = sample.disturbance is not None
        if in_window or self._previous_in_window:   # the window's torque acts after or before this measurement
            msg.header.frame_id = RESET_FRAME
        self._previous_in_window = in_window
        if not sample.fresh:   # no reply this cycle: the last readings, not a measurement; never re-stamped as one
            self.stale_states += 1
        elif all(math.isfinite(v) for v in (*sample.q, *sample.dq, *sample.tau)):
            self.state_pub.publish(msg)
        else:  # never NaN on joint_states; the safety supervisor latched a fault, diagnostics say which reading
            self.nonfinite_states += 1
        if sample.monotonic - self._last_diagnostics >= self.config.diagnostics_period:
            self._last_diagnostics = sample.monotonic
            self.diagnostics_pub.publish(self.diagnostics(sample))

    def diagnostics(self, sample: DriverSample) -> DiagnosticArray:
        """Loop status (safety state, timing) and one status per motor (mode, fault, temperature, voltage)."""
        decision, loop = sample.decision, self.driver.stats.summary()
        level = {SafetyState.ACTIVE: OK, SafetyState.WAITING: OK, SafetyState.FAULT: ERROR}.get(decision.state, WARN)
        values = {"state": decision.state.value, "reason": decision.reason, "refused_commands": self.refused_commands,
                  "nonfinite_states": self.nonfinite_states, "stale_states": self.stale_states,
                  "clamped_commands": self.driver.safety.clamped_commands, "rate_target_hz": self.config.rate,
                  "friction_compensation_limit": self.config.friction_compensation_limit}
        values.update(self.driver.disturbance.summary())
        values.update({k: loop.get(k, math.nan) for k in ("rate_hz", "period_p50_ms", "period_p99_ms", "late_cycles",
                                                          "can_timeouts", "can_errors", "rtt_p50_ms", "rtt_p99_ms",
                                                          "cycles")})
        message = decision.reason or decision.state.value
        if sample.disturbance is not None:
            message = (f"disturbance window {sample.disturbance.index} towards "
                       f"{[round(v, 4) for v in sample.disturbance.target]} rad")
        statuses = [status(f"{NODE_NAME}: loop", self.config.transport.describe(), level, message, values)]
        for joint, motor in zip(self.config.joints, sample.motors):
            bad = motor.mode in (1, 11)
            statuses.append(status(
                f"{NODE_NAME}: {joint.name}", f"moteus id {joint.can_id}", ERROR if bad else OK,
                f"{mode_name(motor.mode)}" + (f", fault {fault_name(motor.fault)}" if motor.fault else ""),
                {"mode": motor.mode, "mode_name": mode_name(motor.mode), "fault": motor.fault,
                 "fault_name": fault_name(motor.fault), "temperature_C": motor.temperature,
                 "voltage_V": motor.voltage, "position_rev": motor.position, "velocity_rev_s": motor.velocity,
                 "torque_Nm": motor.torque, "replied": motor.replied}))
        return self.diagnostics_array(statuses, stamp_from_ns(sample.stamp_ns))

    # ------------------------------------------------------------------ exit paths
    def on_shutdown(self) -> None:
        """End the loop; the runner stops both motors on the way out."""
        runner = getattr(self, "runner", None)   # None when the node refused its parameters
        if runner is not None and runner.is_alive():
            runner.stop()

    def destroy_node(self) -> None:
        self.on_shutdown()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    return run_node(MoteusDriverNode, NODE_NAME, args)


if __name__ == "__main__":
    sys.exit(main())
