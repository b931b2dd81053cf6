"""Each claim's effect per build of the pipeline, and the heterogeneity test across builds (:mod:`harness.experiments.builds`
pools builds as strata; a report shows, and never hides, whether they agree)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from harness.analysis import stats
from harness.reporting.render import claim_title, fmt, md_cell
from harness.reporting.runs import RunSet, add_matched_kl, first_seeds
from harness.reporting.summary import claim_draws, claim_values

if TYPE_CHECKING:
    from harness.experiments.spec import Claim


def build_effects(rs: "RunSet", claim: "Claim") -> Optional[dict[str, Any]]:
    """A claim's effect on each build's runs alone (``rs``: the runs its verdict read; per build, every FINISHED run
    of those seeds on that build, ``rs.every_build``, those set aside from the pooled verdict included), each tested
    as the verdict tests the pooled runs (:func:`harness.analysis.verdicts.compare`, its draws as blocks), and Cochran's Q
    across the builds (:func:`harness.analysis.verdicts.heterogeneity`). Q treats the builds as independent strata; a seed
    run on two builds shares its recipe and seeds there, so Q, if anything, understates a disagreement. A
    pair-matched claim is read per build at the largest KL that build's runs of both arms reach (curves of the
    counted runs only).

    Returns:
        ``{"builds": [{"build" (short form), "n_a", "n_b", "diff", "lo", "hi"}], "q", "df", "p", "i2"}`` (``q`` …
        None with fewer than 2 builds holding ≥ 2 values per arm), or None when the runs are of one build.
    """
    import dataclasses

    import numpy as np
    from scipy import stats as st

    from harness.experiments.builds import short_build
    from harness.analysis.verdicts import compare, heterogeneity

    every = rs.every_build if rs.every_build is not None else rs.runs
    if every.empty or "build" not in every.columns or every["build"].nunique() <= 1:
        return None
    seeds = set(rs.runs["seed"]) if not rs.runs.empty else set()
    every = every[every["seed"].isin(seeds)]  # the seeds the verdict read, on each build that ran them
    rows, effects, ses = [], [], []
    for b in sorted(every["build"].unique()):
        sub = dataclasses.replace(rs, runs=every[every["build"] == b].sort_values("seed").copy())
        add_matched_kl(sub)
        va, vb, _ = claim_values(sub, claim.a, claim.b, claim.metric)
        n_a, n_b = int(np.isfinite(va).sum()) if va else 0, int(np.isfinite(vb).sum()) if vb else 0
        row: dict[str, Any] = {"build": short_build(str(b)), "n_a": n_a, "n_b": n_b, "diff": None, "lo": None, "hi": None}
        if n_a >= 2 and n_b >= 2:
            draws = claim_draws(sub, claim.a, claim.b, claim.metric)
            w = compare(va, vb, *(draws or (None, None)))  # drops the non-finite values with their draws
            half = float(st.t.ppf(0.975, w.df)) * w.se if np.isfinite(w.df) and w.df > 0 else float("nan")
            row.update(diff=w.diff, lo=w.diff - half, hi=w.diff + half)
            effects.append(w.diff)
            ses.append(w.se)
        rows.append(row)
    het = heterogeneity(effects, ses) or {}
    return {"builds": rows, "q": het.get("q"), "df": het.get("df"), "p": het.get("p"), "i2": het.get("i2")}


def add_build_effects(rs: RunSet, summary: dict[str, Any]) -> None:
    """Give each verdict row of ``summary`` (:func:`harness.reporting.summary.build_summary`) its ``by_build``
    (:func:`build_effects` over the seeds its verdict read: those of its deciding or last look under ``--seeds auto``,
    else all). Rows and claims are in spec order."""
    claims = rs.spec.claims_for(rs.scale)
    for row, claim in zip(summary["verdicts"], claims):
        n = (row.get("sequential") or {}).get("n")
        row["by_build"] = stats.clean(build_effects(first_seeds(rs, n) if n else rs, claim))


def build_notes(summary: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The report's notes on builds: the counted builds ``[{"name" (short form), "runs", "seeds"}]`` and the runs set
    aside, per build ``[{"name", "runs", "keys"}]`` (:func:`harness.experiments.builds.short_build` names both)."""
    from harness.experiments.builds import short_build

    counted = [{"name": short_build(b), "runs": d["runs"], "seeds": ", ".join(str(x) for x in d["seeds"])}
               for b, d in (summary.get("builds") or {}).items()]
    aside = [{**b, "name": short_build(b.get("build", ""))} for b in summary.get("other_builds") or []]
    return counted, aside


def build_rows(summary: dict[str, Any]) -> list[str]:
    """The "Per build" table's rows: per claim and build, n per arm and the effect [95% CI]; Cochran's Q on the
    claim's first row (:func:`harness.reporting.builds.build_effects`)."""
    rows = []
    for v in summary["verdicts"]:
        by = v.get("by_build")
        if not by:
            continue
        q = (f"Q = {fmt(by['q'], 2)} ({by['df']:.0f}), p = {fmt(by['p'], 3)}" if by.get("q") is not None
             else "– (fewer than 2 builds with 2 seeds per arm)")
        for i, b in enumerate(by["builds"]):
            eff = f"{fmt(b['diff'])} [{fmt(b['lo'])}, {fmt(b['hi'])}]" if b["diff"] is not None else "–"
            title = md_cell(v.get("title") or claim_title(v["claim"])) if i == 0 else ""
            rows.append(f"| {title} | `{b['build']}` | {b['n_a']} / {b['n_b']} | {eff} | {q if i == 0 else ''} |")
    return rows


__all__ = ["build_effects", "add_build_effects", "build_notes", "build_rows"]
