"""Running an Optuna study: one shared study → worker processes → MLflow → report.

The spec (:class:`~harness.study_spec.StudySpec`) and the trial configs are :mod:`harness.study_spec`;
the report is :mod:`harness.study_report`; ``make bench-sweep`` is :mod:`harness.bench_sweep`.

Storage (:func:`storage_url`): the Optuna study ``NAME@SCALE`` lives in
``JournalStorage(JournalFileBackend(<results>/optuna/NAME.log))`` (one file per spec, one study per
scale in it), or, for several machines, in the RDB named by ``$HARNESS_OPTUNA_STORAGE`` (e.g.
``postgresql+psycopg2://user:pw@host/db``; RDBStorage with heartbeats).

:func:`run_sweep` (``make sweep``):

1. validates the spec, opens (or creates) the study, creates the MLflow store and the experiment
   ``study:NAME`` in this process;
2. finds trials left RUNNING by killed workers (owner pid dead, :func:`recover_stale_trials`),
   marks them FAIL (and their MLflow runs FAILED) and enqueues a retry with the same parameters;
3. builds the pipeline stages here, opens a parent MLflow run, starts ``workers`` spawned processes
   (one torch thread each) that share the study. Each worker loops: under a file lock, count the
   trials that are COMPLETE, PRUNED or RUNNING (Optuna's ``MaxTrialsCallback`` states) and create
   the next trial only while that count is below the cap — so the cap is met exactly, across
   workers and across invocations (running the command again resumes);
4. every trial is one MLflow child run (tags ``trial_number``, ``state``, ``worker_pid``; params;
   metrics ``value`` and the PPO curves); the proxy score is reported to Optuna every iteration
   (:class:`PruningCallback`) and a poor trial is pruned;
5. a worker that dies (SIGKILL, OOM) is noticed: its trial is failed and retried, the worker is
   replaced; a rich display shows trials done and the best value;
6. writes the report (:func:`harness.study_report.write_study_report`): Optuna plots, the best config, and a
   re-evaluation of the best config against the default on fresh seeds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import yaml

from harness.callbacks import Callback
from harness.config import Config, flatten
from harness.errors import HarnessError
from harness.presets import scale_overrides
from harness.study_spec import (
    StudySpec, experiment_name, load_study_spec, resolve_trial_config, spec_fingerprint, studies_dir, study_name,
    study_spec_path,
)

if TYPE_CHECKING:  # optuna and mlflow take seconds to import; only pay for them where used
    import optuna
    from mlflow import MlflowClient

#: Environment variable naming a shared storage (an RDB URL such as PostgreSQL, or a journal file).
STORAGE_ENV = "HARNESS_OPTUNA_STORAGE"
#: Trial states counted towards the global cap (as ``MaxTrialsCallback(N, states=...)``).
CAP_STATES_NAMES = ("COMPLETE", "PRUNED", "RUNNING")
#: A RUNNING trial with no owner recorded after this many seconds is considered orphaned.
ORPHAN_AFTER_S = 60.0
#: How many times a trial whose worker died is retried (attempts in all).
MAX_ATTEMPTS = 3


# ------------------------------------------------------------------------------------------------
# Storage
# ------------------------------------------------------------------------------------------------


def optuna_dir() -> Path:
    """``<results>/optuna`` (absolute; honours ``$HARNESS_RESULTS``)."""
    from harness.tracking import results_root

    return results_root() / "optuna"


def storage_url(name: Optional[str] = None) -> str:
    """Where the Optuna studies live, as ``optuna-dashboard`` and :func:`make_storage` take it.

    ``$HARNESS_OPTUNA_STORAGE`` if set (an RDB URL such as ``postgresql+psycopg2://u:p@host/db``
    for several machines, or a journal file path); else the journal file
    ``<results>/optuna/NAME.log``. Without ``name``: the most recently written journal file.

    Raises:
        HarnessError: no ``name`` and no journal file exists yet.
    """
    env = os.environ.get(STORAGE_ENV)
    if env:
        return env
    d = optuna_dir()
    if name is not None:
        return str(d / f"{name}.log")
    logs = sorted(d.glob("*.log"), key=lambda p: p.stat().st_mtime) if d.is_dir() else []
    if not logs:
        raise HarnessError(f"no sweep storage in {d} yet; run `make sweep NAME=...` first (or set {STORAGE_ENV})")
    return str(logs[-1])


def _is_rdb(url: str) -> bool:
    return "://" in url


def redacted_storage_url(name: Optional[str] = None) -> str:
    """:func:`storage_url` with any password replaced by ``***`` (for tags, reports, logs;
    :func:`harness.safety.redact`)."""
    from harness.safety import redact

    return redact(storage_url(name))


def make_storage(name: str) -> "optuna.storages.BaseStorage":
    """Open the storage of study spec ``name`` (:func:`storage_url`).

    Journal file (default): ``JournalStorage(JournalFileBackend(path))``; a killed worker leaves
    its trial RUNNING, found later by :func:`recover_stale_trials`. RDB URL: ``RDBStorage`` with a
    60 s heartbeat (grace 180 s) whose stale trials are failed and retried with the same parameters
    (:func:`retry_failed_trial`), for workers on other machines.

    Raises:
        HarnessError: the RDB cannot be opened (one line).
    """
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend

    url = storage_url(name)
    if _is_rdb(url):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # heartbeat_interval is marked experimental
                return RDBStorage(url, heartbeat_interval=60, grace_period=180, heartbeat_stale_trial_callback=_heartbeat_stale,
                                  engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None)
        except Exception as e:  # driver missing, host unreachable, bad URL
            raise HarnessError(f"{STORAGE_ENV}={redacted_storage_url(name)}: cannot open the Optuna storage ({' '.join(str(e).split())[:300]})") from None
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(url))


def _file_lock(path: str) -> Any:
    """An exclusive ``filelock.FileLock`` on ``path`` (its directory created), used as a context manager."""
    from filelock import FileLock

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)


def _cap_states() -> tuple[Any, ...]:
    from optuna.trial import TrialState

    return tuple(TrialState[s] for s in CAP_STATES_NAMES)


def count_capped(study: "optuna.Study") -> int:
    """Trials counted towards the cap: COMPLETE, PRUNED or RUNNING (WAITING and FAIL are not)."""
    return len(study.get_trials(deepcopy=False, states=_cap_states()))


def open_study(spec: StudySpec, scale: str, storage: Any = None, sampler: Any = None, pruner: Any = None,
               create: bool = True) -> "optuna.Study":
    """Load (or create, with the spec's directions) the study ``NAME@SCALE``.

    Raises:
        HarnessError: the stored study was created from another spec (search space, objective,
        base or seeds changed: :func:`spec_fingerprint`), or does not exist and not ``create``.
    """
    import optuna

    sname = study_name(spec.name or "", scale)
    url = storage_url(spec.name)
    if storage is None and not create and not _is_rdb(url) and not Path(url).is_file():
        raise HarnessError(f"no study {sname!r}: {url} does not exist; run `make sweep NAME={spec.name} SCALE={scale}` first")
    storage = storage if storage is not None else make_storage(spec.name or "")
    fp = spec_fingerprint(spec, scale)
    try:
        study = optuna.load_study(study_name=sname, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        if not create:
            raise HarnessError(f"no study {sname!r} in {redacted_storage_url(spec.name)}; run `make sweep NAME={spec.name} SCALE={scale}` first") from None
        study = optuna.create_study(study_name=sname, storage=storage, directions=spec.directions, sampler=sampler,
                                    pruner=pruner, load_if_exists=True)
        if "spec_fingerprint" not in study.user_attrs:
            study.set_user_attr("spec_fingerprint", fp)
            study.set_user_attr("scale", scale)
            study.set_user_attr("objective", spec.objective)
            study.set_user_attr("objective_metrics", spec.objective_metrics)
    stored = study.user_attrs.get("spec_fingerprint")
    if stored is not None and stored != fp:
        raise HarnessError(f"study {sname!r} in {redacted_storage_url(spec.name)} was created from a different spec "
                           f"(fingerprint {stored} ≠ {fp}: base, scale preset or overrides, search space, objective or seeds changed); "
                           f"delete that study or give the spec a new name")
    return study


def make_sampler(spec: StudySpec, seed: int) -> "optuna.samplers.BaseSampler":
    """The spec's sampler seeded with ``seed``: TPE (multivariate, constant liar: Optuna 5
    defaults; ``n_startup_trials`` random trials first), grid (the product of each parameter's
    grid values) or random."""
    import optuna

    s = spec.sampler
    if s.type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.type == "grid":
        return optuna.samplers.GridSampler(grid_values(spec), seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=s.n_startup_trials, constant_liar=True)


def grid_values(spec: StudySpec) -> dict[str, list[float]]:
    """Grid-sampler values per parameter: the spec's ``grid`` or ``grid_points`` evenly spaced
    values from low to high (geometric spacing for log parameters)."""
    import numpy as np

    out = {}
    for k, p in spec.search_space.items():
        if p.grid is not None:
            out[k] = [float(v) for v in p.grid]
        elif spec.param_log(k):
            out[k] = [float(v) for v in np.geomspace(p.low, p.high, spec.sampler.grid_points)]
        else:
            out[k] = [float(v) for v in np.linspace(p.low, p.high, spec.sampler.grid_points)]
    return out


def effective_cap(spec: StudySpec, scale: str, trials: Optional[int]) -> int:
    """The global trial cap: ``trials`` or the spec's, at most the grid size for a grid sampler."""
    cap = trials if trials is not None else spec.trials_for(scale)
    if spec.sampler.type == "grid":
        cap = min(cap, math.prod(len(v) for v in grid_values(spec).values()))
    return cap


def make_pruner(spec: StudySpec, steps_per_trial: int) -> "optuna.pruners.BasePruner":
    """MedianPruner (warm-up ``ceil(warmup_fraction × steps_per_trial)`` steps) or NopPruner.
    Optuna's MedianPruner prunes when the trial's *best* reported score so far is worse than the
    median of the completed trials' scores at the same step."""
    import optuna

    p = spec.pruner
    if p is None or p.type == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials,
                                       n_warmup_steps=math.ceil(p.warmup_fraction * steps_per_trial),
                                       interval_steps=p.interval_steps)


# ------------------------------------------------------------------------------------------------
# Stale trials
# ------------------------------------------------------------------------------------------------


def trial_stale_reason(trial: Any, this_host: Optional[str] = None, now: Optional[float] = None,
                       only_pids: Optional[set[int]] = None) -> Optional[str]:
    """Why a RUNNING trial is dead, or None if it may be alive.

    A trial records its owner in user attrs ``worker_pid``, ``host`` and ``started_ms`` (epoch
    ms). On this host the owner's liveness decides (:func:`harness.tracking.process_alive`, which
    also rejects a reused pid). A trial without an owner after :data:`ORPHAN_AFTER_S` seconds is
    orphaned (its worker died between creating it and recording itself). Trials of other hosts
    are left to the RDB heartbeat. ``only_pids`` restricts the check to those owners.
    """
    from harness.tracking import host, process_alive

    this_host = this_host or host()
    now = time.time() if now is None else now
    attrs = trial.user_attrs
    pid = attrs.get("worker_pid")
    if pid is None:
        started = trial.datetime_start.timestamp() if trial.datetime_start is not None else now
        if now - started > ORPHAN_AFTER_S:
            return f"no worker recorded {now - started:.0f} s after the trial started (its worker died?)"
        return None
    if only_pids is not None and int(pid) not in only_pids:
        return None
    if attrs.get("host") != this_host:
        return None
    if process_alive(int(pid), attrs.get("started_ms")):
        return None
    return "its worker process died (killed?) while the trial was RUNNING (pid and host are in the trial's attributes)"


def retry_failed_trial(study: "optuna.Study", trial: Any) -> None:
    """Enqueue a retry of failed ``trial`` with the same parameters (user attrs ``retry_of`` and
    ``attempt``), unless it already had :data:`MAX_ATTEMPTS` attempts."""
    attempt = int(trial.user_attrs.get("attempt", 1))
    if attempt >= MAX_ATTEMPTS or not trial.params:
        return
    study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number, "attempt": attempt + 1},
                        skip_if_exists=False)


def _heartbeat_stale(study: "optuna.Study", trial: Any) -> None:
    """RDB heartbeat callback: a trial whose worker (on any machine) stopped beating was failed by
    Optuna; retry it and mark its MLflow run FAILED (tracking URI from this process's env)."""
    retry_failed_trial(study, trial)
    run_id = trial.user_attrs.get("mlflow_run_id")
    if run_id:
        with contextlib.suppress(Exception):
            from harness import tracking

            c = tracking.client()
            c.set_tag(run_id, "state", "failed")
            tracking.fail_run(c, run_id, "no heartbeat from its worker (killed?; pid and host are in the trial's "
                                         "attributes); retried")


def recover_stale_trials(study: "optuna.Study", c: Optional["MlflowClient"] = None, experiment_id: Optional[str] = None,
                         parent_run_id: Optional[str] = None, only_pids: Optional[set[int]] = None,
                         scale: str = "") -> list[tuple[int, str]]:
    """Fail the RUNNING trials whose worker is dead (:func:`trial_stale_reason`) and retry them.

    For each: user attr ``fail_reason`` set, state FAIL, a retry enqueued
    (:func:`retry_failed_trial`); its MLflow run (user attr ``mlflow_run_id``) marked FAILED with
    tag ``state=failed``, or, if the worker died before creating one, a FAILED child run created
    (under ``parent_run_id``) so that every trial has exactly one run.
    Returns ``[(trial number, reason), ...]``.
    """
    from optuna.trial import TrialState

    from harness import tracking

    storage = study._storage  # the public Study API cannot end another process's trial
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        reason = trial_stale_reason(t, only_pids=only_pids)
        if reason is None:
            continue
        with contextlib.suppress(Exception):
            storage.set_trial_user_attr(t._trial_id, "fail_reason", reason)
        try:
            if not storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                continue
        except Exception:  # finished meanwhile
            continue
        retry_failed_trial(study, t)
        out.append((t.number, reason))
        if c is None:
            continue
        run_id = t.user_attrs.get("mlflow_run_id")
        try:
            if run_id is None:
                if experiment_id is None:
                    continue
                tags = _trial_tags(study.study_name.split("@")[0], scale, t.number, t.user_attrs, parent_run_id)
                run_id = c.create_run(experiment_id, run_name=f"trial-{t.number:04d}", tags=tags).info.run_id
                tracking.log_params(c, run_id, dict(t.params))
            c.set_tag(run_id, "state", "failed")
            tracking.fail_run(c, run_id, reason)  # also a run FINISHED just before the worker died
        except Exception:  # the store is unreachable: the trial is failed all the same
            pass
    return out


def _trial_tags(name: str, scale: str, number: int, attrs: dict[str, Any], parent_run_id: Optional[str]) -> dict[str, str]:
    tags = {"kind": "child", "role": "trial", "study": name, "scale": scale, "trial_number": str(number),
            "attempt": str(attrs.get("attempt", 1)), "state": "running", "optuna.storage": redacted_storage_url(name)}
    if attrs.get("retry_of") is not None:
        tags["retry_of"] = str(attrs["retry_of"])
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    return tags


# ------------------------------------------------------------------------------------------------
# Callbacks
# ------------------------------------------------------------------------------------------------


class PruningCallback(Callback):
    """Report the proxy score ``objective/score`` of every iteration to an Optuna trial and prune.

    ``trial.report(score, step)`` with ``step = offset + iteration`` (seeds of a trial run one
    after another, so step ``k·T + t`` is seed ``k``'s iteration ``t``); then if
    ``trial.should_prune()`` raise ``optuna.TrialPruned`` — the PPO loop propagates exceptions
    from callbacks, so the run stops there (Optuna's pruning protocol; Akiba et al. 2019).
    A non-finite score is not reported.
    """

    def __init__(self, trial: "optuna.Trial", offset: int = 0, metric: str = "objective/score") -> None:
        self.trial, self.offset, self.metric = trial, int(offset), metric
        self.last_step: Optional[int] = None
        self.last_value: Optional[float] = None

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        """Report, then raise ``optuna.TrialPruned`` if the pruner says so."""
        import optuna

        v = metrics.get(self.metric)
        if v is None or not math.isfinite(float(v)):
            return
        step = self.offset + int(iteration)
        self.trial.report(float(v), step)
        self.last_step, self.last_value = step, float(v)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} ({self.metric} = {float(v):.4g})")


class _Offset(Callback):
    """Forward ``on_start``, ``on_metrics`` and ``on_samples`` to ``inner`` with iterations
    shifted by ``offset`` (one trial's seeds share one MLflow run)."""

    def __init__(self, inner: Callback, offset: int) -> None:
        self.inner, self.offset = inner, int(offset)

    def on_start(self, cfg: Any, info: dict[str, Any]) -> None:
        self.inner.on_start(cfg, info)

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        self.inner.on_metrics(self.offset + iteration, metrics)

    def on_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        self.inner.on_samples(self.offset + iteration, samples)


# ------------------------------------------------------------------------------------------------
# Worker side
# ------------------------------------------------------------------------------------------------


@dataclass
class SweepJob:
    """Everything a worker needs: plain data, picklable."""

    name: str
    scale: str
    spec: dict[str, Any]
    cap: int
    max_failed: int
    lock_path: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    out_root: str
    git_sha: str
    sampler_seed: int
    report_mlflow_samples: bool = True


class _OverCap(Exception):
    """This trial was created beyond the global cap by a process on another machine."""


def _spec_from(job: SweepJob) -> StudySpec:
    spec = StudySpec.model_validate(job.spec)
    spec.name = job.name
    return spec


def _should_stop(study: "optuna.Study", job: SweepJob) -> Optional[str]:
    from optuna.trial import TrialState

    if count_capped(study) >= job.cap:
        return "cap reached"
    if len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,))) >= job.max_failed:
        return f"{job.max_failed} failed trials"
    return None


def sweep_worker(job: SweepJob, index: int, events: Any = None, init: bool = True) -> None:
    """Worker process entry: one torch thread; loop over trials of the shared study until the cap.

    Each iteration takes the study's file lock, stops if COMPLETE+PRUNED+RUNNING ≥ cap (or too
    many trials failed), else creates the next trial with ``study.optimize(n_trials=1)`` — the
    objective releases the lock as soon as the trial exists — and runs it. ``init``: set up the
    process as a worker (:func:`harness.ablate._init_worker`: 1 torch thread, no SIGINT, dies with
    its parent); False when the loop runs inside the calling process.
    """
    import optuna

    from harness.ablate import _init_worker

    if init:
        _init_worker(events)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    spec = _spec_from(job)
    steps = len(spec.seeds_for(job.scale)) * resolve_trial_config(spec, job.scale, None, 0).ppo.total_iterations
    study = open_study(spec, job.scale, sampler=make_sampler(spec, job.sampler_seed), pruner=make_pruner(spec, steps))
    from harness.tracking import client

    c = client(job.tracking_uri)
    while True:
        lock = _file_lock(job.lock_path)
        t_lock = time.perf_counter()
        lock.acquire()
        lock_wait = time.perf_counter() - t_lock
        held = [True]

        def release() -> None:
            if held[0]:
                held[0] = False
                lock.release()

        try:
            if _should_stop(study, job):
                break
            study.optimize(lambda t: _objective(t, job, spec, c, study, index, release, lock_wait), n_trials=1,
                           catch=(Exception,), gc_after_trial=False, show_progress_bar=False)
        finally:
            release()


def _objective(trial: "optuna.Trial", job: SweepJob, spec: StudySpec, c: "MlflowClient", study: "optuna.Study",
               index: int, release: Any, lock_wait: float = 0.0) -> Any:
    """One trial: record the owner, release the lock, sample, run every seed, return the value(s).
    User attrs: ``worker_pid``, ``host``, ``started_ms``, ``worker``, ``mlflow_run_id``,
    ``lock_wait_s`` (seconds waited for the cap lock) and ``cpu_s`` (this process's CPU seconds)."""
    import optuna

    from harness import tracking
    from harness.ablate import ProgressCallback, _emit, _one_line, _output_to

    cpu0 = time.process_time()
    pid = os.getpid()
    trial.set_user_attr("worker_pid", pid)
    trial.set_user_attr("host", tracking.host())
    trial.set_user_attr("started_ms", int(time.time() * 1000))
    trial.set_user_attr("worker", index)
    trial.set_user_attr("lock_wait_s", round(lock_wait, 4))
    release()
    n = trial.number
    over = sum(t.number < n for t in study.get_trials(deepcopy=False, states=_cap_states()))
    params = {k: trial.suggest_float(k, p.low, p.high, log=spec.param_log(k)) for k, p in spec.search_space.items()}
    seeds = spec.seeds_for(job.scale)
    cfgs = [resolve_trial_config(spec, job.scale, params, s) for s in seeds]
    attrs = dict(trial.user_attrs)
    tags = {**_trial_tags(job.name, job.scale, n, attrs, job.parent_run_id), "worker": str(index),
            "worker_pid": str(pid), "git_sha": job.git_sha, "mlflow.source.git.commit": job.git_sha,
            "config_hash": _run_hash(cfgs[0]),
            "optuna.study_name": study.study_name, **tracking.owner_tags()}
    run_id = c.create_run(job.experiment_id, run_name=f"trial-{n:04d}", tags=tags).info.run_id
    trial.set_user_attr("mlflow_run_id", run_id)
    _emit("start", n, pid)
    out_dir = Path(job.out_root) / f"trial-{n:04d}"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = out_dir / "run.log"
    mlcb = tracking.MLflowCallback(c, run_id)
    pruning = PruningCallback(trial) if not spec.multi_objective else None
    summaries: list[dict[str, Any]] = []
    try:
        if over >= job.cap:
            raise _OverCap(f"trial {n} was created beyond the cap of {job.cap} (another machine got there first)")
        cfg_dict = cfgs[0].to_dict()
        cfg_dict.pop("seed", None)
        tracking.log_params(c, run_id, {**params, **cfg_dict, "seeds": ",".join(map(str, seeds))})
        from harness.ppo import train

        with _output_to(log_file):
            for i, cfg in enumerate(cfgs):
                offset = i * cfg.ppo.total_iterations
                cbs: list[Callback] = [_Offset(mlcb, offset), _Offset(ProgressCallback(str(n)), offset)]
                if pruning is not None:
                    pruning.offset = offset
                    cbs.append(pruning)
                try:
                    summaries.append(train(cfg, out_dir / f"seed{cfg.seed}", cbs, progress=False))
                finally:
                    mlcb.flush()
        values = [float(sum(_metric(s, m) for s in summaries) / len(summaries)) for m in spec.objective_metrics]
        for v in values:
            if not math.isfinite(v):
                raise HarnessError(f"objective is {v} (non-finite)")
        _log_trial_end(c, run_id, summaries, seeds, spec, "complete", values)
        c.log_artifact(run_id, str(log_file))
        c.set_terminated(run_id, "FINISHED")
        trial.set_user_attr("cpu_s", round(time.process_time() - cpu0, 3))
        _emit("end", n, "COMPLETE")
        return values[0] if len(values) == 1 else values
    except optuna.TrialPruned as e:
        with contextlib.suppress(Exception):
            trial.set_user_attr("cpu_s", round(time.process_time() - cpu0, 3))
        last = pruning.last_value if pruning is not None else None
        with contextlib.suppress(Exception):
            _log_trial_end(c, run_id, summaries, seeds, spec, "pruned", [last] if last is not None else [],
                           extra={"pruned_at_step": float(pruning.last_step) if pruning and pruning.last_step is not None else float("nan")})
            c.set_tag(run_id, "pruned_reason", str(e))
            c.log_artifact(run_id, str(log_file))
            c.set_terminated(run_id, "FINISHED")
        _emit("end", n, "PRUNED")
        raise
    except BaseException as e:
        reason = _one_line(e)
        with contextlib.suppress(Exception):
            trial.set_user_attr("fail_reason", reason)
        with contextlib.suppress(Exception):
            c.set_tag(run_id, "state", "failed")
            if log_file.exists():
                c.log_artifact(run_id, str(log_file))
            tracking.fail_run(c, run_id, reason, status="FAILED" if isinstance(e, Exception) else "KILLED")
        _emit("end", n, "FAIL")
        raise


def _run_hash(cfg: Config) -> str:
    from harness.ablate import run_hash

    return run_hash(cfg)


def _metric(summary: dict[str, Any], metric: str) -> float:
    """``eval_final/gold`` → ``summary["eval_final"]["gold"]``."""
    node: Any = summary
    for part in metric.split("/"):
        node = node[part]
    return float(node)


def _log_trial_end(c: "MlflowClient", run_id: str, summaries: list[dict[str, Any]], seeds: list[int], spec: StudySpec,
                   state: str, values: list[Any], extra: Optional[dict[str, float]] = None) -> None:
    """Trial-level metrics: ``value`` (``value/<metric>`` per objective when multi-objective),
    the mean over seeds of every numeric summary leaf (``final/gold`` ...), per seed
    ``seed<k>/final/*``; tag ``state``; each seed's ``summary.json`` as an artifact."""
    from harness.tracking import log_metric_dict

    m: dict[str, float] = dict(extra or {})
    if values:
        if len(values) == 1:
            m["value"] = float(values[0])
        else:
            for name, v in zip(spec.objective_metrics, values):
                m[f"value/{name.split('/')[-1]}"] = float(v)
    leaves: dict[str, list[float]] = {}
    for seed, s in zip(seeds, summaries):
        for k, v in flatten(s).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                leaves.setdefault(k.replace(".", "/"), []).append(float(v))
        for k in ("gold", "score", "kl"):
            if k in s.get("final", {}):
                m[f"seed{seed}/final/{k}"] = float(s["final"][k])
    for k, vs in leaves.items():
        m[k] = sum(vs) / len(vs)
    m["seeds_finished"] = float(len(summaries))
    log_metric_dict(c, run_id, m)
    c.set_tag(run_id, "state", state)
    for seed, s in zip(seeds, summaries):
        c.log_text(run_id, json.dumps(s, indent=2, default=str), f"summaries/seed{seed}.json")


# ------------------------------------------------------------------------------------------------
# Parent side
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

    def __enter__(self) -> "_Display":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

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
        """Worker events: ``start`` (pid), ``iter`` (iterations done), ``end`` (state)."""
        key = str(key)
        if kind == "start":
            self.end(key)
            self.rows[key] = self.progress.add_task(f"  trial #{key} (pid {value})", total=self.steps)
        elif kind == "iter" and key in self.rows:
            self.progress.update(self.rows[key], completed=int(value))
        elif kind == "end":
            self.end(key)

    def end(self, key: str) -> None:
        """Remove a trial's row."""
        row = self.rows.pop(key, None)
        if row is not None:
            self.progress.remove_task(row)


def _sampler_seed(spec: StudySpec, n_existing: int, index: int, spawn: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([spec.sampler.seed, n_existing, index, spawn]).generate_state(1)[0])


def _run_workers(job_base: SweepJob, spec: StudySpec, study: "optuna.Study", workers: int, display: _Display,
                 console: Any, c: "MlflowClient", max_respawns: int) -> dict[str, Any]:
    """Start ``workers`` spawned worker processes; replace one that dies (after failing and
    retrying its trial) while work is left; return ``{"pids": [...], "respawns": k, "died": [...]}``."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    # one event queue per worker: a worker killed while it holds its queue's lock cannot block the others
    queues: list[Any] = []
    procs: dict[int, Any] = {}
    pids: list[int] = []
    died: list[dict[str, Any]] = []
    spawned = [0]
    n_existing = len(study.get_trials(deepcopy=False))

    def spawn(index: int) -> None:
        job = SweepJob(**{**asdict(job_base), "sampler_seed": _sampler_seed(spec, n_existing, index, spawned[0])})
        events = ctx.Queue()
        queues.append(events)
        p = ctx.Process(target=sweep_worker, args=(job, index, events), name=f"sweep-worker-{index}", daemon=False)
        p.start()
        spawned[0] += 1
        procs[index] = p
        pids.append(p.pid)

    def drain() -> None:
        for events in queues:
            while True:
                try:
                    ev = events.get_nowait()
                except (queue_mod.Empty, EOFError, OSError, ValueError):
                    break
                display.event(*ev)

    respawns = 0
    try:
        for i in range(workers):
            spawn(i)
        last_refresh = 0.0
        while procs:
            drain()
            if time.time() - last_refresh > 1.0:
                display.refresh(study)
                last_refresh = time.time()
            for i, p in list(procs.items()):
                if p.is_alive():
                    continue
                p.join()
                del procs[i]
                if p.exitcode != 0:
                    rec = recover_stale_trials(study, c, job_base.experiment_id, job_base.parent_run_id,
                                               only_pids={p.pid}, scale=job_base.scale)
                    died.append({"pid": p.pid, "exitcode": p.exitcode, "trials": [n for n, _ in rec]})
                    for n, _ in rec:
                        display.end(str(n))
                    console.print(f"[yellow]worker {i} (pid {p.pid}) died with exit code {p.exitcode}[/]; "
                                  f"trial(s) {[n for n, _ in rec] or 'none'} failed and queued for retry")
                    if respawns < max_respawns and _should_stop(study, job_base) is None:
                        respawns += 1
                        spawn(i)
            time.sleep(0.2)
        drain()
    except BaseException:
        for p in procs.values():
            with contextlib.suppress(Exception):
                p.kill()
        for p in procs.values():
            with contextlib.suppress(Exception):
                p.join(timeout=5)
        recover_stale_trials(study, c, job_base.experiment_id, job_base.parent_run_id,
                             only_pids={p.pid for p in procs.values()}, scale=job_base.scale)
        raise
    finally:
        display.refresh(study)
        for events in queues:
            with contextlib.suppress(Exception):
                events.close()
                events.join_thread()
    return {"pids": pids, "respawns": respawns, "died": died}


def _n_finished(study: "optuna.Study") -> int:
    return sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))


def _trial_counts(study: "optuna.Study") -> dict[str, int]:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    return {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}


def run_sweep(name: str, trials: Optional[int] = None, scale: str = "smoke", workers: int = 2, progress: bool = True,
              report: bool = True, spec: Optional[StudySpec] = None, inprocess: bool = False) -> Path:
    """Run (or resume) study ``name`` at ``scale`` until ``trials`` trials are COMPLETE, PRUNED
    or RUNNING, in ``workers`` processes sharing one Optuna study; then write the report.

    Steps in the module docstring. Safe to run again: it resumes (a finished study starts no new
    trial); trials left RUNNING by killed workers are failed and retried; the cap is exact.

    Args:
        name: spec name (``ablations/studies/NAME.yaml``).
        trials: global trial cap (default: the spec's for ``scale``).
        scale: ``smoke`` | ``default`` | ``full``.
        workers: worker processes (≥ 1), one torch thread each.
        progress: show the rich display (stderr).
        report: write ``reports/NAME/`` at the end (:func:`write_study_report`, including the
            re-evaluation on fresh seeds).
        spec: an already validated spec (default: loaded from the file).
        inprocess: run the single worker's loop in this process (``workers`` must be 1; for tests
            and debugging: no process start-up, but this process's torch threads are used as set).
    Returns:
        The report path, or the sweep's output directory when ``report`` is False.
    Raises:
        HarnessError / ConfigError: unknown study or scale, invalid spec (before any compute),
        a stored study from another spec, storage errors. Failing *trials* never raise.
    """
    import optuna
    from rich.console import Console

    from harness import tracking
    from harness.pipeline import build_pipeline

    if workers < 1:
        raise HarnessError(f"--workers: must be ≥ 1, got {workers}")
    if inprocess and workers != 1:
        raise HarnessError(f"inprocess runs one worker, got workers={workers}")
    scale_overrides(scale)
    spec = spec or load_study_spec(name)
    cap = effective_cap(spec, scale, trials)
    console = Console(stderr=True, quiet=not progress)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    storage = make_storage(name)
    study = open_study(spec, scale, storage=storage)
    uri = tracking.tracking_uri()
    c = tracking.init_store(uri)
    exp_id = tracking.experiment_id(c, experiment_name(name))
    from harness.ablate import run_hash

    base_hash = run_hash(resolve_trial_config(spec, scale, None, 0))
    if "base_config_hash" not in study.user_attrs:
        study.set_user_attr("base_config_hash", base_hash)
    elif study.user_attrs["base_config_hash"] != base_hash:
        console.print(f"[yellow]note[/]: the resolved default config of {study.study_name} changed since the study started "
                      f"({study.user_attrs['base_config_hash']} → {base_hash}: code defaults changed?); new trials are not "
                      "strictly comparable with earlier ones")
    for n, reason in recover_stale_trials(study, c, exp_id, None, scale=scale):
        console.print(f"[yellow]trial {n} failed[/] ({reason}); queued for retry")
    tracking.mark_stale_runs(c, exp_id)
    out_root = tracking.results_root() / "sweeps" / name / scale
    lock_path = str(optuna_dir() / f"{name}@{scale}.lock")
    max_failed = spec.max_failed_trials or max(cap, 3)
    base_cfg = resolve_trial_config(spec, scale, None, 0)
    steps = len(spec.seeds_for(scale)) * base_cfg.ppo.total_iterations

    job = SweepJob(name=name, scale=scale, spec=spec.model_dump(mode="json"), cap=cap, max_failed=max_failed,
                   lock_path=lock_path, tracking_uri=uri, experiment_id=exp_id, parent_run_id="",
                   out_root=str(out_root), git_sha="unknown", sampler_seed=0)
    stop = _should_stop(study, job)
    if stop:
        counts = _trial_counts(study)
        console.print(f"study {study.study_name}: nothing to run ({stop}: {count_capped(study)}/{cap}; "
                      f"{counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed)")
    else:
        for seed in spec.seeds_for(scale):  # stage keys include the seed: build each one here, not in racing workers
            build_pipeline(resolve_trial_config(spec, scale, None, seed))
        sha = tracking.git_sha()
        parent = c.create_run(exp_id, run_name=f"{name}-{scale}-{time.strftime('%Y%m%d-%H%M%S')}", tags={
            "kind": "parent", "role": "sweep", "study": name, "scale": scale, "workers": str(workers), "cap": str(cap),
            "optuna.study_name": study.study_name, "optuna.storage": redacted_storage_url(name), "git_sha": sha,
            "mlflow.source.git.commit": sha, **tracking.owner_tags()})
        job.parent_run_id, job.git_sha = parent.info.run_id, sha
        t0 = time.time()
        before = len(study.get_trials(deepcopy=False))
        try:
            c.log_text(parent.info.run_id, study_spec_path(name).read_text() if (studies_dir() / f"{name}.yaml").is_file()
                       else yaml.safe_dump(job.spec), "study.yaml")
            label = f"{study.study_name} [cap {cap}, {workers} worker{'s' if workers > 1 else ''}]"
            display = _Display(label, cap, steps, spec.multi_objective, enabled=progress)
            with display:
                info = {"pids": [], "died": [], "respawns": 0}
                if inprocess:
                    job.sampler_seed = _sampler_seed(spec, before, 0, 0)
                    sweep_worker(job, 0, None, init=False)
                    display.refresh(study)
                for _round in range(0 if inprocess else 3):  # a worker that died last may leave work: fresh workers pick it up
                    finished_before = _n_finished(study)
                    more = _run_workers(job, spec, study, workers, display, console, c, max_respawns=2 * workers)
                    for k in info:
                        info[k] += more[k]
                    if _should_stop(study, job) is not None:
                        break
                    if _n_finished(study) == finished_before:
                        raise HarnessError(f"study {study.study_name}: the workers stopped without finishing a trial "
                                           f"({len(info['died'])} died); see the messages above")
            counts = _trial_counts(study)
            tracking.log_metric_dict(c, parent.info.run_id, {
                "trials/new": len(study.get_trials(deepcopy=False)) - before, "trials/complete": counts["complete"],
                "trials/pruned": counts["pruned"], "trials/failed": counts["fail"], "sweep/wall_s": time.time() - t0,
                "workers/died": len(info["died"])})
            c.set_terminated(parent.info.run_id, "FINISHED")
        except KeyboardInterrupt:
            tracking.fail_run(c, parent.info.run_id, "interrupted (Ctrl-C)", status="KILLED")
            raise
        except BaseException as e:
            tracking.fail_run(c, parent.info.run_id, " ".join(f"{type(e).__name__}: {e}".split())[:500])
            raise
        counts = _trial_counts(study)
        console.print(f"study {study.study_name}: {count_capped(study)}/{cap} trials "
                      f"({counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed) "
                      f"in {time.time() - t0:.1f} s")
    if report:
        from harness.study_report import write_study_report

        return write_study_report(name, scale=scale, workers=workers, progress=progress, spec=spec)
    return out_root


__all__ = [
    "STORAGE_ENV", "storage_url", "make_storage", "open_study", "count_capped", "recover_stale_trials",
    "retry_failed_trial", "trial_stale_reason", "PruningCallback", "run_sweep",
]
