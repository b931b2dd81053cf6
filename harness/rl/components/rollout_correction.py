"""Corrections for the training–inference mismatch (``ppo.rollout_correction``) and its metrics.

When the responses are sampled by a rollout engine that is not the trainer (:mod:`harness.rl.engine`: bf16 or FP8
weights), the engine's token probabilities π_engine differ from the trainer's π_old and "on-policy" PPO is off-policy.
In the decoupled objective (Hilton et al. 2021; verl's ``rollout_corr`` in decoupled mode) the PPO ratio is taken
against the trainer's π_old, recomputed in fp32, and the off-policyness of the sample itself is corrected with the
per-token importance ratio

    w_t = π_old,trainer(y_t | x, y_<t) / π_engine(y_t | x, y_<t),      log w_t = logprobs_t − engine_logprobs_t,

with no gradient through ``w``. Uniform signature::

    fn(log_w[B,T], response_mask[B,T], *, c, low, high) -> weights[B,T] float, detached, 0 off the mask

The loop multiplies the per-token policy loss by ``weights`` before aggregating it with the minibatch's usual token
and sequence counts (so a token masked out adds 0 and the normaliser still counts it, as in IcePop's objective;
verl's rejection modes instead drop the rejected tokens from the loss mask, hence from the normaliser too: the two
differ by the kept fraction under ``token-mean``). The value loss and a KL loss are not weighted.

Sources: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (TIS: the
truncated weight min(w, C), C = 2); Ling Team 2025, Ring-1T / IcePop (the masked weight M(w) = w on [α, β] =
[0.5, 2], 0 outside; ``mis`` is its pure-rejection form, weight 1 inside); Liu & Li 2025, "When Speed Kills Stability" and Zheng et al. 2025 (arXiv 2512.01374 §2.3–2.4): the
sequence-level weight (the product of the token ratios, truncated) and the geometric-mean sequence mask. verl names
them ``rollout_is: token | sequence`` (truncated at ``rollout_is_threshold``) and ``rollout_rs: token | sequence |
geometric`` (rejection outside [lower, upper]).
"""

from __future__ import annotations

from typing import Protocol

import torch

from harness.registry import Registry


class RolloutCorrection(Protocol):
    """``fn(log_w[B,T], response_mask[B,T], *, c, low, high) -> weights[B,T]``."""

    def __call__(self, log_w: torch.Tensor, response_mask: torch.Tensor, *, c: float, low: float,
                 high: float) -> torch.Tensor: ...


ROLLOUT_CORRECTIONS: Registry = Registry("ppo.rollout_correction", RolloutCorrection,
                                         "how the policy loss corrects for the rollout engine's probabilities")


def _masked_log_w(log_w: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_w as float, 0 off the mask, detached; the mask as float)``."""
    m = response_mask.float()
    return (log_w.detach().float() * m), m


@ROLLOUT_CORRECTIONS.register("none")
def no_correction(log_w: torch.Tensor, response_mask: torch.Tensor, *, c: float, low: float,
                  high: float) -> torch.Tensor:
    """No correction: weight 1 on every real token (``response_mask`` as float); today's loop."""
    return response_mask.float()


@ROLLOUT_CORRECTIONS.register("tis")
def truncated_is(log_w: torch.Tensor, response_mask: torch.Tensor, *, c: float, low: float,
                 high: float) -> torch.Tensor:
    """Token-level truncated importance sampling: ``sg(min(w_t, c))`` on real tokens.

    Args: ``log_w``, ``response_mask``: ``[B, T]`` (nats; 1 = real token); ``c`` > 0 the cap (C = 2 in the source).
    Returns: ``[B, T]`` float in [0, c]. Example: log w = (log 3, 0, log ½) → (2, 1, ½).
    Source: Yao et al. 2025 (TIS, the ``min(π_fsdp/π_vllm, C)`` weight on the policy gradient); verl
    ``rollout_is=token``, TRL ``vllm_importance_sampling_mode="token_truncate"``.
    """
    lw, m = _masked_log_w(log_w, response_mask)
    return torch.exp(lw).clamp(max=c) * m


@ROLLOUT_CORRECTIONS.register("mis")
def masked_is(log_w: torch.Tensor, response_mask: torch.Tensor, *, c: float, low: float,
              high: float) -> torch.Tensor:
    """Token rejection outside a trust band: weight 1 where ``low ≤ w_t ≤ high``, 0 outside (no reweighting
    inside: the token is either trained on as sampled or not at all).

    Args: as :func:`truncated_is`; ``low < high`` the band ([0.5, 2] by default, IcePop's). Returns: ``[B, T]``
    float 0/1. Example: w = (3, 1, 0.4) with [0.5, 2] → (0, 1, 0).
    Source: verl ``rollout_rs=token`` (a token rejection mask between ``rollout_rs_threshold_lower`` and its upper
    threshold); the band is IcePop's. :func:`icepop` keeps the weight w inside the band instead.
    """
    lw, m = _masked_log_w(log_w, response_mask)
    w = torch.exp(lw)
    return ((w >= low) & (w <= high)).float() * m


@ROLLOUT_CORRECTIONS.register("icepop")
def icepop(log_w: torch.Tensor, response_mask: torch.Tensor, *, c: float, low: float,
           high: float) -> torch.Tensor:
    """IcePop's masked importance weight: ``sg(w_t)`` where ``low ≤ w_t ≤ high``, 0 outside.

    Args: as :func:`masked_is`. Returns: ``[B, T]`` float in {0} ∪ [low, high]. Example: w = (3, 1.5, 0.4) with
    [0.5, 2] → (0, 1.5, 0).
    Source: Ling Team 2025 (Ring-1T, IcePop: M(k) = k if k ∈ [α, β] else 0, α = 0.5, β = 2); TRL
    ``vllm_importance_sampling_mode="token_mask"`` (the weight w, set to 0 above its cap: one-sided there, two-sided
    here); OpenRLHF ``is_correction_type=icepop``.
    """
    lw, _ = _masked_log_w(log_w, response_mask)
    return torch.exp(lw) * masked_is(log_w, response_mask, c=c, low=low, high=high)  # w inside the band, 0 outside


@ROLLOUT_CORRECTIONS.register("seq_tis")
def sequence_truncated_is(log_w: torch.Tensor, response_mask: torch.Tensor, *, c: float, low: float,
                          high: float) -> torch.Tensor:
    """Sequence-level truncated importance sampling: every real token of row i weighted by
    ``sg(min(Π_t w_it, c))``, the product over the row's real tokens.

    Args: as :func:`truncated_is`. Returns: ``[B, T]`` float, constant along each row's real tokens.
    Example: a row with w = (2, 2, ½) → product 2 → weight min(2, c); with c = 2: (2, 2, 2).
    Source: Liu & Li 2025, "When Speed Kills Stability" (the sequence-level IS weight, truncated); Zheng et al.
    2025 (arXiv 2512.01374 §2.3); verl ``rollout_is=sequence``, TRL ``vllm_importance_sampling_mode="sequence_truncate"``.
    """
    lw, m = _masked_log_w(log_w, response_mask)
    seq = torch.exp(lw.sum(1).clamp(max=torch.log(torch.tensor(float(c))).item()))  # clamp in log space: no overflow
    return seq[:, None] * m


@ROLLOUT_CORRECTIONS.register("seq_mask")
def geometric_sequence_mask(log_w: torch.Tensor, response_mask: torch.Tensor, *, c: float, low: float,
                            high: float) -> torch.Tensor:
    """Geometric sequence masking: a row whose geometric-mean token ratio ``exp(mean_t log w_t)`` lies outside
    ``[low, high]`` is masked whole (weight 0 on every token), otherwise kept with weight 1.

    Args: as :func:`masked_is`. Returns: ``[B, T]`` float 0/1, constant along each row. A row with no real token
    is kept (its weights are 0 off the mask anyway). Example: w = (4, 1) → geometric mean 2 → kept on [0.5, 2];
    w = (4, 4) → 4 → masked.
    Source: Zheng et al. 2025 (arXiv 2512.01374 §2.4, the geometric mean of the ratios as a length-independent
    sequence statistic); verl ``rollout_rs=geometric``.
    """
    lw, m = _masked_log_w(log_w, response_mask)
    geo = lw.sum(1) / m.sum(1).clamp(min=1)
    keep = (geo >= torch.log(torch.tensor(float(low)))) & (geo <= torch.log(torch.tensor(float(high))))
    return keep.float()[:, None] * m


def mismatch_metrics(logprobs: torch.Tensor, engine_logprobs: torch.Tensor, response_mask: torch.Tensor,
                     band: float = 2.0) -> dict[str, float]:
    """How far the engine's token log-probabilities are from the trainer's, on the engine's own samples.

    Args:
        logprobs: ``[B, T]`` the trainer's log π_old (nats). engine_logprobs: ``[B, T]`` the engine's log π_engine
        of the same tokens. response_mask: ``[B, T]`` 1 on real tokens. band: C of the ratio band [1/C, C].
    Returns:
        ``rollout/mismatch_abs_mean`` and ``rollout/mismatch_abs_max`` (per token |log π_old − log π_engine|, nats),
        ``rollout/seq_log_ratio`` (mean over rows of Σ_t log w_t) and ``rollout/seq_log_ratio_abs`` (mean of its
        absolute value), ``rollout/kl_engine_trainer`` (KL(π_engine ‖ π_old) per token by Schulman's k3 estimator on
        the engine's samples: mean of ``w − 1 − log w``, ≥ 0, unbiased), and ``rollout/outside_band`` (fraction of
        real tokens with w outside [1/band, band]). All 0 when the two agree exactly.
    Raises:
        ValueError: the mask has no real token.
    """
    m = response_mask.float()
    n = m.sum()
    if n <= 0:
        raise ValueError("mismatch_metrics: the response mask has no real token")
    lw = (logprobs.float() - engine_logprobs.float()) * m
    seq = lw.sum(1)
    k3 = (torch.exp(lw) - 1 - lw) * m
    outside = (lw.abs() > torch.log(torch.tensor(float(band)))).float() * m
    return {"rollout/mismatch_abs_mean": (lw.abs().sum() / n).item(), "rollout/mismatch_abs_max": lw.abs().max().item(),
            "rollout/seq_log_ratio": seq.mean().item(), "rollout/seq_log_ratio_abs": seq.abs().mean().item(),
            "rollout/kl_engine_trainer": (k3.sum() / n).item(), "rollout/outside_band": (outside.sum() / n).item()}


#: The per-iteration metrics of a run with a rollout engine (:func:`mismatch_metrics` and the weight sync).
MISMATCH_METRICS: tuple[str, ...] = ("rollout/mismatch_abs_mean", "rollout/mismatch_abs_max", "rollout/seq_log_ratio",
                                     "rollout/seq_log_ratio_abs", "rollout/kl_engine_trainer", "rollout/outside_band",
                                     "rollout/weight_mean", "rollout/weight_std", "time/sync")


__all__ = ["ROLLOUT_CORRECTIONS", "RolloutCorrection", "no_correction", "truncated_is", "masked_is", "icepop",
           "sequence_truncated_is", "geometric_sequence_mask", "mismatch_metrics", "MISMATCH_METRICS"]
