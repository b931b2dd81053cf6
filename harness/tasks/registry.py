"""The task registry, apart from the tasks themselves, so that a task module imports it without
importing the package that imports the task (no import circle).

The contract. A task registers a factory ``(cfg: Config, tokenizer) -> task`` with
``@TASKS.register(name, stages=..., eval_metrics=(...), [gold=...], [fetch=...])``:

- ``stages(cfg, runner, full=False) -> dict``: builds the task's pipeline through the
  :class:`~harness.pipeline.stage.StageRunner` and returns the fields of
  :class:`~harness.pipeline.PipelineArtifacts` (at least ``tokenizer_dir`` and ``sft_dir``; ``rm_dir`` for a
  task rewarded by a learned reward model), plus an optional ``summary`` dict;
- ``eval_metrics``: the ``eval/*`` metrics its evaluation logs (:mod:`harness.rl.metrics`), or a function
  ``(cfg) -> names`` where they depend on the task's options;
- ``final_metrics`` (optional): those of them also read at the end as ``eval_final/*`` beside the generic ones
  (gold, proxy, KL, length...), so that claims can test them; or a function ``(cfg) -> names``;
- ``gold(artifacts, device)`` (optional): its gold scorer, kept as ``Models.gold``;
- ``fetch(force=False)`` (optional): fetches its data into the cache (``harness data``);
- ``options`` (optional): a pydantic model of the task's own knobs, ``task.options`` (validated with the config;
  a task without it takes no options);
- ``reward_model`` (default True): False for a task scored by a verifier (its pipeline builds no reward model, so
  the config refuses ``ppo.critic_init: reward_model`` and skips the best-of-n checks);
- ``defaults`` (optional): nested config values under every config that names the task (e.g. its lengths);
- ``scales`` (optional): ``{scale: overrides}`` that replace the generic scale presets
  (:data:`harness.config.presets.SCALE_PRESETS`, sized for review_sentiment) for this task;
- ``regimes`` and ``default_regime`` (optional): ``{name: {"overrides", "note"}}``, named settings an ablation or
  study spec runs in (``regime:``; :func:`harness.config.presets.regime_overrides`), and the one it runs in by default;
- ``run_seconds`` (optional): ``{scale: seconds}``, the typical wall time of one run on one core of a two-core
  machine, for the plan ``--seeds auto`` prints before any run of that scale is in the store;
- ``draw_seconds`` (optional): the typical time to build one pipeline draw (``pipeline.replicates``) on one such
  core, which the plan adds for each draw its seeds use that this machine has not built yet;
- ``curve_metrics`` (optional): the per-iteration metrics the reports draw as learning curves (default
  :data:`harness.reporting.plots.CURVE_METRICS`, sized for review_sentiment);
- ``sample_columns`` (optional): the report's labels for a sample completion's ``score`` and ``gold_lexicon``
  (default ``("reward", "secondary score")``, :data:`harness.reporting.ablation.SAMPLE_COLUMNS`);
- ``distinct_floor`` (optional, default 0.1): the distinct-2 below which its final responses count as degenerate
  (:func:`harness.rl.evaluation.is_degenerate`); None for a task written in a handful of symbols.

Adding a task is a package under ``harness/tasks/`` that registers itself, and its import in
``harness/tasks/__init__.py``.

The task object the factory returns has ``eval_prompt_ids`` (``[N, P]``), ``sample_prompts(batch_size,
generator) -> [B, P]``, ``score(models, cfg, prompt_ids, responses, response_mask, with_gold) -> {"score": [B],
"gold_lexicon": [B], "gold": [B] or None, "texts": [B]}`` (the training reward of a rollout batch) and
``evaluate(models, cfg, prompts, k, device, autocast, eos_id, pad_id) -> {"eval/...": float}`` (the held-out
evaluation after ``k`` iterations; :func:`harness.rl.evaluation.eval_rollout` draws its responses). A task
rewarded by a learned reward model inherits both from :class:`harness.tasks.rm_scoring.RewardModelScored`.
"""

from harness.registry import Registry

TASKS: Registry = Registry("task.name", None, "the RL task: prompts, reward and evaluation, pipeline stages")

__all__ = ["TASKS"]
