"""Learner components: torch policy, physics prior, rollout gradients, non-finite detection, schedules, config."""

import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mcpilco_core.config import ConfigError, load_robot_config
from mcpilco_core.learning.cost import CostSettings, saturated_cost, trajectory_cost
from mcpilco_core.learning.gp import GPHyperparameters, GPSettings, build_posterior
from mcpilco_core.learning.learner import (
    ExplorationController,
    Learner,
    curriculum_gamma,
    initial_distribution,
    load_train_config,
    trial_generators,
)
from mcpilco_core.learning.model import DynamicsModel, NonFiniteParticlesError, rollout
from mcpilco_core.learning.optimizer import PlateauMonitor
from mcpilco_core.learning.torch_policy import TorchPolicy
from mcpilco_core.policy import load_policy, save_policy
from mcpilco_core.recording.transitions import transitions_from_trajectory

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "config"


def _states(rng, n):
    return np.concatenate([rng.uniform(-9, 9, (n, 2)), rng.uniform(-15, 15, (n, 2))], 1)


def test_torch_policy_equals_numpy_policy_and_round_trips(tmp_path):
    gen = torch.Generator().manual_seed(0)
    policy = TorchPolicy.random(50, 3.0, gen, dtype=torch.float64)
    with torch.no_grad():
        policy.log_lengthscales.copy_(torch.linspace(-0.5, 0.7, 6, dtype=torch.float64))
    x = _states(np.random.default_rng(1), 64)
    runtime = policy.to_numpy("pendubot", 0.02)
    expected = runtime(x)
    np.testing.assert_allclose(policy(torch.tensor(x)).detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    assert np.abs(expected).max() <= 3.0
    loaded = load_policy(save_policy(runtime, tmp_path / "p.npz"), robot="pendubot")
    np.testing.assert_array_equal(loaded(x), expected)
    twin = TorchPolicy.from_numpy(loaded, torch.float32)
    np.testing.assert_allclose(twin(torch.tensor(x, dtype=torch.float32)).detach().numpy(), expected, atol=2e-5)


def test_policy_initialisation_follows_the_paper():
    policy = TorchPolicy.random(400, 3.0, torch.Generator().manual_seed(1))
    c = policy.centers.detach().numpy()
    assert np.abs(policy.weights.detach().numpy()).max() <= 3.0
    assert np.abs(c[:, :2]).max() <= 2 * math.pi
    np.testing.assert_allclose(c[:, 2:4] ** 2 + c[:, 4:] ** 2, 1.0, rtol=1e-5)  # (cos, sin) on the circle
    assert np.all(policy.log_lengthscales.detach().numpy() == 0.0)


def test_policy_initialisation_spans_the_torque_and_speed_ranges():
    """w ~ U[-u_M, u_M] and velocity centres ~ U[-dq_range, dq_range]: the draws fill those ranges."""
    for u_max, dq_range in ((3.0, 2 * math.pi), (6.0, 20.0)):
        policy = TorchPolicy.random(400, u_max, torch.Generator().manual_seed(1), dq_range=dq_range)
        weights, speeds = policy.weights.detach().numpy(), policy.centers.detach().numpy()[:, :2]
        assert 0.95 * u_max < np.abs(weights).max() <= u_max and weights.min() < 0 < weights.max()
        assert 0.95 * dq_range < np.abs(speeds).max() <= dq_range and speeds.min() < 0 < speeds.max()


def test_dropout_mask_scales_kept_basis_outputs():
    policy = TorchPolicy.random(1000, 3.0, torch.Generator().manual_seed(2))
    policy.set_dropout(0.25, torch.Generator().manual_seed(3))
    kept = policy.mask > 0
    assert 0.68 < float(kept.float().mean()) < 0.82
    assert torch.allclose(policy.mask[kept], torch.tensor(1 / 0.75))
    policy.set_dropout(0.0, None)
    assert policy.mask is None


@pytest.mark.parametrize("robot", ["pendubot", "acrobot"])
def test_fast_prior_equals_plant_forward_dynamics(robot):
    model = DynamicsModel(load_robot_config(CONFIG / f"{robot}.yaml"))
    rng = np.random.default_rng(4)
    x, u = _states(rng, 50), rng.uniform(-3, 3, 50)
    expected = model.prior_mean(x, u)
    xt, ut = torch.tensor(x), torch.tensor(u)
    got = model._prior_from_trig(xt[:, 2:], torch.cos(xt[:, :2]), torch.sin(xt[:, :2]), ut).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("robot", ["pendubot", "acrobot"])
def test_rk4_prior_matches_the_simulator_and_its_torch_twin(robot):
    """The RK4 prior is one RK4 step of length Ts: within 1e-3 rad/s of the simulator's ten 2 ms RK4 steps
    at moderate speeds (Euler is 50x worse there), and the torch reference computes the same numbers."""
    config = load_robot_config(CONFIG / f"{robot}.yaml")
    model = DynamicsModel(config, GPSettings(prior="rk4"))
    rng = np.random.default_rng(4)
    x, u = _states(rng, 200), rng.uniform(-3, 3, 200)
    x[:, 2:] = rng.uniform(-8, 8, (200, 2))
    torques = model.torques(u)
    fine = x.copy()
    for _ in range(10):
        fine = model.plant.rk4_step(fine, torques, 0.002)
    true_delta = fine[:, 2:] - x[:, 2:]
    rk4_error = np.abs(model.prior_mean(x, u) - true_delta).max()
    euler_error = np.abs(DynamicsModel(config).prior_mean(x, u) - true_delta).max()
    assert rk4_error < 1e-2 and rk4_error < euler_error / 50, (rk4_error, euler_error)
    xt, ut = torch.tensor(x), torch.tensor(u)
    got = model._prior_reference(xt[:, :2], xt[:, 2:], torch.cos(xt[:, :2]), torch.sin(xt[:, :2]), ut).numpy()
    np.testing.assert_allclose(got, model.prior_mean(x, u), rtol=1e-10, atol=1e-10)


def test_saved_model_with_another_prior_is_refused():
    model = _fitted_model()
    arrays = model.to_arrays()
    assert str(arrays["prior"]) == "euler"
    with pytest.raises(ValueError, match="'euler' prior.*gp.prior = 'rk4'"):
        DynamicsModel(model.config, GPSettings(prior="rk4")).load_arrays(arrays, dtype=torch.float64)
    del arrays["prior"]                                   # models saved before the option: Euler
    DynamicsModel(model.config).load_arrays(arrays, dtype=torch.float64)


def _fitted_model(dtype=torch.float64, n=25, seed=5):
    model = DynamicsModel(load_robot_config(CONFIG / "pendubot.yaml"))
    rng = np.random.default_rng(seed)
    x, u = _states(rng, n) * 0.3, rng.uniform(-3, 3, n)
    inputs = model.gp_inputs(x, u)
    targets = 0.05 * np.stack([np.sin(x[:, 0] + u), np.cos(x[:, 2])], -1)
    hyper = GPHyperparameters.initial(inputs, targets)
    model.hyper, model.subsets = hyper, [np.arange(n), np.arange(0, n, 2)]
    model.posterior = build_posterior(hyper, inputs, targets, model.subsets, dtype=dtype)
    model._inputs, model._targets = inputs, targets
    return model


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_rollout_gradient_matches_finite_differences_float64(delay):
    """Also with a command delay (``gp.delay_aware``): the torque of step t then acts in step t + 1 too, and the
    gradient through the previous command (policy without rollout_parts: one node per step, the previous command
    through autograd) checks out."""
    model = _fitted_model() if not delay else _friction_model("pendubot", "rk4", delay)
    policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)
    x0 = torch.tensor(_states(np.random.default_rng(7), 4) * 0.2)

    def objective(*values):
        traj = rollout(model, _Functional(policy, values), x0, 6, torch.Generator().manual_seed(8))
        return trajectory_cost(traj, CostSettings())

    inputs = tuple(p.detach().clone().requires_grad_(True) for p in policy.parameters())
    assert torch.autograd.gradcheck(objective, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


class _Functional:
    """The policy evaluated with explicit parameter tensors (so gradcheck can perturb them)."""

    def __init__(self, policy, values):
        self.policy, (self.centers, self.log_ls, self.weights) = policy, values

    def forward_features(self, phi):
        inv = torch.exp(-self.log_ls)
        d = (phi[:, None, :] - self.centers) * inv
        act = torch.exp(-(d * d).sum(-1))
        return self.policy.u_max * torch.tanh(act @ self.weights / self.policy.u_max)


def test_rollout_gradient_with_module_policy_equals_functional():
    model = _fitted_model()
    policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)
    x0 = torch.tensor(_states(np.random.default_rng(7), 4) * 0.2)
    cost = trajectory_cost(rollout(model, policy, x0, 6, torch.Generator().manual_seed(8)), CostSettings())
    grads = torch.autograd.grad(cost, list(policy.parameters()))
    values = tuple(p.detach().clone().requires_grad_(True) for p in policy.parameters())
    cost_f = trajectory_cost(rollout(model, _Functional(policy, values), x0, 6, torch.Generator().manual_seed(8)),
                             CostSettings())
    for a, b in zip(grads, torch.autograd.grad(cost_f, values)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode,particles,thread_counts", [("fused", 7, (1, 2, 3)), ("compiled", 8, (1, 2))])
def test_particle_threads_give_the_same_optimisation_as_one_thread(mode, particles, thread_counts):
    """parallel: particles splits each step's particles between threads; J and its gradient are the same sums."""
    from mcpilco_core.learning.optimizer import OptimizerSettings, optimize_policy

    model = _fitted_model()
    model.rollout_mode = mode
    settings = OptimizerSettings(max_steps_first=4, max_steps=4)
    histories = []
    for threads in thread_counts:                     # compiled: shares of 4 particles reuse the compiled code
        policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)

        def sample(n, generator):
            return (torch.rand((n, 4), generator=generator, dtype=torch.float64) - 0.5) * 0.4

        result = optimize_policy(policy, model, sample, particles, 5, CostSettings(), settings, 4,
                                 torch.Generator().manual_seed(1), progress=False, particle_threads=threads)
        histories.append((result.cost, torch.cat([p.detach().flatten() for p in policy.parameters()])))
    for cost, params in histories[1:]:
        np.testing.assert_allclose(cost, histories[0][0], rtol=1e-12)
        torch.testing.assert_close(params, histories[0][1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("delay", [0.0, 0.2])
def test_particle_processes_give_the_same_optimisation_as_one_thread(delay):
    """parallel: processes runs all but the first share in spawned workers holding exact copies of the posterior
    (and of the prior: its identified friction and command delay)."""
    from mcpilco_core.learning.optimizer import OptimizerSettings, optimize_policy

    model = _fitted_model() if not delay else _friction_model("acrobot", "euler", delay)
    settings = OptimizerSettings(max_steps_first=3, max_steps=3)
    histories = []
    for processes in (False, True):
        policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)

        def sample(n, generator):
            return (torch.rand((n, 4), generator=generator, dtype=torch.float64) - 0.5) * 0.4

        result = optimize_policy(policy, model, sample, 7, 5, CostSettings(), settings, 3,
                                 torch.Generator().manual_seed(1), progress=False, particle_threads=2,
                                 particle_processes=processes)
        histories.append((result.cost, torch.cat([p.detach().flatten() for p in policy.parameters()])))
    np.testing.assert_allclose(histories[1][0], histories[0][0], rtol=1e-12)
    torch.testing.assert_close(histories[1][1], histories[0][1], rtol=1e-10, atol=1e-12)


def test_judged_snapshots_keep_the_best_parameters_and_leave_the_steps_as_they_were():
    """optimizer.snapshot_every: the iterates are those of a run without snapshots (the judge draws nothing from
    the generator); the policy ends with the parameters of the best-judged snapshot, the warm start included."""
    from mcpilco_core.learning.optimizer import OptimizerSettings, optimize_policy

    model = _fitted_model()

    def sample(n, generator):
        return (torch.rand((n, 4), generator=generator, dtype=torch.float64) - 0.5) * 0.4

    def optimise(every, judge, snapshot_start=True):
        policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)
        settings = OptimizerSettings(max_steps_first=7, max_steps=7, snapshot_every=every,
                                     snapshot_start=snapshot_start)
        result = optimize_policy(policy, model, sample, 5, 4, CostSettings(), settings, 7,
                                 torch.Generator().manual_seed(1), progress=False, judge=judge)
        return result, torch.cat([p.detach().flatten() for p in policy.parameters()])

    plain, last = optimise(0, None)
    calls: list[torch.Tensor] = []

    def best_third(policy):              # a judge that likes the third snapshot (step 4) best
        calls.append(torch.cat([p.detach().flatten() for p in policy.parameters()]))
        assert policy.mask is None       # judged with dropout off
        return -abs(len(calls) - 3)

    judged, kept = optimise(2, best_third)
    assert judged.cost == plain.cost
    assert [s for s, _ in judged.snapshots] == [0, 2, 4, 6, 7] and judged.kept_step == 4
    torch.testing.assert_close(kept, calls[2], rtol=0, atol=0)
    assert not torch.equal(kept, last)
    flat, start = optimise(3, lambda policy: 0.0)
    assert flat.kept_step == 0            # nothing beat the warm start (ties keep the earlier): it stays
    torch.testing.assert_close(start, calls[0], rtol=0, atol=0)
    own, params = optimise(3, lambda policy: 0.0, snapshot_start=False)
    assert [s for s, _ in own.snapshots] == [3, 6, 7] and own.kept_step == 3    # the start is not a candidate
    assert not torch.equal(params, calls[0])
    arrays = judged.to_arrays()
    assert arrays["snapshots"].shape == (5, 2) and int(arrays["kept_step"]) == 4


@pytest.mark.parametrize("text,words", [("snapshot_every: -1", "optimizer.snapshot_every"),
                                        ("snapshot_seeds: []", "optimizer.snapshot_seeds"),
                                        ("snapshot_seeds: [1, -2]", "optimizer.snapshot_seeds"),
                                        ("snapshot_seconds: 0", "optimizer.snapshot_seconds"),
                                        ("starts_first: 0", "optimizer.starts_first"),
                                        ("starts_first: 2", "optimizer.starts_first.*snapshot_every"),
                                        ("restart_below: 0.2", "optimizer.restart_below.*snapshot_every"),
                                        ("restart_below: -0.1", "optimizer.restart_below"),
                                        ("snapshot_every: 5, restart_below: 1.5", "optimizer.restart_below.*at most 1"),
                                        ("restart_from: 1", "optimizer.restart_from"),
                                        ("judge_processes: 0", "optimizer.judge_processes")])
def test_snapshot_settings_are_validated(tmp_path, text, words):
    path = tmp_path / "train.yaml"
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\noptimizer: {{{text}}}\n")
    with pytest.raises(ConfigError, match=words):
        load_train_config(path)


def test_particle_splitting_is_refused_on_cuda(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\ndevice: cuda\nparallel: processes\n")
    with pytest.raises(ConfigError, match="parallel.*use parallel: ops with device: cuda"):
        load_train_config(path)


def test_particle_processes_report_worker_failures_and_stop_their_workers():
    from mcpilco_core.learning.parallel import ParticleProcesses

    model = _fitted_model()
    policy = TorchPolicy.random(4, 3.0, torch.Generator().manual_seed(1), dtype=torch.float64)
    noise = torch.zeros(3, 6, 2, dtype=torch.float64)
    x0 = torch.zeros(6, 4, dtype=torch.float64)
    pool = ParticleProcesses(model, 2)
    try:
        assert pool.cost_and_gradients(model, policy, x0, noise, 3, CostSettings()) > 0
        bad = x0.clone()
        bad[5, 2] = float("nan")                           # in the worker's share
        with pytest.raises(NonFiniteParticlesError, match="non-finite particle states"):
            pool.cost_and_gradients(model, policy, bad, noise, 3, CostSettings())
        assert pool.cost_and_gradients(model, policy, x0, noise, 3, CostSettings()) > 0   # still in step
        pool.processes[0].kill()
        pool.processes[0].join()
        with pytest.raises(RuntimeError, match="particle worker particles-1 died"):
            pool.cost_and_gradients(model, policy, x0, noise, 3, CostSettings())
    finally:
        processes = list(pool.processes)
        pool.close()
    assert not any(p.is_alive() for p in processes)


def test_bfloat16_backward_gives_close_gradients():
    model = _fitted_model(torch.float32, n=60)
    policy = TorchPolicy.random(20, 3.0, torch.Generator().manual_seed(9))
    x0 = torch.zeros(32, 4)
    grads = {}
    for precision in ("float32", "bfloat16"):
        model.posterior.set_backward_precision(precision)
        cost = trajectory_cost(rollout(model, policy, x0, 20, torch.Generator().manual_seed(1)), CostSettings())
        grads[precision] = torch.cat([g.flatten() for g in torch.autograd.grad(cost, list(policy.parameters()))])
    rel = (grads["float32"] - grads["bfloat16"]).norm() / grads["float32"].norm()
    assert float(rel) < 0.05


@pytest.mark.parametrize("native", [True, False])
def test_auto_backward_precision_is_bfloat16_only_where_the_cpu_multiplies_it_natively(tmp_path, monkeypatch, native):
    """Emulated bfloat16 matmuls made the acrobot's steps 3.5x slower on an AVX2-only CPU: auto must avoid them."""
    from mcpilco_core.learning import gp as gp_module
    from mcpilco_core.learning.runs import backward_precision_note

    monkeypatch.setattr(gp_module, "native_bfloat16_matmul", lambda: native)
    path = tmp_path / "train.yaml"
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\n")
    config = load_train_config(path)
    assert config.backward_matmul == "auto"                       # the default
    assert config.backward_precision == ("bfloat16" if native else "float32")
    assert config.to_dict()["backward_matmul_as_run"] == config.backward_precision
    assert "WARNING" not in backward_precision_note(config)
    forced = replace(config, backward_matmul="bfloat16")
    assert forced.backward_precision == "bfloat16"                 # an explicit setting is kept ...
    assert ("WARNING" in backward_precision_note(forced)) is (not native)   # ... and warned about where it is slow
    assert replace(config, backward_matmul="float32").backward_precision == "float32"
    assert replace(config, dtype="float64", backward_matmul="bfloat16").backward_precision == "float32"
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\nbackward_matmul: bf16\n")
    with pytest.raises(ConfigError, match=r"field 'backward_matmul'"):
        load_train_config(path)


def test_the_learner_sets_the_resolved_backward_precision_on_its_posterior(tmp_path, monkeypatch):
    from mcpilco_core.learning import gp as gp_module

    monkeypatch.setattr(gp_module, "native_bfloat16_matmul", lambda: False)
    path = tmp_path / "train.yaml"
    path.write_text(f"base: {CONFIG / 'train_tiny.yaml'}\nbackward_matmul: auto\n")
    learner = Learner(load_train_config(path))
    learner.exploration_trial()
    learner.learning_trial(1)
    assert learner.model.posterior.fast().backward_matrix.dtype == torch.float32
    monkeypatch.setattr(gp_module, "native_bfloat16_matmul", lambda: True)
    learner.learning_trial(2)
    assert learner.model.posterior.fast().backward_matrix.dtype == torch.bfloat16


def test_non_finite_particles_are_reported():
    model = _fitted_model()
    policy = TorchPolicy.random(4, 3.0, torch.Generator().manual_seed(1), dtype=torch.float64)
    x0 = torch.zeros(5, 4, dtype=torch.float64)
    x0[3, 2] = float("nan")
    with pytest.raises(NonFiniteParticlesError, match="first at step 0"):
        rollout(model, policy, x0, 3, torch.Generator().manual_seed(0))


def test_cost_wraps_angles_and_is_zero_at_goal():
    goal = torch.tensor([[math.pi, 0.0, 0.0, 0.0], [-math.pi, 2 * math.pi, 5.0, 0.0],
                         [5 * math.pi, -4 * math.pi, 0, 0]])
    assert torch.allclose(saturated_cost(goal, CostSettings()), torch.zeros(3), atol=1e-12)
    down = saturated_cost(torch.zeros(1, 4, dtype=torch.float64), CostSettings())
    assert float(down) == pytest.approx(1 - math.exp(-(math.pi / 3) ** 2))


def test_cost_lengthscales_are_per_joint():
    """c = 1 - exp(-((|wrap q1| - pi) / l1)^2 - (wrap(q2) / l2)^2) with l1 != l2."""
    settings = CostSettings(lengthscales=(2.0, 5.0))
    states = torch.tensor(np.random.default_rng(3).uniform(-7.0, 7.0, (50, 4)))
    q1 = np.remainder(states[:, 0].numpy() + math.pi, 2 * math.pi) - math.pi
    q2 = np.remainder(states[:, 1].numpy() + math.pi, 2 * math.pi) - math.pi
    expected = 1 - np.exp(-((np.abs(q1) - math.pi) / 2.0) ** 2 - (q2 / 5.0) ** 2)
    np.testing.assert_allclose(saturated_cost(states, settings).numpy(), expected, rtol=1e-12, atol=1e-15)


def test_roa_term_is_the_supervisors_lqr_cost_to_go(tmp_path):
    import numpy as np

    from mcpilco_core.config import load_robot_config
    from mcpilco_core.control import design_lqr, region_of_attraction
    from mcpilco_core.learning.cost import roa_cost
    from mcpilco_core.plant import DoublePendulum, wrap_state

    path = tmp_path / "train.yaml"
    path.write_text(f"robot_config: {CONFIG / 'acrobot.yaml'}\ncost: {{roa_weight: 2.0, roa_scale: 10}}\n")
    settings = load_train_config(path).cost
    robot = load_robot_config(CONFIG / "acrobot.yaml")
    plant = DoublePendulum(robot.plant)
    design = design_lqr(plant, robot.actuated_joint, robot.lqr.Q_diag, robot.lqr.R)
    rho = region_of_attraction(robot, plant, design).rho
    assert settings.roa_rho == pytest.approx(10 * rho * robot.roa.enter_fraction)
    noise = np.random.default_rng(0).normal(0, 1, (50, 4)) * [0.2, 0.2, 1, 1]
    states = noise + [5 * math.pi, -2 * math.pi, 0, 0]                 # wound up by whole turns
    expected = 1 - np.exp(-design.cost_to_go(wrap_state(states)) / settings.roa_rho)
    assert np.allclose(roa_cost(torch.as_tensor(states), settings).numpy(), expected, rtol=1e-9, atol=1e-12)
    goal = torch.tensor([[math.pi, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert float(saturated_cost(goal, settings)) == 0.0
    down = torch.zeros(1, 4, dtype=torch.float64)             # far outside: the term is 1, weighted 2 of 3
    assert float(saturated_cost(down, settings)) == pytest.approx((1 - math.exp(-(math.pi / 3) ** 2) + 2) / 3)
    path.write_text(f"robot_config: {CONFIG / 'acrobot.yaml'}\ncost: {{roa_weight: -1}}\n")
    with pytest.raises(ConfigError, match="cost.roa_weight"):
        load_train_config(path)
    with pytest.raises(ValueError, match="roa_metric"):
        CostSettings(roa_weight=1.0)


def test_catch_model_weights_each_state_by_the_chance_the_lqr_has_not_caught_yet(tmp_path):
    """cost.catch_level: J = sum_t E[s_t c(x_t)], s_t = prod_{k<=t} (1 - h(x_k)), h = 1 / (1 + (V / V50)^k)."""
    import numpy as np

    from mcpilco_core.control import build_controller
    from mcpilco_core.learning.cost import catch_probability, trajectory_cost
    from mcpilco_core.plant import wrap_state

    path = tmp_path / "train.yaml"
    path.write_text(f"robot_config: {CONFIG / 'acrobot.yaml'}\ncost: {{catch_level: 6, catch_sharpness: 2}}\n")
    settings = load_train_config(path).cost
    supervisor = build_controller(load_train_config(path).robot)
    assert settings.catch_v50 == pytest.approx(6 * supervisor.rho) and settings.roa_weight == 0.0
    # the catch probability is the supervisor's own cost-to-go through the fitted curve: 1/2 at V50
    rng = np.random.default_rng(1)
    states = rng.normal(0, 1, (20, 3, 4)) * [0.1, 0.1, 0.5, 0.5] + [3 * math.pi, 2 * math.pi, 0, 0]
    value = supervisor.design.cost_to_go(wrap_state(states.reshape(-1, 4))).reshape(20, 3)
    h = 1 / (1 + (value / settings.catch_v50) ** 2)
    got = catch_probability(torch.as_tensor(states), settings).numpy()
    assert np.allclose(got, h, rtol=1e-9)
    # the trajectory cost by hand: survival-weighted saturated costs, mean over particles, sum over time
    expected = (saturated_cost(torch.as_tensor(states), settings).numpy() * np.cumprod(1 - h, axis=0)).mean(-1).sum()
    assert float(trajectory_cost(torch.as_tensor(states), settings)) == pytest.approx(expected, rel=1e-9)
    # a particle at the goal is caught at once: it costs nothing afterwards, wherever the model takes it
    caught = torch.tensor([[[math.pi, 0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0, 0.0]]],
                          dtype=torch.float64)
    assert float(trajectory_cost(caught, settings)) == 0.0
    plain = CostSettings()
    assert float(trajectory_cost(caught, plain)) == pytest.approx(2 * (1 - math.exp(-(math.pi / 3) ** 2)))
    # gradients flow through the catch model: moving towards the basin lowers the cost of the states after it
    near = torch.tensor([[[math.pi + 0.05, 0.02, 0.3, -0.2]], [[2.0, 0.5, 1.0, 1.0]]], dtype=torch.float64,
                        requires_grad=True)
    trajectory_cost(near, settings).backward()
    assert torch.isfinite(near.grad).all() and float(near.grad[0, 0, 2]) > 0.0   # less speed at step 0: lower J
    # bad values: named errors
    path.write_text(f"robot_config: {CONFIG / 'acrobot.yaml'}\ncost: {{catch_level: -1}}\n")
    with pytest.raises(ConfigError, match="cost.catch_level"):
        load_train_config(path)
    path.write_text(f"robot_config: {CONFIG / 'acrobot_policy_only.yaml'}\ncost: {{catch_level: 6}}\n")
    with pytest.raises(ConfigError, match="cost.catch_level.*never takes over"):
        load_train_config(path)
    with pytest.raises(ValueError, match="roa_metric"):
        CostSettings(catch_v50=1.0)
    with pytest.raises(ValueError, match="catch_sharpness"):
        CostSettings(catch_v50=1.0, roa_metric=((1.0,),), catch_sharpness=0.0)


def test_height_term_is_the_scores_line_on_the_controllers_own_links(tmp_path):
    """cost.height_weight w: c = (c_seed + w sigma((line - h) / scale)) / (1 + w), h the end effector's height."""
    path = tmp_path / "train.yaml"
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\ncost: {{height_weight: 2.0, height_scale: 0.01}}\n")
    settings = load_train_config(path).cost
    plant = load_train_config(path).robot.plant
    assert settings.link_lengths == (plant.l[0], plant.l[1])
    assert settings.height_line == pytest.approx(0.9 * (plant.l[0] + plant.l[1]))
    states = torch.tensor([[0.0, 0.0, 0.0, 0.0], [math.pi, 0.0, 0.0, 0.0], [math.pi - 0.3, 0.3, 0.0, 0.0],
                           [math.pi - 0.9, 0.0, 0.0, 0.0]], dtype=torch.float64)
    l1, l2 = settings.link_lengths
    height = -l1 * torch.cos(states[:, 0]) - l2 * torch.cos(states[:, 0] + states[:, 1])
    below = torch.sigmoid((settings.height_line - height) / 0.01)
    expected = (saturated_cost(states, CostSettings()) + 2.0 * below) / 3.0
    assert torch.allclose(saturated_cost(states, settings), expected, rtol=1e-12)
    assert float(below[0]) > 0.999 and float(below[1]) < 0.01          # hanging: below; upright: above the line
    assert float(below[2]) < 0.5 < float(below[3])                     # tilted with the tip up: above; 0.9 rad: below
    # off by default: configs without it keep the seed's cost exactly
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\n")
    assert load_train_config(path).cost == CostSettings()
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\ncost: {{height_weight: -1}}\n")
    with pytest.raises(ConfigError, match="cost.height_weight"):
        load_train_config(path)
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\ncost: {{height_weight: 1, height_scale: 0}}\n")
    with pytest.raises(ConfigError, match="cost.height_scale"):
        load_train_config(path)
    with pytest.raises(ValueError, match="link_lengths"):
        CostSettings(height_weight=1.0)


def test_velocity_term_makes_passing_the_top_fast_costly(tmp_path):
    settings = CostSettings(velocity_lengthscales=(12.0, 6.0))
    at_rest_on_top = torch.tensor([[math.pi, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert float(saturated_cost(at_rest_on_top, settings)) == 0.0
    spinning = torch.tensor([[math.pi, 0.0, 12.0, -6.0]], dtype=torch.float64)
    assert float(saturated_cost(spinning, settings)) == pytest.approx(1 - math.exp(-2.0))
    assert float(saturated_cost(spinning, CostSettings())) == 0.0           # the seed's cost ignores speed
    path = tmp_path / "train.yaml"
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\ncost: {{velocity_lengthscales: [12, 6]}}\n")
    assert load_train_config(path).cost == settings
    path.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\ncost: {{velocity_lengthscales: [12, 0]}}\n")
    with pytest.raises(ConfigError, match=r"cost.velocity_lengthscales\[1\]"):
        load_train_config(path)


def test_transitions_resample_trajectory_at_the_policy_period():
    t = np.arange(41) * 0.002
    x = np.cumsum(np.ones((41, 4)), 0)
    u = np.zeros((40, 2))
    u[:, 1] = np.arange(40)
    data = transitions_from_trajectory(t, x, u, 0.02, actuated_joint=1)
    assert len(data) == 4
    np.testing.assert_array_equal(data.x[:, 0], [1, 11, 21, 31])
    np.testing.assert_array_equal(data.x_next[:, 0], [11, 21, 31, 41])
    np.testing.assert_allclose(data.u, [4.5, 14.5, 24.5, 34.5])


def test_plateau_monitor_detects_noise_but_not_a_trend():
    rng = np.random.default_rng(0)
    flat = PlateauMonitor(0.97, 0.1, 30)
    assert any(flat.update(10 + rng.normal()) for _ in range(400))
    trend = PlateauMonitor(0.97, 0.1, 30)
    assert not any(trend.update(100 - 0.5 * k + 0.1 * rng.normal()) for k in range(400))


def test_plateau_monitor_corrects_the_startup_bias_of_its_averages():
    """The moving averages start at 0: divided by their weight 1 - a^n, the first changes of a steady descent give
    their true mean and no spread (a trend), instead of a mean shrunk towards 0 that reads as noise and stops the
    learning-rate schedule in its first steps."""
    monitor = PlateauMonitor(0.97, 0.5, 5)
    assert not any(monitor.update(100.0 - k) for k in range(10))
    assert monitor.ratio > 10.0


def test_each_plateau_halves_the_learning_rate_and_scales_the_dropout_until_the_minimum(monkeypatch):
    """The optimiser's schedule (optimizer.py's docstring): at a plateau (once min_steps are done) lr x lr_factor, down
    to lr_min, and dropout x dropout_factor; at a plateau with lr at lr_min it stops. The rate Adam steps with is the
    scheduled one. Plateaus are scripted here (every 3rd step), the rollout a cheap function of the policy."""
    from dataclasses import replace

    from mcpilco_core.learning import optimizer as opt_module

    class EveryThirdStep:
        def __init__(self, *args):
            self.calls, self.ratio = 0, 0.0

        def update(self, cost):
            self.calls += 1
            return self.calls % 3 == 0

    stepped_with = []

    class RecordingAdam(torch.optim.Adam):
        def step(self, closure=None):
            stepped_with.append(self.param_groups[0]["lr"])
            return super().step(closure)

    def cheap_rollout(model, policy, x0, steps, generator, noise=None):
        return torch.stack([x0, x0 + 0.1 * policy(x0).unsqueeze(-1)])

    monkeypatch.setattr(opt_module, "PlateauMonitor", EveryThirdStep)
    monkeypatch.setattr(opt_module, "rollout", cheap_rollout)
    monkeypatch.setattr(torch.optim, "Adam", RecordingAdam)
    settings = replace(opt_module.OptimizerSettings(), lr=0.01, lr_min=0.003, lr_factor=0.5, dropout=0.2,
                       dropout_factor=0.5, min_steps=5)
    policy = TorchPolicy.random(5, 3.0, torch.Generator().manual_seed(0), dtype=torch.float64)
    result = opt_module.optimize_policy(policy, None, lambda n, g: torch.rand(n, 4, generator=g, dtype=torch.float64),
                                        4, 1, CostSettings(), settings, 100, torch.Generator().manual_seed(1),
                                        progress=False)
    # plateaus after steps 3 (before min_steps: ignored), 6, 9 and 12 (lr at its minimum: stop)
    assert result.stop_reason == "plateau at the minimum learning rate" and result.steps == 12
    assert result.lr == [0.01] * 6 + [0.005] * 3 + [0.003] * 3        # 0.0025 held at lr_min
    assert result.dropout == pytest.approx([0.2] * 6 + [0.1] * 3 + [0.05] * 3)
    assert stepped_with == result.lr


def test_curriculum_and_initial_distribution():
    assert [curriculum_gamma(k, 5, 10) for k in (0, 5, 10, 15, 30)] == [0, 0, 0.5, 1, 1]
    config = load_train_config(CONFIG / "train_pendubot.yaml", "pendubot")
    rng, _ = trial_generators(0, 10)
    x = initial_distribution(config, 10, np.zeros((0, 4))).sample_numpy(2000, rng)
    assert np.abs(x[:, 0]).max() <= math.pi / 2 and np.abs(x[:, 0]).max() > 1.4
    assert np.all(initial_distribution(config, 2, np.zeros((0, 4))).sample_numpy(5, rng) == 0)
    pool = np.full((3, 4), 7.0)
    mixed = initial_distribution(config, 2, pool)
    mixed.pool_fraction, mixed.jitter = 0.5, 0.0
    share = np.mean(mixed.sample_numpy(1000, rng)[:, 0] == 7.0)
    assert 0.4 < share < 0.6
    torch_sample = mixed.sampler("cpu", torch.float32)(1000, torch.Generator().manual_seed(0))
    assert 0.4 < float((torch_sample[:, 0] == 7.0).float().mean()) < 0.6


def test_controller_nodes_never_import_torch():
    """The nodes on the robot (controller with exploration, drivers) start fast and never pull in torch: the
    exploration signal's generator is the learner's trial generator, built without it."""
    import subprocess
    import sys

    code = ("import sys; import mcpilco_ros.controller_node, mcpilco_ros.sim_driver_node, "
            "mcpilco_ros.moteus_driver_node; from mcpilco_core.control.exploration import trial_rng; "
            "trial_rng(3, 2).uniform(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    from mcpilco_core.control.exploration import trial_rng

    assert trial_rng(3, 2).uniform() == trial_generators(3, 2)[0].uniform()


def test_trial_generators_depend_only_on_seed_and_trial():
    a, ta = trial_generators(1, 4)
    b, tb = trial_generators(1, 4)
    c, _ = trial_generators(1, 5)
    assert a.random() == b.random() != c.random()
    assert torch.equal(torch.rand(3, generator=ta), torch.rand(3, generator=tb))


def test_exploration_holds_torque_for_one_policy_period_on_the_actuated_joint():
    config = load_robot_config(CONFIG / "acrobot.yaml")
    ctrl = ExplorationController(config, 2.0, np.random.default_rng(0))
    us = np.array([ctrl.step(np.zeros(4), k * 0.002) for k in range(30)])
    assert np.all(us[:, 0] == 0.0) and np.abs(us[:, 1]).max() <= 2.0
    assert len(np.unique(us[:10, 1])) == 1 and us[10, 1] != us[9, 1]


def test_train_config_errors_name_file_and_field(tmp_path):
    bad = tmp_path / "train.yaml"
    bad.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\noptimizer: {{lr: -1}}\n")
    with pytest.raises(ConfigError, match=r"train.yaml: field 'optimizer.lr'"):
        load_train_config(bad)
    bad.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\nparticels: 3\n")
    with pytest.raises(ConfigError, match="particels"):
        load_train_config(bad)
    bad.write_text(f"robot_config: {CONFIG / 'pendubot.yaml'}\ngp: {{prior: midpoint}}\n")
    with pytest.raises(ConfigError, match=r"field 'gp.prior'"):
        load_train_config(bad)
    bad.write_text(f"robot_config: {CONFIG / 'pendubot_dither.yaml'}\npolicy: {{u_max: 6.5}}\n")
    with pytest.raises(ConfigError, match=r"field 'policy.u_max'.*u_max 3.0 N m \(torque limit 6.0"):
        load_train_config(bad)
    bad.write_text(f"robot_config: {CONFIG / 'pendubot_dither.yaml'}\npolicy: {{u_max: 3.5}}\n")   # its bound: 3
    with pytest.raises(ConfigError, match=r"field 'policy.u_max'"):
        load_train_config(bad)
    bad.write_text(f"robot_config: {CONFIG / 'acrobot.yaml'}\npolicy: {{u_max: 6.0}}\n")
    assert load_train_config(bad).policy_u_max == 6.0
    with pytest.raises(ConfigError, match="robot_config"):
        load_train_config(CONFIG / "train_pendubot.yaml", "acrobot")
    shipped = sorted(CONFIG.glob("train_*.yaml")) + sorted(CONFIG.glob("experiments/*.yaml"))
    assert len(shipped) >= 12
    for path in shipped:                                  # every shipped training config loads
        assert load_train_config(path).policy_u_max in (3.0, 6.0)


@pytest.mark.parametrize("section, key", [("evaluation", "seeds"), ("initial_state", "disturbance_seeds"),
                                          ("optimizer", "snapshot_seeds")])
@pytest.mark.parametrize("seed", [-1, 2**32])
def test_protocol_seeds_out_of_numpys_range_are_refused_at_load(tmp_path, section, key, seed):
    """evaluation.seeds [-1] loaded and stopped the run with numpy's ValueError only after the first trial's
    optimisation; every protocol seed list is checked when the file is read."""
    bad = tmp_path / "train.yaml"
    bad.write_text(f"base: {CONFIG / 'train_tiny.yaml'}\n{section}: {{{key}: [100, {seed}]}}\n")
    with pytest.raises(ConfigError, match=rf"train.yaml: field '{section}.{key}\[1\]': a seed must be in 0 \.\. 2"):
        load_train_config(bad)


def test_experiment_files_override_their_base(tmp_path):
    """`base:` merges mappings key by key, replaces anything else, keeps robot_config relative to its own file."""
    base = load_train_config(CONFIG / "train_acrobot_u6.yaml")
    experiment = load_train_config(CONFIG / "experiments" / "acrobot_u6_roa100.yaml")   # base of a base
    assert experiment.robot.robot == "acrobot" and experiment.cost.roa_weight == 1.0
    assert experiment.trials == 12 and base.trials == 10
    assert experiment.cost.velocity_lengthscales == base.cost.velocity_lengthscales          # merged, not replaced
    assert experiment.gp == base.gp and experiment.optimizer == base.optimizer
    loop = tmp_path / "loop.yaml"
    loop.write_text("base: loop.yaml\n")
    with pytest.raises(ConfigError, match=r"field 'base'.*includes itself"):
        load_train_config(loop)
    (tmp_path / "typo.yaml").write_text(f"base: {CONFIG / 'train_tiny.yaml'}\ntrails: 3\n")
    with pytest.raises(ConfigError, match="trails"):
        load_train_config(tmp_path / "typo.yaml")
    missing = tmp_path / "missing.yaml"
    missing.write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml"):
        load_train_config(missing)
    (tmp_path / "number.yaml").write_text("robot_config: 5\n")       # a base's robot_config that is no file name
    (tmp_path / "inherits.yaml").write_text("base: number.yaml\n")
    with pytest.raises(ConfigError, match=r"number.yaml: field 'robot_config': expected a string, got 5"):
        load_train_config(tmp_path / "inherits.yaml")


def test_auto_threads_follow_omp_num_threads(monkeypatch):
    """The trainer node limits its retraining process with OMP_NUM_THREADS; `threads: auto` must honour it."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = load_train_config(CONFIG / "train_pendubot.yaml")
    assert config.threads == 1 and config.particle_threads == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    config = load_train_config(CONFIG / "train_pendubot.yaml")
    assert config.threads == min(2, os.cpu_count() or 1) and config.parallel == "processes"


def test_initial_lengthscales_set_the_policy_and_are_validated():
    policy = TorchPolicy.random(5, 3.0, torch.Generator().manual_seed(0), 15.0, torch.float64,
                                (4.0, 4.0, 1.0, 1.0, 1.0, 1.0))
    torch.testing.assert_close(policy.log_lengthscales.exp(), torch.tensor([4.0, 4.0, 1, 1, 1, 1], dtype=torch.float64))
    assert float(policy.centers[:, :2].abs().max()) <= 15.0
    with pytest.raises(ValueError, match="6 positive"):
        TorchPolicy.random(5, 3.0, torch.Generator().manual_seed(0), lengthscales=(1.0, 0.0, 1, 1, 1, 1))


def _friction_model(robot, prior="euler", delay=0.0):
    from dataclasses import replace

    config = load_robot_config(CONFIG / f"{robot}.yaml")
    fitted = _fitted_model()
    model = DynamicsModel(replace(config, plant=replace(config.plant, b=(0.05, 0.02), cf=(0.1, 0.03))),
                          GPSettings(prior=prior, identify=bool(delay), delay_aware=bool(delay)))
    if delay:
        model.set_prior_plant(model.config.plant, delay)
    model.hyper, model.subsets, model.posterior = fitted.hyper, fitted.subsets, fitted.posterior
    assert len(model.prior_constants.friction) == 2 and model.prior_constants.delay == delay
    return model


@pytest.mark.parametrize("robot,prior,delay", [("pendubot", "euler", 0.0), ("acrobot", "euler", 0.0),
                                               ("pendubot", "rk4", 0.0), ("acrobot", "rk4", 0.0),
                                               ("pendubot", "rk4", 0.3), ("acrobot", "euler", 0.2)])
@pytest.mark.parametrize("sample", [True, False])
def test_fused_rollout_equals_reference_with_gradients(robot, prior, delay, sample):
    """The fused rollout (hand-written backward, policy kernel) equals the plain-autograd reference in float64,
    states and gradients w.r.t. every policy parameter and x0, with friction terms in the prior (Euler and RK4
    priors: the RK4 backward chains four stages by hand) and with a command delay (``gp.delay_aware``: the
    gradient also runs from each step's torque into the next step's through the previous command)."""
    model = _friction_model(robot, prior, delay)
    policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)
    policy.set_dropout(0.25, torch.Generator().manual_seed(2))
    x0 = torch.tensor(_states(np.random.default_rng(7), 5) * 0.2, requires_grad=True)
    results = {}
    for mode in ("reference", "fused"):
        traj = rollout(model, policy, x0, 7, torch.Generator().manual_seed(8), sample=sample, mode=mode)
        cost = trajectory_cost(traj, CostSettings()) + (traj ** 2).mean()
        results[mode] = (traj.detach(), torch.autograd.grad(cost, [x0, *policy.parameters()]))
    torch.testing.assert_close(results["fused"][0], results["reference"][0], rtol=1e-12, atol=1e-12)
    for a, b in zip(results["fused"][1], results["reference"][1]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_fused_rollout_float32_close_to_reference():
    """float32 (and the bfloat16 backward matmul): fused and reference agree to float32 noise."""
    model = _fitted_model(torch.float32, n=60)
    policy = TorchPolicy.random(20, 3.0, torch.Generator().manual_seed(9))
    x0 = (torch.rand(64, 4, generator=torch.Generator().manual_seed(3)) - 0.5) * torch.tensor([6.0, 6.0, 1.0, 1.0])
    for precision, grad_tol in (("float32", 1e-3), ("bfloat16", 0.05)):
        model.posterior.set_backward_precision(precision)
        out = {}
        for mode in ("reference", "fused"):
            traj = rollout(model, policy, x0, 30, torch.Generator().manual_seed(1), mode=mode)
            cost = trajectory_cost(traj, CostSettings())
            grads = torch.cat([g.flatten() for g in torch.autograd.grad(cost, list(policy.parameters()))])
            out[mode] = traj.detach(), grads
        torch.testing.assert_close(out["fused"][0], out["reference"][0], rtol=1e-4, atol=1e-4)
        rel = (out["fused"][1] - out["reference"][1]).norm() / out["reference"][1].norm()
        assert float(rel) < grad_tol, (precision, float(rel))


def test_fused_gp_prediction_gradient_equals_reference():
    model = _fitted_model()
    x = torch.tensor(model.gp_inputs(_states(np.random.default_rng(3), 9) * 0.3,
                                     np.random.default_rng(4).uniform(-3, 3, 9)), requires_grad=True)
    weights = torch.tensor(np.random.default_rng(5).normal(size=(9, 4)))
    results = []
    for predict in (model.posterior.predict, model.posterior.predict_reference):
        mean, var = predict(x)
        value = (torch.cat([mean, var], -1) * weights).sum()
        results.append((mean.detach(), var.detach(), torch.autograd.grad(value, x)[0]))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_compiled_rollout_falls_back_to_eager_when_compilation_fails(monkeypatch, caplog):
    from mcpilco_core.learning import fused, torch_policy

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(fused, "_KERNELS", {})
    monkeypatch.setattr(torch_policy, "_KERNELS", {})
    model = _fitted_model()
    policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)
    x0 = torch.tensor(_states(np.random.default_rng(7), 4) * 0.2)
    with caplog.at_level("WARNING", logger="mcpilco.compile"):
        compiled = rollout(model, policy, x0, 5, torch.Generator().manual_seed(8), mode="compiled")
    assert "no compiler here" in caplog.text
    torch.testing.assert_close(compiled, rollout(model, policy, x0, 5, torch.Generator().manual_seed(8)))


def test_fresh_compilation_gives_a_failed_kernel_its_compiled_version_back(monkeypatch):
    """A kernel that fell back to eager (e.g. torch.compile's recompile limit in a long offline run) compiles again
    after fresh_compilation, as in a new process; a kernel never asked to compile stays eager."""
    from mcpilco_core.learning import compile as compile_module

    calls = []

    def fake_compile(fn, **kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            def failing(*args):
                raise RuntimeError("recompile limit")
            return failing
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append("reset"))
    kernel = compile_module.MaybeCompiled(lambda x: x + 1, compiled=True)
    eager = compile_module.MaybeCompiled(lambda x: x - 1, compiled=False)
    assert kernel(1) == 2 and not kernel.active            # the first compiled version failed: eager from then on
    assert kernel(2) == 3 and len(calls) == 1
    compile_module.fresh_compilation()
    assert kernel.active and kernel.compiled is None and "reset" in calls
    assert kernel(3) == 4 and kernel.active and len([c for c in calls if c != "reset"]) == 2   # compiled anew
    assert eager(3) == 2 and not eager.active


def test_policy_rollout_function_equals_forward_features_with_gradients():
    policy = TorchPolicy.random(12, 3.0, torch.Generator().manual_seed(4), dtype=torch.float64)
    policy.set_dropout(0.25, torch.Generator().manual_seed(5))
    x = torch.tensor(_states(np.random.default_rng(6), 10) * 0.3)
    rows = torch.cat([x[:, 2:], torch.cos(x[:, :2]), torch.sin(x[:, :2])], -1).T.contiguous().requires_grad_(True)
    u_fast = policy.rollout_function()(rows)
    u_ref = policy.forward_features(rows.T)
    torch.testing.assert_close(u_fast, u_ref, rtol=1e-12, atol=1e-12)
    weights = torch.linspace(-1.0, 1.0, 10, dtype=torch.float64)
    inputs = [rows, *policy.parameters()]
    for a, b in zip(torch.autograd.grad((u_fast * weights).sum(), inputs),
                    torch.autograd.grad((u_ref * weights).sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_delay_acts_from_the_second_step_on():
    """Step 0 has no previous command (the effective torque is u); later steps see u + a (u_prev - u), so the
    delay-aware rollout leaves the plain one after the first step and by a rising margin."""
    policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)
    x0 = torch.tensor(_states(np.random.default_rng(7), 5) * 0.2)
    plain = rollout(_friction_model("acrobot", "rk4"), policy, x0, 6, None, sample=False)
    late = rollout(_friction_model("acrobot", "rk4", 0.3), policy, x0, 6, None, sample=False)
    torch.testing.assert_close(late[:2], plain[:2], rtol=0.0, atol=0.0)
    gaps = (late - plain).abs().amax((1, 2))
    assert float(gaps[2]) > 1e-6 and float(gaps[-1]) > float(gaps[2])


def test_saved_delay_aware_model_keeps_its_delay_and_is_refused_by_other_settings():
    model = _friction_model("pendubot", "euler", 0.25)
    fitted = _fitted_model()
    model._inputs, model._targets = fitted._inputs, fitted._targets
    arrays = model.to_arrays()
    loaded = DynamicsModel(model.config, model.settings)
    loaded.load_arrays(arrays, dtype=torch.float64)
    assert loaded.delay_fraction == 0.25 and loaded.prior_constants.delay == 0.25
    with pytest.raises(ValueError, match="delay_aware = True but the settings say False"):
        DynamicsModel(model.config, GPSettings()).load_arrays(arrays, dtype=torch.float64)
    for key in ("delay_aware", "delay_fraction"):       # models saved before the option: not delay-aware
        del arrays[key]
    plain = DynamicsModel(model.config, GPSettings())
    plain.load_arrays(arrays, dtype=torch.float64)
    assert plain.prior_constants.delay == 0.0


def test_compiled_rollout_equals_fused():
    """torch.compile path (or its eager fallback where no compiler works): same states and gradients."""
    for model in (_fitted_model(), _friction_model("acrobot", "euler", 0.2)):    # (RK4 compiled: ~1e-9 apart)
        _compiled_equals_fused(model)


def _compiled_equals_fused(model):
    policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)
    x0 = torch.tensor(_states(np.random.default_rng(7), 4) * 0.2)
    out = {}
    for mode in ("fused", "compiled"):
        traj = rollout(model, policy, x0, 5, torch.Generator().manual_seed(8), mode=mode)
        out[mode] = traj.detach(), torch.autograd.grad(trajectory_cost(traj, CostSettings()), list(policy.parameters()))
    torch.testing.assert_close(out["compiled"][0], out["fused"][0], rtol=1e-10, atol=1e-12)
    for a, b in zip(out["compiled"][1], out["fused"][1]):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_a_run_of_an_experiment_file_describes_itself(tmp_path):
    """The run directory keeps the resolved settings: it reloads without the base file."""
    from mcpilco_core.learning.runs import RunDirectory, RunError

    experiment = tmp_path / "exp.yaml"
    experiment.write_text(f"base: {CONFIG / 'train_tiny.yaml'}\ntrials: 3\n")
    config = load_train_config(experiment)
    run = RunDirectory(tmp_path / "run")
    run.create(config, resume=False)
    copy = (tmp_path / "run" / "train_config.yaml").read_text()
    assert "base:" not in copy and "trials: 3" in copy
    reloaded = run.load_config()
    assert reloaded.trials == 3 and reloaded.particles == config.particles and reloaded.gp == config.gp
    run.create(config, resume=True)                                   # same settings: resumable
    experiment.write_text(f"base: {CONFIG / 'train_tiny.yaml'}\ntrials: 4\n")
    with pytest.raises(RunError, match="another configuration"):
        run.create(load_train_config(experiment), resume=True)


def test_particles_run_with_subnormals_flushed_and_the_rest_of_the_thread_does_not():
    """denormals_flushed: while particles are propagated (the optimiser's step, each share of a split step, the
    selection's ranking) subnormal float32 values count as 0 -- the GP kernel's far tails, which cost Intel CPUs a
    microcode assist per operation (a 340x slower bmm measured) -- and outside it, and after a nested use, this
    thread's arithmetic (the numpy protocol simulations included) is IEEE again."""
    from mcpilco_core.learning.model import denormals_flushed

    tiny = torch.tensor([1e-39], dtype=torch.float32)
    if not torch.set_flush_denormal(False) or float(tiny * 1.0) == 0.0:
        pytest.skip("this CPU cannot flush subnormals (torch.set_flush_denormal: x86 SSE3 / AArch64 only)")
    assert float(tiny * 1.0) > 0.0 and float(np.float32(1e-39) * np.float32(1.0)) > 0.0
    with denormals_flushed():
        assert float(tiny * 1.0) == 0.0
        with denormals_flushed():
            assert float(tiny * 1.0) == 0.0
        assert float(tiny * 1.0) == 0.0                    # the inner exit keeps the outer's setting
    assert float(tiny * 1.0) > 0.0 and float(np.float32(1e-39) * np.float32(1.0)) > 0.0
    with pytest.raises(RuntimeError, match="inside"), denormals_flushed():
        raise RuntimeError("inside")
    assert float(tiny * 1.0) > 0.0                         # restored on an exception too


@pytest.mark.parametrize("threads", [1, 2])
def test_the_optimisers_steps_run_with_subnormals_flushed(monkeypatch, threads):
    """Every rollout of an optimisation step, in one thread or in each share's thread, runs inside
    denormals_flushed; the caller's thread is IEEE again afterwards."""
    import mcpilco_core.learning.optimizer as optimizer
    import mcpilco_core.learning.parallel as parallel
    from mcpilco_core.learning.optimizer import OptimizerSettings, optimize_policy

    tiny = torch.tensor([1e-39], dtype=torch.float32)
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormals")
    flushed = []

    def watched(*args, **kwargs):
        flushed.append(float(tiny * 1.0) == 0.0)
        return rollout(*args, **kwargs)

    monkeypatch.setattr(optimizer, "rollout", watched)
    monkeypatch.setattr(parallel, "rollout", watched)
    policy = TorchPolicy.random(8, 3.0, torch.Generator().manual_seed(6), dtype=torch.float64)

    def sample(n, generator):
        return (torch.rand((n, 4), generator=generator, dtype=torch.float64) - 0.5) * 0.4

    optimize_policy(policy, _fitted_model(), sample, 6, 5, CostSettings(), OptimizerSettings(), 3,
                    torch.Generator().manual_seed(1), progress=False, particle_threads=threads)
    assert len(flushed) == 3 * threads and all(flushed)
    assert float(tiny * 1.0) > 0.0
