"""Every number of an ablation report: per-variant statistics, claim values (also at matched KL), the
group-sequential verdicts, frontier fits, caveats and compute, gathered by :func:`build_summary`.

Statistics (``shared/reference/ppo-components.md``, "Statistics for comparisons"):

- verdicts: :mod:`harness.analysis.verdicts` (Welch t / TOST per claim, Holm across the ablation's claims,
  no verdict below ``min_seeds``, minimum detectable effect and the seeds a margin would need), or the
  group-sequential rule of :mod:`harness.analysis.sequential` for an ablation run with ``--seeds auto``;
- per variant: mean with its Student t 95% interval, IQM only where it trims (n ≥ 8), and
  P(improvement) over the baseline (Mann–Whitney U / (n·n_base)) with a bootstrap interval;
- outcomes on equal footing: the held-out evaluation every ``eval.every`` iterations (``eval/*``),
  read per run as the final evaluation, the peak gold and its iteration, the area under the gold curve,
  a collapse flag, and gold and proxy at matched KL (:func:`harness.reporting.runs.add_matched_kl`);
- frontier: Gao, Schulman & Hilton 2022, ``R(d) = d(α − β log d)`` with ``d = √KL(π‖π_init)``,
  fitted by ``scipy.optimize.curve_fit`` on the evaluation points of all seeds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

import numpy as np

from harness.analysis import stats
from harness.config import flatten
from harness.reporting.matched import is_pair_reading, matched_point, pair_values
from harness.reporting.passk import passk_stats
from harness.reporting.render import fmt as _fmt
from harness.reporting.runs import (RunSet, add_matched_kl, first_seeds, frontier_groups, identical_runs,
                                 load_bon, mean_eval_curve, record_ids, run_draws, run_values)
from harness.rl.metrics import STANDING
from harness.analysis.verdicts import AS_BASELINE, UNTESTABLE, never_triggered, set_untestable

if TYPE_CHECKING:
    import pandas as pd

    from harness.experiments.spec import AblationSpec, Claim


def metric_stats(values: Sequence[float], baseline: Optional[Sequence[float]], goal: str, confidence: float = 0.95,
                 n_resamples: int = 9999) -> dict[str, Any]:
    """Per-variant statistics of one metric over seeds.

    Returns ``{"n", "values", "mean", "sd", "ci_low", "ci_high", "iqm", "p_improvement",
    "p_improvement_ci"}``: the Student t interval of the mean (:func:`harness.analysis.stats.mean_ci`); the IQM
    only where it trims something (n ≥ 8, else None); P(better than the baseline) =
    Mann–Whitney U / (n·n_base) oriented by ``goal`` with its percentile bootstrap CI (None for the
    baseline itself and for ``goal="none"``).
    """
    v = stats.finite(values)
    lo, hi = stats.mean_ci(v, confidence)
    compare = baseline is not None and goal != "none"
    return {
        "n": int(len(v)), "values": [float(t) for t in v],
        "mean": float(v.mean()) if len(v) else float("nan"),
        "sd": float(v.std(ddof=1)) if len(v) > 1 else float("nan"),
        "ci_low": lo, "ci_high": hi, "iqm": stats.iqm(v) if len(v) >= 8 else None,
        "p_improvement": stats.probability_of_improvement(v, baseline, goal) if compare else None,
        "p_improvement_ci": list(stats.probability_of_improvement_ci(v, baseline, goal, confidence, n_resamples))
        if compare else None,
    }



def variant_metrics(spec: "AblationSpec", scale: str, columns: Iterable[str] = ()) -> list[str]:
    """The metrics summarised per variant: the spec's, then any other metric a claim at ``scale`` reads
    (sorted), except the matched-point readings (``pair_matched_kl/*``, ``pair_matched_responses/*``), which exist only
    for a claim's two arms, then the standing columns
    (:data:`harness.rl.metrics.STANDING`: length, distinct-2, degenerate) that the runs recorded (``columns``: the
    run table's ``metrics.*`` columns) and the spec does not already list."""
    metrics = [m.name for m in spec.metrics]  # type: ignore[union-attr]
    extra = {c.metric for c in spec.claims_for(scale) if c.metric not in metrics and not is_pair_reading(c.metric)}
    recorded = {c.removeprefix("metrics.") for c in columns}
    standing = [m for m in STANDING if m in recorded and m not in metrics and m not in extra]
    return metrics + sorted(extra) + standing


def claim_values(rs: RunSet, a: str, b: str, metric: str) -> tuple[list[float], list[float], Optional[float]]:
    """The per-seed values a claim compares: ``(values of a, values of b, target or None)``.

    A matched-point reading (``pair_matched_kl/<m>``: both arms at the largest KL every run of the two reaches, in
    nats; ``pair_matched_responses/<m>``: at the most responses every run of the two sampled) is
    :func:`harness.reporting.matched.pair_values`, with its target. Any other metric is :func:`run_values` of each
    arm, target None. Values are in seed order; runs without the metric are skipped.
    """
    if is_pair_reading(metric):
        return pair_values(rs, a, b, metric)
    return run_values(rs, a, metric), run_values(rs, b, metric), None



def claim_draws(rs: RunSet, a: str, b: str, metric: str) -> Optional[tuple[list[str], list[str]]]:
    """The pipeline draw of each value :func:`claim_values` returns for a claim, ``(draws of a, draws of b)``, when
    the runs come from several draws (``pipeline.replicates`` > 1: tag ``replicate``) and every value has one; None
    otherwise (one pipeline: the seeds are then compared as independent draws of the PPO run alone). With runs of
    several builds counted, a draw is labelled with its build (a draw built on two machines is two blocks). Not for
    a matched-point reading (read off the curves), which is compared by seed as before."""
    if is_pair_reading(metric):
        return None
    da, db = run_draws(rs, a, metric, with_build=False), run_draws(rs, b, metric, with_build=False)
    if not da or not db or None in da or None in db or len(set(da) | set(db)) < 2:
        return None
    return run_draws(rs, a, metric), run_draws(rs, b, metric)  # each draw on its build (harness.experiments.builds)


def sequential_rows(rs: RunSet, claims: Sequence["Claim"], alpha: float, stage: int, cap: int,
                    margin_alpha: float = 0.0) -> list[dict[str, Any]]:
    """The group-sequential verdicts of ``claims`` (:func:`harness.analysis.sequential.sequential_decisions`) from
    the runs recorded so far: looks at ``stage, 2·stage, … cap`` seeds per arm, each taken only once both
    arms hold all of that look's seeds (or no more runs of them will come: the claim was decided). A claim whose
    arms never differ at a look (every value equal, or runs bit-identical: :func:`inert_reason`) stops there,
    decided and ``untestable``: more seeds cannot tell its arms apart, so the driver trains them no further.

    ``margin_alpha``: the margin tests' part of ``alpha`` (:func:`harness.analysis.sequential.sequential_decisions`).

    Returns:
        per claim: the decision dict (``decided``, ``look``, ``supports``, ``below_margin``, ``level``,
        ``margin_level``, ``path``) plus ``n`` (seeds per arm at the decision, or at the last look taken),
        ``looks_planned`` and ``at_cap``.
    """
    from harness.analysis import sequential
    from harness.analysis.verdicts import claim_look, has_margin_test

    sizes = sequential.stage_sizes(stage, cap)
    counts = rs.runs.groupby("variant")["seed"].count().to_dict() if not rs.runs.empty else {}
    subsets = {n: first_seeds(rs, n) for n in sizes if max(counts.values(), default=0) >= n}
    looks: list[list[Any]] = []
    inert: list[Optional[int]] = []  # the look at which a claim's arms never differed (verdicts.never_triggered)
    reasons: list[Optional[str]] = []  # why, where runs were bit-identical (inert_reason); None for equal values
    for c in claims:
        mine, stop, why = [], None, None
        for n in sizes:
            if min(counts.get(c.a, 0), counts.get(c.b, 0)) < n:
                break  # this look's seeds are not all there yet
            va, vb, _ = claim_values(subsets[n], c.a, c.b, c.metric)
            flat = never_triggered(va, vb)
            why = None if flat else inert_reason(subsets[n], c.a, c.b)
            if flat or why is not None:
                stop = len(mine)
                break
            lk = claim_look(c, va, vb, *(claim_draws(subsets[n], c.a, c.b, c.metric) or (None, None)))
            if lk is None:
                break
            mine.append(lk)
        looks.append(mine)
        inert.append(stop)
        reasons.append(why)  # set only where the loop stopped on it
    # A claim whose arms never differ leaves the family (it has no test, as Holm leaves out a claim without a
    # p-value): its first look's seeds are constant, or its arms' runs bit-identical seed by seed (a switch that never
    # binds, an A/A control that is the same computation), so are its later looks', and it stops there.
    testable = [i for i, stop in enumerate(inert) if stop is None]
    decisions = iter(sequential.sequential_decisions([looks[i] for i in testable], alpha, cap, margin_alpha,
                                                     [has_margin_test(claims[i]) for i in testable]))
    out = [next(decisions) if stop is None else
           {"decided": True, "untestable": True, "look": stop, "supports": None, "level": None, "path": [], "why": why}
           for stop, why in zip(inert, reasons)]
    for res, mine in zip(out, looks):
        taken = res["look"] + 1 if res["decided"] else len(mine)
        res["n"] = sizes[taken - 1] if taken else 0
        res["looks_planned"] = sizes
        res["at_cap"] = bool(taken and sizes[taken - 1] == cap)
    return out



def _frontier_fits(rs: RunSet, variant: str, n_resamples: int) -> dict[str, Any]:
    """``{"gold": fit, "proxy": fit}``: :func:`harness.analysis.frontier.bootstrap_fit` of ``R_RL`` over seeds, plus
    ``seed_t`` (:func:`harness.analysis.frontier.seed_t_fit`, the per-seed fits' t intervals), ``kl_peak`` and
    ``kl_peak_ci`` (``d_peak²``, nats) where the fit has a peak."""
    from harness.analysis.frontier import bootstrap_fit, kl_at, seed_t_fit

    out = {}
    for metric in ("gold", "proxy"):
        groups = frontier_groups(rs, variant, metric)
        f = bootstrap_fit(groups, "rl", n_resamples=n_resamples, seed=0)
        f["seed_t"] = seed_t_fit(groups, "rl")
        sq = [kl_at(x) for x in f.get("d_peak_ci") or []]  # a near-flat fit's peak: beyond a float's square
        f["kl_peak"] = kl_at(f.get("d_peak"))
        f["kl_peak_ci"] = sq if sq and all(np.isfinite(sq)) else None
        out[metric] = f
    return out


def _claim_caveats(rs: RunSet, row: dict[str, Any], lengths: dict[str, Optional[dict[str, Any]]],
                   plateaus: dict[str, Optional[dict[str, Any]]]) -> None:
    """Add data caveats to a judged claim: collapsed and degenerate seeds per arm, an arm whose mean held-out length
    ends below half the SFT policy's (``lengths``: each variant's :func:`_length`; unless the claim's metric is a
    length), for a claim read at the end of training (``eval_final/*``) an arm whose mean gold curve is still rising
    (``plateaus``: each variant's :func:`_plateau`), seeds that failed."""
    for arm in (row["a"], row["b"]):
        rising = plateaus.get(arm)
        if rising and rising["holds"] is False and row["metric"].startswith("eval_final/"):
            row["caveats"].append(f"not converged: {arm} is still rising at iteration {rising['read_at']:g} (its mean "
                                  f"held-out gold rose {rising['late_share']:.0%} of its total in the last quarter), so the "
                                  "arms are compared at the end of training, not at their plateaus")
        for flag, what in (("collapsed", "collapsed (held-out gold below the SFT policy's)"),
                           ("degenerate", "degenerate (final responses of ≤ 2 tokens on average, or distinct-2 < 0.1)")):
            name = f"metrics.eval_final/{flag}"
            col = rs.runs.loc[rs.runs["variant"] == arm, name] if name in rs.runs.columns else []
            k = int(np.nansum(np.asarray(list(col), dtype=float))) if len(col) else 0
            if k:
                row["caveats"].append(f"{k} of {len(col)} seeds of {arm} {what}")
        short = lengths.get(arm)
        if short and short["below_floor"] and "length" not in row["metric"]:
            row["caveats"].append(f"{arm} ends at {_fmt(short['final'])} tokens, below "
                                  f"{stats.LENGTH_FLOOR_SHARE:g} of the SFT policy's {_fmt(short['sft'])} (a length collapse)")
        lost = [f for f in rs.failed if f["variant"] == arm and not f["retried"]]
        if lost:
            row["caveats"].append(f"{len(lost)} run(s) of {arm} failed and were not retried")


def build_summary(rs: RunSet) -> dict[str, Any]:
    """Every number of the report, JSON-ready.

    Schema::

        {"ablation", "question", "scale", "experiment_id", "tracking_uri" (display form, no absolute path, no
         credentials), "generated_at", "report_git_sha", "baseline", "metrics": [{"name", "goal"}], "seeds": [...],
         "git_shas": [...], "pipeline": {stage: [keys]}, "draws": pipeline_draws(...) (each pipeline draw's seeds,
         stage keys and weight digests), "matched_kl", "rule": {rule, alpha, min_seeds, power},
         "configs_digest": configs_digest (what the spec ran at this scale when the report was made),
         "evaluation": evaluation_design(...) (the fixed held-out prompts every run is evaluated on),
         "variants": {name: {"overrides", "seeds", "run_ids",
                             "final": {metric: metric_stats(...)},
                             "frontier": {"gold"|"proxy": harness.analysis.frontier.bootstrap_fit + seed_t, kl_peak, kl_peak_ci},
                             "plateau": harness.analysis.stats.plateau_check of the mean gold curve,
                             "length": harness.analysis.stats.length_check of the mean held-out length (SFT vs end),
                             "updates": planned_updates(...) (optimizer steps per run), "passk": passk.passk_stats,
                             "identical_to_baseline": harness.reporting.runs.identical_runs or None}},
         "bon": load_bon(...) (the SFT policy's best-of-n curve of each proxy the runs used, with fits),
         "verdicts": [harness.analysis.verdicts.judge_claims rows],
         "failed": [{variant, seed, run_id, status, reason, retried, start_time}], "running": [...],
         "ignored_runs": int, "builds": {build: {runs, seeds}}, "other_builds": [{build, runs, keys}] (the counted
         builds and the runs set aside, harness.experiments.builds.pool_builds)}; harness.reporting.builds adds each row's by_build.
    """
    from harness.infra import tracking
    from harness.analysis.verdicts import judge_claims

    spec = rs.spec
    rule = spec.verdict
    matched = add_matched_kl(rs)
    claims = spec.claims_for(rs.scale)
    all_metrics = variant_metrics(spec, rs.scale, rs.runs.columns)
    variants: dict[str, Any] = {}
    for v in spec.variants_for(rs.scale):
        sub = rs.runs[rs.runs["variant"] == v].sort_values("seed") if not rs.runs.empty else rs.runs
        final = {}
        for m in all_metrics:
            base = run_values(rs, spec.baseline, m) if v != spec.baseline else None
            final[m] = metric_stats(run_values(rs, v, m), base, spec.metric_goal(m), 1 - rule.alpha, rule.n_resamples)
        variants[v] = {
            "overrides": flatten(spec.variants[v]),
            "seeds": [int(s) for s in sub["seed"]] if len(sub) else [],
            "run_ids": record_ids(sub) if len(sub) else [],
            "final": final,
            "frontier": _frontier_fits(rs, v, min(rule.n_resamples, 2000)),
            "plateau": _plateau(rs, v),
            "length": _length(rs, v), "passk": passk_stats(rs, v),
            "updates": planned_updates(spec, rs.scale, v),
            "identical_to_baseline": identical_runs(rs, v, spec.baseline) if v != spec.baseline else None,
        }
    seq = (sequential_rows(rs, claims, rule.alpha, rs.design["stage"], rs.design["cap"], rule.margin_alpha)
           if rs.design else None)
    looked = [rs for _ in claims] if seq is None else [first_seeds(rs, r["n"]) if r["n"] else rs for r in seq]
    compared = [claim_values(sub, c.a, c.b, c.metric) for sub, c in zip(looked, claims)]
    draws = [claim_draws(sub, c.a, c.b, c.metric) for sub, c in zip(looked, claims)]
    verdicts = judge_claims(claims, [(va, vb, *d) if d else (va, vb) for (va, vb, _), d in zip(compared, draws)], rule)
    if seq is not None:
        from harness.analysis.verdicts import apply_sequential

        for row, res in zip(verdicts, seq):
            apply_sequential(row, res, rule, rs.design["stage"], rs.design["cap"])  # type: ignore[index]
    for row, c, res in zip(verdicts, claims, seq or [None] * len(claims)):
        row["cost"] = _claim_cost(rs, c, res["n"] if res else None)
    _finish_rows(rs, verdicts, compared, staged=seq is not None, variants=variants, matched=matched)
    seeds = sorted({s for v in variants.values() for s in v["seeds"]})
    draws = pipeline_draws(rs)
    pipeline: dict[str, list[str]] = {}
    for col in sorted(c for c in rs.runs.columns if c.startswith("tags.pipeline.")):
        pipeline[col.removeprefix("tags.pipeline.")] = sorted({str(x) for x in rs.runs[col].dropna()})
    return stats.clean({
        "ablation": spec.name, "question": spec.question, "scale": rs.scale, "experiment_id": rs.experiment_id,
        "tracking_uri": tracking.display_uri(tracking.tracking_uri()), "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "report_git_sha": tracking.git_sha(),
        "baseline": spec.baseline, "metrics": [{"name": m.name, "goal": m.goal} for m in spec.metrics],  # type: ignore[union-attr]
        "seeds": seeds, "git_shas": rs.git_shas, "pipeline": pipeline, "draws": draws, "matched_kl": matched,
        "rule": rule.reported(), "configs_digest": _configs_digest(spec, rs.scale),
        "evaluation": evaluation_design(spec, rs.scale), "variants": variants, "verdicts": verdicts, "bon": load_bon(rs), "design": rs.design,
        "cost": _ablation_cost(rs),
        "failed": rs.failed, "running": rs.running, "ignored_runs": rs.ignored, "other_builds": rs.other_builds, "builds": rs.builds,
    })



def _finish_rows(rs: RunSet, verdicts: list[dict[str, Any]], compared: list[tuple[list[float], list[float], Any]],
                 staged: bool, variants: dict[str, dict[str, Any]], matched: Optional[float] = None) -> None:
    """The judged rows' last touches: where a matched-point claim was read (``matched``, nats, for ``matched_kl/*``:
    :func:`harness.reporting.runs.add_matched_kl`; its own pair's KL or responses for a matched-point reading:
    :func:`harness.reporting.matched.matched_point`),
    data caveats (from each of the
    summary's ``variants``: its ``length`` and ``plateau`` checks), and
    :data:`UNTESTABLE` for a claim whose arms never differ over at least ``min_seeds`` seeds (a fixed design's; the
    staged rule stops such a claim itself) or whose runs are bit-identical."""
    lengths = {v: d["length"] for v, d in variants.items()}
    plateaus = {v: d["plateau"] for v, d in variants.items()}
    for row, (va, vb, target) in zip(verdicts, compared):
        # with fewer seeds than the rule's min_seeds the verdict stays "not enough seeds": a handful of equal values
        # does not show that the arms never differ
        if not staged and row["enough_seeds"] and never_triggered(va, vb):
            set_untestable(row, f"every seed of both arms gave the same {row['metric']}: the arms never differ here")
        if target is not None:
            key, note = matched_point(str(row["metric"]), target)
            row[key], row["evidence"] = target, row["evidence"] + note
        elif matched is not None and str(row["metric"]).startswith("matched_kl/"):
            row["matched_kl"] = matched
        _claim_caveats(rs, row, lengths, plateaus)
        mark_untestable(row, inert_reason(rs, row["a"], row["b"]))


def inert_reason(rs: RunSet, a: str, b: str) -> Optional[str]:
    """Why the runs cannot speak to a claim on arms ``a`` and ``b``, or None when they can: the two arms' runs are
    bit-identical on every shared seed (:func:`harness.reporting.runs.identical_runs`), or one arm ran bit-identically
    to the baseline while the other is a third variant: its switch never bound here, so the data compare the baseline
    with the other arm. Example: rollout_correction's ``seq_mask`` masks no sequence under our FP8 engine, so its runs
    are ``none``'s seed by seed, and "seq_mask matches TIS" is untestable, not a verdict on ``none`` vs ``tis``."""
    if identical_runs(rs, a, b):
        return f"the runs of {a} and {b} are bit-identical on every shared seed"
    base = rs.spec.baseline
    for arm, other in ((a, b), (b, a)):
        if base not in (arm, other) and identical_runs(rs, arm, base):
            return (f"the runs of {arm} are {AS_BASELINE} {base}'s on every shared seed: {arm}'s "
                    f"switch never bound here, so the data compare {base} with {other}, not {arm}")
    return None


def mark_untestable(row: dict[str, Any], why: Optional[str]) -> None:
    """Replace a judged claim's verdict by :data:`UNTESTABLE` (not decisive) when the runs cannot speak to it,
    ``why`` (:func:`inert_reason`) saying so in its caveats (once); None leaves the row as it is."""
    if why and not any(why in c for c in row["caveats"]):  # apply_sequential may have said it already
        set_untestable(row, why)


def evaluation_design(spec: "AblationSpec", scale: str) -> Optional[dict[str, int]]:
    """The held-out evaluation every run of the ablation reads its ``eval/*`` metrics from, as the baseline's config
    at ``scale`` resolves it: ``{"num_prompts", "samples_per_prompt", "passk_samples"}`` (``eval.num_prompts`` prompts
    set aside from the task's pool, the same for every run; ``eval.samples_per_prompt`` sampled responses each;
    ``eval.passk_samples`` more per prompt for pass@k before the first update and after the last). None when the
    config cannot be resolved. The report says what the fixed prompts mean for its intervals."""
    from harness.experiments.spec import resolve_config
    from harness.errors import HarnessError

    try:
        e = resolve_config(spec, scale, spec.baseline, 0).eval
    except (HarnessError, ValueError):
        return None
    return {"num_prompts": int(e.num_prompts), "samples_per_prompt": int(e.samples_per_prompt),
            "passk_samples": int(e.passk_samples)}


def planned_updates(spec: "AblationSpec", scale: str, variant: str) -> Optional[int]:
    """The optimizer steps a run of ``variant`` plans: ``total_iterations · num_ppo_epochs · num_minibatches`` (one
    step per minibatch; gradient accumulation splits a step, it adds none). None when the variant's config cannot
    be resolved at ``scale``. Arms with fewer steps (RLOO as published: one epoch, one minibatch) move less per
    batch, which a comparison at the end confounds with the claim."""
    from harness.experiments.spec import resolve_config
    from harness.errors import HarnessError

    try:
        p = resolve_config(spec, scale, variant, 0).ppo
    except (HarnessError, ValueError):
        return None
    return int(p.total_iterations * p.num_ppo_epochs * p.num_minibatches)


def pipeline_draws(rs: RunSet) -> list[dict[str, Any]]:
    """The pipeline draws the counted runs used (tag ``replicate``; runs recorded without it count as draw 0), each
    with its seeds, and per stage the cache keys (``pipeline.<stage>`` tags) and the digests of the saved weights
    (``digest.<stage>`` tags) its runs recorded: one key and one digest per stage when the draw is what it claims."""
    import pandas as pd

    if rs.runs.empty:
        return []
    runs = rs.runs
    draw = runs["tags.replicate"].fillna("0").astype(str) if "tags.replicate" in runs.columns else \
        pd.Series("0", index=runs.index)
    out = []
    for j in sorted(draw.unique(), key=lambda x: (len(x), x)):
        sub = runs[draw == j]
        stages: dict[str, dict[str, list[str]]] = {}
        for col in sorted(c for c in runs.columns if c.startswith(("tags.pipeline.", "tags.digest."))):
            kind, stage = col.removeprefix("tags.").split(".", 1)
            vals = sorted({str(x) for x in sub[col].dropna()})
            if vals:
                stages.setdefault(stage, {})["keys" if kind == "pipeline" else "digests"] = vals
        out.append({"draw": int(j) if j.isdigit() else j, "seeds": sorted({int(x) for x in sub["seed"]}),
                    "stages": stages, "proxy": _proxy_metrics(rs, stages)})
    return out


#: The proxy's metrics a report gives per pipeline draw (from its pipeline stage, :func:`harness.experiments.archive.stage_copy`).
PROXY_METRICS = ("heldout_agreement", "spearman_vs_gold", "spearman_vs_length")


def _proxy_metrics(rs: RunSet, stages: dict[str, dict[str, list[str]]]) -> Optional[dict[str, float]]:
    """The :data:`PROXY_METRICS` of a draw's proxy reward model: its agreement with the gold on held-out comparisons
    (fraction), its Spearman with the gold and with response length (tokens) over held-out responses, as built here or
    archived with the runs (checked against every digest in ``stages``: those the draw's runs recorded); None when
    the draw's runs name no single proxy or its metrics are neither built nor kept."""
    from harness.experiments.archive import stage_copy

    keys = stages.get("reward_model", {}).get("keys") or []
    if len(keys) != 1:
        return None
    digests = {d for st in stages.values() for d in st.get("digests", [])}
    metrics = stage_copy(rs.spec.name or "", "reward_model", keys[0], digests) or {}
    kept = {k: float(metrics[k]) for k in PROXY_METRICS if k in metrics}
    return kept or None


def _length(rs: RunSet, variant: str) -> Optional[dict[str, Any]]:
    """:func:`harness.analysis.stats.length_check` of ``variant``'s mean held-out response length: its first evaluation (the
    SFT policy) against its last; None without two evaluations or with an SFT length of 0."""
    steps, lengths = mean_eval_curve(rs, variant, "eval/length")
    return stats.length_check(lengths[0], lengths[-1]) if len(steps) >= 2 and lengths[0] > 0 else None


def _plateau(rs: RunSet, variant: str) -> Optional[dict[str, Any]]:
    """:func:`harness.analysis.stats.plateau_check` of ``variant``'s mean held-out gold curve (None without two evaluations)."""
    steps, gold = mean_eval_curve(rs, variant)
    return stats.plateau_check(steps, gold) if len(steps) >= 2 else None


def configs_digest(spec: Any, scale: str) -> str:
    """A fingerprint of what the spec runs at ``scale`` now: sha256 (12 hex digits) of each variant's
    :func:`harness.experiments.spec.run_hash` at seed 0, so that any change of a resolved config (a task default, the regime, the
    scale's iterations or pipeline draws, a variant's overrides) changes it. A report records it, and the
    scorecard lends a committed report's verdicts only while it matches (:mod:`harness.reporting.scorecard`).

    Raises:
        HarnessError, ConfigError: as :func:`harness.experiments.spec.resolve_config`.
    """
    import hashlib
    import json

    from harness.experiments.spec import resolve_config, run_hash

    hashes = {v: run_hash(resolve_config(spec, scale, v, 0)) for v in spec.variants_for(scale)}
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()[:12]


def _configs_digest(spec: Any, scale: str) -> Optional[str]:
    """:func:`configs_digest`, or None where a variant's config does not resolve at ``scale``."""
    from harness.errors import HarnessError

    try:
        return configs_digest(spec, scale)
    except (HarnessError, ValueError):  # ConfigError is both
        return None


def _cost(runs: "pd.DataFrame") -> dict[str, Any]:
    """``{"runs", "cpu_hours", "pipeline_cpu_hours", "copied"}`` of counted runs: CPU-hours are the summed
    ``wall_time_s`` (one core per run) of the runs trained for this ablation, ``pipeline_cpu_hours`` the part of
    them a run's worker spent building a missing pipeline draw (``pipeline_build_s``; 0 for runs that did not
    record it); a run copied in from another (tag ``copied_from``) is counted as a run but costs nothing here, so
    no compute is counted twice."""
    if runs.empty:
        return {"runs": 0, "cpu_hours": 0.0, "pipeline_cpu_hours": 0.0, "copied": 0}
    copied = runs["tags.copied_from"].notna() if "tags.copied_from" in runs.columns else runs["run_id"].isna()

    def hours(col: str) -> float:
        return float(runs.loc[~copied, col].fillna(0).sum()) / 3600 if col in runs.columns else 0.0

    return {"runs": int(len(runs)), "cpu_hours": hours("metrics.wall_time_s"),
            "pipeline_cpu_hours": hours("metrics.pipeline_build_s"), "copied": int(copied.sum())}


def _claim_cost(rs: RunSet, claim: "Claim", n: Optional[int]) -> dict[str, Any]:
    """:func:`_cost` of a claim's two arms, up to ``n`` seeds per arm when the sequential rule stopped there
    (all counted runs otherwise)."""
    sub = first_seeds(rs, n) if n else rs
    return _cost(sub.runs[sub.runs["variant"].isin([claim.a, claim.b])] if not sub.runs.empty else sub.runs)


def _ablation_cost(rs: RunSet) -> dict[str, Any]:
    """:func:`_cost` of every counted run of the ablation at this scale."""
    return _cost(rs.runs)


