"""The rollout batch of one PPO iteration: responses sampled and scored (:func:`rollout_responses`), the score
trained on (:func:`shaped_score`: the EOS penalty, DAPO's overlong shaping, clipping) and the batch itself
(:func:`sample_batch`), with DAPO's dynamic sampling when asked. ``run`` is :mod:`harness.ppo`'s run state
(``cfg``, ``models``, ``task``, ``gen``, ``prompt_gen``, ``group_size``, ``eos_id``, ``pad_id``, ``autocast``,
``device``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from harness.components.eos import apply_missing_eos_penalty, mask_extent, pad_based_mask, truncate_after_eos
from harness.components.rewards import clip_scores, fill_groups, informative_groups, kimi_length_reward, overlong_penalty
from harness.rollout import sample


def rollout_responses(run: Any, prompt_ids: torch.Tensor) -> dict[str, Any]:
    """Sample ``task.response_length`` tokens per prompt (``[B, P]``), truncate after EOS, score. Returns
    responses and mask (``[B, L]``: the columns that are padding in every row are cut, unless the update
    forwards are compiled, which want one shape), has_eos, score, gold_lexicon, gold (the gold RM's
    scores only when training on them, else None), texts and ``score_time`` (s)."""
    p, eos_id, models = run.cfg.ppo, run.eos_id, run.models
    models.policy.eval()
    with run.autocast():
        raw = sample(models.policy, prompt_ids, run.cfg.task.response_length, p.temperature, run.gen, sampler=p.sampler,
                     stop_token=eos_id if p.truncate_after_eos else None)
    if p.truncate_after_eos:
        responses, mask, has_eos = truncate_after_eos(raw, eos_id, eos_id if p.pad_equals_eos else run.pad_id)
        if p.pad_equals_eos:  # the negative control: the end is the first "pad", i.e. the EOS itself
            mask = pad_based_mask(responses, eos_id)
        if not p.compile:
            L = mask_extent(mask)
            responses, mask = responses[:, :L], mask[:, :L]
    else:
        responses, mask = raw, torch.ones_like(raw)
        has_eos = (raw == eos_id).any(1)
    t0 = time.perf_counter()
    with run.autocast():
        scored = run.task.score(models, run.cfg, prompt_ids, responses, mask, with_gold=p.train_on_gold)
    return {"responses": responses, "mask": mask, "has_eos": has_eos, **scored, "score_time": time.perf_counter() - t0}


def shaped_score(run: Any, ro: dict[str, Any]) -> torch.Tensor:
    """The sequence score trained on (``[B]``): the task's score, replaced by ``ppo.missing_eos_penalty`` without an
    EOS, plus DAPO's overlong penalty (``ppo.overlong_buffer``) and Kimi k1.5's length reward
    (``ppo.length_reward_coef``), clipped to ``ppo.reward_clip``."""
    p = run.cfg.ppo
    score = apply_missing_eos_penalty(ro["score"], ro["has_eos"], p.missing_eos_penalty)
    if p.overlong_buffer is not None:
        lengths = ro["mask"].float().sum(1)
        score = score + overlong_penalty(lengths, run.cfg.task.response_length, p.overlong_buffer).to(score.device)
    if p.length_reward_coef:  # Kimi k1.5's group length reward; correct = the task's score above POSITIVE_ABOVE
        from harness.components.outcome_advantages import POSITIVE_ABOVE

        lengths = ro["mask"].float().sum(1)
        bonus = kimi_length_reward(lengths, ro["score"] > POSITIVE_ABOVE, run.group_size).to(score.device)
        score = score + p.length_reward_coef * bonus
    return clip_scores(score, p.reward_clip)


def sample_batch(run: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Prompts (``[B, P]``, ``group_size`` rows per prompt) and their :func:`rollout_responses` with ``shaped`` (the score
    trained on, :func:`shaped_score`), ``all_equal`` (the fraction of the first round's groups whose shaped scores
    are all equal; NaN with a critic), ``all_equal_trained`` (the same fraction in the batch trained on, after
    dynamic sampling; equal to ``all_equal`` without it) and ``rounds``. With ``ppo.dynamic_sampling`` (DAPO §3.2), groups whose
    scores are all equal are dropped and more prompts sampled, up to ``ppo.dynamic_sampling_max_rounds`` rollouts
    (:func:`harness.components.rewards.fill_groups` tops up the batch if the cap is reached)."""
    p, G = run.cfg.ppo, run.group_size
    n_groups, parts = p.batch_size // G, []
    while True:
        prompts = run.task.sample_prompts(n_groups, run.prompt_gen).to(run.device).repeat_interleave(G, dim=0)
        ro = rollout_responses(run, prompts)
        ro["prompts"], ro["shaped"] = prompts, shaped_score(run, ro)
        keep = informative_groups(ro["shaped"], G) if G > 1 else None
        parts.append((ro, keep))
        done = sum(int(k.sum()) for _, k in parts) >= n_groups if keep is not None else True
        if not p.dynamic_sampling or done or len(parts) >= p.dynamic_sampling_max_rounds:
            break
    all_equal = 1.0 - parts[0][1].float().mean().item() if parts[0][1] is not None else math.nan
    if len(parts) > 1 or p.dynamic_sampling:
        ro = _gather_groups([r for r, _ in parts], fill_groups([k for _, k in parts], n_groups), G, run.pad_id)
    trained = 1.0 - informative_groups(ro["shaped"], G).float().mean().item() if G > 1 else math.nan
    return ro["prompts"], {**ro, "all_equal": all_equal, "all_equal_trained": trained, "rounds": len(parts),
                           "dynamic_sampling": p.dynamic_sampling}


def _gather_groups(rounds: list[dict[str, Any]], picks: list[tuple[int, int]], G: int, pad_id: int) -> dict[str, Any]:
    """One rollout dict from the groups ``picks`` (``(round, group)``) of several rollouts: tensors ``[B, ...]``
    concatenated (responses right-padded with ``pad_id`` to the longest), ``texts`` likewise, times summed."""
    L = max(r["responses"].shape[1] for r in rounds)
    out: dict[str, Any] = {"score_time": sum(r["score_time"] for r in rounds)}
    rows = [(r, g * G + i) for r, g in picks for i in range(G)]
    for key in ("prompts", "responses", "mask", "has_eos", "score", "gold_lexicon", "gold", "shaped"):
        if rounds[0].get(key) is None:
            out[key] = None
            continue
        parts = [rounds[r][key][j] for r, j in rows]
        if key in ("responses", "mask"):
            parts = [torch.nn.functional.pad(x, (0, L - x.shape[0]), value=pad_id if key == "responses" else 0)
                     for x in parts]
        out[key] = torch.stack(parts)
    out["texts"] = [rounds[r]["texts"][j] for r, j in rows]
    return out


__all__ = ["rollout_responses", "sample_batch", "shaped_score"]
