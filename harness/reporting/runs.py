"""Reading an ablation's runs from MLflow for its report: the :class:`RunSet`, per-run values, evaluation
curves, values at matched KL, the first-n-seeds subsets the sequential rule looks at, frontier points
and the SFT policy's best-of-n curves.

Which runs count: child runs of the chosen scale (default: the scale of the latest invocation) whose
``config_hash`` equals the hash the spec resolves to now for that (variant, seed), the latest FINISHED one per
(variant, seed); each seed's arms on one pipeline build (:func:`harness.experiments.builds.pool_builds`). Earlier
FAILED/KILLED attempts are listed.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from harness.errors import HarnessError

if TYPE_CHECKING:
    import pandas as pd

    from harness.experiments.spec import AblationSpec

#: Namespaces of per-iteration metrics (read in full and written to ``runs.csv``); everything else
#: a run logs is a run-level summary value.
PER_ITERATION_PREFIXES = ("objective/", "policy/", "loss/", "val/", "response/", "time/", "perf/", "eval/", "dynamic/",
                          "batch/responses_sampled")


@dataclass
class RunSet:
    """The runs of one ablation at one scale, as read from MLflow.

    ``runs``: one row per counted run (latest FINISHED per (variant, seed)) with columns
    ``run_id, record_id, variant, seed, start_time, artifact_uri`` and ``metrics.<name>`` for every
    run-level metric. ``run_id`` is this store's (the key for MLflow calls); ``record_id`` the id the run is archived
    under (:func:`harness.experiments.archive.archive_key`: the original run's id for a run restored from the archive), the one
    every committed output names, so that a report written on another machine names the same runs. ``history``: long format ``run_id, variant, seed, metric, step, value``
    for every per-iteration metric (:data:`PER_ITERATION_PREFIXES`). ``failed``: every FAILED/KILLED attempt of a planned
    (variant, seed), with ``reason`` and ``retried`` (a later FINISHED run exists); ``failed`` and ``running`` name runs
    by their ``record_id``. ``design``: the
    ``stage`` and ``cap`` of the sequential rule when the ablation ran with ``--seeds auto`` at this scale.
    ``other_builds``, ``builds``, ``every_build``: the runs set aside (their seed counted on another build), the counted
    builds and every build's runs (:func:`harness.experiments.builds.pool_builds`, :func:`harness.experiments.builds.counted_builds`).
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
    # run_id -> sorted (metric, step, value) rows without timings (identical_runs), filled once
    run_rows: dict[str, list] = field(default_factory=dict, repr=False)
    design: Optional[dict[str, int]] = None  # {"stage", "cap"} when the newest invocation at this scale was --seeds auto
    other_builds: list[dict[str, Any]] = field(default_factory=list)
    builds: dict[str, dict[str, Any]] = field(default_factory=dict)  # the counted builds: {build: {"runs", "seeds"}}
    every_build: Any = None  # every build's FINISHED runs, set aside or not (latest per variant, seed, build)


def _parents(c: Any, exp_id: str) -> list[Any]:
    """Every parent run (one per invocation) of the experiment, newest first."""
    from harness.infra.tracking import search_all

    return list(search_all(c, [exp_id], "tags.kind = 'parent'"))


def _latest_parent(c: Any, exp_id: str) -> Any:
    parents = _parents(c, exp_id)
    return parents[0] if parents else None


def _load_spec_for_report(name: str, parent: Any) -> "AblationSpec":
    """The spec file if it exists, else the copy stored with the latest invocation."""
    import yaml

    from harness.experiments.spec import AblationSpec, load_spec, spec_path

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


def _client_with_archive(name: str, uri: str) -> Any:
    """A client on ``uri``, after the runs of ``name``'s archive that the store lacks are restored into it, with the
    rescored metrics the archive keeps (:func:`harness.experiments.archive.apply_rescored`)."""
    from harness.experiments import archive
    from harness.infra import tracking
    from harness.experiments.spec import experiment_name

    if not any(archive.archive_dir(name).glob("*.json.gz")):
        return tracking.client(uri)
    c = tracking.init_store(uri)
    exp_id = tracking.experiment_id(c, experiment_name(name))
    archive.restore_runs(c, exp_id, name)
    archive.apply_rescored(c, exp_id, name)  # what `harness rescore` kept beside the runs
    return c


def _search_children(uri: str, exp_id: str) -> "pd.DataFrame":
    """``mlflow.search_runs`` of experiment ``exp_id``'s child runs on store ``uri``, as a pandas frame (``run_id,
    status, start_time, metrics.*, params.*, tags.*``). ``mlflow.set_tracking_uri``, which the fluent call needs,
    also writes ``$MLFLOW_TRACKING_URI`` (when MLflow's own URI changes); this project reads that variable as the
    user's choice of store (:func:`harness.infra.tracking.tracking_uri`, :func:`harness.infra.tracking.artifact_root`, which then
    leaves new experiments to MLflow's default, ``./mlruns`` of the working directory for a database store), so the
    variable is put back as it was.

    Raises:
        MlflowException: the store cannot be read.
    """
    import mlflow

    before = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        mlflow.set_tracking_uri(uri)
        return mlflow.search_runs(experiment_ids=[exp_id], filter_string="tags.kind = 'child'", output_format="pandas")
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before


def load_runs(name: str, scale: Optional[str] = None, history_prefixes: Sequence[str] = PER_ITERATION_PREFIXES) -> RunSet:
    """Read ablation ``name``'s runs at ``scale`` (default: the latest invocation's scale), archived ones restored first.

    Uses ``mlflow.search_runs`` (pandas; :func:`_search_children`) for run-level metrics and tags and
    ``MlflowClient.get_metric_history`` for the curves.

    Raises:
        HarnessError: no experiment / no invocation recorded for ``name``.
    """
    import pandas as pd

    from harness.experiments.spec import experiment_name, resolve_config, run_hash
    from harness.infra import tracking
    from harness.rl import metrics as run_metrics
    from harness.experiments.builds import counted_builds, pool_builds

    uri = tracking.tracking_uri()
    c = _client_with_archive(name, uri)
    exp = c.get_experiment_by_name(experiment_name(name))
    if exp is None:
        from harness.experiments.spec import spec_path

        spec_path(name)  # an unknown name: the error lists the available ablations
        raise HarnessError(f"no runs recorded for ablation {name!r} in {tracking.display_uri(uri)}; run `harness ablate {name}` first")
    exp_id = exp.experiment_id
    parent = _latest_parent(c, exp_id)
    spec = _load_spec_for_report(name, parent)
    if scale is None:
        if parent is None:
            raise HarnessError(f"no invocation recorded for ablation {name!r}; run `harness ablate {name}` first")
        scale = parent.data.tags.get("scale", "default")

    df = _search_children(uri, exp_id)
    empty_hist = pd.DataFrame(columns=["run_id", "variant", "seed", "metric", "step", "value"])
    if df.empty:
        return RunSet(spec, scale, exp_id, df, empty_hist)
    df = df[df["tags.scale"] == scale].copy()
    df["record_id"] = _record_ids(df)
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
    df = df[np.asarray(keep, dtype=bool)].sort_values("start_time", ascending=False)
    df, other_builds, every = pool_builds(df)
    finished = df[df["status"] == "FINISHED"].drop_duplicates(["variant", "seed"], keep="first")
    done_keys = set(zip(finished["variant"], finished["seed"]))
    failed, running = _unfinished(df, done_keys)
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
    finished, history = run_metrics.derive_trained_all_equal(
        finished, history, {k: resolve_config(spec, scale, *k).ppo for k in zip(finished["variant"], finished["seed"])})
    shas = sorted({s for s in finished.get("tags.git_sha", pd.Series(dtype=str)).dropna()})
    design = None
    auto = [r for r in _parents(c, exp_id) if r.data.tags.get("scale") == scale and r.data.tags.get("seeds_mode") == "auto"]
    if auto:  # the newest staged invocation at this scale: its design judges the claims
        design = {"stage": int(auto[0].data.tags["stage"]), "cap": int(auto[0].data.tags["cap"])}
    return RunSet(spec, scale, exp_id, finished.reset_index(drop=True), history, failed, running, ignored, shas,
                  design=design, other_builds=other_builds, builds=counted_builds(finished),
                  every_build=every.drop_duplicates(["variant", "seed", "build"], keep="first"))


def _record_ids(df: "pd.DataFrame") -> list[str]:
    """Each row's archive key (:func:`harness.experiments.archive.record_key` of its ``restored_from`` tag and ``run_id``)."""
    from harness.experiments.archive import RESTORED_TAG, record_key

    col = f"tags.{RESTORED_TAG}"
    restored = df[col] if col in df.columns else [None] * len(df)
    return [record_key(r, rid) for r, rid in zip(restored, df["run_id"])]


def record_ids(runs: "pd.DataFrame") -> list[str]:
    """The ``record_id`` of each row of a :class:`RunSet`'s ``runs`` (its ``run_id`` where the frame has no such column,
    e.g. one built by hand: a run never archived is recorded under its own id)."""
    return list(runs["record_id"] if "record_id" in runs.columns else runs["run_id"])


def _unfinished(df: "pd.DataFrame", done_keys: set) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The FAILED/KILLED attempts of the counted configs (with ``reason``, ``retried``: a FINISHED run of the same
    (variant, seed) exists, ``start_time``) and the RUNNING ones, from :func:`load_runs`' filtered runs ``df``."""
    failed, running = [], []
    for _, row in df[df["status"].isin(["FAILED", "KILLED"])].iterrows():
        failed.append({"variant": row["variant"], "seed": int(row["seed"]), "run_id": row["record_id"], "status": row["status"],
                       "reason": row.get("tags.failure_reason") if isinstance(row.get("tags.failure_reason"), str) else "",
                       "retried": (row["variant"], row["seed"]) in done_keys,
                       "start_time": str(row["start_time"])})
    for _, row in df[df["status"] == "RUNNING"].iterrows():
        running.append({"variant": row["variant"], "seed": int(row["seed"]), "run_id": row["record_id"]})
    return failed, running


def _with_metric(rs: RunSet, variant: str, metric: str) -> "pd.DataFrame":
    """``variant``'s counted runs with a finite ``metric`` by seed: only the columns read (seed, metric, draw, build)."""
    col = f"metrics.{metric}"
    if col not in rs.runs.columns or rs.runs.empty:
        return rs.runs.iloc[0:0]
    sub = rs.runs.loc[rs.runs["variant"] == variant, [c for c in ("seed", col, "tags.replicate", "build")
                                                       if c in rs.runs.columns]].sort_values("seed")
    return sub[[v is not None and np.isfinite(float(v)) for v in sub[col]]]


def run_values(rs: RunSet, variant: str, metric: str) -> list[float]:
    """Final values of ``metric`` (an MLflow run-level metric, or one computed here such as
    ``matched_kl/gold``) for ``variant``'s counted runs, in seed order; runs without it are skipped."""
    sub = _with_metric(rs, variant, metric)
    return [float(v) for v in sub[f"metrics.{metric}"]] if len(sub) else []


def run_draws(rs: RunSet, variant: str, metric: str, with_build: bool = True) -> list[Optional[str]]:
    """The pipeline draw (tag ``replicate``) of each value :func:`run_values` returns for ``variant`` and ``metric``, in
    order (None: no tag); with ``with_build``, on its build when several are counted (:func:`harness.experiments.builds.draw_labels`)."""
    from harness.experiments.builds import draw_labels

    sub = _with_metric(rs, variant, metric)
    tags = sub["tags.replicate"] if "tags.replicate" in sub.columns else [None] * len(sub)
    draws = [None if t is None or t != t else str(t) for t in tags]
    several = with_build and "build" in rs.runs.columns and rs.runs["build"].nunique() > 1
    return draw_labels(draws, [str(b) for b in sub["build"]]) if several else draws


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


#: Per-iteration metrics that differ between bit-identical runs (wall-clock timings and throughput).
TIMING_PREFIXES = ("time/", "perf/")


def identical_runs(rs: RunSet, a: str, b: str) -> Optional[bool]:
    """Whether variants ``a`` and ``b`` gave bit-identical runs: on every seed both ran, every recorded per-iteration
    and evaluation value (timings excepted) is exactly equal, at every step. A variant whose switch never binds
    here (a dual clip bound no ratio reaches) gives the baseline's runs exactly.

    Returns:
        True or False; None when the two share no seed (e.g. disjoint seed offsets) or no history was loaded.
    """
    if rs.runs.empty or rs.history.empty:
        return None
    runs = {v: dict(zip(rs.runs.loc[rs.runs["variant"] == v, "seed"].astype(int),
                        rs.runs.loc[rs.runs["variant"] == v, "run_id"])) for v in (a, b)}
    shared = sorted(set(runs[a]) & set(runs[b]))
    if not shared:
        return None
    if not rs.run_rows:
        h = rs.history[~rs.history["metric"].str.startswith(TIMING_PREFIXES)]
        rs.run_rows.update({rid: sub.sort_values(["metric", "step"])[["metric", "step", "value"]].to_numpy().tolist()
                            for rid, sub in h.groupby("run_id", sort=False)})
    rows = rs.run_rows
    return all(runs[a][s] in rows and rows[runs[a][s]] == rows.get(runs[b][s]) for s in shared)


def mean_eval_curve(rs: RunSet, variant: str, metric: str = "eval/gold") -> tuple[list[float], list[float]]:
    """``(steps, means)``: ``metric`` averaged over ``variant``'s runs at each evaluation step (every run evaluates at
    the same steps; a step only some runs reached averages those). Empty lists when no run recorded it."""
    ids = list(rs.runs.loc[rs.runs["variant"] == variant, "run_id"]) if not rs.runs.empty else []
    values: dict[float, list[float]] = {}
    for rid in ids:
        c = eval_curve(rs, rid)
        if metric in c.columns:
            for k, v in zip(c["step"], c[metric]):
                if v == v:  # not NaN
                    values.setdefault(float(k), []).append(float(v))
    steps = sorted(values)
    return steps, [float(np.mean(values[k])) for k in steps]


def first_seeds(rs: RunSet, n: int) -> RunSet:
    """``rs`` restricted to each variant's first ``n`` planned seeds (run seed minus the variant's
    ``seed_offset`` below ``n``): the data the sequential rule sees at a look of ``n`` seeds per arm."""
    if rs.runs.empty:
        return rs
    offset = rs.runs["variant"].map(lambda v: rs.spec.seed_offset.get(v, 0))
    sub = dataclasses.replace(rs, runs=rs.runs[(rs.runs["seed"].astype(int) - offset) < n].copy())
    add_matched_kl(sub)  # the matched KL of the runs seen at this look, not of runs still to come
    return sub



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
    tagged with (one for most ablations; one per proxy when the variants change the proxy; only runs on
    pipeline draw 0 carry one, the draw the curve is built on), read from the copy in the ablation's archive or
    else the stage built here from the runs' weights (:func:`harness.experiments.archive.stage_copy`), each with
    gold and proxy fits of ``R_bon(d) = d(α − β d)`` and bootstrap CIs over prompts.

    Returns:
        ``[{"key", "variants", "n", "kl", "d", "gold_gain", "proxy_gain", "fit": {"gold": ..., "proxy": ...}}]``
        in the spec's variant order (``variants``: those whose runs used that curve); ``[]`` when the
        runs carry no ``bon`` key. A key whose curve is neither archived nor built here from the runs' weights is left out.
    """
    from harness.experiments.archive import stage_copy
    from harness.experiments.builds import recorded_digests
    from harness.analysis.frontier import bootstrap_fit

    col = "tags.pipeline.bon"
    if rs.runs.empty or col not in rs.runs.columns:
        return []
    users: dict[str, list[str]] = {}
    for v in rs.spec.variants:
        for k in sorted({str(k) for k in rs.runs.loc[rs.runs["variant"] == v, col].dropna()}):
            users.setdefault(k, []).append(v)
    out = []
    for key, variants in users.items():
        c = stage_copy(rs.spec.name or "", "bon", key, recorded_digests(rs.runs[rs.runs[col].astype(str) == key]))
        if c is None:
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


def task_meta(spec: "AblationSpec") -> dict[str, Any]:
    """The registration metadata of ``spec``'s task (:mod:`harness.tasks.registry`: what its reports read, e.g.
    ``reward_model``, ``curve_metrics``, ``sample_columns``).

    Raises:
        UnknownComponentError: the spec's task is not registered.
    """
    from harness.config.presets import task_name
    from harness.tasks import TASKS

    return TASKS.meta(task_name(spec.base))


def scored_by_verifier(spec: "AblationSpec") -> bool:
    """True when ``spec``'s task is scored by a verifier, not a learned reward model (``reward_model=False`` in its
    registration): its ``proxy`` is the same number as its ``gold``, and it has no best-of-n reference.

    Raises:
        UnknownComponentError: the spec's task is not registered.
    """
    return not task_meta(spec).get("reward_model", True)


def frontier_rewards(spec: "AblationSpec") -> tuple[str, ...]:
    """The rewards the frontier section reads for ``spec``'s task: ``("gold", "proxy")`` for a task rewarded by a
    learned reward model; ``("gold",)`` for one :func:`scored_by_verifier`.

    Raises:
        UnknownComponentError: the spec's task is not registered.
    """
    return ("gold",) if scored_by_verifier(spec) else ("gold", "proxy")


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


