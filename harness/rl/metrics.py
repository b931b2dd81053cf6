"""The metric names a run records, declared, so that a spec naming a metric no run logs is refused
before any compute (a typo in a claim's metric would otherwise show only as an empty row of the
report, after every run was paid for).

Three sources, each declared where it is produced:

- the loop's per-iteration metrics (:data:`ITERATION`, :data:`CRITIC_ITERATION`; ``harness.rl.ppo``);
- the task's held-out evaluation (``eval/<name>``), declared by the task at registration
  (``TASKS.register(name, eval_metrics=(...))``);
- the readouts computed from those: the run summary's ``eval_final/*``, ``eval_peak/*``,
  ``eval_drop/gold``, ``eval_auc/gold``, ``initial/*``, ``final/*``, the ``last/<metric>`` window of
  every per-iteration metric (``harness.infra.tracking.MLflowCallback``), and the report's
  ``matched_kl/*`` and ``pair_matched_kl/*`` (``harness.reporting.ablation``).

A metric added to the loop after runs were recorded is derived for those runs where their own metrics determine it
exactly (:func:`derive_trained_all_equal`, read by the reports).

``tests/test_ppo.py`` runs the loop and checks that what MLflow receives equals this declaration, so
the two cannot drift apart.
"""

from __future__ import annotations

import difflib
import math
from typing import TYPE_CHECKING, Any, Iterable

import torch

from harness.rl.components.whitening import masked_mean, masked_var
from harness.rl.evaluation import COLLAPSED, DEGENERATE, DEGENERATE_DISTINCT_2, DEGENERATE_LENGTH, FINAL_EVAL

if TYPE_CHECKING:
    import pandas as pd

#: Per-iteration metrics of every run (:func:`iteration_metrics` and ``harness.rl.ppo._update``).
ITERATION: tuple[str, ...] = (
    "objective/score", "objective/score_train", "objective/gold_lexicon", "objective/kl", "objective/entropy",
    "objective/kl_coef", "response/length", "response/eos_rate", "perf/tokens_per_s", "perf/response_tokens",
    "time/score", "time/generate", "time/forward", "time/update",
    "policy/ratio_mean", "policy/ratio_std", "policy/clipfrac", "policy/approxkl", "loss/policy",
    "policy/ratio_mean_first", "policy/ratio_std_first", "policy/clipfrac_first", "policy/approxkl_first",
    "batch/prompts_sampled", "batch/responses_sampled",
)
#: The fraction of all-equal groups in the batch trained on, after dynamic sampling (critic-free runs; logged since the
#: dynamic-sampling ablation's first runs, derived for earlier ones by :func:`derive_trained_all_equal`).
TRAINED_ALL_EQUAL = "objective/all_equal_groups_trained"

#: Per-iteration metrics of runs with a critic (PPO with GAE), besides :data:`ITERATION`.
CRITIC_ITERATION: tuple[str, ...] = ("loss/value", "val/clipfrac", "val/explained_variance")
#: Run-summary readouts that do not depend on the task's metric list (``harness.rl.ppo.train``'s summary).
SUMMARY: tuple[str, ...] = (
    "eval_peak/gold", "eval_peak/iteration", "eval_peak/kl", "eval_drop/gold", "eval_auc/gold",
    "initial/score", "initial/score_std", "initial/gold", "initial/eos_rate",
    "final/score", "final/gold_lexicon", "final/kl", "iterations", "wall_time_s", "pipeline_build_s",
    "n_params/policy", "n_params/ref",
)
#: Final metrics every report's table shows for every variant when its runs recorded them (what the responses look
#: like, whatever the claims read): length, distinct-2 and the degenerate flag.
STANDING: tuple[str, ...] = ("eval_final/length", "eval_final/distinct_2", "eval_final/rep_2", "eval_final/msttr",
                              "eval_final/top_response_share", "eval_final/gold_p_natural", f"eval_final/{DEGENERATE}",
                              "rescored_final/gold")
#: The standing columns that are diagnostics, with no better direction; the others (another judge's gold) are read as
#: the metric they stand beside (higher is better).
STANDING_DIAGNOSTIC: tuple[str, ...] = tuple(m for m in STANDING if m != "rescored_final/gold")
#: Report readouts at matched KL (``harness.reporting.runs.add_matched_kl``, ``claim_values``).
MATCHED_KL: tuple[str, ...] = ("matched_kl/gold", "matched_kl/proxy")
PAIR_MATCHED_KL: tuple[str, ...] = ("pair_matched_kl/gold", "pair_matched_kl/proxy", "pair_matched_kl/gold_lexicon")
#: Report readouts at equal sampled responses (``harness.reporting.matched``), each where the task evaluates its curve.
PAIR_MATCHED_RESPONSES: tuple[str, ...] = ("pair_matched_responses/pass1_greedy", "pair_matched_responses/gold")


def task_final_metrics(cfg: Any) -> tuple[str, ...]:
    """The evaluation metrics task ``cfg.task.name`` also reads at the end (its registered ``final_metrics``, without
    the ``eval/`` prefix; ``()`` for a task that declares none; a callable is called with ``cfg``), beyond the
    generic ``eval_final/*``.

    Raises:
        UnknownComponentError: ``cfg.task.name`` names no registered task.
    """
    from harness.tasks import TASKS

    final = TASKS.meta(cfg.task.name).get("final_metrics", ())
    return tuple(final(cfg) if callable(final) else final)


def task_distinct_floor(cfg: Any) -> float | None:
    """The distinct-2 floor below which task ``cfg.task.name``'s responses count as degenerate (its registered
    ``distinct_floor``; default :data:`DEGENERATE_DISTINCT_2`; None: the task's alphabet is too small
    for distinct-n to mean anything, and length alone decides).

    Raises:
        UnknownComponentError: ``cfg.task.name`` names no registered task.
    """
    from harness.tasks import TASKS

    return TASKS.meta(cfg.task.name).get("distinct_floor", DEGENERATE_DISTINCT_2)


def run_metric_names(cfg: Any) -> frozenset[str]:
    """Every metric name a run of ``cfg`` records or its report derives, as a claim may read it.

    Args:
        cfg: a resolved :class:`harness.config.Config`.
    Returns:
        the per-iteration metrics (``objective/*``, ``policy/*`` …; ``loss/value`` and ``val/*`` only with a
        critic, ``objective/all_equal_groups`` and ``objective/all_equal_groups_trained`` only without one, ``objective/gold`` only with ``ppo.train_on_gold``,
        ``dynamic/rounds`` only with ``ppo.dynamic_sampling``, ``policy/selected_frac`` only with a
        ``ppo.token_selection``, ``batch/groups_in_loss`` with ``ppo.zero_variance_filter`` and
        ``batch/prompts_retired`` with ``ppo.no_positive_resampling``, ``rollout/*`` and ``time/sync`` with a rollout
        engine), ``eval/<m>`` for the task's declared
        evaluation metrics, ``last/<per-iteration metric>``, and the summary and report readouts (at equal sampled
        responses only of the curves the task evaluates).
    Raises:
        UnknownComponentError: ``cfg.task.name`` names no registered task.
    """
    from harness.tasks import TASKS

    iteration = list(ITERATION)
    if cfg.ppo.needs_critic:
        iteration += CRITIC_ITERATION
    else:
        iteration += ["objective/all_equal_groups", TRAINED_ALL_EQUAL]
    if cfg.ppo.dynamic_sampling:
        iteration.append("dynamic/rounds")
    if cfg.ppo.zero_variance_filter:
        iteration.append("batch/groups_in_loss")
    if cfg.ppo.no_positive_resampling is not None:
        iteration.append("batch/prompts_retired")
    if cfg.ppo.train_on_gold:
        iteration.append("objective/gold")
    if cfg.ppo.token_selection != "all":
        iteration.append("policy/selected_frac")
    if cfg.ppo.uses_engine:
        from harness.rl.components.rollout_correction import MISMATCH_METRICS

        iteration += MISMATCH_METRICS
    evals = TASKS.meta(cfg.task.name).get("eval_metrics", ())
    evals = tuple(evals(cfg) if callable(evals) else evals)
    final = [f"eval_final/{m}" for m in FINAL_EVAL if m in evals] + [f"eval_final/{COLLAPSED}"] + \
        ([f"eval_final/{DEGENERATE}"] if "length" in evals else []) + \
        [f"eval_final/{m}" for m in task_final_metrics(cfg)]
    summary = list(SUMMARY) + (["final/gold"] if cfg.ppo.train_on_gold else []) + \
        (["n_params/critic"] if cfg.ppo.needs_critic else []) + \
        (["n_params/reward_model"] if TASKS.meta(cfg.task.name).get("reward_model", True) else [])
    return frozenset(iteration + [f"last/{m}" for m in iteration] + [f"eval/{m}" for m in evals] + final + summary
                     + list(MATCHED_KL) + list(PAIR_MATCHED_KL)
                     + [m for m in PAIR_MATCHED_RESPONSES if m.split("/", 1)[1] in evals])


def iteration_metrics(batch: Any, ro: dict[str, Any], score: torch.Tensor, entropy: torch.Tensor, kl_coef: float,
                       stats: dict[str, float], timings: dict[str, float], batch_size: int) -> dict[str, float]:
    """One iteration's logged metrics: ``objective/*`` (proxy score as sampled and as trained on,
    lexicon gold, k1 KL per response in nats, entropy per token, the KL coefficient in force; with groups,
    ``objective/all_equal_groups``: the fraction of the first rollout's groups whose scores are all equal, and
    ``objective/all_equal_groups_trained``: that fraction in the batch trained on, after dynamic sampling),
    ``response/*``, ``perf/*``, the update's ``stats`` and the phase ``timings`` (s),
    ``val/explained_variance`` of the returns by the critic's values, ``dynamic/rounds`` (rollouts drawn
    for the batch) with ``ppo.dynamic_sampling``, ``policy/selected_frac`` with a ``ppo.token_selection``, the
    batch's consumption (``batch/*``, :func:`harness.rl.batch.sample_batch`) and, with a rollout engine, the
    mismatch metrics (``rollout/*``, :func:`harness.rl.engine.correct`, passed in ``ro["rollout_metrics"]``).

    ``batch`` is the loop's :class:`harness.rl.ppo.Rollout`; every per-token tensor is ``[B, L]``."""
    mask, P = batch.response_mask, batch.context_length
    k1_seq = ((batch.logprobs - batch.ref_logprobs) * mask).sum(1)
    m = {
        "objective/score": ro["score"].mean().item(),
        "objective/score_train": score.mean().item(),
        "objective/gold_lexicon": ro["gold_lexicon"].mean().item(),
        "objective/kl": k1_seq.mean().item(),
        "objective/entropy": masked_mean(entropy, mask).item(),
        "objective/kl_coef": kl_coef,
        "response/length": mask.sum(1).mean().item(),
        "response/eos_rate": ro["has_eos"].float().mean().item(),
        "perf/tokens_per_s": batch_size * (P + batch.max_len) / max(sum(timings.values()), 1e-9),
        **stats,
        **timings,
    }
    if ro["gold"] is not None:
        m["objective/gold"] = ro["gold"].mean().item()
    if not math.isnan(ro.get("all_equal", math.nan)):  # groups of responses per prompt (critic-free estimators)
        m["objective/all_equal_groups"] = ro["all_equal"]
        m["objective/all_equal_groups_trained"] = ro["all_equal_trained"]
    if ro.get("dynamic_sampling"):
        m["dynamic/rounds"] = float(ro["rounds"])
    m.update(ro.get("consumed", {}))  # batch/*: prompts and responses sampled so far, the filters' counts
    m.update(ro.get("rollout_metrics", {}))  # rollout/*: the engine's mismatch and the correction's weights
    if batch.values is not None:
        var_r = masked_var(batch.returns, mask)
        m["val/explained_variance"] = ((1 - masked_var(batch.returns - batch.values, mask) / var_r).item()
                                       if var_r > 0 else float("nan"))
    if batch.policy_mask is not None:  # ppo.token_selection: the fraction of real tokens carrying the policy loss
        m["policy/selected_frac"] = (batch.policy_mask.sum() / mask.sum().clamp(min=1)).item()
    m["perf/response_tokens"] = mask.sum().item()
    return m


def derive_trained_all_equal(runs: "pd.DataFrame", history: "pd.DataFrame",
                             ppo: dict[tuple[str, int], Any]) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """Add :data:`TRAINED_ALL_EQUAL` (per iteration and its ``last/`` window) to the critic-free runs recorded before
    the loop logged it, where their own metrics determine it exactly; runs that logged it are left as they are.

    The batch trained on is the first rollout when ``ppo.dynamic_sampling`` is off, so the fraction equals
    ``objective/all_equal_groups``; with it on, an iteration that drew fewer than ``ppo.dynamic_sampling_max_rounds``
    rollouts (``dynamic/rounds``) stopped because the batch was full of informative groups
    (:func:`harness.rl.batch.sample_batch`), so the fraction is 0; at the cap it is unknown (NaN). The
    ``last/`` value is the mean of the finite values over the last 10% of iterations, as
    :class:`harness.infra.tracking.MLflowCallback` computes it.

    Args:
        runs: counted runs (``run_id, variant, seed, metrics.*``).
        history: long format ``run_id, variant, seed, metric, step, value`` (with ``dynamic/rounds``).
        ppo: the resolved ``ppo`` section of each run's config, by ``(variant, seed)``.
    Returns:
        ``(runs, history)`` with the derived values added (new frames; the inputs are not modified).
    """
    import numpy as np
    import pandas as pd

    col = f"metrics.last/{TRAINED_ALL_EQUAL}"
    runs = runs.copy()
    if col not in runs.columns:
        runs[col] = np.nan
    added = []
    for i, row in runs.iterrows():
        if not pd.isna(row[col]):
            continue
        h = history[history["run_id"] == row["run_id"]]
        first = h[h["metric"] == "objective/all_equal_groups"].set_index("step")["value"].sort_index()
        if first.empty:  # a run with a critic: no groups
            continue
        p = ppo[(row["variant"], int(row["seed"]))]
        if p.dynamic_sampling:
            rounds = h[h["metric"] == "dynamic/rounds"].set_index("step")["value"].reindex(first.index)
            values = pd.Series(np.where(rounds < p.dynamic_sampling_max_rounds, 0.0, np.nan), index=first.index)
        else:
            values = first
        window = values.iloc[-max(1, int(np.ceil(0.1 * len(values)))):].dropna()
        runs.loc[i, col] = float(window.mean()) if len(window) else np.nan
        added += [(row["run_id"], row["variant"], int(row["seed"]), TRAINED_ALL_EQUAL, int(s), float(v))
                  for s, v in values.items()]
    if added:
        history = pd.concat([history, pd.DataFrame(added, columns=history.columns)], ignore_index=True)
    return runs, history


def unknown_metric(metric: str, known: Iterable[str]) -> str:
    """The one-line reason ``metric`` is not among ``known``: the closest names (``difflib``), and the
    families a run records."""
    known = sorted(known)
    close = difflib.get_close_matches(metric, known, n=2)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    families = sorted({k.split("/", 1)[0] + "/" for k in known if "/" in k})
    return f"no run records metric {metric!r}{hint}; a run records {', '.join(f'{f}*' for f in families)}"


__all__ = ["ITERATION", "CRITIC_ITERATION", "SUMMARY", "FINAL_EVAL", "STANDING", "STANDING_DIAGNOSTIC", "COLLAPSED", "DEGENERATE", "task_distinct_floor", "MATCHED_KL", "PAIR_MATCHED_KL", "PAIR_MATCHED_RESPONSES", "run_metric_names",
           "TRAINED_ALL_EQUAL", "derive_trained_all_equal",
           "unknown_metric"]
