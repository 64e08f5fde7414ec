"""The catch (control/catch.py): a receding-horizon plan in place of the LQR in the outer balancing band.

Its model's Jacobians are the plant's; its schedule never waits for a computation (the LQR holds the first period,
then each period's torque is held, solved one period ahead); the passive joint gets exactly 0; it is off unless the
robot config turns it on, and bad settings name their field; and it catches a hand-over state the LQR drops.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import expm
from test_friction_compensation import robot_file

from mcpilco_core.config import ConfigError, RobotConfig, load_robot_config
from mcpilco_core.control import build_controller
from mcpilco_core.control.catch import CatchPlan, CatchPlanner, build_catch, goal_error
from mcpilco_core.control.roa import _cache_key
from mcpilco_core.plant import GOAL, DoublePendulum, wrap_state
from mcpilco_core.simulation import drive, load_robot_profile

REPO = Path(__file__).resolve().parent.parent

# A state where the shipped acrobot policy handed over to the LQR (protocol seed 202, V = 7.6 rho), which the LQR
# alone drops and the catch holds (nominal robot, 3 s; of 10 states within 1e-3 of it the catch holds 8, the LQR 0).
DROPPED_BY_THE_LQR = np.array([4.36, 0.683, -5.753, -2.673])


def with_catch(robot: str, enabled: bool = True, band: float | None = 100.0, **settings) -> RobotConfig:
    """The shipped robot config with the catch set; ``band``: the balancing band's enter/exit fractions (so the
    band's controller stays in charge from any start)."""
    config = load_robot_config(REPO / "config" / f"{robot}.yaml")
    catch = dataclasses.replace(config.catch, enabled=enabled, **settings)
    roa = config.roa
    if band is not None:
        rho = build_controller(config).rho
        roa = dataclasses.replace(config.roa, rho=rho, enter_fraction=band, exit_fraction=band)
    return dataclasses.replace(config, catch=catch, roa=roa)


def test_off_unless_the_config_turns_it_on_and_then_only_the_fingerprint_changes(tmp_path):
    shipped = load_robot_config(REPO / "config" / "pendubot.yaml")
    assert not shipped.catch.enabled and build_catch(DoublePendulum(shipped.plant), build_controller(shipped).design,
                                                     shipped) is None
    off = load_robot_config(robot_file(tmp_path, "pendubot", "catch", enabled=False, horizon=0.5))
    assert off.fingerprint() == shipped.fingerprint()
    on = load_robot_config(robot_file(tmp_path, "pendubot", "catch", enabled=True))
    assert on.catch.enabled and on.fingerprint() != shipped.fingerprint()
    assert _cache_key(on) == _cache_key(shipped)          # rho is the LQR's alone: the cached estimate stays valid


@pytest.mark.parametrize("values, field, words", [
    ({"period": 0.003}, "catch.period", "whole number of control periods"),
    ({"period": 0.02, "horizon": 0.01}, "catch.horizon", "shorter than catch.period"),
    ({"enabled": True, "lqr_level": 50.0}, "catch.lqr_level", "exceeds roa.exit_fraction"),
    ({"iterations": 0}, "catch.iterations", "must be in [1, 1000]"),
    ({"horizon": -1.0}, "catch.horizon", "must be positive"),
    ({"planner": "mpc"}, "catch", "planner")])
def test_bad_settings_name_their_field(tmp_path, values, field, words):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as info:
        load_robot_config(robot_file(tmp_path, "acrobot", "catch", **values))
    assert words in str(info.value)


def test_the_plan_model_is_the_plants_one_period_map():
    """At the goal the finite-difference Jacobians equal the exact zero-order-hold discretisation of the plant's
    linearisation (exp of the augmented matrix)."""
    config = load_robot_config(REPO / "config" / "acrobot.yaml")
    plant = DoublePendulum(config.plant)
    design = build_controller(config).design
    planner = CatchPlanner(plant, design, config.lqr.Q_diag, config.lqr.R, 6.0, period=0.02, steps=3,
                           integration_step=0.002)
    a_c, b_c = plant.linearize()
    augmented = np.zeros((5, 5))
    augmented[:4, :4], augmented[:4, 4] = a_c, b_c[:, 1]
    exact = expm(augmented * 0.02)
    a, b = planner._jacobians(np.tile(GOAL, (4, 1)), np.zeros(3))
    for k in range(3):
        np.testing.assert_allclose(a[k], exact[:4, :4], atol=2e-4)
        np.testing.assert_allclose(b[k], exact[:4, 4], atol=2e-4)


def test_a_plan_improves_on_the_lqr_and_respects_the_torque_limit():
    config = with_catch("acrobot")
    design = build_controller(config).design
    x0 = tuple(wrap_state(DROPPED_BY_THE_LQR))
    planner = build_catch(DoublePendulum(config.plant), design, config).planner
    lqr_run = planner.lqr_run(x0)
    np.testing.assert_array_equal(planner.rollout(x0, lqr_run.torques).states, lqr_run.states)
    plan = planner.improve(x0, lqr_run, iterations=20)
    assert plan.cost < 0.5 * lqr_run.cost
    assert np.abs(plan.torques).max() <= 6.0
    def end_cost(run) -> float:
        return float(goal_error(run.states[-1]) @ design.S @ goal_error(run.states[-1]))

    assert end_cost(plan) < end_cost(lqr_run)
    again = planner.improve(x0, planner.lqr_run(x0), iterations=20)    # deterministic
    np.testing.assert_array_equal(again.torques, plan.torques)


def test_the_lqr_holds_the_first_period_then_each_plan_is_held_for_its_period():
    config = with_catch("acrobot")
    supervisor = build_controller(config)
    plain = build_controller(with_catch("acrobot", enabled=False))
    act, pas = config.actuated_joint, config.passive_joint
    robot = load_robot_profile("nominal").robot(config, 0, DROPPED_BY_THE_LQR)
    torques, catching = [], []
    for k in range(50):                                      # 0.1 s: the first 10 states are the first period
        x, t = robot.measurement(), k * config.control_period
        u = supervisor.step(x, t)
        assert supervisor.mode == "lqr" and u[pas] == 0.0 and abs(u[act]) <= config.torque_limit
        if k < 10:
            assert u[act] == plain.step(x, t)[act] and not supervisor.catching
        torques.append(u[act])
        catching.append(supervisor.catching)
        robot.step(u)
    assert all(catching[10:])
    held = np.array(torques[10:]).reshape(4, 10)              # one torque per 20 ms period
    assert np.all(held == held[:, :1]) and len(np.unique(held[:, 0])) > 1
    assert supervisor._catch.plans_solved == 5               # the first one while the LQR held, then one per period


def test_the_command_at_a_period_boundary_does_not_wait_for_the_next_plan():
    """step() returns with the plan pending; finish_step() (the node, after publishing) or the next step solves it,
    and the torques are the same either way."""
    config = with_catch("acrobot")
    runs = {}
    for finish in (True, False):
        supervisor = build_controller(config)
        robot = load_robot_profile("nominal").robot(config, 0, DROPPED_BY_THE_LQR)
        torques, solved_in_step = [], 0
        for k in range(50):
            before = supervisor._catch.plans_solved
            pending_before = supervisor._catch.pending
            u = supervisor.step(robot.measurement(), k * config.control_period)
            # a step solves nothing of its own: at most the plan its caller left pending
            assert supervisor._catch.plans_solved - before == int(pending_before)
            solved_in_step += int(pending_before)
            if k % 10 == 0:
                assert supervisor._catch.pending                # entered / a boundary: the next plan waits
            if finish:
                supervisor.finish_step()
                assert not supervisor._catch.pending
            torques.append(u[config.actuated_joint])
            robot.step(u)
        runs[finish] = torques
        assert solved_in_step == (0 if finish else 5)             # the entry, then one per period
    assert runs[True] == runs[False]


def test_it_hands_over_to_the_lqr_inside_lqr_level_and_forgets_its_plan_outside_the_band():
    config = with_catch("acrobot", lqr_level=1.0)
    supervisor = build_controller(config)
    near = np.array([math.pi + 0.001, -0.001, 0.0, 0.0])    # V << rho: the LQR's 500 Hz feedback
    supervisor.step(DROPPED_BY_THE_LQR, 0.0)
    assert supervisor._catch.pending                         # entered: its first plan is left to solve
    u = supervisor.step(near, 0.002)
    assert not supervisor.catching and supervisor._catch._plan is None and not supervisor._catch.pending
    assert u[config.actuated_joint] == pytest.approx(-supervisor.design.K[config.actuated_joint] @ (near - GOAL))
    supervisor.step(DROPPED_BY_THE_LQR, 0.004)
    supervisor.step(np.array([0.0, 0.0, 30.0, 0.0]), 0.006)   # spinning: damping, the plan is dropped
    assert supervisor.mode == "damping" and supervisor._catch._plan is None and not supervisor._catch.pending


def test_it_catches_a_hand_over_state_the_lqr_drops():
    def caught(config: RobotConfig) -> bool:
        robot = load_robot_profile("nominal").robot(config, 0, DROPPED_BY_THE_LQR)
        trajectory = drive(robot, build_controller(config), 1500)             # 3 s
        error = goal_error(wrap_state(trajectory.x[-1]))
        return abs(error[0]) < 0.2 and abs(error[1]) < 0.3

    assert not caught(with_catch("acrobot", enabled=False))
    assert caught(with_catch("acrobot"))


def test_the_plans_torque_is_corrected_by_its_gains_for_the_wrapped_error_and_clipped():
    """U0 + K0 (x - X0) with the angle error wrapped, clipped to the limit."""
    plan = CatchPlan(torques=np.array([1.0]), states=np.array([[math.pi - 0.01, 0.0, 0.0, 0.0], GOAL]),
                     gains=np.array([[10.0, 0.0, 1.0, 0.0]]), cost=0.0)
    x = np.array([-math.pi + 0.01, 0.0, 0.5, 0.0])                       # 0.02 rad past X0 across the wrap
    assert plan.torque_at_start(x, 6.0) == pytest.approx(1.0 + 10.0 * 0.02 + 0.5, abs=1e-12)
    assert plan.torque_at_start(x + [0, 0, 10.0, 0], 6.0) == 6.0
    assert plan.torque_at_start(x - [0, 0, 10.0, 0], 6.0) == -6.0


def test_the_plan_model_integrates_each_period_in_steps_of_at_most_integration_step():
    config = load_robot_config(REPO / "config" / "acrobot.yaml")
    plant = DoublePendulum(config.plant)
    planner = CatchPlanner(plant, build_controller(config).design, config.lqr.Q_diag, config.lqr.R, 6.0, period=0.02,
                           steps=3, integration_step=0.005)
    x = tuple(float(v) for v in wrap_state(DROPPED_BY_THE_LQR))
    expected = x
    for _ in range(4):                                                  # 4 RK4 steps of 5 ms
        expected = plant.rk4_step_scalar(expected, (0.0, 1.5), 0.005)
    assert planner.advance(x, 1.5) == expected


def test_each_plan_is_solved_for_the_state_the_model_predicts_one_period_ahead():
    """On entry the prediction is the LQR's period on the model, at each boundary the held torque's; the plan then
    solved starts there."""
    config = with_catch("acrobot")
    supervisor = build_controller(config)
    planner, goal = supervisor._catch.planner, supervisor.design.goal
    act = config.actuated_joint
    robot = load_robot_profile("nominal").robot(config, 0, DROPPED_BY_THE_LQR)
    for k in range(21):
        x = robot.measurement()
        u = supervisor.step(x, k * config.control_period)
        wrapped = tuple(float(v) for v in wrap_state(x) - goal + goal)   # as the supervisor hands it over
        if k % 10 == 0:
            expected = (planner.advance_lqr(wrapped, config.control_period) if k == 0
                        else planner.advance(wrapped, u[act]))
            assert supervisor._catch._pending == expected, k
            supervisor.finish_step()
            np.testing.assert_array_equal(supervisor._catch._plan.states[0], wrap_state(np.array(expected)))
        robot.step(u)


def test_the_lqr_alone_acts_below_lqr_level_times_rho_and_the_plan_above_it():
    config = with_catch("acrobot", lqr_level=0.5)
    direction = np.array([0.01, -0.01, 0.05, 0.05])
    for level, planned in ((0.25, False), (0.75, True)):
        supervisor = build_controller(config)
        design = supervisor.design
        x = GOAL + direction * math.sqrt(level * supervisor.rho / float(direction @ design.S @ direction))
        u = supervisor.step(x, 0.0)
        assert supervisor.last_cost_to_go == pytest.approx(level * supervisor.rho)
        assert supervisor.mode == "lqr" and supervisor._catch.pending == planned, level
        assert u[config.actuated_joint] == pytest.approx(-design.K[config.actuated_joint] @ (x - GOAL))
