"""Training-config switches that no shipped recipe varies are user-facing options: each does what it says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mcpilco_core.learning import model as model_module
from mcpilco_core.learning.learner import Learner, initial_distribution, load_train_config
from mcpilco_core.learning.runs import train

TINY = Path(__file__).resolve().parents[1] / "config" / "train_tiny.yaml"

pytestmark = pytest.mark.timeout(120)


def settings(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(f"base: {TINY}\n{text}")
    return path


def test_dtype_float64_runs_the_rollouts_in_float64(tmp_path):
    config = load_train_config(settings(tmp_path, "dtype: float64\ntrials: 2\n"))
    assert config.torch_dtype == torch.float64
    records = train(config, tmp_path / "run")
    assert records[1].policy.weights.dtype == np.float64 and np.isfinite(records[1].optimization.cost).all()


@pytest.mark.parametrize("warm", [True, False])
def test_gp_warm_start_keeps_or_resets_the_hyperparameters(tmp_path, monkeypatch, warm):
    config = load_train_config(settings(tmp_path, f"gp: {{warm_start: {str(warm).lower()}, fit_steps: 5}}\n"))
    calls = []
    original = model_module.GPHyperparameters.initial
    monkeypatch.setattr(model_module.GPHyperparameters, "initial",
                        classmethod(lambda cls, *a, **k: calls.append(1) or original(*a, **k)))
    learner = Learner(config)
    learner.exploration_trial()
    for _ in range(2):
        learner.model.fit(learner.data, np.random.default_rng(0))
    assert len(calls) == (1 if warm else 2)


def test_floor_and_jitter_shape_the_initial_distribution(tmp_path):
    config = load_train_config(settings(tmp_path, "initial_state: {k_m: 50, K: 10, floor: [0.1, 0.2, 0.3, 0.4],"
                                                  " disturbance_fraction: 1.0, disturbance_from_trial: 0,"
                                                  " disturbance_jitter: 0.0}\n"))
    pool = np.array([[1.0, 2.0, 3.0, 4.0]])
    dist = initial_distribution(config, 1, pool)
    np.testing.assert_array_equal(dist.half_width, [0.1, 0.2, 0.3, 0.4])     # gamma = 0: the floor alone
    np.testing.assert_array_equal(dist.sample_numpy(5, np.random.default_rng(0)), np.repeat(pool, 5, axis=0))
    no_pool = initial_distribution(config, 1, np.zeros((0, 4))).sample_numpy(200, np.random.default_rng(1))
    assert np.all(np.abs(no_pool) <= [0.1, 0.2, 0.3, 0.4]) and np.all(np.abs(no_pool).max(axis=0) > 0.05)
