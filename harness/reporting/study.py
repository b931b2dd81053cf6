"""The report of an Optuna study: plots, the best config, and its re-evaluation against the default.

:func:`write_study_report` (``harness report NAME`` for a study, and the end of ``make sweep``) writes
``reports/NAME/``: Optuna's plots, ``best_config.yaml``, the Pareto front for ``gold_kl``, and the best
config re-run against the default on fresh seeds.
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import yaml

from harness.config import default_reports_dir
from harness.config.presets import task_meta
from harness.errors import HarnessError, one_line
from harness.reporting.render import fmt, render
from harness.experiments.study_spec import SEARCHABLE, StudySpec, experiment_name, load_study_spec, resolve_trial_config
from harness.experiments.archive import scrub
from harness.experiments.study_storage import archive_study, display_storage, open_study, redacted_storage_url, restore_study
from harness.experiments.study_storage import trial_counts
from harness.reporting.reevaluation import (REEVALUATION_RULE, _compare_arms, _get_path, _reevaluate,  # noqa: F401
                                            constraint_verdict, reevaluation_verdict)

if TYPE_CHECKING:
    import optuna
    from mlflow import MlflowClient


def _latest_scale(name: str, c: "MlflowClient") -> Optional[str]:
    from harness.infra.tracking import search_all

    exp = c.get_experiment_by_name(experiment_name(name))
    if exp is None:
        return None
    parents = search_all(c, [exp.experiment_id], "tags.role = 'sweep'")
    return parents[0].data.tags.get("scale") if parents else None


def choose_best(study: "optuna.Study", spec: StudySpec) -> Optional[Any]:
    """The best trial: Optuna's ``best_trial`` (single objective); for ``gold_kl``, the trial of
    the Pareto front with the highest gold (ties: lower KL). With ``spec.constraints`` only feasible
    trials count (every constraint value ``min − value`` ≤ 0, :func:`harness.experiments.sweep_trial.record_constraints`);
    a complete trial without constraint values (run before the constraints existed) is not feasible.
    None without a COMPLETE (feasible) trial."""
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if spec.constraints:
        complete = [t for t in complete if feasible(t, spec)]
    if not complete:
        return None
    if not spec.multi_objective:
        pick = max if spec.directions[0] == "maximize" else min
        return pick(complete, key=lambda t: t.values[0])  # the first of equal values, as Optuna's best_trial
    # the highest gold, ties to the lower KL: no trial dominates it, so it is the Pareto front's choice too
    return min(complete, key=lambda t: (-t.values[0], t.values[1]))


def feasible(trial: Any, spec: StudySpec) -> bool:
    """Whether ``trial`` keeps every constraint of ``spec``: each has a recorded value ``min − value`` ≤ 0."""
    cons = trial.constraints
    return all(c.metric in cons and cons[c.metric] <= 0.0 for c in spec.constraints)


def _save_axes(ax: Any, path: Path, title: Optional[str] = None, size: Optional[tuple[float, float]] = None) -> Path:
    """Save the figure of an Optuna matplotlib plot (one Axes or an array of them) as a PNG."""
    import matplotlib.pyplot as plt
    import numpy as np

    axes = np.asarray(ax, dtype=object)
    fig = axes.flat[0].figure
    if size is not None:
        fig.set_size_inches(*size)
    if title and axes.size == 1:
        for loc in ("left", "right"):  # Optuna's generic titles
            axes.flat[0].set_title("", loc=loc)
        axes.flat[0].set_title(title)
    elif title:
        fig.suptitle(title)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_study(study: "optuna.Study", spec: StudySpec, out: Path) -> tuple[dict[str, Optional[Path]], dict[str, str]]:
    """Optuna's matplotlib plots of the study into ``out``: ``history.png``, ``importances.png``
    (fANOVA, seed 0), ``contour.png`` and ``slice.png`` of the searched parameters, and
    ``pareto_front.png`` for ``gold_kl``. Multi-objective plots show the gold objective.
    Returns ``(figures, notes)``: a figure is None, with a note why, when Optuna cannot draw it
    (e.g. too few COMPLETE trials)."""
    import matplotlib

    matplotlib.use("Agg")
    import optuna
    from optuna.visualization import matplotlib as ovm

    params = [p for p in ("cliprange", "lam", "kl_coef", "lr") if p in spec.search_space]
    kw: dict[str, Any] = {}
    if spec.multi_objective:
        kw = {"target": lambda t: t.values[0], "target_name": "final gold"}
    else:
        kw = {"target_name": f"final {spec.objective}"}
    figs: dict[str, Optional[Path]] = {}
    notes: dict[str, str] = {}
    plots = {
        "history": lambda: ovm.plot_optimization_history(study, **kw),
        "importances": lambda: ovm.plot_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), params=params, **kw),
        "contour": lambda: ovm.plot_contour(study, params=params, **kw),
        "slice": lambda: ovm.plot_slice(study, params=params, **kw),
    }
    if spec.multi_objective:
        plots["pareto_front"] = lambda: ovm.plot_pareto_front(study, target_names=["final gold ↑", "final KL ↓"])
        plots["importances_kl"] = lambda: ovm.plot_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), params=params,
            target=lambda t: t.values[1], target_name="final KL")
    elif any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        plots["intermediate"] = lambda: ovm.plot_intermediate_values(study)
    titles = {"history": "optimization history", "importances": "parameter importances (fANOVA)",
              "importances_kl": "parameter importances for the final KL (fANOVA)",
              "contour": "contour", "slice": "slice", "pareto_front": "Pareto front",
              "intermediate": f"intermediate {_signal(spec)} (pruning signal)"}
    k = len(params)
    sizes = {"history": (8, 4.5), "importances": (8, 3.5), "importances_kl": (8, 3.5), "contour": (4.2 * k + 1.5, 3.6 * k), "slice": (4.2 * k, 4.2),
             "pareto_front": (7, 5), "intermediate": (9, 5)}
    for key, fn in plots.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = fn()
            figs[key] = _save_axes(ax, out / f"{key}.png", f"{study.study_name}: {titles[key]}", sizes[key])
        except Exception as e:  # too few trials, a single distinct value ...
            import matplotlib.pyplot as plt

            plt.close("all")
            figs[key] = None
            notes[key] = one_line(e, 300)
    return figs, notes


def _importances_and_front(study: "optuna.Study", spec: StudySpec, counts: dict[str, int]
                           ) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """fANOVA parameter importances per objective metric (``optuna.importance``, seed 0; with ≥ 2 COMPLETE
    trials, a metric whose evaluator fails is left out) and, for a multi-objective study, its Pareto front
    ``[{number, values, params}]`` by descending first value."""
    import optuna

    importances: dict[str, dict[str, float]] = {}  # objective metric -> {param: fANOVA importance}
    for i, metric in enumerate(spec.objective_metrics):
        if counts["complete"] < 2:
            break
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances[metric] = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
                target=(lambda t, i=i: t.values[i]))
    pareto = []
    if spec.multi_objective and counts["complete"]:
        pareto = [{"number": t.number, "values": list(t.values), "params": t.params} for t in
                  sorted(study.best_trials, key=lambda t: t.values[0], reverse=True)]
    return importances, pareto


def _trial_records(trials: list[Any], spec: Optional[StudySpec] = None) -> list[dict[str, Any]]:
    """The summary's ``trials``: number, state, values, params, worker (processes numbered 1, 2, … in order of
    appearance: no process id in a committed report), the trial it retries, why it failed, duration (s), and for a
    constrained study its constraint metrics' values (``constraint_values``: a pruned trial's are its last held-out
    ones) and whether it is ``feasible`` (:func:`feasible`)."""
    workers: dict[Any, int] = {}
    for t in trials:
        if t.user_attrs.get("worker_pid") is not None:
            workers.setdefault(t.user_attrs["worker_pid"], len(workers) + 1)
    return [{"number": t.number, "state": t.state.name.lower(), "values": t.values, "params": t.params,
             "worker": workers.get(t.user_attrs.get("worker_pid")), "retry_of": t.user_attrs.get("retry_of"),
             "fail_reason": t.user_attrs.get("fail_reason"),
             "duration_s": t.duration.total_seconds() if t.duration is not None else None,
             **({"constraint_values": t.user_attrs.get("constraint_values", {}), "feasible": feasible(t, spec)}
                if spec is not None and spec.constraints else {})} for t in trials]


def _write_best_config(spec: StudySpec, scale: str, best_params: dict[str, float], out: Path) -> dict[str, Any]:
    """The best trial's resolved config without ``seed`` and this machine's data directories
    (:meth:`harness.config.Config.portable_dict`), also written to ``out/best_config.yaml``."""
    cfg = resolve_trial_config(spec, scale, best_params, 0).portable_dict()
    cfg.pop("seed", None)
    (out / "best_config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg


def _trial_counts_entry(trials: list[Any], counts: dict[str, int], n_children: int) -> dict[str, int]:
    """The summary's trial counts: in storage, by state, MLflow child runs and worker processes seen."""
    return {"n_trials": len(trials), "n_trials_complete": counts["complete"], "n_trials_pruned": counts["pruned"],
            "n_trials_failed": counts["fail"], "n_trials_running": counts["running"], "n_trials_waiting": counts["waiting"],
            "n_mlflow_child_runs": n_children,  # workers: numbered 1, 2, … in trial order (no process ids)
            "n_workers_seen": len({t.user_attrs["worker_pid"] for t in trials if "worker_pid" in t.user_attrs})}


def _best_entry(best: Any, best_params: Optional[dict[str, float]], spec: StudySpec) -> dict[str, Any]:
    """The summary's best trial: number, params, first objective value and every objective value by metric."""
    return {"best_trial": best.number if best is not None else None, "best_params": best_params,
            "best_value": (best.values[0] if best is not None else None),
            "best_values": dict(zip(spec.objective_metrics, best.values)) if best is not None else None}


def write_study_report(name: str, scale: Optional[str] = None, workers: int = 2, progress: bool = True,
                       reevaluate: bool = True, spec: Optional[StudySpec] = None) -> Path:
    """Write ``<reports>/<name>/`` for study ``name``: ``report.md``, PNGs and ``summary.json``.

    Contents: trial counts by state, MLflow child runs, the best trial and its resolved config
    (``best_config.yaml``), Optuna plots (:func:`plot_study`), the Pareto front for ``gold_kl``, and
    (``reevaluate``) the best config against the default config on the spec's fresh re-evaluation
    seeds, run in ``workers`` processes (:func:`_reevaluate`): mean with its t interval, IQM (n ≥ 8),
    Welch's 95% interval and p-value of the difference, and the probability of improvement
    (Agarwal et al. 2021; :mod:`harness.analysis.stats`).

    ``summary.json`` keys: ``study, optuna_study, scale, storage, experiment, objective, directions, cap, n_trials,
    n_trials_complete, n_trials_pruned, n_trials_failed, n_trials_running, n_trials_waiting, n_mlflow_child_runs,
    n_workers_seen, best_trial, best_params, best_value, best_values, default_params, best_config, pareto_front,
    importances, figures, figure_notes, trials, reevaluation, generated_at``; ``reevaluation`` holds ``seeds,
    sweep_seeds, primary, arms {best, default: {params, run_ids, seeds_finished}}, comparison {metric: {goal, best,
    default, diff_mean, diff_ci_low, diff_ci_high, p_welch, p_best_better}}, failed``.

    A machine without the study restores it first from ``<reports>/<name>/archive/`` (written here and by each sweep).

    Args:
        name: study spec name.
        scale: which study (default: the scale of the latest sweep invocation).
    Returns:
        Path of ``report.md``.
    Raises:
        HarnessError: unknown study, or no sweep recorded for it yet.
    """
    import optuna

    from harness.infra import tracking
    from harness.analysis.stats import clean

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = spec or load_study_spec(name)
    uri = tracking.tracking_uri()
    c = tracking.init_store(uri)
    restore_study(name, c)  # a new machine renders from the archive (reports/NAME/archive/)
    if scale is None:
        scale = _latest_scale(name, c)
        if scale is None:
            raise HarnessError(f"no sweep recorded for study {name!r} in {tracking.display_uri(uri)}; run `make sweep NAME={name}` first")
    study = open_study(spec, scale, create=False)
    exp_id = tracking.experiment_id(c, experiment_name(name))
    trials = study.get_trials(deepcopy=False)
    counts = trial_counts(study)
    here = scrub(redacted_storage_url(name))
    children = [r for r in tracking.search_all(c, [exp_id], f"tags.role = 'trial' and tags.scale = '{scale}'")
                if scrub(r.data.tags.get("optuna.storage", here)) == here]  # this storage's study only (an archived run's tag is scrubbed)
    out = Path(default_reports_dir()) / name
    out.mkdir(parents=True, exist_ok=True)
    figs, notes = plot_study(study, spec, out)

    best = choose_best(study, spec)
    best_params = dict(best.params) if best is not None else None
    best_cfg = _write_best_config(spec, scale, best_params, out) if best is not None else None
    importances, pareto = _importances_and_front(study, spec, counts)
    reeval: Optional[dict[str, Any]] = None
    if reevaluate and best_params is not None:
        reeval = _reevaluate(spec, scale, best_params, workers, progress, c, exp_id)
    summary = clean({
        "study": name, "optuna_study": study.study_name, "scale": scale, "storage": display_storage(name),
        "experiment": experiment_name(name), "experiment_id": exp_id, "tracking_uri": tracking.display_uri(uri),
        "objective": spec.objective, "objective_metrics": spec.objective_metrics, "directions": spec.directions,
        "sampler": spec.sampler.type, "pruner": spec.pruner.type if spec.pruner else "none",
        "cap": max((int(r.data.tags.get("cap", 0)) for r in tracking.search_all(c, [exp_id], "tags.role = 'sweep'")
                    if r.data.tags.get("scale") == scale), default=None),
        **_trial_counts_entry(trials, counts, len(children)),
        **_best_entry(best, best_params, spec),
        "default_params": {k: _get_path(resolve_trial_config(spec, scale, None, 0).to_dict(), SEARCHABLE[k].path)
                           for k in spec.search_space},
        "best_config": best_cfg, "pareto_front": pareto, "importances": importances,
        "figures": [p.name for p in figs.values() if p is not None], "figure_notes": notes,
        "trials": _trial_records(trials, spec),
        "constraints": [c.model_dump() for c in spec.constraints],
        "reevaluation": reeval,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })
    archive_study(c, exp_id, name)  # the re-evaluation's runs with the trials'
    return _write_files(out, spec, summary, figs)


def _write_files(out: Path, spec: StudySpec, summary: dict[str, Any], figs: dict[str, Optional[Path]]) -> Path:
    """Write ``out/summary.json`` (scrubbed: :func:`harness.experiments.archive.scrub`) and ``out/report.md``; its path."""
    from harness.experiments.archive import scrub

    (out / "summary.json").write_text(scrub(json.dumps(summary, indent=2, allow_nan=False)))
    path = out / "report.md"
    path.write_text(render_study_markdown(spec, summary, figs))
    return path


def _trial_row(t: dict[str, Any], signal: str = "proxy score") -> dict[str, Any]:
    """The cells of one trial's row: values (a pruned trial's is the intermediate ``signal`` it was pruned at, said
    so), the three searched parameters, worker and a note (the trial it retries, the first 80 characters of why it failed)."""
    note = (f"retry of #{t['retry_of']}" if t["retry_of"] is not None else "") + \
           ((" · " if t["retry_of"] is not None else "") + " ".join(str(t["fail_reason"]).split())[:80] if t["fail_reason"] else "")
    p = t["params"]
    vals = ", ".join(fmt(v) for v in (t["values"] or [])) or "–"
    if t["state"] == "pruned" and t["values"]:  # Optuna keeps a pruned trial's last intermediate value: not the objective
        vals = f"– (pruned at an intermediate {signal} of {vals})"
    cons = t.get("constraint_values")
    return {"number": t["number"], "state": t["state"], "vals": vals,
            "constraints": (", ".join(fmt(v) for v in cons.values()) or "–") + ("" if t.get("feasible") or t["state"] not in ("complete", "pruned") else " (infeasible)")
                           if cons is not None else None,
            "cliprange": fmt(p.get("cliprange")), "lam": fmt(p.get("lam")), "kl_coef": fmt(p.get("kl_coef")),
            "worker": t["worker"] or "–", "note": note.replace("|", "/")}


def _reeval_row(m: str, d: dict[str, Any], primary: list[str]) -> str:
    """One metric's row of the re-evaluation table: best and default (mean [95% t CI] (n), IQM), their Welch
    difference with its p-value, and P(best better)."""
    b, df = d["best"], d["default"]
    star = " (objective)" if m in primary else ""
    arrow = {"max": " ↑", "min": " ↓"}.get(d["goal"], " (diagnostic)")
    return (f"| `{m}`{star}{arrow} | {fmt(b['mean'])} [{fmt(b['ci_low'])}, {fmt(b['ci_high'])}] "
            f"(n={b['n']}) | {fmt(b['iqm'])} | {fmt(df['mean'])} [{fmt(df['ci_low'])}, {fmt(df['ci_high'])}] (n={df['n']}) | "
            f"{fmt(df['iqm'])} | {fmt(d['diff_mean'])} [{fmt(d['diff_ci_low'])}, {fmt(d['diff_ci_high'])}] "
            f"(p = {fmt(d.get('p_welch'), 3)}) | {fmt(d['p_best_better'], 2)} |")


#: What each verdict of :func:`reevaluation_verdict` says about the study's selection.
_VERDICT_MEANING = {
    "reproduced": "the best configuration's advantage holds on seeds and pipeline draws the sweep never saw",
    "contradicted": "on fresh seeds the default configuration does better than the selected one",
    "below margin": "any advantage of the selected configuration is smaller than the margin",
    "inconclusive": "these seeds neither confirm the selection nor rule out an advantage of the margin's size",
}

_CAPTIONS = {"history": "Optimization history", "importances": "Parameter importances (fANOVA)",
             "importances_kl": "Parameter importances for the final KL (fANOVA)",
             "contour": "Contour plots of the searched parameters", "slice": "Slice plots",
             "pareto_front": "Pareto front (gold ↑, KL ↓)", "intermediate": "Intermediate proxy score per trial (the pruning signal)"}


def _seed_table(spec: StudySpec, r: dict[str, Any]) -> dict[str, Any]:
    """The re-evaluation's per-seed table and its count of degenerate seeds (:func:`harness.reporting.reevaluation._standing`)
    for ``study.md.j2``: ``{"metrics", "rows", "counts"}``; a seed's value below a constrained metric's floor is marked ↓
    and a run the evaluation flags degenerate ⚠."""
    from harness.rl.evaluation import DEGENERATE

    flag = f"eval_final/{DEGENERATE}"
    floors = {c.metric: c.min for c in spec.constraints}
    metrics = list(dict.fromkeys([spec.objective_metrics[0], "eval_final/distinct_2", *floors]))

    def cell(vals: dict[str, float], m: str) -> str:
        v = vals.get(m)
        mark = " ↓" if v is not None and m in floors and v < floors[m] else ""
        return fmt(v) + mark + (" ⚠" if m == metrics[0] and vals.get(flag) else "")

    rows = [f"| {x['seed']} | " + " | ".join(cell(x[a], m) for a in ("best", "default") for m in metrics) + " |"
            for x in r["per_seed"]]
    counts = []
    for arm in ("best", "default"):
        st = r["standing"][arm]
        below = "".join(f"; {b['count']} below the floor of `{m}` ({fmt(b['floor'])})" for m, b in st["below"].items())
        counts.append(f"{arm}: {st['degenerate']} of {st['n']} seeds degenerate{below}")
    return {"metrics": metrics, "rows": rows, "counts": "; ".join(counts)}


def _signal(spec: StudySpec) -> str:
    """What the spec's pruner reads, in words."""
    return "held-out gold" if spec.pruner is not None and spec.pruner.metric == "eval/gold" else "proxy score"


def render_study_markdown(spec: StudySpec, s: dict[str, Any], figs: dict[str, Optional[Path]]) -> str:
    """The study report (GitHub markdown) from the summary and the written figures: the data of
    ``harness/reporting/templates/study.md.j2``, rendered by :func:`harness.reporting.render.render`."""
    complete = [t["values"] for t in s["trials"] if t["state"] == "complete" and t["values"]]
    tie = None
    if s["best_trial"] is not None and len(complete) > 1 and all(v[0] == complete[0][0] for v in complete):
        tie = {"n": len(complete), "metric": spec.objective_metrics[0], "value": complete[0][0],
               "then": "the choice falls to the lowest KL" if spec.multi_objective else "so this \"best\" is only the first of them"}
    r = s.get("reevaluation")
    v = r.get("verdict") if r else None
    return render(
        "study", s=s, r=r, v=v, alpha=REEVALUATION_RULE.alpha, min_seeds=REEVALUATION_RULE.min_seeds,
        verdict_meaning=_VERDICT_MEANING.get(v["verdict"], "fewer seeds than the rule needs") if v else None,
        tie=tie, description=spec.description.strip(),
        objective={"gold": "final gold reward ↑", "score": "final proxy (RM) score ↑",
                   "gold_kl": "Pareto front of final gold ↑ and final KL ↓"}[spec.objective],
        space=[{"name": k, "path": SEARCHABLE[k].path, "low": f"{p.low:g}", "high": f"{p.high:g}",
                "scale": "log" if spec.param_log(k) else "linear"} for k, p in spec.search_space.items()],
        trials=[_trial_row(t, _signal(spec)) for t in s["trials"]],
        best_how=("highest gold on the Pareto front" if spec.multi_objective else "best objective value")
                 + (" among the feasible trials" if spec.constraints else ""),
        constraints=[{"metric": c.metric, "min": fmt(c.min), "margin": fmt(c.margin),
                      "sft": fmt(((r or {}).get("sft") or {}).get(c.metric, {}).get("mean"))} for c in spec.constraints],
        sft=[{"metric": m, "mean": fmt(d["mean"]), "n": d["n"]} for m, d in ((r or {}).get("sft") or {}).items()],
        cverdicts=(r or {}).get("constraint_verdicts") or [],
        best_values=", ".join(f"{k} = {fmt(v)}" for k, v in (s["best_values"] or {}).items()),
        reeval_rows=[_reeval_row(m, d, r["primary"]) for m, d in r["comparison"].items()] if r else [],
        seeds=_seed_table(spec, r) if r and r.get("per_seed") else None,
        samples=(r or {}).get("samples") or [],
        sample_columns=task_meta(resolve_trial_config(spec, s["scale"], None, 0).task.name).get(
            "sample_columns", ("reward", "secondary score")),
        figures=[{"key": k, "caption": _CAPTIONS[k].replace("proxy score", _signal(spec)), "file": p.name if p is not None else None,
                  "note": s["figure_notes"].get(k, "unknown reason")} for k, p in figs.items()])
