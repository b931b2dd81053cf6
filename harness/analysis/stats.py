"""Statistics behind every verdict: calibrated tests for a few, heavy-tailed seeds per arm.

Seeds are few (10 per arm at the default scale) and their outcomes heavy-tailed (some seeds collapse),
so a percentile or BCa bootstrap of the difference of means is anti-conservative there: its "95%"
interval excluded a true zero in 16–21% of simulated A/A comparisons at n = 3 and ~10% at n = 10.
The tests here are the ones whose error rate holds at those n (``tests/test_stats.py`` checks it on
≥ 2,000 simulated heavy-tailed A/A comparisons per n):

- **Difference** of means: Welch's unequal-variance t test (Welch 1947; Satterthwaite's degrees of
  freedom), p-values from ``scipy.stats.ttest_ind(equal_var=False)``.
- **Equivalence** ("no effect", ``|d| < m``): two one-sided Welch tests, TOST (Schuirmann 1987):
  ``p = max(p(d > −m), p(d < m))``; equal to asking that the 1 − 2α Welch interval lie in (−m, m).
- **Several claims**: Holm's step-down adjustment (Holm 1979), strong family-wise error control.
- **Power**: the minimum detectable effect at 80% power of the two-sided Welch test, from the
  non-central t distribution (``scipy.stats.nct``); the seeds per arm a declared margin would need.
- **P(improvement)** ``P(X_a > X_b)`` = Mann–Whitney ``U / (n_a·n_b)`` (Agarwal et al. 2021), with a
  percentile bootstrap CI (a description, never a verdict).

All functions take plain sequences of per-seed values; non-finite values are dropped.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np


def finite(x: Sequence[float]) -> np.ndarray:
    """The finite values of ``x`` as a float array ``[n]`` (NaN and ±inf dropped)."""
    a = np.asarray(list(x), dtype=float)
    return a[np.isfinite(a)]


# ------------------------------------------------------------------------------------------------
# Welch
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Welch:
    """Welch's two-sample comparison of ``mean(a) − mean(b)``.

    Attributes:
        diff: ``mean(a) − mean(b)`` (metric units).
        se: ``sqrt(s_a²/n_a + s_b²/n_b)`` with unbiased sample variances.
        df: Welch–Satterthwaite degrees of freedom
            ``se⁴ / ((s_a²/n_a)²/(n_a−1) + (s_b²/n_b)²/(n_b−1))``; NaN when ``se == 0``.
        n_a, n_b: finite values per arm; sd_a, sd_b: their sample standard deviations.
    """

    diff: float
    se: float
    df: float
    n_a: int
    n_b: int
    sd_a: float
    sd_b: float

    def ci(self, confidence: float = 0.95) -> tuple[float, float]:
        """Two-sided Welch t interval ``diff ± t_{(1+c)/2, df}·se``; ``(diff, diff)`` when ``se == 0``."""
        from scipy import stats

        if self.se == 0:
            return self.diff, self.diff
        h = float(stats.t.ppf(0.5 + confidence / 2, self.df)) * self.se
        return self.diff - h, self.diff + h

    def p(self, delta: float = 0.0, alternative: str = "two-sided") -> float:
        """p-value of ``H0: d = delta`` against ``alternative`` (``two-sided``, ``greater``: d > delta,
        ``less``: d < delta), from the t distribution with ``df`` degrees of freedom.

        With ``se == 0`` (every seed of both arms gave the same value) the difference is exact:
        p is 0 when the observed difference lies strictly on the alternative's side, else 1.
        """
        from scipy import stats

        t_diff = self.diff - delta
        if self.se == 0:
            hit = {"two-sided": t_diff != 0, "greater": t_diff > 0, "less": t_diff < 0}[alternative]
            return 0.0 if hit else 1.0
        t = t_diff / self.se
        if alternative == "greater":
            return float(stats.t.sf(t, self.df))
        if alternative == "less":
            return float(stats.t.cdf(t, self.df))
        return float(min(1.0, 2 * stats.t.sf(abs(t), self.df)))


def welch(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Welch's statistics of two independent samples (Welch 1947).

    Args:
        a, b: per-seed values of the two arms (non-finite values are dropped).
    Returns:
        :class:`Welch`.
    Raises:
        ValueError: fewer than 2 finite values in either arm (no variance estimate).

    Example: ``a = [1, 2, 3]``, ``b = [1, 1, 4]``: s_a² = 1, s_b² = 3, se² = 1/3 + 1 = 4/3,
    df = (4/3)² / ((1/3)²/2 + 1²/2) = 3.2.
    """
    x, y = finite(a), finite(b)
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"Welch's test needs ≥ 2 values per arm (got n_a={len(x)}, n_b={len(y)})")
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se2 = va + vb
    df = se2**2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1)) if se2 > 0 else float("nan")
    return Welch(diff=float(x.mean() - y.mean()), se=float(math.sqrt(se2)), df=float(df), n_a=len(x), n_b=len(y),
                 sd_a=float(x.std(ddof=1)), sd_b=float(y.std(ddof=1)))


@dataclass(frozen=True)
class Blocked(Welch):
    """A comparison of two arms run on the same pipeline draws (blocks), whose effect may vary from draw to draw:
    ``diff`` is the mean over the ``blocks`` draws of ``d_j = mean(a | draw j) − mean(b | draw j)``, ``se`` =
    ``sd(d_j) / √blocks`` and ``df = blocks − 1``. This is the test of a fixed factor against the interaction mean
    square in the two-factor mixed model with a random block factor (arm × draw interaction random; Montgomery,
    "Design and Analysis of Experiments", 8th ed., §13.3: ``F = MS_A / MS_AB`` on (1, r − 1) df, here its t form),
    so the between-draw variation of the effect enters the verdict. ``n_a``, ``n_b``, ``sd_a``, ``sd_b`` describe
    the per-seed values used (in draws both arms ran)."""

    blocks: int = 0


def blocked(a: Sequence[float], b: Sequence[float], blocks_a: Sequence[Any], blocks_b: Sequence[Any]) -> Blocked:
    """:class:`Blocked` statistics of arms ``a`` and ``b`` whose values come from the draws ``blocks_a`` and
    ``blocks_b`` (one label per value, aligned; values in a draw only one arm ran are left out).

    Example: a = [1, 3 | 5], b = [0 | 4, 6] in draws [0, 0 | 1], [0 | 1, 1]: d_0 = 2 − 0 = 2, d_1 = 5 − 5 = 0;
    diff = 1, se = sd(2, 0) / √2 = √2 / √2 = 1, df = 1.

    Raises:
        ValueError: labels not aligned with the values, a non-finite value, or fewer than 2 draws both arms ran.
    """
    if len(a) != len(blocks_a) or len(b) != len(blocks_b):
        raise ValueError(f"blocked: {len(a)}/{len(b)} values but {len(blocks_a)}/{len(blocks_b)} draw labels")
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("blocked: non-finite value (drop such runs before pairing values with their draws)")
    shared = sorted(set(blocks_a) & set(blocks_b), key=str)
    if len(shared) < 2:
        raise ValueError(f"blocked: needs ≥ 2 draws that both arms ran (got {len(shared)})")
    la, lb = np.asarray(blocks_a, dtype=object), np.asarray(blocks_b, dtype=object)
    keep_a, keep_b = np.isin(la, shared), np.isin(lb, shared)
    d = np.array([x[la == j].mean() - y[lb == j].mean() for j in shared])
    xa, yb = x[keep_a], y[keep_b]
    return Blocked(diff=float(d.mean()), se=float(d.std(ddof=1) / math.sqrt(len(d))), df=float(len(d) - 1),
                   n_a=int(len(xa)), n_b=int(len(yb)), sd_a=float(xa.std(ddof=1)) if len(xa) > 1 else 0.0,
                   sd_b=float(yb.std(ddof=1)) if len(yb) > 1 else 0.0, blocks=len(d))


def blocked_mde(se: float, df: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable effect of a :class:`Blocked` comparison: ``(t_{1−α/2, df} + t_{power, df}) · se`` (the
    usual central-t approximation to the noncentral-t power equation)."""
    from scipy import stats as st

    return float((st.t.ppf(1 - alpha / 2, df) + st.t.ppf(power, df)) * se)


def _smallest_n(ok: Callable[[int], bool], max_n: int) -> Optional[int]:
    """The smallest n in [2, ``max_n``] with ``ok(n)`` for a predicate that turns true as n grows (power rises with
    n), by bisection; None when ``ok(max_n)`` is false."""
    if ok(2):
        return 2
    if not ok(max_n):
        return None
    lo, hi = 2, max_n  # ok(lo) false, ok(hi) true
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def blocked_seeds_needed(effect: float, sd_d: float, alpha: float = 0.05, power: float = 0.8, test: str = "difference",
                         max_n: int = 100_000) -> Optional[int]:
    """Pipeline draws (one seed per arm on each) for ``power`` at level α in a :class:`Blocked` comparison whose
    per-draw differences have SD ``sd_d``: the smallest n ≥ 2 with ``(t_{1−α/2, n−1} + t_{power, n−1}) · sd_d/√n ≤
    effect`` (``test="difference"``, the approximation of :func:`blocked_mde`), or, for ``test="equivalence"`` (TOST
    with margin ``effect`` at a true difference of 0), ``2·F_t(effect/se − t_{1−α, n−1}; n−1) − 1 ≥ power`` with
    ``se = sd_d/√n`` (as :func:`tost_power`). None if even ``max_n`` is not enough; 2 when ``sd_d`` is 0.

    Example: sd_d = 1, effect = 1 (difference, α 0.05, power 0.8): n = 10 gives (2.262 + 0.883)/√10 = 0.995 ≤ 1,
    n = 9 gives (2.306 + 0.889)/3 = 1.065 > 1, so 10.

    Raises:
        ValueError: ``effect ≤ 0``, ``sd_d < 0`` or an unknown ``test``.
    """
    from scipy import stats as st

    if not effect > 0 or sd_d < 0:
        raise ValueError(f"effect must be > 0 and sd_d ≥ 0 (got {effect}, {sd_d})")
    if test == "difference":
        ok = lambda n: (st.t.ppf(1 - alpha / 2, n - 1) + st.t.ppf(power, n - 1)) * sd_d / math.sqrt(n) <= effect  # noqa: E731
    elif test == "equivalence":
        ok = lambda n: blocked_tost_power(effect, sd_d, n, alpha) >= power  # noqa: E731
    else:
        raise ValueError(f"test: unknown value {test!r}; choose from: difference, equivalence")
    return 2 if sd_d == 0 else _smallest_n(ok, max_n)


def blocked_tost_power(margin: float, sd_d: float, n: int, alpha: float = 0.05) -> float:
    """Approximate power of TOST with margin ``margin`` at level α in a :class:`Blocked` comparison of ``n`` draws
    whose per-draw differences have SD ``sd_d``, when the true difference is 0: ``max(0, 2·F_t(m/se − t_{1−α, n−1};
    n−1) − 1)`` with ``se = sd_d/√n`` (as :func:`tost_power`, with the paired df); 1 when ``sd_d`` is 0.

    Example: m = 0.05, sd_d = 0.1, n = 16: se = 0.025, m/se = 2, t_{0.95, 15} = 1.7531, F_t(0.2469; 15) = 0.5959,
    so 2·0.5959 − 1 = 0.1917.

    Raises:
        ValueError: fewer than 2 draws.
    """
    from scipy import stats as st

    if n < 2:
        raise ValueError(f"blocked_tost_power needs ≥ 2 draws (got {n})")
    if sd_d == 0:
        return 1.0
    return float(max(0.0, 2 * st.t.cdf(margin / (sd_d / math.sqrt(n)) - st.t.ppf(1 - alpha, n - 1), n - 1) - 1))


def tost(w: Welch, margin: float) -> tuple[float, float, float]:
    """Two one-sided tests of equivalence ``|d| < margin`` (Schuirmann 1987), on Welch's t.

    Args:
        w: the Welch comparison of the two arms.
        margin: the equivalence margin ``m > 0`` in the metric's units.
    Returns:
        ``(p, p_lower, p_upper)``: ``p_lower`` tests ``H0: d ≤ −m`` against ``d > −m``, ``p_upper``
        tests ``H0: d ≥ m`` against ``d < m``; ``p = max(p_lower, p_upper)``. Equivalence is shown at
        level α when ``p < α`` (the 1 − 2α Welch interval lies inside (−m, m)).
    Raises:
        ValueError: ``margin ≤ 0``.
    """
    if not margin > 0:
        raise ValueError(f"margin: the equivalence margin must be > 0 (got {margin})")
    p_lower = w.p(-margin, "greater")
    p_upper = w.p(margin, "less")
    return max(p_lower, p_upper), p_lower, p_upper


def holm(pvalues: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm–Bonferroni adjusted p-values (Holm 1979), in the input order.

    With the m non-missing p-values sorted ascending, ``p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j))``.
    Rejecting where ``p̃ < α`` controls the family-wise error rate at α. ``None`` entries (claims
    without a test) are passed through and do not count in m.

    Example: ``holm([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06]``.
    """
    idx = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    order = sorted(idx, key=lambda i: pvalues[i])  # type: ignore[arg-type, return-value]
    m = len(order)
    out: list[Optional[float]] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))  # type: ignore[arg-type]
        out[i] = running
    return out


# ------------------------------------------------------------------------------------------------
# Power
# ------------------------------------------------------------------------------------------------


def _se_df(sd_a: float, sd_b: float, n_a: int, n_b: int) -> tuple[float, float]:
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    se2 = va + vb
    if se2 == 0:
        return 0.0, float("inf")
    return math.sqrt(se2), se2**2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))


def welch_power(effect: float, sd_a: float, sd_b: float, n_a: int, n_b: int, alpha: float = 0.05) -> float:
    """Power of the two-sided level-α Welch test when the true difference is ``effect``.

    ``P(|T'| > t_{1−α/2, df})`` with ``T'`` non-central t (``df`` Welch–Satterthwaite from the given
    SDs and sizes, non-centrality ``effect / se``), computed with ``scipy.stats.nct``. 1 when the SDs
    are 0 and ``effect ≠ 0``.
    """
    from scipy import stats

    se, df = _se_df(sd_a, sd_b, n_a, n_b)
    if se == 0:
        return 1.0 if effect != 0 else alpha
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = abs(effect) / se
    upper, lower = float(stats.nct.sf(crit, df, nc)), float(stats.nct.cdf(-crit, df, nc))
    if not math.isfinite(upper):  # scipy's nct loses precision far in the tails (tiny df, large nc)
        upper = 1.0 if nc > crit else 0.0
    if not math.isfinite(lower):
        lower = 0.0
    return min(1.0, upper + lower)


def tost_power(margin: float, sd_a: float, sd_b: float, n_a: int, n_b: int, alpha: float = 0.05) -> float:
    """Approximate power of TOST at level α when the true difference is 0:
    ``max(0, 2·F_t(m/se − t_{1−α, df}; df) − 1)`` (Chow, Shao & Wang 2008, *Sample Size Calculations
    in Clinical Research*, §3.2, equivalence with δ = 0)."""
    from scipy import stats

    se, df = _se_df(sd_a, sd_b, n_a, n_b)
    if se == 0:
        return 1.0
    return float(max(0.0, 2 * stats.t.cdf(margin / se - stats.t.ppf(1 - alpha, df), df) - 1))


def mde(sd_a: float, sd_b: float, n_a: int, n_b: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable effect: the smallest ``|d|`` the two-sided level-α Welch test detects with
    probability ``power``, for the given per-arm SDs and sizes (solved with ``scipy.optimize.brentq``
    on :func:`welch_power`). 0 when both SDs are 0.

    Raises:
        ValueError: an arm with fewer than 2 seeds.
    """
    from scipy.optimize import brentq

    if min(n_a, n_b) < 2:
        raise ValueError(f"mde needs ≥ 2 seeds per arm (got {n_a}, {n_b})")
    se, _ = _se_df(sd_a, sd_b, n_a, n_b)
    if se == 0:
        return 0.0
    hi = se
    while welch_power(hi, sd_a, sd_b, n_a, n_b, alpha) < power:
        hi *= 2
    return float(brentq(lambda d: welch_power(d, sd_a, sd_b, n_a, n_b, alpha) - power, 0.0, hi, xtol=1e-10 * se))


def seeds_needed(effect: float, sd_a: float, sd_b: float, alpha: float = 0.05, power: float = 0.8,
                 test: str = "difference", max_n: int = 100_000) -> Optional[int]:
    """Seeds per arm (equal arms) for ``power`` at level α, given the observed per-arm SDs.

    Args:
        effect: for ``test="difference"`` the difference to detect (two-sided Welch); for
            ``test="equivalence"`` the TOST margin, with a true difference of 0.
        sd_a, sd_b: per-seed standard deviations (metric units).
    Returns:
        The smallest n ≥ 2 with enough power (bisection; power rises with n), or None if even
        ``max_n`` is not enough.
    Raises:
        ValueError: ``effect ≤ 0`` or an unknown ``test``.
    """
    if not effect > 0:
        raise ValueError(f"effect must be > 0 (got {effect})")
    if test == "difference":
        ok = lambda n: welch_power(effect, sd_a, sd_b, n, n, alpha) >= power  # noqa: E731
    elif test == "equivalence":
        ok = lambda n: tost_power(effect, sd_a, sd_b, n, n, alpha) >= power  # noqa: E731
    else:
        raise ValueError(f"test: unknown value {test!r}; choose from: difference, equivalence")
    return _smallest_n(ok, max_n)


# ------------------------------------------------------------------------------------------------
# Descriptive statistics
# ------------------------------------------------------------------------------------------------


#: A curve has plateaued when its rise over the last quarter of training is below this share of its total rise.
PLATEAU_LATE_SHARE = 0.1


def plateau_check(steps: Sequence[float], values: Sequence[float], tail: float = 0.25,
                  share: float = PLATEAU_LATE_SHARE) -> dict[str, Any]:
    """Has a learning curve stopped rising? Its rise over the last ``tail`` of the iterations, ``v(K) − v((1 −
    tail)·K)`` (linear interpolation between evaluations), against its total rise ``v(K) − v(k_0)``; it holds when
    the total rise is positive and the late rise is below ``share`` of it (a fall at the end counts as no rise).

    Args:
        steps: evaluation iterations, ascending (the first is usually 0, the SFT policy).
        values: the curve's value at each (e.g. mean held-out gold over seeds).
    Returns:
        ``{"read_at", "total_rise", "late_rise", "late_share", "holds"}``: ``late_share`` = late / total rise;
        ``holds`` None (and ``late_share`` None) when the curve never rose (total rise ≤ 0: nothing to plateau).
    Raises:
        ValueError: fewer than two points, steps not ascending, or lengths that differ.
    """
    k, v = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if k.shape != v.shape or k.size < 2:
        raise ValueError(f"plateau_check: need ≥ 2 (step, value) points of equal count (got {k.size}, {v.size})")
    if np.any(np.diff(k) <= 0):
        raise ValueError("plateau_check: steps must be strictly ascending")
    start = k[-1] - tail * (k[-1] - k[0])
    total, late = float(v[-1] - v[0]), float(v[-1] - np.interp(start, k, v))
    if total <= 0:
        return {"read_at": float(k[-1]), "total_rise": total, "late_rise": late, "late_share": None, "holds": None}
    return {"read_at": float(k[-1]), "total_rise": total, "late_rise": late, "late_share": late / total,
            "holds": bool(late < share * total)}


#: An arm whose mean held-out response length ends below this share of the SFT policy's has collapsed in length; the
#: reports flag it, and a claim on such an arm that is not about length carries the caveat.
LENGTH_FLOOR_SHARE = 0.5


def length_check(sft_length: float, final_length: float, floor: float = LENGTH_FLOOR_SHARE) -> dict[str, Any]:
    """Did an arm's responses shrink to a fraction of the SFT policy's? Mean held-out response length (tokens) of the
    SFT policy (the evaluation before the first update, same prompts) against the arm's at the end.

    Args:
        sft_length: mean length before training (tokens, > 0).
        final_length: mean length at the end (tokens, ≥ 0).
        floor: the share of ``sft_length`` below which the arm is flagged.
    Returns:
        ``{"sft", "final", "ratio", "below_floor"}``: ``ratio`` = final / sft; ``below_floor`` when ratio < floor.
        Example: ``length_check(12.0, 2.66)`` → ratio 0.2217, below_floor True (a policy that answers ".").
    Raises:
        ValueError: ``sft_length`` ≤ 0, a negative or non-finite length.
    """
    if not (math.isfinite(sft_length) and math.isfinite(final_length)) or sft_length <= 0 or final_length < 0:
        raise ValueError(f"length_check: need sft_length > 0 and final_length ≥ 0 (got {sft_length}, {final_length})")
    ratio = final_length / sft_length
    return {"sft": float(sft_length), "final": float(final_length), "ratio": ratio, "below_floor": bool(ratio < floor)}


def iqm(x: Sequence[float]) -> float:
    """Interquartile mean: the mean after dropping ``floor(n/4)`` values at each end
    (``scipy.stats.trim_mean(x, 0.25)``, as in rliable; Agarwal et al. 2021). NaN for no data.

    Example: ``iqm([1, 2, 3, 4, 100]) == 3.0`` (drops 1 and 100)."""
    from scipy import stats

    a = finite(x)
    return float(stats.trim_mean(a, 0.25)) if len(a) else float("nan")


def mean_ci(x: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Student t interval of one mean, ``x̄ ± t_{(1+c)/2, n−1}·s/√n``; ``(nan, nan)`` for n < 2,
    ``(x̄, x̄)`` for constant data."""
    from scipy import stats

    a = finite(x)
    if len(a) < 2:
        return float("nan"), float("nan")
    m, s = float(a.mean()), float(a.std(ddof=1))
    h = float(stats.t.ppf(0.5 + confidence / 2, len(a) - 1)) * s / math.sqrt(len(a))
    return m - h, m + h


def _prob_greater(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """``mean over pairs of [x_i > y_j] + ½[x_i = y_j]`` along ``axis`` (vectorised over leading axes)."""
    x = np.moveaxis(np.asarray(x, dtype=float), axis, -1)[..., :, None]
    y = np.moveaxis(np.asarray(y, dtype=float), axis, -1)[..., None, :]
    return ((x > y) + 0.5 * (x == y)).mean(axis=(-2, -1))


def probability_of_improvement(a: Sequence[float], b: Sequence[float], goal: str = "max") -> float:
    """``P(X_a > X_b)`` (ties ½) = Mann–Whitney ``U_a / (n_a·n_b)`` (Agarwal et al. 2021);
    with ``goal="min"``, ``P(X_a < X_b)``. NaN if either sample is empty.

    Example: ``probability_of_improvement([1, 2, 3], [0, 2]) == 4.5 / 6 == 0.75``."""
    from scipy import stats

    x, y = finite(a), finite(b)
    if len(x) == 0 or len(y) == 0:
        return float("nan")
    if goal == "min":
        x, y = -x, -y
    u = stats.mannwhitneyu(x, y, alternative="two-sided").statistic
    return float(u) / (len(x) * len(y))


def probability_of_improvement_ci(a: Sequence[float], b: Sequence[float], goal: str = "max", confidence: float = 0.95,
                                  n_resamples: int = 9999, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of :func:`probability_of_improvement` (each arm resampled on its own;
    ``scipy.stats.bootstrap``, fixed rng). ``(nan, nan)`` with fewer than 2 values in an arm.
    Descriptive only: no verdict is read from it."""
    from scipy import stats

    x, y = finite(a), finite(b)
    if len(x) < 2 or len(y) < 2:
        return float("nan"), float("nan")
    if goal == "min":
        x, y = -x, -y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.bootstrap((x, y), _prob_greater, n_resamples=n_resamples, confidence_level=confidence,
                              method="percentile", vectorized=True, paired=False, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def clean(x: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, numpy scalars → python."""
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x
