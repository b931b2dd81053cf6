"""Verdicts on the claims of one ablation: a calibrated test per claim, Holm across the claims, power.

Each claim (:class:`harness.experiments.ablate.Claim`) is a statement about ``d = mean(metric | a) − mean(metric | b)``
over seeds. Its p-value (the evidence for whichever side the estimate falls on):

- ``greater`` / ``less``: two-sided Welch test of ``d = 0``; the sign of ``d̂`` says which side.
- ``not_greater`` (``d < m``): two-sided Welch test of ``d = m``; ``d̂ < m`` supports the claim.
- ``exceeds`` (``d > m``, a claim of size): the same test of ``d = m``; ``d̂ > m`` supports the claim, and a
  ``d̂`` significantly below ``m`` contradicts it even when it is significantly above 0.
- ``equivalent`` (``|d| < m``): if ``|d̂| < m``, the TOST p-value (Schuirmann 1987) supports it;
  otherwise ``2·min(p(d > m), p(d < −m))`` (one-sided Welch tests) speaks against it.
  An inconclusive difference test is never read as "no effect".

A directional claim (``greater`` / ``less``, finding or mechanism) is also tested against its margin when
the rule gives the margin tests a part of α (``rule.margin_alpha``; :func:`margin_test`): the one-sided test of
``H0: d ≥ m`` (``less``: ``d ≤ −m``), Bonferroni over the ablation's margin tests at ``margin_alpha / k``. When the
test of its null decides nothing but this one rejects, the claim is *below margin*: whatever effect there is in
the claimed direction is smaller than the margin it is judged at (neither reproduced nor contradicted at that size).
The tests of the nulls then share ``α − margin_alpha`` (:func:`harness.analysis.sequential.split_alpha`); why the split
keeps the family-wise error at α: :mod:`harness.analysis.sequential`.

The p-values of all claims of the ablation are Holm-adjusted together (Holm 1979). A claim is
*reproduced* (a mechanism check *passes*) when its adjusted p < α (less the margin tests' part) on the supporting side,
*contradicted* (*fails*) when adjusted p < α on the other side, *below margin* as above, *inconclusive* otherwise; a negative control
(an A/A comparison) is a *false positive* when adjusted p < α on either side. No verdict
at all when either arm has fewer than ``rule.min_seeds`` seeds: the row then says
``not enough seeds (n = 3 < 10)``.

Under the null (``d = 0`` for a difference claim), the two-sided level-α test makes a decisive verdict
with probability ≤ α; ``tests/test_stats.py`` checks the rate on simulated heavy-tailed seeds.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from harness.analysis import stats
from harness.reporting.render import claim_title

if TYPE_CHECKING:
    from harness.analysis import sequential
    from harness.experiments.spec import Claim, VerdictRule

#: Verdict words by claim kind: (supported, refuted).
#: A negative control (``kind: control``) has no supporting side: a decisive verdict either way is a false positive.
WORDS = {"finding": ("reproduced", "contradicted"), "mechanism": ("pass", "fail"),
         "control": ("false positive", "false positive")}
INCONCLUSIVE = "inconclusive"
#: The verdict of a directional claim whose margin test rejects (:func:`margin_test`): any effect in the claimed
#: direction is smaller than the claim's margin. A decision, counted apart from reproduced and contradicted.
BELOW_MARGIN = "below margin"


def expected_text(claim: "Claim") -> str:
    """The claim as an inequality on ``d = a − b``, e.g. ``none − reward > 0``."""
    m, a, b = claim.margin, claim.a, claim.b
    return {"greater": f"{a} − {b} > 0", "less": f"{a} − {b} < 0", "not_greater": f"{a} − {b} < {m:g}",
            "exceeds": f"{a} − {b} > {m:g}",
            "equivalent": f"|{a} − {b}| < {m:g}"}[claim.expect]


def claim_test(claim: "Claim", w: stats.Welch) -> tuple[float, bool, str]:
    """The p-value of one claim and whether the estimate lies on the claim's side.

    Args:
        claim: the claim (``expect``, ``margin``).
        w: Welch statistics of arm ``a`` vs arm ``b``.
    Returns:
        ``(p, supports, test)``: raw p-value, True if ``d̂`` lies on the claimed side, and the test's
        name for the report (``welch`` or ``tost``).
    """
    m = claim.margin
    if claim.expect == "greater":
        return w.p(0.0), w.diff > 0, "welch"
    if claim.expect == "less":
        return w.p(0.0), w.diff < 0, "welch"
    if claim.expect == "not_greater":
        return w.p(m), w.diff < m, "welch"
    if claim.expect == "exceeds":
        return w.p(m), w.diff > m, "welch"
    if abs(w.diff) < m:
        return stats.tost(w, m)[0], True, "tost"
    return min(1.0, 2 * min(w.p(m, "greater"), w.p(-m, "less"))), False, "welch"


def margin_test(claim: "Claim", w: stats.Welch) -> Optional[float]:
    """The one-sided p-value that a directional claim's effect is smaller than its margin, or None.

    ``greater``: ``H0: d ≥ m`` against ``d < m`` (Welch's ``t = (d̂ − m)/se``, lower tail); ``less``:
    ``H0: d ≤ −m`` against ``d > −m`` (upper tail). None for the other claim types (``not_greater``, ``exceeds``
    and ``equivalent`` already test at the margin), for negative controls (no claimed direction) and for
    ``margin ≤ 0``. A futility test in the sense of Jennison & Turnbull (2000, ch. 4), read as a test of its own.

    Args:
        claim: the claim (``kind``, ``expect``, ``margin``, metric units).
        w: Welch (or blocked) statistics of arm ``a`` vs arm ``b``.
    Returns:
        the p-value in [0, 1], or None.

    Example: ``d̂ = 0.05``, ``se = 0.05``, ``df = 60``, a ``greater`` claim with ``m = 0.3``:
    ``t = −5``, ``p = P(T_60 ≤ −5) ≈ 2.7e-06``.
    """
    if not has_margin_test(claim):
        return None
    if claim.expect == "greater":
        return w.p(claim.margin, "less")
    return w.p(-claim.margin, "greater")


def has_margin_test(claim: "Claim") -> bool:
    """Does ``claim`` get a margin test (:func:`margin_test` is not None for it)?"""
    return claim.kind != "control" and claim.expect in ("greater", "less") and claim.margin > 0


def judge_claims(claims: Sequence["Claim"], values: Sequence[tuple[Sequence[float], Sequence[float]]],
                 rule: "VerdictRule", with_power: bool = True) -> list[dict[str, Any]]:
    """Verdicts of all claims of one ablation.

    Args:
        claims: the ablation's claims, in spec order.
        values: per claim, ``(values of arm a, values of arm b)``: one final value per seed; or ``(values a,
            values b, draws a, draws b)`` with each value's pipeline draw, tested by :func:`compare`.
        rule: α (``rule.alpha``), ``rule.min_seeds``, ``rule.power``.
        with_power: compute ``mde`` and ``seeds_needed`` (None otherwise; the verdicts do not depend on them).
    Returns:
        One dict per claim: ``claim, kind, source, section, setting_note, metric, a, b, expect,
        margin, expected, n_a, n_b, mean_a, mean_b, sd_a, sd_b, diff, ci_low, ci_high`` (Welch 95%
        interval at ``1 − α``), ``df, test, p_raw, p_adj`` (Holm), ``supports, mde`` (at
        ``rule.power``), ``seeds_needed`` (per arm, for ``margin``; for a blocked comparison the draws, one seed per arm on each,
        :func:`harness.analysis.stats.blocked_seeds_needed`), ``se``,
        ``blocks`` (draws of a blocked comparison), ``enough_seeds, verdict, decisive, evidence, caveats``.
    """
    from harness.analysis.sequential import split_alpha

    rows: list[dict[str, Any]] = []
    raw: list[Optional[float]] = []
    holm_alpha, m_level = split_alpha(rule.alpha, rule.margin_alpha, [has_margin_test(c) for c in claims])
    for claim, vals in zip(claims, values):
        va, vb = vals[0], vals[1]
        draws = (vals[2], vals[3]) if len(vals) == 4 else None
        x, y = stats.finite(va), stats.finite(vb)
        row: dict[str, Any] = {
            "claim": claim.claim, "title": claim_title(claim.claim, claim.title), "kind": claim.kind, "source": claim.source, "section": claim.section,
            "setting_note": claim.setting_note, "metric": claim.metric, "a": claim.a, "b": claim.b,
            "expect": claim.expect, "margin": claim.margin, "expected": expected_text(claim),
            "n_a": len(x), "n_b": len(y), "mean_a": float(x.mean()) if len(x) else None,
            "mean_b": float(y.mean()) if len(y) else None, "sd_a": None, "sd_b": None, "diff": None,
            "ci_low": None, "ci_high": None, "df": None, "test": None, "p_raw": None, "p_adj": None,
            "supports": None, "mde": None, "seeds_needed": None,
            "enough_seeds": bool(min(len(x), len(y)) >= rule.min_seeds), "caveats": [],
        }
        p = None
        if len(x) >= 2 and len(y) >= 2:
            w = compare(va, vb, *(draws or (None, None)))
            lo, hi = w.ci(1 - rule.alpha)
            p, supports, test = claim_test(claim, w)
            row.update(sd_a=w.sd_a, sd_b=w.sd_b, diff=w.diff, ci_low=lo, ci_high=hi, df=w.df, test=test, p_raw=p,
                       supports=supports, se=w.se, p_margin=margin_test(claim, w) if m_level is not None else None)
            if isinstance(w, stats.Blocked):
                row["blocks"] = w.blocks
                if with_power:
                    row["mde"] = stats.blocked_mde(w.se, w.df, holm_alpha, rule.power)
                    row["seeds_needed"] = stats.blocked_seeds_needed(
                        claim.margin, w.se * math.sqrt(w.blocks), holm_alpha, rule.power,
                        "equivalence" if claim.expect == "equivalent" else "difference")
            elif with_power:
                row["mde"] = stats.mde(w.sd_a, w.sd_b, w.n_a, w.n_b, holm_alpha, rule.power)
                row["seeds_needed"] = stats.seeds_needed(claim.margin, w.sd_a, w.sd_b, holm_alpha, rule.power,
                                                         "equivalence" if claim.expect == "equivalent" else "difference")
            if w.se == 0:
                row["caveats"].append("every seed of both arms gave the same value: the difference is exact")
        raw.append(p)
        rows.append(row)
    for row, p_adj in zip(rows, stats.holm(raw)):
        row["p_adj"] = p_adj
        row["alpha"] = holm_alpha
        if row.get("p_margin") is not None:
            row["margin_level"] = m_level
        _decide(row, rule)
    return rows


def _decide(row: dict[str, Any], rule: "VerdictRule") -> None:
    """Fill ``verdict``, ``decisive``, ``evidence`` and the caveats of one judged row: ``underpowered``
    (undecided, and the MDE exceeds the margin) and ``small effect`` (a decisive difference claim whose
    estimated |d| is below the margin: real, but smaller than the claim's effect of interest)."""
    yes, no = WORDS[row["kind"]]
    n = min(row["n_a"], row["n_b"])
    a, b, metric = row["a"], row["b"], row["metric"]
    if row["p_raw"] is None:
        missing = "not recorded" if n == 0 else "fewer than 2 seeds"
        row.update(verdict=f"not enough seeds (n = {n} < {rule.min_seeds})", decisive=False,
                   evidence=f"{metric}: {missing} (n_{a}={row['n_a']}, n_{b}={row['n_b']})")
        return
    alpha = row.get("alpha", rule.alpha)
    below = False
    if not row["enough_seeds"]:
        verdict = f"not enough seeds (n = {n} < {rule.min_seeds})"
    elif row["p_adj"] < alpha:
        verdict = yes if row["supports"] else no
    elif row.get("p_margin") is not None and row["p_margin"] <= row["margin_level"]:
        below = True  # Bonferroni: each margin test at margin_alpha / k
        verdict = BELOW_MARGIN
    else:
        verdict = INCONCLUSIVE
    row["verdict"] = verdict
    row["decisive"] = verdict in (yes, no, BELOW_MARGIN)
    pct = round(100 * (1 - rule.alpha))
    test = "TOST" if row["test"] == "tost" else "Welch"
    interval = "Welch"
    if row.get("blocks"):
        test = f"{test} on {row['blocks']} pipeline draws" if test == "TOST" else f"t on {row['blocks']} pipeline draws"
        interval = f"t ({row['blocks']} draws)"
    row["evidence"] = (
        f"{metric}: {a} {row['mean_a']:.4g} ± {row['sd_a']:.2g} (n={row['n_a']}) vs {b} {row['mean_b']:.4g} ± "
        f"{row['sd_b']:.2g} (n={row['n_b']}); d = {row['diff']:+.4g}, {pct}% {interval} CI [{row['ci_low']:+.4g}, "
        f"{row['ci_high']:+.4g}] (df {row['df']:.3g}); {test} p = {row['p_raw']:.3g}, Holm-adjusted {row['p_adj']:.3g}; "
        f"expected {row['expected']}")
    if row.get("p_margin") is not None:
        row["evidence"] += (f"; margin test ({margin_null(row)}): one-sided p = {row['p_margin']:.3g} at level "
                            f"{row['margin_level']:.3g}")
    if below:
        row["caveats"].append(f"below margin: {margin_shown(row)} shown, so any effect in the claimed direction is "
                              f"smaller than the margin {row['margin']:g} the claim is judged at")
    if not row["decisive"] and row["mde"] is not None and row["mde"] > row["margin"] and row["expect"] != "equivalent":
        row["caveats"].append(f"underpowered: MDE {row['mde']:.3g} > margin {row['margin']:g}")
    if verdict in (yes, no) and row["expect"] in ("greater", "less") and abs(row["diff"]) < row["margin"]:
        row["caveats"].append(f"small effect: |d| = {abs(row['diff']):.3g} is below the claim's margin {row['margin']:g}")
    nonzero_caveat(row, yes)


def nonzero_caveat(row: dict[str, Any], yes: str) -> None:
    """The caveat ``not zero`` on an equivalence claim whose confidence interval of the difference excludes 0: when
    equivalence was shown (verdict ``yes``), the arms differ by less than the margin (equivalence within a margin is not
    sameness); when the claim is undecided (not decisive), the arms differ and equivalence within the margin is neither
    shown nor ruled out (the interval is the fixed-n one, not adjusted for the looks or Holm). Not on a decisive
    contradiction, which says more. Replaces an earlier such caveat, so it can be called again after a sequential
    verdict."""
    row["caveats"] = [c for c in row["caveats"] if not c.startswith("not zero")]
    lo, hi = row.get("ci_low"), row.get("ci_high")
    if row["expect"] != "equivalent" or lo is None or hi is None or lo <= 0 <= hi:
        return
    higher = row["a"] if lo > 0 else row["b"]
    if row["verdict"] == yes:
        row["caveats"].append(f"not zero: the interval [{lo:+.3g}, {hi:+.3g}] excludes 0 ({higher} is higher), a "
                              f"difference smaller than the margin {row['margin']:g}")
    elif not row["decisive"]:
        row["caveats"].append(f"not zero: the interval [{lo:+.3g}, {hi:+.3g}] excludes 0 ({higher} is higher; a fixed-n "
                              f"interval, not adjusted for the looks or Holm); equivalence within the margin "
                              f"{row['margin']:g} is neither shown nor ruled out")


def margin_null(row: dict[str, Any]) -> str:
    """A judged row's margin-test null as text, e.g. ``H0: none − reward ≥ 0.3``."""
    if row["expect"] == "greater":
        return f"H0: {row['a']} − {row['b']} ≥ {row['margin']:g}"
    return f"H0: {row['a']} − {row['b']} ≤ {-row['margin']:g}"


def margin_shown(row: dict[str, Any]) -> str:
    """What a rejected margin test shows, e.g. ``none − reward < 0.3``."""
    if row["expect"] == "greater":
        return f"{row['a']} − {row['b']} < {row['margin']:g}"
    return f"{row['a']} − {row['b']} > {-row['margin']:g}"


def compare(a: Sequence[float], b: Sequence[float], draws_a: Optional[Sequence[Any]] = None,
            draws_b: Optional[Sequence[Any]] = None) -> stats.Welch:
    """The comparison a claim's test reads: :func:`harness.analysis.stats.blocked` when the values carry their pipeline draws
    and both arms ran at least two of them (the between-draw variation of the effect then enters the verdict), else
    Welch's (:func:`harness.analysis.stats.welch`). Non-finite values are dropped (with their draw labels).

    Raises:
        ValueError: fewer than 2 finite values in an arm; draw labels not aligned with the values.
    """
    if draws_a is not None and draws_b is not None:
        if len(draws_a) != len(a) or len(draws_b) != len(b):
            raise ValueError(f"compare: {len(a)}/{len(b)} values but {len(draws_a)}/{len(draws_b)} draw labels")
        fa = [(v, d) for v, d in zip(a, draws_a) if math.isfinite(v)]
        fb = [(v, d) for v, d in zip(b, draws_b) if math.isfinite(v)]
        if len({d for _, d in fa} & {d for _, d in fb}) >= 2:
            return stats.blocked([v for v, _ in fa], [v for v, _ in fb], [d for _, d in fa], [d for _, d in fb])
    return stats.welch(stats.finite(a), stats.finite(b))


def claim_look(claim: "Claim", a: Sequence[float], b: Sequence[float], draws_a: Optional[Sequence[Any]] = None,
               draws_b: Optional[Sequence[Any]] = None) -> Optional["sequential.Look"]:
    """One look of the sequential rule at a claim: the per-seed values of its arms so far, tested as
    :func:`claim_test` tests them (a Welch p-value is two-sided, a TOST one one-sided), with a directional
    claim's margin test (:func:`margin_test`, one-sided; the sequential rule uses it only when the rule gives it α).

    Args:
        claim: the claim.
        a, b: finite per-seed values of arms ``a`` and ``b`` (metric units), in seed order.
        draws_a, draws_b: the pipeline draw of each value (:func:`compare`), or None.
    Returns:
        a :class:`harness.analysis.sequential.Look`, or None with fewer than 2 values in an arm.
    """
    from harness.analysis import sequential

    x, y = stats.finite(a), stats.finite(b)
    if len(x) < 2 or len(y) < 2:
        return None
    w = compare(a, b, draws_a, draws_b)
    p, supports, test = claim_test(claim, w)
    pm = margin_test(claim, w)
    return sequential.Look(n_a=len(x), n_b=len(y), p=float(p), supports=bool(supports), sides=1 if test == "tost" else 2,
                           diff=float(w.diff), test=test, p_margin=None if pm is None else float(pm))


def heterogeneity(effects: Sequence[float], ses: Sequence[float]) -> Optional[dict[str, float]]:
    """Cochran's Q test that one effect holds in every stratum (here: each build's runs), from the strata's effect
    estimates and standard errors (same units), with the fixed-effect (inverse-variance) pooled effect, as
    ``statsmodels.stats.meta_analysis.combine_effects`` computes them (Cochran 1954; Higgins & Thompson 2002 for
    I²): ``Q = Σ w_i (θ_i − θ̄)²``, ``w_i = 1/se_i²``, ``θ̄ = Σ w_i θ_i / Σ w_i``, ``p = P(χ²_{k−1} ≥ Q)``.

    Args:
        effects: per stratum, the effect estimate ``[k]``.
        ses: per stratum, its standard error ``[k]``; strata with a non-finite or zero SE are left out.
    Returns:
        ``{"q", "df", "p", "i2", "pooled", "pooled_se", "strata"}``, or None with fewer than 2 usable strata.

    Example: effects ``[0, 2]``, SEs ``[1, 1]`` → ``θ̄ = 1``, ``Q = 2``, ``df = 1``, ``p = P(χ²_1 ≥ 2) ≈ 0.157``.
    """
    from statsmodels.stats.meta_analysis import combine_effects

    keep = [(float(e), float(s)) for e, s in zip(effects, ses) if math.isfinite(float(e)) and math.isfinite(float(s)) and s > 0]
    if len(keep) < 2:
        return None
    eff, var = np.array([e for e, _ in keep]), np.array([s * s for _, s in keep])
    with warnings.catch_warnings():  # its random-effects columns (not read here) take √ of a negative τ² at Q < df
        warnings.simplefilter("ignore", RuntimeWarning)
        res = combine_effects(eff, var, method_re="chi2", use_t=False)
    test = res.test_homogeneity()  # Cochran's Q against χ² on k − 1 df
    return {"q": float(test.statistic), "df": float(test.df), "p": float(test.pvalue),
            "i2": max(0.0, float(res.i2)),  # I² as Higgins & Thompson define it: (Q − df)/Q truncated at 0
            "pooled": float(res.mean_effect_fe), "pooled_se": float(res.sd_eff_w_fe), "strata": float(len(keep))}


#: The verdict of a claim the data cannot speak to: its two arms' runs were bit-identical, or every seed of both
#: arms gave one and the same value (an event neither arm ever showed, e.g. a collapse rate of 0 in both).
UNTESTABLE = "untestable (never triggered here)"


def never_triggered(a: Sequence[float], b: Sequence[float]) -> bool:
    """Did every seed of both arms give one and the same value (≥ 2 seeds each)? Then the claim's metric never
    moved in this setting (say, no run of either arm collapsed): no number of seeds will tell the arms apart, and
    the claim is :data:`UNTESTABLE` rather than judged on an exact zero difference.

    Example: ``never_triggered([0, 0, 0], [0, 0]) is True``; ``never_triggered([0, 0], [0, 1]) is False``.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return False
    both = np.concatenate([x, y])
    return bool(np.all(both == both[0]))


#: The words of an untestable claim's caveat (:func:`harness.reporting.summary.inert_reason`) when one of its arms ran
#: bit-identically to the baseline while the other is a third variant; :func:`arm_never_acted` reads them.
AS_BASELINE = "bit-identical to the baseline"


def arm_never_acted(row: dict[str, Any]) -> bool:
    """Is a judged claim untestable because one of its arms ran as the baseline (its caveats hold
    :data:`AS_BASELINE`), rather than because its two arms never differed? Raises nothing."""
    return any(AS_BASELINE in c for c in row.get("caveats") or [])


def set_untestable(row: dict[str, Any], why: str) -> None:
    """Replace a judged claim's verdict by :data:`UNTESTABLE` (not decisive) and say ``why`` in its caveats. A
    ``below margin`` caveat of the verdict it replaces goes: on arms whose every seed gave one value the margin test
    rejects trivially (a zero standard error), which shows nothing. Raises nothing."""
    row.update(verdict=UNTESTABLE, decisive=False)
    row["caveats"] = [c for c in row["caveats"] if not c.startswith("below margin")] + [why]


def apply_sequential(row: dict[str, Any], res: dict[str, Any], rule: "VerdictRule", stage: int, cap: int) -> None:
    """Replace a row's verdict (judged once by :func:`judge_claims` on the seeds of its deciding look) by the
    group-sequential decision ``res`` of :func:`harness.reporting.summary.sequential_rows`.

    Sets ``verdict``, ``decisive`` and ``sequential``: ``{stage, cap, looks (the path), decided, n (seeds per arm
    at the decision or the last look), level (the claim's Holm level then), at_cap, crossed (the crossing look's
    p and threshold, or None)}``; ``p_adj`` becomes None (Holm works through the levels, not adjusted p-values);
    the MDE is recomputed at the claim's level (Holm's division included), and for an equivalence claim the
    TOST power at zero difference is added (``tost_power_at_zero``). Caveats say where the claim stopped;
    before the first look (an empty path: an arm short of ``stage`` seeds) the verdict names that look, not an n.
    """
    yes, no = WORDS[row["kind"]]
    level = res["level"]
    if res.get("untestable"):  # out of the family: no level, no boundary, no MDE
        row["sequential"] = {"stage": stage, "cap": cap, "looks": [], "decided": True, "n": res["n"], "level": None,
                             "at_cap": False, "crossed": None, "untestable": True}
        row.update(p_adj=None, mde=None)
        row["caveats"] = [c for c in row["caveats"] if not c.startswith("underpowered")]
        why = res.get("why") or f"every seed of both arms gave the same {row['metric']}"
        set_untestable(row, f"{why} at the look at {res['n']} seeds per arm, so no number of seeds "
                            "can decide it: the claim left the Holm family and no further seeds were run for it")
        return
    crossed = next((e for e in res["path"] if e["crossed"]), None)
    row["sequential"] = {"stage": stage, "cap": cap, "looks": res["path"], "decided": res["decided"], "n": res["n"],
                         "level": level, "at_cap": res["at_cap"],
                         "crossed": {"p": crossed["p"], "threshold": crossed["threshold"]} if crossed else None}
    row["p_adj"] = None
    if row.get("blocks"):
        row["mde"] = stats.blocked_mde(row["se"], row["df"], level, rule.power)
    elif row.get("sd_a") is not None and row.get("n_a", 0) >= 2 and row.get("n_b", 0) >= 2:
        row["mde"] = stats.mde(row["sd_a"], row["sd_b"], row["n_a"], row["n_b"], level, rule.power)
        if row["expect"] == "equivalent":
            row["tost_power_at_zero"] = stats.tost_power(row["margin"], row["sd_a"], row["sd_b"], row["n_a"], row["n_b"], level)
    row["caveats"] = [c for c in row["caveats"] if not c.startswith(("underpowered", "below margin"))]
    if res["decided"] and res.get("below_margin"):
        row["verdict"], row["decisive"] = BELOW_MARGIN, True
        row["evidence"] += (f"; decided at look {res['look'] + 1} of {len(res['looks_planned'])} ({res['n']} seeds per arm) "
                            f"by the margin test ({margin_null(row)}): one-sided p = {crossed['p_margin']:.3g} ≤ boundary "
                            f"{crossed['margin_threshold']:.3g} at level {res['margin_level']:.3g}")
        row["caveats"].append(f"below margin: {margin_shown(row)} shown at {res['n']} seeds per arm, so any effect in the "
                              f"claimed direction is smaller than the margin {row['margin']:g} the claim is judged at")
    elif res["decided"]:
        row["verdict"], row["decisive"] = (yes if res["supports"] else no), True
        row["evidence"] += (f"; decided at look {res['look'] + 1} of {len(res['looks_planned'])} ({res['n']} seeds per arm): "
                            f"p = {crossed['p']:.3g} ≤ boundary {crossed['threshold']:.3g} at level {level:.3g}")
    elif res["at_cap"]:
        row["verdict"], row["decisive"] = INCONCLUSIVE, False
        mde = f"; MDE there {row['mde']:.3g} vs margin {row['margin']:g}" if row.get("mde") is not None else ""
        row["caveats"].append(f"undecided at the cap ({cap} seeds per arm){mde}")
    else:  # before the first look (an arm short of its seeds) there is no n to name, only the look to come
        row["verdict"], row["decisive"] = (f"undecided (n = {res['n']} of {cap} per arm)" if res["path"] else
                                           f"undecided (no look yet: the first at {stage} seeds per arm)"), False
        row["caveats"].append("the staged run has not reached the cap (still running, interrupted, paused by --pause-at or "
                              "stopped by --max-cpu-hours): run it again to go on")
    nonzero_caveat(row, yes)  # after every outcome: the fixed-n judgement's wording may no longer fit the verdict
