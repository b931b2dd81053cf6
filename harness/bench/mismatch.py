"""``harness mismatch``: the training–inference mismatch of each rollout precision on a task's SFT policy.

For each task (its pipeline built or read from the cache at the scale) the SFT policy samples responses to the first
``n_prompts`` held-out prompts through a :class:`harness.rl.engine.RolloutEngine` at each precision
(:data:`harness.rl.engine.PRECISIONS`), with one sampling seed, and the trainer's fp32 log-probabilities of the same
tokens are compared with the engine's (:func:`harness.rl.components.rollout_correction.mismatch_metrics`). Printed
per task and precision: the mean and max per-token |Δ log π| (nats), the mean |per-sequence log-ratio|, KL(engine ‖
trainer) per token, the fraction of tokens outside [1/2, 2], the time to generate the responses and the time of one
weight sync. fp32 must give 0 up to float rounding; bf16 and FP8 more. It measures, it does not train.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import torch

#: The columns printed, in order (a metric's name without ``rollout/``, then the timings).
COLUMNS: tuple[str, ...] = ("mismatch_abs_mean", "mismatch_abs_max", "seq_log_ratio_abs", "kl_engine_trainer",
                            "outside_band", "generate_s", "sync_s")


def measure(cfg: Any, precisions: Optional[Sequence[str]] = None, n_prompts: int = 64) -> list[dict[str, Any]]:
    """One row per precision for ``cfg``'s task: ``{"task", "precision", "tokens"}`` and :data:`COLUMNS`.

    Args:
        cfg: a resolved :class:`harness.config.Config` (its task, scale, seed and sampling temperature).
        precisions: engine precisions to measure (default all, :data:`harness.rl.engine.PRECISIONS`).
        n_prompts: held-out prompts sampled (the first ones; fewer if the task has fewer).
    Raises:
        ValueError: an unknown precision or ``n_prompts`` < 1. HarnessError: a pipeline stage could not be built.
    """
    from harness.rl.components.eos import truncate_after_eos
    from harness.rl.components.rollout_correction import mismatch_metrics
    from harness.rl.engine import PRECISIONS, RolloutEngine
    from harness.rl.rollout import response_logprobs, sample
    from harness.rl.runner import build_run

    if n_prompts < 1:
        raise ValueError(f"mismatch: --prompts must be ≥ 1 (got {n_prompts})")
    models, task = build_run(cfg, defer=True)  # no best-of-n reference: nothing here reads it
    policy, P, T, tau = models.policy.eval(), cfg.task.prompt_length, cfg.task.response_length, cfg.ppo.temperature
    eos, pad = models.tokenizer.eos_token_id, models.tokenizer.pad_token_id
    prompts = task.eval_prompt_ids[:n_prompts].to(next(policy.parameters()).device)
    rows = []
    for precision in precisions or PRECISIONS:
        engine = RolloutEngine(policy, precision)
        sync_s = engine.sync(policy)
        t0 = time.perf_counter()
        raw = sample(engine.model, prompts, T, tau, torch.Generator(prompts.device).manual_seed(cfg.seed),
                     sampler=cfg.ppo.sampler, stop_token=eos)
        generate_s = time.perf_counter() - t0
        responses, mask, _ = truncate_after_eos(raw, eos, eos if pad is None else pad)
        qr = torch.cat([prompts, responses], dim=1)
        with torch.no_grad():
            trainer, _ = response_logprobs(policy, qr, P, tau)
        m = mismatch_metrics(trainer, engine.logprobs(qr, P, tau), mask.float())
        rows.append({"task": cfg.task.name, "precision": precision, "tokens": int(mask.sum().item()),
                     **{k.split("/", 1)[1]: v for k, v in m.items()}, "generate_s": generate_s, "sync_s": sync_s})
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of :func:`measure` as an aligned text table (pandas), one line per task and precision."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=["task", "precision", "tokens", *COLUMNS])
    return frame.to_string(index=False, float_format=lambda v: f"{v:.3g}")


__all__ = ["COLUMNS", "measure", "format_rows"]
