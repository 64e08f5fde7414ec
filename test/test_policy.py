"""Policy files: our .npz format, RealAIGym's pickled .np, and refusal of anything unsafe or broken."""

import os
import pickle

import numpy as np
import pytest

from mcpilco_core.control import build_controller
from mcpilco_core.evaluation import ControllerSpec, evaluate_seeds
from mcpilco_core.policy import (
    PolicyError,
    SumOfGaussiansPolicy,
    export_realaigym,
    features,
    import_realaigym,
    load_policy,
    save_policy,
)


def random_policy(robot="pendubot", nb=20, seed=0):
    rng = np.random.default_rng(seed)
    return SumOfGaussiansPolicy(centers=rng.uniform(-1, 1, (nb, 6)), log_lengthscales=rng.normal(0, 0.3, 6),
                                weights=rng.uniform(-3, 3, nb), u_max=3.0, robot=robot)


def test_policy_formula():
    policy = random_policy()
    x = np.array([0.3, -1.2, 2.0, -0.5])
    phi = features(x)
    np.testing.assert_allclose(phi, [2.0, -0.5, np.cos(0.3), np.cos(-1.2), np.sin(0.3), np.sin(-1.2)])
    act = np.exp(-np.sum(((policy.centers - phi) / np.exp(policy.log_lengthscales)) ** 2, axis=1))
    assert policy(x) == pytest.approx(3.0 * np.tanh(act @ policy.weights / 3.0))
    batch = np.stack([x, x + 0.1])
    assert policy(batch).shape == (2,) and abs(policy(batch)).max() <= 3.0


def test_own_format_round_trip(tmp_path):
    policy = random_policy()
    path = save_policy(policy, tmp_path / "p.npz", run_id="run-1", config_hash="abc")
    loaded = load_policy(path, robot="pendubot", torque_limit=6.0)
    np.testing.assert_array_equal(loaded.centers, policy.centers)
    assert loaded.version() == policy.version() and loaded.metadata["run_id"] == "run-1"
    x = np.random.default_rng(1).normal(size=(5, 4))
    np.testing.assert_array_equal(loaded(x), policy(x))


def test_realaigym_round_trip(tmp_path):
    policy = random_policy()
    path = export_realaigym(policy, tmp_path / "p.np")
    with open(path, "rb") as handle:
        raw = pickle.load(handle)  # trusted: we just wrote it
    assert set(raw) == {"log_lengthscales", "centers", "linear_weights"}
    loaded = load_policy(path, robot="pendubot")
    np.testing.assert_array_equal(loaded.weights, policy.weights)
    assert loaded(np.zeros(4)) == pytest.approx(policy(np.zeros(4)))


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.np"
    with open(path, "wb") as handle:
        pickle.dump({"centers": _Exploit(marker), "log_lengthscales": np.zeros(6),
                     "linear_weights": np.zeros(3)}, handle)
    with pytest.raises(PolicyError, match="refused to load"):
        load_policy(path, robot="pendubot")
    with pytest.raises(PolicyError, match="refused"):
        import_realaigym(path, "pendubot")
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"garbage", b"PK\x03\x04broken zip"])
def test_corrupt_files_are_refused(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(PolicyError, match=str(path.name)):
        load_policy(path)


def test_truncated_policy_is_refused(tmp_path):
    path = save_policy(random_policy(), tmp_path / "p.npz")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(PolicyError):
        load_policy(path)


def test_wrong_robot_shapes_and_values_are_refused(tmp_path):
    path = save_policy(random_policy(robot="acrobot"), tmp_path / "a.npz")
    with pytest.raises(PolicyError, match="trained for the acrobot"):
        load_policy(path, robot="pendubot")
    bad = random_policy()
    bad.weights[3] = np.nan
    with pytest.raises(PolicyError, match="NaN"):
        load_policy(save_policy(bad, tmp_path / "nan.npz"))
    big = random_policy()
    big.u_max = 8.0
    with pytest.raises(PolicyError, match="exceeds the torque limit"):
        load_policy(save_policy(big, tmp_path / "big.npz"), torque_limit=6.0)
    wrong = SumOfGaussiansPolicy(centers=np.zeros((4, 5)), log_lengthscales=np.zeros(5), weights=np.zeros(4),
                                 u_max=3.0, robot="pendubot")
    with pytest.raises(PolicyError, match="shape"):
        load_policy(save_policy(wrong, tmp_path / "shape.npz"))


def test_policy_in_the_supervisor_and_evaluator(tmp_path, pendubot_config):
    path = save_policy(random_policy(), tmp_path / "p.npz")
    controller = build_controller(pendubot_config, load_policy(path, robot="pendubot"))
    u = controller.step(np.zeros(4), 0.0)
    assert controller.mode == "policy" and u[1] == 0.0 and abs(u[0]) <= 3.0
    results = evaluate_seeds(ControllerSpec(pendubot_config.source, str(path)), [0], duration=5.0)
    assert results[0].passive_max_torque == 0.0
    assert results[0].mode_fractions.get("policy", 0.0) > 0.5


@pytest.mark.parametrize("robot", ["pendubot", "acrobot"])
def test_shipped_policies_load_and_never_torque_the_passive_joint(robot):
    """policies/<robot>.npz (what the launch files run by default) loads for its robot and, through the
    protocol's first disturbance, never commands the passive joint."""
    from mcpilco_core.evaluation import config_path_for
    from mcpilco_core.paths import shipped_policy

    path = shipped_policy(robot)
    assert path is not None and path.is_file()
    policy = load_policy(path, robot=robot, torque_limit=6.0)
    assert policy.robot == robot and np.isfinite(policy.weights).all()
    (result,) = evaluate_seeds(ControllerSpec(config_path_for(robot), str(path)), [0], duration=6.0)
    assert result.passive_max_torque == 0.0 and result.passive_max_applied_torque == 0.0
