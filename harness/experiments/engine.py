"""The execution engine: every ablation run and every sweep trial is a Ray task.

On a laptop :func:`connect` starts a local Ray instance with one CPU per worker, so ``make ablate``
needs nothing more; with ``$RAY_ADDRESS`` (or ``--address``) it joins a running cluster, and the
same tasks are scheduled on its nodes. A task declares its resources: one CPU, and one GPU when its
config asks for CUDA (Ray sets ``CUDA_VISIBLE_DEVICES``, so each run sees only its own GPU).

Ray's retries replace hand-written dead-worker handling: a task whose worker process or node dies is
re-run (``max_retries``); the task itself marks its dead attempt's MLflow run FAILED before starting
a new one (:func:`harness.experiments.ablate.execute_run`), so a run is never FINISHED twice.

Progress: workers put small events (``("iter", key, 12)``) on a Ray queue that the driver drains
(:func:`emit`, :class:`Pool`).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from harness.errors import HarnessError, one_line

#: Environment variable naming a running Ray cluster (Ray's own).
ADDRESS_ENV = "RAY_ADDRESS"
#: How many times Ray re-runs a task whose worker process or node died (attempts in all: 1 + this).
MAX_RETRIES = 2

#: The workers' environment: no tokenizers thread pool (one CPU per task), no warnings in run logs.
_WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
#: Ray internals a local instance does without: per-process metrics, per-task state events (the state
#: API and dashboard timeline) and asio handler statistics all cost CPU that training needs on a small box.
_LOCAL_SYSTEM_CONFIG = {"enable_metrics_collection": False, "task_events_report_interval_ms": 0, "event_stats": False}

#: How often (seconds) a driver refreshes the record of the Ray processes it started (:func:`record_local`).
_RECORD_EVERY_S = 10.0

_REMOTE: Any = None  # the Ray remote function of _call, made once per process
_RECORDED_AT = 0.0  # when this driver last wrote its record (0: it started no local instance)
_EVENTS: Any = None  # this worker's event queue (a ray.util.queue.Queue), set by the task wrapper


def connect(workers: int, address: Optional[str] = None) -> str:
    """Connect this process to Ray once: the cluster at ``address`` or ``$RAY_ADDRESS``, else a new
    local instance with this machine's CPUs (at least ``workers``) and the GPUs Ray detects; how many
    tasks run at once is capped by the caller (:class:`Pool` users submit at most ``workers``). A local
    instance has no dashboard, metrics or task-event reporting (:data:`_LOCAL_SYSTEM_CONFIG`); workers'
    output is not echoed here (each run writes its own ``run.log``).

    Returns:
        ``"local (N CPUs)"`` or the cluster address, for messages.
    Raises:
        ServiceError: nothing answers at the cluster's address within ``$HARNESS_CONNECT_TIMEOUT`` seconds.
        HarnessError: ``workers`` < 1; the cluster refuses the connection (one line); a local instance asked
            for from a thread other than the main one (Ray ties its processes' lives to the thread that
            starts them with ``PR_SET_PDEATHSIG``, so they would all die when that thread ends).
    """
    import threading

    import ray

    if workers < 1:
        raise HarnessError(f"--workers: must be ≥ 1, got {workers}")
    address = address or os.environ.get(ADDRESS_ENV) or None
    if ray.is_initialized():
        return address or "local"
    if not address and threading.current_thread() is not threading.main_thread():
        raise HarnessError("a local Ray instance must be started from the main thread (its processes die with the "
                           "thread that starts them): call harness.experiments.engine.connect() there first")
    check_reachable(address)
    try:
        if address:
            ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": _WORKER_ENV})
            return address
        # A local instance's workers inherit this process's environment; a runtime_env would keep Ray
        # from using the workers it prestarts (each first task would wait for a new worker).
        for k, v in _WORKER_ENV.items():
            os.environ.setdefault(k, v)
        # Ray turns token authentication on for a new local instance when RAY_AUTH_MODE is unset and says so
        # in a warning banner on every run; that one logger is quietened (the security stays as Ray sets it).
        import logging

        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        cpus = max(workers, os.cpu_count() or 1)  # how many run at once is the caller's cap (Pool), not Ray's
        # address="local": a new instance even when another one runs on this machine (Ray would otherwise
        # join the latest one that `ray start` or a test cluster left behind, and refuse num_cpus).
        reap_stale()  # the processes of a local instance whose driver was killed (kill -9 runs no clean-up)
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 _system_config=_LOCAL_SYSTEM_CONFIG)
        record_local()
    except Exception as e:  # unreachable head, version mismatch, bad address
        raise HarnessError(f"{ADDRESS_ENV}={address!r}: cannot connect to Ray ({' '.join(str(e).split())[:300]})"
                           if address else f"cannot start a local Ray instance ({' '.join(str(e).split())[:300]})") from None
    return f"local ({cpus} CPUs)"


def check_reachable(address: Optional[str] = None) -> None:
    """Check, within ``$HARNESS_CONNECT_TIMEOUT`` seconds, that the cluster at ``address`` (else
    ``$RAY_ADDRESS``) accepts connections; nothing to check for a local instance. Commands call this
    before building pipelines, so an unreachable cluster costs seconds, not a pipeline build.

    Raises:
        ServiceError: unreachable (one line naming the redacted address).
    """
    address = address or os.environ.get(ADDRESS_ENV) or None
    if address:
        from harness.infra.services import check_ray_address

        check_ray_address(address)


def shutdown() -> None:
    """Disconnect from Ray (stopping a local instance this process started, and dropping its record)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _drop_record()


def _drop_record() -> None:
    """Remove this driver's record of its Ray processes (they ended with it), if it wrote one."""
    global _RECORDED_AT
    if _RECORDED_AT:
        with contextlib.suppress(OSError):
            _record_path(os.getpid()).unlink(missing_ok=True)
        _RECORDED_AT = 0.0


def records_dir() -> Path:
    """Where each driver that started a local Ray instance records its processes: ``<tmp>/harness-ray`` (one per
    machine, as the processes are; ``$HARNESS_RAY_RECORDS`` overrides it)."""
    import tempfile

    return Path(os.environ.get("HARNESS_RAY_RECORDS") or Path(tempfile.gettempdir()) / "harness-ray")


def _record_path(pid: int) -> Path:
    return records_dir() / f"driver-{pid}.json"


def _identity(proc: Any) -> list[Any]:
    """``[pid, create time]``: a process, told apart from a later one given the same pid."""
    return [proc.pid, proc.create_time()]


def record_local() -> None:
    """Record this driver and every process its local Ray instance runs now (its descendants: GCS, raylet, the
    dashboard and runtime-env agents, workers), each by pid and create time, with the session directory, in
    ``records_dir()/driver-<pid>.json``. Called after ``ray.init`` and again every :data:`_RECORD_EVERY_S` s while
    tasks are awaited (agents and workers start after the instance), so that a driver killed with SIGKILL leaves a
    record from which the next driver reaps what it left (:func:`reap_stale`). Never raises: a driver that cannot
    record its processes still runs."""
    global _RECORDED_AT
    import json

    import psutil

    with contextlib.suppress(Exception):
        import ray

        me = psutil.Process()
        session = ray._private.worker._global_node.get_session_dir_path()
        procs = []
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                procs.append(_identity(child))
        record = {"driver": _identity(me), "session": session, "procs": procs}
        path = _record_path(me.pid)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
        if not _RECORDED_AT:  # a clean exit drops the record (Ray's own exit hook stops the processes)
            import atexit

            atexit.register(_drop_record)
        _RECORDED_AT = time.monotonic()


def _alive(identity: list[Any]) -> Optional[Any]:
    """The process of ``[pid, create time]`` if it still runs (the same process, not a new one with its pid)."""
    import psutil

    try:
        proc = psutil.Process(int(identity[0]))
        return proc if abs(proc.create_time() - float(identity[1])) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE \
            else None
    except (psutil.Error, ValueError, TypeError, IndexError):
        return None


def reap_stale(timeout: float = 10.0) -> list[int]:
    """Kill the Ray processes that drivers no longer running left behind: for each record of
    :func:`record_local` whose driver is gone (by pid and create time, so a live driver's instance is never
    touched), every recorded process still running as that same process (pid and create time: never by name), then
    drop the record. Returns the pids killed. Never raises."""
    import json
    import signal

    import psutil

    killed: list[int] = []
    folder = records_dir()
    for path in sorted(folder.glob("driver-*.json")) if folder.is_dir() else []:
        with contextlib.suppress(Exception):
            record = json.loads(path.read_text())
            if _alive(record["driver"]) is not None:
                continue
            procs = [p for p in (_alive(i) for i in record.get("procs", [])) if p is not None]
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(signal.SIGKILL)
                    killed.append(proc.pid)
            psutil.wait_procs(procs, timeout=timeout)
            path.unlink(missing_ok=True)
    return killed


def resources(config: dict[str, Any]) -> dict[str, float]:
    """Ray resources of one run of ``config`` (a resolved config as a dict): ``{"num_cpus": 1,
    "num_gpus": 1}`` when ``config["device"]`` is ``"cuda"``, or ``"auto"`` on a cluster that has
    GPUs; else ``{"num_cpus": 1, "num_gpus": 0}``."""
    import ray

    device = str(config.get("device", "auto"))
    gpus = device == "cuda" or (device == "auto" and ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0)
    return {"num_cpus": 1, "num_gpus": 1 if gpus else 0}


def in_task() -> bool:
    """Is this process running an ablation's task (a Ray worker inside :func:`_call`)?"""
    return _EVENTS is not None


def emit(*event: Any) -> None:
    """Send a progress event to the driver (a no-op outside a task; never raises)."""
    if _EVENTS is not None:
        with contextlib.suppress(Exception):
            _EVENTS.put_nowait(event)


def node_id() -> str:
    """The Ray node this process runs on (``""`` outside Ray): tagged on every run as ``ray_node``."""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def _call(fn: Callable[..., Any], events: Any, args: tuple[Any, ...]) -> Any:
    """Task body: set up the worker (one torch thread per CPU of the task, events to ``events``), run ``fn``."""
    global _EVENTS
    import ray
    import torch

    _EVENTS = events
    threads = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    torch.set_num_threads(threads)
    try:
        return fn(*args)
    finally:
        _EVENTS = None


class Pool:
    """Ray tasks in flight, keyed, with the driver's event queue.

    ``submit(key, fn, *args, resources=..., retries=...)`` starts ``fn(*args)`` as a task;
    ``wait()`` yields ``(key, result, error)`` for each finished task (``error`` is the exception
    Ray raised when the task was lost after its retries, e.g. ``WorkerCrashedError``); events put by
    workers go to ``on_event(kind, key, value)``. ``cancel()`` force-stops everything in flight.
    """

    def __init__(self, on_event: Callable[..., None]) -> None:
        from ray.util.queue import Queue

        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.on_event = on_event
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
        self.events = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})  # on the driver's node
        self.refs: dict[Any, str] = {}

    def __len__(self) -> int:
        return len(self.refs)

    def submit(self, key: str, fn: Callable[..., Any], *args: Any, resources: dict[str, float], retries: int = MAX_RETRIES) -> None:
        """Start ``fn(*args)`` as a Ray task with ``resources``, re-run up to ``retries`` times if its worker dies."""
        global _REMOTE
        import ray

        if _REMOTE is None:
            _REMOTE = ray.remote(_call)
        remote = _REMOTE.options(max_retries=retries, retry_exceptions=False, **resources)
        self.refs[remote.remote(fn, self.events, args)] = key

    def drain(self) -> None:
        """Hand the queued worker events to ``on_event`` (one actor call when there are none, two otherwise)."""
        try:
            n = self.events.qsize()
            batch = self.events.get_nowait_batch(n) if n else []
        except Exception:
            return
        for ev in batch:
            self.on_event(*ev)

    def wait(self, timeout: float = 0.2) -> Iterator[tuple[str, Any, Optional[BaseException]]]:
        """Wait up to ``timeout`` s; yield ``(key, result, None)`` or ``(key, None, error)`` per finished task."""
        import ray

        if _RECORDED_AT and time.monotonic() - _RECORDED_AT > _RECORD_EVERY_S:
            record_local()  # the agents and workers started since the last record
        if not self.refs:
            time.sleep(timeout)
            return
        done, _ = ray.wait(list(self.refs), num_returns=len(self.refs), timeout=timeout, fetch_local=True)
        self.drain()
        for ref in done:
            key = self.refs.pop(ref)
            try:
                yield key, ray.get(ref), None
            except Exception as e:  # the task was lost: worker or node died after every retry, or it could not run
                yield key, None, e

    def cancel(self) -> None:
        """Force-stop every task in flight (their workers are killed) and forget them. Tasks already finished are
        not cancelled: force-cancelling one whose reply is arriving can abort Ray's core worker in the driver
        (a failed internal check, seen on Ctrl-C), so the driver would die instead of exiting as interrupted."""
        import ray

        pending = list(self.refs)
        with contextlib.suppress(Exception):
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=0, fetch_local=False)
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True, recursive=True)
        self.refs.clear()
        with contextlib.suppress(Exception):
            ray.kill(self.events.actor)


def describe_error(e: BaseException) -> str:
    """One line for a lost task: ``its worker process died ...`` / ``its node died ...`` / the error."""
    import ray.exceptions as rex

    if isinstance(e, rex.NodeDiedError):
        return "its node died (removed or unreachable)"
    if isinstance(e, (rex.WorkerCrashedError, rex.OutOfMemoryError)):
        return "its worker process died (out of memory or killed?)"
    if isinstance(e, rex.TaskCancelledError):
        return "cancelled"
    return one_line(e)


__all__ = ["ADDRESS_ENV", "MAX_RETRIES", "connect", "shutdown", "records_dir", "record_local", "reap_stale", "resources", "emit", "node_id", "Pool", "describe_error"]
