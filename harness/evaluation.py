"""Scoring responses and the held-out evaluation of a PPO run.

:func:`score_responses` gives the training reward (the task's RM, read at the EOS) and the lexicon and gold
scores; :func:`evaluate_policy` scores the current policy on the task's fixed held-out prompts, the same way
for every run; :func:`eval_summary` reads a run's outcomes off its evaluation curve.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import torch

from harness.components.eos import last_token_index, mask_extent, truncate_after_eos
from harness.config import Config
from harness.errors import HarnessError
from harness.rollout import response_logprobs, sample
from harness.run_models import Models


def decode_responses(tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """The text of each row of ``ids`` ``[B, T]`` restricted to ``mask`` ``[B, T]`` (special tokens skipped)."""
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

    texts = decode_responses(models.tokenizer, responses, response_mask)
    if models.rm_tokenizer is models.tokenizer or models.rm_tokenizer.get_vocab() == models.tokenizer.get_vocab():
        ids = torch.cat([prompt_ids, responses], dim=1)
        index = prompt_ids.shape[1] + last_token_index(response_mask)
    else:  # a policy with its own tokenizer: re-tokenize prompt + response for the RM
        prompts = decode_responses(models.tokenizer, prompt_ids, torch.ones_like(prompt_ids))
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
        full = decode_responses(models.tokenizer, torch.cat([prompt_ids, responses], 1),
                       torch.cat([torch.ones_like(prompt_ids), response_mask.long()], 1))
        gold = models.gold(full).to(score.device).float()
    return {"score": score, "gold_lexicon": lexicon, "gold": gold, "texts": texts}


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
