"""PPO clipped surrogate policy loss and (optionally clipped) value loss, per token."""

from __future__ import annotations

import torch


def policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped surrogate objective, negated to a loss, per token.

    ``r = exp(logprobs − old_logprobs)``,
    ``pg_loss = max(−A·r, −A·clip(r, 1−ε, 1+ε))``.

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradients).
        old_logprobs: ``[B, T]`` log π_old of the same tokens (rollout time, no gradient).
        advantages: ``[B, T]``.
        cliprange: ε > 0.

    Returns:
        ``(pg_loss_mat[B,T], clipped[B,T] bool, ratio[B,T])``; ``clipped`` marks tokens where the
        clipped branch is strictly larger (its gradient is zero). Not masked: aggregate with
        :func:`harness.components.aggregation.agg_loss`.

    Source: Schulman et al. 2017 (PPO) eq. 7; CleanRL ``ppo.py``; TRL PPOTrainer.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    pg_losses = -advantages * ratio
    pg_losses_clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    pg_loss_mat = torch.maximum(pg_losses, pg_losses_clipped)
    clipped = pg_losses_clipped > pg_losses
    return pg_loss_mat, clipped, ratio


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    cliprange_value: float,
    clip_value: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared-error value loss with optional PPO2-style clipping around the rollout values.

    ``V_clip = V_old + clip(V − V_old, −cliprange_value, +cliprange_value)``,
    ``vf_loss = 0.5·max((V − R)², (V_clip − R)²)`` when ``clip_value``, else ``0.5·(V − R)²``.

    Args:
        values: ``[B, T]`` current critic values (with gradients).
        old_values: ``[B, T]`` critic values at rollout time.
        returns: ``[B, T]`` GAE returns (targets).
        cliprange_value: clip half-width (same units as the values).
        clip_value: apply clipping.

    Returns:
        ``(vf_loss_mat[B,T], clipped[B,T] bool)``; ``clipped`` marks tokens where the clipped error
        is strictly larger (all False when ``clip_value`` is False). Not masked.

    Source: OpenAI baselines PPO2 (``vf_loss``); TRL PPOTrainer; N+ (cliprange_value 0.2).
    """
    vf_losses = (values - returns).square()
    if not clip_value:
        return 0.5 * vf_losses, torch.zeros_like(vf_losses, dtype=torch.bool)
    values_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    vf_losses_clipped = (values_clipped - returns).square()
    return 0.5 * torch.maximum(vf_losses, vf_losses_clipped), vf_losses_clipped > vf_losses
