"""Dropout in the policy, reference, critic and reward model: off (N+ detail 7) or as configured.

With dropout on, two forward passes of the same weights differ in ``train()`` mode, so the PPO
ratio is ≠ 1 and the KL is noisy before any update. ``off`` must therefore make training-mode
forwards deterministic. In transformers 5 the GPT-2 attention passes ``self.attn_dropout.p`` as a
float to the eager/sdpa kernel, and Llama-style attention passes a float attribute
``self.attention_dropout`` read from the config at construction time; zeroing ``nn.Dropout.p``
alone would miss the latter, so ``off`` also zeroes every float ``*dropout*`` / ``*pdrop*``
attribute of every submodule and of every model config.
"""

from __future__ import annotations

from typing import Protocol

from torch import nn

from harness.registry import Registry


class DropoutSetting(Protocol):
    """``fn(model) -> model`` with its dropout set (in place)."""

    def __call__(self, model: nn.Module) -> nn.Module: ...

DROPOUT: Registry = Registry("ppo.dropout", DropoutSetting, "dropout in the policy, reference, critic and RM")


def _is_dropout_name(name: str) -> bool:
    return "dropout" in name or "pdrop" in name


def _is_prob(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@DROPOUT.register("off")
def dropout_off(model: nn.Module) -> nn.Module:
    """Disable every dropout of ``model`` in place, in train and eval mode alike.

    Sets ``p = 0`` on every ``nn.Dropout*`` module, sets every numeric attribute whose name contains
    ``dropout`` or ``pdrop`` on any submodule to 0.0 (attention kernels take these as floats), and
    does the same on each submodule's ``config`` (so a saved model keeps dropout off).

    Args:
        model: any ``nn.Module`` (HF model or not).

    Returns:
        the same ``model``.

    Source: Huang et al. 2024 (N+), detail 7; TRL PPOTrainer ``disable_dropout_in_model``.
    """
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if _is_dropout_name(name) and _is_prob(value):
                setattr(module, name, 0.0)
        config = getattr(module, "config", None)
        if config is not None and not isinstance(config, nn.Module):
            for name, value in list(vars(config).items()):
                if _is_dropout_name(name) and _is_prob(value):
                    setattr(config, name, 0.0)
    return model


@DROPOUT.register("on")
def dropout_on(model: nn.Module) -> nn.Module:
    """Keep the model's configured dropout (active in ``train()`` forwards only, off in ``eval()``).

    Args:
        model: any ``nn.Module``.

    Returns:
        the same ``model``, unchanged.

    Source: the ablation of N+ detail 7 (dropout left as configured).
    """
    return model
