"""Claims that read both arms at a matched point of their evaluation curves instead of at the end of the run.

- ``pair_matched_kl/<m>``: ``eval/<m>`` of every run of the claim's two arms where its ``eval/kl`` first reaches
  the largest KL that every one of those runs reaches (Gao, Schulman & Hilton 2022 compare policies at equal KL).
- ``pair_matched_responses/<m>``: ``eval/<m>`` where the run's sampled responses reach the most that every run of
  the two arms sampled. An arm that samples more responses per gradient step (DAPO's dynamic sampling, arXiv
  2503.14476 §3.2) is read earlier in its run, at the other arm's sampling budget: the two meet at equal sampled
  responses instead of at equal gradient steps (ScaleRL, arXiv 2510.13786 §3, weighs batch compositions by the
  compute they spend).

Both interpolate linearly between evaluations (:func:`harness.reporting.runs.value_at_kl`, on the KL or on the
responses axis). Read by :func:`harness.reporting.summary.claim_values`.
"""

from __future__ import annotations

from typing import Optional

from harness.experiments.spec import PAIR_MATCHED, PAIR_MATCHED_RESPONSES, PAIR_READINGS
from harness.reporting.render import fmt
from harness.reporting.runs import RunSet, eval_curve, value_at_kl

#: The per-iteration count a ``pair_matched_responses/`` claim reads (cumulative over the run, every rollout round).
RESPONSES = "batch/responses_sampled"


def is_pair_reading(metric: str) -> bool:
    """Whether a claim ``metric`` is read off its two arms' curves at a matched point (:data:`PAIR_READINGS`)."""
    return metric.startswith(tuple(PAIR_READINGS))


def responses_at_evals(rs: RunSet, run_id: str) -> Optional[list[float]]:
    """The responses sampled before each of a run's held-out evaluations, in the order of :func:`eval_curve`.

    The evaluation at step ``s`` scores the policy after ``s`` updates, which were trained on the responses
    iteration ``s − 1`` had sampled so far (``batch/responses_sampled`` at step ``s − 1``, cumulative); step 0,
    the SFT policy, on none.

    Returns:
        one count per evaluation (responses, not prompts); None when the run logged no ``batch/responses_sampled``
        at some step an evaluation needs (runs from before it was logged).
    """
    h = rs.history[(rs.history["run_id"] == run_id) & (rs.history["metric"] == RESPONSES)]
    sampled = {int(s): float(v) for s, v in zip(h["step"], h["value"])}
    out = []
    for step in eval_curve(rs, run_id)["step"]:
        if int(step) > 0 and int(step) - 1 not in sampled:
            return None
        out.append(0.0 if int(step) == 0 else sampled[int(step) - 1])
    return out


def pair_values(rs: RunSet, a: str, b: str, metric: str) -> tuple[list[float], list[float], Optional[float]]:
    """The per-seed values of a matched-point claim: ``(values of a, values of b, target)``.

    Every counted run of ``a`` and ``b`` with the curve ``eval/<m>`` is read at ``target`` = the minimum over those
    runs of the largest point each reaches on the matching axis: ``eval/kl`` (nats) for ``pair_matched_kl/<m>``,
    the responses sampled (:func:`responses_at_evals`) for ``pair_matched_responses/<m>``. So the two arms meet at
    the largest KL, or the most responses, that both reach, whatever the ablation's other variants do.

    Returns:
        values in seed order (runs without the curve or its axis skipped), and the target; ``([], [], None)``
        when no run has both.
    Raises:
        ValueError: ``metric`` is not a matched-point reading (:func:`is_pair_reading`).
    """
    if not is_pair_reading(metric):
        raise ValueError(f"metric {metric!r} is not one of {', '.join(PAIR_READINGS)}")
    prefix = PAIR_MATCHED if metric.startswith(PAIR_MATCHED) else PAIR_MATCHED_RESPONSES
    col = "eval/" + metric.removeprefix(prefix)
    ids = {v: list(rs.runs.loc[rs.runs["variant"] == v].sort_values("seed")["run_id"]) if not rs.runs.empty else []
           for v in (a, b)}
    axes: dict[str, tuple[list[float], list[float]]] = {}
    for r in ids[a] + ids[b]:
        c = eval_curve(rs, r)
        if col not in c or not len(c):
            continue
        x = (list(c["eval/kl"]) if "eval/kl" in c else None) if prefix == PAIR_MATCHED else responses_at_evals(rs, r)
        if x is not None:
            axes[r] = (x, list(c[col]))
    if not axes:
        return [], [], None
    target = min(max(x) for x, _ in axes.values())
    vals = {v: [value_at_kl(*axes[r], target) for r in ids[v] if r in axes] for v in (a, b)}
    return vals[a], vals[b], target


def matched_point(metric: str, target: float) -> tuple[str, str]:
    """Where a matched-point claim was read, for its verdict row: ``(row key, evidence note)``; the key is
    ``matched_kl`` (nats) or ``matched_responses`` (responses sampled)."""
    if metric.startswith(PAIR_MATCHED_RESPONSES):
        return "matched_responses", (f"; both arms read at {target:.0f} sampled responses, the most every run of the "
                                     "two sampled (the arm that samples more is read earlier in its run)")
    return "matched_kl", f"; both arms read at {fmt(target)} nats, the largest KL every run of the two reaches"


__all__ = ["RESPONSES", "is_pair_reading", "responses_at_evals", "pair_values", "matched_point"]
