"""The group-sequential verdict rule: boundaries against hand values and an independent Monte Carlo,
Holm's step-down as its one-look special case, a two-look path by hand, and a small version of the
calibration simulation (``python -m harness.calibrate`` prints the full table)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from harness import sequential
from harness.sequential import Look, boundaries, nominal_levels, obf_spending, sequential_decisions, stage_sizes


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


def test_stage_sizes():
    assert stage_sizes(10, 40) == [10, 20, 30, 40]
    assert stage_sizes(10, 35) == [10, 20, 30, 35]
    assert stage_sizes(10, 40, start=20) == [30, 40]
    with pytest.raises(ValueError, match="--stage"):
        stage_sizes(1, 40)


@pytest.mark.slow
def test_calibration_small_version():
    """400 repetitions of the collapsing-seed case (the full table uses 4,000 per case): each claim type's error under its null stays
    within 3 Monte Carlo SEs of α, while naive peeking at the same looks is clearly above α."""
    from harness.calibrate import calibration_table

    rows = calibration_table(reps=400, cases=("collapsing",), seed=11)  # the heavy-tailed case; normal is the full table's
    for r in rows:
        bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / r["reps"])
        assert r["fpr"] <= bound and r["fwer_4"] <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / (r["reps"] // 4)), r
        assert r["power"] >= 0.7, r  # at a margin of 0.75 SD, 40 seeds per arm
        assert r["seeds_null"] > 35  # under the null the rule mostly runs to the cap
    assert max(r["fpr_peeking"] for r in rows) > 0.08
