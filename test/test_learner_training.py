"""End-to-end: tiny MC-PILCO trainings (config/train_tiny.yaml), resume, run directory, CLI."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mcpilco_core.config import load_robot_config
from mcpilco_core.learning.learner import Learner, load_train_config
from mcpilco_core.learning.runs import RunDirectory, RunError, train
from mcpilco_core.policy import import_realaigym, load_policy
from mcpilco_ros import cli

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "config" / "train_tiny.yaml"

pytestmark = pytest.mark.timeout(120)


def test_tiny_training_writes_run_directory_and_cost_decreases(tmp_path):
    config = load_train_config(TINY, "pendubot")
    records = train(config, tmp_path / "run")
    assert [r.index for r in records] == [0, 1]
    cost = np.asarray(records[1].optimization.cost)
    assert cost[-5:].mean() < cost[:5].mean()
    root = tmp_path / "run"
    for name in ("run.json", "train_config.yaml", "robot_config.yaml", "log.txt", "policy.npz",
                 "learning_curves.png", "trials/trial_000/data.npz", "trials/trial_001/model.npz",
                 "trials/trial_001/policy.npz", "trials/trial_001/optimization.npz"):
        assert (root / name).is_file(), name
    meta = json.loads((root / "run.json").read_text())
    policy = load_policy(root / "policy.npz", robot="pendubot")
    assert policy.metadata["run_id"] == meta["run_id"] and policy.metadata["config_hash"] == meta["config_hash"]
    assert "trial 1 complete" in (root / "log.txt").read_text()
    data = np.load(root / "trials/trial_001/data.npz")
    assert np.all(data["u"][:, 1] == 0.0)  # the passive joint never gets torque
    copied = load_robot_config(root / "robot_config.yaml")  # self-contained: the plant models file came along
    assert copied.plant == config.robot.plant
    reloaded = RunDirectory(root).load_config()            # the run's own copies load as the same configuration
    assert reloaded.robot.fingerprint() == config.robot.fingerprint()
    assert replace(reloaded, source="", robot=config.robot) == replace(config, source="")
    with pytest.raises(RunError, match="--resume"):
        train(config, root)


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path, monkeypatch):
    config = replace(load_train_config(TINY, "pendubot"), trials=3)
    full = train(config, tmp_path / "full")

    original = Learner.learning_trial

    def interrupted(self, k):
        if k == 2:
            raise KeyboardInterrupt
        return original(self, k)

    monkeypatch.setattr(Learner, "learning_trial", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(config, tmp_path / "cut")
    assert RunDirectory(tmp_path / "cut").completed_trials() == [0, 1]
    monkeypatch.setattr(Learner, "learning_trial", original)
    resumed = train(config, tmp_path / "cut", resume=True)
    assert [r.index for r in resumed] == [0, 1, 2]
    a, b = full[-1].policy, resumed[-1].policy
    for name in ("centers", "log_lengthscales", "weights"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(full[-1].trajectory.x, resumed[-1].trajectory.x)
    assert full[-1].optimization.cost == resumed[-1].optimization.cost


def test_cli_train_and_export(tmp_path):
    out = tmp_path / "cli_run"
    assert cli.main(["train", "--robot", "pendubot", "--config", str(TINY), "--out", str(out)]) == 0
    assert cli.main(["train", "--robot", "pendubot", "--config", str(TINY), "--out", str(out), "--resume"]) == 0
    assert cli.main(["train", "--robot", "pendubot", "--config", str(TINY), "--out", str(out)]) == 2
    assert cli.main(["train", "--robot", "acrobot", "--config", str(TINY), "--out", str(tmp_path / "x")]) == 2
    target = tmp_path / "policy.np"
    assert cli.main(["export", str(out / "policy.npz"), "--realaigym", str(target)]) == 0
    exported = import_realaigym(target, "pendubot")
    original = load_policy(out / "policy.npz")
    x = np.random.default_rng(0).normal(size=(20, 4))
    np.testing.assert_array_equal(exported(x), original(x))


def test_optimizer_skips_steps_with_escaped_particles_and_gives_up_when_they_persist(monkeypatch):
    import torch

    from mcpilco_core.learning import optimizer as opt_module
    from mcpilco_core.learning.learner import initial_distribution, trial_generators
    from mcpilco_core.learning.model import NonFiniteParticlesError
    from mcpilco_core.learning.torch_policy import TorchPolicy

    config = load_train_config(TINY, "pendubot")
    learner = Learner(config)
    learner.exploration_trial()
    rng, gen = trial_generators(config.seed, 1)
    learner.model.fit(learner.data, rng)
    policy = TorchPolicy.random(config.num_basis, config.robot.u_max, gen)
    sampler = initial_distribution(config, 1, learner.pool).sampler("cpu", torch.float32)
    real_rollout, calls = opt_module.rollout, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) % 3 == 0:
            raise NonFiniteParticlesError("1 non-finite particle states; first at step 3 (1 of 16 particles)")
        return real_rollout(*args, **kwargs)

    monkeypatch.setattr(opt_module, "rollout", flaky)
    result = opt_module.optimize_policy(policy, learner.model, sampler, 8, 5, config.cost, config.optimizer, 12, gen,
                                        progress=False)
    assert result.skipped_steps == 4 and result.steps == 8
    assert all(bool(torch.isfinite(p).all()) for p in policy.parameters())

    def broken(*args, **kwargs):
        raise NonFiniteParticlesError("escaped")

    monkeypatch.setattr(opt_module, "rollout", broken)
    with pytest.raises(NonFiniteParticlesError, match="in a row"):
        opt_module.optimize_policy(policy, learner.model, sampler, 8, 5, config.cost, config.optimizer, 50, gen,
                                   progress=False)
