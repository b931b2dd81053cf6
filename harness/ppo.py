"""THE PPO loop: rollout → score → advantages → K epochs of shuffled minibatch updates.

One loop serves every ablation. Each implementation detail is looked up by name in its registry
(``harness.components``) from the config; nothing here branches on a variant's name.

Sources: Schulman et al. 2017 (PPO); Ziegler et al. 2019 and Stiennon et al. 2020 (PPO for LMs);
Huang et al. 2024, "The N+ Implementation Details of RLHF with PPO" (the default recipe).
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from harness import components  # noqa: F401  (registers every variant)
from harness.callbacks import Callback
from harness.components.advantages import ADV_ESTIMATORS
from harness.components.aggregation import agg_loss
from harness.components.critic import CRITIC_INIT
from harness.components.dropout import DROPOUT
from harness.components.eos import (apply_missing_eos_penalty, last_token_index, mask_extent, pad_based_mask,
                                   truncate_after_eos)
from harness.components.kl import KL_CONTROLLERS, KL_ESTIMATORS, KL_PLACEMENTS, kl_loss_terms
from harness.components.losses import POLICY_LOSSES, VALUE_LOSSES
from harness.components.rewards import clip_scores, token_rewards, whiten_token_rewards
from harness.components.whitening import masked_mean, masked_var, masked_whiten
from harness.config import Config
from harness.errors import HarnessError, TrainingDivergedError
from harness.rollout import response_logprobs, sample


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------


@dataclass
class Models:
    """The four models of PPO for LMs. ``critic`` is None for critic-free estimators."""

    policy: nn.Module
    ref: nn.Module
    reward_model: nn.Module
    critic: Optional[nn.Module]
    tokenizer: Any  # policy tokenizer
    rm_tokenizer: Any
    reward_offset: float  # mean RM score on the SFT demonstrations (N+ detail 15)
    gold: Optional[Callable[[list[str]], torch.Tensor]] = None  # the gold RM: texts -> [B] (eval/gold)
    pipeline_keys: dict[str, str] = field(default_factory=dict)  # stage -> cache key (provenance)

    def n_params(self) -> dict[str, int]:
        """Parameter count of each model held in memory (critic absent when not built)."""
        out = {
            "policy": sum(p.numel() for p in self.policy.parameters()),
            "ref": sum(p.numel() for p in self.ref.parameters()),
            "reward_model": sum(p.numel() for p in self.reward_model.parameters()),
        }
        if self.critic is not None:
            out["critic"] = sum(p.numel() for p in self.critic.parameters())
        return out


def build_models(cfg: Config, device: torch.device) -> Models:
    """Load policy, frozen reference, RM and (if the estimator needs one) the critic from the
    pipeline's artifacts (``pipeline.model.policy_path``, or the ``pretrained`` stage of
    ``pipeline.model.preset``, replaces the SFT policy when set).

    The pipeline stages are built first if missing (cached otherwise); see :func:`assemble_models`.
    """
    from harness.models import load_tokenizer
    from harness.pipeline import build_pipeline
    from harness.pipeline.gold import GoldRewardModel

    art = build_pipeline(cfg)
    policy_dir = cfg.pipeline.model.policy_path or art.pretrained_dir or art.sft_dir
    tok_dir = cfg.pipeline.model.policy_path or art.pretrained_dir or art.tokenizer_dir
    models = assemble_models(cfg, device, policy_dir, art.rm_dir, load_tokenizer(tok_dir), load_tokenizer(art.tokenizer_dir),
                             float(art.reward_offset))
    models.gold = GoldRewardModel(art.gold_dir, device=device)
    models.pipeline_keys = {k: str(v.get("key")) for k, v in art.summary.get("stages", {}).items()}
    return models


def assemble_models(cfg: Config, device: torch.device, policy_dir: str | Path, rm_dir: str | Path, tokenizer: Any,
                    rm_tokenizer: Any, reward_offset: float) -> Models:
    """The four models from saved directories, prepared as every run uses them.

    Policy and a frozen reference from ``policy_dir``, a frozen RM from ``rm_dir``, and the critic
    from ``ppo.critic_init`` (only when ``ppo.adv_estimator`` needs one). Dropout is set on all four
    by the ``ppo.dropout`` variant; with ``ppo.fused_gelu`` their ``gelu_new`` activations run as
    PyTorch's fused tanh GELU (:func:`harness.models.use_fused_gelu`).

    Raises:
        HarnessError: a directory is missing or cannot be loaded.
    """
    from harness.models import load_policy, load_scalar_model, use_fused_gelu

    set_dropout = DROPOUT.get(cfg.ppo.dropout)
    policy = set_dropout(load_policy(policy_dir, device))
    ref = set_dropout(load_policy(policy_dir, device)).eval().requires_grad_(False)
    reward_model = set_dropout(load_scalar_model(rm_dir, device)).eval().requires_grad_(False)
    critic = None
    if cfg.ppo.needs_critic:
        critic = set_dropout(CRITIC_INIT.get(cfg.ppo.critic_init)(str(policy_dir), str(rm_dir), device, seed=cfg.seed))
    if cfg.ppo.fused_gelu:
        for model in (policy, ref, reward_model, critic):
            if model is not None:
                use_fused_gelu(model)
    return Models(policy=policy, ref=ref, reward_model=reward_model, critic=critic, tokenizer=tokenizer,
                  rm_tokenizer=rm_tokenizer, reward_offset=reward_offset)


@dataclass
class Rollout:
    """One rollout batch, as the update reads it. Per-token tensors are ``[B, L]`` (L ≤ T: the
    columns that are padding in every row may be cut); ``query_responses`` is ``[B, P + L]``.

    ``response_mask`` is float, 1 on real response tokens (EOS included, except under the
    ``ppo.pad_equals_eos`` negative control); ``logprobs`` are π_old's
    (rollout time) and ``ref_logprobs`` the frozen reference's, in nats at the sampling temperature;
    ``values`` are the critic's (None without one); ``advantages`` and ``returns`` come from
    :func:`compute_advantages`; ``max_len`` is the configured response length T (the constant of
    ``seq-mean-token-sum-norm``).
    """

    query_responses: torch.Tensor
    context_length: int
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    values: Optional[torch.Tensor]
    advantages: torch.Tensor
    returns: torch.Tensor
    max_len: int


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------


def _check_finite(name: str, x: torch.Tensor, iteration: int) -> None:
    """Raise TrainingDivergedError if ``x`` holds a NaN or inf."""
    if not torch.isfinite(x).all():
        kind = "nan" if torch.isnan(x).any() else "inf"
        raise TrainingDivergedError(f"{name} is {kind} at iteration {iteration}; the run was stopped")


def _values(critic: nn.Module, query_responses: torch.Tensor, context_length: int) -> torch.Tensor:
    """Critic values ``[B, T]``: the value of the state before each response token."""
    from harness.models import scalar_head_outputs

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
        return _values(critic, query_responses, context_length)

    if not compile:
        return policy_fwd, (critic_fwd if critic is not None else None)
    return (torch.compile(policy_fwd, dynamic=False),
            torch.compile(critic_fwd, dynamic=False) if critic is not None else None)


def _decode(tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return [tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True) for row, m in zip(ids, mask)]


def retokenize_for_rm(rm_tokenizer: Any, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of ``texts`` (prompt + response, decoded from a policy with another vocabulary) for the
    reward model, each followed by the RM tokenizer's EOS, where the RM reads its score.

    A text whose encoding is longer than ``max_length`` (the RM's position limit) keeps its last
    ``max_length`` tokens, so the response and its EOS are always read and the start of the prompt
    is dropped: a policy with a larger vocabulary can produce far more RM tokens than its own (random
    SmolLM2 tokens re-encode to about 3× as many harness tokens).

    Args:
        rm_tokenizer: the RM's tokenizer (``pad_token_id`` ≠ ``eos_token_id``).
        texts: ``B`` strings.
        max_length: tokens the RM can read (``config.max_position_embeddings``), ≥ 2.
    Returns:
        ``ids`` ``[B, W]`` right-padded with the pad id (``W`` the longest kept encoding), and ``index``
        ``[B]``: the position of each row's EOS.
    Raises:
        ValueError: ``max_length`` < 2 or no texts.
    """
    if max_length < 2 or not texts:
        raise ValueError(f"max_length must be ≥ 2 and texts non-empty (got {max_length}, {len(texts)} texts)")
    enc = [(rm_tokenizer(t, add_special_tokens=False)["input_ids"] + [rm_tokenizer.eos_token_id])[-max_length:]
           for t in texts]
    ids = torch.full((len(enc), max(len(e) for e in enc)), rm_tokenizer.pad_token_id, dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, : len(e)] = torch.tensor(e)
    return ids, torch.tensor([len(e) - 1 for e in enc])


@torch.no_grad()
def score_responses(
    models: Models, cfg: Config, task: Any, prompt_ids: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor,
    normalize: Optional[bool] = None, with_gold: bool = False,
) -> dict[str, Any]:
    """Proxy (RM), gold and lexicon scores of truncated responses.

    Args:
        prompt_ids: ``[B, P]``; responses, response_mask: ``[B, T]`` (after EOS truncation).
        normalize: subtract the SFT mean RM score (N+ detail 15); default ``ppo.normalize_reward``.
        with_gold: also score by the gold reward model (``models.gold``) on the decoded prompt + response.
    Returns:
        ``{"score": [B], "gold_lexicon": [B], "gold": [B] or None, "texts": [B] responses}``: the RM
        score read at the last real token (the EOS token when there is one), normalized as asked; the
        task's lexicon score (VADER) of the decoded response; the gold RM's score of prompt + response.
    Raises:
        HarnessError: ``with_gold`` but the models carry no gold scorer.
    """
    from harness.models import score_at

    texts = _decode(models.tokenizer, responses, response_mask)
    if models.rm_tokenizer is models.tokenizer or models.rm_tokenizer.get_vocab() == models.tokenizer.get_vocab():
        ids = torch.cat([prompt_ids, responses], dim=1)
        index = prompt_ids.shape[1] + last_token_index(response_mask)
    else:  # a policy with its own tokenizer: re-tokenize prompt + response for the RM
        prompts = _decode(models.tokenizer, prompt_ids, torch.ones_like(prompt_ids))
        ids, index = retokenize_for_rm(models.rm_tokenizer, [p + t for p, t in zip(prompts, texts)],
                                       models.reward_model.config.max_position_embeddings)
        ids, index = ids.to(responses.device), index.to(responses.device)
    score = score_at(models.reward_model, ids, None, index).float()
    if cfg.ppo.normalize_reward if normalize is None else normalize:
        score = score - models.reward_offset
    lexicon = task.gold_lexicon(texts).to(score.device).float()
    gold = None
    if with_gold:
        if models.gold is None:
            raise HarnessError("the gold reward model is not loaded (build_models loads it from the pipeline)")
        full = _decode(models.tokenizer, torch.cat([prompt_ids, responses], 1),
                       torch.cat([torch.ones_like(prompt_ids), response_mask.long()], 1))
        gold = models.gold(full).to(score.device).float()
    return {"score": score, "gold_lexicon": lexicon, "gold": gold, "texts": texts}


def compute_advantages(p: Any, score: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                       values: Optional[torch.Tensor], response_mask: torch.Tensor, reward_kl_coef: float,
                       group_size: int, iteration: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token rewards, advantages and returns of one rollout batch.

    Args:
        p: the ``PPOConfig`` (estimators, γ, λ, whitening switches).
        score: ``[B]`` sequence scores (RM, after EOS penalty and clipping).
        logprobs, ref_logprobs: ``[B, T]`` π_old and reference log-probabilities (nats).
        values: ``[B, T]`` critic values, or None for critic-free estimators.
        response_mask: ``[B, T]`` float, 1 on real response tokens (EOS included).
        reward_kl_coef: β of the KL penalty placed in the reward (0 when KL is in the loss or off).
        group_size: responses per prompt (1 with a critic).
    Returns:
        ``(rewards, advantages, returns)``, each ``[B, T]``: ``rewards[t] = −β·kl_t`` plus the score
        at the last real token (Stiennon et al. 2020, eq. 2); advantages from the configured
        estimator, whitened over the batch when ``whiten_advantages`` (N+ detail; TRL, verl).
    Raises:
        TrainingDivergedError: rewards or advantages contain NaN/inf.
    """
    kl_tok = KL_ESTIMATORS.get(p.kl_estimator)(logprobs, ref_logprobs) * response_mask
    rewards = token_rewards(score, kl_tok, reward_kl_coef, response_mask)
    if p.whiten_rewards:
        rewards = whiten_token_rewards(rewards, response_mask)
    _check_finite("rewards", rewards, iteration)
    estimator = ADV_ESTIMATORS.get(p.adv_estimator)
    advantages, returns = estimator(rewards, values, response_mask, gamma=p.gamma, lam=p.lam, group_size=group_size)
    if p.whiten_advantages:
        advantages = masked_whiten(advantages, response_mask)
    _check_finite("advantages", advantages, iteration)
    return rewards, advantages, returns


# ------------------------------------------------------------------------------------------------
# Evaluation on the fixed held-out prompts
# ------------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_policy(models: Models, cfg: Config, task: Any, prompts: torch.Tensor, k: int, device: torch.device,
                    autocast: Callable[[], Any], eos_id: int, pad_id: int) -> dict[str, float]:
    """Score the current policy on the fixed held-out prompts, the same way for every run.

    Each prompt is sampled ``eval.samples_per_prompt`` times; responses of ``task.response_length``
    tokens are drawn at the PPO temperature from a generator seeded by :func:`eval_generator_seed`
    (independent of the training streams, so evaluating never changes training), truncated after the first EOS whatever ``ppo.truncate_after_eos`` says (unless
    ``eval.truncate_after_eos`` is false: fixed-length responses; sampling stops once every response
    holds an EOS, and the columns that are padding in every row are cut), and scored
    by the RM (minus the SFT mean, whatever ``ppo.normalize_reward`` says: one scale for all
    variants), by the gold reward model (prompt + response) and by the task's lexicon (response).

    Args:
        prompts: ``[N, P]`` evaluation prompts on ``device``.
        k: PPO iterations done so far (0 = the SFT policy).
    Returns:
        ``eval/gold``, ``eval/gold_lexicon``, ``eval/proxy``, ``eval/proxy_std`` (means over the ``N ·
        samples_per_prompt`` responses; std over them), ``eval/kl`` (k1 summed over the response, nats,
        mean over responses: KL(π‖π_ref) per response), ``eval/eos_rate`` and ``eval/length`` (response
        tokens, EOS included), and ``eval/gold_se``, ``eval/proxy_se``, ``eval/kl_se``: the standard
        errors of those three means (``std / √n`` over the responses; the evaluation's own noise).
    """
    P, T, tau = prompts.shape[1], cfg.task.response_length, cfg.ppo.temperature
    prompts = prompts.repeat_interleave(cfg.eval.samples_per_prompt, dim=0)
    gen = torch.Generator(device=device).manual_seed(eval_generator_seed(cfg, k))
    models.policy.eval()
    with autocast():
        raw = sample(models.policy, prompts, T, tau, gen, sampler=cfg.ppo.sampler,
                     stop_token=eos_id if cfg.eval.truncate_after_eos else None)
    if cfg.eval.truncate_after_eos:
        responses, mask, has_eos = truncate_after_eos(raw, eos_id, pad_id)
        L = mask_extent(mask)  # columns of padding in every row change nothing below: cut them
        responses, mask = responses[:, :L], mask[:, :L]
    else:
        responses, mask, has_eos = raw, torch.ones_like(raw), (raw == eos_id).any(1)
    mask = mask.float()
    with autocast():
        scored = score_responses(models, cfg, task, prompts, responses, mask, normalize=True, with_gold=True)
        score, gold = scored["score"], scored["gold"]
        qr = torch.cat([prompts, responses], dim=1)
        logprobs, _ = response_logprobs(models.policy, qr, P, tau)
        ref_logprobs, _ = response_logprobs(models.ref, qr, P, tau)
    kl = ((logprobs.float() - ref_logprobs.float()) * mask).sum(1)
    n = len(kl)

    def se(x: torch.Tensor) -> float:
        return x.float().std().item() / math.sqrt(n) if n > 1 else float("nan")

    return {"eval/gold": gold.mean().item(), "eval/gold_lexicon": scored["gold_lexicon"].mean().item(),
            "eval/proxy": score.mean().item(), "eval/proxy_std": score.std().item(),
            "eval/kl": kl.mean().item(), "eval/eos_rate": has_eos.float().mean().item(),
            "eval/length": mask.sum(1).mean().item(),
            "eval/gold_se": se(gold), "eval/proxy_se": se(score), "eval/kl_se": se(kl)}


def eval_generator_seed(cfg: Config, k: int) -> int:
    """The seed of the held-out evaluation's sampling generator after ``k`` iterations.

    ``eval.sampling_seed: per_run`` (default): a 31-bit word of ``numpy.random.SeedSequence([eval.seed,
    seed, k])``: the same for runs that share ``seed`` (arms of an ablation compared at one seed see
    one draw), independent across seeds and iterations. ``shared``: ``eval.seed + k`` for every run.

    Args:
        cfg: the run's config (``eval.seed``, ``eval.sampling_seed``, ``seed``).
        k: PPO iterations done (≥ 0).
    Returns:
        a non-negative int below 2³¹.
    """
    if cfg.eval.sampling_seed == "shared":
        return cfg.eval.seed + k
    import numpy as np

    return int(np.random.SeedSequence([cfg.eval.seed, cfg.seed, k]).generate_state(1)[0] >> 1)


def eval_summary(history: Sequence[tuple[int, dict[str, float]]], total_iterations: int) -> dict[str, Any]:
    """Per-run outcomes read off the evaluation curve.

    Args:
        history: ``(k, metrics)`` per evaluation, ascending ``k``, the first at ``k = 0`` (SFT policy).
        total_iterations: PPO iterations of the run (the last evaluation's ``k``).
    Returns:
        ``{"eval_final": {gold, gold_lexicon, proxy, kl, eos_rate, length, collapsed}, "eval_peak": {gold,
        iteration, kl}, "eval_drop": {gold}, "eval_auc": {gold}}``: the last evaluation (``collapsed`` = 1.0
        when its gold is below the SFT policy's, else 0.0); the highest gold, the first iteration that
        reached it and the KL there; the gold lost from that peak to the last evaluation; the area under
        the gold curve by the trapezoid rule over k, divided by ``total_iterations`` (the mean gold over
        training, in gold units).
    Raises:
        ValueError: an empty history.
    """
    if not history:
        raise ValueError("eval_summary: no evaluation recorded")
    ks = [k for k, _ in history]
    gold = [m["eval/gold"] for _, m in history]
    last = history[-1][1]
    peak = max(range(len(gold)), key=lambda i: (gold[i], -i))
    auc = sum((ks[i + 1] - ks[i]) * (gold[i] + gold[i + 1]) / 2 for i in range(len(ks) - 1))
    return {
        "eval_final": {k.split("/")[1]: last[k] for k in ("eval/gold", "eval/gold_lexicon", "eval/proxy", "eval/kl",
                                                          "eval/eos_rate", "eval/length") if k in last}
        | {"collapsed": float(last["eval/gold"] < gold[0])},
        "eval_peak": {"gold": gold[peak], "iteration": float(ks[peak]), "kl": history[peak][1].get("eval/kl", float("nan"))},
        "eval_drop": {"gold": gold[peak] - gold[-1]},
        "eval_auc": {"gold": auc / max(total_iterations, 1) if len(ks) > 1 else gold[0]},
    }


# ------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------


def run_time_estimate(first_iteration_s: float, evaluation_s: float, total_iterations: int, eval_every: int,
                      device: str) -> str:
    """One line estimating a run's wall time from its first iteration and its first evaluation.

    ``total ≈ first_iteration_s · total_iterations + evaluation_s · (⌈total_iterations / eval_every⌉ + 1)``
    (the evaluation before training, one after every ``eval_every`` iterations, and one after the
    last iteration when ``eval_every`` does not divide the total). The first iteration includes
    one-off warm-up, so the estimate errs long.

    Args:
        first_iteration_s, evaluation_s: seconds (≥ 0); total_iterations, eval_every: ≥ 1.
    Returns:
        e.g. ``"[ppo] first iteration 12.3 s, evaluation 4.0 s on cpu: about 2.1 h for 600 iterations"``.
    """
    n_evals = math.ceil(total_iterations / eval_every) + 1
    total = first_iteration_s * total_iterations + evaluation_s * n_evals
    human = f"{total / 3600:.1f} h" if total >= 3600 else f"{total / 60:.1f} min" if total >= 60 else f"{total:.0f} s"
    return (f"[ppo] first iteration {first_iteration_s:.1f} s, evaluation {evaluation_s:.1f} s on {device}: "
            f"about {human} for {total_iterations} iterations")


def train(cfg: Config, out_dir: str | Path, callbacks: Sequence[Callback] = (), progress: bool = True, *,
          models: Optional[Models] = None, task: Any = None) -> dict[str, Any]:
    """Run one PPO run and return its summary (also written to ``out_dir/summary.json``).

    Args:
        cfg: the resolved, validated config.
        out_dir: where ``config.yaml`` and ``summary.json`` are written.
        callbacks: receive per-iteration metrics, sample completions and the summary.
        progress: show a progress bar with score, gold and KL.
        models: prebuilt models on the config's device (the pipeline is then not built); built
            from ``cfg`` by :func:`build_models` when None. Used by ``harness.bench``.
        task: a prebuilt task (``sample_prompts``, ``gold_lexicon``); ``TASKS[cfg.task.name]`` when None.
    Returns:
        ``{"initial": {score, score_std, gold, eos_rate}`` (the evaluation before any update),
        ``"final": {score, gold_lexicon, kl}`` (training batches, mean of the last 10% of iterations;
        plus ``gold`` with ``ppo.train_on_gold``),
        ``"eval_final", "eval_peak", "eval_auc"`` (:func:`eval_summary`),
        ``"wall_time_s", "iterations", "n_params", "device", "config_hash"}``. Evaluations on the
        held-out prompts (:func:`evaluate_policy`) run before the first update, every
        ``eval.every`` iterations and after the last, reported through ``Callback.on_eval``.
    Raises:
        TrainingDivergedError: a loss, reward or advantage became NaN/inf.
    """
    import json

    from tqdm.auto import tqdm

    from harness.models import resolve_device

    t_start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "config.yaml")
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    device, amp_dtype = resolve_device(cfg.device)
    autocast = (lambda: torch.autocast(device.type, dtype=amp_dtype)) if amp_dtype else nullcontext
    p = cfg.ppo

    if models is None:
        import transformers

        transformers.logging.set_verbosity_error()  # no per-load weight bars or padding hints
        transformers.utils.logging.disable_progress_bar()
        models = build_models(cfg, device)
    if task is None:
        from harness.tasks import TASKS

        task = TASKS.get(cfg.task.name)(cfg, models.tokenizer)
    placement = KL_PLACEMENTS.get(p.kl_placement)
    kl_ctl = KL_CONTROLLERS.get(p.kl_ctl)(p.kl_coef, p.kl_target, p.kl_horizon)
    group_size = 1 if models.critic is not None else p.num_generations
    eos_id, pad_id = models.tokenizer.eos_token_id, models.tokenizer.pad_token_id
    if pad_id is None:
        pad_id = eos_id

    update_tau = p.temperature if p.logprob_temperature == "sampling" else 1.0  # "unit": the negative control
    policy_fwd, critic_fwd = update_forwards(models, cfg.task.prompt_length, update_tau, compile=p.compile)
    params = list(models.policy.parameters()) + (list(models.critic.parameters()) if models.critic is not None else [])
    optimizer = torch.optim.AdamW(params, lr=p.lr, eps=p.adam_eps)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    prompt_gen = torch.Generator().manual_seed(cfg.seed)
    info = {"n_params": models.n_params(), "device": str(device), "pipeline_keys": dict(models.pipeline_keys)}
    for cb in callbacks:
        cb.on_start(cfg, info)

    P, T = cfg.task.prompt_length, cfg.task.response_length
    sample_iters = {0, p.total_iterations // 2, p.total_iterations - 1}

    def rollout(prompt_ids: torch.Tensor) -> dict[str, torch.Tensor | list[str]]:
        """Sample, truncate after EOS, score. Returns responses and mask (``[B, L]``: the columns that
        are padding in every row are cut, unless the update forwards are compiled, which want one
        shape), has_eos, score, gold_lexicon, gold (the gold RM's scores only when training on
        them, else None), texts."""
        models.policy.eval()
        with autocast():
            raw = sample(models.policy, prompt_ids, T, p.temperature, gen, sampler=p.sampler,
                         stop_token=eos_id if p.truncate_after_eos else None)
        if p.truncate_after_eos:
            responses, mask, has_eos = truncate_after_eos(raw, eos_id, eos_id if p.pad_equals_eos else pad_id)
            if p.pad_equals_eos:  # the negative control: the end is the first "pad", i.e. the EOS itself
                mask = pad_based_mask(responses, eos_id)
            if not p.compile:
                L = mask_extent(mask)
                responses, mask = responses[:, :L], mask[:, :L]
        else:
            responses, mask = raw, torch.ones_like(raw)
            has_eos = (raw == eos_id).any(1)
        t0 = time.perf_counter()
        with autocast():
            scored = score_responses(models, cfg, task, prompt_ids, responses, mask, with_gold=p.train_on_gold)
        return {"responses": responses, "mask": mask, "has_eos": has_eos, **scored, "score_time": time.perf_counter() - t0}

    @torch.no_grad()
    def evaluate(k: int) -> dict[str, float]:
        """The held-out evaluation after ``k`` iterations (see :func:`evaluate_policy`)."""
        m = evaluate_policy(models, cfg, task, eval_prompts, k, device, autocast, eos_id, pad_id)
        eval_history.append((k, m))
        for cb in callbacks:
            cb.on_eval(k, m)
        return m

    # Evaluation before any update: the SFT policy on the fixed held-out prompts.
    eval_prompts = task.eval_prompt_ids.to(device)
    eval_history: list[tuple[int, dict[str, float]]] = []
    t_eval = time.perf_counter()
    ev0 = evaluate(0)
    t_eval = time.perf_counter() - t_eval
    initial = {"score": ev0["eval/proxy"], "score_std": ev0["eval/proxy_std"], "gold": ev0["eval/gold"],
               "eos_rate": ev0["eval/eos_rate"]}

    history: list[dict[str, float]] = []
    bar = tqdm(range(p.total_iterations), desc="ppo", disable=not progress, dynamic_ncols=True)
    for it in bar:
        t_iter = time.perf_counter()
        timings: dict[str, float] = {}
        # ---- 1. rollout ------------------------------------------------------------------------
        t0 = time.perf_counter()
        prompts = task.sample_prompts(p.batch_size // group_size, prompt_gen).to(device)
        prompts = prompts.repeat_interleave(group_size, dim=0)
        ro = rollout(prompts)
        responses, mask = ro["responses"], ro["mask"].float()
        timings["time/score"] = ro["score_time"]
        timings["time/generate"] = time.perf_counter() - t0 - ro["score_time"]

        # ---- 2. score: logprobs (π_old), ref_logprobs, values, per-token rewards -----------------
        t0 = time.perf_counter()
        query_responses = torch.cat([prompts, responses], dim=1)
        with torch.no_grad(), autocast():
            models.policy.eval()
            logprobs, entropy = response_logprobs(models.policy, query_responses, P, p.temperature, with_entropy=True)
            ref_logprobs, _ = response_logprobs(models.ref, query_responses, P, p.temperature)
            values = _values(models.critic.eval(), query_responses, P).float() if models.critic is not None else None
        timings["time/forward"] = time.perf_counter() - t0

        score = apply_missing_eos_penalty(ro["score"], ro["has_eos"], p.missing_eos_penalty)
        score = clip_scores(score, p.reward_clip)
        if p.train_on_gold:
            score = ro["gold"]
        reward_coef, loss_coef = placement(kl_ctl.value)

        # ---- 3. advantages ---------------------------------------------------------------------
        rewards, advantages, returns = compute_advantages(p, score, logprobs, ref_logprobs, values, mask, reward_coef, group_size, it)

        # ---- 4. K epochs of shuffled minibatch updates -------------------------------------------
        t0 = time.perf_counter()
        batch = Rollout(query_responses, P, mask, logprobs, ref_logprobs, values, advantages, returns, max_len=T)
        stats = _update(models, p, batch, loss_coef, optimizer, gen, autocast, it, policy_fwd, critic_fwd)
        timings["time/update"] = time.perf_counter() - t0

        # ---- metrics -----------------------------------------------------------------------------
        m = _iteration_metrics(batch, ro, score, entropy, reward_coef + loss_coef, stats, timings, p.batch_size)
        kl_ctl.update(m["objective/kl"], p.batch_size)
        history.append(m)
        for cb in callbacks:
            cb.on_metrics(it, m)
        if it in sample_iters and cfg.num_sample_completions:
            prompt_texts = _decode(models.tokenizer, prompts, torch.ones_like(prompts))
            k = cfg.num_sample_completions
            samples = [{"prompt": a, "response": b, "score": s, "gold_lexicon": g}
                       for a, b, s, g in zip(prompt_texts[:k], ro["texts"][:k], ro["score"][:k].tolist(),
                                             ro["gold_lexicon"][:k].tolist())]
            for cb in callbacks:
                cb.on_samples(it, samples)
        if (it + 1) % cfg.eval.every == 0 or it + 1 == p.total_iterations:
            evaluate(it + 1)
        bar.set_postfix(score=f"{m['objective/score']:.3f}", gold=f"{eval_history[-1][1]['eval/gold']:.3f}",
                        kl=f"{m['objective/kl']:.2f}")
        if it == 0 and progress:
            tqdm.write(run_time_estimate(time.perf_counter() - t_iter, t_eval, p.total_iterations, cfg.eval.every,
                                         str(device)), file=sys.stderr)

    last = history[-max(1, math.ceil(0.1 * len(history))):]
    summary = {
        "initial": initial,
        "final": {k.split("/")[1]: sum(h[k] for h in last) / len(last)
                  for k in ("objective/score", "objective/gold_lexicon", "objective/kl", "objective/gold") if k in last[0]},
        **eval_summary(eval_history, p.total_iterations),
        "iterations": p.total_iterations,
        "wall_time_s": time.perf_counter() - t_start,
        "n_params": info["n_params"],
        "device": str(device),
        "config_hash": cfg.hash(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for cb in callbacks:
        cb.on_end(summary)
    return summary


def _iteration_metrics(batch: Rollout, ro: dict[str, Any], score: torch.Tensor, entropy: torch.Tensor, kl_coef: float,
                       stats: dict[str, float], timings: dict[str, float], batch_size: int) -> dict[str, float]:
    """One iteration's logged metrics: ``objective/*`` (proxy score as sampled and as trained on,
    lexicon gold, k1 KL per response in nats, entropy per token, the KL coefficient in force),
    ``response/*``, ``perf/*``, the update's ``stats`` and the phase ``timings`` (s), and
    ``val/explained_variance`` of the returns by the critic's values."""
    mask, P = batch.response_mask, batch.context_length
    k1_seq = ((batch.logprobs - batch.ref_logprobs) * mask).sum(1)
    m = {
        "objective/score": ro["score"].mean().item(),
        "objective/score_train": score.mean().item(),
        "objective/gold_lexicon": ro["gold_lexicon"].mean().item(),
        "objective/kl": k1_seq.mean().item(),
        "objective/entropy": masked_mean(entropy, mask).item(),
        "objective/kl_coef": kl_coef,
        "response/length": mask.sum(1).mean().item(),
        "response/eos_rate": ro["has_eos"].float().mean().item(),
        "perf/tokens_per_s": batch_size * (P + batch.max_len) / max(sum(timings.values()), 1e-9),
        **stats,
        **timings,
    }
    if ro["gold"] is not None:
        m["objective/gold"] = ro["gold"].mean().item()
    if batch.values is not None:
        var_r = masked_var(batch.returns, mask)
        m["val/explained_variance"] = ((1 - masked_var(batch.returns - batch.values, mask) / var_r).item()
                                       if var_r > 0 else float("nan"))
    m["perf/response_tokens"] = mask.sum().item()
    return m


def _update(models: Models, p: Any, batch: Rollout, loss_coef: float, optimizer: torch.optim.Optimizer,
            gen: torch.Generator, autocast: Any, it: int, policy_fwd: Callable[[torch.Tensor], torch.Tensor],
            critic_fwd: Optional[Callable[[torch.Tensor], torch.Tensor]]) -> dict[str, float]:
    """K epochs over shuffled minibatches, each split into micro-batches normalized by the whole
    minibatch (``agg_loss`` with the minibatch's token and sequence counts). Returns the mean
    statistics over all minibatches, plus those of the very first minibatch (``policy/*_first``).
    ``policy_fwd`` / ``critic_fwd`` come from :func:`update_forwards` (eager or compiled). The
    policy loss is ``ppo.policy_loss``'s; with ``loss_coef`` > 0 the KL terms of "k_n as loss"
    (:func:`harness.components.kl.kl_loss_terms`) are added. In eager mode each micro-batch is cut
    to the columns where it has real tokens (:func:`mask_extent`): a causal model's outputs there,
    and every masked sum, are the same without the padding columns."""
    mask, P, query_responses = batch.response_mask, batch.context_length, batch.query_responses
    logprobs, ref_logprobs, values = batch.logprobs, batch.ref_logprobs, batch.values
    advantages, returns = batch.advantages, batch.returns
    pg_loss_fn = POLICY_LOSSES.get(p.policy_loss)
    vf_loss_fn = VALUE_LOSSES.get(p.value_loss)
    kl_estimator = KL_ESTIMATORS.get(p.kl_estimator)
    B, L_batch = mask.shape
    T = batch.max_len
    mb, micro = p.minibatch_size, p.micro_batch_size
    models.policy.train()
    if models.critic is not None:
        models.critic.train()
    acc: dict[str, list[float]] = {}

    def add(k: str, v: float) -> None:
        acc.setdefault(k, []).append(v)

    first: dict[str, float] = {}
    for _epoch in range(p.num_ppo_epochs):
        perm = torch.randperm(B, generator=gen, device=mask.device)
        for start in range(0, B, mb):
            mb_idx = perm[start : start + mb]
            mb_tokens, mb_seqs = mask[mb_idx].sum(), len(mb_idx)
            sums = {"ratio": 0.0, "ratio_sq": 0.0, "clip": 0.0, "approxkl": 0.0, "vclip": 0.0, "pg": 0.0, "vf": 0.0}
            for ms in range(0, mb, micro):
                idx = mb_idx[ms : ms + micro]
                L = L_batch if p.compile else mask_extent(mask[idx])
                m = mask[idx, :L]
                qr = query_responses[idx, : P + L]
                with autocast():
                    new_logprobs = policy_fwd(qr)
                new_logprobs = new_logprobs.float()
                pg_mat, pg_clipped, ratio = pg_loss_fn(new_logprobs, logprobs[idx, :L], advantages[idx, :L], m,
                                                       cliprange=p.cliprange, cliprange_high=p.cliprange_high,
                                                       clip_ratio_c=p.clip_ratio_c)
                agg = dict(mode=p.loss_agg, num_tokens=mb_tokens, num_seqs=mb_seqs, max_len=T)
                pg = agg_loss(pg_mat, m, **agg)
                loss = pg
                if loss_coef:
                    kl_new = kl_loss_terms(new_logprobs, ref_logprobs[idx, :L], logprobs[idx, :L], kl_estimator,
                                           p.kl_loss_importance_weight)
                    loss = loss + loss_coef * agg_loss(kl_new, m, **agg)
                if models.critic is not None:
                    with autocast():
                        new_values = critic_fwd(qr).float()
                    vf_mat, vf_clipped = vf_loss_fn(new_values, values[idx, :L], returns[idx, :L], cliprange_value=p.cliprange_value)
                    vf = agg_loss(vf_mat, m, **agg)
                    loss = loss + p.vf_coef * vf
                    sums["vf"] += vf.item()
                    sums["vclip"] += (vf_clipped.float() * m).sum().item()
                _check_finite("loss", loss, it)
                loss.backward()
                with torch.no_grad():
                    lr_ = new_logprobs - logprobs[idx, :L]
                    sums["pg"] += pg.item()
                    sums["ratio"] += (ratio * m).sum().item()
                    sums["ratio_sq"] += (ratio.square() * m).sum().item()
                    sums["clip"] += (pg_clipped.float() * m).sum().item()
                    sums["approxkl"] += (0.5 * lr_.square() * m).sum().item()
            if p.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_([q for g in optimizer.param_groups for q in g["params"]], p.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            n = mb_tokens.item()
            ratio_mean = sums["ratio"] / n
            stats = {
                "policy/ratio_mean": ratio_mean,
                "policy/ratio_std": math.sqrt(max(sums["ratio_sq"] / n - ratio_mean**2, 0.0)),
                "policy/clipfrac": sums["clip"] / n,
                "policy/approxkl": sums["approxkl"] / n,
                "loss/policy": sums["pg"],
            }
            if models.critic is not None:
                stats["loss/value"] = sums["vf"]
                stats["val/clipfrac"] = sums["vclip"] / n
            if not first:
                first = {f"{k}_first": v for k, v in stats.items() if k.startswith("policy/")}
            for k, v in stats.items():
                add(k, v)
    out = {k: sum(v) / len(v) for k, v in acc.items()}
    out.update(first)
    return out
