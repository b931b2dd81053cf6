"""A study's re-evaluation: the best configuration against the default one on fresh seeds, and its verdicts.

:func:`_reevaluate` runs both on the spec's re-evaluation seeds (pipeline draws no trial saw) as Ray tasks;
:func:`_compare_arms` compares them metric by metric; :func:`reevaluation_verdict` judges the selection on the first
objective metric and :func:`constraint_verdict` each constrained metric (non-inferiority), both by the ablations'
rule; :func:`_sft_values` gives the SFT policy's held-out values the report states beside them.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

from harness.errors import one_line
from harness.experiments.spec import VerdictRule
from harness.experiments.study_spec import OBJECTIVES, SEARCHABLE, StudySpec, held_out_metric, resolve_trial_config

if TYPE_CHECKING:
    from mlflow import MlflowClient

#: The rule a study's re-evaluation is judged by (:func:`reevaluation_verdict`) and that its report states: the
#: ablations' default rule.
REEVALUATION_RULE = VerdictRule()


def _reevaluate(spec: StudySpec, scale: str, best_params: dict[str, float], workers: int, progress: bool,
                c: "MlflowClient", exp_id: str) -> dict[str, Any]:
    """Run the best and the default config on the re-evaluation seeds as Ray tasks (child
    runs of experiment ``study:NAME`` tagged ``reevaluation``; FINISHED ones with the same config
    hash are skipped), then compare them (:func:`harness.reporting.summary.metric_stats`; Welch's interval and
    p-value of the difference, :func:`harness.analysis.stats.welch`)."""
    from harness.infra import tracking
    from harness.experiments import engine
    from harness.experiments.display import RunDisplay
    from harness.experiments.ablate import RunTask, _build_pipelines, prepare_tasks, resume_state, run_hash, run_tasks

    name = spec.name or ""
    seeds = spec.reevaluation.seed_list()
    arms = {"best": best_params, "default": None}
    tasks = []
    for arm, params in arms.items():
        for s in seeds:
            cfg = resolve_trial_config(spec, scale, params, s)
            tasks.append(RunTask(ablation=name, scale=scale, variant=arm, seed=s, config=cfg.to_dict(),
                                 config_hash=run_hash(cfg), total_iterations=cfg.ppo.total_iterations))
    state = resume_state(c, exp_id, tasks)
    todo = [t for t in tasks if t.key not in state.finished and t.key not in state.running]
    if todo:
        sha = tracking.git_sha()
        parent = c.create_run(exp_id, run_name=f"{name}-{scale}-reevaluation-{time.strftime('%Y%m%d-%H%M%S')}", tags={
            "kind": "parent", "role": "reevaluation", "reevaluation": "true", "study": name, "scale": scale,
            "git_sha": sha, **tracking.owner_tags()})
        _build_pipelines(todo)
        out_root = tracking.results_root() / "sweeps" / name / scale / "reevaluation"
        prepare_tasks(todo, exp_id, parent.info.run_id, tracking.tracking_uri(), out_root, sha)
        try:
            engine.connect(workers)
            display = RunDisplay(f"{name} re-evaluation", scale, todo, skipped=len(tasks) - len(todo), enabled=progress)
            with display:
                run_tasks(todo, workers, display)
            c.set_terminated(parent.info.run_id, "FINISHED")
        except BaseException as e:
            tracking.fail_run(c, parent.info.run_id, one_line(e),
                              status="KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
            raise
        state = resume_state(c, exp_id, tasks)
    runs: dict[str, dict[int, Any]] = {a: {} for a in arms}
    for t in tasks:
        rid = state.finished.get(t.key)
        if rid is None:
            continue
        run = c.get_run(rid)
        if run.data.tags.get("reevaluation") != "true":
            c.set_tag(rid, "reevaluation", "true")
            c.set_tag(rid, "role", "reevaluation")
        runs[t.variant][t.seed] = run
    out = _compare_arms(spec, scale, seeds, best_params, runs)
    out["sft"] = _sft_values(c, list(runs["default"].values()), [m for m, _ in _REEVAL_METRICS])
    out["samples"] = _worst_samples(runs)
    out["failed"] = [{"variant": t.variant, "seed": t.seed} for t in tasks if t.key not in state.finished]
    return out


def _compare_arms(spec: StudySpec, scale: str, seeds: list[int], best_params: dict[str, float],
                  runs: dict[str, dict[int, Any]]) -> dict[str, Any]:
    """The re-evaluation's summary from the finished runs of each arm by seed: each arm's params and runs, per
    metric the two arms' statistics and Welch's difference, and the verdict (:func:`reevaluation_verdict`)."""
    from harness.analysis import stats
    from harness.reporting.summary import metric_stats

    arms = ("best", "default")
    metrics = _REEVAL_METRICS
    out: dict[str, Any] = {"seeds": seeds, "sweep_seeds": spec.seeds_for(scale), "primary": spec.objective_metrics,
                           "arms": {}, "comparison": {}}
    for arm in arms:
        out["arms"][arm] = {
            "params": best_params if arm == "best" else {k: _get_path(resolve_trial_config(spec, scale, None, 0).to_dict(), SEARCHABLE[k].path)
                                                         for k in spec.search_space},
            "run_ids": {str(s): r.info.run_id for s, r in sorted(runs[arm].items())},
            "seeds_finished": sorted(runs[arm]),
        }
    for m, goal in metrics:
        vals = {a: [float(r.data.metrics[m]) for _, r in sorted(runs[a].items()) if m in r.data.metrics] for a in arms}
        if goal == "none" and not (vals["best"] or vals["default"]):
            continue  # a diagnostic this task's evaluation does not log
        st_default = metric_stats(vals["default"], None, goal)
        st_best = metric_stats(vals["best"], vals["default"], goal)
        try:
            w = stats.welch(vals["best"], vals["default"])
            (lo, hi), p_welch = w.ci(0.95), w.p()
        except ValueError:  # fewer than 2 finished seeds in an arm
            lo = hi = p_welch = float("nan")
        out["comparison"][m] = {"goal": goal, "best": st_best, "default": st_default,
                                "diff_mean": (st_best["mean"] - st_default["mean"]) if vals["best"] and vals["default"] else None,
                                "diff_ci_low": lo, "diff_ci_high": hi, "p_welch": p_welch,
                                "p_best_better": st_best["p_improvement"]}
    out["per_seed"], out["standing"] = _standing(spec, runs)
    out["verdict"] = reevaluation_verdict(spec, *_values_and_draws(runs, spec.objective_metrics[0]))
    out["constraint_verdicts"] = [constraint_verdict(spec, con, *_values_and_draws(runs, con.metric))
                                  for con in spec.constraints]
    return out


def _standing(spec: StudySpec, runs: dict[str, dict[int, Any]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Each re-evaluation seed's final values of both arms, and per arm how many of its seeds degenerated: the
    evaluation's flag (``eval_final/degenerate``: final responses of ≤ 2 tokens on average, or distinct-2 below the
    task's floor, :mod:`harness.rl.evaluation`) and, per constrained metric, the seeds below the study's floor. A mean
    can keep a floor while some seeds loop; a reader sees those seeds here.

    Returns:
        ``([{"seed", "best": {metric: value}, "default": {metric: value}}], {arm: {"n", "degenerate", "below":
        {metric: {"floor", "count"}}}})`` over the objective's metric, distinct-2, the degenerate flag and the
        constrained metrics, each a run logged; seeds in order.
    """
    from harness.rl.evaluation import DEGENERATE

    flag = f"eval_final/{DEGENERATE}"
    shown = list(dict.fromkeys([spec.objective_metrics[0], "eval_final/distinct_2", flag,
                                *(c.metric for c in spec.constraints)]))
    per_seed = [{"seed": seed, **{a: {m: float(runs[a][seed].data.metrics[m]) for m in shown
                                      if seed in runs[a] and m in runs[a][seed].data.metrics} for a in ("best", "default")}}
                for seed in sorted(set(runs["best"]) | set(runs["default"]))]
    standing = {}
    for arm in ("best", "default"):
        finals = [runs[arm][seed].data.metrics for seed in sorted(runs[arm])]
        standing[arm] = {"n": len(finals), "degenerate": sum(bool(m.get(flag)) for m in finals),
                         "below": {c.metric: {"floor": c.min, "count": sum(m[c.metric] < c.min for m in finals if c.metric in m)}
                                   for c in spec.constraints}}
    return per_seed, standing


def _worst_samples(runs: dict[str, dict[int, Any]], k: int = 3) -> list[dict[str, Any]]:
    """Per arm, the end-of-training sample completions of its seed with the lowest final distinct-2 (its most
    repetitive run; the lowest seed when none logged it): ``[{"variant", "seed", "distinct_2", "iteration",
    "samples"}]`` (:func:`harness.reporting.ablation.last_samples`)."""
    from harness.reporting.ablation import last_samples

    out = []
    for arm in ("best", "default"):
        if not runs[arm]:
            continue
        seed = min(runs[arm], key=lambda s: (runs[arm][s].data.metrics.get("eval_final/distinct_2", float("inf")), s))
        run = runs[arm][seed]
        iteration, samples = last_samples(run.info.run_id, run.info.artifact_uri, k)
        out.append({"variant": arm, "seed": seed, "distinct_2": run.data.metrics.get("eval_final/distinct_2"),
                    "iteration": iteration, "samples": samples})
    return out


def _values_and_draws(runs: dict[str, dict[int, Any]], metric: str) -> tuple[list[float], list[float], list[str], list[str]]:
    """``(best values, default values, best draws, default draws)`` of ``metric`` over each arm's finished runs in seed
    order, each value with its run's pipeline draw (tag ``replicate``); a run without the metric is left out."""
    pairs = {a: [(float(r.data.metrics[metric]), r.data.tags.get("replicate", "0")) for _, r in sorted(runs[a].items())
                 if metric in r.data.metrics] for a in ("best", "default")}
    return ([v for v, _ in pairs["best"]], [v for v, _ in pairs["default"]],
            [d for _, d in pairs["best"]], [d for _, d in pairs["default"]])


#: The re-evaluation's metrics and their goals: the objectives, then length and GRUE's naturalness (distinct-2, rep-2,
#: MSTTR) as diagnostics with no better direction, as in every ablation report; a metric a task does not log is left out.
_REEVAL_METRICS: list[tuple[str, str]] = [
    ("eval_final/gold", "max"), ("eval_final/proxy", "max"), ("eval_final/kl", "min"), ("eval_final/length", "none"),
    ("eval_final/distinct_2", "none"), ("eval_final/rep_2", "none"), ("eval_final/msttr", "none")]


def _sft_values(c: "MlflowClient", runs: list[Any], metrics: list[str]) -> dict[str, dict[str, float]]:
    """The SFT policy's held-out values: each run's evaluation at iteration 0 (before any update) of ``eval/<name>``
    for each ``eval_final/<name>`` in ``metrics``, averaged over ``runs`` (one per pipeline draw): ``{metric: {mean,
    n}}``; a metric no run logged at iteration 0 is left out."""
    out: dict[str, dict[str, float]] = {}
    for m in metrics:
        name = held_out_metric(m)
        vals = []
        for r in runs:
            with contextlib.suppress(Exception):
                first = [x.value for x in c.get_metric_history(r.info.run_id, name) if x.step == 0]
                if first:
                    vals.append(float(first[0]))
        if vals:
            out[m] = {"mean": sum(vals) / len(vals), "n": len(vals)}
    return out


def constraint_verdict(spec: StudySpec, con: Any, best: Sequence[float], default: Sequence[float],
                       best_draws: Optional[Sequence[Any]] = None,
                       default_draws: Optional[Sequence[Any]] = None) -> dict[str, Any]:
    """Does the selected configuration keep a constrained metric on fresh seeds? Stated as a non-inferiority claim,
    ``default − best < con.margin`` (``expect: not_greater`` with ``a = default``, ``b = best``: the best configuration
    is lower than the default by less than the margin), judged like :func:`reevaluation_verdict` by the ablations' rule.
    ``reproduced``: non-inferiority shown; ``contradicted``: the best configuration is lower by more than the margin.

    Args:
        spec: the study; con: one of ``spec.constraints`` (its ``metric`` and ``margin``, in the metric's units).
        best, default: one final value per finished re-evaluation seed; ``*_draws``: their pipeline draws, or None.
    Returns:
        the judged row (:func:`harness.analysis.verdicts.judge_claims`), with ``floor`` (``con.min``) added.
    Raises:
        ValueError: draw labels not aligned with the values.
    """
    from harness.experiments.spec import Claim

    claim = Claim(
        claim=f"The study's best configuration keeps {con.metric} within {con.margin:g} of the default configuration's "
              f"on fresh seeds.",
        kind="finding", source=f"this study ({spec.name}: its constraint {con.metric} ≥ {con.min:g} on the sweep's seeds)",
        section="the best feasible trial, re-run with the default on the re-evaluation seeds",
        setting_note="The sweep's seeds chose a configuration that kept the floor; only the fresh seeds are judged.",
        metric=con.metric, a="default", expect="not_greater", b="best", margin=con.margin)
    return {**_judge(claim, default, best, default_draws, best_draws), "floor": con.min}


def reevaluation_verdict(spec: StudySpec, best: Sequence[float], default: Sequence[float],
                         best_draws: Optional[Sequence[Any]] = None,
                         default_draws: Optional[Sequence[Any]] = None) -> dict[str, Any]:
    """The verdict on the study's selection: does the best configuration beat the default one on the re-evaluation
    seeds (none seen by the trials), in the study's first objective metric, by the project's rule?

    The selection is stated as a directional claim ``best − default > 0`` (``< 0`` for a metric to minimise) with
    margin ``spec.reevaluation.margin`` and judged by :func:`harness.analysis.verdicts.judge_claims` under
    :data:`REEVALUATION_RULE`, the default :class:`harness.experiments.spec.VerdictRule` (α 0.05, at least 10 seeds per arm, a one-sided margin test at 0.01):
    a two-sided Welch test over seeds, or, when the values carry their pipeline draws and both arms ran on at least
    two of them, the t test of the per-draw differences (:func:`harness.analysis.verdicts.compare`), so that the between-draw
    variation enters the verdict as in the ablation reports. ``reproduced``: the best configuration's advantage
    holds on fresh seeds; ``contradicted``: the default is better; ``below margin``: any advantage is smaller than
    the margin; ``inconclusive`` otherwise.

    Args:
        spec: the study (its objective and ``reevaluation.margin``).
        best, default: one final value of the metric per finished re-evaluation seed (metric units).
        best_draws, default_draws: the pipeline draw of each value (tag ``replicate``), or None.
    Returns:
        the judged row (:func:`harness.analysis.verdicts.judge_claims`: ``verdict``, ``diff``, ``ci_low``, ``ci_high``,
        ``p_raw``, ``mde``, ``evidence``, ``caveats``, …).
    Raises:
        ValueError: draw labels not aligned with the values.
    """
    from harness.experiments.spec import Claim

    metric, direction = OBJECTIVES[spec.objective][0]
    params = ", ".join(spec.search_space)
    claim = Claim(
        claim=f"The study's best configuration of {params} gives a {'higher' if direction == 'maximize' else 'lower'} "
              f"{metric} than the default configuration on fresh seeds.",
        kind="finding", source=f"this study ({spec.name}: Optuna {spec.sampler.type} over {params})",
        section="the best trial, re-run with the default on the re-evaluation seeds",
        setting_note="The best trial was selected on the sweep's seeds, whose values are biased upward by the "
                     "selection; only the fresh seeds' values are judged.",
        metric=metric, a="best", expect="greater" if direction == "maximize" else "less", b="default",
        margin=spec.reevaluation.margin)
    return _judge(claim, best, default, best_draws, default_draws)


def _judge(claim: Any, a: Sequence[float], b: Sequence[float], a_draws: Optional[Sequence[Any]],
           b_draws: Optional[Sequence[Any]]) -> dict[str, Any]:
    """``claim`` judged by :data:`REEVALUATION_RULE` on arm ``a``'s and ``b``'s values: on the per-draw differences where
    both carry their draws, else by Welch's test over seeds (:func:`harness.analysis.verdicts.judge_claims`)."""
    from harness.analysis.verdicts import judge_claims

    with_draws = a_draws is not None and b_draws is not None
    [row] = judge_claims([claim], [(a, b, a_draws, b_draws) if with_draws else (a, b)], REEVALUATION_RULE)
    return row


def _get_path(d: dict[str, Any], dotted: str) -> Any:
    node: Any = d
    for part in dotted.split("."):
        node = node[part]
    return node


__all__ = ["REEVALUATION_RULE", "reevaluation_verdict", "constraint_verdict"]
