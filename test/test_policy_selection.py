"""The opt-in policy selection (robot config section ``selection``, control/selection.py): off unless a bank is named,
bad settings named by field, the running policy replaced by the candidate that stays above the line longest on the
config's plant, at the decision's due time and not before, the same numbers whether or not the caller spreads the
work over its steps, and the passive joint still at exactly 0 N m."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from test_friction_compensation import robot_file

from mcpilco_core.config import ConfigError, load_plant_parameters, load_robot_config
from mcpilco_core.control import build_controller, load_bank
from mcpilco_core.control.roa import _cache_key
from mcpilco_core.control.selection import PolicySelection
from mcpilco_core.control.selection_workers import NICENESS, split_tasks
from mcpilco_core.plant import DoublePendulum
from mcpilco_core.policy import PolicyError, load_policy, save_policy
from mcpilco_core.simulation import drive, load_robot_profile

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "policies" / "acrobot.npz"


def limp(path: Path) -> Path:
    """The shipped acrobot policy with every weight 0: it never moves the elbow, so it never swings up."""
    policy = load_policy(SHIPPED)
    save_policy(dataclasses.replace(policy, weights=np.zeros_like(policy.weights)), path)
    return path


def selecting(tmp_path: Path, **settings) -> Path:
    """The shipped acrobot config with a selection whose bank holds the shipped policy."""
    bank = tmp_path / "bank"
    bank.mkdir(exist_ok=True)
    shutil.copy(SHIPPED, bank / "shipped.npz")
    return robot_file(tmp_path, "acrobot", "selection", bank=str(bank), **settings)


def test_off_unless_a_bank_is_named_and_then_rho_is_unchanged(tmp_path):
    shipped = load_robot_config(REPO / "config" / "acrobot.yaml")
    assert not shipped.selection.enabled and load_bank(shipped) == []
    assert build_controller(shipped).selection is None
    off = load_robot_config(robot_file(tmp_path, "acrobot", "selection", horizon=1.0))
    assert off.fingerprint() == shipped.fingerprint()
    on = load_robot_config(selecting(tmp_path))
    assert on.selection.enabled and on.fingerprint() != shipped.fingerprint()
    assert _cache_key(on) == _cache_key(shipped)          # rho is the LQR's alone: the cached estimate stays valid
    shipped_select = load_robot_config(REPO / "config" / "acrobot_select.yaml")
    assert shipped_select.selection.enabled and len(load_bank(shipped_select, load_policy(SHIPPED))) == 7 + 2
    proxy = load_robot_config(REPO / "config" / "acrobot_dither_select.yaml")      # the design robot's plant
    proxy_policy = load_policy(REPO / "policies" / "acrobot_hardware_proxy.npz")
    assert len(load_bank(proxy, proxy_policy)) == 2 + 7 + 2                # proxy run, nominal bank, mirror images
    assert proxy.selection.plant.cf[0] > 0.1 and proxy.plant.cf[0] == 0


@pytest.mark.parametrize("values, field, words", [
    ({"bank": "no/such/dir"}, "selection.bank", "no such directory"),
    ({"bank": "/tmp:no/such/dir"}, "selection.bank", "no such directory"),
    ({"bank": "/tmp::/tmp"}, "selection.bank", "an empty directory name"),
    ({"bank": "/tmp: "}, "selection.bank", "an empty directory name"),
    ({"lead": 0.003}, "selection.lead", "whole number of control periods"),
    ({"step": 0.003}, "selection.step", "does not divide"),
    ({"step": 0.04, "lead": 0.04}, "selection.step", "does not divide policy_period"),
    ({"horizon": 0.0}, "selection.horizon", "must be positive"),
    ({"margin": -1.0}, "selection.margin", "must be non-negative"),
    ({"candidates": 3}, "selection", "candidates"),
    ({"dither_phases": 2}, "selection.dither_phases", "dither that is off"),
    ({"dither_phases": 0}, "selection.dither_phases", "must be in [1, 8]"),
    ({"delay": -0.001}, "selection.delay", "must be non-negative"),
    ({"delay": 2.0}, "selection.delay", "delay"),
    ({"predict_delay": True}, "selection.predict_delay", "no whole simulation step"),
    ({"predict_delay": True, "delay": 0.003, "step": 0.004}, "selection.predict_delay", "no whole simulation step"),
    ({"noise_samples": -1}, "selection.noise_samples", "must be non-negative"),
    ({"noise_samples": 65}, "selection.noise_samples", "65"),
    ({"finalists": 0}, "selection.finalists", "must be in [1, 64]"),
    ({"measurement_noise": [0.0, 0.0, -0.05, 0.05]}, "selection.measurement_noise", "must be"),
    ({"measurement_noise": [0.0, 0.05]}, "selection.measurement_noise", "4"),
    ({"torque_noise": -0.02}, "selection.torque_noise", "must be non-negative"),
    ({"workers": -1}, "selection.workers", "must be non-negative"),
    ({"workers": 17}, "selection.workers", "17")])
def test_bad_settings_name_their_field(tmp_path, values, field, words):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as info:
        load_robot_config(robot_file(tmp_path, "acrobot", "selection", **values))
    assert words in str(info.value)


def test_it_refuses_the_catch_plan_a_bad_bank_file_and_an_empty_bank(tmp_path):
    path = selecting(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["/**"]["ros__parameters"]["catch"] = {"enabled": True}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"selection\.bank") as info:
        load_robot_config(path)
    assert "catch" in str(info.value)
    (tmp_path / "bank" / "broken.npz").write_bytes(b"not a policy")     # a bad file in the bank: named, refused
    with pytest.raises(PolicyError, match="broken.npz"):
        build_controller(load_robot_config(selecting(tmp_path)), load_policy(SHIPPED))
    empty = tmp_path / "empty"
    empty.mkdir()
    config = load_robot_config(robot_file(tmp_path, "acrobot", "selection", bank=str(empty)))
    with pytest.raises(ConfigError, match="no \\*.npz policy"):
        build_controller(config, load_policy(SHIPPED))


def test_several_bank_directories_give_their_candidates_in_turn_each_once(tmp_path):
    """``bank: A:B`` (as in PATH): A's files by name, then B's; a policy in both, or the loaded one, counts once; an
    empty directory among them is refused by name."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    shipped = load_policy(SHIPPED)
    save_policy(dataclasses.replace(shipped, weights=shipped.weights * 0.5), second / "a_half.npz")
    save_policy(dataclasses.replace(shipped, weights=shipped.weights * 0.25), first / "z_quarter.npz")
    shutil.copy(second / "a_half.npz", first / "b_half_again.npz")
    shutil.copy(SHIPPED, second / "b_shipped.npz")
    config = load_robot_config(robot_file(tmp_path, "acrobot", "selection", bank=f"{first}:{second}"))
    assert config.selection.bank == f"{first.resolve()}:{second.resolve()}"
    bank = load_bank(config, shipped)
    scales = [float(np.linalg.norm(policy.weights) / np.linalg.norm(shipped.weights)) for policy in bank]
    assert scales == pytest.approx([0.5, 0.25])      # first/b_half_again, first/z_quarter; second's are repeats
    relative = load_robot_config(robot_file(tmp_path, "acrobot", "selection", bank="first : second"))
    assert relative.selection.bank == config.selection.bank     # each part relative to the robot file, spaces dropped
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no \\*.npz policy in .*empty"):
        load_bank(load_robot_config(robot_file(tmp_path, "acrobot", "selection", bank=f"{first}:{tmp_path / 'empty'}")))



def test_a_run_or_session_copy_of_the_config_brings_the_bank_and_loads_on_its_own(tmp_path):
    """copy_robot_config (runs and session directories keep one): the shipped selection config names its bank by a
    path relative to config/, which the copy's folder does not have, so the bank's policies travel into
    ``selection_bank/`` in order and the copy names them there; it loads with the same candidates in the same order
    and the same controller otherwise. A config without a bank is copied byte for byte."""
    from mcpilco_core.config import copy_robot_config

    shipped = load_robot_config(REPO / "config" / "acrobot_select.yaml")
    (tmp_path / "run").mkdir()
    copy = load_robot_config(copy_robot_config(REPO / "config" / "acrobot_select.yaml", tmp_path / "run"))
    assert all(Path(part).is_relative_to((tmp_path / "run" / "selection_bank").resolve())
               for part in copy.selection.bank.split(":"))
    before, after = load_bank(shipped), load_bank(copy)
    assert len(after) == len(before) >= 2
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a.weights, b.weights)
        np.testing.assert_array_equal(a.centers, b.centers)
    assert dataclasses.replace(copy, source=None, selection=shipped.selection) == dataclasses.replace(
        shipped, source=None)
    (tmp_path / "plain").mkdir()
    plain = copy_robot_config(REPO / "config" / "acrobot.yaml", tmp_path / "plain")
    assert plain.read_bytes() == (REPO / "config" / "acrobot.yaml").read_bytes()
    assert not (tmp_path / "plain" / "selection_bank").exists()

def run(config, policy, seconds: float, finish_steps: bool = False, profile: str = "nominal", workers: int = 0):
    """``seconds`` from rest on the robot ``profile``; returns (trajectory, supervisor, selected index per step).
    ``workers``: the decisions computed in that many worker processes, each waited for when due."""
    supervisor = build_controller(config, policy)
    supervisor.start_selection_workers(workers, wait=True)
    selected = []

    class Watched:
        mode = property(lambda self: supervisor.mode)
        reset = staticmethod(supervisor.reset)

        def step(self, x, t):
            u = supervisor.step(x, t)
            selected.append(supervisor.selected)
            if finish_steps:
                supervisor.finish_step()
            return u

    robot = load_robot_profile(profile).robot(config, 0)
    try:
        traj = drive(robot, Watched(), int(round(seconds / config.control_period)))
    finally:
        supervisor.close()
    return traj, supervisor, np.array(selected)


def test_the_candidate_that_stays_up_longest_takes_over_at_the_due_time(tmp_path):
    config = load_robot_config(selecting(tmp_path, lead=0.04, interval=0.5))
    plant = DoublePendulum(config.plant)
    loaded = load_policy(limp(tmp_path / "limp.npz"))
    alone, _, _ = run(dataclasses.replace(config, selection=dataclasses.replace(config.selection, bank="")), loaded,
                      3.0)
    traj, supervisor, selected = run(config, loaded, 3.0)
    assert not np.any(plant.end_effector_height(alone.x) > plant.height_threshold)   # the limp policy stays down
    assert np.any(plant.end_effector_height(traj.x) > plant.height_threshold)        # the bank's swings up
    lead = round(config.selection.lead / config.control_period)
    assert np.all(selected[:lead] == 0) and np.all(selected[lead:] == 1)   # from the first state's decision on
    assert np.all(traj.u[:lead, 1] == 0.0) and np.any(traj.u[lead:lead + 10, 1] != 0.0)
    assert supervisor.selection.decisions >= 3
    assert np.all(traj.u[:, 0] == 0.0)                  # the passive shoulder: exactly 0 N m, always


@pytest.mark.parametrize("noisy", [{}, {"noise_samples": 2, "finalists": 1, "torque_noise": 0.02,
                                          "measurement_noise": [0.0, 0.0, 0.05, 0.05]}], ids=["plain", "noisy_finals"])
def test_spreading_the_work_over_the_steps_gives_the_same_run_and_each_decision_is_ready_in_time(tmp_path, noisy):
    """With noisy finals too: two options, and (finalists + running) x noise_samples = 2 x 2 noisy simulations."""
    config = load_robot_config(selecting(tmp_path, lead=0.02, interval=0.3, horizon=1.0, step=0.004, **noisy))
    loaded = load_policy(limp(tmp_path / "limp.npz"))
    plain, _, chosen = run(config, loaded, 2.0)
    spread, supervisor, chosen_spread = run(config, loaded, 2.0, finish_steps=True)
    np.testing.assert_array_equal(plain.u, spread.u)
    np.testing.assert_array_equal(chosen, chosen_spread)
    selection = supervisor.selection
    total = selection.lead_steps + (2 + 2 * noisy.get("noise_samples", 0)) * selection.horizon_steps
    assert selection._chunk * selection.lead_periods >= total          # each advance does its share: done when due
    assert np.all(spread.u[:, 0] == 0.0)


def test_the_choice_comes_from_the_robot_configs_plant(tmp_path):
    """A decision's values are simulations on the robot config's plant (no robot is handed to the supervisor):
    the same for the same config, other ones for a config with another plant (model_1.0: friction, rotor inertia),
    or for the plant ``selection.plant_model`` names (the LQR's plant unchanged)."""
    config = load_robot_config(selecting(tmp_path, lead=0.02))
    other = dataclasses.replace(config, plant=load_plant_parameters(REPO / "config" / "plant_models.yaml", "model_1.0"))
    loaded = load_policy(limp(tmp_path / "limp.npz"))

    def first_values(robot_config) -> list[float]:
        supervisor = build_controller(robot_config, loaded)
        assert supervisor.selection.plant.params == (robot_config.selection.plant or robot_config.plant)
        supervisor.step(np.zeros(4), 0.0)
        supervisor.selection.finish()
        return supervisor.selection.last_values

    values = first_values(config)
    assert values == first_values(config) and values[1] > values[0] == 0.0
    assert first_values(other) != values
    named = load_robot_config(selecting(tmp_path, lead=0.02, plant_model="model_1.0",
                                        plant_models_file=str(REPO / "config" / "plant_models.yaml")))
    assert named.plant == config.plant and named.selection.plant == other.plant     # the LQR's plant stays
    assert first_values(named) != values                  # the candidates run on model_1.0 ...
    np.testing.assert_array_equal(build_controller(named).design.K, build_controller(config).design.K)  # not the LQR
    with pytest.raises(ConfigError, match=r"selection\.plant_model") as info:
        load_robot_config(selecting(tmp_path, plant_model="model_9", plant_models_file=str(REPO / "config" /
                                                                                              "plant_models.yaml")))
    assert "unknown plant model" in str(info.value)


def test_a_reloaded_policy_runs_at_once_and_a_gap_starts_a_new_decision(tmp_path):
    config = load_robot_config(selecting(tmp_path, lead=0.04))
    supervisor = build_controller(config, load_policy(limp(tmp_path / "limp.npz")))
    supervisor.step(np.zeros(4), 0.0)
    assert supervisor.selection.pending
    shipped = load_policy(SHIPPED)
    supervisor.set_policy(shipped)                       # ~/reload_policy: candidate 0, running, nothing pending
    assert supervisor.policy is shipped and supervisor.selected == 0 and not supervisor.selection.pending
    supervisor.step(np.zeros(4), 0.002)
    assert not supervisor.selection.pending              # no gap, no policy in charge for an interval yet
    supervisor.step(np.zeros(4), 0.5)                    # states resume after a gap: a new decision
    assert supervisor.selection.pending and supervisor.selection.decided_at == 0.5
    decisions = supervisor.selection.decisions
    supervisor.reset()                                   # the node's reset at a window: nothing pending, count kept
    assert not supervisor.selection.pending and supervisor.selected == 0 and supervisor.selection.decisions == decisions


def proxy_with_two_phases():
    """``acrobot_dither_select.yaml`` with two dither phases, its bank the proxy run's two relatives alone and a 0.1 s
    lead (the shipped file's selection before the nominal candidates joined it): three candidates."""
    shipped = load_robot_config(REPO / "config" / "acrobot_dither_select.yaml")
    bank = str((REPO / "policies" / "acrobot_hardware_proxy_bank").resolve())
    return dataclasses.replace(shipped, selection=dataclasses.replace(shipped.selection, dither_phases=2, bank=bank,
                                                                      lead=0.1))


def test_the_dither_phase_is_chosen_with_the_candidate():
    """``selection.dither_phases``: each candidate is simulated once per starting phase of the balance dither, the
    best (candidate, phase) pair runs, and the live shake then carries that phase (a square wave half a period on:
    the first push the other way)."""
    config = proxy_with_two_phases()
    policy = load_policy(REPO / "policies" / "acrobot_hardware_proxy.npz")
    half = 0.5 / config.dither.frequency                                      # s: 62.5 ms at 8 Hz
    supervisor = build_controller(config, policy)
    x = np.array([np.pi - 0.3, 0.5, 1.0, -1.0])               # rising through the top: the LQR takes over soon
    supervisor.step(x, 0.0)
    selection = supervisor.selection
    choice = selection.finish()
    options = selection.last_options
    assert options == [(index, offset) for index in range(3) for offset in (0.0, half)]
    values = dict(zip(options, selection.last_values))
    assert any(values[(i, 0.0)] != values[(i, half)] for i in range(3))      # the phase changes the prediction
    best = max(options, key=values.get)
    assert choice == (best if values[best] > values[(0, 0.0)] + config.selection.margin else (0, 0.0))
    # The live shake carries the chosen phase: in the band at the goal (LQR 0 N m), 1 ms after the LQR took over.
    plain, shifted = (build_controller(load_robot_config(REPO / "config" / "acrobot_dither.yaml"), policy)
                      for _ in range(2))
    shifted.use_dither_offset(half)
    goal = np.array([np.pi, 0.0, 0.0, 0.0])
    for supervisor in (plain, shifted):
        supervisor.step(goal, 0.0)
    u_plain, u_shifted = plain.step(goal, 0.002), shifted.step(goal, 0.002)
    assert plain.mode == shifted.mode == "lqr"
    assert u_plain[1] == config.dither.amplitude and u_shifted[1] == -config.dither.amplitude
    assert u_plain[0] == u_shifted[0] == 0.0                                  # the passive shoulder: exactly 0
    shifted.reset()
    assert shifted.dither_offset == 0.0


def test_the_dither_phase_alone_needs_no_bank(tmp_path):
    """``dither_phases`` > 1 turns the selection on without a bank: one policy, the shake's phase chosen for it."""
    path = tmp_path / "acrobot_phase.yaml"
    data = yaml.safe_load((REPO / "config" / "acrobot_dither_select.yaml").read_text())
    settings = data["/**"]["ros__parameters"]
    settings["plant_models_file"] = str(REPO / "config" / "plant_models.yaml")
    settings["selection"] = {"dither_phases": 2, "step": 0.004, "lead": 0.1}
    path.write_text(yaml.safe_dump(data))
    config = load_robot_config(path)
    assert config.selection.enabled and config.selection.bank == "" and load_bank(config) == []
    supervisor = build_controller(config, load_policy(REPO / "policies" / "acrobot_hardware_proxy.npz"))
    supervisor.step(np.array([np.pi - 0.3, 0.5, 1.0, -1.0]), 0.0)
    assert supervisor.selection.pending
    supervisor.selection.finish()
    assert supervisor.selection.last_options == [(0, 0.0), (0, 0.5 / config.dither.frequency)]
    settings["selection"]["dither_phases"] = 1                       # one policy, one phase: off
    path.write_text(yaml.safe_dump(data))
    assert not load_robot_config(path).selection.enabled


def banked(tmp_path: Path, policies: dict[str, Path], **settings) -> Path:
    """The shipped acrobot config with a selection whose bank holds ``policies`` (name -> file)."""
    bank = tmp_path / "bank"
    bank.mkdir(exist_ok=True)
    for name, path in policies.items():
        shutil.copy(path, bank / f"{name}.npz")
    return robot_file(tmp_path, "acrobot", "selection", bank=str(bank), **settings)


def test_decisions_come_every_interval_while_a_policy_is_in_charge_and_never_while_the_lqr_is(tmp_path):
    limp_file = limp(tmp_path / "limp.npz")
    other = load_policy(limp_file)                       # limp too, with other parameters (the bank drops equal ones)
    save_policy(dataclasses.replace(other, centers=other.centers + 0.01), tmp_path / "other.npz")
    config = load_robot_config(banked(tmp_path, {"other": tmp_path / "other.npz"}, lead=0.04, interval=0.5))
    supervisor = build_controller(config, load_policy(limp_file))
    for k in range(1501):                                # 3 s at rest: the limp policy in charge throughout
        supervisor.step(np.zeros(4), k * config.control_period)
        assert supervisor.mode == "policy"
    assert supervisor.selection.decisions == 7 and supervisor.selection.decided_at == pytest.approx(3.0)
    goal = np.array([np.pi, 0.0, 0.0, 0.0])
    for k in range(1501, 2001):                          # 1 s balancing, no gap: the LQR in charge, no decision
        supervisor.step(goal, k * config.control_period)
        assert supervisor.mode == "lqr"
    assert supervisor.selection.decisions == 7


def test_a_gap_hands_the_robot_back_to_the_loaded_policy_at_once(tmp_path):
    config = load_robot_config(selecting(tmp_path, lead=0.04, interval=0.5))
    _, supervisor, selected = run(config, load_policy(limp(tmp_path / "limp.npz")), 0.2)
    assert selected[-1] == 1                              # the bank's policy was chosen
    supervisor.step(np.zeros(4), 5.0)                     # the states resume after a window
    assert supervisor.selected == 0 and supervisor.selection.pending


def test_an_equal_candidate_does_not_replace_the_running_one(tmp_path):
    """A candidate replaces the running one only if it beats the running one's own value by the margin (not
    candidate 0's)."""
    limp_policy = load_policy(limp(tmp_path / "limp.npz"))
    config = load_robot_config(banked(tmp_path, {"a": SHIPPED, "b": SHIPPED}, lead=0.02))
    supervisor = build_controller(config, limp_policy)
    selection = supervisor.selection
    shipped = load_policy(SHIPPED)
    selection.start(supervisor.capture_state(), np.zeros(4), 0.0, [limp_policy, shipped, shipped], (2, 0.0))
    assert selection.finish() == (2, 0.0)
    values = selection.last_values
    assert values[1] == values[2] > values[0] + config.selection.margin


def test_a_decisions_values_are_each_candidates_run_from_the_state_predicted_at_the_due_time(tmp_path):
    """By hand, on the config's plant with a supervisor of the same config: the running policy from the measured
    state and the live supervisor's state over the lead, then each candidate from that predicted state and
    supervisor state for the horizon, the time above the line counted. Taken at a decision made on the policy's
    running 20 ms grid, with the candidate that reaches the LQR first (its successors must not inherit that)."""
    limp_file = limp(tmp_path / "limp.npz")
    config = load_robot_config(banked(tmp_path, {"limp": limp_file}, lead=0.1, interval=0.3, horizon=1.5))
    shipped = load_policy(SHIPPED)
    supervisor = build_controller(config, shipped)
    robot = load_robot_profile("nominal").robot(config, 0)
    for k in range(2000):
        x, t = robot.measurement(), k * config.control_period
        before = supervisor.capture_state()
        robot.step(supervisor.step(x, t))
        if supervisor.selection.decisions == 2:
            break
    assert supervisor.selection.decided_at == t and before[0] == "policy"
    supervisor.selection.finish()

    shadow = build_controller(dataclasses.replace(config, selection=dataclasses.replace(config.selection, bank="")))
    plant, dt = DoublePendulum(config.plant), config.selection.step
    limits = config.torque_limits

    def up_time(x: tuple, t0: float, seconds: float) -> tuple[tuple, float]:
        up = 0
        for j in range(round(seconds / dt)):
            u = shadow.step(np.array(x), t0 + j * dt)
            x = plant.rk4_step_scalar(x, tuple(float(np.clip(u[i], -limits[i], limits[i])) for i in range(2)), dt)
            up += bool(plant.end_effector_height(np.array(x)) > plant.height_threshold)
        return x, up * dt

    shadow.restore_state(before)
    x_due, _ = up_time(tuple(float(v) for v in x), t, config.selection.lead)
    due = shadow.capture_state()
    values = []
    for candidate in (shipped, load_policy(limp_file)):
        shadow.restore_state(due)
        shadow.use_policy(candidate)
        values.append(up_time(x_due, t + config.selection.lead, config.selection.horizon)[1])
    assert supervisor.selection.last_values == pytest.approx(values, abs=1e-12)
    assert values[0] > 0.0


def test_the_chosen_dither_phase_runs_from_the_due_time():
    """The live supervisor takes the decision's whole option at the due time: its candidate and its shake's phase."""
    config = proxy_with_two_phases()
    policy = load_policy(REPO / "policies" / "acrobot_hardware_proxy.npz")
    x = np.array([np.pi - 0.4, 0.6, 1.5, -1.0])
    probe = build_controller(config, policy)
    probe.step(x, 0.0)
    choice = probe.selection.finish()
    assert choice[1] == 0.5 / config.dither.frequency              # from this state: the shake half a period on
    supervisor = build_controller(config, policy)
    lead = round(config.selection.lead / config.control_period)
    for k in range(lead + 1):
        supervisor.step(x, k * config.control_period)
        assert supervisor.dither_offset == (choice[1] if k == lead else 0.0), k
    assert supervisor.selected == choice[0]



def spied_decision(tmp_path: Path):
    """The second decision of a supervisor (the shipped policy loaded, the limp one banked), made between two ticks
    of the running policy's 20 ms grid, the live supervisor driven on the selection's own plant (RK4 at its step,
    the control period): the model is the robot. Returns (config, the live steps [(x, t)] over the decision's lead,
    the live supervisor's state at its due time, the shadow's steps [(x, t, its state before the step)] for it)."""
    config = load_robot_config(banked(tmp_path, {"limp": limp(tmp_path / "limp.npz")}, lead=0.1, horizon=0.2,
                                      interval=0.31))
    assert config.selection.step == config.control_period
    supervisor = build_controller(config, load_policy(SHIPPED))
    selection, shadow = supervisor.selection, supervisor.selection.shadow
    shadow_steps, real_step = [], shadow.step

    def spied(x, t):
        shadow_steps.append((np.array(x), t, shadow.capture_state()))
        return real_step(x, t)

    shadow.step = spied
    plant, dt, limits = DoublePendulum(config.plant), config.selection.step, config.torque_limits
    lead = round(config.selection.lead / dt)
    x, live = (0.3, -0.2, 0.5, 0.0), []
    for k in range(1000):
        if selection.decisions == 2:
            live.append((np.array(x), k * dt))
        u = supervisor.step(np.array(x), k * dt)
        if selection.decisions == 2 and not live:                # this step started it
            assert supervisor.mode == "policy" and selection.decided_at == pytest.approx(0.31)
            live.append((np.array(x), k * dt))
            shadow_steps.clear()                                    # the first decision's
        x = plant.rk4_step_scalar(x, tuple(float(np.clip(u[i], -limits[i], limits[i])) for i in range(2)), dt)
        if len(live) == lead:
            break
    at_due = supervisor.capture_state()
    assert not shadow_steps                                     # nothing advanced the decision yet
    selection.finish()
    return config, live, at_due, shadow_steps


def test_the_lead_is_simulated_on_the_live_supervisors_time_base(tmp_path):
    """Kills mutation S16 (the simulations stepped the shadow one step late, t + (k + 1) dt): over the lead the shadow
    is stepped with the times and states the live supervisor meets on a robot that is the model (the running
    policy's 20 ms grid ticks at the same states), and each candidate from the due time on."""
    config, live, _, shadow_steps = spied_decision(tmp_path)
    lead, dt = len(live), config.selection.step
    horizon = round(config.selection.horizon / dt)
    assert len(shadow_steps) == lead + 2 * horizon
    for (x, t), (x_shadow, t_shadow, _) in zip(live, shadow_steps[:lead]):
        np.testing.assert_allclose(x_shadow, x, rtol=0, atol=1e-12)
        assert t_shadow == pytest.approx(t, abs=1e-12)
    for i in range(2):                                          # each candidate: from the due time, step by step
        times = [t for _, t, _ in shadow_steps[lead + i * horizon: lead + (i + 1) * horizon]]
        np.testing.assert_allclose(times, live[0][1] + lead * dt + dt * np.arange(horizon), rtol=0, atol=1e-12)


def test_every_candidate_starts_from_the_supervisor_state_at_the_due_time(tmp_path):
    """Kills mutation S14 (a candidate's simulation inherited the supervisor state the previous candidate's left): each
    candidate's first step starts from the state the live supervisor has at the due time (mode, hysteresis flags,
    held torque, LQR start), with its own policy on a fresh 20 ms grid and the configured dither phase."""
    config, live, at_due, shadow_steps = spied_decision(tmp_path)
    lead, horizon = len(live), round(config.selection.horizon / config.selection.step)
    candidates = [load_policy(SHIPPED), load_policy(tmp_path / "limp.npz")]
    for i, candidate in enumerate(candidates):
        mode, damping, in_lqr, lqr_locked, held_u, next_tick, lqr_since, policy, dither_offset = \
            shadow_steps[lead + i * horizon][2]
        assert (mode, damping, in_lqr, lqr_locked, held_u) == at_due[:5] and next_tick == -np.inf
        assert dither_offset == 0.0
        assert lqr_since == at_due[6] or (np.isnan(lqr_since) and np.isnan(at_due[6]))
        np.testing.assert_array_equal(policy.weights, candidate.weights)


def test_with_a_delay_the_simulations_supervisor_sees_the_state_int_delay_over_step_steps_old(tmp_path):
    """``selection.delay``: as on the robot (the profile's int(delay / dt)), the simulated supervisor is fed the
    model's state that many steps old, the start state until the simulation has one that old; 0 = the exact state."""
    for delay, steps_old in ((0.0, 0), (0.005, 2), (0.008, 4)):
        config = load_robot_config(selecting(tmp_path, delay=delay, step=0.002, lead=0.02))
        fed: list[np.ndarray] = []

        def record(x, t, fed=fed):
            fed.append(np.array(x))
            return np.zeros(2)

        shadow = SimpleNamespace(config=config, step=record)
        plant = DoublePendulum(config.plant)
        selection = PolicySelection(shadow, plant, config.selection, config.control_period, config.torque_limits)
        assert selection.delay_steps == steps_old
        x0 = (2.5, 0.3, 1.0, -2.0)
        rollout = selection._rollout(x0, 0.0, 10)
        for _ in rollout:
            pass
        true = [x0]
        for _ in range(10):
            true.append(plant.rk4_step_scalar(true[-1], (0.0, 0.0), 0.002))
        expected = [true[max(0, k - steps_old)] for k in range(10)]
        np.testing.assert_allclose(np.array(fed), np.array(expected), rtol=0, atol=1e-12)


class RecordingShadow:
    """A stand-in supervisor for the selection's simulations: records what it is fed, answers a fixed torque."""

    def __init__(self, config, torque: float) -> None:
        self.config, self.torque, self.fed = config, torque, []

    def step(self, x, t):
        self.fed.append(np.array(x))
        u = np.zeros(2)
        u[self.config.actuated_joint] = self.torque
        return u

    def restore_state(self, state) -> None:
        pass

    def capture_state(self) -> tuple:
        return ()

    def use_policy(self, policy) -> None:
        pass

    def use_dither_offset(self, offset: float) -> None:
        pass


def test_with_predict_delay_the_model_catches_up_with_the_robot_over_the_delay_and_is_seen_that_late(tmp_path):
    """``selection.predict_delay``: the measured state is the robot's ``delay_steps`` steps ago, so the lead first
    steps the model over them with the last command held (clipped to the limits; the passive joint's 0), feeding the
    simulated supervisor the measured state, then the caught-up ones, each ``delay_steps`` late; every candidate's
    simulation then goes on from where the lead's readings left off. Off: the measured state is taken for the
    present one (the lead starts from it, its supervisor sees it until the model has a state that old)."""
    x0, command = (2.5, 0.3, 1.0, -2.0), (0.7, 9.0)                 # 9 N m: over the limit, clipped to 6
    for predict in (False, True):
        config = load_robot_config(selecting(tmp_path, delay=0.004, step=0.002, lead=0.02, predict_delay=predict))
        shadow = RecordingShadow(config, torque=1.5)
        plant = DoublePendulum(config.plant)
        selection = PolicySelection(shadow, plant, config.selection, config.control_period, config.torque_limits)
        lead, steps_old = selection.lead_steps, selection.delay_steps
        assert steps_old == 2 and lead == 10
        lead_run = selection._lead((), x0, 0.0, command)
        due = _drain(lead_run)
        held, answered = (0.0, 6.0), (0.0, 1.5)             # the acrobot: the elbow acts, the shoulder gets 0
        model = [x0]
        for _ in range(steps_old if predict else 0):
            model.append(plant.rk4_step_scalar(model[-1], held, 0.002))
        start = len(model) - 1                                # the model's state now: the lead starts there
        for _ in range(lead):
            model.append(plant.rk4_step_scalar(model[-1], answered, 0.002))
        expected = [model[max(0, start + k - steps_old)] if predict else model[max(0, k - steps_old)]
                    for k in range(lead)]
        np.testing.assert_allclose(np.array(shadow.fed), np.array(expected), rtol=0, atol=1e-12)
        np.testing.assert_allclose(due[0], model[-1], rtol=0, atol=1e-12)
        if predict:
            assert len(due[3]) == steps_old + 1
            np.testing.assert_allclose(np.array(due[3]), np.array(model[-steps_old - 1:]), rtol=0, atol=1e-12)
        else:
            assert due[3] is None
        shadow.fed.clear()                                    # a candidate from the due time: its first readings
        _drain(selection._simulate(due, [None], (0, 0.0)))
        first = model[-steps_old - 1] if predict else model[-1]
        np.testing.assert_allclose(shadow.fed[0], first, rtol=0, atol=1e-12)


def _drain(generator):
    while True:
        try:
            next(generator)
        except StopIteration as stop:
            return stop.value


def late_model_profile(tmp_path: Path) -> Path:
    """A robot profile that is the robot config's own plant with 4 ms late sensors and nothing else."""
    profile = tmp_path / "late.yaml"
    profile.write_text(yaml.safe_dump({"description": "the model, 4 ms late sensors", "plant_model": "robot",
                                       "measurement_noise": [0.0, 0.0, 0.0, 0.0], "delay": 0.004,
                                       "motor_responsiveness": 1.0, "torque_noise": {"actuated": 0.0, "passive": 0.0},
                                       "perturbation": 0.0, "seed": 0}))
    return profile


def test_with_predict_delay_the_decisions_start_from_the_robots_state_at_the_due_time(tmp_path):
    """On a robot that is the model but whose sensors are 4 ms late, the state every candidate starts from is the
    robot's true state at the due time only with ``predict_delay`` (off, it is the state 4 ms before)."""
    profile = late_model_profile(tmp_path)
    errors = {}
    for predict in (False, True):
        config = load_robot_config(selecting(tmp_path, delay=0.004, step=0.002, lead=0.02, interval=0.1, horizon=0.5,
                                             predict_delay=predict))
        supervisor = build_controller(config, load_policy(limp(tmp_path / "limp.npz")))   # the shipped one banked
        starts = []
        lead = supervisor.selection._lead

        def spied(state, x, t, command=(0.0, 0.0), lead=lead, starts=starts):
            due = yield from lead(state, x, t, command)
            starts.append((due[1], np.array(due[0])))
            return due

        supervisor.selection._lead = spied
        robot = load_robot_profile(str(profile)).robot(config, 0, (0.5, 0.0, 0.0, 0.0))
        trajectory = drive(robot, supervisor, 1000, True, 2.0)
        assert len(starts) >= 10
        gaps = [np.abs(x_due - trajectory.x[int(round(t_due / 0.002))]).max() for t_due, x_due in starts]
        errors[predict] = float(np.median(gaps))
    assert errors[True] < 0.2 * errors[False]
    assert errors[True] < 1e-3


def test_a_noisy_simulation_adds_its_noise_to_what_the_supervisor_sees_and_to_the_actuated_torque(tmp_path):
    """The finalists' noisy simulations (``noise_samples``): the sensors' noise on the (delayed) state the simulated
    supervisor is fed, the torque noise on the actuated joint's command before the limits; the passive joint keeps
    exactly 0."""
    config = load_robot_config(selecting(tmp_path, delay=0.004, step=0.002, lead=0.02))
    fed: list[np.ndarray] = []

    def record(x, t):
        fed.append(np.array(x))
        return np.array([0.0, 0.5])

    selection = PolicySelection(SimpleNamespace(config=config, step=record), DoublePendulum(config.plant),
                                config.selection, config.control_period, config.torque_limits)
    rng = np.random.default_rng(3)
    noise = (rng.standard_normal((10, 4)) * 0.1, rng.standard_normal(10) * 0.2)
    noise[1][4] = 100.0                                           # far beyond the limit: clipped to it
    rollout = selection._rollout((2.5, 0.3, 1.0, -2.0), 0.0, 10, noise)
    for _ in rollout:
        pass
    plant, true = DoublePendulum(config.plant), [(2.5, 0.3, 1.0, -2.0)]
    for k in range(10):
        elbow = min(max(0.5 + noise[1][k], -config.torque_limit), config.torque_limit)
        true.append(plant.rk4_step_scalar(true[-1], (0.0, elbow), 0.002))
    expected = [np.array(true[max(0, k - 2)]) + noise[0][k] for k in range(10)]
    np.testing.assert_allclose(np.array(fed), np.array(expected), rtol=0, atol=1e-12)


def noisy_decision(tmp_path: Path, **settings):
    """One decision on the way up with the limp policy loaded and the shipped one banked; returns the selection and the
    noise each of its noisy simulations got [(option, measurement noise, torque noise)]."""
    config = load_robot_config(selecting(tmp_path, lead=0.02, horizon=1.0, step=0.004, **settings))
    supervisor = build_controller(config, load_policy(limp(tmp_path / "limp.npz")))
    selection, seen = supervisor.selection, []
    rollout = selection._rollout

    def spied(x, t, steps, noise=None, readings=None, **resume):
        if noise is not None:
            seen.append((supervisor.selection.shadow._policy, noise[0].copy(), noise[1].copy()))
        return (yield from rollout(x, t, steps, noise, readings, **resume))

    selection._rollout = spied
    supervisor.step(np.array([2.0, 0.5, 4.0, 0.0]), 0.0)                # on the way up: the shipped policy gets over
    selection.finish()
    return selection, seen


def test_the_finalists_are_the_best_noise_free_options_and_the_running_one_valued_by_their_noisy_mean(tmp_path):
    """With noise stds of 0 the noisy simulations repeat the noise-free ones: the finalists' values are then the
    noise-free values of the ``finalists`` best options, the running one added (here the limp policy, last)."""
    plain, _ = noisy_decision(tmp_path)
    assert plain.last_options == [(0, 0.0), (1, 0.0)] and plain.last_values[1] > plain.last_values[0]
    quiet, seen = noisy_decision(tmp_path, noise_samples=3, finalists=1)
    assert quiet.last_options == [(1, 0.0), (0, 0.0)]                 # the best, then the running one
    assert quiet.last_values == pytest.approx(plain.last_values[::-1], abs=1e-12)
    assert len(seen) == 2 * 3


def test_noisy_finalists_share_each_samples_noise_and_a_decision_repeats_its_numbers(tmp_path):
    """Common random numbers: sample j's noise is the same for every finalist, other samples get other noise, drawn
    with the configured stds; the same decision gives the same numbers again."""
    settings = dict(noise_samples=3, finalists=1, measurement_noise=[0.01, 0.02, 0.5, 0.25], torque_noise=0.3)
    first, seen = noisy_decision(tmp_path, **settings)
    again, _ = noisy_decision(tmp_path, **settings)
    assert first.last_values == again.last_values
    assert len(seen) == 2 * 3
    for j in range(3):
        np.testing.assert_array_equal(seen[j][1], seen[3 + j][1])
        np.testing.assert_array_equal(seen[j][2], seen[3 + j][2])
    assert not np.array_equal(seen[0][1], seen[1][1])
    pooled = np.concatenate([noise for _, noise, _ in seen[:3]])
    np.testing.assert_allclose(pooled.std(axis=0), [0.01, 0.02, 0.5, 0.25], rtol=0.15)
    assert np.concatenate([tn for _, _, tn in seen[:3]]).std() == pytest.approx(0.3, rel=0.15)


# ---------------------------------------------------------------- the decisions in worker processes (selection.workers)
@pytest.mark.parametrize("noisy", [{}, {"noise_samples": 2, "finalists": 1, "torque_noise": 0.02,
                                          "measurement_noise": [0.0, 0.0, 0.05, 0.05]},
                                   {"delay": 0.004, "predict_delay": True}],
                         ids=["plain", "noisy_finals", "predict_delay"])
def test_decisions_computed_in_worker_processes_are_the_in_loop_ones_bit_for_bit(tmp_path, noisy):
    """Two workers split each round of simulations (the options', then the noisy finalists'); waited for when due,
    the run is the in-loop one to the last bit: the same choices, values and torques."""
    config = load_robot_config(selecting(tmp_path, lead=0.04, interval=0.5, step=0.004, **noisy))
    loaded = load_policy(limp(tmp_path / "limp.npz"))
    plain, in_loop, chosen = run(config, loaded, 3.0, finish_steps=True)
    remote, supervisor, chosen_remote = run(config, loaded, 3.0, finish_steps=True, workers=2)
    np.testing.assert_array_equal(plain.u, remote.u)
    np.testing.assert_array_equal(chosen, chosen_remote)
    assert np.any(chosen == 1)                                    # a decision switched to the bank's policy
    selection = supervisor.selection
    assert selection.decisions == in_loop.selection.decisions >= 3
    assert selection.last_options == in_loop.selection.last_options
    assert selection.last_values == in_loop.selection.last_values
    assert selection.late_decisions == 0 and not selection.failure
    assert selection.worker_count == 0                            # run() closed them
    assert np.all(remote.u[:, 0] == 0.0)


def started_decision(tmp_path: Path, workers: int, wait: bool, **settings):
    """A supervisor with the limp policy loaded and the shipped one banked, its decisions in ``workers`` processes,
    and one decision started on the way up (the first state starts one)."""
    config = load_robot_config(selecting(tmp_path, lead=0.02, horizon=2.0, step=0.004, **settings))
    supervisor = build_controller(config, load_policy(limp(tmp_path / "limp.npz")))
    supervisor.start_selection_workers(workers, wait=wait)
    supervisor.step(np.array([2.0, 0.5, 4.0, 0.0]), 0.0)
    assert supervisor.selection.pending
    return supervisor


def wait_until(condition, seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_in_real_time_a_decision_not_ready_when_due_is_dropped_and_none_starts_while_the_workers_are_busy(tmp_path):
    """A real-time caller never waits: the decision asked for at once is dropped (the running, limp, policy goes on),
    the next one is skipped while the worker is still on the dropped one, and once it is done decisions come again
    and are applied."""
    supervisor = started_decision(tmp_path, 1, wait=False)
    selection = supervisor.selection
    try:
        assert not selection.ready
        assert selection.finish() == (0, 0.0) and selection.late_decisions == 1 and not selection.pending
        selection.start(supervisor.capture_state(), np.array([2.0, 0.5, 4.0, 0.0]), 0.01, supervisor._candidates,
                        (0, 0.0))
        assert not selection.pending and selection.late_decisions == 2 and selection.decisions == 1
        time.sleep(0.5)
        supervisor.step(np.array([2.0, 0.5, 4.0, 0.0]), 10.0)          # after a gap: a new decision starts
        assert selection.pending and selection.decisions == 2
        wait_until(lambda: (supervisor.finish_step(), selection.ready)[1])
        assert selection.finish() == (1, 0.0) and selection.late_decisions == 2 and not selection.failure
    finally:
        supervisor.close()


def test_a_worker_that_is_gone_ends_the_decisions_and_the_running_policy_goes_on(tmp_path):
    """A worker process killed mid-run: no exception reaches the control loop, ``failure`` says what happened, the
    workers are stopped, no decision starts again, and the torques go on (the passive joint's exactly 0)."""
    config = load_robot_config(selecting(tmp_path, lead=0.02, interval=0.3, horizon=1.0, step=0.004))
    supervisor = build_controller(config, load_policy(limp(tmp_path / "limp.npz")))
    supervisor.start_selection_workers(1, wait=True)
    selection = supervisor.selection
    process = selection._workers._processes[0]
    process.kill()
    process.join(5.0)
    robot = load_robot_profile("nominal").robot(config, 0)
    traj = drive(robot, supervisor, 500)
    assert "gone" in selection.failure and selection.worker_count == 0
    assert selection.decisions <= 1 and not selection.pending
    assert np.all(traj.u[:, 0] == 0.0) and np.all(np.isfinite(traj.u))
    supervisor.close()


def test_workers_are_started_only_for_a_selection_and_stopped_by_close(tmp_path):
    plain = build_controller(load_robot_config(REPO / "config" / "acrobot.yaml"), load_policy(SHIPPED))
    assert plain.start_selection_workers(2) == 0
    config = load_robot_config(selecting(tmp_path, workers=2))
    supervisor = build_controller(config, load_policy(SHIPPED))
    assert supervisor.selection.worker_count == 0              # none unless asked: the evaluator computes in-loop
    assert supervisor.start_selection_workers() == 2           # the config's count
    processes = list(supervisor.selection._workers._processes)
    assert all(p.is_alive() for p in processes)
    own = os.getpriority(os.PRIO_PROCESS, 0)                       # the loop first where they share a core
    assert all(os.getpriority(os.PRIO_PROCESS, p.pid) == min(19, own + NICENESS) for p in processes)
    supervisor.close()
    assert supervisor.selection.worker_count == 0 and not any(p.is_alive() for p in processes)


def test_after_a_reload_the_workers_simulate_the_new_loaded_policy_sent_alone(tmp_path):
    """``set_policy`` (the node's hot reload) sends the workers only the new candidate 0 (a small message, which the
    pipe takes without waiting for a busy worker); the next decision's values are the in-loop ones with it."""
    config = load_robot_config(selecting(tmp_path, lead=0.02, horizon=1.0, step=0.004))
    x = np.array([2.0, 0.5, 4.0, 0.0])
    values, sent = {}, []
    for workers in (0, 2):
        supervisor = build_controller(config, load_policy(limp(tmp_path / "limp.npz")))
        supervisor.start_selection_workers(workers, wait=True)
        selection = supervisor.selection
        if workers:
            send_all = selection._workers._send_all
            selection._workers._send_all = lambda message, send_all=send_all: (sent.append(message[:2]),
                                                                                send_all(message))
        supervisor.step(x, 0.0)
        selection.finish()
        before = list(selection.last_values)
        supervisor.set_policy(load_policy(SHIPPED))                   # the shipped one, loaded again: candidate 0
        supervisor.step(x, 10.0)                                      # after a gap: a new decision
        selection.finish()
        values[workers] = (before, list(selection.last_values))
        supervisor.close()
    assert values[2] == values[0] and values[0][1] != values[0][0]
    assert values[0][1][0] == pytest.approx(values[0][1][1])          # candidate 0 is now the bank's policy
    assert sent == [("candidate", 0)]


# ---------------------------------------------------------------- a candidate's dither phases share their simulation
def whole_simulation(selection, due, candidates, option, noise=None) -> float:
    """An option's simulation from ``due`` computed whole, without the shared prefix (the reference)."""
    x_due, t_due, state_due, readings = due
    selection.shadow.restore_state(state_due)
    selection.shadow.use_policy(candidates[option[0]])
    selection.shadow.use_dither_offset(option[1])
    seen = deque(readings, maxlen=selection.delay_steps + 1) if readings is not None else None
    _, up = _drain(selection._rollout(x_due, t_due, selection.horizon_steps, noise, seen))
    return selection._value(up)


def phases_with_noisy_finals():
    """Three candidates in two dither phases each, four finalists valued on two noisy samples."""
    config = proxy_with_two_phases()
    return dataclasses.replace(config, selection=dataclasses.replace(
        config.selection, noise_samples=2, finalists=4, measurement_noise=(0.0001, 0.0001, 0.05, 0.05),
        torque_noise=0.02))


def test_a_candidates_dither_phases_share_their_simulation_up_to_the_first_shake_to_the_last_bit():
    """The options of one candidate that differ only in the dither's phase are one simulation until the dither first
    shapes a torque: the second phase goes on from there, or takes the first's value when the LQR never took over.
    Every value, noise-free and noisy, is the whole simulation's to the last bit, and both shortcuts happen."""
    config = phases_with_noisy_finals()
    supervisor = build_controller(config, load_policy(REPO / "policies" / "acrobot_hardware_proxy.npz"))
    selection = supervisor.selection
    simulate, kinds = selection._simulate, []

    def checked(due, candidates, option, noise=None, sample=None):
        branch = selection._branches.get((option[0], sample))
        value = yield from simulate(due, candidates, option, noise, sample)
        kinds.append("whole" if branch is None else "copied" if branch[0] is None else "resumed")
        assert value == whole_simulation(selection, due, candidates, option, noise)
        return value

    selection._simulate = checked
    for t, x in enumerate(([np.pi - 0.3, 0.5, 1.0, -1.0], [0.4, -0.2, 0.0, 0.0], [2.2, 0.4, 3.0, -1.0])):
        supervisor.step(np.array(x), 10.0 * t)                 # a new time base: each state starts a decision
        selection.finish()
    assert kinds.count("resumed") > 0 and kinds.count("copied") > 0
    assert kinds.count("whole") == kinds.count("resumed") + kinds.count("copied")   # each candidate once whole


def test_the_workers_get_a_candidates_phases_together_and_deal_the_candidates_round_robin():
    options = [(index, offset) for index in range(3) for offset in (0.0, 0.07)]
    shares = split_tasks(list(enumerate(options)), 2)
    assert shares == [[(0, (0, 0.0)), (1, (0, 0.07)), (4, (2, 0.0)), (5, (2, 0.07))],
                      [(2, (1, 0.0)), (3, (1, 0.07))]]
    noisy = [(k, option, j) for k, option in enumerate([(1, 0.0), (1, 0.07), (0, 0.0)]) for j in range(2)]
    shares = split_tasks(noisy, 2)                             # groups (candidate, sample): (1,0), (1,1), (0,0), (0,1)
    assert shares == [[(0, (1, 0.0), 0), (1, (1, 0.07), 0), (2, (0, 0.0), 0)],
                      [(0, (1, 0.0), 1), (1, (1, 0.07), 1), (2, (0, 0.0), 1)]]
    assert split_tasks(noisy, 8)[4:] == [[], [], [], []]


def test_with_dither_phases_and_noisy_finals_the_workers_give_the_in_loop_run_bit_for_bit():
    config = phases_with_noisy_finals()
    policy = load_policy(REPO / "policies" / "acrobot_hardware_proxy.npz")
    plain, in_loop, chosen = run(config, policy, 3.0, finish_steps=True, profile="hardware_proxy")
    remote, supervisor, chosen_remote = run(config, policy, 3.0, finish_steps=True, profile="hardware_proxy",
                                            workers=2)
    np.testing.assert_array_equal(plain.u, remote.u)
    np.testing.assert_array_equal(chosen, chosen_remote)
    assert supervisor.selection.decisions == in_loop.selection.decisions >= 3
    assert supervisor.selection.last_values == in_loop.selection.last_values
    assert np.all(remote.u[:, 0] == 0.0)
