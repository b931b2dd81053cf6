"""Best-of-n from the SFT policy: the reference gold–KL frontier (Gao, Schulman & Hilton 2022, §2.2).

Two stages:
* ``bon_samples`` (:func:`build_bon_samples`): ``n_samples`` responses per evaluation prompt (the first
  ``num_prompts`` of the task's fixed held-out evaluation prompts), sampled from the SFT policy at the PPO
  temperature and truncated after the first EOS as every rollout is, each with its gold score.
* ``bon`` (:func:`build_bon_curve`): the proxy (the config's reward model, normalised by its
  ``reward_offset``) scores every sample; for n = 1, 2, 4, …, ``n_samples`` the unbiased best-of-n
  estimate (:func:`harness.analysis.frontier.bon_estimate`) of the gold and proxy score of the proxy-best
  sample, at ``KL_bon(n) = log n − (n − 1)/n``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

SAMPLES_FILE = "samples.parquet"


def build_bon_samples(out_dir: Path, sft_dir: str, tokenizer: Any, prompts: torch.Tensor,
                      gold: Callable[[list[str]], torch.Tensor], *, n_samples: int, response_length: int,
                      temperature: float, seed: int, device: torch.device | str = "cpu",
                      batch_size: int = 512, truncate: bool = True, suppress_special: bool = False) -> dict[str, Any]:
    """Sample ``n_samples`` responses for each prompt of ``prompts`` (``[M, P]``), truncated after the first
    EOS unless ``truncate`` is False (as the PPO loop's ``ppo.truncate_after_eos``), score them by gold, save.
    ``suppress_special``: the SFT policy never emits the special tokens its text would hide (all, or all but EOS with
    ``truncate``; ``task.suppress_special_tokens``, :func:`harness.rl.models.hidden_special_ids`,
    :func:`harness.rl.models.suppress_tokens`), as the policies compared with this curve do.

    Returns:
        metrics: ``num_prompts``, ``n_samples``, ``gold_mean`` (= the best-of-1 gold), ``eos_rate``.
    """
    from harness.rl.models import hidden_special_ids, load_policy, suppress_tokens
    from harness.rl.rollout import sample_sequences

    policy = load_policy(sft_dir, device)
    if suppress_special:
        suppress_tokens(policy, hidden_special_ids(tokenizer, ends_at_eos=truncate))
    gen = torch.Generator(device=device).manual_seed(seed)
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    seqs = sample_sequences(policy, prompts.repeat_interleave(n_samples, dim=0), response_length, temperature, gen,
                            eos_id, pad_id, truncate=truncate, batch_size=batch_size)
    g = gold(tokenizer.batch_decode(seqs, skip_special_tokens=True)).double().numpy()
    df = pd.DataFrame({"prompt": np.repeat(np.arange(prompts.shape[0]), n_samples), "ids": seqs, "gold": g})
    df.to_parquet(out_dir / SAMPLES_FILE)
    return {"num_prompts": int(prompts.shape[0]), "n_samples": int(n_samples), "gold_mean": float(g.mean()),
            "eos_rate": float(np.mean([eos_id in s[prompts.shape[1]:] for s in seqs]))}


def bon_ns(n_samples: int) -> list[int]:
    """Powers of two from 1 up to ``n_samples`` (inclusive when it is one)."""
    ns, n = [], 1
    while n <= n_samples:
        ns.append(n)
        n *= 2
    return ns


def build_bon_curve(out_dir: Path, samples_dir: str | Path, rm_dir: str | Path, reward_offset: float, pad_id: int,
                    device: torch.device | str = "cpu") -> dict[str, Any]:
    """Score the ``bon_samples`` by the proxy RM and write the best-of-n curve ``bon.json``.

    ``bon.json``: ``n``, ``kl`` (nats), ``d`` (√kl), ``gold`` and ``proxy`` (means over prompts),
    ``gold_gain`` (gold − best-of-1 gold), ``gold_per_prompt`` and ``proxy_per_prompt`` (``[M][len(n)]``,
    for bootstrap CIs over prompts).

    Returns:
        metrics: ``n_max``, ``kl_max``, ``gold_gain_max`` (at the largest n), ``proxy_gain_max``.
    """
    from harness.analysis.frontier import BON_CURVE_FILE, bon_estimate, bon_kl
    from harness.rl.models import load_scalar_model
    from harness.tasks.review_sentiment.reward_model import score_sequences

    df = pd.read_parquet(Path(samples_dir) / SAMPLES_FILE)
    rm = load_scalar_model(rm_dir, device)
    proxy = score_sequences(rm, [list(map(int, x)) for x in df["ids"]], pad_id, device=device) - reward_offset
    M = int(df["prompt"].max()) + 1
    N = len(df) // M
    P, G = proxy.reshape(M, N), df["gold"].to_numpy(dtype=float).reshape(M, N)
    ns = bon_ns(N)
    gold_pp, proxy_pp = bon_estimate(P, G, ns), bon_estimate(P, P, ns)
    kl = bon_kl(ns)
    curve = {"n": ns, "kl": [float(x) for x in kl], "d": [float(x) for x in np.sqrt(kl)],
             "gold": gold_pp.mean(0).tolist(), "proxy": proxy_pp.mean(0).tolist(),
             "gold_gain": (gold_pp.mean(0) - gold_pp[:, 0].mean()).tolist(),
             "gold_per_prompt": gold_pp.tolist(), "proxy_per_prompt": proxy_pp.tolist()}
    (out_dir / BON_CURVE_FILE).write_text(json.dumps(curve))
    return {"n_max": ns[-1], "kl_max": float(kl[-1]), "gold_gain_max": curve["gold_gain"][-1],
            "proxy_gain_max": float(proxy_pp.mean(0)[-1] - proxy_pp[:, 0].mean())}


__all__ = ["build_bon_samples", "build_bon_curve", "bon_ns", "SAMPLES_FILE"]
