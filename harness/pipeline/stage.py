"""The stage cache of the pipeline: :func:`run_stage` builds a stage once, in a temporary directory renamed
into place under a file lock, keyed by :func:`stage_key`; :class:`StageRunner` runs one pipeline's stages in
order (timed, one line each on stderr). A task's stage builders use these without importing the pipeline
runner (:mod:`harness.pipeline`), which imports the tasks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import yaml
from filelock import FileLock

from harness.config import Config, fingerprint

STAGE_FILE = "stage.json"



def stage_key(stage_config: dict[str, Any], inputs: dict[str, str]) -> str:
    """12-hex-digit sha256 of ``{"config": stage_config, "inputs": inputs}`` (sorted JSON).

    Raises:
        TypeError: ``stage_config`` is not JSON-serialisable.
    """
    return fingerprint({"config": stage_config, "inputs": inputs})


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False))
    os.replace(tmp, path)


def run_stage(
    out_dir: str | Path,
    name: str,
    stage_config: dict[str, Any],
    inputs: dict[str, str],
    build: Callable[[Path], dict],
    force: bool = False,
) -> tuple[Path, dict, bool]:
    """Return the cached stage ``<out_dir>/<name>/<key>`` or build it with ``build(tmp_dir) -> metrics``.

    A stage is complete iff its ``stage.json`` exists. A build writes into a temporary sibling directory,
    then ``config.yaml`` and ``stage.json`` are added and the directory is renamed into place. ``force``
    rebuilds (replacing the old directory). Every build of a key holds its lock, so the temporary directories of that
    key found under the lock (``.KEY.tmp-PID``: a build killed mid-way) are stale and are removed, cached or not.

    Returns:
        ``(stage_dir, record, cached)``; ``record`` is the ``stage.json`` content (``stage``, ``key``,
        ``config``, ``inputs``, ``metrics``, ``build_time_s``, ``created_at``, ``weights_sha256``: the
        :func:`weights_digest` of the built directory, added once to a record written before it existed; ``kernels``:
        the :func:`kernel_path` it was built with, absent from a record written before it was recorded).

    Raises:
        whatever ``build`` raises (the temporary directory is removed).
    """
    key = stage_key(stage_config, inputs)
    root = Path(out_dir) / name
    final = root / key
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{key}.lock")):
        for stale in root.glob(f".{key}.tmp-*"):  # a build killed mid-way; under the lock no build of this key is live
            shutil.rmtree(stale, ignore_errors=True)
        if not force and (final / STAGE_FILE).is_file():
            record = json.loads((final / STAGE_FILE).read_text())
            if "weights_sha256" not in record:  # a stage built before digests were recorded: hashed once, here
                record["weights_sha256"] = weights_digest(final)
                _write_json_atomic(final / STAGE_FILE, record)
            return final, record, True
        tmp = root / f".{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        t0 = time.perf_counter()
        try:
            with _quiet_datasets():
                metrics = build(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        record = {
            "stage": name,
            "key": key,
            "config": stage_config,
            "inputs": inputs,
            "metrics": metrics,
            "build_time_s": round(time.perf_counter() - t0, 3),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "weights_sha256": weights_digest(tmp),
            "kernels": kernel_path(),
        }
        (tmp / "config.yaml").write_text(yaml.safe_dump({name: stage_config, "inputs": inputs}, sort_keys=False))
        _write_json_atomic(tmp / STAGE_FILE, record)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final, record, False


@contextlib.contextmanager
def _quiet_libraries():
    """Silence transformers' shard-writing bars and known deprecation chatter during a build (``datasets``' bars:
    :func:`_quiet_datasets`, around each stage that is built)."""
    import transformers

    tlog = transformers.utils.logging
    tf_bars = tlog.is_progress_bar_enabled()
    verbosity = tlog.get_verbosity()
    tlog.disable_progress_bar()
    tlog.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # e.g. `gradient_checkpointing` renamed in transformers 6
            yield
    finally:
        if tf_bars:
            tlog.enable_progress_bar()
        tlog.set_verbosity(verbosity)


@contextlib.contextmanager
def _quiet_datasets():
    """Silence ``datasets``' map bars while a stage is built. Entered only on a cache miss, so a process that loads
    a cached pipeline (every run) never imports ``datasets`` (with TRL, about 3 s of a fresh worker's start)."""
    import datasets

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()


def say(msg: str) -> None:
    """One ``[pipeline]`` progress line on stderr."""
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


def read_while_unchanged(memo: dict, key: Any, directory: str | Path, read: Callable[[], Any]) -> Any:
    """``read()``, once per process for ``key`` while ``directory``'s files keep their names, sizes and mtimes (one
    ``stat`` each): a file replaced or edited in place makes the next call read again, and the new value replaces the
    old in ``memo`` (one entry per key). For what a process reads many times from files nothing rewrites in use: a Ray
    worker's runs each reading the corpora (:mod:`harness.tasks.review_sentiment.data`) or the frozen gold encoder.

    Returns:
        the value ``read()`` returned for this state of the directory.
    Raises:
        whatever ``read`` raises (nothing is kept then).
    """
    stamp = tuple((f.name, st.st_size, st.st_mtime_ns) for f in sorted(Path(directory).glob("*"))
                  for st in [f.stat()] if f.is_file())
    held = memo.get(key)
    if held is None or held[0] != stamp:
        memo[key] = held = (stamp, read())
    return held[1]


#: Files whose bytes are a stage's weights (what :func:`weights_digest` hashes).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npy", ".npz")


def weights_digest(stage_dir: str | Path) -> str | None:
    """The sha256 (first 16 hex digits) of a stage's saved tensors: every file under ``stage_dir`` whose suffix is in
    :data:`WEIGHT_SUFFIXES`, in sorted relative-path order, each hashed as its path then its own sha256
    (``hashlib.file_digest``). Two stages with
    the same key built on two machines give the same digest only when their weights are bit-identical. None when
    the stage saved no tensor file (e.g. the problems stage)."""
    import hashlib

    root = Path(stage_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(root)).encode())
        with open(f, "rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()[:16]


#: Environment variables that pin the math libraries' kernels (recorded by :func:`kernel_path` when set).
KERNEL_PINS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "NPY_DISABLE_CPU_FEATURES")


def kernel_path() -> str:
    """The CPU kernels this process's math runs on, as far as they decide the weights a stage builds: torch's CPU
    capability (ATen's vectorised kernels: ``DEFAULT``, ``AVX2``, ``AVX512``, …), its intra-op threads (reductions split
    by thread), and every pin of :data:`KERNEL_PINS` set in the environment. Recorded in each built stage's
    ``stage.json`` (``kernels``) and as every run's ``kernels`` tag, so that a build that differs (:mod:`harness.experiments.builds`)
    can be told apart from its kernels. Equal strings do not promise equal weights (the math libraries also dispatch on
    the CPU model); different ones usually mean different weights.

    Example: ``"AVX512, 2 threads"``; with ``MKL_CBWR=AVX2`` and one thread ``"AVX512, 1 thread, MKL_CBWR=AVX2"``."""
    import torch

    threads = torch.get_num_threads()
    pins = [f"{k}={os.environ[k]}" for k in KERNEL_PINS if os.environ.get(k)]
    return ", ".join([torch.backends.cpu.get_cpu_capability(), f"{threads} thread{'s' if threads != 1 else ''}", *pins])


class StageRunner:
    """Builds one pipeline's stages in order: each through :func:`run_stage`, timed, one line on stderr.

    A task's ``stages`` function receives one and calls it once per stage. Attributes a stage builder
    reads: ``cfg``, ``out_dir``, ``device``, ``bf16``, ``progress`` (show training bars), ``force``, ``defer``
    (leave out the stages no PPO run reads, e.g. review_sentiment's best-of-n reference: an ablation's driver
    builds the shared stages with ``defer`` and its first worker builds the rest while the other trains).
    ``stages`` and ``metrics`` collect, by stage label, the cache record (with the stage's :func:`weights_digest`)
    and the stage's metrics that
    :func:`build_pipeline` writes to ``summary.json``. ``check``, when given, is called with each stage's label and
    record as soon as the stage is built or loaded; what it raises stops the pipeline there (a build check stops at
    the first stage whose weights differ, :func:`harness.experiments.build_check.check_build`).
    """

    def __init__(self, cfg: Config, out_dir: Path, device: Any, bf16: bool, force: bool, progress: bool,
                 defer: bool = False, check: Optional[Callable[[str, dict], None]] = None) -> None:
        self.cfg, self.out_dir, self.device, self.bf16 = cfg, out_dir, device, bf16
        self.force, self.progress, self.defer, self.check = force, progress, defer, check
        self.stages: dict[str, dict] = {}
        self.metrics: dict[str, dict] = {}

    def __call__(self, name: str, stage_config: dict[str, Any], inputs: dict[str, str], build: Callable[[Path], dict],
                 label: str | None = None) -> tuple[Path, dict]:
        """Build or load stage ``name`` (see :func:`run_stage`) and record it under ``label`` (default
        ``name``; e.g. two reward-model stages are recorded as ``human_rm`` and ``reward_model``).

        Returns:
            ``(stage_dir, record)`` (``record["key"]`` is the stage's cache key).
        Raises:
            whatever ``build`` raises, or ``check`` (after the stage is recorded).
        """
        t0 = time.perf_counter()
        path, rec, cached = run_stage(self.out_dir, name, stage_config, inputs, build, self.force)
        label = label or name
        wall = time.perf_counter() - t0
        self.stages[label] = {"key": rec.get("key"), "dir": str(path), "cached": cached, "wall_time_s": round(wall, 3),
                              "build_time_s": rec.get("build_time_s"), "weights_sha256": rec.get("weights_sha256")}
        self.metrics[label] = rec.get("metrics", {})
        say(f"{label:<14} {'cached' if cached else 'built':<8} {wall:7.1f} s  {path}")
        if self.check is not None:
            self.check(label, self.stages[label])
        return path, rec

    def forget(self, label: str) -> dict:
        """Drop ``label`` from the summary's stages and return its metrics (a stage built only to be
        summarised elsewhere, e.g. a proxy of another size)."""
        self.stages.pop(label)
        return self.metrics.pop(label)
