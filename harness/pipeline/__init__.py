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

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from harness.config import Config
from harness.config.base import fingerprint, portable
from harness.pipeline.stage import STAGE_FILE, StageRunner, _quiet_libraries, _write_json_atomic, run_stage, say, stage_key

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
            (:func:`harness.analysis.frontier.load_bon_curve`); empty otherwise.
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


def draw_key(cfg: Config, replicate: Optional[int] = None) -> str:
    """The identity of pipeline draw ``replicate`` (default ``cfg.replicate``) of ``cfg``'s task and pipeline: the
    :func:`~harness.config.base.fingerprint` of the task section, the portable pipeline section less
    ``replicates`` (which only says how seeds map to draws) and the draw's seed
    (:meth:`~harness.config.pipeline.PipelineConfig.draw_seed`). Two regimes of one task that share ``pipeline.out_dir``
    differ in it, so the summary a draw's build writes (as ``draw_key``) tells which regime built it
    (:func:`harness.experiments.staged.draw_built`). 12 hex digits.

    Example: draws 0 and 1 of one config differ; draw 0 with ``replicates`` 1 and 40 is one key.

    Raises:
        ValueError: ``replicate`` is negative.
    """
    r = cfg.replicate if replicate is None else replicate
    if r < 0:
        raise ValueError(f"replicate: must be ≥ 0, got {r}")
    pipeline = portable(cfg.to_dict())["pipeline"]
    pipeline.pop("replicates", None)
    return fingerprint({"task": cfg.task.model_dump(mode="json"), "pipeline": pipeline,
                        "draw_seed": cfg.pipeline.draw_seed(r)})


def cpu_threads() -> int:
    """The torch threads a build uses when neither the caller nor the config names a number: ``$OMP_NUM_THREADS``
    where it is a positive integer (the standard cap on a process's OpenMP threads, which torch's CPU kernels run
    on, and which torch's own default follows), else every CPU this process may use (``sched_getaffinity``).
    A value that is not a positive integer is ignored, as OpenMP ignores it. Returns a count of threads (≥ 1);
    raises nothing."""
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    return len(os.sched_getaffinity(0))


def build_pipeline(cfg: Config, force: bool = False, progress: bool = True, full: bool = False,
                   threads: Optional[int] = None, defer: bool = False,
                   check: Optional[Callable[[str, dict], None]] = None) -> PipelineArtifacts:
    """Build (or load from cache) every stage the PPO loop and its evaluation need for ``cfg``.

    The stages are the task's (``TASKS.meta(cfg.task.name)["stages"]``; the shipped tasks document theirs,
    e.g. :func:`harness.tasks.review_sentiment.stages.build_stages`). They are built with
    ``threads`` torch threads (default ``torch_threads``, else :func:`cpu_threads`); the caller's thread count is
    restored on return, so that a run in a one-CPU worker that loads the cached pipeline keeps its one
    thread (two workers with two MKL threads each would oversubscribe two cores).

    Prints each stage's wall time to stderr and writes ``<pipeline.out_dir>/summary.json`` (``summary-draw<r>.json``
    for pipeline draw ``r`` > 0, :attr:`harness.config.Config.replicate`, so that draws built side by side keep their
    own): the metrics of
    every stage by label, the task's own summary entries, ``stages`` (key, dir, cached, times),
    ``artifacts``, ``draw_key`` (:func:`draw_key`), ``device``, ``torch_threads`` and ``wall_time_s``.

    Args:
        force: rebuild every stage even when cached.
        progress: show training progress bars (with the current loss).
        full: also build the optional stages the task offers for its summary (``harness pipeline``;
            e.g. review_sentiment's proxies of every shipped size).
        threads: torch threads of the build (a worker passes its run's own).
        defer: leave out the stages no PPO run reads (:class:`StageRunner`'s ``defer``; their artifact fields
            stay empty): an ablation's driver builds only what every run waits for.
        check: called with each stage's label and record (``key``, ``weights_sha256``, …) once it is built or
            loaded (:class:`StageRunner`'s ``check``); what it raises stops the build there and is raised here.

    Returns:
        :class:`PipelineArtifacts`.

    Raises:
        DataCacheError: the data cache is missing or corrupt (names ``harness data``).
        HarnessError: ``device=cuda`` without CUDA.
        whatever ``check`` raises.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads or cfg.torch_threads or cpu_threads())
    try:
        return _build_stages(cfg, force, progress, full, defer, check)
    finally:
        torch.set_num_threads(before)


def _build_stages(cfg: Config, force: bool, progress: bool, full: bool, defer: bool,
                  check: Optional[Callable[[str, dict], None]] = None) -> PipelineArtifacts:
    """The body of :func:`build_pipeline`, run with its thread count."""
    import torch

    from harness.rl.models import resolve_device
    from harness.tasks import TASKS

    t_all = time.perf_counter()
    device, autocast = resolve_device(cfg.device)
    out_dir = Path(cfg.pipeline.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runner = StageRunner(cfg, out_dir, device, autocast == torch.bfloat16, force, progress, defer, check)
    with _quiet_libraries():
        built = TASKS.meta(cfg.task.name)["stages"](cfg, runner, full=full)
    art = PipelineArtifacts(**{k: v for k, v in built.items() if k != "summary"})
    summary = {**runner.metrics, **built.get("summary", {}), "stages": runner.stages,
               "artifacts": {"tokenizer_dir": art.tokenizer_dir, "sft_dir": art.sft_dir, "rm_dir": art.rm_dir,
                             "reward_offset": art.reward_offset, "gold_dir": art.gold_dir, "bon_dir": art.bon_dir,
                             "pretrained_dir": art.pretrained_dir},
               "draw_key": draw_key(cfg), "device": str(device), "torch_threads": torch.get_num_threads(),
               "wall_time_s": round(time.perf_counter() - t_all, 3)}
    name = "summary.json" if cfg.replicate == 0 else f"summary-draw{cfg.replicate}.json"  # one file per draw
    _write_json_atomic(out_dir / name, summary)
    say(f"{'total':<23} {summary['wall_time_s']:7.1f} s  summary: {out_dir / name}")
    art.summary, art.out_dir = summary, str(out_dir)
    return art


__all__ = ["PipelineArtifacts", "StageRunner", "build_pipeline", "draw_key", "run_stage", "stage_key", "say", "STAGE_FILE"]
