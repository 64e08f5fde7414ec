"""Linters run as tests, and the ROS-free core stays ROS-free."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROS_MODULES = {"rclpy", "launch", "launch_ros", "sensor_msgs", "std_msgs", "std_srvs", "diagnostic_msgs"}


def test_ruff():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed")
    result = subprocess.run([ruff, "check", "--no-cache", str(REPO)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_never_imports_ros():
    offenders = []
    for path in (REPO / "mcpilco_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                          if n.split(".")[0] in ROS_MODULES]
    assert not offenders, offenders
