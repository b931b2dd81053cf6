"""The offline RLHF pipeline: data → tokenizer → SFT policy → reward model, each stage cached.

``build_pipeline(cfg)`` returns the directories the PPO loop loads (tokenizer, SFT policy = reference,
reward model) and the RM's ``reward_offset``. Every stage lives in
``<out_dir>/<stage>/<key>/`` where ``key`` hashes the stage's resolved config plus the keys of its
inputs, so changing e.g. ``tokenizer.vocab_size`` rebuilds the tokenizer, SFT and RM but not the data
stage, and a re-run with the same config only reads ``stage.json`` files. Next to every artifact:
``config.yaml`` (the resolved stage config) and ``stage.json`` (key, inputs, metrics, build time).
Stages are built in a temporary directory, renamed into place when complete, under a file lock, so a
crashed build never looks finished and concurrent callers build a stage once.

``pipeline.model.policy_path`` does not change what is built here: the PPO loop loads the policy and
reference from that path (with its own tokenizer) instead of ``sft_dir``; the RM stays the one built here
on this tokenizer, so text is re-tokenised for it when the vocabularies differ.

Heavy libraries (torch, transformers, TRL) are imported inside the functions, so importing this
package (e.g. for config validation) stays cheap.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
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

from harness.config import Config

STAGES = ("data", "gold", "tokenizer", "sft", "reward_model")
STAGE_FILE = "stage.json"


@dataclass
class PipelineArtifacts:
    """What the PPO loop needs from the pipeline.

    Attributes:
        tokenizer_dir: tokenizer (``load_tokenizer``); pad ≠ eos for the built tokenizer.
        sft_dir: SFT causal LM = initial policy and frozen reference (``load_policy``).
        rm_dir: reward model (``load_scalar_model``), score read at the EOS token (``score_at``).
        reward_offset: mean raw RM score on SFT demonstrations; normalised score = raw − offset.
        summary: the dict written to ``<out_dir>/summary.json``.
        out_dir: the pipeline output directory.
        gold_dir: the gold reward model's head (:class:`harness.pipeline.gold.GoldRewardModel`).
    """

    tokenizer_dir: str
    sft_dir: str
    rm_dir: str
    reward_offset: float
    summary: dict = field(default_factory=dict)
    out_dir: str = ""
    gold_dir: str = ""


def stage_key(stage_config: dict[str, Any], inputs: dict[str, str]) -> str:
    """12-hex-digit sha256 of ``{"config": stage_config, "inputs": inputs}`` (sorted JSON).

    Raises:
        TypeError: ``stage_config`` is not JSON-serialisable.
    """
    payload = json.dumps({"config": stage_config, "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False))
    os.replace(tmp, path)


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
    with _file_lock(root / f".{key}.lock"):
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


def _say(msg: str) -> None:
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


def build_pipeline(cfg: Config, force: bool = False, progress: bool = True, with_gold: bool = False) -> PipelineArtifacts:
    """Build (or load from cache) the tokenizer, SFT policy and reward model for ``cfg``.

    Stages and their cache keys (each also hashes its inputs' keys):
      * ``data``: split fractions + salt + sha256 of every cached data file (the cache must exist:
        ``harness data``). Metrics: row counts per domain and split.
      * ``gold`` (only ``with_gold``: ``harness pipeline`` builds it; the PPO loop does not use it yet):
        :data:`harness.pipeline.gold.GOLD_SETTINGS`. The gold reward model: the pretrained
        all-MiniLM-L6-v2 encoder (frozen) plus a ridge head on the human ratings of all four domains.
        Metrics: held-out Pearson/Spearman per domain, beside VADER's. About 3 minutes on 2 cores.
      * ``tokenizer``: ``pipeline.tokenizer``. Byte-level BPE on the train split.
      * ``sft``: ``pipeline.model`` (minus ``policy_path``) + ``pipeline.sft`` + ``pipeline.seed``. TRL ``SFTTrainer``.
        Metrics: ``val_perplexity``, ``unigram_perplexity``.
      * ``reward_model``: ``pipeline.reward_model`` + ``pipeline.seed``. TRL ``RewardTrainer``. Metrics:
        ``pairwise_accuracy``, ``spearman_vs_gold``, ``reward_offset``.

    Prints each stage's wall time to stderr and writes ``<pipeline.out_dir>/summary.json``.

    Args:
        force: rebuild every stage even when cached.
        progress: show training progress bars (with the current loss).
        with_gold: also build (or load) the ``gold`` stage.

    Returns:
        :class:`PipelineArtifacts`.

    Raises:
        DataCacheError: the data cache is missing or corrupt (names ``harness data``).
        HarnessError: ``device=cuda`` without CUDA.
    """
    import torch

    from harness.models import load_tokenizer, resolve_device
    from harness.pipeline import data as data_mod

    t_all = time.perf_counter()
    device, autocast = resolve_device(cfg.device)
    bf16 = autocast == torch.bfloat16
    n_threads = cfg.torch_threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(n_threads)
    pc = cfg.pipeline
    out_dir = Path(pc.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stages: dict[str, dict] = {}
    metrics: dict[str, dict] = {}

    def record(name: str, path: Path | str, rec: dict, cached: bool, t0: float) -> None:
        wall = time.perf_counter() - t0
        stages[name] = {
            "key": rec.get("key"),
            "dir": str(path),
            "cached": cached,
            "wall_time_s": round(wall, 3),
            "build_time_s": rec.get("build_time_s"),
        }
        metrics[name] = rec.get("metrics", {})
        how = "cached" if cached else "built"
        _say(f"{name:<12} {how:<8} {wall:7.1f} s  {path}")

    with _quiet_libraries():
        # ---- data ---------------------------------------------------------------------------
        t0 = time.perf_counter()
        manifest = data_mod.check_cache(pc.data)
        data_cfg = {
            "val_fraction": pc.data.val_fraction,
            "test_fraction": pc.data.test_fraction,
            "split_salt": pc.data.split_salt,
            "files": {k: v["sha256"] for k, v in sorted(manifest["files"].items())},
        }
        loaded: dict[str, Any] = {}

        def corpora():
            if not loaded:
                loaded["snippets"] = data_mod.load_snippets(pc.data)
                loaded["rt"] = data_mod.load_rotten_tomatoes(pc.data)
            return loaded["snippets"], loaded["rt"]

        def split_texts(split: str) -> list[str]:
            sn, rt = corpora()
            texts = list(sn.loc[sn["split"] == split, "text"]) + list(rt.loc[rt["split"] == split, "text"])
            return [t.strip() for t in texts if t.strip()]

        def build_data(tmp: Path) -> dict:
            sn, rt = corpora()
            counts = {
                "snippets": int(len(sn)),
                "snippets_by_domain": {k: int(v) for k, v in sn.groupby("domain", sort=False).size().items()},
                "snippets_by_split": {k: int(v) for k, v in sn["split"].value_counts().sort_index().items()},
                "rotten_tomatoes": int(len(rt)),
                "rotten_tomatoes_by_split": {k: int(v) for k, v in rt["split"].value_counts().sort_index().items()},
            }
            (tmp / "counts.json").write_text(json.dumps(counts, indent=2))
            return counts

        data_dir, rec, cached = run_stage(out_dir, "data", data_cfg, {}, build_data, force)
        data_key = rec["key"]
        record("data", data_dir, rec, cached, t0)

        # ---- gold reward model -------------------------------------------------------------
        from harness.pipeline.gold import GOLD_SETTINGS

        gold_dir = ""
        gold_built = (out_dir / "gold" / stage_key(GOLD_SETTINGS, {"data": data_key}) / STAGE_FILE).is_file()
        if with_gold or gold_built:  # a built gold stage is always reported
            t0 = time.perf_counter()

            def build_gold(tmp: Path) -> dict:
                from harness.pipeline.gold import train_gold

                sn, _ = corpora()
                return train_gold(sn, tmp, device=device)

            gdir, rec, cached = run_stage(out_dir, "gold", GOLD_SETTINGS, {"data": data_key}, build_gold, force)
            gold_dir = str(gdir)
            record("gold", gdir, rec, cached, t0)

        # ---- tokenizer ------------------------------------------------------------------
        t0 = time.perf_counter()
        tok_cfg = pc.tokenizer.model_dump(mode="json")

        def build_tok(tmp: Path) -> dict:
            from harness.pipeline.tokenizer import build_tokenizer

            build_tokenizer(split_texts("train"), pc.tokenizer.vocab_size, pc.tokenizer.min_frequency, tmp)
            t = load_tokenizer(tmp)
            return {
                "vocab_size": len(t),
                "eos_token": t.eos_token,
                "eos_token_id": t.eos_token_id,
                "pad_token": t.pad_token,
                "pad_token_id": t.pad_token_id,
            }

        tdir, rec, cached = run_stage(out_dir, "tokenizer", tok_cfg, {"data": data_key}, build_tok, force)
        tok_key = rec["key"]
        tok_dir = str(tdir)
        record("tokenizer", tdir, rec, cached, t0)
        tok = load_tokenizer(tok_dir)

        # ---- SFT ------------------------------------------------------------------------
        t0 = time.perf_counter()
        model_cfg = pc.model.model_dump(mode="json")
        model_cfg.pop("policy_path")
        sft_cfg = {"model": model_cfg, "sft": pc.sft.model_dump(mode="json"), "seed": pc.seed}

        def build_sft(tmp: Path) -> dict:
            from harness.pipeline.sft import train_sft

            return train_sft(
                split_texts("train"), split_texts("val"), tok, pc.model, pc.sft, tmp,
                seed=pc.seed, device=device, bf16=bf16, progress=progress,
            )

        sdir, rec, cached = run_stage(
            out_dir, "sft", sft_cfg, {"data": data_key, "tokenizer": tok_key}, build_sft, force
        )
        sft_key = rec["key"]
        sft_dir = str(sdir)
        record("sft", sdir, rec, cached, t0)
        rm_init = sft_dir

        # ---- reward model ---------------------------------------------------------------------
        t0 = time.perf_counter()
        rm_cfg = {"reward_model": pc.reward_model.model_dump(mode="json"), "seed": pc.seed}

        def build_rm(tmp: Path) -> dict:
            from harness.pipeline.reward_model import train_reward_model

            sn, _ = corpora()
            return train_reward_model(
                sn, split_texts("train"), rm_init, tok, pc.reward_model, tmp,
                seed=pc.seed, device=device, bf16=bf16, progress=progress,
            )

        rdir, rec, cached = run_stage(
            out_dir, "reward_model", rm_cfg, {"data": data_key, "sft": sft_key}, build_rm, force
        )
        rm_dir = str(rdir)
        record("reward_model", rdir, rec, cached, t0)

    from harness.pipeline.reward_model import load_reward_offset

    offset = load_reward_offset(rm_dir)
    summary = {
        **{name: metrics[name] for name in STAGES if name in metrics},
        "stages": stages,
        "artifacts": {"tokenizer_dir": tok_dir, "sft_dir": sft_dir, "rm_dir": rm_dir, "reward_offset": offset,
                      "gold_dir": gold_dir},
        "device": str(device),
        "torch_threads": n_threads,
        "wall_time_s": round(time.perf_counter() - t_all, 3),
    }
    _write_json_atomic(out_dir / "summary.json", summary)
    _say(f"total        {summary['wall_time_s']:7.1f} s  summary: {out_dir / 'summary.json'}")
    return PipelineArtifacts(tok_dir, sft_dir, rm_dir, offset, summary, str(out_dir), gold_dir)


__all__ = ["PipelineArtifacts", "build_pipeline", "run_stage", "stage_key", "STAGES"]
