"""MLflow tracking: an embedded sqlite store, nested runs, batched metrics, stale-run recovery.

Layout (embedded default, no server needed)::

    <results>/mlflow.db          sqlite backend store (one per results directory)
    <results>/mlartifacts/...    artifact root of every experiment created here

``MLFLOW_TRACKING_URI`` overrides the store (e.g. ``http://host:5000`` for a shared server).

Conventions shared by ablations and studies:

- one experiment per ablation (``ablation/<name>``), one *parent* run per invocation (tag ``kind=parent``), one
  *child* run per (variant, seed) (tag ``kind=child`` and ``mlflow.parentRunId``);
- every run records the process that owns it (tags ``pid``, ``host``), so that a run left ``RUNNING`` by a process
  killed with SIGKILL can be recognised later (:func:`mark_stale_runs`) and marked ``FAILED`` with a
  ``failure_reason`` tag;
- per-iteration metrics are buffered and written with ``MlflowClient.log_batch`` (:class:`MLflowCallback`): one
  ``log_metric`` call costs ~7 ms on sqlite, a batch of 300 points ~40 ms (measured, ``shared/reference/tooling.md``).

The store must be created once by the parent process before any worker opens it: several processes migrating a
fresh sqlite schema at once fail (mlflow#4123). :func:`init_store` does that.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

from harness.rl.callbacks import HELDOUT_DIR, Callback
from harness.config import default_results_dir, flatten

if TYPE_CHECKING:  # mlflow takes ~2.5 s to import; only pay for it where it is used
    from mlflow import MlflowClient
    from mlflow.entities import Run

#: MLflow's own limits per ``log_batch`` call.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE_CHARS = 6000

#: Run statuses that mean "this run will not change any more".
TERMINAL = ("FINISHED", "FAILED", "KILLED")


# ------------------------------------------------------------------------------------------------
# Store location
# ------------------------------------------------------------------------------------------------


def results_root() -> Path:
    """Absolute results directory (``$HARNESS_RESULTS/results`` or ``./results``)."""
    return Path(default_results_dir()).resolve()


def tracking_uri() -> str:
    """The MLflow tracking URI: ``$MLFLOW_TRACKING_URI`` if set, else the embedded sqlite store
    ``sqlite:///<results>/mlflow.db`` (absolute path, so workers in any CWD agree)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{results_root() / 'mlflow.db'}"


def display_uri(uri: str) -> str:
    """``uri`` as it may be printed or committed: credentials replaced by ``***``
    (:func:`harness.infra.safety.redact`: ``http://user:pw@host`` → ``http://user:***@host``) and a sqlite store inside this project written
    relative to the project root (``sqlite:///results/mlflow.db``); any other absolute sqlite path
    becomes ``sqlite:///<outside the project>/<file name>``."""
    from harness.infra.safety import redact

    uri = redact(uri)
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        if path.is_absolute():
            root = Path(__file__).resolve().parents[2]
            try:
                return f"sqlite:///{path.resolve().relative_to(root)}"
            except ValueError:
                return f"sqlite:///<outside the project>/{path.name}"
    return uri


def artifact_root() -> Optional[str]:
    """Artifact root for new experiments: None (the server's default) for a tracking server (``http(s)://…``,
    ``databricks``); else a local directory, ``<sqlite file's directory>/mlartifacts`` or ``<results>/mlartifacts``
    (MLflow's own fallback for a database it opens directly is ``./mlruns`` of the working directory)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.split(":", 1)[0].lower() in ("http", "https", "databricks", "databricks-uc"):
        return None
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":
        return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
    return (results_root() / "mlartifacts").as_uri()


def _quiet_mlflow() -> None:
    """Silence MLflow's INFO chatter (schema migration notices) on the console."""
    import logging

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow prints "View run … at: <tracking URI>" when a run ends, credentials included: never
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    import mlflow  # noqa: F401  (configures its loggers on import; lower them afterwards)

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def client(uri: Optional[str] = None) -> "MlflowClient":
    """An ``MlflowClient`` on ``uri`` (default :func:`tracking_uri`). Does not create anything;
    use :func:`init_store` once in the parent process first.

    Raises:
        ServiceError: a server or database store does not answer within ``$HARNESS_CONNECT_TIMEOUT``
            seconds (:func:`harness.infra.services.check_tracking_store`; checked once per process).
    """
    from harness.infra.services import check_tracking_store

    uri = uri or tracking_uri()
    check_tracking_store(uri)
    _quiet_mlflow()
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def init_store(uri: Optional[str] = None) -> "MlflowClient":
    """Create (and migrate) the tracking store once; return a client.

    Concurrent schema migration of a fresh sqlite file fails (mlflow#4123: ``duplicate column
    name``), so the first opening runs under an exclusive file lock (``filelock``) next to the store
    (``<results>/.mlflow-store.lock`` for a server URI): independent invocations on this machine
    (two ablations started at once on a store that does not exist yet) migrate it one after the
    other. Call this in the parent before starting worker processes. The results directory (and the
    embedded store's) is created first and must be writable.

    Raises:
        HarnessError: the results directory is not writable (:func:`harness.infra.services.check_writable`).
        ServiceError: the store is unreachable, empty or corrupt (:func:`harness.infra.services.check_tracking_store`).
    """
    from filelock import FileLock

    from harness.infra.services import check_writable

    uri = uri or tracking_uri()
    check_writable(results_root(), "the results directory")
    results_root().mkdir(parents=True, exist_ok=True)
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        check_writable(db.parent, "the MLflow store's directory")
        db.parent.mkdir(parents=True, exist_ok=True)
        lock_path = db.with_name(f".{db.name}.lock")
    else:
        lock_path = results_root() / ".mlflow-store.lock"
    with FileLock(str(lock_path)):
        c = client(uri)
        c.search_experiments(max_results=1)  # opens the store: creates tables / runs migrations
    return c


def experiment_id(c: "MlflowClient", name: str, create: bool = True) -> Optional[str]:
    """The id of experiment ``name``; created (artifacts under :func:`artifact_root`) if missing
    and ``create``. A deleted experiment of that name is restored. Returns None if missing and
    not ``create``."""
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    if not create:
        return None
    root = artifact_root()
    location = f"{root}/{name.replace('/', '-')}" if root else None
    try:
        return c.create_experiment(name, artifact_location=location)
    except Exception:  # created meanwhile by a concurrent process
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


# ------------------------------------------------------------------------------------------------
# Provenance
# ------------------------------------------------------------------------------------------------


def git_sha(repo: Optional[Path] = None) -> str:
    """The HEAD commit of the repository holding this package (``+dirty`` when tracked files other
    than the generated ``reports/`` and the ablation specs ``ablations/`` have uncommitted changes: rewriting a
    committed report is not a code change, and what a spec changes in a run is in the run's own resolved config and
    its hash), or ``"unknown"`` (no git, no commit yet)."""
    repo = repo or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports",
                                ":(exclude)ablations"], cwd=repo, capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def host() -> str:
    """This machine's host name (recorded as the ``host`` tag of every run)."""
    return socket.gethostname()


def process_alive(pid: int, started_ms: Optional[int] = None) -> bool:
    """Whether process ``pid`` on this host is alive and is the one that started at or before
    ``started_ms`` (epoch ms; a process created later is a reused pid, i.e. the original is dead).
    Zombies count as dead."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if started_ms is not None and proc.create_time() * 1000.0 > started_ms + 2000.0:
            return False
        return True
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def owner_tags() -> dict[str, str]:
    """Tags identifying the process that owns a run: ``pid`` and ``host``."""
    return {"pid": str(os.getpid()), "host": host()}


# ------------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------------


def search_all(c: "MlflowClient", experiment_ids: list[str], filter_string: str = "") -> list["Run"]:
    """Every run matching ``filter_string`` (all pages), newest first."""
    out: list[Run] = []
    token = None
    while True:
        page = c.search_runs(experiment_ids, filter_string=filter_string, max_results=1000,
                             order_by=["attributes.start_time DESC"], page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _param_str(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return s[:MAX_PARAM_VALUE_CHARS]


def log_params(c: "MlflowClient", run_id: str, params: dict[str, Any]) -> None:
    """Log a (possibly nested) dict as params, flattened to dotted keys (``ppo.kl_coef``),
    in batches of at most 100 (MLflow's limit). Paths are written as :func:`harness.infra.safety.display_path`
    shows them (relative to the project, or ``~/...``: no user name in a shared store) and URIs redacted."""
    from mlflow.entities import Param

    from harness.infra.safety import display_path, redact

    def shown(v: Any) -> str:
        s = _param_str(v)
        return display_path(s) if s.startswith("/") else redact(s)

    flat = flatten(params)
    items = [Param(k, shown(v)) for k, v in sorted(flat.items())]
    for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
        c.log_batch(run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])


def log_metric_points(c: "MlflowClient", run_id: str, points: list[Any]) -> None:
    """Write ``mlflow.entities.Metric`` points with ``log_batch``, at most 1000 per call (MLflow's limit)."""
    for i in range(0, len(points), MAX_METRICS_PER_BATCH):
        c.log_batch(run_id, metrics=points[i : i + MAX_METRICS_PER_BATCH])


def log_metric_dict(c: "MlflowClient", run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    """Log ``{name: value}`` at ``step`` in one batch; non-numeric values are skipped."""
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    items = [Metric(k, float(v), ts, step) for k, v in metrics.items() if _is_number(v)]
    for i in range(0, len(items), MAX_METRICS_PER_BATCH):
        c.log_batch(run_id, metrics=items[i : i + MAX_METRICS_PER_BATCH])


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def fail_run(c: "MlflowClient", run_id: str, reason: str, status: str = "FAILED") -> None:
    """Mark a run ``FAILED`` (or ``KILLED``) and record ``reason`` (one line, ≤ 500 chars, redacted by
    :func:`harness.infra.safety.one_line`) in the ``failure_reason`` tag."""
    from harness.infra.safety import one_line

    line = one_line(reason, 500)
    c.set_tag(run_id, "failure_reason", line)
    c.set_terminated(run_id, status)


def run_is_stale(run: "Run", parents: dict[str, "Run"], this_host: Optional[str] = None) -> Optional[str]:
    """Why a ``RUNNING`` run is in fact dead, or None if it may still be alive.

    When the owner process (tags ``pid``/``host``) is on this host, its liveness decides. Otherwise
    a child run is stale when its parent invocation has ended (parent status not RUNNING, e.g.
    because it was itself found stale). ``parents`` maps parent run ids to their (refreshed) runs.
    Runs owned by another host with a live parent cannot be checked and are assumed alive.
    """
    this_host = this_host or host()
    tags = run.data.tags
    pid, run_host = tags.get("pid"), tags.get("host")
    if run_host == this_host and pid and pid.isdigit():  # the owner can be checked directly
        if process_alive(int(pid), run.info.start_time):
            return None
        return "its worker process died (killed?) while the run was RUNNING (its pid and host are in the run's tags)"
    parent_id = tags.get("mlflow.parentRunId")
    if parent_id:
        parent = parents.get(parent_id)
        if parent is None:
            return f"its parent run {parent_id} no longer exists"
        if parent.info.status != "RUNNING":
            return f"its parent invocation {parent_id} ended ({parent.info.status}) while the run was RUNNING"
    return None


def mark_stale_runs(c: "MlflowClient", experiment_id: str) -> list[tuple[str, str]]:
    """Find runs left ``RUNNING`` by killed processes in ``experiment_id`` and mark them FAILED.

    Parents (invocations) are checked first, then children, so that the children of a killed
    invocation are caught even when their own worker pid was reused.
    Returns ``[(run_id, reason), ...]`` of the runs marked.
    """
    running = search_all(c, [experiment_id], "attributes.status = 'RUNNING'")
    marked: list[tuple[str, str]] = []
    this_host = host()
    parent_ids = {r.data.tags.get("mlflow.parentRunId") for r in running} - {None}
    parents: dict[str, Run] = {}
    for pid in parent_ids:
        try:
            parents[pid] = c.get_run(pid)
        except Exception:
            pass
    # 1) parents (runs that have no parent themselves)
    for run in running:
        if run.data.tags.get("mlflow.parentRunId"):
            continue
        reason = run_is_stale(run, {}, this_host)
        if reason:
            fail_run(c, run.info.run_id, reason)
            marked.append((run.info.run_id, reason))
            if run.info.run_id in parents:
                parents[run.info.run_id] = c.get_run(run.info.run_id)
    # 2) children
    for run in running:
        if not run.data.tags.get("mlflow.parentRunId"):
            continue
        reason = run_is_stale(run, parents, this_host)
        if reason:
            fail_run(c, run.info.run_id, reason)
            marked.append((run.info.run_id, reason))
    return marked


# ------------------------------------------------------------------------------------------------
# The loop callback
# ------------------------------------------------------------------------------------------------


class MLflowCallback(Callback):
    """Send one PPO run's metrics, samples and summary to an existing MLflow run.

    - ``on_metrics``: buffered; written with ``MlflowClient.log_batch`` every ``flush_every`` iterations and at the
      end (step = iteration, timestamp = when the loop reported it).
    - ``on_eval``: the held-out evaluation's ``eval/*`` metrics, buffered the same way (step = PPO iterations done).
    - ``on_samples``: ``samples/iter_XXXX.json`` artifact (list of ``{prompt, response, score, gold}``), written at
      once so a crashed run keeps what it had.
    - ``on_heldout``: ``heldout/iter_XXXX.json`` artifact (every held-out response of that evaluation: texts, token
      ids, gold and proxy scores), so that a new judge re-scores the run without training (``harness rescore``).
    - ``on_end``: flushes, then logs every numeric leaf of the summary as a metric with ``/`` joined names
      (``final/score``, ``eval_final/gold``, ``eval_peak/iteration``, ``wall_time_s`` ...), plus ``last/<metric>``:
      the mean of each per-iteration metric over the last ``ceil(10%)`` of iterations (the summary's ``final``
      window), and ``summary.json`` as an artifact. The run's status is not changed here: its owner ends it.

    Args:
        client: an ``MlflowClient`` on the store holding ``run_id``.
        run_id: the run to log into (already created).
        flush_every: iterations buffered between two ``log_batch`` calls (≥ 1).
    """

    def __init__(self, client: "MlflowClient", run_id: str, flush_every: int = 10) -> None:
        self.client = client
        self.run_id = run_id
        self.flush_every = max(1, int(flush_every))
        self._buffer: list[Any] = []
        self._pending_iters = 0
        self._history: dict[str, list[float]] = {}
        self.n_logged = 0

    def on_start(self, cfg: Any, info: dict[str, Any]) -> None:
        """Record the device, the CPU kernels (``kernels``, :func:`harness.pipeline.stage.kernel_path`), the pipeline draw
        (``replicate``), the pipeline's stage cache keys (``pipeline.<stage>``) and the digests of their saved weights
        (``digest.<stage>``) as tags."""
        for tag in ("device", "kernels", "replicate"):
            if tag in info:
                self.client.set_tag(self.run_id, tag, str(info[tag]))
        for stage, key in (info.get("pipeline_keys") or {}).items():
            self.client.set_tag(self.run_id, f"pipeline.{stage}", str(key))
        for stage, digest in (info.get("pipeline_digests") or {}).items():
            self.client.set_tag(self.run_id, f"digest.{stage}", str(digest))

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        """Buffer one iteration's metrics; flush every ``flush_every`` iterations."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        for k, v in metrics.items():
            if _is_number(v):
                self._buffer.append(Metric(k, float(v), ts, int(iteration)))
                self._history.setdefault(k, []).append(float(v))
        self._pending_iters += 1
        if self._pending_iters >= self.flush_every:
            self.flush()

    def on_eval(self, iteration: int, metrics: dict[str, float]) -> None:
        """Buffer one evaluation's metrics at step ``iteration`` (no ``last/*`` window for them)."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), ts, int(iteration)) for k, v in metrics.items() if _is_number(v))

    def flush(self) -> None:
        """Write the buffered metrics now (in ``log_batch`` calls of ≤ 1000 points)."""
        buf, self._buffer, self._pending_iters = self._buffer, [], 0
        log_metric_points(self.client, self.run_id, buf)
        self.n_logged += len(buf)

    def on_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        """Log ``samples/iter_XXXX.json``."""
        self.client.log_text(self.run_id, json.dumps({"iteration": iteration, "samples": samples}, indent=2),
                             f"samples/iter_{iteration:04d}.json")

    def on_heldout(self, iteration: int, heldout: dict[str, Any]) -> None:
        """Log ``heldout/iter_XXXX.json``: the evaluation's held-out responses, kept with the run and its archive."""
        self.client.log_text(self.run_id, json.dumps(heldout, separators=(",", ":")), f"{HELDOUT_DIR}/iter_{iteration:04d}.json")

    def on_end(self, summary: dict[str, Any]) -> None:
        """Flush, log the summary's numbers as ``final/*`` etc., ``last/*``, and ``summary.json``."""
        self.flush()
        final = {k.replace(".", "/"): v for k, v in flatten(summary).items() if _is_number(v)}
        for k, values in self._history.items():
            window = values[-max(1, math.ceil(0.1 * len(values))):]
            finite = [v for v in window if math.isfinite(v)]
            if finite:
                final[f"last/{k}"] = sum(finite) / len(finite)
        log_metric_dict(self.client, self.run_id, final, step=int(summary.get("iterations", 0) or 0))
        self.client.log_text(self.run_id, json.dumps(summary, indent=2, default=str), "summary.json")


def copy_run(c: "MlflowClient", src: "Run", experiment_id: str, tags: dict[str, str]) -> str:
    """Copy a FINISHED run into ``experiment_id``: its params, every metric's full history, its
    artifacts and its tags (overridden by ``tags``), with the source's start and end times; the copy
    is tagged ``copied_from = <source run id>``. Returns the new run's id.

    Raises:
        MlflowException: the store refuses a write (the partial copy is marked FAILED first).
    """
    import tempfile

    from mlflow.entities import Metric

    src_id = src.info.run_id
    keep = {k: v for k, v in src.data.tags.items() if not k.startswith("mlflow.") or k == "mlflow.source.git.commit"}
    run = c.create_run(experiment_id, start_time=src.info.start_time, run_name=tags.get("mlflow.runName"),
                       tags={**keep, **tags, "copied_from": src_id})
    rid = run.info.run_id
    try:
        log_params(c, rid, dict(src.data.params))
        log_metric_points(c, rid, [Metric(m.key, m.value, m.timestamp, m.step) for key in sorted(src.data.metrics)
                                   for m in c.get_metric_history(src_id, key)])
        with tempfile.TemporaryDirectory() as tmp:
            if c.list_artifacts(src_id):
                c.log_artifacts(rid, c.download_artifacts(src_id, "", tmp))
        c.set_terminated(rid, "FINISHED", end_time=src.info.end_time)
    except BaseException as e:
        fail_run(c, rid, f"copy of run {src_id} failed: {' '.join(str(e).split())[:300]}")
        raise
    return rid


def iter_children(runs: Iterable["Run"]) -> list["Run"]:
    """The child runs (tag ``kind=child``) among ``runs``."""
    return [r for r in runs if r.data.tags.get("kind") == "child"]
