"""The plant against RealAIGym's reference values, in numpy, torch and plain floats."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mcpilco_core.config import PlantParameters
from mcpilco_core.plant import GOAL, DoublePendulum, wrap_angle, wrap_state

REPO = Path(__file__).resolve().parent.parent
# A copy of shared/reference/realaigym_dynamics.json (values computed with RealAIGym's own plant).
REFERENCE = REPO / "test" / "data" / "realaigym_dynamics.json"
# The README's claim: the float64 plant matches RealAIGym's to <= 4e-15 relative (measured 3.4e-15, qdd of
# model_1.0), float32 torch to <= 1e-5.
TOL64, TOL32 = 4e-15, 1e-5


def reference():
    if not REFERENCE.is_file():
        pytest.skip(f"reference file {REFERENCE} not available")
    return json.loads(REFERENCE.read_text())


def models():
    return list(reference()["models"].items()) if REFERENCE.is_file() else []


def rel_err(value, expected):
    value, expected = np.asarray(value, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return float(np.max(np.abs(value - expected) / np.maximum(np.abs(expected), 1e-12)))


def abs_rel_err(value, expected):
    """Relative error with an absolute floor of 1e-6 of the magnitude scale (for float32 comparisons)."""
    value, expected = np.asarray(value, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = np.maximum(np.abs(expected), 1e-3 * np.max(np.abs(expected)))
    return float(np.max(np.abs(value - expected) / scale))


@pytest.mark.parametrize("name,model", models())
def test_numpy_matches_reference(name, model):
    plant = DoublePendulum(PlantParameters.from_mapping(model["parameters"], name))
    for case in model["cases"]:
        x, u = np.array(case["x"]), np.array(case["u"])
        assert rel_err(plant.forward_dynamics(x, u), case["qdd"]) < TOL64
        assert rel_err(plant.mass_matrix(x[:2]), case["M"]) < TOL64
        assert rel_err(plant.coriolis_matrix(x[:2], x[2:]), case["C"]) < TOL64
        assert rel_err(plant.gravity_vector(x[:2]), case["G"]) < TOL64
        assert rel_err(plant.end_effector_height(x), case["ee_height"]) < TOL64
        assert rel_err(plant.rk4_step(x, u, 0.002), case["rk4_dt0.002_next_x"]) < TOL64
        assert rel_err(plant.rk4_step_scalar(tuple(x), tuple(u), 0.002), case["rk4_dt0.002_next_x"]) < TOL64


@pytest.mark.parametrize("name,model", models())
def test_numpy_batched_matches_reference(name, model):
    plant = DoublePendulum(PlantParameters.from_mapping(model["parameters"], name))
    x = np.array([c["x"] for c in model["cases"]]).reshape(4, -1, 4)
    u = np.array([c["u"] for c in model["cases"]]).reshape(4, -1, 2)
    qdd = np.array([c["qdd"] for c in model["cases"]]).reshape(4, -1, 2)
    assert plant.forward_dynamics(x, u).shape == qdd.shape
    assert rel_err(plant.forward_dynamics(x, u), qdd) < TOL64


@pytest.mark.parametrize("name,model", models())
@pytest.mark.parametrize("dtype,tol", [(torch.float32, TOL32), (torch.float64, TOL64)])
def test_torch_matches_reference(name, model, dtype, tol):
    plant = DoublePendulum(PlantParameters.from_mapping(model["parameters"], name))
    x = torch.tensor([c["x"] for c in model["cases"]], dtype=dtype)
    u = torch.tensor([c["u"] for c in model["cases"]], dtype=dtype)
    qdd = plant.forward_dynamics(x, u)
    assert qdd.dtype == dtype and qdd.shape == (len(model["cases"]), 2)
    expected = np.array([c["qdd"] for c in model["cases"]])
    err = abs_rel_err(qdd.numpy(), expected) if dtype == torch.float32 else rel_err(qdd.numpy(), expected)
    assert err < tol
    nxt = plant.rk4_step(x, u, 0.002)
    assert abs_rel_err(nxt.numpy(), [c["rk4_dt0.002_next_x"] for c in model["cases"]]) < tol


def test_torch_forward_dynamics_is_differentiable(pendubot_plant):
    x = torch.tensor([[0.3, -0.2, 1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    u = torch.tensor([[0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a, b: pendubot_plant.forward_dynamics(a, b), (x, u))


def test_from_yaml_api():
    plant = DoublePendulum.from_yaml(REPO / "config" / "acrobot.yaml")
    qdd = plant.forward_dynamics(np.zeros((3, 5, 4)), np.zeros((3, 5, 2)))
    assert qdd.shape == (3, 5, 2)
    assert np.allclose(qdd, 0.0)  # hanging at rest is an equilibrium


def test_energy_conserved_without_torque_or_friction(pendubot_plant):
    """RK4 at 2 ms keeps the total energy within a tight drift bound over 10 s (model_1.1: no friction)."""
    x = (2.0, -1.0, 3.0, -4.0)
    e0 = pendubot_plant.total_energy(np.array(x))
    energies = []
    for _ in range(5000):
        x = pendubot_plant.rk4_step_scalar(x, (0.0, 0.0), 0.002)
        energies.append(pendubot_plant.total_energy(np.array(x)))
    drift = np.max(np.abs(np.array(energies) - e0))
    assert drift < 1e-5 * (abs(e0) + 1.0), drift


def test_friction_dissipates_energy():
    plant = DoublePendulum.from_yaml(REPO / "config" / "pendubot.yaml")
    hardware = DoublePendulum(plant.params.__class__(**{**plant.params.__dict__, "b": (0.001, 0.001),
                                                        "cf": (0.16, 0.12), "name": "hw"}))
    x = (2.0, -1.0, 3.0, -4.0)
    e0 = hardware.total_energy(np.array(x))
    for _ in range(1000):
        x = hardware.rk4_step_scalar(x, (0.0, 0.0), 0.002)
    assert hardware.total_energy(np.array(x)) < e0 - 0.01


def test_linearisation_matches_finite_differences(pendubot_plant):
    a, b = pendubot_plant.linearize(GOAL, (0.0, 0.0))
    eps = 1e-6
    for i in range(4):
        dx = np.zeros(4)
        dx[i] = eps
        column = (pendubot_plant.state_derivative(GOAL + dx, np.zeros(2))
                  - pendubot_plant.state_derivative(GOAL - dx, np.zeros(2))) / (2 * eps)
        assert np.allclose(a[:, i], column, rtol=1e-6, atol=1e-6)
    for j in range(2):
        du = np.zeros(2)
        du[j] = eps
        column = (pendubot_plant.state_derivative(GOAL, du) - pendubot_plant.state_derivative(GOAL, -du)) / (2 * eps)
        assert np.allclose(b[:, j], column, rtol=1e-6, atol=1e-6)


def test_wrapping():
    assert wrap_angle(math.pi) == pytest.approx(-math.pi)
    assert wrap_angle(3 * math.pi + 0.1) == pytest.approx(-math.pi + 0.1)
    x = np.array([math.pi + 0.1 + 6 * math.pi, 0.2 - 4 * math.pi, 1.0, 2.0])
    assert np.allclose(wrap_state(x), [math.pi + 0.1, 0.2, 1.0, 2.0])


def test_end_effector_height_and_threshold(pendubot_plant):
    assert pendubot_plant.end_effector_height(np.array(GOAL)) == pytest.approx(0.5)
    assert pendubot_plant.end_effector_height(np.zeros(4)) == pytest.approx(-0.5)
    assert pendubot_plant.height_threshold == pytest.approx(0.45)


def test_forward_dynamics_solves_the_documented_equation_with_unequal_joint_friction():
    """M qdd = G + u - C dq - F(dq), F_i = b_i dq_i + cf_i atan(100 dq_i), on a plant whose joints have different
    friction (the reference models have b1 = b2), so each joint's own b and cf are checked, and friction() with them."""
    base = DoublePendulum.from_yaml(REPO / "config" / "pendubot.yaml").params
    plant = DoublePendulum(base.__class__(**{**base.__dict__, "b": (0.003, 0.011), "cf": (0.05, 0.21),
                                             "Ir": 6e-5, "name": "asymmetric"}))
    rng = np.random.default_rng(0)
    x = rng.uniform(-3.0, 3.0, (20, 4))
    x[:3, 2:] = [[0.004, -0.002], [-0.001, 0.003], [0.0, 0.0]]     # slow: inside atan's steep part
    u = rng.uniform(-2.0, 2.0, (20, 2))
    friction = plant.friction(x[:, 2:])
    expected_friction = np.array([[b * v + cf * math.atan(100.0 * v) for b, cf, v in zip((0.003, 0.011), (0.05, 0.21),
                                                                                         row)] for row in x[:, 2:]])
    np.testing.assert_allclose(friction, expected_friction, rtol=1e-14, atol=1e-16)
    rhs = (plant.gravity_vector(x[:, :2]) + u - np.einsum("nij,nj->ni", plant.coriolis_matrix(x[:, :2], x[:, 2:]),
                                                          x[:, 2:]) - expected_friction)
    expected = np.linalg.solve(plant.mass_matrix(x[:, :2]), rhs[..., None])[..., 0]
    np.testing.assert_allclose(plant.forward_dynamics(x, u), expected, rtol=1e-10, atol=1e-12)
    for row, v in zip(x[:5], u[:5]):
        np.testing.assert_allclose(plant.rk4_step_scalar(tuple(row), tuple(v), 0.002), plant.rk4_step(row, v, 0.002),
                                   rtol=1e-13, atol=1e-15)
