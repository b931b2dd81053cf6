"""Batch composition: which sampled groups enter the loss, and which prompts stay in the pool.

* Zero-variance filtering (ScaleRL, Khatri et al. 2025, arXiv 2510.13786, its "zero-variance filtering"): a group
  whose rewards are all equal is left out of the loss (its tokens count neither in the loss nor in its normaliser);
  nothing is resampled, unlike DAPO's dynamic sampling (Yu et al. 2025 §3.2), which refills the batch
  (:func:`harness.rl.components.rewards.fill_groups`).
* No-Positive-Resampling (ScaleRL): each prompt's running pass rate over every time it was sampled; a prompt whose
  rate reaches the threshold (0.9 in ScaleRL) leaves the prompt pool for good.

Pure tensor functions; the loop (:mod:`harness.rl.batch`) keeps the running counts.
"""

from __future__ import annotations

import torch

from harness.rl.components.rewards import informative_groups


def zero_variance_rows(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which rows stay in the loss under zero-variance filtering: 1.0 for every row of a group whose scores are
    not all equal, 0.0 for the rows of an all-equal group.

    Args:
        scores: ``[B]`` sequence scores (the shaped score trained on), groups of ``group_size`` consecutive rows.
        group_size: G ≥ 2 dividing B.
    Returns:
        ``[B]`` float.
    Raises:
        ValueError: G < 2 (one response per prompt has no group) or G does not divide B.

    Source: ScaleRL (arXiv 2510.13786), zero-variance filtering; the all-equal test is DAPO's (Eq. 11).
    """
    if group_size < 2:
        raise ValueError(f"zero_variance_rows: group_size must be ≥ 2 (got {group_size})")
    return informative_groups(scores, group_size).repeat_interleave(group_size).to(scores.dtype)


def update_pass_counts(passed: torch.Tensor, seen: torch.Tensor, prompt_index: torch.Tensor, correct: torch.Tensor,
                       group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The running pass counts of a prompt pool after one batch: ``(passed', seen')``.

    Args:
        passed, seen: ``[N]`` float, correct and sampled responses of each pool prompt so far.
        prompt_index: ``[B / G]`` long, the pool index of each group's prompt (a prompt may recur).
        correct: ``[B]`` 0/1, whether each response is correct, groups of ``group_size`` consecutive rows.
        group_size: G ≥ 1 dividing B.
    Returns:
        new ``passed`` and ``seen`` (``[N]``; the inputs are not changed).
    Raises:
        ValueError: G does not divide B, or ``prompt_index`` does not hold one index per group.

    Source: ScaleRL (arXiv 2510.13786), No-Positive-Resampling: a prompt's historical pass rate.
    """
    B = correct.shape[0]
    if group_size < 1 or B % group_size or prompt_index.shape[0] != B // group_size:
        raise ValueError(f"update_pass_counts: {B} responses must be {prompt_index.shape[0]} groups of {group_size}")
    per_group = correct.float().view(-1, group_size).sum(1)
    passed = passed.clone().index_add_(0, prompt_index, per_group.to(passed.dtype))
    seen = seen.clone().index_add_(0, prompt_index, torch.full_like(per_group, float(group_size)).to(seen.dtype))
    return passed, seen


def retired_prompts(passed: torch.Tensor, seen: torch.Tensor, threshold: float) -> torch.Tensor:
    """No-Positive-Resampling's retired prompts: ``[N]`` bool, True where a prompt was sampled and its running pass
    rate ``passed / seen`` is at least ``threshold``.

    Raises:
        ValueError: ``threshold`` outside (0, 1].

    Source: ScaleRL (arXiv 2510.13786): prompts whose pass rate reaches 0.9 are not resampled.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"retired_prompts: threshold must be in (0, 1] (got {threshold})")
    return (seen > 0) & (passed >= threshold * seen)


def draw_active(n: int, batch_size: int, generator: torch.Generator, retired: torch.Tensor) -> torch.Tensor:
    """``batch_size`` pool indices drawn from the prompts not retired (``[B]`` long): without replacement from a
    random permutation of the active prompts when there are enough, else with replacement. With no prompt retired it
    draws exactly what :func:`harness.tasks.base.draw_prompt_rows` draws from the same generator state.

    Raises:
        ValueError: ``batch_size < 1``, or every prompt is retired.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1 (got {batch_size})")
    active = torch.nonzero(~retired[:n]).flatten()
    if active.numel() == 0:
        raise ValueError(f"every one of the {n} prompts is retired (No-Positive-Resampling): no prompt left to draw")
    m = active.numel()
    pick = torch.randperm(m, generator=generator)[:batch_size] if batch_size <= m else \
        torch.randint(0, m, (batch_size,), generator=generator)
    return active[pick]


__all__ = ["draw_active", "retired_prompts", "update_pass_counts", "zero_variance_rows"]
