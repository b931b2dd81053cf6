"""Policy losses (a registry of surrogate objectives) and value losses (a registry of critic losses), per token.

Every policy loss has one signature (:class:`PolicyLoss`)::

    fn(logprobs[B,T], old_logprobs[B,T], advantages[B,T], response_mask[B,T], *,
       cliprange, cliprange_high, clip_ratio_c) -> (pg_loss_mat[B,T], clipped[B,T] bool, ratio[B,T])

A variant reads the knobs it needs and ignores the others. ``pg_loss_mat`` is not masked: aggregate
it with :func:`harness.components.aggregation.agg_loss`. ``clipped`` marks tokens whose loss is set
by a clipping bound (zero gradient there); ``ratio`` is the importance ratio that the loss used.

Every value loss has one signature (:class:`ValueLoss`)::

    fn(values[B,T], old_values[B,T], returns[B,T], *, cliprange_value) -> (vf_loss_mat[B,T], clipped[B,T] bool)
"""

from __future__ import annotations

from typing import Protocol

import torch

from harness.registry import Registry


class PolicyLoss(Protocol):
    """``fn(logprobs, old_logprobs, advantages, response_mask, *, cliprange, cliprange_high, clip_ratio_c)
    -> (pg_loss_mat, clipped, ratio)``, all ``[B, T]``."""

    def __call__(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 response_mask: torch.Tensor, *, cliprange: float, cliprange_high: float, clip_ratio_c: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


POLICY_LOSSES: Registry = Registry("ppo.policy_loss", PolicyLoss, "the surrogate objective per token")


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``max(−A·r, −A·clip(r, low, high))`` and where the clipped branch is strictly larger."""
    unclipped = -advantages * ratio
    clipped_branch = -advantages * torch.clamp(ratio, low, high)
    return torch.maximum(unclipped, clipped_branch), clipped_branch > unclipped


@POLICY_LOSSES.register("vanilla")
def vanilla(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
            cliprange: float, cliprange_high: float, clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, negated to a loss: ``r = exp(logprobs − old_logprobs)``,
    ``pg_loss = max(−A·r, −A·clip(r, 1−ε, 1+ε))`` per token (ε = ``cliprange``).

    Args:
        logprobs: ``[B, T]`` log π_θ of the sampled tokens (with gradients).
        old_logprobs: ``[B, T]`` log π_old of the same tokens (rollout time, no gradient).
        advantages: ``[B, T]``; response_mask: ``[B, T]`` (unused: per-token loss).
        cliprange: ε > 0. cliprange_high, clip_ratio_c: ignored.
    Returns:
        ``(pg_loss_mat, clipped, ratio)``, each ``[B, T]``.

    Source: Schulman et al. 2017 (PPO) eq. 7; CleanRL ``ppo.py``; TRL PPOTrainer.
    """
    return clip_higher(logprobs, old_logprobs, advantages, response_mask, cliprange=cliprange, cliprange_high=cliprange,
                       clip_ratio_c=clip_ratio_c)


@POLICY_LOSSES.register("clip_higher")
def clip_higher(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
                cliprange: float, cliprange_high: float, clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoupled clip ("clip-higher"): ``max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high))`` per token with
    ε_low = ``cliprange`` and ε_high = ``cliprange_high`` (DAPO: 0.2 / 0.28), so a token with A > 0
    and a low probability can grow further before its gradient is cut.

    Args / Returns: as :func:`vanilla`; ``clip_ratio_c`` ignored.

    Source: Yu et al. 2025, "DAPO", §3.1 (Clip-Higher), eq. 10.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    loss, clipped = _clipped_surrogate(ratio, advantages, 1.0 - cliprange, 1.0 + cliprange_high)
    return loss, clipped, ratio


@POLICY_LOSSES.register("dual_clip")
def dual_clip(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
              cliprange: float, cliprange_high: float, clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dual-clip PPO: the vanilla loss, and for A < 0 also bounded above by ``−c·A``
    (c = ``clip_ratio_c`` > 1): ``min(max(−A·r, −A·clip(r, 1−ε, 1+ε)), −c·A)`` where A < 0, so a
    token whose ratio has grown far past 1 + ε under a negative advantage cannot dominate the loss.

    Args / Returns: as :func:`vanilla`; ``clipped`` also marks tokens held at the lower bound ``−c·A``;
    ``cliprange_high`` ignored.

    Source: Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", eq. 5 (dual-clip);
    verl ``clip_ratio_c`` (default 3).
    """
    loss, clipped, ratio = vanilla(logprobs, old_logprobs, advantages, response_mask, cliprange=cliprange,
                                   cliprange_high=cliprange_high, clip_ratio_c=clip_ratio_c)
    bound = -advantages * clip_ratio_c
    held = (advantages < 0) & (bound < loss)
    return torch.where(held, bound, loss), clipped | held, ratio


@POLICY_LOSSES.register("gspo")
def gspo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
         cliprange: float, cliprange_high: float, clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO's sequence-level importance ratio in its GSPO-token form: ``s_i = exp(mean_t log r_{i,t})`` over the
    response's real tokens (a length-normalised sequence likelihood ratio), and per token
    ``s_{i,t} = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]`` (equal to ``s_i`` in value; its gradient is
    ``s_i · ∇log π_θ(y_t)``), clipped per sequence: ``max(−A_{i,t}·s_{i,t}, −A_{i,t}·clip(s_{i,t}, 1−ε_low,
    1+ε_high))`` (ε_low = ``cliprange``, ε_high = ``cliprange_high``).

    With one advantage per sequence (every critic-free estimator here) the gradient is GSPO's own (eq. 7): the
    paper shows GSPO-token and GSPO coincide when ``A_{i,t} = A_i``. With per-token advantages (GAE) each token
    keeps its own ``A_{i,t}`` (GSPO-token, §4.3), rather than the sequence mean the plain ``s_i`` form would give.

    Args / Returns: as :func:`vanilla`, with ``ratio`` = ``s_i`` broadcast over the row (1 on a row with no real
    token). GSPO's own clip ranges are far smaller (ε_low 3e-4, ε_high 4e-4).

    Source: Zheng et al. 2025, "Group Sequence Policy Optimization", eqs. 5–7 (GSPO) and §4.3 (GSPO-token).
    """
    m = response_mask.to(logprobs.dtype)
    n = m.sum(dim=1, keepdim=True).clamp_min(1.0)
    log_s = ((logprobs - old_logprobs) * m).sum(dim=1, keepdim=True) / n
    ratio = torch.exp(log_s.detach() + logprobs - logprobs.detach())
    loss, clipped = _clipped_surrogate(ratio, advantages, 1.0 - cliprange, 1.0 + cliprange_high)
    return loss, clipped, ratio


@POLICY_LOSSES.register("reinforce")
def reinforce(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
              cliprange: float, cliprange_high: float, clip_ratio_c: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unclipped importance-weighted policy gradient: ``−A·r`` per token. With one update per
    rollout batch (``num_ppo_epochs: 1``, ``num_minibatches: 1``) the ratio is 1 and its gradient is
    REINFORCE's ``−A·∇log π``: the update of RLOO as published.

    Args / Returns: as :func:`vanilla`; ``clipped`` is all False; ``cliprange*`` and ``clip_ratio_c`` ignored.

    Source: Williams 1992; Ahmadian et al. 2024, "Back to Basics" (RLOO), §3–4 (REINFORCE with a
    leave-one-out baseline, no clipping).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    return -advantages * ratio, torch.zeros_like(ratio, dtype=torch.bool), ratio


class ValueLoss(Protocol):
    """``fn(values, old_values, returns, *, cliprange_value) -> (vf_loss_mat, clipped)``, all ``[B, T]``."""

    def __call__(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *,
                 cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]: ...


VALUE_LOSSES: Registry = Registry("ppo.value_loss", ValueLoss, "the critic's loss per token")


@VALUE_LOSSES.register("clipped")
def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *,
                       cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared error, pessimistic over PPO2-style clipping around the rollout values.

    ``V_clip = V_old + clip(V − V_old, −cliprange_value, +cliprange_value)``,
    ``vf_loss = 0.5·max((V − R)², (V_clip − R)²)``.

    Args:
        values: ``[B, T]`` current critic values (with gradients).
        old_values: ``[B, T]`` critic values at rollout time.
        returns: ``[B, T]`` GAE returns (targets).
        cliprange_value: clip half-width, > 0, in the values' units.
    Returns:
        ``(vf_loss_mat[B,T], clipped[B,T] bool)``; ``clipped`` marks tokens where the clipped error is
        strictly larger (zero gradient there). Not masked: aggregate with ``agg_loss``.

    Source: OpenAI baselines PPO2 (``vf_loss``); TRL PPOTrainer; verl ``compute_value_loss``; N+
    (cliprange_value 0.2).
    """
    vf_losses = (values - returns).square()
    values_clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    vf_losses_clipped = (values_clipped - returns).square()
    return 0.5 * torch.maximum(vf_losses, vf_losses_clipped), vf_losses_clipped > vf_losses


@VALUE_LOSSES.register("mse")
def mse_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *,
                   cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain squared error ``vf_loss = 0.5·(V − R)²``, no clipping.

    Args:
        values, old_values, returns: ``[B, T]`` as in :func:`clipped_value_loss` (``old_values`` unused).
        cliprange_value: ignored.
    Returns:
        ``(vf_loss_mat[B,T], clipped[B,T])`` with ``clipped`` all False. Not masked.

    Source: Schulman et al. 2017 (PPO) eq. 9, the L^VF term; Engstrom et al. 2020 and Andrychowicz et
    al. 2021 ablate value clipping against it.
    """
    return 0.5 * (values - returns).square(), torch.zeros_like(values, dtype=torch.bool)
