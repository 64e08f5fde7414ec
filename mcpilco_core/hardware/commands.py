"""moteus commands built with the official library, kept apart from sending so their bytes are testable.

Torque control in moteus is position mode with the position loop switched off: ``position=nan`` (no
position target), ``kp_scale=0``, ``kd_scale=0`` and the wanted torque as ``feedforward_torque``, bounded by
``maximum_torque``; every command carries ``watchdog_timeout`` so the firmware stops the motor (mode 11)
if this process stops talking. Omitting ``position`` would mean "go to 0 rev" (moteus docs).
"""

from __future__ import annotations

import math

import moteus

# Fault codes of the moteus FAULT register (moteus reference manual, register 0x00f).
FAULT_NAMES: dict[int, str] = {
    0: "success",
    1: "dma_stream_transfer_error",
    2: "dma_stream_fifo_error",
    3: "uart_overrun_error",
    4: "uart_framing_error",
    5: "uart_noise_error",
    6: "uart_buffer_overrun_error",
    7: "uart_parity_error",
    32: "calibration_fault",
    33: "motor_driver_fault",
    34: "over_voltage",
    35: "encoder_fault",
    36: "motor_not_configured",
    37: "pwm_cycle_overrun",
    38: "over_temperature",
    39: "start_outside_limit",
    40: "under_voltage",
    41: "config_changed",
    42: "theta_invalid",
    43: "position_invalid",
    44: "driver_enable_fault",
    45: "stop_position_deprecated",
    46: "timing_violation",
    47: "bemf_feedforward_no_accel",
    48: "invalid_limits",
}

MODE_NAMES: dict[int, str] = {int(m): m.name.lower() for m in moteus.Mode}
FAULT_MODES = (int(moteus.Mode.FAULT), int(moteus.Mode.TIMEOUT))


def fault_name(code: int) -> str:
    """Name of a moteus fault code (codes >= 96 are limit flags the firmware reports while running)."""
    if code in FAULT_NAMES:
        return FAULT_NAMES[code]
    if code >= 96:
        return f"limit_active_{code}"
    return f"unknown_fault_{code}"


def mode_name(mode: int) -> str:
    """Name of a moteus mode (0 stopped, 1 fault, 10 position, 11 timeout, ...)."""
    return MODE_NAMES.get(mode, f"mode_{mode}")


def torque_command(controller: moteus.Controller, torque: float, maximum_torque: float,
                   watchdog_timeout: float, query: bool = True) -> moteus.Command:
    """A torque-mode command (N m at the moteus output, bounded by ``maximum_torque`` N m, watchdog s)."""
    if not math.isfinite(torque):
        raise ValueError(f"torque must be finite, got {torque}")
    maximum_torque = abs(maximum_torque)
    torque = min(max(torque, -maximum_torque), maximum_torque)
    return controller.make_position(position=math.nan, kp_scale=0.0, kd_scale=0.0, feedforward_torque=torque,
                                    maximum_torque=maximum_torque, watchdog_timeout=watchdog_timeout, query=query)


def query_command(controller: moteus.Controller) -> moteus.Command:
    """A pure query (mode, position, velocity, torque, voltage, temperature, fault): no torque."""
    return controller.make_query()


def stop_command(controller: moteus.Controller, query: bool = True) -> moteus.Command:
    """Stop mode: motor unpowered; also clears a latched fault (mode 1) or timeout (mode 11)."""
    return controller.make_stop(query=query)
