"""Report statistics on hand-computed numbers, and the kl_placement smoke report checked against
the numbers recomputed independently from the MLflow runs."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from ablation_fixtures import child_runs, kl_placement_smoke, results_env

from harness.ablate import Claim, VerdictRule, experiment_name, load_spec
from harness.report import (
    CURVE_METRICS,
    bootstrap_ci,
    diff_ci,
    fit_frontier,
    gao_rl_curve,
    iqm,
    judge_claim,
    probability_of_improvement,
)

# ------------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------------


def test_iqm_hand_computed():
    assert iqm([1, 2, 3, 4, 100]) == 3.0  # drops floor(5/4) = 1 value at each end: mean(2, 3, 4)
    assert iqm([1, 2, 3, 4, 5, 6, 7, 100]) == 4.5  # drops 2 at each end: mean(3, 4, 5, 6)
    assert iqm([0.2, 0.6]) == pytest.approx(0.4)  # nothing to drop with n < 4
    assert math.isnan(iqm([]))
    assert iqm([1.0, float("nan"), 3.0]) == 2.0  # non-finite values are ignored


def test_probability_of_improvement_hand_computed():
    # pairs (a_i > b_j) of [1,2,3] vs [0,2]: 1>0, 2>0, 2=2 (½), 3>0, 3>2 -> 4.5 of 6
    assert probability_of_improvement([1, 2, 3], [0, 2]) == 0.75
    # lower is better: pairs a_i < b_j: 1<2 and the tie 2=2 (½) -> 1.5 of 6
    assert probability_of_improvement([1, 2, 3], [0, 2], goal="min") == 0.25
    assert probability_of_improvement([5, 6], [1, 2]) == 1.0 and probability_of_improvement([1, 2], [5, 6]) == 0.0
    a, b = [0.3, 0.1, 0.7, 0.5], [0.2, 0.6, 0.4]
    brute = sum((x > y) + 0.5 * (x == y) for x, y in itertools.product(a, b)) / (len(a) * len(b))
    assert probability_of_improvement(a, b) == pytest.approx(brute)
    assert math.isnan(probability_of_improvement([], [1.0]))


def test_bootstrap_cis_hand_computed():
    # resampled means of [1, 2] take 1, 1.5, 2 with probability ¼, ½, ¼: the 2.5%/97.5% points are 1 and 2
    assert bootstrap_ci([1.0, 2.0]) == (1.0, 2.0)
    assert bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    lo, hi = bootstrap_ci([0.7])
    assert math.isnan(lo) and math.isnan(hi)
    # mean([1, 3] resampled) - 0: values 1, 2, 3 with probability ¼, ½, ¼
    assert diff_ci([1.0, 3.0], [0.0, 0.0]) == (1.0, 3.0)
    assert diff_ci([2.0, 2.0], [0.5, 0.5]) == (1.5, 1.5)
    assert all(math.isnan(v) for v in diff_ci([1.0], [0.0, 1.0]))
    # larger samples: the CI brackets the observed difference and is reproducible (fixed rng)
    rng = np.random.default_rng(1)
    a, b = rng.normal(1.0, 0.2, 8), rng.normal(0.5, 0.2, 8)
    lo, hi = diff_ci(a, b)
    assert lo < a.mean() - b.mean() < hi and (lo, hi) == diff_ci(a, b)


def test_gao_frontier_fit_recovers_known_coefficients():
    d = np.linspace(0.2, 4.0, 25)
    r = gao_rl_curve(d, 0.8, 0.35)
    assert r[0] == pytest.approx(0.2 * (0.8 - 0.35 * math.log(0.2)))
    fit = fit_frontier(np.concatenate([[0.0], d]), np.concatenate([[0.0], r]))  # d = 0 is dropped (log)
    assert fit["alpha"] == pytest.approx(0.8, abs=1e-6) and fit["beta"] == pytest.approx(0.35, abs=1e-6)
    assert fit["n_points"] == 25 and fit["rmse"] < 1e-6 and fit["error"] is None
    few = fit_frontier([0.5, 1.0], [0.1, 0.2])
    assert few["alpha"] is None and "only 2 points" in few["error"]


def _claim(expect: str, margin: float = 0.0) -> Claim:
    return Claim(claim="c", source="s", metric="final/gold", a="x", expect=expect, b="y", margin=margin)


RULE = VerdictRule(min_seeds=5)
HIGH, LOW, MID = [1.0, 1.1, 1.2, 1.3, 1.4], [0.0, 0.1, 0.2, 0.3, 0.4], [0.1, 0.5, 0.9, 1.3, 1.7]


@pytest.mark.parametrize(
    "expect, margin, a, b, verdict",
    [
        ("greater", 0.0, HIGH, LOW, "reproduced"),
        ("greater", 0.0, LOW, HIGH, "contradicted"),
        ("greater", 0.0, MID, HIGH, "inconclusive"),
        ("less", 0.0, LOW, HIGH, "reproduced"),
        ("less", 0.0, HIGH, LOW, "contradicted"),
        ("not_greater", 0.05, LOW, HIGH, "reproduced"),
        ("not_greater", 0.05, HIGH, LOW, "contradicted"),
        ("equivalent", 0.5, [1.0, 1.01, 1.02, 1.03, 1.04], [1.0, 1.02, 1.01, 1.04, 1.03], "reproduced"),
        ("equivalent", 0.5, HIGH, [v - 2 for v in HIGH], "contradicted"),
        ("equivalent", 0.5, MID, HIGH, "inconclusive"),
    ],
)
def test_claim_verdicts(expect, margin, a, b, verdict):
    out = judge_claim(_claim(expect, margin), a, b, RULE)
    assert out["verdict"] == verdict
    assert out["diff"] == pytest.approx(np.mean(a) - np.mean(b))
    assert (out["ci_low"], out["ci_high"]) == diff_ci(a, b)
    assert out["enough_seeds"] and "indicative" not in out["evidence"]


def test_claim_verdict_flags_few_seeds_and_missing_runs():
    out = judge_claim(_claim("greater"), [1.0, 1.1], [0.0, 0.1], RULE)
    assert out["verdict"] == "reproduced" and not out["enough_seeds"]
    assert "only 2 seeds per variant (< 5): indicative only" in out["evidence"]
    none = judge_claim(_claim("greater"), [1.0, 1.1], [], RULE)
    assert none["verdict"] == "inconclusive" and "not recorded" in none["evidence"]
    one = judge_claim(_claim("greater"), [1.0, 1.1], [0.2], RULE)
    assert one["verdict"] == "inconclusive" and "fewer than 2 seeds" in one["evidence"]


# ------------------------------------------------------------------------------------------------
# The kl_placement smoke report
# ------------------------------------------------------------------------------------------------


def test_kl_placement_report_structure_and_numbers_match_mlflow():
    report = kl_placement_smoke()["report"]
    out = report.parent
    text = report.read_text()
    for section in ("# Ablation `kl_placement` (smoke scale)", "## Variants", "## Verdicts on the published claims",
                    "## Final metrics", "## Learning curves", "## Gold reward vs KL frontier", "## Failed runs",
                    "## Sample completions (end of training)"):
        assert section in text
    for png in ("learning_curves.png", "final_metrics.png", "frontier.png", "claims.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({png})" in text
    summary = json.loads((out / "summary.json").read_text())
    with results_env():
        spec = load_spec("kl_placement")
    assert summary["scale"] == "smoke" and summary["baseline"] == "reward" and summary["failed"] == []
    assert list(summary["variants"]) == ["reward", "loss", "none"]

    # recompute from MLflow with the client (not the report's pandas path): the latest FINISHED run per (variant, seed)
    latest: dict[tuple[str, int], object] = {}
    for r in sorted(child_runs(experiment_name("kl_placement")), key=lambda r: r.info.start_time):
        if r.info.status == "FINISHED" and r.data.tags["scale"] == "smoke":
            latest[(r.data.tags["variant"], int(r.data.tags["seed"]))] = r
    values = {(v, m): [latest[(v, s)].data.metrics[m] for s in (0, 1)]
              for v in spec.variants for m in ("final/gold", "final/score", "final/kl")}
    for v in spec.variants:
        entry = summary["variants"][v]
        assert entry["seeds"] == [0, 1] and entry["run_ids"] == [latest[(v, 0)].info.run_id, latest[(v, 1)].info.run_id]
        for m, goal in (("final/gold", "max"), ("final/score", "max"), ("final/kl", "min")):
            st, vals = entry["final"][m], values[(v, m)]
            assert st["n"] == 2 and st["values"] == vals
            assert st["mean"] == pytest.approx(sum(vals) / 2, rel=1e-12) and st["iqm"] == pytest.approx(sum(vals) / 2, rel=1e-12)
            lo, hi = bootstrap_ci(vals)
            assert (st["ci_low"], st["ci_high"]) == (pytest.approx(lo), pytest.approx(hi))
            assert min(vals) - 1e-12 <= st["ci_low"] <= st["ci_high"] <= max(vals) + 1e-12
            if v == "reward":
                assert st["p_improvement"] is None
            else:
                base = values[("reward", m)]
                better = (lambda x, y: x > y) if goal == "max" else (lambda x, y: x < y)
                brute = sum(better(x, y) + 0.5 * (x == y) for x in vals for y in base) / 4
                assert st["p_improvement"] == pytest.approx(brute)

    # verdicts: one per claim, the deciding numbers equal the recomputed ones
    assert [v["claim"] for v in summary["verdicts"]] == [c.claim for c in spec.claims]
    for claim, ver in zip(spec.claims, summary["verdicts"]):
        a, b = values[(claim.a, claim.metric)], values[(claim.b, claim.metric)]
        assert ver["verdict"] in ("reproduced", "contradicted", "inconclusive") and ver["source"] == claim.source
        assert ver["diff"] == pytest.approx(sum(a) / 2 - sum(b) / 2, rel=1e-9, abs=1e-12)
        assert (ver["ci_low"], ver["ci_high"]) == (pytest.approx(diff_ci(a, b)[0]), pytest.approx(diff_ci(a, b)[1]))
        assert ver["enough_seeds"] is False and "indicative only" in ver["evidence"]

    # frontier: refit on the per-iteration points read with get_metric_history
    with results_env():
        from harness import tracking

        c = tracking.client()
        for v in spec.variants:
            d, g = [], []
            for s in (0, 1):
                run = latest[(v, s)]
                kl = {m.step: m.value for m in c.get_metric_history(run.info.run_id, "objective/kl")}
                gold = {m.step: m.value for m in c.get_metric_history(run.info.run_id, "objective/gold")}
                assert set(kl) == set(gold) == set(range(3))
                for step in sorted(kl):
                    d.append(math.sqrt(max(kl[step], 0.0)))
                    g.append(gold[step] - run.data.metrics["initial/gold"])
            fit = fit_frontier(d, g)
            got = summary["variants"][v]["frontier"]
            assert got["n_points"] == fit["n_points"]
            if fit["alpha"] is not None:
                assert got["alpha"] == pytest.approx(fit["alpha"], rel=1e-6) and got["beta"] == pytest.approx(fit["beta"], rel=1e-6)
            # every curve metric of every counted run was read
            for m in CURVE_METRICS:
                assert len(c.get_metric_history(latest[(v, 0)].info.run_id, m)) == 3


def test_metric_stats_orientation_by_goal():
    from harness.report import metric_stats

    kl = metric_stats([0.1, 0.2, 0.3], [0.2, 0.4], goal="min")  # lower KL than the baseline is better
    # pairs x < y: 0.1<0.2, 0.1<0.4, 0.2=0.2 (½), 0.2<0.4, 0.3<0.4 -> 4.5 of 6
    assert kl["p_improvement"] == 0.75 and kl["mean"] == pytest.approx(0.2) and kl["n"] == 3
    assert metric_stats([1.0, 2.0], [0.0, 1.0], goal="none")["p_improvement"] is None
    assert metric_stats([1.0, 2.0], None, goal="max")["p_improvement"] is None  # the baseline itself
