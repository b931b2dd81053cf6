"""Policy losses (a registry of surrogate objectives) and value losses (a registry of critic losses), per token.

Every policy loss has one signature (:class:`PolicyLoss`)::

    fn(logprobs[B,T], old_logprobs[B,T], advantages[B,T], response_mask[B,T], *,
       cliprange, cliprange_high, clip_ratio_c, knobs) -> (pg_loss_mat[B,T], clipped[B,T] bool, ratio[B,T])

A variant reads the knobs it needs and ignores the others; ``knobs`` holds the further ``PPOConfig`` fields a
variant names at registration (meta ``knobs``, e.g. SAPO's temperatures), None or ``{}`` for the others. A
sequence-level objective (GMPO) registers ``loss_agg="seq-mean-token-mean"``: it puts its per-sequence loss on
every token of the row, and the config requires that aggregation, whose value is then the mean over sequences. ``pg_loss_mat`` is not masked: aggregate
it with :func:`harness.rl.components.aggregation.agg_loss`. ``clipped`` marks tokens whose loss is set
by a clipping bound (zero gradient there); ``ratio`` is the importance ratio that the loss used.

Every value loss has one signature (:class:`ValueLoss`)::

    fn(values[B,T], old_values[B,T], returns[B,T], *, cliprange_value) -> (vf_loss_mat[B,T], clipped[B,T] bool)
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol

import torch

from harness.registry import Registry


class PolicyLoss(Protocol):
    """``fn(logprobs, old_logprobs, advantages, response_mask, *, cliprange, cliprange_high, clip_ratio_c, knobs)
    -> (pg_loss_mat, clipped, ratio)``, all ``[B, T]``."""

    def __call__(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                 response_mask: torch.Tensor, *, cliprange: float, cliprange_high: float, clip_ratio_c: float,
                 knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


POLICY_LOSSES: Registry = Registry("ppo.policy_loss", PolicyLoss, "the surrogate objective per token")


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``max(−A·r, −A·clip(r, low, high))`` and where the clipped branch is strictly larger."""
    unclipped = -advantages * ratio
    clipped_branch = -advantages * torch.clamp(ratio, low, high)
    return torch.maximum(unclipped, clipped_branch), clipped_branch > unclipped


@POLICY_LOSSES.register("vanilla")
def vanilla(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
            cliprange: float, cliprange_high: float, clip_ratio_c: float,
            knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
                cliprange: float, cliprange_high: float, clip_ratio_c: float,
                knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
              cliprange: float, cliprange_high: float, clip_ratio_c: float,
              knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
         cliprange: float, cliprange_high: float, clip_ratio_c: float,
         knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
              cliprange: float, cliprange_high: float, clip_ratio_c: float,
              knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unclipped importance-weighted policy gradient: ``−A·r`` per token. With one update per
    rollout batch (``num_ppo_epochs: 1``, ``num_minibatches: 1``) the ratio is 1 and its gradient is
    REINFORCE's ``−A·∇log π``: the update of RLOO as published.

    Args / Returns: as :func:`vanilla`; ``clipped`` is all False; ``cliprange*`` and ``clip_ratio_c`` ignored.

    Source: Williams 1992; Ahmadian et al. 2024, "Back to Basics" (RLOO), §3–4 (REINFORCE with a
    leave-one-out baseline, no clipping).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    return -advantages * ratio, torch.zeros_like(ratio, dtype=torch.bool), ratio


def _cispo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, low: Optional[float],
           high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO's token loss ``−sg(clip(r, low, high))·A·log π_θ`` (``low`` None: no lower bound), where the weight
    was truncated, and the ratio."""
    ratio = torch.exp(logprobs - old_logprobs)
    weight = torch.clamp(ratio, min=low, max=high).detach()
    truncated = (ratio > high) if low is None else (ratio > high) | (ratio < low)
    return -weight * advantages * logprobs, truncated, ratio


@POLICY_LOSSES.register("cispo")
def cispo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
          cliprange: float, cliprange_high: float, clip_ratio_c: float,
          knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO, clipped importance-sampling policy optimisation: REINFORCE on ``log π_θ`` weighted by the detached
    importance ratio truncated from above, ``pg_loss = −sg(min(r, 1+ε_high))·A·log π_θ`` per token
    (ε_high = ``cliprange_high``; ``r = exp(logprobs − old_logprobs)``). No token's gradient is dropped: a token
    past the bound keeps its gradient, scaled by ``1+ε_high`` instead of ``r``.

    The loss *value* is not PPO's surrogate (it holds ``log π_θ``, not ``r``); its gradient at ``r = 1`` is the
    same ``−A·∇log π_θ``. This is the form MiniMax-M1 trains with (no lower bound) and TRL's ``loss_type="cispo"``
    (``epsilon_high``); :func:`cispo_two_sided` is verl's.

    Args / Returns: as :func:`vanilla`; ``clipped`` marks the tokens whose weight was truncated (their gradient
    is scaled, not cut); ``cliprange`` and ``clip_ratio_c`` ignored.

    Source: MiniMax 2025, "MiniMax-M1" (arXiv 2506.13585) §3.1 (the CISPO objective); TRL ``GRPOTrainer`` ``cispo``.
    """
    return _cispo(logprobs, old_logprobs, advantages, None, 1.0 + cliprange_high)


@POLICY_LOSSES.register("cispo_two_sided")
def cispo_two_sided(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    response_mask: torch.Tensor, *, cliprange: float, cliprange_high: float, clip_ratio_c: float,
                    knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO with the weight clamped on both sides, as verl's ``cispo`` does:
    ``pg_loss = −sg(clip(r, 1−ε_low, 1+ε_high))·A·log π_θ`` (ε_low = ``cliprange``, ε_high = ``cliprange_high``).

    Args / Returns: as :func:`cispo`; ``clipped`` marks weights truncated at either bound.

    Source: MiniMax-M1 (arXiv 2506.13585) §3.1, the clip with its ε_low^IS; verl ``core_algos`` ``cispo``.
    """
    return _cispo(logprobs, old_logprobs, advantages, 1.0 - cliprange, 1.0 + cliprange_high)


@POLICY_LOSSES.register("sapo", knobs=("sapo_tau_pos", "sapo_tau_neg"))
def sapo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
         cliprange: float, cliprange_high: float, clip_ratio_c: float,
         knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SAPO, soft adaptive policy optimisation: a sigmoid gate in place of the hard clip,
    ``pg_loss = −σ(τ·(r − 1))·(4/τ)·A`` per token with ``τ = τ_pos`` where A > 0 and ``τ_neg`` elsewhere. The
    gate's slope at ``r = 1`` is 1 (the plain policy gradient); it decays smoothly as ``r`` leaves 1, faster for
    the larger τ (negative advantages: τ_neg > τ_pos).

    Args / Returns: as :func:`vanilla`; ``knobs``: ``sapo_tau_pos`` (1.0), ``sapo_tau_neg`` (1.05). ``clipped`` is
    all False (no hard bound); ``cliprange*`` and ``clip_ratio_c`` ignored.

    Source: "Soft Adaptive Policy Optimization" (SAPO, arXiv 2511.20347), the gate f(r) and its
    temperatures; verl ``sapo``; TRL ``loss_type="sapo"``.
    """
    k = knobs or {}
    tau_pos, tau_neg = float(k.get("sapo_tau_pos", 1.0)), float(k.get("sapo_tau_neg", 1.05))
    ratio = torch.exp(logprobs - old_logprobs)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * advantages, torch.zeros_like(ratio, dtype=torch.bool), ratio


@POLICY_LOSSES.register("gmpo", loss_agg="seq-mean-token-mean")
def gmpo(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, *,
         cliprange: float, cliprange_high: float, clip_ratio_c: float,
         knobs: Optional[Mapping[str, Any]] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GMPO, geometric-mean policy optimisation: per sequence, the geometric mean of its token ratios, each clipped
    pessimistically in log space, ``ρ̄_i = exp(mean_t sgn(A_i)·min(sgn(A_i)·Δ_t, sgn(A_i)·clip(Δ_t, −ε_low,
    ε_high)))`` with ``Δ = logprobs − old_logprobs`` (ε_low = ``cliprange``, ε_high = ``cliprange_high``; the paper's
    ε = 0.4 on both sides), and the sequence loss ``−A_i·ρ̄_i``, where ``A_i`` is the mean of the row's advantages.

    A sequence-level objective: the loss is ``−A_i·ρ̄_i`` on every real token of row ``i``, and the registry meta
    ``loss_agg="seq-mean-token-mean"`` makes the config require that aggregation, whose value is then
    ``mean_i(−A_i·ρ̄_i)``, GMPO's objective. An outlier token moves the geometric mean far less than the arithmetic
    one, so the update is less sensitive to extreme ratios.

    Args / Returns: as :func:`vanilla`, with ``ratio`` = ``ρ̄_i`` broadcast over the row (1 on a row without real
    tokens); ``clipped`` marks tokens whose clipped log-ratio was the pessimistic branch.

    Source: Zhao et al. 2025, "Geometric-Mean Policy Optimization" (arXiv 2507.20673), the GMPO objective
    and its clipping in log space (ε = 0.4); verl ``geo_mean``.
    """
    m = response_mask.to(logprobs.dtype)
    n = m.sum(dim=1, keepdim=True).clamp_min(1.0)
    adv_seq = (advantages * m).sum(dim=1, keepdim=True) / n
    sgn = torch.sign(adv_seq)
    delta = logprobs - old_logprobs
    delta_clipped = torch.clamp(delta, -cliprange, cliprange_high)
    token_log = sgn * torch.minimum(sgn * delta, sgn * delta_clipped)
    rho = torch.exp((token_log * m).sum(dim=1, keepdim=True) / n)
    clipped = (sgn * delta_clipped) < (sgn * delta)
    return (-adv_seq * rho).expand_as(logprobs), clipped, rho.expand_as(logprobs)


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
