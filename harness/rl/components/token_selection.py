"""Which response tokens carry the policy gradient (``ppo.token_selection``).

Uniform signature::

    fn(entropy[B,T], response_mask[B,T], *, rho) -> selected[B,T] float (1: the token's policy loss counts)

The loop multiplies the per-token policy loss by ``selected`` before aggregating it with the usual counts of the
minibatch (so an unselected token adds 0 and the normaliser still counts every real token, as in Wang et al.'s
objective and TRL's ``top_entropy_quantile``). The value loss and a KL loss keep every token.

``entropy`` is the per-token entropy of π_old at the sampling temperature, computed once per rollout batch over the
whole batch (the quantile is the batch's, Wang et al.'s τ^B_ρ); TRL takes it from the update's forward per
micro-batch, which on the first minibatch is the same policy.
"""

from __future__ import annotations

from typing import Protocol

import torch

from harness.registry import Registry


class TokenSelection(Protocol):
    """``fn(entropy[B,T], response_mask[B,T], *, rho) -> selected[B,T]`` (float 0/1)."""

    def __call__(self, entropy: torch.Tensor, response_mask: torch.Tensor, *, rho: float) -> torch.Tensor: ...


TOKEN_SELECTIONS: Registry = Registry("ppo.token_selection", TokenSelection,
                                      "which response tokens carry the policy gradient")


def entropy_threshold(entropy: torch.Tensor, response_mask: torch.Tensor, rho: float) -> torch.Tensor:
    """The ``(1 − rho)`` quantile (linear interpolation, ``torch.quantile``) of the entropies of the real tokens:
    0-dim, in nats. Raises ValueError for ``rho`` outside (0, 1) or a mask with no real token."""
    if not 0.0 < rho < 1.0:
        raise ValueError(f"ppo.entropy_rho must be in (0, 1) (got {rho})")
    valid = entropy[response_mask.bool()].float()
    if valid.numel() == 0:
        raise ValueError("token selection: the response mask has no real token")
    return torch.quantile(valid, 1.0 - rho)


@TOKEN_SELECTIONS.register("all")
def all_tokens(entropy: torch.Tensor, response_mask: torch.Tensor, *, rho: float) -> torch.Tensor:
    """Every real token (the standard policy gradient): ``response_mask`` as float. ``entropy``, ``rho`` ignored."""
    return response_mask.float()


@TOKEN_SELECTIONS.register("top_entropy")
def top_entropy(entropy: torch.Tensor, response_mask: torch.Tensor, *, rho: float) -> torch.Tensor:
    """The high-entropy "forking" tokens: real tokens whose entropy is ≥ the batch's ``(1 − rho)`` quantile
    (:func:`entropy_threshold`), about the top ``rho`` of them (ρ = 0.2 in the paper).

    Args: ``entropy``, ``response_mask``: ``[B, T]`` (nats; 1 = real token); ``rho`` in (0, 1).
    Returns: ``[B, T]`` float 0/1. Raises: ValueError as :func:`entropy_threshold`.

    Source: Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL for LLM
    Reasoning" (arXiv 2506.01939) §5, the objective with I[H_t ≥ τ^B_ρ]; TRL ``top_entropy_quantile``
    (``entropies >= quantile(entropies, 1 − ρ)``).
    """
    keep = (entropy >= entropy_threshold(entropy, response_mask, rho)) & response_mask.bool()
    return keep.float()


@TOKEN_SELECTIONS.register("bottom_entropy")
def bottom_entropy(entropy: torch.Tensor, response_mask: torch.Tensor, *, rho: float) -> torch.Tensor:
    """The complement of :func:`top_entropy` among the real tokens (the low-entropy ~``1 − rho``): the paper's
    control that trains on the bottom 80% only.

    Args / Returns / Raises: as :func:`top_entropy`. Source: Wang et al. 2025 (arXiv 2506.01939) §5, the bottom-80%
    ablation.
    """
    keep = (entropy < entropy_threshold(entropy, response_mask, rho)) & response_mask.bool()
    return keep.float()
