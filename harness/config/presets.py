"""Scale presets: nested config overrides applied under an ablation's or a study's own settings.

- ``smoke``: a tiny pipeline and a few PPO iterations; seconds per run; used by the test suite.
- ``default``: the shipped defaults (the N+ recipe scaled to the tiny model), with 56 PPO iterations, on
  :data:`REPLICATES` pipeline draws. At 40 the baseline's mean held-out gold had not plateaued (kl_placement,
  fixed-length regime, β 0.05, 39 seeds: gains per 8 iterations 0.044, 0.079, 0.053, 0.030, 0.018, the rise over
  iterations 30–40 10.1% of the total 0.206); the gains shrink by ~0.6 per 8 iterations, and at 56 the rise over
  iterations 42–56 is 6.1% of the total 0.241 (30 seeds). The reports print the check
  (``harness.analysis.stats.plateau_check``) for every arm.
- ``full``: longer PPO runs on the default pipeline (the same draws).
- ``real_model``: a real pretrained policy (SmolLM2-135M-Instruct from its wheel) with 48-token
  responses, sized for one GPU; on two CPU cores an iteration takes minutes (``harness train`` prints
  its estimate after the first one).
"""

from __future__ import annotations

from typing import Any

#: Pipeline draws at the default and full scales (``pipeline.replicates``): seed ``s`` runs on draw ``s mod 40``, so up
#: to the default cap of 40 seeds every seed has its own SFT policy, proxy data and proxy (each draw ~4 CPU-minutes,
#: built once and shared by every arm and every ablation of the same pipeline), and the test on the draws
#: (:func:`harness.analysis.stats.blocked`) is the t test of the per-draw differences on n − 1 df. Measured on kl_placement
#: (5 draws × 2 seeds per arm): the draw moves final gold by up to 0.4 (proxies of Spearman 0.17–0.37 with gold)
#: where two seeds on one draw differ by ~0.02, and the none − reward KL gap ranges 33–96 nats across draws. With
#: the effect varying that much from draw to draw, seeds added on the same few draws buy nothing: power comes from
#: draws (on 5 draws the test has 4 df at every look, and the O'Brien–Fleming boundary of the first look asks t > 43).
REPLICATES = 40

SCALE_PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "pipeline": {
            "tokenizer": {"vocab_size": 512},
            "model": {"n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 64},
            "sft": {"max_steps": 40, "batch_size": 32, "max_train_texts": 4000},
            "gold": {"finetune_layers": 0, "max_snippets": 1500, "encoder_layers": 2},
            "reward_model": {"max_steps": 40, "batch_size": 32, "max_train_pairs": 2000,
                             "proxy_pairs": 128, "proxy_pool_pairs": 256, "proxy_heldout_pairs": 64},
            "bon": {"num_prompts": 8, "n_samples": 16},
        },
        "task": {"response_length": 12},
        "ppo": {"total_iterations": 3, "batch_size": 16, "num_minibatches": 2, "num_ppo_epochs": 2},
        "num_sample_completions": 4,
        "eval": {"every": 1, "num_prompts": 8},
    },
    "default": {"ppo": {"total_iterations": 56}, "pipeline": {"replicates": REPLICATES}},
    "full": {"ppo": {"total_iterations": 150}, "pipeline": {"replicates": REPLICATES}},
    # SmolLM2-135M-Instruct (harness.pipeline.pretrained) as the policy, sized for one GPU: 48-token
    # responses, a critic from the policy (the RM's tokenizer differs), a pretrained model's learning rate.
    "real_model": {
        "pipeline": {"model": {"preset": "smollm2-135m"}},
        "task": {"prompt_length": 16, "response_length": 48},
        "ppo": {"total_iterations": 200, "batch_size": 64, "num_minibatches": 4, "lr": 3e-6, "critic_init": "policy"},
    },
}


#: The scales every ablation and study spec must resolve at when it is loaded. Other scales (``real_model``,
#: whose policy has its own tokenizer, so some variants cannot run there) are checked when a run asks for them.
CHECKED_SCALES = ("smoke", "default", "full")


def scale_overrides(scale: str, task: str | None = None) -> dict[str, Any]:
    """The nested overrides of ``scale``: the preset of task ``task`` when it registers one for this scale
    (``TASKS.register(..., scales={scale: overrides})``; it replaces the generic preset, whose pipeline and
    lengths are review_sentiment's), else :data:`SCALE_PRESETS` ``[scale]``.

    Raises:
        HarnessError: for an unknown scale, listing the valid ones.
    """
    from harness.errors import HarnessError

    if scale not in SCALE_PRESETS:
        raise HarnessError(f"scale: unknown value {scale!r}; choose from: {', '.join(SCALE_PRESETS)}")
    own = task_meta(task).get("scales", {}) if task else {}
    return own.get(scale, SCALE_PRESETS[scale])


def _regime(regime: str | None, task: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, {"overrides", "note"})`` of the regime a spec names for task ``task`` (the task's default when
    ``regime`` is None), or None for a task without regimes.

    Raises:
        HarnessError: a regime the task does not define (names the task's regimes).
    """
    from harness.errors import HarnessError

    meta = task_meta(task)
    regimes = meta.get("regimes", {})
    name = regime if regime is not None else meta.get("default_regime")
    if name is None:
        return None
    if name not in regimes:
        raise HarnessError(f"regime: unknown value {name!r} for task {task}; choose from: "
                           f"{', '.join(regimes) or '(none: the task defines no regime)'}")
    return name, regimes[name]


def regime_overrides(regime: str | None, task: str) -> dict[str, Any]:
    """The config overrides of task ``task``'s named regime (``TASKS.register(..., regimes={name: {"overrides",
    "note"}}, default_regime=name)``), which an ablation or study spec applies under its ``base``;
    ``regime=None`` is the task's default regime ({} for a task without regimes).

    Raises:
        HarnessError: a regime the task does not define (names the task's regimes).
    """
    found = _regime(regime, task)
    return found[1]["overrides"] if found else {}


def regime_note(regime: str | None, task: str) -> str:
    """``"<name>: <note>"`` for the regime a spec runs in (its own, else the task's default); empty for a task
    without regimes.

    Raises:
        HarnessError: as :func:`regime_overrides`.
    """
    found = _regime(regime, task)
    return f"{found[0]}: {found[1]['note']}" if found else ""


def task_meta(task: str) -> dict[str, Any]:
    """The registration metadata of task ``task`` (``{}`` for a name no task has: the config's validation
    reports it)."""
    from harness.registry import registry

    reg = registry("task.name")
    return reg.meta(task) if task in reg else {}


def task_name(data: dict[str, Any]) -> str:
    """The task a (partial) nested config names: ``data["task"]["name"]``, else the default task."""
    from harness.config.base import DEFAULT_TASK

    task = data.get("task") if isinstance(data, dict) else None
    name = task.get("name") if isinstance(task, dict) else None
    return name if isinstance(name, str) else DEFAULT_TASK
