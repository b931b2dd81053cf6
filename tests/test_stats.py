"""The verdict statistics: hand-computed Welch and TOST numbers, Holm, power, and the calibration of
the verdict rule on simulated heavy-tailed A/A comparisons (the false-positive rate the reports rely on)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from harness.analysis import stats
from harness.experiments.ablate import Claim, VerdictRule
from harness.analysis.verdicts import judge_claims

A, B = [1.0, 2.0, 3.0], [4.0, 4.0, 7.0]


# ------------------------------------------------------------------------------------------------
# Welch, TOST, Holm: hand-computed
# ------------------------------------------------------------------------------------------------


def test_welch_hand_computed_and_matches_scipy():
    w = stats.welch(A, B)
    # s_a² = 1, s_b² = 3; se² = 1/3 + 3/3 = 4/3; df = (4/3)² / ((1/3)²/2 + 1²/2) = (16/9) / (5/9) = 3.2
    assert w.diff == -3.0 and w.se == pytest.approx(math.sqrt(4 / 3), rel=1e-12)
    assert w.df == pytest.approx(3.2, rel=1e-12) and (w.sd_a, w.sd_b) == (1.0, pytest.approx(math.sqrt(3)))
    # t = −3 / √(4/3) = −2.598; two-sided p = 2·P(T_3.2 > 2.598) = 0.07538
    assert w.p() == pytest.approx(0.0753764, abs=1e-6)
    ref = sps.ttest_ind(A, B, equal_var=False)  # independent reference
    assert w.p() == pytest.approx(ref.pvalue, rel=1e-9) and w.df == pytest.approx(ref.df, rel=1e-9)
    lo, hi = w.ci(0.95)
    assert (lo, hi) == (pytest.approx(-6.548197, abs=1e-5), pytest.approx(0.548197, abs=1e-5))
    assert (lo, hi) == (pytest.approx(ref.confidence_interval(0.95).low), pytest.approx(ref.confidence_interval(0.95).high))
    # one-sided: d < 0 is supported at p = 0.0377, d > 0 is not
    assert w.p(0.0, "less") == pytest.approx(0.0753764 / 2, abs=1e-6) and w.p(0.0, "greater") > 0.96
    with pytest.raises(ValueError, match="≥ 2 values per arm"):
        stats.welch([1.0], B)


def test_welch_without_variance_is_exact():
    same = stats.welch([0.0, 0.0, 0.0], [0.0, 0.0])
    assert same.se == 0 and same.p() == 1.0
    diff = stats.welch([0.2, 0.2], [0.0, 0.0, 0.0])
    assert diff.p() == 0.0 and diff.p(0.0, "less") == 1.0 and diff.ci() == (0.2, 0.2)
    one = stats.welch([0.1, 0.3, 0.2], [0.0, 0.0, 0.0])  # one arm constant: se and df from the other arm
    assert one.df == pytest.approx(2.0) and one.se == pytest.approx(0.1 / math.sqrt(3))


def test_tost_hand_computed():
    w = stats.welch(A, B)  # d = −3, se = 1.1547, df = 3.2
    p, p_lower, p_upper = stats.tost(w, 4.0)
    # H0 d ≤ −4: t = (−3 + 4)/1.1547 = 0.866, p = P(T_3.2 > 0.866) = 0.2233
    # H0 d ≥ +4: t = (−3 − 4)/1.1547 = −6.062, p = P(T_3.2 < −6.062) = 0.00373
    assert p_lower == pytest.approx(0.2232695, abs=1e-6) and p_upper == pytest.approx(0.0037305, abs=1e-6)
    assert p == p_lower
    # with a wide margin both one-sided tests reject: equivalence within ±12 is shown at 5%
    assert stats.tost(w, 12.0)[0] < 0.05
    with pytest.raises(ValueError, match="margin"):
        stats.tost(w, 0.0)


def test_holm_hand_computed():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # sorted 0.005, 0.02, 0.3 (m = 3): 0.015, max(0.015, 0.04) = 0.04, max(0.04, 0.3) = 0.3; None passes through
    assert stats.holm([0.3, None, 0.005, 0.02]) == [pytest.approx(0.3), None, pytest.approx(0.015), pytest.approx(0.04)]
    assert stats.holm([0.6, 0.7]) == [1.0, 1.0] and stats.holm([]) == []


# ------------------------------------------------------------------------------------------------
# Power
# ------------------------------------------------------------------------------------------------


def test_mde_and_seeds_needed():
    # large n: the MDE approaches the normal-theory (z_.975 + z_.8)·se = 2.8016·√(2/1000)
    assert stats.mde(1.0, 1.0, 1000, 1000) == pytest.approx(2.8016 * math.sqrt(2 / 1000), rel=2e-3)
    m = stats.mde(0.1, 0.1, 10, 10)
    assert stats.welch_power(m, 0.1, 0.1, 10, 10) == pytest.approx(0.8, abs=1e-6)
    # the reference's rule of thumb: SD 0.1 gold, detecting 0.1 needs ~16 seeds per arm, 0.05 needs ~65
    n1, n2 = stats.seeds_needed(0.1, 0.1, 0.1), stats.seeds_needed(0.05, 0.1, 0.1)
    assert n1 == 17 and 64 <= n2 <= 65
    assert stats.welch_power(0.1, 0.1, 0.1, n1, n1) >= 0.8 > stats.welch_power(0.1, 0.1, 0.1, n1 - 1, n1 - 1)
    # equivalence: TOST with margin 0.1, SD 0.1, true d = 0 (normal theory: n ≈ 2(z_.95 + z_.9)²·(0.1/0.1)² = 17.1)
    assert 17 <= stats.seeds_needed(0.1, 0.1, 0.1, test="equivalence") <= 19
    assert stats.mde(0.0, 0.0, 3, 3) == 0.0 and stats.seeds_needed(1.0, 0.0, 0.0) == 2
    assert stats.seeds_needed(1e-6, 1.0, 1.0, max_n=1000) is None


def test_draws_needed_for_a_blocked_comparison_by_hand():
    """Per-draw differences of SD 1, margin 1: (t_.975,9 + t_.8,9)/√10 = (2.2622 + 0.8834)/3.1623 = 0.9947 ≤ 1 but
    (t_.975,8 + t_.8,8)/3 = (2.3060 + 0.8889)/3 = 1.0650 > 1, so 10 draws; the rule agrees with blocked_mde at n = 10.
    TOST with margin 0.05 and SD 0.0644: at 16 draws 2·F_15(0.05/(0.0644/4) − 1.7531) − 1 = 2·F_15(1.3525) − 1 = 0.804,
    at 15 draws 2·F_14(3.0070 − 1.7613) − 1 = 0.767, so 16."""
    assert stats.blocked_seeds_needed(1.0, 1.0) == 10
    assert stats.blocked_mde(1 / math.sqrt(10), 9) <= 1.0 < stats.blocked_mde(1 / 3, 8)
    assert stats.blocked_seeds_needed(0.05, 0.0644, test="equivalence") == 16
    assert round(stats.blocked_tost_power(0.05, 0.0644, 16), 3) == 0.804
    assert round(stats.blocked_tost_power(0.05, 0.0644, 15), 3) == 0.767 and stats.blocked_tost_power(0.05, 0.0, 2) == 1.0
    with pytest.raises(ValueError, match="needs ≥ 2 draws"):
        stats.blocked_tost_power(0.05, 0.1, 1)
    assert stats.blocked_seeds_needed(1.0, 0.0) == 2 and stats.blocked_seeds_needed(1e-6, 1.0, max_n=1000) is None
    with pytest.raises(ValueError, match="effect must be > 0"):
        stats.blocked_seeds_needed(0.0, 1.0)
    with pytest.raises(ValueError, match="test: unknown value 'two'"):
        stats.blocked_seeds_needed(1.0, 1.0, test="two")


def test_simulated_power_matches_the_mde():
    """At the MDE, the level-5% Welch test on normal data is decisive ~80% of the time."""
    rng = np.random.default_rng(7)
    m = stats.mde(1.0, 1.0, 10, 10)
    a = rng.normal(m, 1.0, (4000, 10))
    b = rng.normal(0.0, 1.0, (4000, 10))
    p = sps.ttest_ind(a, b, axis=1, equal_var=False).pvalue
    assert abs((p < 0.05).mean() - 0.8) < 0.025


def test_probability_of_improvement_and_its_interval():
    assert stats.probability_of_improvement([1, 2, 3], [0, 2]) == 0.75
    lo, hi = stats.probability_of_improvement_ci([0.3, 0.1, 0.7, 0.5, 0.9], [0.2, 0.6, 0.4, 0.0])
    assert 0.0 <= lo <= stats.probability_of_improvement([0.3, 0.1, 0.7, 0.5, 0.9], [0.2, 0.6, 0.4, 0.0]) <= hi <= 1.0
    assert stats.probability_of_improvement_ci([5.0, 6.0], [1.0, 2.0]) == (1.0, 1.0)  # every resample: all pairs better
    assert all(math.isnan(v) for v in stats.probability_of_improvement_ci([1.0], [0.0, 1.0]))
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 100]) == 4.5
    lo, hi = stats.mean_ci([1.0, 2.0, 3.0])  # 2 ± t_.975,2 · 1/√3 = 2 ± 2.4841
    assert (lo, hi) == (pytest.approx(2 - 2.48414, abs=1e-4), pytest.approx(2 + 2.48414, abs=1e-4))


# ------------------------------------------------------------------------------------------------
# Calibration: the verdict rule on simulated A/A comparisons
# ------------------------------------------------------------------------------------------------


def _collapsing_seeds(rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
    """Final gold of seeds that mostly land near 0.6 with Student-t(3) noise and collapse to ~0.1
    with probability 0.15."""
    ok = 0.6 + 0.05 * rng.standard_t(3, size)
    return np.where(rng.random(size) < 0.15, 0.1 + 0.03 * rng.standard_normal(size), ok)


def _lognormal_seeds(rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
    """Right-skewed seeds (a few very good runs): lognormal with σ = 1."""
    return rng.lognormal(0.0, 1.0, size)


def _claim(expect: str = "greater", margin: float = 0.05, kind: str = "finding") -> Claim:
    return Claim(claim="c", kind=kind, source="s", section="t", setting_note="n", metric="eval_final/gold", a="x",
                 expect=expect, b="y", margin=margin)


REPS = 2000


@pytest.mark.parametrize("law", [_collapsing_seeds, _lognormal_seeds], ids=["collapses", "lognormal"])
@pytest.mark.parametrize("n", [3, 5, 10])
def test_verdict_rule_is_calibrated_on_heavy_tailed_aa_data(law, n):
    """≥ 2,000 A/A comparisons (both arms from the same law): the rule's decisive verdicts ≤ 6%."""
    rng = np.random.default_rng(1000 + n)
    a, b = law(rng, (REPS, n)), law(rng, (REPS, n))
    rule = VerdictRule(min_seeds=n)
    claims = [_claim("greater"), _claim("less")]
    decisive = 0
    for x, y in zip(a, b):
        rows = judge_claims(claims[:1], [(x, y)], rule, with_power=False)
        decisive += rows[0]["decisive"]
    assert decisive / REPS <= 0.06, f"false-positive rate {decisive / REPS:.3f} at n = {n}"
    # the same check catches an anti-conservative rule: a z interval (normal quantiles) at n = 3
    if n == 3 and law is _collapsing_seeds:
        se = np.sqrt(a.var(axis=1, ddof=1) / n + b.var(axis=1, ddof=1) / n)
        z_rate = float((np.abs(a.mean(1) - b.mean(1)) > 1.96 * se).mean())
        assert z_rate > 0.06


def test_equivalence_is_never_read_from_an_inconclusive_difference():
    rule = VerdictRule(min_seeds=3)
    wide = judge_claims([_claim("equivalent", 0.05)], [([0.1, 0.5, 0.9], [0.2, 0.6, 0.7])], rule)[0]
    assert wide["verdict"] == "inconclusive" and wide["test"] == "tost" and wide["p_raw"] > 0.05
    tight = judge_claims([_claim("equivalent", 0.05)], [([0.50, 0.51, 0.52, 0.50], [0.51, 0.50, 0.52, 0.51])], rule)[0]
    assert tight["verdict"] == "reproduced" and tight["p_raw"] < 0.05


def test_a_decided_negative_control_is_a_false_positive_on_either_side():
    """A control's arms differ clearly (x − y = +0.1 over four seeds with SD ≈ 0.013, Welch p ≈ 1e-5): whichever
    side the estimate falls on, the verdict is a false positive, decisive; a null difference stays inconclusive."""
    rule = VerdictRule(min_seeds=3)
    x, y = [0.60, 0.61, 0.62, 0.59], [0.50, 0.51, 0.52, 0.49]
    for a, b in ((x, y), (y, x)):
        row = judge_claims([_claim("greater", kind="control")], [(a, b)], rule)[0]
        assert row["verdict"] == "false positive" and row["decisive"] and row["p_raw"] < 1e-4
    same = judge_claims([_claim("greater", kind="control")], [(x, [v + 0.001 for v in reversed(x)])], rule)[0]
    assert same["verdict"] == "inconclusive" and not same["decisive"]


# ------------------------------------------------------------------------------------------------
# Pipeline draws (replicates): the blocked comparison
# ------------------------------------------------------------------------------------------------


def test_blocked_comparison_by_hand():
    """a = [1, 3 | 5], b = [0 | 4, 6] on draws [0, 0 | 1], [0 | 1, 1]: d_0 = 2 − 0 = 2, d_1 = 5 − 5 = 0; diff 1,
    se = sd(2, 0)/√2 = 1, df 1, p = 2·(1 − F_t1(1)) = 0.5; a draw only one arm ran is left out."""
    w = stats.blocked([1, 3, 5, 9], [0, 4, 6], [0, 0, 1, 7], [0, 1, 1])
    assert (w.diff, w.se, w.df, w.blocks, w.n_a, w.n_b) == (1.0, pytest.approx(1.0), 1.0, 2, 3, 3)
    assert w.p() == pytest.approx(0.5) and w.ci(0.95) == pytest.approx((1 - 12.7062047, 1 + 12.7062047))
    assert stats.blocked_mde(1.0, 1.0, 0.05, 0.8) == pytest.approx(12.7062047 + 1.3763819)
    with pytest.raises(ValueError, match="≥ 2 draws"):
        stats.blocked([1, 2], [3, 4], [0, 0], [0, 0])
    with pytest.raises(ValueError, match="draw labels"):
        stats.blocked([1, 2], [3, 4], [0], [0, 1])


def test_compare_uses_the_draws_only_when_there_are_two():
    from harness.analysis.verdicts import compare

    assert isinstance(compare([1, 2, 3, 4], [2, 3, 4, 6], [0, 1, 0, 1], [0, 1, 0, 1]), stats.Blocked)
    one = compare([1, 2, 3], [2, 3, 5], [0, 0, 0], [0, 0, 0])  # one draw: Welch over the seeds
    assert not isinstance(one, stats.Blocked) and one == stats.welch([1, 2, 3], [2, 3, 5])
    assert compare([1, float("nan"), 3, 4], [2, 3, 4, 6], [0, 1, 0, 1], [0, 1, 0, 1]).n_a == 3


def test_verdicts_keep_their_error_rate_when_pipeline_draws_differ():
    """2,000 A/A ablations, 30 seeds per arm on 3 and on 30 (each seed its own, as at the default scale) pipeline draws whose effect varies
    from draw to draw (SD 0.5 of the seeds' SD; mean effect 0): judged on the draws, a decisive verdict comes in
    ≤ α + 3 MC SEs of them; on 3 draws Welch over the seeds, blind to the draws, is decisive about twice as often
    (the error the draws exist to catch)."""
    from harness.analysis.calibrate import replicated_pair
    from harness.analysis.verdicts import claim_test, compare

    rng = np.random.default_rng(5)
    claim = Claim(claim="c", kind="finding", source="s", section="-", setting_note="-", metric="x/y", a="a", b="b",
                  expect="greater", margin=0.5)
    reps, naive = 2000, 0
    blocked = {3: 0, 30: 0}
    for _ in range(reps):
        for r in blocked:
            a, b, d = replicated_pair(rng, 30, 0.0, replicates=r)
            blocked[r] += claim_test(claim, compare(a, b, list(d), list(d)))[0] < 0.05
            if r == 3:
                naive += claim_test(claim, compare(a, b))[0] < 0.05
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)
    assert max(blocked.values()) / reps <= bound and naive / reps > 0.08, (blocked, naive / reps)
