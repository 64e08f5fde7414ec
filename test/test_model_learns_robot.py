"""The GP learns what the prior gets wrong: on a robot with friction and rotor inertia (model_1.0) and a
frictionless prior (model_1.1), the learned model predicts held-out transitions better than the prior alone."""

from __future__ import annotations

import numpy as np
import pytest

from mcpilco_core.config import load_plant_parameters
from mcpilco_core.learning.gp import GPSettings
from mcpilco_core.learning.model import DynamicsModel
from mcpilco_core.plant import DoublePendulum
from mcpilco_core.recording.transitions import TransitionData


def transitions(plant: DoublePendulum, n: int, rng: np.random.Generator, period: float = 0.02,
                dt: float = 0.002) -> TransitionData:
    x = np.column_stack([rng.uniform(-np.pi, np.pi, (n, 2)), rng.uniform(-3, 3, (n, 2))])
    u = rng.uniform(-3, 3, n)
    torques = np.zeros((n, 2))
    torques[:, 0] = u
    y = x.copy()
    for _ in range(round(period / dt)):
        y = plant.rk4_step(y, torques, dt)
    return TransitionData(x, u, y)


def test_the_learned_model_beats_the_prior_on_held_out_robot_data(pendubot_config, repo):
    robot = DoublePendulum(load_plant_parameters(repo / "config" / "plant_models.yaml", "model_1.0"))
    rng = np.random.default_rng(0)
    train, held_out = transitions(robot, 400, rng), transitions(robot, 300, rng)
    model = DynamicsModel(pendubot_config, GPSettings(fit_steps=150, fit_lr=0.05, fit_points=300, max_points=200,
                                                      noise_floor=1e-4, prior="rk4"))
    assert model.plant.params.name == "model_1.1"                   # the prior knows no friction
    model.fit(train, rng)
    errors = model.one_step_errors(held_out)
    prior, learned = (np.sqrt(np.mean(errors[k] ** 2, axis=0)) for k in ("prior", "learned"))
    assert prior.min() > 0.05                                       # friction: the prior is clearly off ...
    assert np.all(learned < 0.5 * prior), (prior, learned)          # ... and the GP learnt most of it
    same = model.one_step_errors(train)                             # (the errors are residuals: exact at 0)
    assert same["prior"].shape == (400, 2)
    with pytest.raises(RuntimeError, match="not been fitted"):
        DynamicsModel(pendubot_config).one_step_errors(held_out)
