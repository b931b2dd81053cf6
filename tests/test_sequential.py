"""The group-sequential verdict rule: boundaries against hand values, published values, Genz's integration and an
independent Monte Carlo, Holm's step-down as its one-look special case, a two-look path by hand, and a small version of the
calibration simulation (``python -m harness.analysis.calibrate`` prints the full table)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pytest
from scipy.stats import norm

from harness.analysis import sequential
from harness.analysis.sequential import Look, boundaries, nominal_levels, obf_spending, sequential_decisions, stage_sizes


def test_spending_function_hand_values():
    z = norm.ppf(0.975)
    assert obf_spending(1.0, 0.05) == pytest.approx(0.05, abs=1e-12)
    assert obf_spending(0.5, 0.05) == pytest.approx(2 - 2 * norm.cdf(z / math.sqrt(0.5)), abs=1e-12)
    assert obf_spending(0.25, 0.05) == pytest.approx(8.86e-5, rel=1e-2)  # 2 − 2Φ(1.95996 / 0.5)
    with pytest.raises(ValueError):
        obf_spending(0.0, 0.05)


def test_one_look_is_the_plain_test_and_the_first_boundary_is_z_over_root_t():
    z = norm.ppf(0.975)
    assert boundaries((1.0,), 0.05, 2) == pytest.approx((z,), abs=1e-9)
    assert nominal_levels([1.0], 0.05, 2) == pytest.approx([0.05], abs=1e-12)
    assert nominal_levels([1.0], 0.05, 1) == pytest.approx([0.05], abs=1e-12)
    c = boundaries((0.5, 1.0), 0.05, 2)
    assert c[0] == pytest.approx(z / math.sqrt(0.5), abs=1e-6)  # P(|Z_1| ≥ c_1) = α(0.5) ⇔ c_1 = z_{α/2} / √t_1
    assert c[0] > c[1] > z  # O'Brien–Fleming: strict early, close to the fixed test at the end


@pytest.mark.parametrize("fractions, sides", [((0.5, 1.0), 2), ((0.25, 0.5, 0.75, 1.0), 2), ((0.25, 0.5, 0.75, 1.0), 1)])
def test_boundaries_spend_exactly_alpha_under_an_independent_brownian_simulation(fractions, sides):
    """Z_k = W(t_k)/√t_k of a simulated Brownian motion (independent increments, 400,000 paths): the
    probability of crossing at or before each look equals the spending function there."""
    rng = np.random.default_rng(7)
    t = np.array(fractions)
    w = np.cumsum(rng.normal(size=(400_000, len(t))) * np.sqrt(np.diff(np.concatenate([[0.0], t]))), axis=1)
    z = w / np.sqrt(t)
    c = np.array(boundaries(fractions, 0.05, sides))
    cross = (np.abs(z) >= c) if sides == 2 else (z >= c)
    first = np.cumsum(cross, axis=1) > 0
    for k, tk in enumerate(t):
        assert first[:, k].mean() == pytest.approx(obf_spending(tk, 0.05), abs=0.0015)


def test_boundaries_match_the_published_obrien_fleming_type_design():
    """Lan–DeMets O'Brien–Fleming-type spending, four equally spaced looks, one-sided α = 0.025 (the spending
    function's ``z_{1−α/2}``, so 2.2414 / √t): the boundaries 4.3326, 2.9631, 2.3590, 2.0141, as
    R's gsDesign publishes them to four decimals (``gsDesign(k = 4, test.type = 1, sfu = sfLDOF)``)."""
    c = boundaries((0.25, 0.5, 0.75, 1.0), 0.025, 1)
    assert c == pytest.approx((4.3326, 2.9631, 2.3590, 2.0141), abs=6e-5)


@pytest.mark.parametrize("fractions, alpha, sides", [((0.25, 0.5, 0.75, 1.0), 0.0125, 2), ((0.2, 0.45, 0.5, 0.9), 0.05, 1),
                                                     ((0.125, 0.55, 0.7, 0.825, 1.0), 0.04 / 3, 2)])
def test_boundaries_spend_alpha_under_genz_multivariate_normal_integration(fractions, alpha, sides):
    """An independent integration of the same law: ``P(no crossing at looks 1..k)`` from scipy's
    ``multivariate_normal.cdf`` (Genz's quasi-Monte Carlo, ``corr = √(t_i/t_j)``) at the recursion's boundaries; the
    error spent by each look equals the spending function there to 2e-6 (the Genz integration's own accuracy)."""
    from scipy.stats import multivariate_normal

    c = np.array(boundaries(fractions, alpha, sides))
    t = np.array(fractions)
    for k in range(1, len(t) + 1):
        cov = np.sqrt(np.minimum.outer(t[:k], t[:k]) / np.maximum.outer(t[:k], t[:k]))
        lower = -c[:k] if sides == 2 else np.full(k, -np.inf)
        mvn = multivariate_normal(mean=np.zeros(k), cov=cov, seed=12345, maxpts=400_000 * k, abseps=1e-8, releps=1e-8)
        assert 1 - mvn.cdf(c[:k], lower_limit=lower) == pytest.approx(obf_spending(t[k - 1], alpha), abs=2e-6)


def test_a_look_close_to_the_previous_one_keeps_the_boundaries_converged():
    """Looks 0.01 apart (the increment's SD 0.1): the boundaries at the module's grid equal those on a grid four
    times finer and reaching further into the tails to 1e-7."""
    coarse = sequential.boundaries.__wrapped__((0.2, 0.21, 0.5), 0.05, 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sequential, "_POINTS_PER_SD", 4 * sequential._POINTS_PER_SD)
        mp.setattr(sequential, "_TAIL_SD", 10.0)
        fine = sequential.boundaries.__wrapped__((0.2, 0.21, 0.5), 0.05, 2)
    assert coarse == pytest.approx(fine, abs=1e-7)


def _look(p: float, n: int = 10, supports: bool = True, sides: int = 2) -> Look:
    return Look(n_a=n, n_b=n, p=p, supports=supports, sides=sides, diff=0.0, test="welch")


@pytest.mark.parametrize("ps, decided", [([0.01, 0.04, 0.03], [True, False, False]),
                                         ([0.01, 0.02, 0.03], [True, True, True]),
                                         ([0.02, 0.02, 0.02], [False, False, False])])
def test_one_look_with_several_claims_is_holm(ps, decided):
    """Holm at α = 0.05 by hand: sorted p against α/3, α/2, α, stopping at the first that fails."""
    res = sequential_decisions([[_look(p, 10)] for p in ps], alpha=0.05, cap=10)
    assert [r["decided"] for r in res] == decided


def test_a_two_look_path_by_hand():
    """Cap 20, looks at 10 and 20 seeds per arm (t = 0.5, 1): threshold 1 is 2(1 − Φ(z/√0.5)) = 0.00557;
    p = 0.01 there does not cross; p = 0.03 at the cap crosses threshold 2 (just under 0.05)."""
    thr = nominal_levels([0.5, 1.0], 0.05, 2)
    assert thr[0] == pytest.approx(2 * norm.sf(norm.ppf(0.975) / math.sqrt(0.5)), abs=1e-9)
    assert 0.03 < thr[1] < 0.05
    res = sequential_decisions([[_look(0.01, 10), _look(0.03, 20, supports=False)]], alpha=0.05, cap=20)[0]
    assert res["decided"] and res["look"] == 1 and res["supports"] is False
    assert [(e["n_a"], e["crossed"]) for e in res["path"]] == [(10, False), (20, True)]
    # the same p at look 1 of a claim whose other claim was decided there is tested at the full α: Holm passes it on
    res = sequential_decisions([[_look(1e-9, 10)], [_look(0.004, 10), _look(0.5, 20)]], alpha=0.05, cap=20)
    assert res[0]["decided"] and res[1]["decided"] and res[1]["level"] == 0.05 and res[1]["look"] == 0


def test_margin_tests_have_their_own_part_of_alpha_and_pass_no_level_on():
    """α = 0.05 with 0.01 for the margin tests: the Holm tests share 0.04, each of k margin tests gets 0.01 / k.
    One look at the cap: the one-sided threshold is the level itself. Claim A (no effect shown, p = 0.9) has margin
    p = 0.004 ≤ 0.01 / 2 = 0.005: below margin. Claim B's p = 0.03 is above Holm's 0.04 / 2 = 0.02 and A's margin
    decision passes nothing on, so B stays undecided; had A been decided by its own test (p = 0.001 ≤ 0.02), B would be
    tested at 0.04 and cross. A margin test never overrides the test of the null: with p = 0.001 and margin p =
    0.004, A is decided by the first, and a claim without a margin test (B's None) is never below margin."""
    from harness.analysis.sequential import split_alpha

    assert split_alpha(0.05, 0.01, [True, False, True]) == (0.04, 0.005) and split_alpha(0.05, 0.01, [False]) == (0.05, None)
    assert split_alpha(0.05, 0.0, [True]) == (0.05, None)
    with pytest.raises(ValueError, match="margin_alpha must lie in"):
        split_alpha(0.05, 0.05, [True])

    def look(p: float, pm: Optional[float]) -> Look:
        return Look(n_a=10, n_b=10, p=p, supports=True, sides=2, diff=0.0, test="welch", p_margin=pm)

    a, b = sequential_decisions([[look(0.9, 0.004)], [look(0.03, 0.5)]], alpha=0.05, cap=10, margin_alpha=0.01)
    assert a["decided"] and a["below_margin"] and a["supports"] is False and a["margin_level"] == 0.005
    assert a["path"][0]["margin_threshold"] == pytest.approx(0.005, abs=1e-9) and a["path"][0]["crossed"]
    assert not b["decided"] and b["level"] == pytest.approx(0.02) and b["path"][0]["threshold"] == pytest.approx(0.02, abs=1e-9)
    a, b = sequential_decisions([[look(0.001, 0.004)], [look(0.03, 0.5)]], alpha=0.05, cap=10, margin_alpha=0.01)
    assert a["decided"] and not a["below_margin"] and a["supports"] and b["decided"] and b["level"] == pytest.approx(0.04)
    # without margin tests (margin_alpha 0, or no claim has one) the Holm tests keep the whole α, as before
    a, b = sequential_decisions([[look(0.9, 0.004)], [look(0.03, None)]], alpha=0.05, cap=10, margin_alpha=0.0)
    assert not a["decided"] and not b["decided"] and b["level"] == 0.025 and a["margin_level"] is None
    a, = sequential_decisions([[look(0.9, 0.004)]], alpha=0.05, cap=10, margin_alpha=0.01, margined=[False])
    assert not a["decided"] and a["level"] == 0.05


def test_stage_sizes():
    assert stage_sizes(10, 40) == [10, 20, 30, 40]
    assert stage_sizes(10, 35) == [10, 20, 30, 35]
    assert stage_sizes(10, 40, start=20) == [30, 40]
    with pytest.raises(ValueError, match="--stage"):
        stage_sizes(1, 40)


@pytest.mark.slow
def test_calibration_small_version():
    """400 repetitions of the collapsing-seed case (the full table uses 4,000 per case): each claim type's error under its null stays
    within 3 Monte Carlo SEs of α, and so does a directional claim's at d = m (declared below margin or contradicted
    there), alone, four at once, and mixed with claims at d = 0; at d = 0 the margin test decides most such claims
    "below margin" before the cap; naive peeking at the same looks is clearly above α."""
    from harness.analysis.calibrate import calibration_table

    rows = calibration_table(reps=400, cases=("collapsing",), seed=11)  # the heavy-tailed case; normal is the full table's
    for r in rows:
        bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / r["reps"])
        assert r["fpr"] <= bound and r["fwer_4"] <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / (r["reps"] // 4)), r
        assert r["power"] >= 0.7, r  # at a margin of 0.75 SD, 40 seeds per arm
        if r["claim"] == "greater":
            four = 0.05 + 3 * math.sqrt(0.05 * 0.95 / (r["reps"] // 4))
            assert r["fpr_margin"] <= bound and r["fwer_4_margin"] <= four and r["fwer_4_mixed"] <= four, r
            assert r["below_null"] > 0.5 and r["seeds_null"] < 38, r  # no effect: mostly "below margin", early
        else:  # no margin test for these claim types: the rule runs to the cap under the null
            assert math.isnan(r["fpr_margin"]) and math.isnan(r["below_null"]) and r["seeds_null"] > 35, r
    assert max(r["fpr_peeking"] for r in rows) > 0.08
