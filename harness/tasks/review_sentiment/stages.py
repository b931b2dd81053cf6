"""The review_sentiment pipeline: data → gold RM → tokenizer → SFT → proxy data → reward models → best-of-n.

:func:`build_stages` is the task's ``stages`` entry (called by :func:`harness.pipeline.build_pipeline`
through a :class:`~harness.pipeline.stage.StageRunner`). Stages and their cache keys (each also hashes its
inputs' keys):

* ``data``: split fractions + salt + sha256 of every cached data file (the cache must exist:
  ``harness data``). Metrics: row counts per domain and split.
* ``gold``: ``pipeline.gold`` + ``pipeline.seed``. The gold reward model: the pretrained all-MiniLM-L6-v2
  encoder, top layers fine-tuned on the human ratings of all four domains (:mod:`.gold`). Metrics:
  held-out Pearson/Spearman per domain, beside VADER's.
* ``tokenizer``: ``pipeline.tokenizer``. Byte-level BPE on the train split.
* ``sft``: ``pipeline.model`` (minus ``policy_path`` and ``preset``) + ``pipeline.sft`` + the draw seed
  (:attr:`harness.config.Config.draw_seed`: ``pipeline.seed`` with one pipeline draw; ``pipeline.replicates``).
  TRL ``SFTTrainer``. Metrics: ``val_perplexity``, ``unigram_perplexity``.
* ``proxy_data`` (``reward_model.labels: gold``): SFT-policy comparisons labelled by the gold
  (:mod:`.proxy`). Its settings: pool and held-out sizes, prompt and response length, PPO temperature, seed
  (and, when set, no early stop, length matching, suppressed special tokens).
* ``reward_model``: ``pipeline.reward_model`` + the draw seed. TRL ``RewardTrainer`` on the first
  ``proxy_pairs`` gold-labelled comparisons (metrics: ``heldout_agreement``, ``spearman_vs_gold``,
  ``reward_offset``), or on human-rating pairs (``labels: human``). With ``proxy_init: human_rm`` the
  proxy starts from the reward model of human ratings (recorded as ``human_rm``), one for every pipeline draw:
  built from draw 0's SFT policy with ``pipeline.seed`` (a draw other than 0 loads that SFT stage as
  ``sft_draw0``).
* ``bon_samples``: ``pipeline.bon`` + the task and evaluation-prompt settings + temperature: responses of
  the SFT policy on the first evaluation prompts, with their gold scores (draw 0 only: the reports' reference).
* ``bon``: the best-of-n curve of those samples under this reward model (:mod:`.bon`; draw 0 only).
* ``pretrained`` and ``pretrained_sft`` (only with ``pipeline.model.preset``):
  :func:`harness.pipeline.pretrained.build_preset_stages` on this task's texts.

``pipeline.model.policy_path`` does not change what is built here: the PPO loop loads the policy and
reference from that path (with its own tokenizer) instead of ``sft_dir``; the RM stays the one built here on
this tokenizer, so text is re-tokenised for it when the vocabularies differ. The proxy data and the
best-of-n reference are sampled from the harness's SFT policy, also under a preset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.config import Config

#: The gold-label fields of ``pipeline.reward_model`` at their defaults: the human-rating reward model that
#: initialises the proxies is keyed without them, so every proxy size shares it.
PROXY_FIELD_DEFAULTS = {"proxy_pairs": 1000, "proxy_pool_pairs": 1000, "proxy_heldout_pairs": 1000,
                        "proxy_truncate_after_eos": True, "proxy_match_length": False, "proxy_init": "human_rm"}
#: Every stage this task builds without a preset, in build order.
STAGES = ("data", "gold", "tokenizer", "sft", "proxy_data", "human_rm", "reward_model", "bon_samples", "bon")
#: The proxy sizes ``harness pipeline`` builds (``reward_model.proxy_pairs``; nested subsets of one pool).
PROXY_SIZES = (1000, 3000, 9000)


class _Corpora:
    """The two corpora of the data cache, loaded once, and their texts by split."""

    def __init__(self, data_cfg: Any) -> None:
        self.data_cfg = data_cfg
        self._loaded: tuple[Any, Any] | None = None

    def frames(self) -> tuple[Any, Any]:
        """``(snippets, rotten_tomatoes)`` DataFrames (:mod:`.data`)."""
        from harness.tasks.review_sentiment.data import load_rotten_tomatoes, load_snippets

        if self._loaded is None:
            self._loaded = (load_snippets(self.data_cfg), load_rotten_tomatoes(self.data_cfg))
        return self._loaded

    def texts(self, split: str) -> list[str]:
        """Whitespace-stripped, non-empty texts of ``split`` (snippets, then Rotten Tomatoes rows)."""
        sn, rt = self.frames()
        texts = list(sn.loc[sn["split"] == split, "text"]) + list(rt.loc[rt["split"] == split, "text"])
        return [t.strip() for t in texts if t.strip()]


def build_stages(cfg: Config, run: Any, full: bool = False) -> dict[str, Any]:
    """Build (or load) every stage of this task (module docstring) with ``run`` (a ``StageRunner``).

    Args:
        full: also build the gold-labelled proxies of every :data:`PROXY_SIZES` size, so their agreement with
            gold is in the summary (``harness pipeline``); without it, sizes built earlier are still reported
            from their cached stages and none is built.
    Returns:
        the :class:`~harness.pipeline.PipelineArtifacts` fields, plus ``summary``: ``{"proxies": {size:
        metrics}}`` with gold labels.
    Raises:
        DataCacheError: the data cache is missing or corrupt (names ``harness data``).
    """
    from harness.rl.models import load_tokenizer
    from harness.pipeline.pretrained import build_preset_stages
    from harness.pipeline.sft import sft_stage
    from harness.pipeline.tokenizer import tokenizer_stage
    from harness.tasks.review_sentiment.reward_model import load_reward_offset

    pc, corpora = cfg.pipeline, _Corpora(cfg.pipeline.data)
    data_key = _data_stage(run, corpora)
    gold_dir, gold_key = _gold_stage(run, corpora, data_key)
    tok_dir, tok_key = tokenizer_stage(run, corpora.texts("train"), data_key)
    tok = load_tokenizer(tok_dir)
    sft_inputs = {"data": data_key, "tokenizer": tok_key}
    sft_dir, sft_key = sft_stage(run, corpora.texts("train"), corpora.texts("val"), tok, sft_inputs)
    gold = _GoldScorer(gold_dir, run.device)
    draw0 = (sft_dir, sft_key)
    if cfg.replicate != 0 and _needs_human_rm(pc.reward_model):  # the human-rating RM is one for every draw
        draw0 = sft_stage(run, corpora.texts("train"), corpora.texts("val"), tok, sft_inputs, seed=pc.seed,
                          label="sft_draw0")
    rm_dir, rm_key, proxies = _reward_model_stages(run, corpora, tok, data_key, sft_dir, sft_key, gold, gold_key, full,
                                                   draw0)
    # the best-of-n reference of the reports' frontier plots: drawn once, from draw 0's SFT policy and proxy, by the
    # first run that loads draw 0 (not by an ablation's driver, which builds with `defer`)
    bon_dir = ""
    if cfg.replicate == 0 and not run.defer:
        bon_dir = _bon_stages(run, tok, sft_dir, sft_key, gold, gold_key, rm_dir, rm_key)
    pretrained_dir = ""
    if pc.model.preset:
        pretrained_dir = build_preset_stages(run, corpora.texts("train"), corpora.texts("val"), data_key)
    return {"tokenizer_dir": tok_dir, "sft_dir": sft_dir, "rm_dir": rm_dir, "reward_offset": load_reward_offset(rm_dir),
            "gold_dir": gold_dir, "bon_dir": bon_dir, "pretrained_dir": pretrained_dir,
            "summary": {"proxies": proxies} if proxies else {}}


def _data_stage(run: Any, corpora: _Corpora) -> str:
    """The ``data`` stage: row counts of the verified cache. Returns its key."""
    from harness.tasks.review_sentiment.data import check_cache

    dc = run.cfg.pipeline.data
    manifest = check_cache(dc)
    data_cfg = {"val_fraction": dc.val_fraction, "test_fraction": dc.test_fraction, "split_salt": dc.split_salt,
                "files": {k: v["sha256"] for k, v in sorted(manifest["files"].items())}}

    def build(tmp: Path) -> dict:
        sn, rt = corpora.frames()
        counts = {
            "snippets": int(len(sn)),
            "snippets_by_domain": {k: int(v) for k, v in sn.groupby("domain", sort=False).size().items()},
            "snippets_by_split": {k: int(v) for k, v in sn["split"].value_counts().sort_index().items()},
            "rotten_tomatoes": int(len(rt)),
            "rotten_tomatoes_by_split": {k: int(v) for k, v in rt["split"].value_counts().sort_index().items()},
        }
        (tmp / "counts.json").write_text(json.dumps(counts, indent=2))
        return counts

    return run("data", data_cfg, {}, build)[1]["key"]


def _gold_stage(run: Any, corpora: _Corpora, data_key: str) -> tuple[str, str]:
    """The ``gold`` stage (:func:`.gold.train_gold`). Returns ``(dir, key)``."""
    from harness.pipeline.stage import say
    from harness.tasks.review_sentiment.gold import stage_settings, train_gold

    pc = run.cfg.pipeline

    def build(tmp: Path) -> dict:
        return train_gold(corpora.frames()[0], tmp, pc.gold, device=run.device, seed=pc.seed, log=say)

    path, rec = run("gold", {**stage_settings(pc.gold), "seed": pc.seed}, {"data": data_key}, build)
    return str(path), rec["key"]


class _GoldScorer:
    """The gold reward model, loaded on first use: ``texts -> FloatTensor[B]``."""

    def __init__(self, gold_dir: str, device: Any) -> None:
        self.gold_dir, self.device, self._model = gold_dir, device, None

    def __call__(self, texts: list[str]) -> Any:
        from harness.tasks.review_sentiment.gold import GoldRewardModel

        if self._model is None:
            self._model = GoldRewardModel(self.gold_dir, device=self.device)
        return self._model(texts)


def _proxy_data_stage(run: Any, corpora: _Corpora, tok: Any, sft_dir: str, sft_key: str, gold: _GoldScorer,
                      gold_key: str) -> tuple[Path, str]:
    """The ``proxy_data`` stage (:func:`.proxy.build_proxy_data`). Returns ``(dir, key)``."""
    from harness.tasks.review_sentiment.proxy import MATCH_CANDIDATES, TIE_RESERVE, build_proxy_data

    cfg, rmc = run.cfg, run.cfg.pipeline.reward_model
    settings = {"pool_pairs": rmc.proxy_pool_pairs, "heldout_pairs": rmc.proxy_heldout_pairs,
                "prompt_length": cfg.task.prompt_length, "response_length": cfg.task.response_length,
                "temperature": cfg.ppo.temperature, "seed": cfg.draw_seed, "tie_reserve": TIE_RESERVE,
                **({} if rmc.proxy_truncate_after_eos else {"truncate_after_eos": False}),
                **({"match_length": MATCH_CANDIDATES} if rmc.proxy_match_length else {}),
                **({"suppress_special_tokens": True} if cfg.task.suppress_special_tokens else {})}

    def build(tmp: Path) -> dict:
        return build_proxy_data(tmp, sft_dir, tok, corpora.texts("train"), corpora.texts("val"), gold,
                                pool_pairs=rmc.proxy_pool_pairs, heldout_pairs=rmc.proxy_heldout_pairs,
                                prompt_length=cfg.task.prompt_length, response_length=cfg.task.response_length,
                                temperature=cfg.ppo.temperature, seed=cfg.draw_seed,
                                truncate=rmc.proxy_truncate_after_eos, match_length=rmc.proxy_match_length,
                                suppress_special=cfg.task.suppress_special_tokens, device=run.device)

    path, rec = run("proxy_data", settings, {"sft": sft_key, "gold": gold_key}, build)
    return path, rec["key"]


def _needs_human_rm(rmc: Any) -> bool:
    """Does the proxy start from the reward model of human ratings (``labels: gold``, ``proxy_init: human_rm``)?"""
    return rmc.labels == "gold" and rmc.proxy_init == "human_rm"


def _rm_stage(run: Any, corpora: _Corpora, tok: Any, rm_cfg: Any, label: str, init_dir: str, proxy_dir: Path | None,
              inputs: dict[str, str], seed: int | None = None) -> tuple[str, str]:
    """One ``reward_model`` stage: gold-labelled proxy comparisons (``labels: gold``, from ``proxy_dir``) or
    human-rating pairs, fine-tuned from ``init_dir``, with ``seed`` (default the run's draw seed). Returns
    ``(dir, key)``."""
    seed = run.cfg.draw_seed if seed is None else seed

    def build(tmp: Path) -> dict:
        if rm_cfg.labels == "gold":
            from harness.tasks.review_sentiment.proxy import load_proxy_data, train_proxy_reward_model

            return train_proxy_reward_model(load_proxy_data(proxy_dir), rm_cfg.proxy_pairs, init_dir, tok, rm_cfg, tmp,
                                            seed=seed, device=run.device, bf16=run.bf16, progress=run.progress)
        from harness.tasks.review_sentiment.reward_model import train_reward_model

        return train_reward_model(corpora.frames()[0], corpora.texts("train"), init_dir, tok, rm_cfg, tmp,
                                  seed=seed, device=run.device, bf16=run.bf16, progress=run.progress)

    path, rec = run("reward_model", {"reward_model": rm_cfg.model_dump(mode="json"), "seed": seed}, inputs, build,
                    label=label)
    return str(path), rec["key"]


def _reward_model_stages(run: Any, corpora: _Corpora, tok: Any, data_key: str, sft_dir: str, sft_key: str,
                         gold: _GoldScorer, gold_key: str, full: bool,
                         draw0: tuple[str, str]) -> tuple[str, str, dict[str, dict]]:
    """The proxy data, the human-rating RM that initialises the proxy, the proxy itself and (``full``) the
    proxies of the other :data:`PROXY_SIZES`. The human-rating RM is not drawn again for each pipeline draw: it
    learns from the corpus's ratings, not from the draw's samples, and is built once, from draw 0's SFT policy
    ``draw0 = (sft_dir, sft_key)`` with ``pipeline.seed`` (the proxy of every draw starts from it and is trained
    on that draw's comparisons with that draw's seed). Returns ``(rm_dir, rm_key, proxies)`` where ``proxies`` maps
    each built or cached gold-labelled size to its metrics (empty with ``labels: human``)."""
    from harness.pipeline.stage import STAGE_FILE, stage_key

    pc = run.cfg.pipeline
    rmc = pc.reward_model
    base = {"data": data_key, "sft": sft_key}
    keys: dict[str, str] = {}
    proxy_dir = None
    if rmc.labels == "gold":
        proxy_dir, keys["proxy_data"] = _proxy_data_stage(run, corpora, tok, sft_dir, sft_key, gold, gold_key)
    init = sft_dir
    if _needs_human_rm(rmc):
        human = rmc.model_copy(update={"labels": "human", **PROXY_FIELD_DEFAULTS})
        init, keys["init"] = _rm_stage(run, corpora, tok, human, "human_rm", draw0[0], None,
                                       {"data": data_key, "sft": draw0[1]}, seed=pc.seed)
    rm_dir, rm_key = _rm_stage(run, corpora, tok, rmc, "reward_model", init, proxy_dir, {**base, **keys})
    if rmc.labels != "gold":
        return rm_dir, rm_key, {}
    proxies = {str(rmc.proxy_pairs): run.metrics["reward_model"]}
    for n in sorted(PROXY_SIZES):
        if n == rmc.proxy_pairs or n > rmc.proxy_pool_pairs:
            continue
        size_cfg = rmc.model_copy(update={"proxy_pairs": n})
        if full:
            _rm_stage(run, corpora, tok, size_cfg, f"proxy_{n}", init, proxy_dir, {**base, **keys})
            proxies[str(n)] = run.forget(f"proxy_{n}")
        else:  # not asked for: reported when an earlier `harness pipeline` built it, never built here
            key = stage_key({"reward_model": size_cfg.model_dump(mode="json"), "seed": run.cfg.draw_seed},
                            {**base, **keys})
            done = run.out_dir / "reward_model" / key / STAGE_FILE
            if done.is_file():
                proxies[str(n)] = json.loads(done.read_text())["metrics"]
    return rm_dir, rm_key, dict(sorted(proxies.items(), key=lambda kv: int(kv[0])))


def _bon_stages(run: Any, tok: Any, sft_dir: str, sft_key: str, gold: _GoldScorer, gold_key: str, rm_dir: str,
                rm_key: str) -> str:
    """``bon_samples`` (SFT responses on the first evaluation prompts, gold-scored; with the gold's naturalness head
    on, also the gold's mean on the committed degenerate samples, ``degenerate_samples_gold_mean``, and whether it is
    below the SFT policy's held-out ``gold_mean``: the gold's validation) and ``bon`` (their best-of-n curve under
    this RM). Returns the ``bon`` stage directory."""
    from harness.tasks.review_sentiment.bon import build_bon_curve, build_bon_samples
    from harness.tasks.review_sentiment.reward_model import load_reward_offset

    cfg = run.cfg
    bc, truncate = cfg.pipeline.bon, cfg.pipeline.reward_model.proxy_truncate_after_eos
    settings = {**bc.model_dump(mode="json"), "temperature": cfg.ppo.temperature, "task": cfg.task.model_dump(mode="json"),
                "eval_prompts": cfg.eval.num_prompts, "eval_seed": cfg.eval.seed,
                **({} if truncate else {"truncate_after_eos": False})}

    def build_samples(tmp: Path) -> dict:
        from harness.tasks.review_sentiment.task import make_review_sentiment

        prompts = make_review_sentiment(cfg, tok).eval_prompt_ids[: bc.num_prompts]
        metrics = build_bon_samples(tmp, sft_dir, tok, prompts, gold, n_samples=bc.n_samples,
                                    response_length=cfg.task.response_length, temperature=cfg.ppo.temperature,
                                    seed=bc.seed, device=run.device, truncate=truncate,
                                    suppress_special=cfg.task.suppress_special_tokens)
        if cfg.pipeline.gold.naturalness == "on":  # the gold's validation: degenerate text below the SFT policy's
            from harness.tasks.review_sentiment.gold import DEGENERATE_SAMPLES

            samples = json.loads(DEGENERATE_SAMPLES.read_text())["samples"]
            metrics["degenerate_samples_gold_mean"] = float(gold([x["prompt"] + x["response"] for x in samples]).mean())
            metrics["degenerate_below_sft"] = metrics["degenerate_samples_gold_mean"] < metrics["gold_mean"]
        return metrics

    samples_dir, rec = run("bon_samples", settings, {"sft": sft_key, "gold": gold_key}, build_samples)

    def build_curve(tmp: Path) -> dict:
        return build_bon_curve(tmp, samples_dir, rm_dir, load_reward_offset(rm_dir), tok.pad_token_id, device=run.device)

    path, _ = run("bon", {}, {"bon_samples": rec["key"], "reward_model": rm_key}, build_curve)
    return str(path)


__all__ = ["build_stages", "STAGES", "PROXY_SIZES", "PROXY_FIELD_DEFAULTS"]
