"""Group-sequential verdicts: seeds are added in stages until each claim is decided or the cap is
reached, with the family-wise error rate held across the looks and across the ablation's claims.

Looking at the data after every batch of seeds and stopping once a test "looks decided" inflates the
false-positive rate (five looks at a nominal 5% reject a true null about 14% of the time; Armitage,
McPherson & Rowe 1969). The rule here spends α over the looks instead:

- **Looks and information.** A claim is examined after each stage, with ``n_a``, ``n_b`` seeds per
  arm. Its statistical information is proportional to ``n_a·n_b / (n_a + n_b)`` (the inverse variance
  of the difference of means for equal variances), so the information fraction at a look is
  ``t = [n_a n_b / (n_a + n_b)] / (N / 2)`` with ``N`` the cap on seeds per arm.
- **α spending** (Lan & DeMets 1983, the O'Brien–Fleming-type function):
  ``α(t) = 2 − 2 Φ(z_{1−α/2} / √t)``: almost nothing is spent at the early looks, and the last look is
  tested at nearly the full α.
- **Boundaries.** Under the null the standardized statistics at the looks are jointly normal with
  ``corr(Z_i, Z_j) = √(t_i / t_j)`` (independent increments; Jennison & Turnbull 2000, ch. 3). The
  boundary ``c_k`` at look ``k`` solves ``P(no crossing before k, crossing at k) = α(t_k) − α(t_{k−1})``,
  with ``|Z| ≥ c`` for a two-sided test and ``Z ≥ c`` for a one-sided one (TOST's two halves); the
  crossing probabilities come from the recursive numerical integration of Armitage, McPherson & Rowe (1969) on a
  Simpson grid (:func:`boundaries`), checked against Genz's multivariate normal integration and a simulation.
- **Welch at each look.** The boundary is turned into a nominal level (``2(1 − Φ(c_k))`` two-sided,
  ``1 − Φ(c_k)`` one-sided) and the claim's Welch or TOST p-value at that look
  (:func:`harness.analysis.verdicts.claim_test`) is compared with it. Few seeds make the t statistic heavier
  tailed than the normal; ``tests/test_sequential.py`` and ``python -m harness.analysis.calibrate`` measure the
  whole procedure's error rates by simulation, looks included.
- **Several claims: Holm, group-sequentially** (Maurer & Bretz 2013, "Multiple testing in group
  sequential trials using graphical approaches", the Holm special case). Each undecided claim is tested
  at level ``α / u`` (``u``: claims not yet decided); when one is decided its level is passed on, and
  the others are tested again at the same look with their larger level, until no further claim is
  decided. With one look this is exactly Holm's step-down procedure (Holm 1979).

A claim is decided when its null is rejected on either side (the verdict words are those of
:mod:`harness.analysis.verdicts`); a claim still undecided at the cap is reported with its minimum detectable
effect there.

- **Below the margin** (``margin_alpha`` > 0; a directional claim, ``d > 0`` or ``d < 0``, judged at a margin
  ``m``): the one-sided test of ``H0: d ≥ m`` (for ``d < 0``: ``d ≤ −m``) has its own group-sequential boundary; once
  the Holm tests of a look have settled, an undecided claim that crosses it is decided *below margin*: any effect in
  the claimed direction is smaller than the margin (a futility boundary in the sense of Jennison & Turnbull 2000,
  ch. 4, read as a test of its own). The two families split α: the margin tests are Bonferroni at
  ``margin_alpha / k`` each (``k``: claims with one; a claim's margin null can hold even after it is reproduced, so no
  level passes into or out of this family), and the Holm tests above run at ``alpha − margin_alpha``, passing levels
  only from claims they decide (a claim decided below margin keeps its Holm share). Each family holds its part of α
  whatever the other decides (Holm is monotone: a claim that stops early only lowers the others' levels), so the
  family-wise error over both stays ≤ α. Passing Holm levels into the margin tests instead would not: with four claims
  all at ``d = m``, the reproduced ones hand their level to the others' true margin nulls, and 400 simulated
  ablations made an error 12% of the time. This module is plain data in, plain data out; the runner (:mod:`harness.experiments.ablate`) and the
report read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional, Sequence

import numpy as np

#: Seeds per arm added at each stage, and the cap, of ``--seeds auto`` unless the spec or the CLI says otherwise.
DEFAULT_STAGE = 10
DEFAULT_CAP = 40


def obf_spending(t: float, alpha: float) -> float:
    """The Lan–DeMets O'Brien–Fleming-type α-spending function ``2 − 2Φ(z_{1−α/2} / √t)``.

    Args:
        t: information fraction in (0, 1] (values above 1 are treated as 1).
        alpha: the total error to spend, in (0, 1).
    Returns:
        the cumulative error spent by information ``t`` (``alpha`` at ``t = 1``).
    Raises:
        ValueError: ``t ≤ 0`` or ``alpha`` outside (0, 1).
    """
    from scipy.stats import norm

    if not t > 0 or not 0 < alpha < 1:
        raise ValueError(f"obf_spending: need t > 0 and 0 < alpha < 1 (got t={t}, alpha={alpha})")
    t = min(t, 1.0)
    return float(2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(t)))


#: How far (in standard deviations of ``S_k``) the integration grid reaches where the continuation region is unbounded
#: (a one-sided test's lower side) or wider: the normal mass beyond 9 SD is below 1e-18.
_TAIL_SD = 9.0
#: Grid points per standard deviation of the narrowest increment ``S_j − S_{j−1}`` (or of ``S_1``): Simpson's rule at
#: this spacing integrates the smooth densities of :func:`boundaries` to ~1e-10.
_POINTS_PER_SD = 16


def _simpson_grid(lo: float, hi: float, h: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and composite-Simpson weights on ``[lo, hi]`` at spacing ≤ ``h`` (an even number of intervals, ≥ 2)."""
    m = max(2, int(math.ceil((hi - lo) / h)))
    m += m % 2
    x = np.linspace(lo, hi, m + 1)
    w = np.full(m + 1, 2.0)
    w[1::2] = 4.0
    w[0] = w[-1] = 1.0
    return x, w * (hi - lo) / (3 * m)


def _region(c: float, tk: float, sides: int) -> tuple[float, float]:
    """The continuation region of ``S_k = Z_k √t_k`` at boundary ``c``, cut at :data:`_TAIL_SD` SDs of ``S_k``."""
    hi = min(c, _TAIL_SD) * math.sqrt(tk)
    return (-hi if sides == 2 else -_TAIL_SD * math.sqrt(tk)), hi


@lru_cache(maxsize=4096)
def boundaries(fractions: tuple[float, ...], alpha: float, sides: int = 2) -> tuple[float, ...]:
    """The group-sequential z boundaries ``c_1 … c_K`` at information ``fractions`` that spend ``alpha``
    by :func:`obf_spending`.

    Computed by the recursive numerical integration of Armitage, McPherson & Rowe (1969) as Jennison & Turnbull
    (2000, ch. 19) give it: on the score scale ``S_k = Z_k √t_k`` (a Brownian motion at times ``t_k`` under the null),
    the density ``g_k`` of ``S_k`` on the paths that have not crossed by look ``k`` is carried from look to look by
    convolution with the increment's normal density, on a composite-Simpson grid over the continuation region. The
    crossing probability at look ``k`` is then a one-dimensional integral of ``g_{k−1}`` against the normal tail
    probabilities of the increment, and ``c_k`` is its root (Brent's method).

    Args:
        fractions: increasing information fractions ``t_1 < … < t_K`` (the last may be below 1 when the
            cap is not reached; the unspent error is then not used).
        alpha: the claim's level (after Holm's division).
        sides: 2 (reject on ``|Z| ≥ c``) or 1 (``Z ≥ c``).
    Returns:
        one boundary per look (z units); 12 at a look that may spend nothing more (no root below it).
    Raises:
        ValueError: fractions not strictly increasing in (0, 1], or ``sides`` not 1 or 2.
    """
    from scipy.optimize import brentq
    from scipy.stats import norm

    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2 (got {sides})")
    t = [min(float(x), 1.0) for x in fractions]
    if not t or t[0] <= 0 or any(b <= a for a, b in zip(t, t[1:])):
        raise ValueError(f"information fractions must increase strictly within (0, 1] (got {list(fractions)})")
    # one grid spacing for every look; no finer than 1e-3 (≤ 18,001 points over ±9 SD), which only looks closer than
    # an increment SD of 0.016 would ask for
    h = max(min(np.sqrt(np.diff([0.0] + t))) / _POINTS_PER_SD, 1e-3)
    out: list[float] = []
    spent = 0.0
    u = g = None  # grid nodes × Simpson weights × density of S on the paths still going, at the previous look
    for k, tk in enumerate(t):
        target = obf_spending(tk, alpha) - spent  # the error this look may add
        if k == 0:
            c = float(norm.ppf(1 - target / sides))
        else:
            sd, root_t = math.sqrt(tk - t[k - 1]), math.sqrt(tk)

            def excess(ck: float) -> float:
                upper = norm.sf((ck * root_t - u) / sd)
                lower = norm.cdf((-ck * root_t - u) / sd) if sides == 2 else 0.0
                return float(g @ (upper + lower)) - target

            c = float(brentq(excess, 0.1, 12.0, xtol=1e-8)) if excess(12.0) < 0 < excess(0.1) else 12.0
        out.append(c)
        spent = obf_spending(tk, alpha)
        if k + 1 < len(t):  # carry the density of the paths that did not cross to the next look
            x, w = _simpson_grid(*_region(c, tk, sides), h)
            if k == 0:
                dens = norm.pdf(x / math.sqrt(tk)) / math.sqrt(tk)
            else:  # in blocks of rows, so that a fine grid never holds more than 512 × len(u) kernel values
                dens = np.concatenate([(norm.pdf((x[i:i + 512, None] - u[None, :]) / sd) / sd) @ g
                                       for i in range(0, len(x), 512)])
            u, g = x, w * dens
    return tuple(out)


def nominal_levels(fractions: Sequence[float], alpha: float, sides: int = 2) -> list[float]:
    """The boundaries of :func:`boundaries` as p-value thresholds: ``2(1 − Φ(c_k))`` two-sided,
    ``1 − Φ(c_k)`` one-sided. A look whose p-value is at or below its threshold crosses.

    Raises:
        ValueError: as :func:`boundaries`.
    """
    from scipy.stats import norm

    cs = boundaries(tuple(round(float(x), 9) for x in fractions), float(alpha), sides)
    return [float(sides * norm.sf(c)) for c in cs]


def information_fraction(n_a: int, n_b: int, cap: int) -> float:
    """``[n_a n_b / (n_a + n_b)] / (cap / 2)``: the share of the information two arms of ``cap`` seeds hold."""
    if n_a <= 0 or n_b <= 0:
        return 0.0
    return (n_a * n_b / (n_a + n_b)) / (cap / 2)


@dataclass(frozen=True)
class Look:
    """One claim at one look: seeds per arm, the claim's p-value there and on which side its estimate
    lies (:func:`harness.analysis.verdicts.claim_test`), how many sides that p-value has, the Welch statistics
    for the report, and a directional claim's margin-test p-value."""

    n_a: int
    n_b: int
    p: float
    supports: bool
    sides: int
    diff: float
    test: str
    #: one-sided p of a directional claim's margin test (:func:`harness.analysis.verdicts.margin_test`), else None
    p_margin: Optional[float] = None


def split_alpha(alpha: float, margin_alpha: float, margined: Sequence[bool]) -> tuple[float, Optional[float]]:
    """The levels of the two families: ``(alpha of the Holm tests, level of each margin test or None)``.

    With ``margin_alpha > 0`` and ``k`` claims that have a margin test (``margined``), the Holm tests share
    ``alpha − margin_alpha`` and each margin test gets ``margin_alpha / k``; otherwise the Holm tests keep ``alpha``.

    Raises:
        ValueError: ``margin_alpha`` outside ``[0, alpha)``.

    Example: ``split_alpha(0.05, 0.01, [True, False, True]) == (0.04, 0.005)``.
    """
    if not 0 <= margin_alpha < alpha:
        raise ValueError(f"margin_alpha must lie in [0, alpha = {alpha}) (got {margin_alpha})")
    k = sum(bool(x) for x in margined)
    if margin_alpha == 0 or k == 0:
        return alpha, None
    return alpha - margin_alpha, margin_alpha / k


def sequential_decisions(looks: Sequence[Sequence[Look]], alpha: float, cap: int, margin_alpha: float = 0.0,
                         margined: Optional[Sequence[bool]] = None) -> list[dict[str, Any]]:
    """Run the group-sequential Holm procedure over the looks taken so far, with the margin tests of directional
    claims beside it (see the module's "Below the margin").

    Args:
        looks: per claim, its looks in order (a claim decided earlier needs no later looks; a claim may
            have fewer looks than another when its arms stopped).
        alpha: the family-wise level over all claims and both families.
        cap: seeds per arm at the last planned look (sets the information fractions).
        margin_alpha: the part of ``alpha`` the margin tests get (0: none are made).
        margined: per claim, whether it has a margin test (default: whether any of its looks carries a
            ``p_margin``).
    Returns:
        per claim: ``{"decided": bool, "look": index of the deciding look or None, "supports": bool or
        None, "below_margin": bool, "level": the claim's Holm level when decided (or at the end),
        "margin_level": its margin test's level or None, "path": [{"n_a", "n_b", "t", "p", "threshold",
        "level", "crossed", "p_margin", "margin_threshold", "below_margin"}]}``; ``threshold`` is the nominal
        p-level of that look at the Holm level then in force, ``margin_threshold`` the one-sided one of the margin
        test (None without one), ``crossed`` whether the look decided the claim (either test).
    Raises:
        ValueError: as :func:`split_alpha`.
    """
    m = len(looks)
    if margined is None:
        margined = [any(lk.p_margin is not None for lk in x) for x in looks]
    holm_alpha, m_level = split_alpha(alpha, margin_alpha, margined)
    state = _State(looks, cap, holm_alpha)
    for k in range(max((len(x) for x in looks), default=0)):
        state.holm_look(k)
        if m_level is not None:  # the margin tests, once the Holm tests of this look have settled
            state.margin_look(k, m_level, margined)
    out = []
    for i in range(m):
        mine = m_level if margined[i] else None
        if i in state.decided:
            k, supports, level, below = state.decided[i]
            out.append({"decided": True, "look": k, "supports": supports, "below_margin": below, "level": level,
                        "margin_level": mine, "path": state.paths[i]})
        else:
            out.append({"decided": False, "look": None, "supports": None, "below_margin": False,
                        "level": holm_alpha / max(1, m - len(state.by_holm)), "margin_level": mine,
                        "path": state.paths[i]})
    return out


class _State:
    """The decisions of :func:`sequential_decisions` so far: per claim its path of looks, the claims decided (look,
    supports, level, below margin) and those the Holm tests decided (only they pass their level on)."""

    def __init__(self, looks: Sequence[Sequence[Look]], cap: int, holm_alpha: float) -> None:
        self.looks, self.cap, self.holm_alpha = looks, cap, holm_alpha
        self.decided: dict[int, tuple[int, bool, float, bool]] = {}
        self.by_holm: set[int] = set()
        self.paths: list[list[dict[str, Any]]] = [[] for _ in looks]

    def fractions(self, i: int, k: int) -> Optional[list[float]]:
        """Claim ``i``'s information fractions up to look ``k``; None when look ``k`` adds none (nothing to test)."""
        if k >= len(self.looks[i]):
            return None
        fr = [information_fraction(lk.n_a, lk.n_b, self.cap) for lk in self.looks[i][: k + 1]]
        if any(b <= a for a, b in zip(fr, fr[1:])) or fr[0] <= 0:
            return None
        return fr

    def holm_look(self, k: int) -> None:
        """Look ``k`` of the Holm tests: a claim decided passes its level on and the rest are tested again."""
        changed = True
        while changed:
            changed = False
            undecided = [i for i in range(len(self.looks)) if i not in self.decided]
            if not undecided:
                return
            level = self.holm_alpha / (len(self.looks) - len(self.by_holm))
            for i in undecided:
                if (fr := self.fractions(i, k)) is None:
                    continue
                lk = self.looks[i][k]
                thr = nominal_levels(fr, level, lk.sides)[-1]
                crossed = bool(lk.p <= thr)
                entry = {"n_a": lk.n_a, "n_b": lk.n_b, "t": fr[-1], "p": lk.p, "threshold": thr, "level": level,
                         "crossed": crossed, "p_margin": lk.p_margin, "margin_threshold": None, "below_margin": False}
                path = self.paths[i]
                if path and path[-1]["n_a"] == lk.n_a and path[-1]["n_b"] == lk.n_b:
                    path[-1] = entry  # the same look, re-tested at a larger Holm level
                else:
                    path.append(entry)
                if crossed:
                    self.decided[i] = (k, lk.supports, level, False)
                    self.by_holm.add(i)
                    changed = True
                    break

    def margin_look(self, k: int, m_level: float, margined: Sequence[bool]) -> None:
        """Look ``k`` of the margin tests (Bonferroni, each at ``m_level``; the order of the claims does not matter)."""
        for i in range(len(self.looks)):
            if i in self.decided or not margined[i] or (fr := self.fractions(i, k)) is None or not self.paths[i]:
                continue
            lk = self.looks[i][k]
            if lk.p_margin is None:
                continue
            m_thr = nominal_levels(fr, m_level, 1)[-1]
            below = bool(lk.p_margin <= m_thr)
            self.paths[i][-1].update(margin_threshold=m_thr, below_margin=below, crossed=below)
            if below:
                self.decided[i] = (k, False, self.paths[i][-1]["level"], True)


def stage_sizes(stage: int, cap: int, start: int = 0) -> list[int]:
    """Seeds per arm at each planned look: ``stage, 2·stage, …`` up to ``cap`` (the cap is always a look).

    Raises:
        ValueError: ``stage < 2`` or ``cap < stage``.
    """
    if stage < 2 or cap < stage:
        raise ValueError(f"--stage must be ≥ 2 and ≤ the cap (got stage {stage}, cap {cap})")
    sizes = list(range(stage, cap + 1, stage))
    if sizes[-1] != cap:
        sizes.append(cap)
    return [s for s in sizes if s > start] if start else sizes


__all__ = ["DEFAULT_STAGE", "DEFAULT_CAP", "obf_spending", "boundaries", "nominal_levels", "information_fraction",
           "Look", "split_alpha", "sequential_decisions", "stage_sizes"]
