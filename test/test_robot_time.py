"""Robot time is counted (issue: the robot is not the model): every second the robot runs for learning is in
run.json and on the learning curve; scoring a policy for the report is not, and it feeds nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mcpilco_core.learning.learner import load_train_config
from mcpilco_core.learning.runs import train

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "config" / "train_tiny.yaml"

pytestmark = pytest.mark.timeout(180)


def test_robot_time_adds_up_over_a_tiny_run_and_reports_feed_nothing(tmp_path):
    settings = tmp_path / "train.yaml"
    settings.write_text(f"base: {TINY}\ntrials: 3\nevaluation: {{seeds: [100]}}\n"
                        "initial_state: {disturbance_fraction: 0.5, disturbance_from_trial: 1,\n"
                        "                disturbance_seeds: [1000, 1001], pool_seeds_per_trial: 1}\n")
    config = load_train_config(settings)
    records = train(config, tmp_path / "run")
    expected = [config.exploration_duration] + [config.trial_duration] * (config.trials - 1)
    assert [r.robot_time for r in records] == pytest.approx(expected, abs=1e-9)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["robot_time_s"]["per_trial"] == pytest.approx(expected, abs=1e-9)
    assert meta["robot_time_s"]["total"] == pytest.approx(sum(expected), abs=1e-9)      # 2 + 1 + 1 s
    assert meta["robot_time_s"]["evaluation_seconds_reported"] == pytest.approx(60.0 * 2)
    for r in records[1:]:
        assert r.eval_scores.size == 1                                                  # reported ...
        assert len(r.disturbance_states) == 15                                          # one pool seed, on the model
        summary = json.loads((tmp_path / "run" / "trials" / f"trial_{r.index:03d}" / "summary.json").read_text())
        assert summary["robot_time_s"] == pytest.approx(config.trial_duration)
    # ... but the evaluation feeds nothing: without it the same run learns the same policies
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text(settings.read_text().replace("seeds: [100]", "seeds: []"))
    again = train(load_train_config(quiet), tmp_path / "run_quiet")
    for a, b in zip(records[1:], again[1:]):
        np.testing.assert_array_equal(a.policy.centers, b.policy.centers)
        np.testing.assert_array_equal(a.trajectory.x, b.trajectory.x)
        assert b.eval_scores.size == 0


def test_the_prior_model_is_named_by_the_training_config_and_the_controller_keeps_its_own(tmp_path):
    from mcpilco_core.control import build_controller
    from mcpilco_core.learning.learner import Learner

    settings = tmp_path / "train.yaml"
    settings.write_text(f"base: {TINY}\nprior_model: model_1.0\n")
    config = load_train_config(settings)
    nominal = load_train_config(TINY)
    assert config.model_robot.plant.name == "model_1.0" and config.model_robot.plant.cf == (0.16, 0.12)
    assert config.robot.fingerprint() == nominal.robot.fingerprint()  # the controller's config is untouched
    assert Learner(config).model.plant.params.name == "model_1.0"      # the GP's prior mean
    assert Learner(nominal).model.plant.params.name == "model_1.1"     # default: the robot config's plant
    np.testing.assert_array_equal(build_controller(config.robot).design.K, build_controller(nominal.robot).design.K)
    settings.write_text(f"base: {TINY}\nprior_model: model_9\n")
    with pytest.raises(Exception, match="model_9"):
        load_train_config(settings)


def test_the_prior_may_come_from_a_design_robots_plant_models_file_and_travels_with_the_run(tmp_path):
    """``prior_models_file`` (relative to the training file): the prior with links identified from trials
    (``mcpilco identify --mechanics --write``); the run keeps a copy and reloads the same prior from it."""
    from mcpilco_core.learning.retrain import resolved_train_config
    from mcpilco_core.learning.runs import PRIOR_MODELS_FILE, RunDirectory

    design = tmp_path / "design"
    design.mkdir()
    (design / "plant_models.yaml").write_text(
        "models:\n  my_links:\n    m: [0.5, 0.65]\n    l: [0.2, 0.3]\n    r: [0.19, 0.25]\n"
        "    I: [0.034, 0.051]\n    Ir: 5.0e-05\n    gr: 6.0\n    b: [0.001, 0.0007]\n"
        "    cf: [0.158, 0.12]\n    g: 9.81\n")
    settings = tmp_path / "train.yaml"
    settings.write_text(f"base: {TINY}\nprior_model: my_links\nprior_models_file: design/plant_models.yaml\n")
    config = load_train_config(settings)
    nominal = load_train_config(TINY)
    assert config.model_robot.plant.m == (0.5, 0.65) and config.model_robot.plant.cf == (0.158, 0.12)
    assert config.robot.fingerprint() == nominal.robot.fingerprint()      # the controller's config is untouched
    elsewhere = tmp_path / "retrain" / "train_config.yaml"     # a retrain's copy loads from its own directory
    elsewhere.parent.mkdir()
    elsewhere.write_text(resolved_train_config(config), encoding="utf-8")
    assert load_train_config(elsewhere).model_robot.plant == config.model_robot.plant
    run = RunDirectory(tmp_path / "run")
    run.create(config, resume=False)
    (design / "plant_models.yaml").unlink()                               # the run no longer needs the original
    assert (run.root / PRIOR_MODELS_FILE).is_file()
    assert run.load_config().model_robot.plant == config.model_robot.plant
    settings.write_text(f"base: {TINY}\nprior_models_file: design/plant_models.yaml\n")
    with pytest.raises(Exception, match="prior_models_file.*prior_model is not set"):
        load_train_config(settings)
    settings.write_text(f"base: {TINY}\nprior_model: my_links\nprior_models_file: design/nothing.yaml\n")
    with pytest.raises(Exception, match="prior_models_file.*no such plant-models file"):
        load_train_config(settings)


def test_a_disturbance_trial_torques_the_passive_joint_only_inside_its_window(pendubot_config):
    """The trial starts with the protocol's 0.2 s reset PID on both motors; outside it the passive joint gets
    exactly 0, inside both joints stay within the reset limit; the learner never sees the window."""
    from mcpilco_core.control import build_controller
    from mcpilco_core.learning.learner import recorded_trial, run_on_robot
    from mcpilco_core.simulation import MODE_CODES

    controller = build_controller(pendubot_config)           # LQR + damping; zero torque far from the top
    traj = run_on_robot(pendubot_config, controller, np.zeros(4), 1.0, "hardware_proxy", 3, np.array([2.5, -1.0]))
    reset = traj.mode == MODE_CODES["reset"]
    n = int(reset.sum())
    assert n == 100 and reset[:n].all()                      # RealAIGym's window: its 0.2 s from 0
    assert len(traj.u) == n + 500                            # the window, then the trial's 1.0 s
    assert np.all(traj.u[~reset, 1] == 0.0)                   # pendubot: the elbow is passive
    assert np.abs(traj.u[reset]).max() <= 6.0 and np.abs(traj.u[reset, 1]).max() > 0.5
    assert np.abs(traj.x[n, 2:]).max() > 3.0               # it handed over a fast state
    trial = recorded_trial(traj, pendubot_config)            # as its bag reads
    assert list(np.flatnonzero(~trial.valid)) == list(range(10)) and set(trial.mode[:10]) == {"reset"}
    assert list(np.flatnonzero(~trial.states.valid)) == list(range(n))    # at the state rate: the window's steps
    data = trial.transitions(pendubot_config.actuated_joint)
    assert len(data) == 50 and data.u_prev[0] == trial.u[9, 0] != 0.0   # the window's last 20 ms came before
    np.testing.assert_array_equal(data.x, traj.extras["x_measured"][n:-1:10])   # what the sensors reported
    np.testing.assert_array_equal(trial.handed_over_states(), traj.extras["x_measured"][[n]])
    assert not np.array_equal(data.x, traj.x[n:-1:10])                         # (noisy, delayed: not the truth)


def test_the_prior_and_the_controller_do_not_change_when_the_robot_does(tmp_path):
    from mcpilco_core.control import build_controller
    from mcpilco_core.learning.learner import Learner

    proxy = load_train_config(TINY, robot_profile="hardware_proxy")
    nominal = load_train_config(TINY)
    assert proxy.robot_profile == "hardware_proxy" and nominal.robot_profile == "nominal"
    assert Learner(proxy).model.plant.params == Learner(nominal).model.plant.params       # model_1.1 prior
    assert proxy.robot.fingerprint() == nominal.robot.fingerprint()
    np.testing.assert_array_equal(build_controller(proxy.robot).design.S, build_controller(nominal.robot).design.S)
    with pytest.raises(Exception, match="no_such_robot"):
        load_train_config(TINY, robot_profile="no_such_robot")


def test_a_tiny_run_on_the_proxy_learns_from_what_its_sensors_measured(tmp_path):
    from mcpilco_core.learning.runs import RunError

    settings = tmp_path / "train.yaml"
    settings.write_text(f"base: {TINY}\nrobot_profile: hardware_proxy\n"
                        "initial_state: {disturbance_fraction: 0.5, disturbance_from_trial: 1,\n"
                        "  disturbance_trial_from: 1, disturbance_seeds: [1000], pool_seeds_per_trial: 1}\n")
    config = load_train_config(settings)
    records = train(config, tmp_path / "run")
    assert len(records[1].disturbance_states) == 1 + 15        # the window's hand-over + one simulated seed
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["config"]["robot_profile"] == "hardware_proxy"
    assert meta["robot_time_s"]["per_trial"][1] == pytest.approx(config.trial_duration + 0.2, abs=0.0021)
    with pytest.raises(RunError, match="robot profile: hardware_proxy -> nominal"):
        train(load_train_config(settings, robot_profile="nominal"), tmp_path / "run", resume=True)


def test_resume_on_a_noisy_robot_learns_from_the_same_measurements(tmp_path):
    """The run directory keeps what the sensors measured: a resumed run on the proxy equals an uninterrupted one."""
    from dataclasses import replace

    settings = tmp_path / "train.yaml"
    settings.write_text(f"base: {TINY}\nrobot_profile: hardware_proxy\ntrials: 3\n")
    config = load_train_config(settings)
    whole = train(config, tmp_path / "whole")
    train(replace(config, trials=2), tmp_path / "resumed")
    resumed = train(config, tmp_path / "resumed", resume=True)
    np.testing.assert_array_equal(resumed[2].policy.centers, whole[2].policy.centers)
    np.testing.assert_array_equal(resumed[2].trajectory.extras["x_measured"], whole[2].trajectory.extras["x_measured"])
    assert not np.array_equal(whole[1].trajectory.extras["x_measured"], whole[1].trajectory.x)
