"""The EOS trick: truncate each sampled response after its first EOS, and penalize responses
that never emit one.

Source: Huang et al. 2024 ("The N+ implementation details of RLHF with PPO"), detail 23; TRL
``stop_token`` / ``missing_eos_penalty``. The mask is built from the EOS *position*, not from
``ids != pad``, so it stays correct when ``pad_token_id == eos_token_id`` (TRL bug #3750).
"""

from __future__ import annotations

import torch


def truncate_after_eos(
    response_ids: torch.Tensor, eos_token_id: int, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Replace every token after the first EOS with ``pad_token_id``.

    Args:
        response_ids: ``[B, T]`` sampled response token ids (prompt excluded).
        eos_token_id: the EOS id.
        pad_token_id: the id written after the first EOS (may equal ``eos_token_id``).

    Returns:
        ``(ids[B,T] long, response_mask[B,T] long, has_eos[B] bool)``: the mask is 1 up to and
        including the first EOS and 0 after it; a row without EOS keeps all ``T`` tokens (mask all
        ones, ``has_eos`` False).

    Source: N+ detail 23; TRL ``first_true_indices`` truncation.
    """
    T = response_ids.shape[1]
    is_eos = response_ids == eos_token_id
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, T - 1, dtype=torch.long))
    positions = torch.arange(T, device=response_ids.device)
    keep = positions.unsqueeze(0) <= first_eos.unsqueeze(1)
    ids = torch.where(keep, response_ids, torch.full_like(response_ids, pad_token_id))
    return ids, keep.long(), has_eos


def pad_based_mask(response_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """The response mask a trainer gets when it finds each response's end as its first pad token
    (TRL ≤ 1.12 PPOTrainer: ``sequence_length = first_true_indices(ids == pad) − 1``): 1 before the
    first ``pad_token_id``, 0 from it on; a row without one keeps every token.

    With ``pad_token_id == eos_token_id`` (a tokenizer whose pad token is its EOS) the first "pad" is
    the EOS itself: the EOS token falls out of the mask (its log-probability is never trained) and
    the score is read at the token before it. This is the failure of TRL issue #3750 made into a
    negative control (``ppo.pad_equals_eos``). A response whose first token is the EOS keeps that
    one token (TRL would read the score from the prompt's last token there).

    Args:
        response_ids: ``[B, T]`` truncated response ids (after :func:`truncate_after_eos`).
        pad_token_id: the id searched for.
    Returns:
        ``[B, T]`` long mask, a right-padded prefix with at least one 1 per row.

    Source: TRL ≤ 1.12 ``PPOTrainer`` (``first_true_indices``, ``get_reward``); huggingface/trl#3750;
    N+ (Huang et al. 2024) detail 23 (pad ≠ EOS).
    """
    T = response_ids.shape[1]
    is_pad = response_ids == pad_token_id
    first_pad = torch.where(is_pad.any(dim=1), is_pad.int().argmax(dim=1), torch.full_like(is_pad[:, 0], T, dtype=torch.long))
    length = first_pad.clamp_min(1)
    return (torch.arange(T, device=response_ids.device).unsqueeze(0) < length.unsqueeze(1)).long()


def apply_missing_eos_penalty(
    scores: torch.Tensor, has_eos: torch.Tensor, penalty: float | None
) -> torch.Tensor:
    """Replace the score of every response without EOS by exactly ``penalty``.

    Args:
        scores: ``[B]`` reward-model (or rule) scores.
        has_eos: ``[B]`` bool from :func:`truncate_after_eos`.
        penalty: the fixed score (N+ uses −1), or None to leave ``scores`` unchanged.

    Returns:
        ``[B]`` scores (a new tensor; the input is not modified).

    Source: N+ detail 23 / TRL ``missing_eos_penalty`` (replace semantics as in N+).
    """
    if penalty is None:
        return scores
    return torch.where(has_eos.bool(), scores, torch.full_like(scores, float(penalty)))


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each response: ``response_mask.sum(1) − 1``.

    Args:
        response_mask: ``[B, T]`` right-padded prefix mask (1 = real token).

    Returns:
        ``[B]`` long, in response coordinates (add the prompt length for full-sequence positions).

    Raises:
        ValueError: if a row has no real token.
    """
    lengths = response_mask.bool().sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("last_token_index: a response row has an all-zero mask (need at least 1 token)")
    return (lengths - 1).long()


def mask_extent(response_mask: torch.Tensor) -> int:
    """The number of leading columns of ``response_mask`` that hold any real token.

    Columns past it are padding in every row, so a causal model's outputs on the first columns, and
    every masked sum, mean or whitening over the batch, are the same with them cut off; the loop cuts
    them before its forward passes (after EOS truncation most of a ``T``-token batch can be padding).

    Args:
        response_mask: ``[B, T]`` 1 on real tokens, 0 on padding (any dtype).
    Returns:
        ``L`` in ``[1, T]``: one past the last column with a nonzero entry (1 for an all-zero mask).
    Raises:
        ValueError: ``response_mask`` is not 2-D.
    """
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T]; got shape {tuple(response_mask.shape)}")
    cols = response_mask.bool().any(0).nonzero()
    return int(cols.max()) + 1 if len(cols) else 1
