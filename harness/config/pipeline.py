"""Pipeline settings: data, tokenizer, the harness's model, SFT, the gold and reward models, best-of-n
(``Config.pipeline``). The stages that read them are the task's (e.g.
:mod:`harness.tasks.review_sentiment.stages`) and the generic ones of :mod:`harness.pipeline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BeforeValidator, Field, model_validator

from harness.config.base import _Strict, _yaml_switch, default_cache_dir, default_results_dir


class DataConfig(_Strict):
    """Where the offline corpora live and how they are split (by a hash of the text)."""

    cache_dir: str = Field(default_factory=default_cache_dir)
    val_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    test_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    split_salt: str = "ppo-harness"


class TokenizerConfig(_Strict):
    """Byte-level BPE trained with HF ``tokenizers`` on the train split."""

    vocab_size: int = Field(2048, ge=300, le=65536)
    min_frequency: int = Field(2, ge=1)


class ModelConfig(_Strict):
    """The small GPT-2 built here, or any local causal LM (``policy_path``)."""

    n_layer: int = Field(4, ge=1, le=48)
    n_embd: int = Field(128, ge=16, le=4096)
    n_head: int = Field(4, ge=1, le=64)
    n_positions: int = Field(96, ge=16, le=8192)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    policy_path: Optional[str] = None  # local dir (or hub id when online) replacing the built SFT policy
    # a real pretrained policy from a PyPI wheel (harness.pipeline.pretrained), built by the `pretrained` stage
    preset: Optional[Literal["smollm2-135m"]] = None

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.n_embd % self.n_head:
            raise ValueError(f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head})")
        if self.preset and self.policy_path:
            raise ValueError(f"model.preset ({self.preset}) and model.policy_path both name the policy; set one")
        return self


class SFTConfig(_Strict):
    """Supervised fine-tuning with TRL ``SFTTrainer``."""

    epochs: float = Field(1.0, gt=0.0)  # one pass over ~33.8k texts ≈ 530 steps ≈ 3 min on 2 CPU cores
    max_steps: int = Field(-1, ge=-1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(2e-3, gt=0.0, lt=1.0)
    max_length: int = Field(64, ge=8)
    max_train_texts: Optional[int] = Field(None, ge=1)
    group_by_length: bool = True  # batch texts of similar length: less padding, less compute


class GoldConfig(_Strict):
    """The gold reward model (:mod:`harness.tasks.review_sentiment.gold`): the pretrained all-MiniLM-L6-v2 encoder with
    its top ``finetune_layers`` layers trained (0 = frozen encoder, ridge head) on the human ratings, and with
    ``naturalness: on`` a naturalness head beside it (both knobs left out of the dump, hence every hash, while off).
    ``encoder_layers`` < 6 keeps only the encoder's bottom layers (the smoke scale's cheap gold; left out of the dump
    at 6)."""

    _omit_at_default = ("naturalness", "naturalness_penalty", "naturalness_negatives", "encoder_layers")

    finetune_layers: int = Field(2, ge=0, le=6)
    encoder_layers: int = Field(6, ge=1, le=6)
    epochs: int = Field(2, ge=1, le=20)
    lr: float = Field(6e-5, gt=0.0, lt=1.0)  # the fine-tuned encoder layers
    head_lr: float = Field(1e-3, gt=0.0, lt=1.0)  # the linear head
    batch_size: int = Field(32, ge=1)
    max_snippets: Optional[int] = Field(None, ge=100)  # cap on the rated snippets used (smoke tests)
    # on: gold = sentiment − naturalness_penalty · (1 − P(natural)), the naturalness head judging human text against
    # rule-made degenerations (harness.tasks.review_sentiment.naturalness); off: sentiment alone
    naturalness: Annotated[Literal["off", "on"], BeforeValidator(_yaml_switch)] = "off"
    naturalness_penalty: float = Field(1.0, gt=0.0, le=10.0)
    # what the head learns to call unnatural: loops (repeated n-grams, character loops); loops and fragment soup
    # (run-together word pieces; one more feature, the share of characters in long words); or both and symbol soup
    # (pieces of the corpus's emoticons and placeholders between words; one more feature, the share of symbols)
    naturalness_negatives: Literal["loops", "loops_and_soup", "loops_and_symbol_soup"] = "loops"

    @model_validator(mode="after")
    def _tuned_layers_exist(self) -> "GoldConfig":
        if self.naturalness_negatives != "loops" and self.naturalness != "on":
            raise ValueError(f"gold.naturalness_negatives ({self.naturalness_negatives}) needs gold.naturalness: on "
                             "(it chooses what the naturalness head is trained on)")
        if self.finetune_layers > self.encoder_layers:
            raise ValueError(f"gold.finetune_layers ({self.finetune_layers}) must be at most gold.encoder_layers "
                             f"({self.encoder_layers}): only the layers the encoder keeps can be fine-tuned")
        return self


class RewardModelConfig(_Strict):
    """The proxy reward model, trained with TRL ``RewardTrainer``.

    ``labels: gold`` (default; Gao et al. 2022 §2): comparisons of two SFT-policy responses to one
    prompt, labelled by the gold reward model; the first ``proxy_pairs`` of a pool of
    ``proxy_pool_pairs`` are used (so proxies of different sizes are nested: a spec comparing proxy sizes sets one
    pool for all of them, e.g. ``overoptimization``'s 9,000), agreement is measured on ``proxy_heldout_pairs``
    comparisons on held-out prompts. The default pool is the default proxy's 1,000 comparisons: each pipeline draw
    samples and gold-labels only what it trains on. ``labels: human``: pairs of rated
    snippets ordered by their mean human rating (``margin``, ``pairs_per_snippet``, ``max_train_pairs``).
    """

    labels: Literal["gold", "human"] = "gold"
    proxy_pairs: int = Field(1000, ge=16)
    proxy_pool_pairs: int = Field(1000, ge=16)
    proxy_heldout_pairs: int = Field(1000, ge=16)
    # cut the sampled responses of the proxy data (and of best-of-n) after the first EOS, as rollouts are with
    # ppo.truncate_after_eos; false: fixed-length responses (Ziegler et al. 2019's continuation tasks)
    proxy_truncate_after_eos: bool = True
    # proxy comparisons of two responses of equal length only (truncated after EOS): a proxy that cannot learn a
    # length preference from its data, for claims about EOS or length (review_sentiment's variable_length regime)
    proxy_match_length: bool = False
    # what a gold-labelled proxy starts from: the reward model of human ratings (built first; it already
    # reads sentiment) or the SFT policy (a new score head)
    proxy_init: Literal["human_rm", "sft"] = "human_rm"
    margin: float = Field(2.0, ge=0.0, le=8.0)  # skip pairs whose mean ratings differ by less
    pairs_per_snippet: int = Field(2, ge=1)
    max_train_pairs: Optional[int] = Field(24000, ge=1)  # of ~42.5k candidate pairs; 750 steps at batch 32
    epochs: float = Field(1.0, gt=0.0)
    max_steps: int = Field(-1, ge=-1)
    batch_size: int = Field(32, ge=1)  # pairs per step (2x sequences)
    lr: float = Field(1e-3, gt=0.0, lt=1.0)
    max_length: int = Field(64, ge=8)
    group_by_length: bool = True  # batch pairs of similar length: less padding, less compute

    _omit_at_default = ("proxy_match_length",)

    @model_validator(mode="after")
    def _matched_lengths_are_truncated_lengths(self) -> "RewardModelConfig":
        if self.proxy_match_length and not self.proxy_truncate_after_eos:
            raise ValueError("reward_model.proxy_match_length needs reward_model.proxy_truncate_after_eos: true "
                             "(fixed-length responses are all of one length already)")
        return self

    @model_validator(mode="after")
    def _pool_holds_proxy(self) -> "RewardModelConfig":
        if self.proxy_pairs > self.proxy_pool_pairs:
            raise ValueError(f"reward_model.proxy_pairs ({self.proxy_pairs}) must be ≤ reward_model.proxy_pool_pairs "
                             f"({self.proxy_pool_pairs})")
        return self


class BonConfig(_Strict):
    """Best-of-n from the SFT policy (:mod:`harness.tasks.review_sentiment.bon`): ``n_samples`` responses for each of the
    first ``num_prompts`` evaluation prompts; n = 1, 2, 4, …, ``n_samples``."""

    num_prompts: int = Field(64, ge=1)
    n_samples: int = Field(256, ge=2, le=4096)
    seed: int = Field(4321, ge=0)


#: Distance between the seeds of two pipeline draws (:attr:`PipelineConfig.replicates`).
REPLICATE_STRIDE = 1_000_003


class PipelineConfig(_Strict):
    """Everything that builds the four models' starting points.

    ``seed`` is the pipeline's own seed (SFT and RM training), separate from the PPO run's seed, so
    that seeds of an ablation vary only PPO and share one SFT policy and one reward model.

    ``replicates`` (r) draws of the stages that sample or train with randomness: a run of seed ``s`` uses draw
    ``s mod r`` (:attr:`harness.config.Config.replicate`), whose SFT, proxy data and reward models are built from
    the draw seed ``seed + REPLICATE_STRIDE · (s mod r)`` (:attr:`harness.config.Config.draw_seed`); the gold scorer,
    the data and the problems stay one. Draw 0 is the single pipeline of ``r = 1`` (same stage keys).
    """

    _omit_at_default = ("replicates",)

    seed: int = Field(0, ge=0)
    replicates: int = Field(1, ge=1, le=100)

    data: DataConfig = Field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    gold: GoldConfig = Field(default_factory=GoldConfig)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    bon: BonConfig = Field(default_factory=BonConfig)
    out_dir: str = Field(default_factory=lambda: str(Path(default_results_dir()) / "pipeline"))

    def draw_seed(self, replicate: int) -> int:
        """The seed of pipeline draw ``replicate``: ``seed + REPLICATE_STRIDE · replicate`` (``seed`` for draw 0).
        Raises nothing."""
        return self.seed + REPLICATE_STRIDE * replicate
