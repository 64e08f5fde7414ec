"""Identifying the prior's friction and rotor inertia from trials (gp.identify): on data of a robot with friction
(model_1.0) and a frictionless prior (model_1.1) the fit recovers the friction, takes the prior's one-step error
down to almost nothing, and the saved model reloads with the identified prior."""

from __future__ import annotations

import numpy as np
import pytest
from test_model_learns_robot import transitions

from mcpilco_core.config import ConfigError, load_plant_parameters
from mcpilco_core.learning.gp import GPSettings
from mcpilco_core.learning.identification import identify_plant, predicted_velocities
from mcpilco_core.learning.learner import load_train_config
from mcpilco_core.learning.model import DynamicsModel
from mcpilco_core.plant import DoublePendulum


@pytest.fixture
def plants(repo):
    models = repo / "config" / "plant_models.yaml"
    return load_plant_parameters(models, "model_1.1"), load_plant_parameters(models, "model_1.0")


def velocity_rms(plant, data) -> np.ndarray:
    error = predicted_velocities(plant, data, 0.02, 0) - data.x_next[:, 2:]
    return np.sqrt(np.mean(error ** 2, axis=0))


def test_the_fit_recovers_the_friction_of_the_robot(plants):
    prior, robot = plants
    rng = np.random.default_rng(1)
    data, held_out = transitions(DoublePendulum(robot), 600, rng), transitions(DoublePendulum(robot), 300, rng)
    found = identify_plant(prior, data, 0.02, actuated=0, rng=rng)
    assert found.cf == pytest.approx(robot.cf, rel=0.05) and found.Ir == pytest.approx(robot.Ir, rel=0.2)
    assert (found.m, found.l, found.r, found.I) == (prior.m, prior.l, prior.r, prior.I)   # the rest is the user's
    before, after = velocity_rms(prior, held_out), velocity_rms(found, held_out)
    assert before.min() > 0.05 and after.max() < 0.01 * before.min() + 1e-4, (before, after)
    assert identify_plant(prior, transitions(DoublePendulum(robot), 5, rng), 0.02, 0) is prior   # too little data


def test_the_model_identifies_before_fitting_and_reloads_the_identified_prior(pendubot_config, plants):
    prior, robot = plants
    rng = np.random.default_rng(2)
    data = transitions(DoublePendulum(robot), 400, rng)
    settings = GPSettings(fit_steps=20, fit_points=200, max_points=100, noise_floor=1e-4, prior="rk4", identify=True)
    model = DynamicsModel(pendubot_config, settings)
    model.fit(data, rng)
    assert model.config.plant.cf == pytest.approx(robot.cf, rel=0.05) and model.base_plant == prior
    residual = np.sqrt(np.mean(model.residual_targets(data)[1] ** 2, axis=0))
    again = DynamicsModel(pendubot_config, settings)
    again.load_arrays(model.to_arrays())
    assert again.config.plant == model.config.plant and again.prior_constants == model.prior_constants
    plain = DynamicsModel(pendubot_config, GPSettings(fit_steps=20, fit_points=200, max_points=100, prior="rk4"))
    plain.fit(data, rng)
    assert plain.config.plant == prior                              # off by default: the prior stays the user's
    left = np.sqrt(np.mean(plain.residual_targets(data)[1] ** 2, axis=0))
    assert np.all(residual < 0.3 * left), (residual, left)          # far less is left for the GP to learn


@pytest.mark.parametrize("bad,problem,good,setting", [
    ("identify: maybe", "gp.identify", "identify: true", "identify"),
    ("delay_aware: true", "gp.delay_aware.*needs gp.identify", "delay_aware: true, identify: true", "delay_aware"),
    ("lengthscale_floor: -0.05", "gp.lengthscale_floor", "lengthscale_floor: 0.05", "lengthscale_floor"),
    ("mirror_data: 1", "gp.mirror_data", "mirror_data: true", "mirror_data")])
def test_the_settings_are_validated(tmp_path, repo, bad, problem, good, setting):
    """gp.identify must be a boolean; gp.delay_aware needs gp.identify (the delay is fitted with the friction);
    gp.lengthscale_floor is a fraction >= 0; gp.mirror_data a boolean."""
    path = tmp_path / "t.yaml"
    path.write_text(f"base: {repo / 'config' / 'train_tiny.yaml'}\ngp: {{{bad}}}\n")
    with pytest.raises(ConfigError, match=problem):
        load_train_config(path, "pendubot")
    path.write_text(f"base: {repo / 'config' / 'train_tiny.yaml'}\ngp: {{{good}}}\n")
    assert getattr(load_train_config(path, "pendubot").gp, setting)


def test_the_delay_aware_fit_finds_the_command_delay_of_a_late_robot(pendubot_config, plants, repo):
    """A noise-free robot whose state reaches the controller 5 ms late (2 steps of 2 ms: the previous command acts for
    the first 4 ms of each 20 ms transition). The 20 ms fit with ``fit_delay`` finds a = 4 / 20 of the period, and the
    delay-aware model's prior (u + a (u_prev - u) held) leaves a fraction of the torque-held prior's error."""
    from test_identified_robot import exploration

    from mcpilco_core.learning.identification import identify_prior
    from mcpilco_core.learning.learner import learning_transitions
    from mcpilco_core.simulation import RobotProfile

    prior, robot = plants
    profile = RobotProfile(name="late", plant_model="model_1.0", plant_models_file=str(repo / "config" /
                           "plant_models.yaml"), delay=0.005)
    data = learning_transitions(exploration(pendubot_config, profile, 4, seconds=6.0), pendubot_config)
    held_plant, none = identify_prior(prior, data, 0.02, 0, fit_delay=False)
    plant, delay = identify_prior(prior, data, 0.02, 0, fit_delay=True)
    assert none == 0.0 and delay == pytest.approx(0.2, abs=0.02)
    assert plant.cf == pytest.approx(robot.cf, rel=0.1)
    held = velocity_rms(held_plant, data)
    late = np.sqrt(np.mean((predicted_velocities(plant, data, 0.02, 0, delay) - data.x_next[:, 2:]) ** 2, axis=0))
    assert np.all(late < 0.3 * held), (late, held)
    settings = GPSettings(fit_steps=20, fit_points=200, max_points=100, prior="rk4", identify=True, delay_aware=True)
    model = DynamicsModel(pendubot_config, settings)
    model.fit(data, np.random.default_rng(0))
    assert model.delay_fraction == pytest.approx(delay, abs=0.01)
    assert model.prior_constants.delay == model.delay_fraction
    assert np.array_equal(model.effective_commands(data), data.u + model.delay_fraction * (data.u_prev - data.u))



def test_the_models_fit_keeps_every_lengthscale_above_gp_lengthscale_floor(pendubot_config, plants):
    """gp.lengthscale_floor reaches the model's fit: each output's lengthscales stay at or above that fraction of
    their input's standard deviation over the fit points (here all of them)."""
    prior, robot = plants
    rng = np.random.default_rng(5)
    data = transitions(DoublePendulum(robot), 150, rng)
    settings = GPSettings(fit_steps=5, fit_points=200, max_points=50, prior="rk4", lengthscale_floor=3.0)
    model = DynamicsModel(pendubot_config, settings)
    model.fit(data, rng)
    inputs, _ = model.residual_targets(data)
    floor = 3.0 * inputs.std(axis=0)
    lengthscales = model.hyper.lengthscales().detach().numpy()
    assert np.all(lengthscales >= floor * (1 - 1e-9)), (lengthscales, floor)
    plain = DynamicsModel(pendubot_config, GPSettings(fit_steps=5, fit_points=200, max_points=50, prior="rk4"))
    plain.fit(data, np.random.default_rng(5))
    assert np.any(plain.hyper.lengthscales().detach().numpy() < floor)     # the floor is what lifted them
