"""pass@k in an ablation report: each arm's unbiased pass@k before training and at the end, with its standard
errors over seeds and over the held-out problems (:func:`passk_stats`), and the report's table of them
(:func:`passk_rows`). The runs log it when ``eval.passk_samples`` > 0 (chain_sum:
:meth:`harness.tasks.chain_sum.task.ChainSumTask.evaluate`, :func:`harness.rl.evaluation.pass_at_k_metrics`)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from scipy.stats import sem

from harness.reporting.render import fmt
from harness.reporting.runs import RunSet, mean_eval_curve, run_values


def passk_stats(rs: RunSet, variant: str) -> Optional[dict[str, dict[str, Any]]]:
    """The unbiased pass@k (Chen et al. 2021, eq. 1) of ``variant`` for each k of
    :data:`harness.rl.evaluation.PASSK` its runs logged (``eval.passk_samples`` samples per held-out problem, drawn
    before the first update and after the last: ``eval/pass_at_{k}`` at steps 0 and the last, ``eval_final/pass_at_{k}``).

    Returns:
        ``{str(k): {"n", "mean", "se_seeds", "se_problems", "sft"}}``, None when no run logged a pass@k: ``mean`` the
        mean over seeds of the final pass@k (a probability in [0, 1]); ``se_seeds`` its standard error over seeds
        (SD/√n, None for one seed); ``se_problems`` the mean over runs of each run's own SE over the held-out problems
        (``eval_final/pass_at_{k}_se``; None when not logged); ``sft`` the mean over runs of the evaluation before the
        first update (the SFT policy on the same problems; None without it). Raises nothing.
        Example: final pass@16 of 0.70 and 0.76 (SEs over problems 0.028, 0.026), 0.72 and 0.70 before training →
        ``{"16": {"n": 2, "mean": 0.73, "se_seeds": 0.03, "se_problems": 0.027, "sft": 0.71}}``.
    """
    from harness.rl.evaluation import PASSK

    out: dict[str, dict[str, Any]] = {}
    for k in PASSK:
        final = run_values(rs, variant, f"eval_final/pass_at_{k}")
        if not final:
            continue
        ses = run_values(rs, variant, f"eval_final/pass_at_{k}_se")
        steps, before = mean_eval_curve(rs, variant, f"eval/pass_at_{k}")
        out[str(k)] = {"n": len(final), "mean": float(np.mean(final)),
                       "se_seeds": float(sem(final)) if len(final) > 1 else None,
                       "se_problems": float(np.mean(ses)) if ses else None,
                       "sft": before[0] if steps and steps[0] == 0 else None}
    return out or None


def passk_rows(summary: dict[str, Any], skip: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """The pass@k table of a verifier task: ``(ks, rows)``, the k columns any variant has and one markdown row per
    variant not in ``skip`` with a pass@k (:func:`passk_stats`); each cell reads
    ``SFT → end ± SE over seeds (SE over problems)`` (each part only where known: no SE over seeds from one seed),
    "–" where the variant lacks that k. ``([], [])`` when no
    variant logged a pass@k (runs without ``eval.passk_samples``). Raises nothing.

    Example: ``{"16": {"n": 8, "mean": 0.7559, "se_seeds": 0.0093, "se_problems": 0.027, "sft": 0.7148}}`` gives
    the cell ``0.7148 → 0.7559 ± 0.0093 (0.027)``.
    """
    stats_of = {v: d.get("passk") for v, d in summary["variants"].items() if v not in skip and d.get("passk")}
    ks = sorted({k for p in stats_of.values() for k in p}, key=int)

    def cell(p: Optional[dict[str, Any]]) -> str:
        if not p:
            return "–"
        within = f" ({fmt(p['se_problems'], 2)})" if p.get("se_problems") is not None else ""
        sft = f"{fmt(p['sft'])} → " if p.get("sft") is not None else ""
        spread = f" ± {fmt(p['se_seeds'], 2)}" if p.get("se_seeds") is not None else ""
        return f"{sft}{fmt(p['mean'])}{spread}{within}"

    rows = [f"| {v} | {max(x['n'] for x in p.values())} | " + " | ".join(cell(p.get(k)) for k in ks) + " |"
            for v, p in stats_of.items()]
    return ks, rows
