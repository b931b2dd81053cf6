"""The models of one PPO run: policy, frozen reference, reward model, critic; and the update's forwards.

:func:`build_models` loads them from the task's pipeline artifacts; :func:`assemble_models` from saved
directories (the benchmark uses it directly). :func:`update_forwards` builds the two forward passes of a
PPO update step once per run (eager or ``torch.compile``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from harness.rl import components  # noqa: F401  (registers every variant)
from harness.rl.components.critic import CRITIC_INIT
from harness.rl.components.dropout import DROPOUT
from harness.config import Config
from harness.rl.rollout import response_logprobs


@dataclass
class Models:
    """The four models of PPO for LMs. ``critic`` is None for critic-free estimators, ``reward_model`` (and
    ``rm_tokenizer``) for a task scored by a verifier."""

    policy: nn.Module
    ref: nn.Module
    reward_model: Optional[nn.Module]
    critic: Optional[nn.Module]
    tokenizer: Any  # policy tokenizer
    rm_tokenizer: Any
    reward_offset: float  # mean RM score on the SFT demonstrations (N+ detail 15)
    gold: Optional[Callable[[list[str]], torch.Tensor]] = None  # the gold RM: texts -> [B] (eval/gold)
    pipeline_keys: dict[str, str] = field(default_factory=dict)  # stage -> cache key (provenance)
    pipeline_digests: dict[str, str] = field(default_factory=dict)  # stage -> sha256 of its saved tensors
    pipeline_build_s: float = 0.0  # seconds this run spent building pipeline stages it found missing (0 when cached)

    def n_params(self) -> dict[str, int]:
        """Parameter count of each model held in memory (reward model and critic absent when not built)."""
        out = {
            "policy": sum(p.numel() for p in self.policy.parameters()),
            "ref": sum(p.numel() for p in self.ref.parameters()),
        }
        if self.reward_model is not None:
            out["reward_model"] = sum(p.numel() for p in self.reward_model.parameters())
        if self.critic is not None:
            out["critic"] = sum(p.numel() for p in self.critic.parameters())
        return out


def build_models(cfg: Config, device: torch.device, defer: bool = False) -> Models:
    """Load policy, frozen reference, the task's reward model (when its pipeline builds one) and (if the
    estimator needs one) the critic from the pipeline's artifacts (``pipeline.model.policy_path``, or the
    ``pretrained`` stage of ``pipeline.model.preset``, replaces the SFT policy when set), and the task's gold
    scorer (``TASKS.meta(name)["gold"](artifacts, device)``, when the task declares one).

    The pipeline stages are built first if missing (cached otherwise; an ablation's worker builds its run's
    pipeline draw this way, with the run's own torch threads, while other runs train; the seconds spent building
    are kept in ``pipeline_build_s``, so that a run's cost can leave them out); see :func:`assemble_models`.
    ``defer`` leaves out the stages no PPO run reads (:func:`harness.pipeline.build_pipeline`'s ``defer``: the
    best-of-n reference), for a caller that measures the models without training them.
    """
    from harness.experiments import engine
    from harness.rl.models import load_tokenizer
    from harness.pipeline import build_pipeline
    from harness.tasks import TASKS

    # in a worker: the run's own threads, and no training bars under the driver's display
    art = build_pipeline(cfg, threads=torch.get_num_threads(), progress=not engine.in_task(), defer=defer)
    policy_dir = cfg.pipeline.model.policy_path or art.pretrained_dir or art.sft_dir
    tok_dir = cfg.pipeline.model.policy_path or art.pretrained_dir or art.tokenizer_dir
    models = assemble_models(cfg, device, policy_dir, art.rm_dir, load_tokenizer(tok_dir), load_tokenizer(art.tokenizer_dir),
                             float(art.reward_offset))
    load_gold = TASKS.meta(cfg.task.name).get("gold")
    models.gold = load_gold(art, device) if load_gold is not None else None
    models.pipeline_keys = {k: str(v.get("key")) for k, v in art.summary.get("stages", {}).items()}
    models.pipeline_digests = {k: str(v["weights_sha256"]) for k, v in art.summary.get("stages", {}).items()
                               if v.get("weights_sha256")}
    models.pipeline_build_s = pipeline_build_seconds(art.summary)
    return models


def pipeline_build_seconds(summary: dict[str, Any]) -> float:
    """Seconds spent building the stages of a :func:`build_pipeline` call that were not cached (the sum of their
    ``wall_time_s`` in ``summary["stages"]``); 0.0 when every stage was loaded from the cache.

    Example: ``{"stages": {"sft": {"cached": False, "wall_time_s": 190.0}, "gold": {"cached": True, ...}}}`` → 190.0.
    """
    return float(sum(float(v.get("wall_time_s") or 0.0) for v in summary.get("stages", {}).values()
                     if not v.get("cached", True)))


def assemble_models(cfg: Config, device: torch.device, policy_dir: str | Path, rm_dir: str | Path, tokenizer: Any,
                    rm_tokenizer: Any, reward_offset: float) -> Models:
    """The four models from saved directories, prepared as every run uses them.

    Policy and a frozen reference from ``policy_dir``, a frozen RM from ``rm_dir``, and the critic
    from ``ppo.critic_init`` (only when ``ppo.adv_estimator`` needs one). Dropout is set on all four
    by the ``ppo.dropout`` variant; with ``ppo.fused_gelu`` their ``gelu_new`` activations run as
    PyTorch's fused tanh GELU (:func:`harness.rl.models.use_fused_gelu`). With ``task.suppress_special_tokens`` the
    policy and the reference never emit the special tokens a response's text would hide
    (:func:`harness.rl.models.hidden_special_ids`: all of them, or all but EOS where responses end at EOS;
    :func:`harness.rl.models.suppress_tokens`).

    Raises:
        HarnessError: a directory is missing or cannot be loaded.
    """
    from harness.rl.models import hidden_special_ids, load_policy, load_scalar_model, suppress_tokens, use_fused_gelu

    set_dropout = DROPOUT.get(cfg.ppo.dropout)
    policy = set_dropout(load_policy(policy_dir, device))
    ref = set_dropout(load_policy(policy_dir, device)).eval().requires_grad_(False)
    if cfg.task.suppress_special_tokens:
        # EOS stays allowed wherever a response is cut there: in training, or in the held-out evaluation (a variant
        # that trains without the cut, e.g. eos_trick's no_truncation, is still measured by where its EOS falls)
        hidden = hidden_special_ids(tokenizer, ends_at_eos=cfg.ppo.truncate_after_eos or cfg.eval.truncate_after_eos)
        for lm in (policy, ref):
            suppress_tokens(lm, hidden)
    reward_model = set_dropout(load_scalar_model(rm_dir, device)).eval().requires_grad_(False) if rm_dir else None
    critic = None
    if cfg.ppo.needs_critic:
        critic = set_dropout(CRITIC_INIT.get(cfg.ppo.critic_init)(str(policy_dir), str(rm_dir), device, seed=cfg.seed))
    if cfg.ppo.fused_gelu:
        for model in (policy, ref, reward_model, critic):
            if model is not None:
                use_fused_gelu(model)
    return Models(policy=policy, ref=ref, reward_model=reward_model, critic=critic, tokenizer=tokenizer,
                  rm_tokenizer=rm_tokenizer, reward_offset=reward_offset)


def critic_values(critic: nn.Module, query_responses: torch.Tensor, context_length: int) -> torch.Tensor:
    """Critic values ``[B, T]`` for ``query_responses`` ``[B, P + T]`` (``P = context_length``): the value of
    the state before each response token, read from the critic's scalar head (TRL/OpenRLHF convention)."""
    from harness.rl.models import scalar_head_outputs

    v = scalar_head_outputs(critic, query_responses, None)
    return v[:, context_length - 1 : -1]


def update_forwards(models: Models, context_length: int, temperature: float, compile: bool = False
                    ) -> tuple[Callable[[torch.Tensor], torch.Tensor], Optional[Callable[[torch.Tensor], torch.Tensor]]]:
    """The two forward passes of a PPO update step, built once per run.

    Returns ``(policy_fwd, critic_fwd)``: ``policy_fwd(query_responses [b, P+T]) -> logprobs [b, T]``
    (response log-probabilities at τ, grad-enabled) and ``critic_fwd(query_responses) -> values [b, T]``
    (None without a critic). With ``compile`` each is wrapped in ``torch.compile`` (inductor, static
    shapes): it compiles on its first call (per distinct micro-batch shape and train/eval mode) and is
    reused for every later iteration of the run; inductor's on-disk cache makes later processes with
    the same graphs compile faster. Compiled kernels fuse differently, so results are not
    bit-identical to eager; with ``compile=False`` these are the plain eager calls.
    """
    policy, critic = models.policy, models.critic

    def policy_fwd(query_responses: torch.Tensor) -> torch.Tensor:
        return response_logprobs(policy, query_responses, context_length, temperature)[0]

    def critic_fwd(query_responses: torch.Tensor) -> torch.Tensor:
        return critic_values(critic, query_responses, context_length)

    if not compile:
        return policy_fwd, (critic_fwd if critic is not None else None)
    return (torch.compile(policy_fwd, dynamic=False),
            torch.compile(critic_fwd, dynamic=False) if critic is not None else None)
