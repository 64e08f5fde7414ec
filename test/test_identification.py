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


def test_the_setting_is_validated(tmp_path, repo):
    path = tmp_path / "t.yaml"
    path.write_text(f"base: {repo / 'config' / 'train_tiny.yaml'}\ngp: {{identify: maybe}}\n")
    with pytest.raises(ConfigError, match="gp.identify"):
        load_train_config(path, "pendubot")
    path.write_text(f"base: {repo / 'config' / 'train_tiny.yaml'}\ngp: {{identify: true}}\n")
    assert load_train_config(path, "pendubot").gp.identify
