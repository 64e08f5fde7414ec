"""The balance dither: off by default, added to the LQR's torque only (phase from the moment the LQR took over),
clipped to the torque limit, never on the passive joint; and on a robot whose passive joint has Coulomb friction
it is what lets the LQR hold the top at all."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_friction_compensation import robot_file as config_with

from mcpilco_core.config import ConfigError, load_robot_config
from mcpilco_core.control import Supervisor, build_controller
from mcpilco_core.control.roa import sample_sublevel_states
from mcpilco_core.plant import wrap_state
from mcpilco_core.simulation import drive, load_robot_profile

REPO = Path(__file__).resolve().parent.parent


def robot_file(tmp_path: Path, robot: str = "pendubot", **dither) -> Path:
    return config_with(tmp_path, robot, "dither", **dither)


def test_off_by_default_and_the_fingerprint_is_unchanged(tmp_path):
    shipped = load_robot_config(REPO / "config" / "pendubot.yaml")
    assert shipped.dither.amplitude == 0.0 and shipped.dither.torque(0.05) == 0.0
    off = load_robot_config(robot_file(tmp_path, amplitude=0.0, frequency=9.0))
    assert off.fingerprint() == shipped.fingerprint()
    on = load_robot_config(robot_file(tmp_path, amplitude=1.0))
    assert on.fingerprint() != shipped.fingerprint()


@pytest.mark.parametrize("field, value, words", [
    ("amplitude", 7.0, "exceeds torque_limit"), ("amplitude", -1.0, "got -1.0"), ("frequency", 0.0, "must be positive"),
    ("shape", "triangle", "one of"), ("phase", 1.0, "phase"), ("frequency", 250.0, "half the control rate")])
def test_bad_values_name_the_field(tmp_path, field, value, words):
    with pytest.raises(ConfigError, match=r"dither\." + field) as info:
        load_robot_config(robot_file(tmp_path, **{field: value}))
    assert words in str(info.value)


@pytest.mark.parametrize("robot, shape", [("pendubot", "sine"), ("acrobot", "square")])
def test_only_the_lqr_gets_the_shake_from_its_own_start(tmp_path, robot, shape):
    config = load_robot_config(robot_file(tmp_path, robot, amplitude=2.0, frequency=5.0, shape=shape))
    plain = build_controller(load_robot_config(REPO / "config" / f"{robot}.yaml"))
    shaken = build_controller(config)
    act, pas = config.actuated_joint, config.passive_joint
    near = np.array([math.pi + 0.01, -0.01, 0.02, -0.02])
    t0 = 3.21                                                 # the LQR takes over here: the shake starts at phase 0
    for k, dt in enumerate([0.0, 0.03, 0.05, 0.11, 0.17]):
        u, v = shaken.step(near, t0 + dt), plain.step(near, t0 + dt)
        assert shaken.mode == plain.mode == "lqr"
        wave = math.sin(2 * math.pi * 5.0 * dt)
        shake = 2.0 * wave if shape == "sine" else (2.0 if wave >= 0 else -2.0)
        expected = min(max(v[act] + shake, -6.0), 6.0)
        assert u[act] == pytest.approx(expected, abs=1e-12), k
        assert u[pas] == 0.0 and v[pas] == 0.0
    far = np.array([0.0, 0.0, 0.0, 0.0])                     # hanging: idle (no policy) -> nothing at all
    assert shaken.step(far, 5.0).tolist() == [0.0, 0.0] and shaken.mode == "idle"
    shaken.step(near, 7.0)                                    # re-entry restarts the phase: sine at 0 -> no shake
    plain.reset()
    v = plain.step(near, 7.0)
    if shape == "sine":
        assert shaken.step(near, 7.0)[act] == pytest.approx(v[act], abs=1e-12)
    spin = np.array([math.pi, 0.0, 30.0, 0.0])               # damping mode: no shake
    plain.reset()
    assert shaken.step(spin, 8.0)[act] == plain.step(spin, 8.0)[act] and shaken.mode == "damping"


def test_the_sum_is_clipped_to_the_torque_limit(tmp_path):
    config = load_robot_config(robot_file(tmp_path, amplitude=6.0, frequency=5.0, shape="square"))
    supervisor = build_controller(config)
    x = np.array([math.pi + 0.3, -0.3, 1.0, -1.0])
    supervisor.step(x, 0.0)
    for t in np.arange(0.0, 0.4, 0.002):
        u = supervisor.step(x, float(t))
        assert abs(u[0]) <= 6.0 and u[1] == 0.0


def caught(config, profile: str, x0s: np.ndarray) -> int:
    supervisor = build_controller(config)
    count = 0
    for i, x0 in enumerate(x0s):
        traj = drive(load_robot_profile(profile).robot(config, i, x0), supervisor, 1500)
        assert np.all(traj.u[:, config.passive_joint] == 0.0)
        err = wrap_state(traj.x[-1]) - supervisor.design.goal
        count += bool(np.isfinite(err).all() and abs(err[0]) < 0.2 and abs(err[1]) < 0.3)
    return count


def test_on_the_friction_robot_the_dither_lets_the_lqr_hold_the_top():
    """The shipped pendubot_dither.yaml against pendubot.yaml on the hardware proxy (model_1.0's Coulomb friction on
    the elbow), from 12 states at V = 0.5 rho: without the shake the LQR holds none (docs/learner.md)."""
    plain = load_robot_config(REPO / "config" / "pendubot.yaml")
    shaken = load_robot_config(REPO / "config" / "pendubot_dither.yaml")
    supervisor = build_controller(plain)
    x0s = sample_sublevel_states(supervisor.design, np.full(12, 0.5 * supervisor.rho), np.random.default_rng(0))
    assert caught(plain, "hardware_proxy", x0s) == 0
    assert caught(shaken, "hardware_proxy", x0s) >= 9


def test_the_shake_is_added_to_the_lqrs_own_torque_and_only_the_sum_is_clipped(tmp_path):
    """Where the LQR alone asks for more than the limit, a shake against it lowers the torque below the limit: the
    sum is clipped, not the LQR's torque first (that would take the whole shake off the limit)."""
    config = load_robot_config(robot_file(tmp_path, amplitude=2.0, frequency=5.0, shape="square"))
    design = build_controller(config).design
    for sign, dt in ((1.0, 0.15), (-1.0, 0.05)):            # 3/4 and 1/4 of the shake's period: -2 and +2 N m
        supervisor = Supervisor(config, design, 100.0)        # a wide band: the LQR holds where it saturates
        x = np.array([math.pi + sign * 0.1, 0.0, 0.0, 0.0])
        u_lqr = -float(design.K[0] @ (wrap_state(x) - design.goal))
        assert sign * u_lqr > 7.0
        supervisor.step(x, 1.0)                               # the LQR takes over: phase 0
        u = supervisor.step(x, 1.0 + dt)
        assert supervisor.mode == "lqr" and u[1] == 0.0
        assert u[0] == pytest.approx(u_lqr - sign * 2.0, abs=1e-12)
