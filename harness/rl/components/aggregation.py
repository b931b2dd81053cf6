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
    """``fn(loss_mat[B,T], mask[B,T], num_tokens, num_seqs, max_len, group_lengths) -> 0-dim loss``;
    ``group_lengths`` is ``[B]`` or None (see :func:`agg_loss`)."""

    def __call__(self, loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len,
                 group_lengths=None) -> torch.Tensor: ...

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
def token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len,
               group_lengths=None) -> torch.Tensor:
    """``Σ L·M / num_tokens``: every token weighs the same.

    ``loss_mat``, ``mask``: ``[B, T]``; counts as in :func:`agg_loss`. Returns a 0-dim tensor.
    Source: TRL PPO, N+, DAPO (Yu et al. 2025) token-level loss.
    """
    return _masked(loss_mat, mask).sum() / num_tokens


@LOSS_AGG.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len,
                        group_lengths=None) -> torch.Tensor:
    """``Σ_i (Σ_t L·M / Σ_t M) / num_seqs``: per-sequence mean, then mean over sequences.

    ``loss_mat``, ``mask``: ``[B, T]``; a row with no token contributes 0. Returns a 0-dim tensor.
    Source: original GRPO (Shao et al. 2024) eq. 3.
    """
    seq_tokens = mask.bool().sum(dim=1).clamp(min=1).to(loss_mat.dtype)
    return (_masked(loss_mat, mask).sum(dim=1) / seq_tokens).sum() / num_seqs


@LOSS_AGG.register("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len,
                       group_lengths=None) -> torch.Tensor:
    """``Σ L·M / num_seqs``: per-sequence sum, mean over sequences.

    ``loss_mat``, ``mask``: ``[B, T]``. Returns a 0-dim tensor. Source: verl ``seq-mean-token-sum``.
    """
    return _masked(loss_mat, mask).sum() / num_seqs


@LOSS_AGG.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len,
                            group_lengths=None) -> torch.Tensor:
    """``Σ L·M / (num_seqs·max_len)`` with a constant ``max_len`` (no length bias).

    ``loss_mat``, ``mask``: ``[B, T]``. Returns a 0-dim tensor. Source: Dr. GRPO (Liu et al. 2025).
    """
    return _masked(loss_mat, mask).sum() / (num_seqs * max_len)


@LOSS_AGG.register("prompt-mean")
def prompt_mean(loss_mat: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs, max_len,
                group_lengths=None) -> torch.Tensor:
    """``Σ_i (Σ_t L·M) / ℓ_g(i) / num_seqs``, with ``ℓ_g(i)`` = ``group_lengths[i]``, the mean response length of
    row ``i``'s group (its prompt's responses) over the whole rollout batch: on a minibatch of whole groups this is
    the mean over prompts of each group's token-summed loss over the group's token count (every prompt weighs the
    same, and within a prompt every token). On a minibatch of shuffled rows it is the same weighting applied to the
    rows present (each row keeps its full-batch weight). Without groups (``group_lengths`` None, or groups of one
    response) it is :func:`seq_mean_token_mean`.

    ``loss_mat``, ``mask``: ``[B, T]``; ``group_lengths``: ``[B]`` tokens, > 0. Returns a 0-dim tensor.
    Source: Khatri et al. 2025, "The Art of Scaling Reinforcement Learning Compute for LLMs" (ScaleRL, arXiv
    2510.13786), prompt-level loss averaging.
    """
    if group_lengths is None:
        return seq_mean_token_mean(loss_mat, mask, num_tokens, num_seqs, max_len)
    per_row = _masked(loss_mat, mask).sum(dim=1) / group_lengths.to(loss_mat.dtype).clamp(min=1e-12)
    return per_row.sum() / num_seqs


def group_mean_lengths(response_mask: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B]``: each row's group mean response length (tokens), groups being consecutive blocks of ``group_size``
    rows (one prompt each) of the ``[B, T]`` rollout mask; a group with no token gets 1 (its rows add 0 anyway).

    Example: mask rows of lengths 2, 4 with ``group_size`` 2 → ``[3., 3.]``. Raises ValueError when ``group_size``
    does not divide B.
    """
    B = response_mask.shape[0]
    if group_size < 1 or B % group_size:
        raise ValueError(f"prompt-mean: batch size {B} must be a multiple of group_size ({group_size})")
    lengths = response_mask.bool().sum(dim=1).to(torch.float32).view(B // group_size, group_size)
    return lengths.mean(dim=1).clamp(min=1.0).repeat_interleave(group_size)


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: int | float | torch.Tensor | None = None,
    num_seqs: int | None = None,
    max_len: int | None = None,
    group_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar with the registered ``mode``.

    Args:
        loss_mat: ``[B, T]`` per-token losses (padding may hold anything, even NaN).
        mask: ``[B, T]`` response mask (1 = real token).
        mode: one of ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum``,
            ``seq-mean-token-sum-norm``, ``prompt-mean``.
        num_tokens: masked-token count of the whole minibatch (default: ``mask.sum()`` of this tensor).
        num_seqs: sequence count of the whole minibatch (default: ``B``).
        max_len: the constant ``T_max`` of ``seq-mean-token-sum-norm`` (default: ``T``).
        group_lengths: ``[B]`` the mean response length of each row's group (:func:`group_mean_lengths`), read by
            ``prompt-mean`` only (None: no groups).

    Returns:
        0-dim tensor.

    Raises:
        UnknownComponentError: for an unknown ``mode`` (lists the registered modes).

    Source: verl ``core_algos.agg_loss`` (the first four modes; verl has no prompt-level mode).
    """
    fn = LOSS_AGG.get(mode)
    if num_tokens is None:
        num_tokens = mask.bool().sum().to(loss_mat.dtype)
    if num_seqs is None:
        num_seqs = loss_mat.shape[0]
    if max_len is None:
        max_len = loss_mat.shape[1]
    return fn(loss_mat, mask, num_tokens, num_seqs, max_len, group_lengths)
