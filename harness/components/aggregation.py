"""Loss aggregation: how a per-token loss matrix becomes one scalar.

``agg_loss(loss_mat, mask, mode)`` with the four verl ``loss_agg_mode`` modes. For gradient
accumulation, pass the *whole minibatch's* ``num_tokens`` / ``num_seqs``: then summing the
micro-batch results equals the full-minibatch value exactly (DAPO / verl global-token normalization).
"""

from __future__ import annotations

from typing import Protocol

import torch

from harness.registry import Registry


class LossAggregation(Protocol):
    """``fn(loss_mat[B,T], mask[B,T], num_tokens, num_seqs, max_len) -> 0-dim loss``."""

    def __call__(self, loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len) -> torch.Tensor: ...

LOSS_AGG: Registry = Registry("ppo.loss_agg", LossAggregation, "how a per-token loss matrix becomes one scalar")

#: TRL ``GRPOConfig.loss_type`` names as aliases of the aggregation they mean (``ppo.loss_type`` in a config sets
#: ``ppo.loss_agg``). TRL: ``grpo`` averages each sequence's tokens, then the sequences; ``bnpo`` averages the
#: tokens of the (local) batch; ``dapo`` averages the tokens of the whole accumulated batch (one process here, so
#: the same as ``bnpo``); ``dr_grpo`` divides the token sum by batch size × the maximum completion length. TRL's
#: advantage scaling is a separate knob (``scale_rewards``: ``group`` → ``adv_estimator: grpo``, ``batch`` →
#: ``grpo_batch_std``, ``none`` → ``dr_grpo``), and so it is here.
LOSS_TYPE_ALIASES: dict[str, str] = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}


def resolve_loss_type(ppo: dict) -> dict:
    """A raw ``ppo`` config mapping with TRL's ``loss_type`` replaced by the ``loss_agg`` it names
    (:data:`LOSS_TYPE_ALIASES`); a mapping without ``loss_type`` comes back unchanged.

    Raises:
        ValueError: ``loss_type`` not one of the aliases (names the allowed ones), or ``loss_agg`` also given and
            different from the alias's.
    """
    if not isinstance(ppo, dict) or "loss_type" not in ppo:
        return ppo
    out = dict(ppo)
    name = out.pop("loss_type")
    if name not in LOSS_TYPE_ALIASES:
        raise ValueError(f"ppo.loss_type: {name!r} is not a TRL loss_type alias; allowed: "
                         f"{', '.join(LOSS_TYPE_ALIASES)}")
    agg = LOSS_TYPE_ALIASES[name]
    if "loss_agg" in out and out["loss_agg"] != agg:
        raise ValueError(f"ppo.loss_type {name!r} means ppo.loss_agg {agg!r}, but ppo.loss_agg is "
                         f"{out['loss_agg']!r}; give one of the two")
    out["loss_agg"] = agg
    return out


def _masked(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))


@LOSS_AGG.register("token-mean")
def token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len) -> torch.Tensor:
    """``Σ L·M / num_tokens``: every token weighs the same.

    ``loss_mat``, ``mask``: ``[B, T]``; counts as in :func:`agg_loss`. Returns a 0-dim tensor.
    Source: TRL PPO, N+, DAPO (Yu et al. 2025) token-level loss.
    """
    return _masked(loss_mat, mask).sum() / num_tokens


@LOSS_AGG.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len) -> torch.Tensor:
    """``Σ_i (Σ_t L·M / Σ_t M) / num_seqs``: per-sequence mean, then mean over sequences.

    ``loss_mat``, ``mask``: ``[B, T]``; a row with no token contributes 0. Returns a 0-dim tensor.
    Source: original GRPO (Shao et al. 2024) eq. 3.
    """
    seq_tokens = mask.bool().sum(dim=1).clamp(min=1).to(loss_mat.dtype)
    return (_masked(loss_mat, mask).sum(dim=1) / seq_tokens).sum() / num_seqs


@LOSS_AGG.register("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len) -> torch.Tensor:
    """``Σ L·M / num_seqs``: per-sequence sum, mean over sequences.

    ``loss_mat``, ``mask``: ``[B, T]``. Returns a 0-dim tensor. Source: verl ``seq-mean-token-sum``.
    """
    return _masked(loss_mat, mask).sum() / num_seqs


@LOSS_AGG.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len) -> torch.Tensor:
    """``Σ L·M / (num_seqs·max_len)`` with a constant ``max_len`` (no length bias).

    ``loss_mat``, ``mask``: ``[B, T]``. Returns a 0-dim tensor. Source: Dr. GRPO (Liu et al. 2025).
    """
    return _masked(loss_mat, mask).sum() / (num_seqs * max_len)


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: int | float | torch.Tensor | None = None,
    num_seqs: int | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar with the registered ``mode``.

    Args:
        loss_mat: ``[B, T]`` per-token losses (padding may hold anything, even NaN).
        mask: ``[B, T]`` response mask (1 = real token).
        mode: one of ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum``,
            ``seq-mean-token-sum-norm``.
        num_tokens: masked-token count of the whole minibatch (default: ``mask.sum()`` of this tensor).
        num_seqs: sequence count of the whole minibatch (default: ``B``).
        max_len: the constant ``T_max`` of ``seq-mean-token-sum-norm`` (default: ``T``).

    Returns:
        0-dim tensor.

    Raises:
        UnknownComponentError: for an unknown ``mode`` (lists the registered modes).

    Source: verl ``core_algos.agg_loss`` (same four modes).
    """
    fn = LOSS_AGG.get(mode)
    if num_tokens is None:
        num_tokens = mask.bool().sum().to(loss_mat.dtype)
    if num_seqs is None:
        num_seqs = loss_mat.shape[0]
    if max_len is None:
        max_len = loss_mat.shape[1]
    return fn(loss_mat, mask, num_tokens, num_seqs, max_len)
