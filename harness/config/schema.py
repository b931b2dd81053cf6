"""Typed configuration: one pydantic model per concern, loaded from YAML, validated up front.

Every knob of the task, of the PPO loop and of the evaluation lives here; the pipeline's are in
:mod:`harness.config.pipeline`, the base model and defaults in :mod:`harness.config.base`.
Unknown keys, wrong types and out-of-range values are rejected before any compute starts; the
error names the field and the allowed values (see :func:`format_validation_error`).

Usage::

    cfg = load_config("my.yaml", overrides=["ppo.kl_coef=0.1", "seed=3"])
    cfg.save("run/config.yaml")        # the resolved config, saved next to every artifact
    cfg.hash()                         # stable hash of the resolved config
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import (BeforeValidator, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from harness.registry import component


# ConfigError, fingerprint and the default directories are part of this API (defined in harness.config.base)
# (flatten, deep_update and parse_overrides too: the merging and override parsing of config mappings)
from harness.config.base import (ALIAS_KEYS, DEFAULT_TASK, ConfigError, _Strict, _yaml_switch,  # noqa: F401
                                 deep_update, default_cache_dir, default_reports_dir, default_results_dir,
                                 fingerprint, flatten, parse_overrides, portable)
from harness.config.messages import format_validation_error  # noqa: F401  (part of this API)
from harness.config.pipeline import PipelineConfig


class TaskConfig(_Strict):
    """The RL task: its name, prompt and response length, and its own knobs (``options``).

    ``options`` holds the knobs of the named task (e.g. chain_sum's number of terms and digits), validated by the
    model the task registers (``TASKS.register(..., options=Model)``) when the config is built: an unknown or
    out-of-range option names ``task.options.<field>``. A task without options takes none. Empty options are
    left out of the dumped config, so configs from before options existed keep their hash.
    """

    name: component("task.name") = DEFAULT_TASK
    prompt_length: int = Field(8, ge=1, le=256)  # tokens of a prompt (left-padded by tasks whose prompts vary)
    response_length: int = Field(24, ge=1, le=1024)
    options: dict[str, Any] = Field(default_factory=dict, validate_default=True)
    # true: the policy, the reference and the pipeline's SFT samples never emit special tokens their text would hide
    # (padding; EOS unless responses end there: harness.rl.models.hidden_special_ids), so every token is text
    suppress_special_tokens: bool = False
    _omit_at_default = ("options", "suppress_special_tokens")

    @field_validator("options")
    @classmethod
    def _options_of_the_task(cls, options: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        from harness.registry import registry

        name = info.data.get("name")
        if name is None:  # the name failed its own validation, which reports it
            return options
        model = registry("task.name").meta(name).get("options")
        if model is None:
            if options:
                raise ValueError(f"task {name} takes no options (got {', '.join(sorted(options))})")
            return options
        try:
            return model.model_validate(options).model_dump(mode="json")
        except ValidationError as err:
            whole = "\x00"  # a problem of the options as a whole: no field name before it
            text = format_validation_error(err, root=model, empty=whole).replace(f"{whole}: ", "")
            raise ValueError(f"task {name}: {text}") from None



# --------------------------------------------------------------------------------------------
# PPO
# --------------------------------------------------------------------------------------------


class PPOConfig(_Strict):
    """Every implementation detail of the PPO loop. Defaults follow the N+ reference recipe
    (Huang et al. 2024), scaled to the tiny model. Names follow ``shared/reference``."""

    # schedule
    total_iterations: int = Field(60, ge=1)
    batch_size: int = Field(64, ge=1)  # rollout batch (responses per iteration)
    num_minibatches: int = Field(2, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)  # micro-batches per minibatch
    num_ppo_epochs: int = Field(4, ge=1)
    lr: float = Field(3e-4, gt=0.0, lt=1.0)
    adam_eps: float = Field(1e-5, gt=0.0)
    max_grad_norm: Optional[float] = Field(1.0, gt=0.0)
    temperature: float = Field(0.7, gt=0.0)
    # the update forwards' logprobs: "sampling" divides the logits by τ as the rollout did (N+); "unit" uses
    # τ = 1 there while π_old stays at τ (negative control: a sampler/trainer mismatch, first-epoch ratio ≠ 1)
    logprob_temperature: Literal["sampling", "unit"] = "sampling"
    sampler: component("ppo.sampler") = "inverse_cdf"  # how tokens are drawn: inverse_cdf | multinomial (same distribution)
    fused_gelu: bool = True  # run GPT-2's gelu_new as torch's one-kernel tanh GELU (same function, faster)
    compile: bool = False  # torch.compile the update-step forwards (compiled once per run; not bit-identical)
    # policy loss
    policy_loss: component("ppo.policy_loss") = "vanilla"
    cliprange: float = Field(0.2, gt=0.0, le=10.0)  # ε (ε_low of clip_higher)
    cliprange_high: float = Field(0.28, gt=0.0, le=10.0)  # ε_high of clip_higher (DAPO: 0.28)
    clip_ratio_c: float = Field(3.0, gt=1.0)  # the lower bound −c·A of dual_clip for A < 0 (Ye et al. 2020: 3)
    # value loss
    vf_coef: float = Field(0.1, ge=0.0)
    value_loss: component("ppo.value_loss") = "clipped"  # clipped (PPO2, N+) | mse
    cliprange_value: float = Field(0.2, gt=0.0)  # half-width of the clipped value loss
    # advantages
    adv_estimator: component("ppo.adv_estimator") = "gae"
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(0.95, ge=0.0, le=1.0)
    num_generations: int = Field(4, ge=2)  # group size for critic-free estimators
    # whiten the advantages over the batch (N+ detail); unset = the estimator's recipe (its registry meta ``whitens``:
    # GAE yes, the critic-free estimators no); the dump, hence the hash, holds the resolved value
    whiten_advantages: Optional[bool] = None
    # KL
    kl_placement: component("ppo.kl_placement") = "reward"
    kl_estimator: component("ppo.kl_estimator") = "k1"
    kl_coef: float = Field(0.05, ge=0.0)
    kl_ctl: component("ppo.kl_ctl") = "fixed"
    kl_target: float = Field(6.0, gt=0.0)
    kl_horizon: int = Field(10000, ge=1)
    kl_loss_importance_weight: bool = False  # KL as a loss: weight by sg(π_θ/π_old) (Liu et al. 2025's off-policy correction)
    # reward shaping
    normalize_reward: bool = True  # RM normalization: subtract the mean RM score on SFT data
    whiten_rewards: bool = False  # scale per-token rewards by masked std, no mean shift
    reward_clip: Optional[float] = Field(None, gt=0.0)
    # aggregation, EOS trick, dropout, critic
    loss_agg: component("ppo.loss_agg") = "token-mean"
    truncate_after_eos: bool = True
    missing_eos_penalty: Optional[float] = -1.0
    # negative control: pad id = EOS id, the response's end found as its first pad (TRL #3750): EOS out of the loss
    pad_equals_eos: bool = False
    # YAML 1.1 reads a bare on/off as a boolean; it is mapped back to the variant name.
    dropout: Annotated[component("ppo.dropout"), BeforeValidator(_yaml_switch)] = "off"
    critic_init: component("ppo.critic_init") = "reward_model"
    # gold reward for training (never by default)
    train_on_gold: bool = False
    # DAPO (Yu et al. 2025): overlong reward shaping (§3.4) with this soft buffer L_cache (tokens; None = off), and
    # dynamic sampling (§3.2): groups whose scores are all equal are dropped and refilled, up to max_rounds rollouts
    overlong_buffer: Optional[int] = Field(None, ge=1)
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = Field(4, ge=1)
    # ScaleRL (arXiv 2510.13786): zero-variance filtering (all-equal groups left out of the loss, nothing resampled)
    # and No-Positive-Resampling (a prompt whose running pass rate reaches this threshold leaves the pool; None: off)
    zero_variance_filter: bool = False
    no_positive_resampling: Optional[float] = Field(None, gt=0.0, le=1.0)
    # the knobs of the 2025–26 variants, read by those that name them (registry meta ``knobs``; docket-2025-26):
    sapo_tau_pos: float = Field(1.0, gt=0.0)  # SAPO's gate temperature where A > 0 (arXiv 2511.20347: 1.0)
    sapo_tau_neg: float = Field(1.05, gt=0.0)  # ... and where A < 0 (1.05)
    clip_cov_ratio: float = Field(2e-4, gt=0.0, le=1.0)  # Clip-Cov: the fraction of tokens whose gradient is cut
    clip_cov_lb: float = 1.0  # ... drawn from the tokens whose covariance lies in (clip_cov_lb, clip_cov_ub)
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = Field(2e-4, gt=0.0, le=1.0)  # KL-Cov: the fraction of tokens (top covariance) penalised
    kl_cov_coef: float = Field(1.0, ge=0.0)  # ... by kl_cov_coef·|log π_θ − log π_old|
    # which tokens carry the policy gradient: all | top_entropy | bottom_entropy (ρ = entropy_rho; arXiv 2506.01939)
    token_selection: component("ppo.token_selection") = "all"
    entropy_rho: float = Field(0.2, gt=0.0, lt=1.0)
    w_reinforce_lambda: float = Field(0.1, ge=0.0)  # W-REINFORCE's weight of the positive samples (arXiv 2506.01347)
    pass_k: int = Field(4, ge=1)  # the k of the pass@k advantage (arXiv 2508.10751), ≤ num_generations
    length_reward_coef: float = Field(0.0, ge=0.0)  # weight of Kimi k1.5's group length reward (0: off)
    vapo_alpha: float = Field(0.05, gt=0.0)  # α of VAPO's length-adaptive λ_policy = 1 − 1/(α·l) (arXiv 2504.05118)
    # VAPO's value pretraining: iterations before the first update that sample with the SFT policy and fit only the
    # critic to the λ = 1 (Monte-Carlo) returns; 0: off
    critic_warmup_iterations: int = Field(0, ge=0, le=1000)
    # the rollout engine (harness.rl.engine): its precision, the correction of the mismatch, and bypass (π_old := the
    # engine's logprobs instead of the trainer's recomputed fp32 ones); TIS's cap C and the band of the masks
    rollout_precision: Literal["fp32", "bf16_fp32_head", "bf16", "fp8"] = "fp32"
    rollout_correction: component("ppo.rollout_correction") = "none"
    rollout_bypass: bool = False
    rollout_is_cap: float = Field(2.0, gt=0.0)
    rollout_band_low: float = Field(0.5, gt=0.0)
    rollout_band_high: float = Field(2.0, gt=0.0)
    _omit_at_default = ("overlong_buffer", "dynamic_sampling", "dynamic_sampling_max_rounds", "zero_variance_filter",
                        "no_positive_resampling", "sapo_tau_pos",
                        "sapo_tau_neg", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "kl_cov_coef",
                        "token_selection", "entropy_rho", "w_reinforce_lambda", "pass_k", "length_reward_coef",
                        "vapo_alpha", "critic_warmup_iterations", "rollout_precision", "rollout_correction",
                        "rollout_bypass", "rollout_is_cap", "rollout_band_low", "rollout_band_high")

    @model_validator(mode="before")
    @classmethod
    def _loss_type_alias(cls, data: Any) -> Any:
        """TRL's ``loss_type`` (grpo, bnpo, dapo, dr_grpo) is read as the ``loss_agg`` it names and not kept
        (:data:`harness.rl.components.aggregation.LOSS_TYPE_ALIASES`): an alias and its aggregation are one config."""
        from harness.rl.components.aggregation import resolve_loss_type

        return resolve_loss_type(data)

    @model_validator(mode="after")
    def _batch_divides(self) -> "PPOConfig":
        n = self.num_minibatches * self.gradient_accumulation_steps
        if self.batch_size % n:
            raise ValueError(
                f"ppo.batch_size ({self.batch_size}) must be divisible by ppo.num_minibatches × "
                f"ppo.gradient_accumulation_steps ({self.num_minibatches} × {self.gradient_accumulation_steps} = {n})"
            )
        for knob in ("dynamic_sampling", "zero_variance_filter", "no_positive_resampling"):
            if getattr(self, knob) not in (False, None) and self.needs_critic:
                raise ValueError(f"ppo.{knob} needs groups of responses per prompt: a critic-free "
                                 f"ppo.adv_estimator, not {self.adv_estimator!r}")
        if self.dynamic_sampling and self.zero_variance_filter:
            raise ValueError("ppo.zero_variance_filter leaves the all-equal groups out of the loss, ppo.dynamic_sampling "
                             "resamples them: choose one")
        if self.rollout_band_high <= self.rollout_band_low:
            raise ValueError(f"ppo.rollout_band_high ({self.rollout_band_high}) must be > ppo.rollout_band_low "
                             f"({self.rollout_band_low})")
        if self.rollout_bypass and self.rollout_correction != "none":
            raise ValueError(f"ppo.rollout_bypass takes the engine's logprobs as π_old, so there is no mismatch left to "
                             f"correct: ppo.rollout_correction must be 'none' with it, not {self.rollout_correction!r}")
        if self.clip_cov_ub <= self.clip_cov_lb:
            raise ValueError(f"ppo.clip_cov_ub ({self.clip_cov_ub}) must be > ppo.clip_cov_lb ({self.clip_cov_lb})")
        from harness.registry import registry

        for axis, name in (("ppo.policy_loss", self.policy_loss), ("ppo.adv_estimator", self.adv_estimator)):
            need = registry(axis).meta(name).get("loss_agg")
            if need and self.loss_agg != need:
                raise ValueError(f"{axis} {name!r} is a sequence-level objective: it needs ppo.loss_agg {need!r} "
                                 f"(the mean of its per-sequence losses), not {self.loss_agg!r}")
        if self.adv_estimator == "pass_at_k" and self.pass_k > self.num_generations:
            raise ValueError(f"ppo.pass_k ({self.pass_k}) must be ≤ ppo.num_generations ({self.num_generations}) "
                             "for adv_estimator='pass_at_k'")
        if self.critic_warmup_iterations and not self.needs_critic:
            raise ValueError(f"ppo.critic_warmup_iterations pretrains a critic: it needs a critic's ppo.adv_estimator "
                             f"(gae, gae_length_adaptive), not {self.adv_estimator!r}")
        if self.length_reward_coef and self.needs_critic:
            raise ValueError(f"ppo.length_reward_coef needs groups of responses per prompt: a critic-free "
                             f"ppo.adv_estimator, not {self.adv_estimator!r}")
        if not self.needs_critic:
            if self.batch_size % self.num_generations:
                raise ValueError(
                    f"ppo.batch_size ({self.batch_size}) must be divisible by ppo.num_generations "
                    f"({self.num_generations}) for adv_estimator={self.adv_estimator!r}"
                )
        return self

    def _resolve_dump(self, out: dict[str, Any]) -> dict[str, Any]:
        if out.get("whiten_advantages", False) is None:
            out["whiten_advantages"] = self.advantage_whitening
        return out

    @property
    def advantage_whitening(self) -> bool:
        """Whether the loop whitens the advantages over the batch: ``whiten_advantages`` when set, else the
        estimator's published recipe (registry meta ``whitens``; :mod:`harness.rl.components.advantages`)."""
        if self.whiten_advantages is not None:
            return self.whiten_advantages
        from harness.registry import registry

        return bool(registry("ppo.adv_estimator").meta(self.adv_estimator).get("whitens", False))

    @property
    def needs_critic(self) -> bool:
        """Whether ``adv_estimator`` uses a learned critic (its registry metadata; GAE does, the
        critic-free estimators do not)."""
        from harness.registry import registry

        return bool(registry("ppo.adv_estimator").meta(self.adv_estimator).get("needs_critic", True))

    @property
    def uses_engine(self) -> bool:
        """Whether the responses are sampled by a rollout engine apart from the trainer (:mod:`harness.rl.engine`):
        a precision other than fp32, a correction or bypass. Off (the default), the trainer's policy samples."""
        return self.rollout_precision != "fp32" or self.rollout_correction != "none" or self.rollout_bypass

    @property
    def minibatch_size(self) -> int:
        """Responses per minibatch: ``batch_size // num_minibatches`` (the validator has checked that it divides;
        TRL's ``local_mini_batch_size``)."""
        return self.batch_size // self.num_minibatches

    @property
    def micro_batch_size(self) -> int:
        """Responses per forward/backward pass within a minibatch: ``minibatch_size // gradient_accumulation_steps``
        (checked to divide as well); the loss is still aggregated over the whole minibatch."""
        return self.minibatch_size // self.gradient_accumulation_steps


class EvalConfig(_Strict):
    """The held-out evaluation: ``num_prompts`` prompts set aside from the task's prompt pool by a
    permutation seeded with ``seed`` (the same for every run, never used for training), each sampled
    ``samples_per_prompt`` times at the PPO temperature every ``every`` iterations, before the first
    update and after the last. The sampling generator after ``k`` iterations is seeded from
    ``(seed, run seed, k)`` (``sampling_seed: per_run``): runs that share a seed share the draw, and
    different seeds get independent draws, so the evaluation's sampling noise averages out over seeds
    like any other. ``shared`` seeds it with ``seed + k`` for every run (one draw for all seeds of an
    arm: a constant per arm that no number of seeds averages away; kept to reproduce older runs).
    Responses are cut after the first EOS (whatever ``ppo.truncate_after_eos`` says, so every variant
    is scored alike) unless ``truncate_after_eos`` is false. Gold, proxy (RM score minus the SFT mean,
    whatever ``ppo.normalize_reward`` says), KL, EOS rate and length are logged as ``eval/*``, with the
    standard error of the gold, proxy and KL means over responses as ``eval/*_se``."""

    every: int = Field(8, ge=1)  # 6 evaluations in a 40-iteration run (0, 8, …, 40): the plateau check's points
    num_prompts: int = Field(128, ge=1)
    samples_per_prompt: int = Field(2, ge=1)
    seed: int = Field(1234, ge=0)
    sampling_seed: Literal["per_run", "shared"] = "per_run"
    truncate_after_eos: bool = True  # false: score the full response_length tokens (fixed-length tasks)
    # samples per prompt of a separate draw for the unbiased pass@k (k in harness.rl.evaluation.PASSK up to it) before
    # the first update and after the last, where the task supports it (chain_sum); 0: off
    passk_samples: int = Field(0, ge=0, le=256)
    _omit_at_default = ("passk_samples",)


class Config(_Strict):
    """The whole resolved configuration of one run."""

    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    torch_threads: Optional[int] = Field(None, ge=1)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log_every: int = Field(1, ge=1)
    num_sample_completions: int = Field(8, ge=0)

    @model_validator(mode="after")
    def _bon_prompts_are_eval_prompts(self) -> "Config":
        from harness.registry import registry

        has_rm = registry("task.name").meta(self.task.name).get("reward_model", True)  # only RM tasks build best-of-n
        if has_rm and self.pipeline.bon.num_prompts > self.eval.num_prompts:
            raise ValueError(f"pipeline.bon.num_prompts ({self.pipeline.bon.num_prompts}) must be ≤ eval.num_prompts "
                             f"({self.eval.num_prompts}): best-of-n uses the first evaluation prompts")
        return self

    @model_validator(mode="after")
    def _overlong_buffer_fits(self) -> "Config":
        if self.ppo.overlong_buffer is not None and self.ppo.overlong_buffer > self.task.response_length:
            raise ValueError(f"ppo.overlong_buffer ({self.ppo.overlong_buffer}) must be ≤ task.response_length "
                             f"({self.task.response_length}): it is the last part of the maximum length")
        return self

    @model_validator(mode="after")
    def _critic_from_a_reward_model_the_task_has(self) -> "Config":
        from harness.registry import registry

        if (self.ppo.needs_critic and self.ppo.critic_init == "reward_model"
                and not registry("task.name").meta(self.task.name).get("reward_model", True)):
            raise ValueError(f"ppo.critic_init: reward_model, but task {self.task.name} is scored by a verifier and has "
                             f"no reward model; use ppo.critic_init=policy")
        return self

    @model_validator(mode="after")
    def _critic_reads_the_policys_tokens(self) -> "Config":
        # a critic initialised from the reward model reads the harness tokenizer's ids; a preset policy has its own
        if self.pipeline.model.preset and self.ppo.critic_init == "reward_model" and self.ppo.needs_critic:
            raise ValueError(f"ppo.critic_init: reward_model cannot be the critic of pipeline.model.preset="
                             f"{self.pipeline.model.preset} (another tokenizer); use ppo.critic_init=policy")
        return self

    @property
    def replicate(self) -> int:
        """The pipeline draw this run uses: ``seed mod pipeline.replicates`` (0 with one draw)."""
        return self.seed % self.pipeline.replicates

    @property
    def draw_seed(self) -> int:
        """The seed of this run's pipeline draw: ``pipeline.seed + REPLICATE_STRIDE · replicate`` (``pipeline.seed``
        for draw 0). The stages that train or sample with randomness (SFT, proxy data, reward models) use it; the
        gold scorer uses ``pipeline.seed`` (one measuring instrument for every draw)."""
        return self.pipeline.draw_seed(self.replicate)

    # ---- (de)serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The resolved config as plain python data."""
        return self.model_dump(mode="json")

    def portable_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without this machine's data directories (:func:`harness.config.base.portable`)."""
        return portable(self.to_dict())

    def hash(self) -> str:
        """The run's identity: :func:`fingerprint` of :meth:`portable_dict`, so one config hashes alike on every
        machine. Tagged ``config_hash`` on every ablation child run and written in every run's ``summary.json``."""
        return fingerprint(self.portable_dict())

    def save(self, path: str | os.PathLike) -> Path:
        """Write the resolved config as YAML to ``path`` (parents created). Returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return p


def build_config(data: dict[str, Any] | None = None, overrides: list[str] | None = None) -> Config:
    """Validate ``data`` (plus dotted ``overrides``) into a :class:`Config`, on top of the defaults the named task
    registers (``TASKS.register(..., defaults={...})``: e.g. chain_sum's prompt and response lengths).

    Raises:
        ConfigError: one line naming each bad field and its allowed values.
    """
    from harness.config.presets import task_meta, task_name

    merged = deep_update(data or {}, parse_overrides(overrides))
    merged = deep_update(copy.deepcopy(task_meta(task_name(merged)).get("defaults", {})), merged)
    try:
        return Config.model_validate(merged)
    except ValidationError as err:
        raise ConfigError("invalid config: " + format_validation_error(err, Config)) from None


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None,
                scale: str | None = None, regime: str | None = None) -> Config:
    """Load a YAML config file (or the defaults when ``path`` is None) and apply overrides.

    With ``scale``, the scale preset (:data:`harness.config.presets.SCALE_PRESETS`) is applied first; with ``regime``, the
    task's named regime (:func:`harness.config.presets.regime_overrides`; ``"default"``: the task's default regime, as an
    ablation spec without ``regime:`` runs in) over it; the file's values and the overrides win over both.

    Raises:
        ConfigError: the file is missing, is not a YAML mapping, or fails validation.
        HarnessError: unknown scale (names the scales) or a regime the task does not define (names its regimes).
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        from harness.infra.safety import load_yaml, one_line, read_small_text

        try:
            loaded = load_yaml(read_small_text(p, "config file"))
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p}: not valid YAML ({one_line(e, 200)})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p}: expected a mapping at the top level")
        data = loaded
    if scale is not None or regime is not None:
        from harness.config.presets import regime_overrides, scale_overrides, task_name

        task = task_name(deep_update(data, parse_overrides(overrides)))
        under: dict[str, Any] = copy.deepcopy(scale_overrides(scale, task)) if scale is not None else {}
        if regime is not None:
            under = deep_update(under, copy.deepcopy(regime_overrides(None if regime == "default" else regime, task)))
        data = deep_update(under, data)
    return build_config(data, overrides)


__all__ = ["ALIAS_KEYS", "DEFAULT_TASK", "Config", "ConfigError", "EvalConfig", "PPOConfig", "PipelineConfig", "TaskConfig",
           "build_config", "deep_update", "default_cache_dir", "default_reports_dir", "default_results_dir", "fingerprint",
           "flatten", "format_validation_error", "load_config", "parse_overrides", "portable"]
