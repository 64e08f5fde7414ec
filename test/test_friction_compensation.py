"""The opt-in passive-joint friction compensation: off by default (passive joint exactly 0), bounded by its limit
(<= 0.5 N m), cancels only the passive joint's friction, and every report says when it was on."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from mcpilco_core.config import ConfigError, load_robot_config
from mcpilco_core.control import build_controller
from mcpilco_core.evaluation import evaluate_seed

REPO = Path(__file__).resolve().parent.parent


def robot_file(tmp_path: Path, robot: str = "pendubot", section: str = "friction_compensation", **values) -> Path:
    """The shipped robot config with ``section`` set to ``values`` (none: as shipped), written to ``tmp_path``."""
    data = yaml.safe_load((REPO / "config" / f"{robot}.yaml").read_text())
    params = data["/**"]["ros__parameters"]
    params["plant_models_file"] = str(REPO / "config" / "plant_models.yaml")
    if values:
        params[section] = values
    path = tmp_path / f"{robot}.yaml"
    path.write_text(yaml.safe_dump(data))
    for cache in (REPO / "config").glob(f"{robot}.roa.json"):   # rho depends on neither the compensation nor the dither
        (tmp_path / cache.name).write_bytes(cache.read_bytes())
    return path


def test_off_by_default_and_the_fingerprint_is_unchanged(tmp_path):
    shipped = load_robot_config(REPO / "config" / "pendubot.yaml")
    assert not shipped.friction_compensation.enabled and shipped.torque_limits == (6.0, 0.0)
    assert shipped.friction_compensation.torque(3.0) == 0.0
    off = load_robot_config(robot_file(tmp_path, enabled=False, coulomb=0.12))
    assert off.fingerprint() == shipped.fingerprint()
    # switched off with its coefficients still in the file: exactly 0 on the passive joint in every mode
    assert off.friction_compensation.coulomb == 0.12 and off.friction_compensation.torque(3.0) == 0.0
    supervisor = build_controller(off)
    for x in ([math.pi, 0.0, 0.0, 0.3], [math.pi, 0.0, 30.0, 5.0]):        # lqr, damping
        assert supervisor.step(np.array(x), 0.0)[1] == 0.0 and supervisor.mode in ("lqr", "damping")


@pytest.mark.parametrize("robot", ["pendubot", "acrobot"])
def test_on_it_cancels_the_passive_joints_friction_within_its_limit(tmp_path, robot):
    config = load_robot_config(robot_file(tmp_path, robot, enabled=True, limit=0.2, coulomb=0.12, viscous=0.001))
    act, pas = config.actuated_joint, config.passive_joint
    assert config.torque_limits[pas] == 0.2 and config.torque_limits[act] == 6.0
    supervisor = build_controller(config)
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(300):
        x = rng.uniform(-1, 1, 4) * np.array([0.05, 0.05, 0.3, 0.3]) + np.array([math.pi, 0, 0, 0])
        if rng.uniform() < 0.3:
            x[2:] = rng.uniform(-30, 30, 2)                  # damping
        u = supervisor.step(x, 0.0)
        seen.add(supervisor.mode)
        expected = min(max(0.001 * x[2 + pas] + 0.12 * math.atan(100 * x[2 + pas]), -0.2), 0.2)
        expected = 0.0 if supervisor.mode in ("idle", "safe") else expected
        assert u[pas] == pytest.approx(expected, abs=1e-15) and abs(u[pas]) <= 0.2
    assert {"lqr", "damping", "idle"} <= seen
    supervisor.reset()
    far = np.array([0.3, 0.2, 0.5, 1.5])                     # no policy, outside the ROA: idle -> nothing at all
    assert supervisor.step(far, 0.0)[pas] == 0.0 and supervisor.mode == "idle"
    assert supervisor.step(np.array([np.nan, 0, 0, 1.0]), 0.0)[pas] == 0.0 and supervisor.mode == "safe"


@pytest.mark.parametrize("field,value", [("limit", 0.6), ("coulomb", -0.1), ("limit", "lots")])
def test_bad_values_name_the_field(tmp_path, field, value):
    with pytest.raises(ConfigError, match=f"friction_compensation.{field}"):
        load_robot_config(robot_file(tmp_path, **{"enabled": True, field: value}))


def test_the_evaluation_says_it_was_on(tmp_path):
    config = load_robot_config(robot_file(tmp_path, enabled=True, limit=0.5, coulomb=0.12))
    result = evaluate_seed(build_controller(config), config, 0, duration=8.0, profile="hardware_proxy")
    assert result.to_dict()["friction_compensation"] is True
    assert 0.0 < result.passive_max_applied_torque <= 0.5 + 1e-9      # (plus the proxy's motor model: lag only)
    plain = load_robot_config(REPO / "config" / "pendubot.yaml")
    result = evaluate_seed(build_controller(plain), plain, 0, duration=8.0, profile="hardware_proxy")
    assert result.to_dict()["friction_compensation"] is False and result.passive_max_applied_torque == 0.0
