"""moteus protocol level: byte-exact torque commands, the emulator's decoding, unit conversions, config errors."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import moteus
import pytest
from moteus import fdcanusb_device, protocol

from mcpilco_core.config import ConfigError
from mcpilco_core.hardware import units
from mcpilco_core.hardware.commands import fault_name, mode_name, query_command, stop_command, torque_command
from mcpilco_core.hardware.config import JointDriverConfig, load_driver_config
from mcpilco_core.hardware.emulator import EmulatedMotor, crc8, decode_request, pad_can_fd

pytestmark = pytest.mark.timeout(20)
CONFIG = Path(__file__).resolve().parents[1] / "config"


def f32(value: float) -> bytes:
    return struct.pack("<f", value)


def test_torque_command_bytes_are_exact() -> None:
    cmd = torque_command(moteus.Controller(id=1), 1.5, 6.0, 0.05)
    expected = (bytes([0x01, 0x00, 0x0A])                      # write int8 x1 @ MODE = 10 (position)
                + bytes([0x0D, 0x20]) + f32(math.nan)         # write f32 x1 @ 0x020 position = NaN
                + bytes([0x0C, 0x04, 0x22]) + f32(1.5) + f32(0.0) + f32(0.0) + f32(6.0)  # ff, kp, kd, max torque
                + bytes([0x0D, 0x27]) + f32(0.05)             # watchdog timeout (s)
                + bytes([0x11, 0x00, 0x1F, 0x01, 0x13, 0x0D]))  # query: mode i8, pos/vel/torque f32, V/T/fault i8
    assert cmd.data == expected
    assert cmd.reply_required and cmd.destination == 1 and cmd.source == 0
    # the arbitration id the library puts on the wire: reply bit | source << 8 | destination
    transport = moteus.Transport([])
    assert transport._command_to_frame(cmd).arbitration_id == 0x8001


def test_torque_command_clamps_and_rejects_nan() -> None:
    cmd = torque_command(moteus.Controller(id=2), -10.0, 6.0, 0.05, query=False)
    assert cmd.data[9:12] == bytes([0x0C, 0x04, 0x22]) and cmd.data[12:16] == f32(-6.0)
    assert not cmd.reply_required
    with pytest.raises(ValueError):
        torque_command(moteus.Controller(id=2), math.nan, 6.0, 0.05)


def test_stop_and_query_bytes() -> None:
    c = moteus.Controller(id=3)
    assert stop_command(c, query=False).data == bytes([0x01, 0x00, 0x00])
    assert query_command(c).data == bytes([0x11, 0x00, 0x1F, 0x01, 0x13, 0x0D])


def test_emulator_decodes_the_library_frame_and_answers_in_the_reply_format() -> None:
    motor = EmulatedMotor(1)
    motor.position, motor.velocity = 0.25, -1.5
    cmd = torque_command(moteus.Controller(id=1), 1.5, 6.0, 0.05)
    payload = pad_can_fd(motor.process(bytes(cmd.data) + b"\x50\x50", True, now=1.0))
    assert motor.mode == 10
    c = motor.commands
    assert math.isnan(c[0x020]) and c[0x022] == 1.5 and c[0x023] == 0.0 and c[0x024] == 0.0
    assert c[0x025] == 6.0 and c[0x027] == pytest.approx(0.05)
    assert motor.output_torque() == pytest.approx(1.5)   # kp/kd scaled to 0: pure feed-forward
    values = protocol.parse_reply(payload)
    assert values[moteus.Register.MODE] == 10
    assert values[moteus.Register.POSITION] == pytest.approx(0.25)
    assert values[moteus.Register.VELOCITY] == pytest.approx(-1.5)
    assert values[moteus.Register.TORQUE] == pytest.approx(1.5)
    assert values[moteus.Register.VOLTAGE] == 24.0 and values[moteus.Register.FAULT] == 0
    assert len(payload) in (12, 16, 20, 24, 32, 48, 64)


def test_emulator_position_defaults_and_latches() -> None:
    motor = EmulatedMotor(1)
    motor.position = 0.5
    plain = moteus.Controller(id=1).make_position(query=False)          # omitted position means "go to 0"
    motor.process(plain.data, False, now=0.0)
    assert motor.output_torque() == pytest.approx(-motor.params.kp * 0.5)
    motor.check_watchdog(now=0.05)
    assert motor.mode == 10
    motor.check_watchdog(now=0.2)            # none sent: register 0x027 is 0 = the configured default, 0.1 s
    assert motor.mode == 11 and motor.output_torque() == pytest.approx(0.0)
    motor.process(torque_command(moteus.Controller(id=1), 1.0, 6.0, 0.05).data, True, now=0.3)
    assert motor.mode == 11                   # latched until a stop
    motor.process(stop_command(moteus.Controller(id=1)).data, True, now=0.4)
    assert motor.mode == 0
    motor.inject_fault(33)
    reply = protocol.parse_reply(motor.process(query_command(moteus.Controller(id=1)).data, True, now=0.5))
    assert reply[moteus.Register.MODE] == 1 and reply[moteus.Register.FAULT] == 33


@pytest.mark.parametrize("timeout, mode_after_1s", [(math.nan, 10), (0.0, 11), (0.5, 11), (2.0, 10)])
def test_emulator_watchdog_register_semantics(timeout: float, mode_after_1s: int) -> None:
    """moteus reference, register 0x027: 0 (the default) = the configured servo.default_timeout_s, NaN = no enforced
    timeout. A test against an emulator with them swapped would pass where the real firmware never times out."""
    motor = EmulatedMotor(1)
    command = moteus.Controller(id=1).make_position(position=math.nan, watchdog_timeout=timeout, query=False)
    motor.process(command.data, False, now=0.0)
    assert motor.mode == 10
    motor.check_watchdog(now=1.0)
    assert motor.mode == mode_after_1s


def test_decode_request_handles_long_form_and_int_resolutions() -> None:
    res = moteus.PositionResolution()
    res.position, res.velocity, res.feedforward_torque = moteus.INT16, moteus.INT16, moteus.INT16
    cmd = moteus.Controller(id=1, position_resolution=res).make_position(
        position=math.nan, velocity=0.5, feedforward_torque=-0.25, query=False)
    frame = decode_request(cmd.data)
    regs = {reg: raw for reg, _, raw in frame.writes}
    assert regs[0x020] == -32768 and regs[0x021] == 2000 and regs[0x022] == -25


def test_crc8_matches_the_library() -> None:
    for line in (b"can send 8001 01000A ", b"OK ", b"rcv 100 2404000A "):
        assert crc8(line) == fdcanusb_device._compute_crc8(line)


def test_names() -> None:
    assert fault_name(33) == "motor_driver_fault" and fault_name(40) == "under_voltage"
    assert fault_name(98).startswith("limit_active") and fault_name(77) == "unknown_fault_77"
    assert mode_name(11) == "timeout" and mode_name(1) == "fault"


@pytest.mark.parametrize("direction,offset,gear", [(1, 0.0, 1.0), (-1, 1.0, 2.0), (1, -math.pi, 6.0)])
def test_unit_round_trips(direction: int, offset: float, gear: float) -> None:
    joint = JointDriverConfig("shoulder", 1, direction, offset, gear, 6.0)
    for rev in (-3.2, -0.25, 0.0, 0.5, 7.75):
        q = units.joint_position(joint, rev)
        assert q == pytest.approx(direction * 2 * math.pi * rev / gear + offset)
        assert units.motor_position(joint, q) == pytest.approx(rev)
        assert units.motor_velocity(joint, units.joint_velocity(joint, rev)) == pytest.approx(rev)
        assert units.motor_torque(joint, units.joint_torque(joint, rev)) == pytest.approx(rev)


def test_unit_signs() -> None:
    joint = JointDriverConfig("elbow", 2, -1, 0.5, 2.0, 6.0)
    assert units.joint_position(joint, 0.0) == pytest.approx(0.5)          # offset: joint angle at 0 rev
    assert units.joint_position(joint, 1.0) == pytest.approx(0.5 - math.pi)
    assert units.joint_velocity(joint, 1.0) == pytest.approx(-math.pi)
    assert units.joint_torque(joint, 1.0) == pytest.approx(-2.0)           # gear multiplies torque
    assert units.motor_torque(joint, 3.0) == pytest.approx(-1.5)


def test_shipped_configs_load() -> None:
    p = load_driver_config(CONFIG / "moteus_driver_pendubot.yaml")
    a = load_driver_config(CONFIG / "moteus_driver_acrobot.yaml")
    assert p.torque_limits == (6.0, 0.0) and a.torque_limits == (0.0, 6.0)
    assert p.rate == 500.0 and p.actuated_joint == 0 and a.actuated_joint == 1


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "driver.yaml"
    path.write_text(text)
    return path


BASE = """moteus_driver_node:
  ros__parameters:
    robot: pendubot
    joints:
      shoulder: {{can_id: 1, torque_limit: 6.0{s}}}
      elbow: {{can_id: {e_id}, torque_limit: {e_lim}}}
{extra}"""


@pytest.mark.parametrize("kwargs,field", [
    (dict(e_lim=1.0), "joints.elbow.torque_limit"),
    (dict(e_id=1), "joints.elbow.can_id"),
    (dict(e_id=127), "joints.elbow.can_id"),
    (dict(s=", direction: 2"), "joints.shoulder.direction"),
    (dict(s=", gear: 2"), "joints.shoulder.gear"),
    (dict(extra="    transport: {kind: serial}\n"), "transport.kind"),
    (dict(extra="    watchdog_timeout: 0.001\n"), "watchdog_timeout"),
])
def test_config_errors_name_file_and_field(tmp_path: Path, kwargs: dict, field: str) -> None:
    values = dict(s="", e_id=2, e_lim=0.0, extra="")
    values.update(kwargs)
    path = _write(tmp_path, BASE.format(**values))
    with pytest.raises(ConfigError) as info:
        load_driver_config(path)
    assert info.value.field == field and str(path) in str(info.value)


@pytest.mark.parametrize("change,field", [
    (("", "    watchdog_timeout: 1.0e+9\n"), "watchdog_timeout"),
    (("", "    command_timeout: 1.0e+9\n"), "command_timeout"),
    (("torque_limit: 6.0", "torque_limit: 1.0e+6"), "joints.shoulder.torque_limit"),
    (("", "    transport: {can_timeout: 1.0e+9}\n"), "transport.can_timeout"),
])
def test_absurd_but_finite_values_are_refused(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    """hw-check's loader: a 1e9 s watchdog or a 1e6 N m limit is a typo, not a setting (ranges of the metadata)."""
    old, new = change
    text = BASE.format(s="", e_id=2, e_lim=0.0, extra=new if not old else "")
    path = _write(tmp_path, text.replace(old, new) if old else text)
    with pytest.raises(ConfigError) as info:
        load_driver_config(path)
    assert info.value.field == field and "must be in" in str(info.value) and str(path) in str(info.value)
