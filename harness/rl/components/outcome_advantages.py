"""Critic-free advantages of verifiable outcomes (2025): sample polarity (PSR, NSR, W-REINFORCE) and the pass@k
advantage. Registered on the ``ppo.adv_estimator`` axis with its signature
(:class:`harness.rl.components.advantages.AdvantageEstimator`).

A response is *positive* (correct) when its sequence return ``R_i = Σ_t r_{i,t}`` exceeds :data:`POSITIVE_ABOVE`:
with a verifier's 1/0 reward (chain_sum's exact match) that is "correct", and with Zhu et al.'s ±1 rewards it is
``r = +1``. KL in the reward (or a missing-EOS penalty) lowers ``R_i`` as it lowers any estimator's return.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import torch

from harness.rl.components.advantages import ADV_ESTIMATORS, _broadcast, _grouped_returns

#: A response whose sequence return exceeds this is positive (correct).
POSITIVE_ABOVE = 0.5


def _positive(rewards: torch.Tensor, response_mask: torch.Tensor, group_size: int, name: str) -> torch.Tensor:
    """``[B/G, G]`` bool: which responses are positive (module docstring)."""
    return _grouped_returns(rewards, response_mask, group_size, name) > POSITIVE_ABOVE


@ADV_ESTIMATORS.register("psr", needs_critic=False, whitens=False)
def psr(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive sample reinforcement: ``A_i = 1`` on positive responses, 0 on the others, so the loss
    ``−A·log π`` (``policy_loss: reinforce`` or a clipped surrogate) is ``−Σ_{r=+1} log π(y)``: likelihood
    training on the correct samples only.

    Args: ``rewards``, ``response_mask``: ``[B, T]``; ``group_size``: G ≥ 1 (groups only delimit prompts here);
    ``values``, ``gamma``, ``lam``, ``knobs`` ignored. Returns ``(advantages[B,T], returns[B,T])``, 0 on padding.
    Raises ValueError when G does not divide B.

    Source: Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning" (arXiv
    2506.01347) §3, L_PSR.
    """
    pos = _positive(rewards, response_mask, group_size, "psr")
    return _broadcast(pos.to(rewards.dtype), response_mask)


@ADV_ESTIMATORS.register("nsr", needs_critic=False, whitens=False)
def nsr(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Negative sample reinforcement: ``A_i = −1`` on non-positive responses, 0 on the positive ones: the loss
    ``+Σ_{r=−1} log π(y)`` pushes probability off the wrong samples and lets the model's prior redistribute it.

    Args / Returns / Raises: as :func:`psr`. Source: Zhu et al. 2025 (arXiv 2506.01347) §3, L_NSR.
    """
    pos = _positive(rewards, response_mask, group_size, "nsr")
    return _broadcast(-(~pos).to(rewards.dtype), response_mask)


@ADV_ESTIMATORS.register("w_reinforce", needs_critic=False, whitens=False, knobs=("w_reinforce_lambda",))
def w_reinforce(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted REINFORCE, ``λ·L_PSR + L_NSR``: ``A_i = λ`` on positive responses and ``−1`` on the others
    (``knobs["w_reinforce_lambda"]``, λ = 0.1 by default, as the paper recommends).

    Args / Returns / Raises: as :func:`psr`. Source: Zhu et al. 2025 (arXiv 2506.01347) §5, W-REINFORCE.
    """
    lam_pos = float((knobs or {}).get("w_reinforce_lambda", 0.1))
    pos = _positive(rewards, response_mask, group_size, "w_reinforce").to(rewards.dtype)
    return _broadcast(lam_pos * pos - (1.0 - pos), response_mask)


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct: ``1 − C(n−c, k)/C(n, k)``
    (1 when fewer than ``k`` samples are wrong). Example: ``n = 4, c = 1, k = 2`` → 0.5.

    Raises:
        ValueError: unless ``1 ≤ k ≤ n`` and ``0 ≤ c ≤ n``.

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (Codex), eq. 1.
    """
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k: need 1 ≤ k ≤ n and 0 ≤ c ≤ n (got n={n}, c={c}, k={k})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k_advantages(n: int, c: int, k: int) -> tuple[float, float]:
    """The pass@k advantages ``(A⁺, A⁻)`` of a group of ``n`` responses with ``c`` correct: with
    ``ρ = 1 − C(n−c, k)/C(n, k)`` (the group's unbiased pass@k) and ``σ = √(ρ(1−ρ))``,
    ``A⁺ = (1 − ρ)/σ`` and ``A⁻ = (1 − ρ − C(n−c−1, k−1)/C(n−1, k−1))/σ``; both 0 where σ = 0 (every response
    correct, none, or ``n − c < k``). Over the group they sum to 0: ``c·A⁺ + (n−c)·A⁻ = 0``.

    Example: ``n = 4, c = 1, k = 2`` → ρ = 0.5, ``(1.0, −1/3)``.
    Raises ValueError unless ``1 ≤ k ≤ n`` and ``0 ≤ c ≤ n``.

    Source: Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large
    Reasoning Models" (arXiv 2508.10751), the analytical pass@k advantage.
    """
    rho = unbiased_pass_at_k(n, c, k)
    sigma = math.sqrt(max(rho * (1.0 - rho), 0.0))
    if sigma < 1e-12:
        return 0.0, 0.0
    a_neg = (1.0 - rho - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)) / sigma if c < n else 0.0
    return (1.0 - rho) / sigma, a_neg


@ADV_ESTIMATORS.register("pass_at_k", needs_critic=False, whitens=False, knobs=("pass_k",))
def pass_at_k(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pass@k advantage: per group of G responses with ``c`` positive ones, ``A⁺`` on the positive and ``A⁻``
    on the others (:func:`pass_at_k_advantages` with ``n = G``, ``k = knobs["pass_k"]``), so the group is trained
    towards a higher pass@k rather than a higher pass@1: a wrong response in a group that already has a correct
    one is penalised less.

    Args / Returns: as :func:`psr`, with G ≥ 2. Raises ValueError when G does not divide B, or ``pass_k`` is
    outside ``[1, G]``.

    Source: Chen et al. 2025 (arXiv 2508.10751), the analytical derivation of the pass@k advantage.
    """
    k = int((knobs or {}).get("pass_k", 4))
    pos = _positive(rewards, response_mask, group_size, "pass_at_k")
    G = pos.shape[1]
    table = {c: pass_at_k_advantages(G, c, k) for c in range(G + 1)}
    counts = pos.sum(dim=1).tolist()
    a_pos = torch.tensor([table[int(c)][0] for c in counts], dtype=rewards.dtype, device=rewards.device)
    a_neg = torch.tensor([table[int(c)][1] for c in counts], dtype=rewards.dtype, device=rewards.device)
    adv = torch.where(pos, a_pos[:, None], a_neg[:, None])
    return _broadcast(adv, response_mask)
