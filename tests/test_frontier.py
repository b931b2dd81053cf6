"""The gold–KL frontier (Gao, Schulman & Hilton 2022): best-of-n KL, the unbiased best-of-n estimator,
the functional-form fits and their bootstrap, on hand-computed values and synthetic data."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from harness.frontier import bon_estimate, bon_kl, bon_weights, bootstrap_fit, fit_gao, gao_curve, peak_d


def test_bon_kl_hand_values():
    assert bon_kl(1) == 0.0
    assert bon_kl(2) == pytest.approx(math.log(2) - 0.5)  # 0.19314718...
    assert bon_kl(2) == pytest.approx(0.1931471806)
    assert bon_kl(256) == pytest.approx(math.log(256) - 255 / 256)
    assert bon_kl(256) == pytest.approx(4.549084, abs=1e-6)  # 5.545177 − 0.996094
    assert np.allclose(bon_kl([1, 4]), [0.0, math.log(4) - 0.75])
    with pytest.raises(ValueError, match="n ≥ 1"):
        bon_kl(0)


def test_bon_weights_match_the_combinatorial_definition():
    # N = 4, n = 2: rank i (0-based, ascending) is the max of a random pair w.p. C(i, 1) / C(4, 2) = i / 6
    assert np.allclose(bon_weights(4, 2), [0, 1 / 6, 2 / 6, 3 / 6])
    assert np.allclose(bon_weights(4, 1), [0.25] * 4) and np.allclose(bon_weights(4, 4), [0, 0, 0, 1])
    assert bon_weights(300, 37).sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="1 ≤ n ≤ N"):
        bon_weights(4, 5)


def test_bon_estimate_equals_the_average_over_all_subsets():
    rng = np.random.default_rng(0)
    proxy, gold = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
    got = bon_estimate(proxy, gold, [1, 2, 3, 7])
    for m in range(3):
        for j, n in enumerate([1, 2, 3, 7]):
            subsets = list(itertools.combinations(range(7), n))
            brute = np.mean([gold[m, max(s, key=lambda i: proxy[m, i])] for s in subsets])  # exhaustive enumeration
            assert got[m, j] == pytest.approx(brute)
    assert np.allclose(got[:, 0], gold.mean(1)) and np.allclose(got[:, -1], gold[np.arange(3), proxy.argmax(1)])


def test_rl_fit_recovers_known_alpha_beta_and_peak():
    d = np.linspace(0.2, 4.0, 25)
    r = gao_curve(d, 0.8, 0.35, "rl")
    assert r[0] == pytest.approx(0.2 * (0.8 - 0.35 * math.log(0.2)))
    fit = fit_gao(np.concatenate([[0.0], d]), np.concatenate([[0.0], r]), "rl")  # d = 0 is dropped
    assert fit["alpha"] == pytest.approx(0.8, abs=1e-9) and fit["beta"] == pytest.approx(0.35, abs=1e-9)
    assert fit["n_points"] == 25 and fit["rmse"] < 1e-9 and fit["error"] is None
    assert fit["d_peak"] == pytest.approx(math.exp(0.8 / 0.35 - 1))  # dR/dd = α − β(log d + 1) = 0
    few = fit_gao([0.5, 1.0], [0.1, 0.2])
    assert few["alpha"] is None and "only 2 points" in few["error"]


def test_bon_fit_recovers_known_alpha_beta_and_peak():
    d = np.sqrt(bon_kl([1, 2, 4, 8, 16, 32, 64, 128, 256]))
    r = gao_curve(d, 0.5, 0.2, "bon")
    assert r[2] == pytest.approx(d[2] * (0.5 - 0.2 * d[2]))
    fit = fit_gao(d, r, "bon")
    assert fit["alpha"] == pytest.approx(0.5, abs=1e-9) and fit["beta"] == pytest.approx(0.2, abs=1e-9)
    assert fit["d_peak"] == pytest.approx(0.5 / 0.4) and peak_d(0.5, -0.1, "bon") is None
    with pytest.raises(ValueError, match="rl"):
        fit_gao(d, r, "linear")


def test_bootstrap_over_seeds_covers_the_true_beta_on_noisy_synthetic_runs():
    rng = np.random.default_rng(1)
    d = np.linspace(0.3, 5.0, 9)
    groups = [(d, gao_curve(d, 0.3, 0.15, "rl") + rng.normal(0, 0.02, size=d.size)) for _ in range(8)]
    f = bootstrap_fit(groups, "rl", n_resamples=400, seed=0)
    assert f["n_groups"] == 8 and f["n_resamples"] == 400
    assert f["beta_ci"][0] < 0.15 < f["beta_ci"][1] and f["beta_ci"][0] > 0  # the CI excludes 0
    assert f["alpha_ci"][0] < 0.3 < f["alpha_ci"][1]
    assert f["d_peak_ci"][0] < math.exp(0.3 / 0.15 - 1) < f["d_peak_ci"][1]
    # deterministic given the seed
    assert bootstrap_fit(groups, "rl", n_resamples=400, seed=0)["beta_ci"] == f["beta_ci"]
