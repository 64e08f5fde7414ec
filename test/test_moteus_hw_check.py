"""``mcpilco hw-check`` against emulated controllers (python-can virtual bus and the fdcanusb pty)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from mcpilco_core.hardware.config import load_driver_config
from mcpilco_core.hardware.emulator import FdcanusbPtyEmulator, VirtualCanEmulator, robot_bus
from mcpilco_core.plant import DoublePendulum
from mcpilco_ros import cli

pytestmark = pytest.mark.timeout(20)
CONFIG = Path(__file__).resolve().parents[1] / "config"


def run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().out


def test_hw_check_reports_both_controllers_over_the_pty(capsys: pytest.CaptureFixture) -> None:
    bus = robot_bus(load_driver_config(CONFIG / "moteus_driver_pendubot.yaml"))
    bus.motor(2).inject_fault(33)                 # a latched fault is cleared by hw-check's stop
    bus.motor(1).position = 0.25
    with FdcanusbPtyEmulator(bus) as emulator:
        code, out = run(["hw-check", "--config", str(CONFIG / "moteus_driver_pendubot.yaml"),
                         "--transport", "fdcanusb", "--path", emulator.path], capsys)
    assert code == 0, out
    assert "shoulder" in out and "elbow" in out and "stopped" in out and "1.571" in out and "24.0" in out
    assert bus.motor(1).mode == 0 and bus.motor(1).max_commanded_torque == 0.0   # no pulse without --pulse
    assert "hw-check: OK" in out


def test_hw_check_missing_controller_fails_naming_it(capsys: pytest.CaptureFixture) -> None:
    bus = robot_bus(load_driver_config(CONFIG / "moteus_driver_acrobot.yaml"))
    bus.motor(1).silent = True
    channel = f"hw-{uuid.uuid4().hex}"
    with VirtualCanEmulator(bus, channel):
        code, out = run(["hw-check", "--robot", "acrobot", "--config", str(CONFIG / "moteus_driver_acrobot.yaml"),
                         "--transport", "pythoncan", "--interface", "virtual", "--channel", channel], capsys)
    assert code == 1
    assert "MISSING" in out and channel in out and "hw-check: FAILED" in out


def test_hw_check_pulse_is_bounded_and_on_the_actuated_joint_only(capsys: pytest.CaptureFixture) -> None:
    config = load_driver_config(CONFIG / "moteus_driver_pendubot.yaml")
    bus = robot_bus(config, DoublePendulum.from_yaml(CONFIG / "pendubot.yaml"))
    channel = f"hw-{uuid.uuid4().hex}"
    with VirtualCanEmulator(bus, channel):
        code, out = run(["hw-check", "--config", str(CONFIG / "moteus_driver_pendubot.yaml"), "--transport",
                         "pythoncan", "--interface", "virtual", "--channel", channel, "--pulse",
                         "--pulse-torque", "5", "--pulse-duration", "3"], capsys)
    assert code == 0, out
    assert "pulse: +1.00 N m on shoulder for 1.00 s" in out            # clamped to 1 N m and 1 s
    assert bus.motor(1).max_commanded_torque == pytest.approx(1.0)
    assert bus.motor(2).max_commanded_torque == 0.0 and bus.motor(1).mode == 0
    moved = float(out.split("joint moved ")[1].split()[0])
    assert moved > 0.01                                                 # positive torque, positive motion


def test_hw_check_is_a_cli_subcommand() -> None:
    assert "hw-check" in cli.build_parser().format_help()


def test_hw_check_refuses_an_absurd_watchdog(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = (CONFIG / "moteus_driver_pendubot.yaml").read_text()
    bad = tmp_path / "driver.yaml"
    bad.write_text(text.replace("watchdog_timeout: 0.05", "watchdog_timeout: 1.0e+9"))
    code = cli.main(["hw-check", "--config", str(bad)])
    captured = capsys.readouterr()
    assert code == 2 and "watchdog_timeout" in captured.err + captured.out and str(bad) in captured.err + captured.out
