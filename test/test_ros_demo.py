"""The main demo's ROS path, shortened to 5 s: same score as the evaluator, plot and trajectory written;
and the demo module (registered in the mcpilco CLI) never imports rclpy itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("rclpy")
from mcpilco_ros.demo import run_demo  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def test_demo_over_ros_matches_the_evaluator(tmp_path):
    result = run_demo("pendubot", seed=1, out_dir=tmp_path, compare=True, quiet=True, duration=5.0)
    assert result["lockstep_timeouts"] == 0
    assert result["score"] == result["evaluate_score"]
    assert result["plot"].is_file() and result["plot"].stat().st_size > 10_000
    assert result["trajectory"].is_file()


def test_cli_and_demo_module_do_not_import_rclpy():
    code = ("import sys; from mcpilco_ros.cli import build_parser; build_parser().parse_args(['demo']); "
            "assert 'rclpy' not in sys.modules, 'rclpy imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
