"""LQR, region of attraction, damping and the supervisor."""

import dataclasses
import json
import math

import numpy as np
import pytest

from mcpilco_core.control import Supervisor, build_controller, design_lqr, load_controller
from mcpilco_core.control.roa import estimate_roa, region_of_attraction, sample_sublevel_states, simulate_lqr
from mcpilco_core.plant import GOAL, DoublePendulum, wrap_state
from mcpilco_core.simulation import Simulator


def reference_lqr(repo):
    return json.loads((repo / "test" / "data" / "realaigym_dynamics.json").read_text())["lqr"]


@pytest.mark.parametrize("robot", ["pendubot", "acrobot"])
def test_lqr_matches_reference(repo, robot):
    ref = reference_lqr(repo)[robot]
    config = load_controller(repo / "config" / f"{robot}.yaml").config
    plant = DoublePendulum(config.plant)
    design = design_lqr(plant, config.actuated_joint, ref["Q_diag"], ref["R_diag"][config.actuated_joint])
    # the README's claim: <= 2e-12 relative, element by element (measured: pendubot 8e-14, acrobot 9.8e-13)
    np.testing.assert_allclose(design.K, ref["K"], rtol=2e-12, atol=0.0)
    np.testing.assert_allclose(design.S, ref["S"], rtol=2e-12, atol=0.0)
    assert np.all(design.K[config.passive_joint] == 0.0)


@pytest.mark.parametrize("robot", ["pendubot", "acrobot"])
def test_lqr_converges_from_small_perturbations(repo, robot):
    controller = load_controller(repo / "config" / f"{robot}.yaml")
    config = controller.config
    sim = Simulator(DoublePendulum(config.plant), config.torque_limits)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x0 = GOAL + rng.normal(0.0, [0.01, 0.01, 0.03, 0.03])
        traj = sim.run(controller, x0, 5.0)
        assert controller.mode == "lqr"
        cost = controller.design.cost_to_go(traj.x)
        assert cost[-1] < 1e-3 * cost[0], (cost[0], cost[-1])
        assert np.allclose(traj.x[-1], GOAL, atol=1e-2)
        assert np.all(traj.u[:, config.passive_joint] == 0.0)
        assert np.all(traj.u_cmd[:, config.passive_joint] == 0.0)


def test_lqr_converges_from_wound_up_angles(repo):
    controller = load_controller(repo / "config" / "pendubot.yaml")
    x0 = GOAL + np.array([4 * math.pi + 0.02, -2 * math.pi - 0.02, 0.0, 0.0])
    traj = Simulator(DoublePendulum(controller.config.plant), controller.config.torque_limits).run(controller, x0, 3.0)
    assert controller.mode == "lqr"
    assert np.allclose(traj.x[-1, 2:], 0.0, atol=1e-3)
    assert np.allclose(traj.x[-1, :2], x0[:2] - [0.02, -0.02], atol=1e-3)


def test_the_supervisors_cost_to_go_is_that_of_the_wrapped_state_to_the_last_bit(repo):
    """The supervisor wraps the state on floats (its 500 Hz path); the numbers must be wrap_state's exactly, at the
    wrapping's edges (q1 = 0 / 2 pi, q2 = +-pi) and for multi-turn angles."""
    controller = load_controller(repo / "config" / "pendubot.yaml")
    design = controller.design
    rng = np.random.default_rng(4)
    edges = np.array([[0.0, math.pi, 0.1, 0.2], [2 * math.pi, -math.pi, 0.0, 0.0], [-1e-300, 3 * math.pi, 0.0, 0.0]])
    assert controller.config.damping.enter_speed > 5.0          # the states below stay out of damping
    states = np.concatenate([edges, rng.uniform([-30.0, -30.0, -5.0, -5.0], [30.0, 30.0, 5.0, 5.0], (300, 4))])
    for x in states:
        controller.reset()
        controller.step(x, 0.0)
        err = wrap_state(x) - design.goal
        assert controller.last_cost_to_go == float(err @ design.S @ err)


def test_passive_joint_is_exactly_zero_everywhere(repo):
    rng = np.random.default_rng(0)
    for robot in ("pendubot", "acrobot"):
        controller = load_controller(repo / "config" / f"{robot}.yaml")
        passive = controller.config.passive_joint
        states = np.concatenate([rng.uniform(-20, 20, (300, 4)), GOAL + rng.normal(0, 0.05, (100, 4))])
        for k, x in enumerate(states):
            u = controller.step(x, 0.002 * k)
            assert u.shape == (2,) and u[passive] == 0.0
            assert abs(u[controller.config.actuated_joint]) <= controller.config.torque_limit


@pytest.mark.parametrize("bad", [[np.nan, 0, 0, 0], [0, np.inf, 0, 0], [0, 0, -np.inf, 0], [1.0, 2.0, 3.0]])
def test_non_finite_or_malformed_state_gives_zero_torque(repo, bad):
    controller = load_controller(repo / "config" / "pendubot.yaml")
    controller.step(GOAL + 0.01, 0.0)
    u = controller.step(np.array(bad, dtype=float), 0.002)
    assert np.all(u == 0.0) and controller.mode == "safe"
    u = controller.step(GOAL + 0.01, float("nan"))
    assert np.all(u == 0.0) and controller.mode == "safe"
    controller.step(GOAL + 0.01, 0.004)
    assert controller.mode == "lqr"  # recovers on the next good state


def test_a_non_finite_policy_output_is_safe_and_the_next_state_asks_the_policy_again(pendubot_config):
    """A policy that returns NaN (a broken file slipped through, an overflow) gives zero torque in mode ``safe``, and
    its NaN is not held for the rest of the policy period: the next state evaluates the policy afresh."""
    controller = build_controller(pendubot_config)
    outputs = iter([math.nan, 1.5])
    controller.set_policy(lambda x: next(outputs))
    x = np.zeros(4)  # hanging down at rest: outside the ROA, slow
    assert np.all(controller.step(x, 0.0) == 0.0) and controller.mode == "safe"
    assert list(controller.step(x, 0.002)) == [1.5, 0.0] and controller.mode == "policy"


def test_damping_engages_with_hysteresis(repo):
    controller = load_controller(repo / "config" / "pendubot.yaml")
    settings = controller.config.damping
    fast = np.array([0.0, 0.0, settings.enter_speed + 1.0, 0.0])
    u = controller.step(fast, 0.0)
    expected = max(-settings.gain * fast[2], -controller.config.torque_limit)
    assert controller.mode == "damping" and u[0] == pytest.approx(expected) and u[1] == 0.0
    between = np.array([0.0, 0.0, 0.5 * (settings.enter_speed + settings.exit_speed), 0.0])
    controller.step(between, 0.002)
    assert controller.mode == "damping"  # still above the exit speed
    controller.step(np.array([0.0, 0.0, settings.exit_speed - 1.0, 0.0]), 0.004)
    assert controller.mode == "idle"
    controller.step(between, 0.006)
    assert controller.mode == "idle"  # below the enter speed: no re-engagement


def test_damping_watches_the_faster_joint_whichever_it_is(repo):
    """max |dq| over both joints: a spinning passive joint engages the damping and keeps it, with the actuated joint
    slow (its speed alone would not)."""
    controller = load_controller(repo / "config" / "pendubot.yaml")
    settings = controller.config.damping
    spinning_elbow = np.array([0.0, 0.0, 1.0, settings.enter_speed + 1.0])
    u = controller.step(spinning_elbow, 0.0)
    assert controller.mode == "damping" and u[0] == pytest.approx(-settings.gain * 1.0) and u[1] == 0.0
    controller.step(np.array([0.0, 0.0, 1.0, settings.exit_speed + 1.0]), 0.002)
    assert controller.mode == "damping"
    controller.step(np.array([0.0, 0.0, 1.0, settings.exit_speed - 1.0]), 0.004)
    assert controller.mode == "idle"


def test_acrobot_damping_acts_on_the_elbow_only(repo):
    controller = load_controller(repo / "config" / "acrobot.yaml")
    u = controller.step(np.array([0.0, 0.0, 25.0, -30.0]), 0.0)
    assert controller.mode == "damping" and u[0] == 0.0 and u[1] > 0.0


def test_exploration_yields_to_the_supervisors_damping_as_on_the_robot(repo):
    """While exploring, the damping (too fast) overrides the random torque and the explorer is not stepped (its
    draws resume where they stopped); otherwise the actuated joint gets the draw, the passive one exactly 0. The
    offline learner's SupervisedExploration and the controller node share this rule."""
    from mcpilco_core.control.exploration import ExplorationController, SupervisedExploration, trial_rng

    config = load_controller(repo / "config" / "acrobot.yaml").config
    reference = ExplorationController(config, 3.0, trial_rng(7, 0))
    draws = [reference.step(np.zeros(4), k * config.policy_period)[1] for k in range(3)]
    explore = SupervisedExploration(load_controller(repo / "config" / "acrobot.yaml"),
                                    ExplorationController(config, 3.0, trial_rng(7, 0)))
    explore.reset()
    slow, fast = np.zeros(4), np.array([0.0, 0.0, 25.0, -30.0])
    u = explore.step(slow, 0.0)
    assert explore.mode == "explore" and u[0] == 0.0 and u[1] == draws[0]
    u = explore.step(fast, 0.02)
    assert explore.mode == "damping" and u[0] == 0.0 and u[1] > 0.0
    u = explore.step(slow, 0.04)                                  # slow again: the next draw, not a skipped one
    assert explore.mode == "explore" and u[1] == draws[1]


class CountingPolicy:
    robot = "pendubot"

    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return 0.01 * self.calls


def test_policy_runs_at_its_own_rate_with_zero_order_hold(pendubot_config):
    controller = build_controller(pendubot_config)
    policy = CountingPolicy()
    controller.set_policy(policy)
    x = np.zeros(4)  # hanging down at rest: outside the ROA, slow
    outputs = [controller.step(x, 0.002 * k)[0] for k in range(100)]  # 0.2 s at 500 Hz
    assert controller.mode == "policy"
    assert policy.calls == 10  # 50 Hz
    assert outputs[0] == outputs[9] != outputs[10]
    controller.set_policy(None)
    controller.step(x, 0.2)
    assert controller.mode == "idle"


def test_a_late_state_keeps_the_policy_on_its_time_grid(pendubot_config):
    """A policy tick evaluated late (a state that arrives after the tick's time) does not shift the grid: the next
    tick is due one period after the missed one, not one period after the late state; a tick already in the past
    restarts the grid from the state's time."""
    controller = build_controller(pendubot_config)
    policy = CountingPolicy()
    controller.set_policy(policy)
    x = np.zeros(4)
    controller.step(x, 0.0)                     # tick at 0: next due at 0.02
    controller.step(x, 0.025)                   # late: tick, next due at 0.04 (grid), not 0.045
    assert policy.calls == 2
    controller.step(x, 0.04)
    assert policy.calls == 3                    # on the grid
    controller.step(x, 0.2)                     # far behind: the grid restarts, next due at 0.22
    controller.step(x, 0.21)
    assert policy.calls == 4
    controller.step(x, 0.22)
    assert policy.calls == 5


def test_lqr_hysteresis(pendubot_config):
    controller = build_controller(pendubot_config)
    design, rho, roa = controller.design, controller.rho, pendubot_config.roa
    assert roa.enter_fraction < roa.exit_fraction
    enter, leave = roa.enter_fraction * rho, roa.exit_fraction * rho
    rng = np.random.default_rng(0)
    inside = sample_sublevel_states(design, np.array([0.5 * enter]), rng)[0]
    between = sample_sublevel_states(design, np.array([0.5 * (enter + leave)]), rng)[0]
    outside = sample_sublevel_states(design, np.array([1.2 * leave]), rng)[0]
    controller.step(between, 0.0)
    assert controller.mode == "idle"
    controller.step(inside, 0.002)
    assert controller.mode == "lqr"
    controller.step(between, 0.004)
    assert controller.mode == "lqr"
    controller.step(outside, 0.006)
    assert controller.mode == "idle"


def test_lqr_reenters_after_a_lost_catch_only_once_below_the_line(pendubot_config):
    """The opt-in roa.reenter_below_line: after the LQR hands back, a state inside the enter level is the policy's
    until the end effector has been at or below the score line; off (the default) the LQR takes it at once."""
    plant = DoublePendulum(pendubot_config.plant)
    rng = np.random.default_rng(0)
    for locked in (False, True):
        config = dataclasses.replace(pendubot_config,
                                     roa=dataclasses.replace(pendubot_config.roa, reenter_below_line=locked))
        lqr_only = build_controller(config)
        controller = Supervisor(config, lqr_only.design, lqr_only.rho, policy=lambda x: 1.0)
        design, rho, roa = controller.design, controller.rho, config.roa
        inside, outside = (next(x for x in sample_sublevel_states(design, np.full(200, level * rho), rng)
                                if plant.end_effector_height(x) > plant.height_threshold)
                           for level in (0.5 * roa.enter_fraction, 1.2 * roa.exit_fraction))
        low = np.array([0.3, 0.0, 0.0, 0.0])                       # hanging nearly down: far below the line
        assert plant.end_effector_height(inside) > plant.height_threshold
        assert plant.end_effector_height(outside) > plant.height_threshold
        assert plant.end_effector_height(low) <= plant.height_threshold
        modes = []
        for k, x in enumerate([inside, outside, inside, inside, low, inside]):
            controller.step(x, 0.002 * k)
            modes.append(controller.mode)
        expected = (["lqr", "policy", "policy", "policy", "policy", "lqr"] if locked
                    else ["lqr", "policy", "lqr", "lqr", "policy", "lqr"])
        assert modes == expected, locked
        controller.reset()                                         # forgets the lock
        controller.step(inside, 0.0)
        assert controller.mode == "lqr"


def test_roa_estimate_is_simulated(pendubot_config):
    plant = DoublePendulum(pendubot_config.plant)
    design = design_lqr(plant, 0, pendubot_config.lqr.Q_diag, pendubot_config.lqr.R)
    settings = dataclasses.replace(pendubot_config.roa, samples=300, seed=3)
    estimate = estimate_roa(plant, design, pendubot_config.torque_limit, settings, 0.002)
    assert 0.0 < estimate.rho < settings.rho_max and estimate.failures > 0
    # a much weaker actuator shrinks the region
    weak = estimate_roa(plant, design, 0.5, settings, 0.002)
    assert weak.rho < estimate.rho


def test_roa_refinement_keeps_the_smallest_failure_and_samples_below_twice_it(pendubot_config, monkeypatch):
    """estimate_roa's rounds (module docstring, step 5): round 1 samples V in (0, rho_max], each later round in
    (0, 2 rho] of the previous one, the samples split between the rounds; rho = the smallest failing V seen overall."""
    from mcpilco_core.control import roa

    plant = DoublePendulum(pendubot_config.plant)
    design = design_lqr(plant, 0, pendubot_config.lqr.Q_diag, pendubot_config.lqr.R)
    settings = dataclasses.replace(pendubot_config.roa, samples=30, rho_max=50.0)
    scripted = iter([np.array([9.0, 5.0]), np.array([7.0]), np.array([])])   # round 2 fails only above round 1's
    asked = []

    def failing(plant_, design_, limit, settings_, dt, upper, count, rng):
        asked.append((upper, count))
        return next(scripted)

    monkeypatch.setattr(roa, "_failing_values", failing)
    estimate = estimate_roa(plant, design, pendubot_config.torque_limit, settings, 0.002)
    assert asked == [(50.0, 10), (10.0, 10), (10.0, 10)]
    assert estimate == roa.RoaEstimate(rho=5.0, samples=30, failures=3, saturated=False)
    scripted = iter([np.array([]), np.array([]), np.array([])])
    asked.clear()
    estimate = estimate_roa(plant, design, pendubot_config.torque_limit, settings, 0.002)
    assert asked == [(50.0, 10)] * 3 and estimate == roa.RoaEstimate(rho=50.0, samples=30, failures=0, saturated=True)


def test_roa_samples_draw_v_uniformly_and_count_a_diverged_final_state_as_failed(pendubot_config, monkeypatch):
    """_failing_values: V(x0) ~ U(0, upper) from the estimate's generator, then the directions; a sample whose
    closed loop ends non-finite (NaN) fails, as does one that ends above converged_cost."""
    from mcpilco_core.control import roa

    plant = DoublePendulum(pendubot_config.plant)
    design = design_lqr(plant, 0, pendubot_config.lqr.Q_diag, pendubot_config.lqr.R)
    settings = pendubot_config.roa

    def closed_loop(plant_, design_, x0, limit, dt, horizon):
        final = np.tile(design.goal, (len(x0), 1))
        final[0::3] = np.nan                      # diverged
        final[1::3, 0] += 1.0                     # not converged
        return final

    monkeypatch.setattr(roa, "simulate_lqr", closed_loop)
    values = np.random.default_rng(5).uniform(0.0, 4.0, 9)
    failing = roa._failing_values(plant, design, 6.0, settings, 0.002, 4.0, 9, np.random.default_rng(5))
    np.testing.assert_array_equal(failing, values[[0, 1, 3, 4, 6, 7]])


def test_simulate_lqr_is_the_saturated_closed_loop_on_wrapped_angles(pendubot_config):
    """One step: u = clip(-K (wrap(x) - goal)) on the actuated joint, 0 on the passive one, one RK4 step; a state
    wound up by whole turns takes the same torque."""
    plant = DoublePendulum(pendubot_config.plant)
    design = design_lqr(plant, 0, pendubot_config.lqr.Q_diag, pendubot_config.lqr.R)
    x0 = np.array([GOAL + [0.3, -0.2, 0.5, 1.0], GOAL + [0.001, 0.0, 0.0, 0.0]])
    wound = x0 + [4 * math.pi, -2 * math.pi, 0.0, 0.0]
    limit = 0.5
    for start in (x0, wound):
        final = simulate_lqr(plant, design, start, limit, 0.002, 0.002)
        torque = np.clip(-(wrap_state(start) - GOAL) @ design.K[0], -limit, limit)
        assert abs(torque[0]) == limit and abs(torque[1]) < limit       # one saturated, one not
        expected = plant.rk4_step(start, np.stack([torque, np.zeros(2)], -1), 0.002)
        np.testing.assert_allclose(final, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("robot,at_09", [("pendubot", 0.01), ("acrobot", 0.0)])
def test_states_inside_the_shipped_roa_are_stabilised(repo, robot, at_09):
    """The README's numbers: of 1000 fresh states at 0.8 rho all are stabilised; at 0.9 rho at most 1 %
    (pendubot) / none (acrobot) are not."""
    controller = load_controller(repo / "config" / f"{robot}.yaml")
    config, design = controller.config, controller.design
    plant = DoublePendulum(config.plant)
    for fraction, allowed in ((0.8, 0.0), (0.9, at_09)):
        states = sample_sublevel_states(design, np.full(1000, fraction * controller.rho), np.random.default_rng(7))
        np.testing.assert_allclose(design.cost_to_go(states), fraction * controller.rho, rtol=1e-9)
        final = simulate_lqr(plant, design, states, config.torque_limit, 0.002, 3.0)
        failed = int(np.sum(~(design.cost_to_go(wrap_state(final)) < config.roa.converged_cost)))
        assert failed <= allowed * 1000, (fraction, failed)


def test_roa_cache_roundtrip_and_invalidation(pendubot_config, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = dataclasses.replace(pendubot_config, source=str(tmp_path / "robot.yaml"),
                                 roa=dataclasses.replace(pendubot_config.roa, samples=60))
    plant = DoublePendulum(config.plant)
    design = design_lqr(plant, 0, config.lqr.Q_diag, config.lqr.R)
    first = region_of_attraction(config, plant, design)
    cache = tmp_path / "robot.roa.json"
    assert json.loads(cache.read_text())["estimate"]["rho"] == first.rho
    data = json.loads(cache.read_text())
    data["estimate"]["rho"] = 0.123
    cache.write_text(json.dumps(data))
    assert region_of_attraction(config, plant, design).rho == 0.123  # served from the cache
    switching = dataclasses.replace(config, roa=dataclasses.replace(config.roa, enter_fraction=3.0, exit_fraction=5.0))
    assert region_of_attraction(switching, plant, design).rho == 0.123  # the fractions do not change rho
    changed = dataclasses.replace(config, torque_limit=5.0)
    assert region_of_attraction(changed, plant, design).rho != 0.123  # different fingerprint: recomputed
    # ... into the user cache: the file beside the config keeps its own estimate (no eviction, no thrash)
    assert json.loads(cache.read_text())["estimate"]["rho"] == 0.123
    assert len(list((tmp_path / "cache" / "mcpilco_ros" / "roa").glob("pendubot-*.json"))) == 1
    assert region_of_attraction(config, plant, design).rho == 0.123
    fixed = dataclasses.replace(config, roa=dataclasses.replace(config.roa, rho=0.7))
    assert region_of_attraction(fixed, plant, design).rho == 0.7


@pytest.mark.parametrize("content", ["[]", '"x"', '{"fingerprint": "KEY", "estimate": {"rho": NaN, "samples": 1, '
                                     '"failures": 0, "saturated": false}}',
                                     '{"fingerprint": "KEY", "estimate": {"rho": -1.0, "samples": 1, "failures": 0, '
                                     '"saturated": false}}',
                                     '{"fingerprint": "KEY", "estimate": {"rho": "0.5", "samples": 1, "failures": 0, '
                                     '"saturated": false}}'])
def test_a_damaged_roa_cache_is_estimated_afresh(pendubot_config, tmp_path, monkeypatch, content):
    """A cache file that is not a JSON object, or whose rho is NaN, negative or not a number, is neither a crash nor
    the supervisor's switching level: the estimate is made afresh and replaces it."""
    from mcpilco_core.control.roa import _cache_key

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = dataclasses.replace(pendubot_config, source=str(tmp_path / "robot.yaml"),
                                 roa=dataclasses.replace(pendubot_config.roa, samples=60))
    plant = DoublePendulum(config.plant)
    design = design_lqr(plant, 0, config.lqr.Q_diag, config.lqr.R)
    cache = tmp_path / "robot.roa.json"
    cache.write_text(content.replace("KEY", _cache_key(config)))
    rho = region_of_attraction(config, plant, design).rho
    assert isinstance(rho, float) and math.isfinite(rho) and rho > 0.0
    assert json.loads(cache.read_text())["estimate"]["rho"] == rho


@pytest.mark.parametrize("robot", ["pendubot", "acrobot"])
def test_policy_only_configs_never_hand_over_to_the_lqr(repo, robot):
    """config/<robot>_policy_only.yaml (a robot with passive-joint friction): enter_fraction 0 = never the LQR,
    everything else as the shipped config."""
    only = load_controller(repo / "config" / f"{robot}_policy_only.yaml")
    shipped = load_controller(repo / "config" / f"{robot}.yaml")
    goal = np.array([np.pi, 0.0, 0.0, 0.0])
    assert shipped.step(goal + 1e-3, 0.0).any() and shipped.mode == "lqr"
    for x in (goal, goal + 1e-3, goal + np.array([0.05, -0.05, 0.2, 0.1])):
        only.step(x, 0.0)
        assert only.mode == "idle"                              # no policy loaded, and never the LQR
    assert only.config.roa.enter_fraction == 0.0 and only.config.lqr == shipped.config.lqr
    assert only.config.plant == shipped.config.plant and only.config.damping == shipped.config.damping


def test_the_robot_configs_u_max_bounds_a_loaded_policy(repo, tmp_path):
    """Issue 13 item 9: with u_max 1.0 in the robot config the shipped acrobot policy (6 N m) applies <= 1 N m."""
    import yaml

    data = yaml.safe_load((repo / "config" / "acrobot.yaml").read_text())
    params = data["/**"]["ros__parameters"]
    params["u_max"], params["plant_models_file"] = 1.0, str(repo / "config" / "plant_models.yaml")
    (tmp_path / "acrobot.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "acrobot.roa.json").write_bytes((repo / "config" / "acrobot.roa.json").read_bytes())
    bounded = load_controller(tmp_path / "acrobot.yaml", repo / "policies" / "acrobot.npz")
    shipped = load_controller(repo / "config" / "acrobot.yaml", repo / "policies" / "acrobot.npz")
    rng = np.random.default_rng(1)
    outputs = []
    for k in range(400):
        x = np.concatenate([rng.uniform(-np.pi, np.pi, 2), rng.uniform(-8, 8, 2)])
        u_bounded, u_shipped = bounded.step(x, 0.02 * k), shipped.step(x, 0.02 * k)
        if bounded.mode == "policy":
            assert abs(u_bounded[1]) <= 1.0 and u_bounded[0] == 0.0
            assert u_bounded[1] == pytest.approx(np.clip(u_shipped[1], -1.0, 1.0), abs=1e-12)
            outputs.append(abs(u_shipped[1]))
    assert max(outputs) > 3.0                       # the policy file alone would have applied more


def test_every_shipped_robot_config_finds_its_cached_roa(repo):
    """Every config/<name>.yaml has a config/<name>.roa.json whose key matches (no ROA estimate at first use);
    the key ignores what does not change rho (switching fractions, u_max, friction compensation)."""
    from mcpilco_core.config import load_robot_config
    from mcpilco_core.control.roa import _cache_key

    robot_files = [p for p in sorted((repo / "config").glob("*.yaml"))
                   if (p.with_name(p.stem + ".roa.json")).is_file()]
    assert len(robot_files) >= 5
    for path in robot_files:
        cached = json.loads(path.with_name(path.stem + ".roa.json").read_text())["fingerprint"]
        assert _cache_key(load_robot_config(path)) == cached, path.name


@pytest.mark.parametrize("lqr", [{"Q_diag": [0.0, 0.0, 0.0, 0.0]}, {"Q_diag": [1e6, 1e6, 1e6, 1e6], "R": 1e-300}])
def test_lqr_weights_without_a_design_name_the_file(repo, tmp_path, lqr):
    """Weights each in range may still have no LQR (Q_diag all zero: a singular cost-to-go; an extreme ratio: no
    Riccati solution): `mcpilco roa` and build_controller say so naming the file's lqr section, not numpy."""
    import yaml

    from mcpilco_core.config import ConfigError, load_robot_config
    from mcpilco_ros.cli import main

    data = yaml.safe_load((repo / "config" / "acrobot.yaml").read_text())
    params = data["/**"]["ros__parameters"]
    params["plant_models_file"] = str(repo / "config" / "plant_models.yaml")
    params["lqr"] = lqr
    path = tmp_path / "acrobot.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"acrobot\.yaml: field 'lqr': .*positive definite"):
        build_controller(load_robot_config(path))
    assert main(["roa", "--robot", "acrobot", "--config", str(path)]) == 2


def test_lqr_gain_scale_scales_the_feedback_only(repo, tmp_path):
    """lqr.gain_scale multiplies the Riccati gains column by column; S (where the supervisor switches) and the passive
    joint's zero row stay; all ones is the unscaled design with the same fingerprint; bad values name the field."""
    import yaml

    from mcpilco_core.config import ConfigError, load_robot_config
    from mcpilco_core.control import configured_lqr

    def with_scale(scale):
        data = yaml.safe_load((repo / "config" / "acrobot.yaml").read_text())
        params = data["/**"]["ros__parameters"]
        params["plant_models_file"] = str(repo / "config" / "plant_models.yaml")
        params["lqr"]["gain_scale"] = scale
        path = tmp_path / "acrobot.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_robot_config(path)

    shipped = load_robot_config(repo / "config" / "acrobot.yaml")
    plant = DoublePendulum(shipped.plant)
    plain = configured_lqr(plant, shipped)
    assert with_scale([1.0, 1.0, 1.0, 1.0]).fingerprint() == shipped.fingerprint()
    scaled_config = with_scale([1.1, 0.9, 1.0, 2.0])
    assert scaled_config.fingerprint() != shipped.fingerprint()
    scaled = configured_lqr(plant, scaled_config)
    np.testing.assert_array_equal(scaled.K, plain.K * np.array([1.1, 0.9, 1.0, 2.0]))
    np.testing.assert_array_equal(scaled.S, plain.S)
    assert np.all(scaled.K[scaled_config.passive_joint] == 0.0)
    near = np.array([math.pi + 0.01, -0.02, 0.03, 0.04])
    supervisor = Supervisor(scaled_config, scaled, 1.0)
    u = supervisor.step(near, 0.0)
    assert supervisor.mode == "lqr"
    assert u[1] == pytest.approx(-float(scaled.K[1] @ (wrap_state(near) - GOAL)), abs=1e-12) and u[0] == 0.0
    for bad, words in (([1.0, 1.0, 0.0, 1.0], "must be positive"), ([1.0, 1.0, 1.0], "4")):
        with pytest.raises(ConfigError, match=r"lqr\.gain_scale") as info:
            with_scale(bad)
        assert words in str(info.value)


def test_the_lqr_may_be_designed_on_its_own_plant_while_the_score_keeps_the_configs(repo, tmp_path):
    """lqr.plant_model: the LQR and its ROA estimate come from the named plant (e.g. the robot's measured links); the
    config's plant, which places the score's line and drives the reset, stays; without it the design and the
    fingerprint (the ROA cache) are as before; a bad name or file is refused naming the field;
    a run's or a session's copy of the config brings the file."""
    import shutil

    import yaml

    from mcpilco_core.config import ConfigError, copy_robot_config, load_plant_parameters, load_robot_config
    from mcpilco_core.control import configured_lqr, lqr_plant
    from mcpilco_core.recording.session_directory import SessionDirectory

    models = tmp_path / "measured.yaml"
    nominal = yaml.safe_load((repo / "config" / "plant_models.yaml").read_text())["models"]["model_1.1"]
    models.write_text(yaml.safe_dump({"models": {"measured": {**nominal, "l": [0.186, 0.327]}}}))
    shutil.copyfile(repo / "config" / "plant_models.yaml", tmp_path / "plant_models.yaml")

    def config_with(**lqr):
        data = yaml.safe_load((repo / "config" / "acrobot.yaml").read_text())
        data["/**"]["ros__parameters"]["lqr"].update(lqr)
        path = tmp_path / "acrobot.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_robot_config(path)

    shipped = load_robot_config(repo / "config" / "acrobot.yaml")
    plain = config_with()
    assert plain.lqr.plant is None and plain.fingerprint() == shipped.fingerprint()
    assert lqr_plant(plain).params == shipped.plant
    own = config_with(plant_model="measured", plant_models_file="measured.yaml")
    assert own.lqr.plant == load_plant_parameters(models, "measured") and own.lqr.plant.l == (0.186, 0.327)
    assert own.plant == shipped.plant                      # the score's line and the reset: the config's plant
    assert own.fingerprint() != shipped.fingerprint()     # its own ROA estimate
    expected = configured_lqr(DoublePendulum(own.lqr.plant), own).K
    assert not np.allclose(expected, configured_lqr(DoublePendulum(own.plant), own).K)
    supervisor = build_controller(dataclasses.replace(own, roa=dataclasses.replace(own.roa, rho=1.0)))
    np.testing.assert_array_equal(supervisor.design.K, expected)
    with pytest.raises(ConfigError, match="lqr.plant_model"):
        config_with(plant_model="no_such_model", plant_models_file="measured.yaml")
    with pytest.raises(ConfigError, match="lqr.plant_models_file"):
        config_with(plant_model="measured", plant_models_file="missing.yaml")

    own = config_with(plant_model="measured", plant_models_file="measured.yaml")   # as runs and sessions copy it
    (tmp_path / "run").mkdir()
    copy = copy_robot_config(own.source, tmp_path / "run")
    assert load_robot_config(copy).lqr.plant == own.lqr.plant and load_robot_config(copy).plant == own.plant
    session = SessionDirectory.create(tmp_path / "session", own)
    assert load_robot_config(session.root / "robot_config.yaml").lqr.plant == own.lqr.plant
