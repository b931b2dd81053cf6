"""Ablation reports: MLflow runs → pandas → statistics → seaborn PNGs, ``report.md``, ``summary.json``.

``write_report(name)`` reads the child runs of experiment ``ablation/<name>`` and writes
``<reports>/<name>/``:

- ``report.md``: question, setup, a verdict per published claim, the final-metric table,
  learning curves, the gold-vs-√KL frontier, failed runs and sample completions;
- ``learning_curves.png``: per-iteration metrics, mean ± 95% CI over seeds per variant;
- ``final_metrics.png``: each primary metric per variant (seeds as points, mean and its 95% t interval);
- ``frontier.png``: held-out gold gain vs d = √KL with the fitted Gao et al. curve per variant;
- ``claims.png``: each claim's difference with its 95% Welch interval against its bound(s);
- ``summary.json``: every number of the report (schema in :func:`build_summary`);
- ``runs.csv``: every per-iteration metric of every counted run (long format).

Which runs count: child runs of the chosen scale (default: the scale of the latest invocation)
whose ``config_hash`` equals the hash the spec resolves to now for that (variant, seed); of those,
only the latest FINISHED run per (variant, seed). Earlier FAILED/KILLED attempts are listed.

Statistics (``shared/reference/ppo-components.md``, "Statistics for comparisons"):

- verdicts: :mod:`harness.verdicts` (Welch t / TOST per claim, Holm across the ablation's claims,
  no verdict below ``min_seeds``, minimum detectable effect and the seeds a margin would need);
- per variant: mean with its Student t 95% interval, IQM only where it trims (n ≥ 8), and
  P(improvement) over the baseline (Mann–Whitney U / (n·n_base)) with a bootstrap interval;
- outcomes on equal footing: the held-out evaluation every ``eval.every`` iterations (``eval/*``),
  read per run as the final evaluation, the peak gold and its iteration, the area under the gold curve,
  a collapse flag, and gold and proxy at matched KL (:func:`add_matched_kl`);
- frontier: Gao, Schulman & Hilton 2022, ``R(d) = d(α − β log d)`` with ``d = √KL(π‖π_init)``,
  fitted by ``scipy.optimize.curve_fit`` on the evaluation points of all seeds.
"""

from __future__ import annotations

import dataclasses

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from harness import stats
from harness.ablation_spec import PAIR_MATCHED
from harness.config import default_reports_dir, flatten
from harness.errors import HarnessError

if TYPE_CHECKING:
    import pandas as pd

    from harness.ablation_spec import AblationSpec, Claim

#: Per-iteration metrics drawn as learning curves: the held-out evaluations first, then training batches.
CURVE_METRICS = [
    "eval/gold", "eval/proxy", "eval/kl", "eval/gold_lexicon", "eval/length", "objective/score", "objective/kl", "objective/entropy",
    "policy/clipfrac", "policy/ratio_mean",
]
#: Namespaces of per-iteration metrics (read in full and written to ``runs.csv``); everything else
#: a run logs is a run-level summary value.
PER_ITERATION_PREFIXES = ("objective/", "policy/", "loss/", "val/", "response/", "time/", "perf/", "eval/")


# ------------------------------------------------------------------------------------------------
# Reading runs
# ------------------------------------------------------------------------------------------------


@dataclass
class RunSet:
    """The runs of one ablation at one scale, as read from MLflow.

    ``runs``: one row per counted run (latest FINISHED per (variant, seed)) with columns
    ``run_id, variant, seed, start_time, artifact_uri`` and ``metrics.<name>`` for every
    run-level metric. ``history``: long format ``run_id, variant, seed, metric, step, value``
    for every per-iteration metric (:data:`PER_ITERATION_PREFIXES`). ``failed``: every FAILED/KILLED attempt of a planned
    (variant, seed), with ``reason`` and ``retried`` (a later FINISHED run exists). ``design``: the
    ``stage`` and ``cap`` of the sequential rule when the ablation ran with ``--seeds auto`` at this scale.
    """

    spec: "AblationSpec"
    scale: str
    experiment_id: str
    runs: "pd.DataFrame"
    history: "pd.DataFrame"
    failed: list[dict[str, Any]] = field(default_factory=list)
    running: list[dict[str, Any]] = field(default_factory=list)
    ignored: int = 0
    git_shas: list[str] = field(default_factory=list)
    eval_curves: dict[str, "pd.DataFrame"] = field(default_factory=dict, repr=False)  # run_id -> curve, filled once
    design: Optional[dict[str, int]] = None  # {"stage", "cap"} when the newest invocation at this scale was --seeds auto


def _parents(c: Any, exp_id: str) -> list[Any]:
    """Every parent run (one per invocation) of the experiment, newest first."""
    from harness.tracking import search_all

    return list(search_all(c, [exp_id], "tags.kind = 'parent'"))


def _latest_parent(c: Any, exp_id: str) -> Any:
    parents = _parents(c, exp_id)
    return parents[0] if parents else None


def _load_spec_for_report(name: str, parent: Any) -> "AblationSpec":
    """The spec file if it exists, else the copy stored with the latest invocation."""
    import yaml

    from harness.ablation_spec import AblationSpec, load_spec, spec_path

    try:
        spec_path(name)
    except HarnessError:
        if parent is None:
            raise
        import mlflow

        text = mlflow.artifacts.load_text(f"{parent.info.artifact_uri}/spec.yaml")
        spec = AblationSpec.model_validate(yaml.safe_load(text))
        spec.name = name
        return spec
    return load_spec(name, validate_configs=False)


def load_runs(name: str, scale: Optional[str] = None, history_prefixes: Sequence[str] = PER_ITERATION_PREFIXES) -> RunSet:
    """Read ablation ``name``'s runs at ``scale`` (default: the latest invocation's scale).

    Uses ``mlflow.search_runs`` (pandas) for run-level metrics and tags and
    ``MlflowClient.get_metric_history`` for the curves.

    Raises:
        HarnessError: no experiment / no invocation recorded for ``name``.
    """
    import mlflow
    import pandas as pd

    from harness import tracking
    from harness.ablation_spec import experiment_name, resolve_config, run_hash

    uri = tracking.tracking_uri()
    c = tracking.client(uri)
    exp = c.get_experiment_by_name(experiment_name(name))
    if exp is None:
        from harness.ablation_spec import spec_path

        spec_path(name)  # an unknown name: the error lists the available ablations
        raise HarnessError(f"no runs recorded for ablation {name!r} in {tracking.display_uri(uri)}; run `harness ablate {name}` first")
    exp_id = exp.experiment_id
    parent = _latest_parent(c, exp_id)
    spec = _load_spec_for_report(name, parent)
    if scale is None:
        if parent is None:
            raise HarnessError(f"no invocation recorded for ablation {name!r}; run `harness ablate {name}` first")
        scale = parent.data.tags.get("scale", "default")

    mlflow.set_tracking_uri(uri)
    df = mlflow.search_runs(experiment_ids=[exp_id], filter_string="tags.kind = 'child'", output_format="pandas")
    empty_hist = pd.DataFrame(columns=["run_id", "variant", "seed", "metric", "step", "value"])
    if df.empty:
        return RunSet(spec, scale, exp_id, df, empty_hist)
    df = df[df["tags.scale"] == scale].copy()
    df["variant"] = df["tags.variant"]
    df["seed"] = pd.to_numeric(df["tags.seed"], errors="coerce").astype("Int64")
    expected: dict[tuple[str, int], str] = {}
    keep = []
    for _, row in df.iterrows():
        v, s = row["variant"], row["seed"]
        if v not in spec.variants or pd.isna(s):
            keep.append(False)
            continue
        if (v, int(s)) not in expected:
            expected[(v, int(s))] = run_hash(resolve_config(spec, scale, v, int(s)))
        keep.append(row["tags.config_hash"] == expected[(v, int(s))])
    ignored = int(len(df) - sum(keep))
    df = df[keep].sort_values("start_time", ascending=False)
    finished = df[df["status"] == "FINISHED"].drop_duplicates(["variant", "seed"], keep="first")
    done_keys = set(zip(finished["variant"], finished["seed"]))
    failed, running = [], []
    for _, row in df[df["status"].isin(["FAILED", "KILLED"])].iterrows():
        failed.append({"variant": row["variant"], "seed": int(row["seed"]), "run_id": row["run_id"], "status": row["status"],
                       "reason": row.get("tags.failure_reason") if isinstance(row.get("tags.failure_reason"), str) else "",
                       "retried": (row["variant"], row["seed"]) in done_keys,
                       "start_time": str(row["start_time"])})
    for _, row in df[df["status"] == "RUNNING"].iterrows():
        running.append({"variant": row["variant"], "seed": int(row["seed"]), "run_id": row["run_id"]})
    order = {v: i for i, v in enumerate(spec.variants)}
    finished = finished.assign(_o=finished["variant"].map(order)).sort_values(["_o", "seed"]).drop(columns="_o")
    rows = []
    keys = sorted(col[len("metrics."):] for col in finished.columns
                  if col.startswith("metrics.") and col[len("metrics."):].startswith(tuple(history_prefixes)))
    for _, row in finished.iterrows():
        for metric in keys:
            if pd.isna(row[f"metrics.{metric}"]):  # not logged by this run
                continue
            for m in c.get_metric_history(row["run_id"], metric):
                rows.append((row["run_id"], row["variant"], int(row["seed"]), metric, int(m.step), float(m.value)))
    history = pd.DataFrame(rows, columns=["run_id", "variant", "seed", "metric", "step", "value"]) if rows else empty_hist
    shas = sorted({s for s in finished.get("tags.git_sha", pd.Series(dtype=str)).dropna()})
    design = None
    auto = [r for r in _parents(c, exp_id) if r.data.tags.get("scale") == scale and r.data.tags.get("seeds_mode") == "auto"]
    if auto:  # the newest staged invocation at this scale: its design judges the claims
        design = {"stage": int(auto[0].data.tags["stage"]), "cap": int(auto[0].data.tags["cap"])}
    return RunSet(spec, scale, exp_id, finished.reset_index(drop=True), history, failed, running, ignored, shas,
                  design=design)


def run_values(rs: RunSet, variant: str, metric: str) -> list[float]:
    """Final values of ``metric`` (an MLflow run-level metric, or one computed here such as
    ``matched_kl/gold``) for ``variant``'s counted runs, in seed order; runs without it are skipped."""
    col = f"metrics.{metric}"
    if col not in rs.runs.columns or rs.runs.empty:
        return []
    sub = rs.runs[rs.runs["variant"] == variant].sort_values("seed")
    return [float(v) for v in sub[col] if v is not None and np.isfinite(float(v))]


# ------------------------------------------------------------------------------------------------
# Summary
# ------------------------------------------------------------------------------------------------

def metric_stats(values: Sequence[float], baseline: Optional[Sequence[float]], goal: str, confidence: float = 0.95,
                 n_resamples: int = 9999) -> dict[str, Any]:
    """Per-variant statistics of one metric over seeds.

    Returns ``{"n", "values", "mean", "sd", "ci_low", "ci_high", "iqm", "p_improvement",
    "p_improvement_ci"}``: the Student t interval of the mean (:func:`harness.stats.mean_ci`); the IQM
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


def eval_curve(rs: RunSet, run_id: str) -> "pd.DataFrame":
    """One run's held-out evaluations: columns ``step, eval/kl, eval/gold, eval/proxy ...``, by step.
    The curves of all runs are pivoted once per :class:`RunSet` and kept in ``rs.eval_curves``."""
    import pandas as pd

    if not rs.eval_curves and not rs.history.empty:
        h = rs.history[rs.history["metric"].str.startswith("eval/")]
        for rid, sub in h.groupby("run_id", sort=False):
            rs.eval_curves[rid] = sub.pivot_table(index="step", columns="metric", values="value").reset_index().sort_values("step")
    return rs.eval_curves.get(run_id, pd.DataFrame(columns=["step"]))


def value_at_kl(kl: Sequence[float], values: Sequence[float], target: float) -> float:
    """The value where the KL curve first reaches ``target``, interpolated linearly on the KL axis.

    Args:
        kl: ``eval/kl`` per evaluation, in iteration order (nats per response).
        values: the metric at the same evaluations.
        target: the matched KL.
    Returns:
        ``values[0]`` if ``kl[0] ≥ target``; else, at the first ``i`` with ``kl[i] ≥ target``,
        ``v[i-1] + (target − kl[i-1]) / (kl[i] − kl[i-1]) · (v[i] − v[i-1])``; NaN if the curve never
        reaches ``target``.

    Example: ``value_at_kl([0, 2, 6], [0.1, 0.3, 0.5], 4.0) == 0.4``.
    """
    for i, k in enumerate(kl):
        if k >= target:
            if i == 0:
                return float(values[0])
            k0, v0 = kl[i - 1], values[i - 1]
            return float(v0 + (target - k0) / (k - k0) * (values[i] - v0))
    return float("nan")


def add_matched_kl(rs: RunSet) -> Optional[float]:
    """Gold and proxy of every counted run at one KL that every run reaches (Gao et al. 2022 compare
    policies at equal KL): ``target = min over runs of max eval/kl``; adds the columns
    ``metrics.matched_kl/gold`` and ``metrics.matched_kl/proxy`` (:func:`value_at_kl`) to ``rs.runs``.
    Returns the target (nats), or None without evaluation curves."""
    if rs.runs.empty or rs.history.empty:
        return None
    curves = {rid: eval_curve(rs, rid) for rid in rs.runs["run_id"]}
    maxima = [float(c["eval/kl"].max()) for c in curves.values() if "eval/kl" in c and len(c)]
    if len(maxima) < len(curves) or not maxima:
        return None
    target = min(maxima)
    for metric in ("gold", "proxy"):
        rs.runs[f"metrics.matched_kl/{metric}"] = [
            value_at_kl(list(curves[r]["eval/kl"]), list(curves[r][f"eval/{metric}"]), target)
            if f"eval/{metric}" in curves[r] else float("nan") for r in rs.runs["run_id"]]
    return target


def variant_metrics(spec: "AblationSpec", scale: str) -> list[str]:
    """The metrics summarised per variant: the spec's, then any other metric a claim at ``scale`` reads
    (sorted), except ``pair_matched_kl/*``, which exists only for a claim's two arms."""
    metrics = [m.name for m in spec.metrics]  # type: ignore[union-attr]
    extra = {c.metric for c in spec.claims_for(scale) if c.metric not in metrics and not c.metric.startswith(PAIR_MATCHED)}
    return metrics + sorted(extra)


def claim_values(rs: RunSet, a: str, b: str, metric: str) -> tuple[list[float], list[float], Optional[float]]:
    """The per-seed values a claim compares: ``(values of a, values of b, KL target or None)``.

    For ``pair_matched_kl/<m>`` (``m``: gold | proxy | gold_lexicon) every counted run of ``a`` and ``b`` is
    read at ``target = min over those runs of max eval/kl`` (nats; :func:`value_at_kl` on its evaluation
    curve), so the two arms meet at the largest KL both reach, whatever the other variants do (Gao et al.
    2022 compare policies at equal KL). Any other metric is :func:`run_values` of each arm, target None.
    Values are in seed order; runs without the metric are skipped.
    """
    if not metric.startswith(PAIR_MATCHED):
        return run_values(rs, a, metric), run_values(rs, b, metric), None
    col = "eval/" + metric.removeprefix(PAIR_MATCHED)
    ids = {v: list(rs.runs.loc[rs.runs["variant"] == v].sort_values("seed")["run_id"]) if not rs.runs.empty else []
           for v in (a, b)}
    curves = {r: eval_curve(rs, r) for v in (a, b) for r in ids[v]}
    curves = {r: c for r, c in curves.items() if "eval/kl" in c and col in c and len(c)}
    if not curves:
        return [], [], None
    target = min(float(c["eval/kl"].max()) for c in curves.values())
    vals = {v: [value_at_kl(list(curves[r]["eval/kl"]), list(curves[r][col]), target) for r in ids[v] if r in curves]
            for v in (a, b)}
    return vals[a], vals[b], target


def first_seeds(rs: RunSet, n: int) -> RunSet:
    """``rs`` restricted to each variant's first ``n`` planned seeds (run seed minus the variant's
    ``seed_offset`` below ``n``): the data the sequential rule sees at a look of ``n`` seeds per arm."""
    if rs.runs.empty:
        return rs
    offset = rs.runs["variant"].map(lambda v: rs.spec.seed_offset.get(v, 0))
    sub = dataclasses.replace(rs, runs=rs.runs[(rs.runs["seed"].astype(int) - offset) < n].copy())
    add_matched_kl(sub)  # the matched KL of the runs seen at this look, not of runs still to come
    return sub


def sequential_rows(rs: RunSet, claims: Sequence["Claim"], alpha: float, stage: int, cap: int) -> list[dict[str, Any]]:
    """The group-sequential verdicts of ``claims`` (:func:`harness.sequential.sequential_decisions`) from
    the runs recorded so far: looks at ``stage, 2·stage, … cap`` seeds per arm, each taken only once both
    arms hold all of that look's seeds (or no more runs of them will come: the claim was decided).

    Returns:
        per claim: the decision dict (``decided``, ``look``, ``supports``, ``level``, ``path``) plus ``n``
        (seeds per arm at the decision, or at the last look taken), ``looks_planned`` and ``at_cap``.
    """
    from harness import sequential
    from harness.verdicts import claim_look

    sizes = sequential.stage_sizes(stage, cap)
    counts = rs.runs.groupby("variant")["seed"].count().to_dict() if not rs.runs.empty else {}
    subsets = {n: first_seeds(rs, n) for n in sizes if max(counts.values(), default=0) >= n}
    looks: list[list[Any]] = []
    for c in claims:
        mine = []
        for n in sizes:
            if min(counts.get(c.a, 0), counts.get(c.b, 0)) < n:
                break  # this look's seeds are not all there yet
            va, vb, _ = claim_values(subsets[n], c.a, c.b, c.metric)
            lk = claim_look(c, va, vb)
            if lk is None:
                break
            mine.append(lk)
        looks.append(mine)
    out = sequential.sequential_decisions(looks, alpha, cap)
    for res, mine in zip(out, looks):
        taken = res["look"] + 1 if res["decided"] else len(mine)
        res["n"] = sizes[taken - 1] if taken else 0
        res["looks_planned"] = sizes
        res["at_cap"] = bool(taken and sizes[taken - 1] == cap)
    return out


def frontier_groups(rs: RunSet, variant: str, metric: str = "gold") -> list[tuple[np.ndarray, np.ndarray]]:
    """Frontier points of ``variant``, one group per seed (seed order), one point per held-out evaluation:
    ``d = √max(eval/kl, 0)`` (nats^½, KL summed over the response) and the gain
    ``eval/<metric> − eval/<metric> at iteration 0`` (the SFT policy's). ``metric``: gold | proxy | gold_lexicon."""
    ids = list(rs.runs.loc[rs.runs["variant"] == variant, "run_id"]) if not rs.runs.empty else []  # seed order
    groups = []
    for rid in ids:
        c = eval_curve(rs, rid)
        col = f"eval/{metric}"
        if "eval/kl" not in c or col not in c or c.empty:
            continue
        d = np.sqrt(np.clip(c["eval/kl"].to_numpy(dtype=float), 0.0, None))
        groups.append((d, c[col].to_numpy(dtype=float) - float(c[col].iloc[0])))
    return groups


def frontier_points(rs: RunSet, variant: str, metric: str = "gold") -> tuple[np.ndarray, np.ndarray]:
    """All of :func:`frontier_groups` concatenated: ``(d [n], gain [n])``."""
    g = frontier_groups(rs, variant, metric)
    if not g:
        return np.zeros(0), np.zeros(0)
    return np.concatenate([x for x, _ in g]), np.concatenate([y for _, y in g])


def load_bon(rs: RunSet) -> list[dict[str, Any]]:
    """The best-of-n curve of each pipeline the runs used: one per ``pipeline.bon`` stage key they were
    tagged with (one for most ablations; one per proxy when the variants change the proxy), each with
    gold and proxy fits of ``R_bon(d) = d(α − β d)`` and bootstrap CIs over prompts.

    Returns:
        ``[{"key", "variants", "n", "kl", "d", "gold_gain", "proxy_gain", "fit": {"gold": ..., "proxy": ...}}]``
        in the spec's variant order (``variants``: those whose runs used that curve); ``[]`` when the
        runs carry no ``bon`` key. A key whose stage is not on this machine is left out.
    """
    from harness.config import PipelineConfig
    from harness.frontier import bootstrap_fit
    from harness.tasks.review_sentiment.bon import load_bon_curve

    col = "tags.pipeline.bon"
    if rs.runs.empty or col not in rs.runs.columns:
        return []
    users: dict[str, list[str]] = {}
    for v in rs.spec.variants:
        for k in sorted({str(k) for k in rs.runs.loc[rs.runs["variant"] == v, col].dropna()}):
            users.setdefault(k, []).append(v)
    out = []
    for key, variants in users.items():
        try:
            c = load_bon_curve(Path(PipelineConfig().out_dir) / "bon" / key)
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        d = np.asarray(c["d"])
        proxy = np.asarray(c["proxy_per_prompt"])
        bon = {"key": key, "variants": variants, "n": c["n"], "kl": c["kl"], "d": c["d"], "gold_gain": c["gold_gain"],
               "proxy_gain": (proxy.mean(0) - proxy[:, 0].mean()).tolist(), "fit": {}}
        for metric in ("gold", "proxy"):
            pp = np.asarray(c[f"{metric}_per_prompt"])
            bon["fit"][metric] = bootstrap_fit([(d, row - row[0]) for row in pp], "bon", n_resamples=1000, seed=0)
        out.append(bon)
    return out


def bon_label(bon: dict[str, Any], several: bool) -> str:
    """``best-of-n (SFT, n ≤ N)``, naming the variants whose proxy selected it when there are several curves."""
    label = f"best-of-n (SFT, n ≤ {bon['n'][-1]})"
    return f"{label}, proxy of {', '.join(bon['variants'])}" if several else label


def frontier_panels(rs: RunSet) -> list[tuple[str, list[str]]]:
    """Rows of the frontier plot: ``[(title, [variant, ...])]`` from the spec's ``panels`` (variants run at
    this scale only; empty rows dropped; variants in no panel form a last row), else one untitled row."""
    run = rs.spec.variants_for(rs.scale)
    if not rs.spec.panels:
        return [("", run)]
    rows = [(t, [v for v in vs if v in run]) for t, vs in rs.spec.panels.items()]
    placed = {v for _, vs in rows for v in vs}
    rows.append(("other variants", [v for v in run if v not in placed]))
    return [(t, vs) for t, vs in rows if vs]


def _frontier_fits(rs: RunSet, variant: str, n_resamples: int) -> dict[str, Any]:
    """``{"gold": fit, "proxy": fit}``: :func:`harness.frontier.bootstrap_fit` of ``R_RL`` over seeds, plus
    ``seed_t`` (:func:`harness.frontier.seed_t_fit`, the per-seed fits' t intervals), ``kl_peak`` and
    ``kl_peak_ci`` (``d_peak²``, nats) where the fit has a peak."""
    from harness.frontier import bootstrap_fit, seed_t_fit

    out = {}
    for metric in ("gold", "proxy"):
        groups = frontier_groups(rs, variant, metric)
        f = bootstrap_fit(groups, "rl", n_resamples=n_resamples, seed=0)
        f["seed_t"] = seed_t_fit(groups, "rl")
        f["kl_peak"] = f["d_peak"] ** 2 if f.get("d_peak") is not None else None
        f["kl_peak_ci"] = [x**2 for x in f["d_peak_ci"]] if f.get("d_peak_ci") else None
        out[metric] = f
    return out


def _claim_caveats(rs: RunSet, row: dict[str, Any]) -> None:
    """Add data caveats to a judged claim: collapsed seeds per arm, seeds that failed."""
    for arm in (row["a"], row["b"]):
        col = rs.runs.loc[rs.runs["variant"] == arm, "metrics.eval_final/collapsed"] \
            if "metrics.eval_final/collapsed" in rs.runs.columns else []
        k = int(np.nansum(np.asarray(list(col), dtype=float))) if len(col) else 0
        if k:
            row["caveats"].append(f"{k} of {len(col)} seeds of {arm} collapsed (held-out gold below the SFT policy's)")
        lost = [f for f in rs.failed if f["variant"] == arm and not f["retried"]]
        if lost:
            row["caveats"].append(f"{len(lost)} run(s) of {arm} failed and were not retried")


def build_summary(rs: RunSet) -> dict[str, Any]:
    """Every number of the report, JSON-ready.

    Schema::

        {"ablation", "question", "scale", "experiment_id", "tracking_uri" (display form, no absolute
         path, no credentials), "generated_at", "report_git_sha", "baseline",
         "metrics": [{"name", "goal"}], "seeds": [...], "git_shas": [...], "pipeline": {stage: [keys]},
         "matched_kl", "rule": {rule, alpha, min_seeds, power},
         "variants": {name: {"overrides", "seeds", "run_ids",
                             "final": {metric: metric_stats(...)},
                             "frontier": {"gold"|"proxy": harness.frontier.bootstrap_fit + seed_t, kl_peak, kl_peak_ci}}},
         "bon": load_bon(...) (the SFT policy's best-of-n curve of each proxy the runs used, with fits),
         "verdicts": [harness.verdicts.judge_claims rows],
         "failed": [{variant, seed, run_id, status, reason, retried, start_time}],
         "running": [...], "ignored_runs": int}
    """
    from harness import tracking
    from harness.verdicts import judge_claims

    spec = rs.spec
    rule = spec.verdict
    matched = add_matched_kl(rs)
    claims = spec.claims_for(rs.scale)
    all_metrics = variant_metrics(spec, rs.scale)
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
            "run_ids": list(sub["run_id"]) if len(sub) else [],
            "final": final,
            "frontier": _frontier_fits(rs, v, min(rule.n_resamples, 2000)),
        }
    seq = sequential_rows(rs, claims, rule.alpha, rs.design["stage"], rs.design["cap"]) if rs.design else None
    if seq is None:
        compared = [claim_values(rs, c.a, c.b, c.metric) for c in claims]
    else:  # each claim shown with the seeds of its deciding (or last) look
        compared = [claim_values(first_seeds(rs, r["n"]) if r["n"] else rs, c.a, c.b, c.metric) for c, r in zip(claims, seq)]
    verdicts = judge_claims(claims, [(va, vb) for va, vb, _ in compared], rule)
    if seq is not None:
        from harness.verdicts import apply_sequential

        for row, res in zip(verdicts, seq):
            apply_sequential(row, res, rule, rs.design["stage"], rs.design["cap"])  # type: ignore[index]
    for row, c, res in zip(verdicts, claims, seq or [None] * len(claims)):
        row["cost"] = _claim_cost(rs, c, res["n"] if res else None)
    for row, (_, _, target) in zip(verdicts, compared):
        if target is not None:
            row["matched_kl"] = target
            row["evidence"] += f"; both arms read at {_fmt(target)} nats, the largest KL every run of the two reaches"
        _claim_caveats(rs, row)
    seeds = sorted({s for v in variants.values() for s in v["seeds"]})
    pipeline: dict[str, list[str]] = {}
    for col in sorted(c for c in rs.runs.columns if c.startswith("tags.pipeline.")):
        pipeline[col.removeprefix("tags.pipeline.")] = sorted({str(x) for x in rs.runs[col].dropna()})
    return stats.clean({
        "ablation": spec.name, "question": spec.question, "scale": rs.scale, "experiment_id": rs.experiment_id,
        "tracking_uri": tracking.display_uri(tracking.tracking_uri()), "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "report_git_sha": tracking.git_sha(),
        "baseline": spec.baseline, "metrics": [{"name": m.name, "goal": m.goal} for m in spec.metrics],  # type: ignore[union-attr]
        "seeds": seeds, "git_shas": rs.git_shas, "pipeline": pipeline, "matched_kl": matched,
        "rule": rule.reported(),
        "variants": variants, "verdicts": verdicts, "bon": load_bon(rs), "design": rs.design,
        "cost": _ablation_cost(rs),
        "failed": rs.failed, "running": rs.running, "ignored_runs": rs.ignored,
    })


def _cost(runs: "pd.DataFrame") -> dict[str, Any]:
    """``{"runs", "cpu_hours", "copied"}`` of counted runs: CPU-hours are the summed ``wall_time_s`` (one core
    per run) of the runs trained for this ablation; a run copied in from another (tag ``copied_from``) is
    counted as a run but costs nothing here, so no compute is counted twice."""
    if runs.empty:
        return {"runs": 0, "cpu_hours": 0.0, "copied": 0}
    copied = runs["tags.copied_from"].notna() if "tags.copied_from" in runs.columns else runs["run_id"].isna()
    col = "metrics.wall_time_s"
    hours = float(runs.loc[~copied, col].fillna(0).sum()) / 3600 if col in runs.columns else 0.0
    return {"runs": int(len(runs)), "cpu_hours": hours, "copied": int(copied.sum())}


def _claim_cost(rs: RunSet, claim: "Claim", n: Optional[int]) -> dict[str, Any]:
    """:func:`_cost` of a claim's two arms, up to ``n`` seeds per arm when the sequential rule stopped there
    (all counted runs otherwise)."""
    sub = first_seeds(rs, n) if n else rs
    return _cost(sub.runs[sub.runs["variant"].isin([claim.a, claim.b])] if not sub.runs.empty else sub.runs)


def _ablation_cost(rs: RunSet) -> dict[str, Any]:
    """:func:`_cost` of every counted run of the ablation at this scale."""
    return _cost(rs.runs)


# ------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------


def _palette(spec: "AblationSpec") -> dict[str, Any]:
    import seaborn as sns

    names = list(spec.variants)
    return dict(zip(names, sns.color_palette("colorblind", len(names))))


def plot_learning_curves(rs: RunSet, path: Path) -> Optional[Path]:
    """Grid of :data:`CURVE_METRICS` vs iteration; line = mean over seeds, band = 95% bootstrap CI
    over seeds (``seaborn.lineplot``, ``errorbar=("ci", 95)``, seed 0). None if no history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    if rs.history.empty:
        return None
    pal = _palette(rs.spec)
    ncols = 4
    nrows = math.ceil(len(CURVE_METRICS) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False)
    for ax, metric in zip(axes.flat, CURVE_METRICS):
        sub = rs.history[rs.history["metric"] == metric]
        if sub.empty:
            ax.set_visible(False)
            continue
        sns.lineplot(data=sub, x="step", y="value", hue="variant", hue_order=[v for v in pal if v in set(sub["variant"])],
                     palette=pal, errorbar=("ci", 95), n_boot=1000, seed=0, ax=ax, legend=False)
        ax.set_title(metric)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("iteration")
        ax.set_ylabel("")
    for ax in list(axes.flat)[len(CURVE_METRICS):]:
        ax.axis("off")
    handles = [plt.Line2D([0], [0], color=c, lw=2) for c in pal.values()]
    legend_ax = list(axes.flat)[-1]
    legend_ax.legend(handles, list(pal), title="variant", loc="center")
    n = rs.runs.groupby("variant")["seed"].nunique().to_dict() if not rs.runs.empty else {}
    fig.suptitle(f"{rs.spec.name} [{rs.scale}]: mean ± 95% CI over seeds (n per variant: "
                 + ", ".join(f"{v}={n.get(v, 0)}" for v in pal) + ")")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_final_metrics(rs: RunSet, summary: dict[str, Any], path: Path) -> Optional[Path]:
    """One panel per primary metric: each seed's final value (points) and the mean with its 95%
    Student t 95% interval (bars) per variant. None if no finished run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    if rs.runs.empty:
        return None
    pal = _palette(rs.spec)
    metrics = [m["name"] for m in summary["metrics"]]
    ncols = min(4, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.6 * nrows), squeeze=False)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    names = rs.spec.variants_for(rs.scale)
    for ax, metric in zip(axes.flat, metrics):
        col = f"metrics.{metric}"
        if col in rs.runs.columns:
            state = np.random.get_state()  # seaborn jitters with numpy's global RNG: same report → same PNG
            np.random.seed(0)
            sns.stripplot(data=rs.runs, x="variant", y=col, order=names, hue="variant", hue_order=names, palette=pal,
                          ax=ax, size=6, alpha=0.6, jitter=0.15, legend=False)
            np.random.set_state(state)
        for i, v in enumerate(names):
            st = summary["variants"][v]["final"][metric]
            if st["mean"] is None:
                continue
            lo, hi = st["ci_low"], st["ci_high"]
            yerr = [[st["mean"] - lo], [hi - st["mean"]]] if lo is not None and hi is not None else None
            ax.errorbar([i + 0.3], [st["mean"]], yerr=yerr, fmt="D", color="black", capsize=4, ms=5)
        goal = {"max": " (↑ better)", "min": " (↓ better)"}.get(rs.spec.metric_goal(metric), "")
        ax.set_title(f"{metric}{goal}")
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set_xlim(-0.5, len(names) - 0.2)
        ax.set_xlabel("")
        ax.set_ylabel("")
    fig.suptitle(f"{rs.spec.name} [{rs.scale}]: final metrics (points: seeds; ◆: mean with its 95% t interval)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_frontier(rs: RunSet, summary: dict[str, Any], path: Path) -> Optional[Path]:
    """Gold gain and proxy gain vs d = √KL, one row of two panels per :func:`frontier_panels` row: every
    evaluation of every seed (points), the fitted ``R_RL(d) = d(α − β log d)`` per variant (lines), and the
    SFT policy's best-of-n curve of the row's proxy with its fitted ``R_bon(d) = d(α − β d)`` (black;
    dotted when a row holds several proxies' curves). None if no history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    from harness.frontier import gao_curve

    if rs.history.empty:
        return None
    rows = frontier_panels(rs)
    curves = summary.get("bon") or []
    several = len(curves) > 1
    # rows share each column's axes, so the peaks of different rows (e.g. proxy sizes) line up
    fig, axes = plt.subplots(len(rows), 2, figsize=(12, 4.8 * len(rows)), squeeze=False, sharex=True, sharey="col")
    for (title, variants), row in zip(rows, axes):
        # one colour per position in the row, so a factor level (e.g. β) keeps its colour from row to row
        pal = dict(zip(variants, sns.color_palette("colorblind", len(variants)))) if title else _palette(rs.spec)
        bons = [b for b in curves if set(b["variants"]) & set(variants)]
        for ax, metric in zip(row, ("gold", "proxy")):
            for v in variants:
                d, r = frontier_points(rs, v, metric)
                if not len(d):
                    continue
                color = pal[v]
                ax.scatter(d, r, s=10, alpha=0.35, color=color)
                fit = summary["variants"][v]["frontier"][metric]
                label = v
                if fit.get("alpha") is not None and fit.get("d_max"):
                    xs = np.linspace(1e-3, fit["d_max"], 200)
                    ax.plot(xs, gao_curve(xs, fit["alpha"], fit["beta"], "rl"), color=color, lw=2)
                    label = f"{v}: α={fit['alpha']:.3g}, β={fit['beta']:.3g}"
                ax.plot([], [], color=color, lw=2, label=label)
            for k, bon in enumerate(bons):
                style = "--" if len(bons) == 1 else [":", "-.", "--"][k % 3]
                ax.plot(bon["d"], bon[f"{metric}_gain"], "ko", ms=4)
                f = bon["fit"][metric]
                label = bon_label(bon, several and len(bons) > 1)
                if f.get("alpha") is not None:
                    xs = np.linspace(0, max(bon["d"]), 200)
                    ax.plot(xs, gao_curve(xs, f["alpha"], f["beta"], "bon"), "k" + style, lw=1.5)
                    label += f": α={f['alpha']:.3g}, β={f['beta']:.3g}"
                ax.plot([], [], "k" + style + "o", ms=4, label=label)
            ax.axhline(0, color="grey", lw=0.8, ls=":")
            ax.set_xlabel("d = √KL(π‖π_init)  [nats^½, k1 summed over the response]")
            ax.set_ylabel(f"held-out {metric} − SFT policy's {metric}")
            ax.tick_params(labelbottom=True)
            ax.set_title(f"{title}: {metric}" if title else f"{metric}: RL fit d(α − β log d), best-of-n fit d(α − β d)",
                         fontsize=10)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fits = "; lines: RL fit d(α − β log d), dashed: best-of-n fit d(α − β d)" if rows[0][0] else ""
    fig.suptitle(f"{rs.spec.name} [{rs.scale}]: reward vs √KL frontier (Gao et al. 2022){fits}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_claims(summary: dict[str, Any], path: Path) -> Optional[Path]:
    """Forest plot: each claim's difference ``a − b`` with its 95% Welch interval, the claimed bound(s)
    dashed, coloured by verdict (grey: inconclusive or no verdict). None if no claim has an interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vs = summary["verdicts"]
    if not any(v["ci_low"] is not None for v in vs):
        return None
    colors = {"reproduced": "tab:green", "pass": "tab:green", "contradicted": "tab:red", "fail": "tab:red"}
    fig, axes = plt.subplots(len(vs), 1, figsize=(7.5, 1.3 * len(vs) + 0.8), squeeze=False)
    for ax, v in zip(axes.flat, vs):
        if v["ci_low"] is not None:
            ax.errorbar([v["diff"]], [0], xerr=[[v["diff"] - v["ci_low"]], [v["ci_high"] - v["diff"]]], fmt="o",
                        color=colors.get(v["verdict"], "tab:grey"), capsize=5, ms=7)
        bounds = [0.0] if v["expect"] in ("greater", "less") else ([v["margin"]] if v["expect"] == "not_greater" else [-v["margin"], v["margin"]])
        for b in bounds:
            ax.axvline(b, color="black", ls="--", lw=1)
        ax.set_yticks([])
        ax.set_title(f"{v['metric']}: {v['a']} − {v['b']} (expected {v['expected']}) → {v['verdict']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------------------


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if math.isfinite(x) else "–"
    return str(x)


def _md_cell(s: Any) -> str:
    return " ".join(str(s).split()).replace("|", "\\|")


def _samples(rs: RunSet, variant: str, k: int = 3) -> tuple[Optional[int], Optional[int], list[dict[str, Any]]]:
    """End-of-run sample completions of ``variant``'s lowest-seed counted run: (seed, iteration, samples)."""
    import mlflow

    sub = rs.runs[rs.runs["variant"] == variant].sort_values("seed") if not rs.runs.empty else rs.runs
    if sub.empty:
        return None, None, []
    row = sub.iloc[0]
    from harness import tracking

    c = tracking.client()
    try:
        files = [f.path for f in c.list_artifacts(row["run_id"], "samples")]
    except Exception:
        return int(row["seed"]), None, []
    if not files:
        return int(row["seed"]), None, []
    last = sorted(files)[-1]
    try:
        data = json.loads(mlflow.artifacts.load_text(f"{row['artifact_uri']}/{last}"))
    except Exception:
        return int(row["seed"]), None, []
    return int(row["seed"]), data.get("iteration"), list(data.get("samples", []))[:k]


_RULE_TEXT = ("Welch's t test of each claim's difference of means over seeds, TOST for equivalence claims, "
              "Holm-adjusted across this ablation's claims; a verdict needs adjusted p < {alpha:g} and at least "
              "{min_seeds} seeds per arm. MDE: the smallest difference the test detects with 80% power at the "
              "observed SDs and n; seeds for margin: seeds per arm for 80% power at the claim's margin.")


def _sequential_section(summary: dict[str, Any]) -> list[str]:
    """The looks of each claim under ``--seeds auto``: seeds per arm, information fraction, p-value, the
    boundary (nominal p-level) then in force, and where the claim was decided or left undecided."""
    d = summary["design"]
    L = ["### Sequential looks\n",
         f"Seeds were added {d['stage']} per arm at a time up to {d['cap']}; at each look every undecided claim was "
         "tested against an O'Brien–Fleming-type α-spending boundary (Lan–DeMets), with Holm's levels passed on "
         "as claims were decided (`harness.sequential`; error rates in `reports/calibration/sequential.txt`).\n",
         "| claim | looks: n per arm (t) p ≤ boundary? | decided at | level | TOST power at 0 |", "|---|---|---|---|---|"]
    for v in summary["verdicts"]:
        s = v.get("sequential") or {}
        looks = "; ".join(f"{e['n_a']} ({e['t']:.2f}): {e['p']:.3g} {'≤' if e['crossed'] else '>'} {e['threshold']:.3g}"
                          for e in s.get("looks", []))
        at = (f"n = {s['n']}" if s.get("decided") else f"undecided at the cap (n = {s['n']})" if s.get("at_cap")
              else f"undecided (n = {s.get('n')})")
        tost = _fmt(v.get("tost_power_at_zero")) if v.get("expect") == "equivalent" else "—"
        L.append(f"| {_md_cell(v['claim'])} | {looks or '—'} | {at} | {_fmt(s.get('level'))} | {tost} |")
    L.append("")
    return L


def claim_row(v: dict[str, Any]) -> str:
    """One markdown table row of a judged claim (:func:`harness.verdicts.judge_claims` output):
    claim, kind, source (section), setting note, metric and expectation, n per arm, effect with its 95%
    Welch interval, raw and Holm-adjusted p, MDE, seeds for the margin, verdict, caveats."""
    eff = (f"{v['diff']:+.4g} [{v['ci_low']:+.4g}, {v['ci_high']:+.4g}]" if v["diff"] is not None else "–")
    need = v["seeds_needed"] if v["seeds_needed"] is not None else ("> 100000" if v["diff"] is not None else "–")
    verdict = f"**{v['verdict']}**" if v["decisive"] else v["verdict"]
    return (f"| {_md_cell(v['claim'])} | {v['kind']} | {_md_cell(v['source'])} ({_md_cell(v['section'])}) | "
            f"{_md_cell(v['setting_note'])} | `{v['metric']}`: {_md_cell(v['expected'])} | {v['n_a']} / {v['n_b']} | {eff} | "
            f"{_fmt(v['p_raw'], 3)} | {_fmt(v['p_adj'], 3)} | {_fmt(v['mde'], 3)} (margin {v['margin']:g}) | {need} | "
            f"{verdict} | {_md_cell('; '.join(v['caveats'])) or '–'} |")


def render_markdown(rs: RunSet, summary: dict[str, Any], figures: dict[str, Optional[Path]]) -> str:
    """The report text (GitHub markdown) from the summary and the written figures."""
    spec = rs.spec
    L: list[str] = []
    L.append(f"# Ablation `{spec.name}` ({rs.scale} scale)\n")
    L.append(f"**Question.** {spec.question.strip()}\n")
    n_runs = len(rs.runs)
    pipe = "; ".join(f"{k} {', '.join(v)}" for k, v in summary.get("pipeline", {}).items()) or "unknown"
    L.append(f"Runs counted: {n_runs} finished (latest per variant × seed), seeds {summary['seeds']}; "
             f"baseline `{spec.baseline}`; MLflow experiment `ablation/{spec.name}` (id {rs.experiment_id}) "
             f"at `{summary['tracking_uri']}`; runs' code {', '.join(summary['git_shas']) or 'unknown'}; "
             f"report code {summary['report_git_sha']}; pipeline stage keys: {pipe}; generated {summary['generated_at']}. "
             "Per-iteration metrics of every run: [`runs.csv`](runs.csv).\n")
    few = [v for v, d in summary["variants"].items() if len(d["seeds"]) < spec.verdict.min_seeds]
    if few:
        L.append(f"> **Fewer than {spec.verdict.min_seeds} seeds** for {', '.join(few)}: no verdict is given for claims "
                 f"on these variants (the spec's `min_seeds` is {spec.verdict.min_seeds}).\n")
    if rs.ignored:
        L.append(f"> {rs.ignored} run(s) of this scale were ignored: their config no longer matches the spec.\n")

    L.append("## Variants\n")
    L.append("| variant | overrides (over the base config) | seeds finished |")
    L.append("|---|---|---|")
    for v, d in summary["variants"].items():
        ov = ", ".join(f"`{k}={val}`" for k, val in d["overrides"].items()) or "(base)"
        L.append(f"| {v}{' (baseline)' if v == spec.baseline else ''} | {ov} | {d['seeds']} |")
    L.append("")

    L.append("## Verdicts on the published claims\n")
    alpha = spec.verdict.alpha
    L.append(f"Rule `{spec.verdict.rule}` ({_md_cell(_RULE_TEXT.format(alpha=alpha, min_seeds=spec.verdict.min_seeds))}) "
             "Findings are *reproduced* / *contradicted*; mechanism checks (true by construction) *pass* / *fail*.\n")
    L.append("| claim | kind | source (section) | setting note | metric: expected | n per arm | effect [95% CI] | "
             "p raw | p adj (Holm) | MDE (80%) | seeds for margin | verdict | caveats |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for v in summary["verdicts"]:
        L.append(claim_row(v))
    L.append("")
    for v in summary["verdicts"]:
        L.append(f"- {_md_cell(v['claim'])} — {_md_cell(v['evidence'])}")
    L.append("")
    if summary.get("design"):
        L += _sequential_section(summary)
    cost = summary.get("cost") or {}
    if cost:
        per = "; ".join(f"{_md_cell(v['claim'][:40])}: {v['cost']['runs']} runs, {_fmt(v['cost']['cpu_hours'])} CPU-h"
                        for v in summary["verdicts"] if v.get("cost"))
        L.append(f"**Compute.** {cost['runs']} runs, {_fmt(cost['cpu_hours'])} CPU-hours (one core per run) in all"
                 + (f"; per claim (its two arms, up to its deciding look): {per}" if per else "") + ".\n")
    if figures.get("claims"):
        L.append(f"![claims]({figures['claims'].name})\n")

    L.append("## Final metrics\n")
    L.append("`eval_final/*`: the held-out evaluation after the last iteration (the same prompts for every run); "
             "`matched_kl/*`: gold and proxy interpolated at the largest KL every run reaches "
             f"({_fmt(summary.get('matched_kl'))} nats; a claim on `pair_matched_kl/*` reads its two arms at the "
             "largest KL every run of those two reaches, stated in its evidence); `final/*`: training batches, last 10% of iterations. "
             "Mean ± SD over seeds with the 95% t interval of the mean; IQM only with ≥ 8 seeds; P(improvement) = "
             f"P(variant better than `{spec.baseline}`) = Mann–Whitney U / (n·n_baseline) with a 95% bootstrap interval.\n")
    for m in variant_metrics(spec, rs.scale):
        goal = {"max": " (higher is better)", "min": " (lower is better)"}.get(spec.metric_goal(m), " (diagnostic: no better direction)")
        L.append(f"**`{m}`**{goal}\n")
        L.append("| variant | n | mean ± SD | 95% CI | IQM | P(improvement) [95% CI] |")
        L.append("|---|---|---|---|---|---|")
        for v, d in summary["variants"].items():
            st = d["final"][m]
            ci = f"[{_fmt(st['ci_low'])}, {_fmt(st['ci_high'])}]" if st["ci_low"] is not None else "– (n < 2)"
            if v == spec.baseline:
                p = "(baseline)"
            elif spec.metric_goal(m) == "none":
                p = "– (no goal)"
            else:
                pci = st.get("p_improvement_ci") or [None, None]
                p = f"{_fmt(st['p_improvement'], 2)} [{_fmt(pci[0], 2)}, {_fmt(pci[1], 2)}]"
            iqm_cell = _fmt(st["iqm"]) if st["iqm"] is not None else "– (n < 8)"
            L.append(f"| {v} | {st['n']} | {_fmt(st['mean'])} ± {_fmt(st['sd'], 2)} | {ci} | {iqm_cell} | {p} |")
        L.append("")
    if figures.get("final"):
        L.append(f"![final metrics]({figures['final'].name})\n")

    L.append("## Learning curves\n")
    if figures.get("curves"):
        L.append("Mean over seeds with a 95% bootstrap CI band, per iteration.\n")
        L.append(f"![learning curves]({figures['curves'].name})\n")
    else:
        L.append("No finished run yet.\n")

    L.append("## Reward vs KL frontier\n")
    L.append("Gao, Schulman & Hilton (2022): with d = √KL(π‖π_init), the gold reward gain follows "
             "R_RL(d) = d(α − β log d) under RL and R_bon(d) = d(α − β d) under best-of-n; the proxy keeps rising "
             "while the gold peaks. Points: every held-out evaluation of every seed (√KL, reward − the SFT policy's). "
             "Fits are least squares on all points; their 95% CIs are percentile bootstraps over seeds (RL) or "
             "prompts (best-of-n). The last column fits each seed alone and gives the mean β with a Student-t "
             "interval over seeds (n − 1 df): read \"β_RL > 0\" (a peak) from it, since its false-positive rate "
             "at few seeds is checked and the percentile bootstrap's is too high. "
             "A variant that gains gold only by drifting further (larger d) has not improved the frontier.\n")
    L.append("| variant | reward | α [95% CI] | β [95% CI] | peak KL (nats) [95% CI] | points | RMSE "
             "| β per seed, mean [t 95% CI] (seeds) |")
    L.append("|---|---|---|---|---|---|---|---|")

    def ci(f: dict[str, Any], key: str) -> str:
        c = f.get(f"{key}_ci")
        return f"{_fmt(f.get(key))} [{_fmt(c[0])}, {_fmt(c[1])}]" if c else _fmt(f.get(key))

    for v, d in summary["variants"].items():
        for metric in ("gold", "proxy"):
            f = d["frontier"][metric]
            if f.get("error"):
                L.append(f"| {v} | {metric} | – | – | – | {f['n_points']} | {_md_cell(f['error'])} | – |")
                continue
            peak = ci(f, "kl_peak") if f.get("kl_peak") is not None else "no peak (β ≤ 0)"
            st = f.get("seed_t") or {}
            seed_cell = f"{ci(st, 'beta')} ({st['n_fitted']})" if st.get("beta") is not None else "–"
            L.append(f"| {v} | {metric} | {ci(f, 'alpha')} | {ci(f, 'beta')} | {peak} | {f['n_points']} | {_fmt(f['rmse'])} "
                     f"| {seed_cell} |")
    curves = summary.get("bon") or []
    for bon in curves:
        for metric in ("gold", "proxy"):
            f = bon["fit"][metric]
            peak = f"{_fmt(f['d_peak'] ** 2)}" if f.get("d_peak") is not None else "no peak (β ≤ 0)"
            L.append(f"| {_md_cell(bon_label(bon, len(curves) > 1))} | {metric} | {ci(f, 'alpha')} | {ci(f, 'beta')} | "
                     f"{peak} | {f['n_points']} | {_fmt(f['rmse'])} | – |")
    L.append("")
    if not curves:
        L.append("No best-of-n curve: the runs' pipeline `bon` stage is not on this machine (`make pipeline`).\n")
    if figures.get("frontier"):
        L.append(f"![frontier]({figures['frontier'].name})\n")

    L.append("## Failed runs\n")
    if summary["failed"]:
        L.append("| variant | seed | run | status | reason | retried successfully |")
        L.append("|---|---|---|---|---|---|")
        for f in summary["failed"]:
            L.append(f"| {f['variant']} | {f['seed']} | `{f['run_id'][:8]}` | {f['status']} | {_md_cell(f['reason'])} | "
                     f"{'yes' if f['retried'] else '**no**'} |")
    else:
        L.append("None.")
    if summary["running"]:
        L.append("\nStill running: " + ", ".join(f"{r['variant']}/s{r['seed']} (`{r['run_id'][:8]}`)" for r in summary["running"]))
    L.append("")

    L.append("## Sample completions (end of training)\n")
    for v in spec.variants_for(rs.scale):
        seed, it, samples = _samples(rs, v)
        if not samples:
            L.append(f"**{v}**: no samples recorded.\n")
            continue
        L.append(f"**{v}** (seed {seed}, iteration {it})\n")
        L.append("| prompt | response | RM score | lexicon (VADER) |")
        L.append("|---|---|---|---|")
        for s in samples:
            L.append(f"| {_md_cell(s.get('prompt', ''))} | {_md_cell(s.get('response', ''))} | {_fmt(s.get('score'), 3)} | "
                     f"{_fmt(s.get('gold_lexicon', s.get('gold')), 3)} |")
        L.append("")
    return "\n".join(L) + "\n"


SEPARATE_SCALES = ("full",)  # scales whose report lives beside, not in place of, the default scale's


def report_dir(name: str, scale: str, reports: Optional[Path] = None) -> Path:
    """Where ablation ``name``'s report at ``scale`` is written: ``<reports>/<name>/`` for the default (and
    the smoke) scale, ``<reports>/<name>/<scale>/`` for a scale in :data:`SEPARATE_SCALES`, so that a
    full-scale report never replaces the shipped default one. ``reports`` defaults to the configured
    reports directory."""
    base = Path(reports or default_reports_dir()) / name
    return base / scale if scale in SEPARATE_SCALES else base


def write_report(name: str, scale: Optional[str] = None, require_runs: bool = False) -> Path:
    """Write :func:`report_dir` (report.md, PNGs, summary.json, runs.csv) from the runs in MLflow.

    Args:
        name: ablation name.
        scale: which scale's runs (default: the latest invocation's).
        require_runs: raise instead of writing a report without any finished run.
    Returns:
        Path of ``report.md``.
    Raises:
        HarnessError: unknown ablation, nothing recorded for it yet (at ``scale``, with ``require_runs``), or
            the reports directory is not writable (checked before the runs are read).
    """
    from harness.services import check_writable

    check_writable(default_reports_dir(), "the reports directory")
    rs = load_runs(name, scale)
    if require_runs and rs.runs.empty:
        why = (f" ({rs.ignored} recorded run(s) at that scale ignored: their variant or config hash does not match the "
               "current spec)") if rs.ignored else ""
        raise HarnessError(f"no finished run of ablation {name!r} at scale {rs.scale}{why}")
    out = report_dir(name, rs.scale)
    out.mkdir(parents=True, exist_ok=True)
    summary = build_summary(rs)
    figures = {
        "curves": plot_learning_curves(rs, out / "learning_curves.png"),
        "final": plot_final_metrics(rs, summary, out / "final_metrics.png"),
        "frontier": plot_frontier(rs, summary, out / "frontier.png"),
        "claims": plot_claims(summary, out / "claims.png"),
    }
    summary["figures"] = [p.name for p in figures.values() if p is not None]
    rs.history.sort_values(["variant", "seed", "metric", "step"]).to_csv(out / "runs.csv", index=False, float_format="%.6g")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    path = out / "report.md"
    path.write_text(render_markdown(rs, summary, figures))
    return path
