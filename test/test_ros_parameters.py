"""The nodes' parameters are generated from the config dataclasses' metadata: the descriptors carry the same
ranges that the YAML loaders enforce, a value outside them is refused naming the parameter, an unknown override is
refused naming it, and a malformed params file is a clear error (exit 2), not an rcl traceback."""

from __future__ import annotations

from dataclasses import MISSING

import pytest

pytest.importorskip("rclpy")
from _ros_helpers import CONFIG, rig  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from mcpilco_core.config import robot_settings, settings_of  # noqa: E402
from mcpilco_core.hardware.config import DriverConfig  # noqa: E402
from mcpilco_ros._ros_utils import ROBOT_PARAMETERS, ParameterError, declare, run_node  # noqa: E402
from mcpilco_ros.controller_node import ControllerNode  # noqa: E402
from mcpilco_ros.moteus_driver_node import DRIVER_PARAMETERS, MoteusDriverNode  # noqa: E402
from mcpilco_ros.sim_driver_node import SimDriverNode  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("specs, settings", [(ROBOT_PARAMETERS, robot_settings()),
                                             (DRIVER_PARAMETERS, settings_of(DriverConfig))], ids=["robot", "driver"])
def test_descriptors_carry_the_dataclass_metadata(specs, settings):
    """Every declared descriptor: the description and the range of the field's metadata, nothing written twice."""
    assert [s.name for s in specs] == [s.name for s in settings]
    with rig() as r:
        node = Node("schema_probe", context=r.context)
        values = declare(node, specs)
        for entry in settings:
            info = entry.setting
            desc = node.describe_parameter(entry.name)
            assert desc.description == info.description
            ranges = list(desc.floating_point_range) + list(desc.integer_range)
            if info.kind in (int, float) and None not in (info.low, info.high, entry.default):
                assert len(ranges) == 1, entry.name
                assert (ranges[0].from_value, ranges[0].to_value) == (info.low, info.high), entry.name
                assert info.range_text() in desc.additional_constraints
            else:
                assert not ranges, entry.name
            # no default: required by the loader (which says so), or part of an optional section (inline plant)
            assert (entry.name in values) == (entry.default is not MISSING), entry.name
        node.destroy_node()


def robot_node(cls, context, **overrides):
    return cls(context=context, cli_args=["--ros-args", "--params-file", str(CONFIG / "pendubot.yaml")],
               parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])


@pytest.mark.parametrize("cls", [ControllerNode, SimDriverNode], ids=["controller", "sim_driver"])
@pytest.mark.parametrize("overrides, parameter, words", [
    ({"torque_limit": 60.0}, "torque_limit", "(0.0, 50.0]"),          # the descriptor's range (rcl refuses)
    ({"torque_limit": 0.0}, "torque_limit", "must be positive"),       # the open bound (mcpilco_core refuses)
    ({"roa.samples": 0}, "roa.samples", "[1, 10000000]"),
    ({"damping.gain": -1.0}, "damping.gain", "[0.0, 1000.0]"),
    ({"lqr.Q_diag": [1.0, -2.0, 0.0, 0.0]}, "lqr.Q_diag[1]", "must be non-negative"),
    ({"umax": 1.0}, "umax", "unknown to"),                             # a typo is refused, not ignored
    ({"plant.I": [0.01, 0.05]}, "plant.I[0]", "must be >= m*r^2"),    # an inline plant is checked (and used)
])
def test_values_outside_the_metadata_are_refused_naming_the_parameter(cls, overrides, parameter, words):
    if "plant.I" in overrides:
        overrides = {"plant.m": [0.5, 0.6], "plant.l": [0.2, 0.3], "plant.r": [0.2, 0.25], **overrides}
    with rig() as r:
        with pytest.raises(ParameterError) as info:
            robot_node(cls, r.context, **overrides)
    assert f"parameter '{parameter}'" in str(info.value) and words in str(info.value)


def test_an_inline_plant_reaches_the_simulated_robot():
    plant = {"plant.m": [0.5, 0.6], "plant.l": [0.2, 0.3], "plant.r": [0.2, 0.25], "plant.I": [0.03, 0.05],
             "plant.g": 9.8}
    with rig() as r:
        sim = r.add(robot_node(SimDriverNode, r.context, **plant))
        assert sim.config.plant.m == (0.5, 0.6) and sim.config.plant.I == (0.03, 0.05)
        assert sim.config.plant.g == 9.8 and sim.config.plant.Ir == 0.0     # unset fields: the dataclass defaults
        plain = r.add(robot_node(SimDriverNode, r.context))
        assert plain.config.plant.name == "model_1.1"                     # no inline plant: the named model


def test_driver_node_refuses_an_absurd_command_timeout():
    with rig() as r:
        with pytest.raises(ParameterError, match=r"parameter 'command_timeout'.*\[0.001, 1.0\]"):
            MoteusDriverNode(context=r.context, cli_args=["--ros-args", "--params-file",
                                                          str(CONFIG / "moteus_driver_pendubot.yaml")],
                             parameter_overrides=[Parameter("command_timeout", value=1e9)])


@pytest.mark.parametrize("text, words", [
    ("/**:\n  ros__parameters:\n    robot: [unclosed\n", "not valid YAML"),
    ("- a\n- list\n", "expected a mapping"),
    ("controller_node:\n  robot: pendubot\n", "ros__parameters"),
    ("controller_node:\n  ros__parameters:\n    x: [1, 'a']\n", "Couldn't parse params file"),   # rcl's own check
])
def test_a_malformed_params_file_is_a_clear_error(tmp_path, capsys, text, words):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)

    def never():  # pragma: no cover - the file is refused before the node is made
        raise AssertionError("node created")

    assert run_node(never, "controller_node", ["controller_node", "--ros-args", "--params-file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "controller_node: refusing to start" in err and str(bad) in err and words in err
    assert "Traceback" not in err and "RCLError" not in err


def test_run_node_keeps_what_it_built_out_of_the_cyclic_collector_while_it_spins():
    """A full collection walking the imports and the node would hold the GIL for tens of ms on a loaded core: the
    control loops' deadline (the moteus watchdog is 50 ms). run_node freezes them (gc.freeze) once the node is up."""
    import gc

    from rclpy.node import Node

    seen: list[int] = []

    class Done:
        def is_set(self) -> bool:
            seen.append(gc.get_freeze_count())
            return True

    class Quick(Node):
        def __init__(self) -> None:
            super().__init__("quick_node")
            self.done = Done()

    assert run_node(Quick, "quick_node", ["quick_node"]) == 0
    assert seen and seen[0] > 10_000                # the process's objects, frozen while the node ran
    assert gc.get_freeze_count() == 0               # and given back to the collector after


def test_run_node_returns_the_exit_code_of_a_node_that_asks_to_leave():
    """A node that sets ``exit_code`` and ``done`` (moteus_driver_node when its driver loop died) ends run_node with
    that code, after its on_shutdown: the process exits non-zero, so a launch file or systemd sees the failure."""
    import threading

    from rclpy.node import Node

    calls: list[bool] = []

    class Failing(Node):
        def __init__(self) -> None:
            super().__init__("failing_node")
            self.done = threading.Event()
            self.exit_code = 1
            self.done.set()

        def on_shutdown(self) -> None:
            calls.append(True)

    assert run_node(Failing, "failing_node", ["failing_node"]) == 1
    assert calls == [True]
