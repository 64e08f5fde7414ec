"""The opt-in state observer: off by default (the controller unchanged); its gain is the Kalman filter's fixed point;
exact on an exact noise-free model; it removes velocity noise, less on a robot it does not model exactly;
restarts from the measurement after a gap or a bad state; the supervisor acts on its estimate; bad settings name the
field."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_friction_compensation import robot_file as config_with

from mcpilco_core.config import ConfigError, ObserverConfig, load_plant_parameters, load_robot_config
from mcpilco_core.control import build_controller
from mcpilco_core.control.observer import StateObserver, steady_state_gain
from mcpilco_core.plant import DoublePendulum, wrap_angle

REPO = Path(__file__).resolve().parent.parent
DT = 0.002
ON = {"enabled": True, "process_noise": 10.0, "position_noise": 1e-4, "velocity_noise": 0.05,
      "motor_responsiveness": 1.0}


def robot_file(tmp_path: Path, robot: str = "acrobot", **observer) -> Path:
    return config_with(tmp_path, robot, "observer", **observer)


def test_off_by_default_and_the_fingerprint_is_unchanged(tmp_path):
    shipped = load_robot_config(REPO / "config" / "acrobot.yaml")
    assert not shipped.observer.enabled
    off = load_robot_config(robot_file(tmp_path, enabled=False, process_noise=3.0))
    assert off.fingerprint() == shipped.fingerprint()
    assert load_robot_config(robot_file(tmp_path, **ON)).fingerprint() != shipped.fingerprint()


@pytest.mark.parametrize("field, value, words", [
    ("process_noise", 0.0, "must be positive"), ("position_noise", -1e-4, "must be positive"),
    ("velocity_noise", 0.0, "must be positive"), ("motor_responsiveness", 1.5, "1.5"),
    ("motor_responsiveness", 0.0, "must be positive"), ("gain", 1.0, "gain")])
def test_bad_values_name_the_field(tmp_path, field, value, words):
    with pytest.raises(ConfigError, match=r"observer\." + field) as info:
        load_robot_config(robot_file(tmp_path, **{**ON, field: value}))
    assert words in str(info.value)


@pytest.mark.parametrize("process_noise, position_noise, velocity_noise", [(10.0, 1e-4, 0.05), (300.0, 1e-3, 0.2)])
def test_the_gain_is_the_kalman_filters_fixed_point(process_noise, position_noise, velocity_noise):
    """Predict the a-posteriori covariance one period on: it must give back the a-priori one the gain came from."""
    gain = steady_state_gain(DT, process_noise, position_noise, velocity_noise)
    f = np.array([[1.0, DT], [0.0, 1.0]])
    g = np.array([[DT * DT / 2], [DT]])
    r = np.diag([position_noise ** 2, velocity_noise ** 2])
    # the a-priori covariance P from K = P (P + R)^-1  <=>  P = (I - K)^-1 K R
    prior = np.linalg.inv(np.eye(2) - gain) @ gain @ r
    posterior = (np.eye(2) - gain) @ prior
    np.testing.assert_allclose(f @ posterior @ f.T + g @ g.T * process_noise ** 2, prior, rtol=1e-8)
    assert 0.0 < gain[1, 1] < 1.0 and gain[1, 0] > 0.0          # leans on the angle's motion and on the reading


def test_exact_on_an_exact_noise_free_model():
    plant = DoublePendulum(load_plant_parameters(REPO / "config" / "plant_models.yaml", "model_1.1"))
    observer = StateObserver(plant, ObserverConfig(**ON), DT)
    x, u = np.array([2.5, 0.3, 1.0, -2.0]), np.array([0.0, 0.7])
    for k in range(200):
        estimate = observer.update(x, k * DT, u)
        np.testing.assert_allclose(estimate, x, atol=1e-12)
        x = np.asarray(plant.rk4_step_scalar(tuple(x), tuple(u), DT))


def test_exact_too_when_the_states_come_with_jitter():
    """On a real-time path states are not 2 ms apart to the microsecond: the prediction spans the time that passed
    (a whole period assumed instead cost up to 1.2 rad/s at +-0.2 ms)."""
    plant = DoublePendulum(load_plant_parameters(REPO / "config" / "plant_models.yaml", "model_1.1"))
    observer = StateObserver(plant, ObserverConfig(**ON), DT)
    rng = np.random.default_rng(0)
    x, u, t = np.array([2.5, 0.3, 1.0, -2.0]), np.array([0.0, 0.7]), 0.0
    for _ in range(200):
        np.testing.assert_allclose(observer.update(x, t, u), x, atol=1e-9)
        dt = DT + rng.uniform(-0.0003, 0.0003)
        x, t = np.asarray(plant.rk4_step_scalar(tuple(x), tuple(u), dt)), t + dt


def noisy_run(observer: StateObserver, robot: DoublePendulum, seconds: float = 4.0):
    """A free swing (0 N m) of ``robot``; the RMS velocity errors (rad/s) of the readings and of the estimates."""
    rng = np.random.default_rng(3)
    x = np.array([2.0, 0.5, 0.0, 0.0])
    raw, filtered = [], []
    for k in range(int(seconds / DT)):
        measured = x + np.array([rng.normal(0, 1e-4), rng.normal(0, 1e-4), rng.normal(0, 0.05), rng.normal(0, 0.05)])
        estimate = observer.update(measured, k * DT, np.zeros(2))
        if k >= 50:
            raw.append(measured[2:] - x[2:])
            filtered.append(estimate[2:] - x[2:])
        x = np.asarray(robot.rk4_step_scalar(tuple(x), (0.0, 0.0), DT))
    return np.sqrt(np.mean(np.square(raw))), np.sqrt(np.mean(np.square(filtered)))


def test_it_removes_most_of_the_velocity_noise_and_some_on_a_robot_it_does_not_model_exactly():
    """A free swing with readings 0.05 rad/s off: on the exact model the estimate's velocity error is a third of the
    readings'; on model_1.0 (friction, rotor inertia; the model stays model_1.1) the model's errors leave two thirds of
    it; with a model trusted as little as a reading, nearly all of it."""
    models = REPO / "config" / "plant_models.yaml"
    model = DoublePendulum(load_plant_parameters(models, "model_1.1"))
    robot = DoublePendulum(load_plant_parameters(models, "model_1.0"))
    raw, exact = noisy_run(StateObserver(model, ObserverConfig(**ON), DT), model)
    assert raw == pytest.approx(0.05, rel=0.1)
    assert exact < 0.4 * raw
    assert noisy_run(StateObserver(model, ObserverConfig(**ON), DT), robot)[1] < 0.75 * raw
    assert noisy_run(StateObserver(model, ObserverConfig(**{**ON, "process_noise": 1e4}), DT), robot)[1] > 0.9 * raw


def test_a_gap_or_a_bad_state_restarts_from_the_measurement():
    plant = DoublePendulum(load_plant_parameters(REPO / "config" / "plant_models.yaml", "model_1.1"))
    observer = StateObserver(plant, ObserverConfig(**ON), DT)
    x = np.array([3.0, 0.1, 0.5, -0.5])
    observer.update(x, 0.0, np.zeros(2))
    moved = observer.update(x + [0, 0, 0.2, 0.2], DT, np.zeros(2))
    assert not np.allclose(moved, x + [0, 0, 0.2, 0.2])                 # filtered
    after_gap = x + [0.3, 0.0, 1.0, 1.0]
    np.testing.assert_array_equal(observer.update(after_gap, 0.2, np.zeros(2)), after_gap)   # a 0.2 s window
    np.testing.assert_array_equal(observer.update(after_gap, 0.2, np.zeros(2)), after_gap)   # no time passed


def test_the_supervisor_acts_on_the_estimate_and_the_passive_joint_stays_at_zero(tmp_path):
    config = load_robot_config(robot_file(tmp_path, **{**ON, "motor_responsiveness": 0.9}))
    plain_config = load_robot_config(REPO / "config" / "acrobot.yaml")
    filtered, plain = build_controller(config), build_controller(plain_config)
    observer = StateObserver(DoublePendulum(config.plant), config.observer, DT)
    rng = np.random.default_rng(0)
    command = np.zeros(2)
    act, pas = config.actuated_joint, config.passive_joint
    differs = 0
    for k in range(300):
        measured = np.array([math.pi + 0.02, -0.03, 0.0, 0.0]) + rng.normal(0, [1e-4, 1e-4, 0.05, 0.05])
        u = filtered.step(measured, k * DT)
        estimate = observer.update(measured, k * DT, command)
        expected = plain.step(estimate, k * DT)
        assert filtered.mode == plain.mode == "lqr"
        np.testing.assert_array_equal(u, expected)
        assert u[pas] == 0.0
        differs += abs(u[act] - build_controller(plain_config).step(measured, 0.0)[act]) > 0.1
        command = u
    assert differs > 100                 # the filter changed the torque (noise of ~2 N m without it)


def test_a_non_finite_state_is_safe_and_the_next_one_is_taken_as_measured(tmp_path):
    config = load_robot_config(robot_file(tmp_path, **ON))
    supervisor, plain = build_controller(config), build_controller(load_robot_config(REPO / "config" / "acrobot.yaml"))
    near = np.array([math.pi + 0.01, -0.01, 0.3, -0.2])
    for k in range(20):
        supervisor.step(near + [0, 0, 0.05 * (-1) ** k, 0], k * DT)
    assert np.all(supervisor.step(np.array([np.nan, 0, 0, 0]), 20 * DT) == 0.0) and supervisor.mode == "safe"
    np.testing.assert_array_equal(supervisor.step(near, 21 * DT), plain.step(near, 21 * DT))


def test_a_non_finite_torque_is_safe_and_the_next_state_is_taken_as_measured(tmp_path):
    """Safe mode from a NaN torque (not a NaN state) restarts the estimate too: the next state, one period later, is
    taken as measured, as after a bad state (an estimate gone non-finite would otherwise keep the controller safe)."""
    config = load_robot_config(robot_file(tmp_path, **ON))
    supervisor, act = build_controller(config), config.actuated_joint
    broken = False
    supervisor.set_policy(lambda x: math.nan if broken else float(x[2]))
    low = np.array([0.3, 0.2, 0.5, -0.4])                 # outside the ROA, slow: the policy acts
    for k in range(20):
        supervisor.step(low + [0, 0, 0.05 * (-1) ** k, 0], k * DT)
    assert supervisor.mode == "policy"
    broken = True
    assert np.all(supervisor.step(low, 20 * DT) == 0.0) and supervisor.mode == "safe"
    broken = False
    assert supervisor.step(low, 21 * DT)[act] == low[2] and supervisor.mode == "policy"   # of the measurement


def test_exact_across_the_angles_wrap():
    """Angles read in [-pi, pi): a joint passing pi jumps by 2 pi between two readings; the innovation is wrapped,
    so the estimate goes on smoothly (equal to the true state modulo 2 pi)."""
    plant = DoublePendulum(load_plant_parameters(REPO / "config" / "plant_models.yaml", "model_1.1"))
    observer = StateObserver(plant, ObserverConfig(**ON), DT)
    x = np.array([math.pi - 0.05, -math.pi + 0.02, 3.0, -3.0])
    for k in range(40):                                            # both cross within the first 20 ms
        measured = np.concatenate([wrap_angle(x[:2]), x[2:]])
        estimate = observer.update(measured, k * DT, np.zeros(2))
        np.testing.assert_allclose(wrap_angle(estimate[:2] - x[:2]), 0.0, atol=1e-9)
        np.testing.assert_allclose(estimate[2:], x[2:], atol=1e-9)
        x = np.asarray(plant.rk4_step_scalar(tuple(x), (0.0, 0.0), DT))


def test_exact_with_the_motors_lag_in_the_prediction():
    """A robot whose motor follows the command with a first-order lag (r = 0.5): the prediction passes the commands
    through the same lag, so the estimate stays exact on an exact noise-free model."""
    plant = DoublePendulum(load_plant_parameters(REPO / "config" / "plant_models.yaml", "model_1.1"))
    observer = StateObserver(plant, ObserverConfig(**{**ON, "motor_responsiveness": 0.5}), DT)
    x, command, applied = np.array([2.5, 0.3, 1.0, -2.0]), np.zeros(2), np.zeros(2)
    for k in range(200):
        np.testing.assert_allclose(observer.update(x, k * DT, command), x, atol=1e-12)
        command = np.array([1.5 * math.cos(0.07 * k), 2.0 * math.sin(0.05 * k)])   # either joint's motor
        applied = applied + 0.5 * (command - applied)
        x = np.asarray(plant.rk4_step_scalar(tuple(x), tuple(applied), DT))


def test_two_periods_without_a_state_restart_the_estimate_and_the_motors_lag():
    """GAP_FACTOR 1.5: a state two periods after the last is taken as measured, and the prediction after it starts
    from the motor at rest, as a fresh observer's does."""
    plant = DoublePendulum(load_plant_parameters(REPO / "config" / "plant_models.yaml", "model_1.1"))
    settings = ObserverConfig(**{**ON, "motor_responsiveness": 0.5})
    used, fresh = StateObserver(plant, settings, DT), StateObserver(plant, settings, DT)
    x, command = np.array([2.5, 0.3, 1.0, -2.0]), np.array([0.0, 3.0])
    for k in range(5):
        used.update(x + [0.0, 0.0, 0.01 * k, 0.0], k * DT, command)
    t = 6 * DT                                                      # the state of 5 DT never came
    np.testing.assert_array_equal(used.update(x, t, command), x)
    fresh.update(x, t, command)
    later = x + [0.002, 0.0, 0.1, 0.1]
    np.testing.assert_array_equal(used.update(later, t + DT, command), fresh.update(later, t + DT, command))


def test_a_reset_or_a_safe_stop_restarts_the_supervisors_estimate(tmp_path):
    """The supervisor's observer starts again from the measurement after a safe stop (here: a non-finite policy
    torque, with a state one period later) and after ``reset()`` (the node's reset at a window)."""
    config = load_robot_config(robot_file(tmp_path, **ON))
    seen = []

    def policy(x: np.ndarray) -> float:
        seen.append(np.array(x))
        return math.nan if len(seen) == 1 else 0.0

    supervisor = build_controller(config)
    supervisor.set_policy(policy)
    hanging = np.array([0.3, 0.1, 0.5, -0.5])
    supervisor.step(hanging, 0.0)
    assert supervisor.mode == "safe"
    measured = hanging + [0.0, 0.0, 0.2, 0.2]
    supervisor.step(measured, DT)
    assert supervisor.mode == "policy"
    np.testing.assert_array_equal(seen[-1], measured)              # taken as measured, not filtered
    supervisor.step(measured, 2 * DT)                              # held: the policy's 20 ms grid
    supervisor.reset()
    again = measured + [0.0, 0.0, -0.3, 0.1]
    supervisor.step(again, 3 * DT)
    assert len(seen) == 3
    np.testing.assert_array_equal(seen[-1], again)
