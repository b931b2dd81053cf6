"""``harness ablate NAME --seeds auto``: seeds added in stages until every claim is decided or the cap.

Stage ``k`` brings every arm that an undecided claim still needs to ``k·stage`` seeds (the spec's
``verdict.stage`` and ``verdict.cap``, or ``--stage`` / ``--max-seeds``); after each stage the claims are
judged by the group-sequential rule (:func:`harness.reporting.summary.sequential_rows`, :mod:`harness.analysis.sequential`).
A decided claim stops; an arm runs further only while a claim that compares it is undecided.

Everything the rule needs is read back from MLflow (which runs FINISHED), and a look's decision depends
only on the first ``n`` seeds of each arm, so an interrupted ablation, re-run, recomputes the same path
and continues at the stage where it stopped; finished runs are never trained again (:mod:`harness.experiments.ablate`).
Before the first run the plan is printed: the stages, the worst-case number of runs and, from each variant's
median training time among finished runs at this scale in the store (else the ablation's, else the task's typical
run) and the pipeline draws this machine has still to build, an estimate of the time.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Optional

from harness.errors import HarnessError

#: The parent-run tag that marks an invocation of the staged procedure (the report reads it).
MODE_TAG = "seeds_mode"


def _finished_runs_filter(scale: str, task: Optional[str], iterations: Optional[int]) -> str:
    """The MLflow filter of FINISHED child runs at ``scale`` of task ``task`` with ``iterations`` PPO iterations
    (either None: any)."""
    flt = f"tags.kind = 'child' and tags.scale = '{scale}' and attributes.status = 'FINISHED'"
    if task is not None:
        flt += f" and params.`task.name` = '{task}'"
    if iterations is not None:
        flt += f" and params.`ppo.total_iterations` = '{int(iterations)}'"
    return flt


def _run_times(c: Any, exps: list[str], flt: str) -> list[tuple[Optional[str], float]]:
    """``(variant tag, seconds)`` of the newest 500 runs of experiments ``exps`` that match ``flt`` and record a
    ``wall_time_s``: the training time, ``wall_time_s`` less ``pipeline_build_s`` (the time a worker spent building a
    pipeline draw)."""
    runs = c.search_runs(exps, filter_string=flt, max_results=500, order_by=["attributes.start_time DESC"]) if exps else []
    return [(r.data.tags.get("variant"), r.data.metrics["wall_time_s"] - r.data.metrics.get("pipeline_build_s", 0.0))
            for r in runs if "wall_time_s" in r.data.metrics]


def median_run_seconds(c: Any, exp_id: str, scale: str, task: Optional[str] = None,
                       iterations: Optional[int] = None) -> Optional[float]:
    """Median training time of FINISHED child runs at ``scale`` (``wall_time_s`` less ``pipeline_build_s``, the time
    a worker spent building a pipeline draw) of task ``task`` with ``iterations`` PPO iterations (either None: any):
    this ablation's, else any ablation's in the store (the newest 500 read); None when there are none. Runs of
    another length (an older default) or another task would mislead the plan."""
    flt = _finished_runs_filter(scale, task, iterations)
    own = _run_times(c, [exp_id], flt)
    if own:
        return float(statistics.median(t for _, t in own))
    others = [e.experiment_id for e in c.search_experiments() if e.name.startswith("ablation/")]
    times = _run_times(c, others, flt)
    return float(statistics.median(t for _, t in times)) if times else None


def variant_run_seconds(c: Any, exp_id: str, scale: str, variants: list[str], task: Optional[str] = None,
                        iterations: Optional[int] = None) -> Optional[dict[str, float]]:
    """Each variant's typical training time in seconds: the median of this ablation's FINISHED runs of that variant (read as
    :func:`median_run_seconds` reads them), else :func:`median_run_seconds`'s; None when the store has no run to go
    by. Arms can differ several-fold (a critic doubles a run; dynamic sampling draws more), so the plan and the
    budget weigh each run by its own variant's time."""
    own = _run_times(c, [exp_id], _finished_runs_filter(scale, task, iterations))
    overall = float(statistics.median(t for _, t in own)) if own else median_run_seconds(c, exp_id, scale, task, iterations)
    if overall is None:
        return None
    times: dict[str, list[float]] = {}
    for v, t in own:
        if v in variants:
            times.setdefault(v, []).append(t)
    return {v: float(statistics.median(times[v])) if v in times else overall for v in variants}


def _baseline_config(spec: Any, scale: str) -> Any:
    """The spec's baseline config at seed 0 at ``scale`` (what the plan's estimates read: task, pipeline draws,
    iterations); None when it does not resolve there."""
    from harness.experiments.spec import resolve_config

    try:
        return resolve_config(spec, scale, spec.baseline, 0)
    except (HarnessError, ValueError):
        return None


def draws_to_build(spec: Any, scale: str, counts: list[int],
                   training: Optional[list[set[int]]] = None) -> list[tuple[int, int]]:
    """For each ``n`` of ``counts`` (seeds ``0..n−1``): ``(draws, new)``, how many pipeline draws those seeds use
    (``seed mod pipeline.replicates``) and how many of them this machine has not built (:func:`draw_built`).
    ``training``, when given, holds for each ``n`` the seeds whose runs are still to train: only their draws can
    need building (a finished run needs none). Runs recorded in the store do not count as built: a store restored
    from the reports' archive holds runs whose draws were built on another machine. A draw whose summary another
    regime of the task wrote last (another :func:`harness.pipeline.draw_key`) counts as not built, though some of its
    stages may be cached: the plan errs towards building. With one draw nothing is counted (the driver builds it
    before any run).

    Example: replicates 40, draws 0–4 built here, counts [10, 40] → ``[(10, 5), (40, 35)]``; with ``training``
    ``[{3, 7}, {3, 7, 13}]`` → ``[(10, 1), (40, 2)]``."""
    cfg = _baseline_config(spec, scale)
    if cfg is None:
        return [(0, 0) for _ in counts]
    wanted = [{s % cfg.pipeline.replicates for s in range(n)} for n in counts]
    needed = wanted if training is None else [{s % cfg.pipeline.replicates for s in seeds} for seeds in training]
    from harness.pipeline import draw_key

    built = {r for r in set().union(*needed) if draw_built(Path(cfg.pipeline.out_dir), r, draw_key(cfg, r))}
    return [(len(d), len(need - built) if len(d) > 1 else 0) for d, need in zip(wanted, needed)]


def draw_built(out_dir: Path, replicate: int, key: Optional[str] = None) -> bool:
    """Whether pipeline draw ``replicate`` was built under ``out_dir`` on this machine: the summary that
    :func:`harness.pipeline.build_pipeline` writes last (``summary.json`` for draw 0, ``summary-draw<r>.json``
    otherwise) exists and names every stage's directory, each still present. With ``key``
    (:func:`harness.pipeline.draw_key` of the draw wanted), a summary written for another draw key (another regime of
    the task, sharing ``out_dir``) does not count; a summary from before draw keys were written is judged by its
    directories alone. An unreadable summary counts as not built. Raises nothing."""
    import json

    path = out_dir / ("summary.json" if replicate == 0 else f"summary-draw{replicate}.json")
    try:
        summary = json.loads(path.read_text())
        if key is not None and summary.get("draw_key", key) != key:
            return False
        return all(Path(rec["dir"]).is_dir() for rec in summary["stages"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _task_seconds(spec: Any, scale: str, key: str) -> Optional[float]:
    """The task meta ``key`` of the spec's task (a number, or ``{scale: number}``) at ``scale``; None when the task
    declares none or the spec's config cannot be resolved."""
    from harness.tasks import TASKS

    cfg = _baseline_config(spec, scale)
    if cfg is None:
        return None
    value = TASKS.meta(cfg.task.name).get(key)
    if isinstance(value, dict):
        value = value.get(scale)
    return float(value) if value is not None else None


def draw_seconds(spec: Any, scale: str) -> Optional[float]:
    """The task's typical time to build one pipeline draw on one core (its ``draw_seconds`` meta), None when it
    declares none."""
    return _task_seconds(spec, scale, "draw_seconds")


def typical_run_seconds(spec: Any, scale: str) -> Optional[float]:
    """The task's typical wall time of one run at ``scale`` (its ``run_seconds`` meta), None when it declares none
    or the spec's config cannot be resolved."""
    return _task_seconds(spec, scale, "run_seconds")


def plan_text(name: str, scale: str, sizes: list[int], n_variants: int, n_claims: int, workers: int,
              per_run_s: Optional[float], typical_s: Optional[float] = None,
              draws: Optional[tuple[int, int, int, int]] = None, draw_s: Optional[float] = None,
              by_variant: bool = False, first_to_train: Optional[int] = None, at: Optional[int] = None,
              worst_to_train: Optional[int] = None, aside: int = 0, not_copied: int = 0) -> str:
    """The plan printed before the first run: looks, worst-case runs and time (from ``per_run_s``, the median of
    finished runs in the store, else from ``typical_s``, the task's typical run time). ``draws``: ``(first, first_new,
    worst, worst_new)`` pipeline draws the first stage and the worst case use and how many of them look unbuilt
    (:func:`draws_to_build`); with ``draw_s`` (seconds per draw on one core) their build time is added. ``by_variant``:
    ``per_run_s`` is the mean of the variants' own medians (:func:`variant_run_seconds`), and the text says so.
    ``first_to_train``: how many of the first stage's runs are neither finished here nor found to copy in (the rest
    cost no training, so the first stage's time counts only these). ``at``: the look an interrupted or paused
    ablation resumes at (seeds per arm; None or ``sizes[0]``: the first), whose stage the text then prices in place
    of the first, with ``first_to_train`` and ``draws[:2]`` counting that stage. ``worst_to_train``: how many of
    the worst case's runs are still to train (default: all); its time counts only these. ``aside``: how many of the
    runs to train finished on another build of the pipeline than the one cached here (said, to be trained again);
    ``not_copied``: how many are runs of another ablation of the same config, of another build, that are trained here
    instead of copied in (said)."""
    worst = n_variants * sizes[-1]
    resumed = at is not None and at != sizes[0]
    first = n_variants * (at if resumed else sizes[0])
    label = f"stage up to the look at {at} seeds per arm" if resumed else "first stage"
    k = first if first_to_train is None else min(first_to_train, first)
    wk = worst if worst_to_train is None else min(worst_to_train, worst)
    if k == 0:  # nothing to train before the look: no time estimate for it, only what an undecided look would add
        t = per_run_s if per_run_s is not None else typical_s
        est = f"; nothing to train before the {label}'s look (its runs are finished or copied in)" + (
            f"; should it leave claims undecided, at most {wk} runs more" + (f" (~{wk * t / 3600:.1f} CPU-hours)" if t else "")
            if wk else "")
    elif per_run_s is not None or typical_s is not None:
        t = per_run_s if per_run_s is not None else typical_s
        basis = ("the variants' median run times, on average" if by_variant else "the median") if per_run_s is not None \
            else "the task's typical"
        extra_first = extra_worst = 0.0
        if draws and draw_s:
            extra_first, extra_worst = draws[1] * draw_s, draws[3] * draw_s
        hours = (wk * t + extra_worst) / workers / 3600
        est = (f"; at {basis} {t:.0f} s a run and {workers} at once: {label} ~{(k * t + extra_first) / workers / 60:.0f} "
               f"min, worst case ~{hours:.1f} h ({(wk * t + extra_worst) / 3600:.1f} CPU-hours)")
        if draws and draws[2] > 1:
            stage_draws = f"the {draws[0]} pipeline draws up to that look" if resumed else \
                f"the first stage's {draws[0]} pipeline draws"
            est += (f", with {draws[1]} of {stage_draws} and {draws[3]} of the worst case's "
                    f"{draws[2]} to build" + (f" (~{draw_s:.0f} s of one core each)" if draw_s else ""))
        elif per_run_s is None:
            est += ", plus the pipeline stages not yet built"
    else:
        est = "; no finished run at this scale in the store to estimate the time from"
    worst_note = f" ({wk} still to train)" if wk < worst else ""
    aside_note = (f"; {aside} of the runs to train finished on another build of the pipeline than the stages cached "
                  f"here and are trained again (`harness build-check {name}`)") if aside else ""
    if not_copied:
        aside_note += (f"; {not_copied} of the runs to train have a run of the same config in another ablation, of "
                       "another build than the stages cached here: trained here, not copied in (a seed's arms are "
                       "compared on one build)")
    return (f"{name} ({scale}), --seeds auto: {n_claims} claim(s), looks at {sizes} seeds per arm; "
            f"{first} runs in the {label}{_to_train_note(first, k)}, at most {worst} runs in all{worst_note}{est}"
            f"{aside_note}")


def _to_train_note(first: int, k: int) -> str:
    """How many of a stage's ``first`` runs are still to train (``k``), when that is fewer."""
    if k >= first:
        return ""
    return f" ({k} of them to train; the other {first - k} finished here or found to copy in)"


def staged_design(rule: Any, stage: Optional[int] = None, cap: Optional[int] = None,
                  max_cpu_hours: Optional[float] = None, pause_at: Optional[int] = None) -> tuple[int, int, list[int]]:
    """The design ``--seeds auto`` runs under a spec's verdict rule ``rule`` (``VerdictRule``) and the staged options
    as given (None: not given): ``(stage, cap, seeds per arm at each look)``. An option given means what it says; none
    of them is ever read as "the default" because it is 0. The driver and its dry run both call this, so they accept,
    refuse and plan alike.

    Example: the default rule (stage 10, cap 40, min_seeds 10) with nothing given → ``(10, 40, [10, 20, 30, 40])``;
    ``stage=15, cap=30`` → ``(15, 30, [15, 30])``.

    Raises:
        HarnessError: one line naming the option and the values it allows: ``--stage`` not in 2..cap, ``--max-seeds``
            below the rule's ``min_seeds`` or below the stage, ``--max-cpu-hours`` not > 0, ``--pause-at`` below the
            first look's seeds or above the cap.
    """
    from harness.analysis import sequential

    stage = rule.stage if stage is None else stage
    cap = rule.cap if cap is None else cap
    if cap < rule.min_seeds:
        raise HarnessError(f"--max-seeds: must be at least the spec's min_seeds ({rule.min_seeds}), got {cap}")
    if not 2 <= stage <= cap:
        raise HarnessError(f"--stage: must be an integer from 2 to the cap ({cap}), got {stage}")
    if max_cpu_hours is not None and not max_cpu_hours > 0:
        raise HarnessError(f"--max-cpu-hours: must be > 0, got {max_cpu_hours}")
    sizes = sequential.stage_sizes(stage, cap)
    if pause_at is not None and not sizes[0] <= pause_at <= cap:
        raise HarnessError(f"--pause-at: must be from the first look's seeds per arm ({sizes[0]}) to the cap ({cap}; "
                           f"looks at {sizes}), got {pause_at}")
    return stage, cap, sizes


def run_staged(name: str, scale: str = "default", workers: int = 2, progress: bool = True, reuse: bool = True,
               address: Optional[str] = None, stage: Optional[int] = None, cap: Optional[int] = None,
               max_cpu_hours: Optional[float] = None, raise_on_failure: bool = False,
               pause_at: Optional[int] = None) -> Path:
    """Run ablation ``name`` at ``scale`` in stages (module docstring), writing its report after every stage.

    Args:
        stage, cap: seeds per arm per stage and at most (default: the spec's ``verdict.stage`` / ``cap``).
        max_cpu_hours: stop before a stage whose runs still to train (each by its variant's median run time,
            :func:`variant_run_seconds`) would take the CPU-hours spent (the summed wall time of the ablation's finished runs at this scale) past this bound.
        pause_at: stop after the look at this many seeds per arm (at least the first stage's). The design (the
            looks up to ``cap`` and their boundaries) is unchanged, so a later invocation without it goes on from
            the next look as if there had been no pause: e.g. the first look of several ablations before any second.
        progress, reuse, address, raise_on_failure: as for :func:`harness.experiments.ablate.run_ablation`; the plan and one
            line per stage go to stderr unless ``progress`` is off.
    Returns:
        the path of the report.
    Raises:
        HarnessError: a bad stage or cap (one line), or any error of :func:`harness.experiments.ablate.run_ablation`.
        RunsFailedError: only with ``raise_on_failure``, after the report is written, if a run FAILED.
    """
    from rich.console import Console

    from harness.analysis import sequential
    from harness.experiments.ablate import _archive_quietly, _invoke, load_spec, open_ablation, plan_runs, raise_failed
    from harness.config.presets import scale_overrides
    from harness.reporting.ablation import write_report

    scale_overrides(scale)
    spec = load_spec(name)
    rule = spec.verdict
    stage, cap, sizes = staged_design(rule, stage, cap, max_cpu_hours, pause_at)
    claims = spec.claims_for(scale)
    console = Console(stderr=True, quiet=not progress, soft_wrap=True)

    def echo(line: str) -> None:
        console.print(line, soft_wrap=True, markup=False, highlight=False)

    tags = {MODE_TAG: "auto", "stage": str(stage), "cap": str(cap)}
    failed: list[dict[str, Any]] = []
    report: Optional[Path] = None
    planned = {t.config_hash for t in plan_runs(spec, scale, list(range(sizes[-1])))}  # every look's, up to the cap
    with open_ablation(name, address, planned) as (c, uri, exp_id):
        base = _baseline_config(spec, scale)  # the runs whose times predict this ablation's: same task and length
        like = {"task": base.task.name, "iterations": base.ppo.total_iterations} if base is not None else {}
        for i, n in enumerate(sizes):
            need = _arms_still_needed(name, scale, claims, rule.alpha, stage, cap, rule.margin_alpha)
            if i == 0:  # the plan is priced only where a stage may run (e.g. not on runs restored from the archive)
                echo(_plan(c, exp_id, spec, name, scale, sizes, claims, workers, like, reuse) if need
                     else decided_plan_text(name, scale, sizes, len(claims)))
            if not need:
                if i:
                    echo(_all_decided_line(sizes[:i]))
                break
            tasks = [t for t in plan_runs(spec, scale, list(range(n))) if t.variant in need]
            stop = _stop_before(c, exp_id, scale, n, tasks, reuse, pause_at, max_cpu_hours, like)
            if stop:
                echo(stop)
                break
            echo(f"stage: {n} seeds per arm for {', '.join(sorted(need))}")
            failed += _invoke(c, uri, exp_id, spec, name, scale, tasks, workers, progress, console, reuse, address,
                              {**tags, "look_seeds": str(n)})
            report = write_report(name, scale=scale)  # the report after every look: hours of runs are readable as they come
            _archive_quietly(c, exp_id, name)  # the look's invocation, ended, joins its runs in the archive
            echo(f"report after the look at {n} seeds per arm: {report}")
    if report is None:  # no stage ran: every claim decided, or stopped before the first
        report = write_report(name, scale=scale)
    if failed and raise_on_failure:
        raise_failed(failed, report)
    return report


def decided_plan_text(name: str, scale: str, sizes: list[int], n_claims: int) -> str:
    """The plan line when the runs already recorded decide every claim (finished here, or restored from the archive
    on a new machine): the design, and that nothing is trained; no time estimate, since no stage runs."""
    return f"{name} ({scale}), --seeds auto: {n_claims} claim(s), looks at {sizes} seeds per arm; {_all_decided_line([])}"


def _all_decided_line(looks_done: list[int]) -> str:
    """What the driver says when no claim needs another stage: decided at the last look this invocation ran, or, when
    it ran none, on the runs already recorded (finished or restored from the archive at an earlier invocation)."""
    if looks_done:
        return f"every claim is decided at the look at {looks_done[-1]} seeds per arm"
    return "every claim is decided on the runs already recorded: no stage to run"


def _arms_still_needed(name: str, scale: str, claims: list[Any], alpha: float, stage: int, cap: int,
                       margin_alpha: float = 0.0) -> set[str]:
    """The arms of the claims the rule (``margin_alpha``: its margin tests' part of ``alpha``) has not decided on the
    runs recorded so far."""
    from harness.reporting.runs import load_runs
    from harness.reporting.summary import sequential_rows

    try:  # the held-out curves are all the rule reads beyond run-level metrics (matched-KL readouts)
        rs = load_runs(name, scale, history_prefixes=("eval/",))
    except HarnessError:  # nothing recorded yet
        return {arm for c in claims for arm in (c.a, c.b)}
    rows = sequential_rows(rs, claims, alpha, stage, cap, margin_alpha)
    return {arm for c, r in zip(claims, rows) if not r["decided"] for arm in (c.a, c.b)}


def _plan(c: Any, exp_id: str, spec: Any, name: str, scale: str, sizes: list[int], claims: list[Any], workers: int,
          like: dict[str, Any], reuse: bool = True) -> str:
    """:func:`plan_text` for ablation ``name`` from the store, over the arms its ``claims`` compare (the only ones a
    stage runs): each arm timed by its own runs (:func:`variant_run_seconds`; every arm runs the same seeds, so the
    mean of their times prices a run), the first stage's runs still to train (:func:`_to_train`), and the pipeline
    draws this machine has still to build. An ablation whose first looks' runs are all finished (paused, or
    restored from its archive) is priced from the first look that still has runs to train, and only the draws of
    the seeds still to train count (:func:`draws_to_build`'s ``training``). Finished runs of another build than the
    one this machine has cached (:func:`_to_train`) count in that stage as runs to train, as the driver trains them
    again there."""
    from harness.experiments.plan import plan_runs

    arms = spec.claim_arms_for(scale)
    by_variant = variant_run_seconds(c, exp_id, scale, arms, **like)
    per_run = statistics.mean(by_variant.values()) if by_variant else None
    tasks = [t for t in plan_runs(spec, scale, list(range(sizes[-1]))) if t.variant in arms]
    todo, aside, refused = _to_train(c, exp_id, tasks, reuse)

    def trains(n: int) -> bool:  # as the driver decides at the look at n (harness.experiments.plan.accept_for_training)
        return any(t.seed < n and t.key not in aside | refused for t in todo)

    # the driver trains again the runs of another build only beside arms of their seed it must train anyway: the
    # first stage with runs to train, with them, is the one to price
    at = next((n for n in sizes if trains(n)), sizes[0])
    stage_todo = [t for t in todo if t.seed < at]
    (first, first_new), (worst, worst_new) = draws_to_build(spec, scale, [at, sizes[-1]],
                                                            [{t.seed for t in stage_todo}, {t.seed for t in todo}])
    return plan_text(name, scale, sizes, len(arms), len(claims), workers, per_run, typical_run_seconds(spec, scale),
                     (first, first_new, worst, worst_new), draw_seconds(spec, scale),
                     by_variant=bool(by_variant) and len(set(by_variant.values())) > 1,
                     first_to_train=len(stage_todo), at=at, worst_to_train=len(todo),
                     aside=sum(t.key in aside for t in stage_todo), not_copied=sum(t.key in refused for t in stage_todo))


def _stop_before(c: Any, exp_id: str, scale: str, n: int, tasks: list[Any], reuse: bool, pause_at: Optional[int],
                 max_cpu_hours: Optional[float], like: dict[str, Any]) -> Optional[str]:
    """Why :func:`run_staged` stops before the look at ``n`` seeds per arm (whose runs are ``tasks``): past
    ``pause_at``, or the runs still to train would take the CPU-hours spent past ``max_cpu_hours`` (each by its
    variant's typical time, :func:`variant_run_seconds`, among runs of ``like``: task and iterations); None to go ahead."""
    if pause_at is not None and n > pause_at:
        return f"pausing before the look at {n} seeds per arm (--pause-at {pause_at}); run again without it to go on from there"
    if max_cpu_hours is None:
        return None
    spent = _cpu_hours(c, exp_id, scale)
    by_variant = variant_run_seconds(c, exp_id, scale, sorted({t.variant for t in tasks}), **like)
    if by_variant is None:
        return None
    add = sum(by_variant[t.variant] for t in _to_train(c, exp_id, tasks, reuse)[0]) / 3600
    if spent + add > max_cpu_hours:
        return (f"stopping before the look at {n} seeds per arm: {spent:.2f} CPU-hours spent, the stage could add "
                f"{add:.2f}, over --max-cpu-hours {max_cpu_hours}")
    return None


def _to_train(c: Any, exp_id: str, tasks: list[Any], reuse: bool) -> tuple[list[Any], set[str], set[str]]:
    """The ``tasks`` a stage would train: not FINISHED here and (with ``reuse``) not to be copied in from another
    ablation (:func:`harness.experiments.plan.find_reusable`), and the FINISHED ones of their seeds that are of another
    build than the shared pipeline stages this machine has cached (:func:`harness.experiments.builds.other_build_keys`: the
    driver would set them aside and train them again, so that no seed's arms span builds), and likewise the runs to
    copy in of such a seed that are of another build and have no candidate of this one
    (:func:`harness.experiments.plan.copies_of_this_build`: the driver trains them instead). Runs RUNNING elsewhere
    count as to train (an upper bound). Returns ``(tasks to train, the keys of those that finished here on another
    build, the keys of those found to copy in but only of another build)``."""
    from harness.experiments.plan import copies_of_this_build, resume_state
    from harness.experiments.builds import other_build_keys
    from harness.config.pipeline import PipelineConfig

    state = resume_state(c, exp_id, tasks, mark_stale=False)
    todo = [t for t in tasks if t.key not in state.finished]
    found, refused, seeds = copies_of_this_build(c, exp_id, todo, state, reuse)  # refused: trained here, not copied
    todo = [t for t in todo if t.key not in found]
    aside = other_build_keys(state, PipelineConfig().out_dir, seeds)
    return todo + [t for t in tasks if t.key in aside], aside, refused


def _cpu_hours(c: Any, exp_id: str, scale: str) -> float:
    """Summed ``wall_time_s`` of the ablation's FINISHED child runs at ``scale``, in hours."""
    from harness.infra.tracking import search_all

    runs = search_all(c, [exp_id], f"tags.kind = 'child' and tags.scale = '{scale}'")
    return sum(r.data.metrics.get("wall_time_s", 0.0) for r in runs if r.info.status == "FINISHED") / 3600


__all__ = ["MODE_TAG", "median_run_seconds", "variant_run_seconds", "draws_to_build", "draw_built", "draw_seconds", "plan_text",
           "decided_plan_text", "run_staged"]
