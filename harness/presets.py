"""Scale presets: nested config overrides applied under an ablation's or a study's own settings.

- ``smoke``: a tiny pipeline and a few PPO iterations; seconds per run; used by the test suite.
- ``default``: the shipped defaults (the N+ recipe scaled to the tiny model), with 40 PPO
  iterations instead of 60 so that an ablation of 3 variants × 10 seeds fits in ~25 minutes on two
  single-threaded workers (the proxy score and gold have risen most of the way by then).
- ``full``: longer PPO runs on the default pipeline.
"""

from __future__ import annotations

from typing import Any

SCALE_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "pipeline": {
            "tokenizer": {"vocab_size": 512},
            "model": {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 64},
            "sft": {"max_steps": 40, "batch_size": 32, "max_train_texts": 4000},
            "gold": {"finetune_layers": 0, "max_snippets": 1500},
            "reward_model": {"max_steps": 40, "batch_size": 32, "max_train_pairs": 2000,
                             "proxy_pairs": 128, "proxy_pool_pairs": 256, "proxy_heldout_pairs": 64},
            "bon": {"num_prompts": 8, "n_samples": 16},
        },
        "task": {"response_length": 12},
        "ppo": {"total_iterations": 3, "batch_size": 16, "num_minibatches": 2, "num_ppo_epochs": 2},
        "num_sample_completions": 4,
        "eval": {"every": 1, "num_prompts": 16},
    },
    "default": {"ppo": {"total_iterations": 40}},
    "full": {"ppo": {"total_iterations": 150}},
}


def scale_overrides(scale: str) -> dict[str, Any]:
    """The nested overrides of ``scale``.

    Raises:
        HarnessError: for an unknown scale, listing the valid ones.
    """
    from harness.errors import HarnessError

    if scale not in SCALE_PRESETS:
        raise HarnessError(f"scale: unknown value {scale!r}; choose from: {', '.join(SCALE_PRESETS)}")
    return SCALE_PRESETS[scale]
