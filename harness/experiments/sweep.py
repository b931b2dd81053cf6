"""Running an Optuna study on Ray: the driver asks, the workers train, the driver tells.

The spec (:class:`~harness.experiments.study_spec.StudySpec`) and the trial configs are :mod:`harness.experiments.study_spec`;
the study's storage, sampler and pruner are :mod:`harness.experiments.study_storage`; one trial's work is :mod:`harness.experiments.sweep_trial`; the report is :mod:`harness.reporting.study`;
``make bench-sweep`` is :mod:`harness.bench.sweep`.

:func:`run_sweep` (``make sweep``) is the only process that creates or ends trials:

1. validates the spec; on a machine without the study, restores its archived journal and runs
   (:func:`harness.experiments.study_storage.restore_study`, ``reports/NAME/archive/``); opens (or creates) the
   study, the MLflow store and the experiment ``study:NAME``, and takes the study's lock (one driver per study on
   this machine);
2. fails the trials an earlier driver left RUNNING (it was killed: no one else ends trials) and
   enqueues a retry of each with the same parameters;
3. builds the pipeline stages, opens a parent MLflow run, and while fewer than the cap are COMPLETE or
   PRUNED: asks the study for a trial (the one sampler lives here), samples its parameters and submits
   :func:`harness.experiments.sweep_trial.run_trial` as a Ray task (at most ``workers`` at once);
4. each worker reports the proxy score every iteration to the trial through the storage, and the
   pruner (read there by ``trial.should_prune``) may stop it; the driver ``tell``s the study each
   outcome (COMPLETE, PRUNED or FAIL);
5. a task lost with its worker or node (SIGKILL, OOM, a removed node) is told FAIL, its MLflow run
   marked FAILED, and a retry with the same parameters is enqueued (at most :data:`MAX_ATTEMPTS`
   attempts), so the cap is met exactly;
6. archives the study, also when stopped (:func:`harness.experiments.study_storage.archive_study`: the runs'
   records and the journal, gzipped, in ``reports/NAME/archive/``, committed with the report);
7. writes the report (:func:`harness.reporting.study.write_study_report`).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import yaml

from harness.errors import HarnessError, one_line
from harness.config.presets import scale_overrides
from harness.experiments.study_spec import (
    StudySpec, experiment_name, load_study_spec, resolve_trial_config, studies_dir, study_spec_path,
)
from harness.experiments.study_storage import (  # noqa: F401  (STORAGE_ENV and storage_url are this module's public names too)
    MAX_ATTEMPTS, STORAGE_ENV, archive_study, effective_cap, make_pruner, make_sampler, make_storage, open_study,
    optuna_dir, redacted_storage_url, restore_study, storage_url, trial_counts,
)

if TYPE_CHECKING:  # optuna and mlflow take seconds to import; only pay for them where used
    import optuna
    from mlflow import MlflowClient


# ------------------------------------------------------------------------------------------------
# Trials the driver ends
# ------------------------------------------------------------------------------------------------


def retry_failed_trial(study: "optuna.Study", trial: Any) -> None:
    """Enqueue a retry of failed ``trial`` with the same parameters (user attrs ``retry_of`` and
    ``attempt``), unless it already had :data:`MAX_ATTEMPTS` attempts."""
    attempt = int(trial.user_attrs.get("attempt", 1))
    if attempt >= MAX_ATTEMPTS or not trial.params:
        return
    study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number, "attempt": attempt + 1},
                        skip_if_exists=False)


def fail_trial(study: "optuna.Study", number: int, reason: str, c: Optional["MlflowClient"] = None,
               experiment_id: Optional[str] = None, parent_run_id: Optional[str] = None, scale: str = "") -> None:
    """End RUNNING trial ``number`` as FAIL with user attr ``fail_reason``, enqueue its retry
    (:func:`retry_failed_trial`), and mark its MLflow run (user attr ``mlflow_run_id``) FAILED with
    tag ``state=failed`` — or, if its worker died before creating one, create that FAILED run under
    ``parent_run_id``, so that every trial has exactly one run."""
    from optuna.trial import TrialState

    from harness.infra import tracking

    storage = study._storage  # the public API cannot set attrs on a trial this process did not ask for
    trial = study.get_trials(deepcopy=False)[number]
    with contextlib.suppress(Exception):
        storage.set_trial_user_attr(trial._trial_id, "fail_reason", reason)
    try:
        study.tell(number, state=TrialState.FAIL)
    except Exception:  # already finished
        return
    retry_failed_trial(study, trial)
    if c is None or experiment_id is None:
        return
    with contextlib.suppress(Exception):  # the store is unreachable: the trial is failed all the same
        run_id = storage.get_trial(trial._trial_id).user_attrs.get("mlflow_run_id")
        if run_id is None:
            from harness.experiments.sweep_trial import trial_tags

            name = study.study_name.split("@")[0]
            tags = trial_tags(name, scale, number, trial.user_attrs, storage_url(name), study.study_name,
                              parent_run_id=parent_run_id or "")
            run_id = c.create_run(experiment_id, run_name=f"trial-{number:04d}", tags=tags).info.run_id
            tracking.log_params(c, run_id, dict(trial.params))
        c.set_tag(run_id, "state", "failed")
        tracking.fail_run(c, run_id, reason)


def fail_abandoned_trials(study: "optuna.Study", c: Optional["MlflowClient"] = None, experiment_id: Optional[str] = None,
                          scale: str = "") -> list[int]:
    """At the start of a driver: every RUNNING trial was left by an earlier driver that was killed
    (only a driver ends trials, and this one holds the study's lock), so fail and retry each
    (:func:`fail_trial`). Returns their numbers."""
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        fail_trial(study, t.number, "its sweep driver stopped (killed?) while the trial was RUNNING", c, experiment_id,
                   scale=scale)
        out.append(t.number)
    return out


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------


class _Display:
    """Rich progress: one summary row (trials done of the cap, complete / pruned / failed /
    running, best value so far) and one row per running trial (iterations)."""

    def __init__(self, label: str, cap: int, steps: int, multi: bool, enabled: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.label, self.cap, self.steps, self.multi = label, cap, steps, multi
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), disable=not enabled)
        self.main = self.progress.add_task(label, total=cap)
        self.rows: dict[str, Any] = {}
        # a log file or pipe shows no live display: one plain line per ended trial instead
        self.plain = enabled and not self.progress.console.is_terminal
        self.t0 = time.time()

    def __enter__(self) -> "_Display":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def note(self, message: str) -> None:
        """Print one line above the live display (a failed trial as it happens)."""
        self.progress.console.print(message)

    def refresh(self, study: "optuna.Study") -> None:
        """Update the summary row from the study (all workers, all machines)."""
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        n = {s: sum(t.state == s for t in trials) for s in TrialState}
        done = n[TrialState.COMPLETE] + n[TrialState.PRUNED]
        best = ""
        if n[TrialState.COMPLETE]:
            if self.multi:
                best = f" · Pareto front: {len(study.best_trials)} trial(s)"
            else:
                bt = study.best_trial
                best = f" · best {bt.value:.4g} (#{bt.number})"
        desc = (f"[bold]{self.label}[/] trials: [green]{n[TrialState.COMPLETE]} complete[/] · {n[TrialState.PRUNED]} pruned · "
                f"[red]{n[TrialState.FAIL]} failed[/] · [cyan]{n[TrialState.RUNNING]} running[/]{best}")
        self.progress.update(self.main, completed=min(done, self.cap), description=desc)

    def event(self, kind: str, key: Any, value: Any) -> None:
        """Worker events: ``start`` (pid), ``iter`` (iterations done), ``end`` (state; a plain line
        when the output is not a terminal)."""
        key = str(key)
        if kind == "start":
            self.end(key)
            self.rows[key] = self.progress.add_task(f"  trial #{key} (pid {value})", total=self.steps)
        elif kind == "iter" and key in self.rows:
            self.progress.update(self.rows[key], completed=int(value))
        elif kind == "end":
            self.end(key)
            if self.plain:
                self.note(f"trial {key} {str(value).lower()}, elapsed {(time.time() - self.t0) / 60:.1f} min")

    def end(self, key: str) -> None:
        """Remove a trial's row."""
        row = self.rows.pop(key, None)
        if row is not None:
            self.progress.remove_task(row)


def _sampler_seed(spec: StudySpec, n_existing: int) -> int:
    """The driver's sampler seed: the spec's, mixed with how many trials the study holds (a resumed
    study does not replay the sampler's first draws)."""
    import numpy as np

    return int(np.random.SeedSequence([spec.sampler.seed, n_existing]).generate_state(1)[0])


def _drive(study: "optuna.Study", spec: StudySpec, scale: str, cap: int, max_failed: int, workers: int,
           base: dict[str, Any], display: _Display, c: "MlflowClient") -> None:
    """Ask, submit, tell until COMPLETE + PRUNED reaches ``cap`` (or ``max_failed`` trials FAILED)."""
    from optuna.trial import TrialState

    from harness.experiments import engine
    from harness.experiments.sweep_trial import TrialJob, run_trial

    pool = engine.Pool(display.event)
    # a trial's resources follow its device, which the search space cannot change: the same for every trial
    resources = engine.resources(resolve_trial_config(spec, scale, None, spec.seeds_for(scale)[0]).to_dict())
    inflight: dict[str, Any] = {}
    last = 0.0
    try:
        while True:
            counts = trial_counts(study)
            while (len(pool) < workers and counts["complete"] + counts["pruned"] + len(pool) < cap
                   and counts["fail"] < max_failed):
                trial = study.ask()
                params = {k: trial.suggest_float(k, p.low, p.high, log=spec.param_log(k)) for k, p in spec.search_space.items()}
                job = TrialJob(**base, trial_id=trial._trial_id, number=trial.number, params=params,
                               attrs=dict(trial.user_attrs))
                pool.submit(str(trial.number), run_trial, job, resources=resources, retries=0)
                inflight[str(trial.number)] = trial
            if not len(pool):
                return
            for key, res, err in pool.wait(2.0):
                trial = inflight.pop(key)
                if err is not None:
                    reason = f"{engine.describe_error(err)} while the trial was RUNNING"
                    fail_trial(study, trial.number, reason, c, base["experiment_id"], base["parent_run_id"], scale)
                    display.note(f"[yellow]trial {trial.number} failed[/] ({reason}); queued for retry")
                elif res["state"] == "COMPLETE":
                    study.tell(trial, res["values"] if len(res["values"]) > 1 else res["values"][0])
                elif res["state"] == "PRUNED":
                    study.tell(trial, state=TrialState.PRUNED)
                else:
                    study.tell(trial, state=TrialState.FAIL)
                    display.note(f"[red]trial {trial.number} failed[/]: {res['reason']}")
                display.end(key)
            if time.time() - last > 1.0:
                display.refresh(study)
                last = time.time()
    except BaseException:
        pool.cancel()
        for key in list(inflight):
            with contextlib.suppress(Exception):
                fail_trial(study, int(key), "the sweep driver was stopped (Ctrl-C)", c, base["experiment_id"],
                           base["parent_run_id"], scale)
        raise
    finally:
        display.refresh(study)


def run_sweep(name: str, trials: Optional[int] = None, scale: str = "smoke", workers: int = 2, progress: bool = True,
              report: bool = True, spec: Optional[StudySpec] = None, address: Optional[str] = None) -> Path:
    """Run (or resume) study ``name`` at ``scale`` until ``trials`` trials are COMPLETE or PRUNED,
    trials running as Ray tasks (at most ``workers`` at once); then write the report.

    Steps in the module docstring. Safe to run again: it resumes (a finished study starts no new
    trial); trials left RUNNING by a killed driver are failed and retried; the cap is exact.

    Args:
        name: spec name (``ablations/studies/NAME.yaml``).
        trials: trial cap (default: the spec's for ``scale``).
        scale: ``smoke`` | ``default`` | ``full``.
        workers: trials at once (≥ 1).
        progress: show the rich display (stderr).
        report: write ``reports/NAME/`` at the end (:func:`write_study_report`, including the
            re-evaluation on fresh seeds).
        spec: an already validated spec (default: loaded from the file).
        address: a Ray cluster (default ``$RAY_ADDRESS``, else a local instance).
    Returns:
        The report path, or the sweep's output directory when ``report`` is False.
    Raises:
        HarnessError / ConfigError: unknown study or scale, invalid spec (before any compute),
        a stored study from another spec, storage errors. Failing *trials* never raise.
    """
    import optuna
    from rich.console import Console

    from harness.infra import tracking
    from harness.experiments.ablate import _invocation_lock, run_hash

    if workers < 1:
        raise HarnessError(f"--workers: must be ≥ 1, got {workers}")
    scale_overrides(scale)
    spec = spec or load_study_spec(name)
    cap = effective_cap(spec, scale, trials)
    console = Console(stderr=True, quiet=not progress, soft_wrap=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    uri = tracking.tracking_uri()
    c = tracking.init_store(uri)
    restore_study(name, c, echo=console.print)  # a machine without the study goes on from the archived trials
    study = open_study(spec, scale, storage=make_storage(name))
    study.sampler = make_sampler(spec, _sampler_seed(spec, len(study.get_trials(deepcopy=False))))
    base_cfg = resolve_trial_config(spec, scale, None, 0)
    steps = len(spec.seeds_for(scale)) * base_cfg.ppo.total_iterations  # pruning steps of a trial: its seeds' iterations
    study.pruner = make_pruner(spec, steps)
    from harness.experiments import engine

    engine.check_reachable(address)  # before any pipeline is built
    exp_id = tracking.experiment_id(c, experiment_name(name))
    base_hash = run_hash(base_cfg)
    if "base_config_hash" not in study.user_attrs:
        study.set_user_attr("base_config_hash", base_hash)
    elif study.user_attrs["base_config_hash"] != base_hash:
        console.print(f"[yellow]note[/]: the resolved default config of {study.study_name} changed since the study started "
                      f"({study.user_attrs['base_config_hash']} → {base_hash}: code defaults changed?); new trials are not "
                      "strictly comparable with earlier ones")
    lock = _invocation_lock(optuna_dir() / f"{name}@{scale}")
    try:
        for n in fail_abandoned_trials(study, c, exp_id, scale=scale):
            console.print(f"[yellow]trial {n} failed[/] (left RUNNING by a stopped driver); queued for retry")
        tracking.mark_stale_runs(c, exp_id)
        max_failed = spec.max_failed_trials or max(cap, 3)
        counts = trial_counts(study)
        if counts["complete"] + counts["pruned"] >= cap or counts["fail"] >= max_failed:
            console.print(f"study {study.study_name}: nothing to run ({counts['complete'] + counts['pruned']}/{cap} done; "
                          f"{counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed)")
        else:
            _run(study, spec, name, scale, cap, max_failed, steps, workers, progress, console, c, exp_id, uri, address)
    finally:
        _archive_quietly(c, exp_id, name, console)  # a stopped sweep keeps what it finished too
        lock.release()
    if report:
        from harness.reporting.study import write_study_report

        return write_study_report(name, scale=scale, workers=workers, progress=progress, spec=spec)
    return tracking.results_root() / "sweeps" / name / scale


def _archive_quietly(c: "MlflowClient", exp_id: str, name: str, console: Any) -> None:
    """Archive the study (:func:`harness.experiments.study_storage.archive_study`); a failure is a warning, never the
    end of the invocation (the trials stay in the store and the journal; the next sweep or report archives them)."""
    try:
        archive_study(c, exp_id, name)
    except Exception as e:
        console.print(f"[yellow]warning[/]: archiving study {name} failed: {one_line(e)}")


def _run(study: "optuna.Study", spec: StudySpec, name: str, scale: str, cap: int, max_failed: int, steps: int, workers: int,
         progress: bool, console: Any, c: "MlflowClient", exp_id: str, uri: str, address: Optional[str]) -> None:
    """One sweep invocation with work to do: pipelines, parent run, Ray, the ask/tell loop."""
    from harness.experiments import engine
    from harness.infra import tracking
    from harness.pipeline import build_pipeline

    for seed in spec.seeds_for(scale):  # stage keys include the seed: build each one here, not in the workers
        build_pipeline(resolve_trial_config(spec, scale, None, seed))
    sha = tracking.git_sha()
    parent = c.create_run(exp_id, run_name=f"{name}-{scale}-{time.strftime('%Y%m%d-%H%M%S')}", tags={
        "kind": "parent", "role": "sweep", "study": name, "scale": scale, "workers": str(workers), "cap": str(cap),
        "optuna.study_name": study.study_name, "optuna.storage": redacted_storage_url(name), "git_sha": sha,
        "mlflow.source.git.commit": sha, **tracking.owner_tags()})
    pid = parent.info.run_id
    t0 = time.time()
    before = len(study.get_trials(deepcopy=False))
    try:
        c.log_text(pid, study_spec_path(name).read_text() if (studies_dir() / f"{name}.yaml").is_file()
                   else yaml.safe_dump(spec.model_dump(mode="json")), "study.yaml")
        where = engine.connect(workers, address)
        display = _Display(f"{study.study_name} [cap {cap}, {workers} at once on Ray: {where}]", cap, steps,
                           spec.multi_objective, enabled=progress)
        out_root = (tracking.results_root() / "sweeps" / name / scale).resolve()
        base = dict(name=name, scale=scale, spec=spec.model_dump(mode="json"), study_name=study.study_name,
                    storage=storage_url(name), tracking_uri=uri, experiment_id=exp_id, parent_run_id=pid,
                    out_root=str(out_root), git_sha=sha)
        with display:
            _drive(study, spec, scale, cap, max_failed, workers, base, display, c)
        counts = trial_counts(study)
        tracking.log_metric_dict(c, pid, {
            "trials/new": len(study.get_trials(deepcopy=False)) - before, "trials/complete": counts["complete"],
            "trials/pruned": counts["pruned"], "trials/failed": counts["fail"], "sweep/wall_s": time.time() - t0})
        c.set_terminated(pid, "FINISHED")
    except KeyboardInterrupt:
        tracking.fail_run(c, pid, "interrupted (Ctrl-C)", status="KILLED")
        raise
    except BaseException as e:
        tracking.fail_run(c, pid, one_line(e))
        raise
    console.print(f"study {study.study_name}: {counts['complete'] + counts['pruned']}/{cap} trials "
                  f"({counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed) "
                  f"in {time.time() - t0:.1f} s")


__all__ = [
    "STORAGE_ENV", "MAX_ATTEMPTS", "storage_url", "make_storage", "open_study", "make_sampler",
    "make_pruner", "retry_failed_trial", "fail_trial", "fail_abandoned_trials", "run_sweep",
]
