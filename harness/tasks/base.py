"""What tasks share at run time: drawing a batch of training prompts from a fixed pool."""

from __future__ import annotations

import torch


def draw_prompt_rows(prompt_ids: torch.Tensor, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """Draw ``batch_size`` rows of the prompt pool ``prompt_ids`` (``[N, P]``): ``LongTensor[B, P]``.

    Without replacement when ``batch_size ≤ N`` (``randperm``), else with replacement (``randint``);
    reproducible given ``generator``'s state.

    Raises:
        ValueError: ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1 (got {batch_size})")
    n = prompt_ids.shape[0]
    if batch_size <= n:
        idx = torch.randperm(n, generator=generator)[:batch_size]
    else:
        idx = torch.randint(0, n, (batch_size,), generator=generator)
    return prompt_ids[idx]


__all__ = ["draw_prompt_rows"]
