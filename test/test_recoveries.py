"""Where the time goes after each disturbance (evaluation.disturbance_recoveries)."""

import math

import numpy as np
import pytest

from mcpilco_core.control import build_controller
from mcpilco_core.evaluation import (
    DT,
    EvaluationResult,
    arrivals_by_level,
    disturbance_recoveries,
    evaluate_seed,
    roa_level,
    summarize_recoveries,
)
from mcpilco_core.policy import load_policy
from mcpilco_core.simulation import MODE_CODES, Trajectory

UP = (math.pi, 0.0, 0.0, 0.0)       # end effector 0.5 m high: above the 0.45 m line
DOWN = (0.0, 0.0, 0.0, 0.0)


def constructed(segments: list[tuple[int, tuple, str]], windows: list[list[float]]) -> EvaluationResult:
    """A trajectory of ``(steps, state, mode)`` segments (plus the final state) and its reset windows."""
    xs, modes = [], []
    for steps, state, mode in segments:
        xs += [state] * steps
        modes += [MODE_CODES[mode]] * steps
    x = np.array(xs + [xs[-1]], dtype=float)
    n = len(modes)
    traj = Trajectory(t=np.arange(n + 1) * DT, x=x, u=np.zeros((n, 2)), u_cmd=np.zeros((n, 2)),
                      mode=np.array(modes))
    return EvaluationResult(seed=7, score=0.0, uptime=0.0, passive_max_torque=0.0, passive_max_applied_torque=0.0,
                            mode_fractions={}, windows=windows, trajectory=traj)


def test_recoveries_on_a_constructed_run(pendubot_plant):
    # 50 steps up; window 1 (100 steps); 30 below, 20 above, 10 below, then above to window 2: policy then LQR;
    # window 2 (100 steps); 40 below until the end: never caught
    state_after = (-3.0, 4.0, 1.5, -2.0)     # hand-over state 1 (q2 = 4 rad wraps to 4 - 2 pi)
    result = constructed([(50, UP, "policy"), (100, DOWN, "reset"), (1, state_after, "policy"), (29, DOWN, "policy"),
                          (20, UP, "policy"), (10, DOWN, "policy"), (25, UP, "policy"), (15, UP, "lqr"),
                          (100, DOWN, "reset"), (40, DOWN, "policy")],
                         windows=[[50 * DT, 150 * DT], [250 * DT, 350 * DT]])
    first, second = disturbance_recoveries(result, pendubot_plant)
    assert first.seed == 7 and first.index == 0 and first.handover_time == pytest.approx(150 * DT)
    assert first.handover_state == pytest.approx((-3.0, 4.0 - 2 * math.pi, 1.5, -2.0))
    assert first.length == pytest.approx(100 * DT)
    assert first.time_to_line == pytest.approx(30 * DT)
    assert first.time_to_stay == pytest.approx(60 * DT)      # above from step 60 of the stretch to its end
    assert first.time_to_lqr == pytest.approx(85 * DT)
    assert first.below_line == pytest.approx((100 + 40) * DT)  # the window, plus 30 + 10 below after it
    assert first.caught and first.passes == 2 and not first.caught_on_first_arrival   # up, down, up again
    assert second.length == pytest.approx(40 * DT) and not second.caught and second.passes == 0
    assert math.isnan(second.time_to_line) and math.isnan(second.time_to_stay) and math.isnan(second.time_to_lqr)
    assert second.below_line == pytest.approx(140 * DT)
    summary = summarize_recoveries([first, second])
    assert summary["n"] == 2 and summary["caught"] == 0.5
    assert summary["time_to_stay"] == pytest.approx(60 * DT)   # over the recoveries where it happened
    assert summary["below_line"] == pytest.approx(140 * DT)
    assert summary["caught_on_first_arrival"] == 0.0 and summary["passes"] == 2.0   # passes: over the caught ones


def test_a_recovery_held_from_its_first_arrival_is_caught_on_it(pendubot_plant):
    # window (100 steps); 10 below, then above to the next window; window; above at once, down, up, down: not caught
    result = constructed([(100, DOWN, "reset"), (10, DOWN, "policy"), (40, UP, "lqr"), (100, DOWN, "reset"),
                          (5, UP, "policy"), (5, DOWN, "policy"), (5, UP, "policy"), (5, DOWN, "policy")],
                         windows=[[0.0, 100 * DT], [150 * DT, 250 * DT]])
    held, lost = disturbance_recoveries(result, pendubot_plant)
    assert held.passes == 1 and held.caught_on_first_arrival and held.time_to_stay == pytest.approx(10 * DT)
    assert lost.passes == 2 and not lost.caught and not lost.caught_on_first_arrival
    summary = summarize_recoveries([held, lost])
    assert summary["caught_on_first_arrival"] == 0.5 and summary["passes"] == 1.0


def test_recoveries_need_the_trajectory(pendubot_plant):
    result = constructed([(10, UP, "policy")], windows=[])
    result.trajectory = None
    with pytest.raises(ValueError, match="keep_trajectory"):
        disturbance_recoveries(result, pendubot_plant)


@pytest.mark.timeout(120)
def test_recoveries_account_for_every_second_below_the_line(repo, pendubot_config, pendubot_plant):
    """Below the line before the first window + every recovery's below_line = 60 s - uptime, exactly."""
    policy = load_policy(repo / "policies" / "pendubot.npz", robot="pendubot", torque_limit=6.0)
    result = evaluate_seed(build_controller(pendubot_config, policy), pendubot_config, seed=3)
    recoveries = disturbance_recoveries(result, pendubot_plant)
    assert len(recoveries) == 15
    first_window = int(round(result.windows[0][0] / DT))
    heights = pendubot_plant.end_effector_height(result.trajectory.x[:first_window])
    before = np.sum(heights <= pendubot_plant.height_threshold) * DT
    assert before + sum(r.below_line for r in recoveries) == pytest.approx(60.0 - result.uptime, abs=1e-9)
    assert all(r.caught for r in recoveries)           # the shipped pendubot policy catches after every one
    assert 0.0 < summarize_recoveries(recoveries)["time_to_line"] < 2.0


UPRIGHT_LEVEL = roa_level(np.eye(4), np.array(UP), rho=0.5)   # V/rho = |wrap(x) - upright|^2 / 0.5
FAST_UP = (math.pi, 0.0, 3.0, 0.0)                             # above the line, V/rho = 18


def test_roa_level_is_the_wrapped_cost_to_go_in_rho():
    levels = UPRIGHT_LEVEL(np.array([UP, (3 * math.pi, 2 * math.pi, 0.0, 0.0), (math.pi + 0.1, 0.0, 0.0, -0.2),
                                     FAST_UP]))
    assert levels == pytest.approx([0.0, 0.0, (0.01 + 0.04) / 0.5, 18.0])   # whole turns are the same upright


def test_first_pass_level_splits_the_catch_from_the_swing_up(pendubot_plant):
    # 1: first pass through the upright, held (caught on it); 2: first pass through the upright, lost, back later;
    # 3: first pass above the line but fast (V = 18 rho), lost; 4: never above the line
    result = constructed([(100, DOWN, "reset"), (10, DOWN, "policy"), (40, UP, "lqr"),
                          (100, DOWN, "reset"), (5, UP, "lqr"), (5, DOWN, "policy"), (20, UP, "lqr"),
                          (100, DOWN, "reset"), (5, FAST_UP, "policy"), (5, DOWN, "policy"), (10, UP, "lqr"),
                          (100, DOWN, "reset"), (10, DOWN, "policy")],
                         windows=[[0.0, 100 * DT], [150 * DT, 250 * DT], [280 * DT, 380 * DT], [400 * DT, 500 * DT]])
    held, lost, fast, never = disturbance_recoveries(result, pendubot_plant, UPRIGHT_LEVEL)
    assert held.first_pass_level == 0.0 and lost.first_pass_level == 0.0
    assert fast.first_pass_level == pytest.approx(18.0)          # its later pass through the upright does not count
    assert math.isnan(never.first_pass_level)
    summary = summarize_recoveries([held, lost, fast, never], enter_level=8.0)
    assert summary["first_pass_in_balance"] == 0.5                # held and lost came within 8 rho
    assert summary["first_pass_lost_in_balance"] == 0.25          # lost did, and fell back: the catch's loss
    assert summarize_recoveries([held, lost, fast], enter_level=20.0)["first_pass_in_balance"] == 1.0


def test_first_pass_level_is_not_measured_without_a_level_function(pendubot_plant):
    result = constructed([(100, DOWN, "reset"), (10, UP, "lqr")], windows=[[0.0, 100 * DT]])
    (recovery,) = disturbance_recoveries(result, pendubot_plant)
    assert math.isnan(recovery.first_pass_level)
    summary = summarize_recoveries([recovery], enter_level=8.0)
    assert math.isnan(summary["first_pass_in_balance"]) and math.isnan(summary["first_pass_lost_in_balance"])
    assert math.isnan(summarize_recoveries([recovery])["first_pass_in_balance"])   # no level given either


def test_the_first_pass_energy_and_the_lqr_entries_group_the_arrivals(pendubot_plant):
    """The energy above the upright's at the first pass's closest state (kinetic energy of the fast pass, 0 at the
    resting upright), the LQR's entries in the stretch, and the grouping bench_recovery prints: within the switching
    level, up to 100 rho, beyond (the swing-up's misses)."""
    very_fast = (math.pi, 0.0, 15.0, 0.0)                       # V/rho = 450: a miss
    result = constructed([(100, DOWN, "reset"), (10, DOWN, "policy"), (40, UP, "lqr"),
                          (100, DOWN, "reset"), (5, FAST_UP, "policy"), (5, DOWN, "policy"), (5, UP, "lqr"),
                          (5, DOWN, "policy"), (10, UP, "lqr"),
                          (100, DOWN, "reset"), (20, very_fast, "policy"), (10, DOWN, "policy")],
                         windows=[[0.0, 100 * DT], [150 * DT, 250 * DT], [280 * DT, 380 * DT]])
    held, fast, miss = disturbance_recoveries(result, pendubot_plant, UPRIGHT_LEVEL)
    top = float(pendubot_plant.total_energy(np.array(UP)))
    assert held.first_pass_energy == pytest.approx(0.0, abs=1e-12) and held.lqr_entries == 1
    assert fast.first_pass_energy == pytest.approx(float(pendubot_plant.total_energy(np.array(FAST_UP))) - top)
    assert fast.first_pass_energy > 0 and fast.lqr_entries == 2             # entered, lost, entered again
    assert miss.first_pass_level == pytest.approx(450.0) and miss.lqr_entries == 0
    within, middle, beyond = arrivals_by_level([held, fast, miss], enter_level=8.0)
    assert (within["n"], middle["n"], beyond["n"]) == (1, 1, 1) and within["share"] == pytest.approx(1 / 3)
    assert within["time_to_line"] == pytest.approx(10 * DT) and middle["time_to_line"] == 0.0
    assert middle["energy"] == pytest.approx(fast.first_pass_energy) and middle["lqr_entries"] == 2.0
    assert beyond["caught"] == 0.0 and math.isnan(beyond["time_to_stay"]) and within["caught"] == 1.0
    (unmeasured,) = disturbance_recoveries(constructed([(100, DOWN, "reset"), (10, UP, "lqr")],
                                                       windows=[[0.0, 100 * DT]]), pendubot_plant)
    assert math.isnan(unmeasured.first_pass_energy) and unmeasured.lqr_entries == 1
    assert all(g["n"] == 0 and math.isnan(g["share"]) for g in arrivals_by_level([unmeasured], 8.0))
