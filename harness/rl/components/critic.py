"""Where the critic (value model) starts: from the reward model (N+) or from the SFT policy.

Each variant is ``fn(sft_dir, rm_dir, device, *, seed=None) -> nn.Module`` and builds an
``AutoModelForSequenceClassification`` with ``num_labels=1`` (same backbone, one scalar head) on
``device``, in the ``eval()`` mode ``from_pretrained`` leaves it in (the loop switches modes). If the
config has no ``pad_token_id``, it is taken from the tokenizer saved in the same directory, if any. Per-token values are read with ``harness.rl.models.scalar_head_outputs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from harness.errors import HarnessError
from harness.registry import Registry

class CriticInit(Protocol):
    """``fn(sft_dir, rm_dir, device, *, seed) -> critic`` (a scalar-head model)."""

    def __call__(self, sft_dir: str, rm_dir: str, device: torch.device | str = "cpu", *, seed: int | None = None
                 ) -> nn.Module: ...


CRITIC_INIT: Registry = Registry("ppo.critic_init", CriticInit, "where the critic's weights come from")


def _load_scalar(path: str, device: torch.device | str, seed: int | None) -> nn.Module:
    """Load ``path`` as a 1-label sequence classifier; a missing head is initialised under ``seed``."""
    if not Path(path).is_dir():
        raise HarnessError(f"critic init: model directory not found: {path}")
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    if model.config.pad_token_id is None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):
            tokenizer = None
        if tokenizer is not None and tokenizer.pad_token_id is not None:
            model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device)


@CRITIC_INIT.register("reward_model")
def from_reward_model(
    sft_dir: str, rm_dir: str, device: torch.device | str = "cpu", *, seed: int | None = None
) -> nn.Module:
    """Critic = a copy of the trained reward model (backbone and scalar head).

    Args:
        sft_dir: unused.
        rm_dir: directory of the saved reward model (``save_pretrained``).
        device: where to put the critic.
        seed: unused (nothing is freshly initialised); accepted for a uniform signature.

    Returns:
        ``AutoModelForSequenceClassification`` (num_labels=1).

    Raises:
        HarnessError: if ``rm_dir`` does not exist.

    Source: Huang et al. 2024 (N+), critic initialised from the RM; Zheng et al. 2023 (PPO-max).
    """
    return _load_scalar(rm_dir, device, seed)


@CRITIC_INIT.register("policy")
def from_policy(
    sft_dir: str, rm_dir: str, device: torch.device | str = "cpu", *, seed: int | None = None
) -> nn.Module:
    """Critic = the SFT causal-LM backbone plus a freshly initialised scalar head (``score``).

    The LM head is dropped; ``score`` gets the model's standard init, drawn under ``seed`` when
    given (the global RNG is left untouched either way).

    Args:
        sft_dir: directory of the saved SFT causal LM.
        rm_dir: unused.
        device: where to put the critic.
        seed: seed for the new head's initialisation (None: the current global RNG state).

    Returns:
        ``AutoModelForSequenceClassification`` (num_labels=1).

    Raises:
        HarnessError: if ``sft_dir`` does not exist.

    Source: verl / OpenRLHF default (critic from the actor's checkpoint).
    """
    return _load_scalar(sft_dir, device, seed)
