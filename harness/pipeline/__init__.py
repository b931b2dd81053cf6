"""The generic pipeline runner: a task's offline stages, each cached by a hash of its config.

``build_pipeline(cfg)`` asks the task named by ``task.name`` to build its stages
(``TASKS.meta(name)["stages"]``, e.g. :mod:`harness.tasks.review_sentiment.stages`) through a
:class:`StageRunner`, and returns the directories the PPO loop loads (tokenizer, SFT policy = reference,
and the task's reward model when it has one). The runner knows no task: it caches, times and reports.

Every stage lives in ``<out_dir>/<stage>/<key>/`` where ``key`` hashes the stage's resolved config plus
the keys of its inputs, so changing e.g. ``tokenizer.vocab_size`` rebuilds the tokenizer and what depends
on it but not the data stage, and a re-run with the same config only reads ``stage.json`` files. Next to
every artifact: ``config.yaml`` (the resolved stage config) and ``stage.json`` (key, inputs, metrics, build
time). Stages are built in a temporary directory, renamed into place when complete, under a file lock, so
a crashed build never looks finished and concurrent callers build a stage once.

Generic stage builders live beside the runner: :mod:`~harness.pipeline.tokenizer` (byte-level BPE),
:mod:`~harness.pipeline.sft` (TRL ``SFTTrainer``), :mod:`~harness.pipeline.pretrained` (a preset's
weights) and :mod:`~harness.pipeline.progress`.

Heavy libraries (torch, transformers, TRL) are imported inside the functions, so importing this
package (e.g. for config validation) stays cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from filelock import FileLock

from harness.config import Config, fingerprint

STAGE_FILE = "stage.json"


@dataclass
class PipelineArtifacts:
    """What the PPO loop needs from the pipeline.

    Attributes:
        tokenizer_dir: tokenizer (``load_tokenizer``); pad ≠ eos for the built tokenizer.
        sft_dir: SFT causal LM = initial policy and frozen reference (``load_policy``).
        rm_dir: the task's learned reward model (``load_scalar_model``), score read at the EOS token
            (``score_at``); empty for a task scored by a verifier.
        reward_offset: mean raw RM score on SFT demonstrations; normalised score = raw − offset (0 without an RM).
        summary: the dict written to ``<out_dir>/summary.json``.
        out_dir: the pipeline output directory.
        gold_dir: the task's gold scorer, when it has a learned one (review_sentiment:
            :class:`harness.tasks.review_sentiment.gold.GoldRewardModel`); empty otherwise.
        bon_dir: the best-of-n curve of the SFT policy under the RM, when the task builds one
            (:func:`harness.tasks.review_sentiment.bon.load_bon_curve`); empty otherwise.
        pretrained_dir: with ``pipeline.model.preset``, the preset's checkpoint after task SFT
            (``pretrained_sft``) and its tokenizer: the policy and reference the PPO loop loads instead of
            ``sft_dir``; empty otherwise.
    """

    tokenizer_dir: str
    sft_dir: str
    rm_dir: str = ""
    reward_offset: float = 0.0
    summary: dict = field(default_factory=dict)
    out_dir: str = ""
    gold_dir: str = ""
    bon_dir: str = ""
    pretrained_dir: str = ""


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
    rebuilds (replacing the old directory).

    Returns:
        ``(stage_dir, record, cached)``; ``record`` is the ``stage.json`` content (``stage``, ``key``,
        ``config``, ``inputs``, ``metrics``, ``build_time_s``, ``created_at``).

    Raises:
        whatever ``build`` raises (the temporary directory is removed).
    """
    key = stage_key(stage_config, inputs)
    root = Path(out_dir) / name
    final = root / key
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{key}.lock")):
        if not force and (final / STAGE_FILE).is_file():
            return final, json.loads((final / STAGE_FILE).read_text()), True
        tmp = root / f".{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        t0 = time.perf_counter()
        try:
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
        }
        (tmp / "config.yaml").write_text(yaml.safe_dump({name: stage_config, "inputs": inputs}, sort_keys=False))
        _write_json_atomic(tmp / STAGE_FILE, record)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final, record, False


@contextlib.contextmanager
def _quiet_libraries():
    """Silence dataset-map bars, shard-writing bars and known deprecation chatter during a build."""
    import datasets
    import transformers

    tlog = transformers.utils.logging
    ds_bars, tf_bars = datasets.is_progress_bar_enabled(), tlog.is_progress_bar_enabled()
    verbosity = tlog.get_verbosity()
    datasets.disable_progress_bars()
    tlog.disable_progress_bar()
    tlog.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # e.g. `gradient_checkpointing` renamed in transformers 6
            yield
    finally:
        if ds_bars:
            datasets.enable_progress_bars()
        if tf_bars:
            tlog.enable_progress_bar()
        tlog.set_verbosity(verbosity)


def say(msg: str) -> None:
    """One ``[pipeline]`` progress line on stderr."""
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


class StageRunner:
    """Builds one pipeline's stages in order: each through :func:`run_stage`, timed, one line on stderr.

    A task's ``stages`` function receives one and calls it once per stage. Attributes a stage builder
    reads: ``cfg``, ``out_dir``, ``device``, ``bf16``, ``progress`` (show training bars), ``force``.
    ``stages`` and ``metrics`` collect, by stage label, the cache record and the stage's metrics that
    :func:`build_pipeline` writes to ``summary.json``.
    """

    def __init__(self, cfg: Config, out_dir: Path, device: Any, bf16: bool, force: bool, progress: bool) -> None:
        self.cfg, self.out_dir, self.device, self.bf16 = cfg, out_dir, device, bf16
        self.force, self.progress = force, progress
        self.stages: dict[str, dict] = {}
        self.metrics: dict[str, dict] = {}

    def __call__(self, name: str, stage_config: dict[str, Any], inputs: dict[str, str], build: Callable[[Path], dict],
                 label: str | None = None) -> tuple[Path, dict]:
        """Build or load stage ``name`` (see :func:`run_stage`) and record it under ``label`` (default
        ``name``; e.g. two reward-model stages are recorded as ``human_rm`` and ``reward_model``).

        Returns:
            ``(stage_dir, record)`` (``record["key"]`` is the stage's cache key).
        Raises:
            whatever ``build`` raises.
        """
        t0 = time.perf_counter()
        path, rec, cached = run_stage(self.out_dir, name, stage_config, inputs, build, self.force)
        label = label or name
        wall = time.perf_counter() - t0
        self.stages[label] = {"key": rec.get("key"), "dir": str(path), "cached": cached, "wall_time_s": round(wall, 3),
                              "build_time_s": rec.get("build_time_s")}
        self.metrics[label] = rec.get("metrics", {})
        say(f"{label:<14} {'cached' if cached else 'built':<8} {wall:7.1f} s  {path}")
        return path, rec

    def forget(self, label: str) -> dict:
        """Drop ``label`` from the summary's stages and return its metrics (a stage built only to be
        summarised elsewhere, e.g. a proxy of another size)."""
        self.stages.pop(label)
        return self.metrics.pop(label)


def build_pipeline(cfg: Config, force: bool = False, progress: bool = True, full: bool = False) -> PipelineArtifacts:
    """Build (or load from cache) every stage the PPO loop and its evaluation need for ``cfg``.

    The stages are the task's (``TASKS.meta(cfg.task.name)["stages"]``; the shipped tasks document theirs,
    e.g. :func:`harness.tasks.review_sentiment.stages.build_stages`). They are built with
    ``torch_threads`` threads (default: every CPU this process may use); the caller's thread count is
    restored on return, so that a run in a one-CPU worker that loads the cached pipeline keeps its one
    thread (two workers with two MKL threads each would oversubscribe two cores).

    Prints each stage's wall time to stderr and writes ``<pipeline.out_dir>/summary.json``: the metrics of
    every stage by label, the task's own summary entries, ``stages`` (key, dir, cached, times),
    ``artifacts``, ``device``, ``torch_threads`` and ``wall_time_s``.

    Args:
        force: rebuild every stage even when cached.
        progress: show training progress bars (with the current loss).
        full: also build the optional stages the task offers for its summary (``harness pipeline``;
            e.g. review_sentiment's proxies of every shipped size).

    Returns:
        :class:`PipelineArtifacts`.

    Raises:
        DataCacheError: the data cache is missing or corrupt (names ``harness data``).
        HarnessError: ``device=cuda`` without CUDA.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads or len(os.sched_getaffinity(0)))
    try:
        return _build_stages(cfg, force, progress, full)
    finally:
        torch.set_num_threads(before)


def _build_stages(cfg: Config, force: bool, progress: bool, full: bool) -> PipelineArtifacts:
    """The body of :func:`build_pipeline`, run with its thread count."""
    import torch

    from harness.models import resolve_device
    from harness.tasks import TASKS

    t_all = time.perf_counter()
    device, autocast = resolve_device(cfg.device)
    out_dir = Path(cfg.pipeline.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runner = StageRunner(cfg, out_dir, device, autocast == torch.bfloat16, force, progress)
    with _quiet_libraries():
        built = TASKS.meta(cfg.task.name)["stages"](cfg, runner, full=full)
    art = PipelineArtifacts(**{k: v for k, v in built.items() if k != "summary"})
    summary = {**runner.metrics, **built.get("summary", {}), "stages": runner.stages,
               "artifacts": {"tokenizer_dir": art.tokenizer_dir, "sft_dir": art.sft_dir, "rm_dir": art.rm_dir,
                             "reward_offset": art.reward_offset, "gold_dir": art.gold_dir, "bon_dir": art.bon_dir,
                             "pretrained_dir": art.pretrained_dir},
               "device": str(device), "torch_threads": torch.get_num_threads(),
               "wall_time_s": round(time.perf_counter() - t_all, 3)}
    _write_json_atomic(out_dir / "summary.json", summary)
    say(f"{'total':<23} {summary['wall_time_s']:7.1f} s  summary: {out_dir / 'summary.json'}")
    art.summary, art.out_dir = summary, str(out_dir)
    return art


__all__ = ["PipelineArtifacts", "StageRunner", "build_pipeline", "run_stage", "stage_key", "say"]
