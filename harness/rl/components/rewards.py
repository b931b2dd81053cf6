"""Per-token rewards for PPO: −β·kl on every response token, the score at the last real token.

Source: Stiennon et al. 2020 eq. 1; Ziegler et al. 2019; N+ / TRL PPOTrainer reward shaping.
"""

from __future__ import annotations

import torch

from harness.rl.components.eos import last_token_index
from harness.rl.components.whitening import masked_whiten


def token_rewards(
    scores: torch.Tensor, kl: torch.Tensor, reward_kl_coef: float, response_mask: torch.Tensor
) -> torch.Tensor:
    """Build the per-token reward matrix.

    ``rewards[i,t] = −β·kl[i,t]·M[i,t]``, then ``rewards[i, L_i − 1] += scores[i]`` with
    ``L_i = Σ_t M[i,t]``.

    Args:
        scores: ``[B]`` sequence scores (RM at EOS, after normalization/clipping/penalty).
        kl: ``[B, T]`` per-token KL estimate (nats), see :mod:`harness.rl.components.kl`.
        reward_kl_coef: β for the reward placement (0 when the KL is in the loss or off).
        response_mask: ``[B, T]`` right-padded prefix mask.

    Returns:
        ``[B, T]`` rewards in the dtype of ``kl``, 0 on padding.

    Raises:
        ValueError: if a row of ``response_mask`` has no real token.
    """
    last = last_token_index(response_mask)
    rewards = torch.where(response_mask.bool(), -reward_kl_coef * kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
    return rewards.scatter_add(1, last.unsqueeze(1), scores.to(rewards.dtype).unsqueeze(1))


def clip_scores(scores: torch.Tensor, reward_clip: float | None) -> torch.Tensor:
    """Clip scores to ``[−reward_clip, reward_clip]``; ``None`` leaves them unchanged.

    Args:
        scores: ``[B]``.
        reward_clip: c > 0 or None.

    Raises:
        ValueError: if ``reward_clip`` ≤ 0.

    Source: OpenRLHF ``reward_clip_range``; Zheng et al. 2023 (PPO-max) reward clipping.
    """
    if reward_clip is None:
        return scores
    if reward_clip <= 0:
        raise ValueError(f"clip_scores: reward_clip must be > 0 (got {reward_clip})")
    return scores.clamp(-reward_clip, reward_clip)


def whiten_token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Scale per-token rewards by their masked std, keeping the mean (``shift_mean=False``).

    Args:
        rewards: ``[B, T]``.
        response_mask: ``[B, T]``.

    Returns:
        ``[B, T]``, 0 on padding.

    Raises:
        ValueError: if the mask selects fewer than 2 tokens.

    Source: TRL ``whiten_rewards`` (``masked_whiten(..., shift_mean=False)``); N+ (off by default).
    """
    return masked_whiten(rewards, response_mask, shift_mean=False)


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the score of each response.

    ``R(y) = 0`` if ``|y| ≤ L_max − L_cache``; ``((L_max − L_cache) − |y|) / L_cache`` if
    ``L_max − L_cache < |y| ≤ L_max``; ``−1`` if ``|y| > L_max``. A response cut at ``L_max`` tokens
    (no EOS) gets −1.

    Args:
        lengths: ``[B]`` response tokens (EOS included), any numeric dtype.
        max_length: ``L_max`` (the harness uses ``task.response_length``).
        buffer: ``L_cache``, 1 ≤ buffer ≤ max_length.
    Returns:
        ``[B]`` float32 penalties in [−1, 0].
    Raises:
        ValueError: ``buffer`` outside ``[1, max_length]``.

    Source: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", §3.4, Eq. 13.
    """
    if not 1 <= buffer <= max_length:
        raise ValueError(f"overlong_penalty: buffer must be in [1, {max_length}] (got {buffer})")
    x = lengths.float()
    soft = max_length - buffer
    inside = ((soft - x) / buffer).clamp(max=0.0)
    return torch.where(x > max_length, torch.full_like(x, -1.0), inside)


def kimi_length_reward(lengths: torch.Tensor, correct: torch.Tensor, group_size: int) -> torch.Tensor:
    """Kimi k1.5's length reward within each group of ``group_size`` responses to one prompt:
    ``λ_i = 0.5 − (len_i − min_len)/(max_len − min_len)`` over the group, rewarded ``λ_i`` if the response is
    correct and ``min(0, λ_i)`` if not (a wrong response is never rewarded for being short). A group whose
    responses all have one length gets 0 (no length to prefer; the formula is 0/0 there).

    Args:
        lengths: ``[B]`` response tokens; correct: ``[B]`` bool; group_size: G, consecutive rows per prompt.
    Returns:
        ``[B]`` float32 in [−0.5, 0.5], to add (times ``ppo.length_reward_coef``) to the score.
    Raises:
        ValueError: G < 1 or G does not divide B.

    Source: Kimi Team 2025, "Kimi k1.5: Scaling Reinforcement Learning with LLMs" (arXiv 2501.12599) §2.3.3,
    length penalty.
    """
    B = lengths.shape[0]
    if group_size < 1 or B % group_size:
        raise ValueError(f"kimi_length_reward: batch size {B} must be a multiple of group_size ({group_size})")
    x = lengths.float().view(B // group_size, group_size)
    lo, hi = x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values
    span = hi - lo
    lam = torch.where(span > 0, 0.5 - (x - lo) / span.clamp(min=1e-12), torch.zeros_like(x)).reshape(-1)
    return torch.where(correct.bool().reshape(-1), lam, lam.clamp(max=0.0))


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups of ``group_size`` consecutive responses (one prompt each) have scores that are not all equal:
    DAPO's dynamic-sampling filter (a group whose rewards are all equal has zero group-relative advantage).

    Args:
        scores: ``[B]`` sequence scores, groups in consecutive blocks.
        group_size: G ≥ 1 dividing B.
    Returns:
        ``[B / G]`` bool.
    Raises:
        ValueError: G < 1 or G does not divide B.

    Source: Yu et al. 2025 (DAPO) §3.2, Eq. 11 (the constraint 0 < |{o_i : is_equivalent(a, o_i)}| < G).
    """
    if group_size < 1 or scores.shape[0] % group_size:
        raise ValueError(f"informative_groups: batch size {scores.shape[0]} must be a multiple of group_size ({group_size})")
    grouped = scores.view(-1, group_size)
    return grouped.max(dim=1).values != grouped.min(dim=1).values


def fill_groups(keep: list[torch.Tensor], n_groups: int) -> list[tuple[int, int]]:
    """The groups that make up a dynamically sampled batch of ``n_groups`` groups, from rounds of rollouts.

    ``keep[r]`` (``[n_r]`` bool, :func:`informative_groups`) marks round ``r``'s informative groups. They are taken
    first, in round order, up to ``n_groups``; if fewer exist (the round cap was hit), the batch is topped up with
    uninformative groups in round order, so it keeps its size (their group-relative advantage is zero).

    Returns:
        ``n_groups`` pairs ``(round, group index within the round)`` (fewer if all rounds hold fewer groups).
    """
    good = [(r, int(g)) for r, k in enumerate(keep) for g in torch.nonzero(k).flatten()]
    rest = [(r, int(g)) for r, k in enumerate(keep) for g in torch.nonzero(~k).flatten()]
    return (good + rest)[:n_groups]
