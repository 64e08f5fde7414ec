"""The launch files, without ROS's launch packages (not installable here, DESIGN.md section 7).

Each launch file is imported with stand-in ``launch`` / ``launch_ros`` / ``ament_index_python`` modules that
only record what the file asks for. Checked: arguments (hardware, policy, config, driver_config, trainer,
trainer_config), that every executable is a console script of setup.py whose entry point imports, that every
parameter file exists and its top-level keys are the node's name or ``/**``, that inline parameters are declared
by the node, and which nodes each ``hardware:=`` / ``trainer:=`` value starts. Then the command line launch_ros
would build for the controller (robot params file + the inline overrides as a node-keyed params file) is run for
real, to prove the launch arguments override the params file. The real ``launch_testing`` test is
test_launch_testing.py.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ROBOTS = ("pendubot", "acrobot")


# --------------------------------------------------------------------------------------------------
# Stand-ins: record the launch description instead of running it


class LaunchConfiguration:
    def __init__(self, name: str) -> None:
        self.name = name


class _Condition:
    def __init__(self, expression) -> None:
        self.expression = expression

    def value(self, args: dict[str, str]) -> bool:
        raw = args[self.expression.name] if isinstance(self.expression, LaunchConfiguration) else self.expression
        return str(raw).lower() in ("true", "1")


class IfCondition(_Condition):
    def holds(self, args: dict[str, str]) -> bool:
        return self.value(args)


class UnlessCondition(_Condition):
    def holds(self, args: dict[str, str]) -> bool:
        return not self.value(args)


class Recorded:
    def __init__(self, *args, **kwargs) -> None:
        self.args = args
        self.kwargs = kwargs


class DeclareLaunchArgument(Recorded):
    pass


class Node(Recorded):
    pass


class LaunchDescription:
    def __init__(self, entities=()) -> None:
        self.entities = list(entities)


def stand_in_modules() -> dict[str, types.ModuleType]:
    modules = {}
    for name in ("launch", "launch.actions", "launch.conditions", "launch.substitutions", "launch_ros",
                 "launch_ros.actions", "ament_index_python", "ament_index_python.packages"):
        modules[name] = types.ModuleType(name)
    modules["launch"].LaunchDescription = LaunchDescription
    modules["launch.actions"].DeclareLaunchArgument = DeclareLaunchArgument
    modules["launch.conditions"].IfCondition = IfCondition
    modules["launch.conditions"].UnlessCondition = UnlessCondition
    modules["launch.substitutions"].LaunchConfiguration = LaunchConfiguration
    modules["launch_ros.actions"].Node = Node

    def get_package_share_directory(package: str) -> str:
        assert package == "mcpilco_ros"
        return str(REPO)   # the source tree has the installed share layout (config/, launch/)

    modules["ament_index_python.packages"].get_package_share_directory = get_package_share_directory
    return modules


def load_launch(robot: str, monkeypatch) -> LaunchDescription:
    for name, module in stand_in_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    path = REPO / "launch" / f"{robot}.launch.py"
    spec = importlib.util.spec_from_file_location(f"launch_file_{robot}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate_launch_description()


def console_scripts() -> dict[str, str]:
    """name -> 'module:function' from setup.py's entry_points (parsed, not executed)."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "console_scripts":
                    entries = [ast.literal_eval(e) for e in value.elts]
                    return {e.split("=")[0].strip(): e.split("=")[1].strip() for e in entries}
    raise AssertionError("setup.py declares no console_scripts")


def arguments(description: LaunchDescription) -> dict[str, DeclareLaunchArgument]:
    return {e.args[0]: e for e in description.entities if isinstance(e, DeclareLaunchArgument)}


def resolve(value, args: dict[str, str]):
    return args[value.name] if isinstance(value, LaunchConfiguration) else value


def defaults(description: LaunchDescription, **overrides: str) -> dict[str, str]:
    values = {name: arg.kwargs["default_value"] for name, arg in arguments(description).items()}
    values.update(overrides)
    return values


def started(description: LaunchDescription, args: dict[str, str]) -> list[Node]:
    return [e for e in description.entities if isinstance(e, Node)
            and (e.kwargs.get("condition") is None or e.kwargs["condition"].holds(args))]


# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("robot", ROBOTS)
def test_launch_arguments(robot, monkeypatch):
    args = arguments(load_launch(robot, monkeypatch))
    assert set(args) == {"hardware", "policy", "config", "driver_config", "trainer", "trainer_config"}
    for flag in ("hardware", "trainer"):
        assert args[flag].kwargs["default_value"] == "false"
        assert args[flag].kwargs["choices"] == ["false", "true"]
    assert Path(args["trainer_config"].kwargs["default_value"]) == REPO / "config" / "trainer.yaml"
    shipped = REPO / "policies" / f"{robot}.npz"
    assert args["policy"].kwargs["default_value"] == (str(shipped) if shipped.is_file() else "")
    assert Path(args["config"].kwargs["default_value"]) == REPO / "config" / f"{robot}.yaml"
    assert all(a.kwargs.get("description") for a in args.values())


@pytest.mark.parametrize("robot", ROBOTS)
@pytest.mark.parametrize("hardware", ["false", "true"])
@pytest.mark.parametrize("trainer", ["false", "true"])
def test_every_node_is_a_console_script_with_existing_matching_params_files(robot, hardware, trainer, monkeypatch):
    description = load_launch(robot, monkeypatch)
    args = defaults(description, hardware=hardware, trainer=trainer)
    scripts = console_scripts()
    nodes = started(description, args)
    expected = {"controller_node", "moteus_driver_node" if hardware == "true" else "sim_driver_node"}
    expected |= {"trainer_node"} if trainer == "true" else set()
    assert {n.kwargs["executable"] for n in nodes} == expected
    for node in nodes:
        executable, name = node.kwargs["executable"], node.kwargs["name"]
        assert node.kwargs["package"] == "mcpilco_ros"
        assert executable in scripts, f"{executable} is not a console script in setup.py"
        module_name, function = scripts[executable].split(":")
        if executable == "moteus_driver_node":
            pytest.importorskip("moteus")
        module = importlib.import_module(module_name)
        assert callable(getattr(module, function))
        assert getattr(module, "NODE_NAME", name) == name
        for params in node.kwargs["parameters"]:
            if isinstance(params, dict):
                declared = {s.name for s in getattr(module, "CONTROLLER_PARAMETERS", ())}
                assert set(params) <= declared, f"{name}: inline parameters {set(params) - declared} not declared"
                continue
            path = Path(resolve(params, args))
            assert path.is_file(), f"{name}: parameter file {path} missing"
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            assert set(data) <= {"/**", name} | _other_nodes(description), f"{path}: unexpected sections {set(data)}"
            assert "/**" in data or name in data, f"{path} has no section for {name}"
            for section in data.values():
                assert "ros__parameters" in section


def _other_nodes(description: LaunchDescription) -> set[str]:
    """Node sections of the shared robot file that belong to another node of this package."""
    return {e.kwargs["name"] for e in description.entities if isinstance(e, Node)}


@pytest.mark.parametrize("robot", ROBOTS)
def test_simulation_arms_at_start_and_hardware_waits_for_enable(robot, monkeypatch):
    description = load_launch(robot, monkeypatch)
    for hardware, armed in (("false", True), ("true", False)):
        args = defaults(description, hardware=hardware, policy="/tmp/p.npz")
        (controller,) = [n for n in started(description, args) if n.kwargs["executable"] == "controller_node"]
        inline = next(p for p in controller.kwargs["parameters"] if isinstance(p, dict))
        assert inline["arm_on_start"] is armed
        assert resolve(inline["policy"], args) == "/tmp/p.npz"
        # fully specified name: launch_ros keys the inline dict by the node's name, so it overrides the file
        assert controller.kwargs["namespace"] == "" and controller.kwargs["name"] == "controller_node"


def test_launch_overrides_win_over_the_params_file_for_real(tmp_path, monkeypatch):
    """What launch_ros runs for hardware:=false policy:=<file>: the override file keyed '/controller_node'."""
    pytest.importorskip("rclpy")
    import numpy as np
    from _ros_helpers import Peer, rig, ros_env, status_values, wait_for

    from mcpilco_core.policy import SumOfGaussiansPolicy, load_policy, save_policy

    rng = np.random.default_rng(0)
    policy = save_policy(SumOfGaussiansPolicy(rng.normal(size=(10, 6)), np.zeros(6), rng.normal(size=10), 3.0,
                                              "pendubot"), tmp_path / "p.npz")
    description = load_launch("pendubot", monkeypatch)
    args = defaults(description, policy=str(policy))
    (controller,) = [n for n in started(description, args) if n.kwargs["executable"] == "controller_node"]
    file_param, inline = controller.kwargs["parameters"]
    generated = tmp_path / "launch_params.yaml"
    generated.write_text(yaml.safe_dump({"/controller_node": {"ros__parameters": {
        k: resolve(v, args) for k, v in inline.items()} | {"diagnostics_period": 0.1}}}), encoding="utf-8")
    import subprocess

    cmd = [sys.executable, "-m", "mcpilco_ros.controller_node", "--ros-args", "-r", "__node:=controller_node",
           "--params-file", resolve(file_param, args), "--params-file", str(generated)]
    proc = subprocess.Popen(cmd, env=ros_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with rig() as r:
            observer = r.add(Peer(r.context, "unused", "unused2", name="observer"))
            r.start()
            wait_for(lambda: observer.last_status("controller") is not None, 30, "controller diagnostics")
            values = status_values(observer.last_status("controller"))
            assert values["armed"] == "True"
            assert values["policy_version"] == load_policy(policy).version()
            assert values["rho"] != ""
    finally:
        proc.kill()
        proc.wait()
