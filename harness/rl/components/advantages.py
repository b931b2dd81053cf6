"""Advantage estimators: GAE with a critic, and critic-free group baselines.

Uniform signature (registered in ``ADV_ESTIMATORS`` with meta ``needs_critic`` and ``whitens``)::

    fn(rewards[B,T], values[B,T] | None, response_mask[B,T], *, gamma, lam, group_size, knobs)
        -> (advantages[B,T], returns[B,T])

``knobs`` holds the further ``PPOConfig`` fields an estimator names at registration (meta ``knobs``: the pass@k
advantage's ``pass_k``), None or ``{}`` for the others.

``rewards`` are per-token rewards: −β·kl on every response token plus the score at the last real
token. Masks are right-padded prefixes (1 up to and including EOS, then 0).

``whitens`` is the estimator's published recipe for the batch whitening the loop may apply afterwards
(``ppo.whiten_advantages``, unset = this recipe): GAE is whitened over the batch (N+, TRL, OpenRLHF); none of
the critic-free estimators is (GRPO, Dr. GRPO, RLOO, REINFORCE: their sources normalise, if at all, inside the
estimator; REINFORCE++'s batch normalisation is the estimator itself).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol

import torch

from harness.rl.components.whitening import masked_whiten
from harness.registry import Registry


class AdvantageEstimator(Protocol):
    """``fn(rewards[B,T], values[B,T] | None, response_mask[B,T], *, gamma, lam, group_size, knobs)
    -> (advantages[B,T], returns[B,T])``."""

    def __call__(self, rewards: torch.Tensor, values: torch.Tensor | None, response_mask: torch.Tensor, *,
                 gamma: float, lam: float, group_size: int | None, knobs: Optional[Mapping[str, Any]] = None
                 ) -> tuple[torch.Tensor, torch.Tensor]: ...


ADV_ESTIMATORS: Registry = Registry("ppo.adv_estimator", AdvantageEstimator,
                                    "advantages from per-token rewards (a critic's GAE or a critic-free baseline)")


def _zero_pad(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


@ADV_ESTIMATORS.register("gae", needs_critic=True, whitens=True)
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    group_size: int | None = None,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over the response tokens.

    ``δ_t = r_t + γ·V_{t+1} − V_t``, ``A_t = δ_t + γλ·A_{t+1}``, with ``V = 0`` after the last real
    token (rewards and values at padding are treated as 0). ``returns = advantages + values``.

    Args:
        rewards: ``[B, T]`` per-token rewards.
        values: ``[B, T]`` critic values V(s_t) of the same tokens.
        response_mask: ``[B, T]`` 1 on real tokens (prefix), 0 on padding.
        gamma: discount γ ∈ [0, 1].
        lam: GAE λ ∈ [0, 1], or a ``[B]`` tensor of one λ per response (:func:`gae_length_adaptive`).
        group_size: ignored (uniform signature).

    Returns:
        ``(advantages[B,T], returns[B,T])``, both 0 on padding.

    Raises:
        ValueError: if ``values`` is None.

    Source: Schulman et al. 2016 (GAE) eq. 16; N+ / TRL PPOTrainer (γ = 1, λ = 0.95).
    """
    if values is None:
        raise ValueError("gae needs critic values (values=None); use a critic-free adv_estimator")
    rewards = _zero_pad(rewards, response_mask)
    values = _zero_pad(values, response_mask)
    T = rewards.shape[1]
    last_gae = torch.zeros_like(rewards[:, 0])
    reversed_adv = []
    for t in reversed(range(T)):
        next_values = values[:, t + 1] if t + 1 < T else torch.zeros_like(values[:, t])
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = delta + gamma * lam * last_gae
        reversed_adv.append(last_gae)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    # With a prefix mask, padding has δ = 0 and A = 0 already; zero explicitly for safety.
    advantages = _zero_pad(advantages, response_mask)
    returns = advantages + values
    return advantages, returns


def _grouped_returns(rewards: torch.Tensor, response_mask: torch.Tensor, group_size: int, name: str,
                     min_group: int = 1) -> torch.Tensor:
    """Sequence returns ``R_i = Σ_t r_{i,t}·M_{i,t}`` reshaped to ``[B/G, G]``; a ValueError naming
    ``name`` when G < ``min_group`` or G does not divide B."""
    if group_size is not None and group_size < min_group:
        raise ValueError(f"{name}: group_size must be >= {min_group} (got {group_size})")
    B = rewards.shape[0]
    if group_size is None or group_size < 1 or B % group_size:
        raise ValueError(f"{name}: batch size {B} must be a multiple of group_size ({group_size})")
    seq_returns = _zero_pad(rewards, response_mask).sum(dim=1)
    return seq_returns.view(B // group_size, group_size)


def _broadcast(seq_adv: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B]`` sequence advantages → ``[B,T]`` on every response token; returns = advantages."""
    adv = seq_adv.reshape(-1, 1) * response_mask.to(seq_adv.dtype)
    return adv, adv.clone()


@ADV_ESTIMATORS.register("grpo", needs_critic=False, whitens=False)
def grpo(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO group-normalized outcome advantage: ``A_i = (R_i − mean_g) / (std_g + 1e-6)``.

    ``R_i`` is the sequence's summed per-token reward; groups are consecutive blocks of
    ``group_size`` rows (one prompt each); std is unbiased. Every response token of row ``i``
    gets ``A_i``; ``returns = advantages``. ``values``, ``gamma``, ``lam`` are ignored.

    Args:
        rewards: ``[B, T]`` per-token rewards.
        values: ignored (may be None).
        response_mask: ``[B, T]``.
        group_size: G ≥ 2, responses per prompt.

    Returns:
        ``(advantages[B,T], returns[B,T])``, 0 on padding.

    Raises:
        ValueError: if ``B % group_size != 0`` or ``group_size < 2``.

    Source: Shao et al. 2024 (DeepSeekMath, GRPO) §4.1.2, outcome supervision; verl ``grpo``.
    """
    grouped = _grouped_returns(rewards, response_mask, group_size, "grpo", min_group=2)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True, unbiased=True)
    return _broadcast((grouped - mean) / (std + 1e-6), response_mask)


@ADV_ESTIMATORS.register("rloo", needs_critic=False, whitens=False)
def rloo(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out: ``A_i = R_i − mean_{j≠i} R_j`` within each group of G.

    Args:
        rewards: ``[B, T]`` per-token rewards (summed per sequence into ``R_i``).
        values: ignored.
        response_mask: ``[B, T]``.
        group_size: G ≥ 2, responses per prompt (consecutive rows).

    Returns:
        ``(advantages[B,T], returns[B,T])`` with ``A_i`` on every response token.

    Raises:
        ValueError: if ``B % group_size != 0`` or ``group_size < 2``.

    Source: Kool et al. 2019; Ahmadian et al. 2024 ("Back to Basics", RLOO) eq. 5; TRL RLOOTrainer.
    """
    grouped = _grouped_returns(rewards, response_mask, group_size, "rloo", min_group=2)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return _broadcast(grouped - baseline, response_mask)


@ADV_ESTIMATORS.register("reinforce", needs_critic=False, whitens=False)
def reinforce(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE with a batch-mean baseline: ``A_i = R_i − mean_{whole batch} R``.

    Args:
        rewards: ``[B, T]`` per-token rewards (summed per sequence into ``R_i``).
        values: ignored.
        response_mask: ``[B, T]``.
        group_size: only checked (``B % group_size == 0``) so every critic-free estimator sees the
            same grouped batch; the baseline uses the whole batch.

    Returns:
        ``(advantages[B,T], returns[B,T])`` with ``A_i`` on every response token.

    Raises:
        ValueError: if ``B % group_size != 0``.

    Source: Williams 1992, REINFORCE with a constant baseline (here the batch mean of ``R``).
    """
    seq_returns = _grouped_returns(rewards, response_mask, group_size, "reinforce").reshape(-1)
    return _broadcast(seq_returns - seq_returns.mean(), response_mask)


@ADV_ESTIMATORS.register("dr_grpo", needs_critic=False, whitens=False)
def dr_grpo(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO: the group-mean baseline without GRPO's division by the group std,
    ``A_i = R_i − mean_g R`` on every response token (pair it with ``loss_agg:
    seq-mean-token-sum-norm``, the paper's other half; its recipe does not whiten the batch, which would
    divide by a std again).

    Args / Returns / Raises: as :func:`grpo`.

    Source: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective", §3.2
    (Dr. GRPO removes the 1/|o_i| and 1/std(R) terms).
    """
    grouped = _grouped_returns(rewards, response_mask, group_size, "dr_grpo", min_group=2)
    return _broadcast(grouped - grouped.mean(dim=1, keepdim=True), response_mask)


@ADV_ESTIMATORS.register("reinforce_pp", needs_critic=False, whitens=False)
def reinforce_pp(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int | None = None,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: the per-token return-to-go ``G_t = Σ_{s≥t} γ^{s−t} r_s`` (the score at the last
    token plus the −β·kl of every later token), normalised over the whole batch's response tokens:
    ``A = (G − mean(G)) / sqrt(var(G) + 1e-8)`` (masked, unbiased var), with no per-prompt group
    baseline. ``returns`` = ``G``.

    Args:
        rewards: ``[B, T]`` per-token rewards; values: ignored; response_mask: ``[B, T]``.
        gamma: discount γ. lam, group_size: ignored (any grouping works).
    Returns:
        ``(advantages[B,T], returns[B,T])``, 0 on padding.

    Source: Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning LLMs", §3
    (token-level KL in the reward, return-to-go, global batch advantage normalisation).
    """
    # the return-to-go is GAE with V = 0 and λ = 1 (δ_t = r_t, A_t = r_t + γ·A_{t+1})
    returns, _ = gae(rewards, torch.zeros_like(rewards), response_mask, gamma=gamma, lam=1.0)
    return masked_whiten(returns, response_mask), returns


@ADV_ESTIMATORS.register("grpo_batch_std", needs_critic=False, whitens=False)
def grpo_batch_std(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    group_size: int,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-mean baseline scaled by the batch std ("Lite PPO"): ``A_i = (R_i − mean_g R) / (std_B R + 1e-6)``,
    where ``std_B`` is the unbiased std of all ``B`` sequence returns of the batch (not of the group: a group
    whose rewards barely differ is not blown up to unit scale).

    Args / Returns / Raises: as :func:`grpo`.

    Source: Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning", §4.1 (group-level
    mean with batch-level std; with the token-level loss it is their Lite PPO, §5).
    """
    grouped = _grouped_returns(rewards, response_mask, group_size, "grpo_batch_std", min_group=2)
    std = grouped.reshape(-1).std(unbiased=True)
    return _broadcast((grouped - grouped.mean(dim=1, keepdim=True)) / (std + 1e-6), response_mask)


@ADV_ESTIMATORS.register("gae_length_adaptive", needs_critic=True, whitens=True, knobs=("vapo_alpha",))
def gae_length_adaptive(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    group_size: int | None = None,
    knobs: Optional[Mapping[str, Any]] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """VAPO's decoupled, length-adaptive GAE: the policy's advantages with a λ per response,
    ``λ_i = clip(1 − 1/(α·l_i), 0, 1)`` (``l_i`` its real tokens, α = ``knobs["vapo_alpha"]``), so a long response's
    credit reaches further back; the critic's targets with λ = 1 (Monte-Carlo returns ``Σ_{t'≥t} γ^{t'−t} r_t'``,
    unbiased). ``lam`` (the config's λ) is ignored.

    Args / Returns / Raises: as :func:`gae`; ``returns`` are the λ = 1 returns, not ``advantages + values``.

    Source: Yue et al. 2025, "VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks"
    (arXiv 2504.05118) §3 (decoupled GAE: λ_critic = 1; length-adaptive GAE: λ_policy = 1 − 1/(αl), α = 0.05).
    """
    alpha = float((knobs or {}).get("vapo_alpha", 0.05))
    lengths = response_mask.to(rewards.dtype).sum(dim=1).clamp(min=1.0)
    lam_rows = (1.0 - 1.0 / (alpha * lengths)).clamp(0.0, 1.0)
    advantages, _ = gae(rewards, values, response_mask, gamma=gamma, lam=lam_rows)
    _, returns = gae(rewards, values, response_mask, gamma=gamma, lam=1.0)
    return advantages, returns
