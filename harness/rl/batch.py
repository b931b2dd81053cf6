"""The rollout batch of one PPO iteration: responses sampled and scored (:func:`rollout_responses`), the score
trained on (:func:`shaped_score`: the EOS penalty, DAPO's overlong shaping, clipping) and the batch itself
(:func:`sample_batch`), with DAPO's dynamic sampling when asked. ``run`` is :mod:`harness.rl.ppo`'s run state
(``cfg``, ``models``, ``task``, ``gen``, ``prompt_gen``, ``group_size``, ``eos_id``, ``pad_id``, ``autocast``,
``device``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from harness.rl.components.batch_filters import draw_active, retired_prompts, update_pass_counts, zero_variance_rows
from harness.rl.components.eos import apply_missing_eos_penalty, mask_extent, pad_based_mask, truncate_after_eos
from harness.rl.components.rewards import clip_scores, fill_groups, informative_groups, kimi_length_reward, overlong_penalty
from harness.rl.rollout import sample


def rollout_responses(run: Any, prompt_ids: torch.Tensor) -> dict[str, Any]:
    """Sample ``task.response_length`` tokens per prompt (``[B, P]``) with the policy, or with the rollout engine's
    copy of it when the run has one (``ppo.rollout_precision``), truncate after EOS, score. Returns
    responses and mask (``[B, L]``: the columns that are padding in every row are cut, unless the update
    forwards are compiled, which want one shape), has_eos, score, gold_lexicon, gold (the gold RM's
    scores only when training on them, else None), texts and ``score_time`` (s)."""
    p, eos_id, models = run.cfg.ppo, run.eos_id, run.models
    models.policy.eval()
    sampler_model = models.policy if getattr(run, "engine", None) is None else run.engine.model  # harness.rl.engine
    with run.autocast():
        raw = sample(sampler_model, prompt_ids, run.cfg.task.response_length, p.temperature, run.gen, sampler=p.sampler,
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
        from harness.rl.components.outcome_advantages import POSITIVE_ABOVE

        lengths = ro["mask"].float().sum(1)
        bonus = kimi_length_reward(lengths, ro["score"] > POSITIVE_ABOVE, run.group_size).to(score.device)
        score = score + p.length_reward_coef * bonus
    return clip_scores(score, p.reward_clip)


def sample_batch(run: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Prompts (``[B, P]``, ``group_size`` rows per prompt) and their :func:`rollout_responses` with ``shaped`` (the score
    trained on, :func:`shaped_score`), ``all_equal`` (the fraction of the first round's groups whose shaped scores
    are all equal; NaN with a critic), ``all_equal_trained`` (the same fraction among the groups in the loss, after
    dynamic sampling or zero-variance filtering; equal to ``all_equal`` without them), ``rounds`` and ``consumed``
    (:func:`_consumed`). With ``ppo.dynamic_sampling`` (DAPO §3.2), groups whose scores are all equal are dropped and
    more prompts sampled, up to ``ppo.dynamic_sampling_max_rounds`` rollouts
    (:func:`harness.rl.components.rewards.fill_groups` tops up the batch if the cap is reached); with
    ``ppo.zero_variance_filter`` (ScaleRL) they stay in the batch with ``loss_rows`` 0 and nothing is resampled;
    with ``ppo.no_positive_resampling`` the prompts are drawn from those whose running pass rate is below it."""
    p, G = run.cfg.ppo, run.group_size
    n_groups, parts = p.batch_size // G, []
    while True:
        prompts = _draw_prompts(run, n_groups).to(run.device).repeat_interleave(G, dim=0)
        ro = rollout_responses(run, prompts)
        ro["prompts"], ro["shaped"] = prompts, shaped_score(run, ro)
        _count_passes(run, ro)
        keep = informative_groups(ro["shaped"], G) if G > 1 else None
        parts.append((ro, keep))
        done = sum(int(k.sum()) for _, k in parts) >= n_groups if keep is not None else True
        if not p.dynamic_sampling or done or len(parts) >= p.dynamic_sampling_max_rounds:
            break
    all_equal = 1.0 - parts[0][1].float().mean().item() if parts[0][1] is not None else math.nan
    if len(parts) > 1 or p.dynamic_sampling:
        ro = _gather_groups([r for r, _ in parts], fill_groups([k for _, k in parts], n_groups), G, run.pad_id)
    if p.zero_variance_filter:  # the all-equal groups stay in the batch, out of the loss: none of them is trained
        ro["loss_rows"], trained = zero_variance_rows(ro["shaped"], G), 0.0
    else:
        trained = 1.0 - informative_groups(ro["shaped"], G).float().mean().item() if G > 1 else math.nan
    return ro["prompts"], {**ro, "all_equal": all_equal, "all_equal_trained": trained, "rounds": len(parts),
                           "dynamic_sampling": p.dynamic_sampling, "consumed": _consumed(run, parts, ro)}


def _draw_prompts(run: Any, n_groups: int) -> torch.Tensor:
    """``n_groups`` training prompts (``[n, P]``): the task's draw, or, with ``ppo.no_positive_resampling``, a draw
    from the pool's prompts not retired (:func:`harness.rl.components.batch_filters.draw_active`; the same draw
    while none is), whose pool indices are kept in ``run.pool["index"]`` for :func:`_count_passes`."""
    threshold = run.cfg.ppo.no_positive_resampling
    if threshold is None:
        return run.task.sample_prompts(n_groups, run.prompt_gen)
    pool = run.task.prompt_ids
    if "passed" not in run.pool:
        run.pool.update(passed=torch.zeros(pool.shape[0]), seen=torch.zeros(pool.shape[0]))
    retired = retired_prompts(run.pool["passed"], run.pool["seen"], threshold)
    run.pool["index"] = draw_active(pool.shape[0], n_groups, run.prompt_gen, retired)
    return pool[run.pool["index"]]


def _count_passes(run: Any, ro: dict[str, Any]) -> None:
    """No-Positive-Resampling's running pass counts after one round: a response is correct when the task's score is
    above :data:`harness.rl.components.outcome_advantages.POSITIVE_ABOVE` (nothing without the option)."""
    if run.cfg.ppo.no_positive_resampling is None:
        return
    from harness.rl.components.outcome_advantages import POSITIVE_ABOVE

    correct = (ro["score"] > POSITIVE_ABOVE).float().cpu()
    run.pool["passed"], run.pool["seen"] = update_pass_counts(run.pool["passed"], run.pool["seen"], run.pool["index"],
                                                              correct, run.group_size)


def _consumed(run: Any, parts: list[tuple[dict[str, Any], Any]], ro: dict[str, Any]) -> dict[str, float]:
    """What the run has sampled so far, over every rollout round: ``batch/prompts_sampled`` and
    ``batch/responses_sampled`` (cumulative), with ``ppo.zero_variance_filter`` ``batch/groups_in_loss`` (the
    fraction of this batch's groups in the loss), and with ``ppo.no_positive_resampling`` ``batch/prompts_retired``
    (pool prompts retired so far)."""
    G = run.group_size
    responses = sum(int(r["responses"].shape[0]) for r, _ in parts)
    run.pool["prompts"] = run.pool.get("prompts", 0) + responses // G
    run.pool["responses"] = run.pool.get("responses", 0) + responses
    out = {"batch/prompts_sampled": float(run.pool["prompts"]), "batch/responses_sampled": float(run.pool["responses"])}
    if "loss_rows" in ro:
        out["batch/groups_in_loss"] = ro["loss_rows"].view(-1, G)[:, 0].mean().item()
    if run.cfg.ppo.no_positive_resampling is not None:
        out["batch/prompts_retired"] = float(retired_prompts(run.pool["passed"], run.pool["seen"],
                                                             run.cfg.ppo.no_positive_resampling).sum())
    return out


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
