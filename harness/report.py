"""Ablation reports: MLflow runs → pandas → statistics → seaborn PNGs, ``report.md``, ``summary.json``.

``write_report(name)`` reads the child runs of experiment ``ablation/<name>`` and writes
``<reports>/<name>/``:

- ``report.md``: question, setup, a verdict per published claim, the final-metric table,
  learning curves, the gold-vs-√KL frontier, failed runs and sample completions;
- ``learning_curves.png``: per-iteration metrics, mean ± 95% CI over seeds per variant;
- ``final_metrics.png``: each primary metric per variant (seeds as points, mean and 95% bootstrap CI);
- ``frontier.png``: gold improvement vs d = √KL with the fitted Gao et al. curve per variant;
- ``claims.png``: the bootstrap CI of each claim's difference against its bound(s);
- ``summary.json``: every number of the report (schema in :func:`build_summary`).

Which runs count: child runs of the chosen scale (default: the scale of the latest invocation)
whose ``config_hash`` equals the hash the spec resolves to now for that (variant, seed); of those,
only the latest FINISHED run per (variant, seed). Earlier FAILED/KILLED attempts are listed.

Statistics (``shared/reference/ppo-components.md``, "Statistics for comparisons"; Agarwal et al.
2021, "Deep RL at the edge of the statistical precipice"):

- IQM: the interquartile mean, ``scipy.stats.trim_mean(x, 0.25)`` (rliable's definition);
- 95% CI: ``scipy.stats.bootstrap`` (BCa; percentile when BCa is undefined), fixed rng, none
  with fewer than 2 seeds;
- probability of improvement ``P(X_A > X_B) = U / (n_A·n_B)``, U the Mann–Whitney statistic
  (ties count ½), oriented by the metric's goal (for ``min`` metrics, P(X_A < X_B));
- frontier: Gao, Schulman & Hilton 2022, ``R(d) = d(α − β log d)`` with ``d = √KL(π‖π_init)``,
  fitted by ``scipy.optimize.curve_fit`` on the per-iteration points of all seeds.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from harness.config import default_reports_dir, flatten
from harness.errors import HarnessError

if TYPE_CHECKING:
    import pandas as pd

    from harness.ablate import AblationSpec, Claim, VerdictRule

#: Per-iteration metrics drawn as learning curves.
CURVE_METRICS = [
    "objective/score", "objective/gold", "objective/kl", "objective/entropy",
    "response/length", "policy/clipfrac", "policy/ratio_mean",
]


# ------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------


def _arr(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(list(x), dtype=float)
    return a[np.isfinite(a)]


def iqm(x: Sequence[float]) -> float:
    """Interquartile mean: the mean after dropping ``floor(n/4)`` values at each end
    (``scipy.stats.trim_mean(x, 0.25)``, as in rliable; Agarwal et al. 2021). NaN for no data.

    Example: ``iqm([1, 2, 3, 4, 100]) == 3.0`` (drops 1 and 100)."""
    from scipy import stats

    a = _arr(x)
    return float(stats.trim_mean(a, 0.25)) if len(a) else float("nan")


def bootstrap_ci(x: Sequence[float], confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0,
                 statistic: Any = np.mean) -> tuple[float, float]:
    """Bootstrap CI of ``statistic`` of one sample (``scipy.stats.bootstrap``).

    BCa, falling back to the percentile method where BCa is undefined (e.g. constant data).
    Returns ``(nan, nan)`` with fewer than 2 finite values, ``(c, c)`` for constant data ``c``.
    Deterministic: the resampling rng is seeded with ``seed``.
    """
    a = _arr(x)
    if len(a) < 2:
        return float("nan"), float("nan")
    if np.ptp(a) == 0:
        v = float(statistic(a))
        return v, v
    return _bootstrap((a,), lambda s, axis=-1: statistic(s, axis=axis), confidence, n_resamples, seed)


def diff_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95, n_resamples: int = 9999,
            seed: int = 0) -> tuple[float, float]:
    """Bootstrap CI of ``mean(a) − mean(b)`` for independent samples (each resampled on its own;
    ``scipy.stats.bootstrap`` with two samples, ``paired=False``). ``(nan, nan)`` if either
    sample has fewer than 2 values."""
    x, y = _arr(a), _arr(b)
    if len(x) < 2 or len(y) < 2:
        return float("nan"), float("nan")
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        d = float(x.mean() - y.mean())
        return d, d
    return _bootstrap((x, y), lambda s, t, axis=-1: s.mean(axis=axis) - t.mean(axis=axis), confidence, n_resamples, seed)


def _bootstrap(data: tuple[np.ndarray, ...], stat: Any, confidence: float, n_resamples: int, seed: int) -> tuple[float, float]:
    from scipy import stats

    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = stats.bootstrap(data, stat, n_resamples=n_resamples, confidence_level=confidence, method=method,
                                  vectorized=True, paired=False, rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi
    return float("nan"), float("nan")


def probability_of_improvement(a: Sequence[float], b: Sequence[float], goal: str = "max") -> float:
    """``P(X_a > X_b)`` (ties ½) = Mann–Whitney ``U_a / (n_a·n_b)`` (Agarwal et al. 2021);
    with ``goal="min"``, ``P(X_a < X_b)``. NaN if either sample is empty.

    Example: ``probability_of_improvement([1, 2, 3], [0, 2]) == 4.5 / 6 == 0.75``."""
    from scipy import stats

    x, y = _arr(a), _arr(b)
    if len(x) == 0 or len(y) == 0:
        return float("nan")
    if goal == "min":
        x, y = -x, -y
    u = stats.mannwhitneyu(x, y, alternative="two-sided").statistic
    return float(u) / (len(x) * len(y))


def gao_rl_curve(d: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """Gao, Schulman & Hilton 2022 (Eq. for RL): gold reward gain ``R(d) = d(α − β log d)`` at
    ``d = √KL(π‖π_init)`` (nats^½). ``R(0) = 0`` (limit)."""
    d = np.asarray(d, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, d * (alpha - beta * np.log(np.where(d > 0, d, 1.0))), 0.0)


def fit_frontier(d: Sequence[float], r: Sequence[float]) -> dict[str, Any]:
    """Least-squares fit of :func:`gao_rl_curve` to points ``(d_i, r_i)`` with ``d_i > 0``.

    Returns ``{"alpha", "beta", "n_points", "rmse", "d_max", "error"}``; alpha/beta are None and
    ``error`` says why when there are fewer than 3 points or the fit fails.
    """
    from scipy.optimize import curve_fit

    x, y = np.asarray(d, dtype=float), np.asarray(r, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[keep], y[keep]
    out: dict[str, Any] = {"alpha": None, "beta": None, "n_points": int(len(x)), "rmse": None,
                           "d_max": float(x.max()) if len(x) else None, "error": None}
    if len(x) < 3:
        out["error"] = f"only {len(x)} points with KL > 0 (need ≥ 3)"
        return out
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (alpha, beta), _ = curve_fit(gao_rl_curve, x, y, p0=(0.0, 0.0), maxfev=10000)
    except (RuntimeError, ValueError, TypeError) as e:
        out["error"] = f"fit failed: {' '.join(str(e).split())}"
        return out
    resid = y - gao_rl_curve(x, alpha, beta)
    out.update(alpha=float(alpha), beta=float(beta), rmse=float(np.sqrt(np.mean(resid**2))))
    return out


def judge_claim(claim: "Claim", a: Sequence[float], b: Sequence[float], rule: "VerdictRule", seed: int = 0) -> dict[str, Any]:
    """Verdict of one claim from the final values of variants ``claim.a`` and ``claim.b``.

    With ``d = mean(a) − mean(b)`` and ``[lo, hi]`` its bootstrap CI (``rule.confidence``):

    - ``greater``: reproduced if lo > 0, contradicted if hi < 0;
    - ``less``: reproduced if hi < 0, contradicted if lo > 0;
    - ``not_greater`` (d < m): reproduced if hi < m, contradicted if lo > m;
    - ``equivalent`` (|d| < m): reproduced if −m < lo and hi < m, contradicted if lo > m or hi < −m;
    - inconclusive otherwise, or with fewer than 2 values on either side.
    The evidence line gives the means, n, d, the CI, ``P(a > b)`` and flags fewer than
    ``rule.min_seeds`` seeds per variant as indicative only.

    Returns ``{"claim", "source", "metric", "a", "b", "expect", "margin", "verdict", "evidence",
    "n_a", "n_b", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "p_a_gt_b", "enough_seeds"}``.
    """
    x, y = _arr(a), _arr(b)
    m = claim.margin
    out: dict[str, Any] = {
        "claim": claim.claim, "source": claim.source, "metric": claim.metric, "a": claim.a, "b": claim.b,
        "expect": claim.expect, "margin": m, "n_a": int(len(x)), "n_b": int(len(y)),
        "mean_a": float(x.mean()) if len(x) else None, "mean_b": float(y.mean()) if len(y) else None,
        "diff": None, "ci_low": None, "ci_high": None, "p_a_gt_b": None,
        "enough_seeds": bool(min(len(x), len(y)) >= rule.min_seeds),
    }
    expected = {"greater": f"{claim.a} > {claim.b}", "less": f"{claim.a} < {claim.b}",
                "not_greater": f"{claim.a} − {claim.b} < {m:g}", "equivalent": f"|{claim.a} − {claim.b}| < {m:g}"}[claim.expect]
    out["expected"] = expected
    if len(x) < 2 or len(y) < 2:
        missing = "not recorded" if len(x) == 0 or len(y) == 0 else "fewer than 2 seeds"
        out["verdict"] = "inconclusive"
        out["evidence"] = f"{claim.metric}: {missing} (n_{claim.a}={len(x)}, n_{claim.b}={len(y)}); need ≥ 2 finished seeds per variant for a CI"
        return out
    d = float(x.mean() - y.mean())
    lo, hi = diff_ci(x, y, rule.confidence, rule.n_resamples, seed)
    p = probability_of_improvement(x, y, "max")
    out.update(diff=d, ci_low=lo, ci_high=hi, p_a_gt_b=p)
    if claim.expect == "greater":
        verdict = "reproduced" if lo > 0 else "contradicted" if hi < 0 else "inconclusive"
    elif claim.expect == "less":
        verdict = "reproduced" if hi < 0 else "contradicted" if lo > 0 else "inconclusive"
    elif claim.expect == "not_greater":
        verdict = "reproduced" if hi < m else "contradicted" if lo > m else "inconclusive"
    else:
        verdict = "reproduced" if (-m < lo and hi < m) else "contradicted" if (lo > m or hi < -m) else "inconclusive"
    out["verdict"] = verdict
    pct = round(100 * rule.confidence)
    ev = (f"{claim.metric}: {claim.a} {x.mean():.4g} (n={len(x)}) vs {claim.b} {y.mean():.4g} (n={len(y)}); "
          f"difference {d:+.4g}, {pct}% CI [{lo:+.4g}, {hi:+.4g}]; expected {expected}; P({claim.a} > {claim.b}) = {p:.2f}")
    if not out["enough_seeds"]:
        ev += f"; only {min(len(x), len(y))} seeds per variant (< {rule.min_seeds}): indicative only"
    out["evidence"] = ev
    return out


# ------------------------------------------------------------------------------------------------
# Reading runs
# ------------------------------------------------------------------------------------------------


@dataclass
class RunSet:
    """The runs of one ablation at one scale, as read from MLflow.

    ``runs``: one row per counted run (latest FINISHED per (variant, seed)) with columns
    ``run_id, variant, seed, start_time, artifact_uri`` and ``metrics.<name>`` for every
    run-level metric. ``history``: long format ``run_id, variant, seed, metric, step, value``
    for :data:`CURVE_METRICS`. ``failed``: every FAILED/KILLED attempt of a planned
    (variant, seed), with ``reason`` and ``retried`` (a later FINISHED run exists).
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


def _latest_parent(c: Any, exp_id: str) -> Any:
    from harness.tracking import search_all

    parents = [r for r in search_all(c, [exp_id], "tags.kind = 'parent'")]
    return parents[0] if parents else None


def _load_spec_for_report(name: str, parent: Any) -> "AblationSpec":
    """The spec file if it exists, else the copy stored with the latest invocation."""
    import yaml

    from harness.ablate import AblationSpec, load_spec, spec_path

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


def load_runs(name: str, scale: Optional[str] = None) -> RunSet:
    """Read ablation ``name``'s runs at ``scale`` (default: the latest invocation's scale).

    Uses ``mlflow.search_runs`` (pandas) for run-level metrics and tags and
    ``MlflowClient.get_metric_history`` for the curves.

    Raises:
        HarnessError: no experiment / no invocation recorded for ``name``.
    """
    import mlflow
    import pandas as pd

    from harness import tracking
    from harness.ablate import experiment_name, resolve_config, run_hash

    uri = tracking.tracking_uri()
    c = tracking.client(uri)
    exp = c.get_experiment_by_name(experiment_name(name))
    if exp is None:
        from harness.ablate import spec_path

        spec_path(name)  # an unknown name: the error lists the available ablations
        raise HarnessError(f"no runs recorded for ablation {name!r} in {uri}; run `harness ablate {name}` first")
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
    for _, row in finished.iterrows():
        for metric in CURVE_METRICS:
            for m in c.get_metric_history(row["run_id"], metric):
                rows.append((row["run_id"], row["variant"], int(row["seed"]), metric, int(m.step), float(m.value)))
    history = pd.DataFrame(rows, columns=["run_id", "variant", "seed", "metric", "step", "value"]) if rows else empty_hist
    shas = sorted({s for s in finished.get("tags.git_sha", pd.Series(dtype=str)).dropna()})
    return RunSet(spec, scale, exp_id, finished.reset_index(drop=True), history, failed, running, ignored, shas)


def run_values(rs: RunSet, variant: str, metric: str) -> list[float]:
    """Final values of ``metric`` (an MLflow run-level metric) for ``variant``'s counted runs,
    in seed order; runs without the metric are skipped."""
    col = f"metrics.{metric}"
    if col not in rs.runs.columns or rs.runs.empty:
        return []
    sub = rs.runs[rs.runs["variant"] == variant].sort_values("seed")
    return [float(v) for v in sub[col] if v is not None and np.isfinite(float(v))]


# ------------------------------------------------------------------------------------------------
# Summary
# ------------------------------------------------------------------------------------------------


def _clean(x: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, numpy scalars → python."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def metric_stats(values: Sequence[float], baseline: Optional[Sequence[float]], goal: str, confidence: float = 0.95,
                 n_resamples: int = 9999) -> dict[str, Any]:
    """``{"n", "values", "mean", "iqm", "ci_low", "ci_high", "p_improvement"}`` for one variant
    and metric; ``p_improvement`` is P(better than the baseline) (None for the baseline itself and
    for metrics with ``goal="none"``)."""
    v = _arr(values)
    lo, hi = bootstrap_ci(v, confidence, n_resamples)
    return {
        "n": int(len(v)), "values": [float(t) for t in v],
        "mean": float(v.mean()) if len(v) else float("nan"), "iqm": iqm(v), "ci_low": lo, "ci_high": hi,
        "p_improvement": probability_of_improvement(v, baseline, goal) if baseline is not None and goal != "none" else None,
    }


def frontier_points(rs: RunSet, variant: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-iteration frontier points of ``variant`` over all its seeds: ``d = √max(KL, 0)`` from
    ``objective/kl`` (nats, summed over response tokens) and gold gain = ``objective/gold`` −
    the run's ``initial/gold`` (0 if not recorded)."""
    h = rs.history
    sub = h[(h["variant"] == variant) & h["metric"].isin(["objective/kl", "objective/gold"])]
    if sub.empty:
        return np.array([]), np.array([])
    wide = sub.pivot_table(index=["run_id", "step"], columns="metric", values="value").reset_index()
    if "objective/kl" not in wide or "objective/gold" not in wide:
        return np.array([]), np.array([])
    init = {}
    if "metrics.initial/gold" in rs.runs.columns:
        init = dict(zip(rs.runs["run_id"], rs.runs["metrics.initial/gold"]))
    g0 = wide["run_id"].map(lambda r: float(init.get(r, 0.0)) if init.get(r) is not None and np.isfinite(init.get(r, 0.0)) else 0.0)
    d = np.sqrt(np.clip(wide["objective/kl"].to_numpy(dtype=float), 0.0, None))
    return d, wide["objective/gold"].to_numpy(dtype=float) - g0.to_numpy(dtype=float)


def build_summary(rs: RunSet) -> dict[str, Any]:
    """Every number of the report, JSON-ready.

    Schema::

        {"ablation", "question", "scale", "experiment_id", "tracking_uri", "generated_at", "baseline",
         "metrics": [{"name", "goal"}], "seeds": [...], "git_shas": [...],
         "variants": {name: {"overrides", "seeds", "run_ids",
                             "final": {metric: {n, values, mean, iqm, ci_low, ci_high, p_improvement}},
                             "frontier": {alpha, beta, n_points, rmse, d_max, error}}},
         "verdicts": [{claim, source, verdict, evidence, metric, a, b, expect, margin, expected,
                       n_a, n_b, mean_a, mean_b, diff, ci_low, ci_high, p_a_gt_b, enough_seeds}],
         "failed": [{variant, seed, run_id, status, reason, retried, start_time}],
         "running": [...], "ignored_runs": int}
    """
    from harness import tracking

    spec = rs.spec
    rule = spec.verdict
    metrics = [m.name for m in spec.metrics]  # type: ignore[union-attr]
    extra = [c.metric for c in spec.claims if c.metric not in metrics]
    all_metrics = metrics + sorted(set(extra))
    variants: dict[str, Any] = {}
    for v in spec.variants:
        sub = rs.runs[rs.runs["variant"] == v].sort_values("seed") if not rs.runs.empty else rs.runs
        final = {}
        for m in all_metrics:
            base = run_values(rs, spec.baseline, m) if v != spec.baseline else None
            final[m] = metric_stats(run_values(rs, v, m), base, spec.metric_goal(m), rule.confidence, rule.n_resamples)
        d, r = frontier_points(rs, v)
        variants[v] = {
            "overrides": flatten(spec.variants[v]),
            "seeds": [int(s) for s in sub["seed"]] if len(sub) else [],
            "run_ids": list(sub["run_id"]) if len(sub) else [],
            "final": final,
            "frontier": fit_frontier(d, r),
        }
    verdicts = [judge_claim(c, run_values(rs, c.a, c.metric), run_values(rs, c.b, c.metric), rule) for c in spec.claims]
    seeds = sorted({s for v in variants.values() for s in v["seeds"]})
    return _clean({
        "ablation": spec.name, "question": spec.question, "scale": rs.scale, "experiment_id": rs.experiment_id,
        "tracking_uri": tracking.tracking_uri(), "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "baseline": spec.baseline, "metrics": [{"name": m.name, "goal": m.goal} for m in spec.metrics],  # type: ignore[union-attr]
        "seeds": seeds, "git_shas": rs.git_shas, "variants": variants, "verdicts": verdicts,
        "failed": rs.failed, "running": rs.running, "ignored_runs": rs.ignored,
    })


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
    bootstrap CI (bars) per variant. None if no finished run."""
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
    names = list(rs.spec.variants)
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
    fig.suptitle(f"{rs.spec.name} [{rs.scale}]: final metrics (points: seeds; ◆: mean with 95% bootstrap CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_frontier(rs: RunSet, summary: dict[str, Any], path: Path) -> Optional[Path]:
    """Gold gain vs d = √KL: per-iteration points of every seed and the fitted
    ``R(d) = d(α − β log d)`` per variant (Gao et al. 2022). None if no history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if rs.history.empty:
        return None
    pal = _palette(rs.spec)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for v, color in pal.items():
        d, r = frontier_points(rs, v)
        if not len(d):
            continue
        ax.scatter(d, r, s=14, alpha=0.45, color=color)
        fit = summary["variants"][v]["frontier"]
        label = v
        if fit["alpha"] is not None and fit["d_max"]:
            xs = np.linspace(1e-3, fit["d_max"], 200)
            ax.plot(xs, gao_rl_curve(xs, fit["alpha"], fit["beta"]), color=color, lw=2)
            label = f"{v}: α={fit['alpha']:.3g}, β={fit['beta']:.3g}"
        ax.plot([], [], color=color, lw=2, label=label)
    ax.axhline(0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("d = √KL(π‖π_init)  [nats^½, k1 summed over the response]")
    ax.set_ylabel("gold − initial gold")
    ax.set_title(f"{rs.spec.name} [{rs.scale}]: gold vs √KL frontier, fit R(d) = d(α − β log d)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_claims(summary: dict[str, Any], path: Path) -> Optional[Path]:
    """Forest plot: each claim's difference ``a − b`` with its bootstrap CI, the claimed bound(s)
    dashed, coloured by verdict. None if no claim has a CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vs = summary["verdicts"]
    if not any(v["ci_low"] is not None for v in vs):
        return None
    colors = {"reproduced": "tab:green", "contradicted": "tab:red", "inconclusive": "tab:grey"}
    fig, axes = plt.subplots(len(vs), 1, figsize=(7.5, 1.3 * len(vs) + 0.8), squeeze=False)
    for ax, v in zip(axes.flat, vs):
        if v["ci_low"] is not None:
            ax.errorbar([v["diff"]], [0], xerr=[[v["diff"] - v["ci_low"]], [v["ci_high"] - v["diff"]]], fmt="o",
                        color=colors[v["verdict"]], capsize=5, ms=7)
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


def render_markdown(rs: RunSet, summary: dict[str, Any], figures: dict[str, Optional[Path]]) -> str:
    """The report text (GitHub markdown) from the summary and the written figures."""
    spec = rs.spec
    L: list[str] = []
    L.append(f"# Ablation `{spec.name}` ({rs.scale} scale)\n")
    L.append(f"**Question.** {spec.question.strip()}\n")
    n_runs = len(rs.runs)
    L.append(f"Runs counted: {n_runs} finished (latest per variant × seed), seeds {summary['seeds']}; "
             f"baseline `{spec.baseline}`; MLflow experiment `ablation/{spec.name}` (id {rs.experiment_id}) "
             f"at `{summary['tracking_uri']}`; code {', '.join(summary['git_shas']) or 'unknown'}; "
             f"generated {summary['generated_at']}.\n")
    few = [v for v, d in summary["variants"].items() if len(d["seeds"]) < spec.verdict.min_seeds]
    if few:
        L.append(f"> **Fewer than {spec.verdict.min_seeds} seeds** for {', '.join(few)}: verdicts below are indicative "
                 f"only (the reference asks for ≥ {spec.verdict.min_seeds} seeds per variant before a verdict).\n")
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
    L.append(f"Rule: `{spec.verdict.rule}` — the {round(100 * spec.verdict.confidence)}% bootstrap CI of the difference "
             "of means (a − b) must lie entirely on the claimed side of the bound to *reproduce* the claim, "
             "entirely on the other side to *contradict* it; otherwise *inconclusive*.\n")
    L.append("| claim | source | expected | verdict | evidence |")
    L.append("|---|---|---|---|---|")
    for v in summary["verdicts"]:
        note = "" if v["enough_seeds"] or v["ci_low"] is None else f" (indicative: n={min(v['n_a'], v['n_b'])} < {spec.verdict.min_seeds})"
        L.append(f"| {_md_cell(v['claim'])} | {_md_cell(v['source'])} | `{v['metric']}`: {_md_cell(v['expected'])} | "
                 f"**{v['verdict']}**{note} | {_md_cell(v['evidence'])} |")
    L.append("")
    if figures.get("claims"):
        L.append(f"![claims]({figures['claims'].name})\n")

    L.append("## Final metrics\n")
    L.append("Per run, `final/*` is the mean over the last 10% of iterations (as in the run summary); "
             "mean and IQM over seeds, 95% bootstrap CI of the mean, and P(improvement) = P(variant better than "
             f"`{spec.baseline}`) = Mann–Whitney U / (n·n_baseline).\n")
    metrics = [m["name"] for m in summary["metrics"]]
    extra = [c.metric for c in spec.claims if c.metric not in metrics]
    for m in metrics + sorted(set(extra)):
        goal = {"max": " (higher is better)", "min": " (lower is better)"}.get(spec.metric_goal(m), " (diagnostic: no better direction)")
        L.append(f"**`{m}`**{goal}\n")
        L.append("| variant | n | mean | IQM | 95% CI | P(improvement) |")
        L.append("|---|---|---|---|---|---|")
        for v, d in summary["variants"].items():
            st = d["final"][m]
            ci = f"[{_fmt(st['ci_low'])}, {_fmt(st['ci_high'])}]" if st["ci_low"] is not None else "– (n < 2)"
            p = "(baseline)" if v == spec.baseline else "– (no goal)" if spec.metric_goal(m) == "none" else _fmt(st["p_improvement"], 2)
            L.append(f"| {v} | {st['n']} | {_fmt(st['mean'])} | {_fmt(st['iqm'])} | {ci} | {p} |")
        L.append("")
    if figures.get("final"):
        L.append(f"![final metrics]({figures['final'].name})\n")

    L.append("## Learning curves\n")
    if figures.get("curves"):
        L.append("Mean over seeds with a 95% bootstrap CI band, per iteration.\n")
        L.append(f"![learning curves]({figures['curves'].name})\n")
    else:
        L.append("No finished run yet.\n")

    L.append("## Gold reward vs KL frontier\n")
    L.append("Gao, Schulman & Hilton (2022): under RL, gold reward gain follows R(d) = d(α − β log d) with "
             "d = √KL(π‖π_init). Points: per-iteration (√KL, gold − initial gold) of every seed. A variant that "
             "gains gold only by drifting further (larger d) has not improved the frontier.\n")
    L.append("| variant | α | β | points | RMSE | max d | note |")
    L.append("|---|---|---|---|---|---|---|")
    for v, d in summary["variants"].items():
        f = d["frontier"]
        L.append(f"| {v} | {_fmt(f['alpha'])} | {_fmt(f['beta'])} | {f['n_points']} | {_fmt(f['rmse'])} | "
                 f"{_fmt(f['d_max'])} | {_md_cell(f['error'] or '')} |")
    L.append("")
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
    for v in spec.variants:
        seed, it, samples = _samples(rs, v)
        if not samples:
            L.append(f"**{v}**: no samples recorded.\n")
            continue
        L.append(f"**{v}** (seed {seed}, iteration {it})\n")
        L.append("| prompt | response | RM score | gold |")
        L.append("|---|---|---|---|")
        for s in samples:
            L.append(f"| {_md_cell(s.get('prompt', ''))} | {_md_cell(s.get('response', ''))} | {_fmt(s.get('score'), 3)} | "
                     f"{_fmt(s.get('gold'), 3)} |")
        L.append("")
    return "\n".join(L) + "\n"


def write_report(name: str, scale: Optional[str] = None) -> Path:
    """Write ``<reports>/<name>/`` (report.md, PNGs, summary.json) from the runs in MLflow.

    Args:
        name: ablation name.
        scale: which scale's runs (default: the latest invocation's).
    Returns:
        Path of ``report.md``.
    Raises:
        HarnessError: unknown ablation, or nothing recorded for it yet.
    """
    rs = load_runs(name, scale)
    out = Path(default_reports_dir()) / name
    out.mkdir(parents=True, exist_ok=True)
    summary = build_summary(rs)
    figures = {
        "curves": plot_learning_curves(rs, out / "learning_curves.png"),
        "final": plot_final_metrics(rs, summary, out / "final_metrics.png"),
        "frontier": plot_frontier(rs, summary, out / "frontier.png"),
        "claims": plot_claims(summary, out / "claims.png"),
    }
    summary["figures"] = [p.name for p in figures.values() if p is not None]
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    path = out / "report.md"
    path.write_text(render_markdown(rs, summary, figures))
    return path
