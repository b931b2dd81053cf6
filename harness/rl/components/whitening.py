"""Masked statistics and whitening over the response tokens of a whole rollout batch.

Padding entries (``mask == 0``) never enter a statistic, even when they hold NaN or inf.
Source: TRL ``core.masked_mean / masked_var / masked_whiten`` conventions (unbiased variance,
``shift_mean=False`` adds the mean back so only the scale changes).
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is non-zero.

    Args:
        x: ``[B, T]`` (any shape) values.
        mask: same shape as ``x``; 1/True = include.
        dim: reduce over this dim, or over every entry when ``None``.

    Returns:
        A scalar (``dim=None``) or the tensor reduced along ``dim``. An empty selection gives NaN.
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return total.sum() / m.sum().to(x.dtype)
    return total.sum(dim) / m.sum(dim).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over every masked entry (one scalar for the whole tensor).

    ``var = Σ M·(x − mean)² / (n − 1)`` (``/ n`` when ``unbiased=False``), ``n = Σ M``.

    Args:
        x: ``[B, T]`` values.
        mask: ``[B, T]``, 1/True = include.
        unbiased: Bessel's correction.

    Raises:
        ValueError: if the mask selects no entry, or a single entry while ``unbiased``.
    """
    n = int(mask.bool().sum())
    if n == 0 or (unbiased and n < 2):
        raise ValueError(f"masked_var: the mask selects {n} entries; need at least {2 if unbiased else 1}")
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean).square(), mask)
    if unbiased:
        var = var * n / (n - 1)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Whiten ``x`` with the mean and unbiased variance of its masked entries.

    ``w = (x − mean) / sqrt(var + eps)``; when ``shift_mean=False`` the mean is added back
    (``w + mean``: the values are only rescaled around their mean, TRL's reward-whitening
    convention, which keeps the sign of a mostly-positive or mostly-negative reward). Padding is 0.

    Args:
        x: ``[B, T]`` values (advantages or per-token rewards).
        mask: ``[B, T]`` response mask.
        shift_mean: subtract the mean (True) or keep it (False).
        eps: added to the variance.

    Returns:
        ``[B, T]`` whitened values, 0 where ``mask == 0``.

    Raises:
        ValueError: if the mask selects fewer than 2 entries.

    Source: TRL ``masked_whiten``; N+ (Huang et al. 2024) advantage whitening over the batch.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros((), dtype=whitened.dtype, device=whitened.device))
