"""GP model: posterior against a closed-form exact GP, likelihood fit, Subset of Data behaviour."""

import numpy as np
import pytest
import torch

from mcpilco_core.learning.gp import (
    GPHyperparameters,
    build_posterior,
    fit_hyperparameters,
    negative_log_marginal_likelihood,
    select_subset,
)


def _hyper(ls, sf2, s2):
    raw_sf = np.log(np.expm1(np.asarray(sf2, dtype=float)))
    raw_s2 = np.log(np.expm1(np.asarray(s2, dtype=float) - 1e-8))
    return GPHyperparameters(torch.tensor(np.log(ls), dtype=torch.float64), torch.tensor(raw_sf),
                             torch.tensor(raw_s2), noise_floor=1e-8)


def _exact(x, y, xt, ls, sf2, s2):
    def k(a, b):
        d = (a[:, None, :] - b[None, :, :]) / ls
        return sf2 * np.exp(-0.5 * (d ** 2).sum(-1))
    kxx = k(x, x) + s2 * np.eye(len(x))
    ks = k(xt, x)
    mean = ks @ np.linalg.solve(kxx, y)
    var = sf2 - np.einsum("ij,ji->i", ks, np.linalg.solve(kxx, ks.T))
    return mean, var


def test_posterior_matches_closed_form_exact_gp():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 3))
    y = np.stack([np.sin(x[:, 0]) + 0.1 * x[:, 1], np.cos(x[:, 2])], -1)
    xt = rng.normal(size=(11, 3))
    ls = np.array([[0.7, 1.3, 2.0], [1.1, 0.5, 0.9]])
    sf2, s2 = np.array([0.8, 1.7]), np.array([0.01, 0.03])
    post = build_posterior(_hyper(ls, sf2, s2), x, y, [np.arange(30), np.arange(30)], dtype=torch.float64)
    mean, var = post.predict(torch.tensor(xt), include_noise=False)
    for j in range(2):
        m_ref, v_ref = _exact(x, y[:, j], xt, ls[j], sf2[j], s2[j])
        np.testing.assert_allclose(mean[:, j].numpy(), m_ref, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(var[:, j].numpy(), v_ref, rtol=1e-7, atol=1e-10)
    _, var_y = post.predict(torch.tensor(xt), include_noise=True)
    np.testing.assert_allclose((var_y - var).numpy(), np.tile(s2, (11, 1)), rtol=1e-9)


def test_padded_subsets_of_different_sizes_match_separate_gps():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 2))
    y = rng.normal(size=(20, 2))
    ls, sf2, s2 = np.array([[1.0, 0.8], [0.6, 1.2]]), np.array([1.0, 0.5]), np.array([0.05, 0.02])
    subsets = [np.arange(0, 20, 2), np.arange(15)]
    post = build_posterior(_hyper(ls, sf2, s2), x, y, subsets, dtype=torch.float64)
    xt = rng.normal(size=(5, 2))
    mean, var = post.predict(torch.tensor(xt), include_noise=False)
    for j, idx in enumerate(subsets):
        m_ref, v_ref = _exact(x[idx], y[idx, j], xt, ls[j], sf2[j], s2[j])
        np.testing.assert_allclose(mean[:, j].numpy(), m_ref, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(var[:, j].numpy(), v_ref, rtol=1e-7, atol=1e-10)


def test_float32_posterior_close_to_float64():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(80, 3))
    y = np.stack([np.sin(2 * x[:, 0]), x[:, 1] * x[:, 2]], -1)
    hyper = _hyper(np.ones((2, 3)), np.array([1.0, 1.0]), np.array([1e-4, 1e-4]))
    subsets = select_subset(x, hyper, 60, 0.5)
    p64 = build_posterior(hyper, x, y, subsets, dtype=torch.float64)
    p32 = build_posterior(hyper, x, y, subsets, dtype=torch.float32)
    xt = torch.tensor(rng.normal(size=(50, 3)))
    m64, v64 = p64.predict(xt)
    m32, v32 = p32.predict(xt.float())
    np.testing.assert_allclose(m32.double().numpy(), m64.numpy(), atol=2e-3)
    np.testing.assert_allclose(v32.double().numpy(), v64.numpy(), atol=2e-3)


def test_marginal_likelihood_fit_improves_and_recovers_noise_scale():
    rng = np.random.default_rng(3)
    x = rng.uniform(-3, 3, size=(120, 2))
    y = np.stack([np.sin(x[:, 0]), np.cos(x[:, 1])], -1) + 0.05 * rng.normal(size=(120, 2))
    hyper = GPHyperparameters.initial(x, y)
    before = float(negative_log_marginal_likelihood(hyper, torch.tensor(x), torch.tensor(y)))
    fitted, history = fit_hyperparameters(hyper, x, y, steps=300, lr=0.05)
    assert history[-1] < before - 0.5
    noise_std = np.sqrt(fitted.noise_variance().numpy())
    assert np.all((noise_std > 0.02) & (noise_std < 0.12))


def test_subset_of_data_skips_redundant_samples_and_respects_cap():
    rng = np.random.default_rng(4)
    base = rng.uniform(-2, 2, size=(10, 2))
    x = np.concatenate([base, base + 1e-6, rng.uniform(-2, 2, size=(200, 2))])
    hyper = _hyper(np.full((1, 2), 0.5), np.array([1.0]), np.array([1e-3]))
    # threshold 1: a sample is kept only if the subset predicts it with std above the noise std, so one
    # copy of a point suffices (with threshold 0.5 about four copies would be kept)
    (chosen,) = select_subset(x, hyper, max_points=1000, threshold=1.0, order=np.arange(len(x)))
    assert set(range(10)) <= set(chosen.tolist())
    assert not set(range(10, 20)) & set(chosen.tolist())  # duplicates add no information
    # every sample left out is predicted with std <= threshold * noise std by the chosen subset
    post = build_posterior(hyper, x, np.zeros((len(x), 1)), [chosen], dtype=torch.float64)
    _, var = post.predict(torch.tensor(x), include_noise=False)
    assert float(var.max()) <= 1e-3 + 1e-12
    (capped,) = select_subset(x, hyper, max_points=25, threshold=0.5)
    assert len(capped) == 25
    assert capped.max() == len(x) - 1  # newest first


def test_a_spike_kernel_stays_bounded_in_float32_and_the_lengthscale_floor_lifts_it():
    """The proxy acrobot's GP shrank the lengthscale of cos q1 to 9e-6 (docs/learner.md). Its scaled inputs reach
    1e5, and the expanded squared distance of the float32 kernel cancels: the exponent came out positive and the
    predictions overflowed to inf. The exponent is now clamped at 0 (k <= sf2, as it is exactly), so the float32
    predictions, reference and fused alike, stay within the bounds k in [0, sf2] gives. ``lengthscale_floor``
    keeps every lengthscale at or above a fraction of its input's std, from a warm start below it too."""
    rng = np.random.default_rng(0)
    x = np.c_[rng.uniform(-10, 10, 200), np.cos(rng.uniform(-0.5, 0.5, 200))]        # like dq1, cos q1
    y = 0.1 * rng.normal(size=(200, 1))
    x_test = torch.tensor(np.c_[rng.uniform(-10, 10, 2000), np.cos(rng.uniform(-0.5, 0.5, 2000))],
                          dtype=torch.float32)
    spike = _hyper([[0.0063, 8.8e-6]], [0.012], [0.0002])

    def bounded_predictions(hyper) -> bool:
        post = build_posterior(hyper, x, y, select_subset(x, hyper, 150, 0.5), "cpu", torch.float32)
        mean_bound = float(post.packed[0, :, post.size].abs().sum()) * (1 + 1e-5)     # sum |sf2 alpha|
        sf2, s2 = float(post.signal[0]), float(post.noise[0])
        for mean, var in (post.predict_reference(x_test), post.predict(x_test)):
            if not (torch.isfinite(mean).all() and torch.isfinite(var).all()):
                return False
            if float(mean.abs().max()) > mean_bound or not (var >= s2 * (1 - 1e-5)).all():
                return False
            if not (var <= (sf2 + s2) * (1 + 1e-5)).all():
                return False
        return True

    assert bounded_predictions(spike)
    unchanged, _ = fit_hyperparameters(spike, x, y, steps=0, lr=0.01)
    np.testing.assert_array_equal(unchanged.raw_lengthscales.numpy(), spike.raw_lengthscales.numpy())
    floor = 0.05 * x.std(axis=0)
    lifted, _ = fit_hyperparameters(spike, x, y, steps=0, lr=0.01, lengthscale_floor=0.05)
    np.testing.assert_allclose(lifted.lengthscales().numpy()[0], np.maximum([0.0063, 8.8e-6], floor), rtol=1e-12)
    fitted, history = fit_hyperparameters(spike, x, y, steps=60, lr=0.05, lengthscale_floor=0.05)
    assert np.all(fitted.lengthscales().numpy() >= floor * (1 - 1e-12)) and np.isfinite(history).all()
    assert bounded_predictions(fitted)


def test_negative_log_marginal_likelihood_is_the_gaussians_per_sample():
    """Sum over outputs of -log N(y_j; 0, K_j + s2_j I), divided by the number of samples (closed form)."""
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(5)
    x = rng.normal(size=(25, 3))
    y = np.stack([np.sin(x[:, 0]), x[:, 1] * x[:, 2]], -1) + 0.1 * rng.normal(size=(25, 2))
    ls = np.array([[0.7, 1.3, 2.0], [1.1, 0.5, 0.9]])
    sf2, s2 = np.array([0.8, 1.7]), np.array([0.01, 0.03])
    expected = 0.0
    for j in range(2):
        d = (x[:, None, :] - x[None, :, :]) / ls[j]
        cov = sf2[j] * np.exp(-0.5 * (d ** 2).sum(-1)) + s2[j] * np.eye(25)
        expected -= multivariate_normal(np.zeros(25), cov).logpdf(y[:, j])
    got = float(negative_log_marginal_likelihood(_hyper(ls, sf2, s2), torch.tensor(x), torch.tensor(y)))
    assert got == pytest.approx(expected / 25, rel=1e-10)


def test_subset_of_data_keeps_a_sample_exactly_when_its_std_exceeds_threshold_times_the_noise_std():
    """Scanning in order, sample i joins iff the predictive variance of f at x_i given the samples kept before it
    exceeds threshold^2 s2 (std > threshold x noise std); checked against the exact GP at every decision."""
    rng = np.random.default_rng(6)
    x = rng.uniform(-2, 2, size=(60, 2))
    ls, sf2, s2, threshold = np.array([[0.8, 0.8]]), 1.0, 0.01, 3.0
    (chosen,) = select_subset(x, _hyper(ls, [sf2], [s2]), max_points=1000, threshold=threshold,
                              order=np.arange(len(x)))
    kept, skipped = [], 0
    for i in range(len(x)):
        if kept:
            _, var = _exact(x[kept], np.zeros(len(kept)), x[i:i + 1], ls[0], sf2, s2)
            var = float(var[0])
        else:
            var = sf2
        assert abs(var - threshold ** 2 * s2) > 1e-9            # no decision on the edge
        if var > threshold ** 2 * s2:
            kept.append(i)
        else:
            skipped += 1
    assert chosen.tolist() == kept and skipped > 5


def test_initial_hyperparameters_follow_the_data():
    """lengthscales = each input's std, sf2 = each residual's variance, noise variance = 1 % of it (floor included)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(200, 3)) * [0.5, 2.0, 7.0]
    y = rng.normal(size=(200, 2)) * [0.3, 1.5]
    hyper = GPHyperparameters.initial(x, y, noise_floor=1e-6)
    np.testing.assert_allclose(hyper.lengthscales().numpy(), np.tile(x.std(axis=0), (2, 1)), rtol=1e-12)
    np.testing.assert_allclose(hyper.signal_variance().numpy(), y.var(axis=0), rtol=1e-12)
    np.testing.assert_allclose(hyper.noise_variance().numpy(), 0.01 * y.var(axis=0), rtol=1e-9)
