"""Ablations as data: ``ablations/NAME.yaml`` → (variant, seed) runs → Ray tasks → MLflow → report.

The spec and each run's resolved config are :mod:`harness.experiments.spec`. :func:`run_ablation` runs
every (variant, seed) not yet FINISHED as Ray tasks (:mod:`harness.experiments.engine`), records each as a nested
MLflow child run (:mod:`harness.infra.tracking`), then writes the report (:func:`harness.reporting.ablation.write_report`).

Resume rules: a (variant, seed) with a FINISHED child run of the same config hash (any earlier
invocation) is skipped; one RUNNING in a live process is left alone; FAILED/KILLED ones, and
RUNNING ones whose process is dead (marked FAILED first), are run again as a new child run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import yaml

from harness.experiments.plan import (  # noqa: F401  (the plan's names are this module's public names too)
    ResumeState, RunTask, find_reusable, plan_ablation, plan_runs, restore_archived, restore_sources, resume_state, reusable_candidates,
    reuse_finished_runs,
)
from harness.experiments.spec import (  # noqa: F401  (the spec's names are this module's public names too)
    DEFAULT_METRICS, DEFAULT_SEEDS, AblationSpec, Claim, MetricSpec, ScaleSpec, VerdictRule, ablations_dir, experiment_name,
    find_spec, is_study, list_ablations, list_specs, load_spec, read_spec, resolve_config, run_hash, spec_path,
    validate_spec,
)
from harness.rl.callbacks import Callback
from harness.config import build_config
from harness.experiments.engine import emit, node_id
from harness.errors import HarnessError, one_line
from harness.experiments.display import RunDisplay
from harness.config.presets import scale_overrides


# ------------------------------------------------------------------------------------------------
# Worker side
# ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _output_to(path: Path):
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _attempt_runs(c: Any, task: RunTask, running_only: bool = False) -> list[Any]:
    """The MLflow runs of ``task``'s (variant, seed) under its invocation's parent run (its attempts),
    only the RUNNING ones if ``running_only``."""
    return c.search_runs([task.experiment_id], f"tags.mlflow.parentRunId = '{task.parent_run_id}' and "
                                               f"tags.variant = '{task.variant}' and tags.seed = '{task.seed}'"
                                               + (" and attributes.status = 'RUNNING'" if running_only else ""))


def _fail_earlier_attempts(c: Any, task: RunTask) -> int:
    """Before a (re-)run of ``task`` under its parent: mark FAILED the runs of the same (variant, seed)
    that an earlier attempt of this task left RUNNING (Ray re-runs a task whose worker or node died),
    each with the dead owner named, and say so on the driver's console. Returns how many earlier
    attempts this parent holds for the task (0 on a first attempt)."""
    from harness.infra.tracking import fail_run

    if not task.parent_run_id:
        return 0
    earlier = _attempt_runs(c, task)
    n = len(earlier)
    for run in earlier:
        if run.info.status != "RUNNING":
            continue
        tags = run.data.tags
        reason = (f"its worker process died (pid {tags.get('pid', '?')} on {tags.get('host', '?')}: out of memory, "
                  f"killed, or its node was removed); retried (attempt {task.attempt + n})")
        with contextlib.suppress(Exception):
            fail_run(c, run.info.run_id, reason)
        emit("retry", task.key, reason)
    return n


def execute_run(task: RunTask) -> dict[str, Any]:
    """Run one (variant, seed) as an MLflow child run; never raises for a failed run.

    Creates the child run (tags ``kind=child``, ``mlflow.parentRunId``, ``ablation``, ``variant``,
    ``seed``, ``scale``, ``config_hash``, ``git_sha``, ``attempt``, ``ray_node``, ``pid``, ``host``)
    after marking FAILED what a dead earlier attempt of this task left RUNNING, logs the flattened
    resolved config as params and ``config.yaml``, trains with :class:`harness.infra.tracking.MLflowCallback`
    attached (stdout/stderr go to ``run.log``, logged too), and terminates the run FINISHED, or
    FAILED with a ``failure_reason`` tag when training raises (e.g. TrainingDivergedError).

    Returns:
        ``{"key", "variant", "seed", "run_id", "status": "FINISHED"|"FAILED", "reason", "wall_s",
        "final": summary["final"] | None}``.
    """
    from harness.infra.tracking import MLflowCallback, client, fail_run, log_params, owner_tags

    t0 = time.time()
    result: dict[str, Any] = {"key": task.key, "variant": task.variant, "seed": task.seed, "run_id": None,
                              "status": "FAILED", "reason": None, "wall_s": 0.0, "final": None}
    emit("start", task.key, os.getpid())
    try:
        c = client(task.tracking_uri)
        attempt = task.attempt + _fail_earlier_attempts(c, task)
        tags = {
            "kind": "child", "mlflow.parentRunId": task.parent_run_id, "ablation": task.ablation,
            "variant": task.variant, "seed": str(task.seed), "scale": task.scale, "config_hash": task.config_hash,
            "git_sha": task.git_sha, "mlflow.source.git.commit": task.git_sha, "attempt": str(attempt),
            "ray_node": node_id(), **owner_tags(),
        }
        run = c.create_run(task.experiment_id, run_name=f"{task.variant}-s{task.seed}", tags=tags)
    except Exception as e:  # the store is unreachable: nothing was created
        result["reason"] = f"could not create the MLflow run: {one_line(e)}"
        emit("end", task.key, "FAILED")
        return result
    run_id = result["run_id"] = run.info.run_id
    emit("run", task.key, run_id)
    out_dir = Path(task.out_root) / task.variant / f"seed{task.seed}-{run_id[:8]}"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = out_dir / "run.log"
    callback = MLflowCallback(c, run_id)
    try:
        cfg = build_config(task.config)
        log_params(c, run_id, task.config)
        c.log_text(run_id, yaml.safe_dump(task.config, sort_keys=False), "config.yaml")
        with _output_to(log_file):
            try:
                from harness.rl.runner import run as train_run

                summary = train_run(cfg, out_dir, [callback, ProgressCallback(task.key)], progress=False)
            except BaseException:
                traceback.print_exc()
                raise
        c.log_artifact(run_id, str(log_file))
        c.set_terminated(run_id, "FINISHED")
        result.update(status="FINISHED", final=summary.get("final"))
    except BaseException as e:  # any failure of the run is recorded, and the ablation goes on
        result["reason"] = one_line(e)
        status = "FAILED" if isinstance(e, Exception) else "KILLED"
        result["status"] = status
        with contextlib.suppress(Exception):
            callback.flush()
        with contextlib.suppress(Exception):
            if log_file.exists():
                c.log_artifact(run_id, str(log_file))
        with contextlib.suppress(Exception):
            fail_run(c, run_id, result["reason"], status=status)
    result["wall_s"] = time.time() - t0
    emit("end", task.key, result["status"])
    return result


class ProgressCallback(Callback):
    """Report finished iterations of run ``key`` to the parent's progress display (through the
    worker's event queue; a no-op outside a worker), at most one event per ``min_interval`` seconds:
    each event is a call to the queue's actor, and the display needs no more."""

    def __init__(self, key: str, min_interval: float = 2.0) -> None:
        self.key = key
        self.min_interval = min_interval
        self._last = -math.inf

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        """Emit ``("iter", key, iteration + 1)`` unless the last event was under ``min_interval`` s ago."""
        now = time.monotonic()
        if now - self._last >= self.min_interval:
            self._last = now
            emit("iter", self.key, iteration + 1)


# ------------------------------------------------------------------------------------------------
# Parent side
# ------------------------------------------------------------------------------------------------


def _build_pipelines(tasks: list[RunTask]) -> list[dict[str, Any]]:
    """Build (or find cached) in this process the first pipeline draw the tasks need of each distinct pipeline:
    its shared stages (data, gold, tokenizer, the reward model of human ratings) and that draw. The stages depend
    on ``pipeline`` (its own seed, not the run's), the task, the PPO temperature (proxy data and best-of-n sample
    at it) and the evaluation prompts. The other draws (``seed mod pipeline.replicates``) are built by the first
    worker whose run needs one (:func:`harness.rl.run_models.build_models`; stage builds are file-locked), while the
    runs of the draws already built train on the other workers; so are the stages no run waits for (``defer``).
    Returns the summary of each pipeline built (its ``stages``: key and weight digest; :mod:`harness.experiments.builds`)."""
    from harness.pipeline import build_pipeline

    first: dict[str, tuple[int, Any]] = {}
    for t in tasks:
        cfg = build_config(t.config)
        key = json.dumps([t.config["pipeline"], t.config["task"], t.config["ppo"]["temperature"], t.config["eval"]],
                         sort_keys=True)
        if key not in first or cfg.replicate < first[key][0]:
            first[key] = (cfg.replicate, cfg)
    return [build_pipeline(cfg, defer=True).summary for _, cfg in first.values()]


def prepare_tasks(tasks: list[RunTask], exp_id: str, parent_id: str, uri: str, out_root: Path, sha: str) -> None:
    """Fill in where each task records itself, with absolute paths (a worker's working directory and
    environment are its node's, not this process's)."""
    for t in tasks:
        t.experiment_id, t.parent_run_id, t.tracking_uri = exp_id, parent_id, uri
        t.out_root, t.git_sha = str(Path(out_root).resolve()), sha
        pipe = t.config.get("pipeline", {})
        if "out_dir" in pipe:
            pipe["out_dir"] = str(Path(pipe["out_dir"]).resolve())
        data = pipe.get("data", {})
        if data.get("cache_dir"):
            data["cache_dir"] = str(Path(data["cache_dir"]).resolve())


def _lost(task: RunTask, error: BaseException) -> dict[str, Any]:
    """The result of a task Ray gave up on (its worker or node died on every attempt): its runs under
    this invocation still RUNNING are marked FAILED with the reason."""
    from harness.experiments.engine import MAX_RETRIES, describe_error
    from harness.infra.tracking import client, fail_run

    reason = f"{describe_error(error)}; not retried again ({1 + MAX_RETRIES} attempts)"
    run_id = None
    with contextlib.suppress(Exception):
        c = client(task.tracking_uri)
        for run in _attempt_runs(c, task, running_only=True):
            run_id = run.info.run_id
            fail_run(c, run_id, reason)
    return {"key": task.key, "variant": task.variant, "seed": task.seed, "run_id": run_id, "status": "FAILED",
            "reason": reason, "wall_s": 0.0, "final": None}


def run_tasks(tasks: list[RunTask], workers: int, display: RunDisplay,
              on_result: Optional[Callable[[dict[str, Any]], None]] = None) -> list[dict[str, Any]]:
    """Run ``tasks`` as Ray tasks (:mod:`harness.experiments.engine`; the caller has connected), at most ``workers``
    at once, each with the resources its config needs (one CPU; one GPU for CUDA). Returns one result
    dict per task (:func:`execute_run`'s, or a FAILED one for a task lost after its retries); ``on_result`` is
    called with each as it comes.

    A worker (or node) that dies is Ray's to handle: the task is re-run up to
    :data:`harness.experiments.engine.MAX_RETRIES` times, and the new attempt marks the dead one's MLflow run FAILED
    before it starts (:func:`_fail_earlier_attempts`). Ctrl-C stops every task in flight.
    """
    from harness.experiments import engine

    pool = engine.Pool(display.event)
    pending, results = list(tasks), []
    by_key = {t.key: t for t in tasks}
    try:
        while pending or len(pool):
            while pending and len(pool) < workers:
                t = pending.pop(0)
                pool.submit(t.key, execute_run, t, resources=engine.resources(t.config))
            for key, res, err in pool.wait(2.0):
                if err is not None:
                    res = _lost(by_key[key], err)
                results.append(res)
                display.finish(key, res["status"], res.get("reason"))
                if on_result is not None:
                    on_result(res)
        pool.drain()
    except BaseException:
        pool.cancel()
        raise
    return results


def run_ablation(name: str, scale: str = "default", seeds: Optional[list[int]] = None, workers: int = 2,
                 progress: bool = True, reuse: bool = True, raise_on_failure: bool = False,
                 address: Optional[str] = None) -> Path:
    """Run every (variant, seed) of ablation ``name`` not yet FINISHED, then write the report.

    Steps: load and validate the spec; create the MLflow store (once, here) and the experiment
    ``ablation/<name>``; mark runs of killed processes FAILED; skip (variant, seed) already
    FINISHED with the same config hash; copy in FINISHED runs of other ablations with the same
    config hash; open a parent run for this invocation; build the pipeline stages here; run the
    rest as Ray tasks, at most ``workers`` at once (:func:`run_tasks`; a local Ray instance unless
    ``address`` or ``$RAY_ADDRESS`` names a cluster) with one progress display; close the parent
    run; write ``reports/<name>/``.

    Args:
        name: spec name (``ablations/<name>.yaml``).
        scale: ``smoke`` | ``default`` | ``full``.
        seeds: explicit seeds (default: the spec's seeds for ``scale``). Seeds in stages until every claim
            is decided are :func:`harness.experiments.staged.run_staged` (``--seeds auto``).
        workers: runs at once (≥ 1).
        progress: show the rich progress display (on stderr).
        address: a Ray cluster to run on (default ``$RAY_ADDRESS``, else a local instance).
        reuse: copy in FINISHED runs of other ablations with the same config hash instead of
            training them again (:func:`reuse_finished_runs`).
        raise_on_failure: after the report is written, raise :class:`RunsFailedError` if a run of
            this invocation FAILED (the CLI does, to exit with status 1).
    Returns:
        Path of ``reports/<name>/report.md``.
    Raises:
        HarnessError: unknown ablation or scale, invalid spec (ConfigError), pipeline errors.
        RunsFailedError: only with ``raise_on_failure``. Otherwise a failing *run* never raises: it
            is recorded FAILED with its reason and listed in the report.
    """
    from rich.console import Console

    from harness.reporting.ablation import write_report

    if workers < 1:
        raise HarnessError(f"--workers: must be ≥ 1, got {workers}")
    scale_overrides(scale)
    spec = load_spec(name)
    tasks = plan_runs(spec, scale, seeds)
    console = Console(stderr=True, quiet=not progress, soft_wrap=True)  # a line a log keeps whole
    with open_ablation(name, address, {t.config_hash for t in tasks}) as (c, uri, exp_id):
        failed = _invoke(c, uri, exp_id, spec, name, scale, tasks, workers, progress, console, reuse, address)
    report = write_report(name, scale=scale)
    if failed and raise_on_failure:
        raise_failed(failed, report, len(tasks))
    return report


def raise_failed(failed: list[dict[str, Any]], report: Path, planned: Optional[int] = None) -> None:
    """Raise :class:`harness.errors.RunsFailedError` naming the first failed runs, their count (of
    ``planned`` when known) and the report that lists them with their reasons."""
    from harness.errors import RunsFailedError

    if failed:
        of = f" of {planned}" if planned is not None else ""
        raise RunsFailedError(f"{len(failed)}{of} runs FAILED ({', '.join(r['key'] for r in failed[:5])}"
                              f"{', …' if len(failed) > 5 else ''}); each is recorded with its reason; report: {report}")


def in_plan_order(tasks: list[RunTask], chosen: Iterable[RunTask]) -> list[RunTask]:
    """The ``chosen`` tasks in ``tasks``' order (the plan's: arm by arm in the spec's order, seeds ascending), each once.
    The runs an invocation trains go in this order whatever put them on the list (not finished, or finished on
    another build and set aside), so that a stage interrupted midway has its first arms whole: e.g. plan
    ``[grpo/s0, grpo/s1, sapo/s0]`` with ``sapo/s0`` to train and ``grpo/s1`` set aside → ``[grpo/s1, sapo/s0]``."""
    keys = {t.key for t in chosen}
    return [t for t in tasks if t.key in keys]


def _invoke(c: Any, uri: str, exp_id: str, spec: AblationSpec, name: str, scale: str, tasks: list[RunTask],
            workers: int, progress: bool, console: Any, reuse: bool = True,
            address: Optional[str] = None, parent_tags: Optional[dict[str, str]] = None) -> list[dict[str, Any]]:
    """One invocation under the lock: resume bookkeeping, reuse, parent run (with ``parent_tags`` added),
    pipelines, Ray tasks. Returns the results of the runs that FAILED in this invocation."""
    from harness.infra import tracking
    from harness.experiments.plan import accept_for_training

    state = resume_state(c, exp_id, tasks)
    for run_id, reason in state.marked_stale:
        console.print(f"[yellow]marked FAILED[/] run {run_id[:8]}: {reason}")
    for key, run_id in state.running.items():
        console.print(f"[yellow]skipping[/] {key}: run {run_id[:8]} is RUNNING in a live process")
    todo = [t for t in tasks if t.key not in state.finished and t.key not in state.running]
    # one search of the store for runs to copy in, for every task not running (a set-aside one may be copied too);
    # none when everything is finished (the copy searches for itself if runs of another build are set aside)
    candidates = reusable_candidates(c, exp_id, [t for t in tasks if t.key not in state.running]) if reuse and todo else None
    accept = accept_for_training(c, exp_id, tasks, todo, state, reuse, console, _build_pipelines, candidates)
    set_aside = [t for t in tasks if t.key in state.finished and not accept(state.finished_tags[t.key])]
    if set_aside:
        console.print(f"[yellow]{len(set_aside)} finished run(s) of another build set aside[/]: {len(todo) + len(set_aside)} "
                      f"run(s) to train or copy in here, not {len(todo)} (`harness build-check {name}` tells before a run)")
    todo = in_plan_order(tasks, todo + set_aside)
    sha = tracking.git_sha()
    parent = c.create_run(exp_id, run_name=f"{name}-{scale}-{time.strftime('%Y%m%d-%H%M%S')}", tags={
        "kind": "parent", "ablation": name, "scale": scale, "seeds": ",".join(str(s) for s in sorted({t.seed for t in tasks})),
        "workers": str(workers), "git_sha": sha, "mlflow.source.git.commit": sha, **tracking.owner_tags(),
        **(parent_tags or {}),
    })
    parent_id = parent.info.run_id
    out_root = tracking.results_root() / "ablations" / name / scale
    try:
        c.log_text(parent_id, spec_path(name).read_text(), "spec.yaml")
        tracking.log_metric_dict(c, parent_id, {"runs/planned": len(tasks), "runs/skipped": len(tasks) - len(todo)})
        results: list[dict[str, Any]] = []
        if reuse and todo:
            copied = reuse_finished_runs(c, exp_id, parent_id, todo, accept, candidates, state.finished_tags)
            for t in todo:
                if t.key in copied:
                    console.print(f"[green]reused[/] {t.key}: run {copied[t.key][1][:8]} of {copied[t.key][0]} "
                                  "(same config hash), copied in")
            todo = [t for t in todo if t.key not in copied]
            tracking.log_metric_dict(c, parent_id, {"runs/reused": len(copied)})
        if todo:
            from harness.experiments import engine

            _build_pipelines(todo)
            where = engine.connect(workers, address)
            console.print(f"running {len(todo)} run(s) on Ray: {where}, {workers} at once")
            prepare_tasks(todo, exp_id, parent_id, uri, out_root, sha)
            display = RunDisplay(name, scale, todo, skipped=len(tasks) - len(todo), enabled=progress)
            with display:
                results = run_tasks(todo, workers, display, lambda res: _archive_quietly(c, exp_id, name))
        failed = [r for r in results if r["status"] != "FINISHED"]
        for r in failed:
            console.print(f"[red]FAILED[/] {r['key']} (run {str(r['run_id'])[:8]}): {r['reason']}")
        tracking.log_metric_dict(c, parent_id, {"runs/finished": len(results) - len(failed), "runs/failed": len(failed)})
        c.set_terminated(parent_id, "FINISHED")
        return failed
    except KeyboardInterrupt:
        tracking.fail_run(c, parent_id, "interrupted (Ctrl-C)", status="KILLED")
        tracking.mark_stale_runs(c, exp_id)
        raise
    except BaseException as e:
        tracking.fail_run(c, parent_id, one_line(e))
        raise


@contextlib.contextmanager
def open_ablation(name: str, address: Optional[str] = None, hashes: Iterable[str] = ()) -> Iterator[tuple[Any, str, str]]:
    """The store (created once, here), the cluster checked, the experiment ``ablation/<name>``, and this
    machine's invocation lock held for the block: yields ``(client, tracking URI, experiment id)``. Archived runs the
    store lacks are restored first, and so are the archives of the other ablations that hold a finished run of one of
    ``hashes`` (the config hashes the caller plans to run; :func:`harness.experiments.plan.restore_sources`), so that
    a new machine copies such runs in rather than training them again; every ended run is archived at the end.

    Raises:
        ServiceError: the store or the cluster is unreachable.
        HarnessError: another live invocation of ``name`` holds the lock.
    """
    from harness.experiments import engine
    from harness.infra import tracking

    uri = tracking.tracking_uri()
    c = tracking.init_store(uri)
    engine.check_reachable(address)
    exp_id = tracking.experiment_id(c, experiment_name(name))
    lock = _invocation_lock(tracking.results_root() / "ablations" / name)
    try:
        restore_archived(c, exp_id, name, set(hashes), warn=_stderr)
        yield c, uri, exp_id
    finally:
        _archive_quietly(c, exp_id, name)
        lock.release()


def _archive_quietly(c: Any, exp_id: str, name: str) -> None:
    """Archive the ablation's ended runs (:func:`harness.experiments.archive.export_runs`), e.g. each run as it finishes, so that a
    driver killed later loses none of them; a failure is a warning, never the end of the invocation."""
    from harness.experiments import archive

    try:
        archive.export_runs(c, exp_id, name)
    except Exception as e:  # the runs stay in the store; `harness archive NAME` writes them later
        _stderr(f"warning: archiving the runs of {name} failed: {one_line(e)}")


def _stderr(line: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(line, soft_wrap=True, markup=False, highlight=False)


def _invocation_lock(directory: Path) -> Any:
    """Hold an exclusive ``filelock.FileLock`` on ``directory/.invocation.lock`` (call ``release()`` on
    the returned lock; the OS drops it when the process dies), so two invocations of one ablation on this
    machine cannot both start the same (variant, seed). The holder's pid is kept in ``.invocation.pid``.

    Raises:
        HarnessError: another live process holds the lock (its pid is named).
    """
    from filelock import FileLock, Timeout

    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(directory / ".invocation.lock"), timeout=0)
    pid_file = directory / ".invocation.pid"
    try:
        lock.acquire()
    except Timeout:
        holder = pid_file.read_text().strip() if pid_file.is_file() else "?"
        raise HarnessError(f"ablation {directory.name!r} is already running in process {holder} on this machine; "
                           "wait for it or stop it first") from None
    pid_file.write_text(str(os.getpid()))
    return lock


__all__ = [
    "AblationSpec", "Claim", "MetricSpec", "ScaleSpec", "VerdictRule", "RunTask", "ablations_dir", "list_ablations",
    "is_study", "load_spec", "resolve_config", "plan_runs", "run_hash", "experiment_name", "execute_run",
    "run_ablation", "resume_state", "find_reusable", "reuse_finished_runs", "plan_ablation",
]
