"""Covariance-based token selection in the policy loss: Clip-Cov and KL-Cov (Cui et al. 2025).

Cui et al. tie the entropy collapse of RL for reasoning to the tokens whose log-probability and advantage covary
most: per token ``cov_t = (A_t − mean A)·(log π_θ(y_t) − mean log π_θ)``, the means over the real tokens of the
batch the loss is computed on. Clip-Cov cuts the gradient of a few randomly chosen tokens with a covariance in a
band; KL-Cov adds a KL penalty ``k·|log π_θ − log π_old|`` on the few tokens of the highest covariance. Both are
policy losses of the :data:`harness.rl.components.losses.POLICY_LOSSES` axis (same signature), with their knobs
(``PPOConfig.clip_cov_*``, ``kl_cov_*``) passed in ``knobs``.

Selection count: ``max(⌊ratio·N⌋, 1)`` of the ``N`` real tokens, as verl counts (the paper's ``r·N`` would
select no token at all in a batch of fewer than 1/ratio tokens, which is every batch here at ratio 2e-4). The
batch is the micro-batch the loss sees, as in verl. Clip-Cov's random choice uses torch's global generator, which
the loop seeds from ``cfg.seed``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from harness.rl.components.losses import POLICY_LOSSES, _clipped_surrogate
from harness.rl.components.whitening import masked_mean


def token_covariance(logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token centred covariance term ``(A_t − Ā)·(log p_t − mean log p)`` with both means over the real tokens
    (no gradient). ``[B, T]`` in, ``[B, T]`` out (``−inf`` on padding, so a padding token is never selected).

    Source: Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
    (arXiv 2505.22617) §4, the covariance whose batch mean drives the entropy change.
    """
    m = response_mask.bool()
    lp, adv = logprobs.detach(), advantages.detach()
    cov = (adv - masked_mean(adv, m)) * (lp - masked_mean(lp, m)) if m.any() else torch.zeros_like(lp)
    return torch.where(m, cov, torch.full_like(cov, float("-inf")))


def _count(ratio: float, n_valid: int) -> int:
    return max(int(ratio * n_valid), 1)


@POLICY_LOSSES.register("clip_cov", knobs=("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"))
def clip_cov(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
             cliprange: float, cliprange_high: float, clip_ratio_c: float,
             knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clip-Cov: PPO's clipped surrogate (bounds ``1−ε_low, 1+ε_high``: ``cliprange``, ``cliprange_high``), with the
    loss and gradient of ``max(⌊ratio·N⌋, 1)`` tokens set to 0, drawn uniformly among the real tokens not already
    clipped whose covariance (:func:`token_covariance`) lies strictly inside ``(clip_cov_lb, clip_cov_ub)``.

    Args / Returns: as :func:`harness.rl.components.losses.vanilla`; ``knobs``: ``clip_cov_ratio`` (2e-4),
    ``clip_cov_lb`` (1), ``clip_cov_ub`` (5). ``clipped`` marks the PPO-clipped tokens and the cut ones.

    Source: Cui et al. 2025 (arXiv 2505.22617) §4.2, Clip-Cov (defaults r = 2e-4, ω_low = 1, ω_high = 5); verl
    ``clip_cov``.
    """
    k = knobs or {}
    ratio_sel, lb, ub = float(k.get("clip_cov_ratio", 2e-4)), float(k.get("clip_cov_lb", 1.0)), float(k.get("clip_cov_ub", 5.0))
    ratio = torch.exp(logprobs - old_logprobs)
    loss, clipped = _clipped_surrogate(ratio, advantages, 1.0 - cliprange, 1.0 + cliprange_high)
    m = response_mask.bool()
    cov = token_covariance(logprobs, advantages, response_mask)
    candidates = torch.nonzero(m & ~clipped & (cov > lb) & (cov < ub), as_tuple=False)
    cut = torch.zeros_like(m)
    if len(candidates):
        pick = candidates[torch.randperm(len(candidates))[: _count(ratio_sel, int(m.sum()))].to(candidates.device)]
        cut[pick[:, 0], pick[:, 1]] = True
    return torch.where(cut, torch.zeros_like(loss), loss), clipped | cut, ratio


@POLICY_LOSSES.register("kl_cov", knobs=("kl_cov_ratio", "kl_cov_coef"))
def kl_cov(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
           cliprange: float, cliprange_high: float, clip_ratio_c: float,
           knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KL-Cov: the unclipped surrogate ``−A·r``, plus ``kl_cov_coef·|log π_θ − log π_old|`` on the
    ``max(⌊ratio·N⌋, 1)`` real tokens of the highest covariance (:func:`token_covariance`; ties by position).

    Args / Returns: as :func:`harness.rl.components.losses.vanilla`; ``knobs``: ``kl_cov_ratio`` (2e-4),
    ``kl_cov_coef`` (1). ``clipped`` marks the penalised tokens (their gradient is not cut); ``cliprange*`` and
    ``clip_ratio_c`` ignored.

    Source: Cui et al. 2025 (arXiv 2505.22617) §4.2, KL-Cov (k = 2e-4, β = 1 in their runs); verl ``kl_cov``.
    """
    k = knobs or {}
    ratio_sel, coef = float(k.get("kl_cov_ratio", 2e-4)), float(k.get("kl_cov_coef", 1.0))
    delta = logprobs - old_logprobs
    ratio = torch.exp(delta)
    loss = -advantages * ratio
    m = response_mask.bool()
    chosen = torch.zeros_like(m)
    n_valid = int(m.sum())
    if n_valid:
        flat = token_covariance(logprobs, advantages, response_mask).reshape(-1)
        top = torch.topk(flat, min(_count(ratio_sel, n_valid), n_valid), sorted=True).indices
        chosen.view(-1)[top] = True
    return torch.where(chosen, loss + coef * delta.abs(), loss), chosen, ratio
