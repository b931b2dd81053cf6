"""Loading models and tokenizers, and reading scalar heads (reward model, critic).

All loads are local ``from_pretrained`` calls; nothing is fetched from a hub unless a hub id is
given explicitly and the machine is online.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerFast

from harness.errors import HarnessError

# "owner/name" or "name" with the characters the hub allows; anything else is a local path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def resolve_device(name: str = "auto") -> tuple[torch.device, torch.dtype | None]:
    """Map a config device name to ``(device, autocast_dtype)``.

    ``"auto"`` → ``(cuda, bfloat16)`` if CUDA is available, else ``(cpu, None)``; ``"cpu"`` →
    ``(cpu, None)`` (bf16 is ~4x slower than fp32 on the CPUs we measured); ``"cuda"`` → ``(cuda, bfloat16)``.

    Raises:
        HarnessError: ``"cuda"`` requested but CUDA is not available, or an unknown name.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu"), None
    if name == "cuda":
        if not torch.cuda.is_available():
            raise HarnessError("device=cuda requested but CUDA is not available; use device=cpu or device=auto")
        return torch.device("cuda"), torch.bfloat16
    raise HarnessError(f"unknown device {name!r}; choose from: auto, cpu, cuda")


def _check_path(path_or_id: str | Path, what: str) -> str:
    s = str(path_or_id)
    if Path(s).exists():
        return s
    looks_local = s.startswith((".", "/", "~")) or s.count("/") > 1 or not _HUB_ID.match(s)
    if looks_local:
        raise HarnessError(f"{what} path not found: {s}")
    return s


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """``AutoTokenizer.from_pretrained(path)`` (a local dir saved with ``save_pretrained``).

    Raises:
        HarnessError: the path does not exist (message names it).
    """
    p = _check_path(path, "tokenizer")
    try:
        return AutoTokenizer.from_pretrained(p)
    except OSError as e:
        raise HarnessError(f"cannot load tokenizer from {p}: {str(e).splitlines()[0]}") from None


def load_policy(path_or_id: str | Path, device: torch.device | str = "cpu") -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path_or_id)`` in float32 on ``device``, in eval mode.

    Raises:
        HarnessError: ``"model path not found: ..."`` for a local-looking path that does not exist, or
        a one-line reason when loading fails.
    """
    p = _check_path(path_or_id, "model")
    try:
        model = AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)
    except OSError as e:
        raise HarnessError(f"cannot load causal LM from {p}: {str(e).splitlines()[0]}") from None
    return model.to(device).eval()


#: The logit the LM head gives a suppressed token (:func:`suppress_tokens`): finite, so that softmax, log-softmax
#: and entropy stay free of NaNs (``0 · log 0`` terms are ``0 · (−1e4 − lse)`` = 0), and far enough below any real
#: logit that ``exp`` underflows to exactly 0 in float32 and bfloat16 at any temperature below ~90. Not lower: where a
#: response is cut at EOS, the positions after it hold padding (a suppressed token) whose log-probability the loop
#: computes and masks; at −1e4 float32 resolves it to 0.001 nats, so the ratio and KL estimators there stay finite
#: (at −1e9 the spacing is 64 nats, and a ratio ``exp(±128)`` overflows to inf, whose masked gradient is NaN).
SUPPRESSED_LOGIT = -1e4


def hidden_special_ids(tokenizer: Any, *, ends_at_eos: bool) -> list[int]:
    """The special-token ids a response's text would hide, to pass to :func:`suppress_tokens`.

    Decoding skips special tokens and the gold reads the decoded text, so a special token inside a response is
    invisible to the gold and the samples but counts in its length (a policy can pad a fixed-length response with
    them to hide a short answer). Where responses end at their first EOS (``ppo.truncate_after_eos`` or
    ``eval.truncate_after_eos``: cut in training, or measured by where the EOS falls), EOS is the response's end and
    stays allowed; every other special token (padding) is hidden, and so is EOS where responses never end there.

    Args:
        tokenizer: a ``transformers`` tokenizer (``all_special_ids``, ``eos_token_id``).
        ends_at_eos: responses are cut after their first EOS.
    Returns:
        sorted ids: ``all_special_ids``, without ``eos_token_id`` when ``ends_at_eos``.
    Raises:
        HarnessError: ``ends_at_eos`` and the tokenizer has no EOS token.
    """
    eos = tokenizer.eos_token_id
    if ends_at_eos and eos is None:
        raise HarnessError("responses end at EOS (truncate_after_eos), but the tokenizer has no eos_token_id")
    return sorted({int(i) for i in tokenizer.all_special_ids} - ({int(eos)} if ends_at_eos else set()))


def suppress_tokens(model: torch.nn.Module, token_ids: list[int]) -> Any:
    """Make ``model`` (a causal LM) never emit ``token_ids``: a forward hook on its LM head sets those columns of the
    logits ``[..., V]`` to :data:`SUPPRESSED_LOGIT` on every forward pass (sampling with a KV cache, scoring with
    ``logits_to_keep``, the update's forward), so ``softmax(logits / τ)`` is the distribution renormalised over the
    other tokens: the suppressed tokens get probability exactly 0 and their gradient is 0. As transformers'
    ``SuppressTokensLogitsProcessor`` does for generation, but inside the model, so that the log-probabilities,
    the KL to the reference and the entropy the loop computes are those of the distribution it samples from.

    Args:
        model: a causal LM whose ``get_output_embeddings()`` returns the LM head.
        token_ids: vocabulary ids to suppress (e.g. the tokenizer's ``all_special_ids``).
    Returns:
        the hook's handle (``.remove()`` undoes it).
    Raises:
        HarnessError: the model has no output embeddings, or an id lies outside its vocabulary.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise HarnessError(f"cannot suppress tokens: {type(model).__name__} has no LM head (get_output_embeddings)")
    vocab = head.weight.shape[0]
    bad = [int(i) for i in token_ids if not 0 <= int(i) < vocab]
    if bad:
        raise HarnessError(f"cannot suppress tokens {bad}: outside the vocabulary of {vocab} ids")
    index = torch.tensor(sorted({int(i) for i in token_ids}), dtype=torch.long, device=head.weight.device)

    def hook(module: torch.nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return output.index_fill(-1, index.to(output.device), SUPPRESSED_LOGIT)

    return head.register_forward_hook(hook)


def load_scalar_model(path: str | Path, device: torch.device | str = "cpu") -> torch.nn.Module:
    """``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)`` in float32 on ``device``, eval mode.

    Used for the reward model and the critic (a backbone plus a linear ``score`` head to one scalar).

    Raises:
        HarnessError: the path does not exist, or loading fails (one line).
    """
    p = _check_path(path, "model")
    try:
        model = AutoModelForSequenceClassification.from_pretrained(p, num_labels=1, dtype=torch.float32)
    except OSError as e:
        raise HarnessError(f"cannot load scalar model from {p}: {str(e).splitlines()[0]}") from None
    return model.to(device).eval()


def use_fused_gelu(model: torch.nn.Module) -> int:
    """Swap every ``gelu_new`` activation module of ``model`` for PyTorch's fused tanh GELU, in place.

    GPT-2's ``gelu_new`` is ``0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`` written as five
    elementwise tensor ops; ``torch.nn.functional.gelu(x, approximate="tanh")`` is the same function
    in one kernel (outputs differ by at most ~2e-7 in fp32, not bit-identical). On CPU it was 4.4×
    faster in isolation and took ~16 % off a PPO iteration of the tiny GPT-2 (``make bench``).
    ``model.config.activation_function`` is updated to match, so a saved copy reloads the same way.

    Args:
        model: any ``nn.Module``; modules that are not ``gelu_new`` are left alone.
    Returns:
        The number of activation modules replaced (0 for models without ``gelu_new``).
    """
    from transformers.activations import ACT2FN, NewGELUActivation

    replaced = 0
    for module in model.modules():
        for name, child in list(module.named_children()):
            if isinstance(child, NewGELUActivation):
                setattr(module, name, ACT2FN["gelu_pytorch_tanh"])
                replaced += 1
    config = getattr(model, "config", None)
    if replaced and getattr(config, "activation_function", None) == "gelu_new":
        config.activation_function = "gelu_pytorch_tanh"
    return replaced


def scalar_head_outputs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The scalar head applied at EVERY position: ``score(h_t)`` for all t.

    Args:
        model: an ``AutoModelForSequenceClassification`` with ``num_labels=1`` (backbone at
            ``model.base_model``, head at ``model.score``, as in transformers' GPT-2/Llama classes).
        input_ids: ``[B, L]`` token ids.
        attention_mask: ``[B, L]`` 1 on real tokens, 0 on padding, or None (attend everywhere). With right
            padding and causal attention, positions before the padding get the same values either way.

    Returns:
        ``[B, L]`` float32 scalar per position (values for the critic, candidate scores for the RM).
        Unlike ``model(...).logits`` pooling (which picks the last token != ``pad_token_id`` and is wrong
        when pad == EOS), nothing is pooled here: callers pick the position.

    Raises:
        ValueError: shapes differ or the model has no ``score`` head.
    """
    if attention_mask is not None and input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} differ")
    head = getattr(model, "score", None)
    if head is None:
        raise ValueError(f"{type(model).__name__} has no `score` head; load it with load_scalar_model")
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, L, H]
    return head(hidden).squeeze(-1).float()  # [B, L]


def score_at(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, index: torch.Tensor
) -> torch.Tensor:
    """Scalar head at one position per row: ``scalar_head_outputs(...)[b, index[b]]``.

    For the RM score ``index`` is the EOS position (N+ detail 23: the score is read at the EOS token);
    for a response with no EOS the caller passes its last real token. The index is given explicitly,
    so this is correct whatever the pad/EOS ids are (pad == EOS included).

    Args:
        input_ids: ``[B, L]``; attention_mask: ``[B, L]`` or None; index: ``[B]`` long, 0 ≤ index < L.

    Returns:
        ``[B]`` float32.

    Raises:
        ValueError: ``index`` has the wrong shape or is out of range.
    """
    B, L = input_ids.shape
    index = torch.as_tensor(index, device=input_ids.device).long()
    if index.shape != (B,):
        raise ValueError(f"index must have shape [{B}] (got {tuple(index.shape)})")
    if B and (int(index.min()) < 0 or int(index.max()) >= L):
        raise ValueError(f"index out of range [0, {L}): min {int(index.min())}, max {int(index.max())}")
    values = scalar_head_outputs(model, input_ids, attention_mask)
    return values.gather(1, index[:, None]).squeeze(1)
