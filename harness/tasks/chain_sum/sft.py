"""Supervised fine-tuning of the chain_sum policy from scratch, and its held-out pass@1.

The policy is the harness's small GPT-2 (:func:`harness.pipeline.sft.build_model`), trained by TRL's
``SFTTrainer`` on prompt-completion pairs: the left-padded prompt (:func:`.task.padded_prompt_text`) and the
scratchpad trace (:func:`.problems.scratchpad`), to which TRL appends EOS; the loss is on the completion only
(TRL's ``completion_only_loss``), so the model learns to solve, not to pose, problems.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch

import harness.tasks.chain_sum.problems as problems
from harness.tasks.chain_sum.task import (encode_prompts, greedy_responses, options_of, padded_prompt_text,
                                         pass1_by_terms)


def train_chain_sum_sft(train: list[dict], heldout: list[dict], tokenizer: Any, cfg: Any, out_dir: str | Path, *,
                        device: Any = "cpu", bf16: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train the SFT policy on ``train`` (at most ``pipeline.sft.max_train_texts`` problems), save it (and
    ``tokenizer``) to ``out_dir`` and summarise it on ``heldout`` (:func:`heldout_pass1`).

    Returns:
        metrics: ``train_loss``, ``steps``, ``n_train``, ``n_params`` and those of :func:`heldout_pass1`.
    Raises:
        ValueError: no training problem; a prompt longer than ``task.prompt_length``.
    """
    from datasets import Dataset

    from harness.pipeline.sft import build_model, fit_sft

    pc, P, seed, opts = cfg.pipeline, cfg.task.prompt_length, cfg.draw_seed, options_of(cfg)
    if pc.sft.max_train_texts is not None:
        train = train[: pc.sft.max_train_texts]
    if not train:
        raise ValueError("no chain_sum training problem")
    encode_prompts(tokenizer, train[:1] + heldout, P)  # a prompt too long for P fails here, before training
    ds = Dataset.from_dict({"prompt": [padded_prompt_text(tokenizer, e, P) for e in train],
                            "completion": sft_completions(train, opts.direct_fraction, seed, opts.direct_min_terms)})
    model = build_model(pc.model, tokenizer, seed)
    max_length = min(pc.sft.max_length, pc.model.n_positions)
    model, result = fit_sft(model, ds, tokenizer, pc.sft, max_length, seed=seed, device=device, bf16=bf16,
                            progress=progress, completion_only_loss=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    summary = heldout_pass1(model.to(device), tokenizer, heldout, P, cfg.task.response_length, opts)
    return {"train_loss": float(result.training_loss), "steps": int(result.global_step), "n_train": len(train),
            "n_params": int(sum(p.numel() for p in model.parameters())), **summary}


def sft_completions(train: list[dict], direct_fraction: float, seed: int, min_terms: int = 2) -> list[str]:
    """The SFT completion of each training problem: its scratchpad, or for ``direct_fraction`` of the problems with
    at least ``min_terms`` terms (chosen by :func:`.problems.direct_indices` with ``seed``) the bare answer
    (:func:`.problems.direct_answer`)."""
    eligible = [i for i, e in enumerate(train) if problems.terms(e) >= min_terms]
    direct = problems.direct_indices(len(train), direct_fraction, seed, eligible)
    return [problems.direct_answer(e) if i in direct else problems.scratchpad(e) for i, e in enumerate(train)]


@torch.no_grad()
def heldout_pass1(policy: Any, tokenizer: Any, heldout: list[dict], prompt_length: int, response_length: int,
                  options: Any) -> dict[str, Any]:
    """Greedy pass@1 of ``policy`` on the ``heldout`` problems (exact match by the library's scorer) and the
    lengths of its responses (tokens, EOS included).

    Returns:
        ``heldout_pass1_greedy`` (fraction correct), ``pass1_greedy_by_terms`` ({terms: fraction}),
        ``length_mean``, ``length_sd``, ``length_correct_mean``, ``length_correct_sd``, ``length_incorrect_mean``
        (NaN-free: 0.0 where a group is empty), ``truncated`` (responses without EOS), ``direct`` (responses that
        answer with no scratchpad), ``n_heldout``.
    """
    from harness.rl.evaluation import decode_responses
    device = next(policy.parameters()).device
    prompts = encode_prompts(tokenizer, heldout, prompt_length).to(device)
    responses, mask = greedy_responses(policy, prompts, response_length, tokenizer.eos_token_id, tokenizer.pad_token_id)
    texts = decode_responses(tokenizer, responses, mask)
    data = problems.dataset(1, options.seed, **options.knobs())
    correct = [problems.reward(t, e, data) for t, e in zip(texts, heldout)]
    lengths = mask.sum(1).tolist()
    has_eos = (responses == tokenizer.eos_token_id).any(1).tolist()
    right = [n for n, c in zip(lengths, correct) if c]
    wrong = [n for n, c in zip(lengths, correct) if not c]
    by_terms = pass1_by_terms(correct, [problems.terms(e) for e in heldout], options.min_terms, options.max_terms)
    return {"heldout_pass1_greedy": sum(correct) / len(correct), "n_heldout": len(heldout),
            "pass1_greedy_by_terms": {str(n): v for n, v in by_terms.items() if not math.isnan(v)},
            "length_mean": statistics.fmean(lengths), "length_sd": _sd(lengths),
            "length_correct_mean": statistics.fmean(right) if right else 0.0, "length_correct_sd": _sd(right),
            "length_incorrect_mean": statistics.fmean(wrong) if wrong else 0.0,
            "truncated": 1.0 - sum(has_eos) / len(has_eos),
            "direct": sum(map(problems.is_direct, texts)) / len(texts)}


def _sd(x: list[float]) -> float:
    return statistics.stdev(x) if len(x) > 1 else 0.0


__all__ = ["heldout_pass1", "sft_completions", "train_chain_sum_sft"]
