"""One sweep trial, as a Ray task: its PPO runs (one per seed), its MLflow run, its pruning reports.

The driver (:func:`harness.experiments.sweep.run_sweep`) asks the study for the trial and samples its parameters;
:func:`run_trial` trains the trial's config on every seed, reports the proxy score to the trial
through the study's storage after every iteration (so the driver's pruner can stop it), and returns
the outcome for the driver to ``tell`` the study. It never raises for a failing trial.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from harness.rl.callbacks import Callback
from harness.config import flatten
from harness.experiments.engine import emit
from harness.experiments.study_spec import StudySpec, held_out_metric, resolve_trial_config

if TYPE_CHECKING:
    import optuna
    from mlflow import MlflowClient


@dataclass
class TrialJob:
    """Everything a worker needs for one trial: plain data, picklable."""

    name: str
    scale: str
    spec: dict[str, Any]
    study_name: str
    storage: str  # the Optuna storage URL or journal path (harness.experiments.sweep.storage_url)
    trial_id: int
    number: int
    params: dict[str, float]
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    out_root: str
    git_sha: str
    attrs: dict[str, Any] = field(default_factory=dict)  # the trial's user attrs (attempt, retry_of)


class PruningCallback(Callback):
    """Report ``metric`` to an Optuna trial and prune: the proxy score ``objective/score`` of every iteration, or a
    held-out metric (``eval/gold``) at every held-out evaluation.

    ``trial.report(value, step)`` with ``step = offset + iteration`` (seeds of a trial run one
    after another, so step ``k·T + t`` is seed ``k``'s iteration ``t``; an evaluation after ``t`` iterations is step
    ``k·T + t``, so seed ``k``'s last evaluation and seed ``k+1``'s first share a step, where Optuna keeps the first);
    then if ``trial.should_prune()`` raise ``optuna.TrialPruned`` — the PPO loop propagates exceptions
    from callbacks, so the run stops there (Optuna's pruning protocol; Akiba et al. 2019).
    A non-finite value is not reported.
    """

    def __init__(self, trial: "optuna.Trial", offset: int = 0, metric: str = "objective/score") -> None:
        self.trial, self.offset, self.metric = trial, int(offset), metric
        self.last_step: Optional[int] = None
        self.last_value: Optional[float] = None

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        """Report an iteration metric (the proxy score), then raise ``optuna.TrialPruned`` if the pruner says so."""
        if not self.metric.startswith("eval/"):
            self._observe(iteration, metrics)

    def on_eval(self, iteration: int, metrics: dict[str, float]) -> None:
        """Report a held-out metric (``eval/gold``) after ``iteration`` iterations, then prune as :meth:`on_metrics`."""
        if self.metric.startswith("eval/"):
            self._observe(iteration, metrics)

    def _observe(self, iteration: int, metrics: dict[str, float]) -> None:
        import optuna

        v = metrics.get(self.metric)
        if v is None or not math.isfinite(float(v)):
            return
        step = self.offset + int(iteration)
        self.trial.report(float(v), step)
        self.last_step, self.last_value = step, float(v)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} ({self.metric} = {float(v):.4g})")


class LastEval(Callback):
    """Remember the last held-out value of each constraint metric (``eval_final/distinct_2`` is read as the
    iteration metric ``eval/distinct_2``), so that a pruned trial still states how it stood on its constraints."""

    def __init__(self, metrics: list[str]) -> None:
        self.names = {m: held_out_metric(m) for m in metrics}
        self.values: dict[str, float] = {}

    def on_eval(self, iteration: int, metrics: dict[str, float]) -> None:
        """Keep the finite values of the tracked metrics this held-out evaluation gave."""
        for m, name in self.names.items():
            v = metrics.get(name)
            if v is not None and math.isfinite(float(v)):
                self.values[m] = float(v)


def record_constraints(trial: Any, spec: StudySpec, summaries: list[dict[str, Any]],
                       last: Optional[dict[str, float]] = None) -> dict[str, float]:
    """Set the trial's constraint violations (Optuna's ``Trial.set_constraint``: ``min − value``, feasible when ≤ 0)
    from the mean over its finished seeds' summaries of each constraint metric, or, for a trial stopped before any
    seed finished, from ``last`` (the last held-out values seen). A metric with no value is left unset (Optuna then
    treats the trial as feasible on it) and absent from the result.

    Returns:
        ``{metric: value}`` of the metrics that had a value (also the trial's user attr ``constraint_values``).
    """
    values: dict[str, float] = {}
    for c in spec.constraints:
        vs = [v for v in (_finite_metric(s, c.metric) for s in summaries) if v is not None]
        v = sum(vs) / len(vs) if vs else (last or {}).get(c.metric)
        if v is not None and math.isfinite(v):
            values[c.metric] = float(v)
            trial.set_constraint(c.metric, c.min - float(v))
    if spec.constraints:
        trial.set_user_attr("constraint_values", values)
    return values


def _finite_metric(summary: dict[str, Any], metric: str) -> Optional[float]:
    """:func:`_metric`, or None where the summary lacks it or it is not finite."""
    try:
        v = _metric(summary, metric)
    except (KeyError, TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


class _Offset(Callback):
    """Forward ``on_start``, ``on_metrics``, ``on_samples``, ``on_eval`` and ``on_heldout`` to ``inner`` with iterations
    shifted by ``offset`` (one trial's seeds share one MLflow run, so its held-out curves run on across seeds)."""

    def __init__(self, inner: Callback, offset: int) -> None:
        self.inner, self.offset = inner, int(offset)

    def on_start(self, cfg: Any, info: dict[str, Any]) -> None:
        self.inner.on_start(cfg, info)

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        self.inner.on_metrics(self.offset + iteration, metrics)

    def on_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        self.inner.on_samples(self.offset + iteration, samples)

    def on_eval(self, iteration: int, metrics: dict[str, float]) -> None:
        self.inner.on_eval(self.offset + iteration, metrics)

    def on_heldout(self, iteration: int, heldout: dict[str, Any]) -> None:
        self.inner.on_heldout(self.offset + iteration, heldout)


def trial_tags(name: str, scale: str, number: int, attrs: dict[str, Any], storage: str, study_name: str,
               git_sha: str = "", parent_run_id: str = "") -> dict[str, str]:
    """MLflow tags of the child run of trial ``number`` of study spec ``name`` (``attrs``: the trial's
    user attrs, for ``attempt`` and ``retry_of``; ``storage`` is recorded with any password redacted)."""
    from harness.infra.safety import redact

    tags = {"kind": "child", "role": "trial", "study": name, "scale": scale, "trial_number": str(number),
            "attempt": str(attrs.get("attempt", 1)), "state": "running", "optuna.storage": redact(storage),
            "optuna.study_name": study_name, "git_sha": git_sha, "mlflow.source.git.commit": git_sha}
    if attrs.get("retry_of") is not None:
        tags["retry_of"] = str(attrs["retry_of"])
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    return tags


def _metric(summary: dict[str, Any], metric: str) -> float:
    """``eval_final/gold`` → ``summary["eval_final"]["gold"]``."""
    node: Any = summary
    for part in metric.split("/"):
        node = node[part]
    return float(node)


def run_trial(job: TrialJob) -> dict[str, Any]:
    """Run trial ``job.number`` (a Ray task body; never raises for a failing trial).

    Creates the trial's MLflow child run (tags :func:`trial_tags` plus owner pid and host; the
    run id in the trial's user attr ``mlflow_run_id``, the worker in ``worker_pid``/``host``), logs
    the parameters and resolved config, trains every seed of the scale with :class:`PruningCallback`
    (single-objective studies) and the MLflow callback, and ends the run FINISHED (tag ``state``
    ``complete`` or ``pruned``) or FAILED with its reason.

    Returns:
        ``{"number", "state": "COMPLETE"|"PRUNED"|"FAIL", "values": [...], "reason", "run_id", "cpu_s"}``.
    """
    import optuna

    from harness.infra import tracking
    from harness.experiments.ablate import _output_to
    from harness.errors import one_line

    cpu0 = time.process_time()
    spec = StudySpec.model_validate(job.spec)
    spec.name = job.name
    out: dict[str, Any] = {"number": job.number, "state": "FAIL", "values": [], "reason": None, "run_id": None, "cpu_s": 0.0}
    emit("start", job.number, os.getpid())
    try:
        study = optuna.load_study(study_name=job.study_name, storage=_storage(job.storage), pruner=_pruner(spec, job.scale))
        trial = optuna.trial.Trial(study, job.trial_id)
        trial.set_user_attr("worker_pid", os.getpid())
        trial.set_user_attr("host", tracking.host())
        seeds = spec.seeds_for(job.scale)
        cfgs = [resolve_trial_config(spec, job.scale, job.params, s) for s in seeds]
        c = tracking.client(job.tracking_uri)
        from harness.experiments.ablate import run_hash

        run_id = c.create_run(job.experiment_id, run_name=f"trial-{job.number:04d}", tags={
            **trial_tags(job.name, job.scale, job.number, job.attrs, job.storage, job.study_name, job.git_sha,
                         job.parent_run_id), "config_hash": run_hash(cfgs[0]), **tracking.owner_tags()}).info.run_id
    except Exception as e:  # the storage or the store is unreachable
        out["reason"] = f"could not start the trial: {one_line(e)}"
        emit("end", job.number, "FAIL")
        return out
    out["run_id"] = run_id
    trial.set_user_attr("mlflow_run_id", run_id)
    out_dir = Path(job.out_root) / f"trial-{job.number:04d}"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = out_dir / "run.log"
    mlcb = tracking.MLflowCallback(c, run_id)
    pruning = PruningCallback(trial, metric=spec.pruner.metric if spec.pruner else "objective/score") \
        if not spec.multi_objective else None
    held_out = LastEval([c.metric for c in spec.constraints])
    summaries: list[dict[str, Any]] = []
    try:
        cfg_dict = cfgs[0].to_dict()
        cfg_dict.pop("seed", None)
        tracking.log_params(c, run_id, {**job.params, **cfg_dict, "seeds": ",".join(map(str, seeds))})
        with _output_to(log_file):
            _train_seeds(cfgs, out_dir, job.number, mlcb, pruning, summaries, [held_out])
        record_constraints(trial, spec, summaries)
        values = [float(sum(_metric(s, m) for s in summaries) / len(summaries)) for m in spec.objective_metrics]
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"objective is {values} (non-finite)")
        _log_trial_end(c, run_id, summaries, seeds, spec, "complete", values)
        out.update(state="COMPLETE", values=values)
    except optuna.TrialPruned as e:
        last = pruning.last_value if pruning is not None else None
        extra = {"pruned_at_step": float(pruning.last_step) if pruning and pruning.last_step is not None else float("nan")}
        with contextlib.suppress(Exception):
            record_constraints(trial, spec, summaries, held_out.values)
        with contextlib.suppress(Exception):
            _log_trial_end(c, run_id, summaries, seeds, spec, "pruned", [last] if last is not None else [], extra)
            c.set_tag(run_id, "pruned_reason", str(e))
        out.update(state="PRUNED", reason=str(e))
    except Exception as e:  # diverged, non-finite objective, ...: recorded, the sweep goes on
        out["reason"] = one_line(e)
    out["cpu_s"] = round(time.process_time() - cpu0, 3)
    _close_trial(trial, c, run_id, log_file, out)
    emit("end", job.number, out["state"])
    return out


def _train_seeds(cfgs: list[Any], out_dir: Path, number: int, mlcb: Any, pruning: Optional["PruningCallback"],
                 summaries: list[dict[str, Any]], extra: Optional[list[Callback]] = None) -> None:
    """Train the trial's configs one seed after another, appending each run summary to ``summaries``; each seed's
    iterations are logged after the previous seeds' (``_Offset``), so the pruner sees one increasing step axis.

    Raises:
        optuna.TrialPruned: the pruner stopped the trial; whatever :func:`harness.rl.ppo.train` raises.
    """
    from harness.experiments.ablate import ProgressCallback
    from harness.rl.runner import run as train_run

    for i, cfg in enumerate(cfgs):
        offset = i * cfg.ppo.total_iterations
        cbs: list[Callback] = [_Offset(mlcb, offset), _Offset(ProgressCallback(str(number)), offset), *(extra or [])]
        if pruning is not None:
            pruning.offset = offset
            cbs.append(pruning)
        try:
            summaries.append(train_run(cfg, out_dir / f"seed{cfg.seed}", cbs, progress=False))
        finally:
            mlcb.flush()


def _close_trial(trial: Any, c: Any, run_id: str, log_file: Path, out: dict[str, Any]) -> None:
    """Record the trial's outcome: its CPU seconds (and failure reason) as Optuna user attrs, the run log as an
    MLflow artifact, and the MLflow run ended FINISHED, or FAILED with its reason. Store errors are swallowed:
    the trial's result is already in ``out``."""
    from harness.infra import tracking

    with contextlib.suppress(Exception):
        trial.set_user_attr("cpu_s", out["cpu_s"])
        if out["state"] == "FAIL":
            trial.set_user_attr("fail_reason", out["reason"])
    with contextlib.suppress(Exception):
        if log_file.exists():
            c.log_artifact(run_id, str(log_file))
        if out["state"] == "FAIL":
            c.set_tag(run_id, "state", "failed")
            tracking.fail_run(c, run_id, out["reason"])
        else:
            c.set_terminated(run_id, "FINISHED")


def _storage(url: str) -> Any:
    from harness.experiments.study_storage import open_storage

    return open_storage(url)


def _pruner(spec: StudySpec, scale: str) -> Any:
    from harness.experiments.study_storage import make_pruner

    steps = len(spec.seeds_for(scale)) * resolve_trial_config(spec, scale, None, 0).ppo.total_iterations
    return make_pruner(spec, steps)


def _log_trial_end(c: "MlflowClient", run_id: str, summaries: list[dict[str, Any]], seeds: list[int], spec: StudySpec,
                   state: str, values: list[Any], extra: Optional[dict[str, float]] = None) -> None:
    """Trial-level metrics: ``value`` (``value/<metric>`` per objective when multi-objective),
    the mean over seeds of every numeric summary leaf (``final/gold`` ...), per seed
    ``seed<k>/final/*``; tag ``state``; each seed's ``summary.json`` as an artifact."""
    from harness.infra.tracking import log_metric_dict

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


__all__ = ["TrialJob", "PruningCallback", "LastEval", "record_constraints", "run_trial", "trial_tags"]
