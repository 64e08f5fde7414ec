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
                dt: float = 0.002, x: np.ndarray | None = None) -> TransitionData:
    if x is None:
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


def one_side(n: int, rng: np.random.Generator) -> np.ndarray:
    """States on one side of the vertical only: both angles in (0.3, 2.8) rad, both velocities in (0.5, 3) rad/s."""
    return np.column_stack([rng.uniform(0.3, 2.8, (n, 2)), rng.uniform(0.5, 3.0, (n, 2))])


def test_a_mirrored_transition_is_one_the_robot_makes(repo):
    """The pendulum is symmetric about the vertical, friction and rotor inertia included (model_1.0): the mirror image
    of a recorded 20 ms transition is what the robot does from the mirrored state under the negated torque."""
    robot = DoublePendulum(load_plant_parameters(repo / "config" / "plant_models.yaml", "model_1.0"))
    rng = np.random.default_rng(3)
    data = transitions(robot, 40, rng)
    data.u_prev = rng.uniform(-3, 3, 40)
    image = data.mirrored()
    torques = np.zeros((40, 2))
    torques[:, 0] = image.u
    y = image.x.copy()
    for _ in range(10):
        y = robot.rk4_step(y, torques, 0.002)
    np.testing.assert_allclose(image.x_next, y, atol=1e-9)
    np.testing.assert_array_equal(image.u_prev, -data.u_prev)
    twice = image.mirrored()
    for a, b in ((twice.x, data.x), (twice.u, data.u), (twice.x_next, data.x_next), (twice.u_prev, data.u_prev)):
        np.testing.assert_array_equal(a, b)


def test_gp_mirror_data_teaches_the_model_the_side_the_robot_has_not_been(pendubot_config, repo):
    """Recorded on one side of the vertical only, the robot's friction is learnt there; with ``gp.mirror_data`` the
    model predicts the other side as well, without it the model there is the frictionless prior again."""
    robot = DoublePendulum(load_plant_parameters(repo / "config" / "plant_models.yaml", "model_1.0"))
    rng = np.random.default_rng(1)
    train = transitions(robot, 300, rng, x=one_side(300, rng))
    other_side = transitions(robot, 200, rng, x=-one_side(200, rng))
    errors = {}
    for mirror in (False, True):
        settings = GPSettings(fit_steps=150, fit_lr=0.05, fit_points=300, max_points=200, noise_floor=1e-4,
                              prior="rk4", mirror_data=mirror)
        model = DynamicsModel(pendubot_config, settings)
        model.fit(train, np.random.default_rng(0))
        found = model.one_step_errors(other_side)
        errors[mirror] = [np.sqrt(np.mean(found[k] ** 2, axis=0)) for k in ("prior", "learned")]
    prior, without = errors[False]
    assert prior.min() > 0.05                                       # friction: the prior is off there
    assert np.all(without > 0.6 * prior), (prior, without)          # unseen: little learnt
    assert np.all(errors[True][1] < 0.4 * prior), (prior, errors[True][1])
