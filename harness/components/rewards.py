"""Per-token rewards for PPO: −β·kl on every response token, the score at the last real token.

Source: Stiennon et al. 2020 eq. 1; Ziegler et al. 2019; N+ / TRL PPOTrainer reward shaping.
"""

from __future__ import annotations

import torch

from harness.components.eos import last_token_index
from harness.components.whitening import masked_whiten


def token_rewards(
    scores: torch.Tensor, kl: torch.Tensor, reward_kl_coef: float, response_mask: torch.Tensor
) -> torch.Tensor:
    """Build the per-token reward matrix.

    ``rewards[i,t] = −β·kl[i,t]·M[i,t]``, then ``rewards[i, L_i − 1] += scores[i]`` with
    ``L_i = Σ_t M[i,t]``.

    Args:
        scores: ``[B]`` sequence scores (RM at EOS, after normalization/clipping/penalty).
        kl: ``[B, T]`` per-token KL estimate (nats), see :mod:`harness.components.kl`.
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
