"""A rollout engine apart from the trainer (``ppo.rollout_precision``), as an inference server samples for RL.

In production RL-for-LLM systems the responses are sampled by an inference engine (vLLM, SGLang) that holds its own
copy of the policy, in bf16 or FP8, synced from the trainer after every update; the trainer computes the update in
fp32 or bf16. Their token probabilities differ, so "on-policy" PPO is silently off-policy (Yao et al. 2025; Liu &
Li 2025). :class:`RolloutEngine` reproduces that on one machine:

* ``fp32``: an exact copy of the trainer's policy (the mismatch is 0; the negative control of a correction);
* ``bf16``: every weight in bfloat16, computed in bfloat16 (the logits are cast to fp32 before the temperature and
  the softmax, as vLLM's sampler does);
* ``bf16_fp32_head``: bf16, with the LM head's weight in fp32 and its input cast to fp32 (MiniMax-M1 §3; ScaleRL;
  TRL ``cast_lm_head_to_fp32``); a head tied to the input embedding is untied in the engine's copy;
* ``fp8``: the weights of every linear layer but the LM head rounded to ``float8_e4m3fn`` with one scale per output
  channel (``amax / 448``; weight-only FP8 as FP8 rollout serving quantizes a checkpoint), the model otherwise in
  bf16 (W8A16). The rounding is simulated (quantize, dequantize): CPUs have no FP8 matmul, and what the mismatch
  depends on is the rounded weights.

The engine samples the responses and returns its own log-probabilities (:meth:`RolloutEngine.logprobs`); the trainer
recomputes π_old in fp32 (:func:`harness.rl.ppo._forward_batch`), and the loop weights the policy loss by
``ppo.rollout_correction`` (:mod:`harness.rl.components.rollout_correction`), or, with ``ppo.rollout_bypass``, takes
the engine's log-probabilities as π_old (what a system without recomputation does).
"""

from __future__ import annotations

import copy
import time
from typing import Any, Iterator, Optional

import torch
from torch import nn

from harness.rl.components.rollout_correction import ROLLOUT_CORRECTIONS, mismatch_metrics
from harness.rl.components.whitening import masked_mean, masked_var
from harness.rl.rollout import _accepts_logits_to_keep, selective_log_softmax

#: The engine precisions (``ppo.rollout_precision``), in the order of the mismatch they are expected to give.
PRECISIONS: tuple[str, ...] = ("fp32", "bf16_fp32_head", "bf16", "fp8")
#: The largest finite value of ``float8_e4m3fn`` (the scale maps each channel's absolute maximum onto it).
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


def fp8_round(weight: torch.Tensor, out_dim: int = 0) -> torch.Tensor:
    """``weight`` rounded to ``float8_e4m3fn`` with one scale per output channel, returned dequantized in float32.

    Args:
        weight: a linear layer's weight (``[out, in]`` for ``nn.Linear``, ``out_dim`` 0; ``[in, out]`` for
            transformers' GPT-2 ``Conv1D``, ``out_dim`` 1). out_dim: the axis of the output channels.
    Returns:
        float32, ``weight``'s shape: ``q · s`` with ``s = amax(|W|) / 448`` over each output channel and
        ``q = fp8(W / s)`` (round to nearest even); a channel of zeros stays 0.
    Example: a channel (448, 1.3) → s = 1 → (448, 1.25) (e4m3 has 3 mantissa bits: 1.3 rounds to 1.25).
    Source: the per-channel weight scale of FP8 checkpoints served by vLLM (``fp8`` weight quantization) and of
    FP8 rollouts (arXiv 2510.26788 compares them with bf16); the e4m3 format of Micikevicius et al. 2022.
    """
    w = weight.float()
    reduce = [d for d in range(w.dim()) if d != out_dim]
    amax = w.abs().amax(dim=reduce, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (w / scale).to(torch.float8_e4m3fn).float() * scale


def _linear_weights(model: nn.Module) -> Iterator[tuple[str, nn.Parameter, int]]:
    """``(state-dict name, weight, out_dim)`` of every linear layer of ``model`` except its output head:
    ``nn.Linear`` (out_dim 0) and transformers' ``Conv1D`` (GPT-2's projections, weight ``[in, out]``: out_dim 1)."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    for name, module in model.named_modules():
        if module is head:
            continue
        if isinstance(module, nn.Linear):
            yield f"{name}.weight", module.weight, 0
        elif isinstance(module, Conv1D):
            yield f"{name}.weight", module.weight, 1


def _head_to_fp32(model: nn.Module) -> None:
    """Keep the LM head in fp32 inside a bf16 model: its weight untied from the input embedding (when tied) and
    cast, and a pre-hook that casts the final hidden state to fp32 before it."""
    head = model.get_output_embeddings()
    head.weight = nn.Parameter(head.weight.detach().clone().float(), requires_grad=False)
    if getattr(head, "bias", None) is not None:
        head.bias = nn.Parameter(head.bias.detach().clone().float(), requires_grad=False)
    head.register_forward_pre_hook(lambda _module, args: tuple(a.float() if torch.is_tensor(a) else a for a in args))


class RolloutEngine:
    """The engine's own copy of the policy at ``precision`` (:data:`PRECISIONS`), in eval mode, without gradients.

    Args:
        policy: the trainer's causal LM (``AutoModelForCausalLM``); copied, never modified.
        precision: one of :data:`PRECISIONS`.
    Raises:
        ValueError: an unknown ``precision`` (names the allowed ones).
    """

    def __init__(self, policy: nn.Module, precision: str) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"ppo.rollout_precision: unknown precision {precision!r}; choose from: {', '.join(PRECISIONS)}")
        self.precision = precision
        self.model = copy.deepcopy(policy).eval()
        self.model.requires_grad_(False)
        if precision != "fp32":
            self.model.to(torch.bfloat16)
        if precision == "bf16_fp32_head":
            _head_to_fp32(self.model)
        self.sync(policy)

    @torch.no_grad()
    def sync(self, policy: nn.Module) -> float:
        """Copy the trainer's weights into the engine (cast to the engine's dtypes; FP8-rounded for ``fp8``), as a
        trainer pushes its weights to the inference server after an update. Returns the seconds it took.

        Raises:
            KeyError: the engine's copy has a tensor the trainer's state dict lacks (a different architecture).
        """
        t0 = time.perf_counter()
        source = policy.state_dict()
        for name, tensor in self.model.state_dict().items():
            tensor.copy_(source[name])
        if self.precision == "fp8":
            for name, weight, out_dim in _linear_weights(self.model):  # rounded from the trainer's fp32 values
                weight.copy_(fp8_round(source[name], out_dim))
        return time.perf_counter() - t0

    @torch.no_grad()
    def logprobs(self, query_responses: torch.Tensor, context_length: int, temperature: float) -> torch.Tensor:
        """The engine's log π_engine of each response token: ``[B, T]`` float32, nats, at temperature τ.

        Args: query_responses ``[B, P + T]`` long; context_length ``P``; temperature τ > 0.
        The logits are cast to fp32 before they are divided by τ (the sampler's order), and only the response rows
        of the LM head are computed where the model allows (``logits_to_keep``)."""
        T = query_responses.shape[1] - context_length
        if _accepts_logits_to_keep(type(self.model)):
            logits = self.model(input_ids=query_responses, logits_to_keep=T + 1).logits[:, :-1]
        else:
            logits = self.model(input_ids=query_responses).logits[:, context_length - 1 : -1]
        return selective_log_softmax(logits.float() / temperature, query_responses[:, context_length:])


def correct(p: Any, logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor
            ) -> tuple[torch.Tensor, Optional[torch.Tensor], dict[str, float]]:
    """π_old for the update, the correction's per-token weights and the mismatch metrics of one rollout batch.

    Args:
        p: the ``PPOConfig`` (``rollout_correction``, ``rollout_bypass``, ``rollout_is_cap``, ``rollout_band_low``,
            ``rollout_band_high``). logprobs: ``[B, T]`` the trainer's fp32 log π_old. engine_logprobs: ``[B, T]``
            the engine's. mask: ``[B, T]`` the response mask.
    Returns:
        ``(old_logprobs, weights or None, metrics)``: decoupled (the default), π_old is the trainer's and the weights
        are ``ppo.rollout_correction``'s of ``log w = logprobs − engine_logprobs`` (None for ``none``); with
        ``ppo.rollout_bypass``, π_old is the engine's and there are no weights. ``metrics``:
        :func:`harness.rl.components.rollout_correction.mismatch_metrics`, ``rollout/weight_mean`` and
        ``rollout/weight_std`` (the mean and population SD of the weights over real tokens; 1 and 0 without weights:
        the SD is what sequence-level weights are said to raise).
    """
    metrics = mismatch_metrics(logprobs, engine_logprobs, mask, band=p.rollout_band_high)
    if p.rollout_bypass:
        return engine_logprobs, None, {**metrics, "rollout/weight_mean": 1.0, "rollout/weight_std": 0.0}
    weights = None
    if p.rollout_correction != "none":
        weights = ROLLOUT_CORRECTIONS.get(p.rollout_correction)(logprobs - engine_logprobs, mask, c=p.rollout_is_cap,
                                                                low=p.rollout_band_low, high=p.rollout_band_high)
    if weights is None:
        return logprobs, None, {**metrics, "rollout/weight_mean": 1.0, "rollout/weight_std": 0.0}
    mean_w, var_w = masked_mean(weights, mask), masked_var(weights, mask, unbiased=False)  # over real tokens
    return logprobs, weights, {**metrics, "rollout/weight_mean": mean_w.item(), "rollout/weight_std": var_w.sqrt().item()}


__all__ = ["PRECISIONS", "FP8_MAX", "fp8_round", "RolloutEngine", "correct"]
