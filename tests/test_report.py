"""Report statistics on hand-computed numbers, and the kl_placement smoke report checked against
the numbers recomputed independently from the MLflow runs."""

from __future__ import annotations

import itertools
import json
import pathlib
import math
import re

import numpy as np
import pytest

from ablation_fixtures import child_runs, kl_placement_smoke, results_env

from harness.analysis import stats
from harness.experiments.ablate import Claim, VerdictRule, experiment_name, load_spec
from harness.analysis.frontier import fit_gao
from harness.reporting.plots import CURVE_METRICS
from harness.reporting.runs import value_at_kl
from harness.analysis.verdicts import judge_claims

# ------------------------------------------------------------------------------------------------
# Statistics and verdicts
# ------------------------------------------------------------------------------------------------


def test_iqm_hand_computed():
    assert stats.iqm([1, 2, 3, 4, 100]) == 3.0  # drops floor(5/4) = 1 value at each end: mean(2, 3, 4)
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 100]) == 4.5  # drops 2 at each end: mean(3, 4, 5, 6)
    assert stats.iqm([0.2, 0.6]) == pytest.approx(0.4)  # nothing to drop with n < 4
    assert math.isnan(stats.iqm([]))
    assert stats.iqm([1.0, float("nan"), 3.0]) == 2.0  # non-finite values are ignored


def test_probability_of_improvement_hand_computed():
    # pairs (a_i > b_j) of [1,2,3] vs [0,2]: 1>0, 2>0, 2=2 (½), 3>0, 3>2 -> 4.5 of 6
    assert stats.probability_of_improvement([1, 2, 3], [0, 2]) == 0.75
    # lower is better: pairs a_i < b_j: 1<2 and the tie 2=2 (½) -> 1.5 of 6
    assert stats.probability_of_improvement([1, 2, 3], [0, 2], goal="min") == 0.25
    assert stats.probability_of_improvement([5, 6], [1, 2]) == 1.0 and stats.probability_of_improvement([1, 2], [5, 6]) == 0.0
    a, b = [0.3, 0.1, 0.7, 0.5], [0.2, 0.6, 0.4]
    brute = sum((x > y) + 0.5 * (x == y) for x, y in itertools.product(a, b)) / (len(a) * len(b))
    assert stats.probability_of_improvement(a, b) == pytest.approx(brute)
    assert math.isnan(stats.probability_of_improvement([], [1.0]))


def test_value_at_matched_kl_hand_computed():
    assert value_at_kl([0.0, 2.0, 6.0], [0.1, 0.3, 0.5], 4.0) == pytest.approx(0.4)  # halfway from KL 2 to 6
    assert value_at_kl([0.0, 2.0, 6.0], [0.1, 0.3, 0.5], 2.0) == pytest.approx(0.3)
    assert value_at_kl([0.0, 5.0, 3.0, 8.0], [0.0, 1.0, 2.0, 3.0], 4.0) == pytest.approx(0.8)  # the first crossing
    assert value_at_kl([0.0, 1.0], [0.1, 0.2], 0.0) == 0.1
    assert math.isnan(value_at_kl([0.0, 1.0], [0.1, 0.2], 3.0))


def _claim(expect: str, margin: float = 0.05, kind: str = "finding") -> Claim:
    return Claim(claim="c", kind=kind, source="s", section="t", setting_note="n", metric="eval_final/gold", a="x",
                 expect=expect, b="y", margin=margin)


RULE = VerdictRule(min_seeds=5)
HIGH, LOW, MID = [1.0, 1.1, 1.2, 1.3, 1.4], [0.0, 0.1, 0.2, 0.3, 0.4], [0.1, 0.5, 0.9, 1.3, 1.7]


@pytest.mark.parametrize(
    "expect, margin, a, b, verdict",
    [
        ("greater", 0.05, HIGH, LOW, "reproduced"),
        ("greater", 0.05, LOW, HIGH, "contradicted"),
        ("greater", 0.05, MID, HIGH, "inconclusive"),
        ("less", 0.05, LOW, HIGH, "reproduced"),
        ("less", 0.05, HIGH, LOW, "contradicted"),
        ("not_greater", 0.05, LOW, HIGH, "reproduced"),
        ("not_greater", 0.05, HIGH, LOW, "contradicted"),
        # exceeds: d = 1.0 (SE 0.1) against m = 0.5 (t = 5), 1.5 (t = −5: contradicted though d > 0) and 1.0 (t = 0)
        ("exceeds", 0.5, HIGH, LOW, "reproduced"),
        ("exceeds", 1.5, HIGH, LOW, "contradicted"),
        ("exceeds", 1.0, HIGH, LOW, "inconclusive"),
        ("equivalent", 0.5, [1.0, 1.01, 1.02, 1.03, 1.04], [1.0, 1.02, 1.01, 1.04, 1.03], "reproduced"),
        ("equivalent", 0.5, HIGH, [v - 2 for v in HIGH], "contradicted"),
        ("equivalent", 0.5, MID, HIGH, "inconclusive"),
    ],
)
def test_claim_verdicts(expect, margin, a, b, verdict):
    out = judge_claims([_claim(expect, margin)], [(a, b)], RULE)[0]
    assert out["verdict"] == verdict and out["decisive"] == (verdict != "inconclusive")
    w = stats.welch(a, b)
    assert out["diff"] == pytest.approx(np.mean(a) - np.mean(b)) and (out["ci_low"], out["ci_high"]) == pytest.approx(w.ci(0.95))
    assert out["p_adj"] == out["p_raw"] and out["enough_seeds"]  # one claim: Holm changes nothing
    alpha = 0.04 if expect in ("greater", "less") else 0.05  # a directional claim's margin test takes 0.01 of α
    assert out["mde"] == pytest.approx(stats.mde(w.sd_a, w.sd_b, 5, 5, alpha)) and out["seeds_needed"] >= 2


def test_an_equivalence_shown_with_an_interval_that_excludes_zero_says_the_arms_still_differ():
    """Equivalence within 0.5 of a = b + 0.1 (SDs ~0.016): reproduced, and the 95% interval of the difference lies
    above 0, so the row says that x is higher by less than the margin; the equivalence whose interval covers 0
    (a and b shuffled copies) has no such caveat."""
    a, b = [1.10, 1.11, 1.12, 1.13, 1.14], [1.00, 1.02, 1.01, 1.04, 1.03]
    out = judge_claims([_claim("equivalent", 0.5)], [(a, b)], RULE)[0]
    lo, hi = lo_a, hi_a = stats.welch(a, b).ci(0.95)
    assert out["verdict"] == "reproduced" and lo > 0
    assert out["caveats"] == [f"not zero: the interval [{lo:+.3g}, {hi:+.3g}] excludes 0 (x is higher), a difference "
                              "smaller than the margin 0.5"]
    out = judge_claims([_claim("equivalent", 0.5)], [(b, a)], RULE)[0]
    assert out["verdict"] == "reproduced" and "(y is higher)" in out["caveats"][0]
    same = judge_claims([_claim("equivalent", 0.5)], [([1.0, 1.01, 1.02, 1.03, 1.04], [1.0, 1.02, 1.01, 1.04, 1.03])], RULE)[0]
    assert same["verdict"] == "reproduced" and same["caveats"] == []
    # within 0.15, a − b ≈ 0.1 [lo, hi] with hi above the margin: TOST fails (inconclusive), yet the arms differ
    near = judge_claims([_claim("equivalent", 0.15)], [([1.06, 1.10, 1.14, 1.18, 1.22], b)], RULE)[0]
    lo, hi = stats.welch([1.06, 1.10, 1.14, 1.18, 1.22], b).ci(0.95)
    assert near["verdict"] == "inconclusive" and lo > 0 and hi > 0.15
    assert near["caveats"] == [f"not zero: the interval [{lo:+.3g}, {hi:+.3g}] excludes 0 (x is higher; a fixed-n "
                               "interval, not adjusted for the looks or Holm); equivalence within the margin 0.15 is "
                               "neither shown nor ruled out"]
    far = judge_claims([_claim("equivalent", 0.5)], [([v + 2 for v in a], b)], RULE)[0]
    assert far["verdict"] == "contradicted" and far["caveats"] == []  # a shown difference beyond the margin says more
    # shown at fixed n, but a staged run's boundary has not been crossed yet (look 1 of 2): the row is undecided, and
    # its caveat says so instead of the fixed-n "smaller than the margin"
    from harness.analysis.verdicts import apply_sequential

    staged = judge_claims([_claim("equivalent", 0.5)], [(a, b)], RULE)[0]
    apply_sequential(staged, {"level": 0.05, "path": [{"crossed": False}], "decided": False, "n": 5, "at_cap": False},
                     RULE, 5, 10)
    assert staged["verdict"] == "undecided (n = 5 of 10 per arm)"
    early = judge_claims([_claim("equivalent", 0.5)], [(a[:4], b[:4])], RULE)[0]  # an arm short of the first look
    apply_sequential(early, {"level": 0.05, "path": [], "decided": False, "n": 0, "at_cap": False}, RULE, 5, 10)
    assert early["verdict"] == "undecided (no look yet: the first at 5 seeds per arm)" and not early["decisive"]
    assert [c for c in staged["caveats"] if c.startswith("not zero")] == [
        f"not zero: the interval [{lo_a:+.3g}, {hi_a:+.3g}] excludes 0 (x is higher; a fixed-n interval, not adjusted "
        "for the looks or Holm); equivalence within the margin 0.5 is neither shown nor ruled out"]


def test_a_directional_claim_whose_effect_is_shown_below_its_margin():
    """a − b = 1.2 − 1.15 = +0.05 on 5 seeds each: the test of d = 0 decides nothing (Welch p ≈ 0.55), but a margin of
    1.0 is ruled out: the one-sided Welch test of d ≥ 1, by scipy's own Welch test on a shifted by the margin, gives
    p ≈ 3e-6 ≤ 0.01 (the margin tests' part of α, one claim): below margin. With margin_alpha 0 the rule makes no
    margin test and the claim stays inconclusive; a claim of the other direction is tested against −m; a negative
    control gets no margin test."""
    from scipy.stats import ttest_ind

    a, b = [1.0, 1.1, 1.2, 1.3, 1.4], [1.05, 1.15, 0.95, 1.25, 1.35]
    out = judge_claims([_claim("greater", 1.0)], [(a, b)], RULE)[0]
    shifted = ttest_ind(np.array(a) - 1.0, b, equal_var=False, alternative="less").pvalue
    assert out["p_margin"] == pytest.approx(shifted, rel=1e-9) and shifted < 1e-4
    assert out["p_raw"] == pytest.approx(ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9) and out["p_raw"] > 0.5
    assert out["verdict"] == "below margin" and out["decisive"] and out["margin_level"] == pytest.approx(0.01)
    assert out["caveats"] == ["below margin: x − y < 1 shown, so any effect in the claimed direction is smaller than the "
                              "margin 1 the claim is judged at"]
    assert "margin test (H0: x − y ≥ 1): one-sided p = " in out["evidence"]
    off = judge_claims([_claim("greater", 1.0)], [(a, b)], VerdictRule(min_seeds=5, margin_alpha=0.0))[0]
    assert off["verdict"] == "inconclusive" and off["p_margin"] is None
    less = judge_claims([_claim("less", 1.0)], [(b, a)], RULE)[0]  # b − a = −0.05: d ≤ −1 ruled out
    assert less["verdict"] == "below margin" and less["p_margin"] == pytest.approx(shifted, rel=1e-9)
    assert judge_claims([_claim("greater", 1.0, "control")], [(a, b)], RULE)[0]["verdict"] == "inconclusive"
    with pytest.raises(ValueError, match="margin_alpha: must be < alpha"):
        VerdictRule(margin_alpha=0.05)


def test_a_decisive_effect_below_the_margin_carries_a_caveat():
    # d = 1.0 - 0.0 = 1: decisive either way; below a margin of 2 it is flagged, above a margin of 0.5 it is not
    small = judge_claims([_claim("greater", margin=2.0)], [(HIGH, LOW)], RULE)[0]
    assert small["verdict"] == "reproduced" and small["caveats"] == ["small effect: |d| = 1 is below the claim's margin 2"]
    assert judge_claims([_claim("greater", margin=0.5)], [(HIGH, LOW)], RULE)[0]["caveats"] == []


def test_holm_across_claims_and_no_verdict_below_min_seeds():
    # each claim alone: Welch p = 0.0282 (t = −2.74, df 7.2) < 0.05 -> reproduced; Holm doubles both: 0.0564 -> inconclusive
    a, b = [1.0, 2.0, 3.0, 2.0, 2.0], [3.0, 4.0, 5.0, 2.5, 3.0]
    alone = judge_claims([_claim("less")], [(a, b)], RULE)[0]
    assert alone["verdict"] == "reproduced" and alone["p_raw"] == pytest.approx(0.0281932, abs=1e-6)
    both = judge_claims([_claim("less"), _claim("less")], [(a, b), (a, b)], RULE)
    assert [r["p_adj"] for r in both] == [pytest.approx(2 * alone["p_raw"])] * 2
    assert [r["verdict"] for r in both] == ["inconclusive", "inconclusive"]
    few = judge_claims([_claim("greater")], [([1.0, 1.1, 1.2], [0.0, 0.1, 0.2])], RULE)[0]
    assert few["verdict"] == "not enough seeds (n = 3 < 5)" and not few["decisive"] and few["p_raw"] < 0.05
    none = judge_claims([_claim("greater")], [([1.0, 1.1], [])], RULE)[0]
    assert none["verdict"] == "not enough seeds (n = 0 < 5)" and "not recorded" in none["evidence"]


def test_mechanism_checks_pass_or_fail():
    on, off = [0.31, 0.35, 0.29, 0.33, 0.30], [0.0] * 5
    ok = judge_claims([_claim("greater", 0.01, "mechanism")], [(on, off)], RULE)[0]
    assert ok["verdict"] == "pass" and ok["kind"] == "mechanism"
    bad = judge_claims([_claim("greater", 0.01, "mechanism")], [(off, on)], RULE)[0]
    assert bad["verdict"] == "fail"


# ------------------------------------------------------------------------------------------------
# The kl_placement smoke report
# ------------------------------------------------------------------------------------------------


def test_kl_placement_report_structure_and_numbers_match_mlflow():
    report = kl_placement_smoke()["report"]
    out = report.parent
    text = report.read_text()
    sections = ("# Ablation `kl_placement` (smoke scale)", "## Answer", "## Variants", "## Verdicts in full",
                "## Final metrics", "## Learning curves", "## Reward vs KL frontier", "## Failed runs",
                "## Sample completions (end of training)", "## Provenance")
    assert [text.index(sec) for sec in sections] == sorted(text.index(sec) for sec in sections)
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[-1] == "## Provenance" and "Runs counted: " in text.split("## Provenance")[1]
    # which gold judged it, before the answer: the spec's, with the naturalness head trained against symbol soup
    assert text.split("## Answer")[0].count("**Gold.** sentiment + naturalness (loops_and_symbol_soup): the sentiment "
                                            "model less a penalty") == 1
    # a task with a learned reward model: its samples show the RM score and VADER, its frontier Gao et al.'s reading
    assert text.count("| prompt | response | RM score | lexicon (VADER) |") == 3 and "scored by a verifier" not in text
    assert "Gao, Schulman & Hilton (2022): with d = √KL(π‖π_init)" in text
    # its verdicts are conditional on the 8 held-out prompts of the smoke scale; gold is no 0/1 outcome, so no bound
    assert ("**Fixed evaluation prompts:** every run is evaluated on the same 8 held-out prompts (`eval.num_prompts`; 2 "
            "sampled responses each), so each interval") in text and "the SE at a rate of 0.5" not in text
    frontier = text.split("## Reward vs KL frontier")[1].split("## Failed runs")[0]
    assert all(frontier.count(f"| {v} | {r} |") == 1 for v in ("reward", "loss", "none") for r in ("gold", "proxy"))
    for png in ("learning_curves.png", "final_metrics.png", "frontier.png", "claims.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({png})" in text
    summary = json.loads((out / "summary.json").read_text())
    with results_env():
        spec = load_spec("kl_placement")
    assert summary["scale"] == "smoke" and summary["baseline"] == "reward" and summary["failed"] == []
    # the answer first: every claim's title, effect and verdict within the first 40 lines, with the claims figure
    first = "\n".join(text.splitlines()[:40])
    for v in summary["verdicts"]:
        assert f"| {v['title']} | {v['kind']} | {v['n_a']} / {v['n_b']} |" in first and v["verdict"] in first
        assert len(v["title"]) <= 80
    assert "![claims](claims.png)" in first
    # the matched-KL claim says at which KL both arms were read: the report's one target, min over runs of max KL
    [matched] = [v for v in summary["verdicts"] if v["metric"] == "matched_kl/gold"]
    assert matched["matched_kl"] == summary["matched_kl"] > 0
    assert f"`matched_kl/gold` at {summary['matched_kl']:.3g} nats |" in first
    assert all("matched_kl" not in v for v in summary["verdicts"] if not v["metric"].startswith("matched_kl/"))
    assert list(summary["variants"]) == ["reward", "loss", "none"]
    # the SFT policy's best-of-n curve of the runs' pipeline is in every report: n = 1 .. 16 at the smoke scale
    [bon] = summary["bon"]  # one pipeline, so one curve, shared by every variant
    assert bon["variants"] == ["reward", "loss", "none"]
    assert bon["n"] == [1, 2, 4, 8, 16] and bon["kl"][1] == pytest.approx(math.log(2) - 0.5)
    # gold gain over best-of-1 at n = 1: a column's mean less the same column's mean, reduced in another order
    assert bon["gold_gain"][0] == pytest.approx(0.0, abs=1e-12)
    assert "| best-of-n (SFT, n ≤ 16) | gold |" in text
    # provenance: a display URI (no absolute path), the pipeline's stage keys, the rule
    assert not summary["tracking_uri"].startswith("sqlite:////") and str(out.parent.parent) not in json.dumps(summary)
    from harness.tasks.review_sentiment.stages import STAGES

    assert set(summary["pipeline"]) == set(STAGES)  # every stage, the gold RM, proxy data and best-of-n included
    assert all(len(keys) == 1 for keys in summary["pipeline"].values())  # one shared pipeline for every seed
    assert summary["rule"] == {"rule": "welch", "alpha": 0.05, "margin_alpha": 0.01, "min_seeds": 10, "power": 0.8}

    # recompute from MLflow with the client (not the report's pandas path): the latest FINISHED run per (variant, seed)
    latest: dict[tuple[str, int], object] = {}
    for r in sorted(child_runs(experiment_name("kl_placement")), key=lambda r: r.info.start_time):
        if r.info.status == "FINISHED" and r.data.tags["scale"] == "smoke":
            latest[(r.data.tags["variant"], int(r.data.tags["seed"]))] = r
    with results_env():
        from harness.infra import tracking

        c = tracking.client()
        curves = {key: {m: [(p.step, p.value) for p in sorted(c.get_metric_history(run.info.run_id, m), key=lambda p: p.step)]
                        for m in ("eval/kl", "eval/gold", "eval/proxy")} for key, run in latest.items()}
    # the held-out evaluation ran before the first update, after every iteration (smoke: eval.every = 1) and at the end
    for key, cv in curves.items():
        assert [st for st, _ in cv["eval/gold"]] == [0, 1, 2, 3]
        assert cv["eval/kl"][0][1] == 0.0  # the policy is the reference before any update
        assert latest[key].data.metrics["eval_final/gold"] == cv["eval/gold"][-1][1]
        assert latest[key].data.metrics["initial/gold"] == cv["eval/gold"][0][1]
    # the SFT policy is evaluated on the same prompts in every run, with a sampling draw seeded by the run's seed:
    # runs that share a seed see one draw (one initial gold per seed), different seeds independent draws
    by_seed: dict[int, set] = {}
    for (variant, seed), cv in curves.items():
        by_seed.setdefault(seed, set()).add(cv["eval/gold"][0][1])
    assert all(len(v) == 1 for v in by_seed.values()) and len({next(iter(v)) for v in by_seed.values()}) == len(by_seed)
    target = min(max(v for _, v in cv["eval/kl"]) for cv in curves.values())
    assert summary["matched_kl"] == pytest.approx(target)
    # the length check: each arm's mean held-out length before the first update (the SFT policy) and at the end
    for v, d in summary["variants"].items():
        runs = [run for (variant, _), run in latest.items() if variant == v]
        hist = [sorted(c.get_metric_history(run.info.run_id, "eval/length"), key=lambda p: p.step) for run in runs]
        sft, end = float(np.mean([h[0].value for h in hist])), float(np.mean([h[-1].value for h in hist]))
        assert d["length"] == {"sft": pytest.approx(sft), "final": pytest.approx(end), "ratio": pytest.approx(end / sft),
                               "below_floor": end / sft < 0.5}
    assert "| held-out length (tokens): SFT → end |" in text

    def values(v: str, m: str) -> list[float]:
        if m.startswith("matched_kl/"):
            cv = [curves[(v, s)] for s in (0, 1)]
            q = "eval/" + m.split("/")[1]
            return [value_at_kl([x for _, x in k["eval/kl"]], [x for _, x in k[q]], target) for k in cv]
        return [latest[(v, s)].data.metrics[m] for s in (0, 1)]

    for v in spec.variants:
        entry = summary["variants"][v]
        assert entry["seeds"] == [0, 1] and entry["run_ids"] == [latest[(v, 0)].info.run_id, latest[(v, 1)].info.run_id]
        for m in ("eval_final/gold", "matched_kl/gold", "eval_final/kl"):
            st, vals = entry["final"][m], values(v, m)
            assert st["n"] == 2 and st["values"] == pytest.approx(vals, rel=1e-12)
            assert st["mean"] == pytest.approx(sum(vals) / 2, rel=1e-12) and st["iqm"] is None  # n < 8: no IQM
            assert (st["ci_low"], st["ci_high"]) == (pytest.approx(stats.mean_ci(vals)[0]), pytest.approx(stats.mean_ci(vals)[1]))
            if v == "reward":
                assert st["p_improvement"] is None
            else:
                base = values("reward", m)
                better = (lambda x, y: x > y) if spec.metric_goal(m) == "max" else (lambda x, y: x < y)
                brute = sum(better(x, y) + 0.5 * (x == y) for x in vals for y in base) / 4
                assert st["p_improvement"] == pytest.approx(brute)

    # verdicts: one per claim; Welch numbers recomputed; Holm over the raw p-values; no verdict at n = 2 < 10
    assert [v["claim"] for v in summary["verdicts"]] == [c.claim for c in spec.claims]
    raw = []
    for claim, ver in zip(spec.claims, summary["verdicts"]):
        a, b = values(claim.a, claim.metric), values(claim.b, claim.metric)
        w = stats.welch(a, b)
        assert ver["diff"] == pytest.approx(w.diff, rel=1e-9, abs=1e-12) and ver["kind"] == claim.kind
        assert (ver["ci_low"], ver["ci_high"]) == (pytest.approx(w.ci()[0]), pytest.approx(w.ci()[1]))
        assert ver["verdict"] == "not enough seeds (n = 2 < 10)" and not ver["decisive"]
        assert ver["verdict"] in text
        raw.append(ver["p_raw"])
    assert [v["p_adj"] for v in summary["verdicts"]] == pytest.approx(stats.holm(raw))

    # runs.csv: every per-iteration metric of every counted run, equal to MLflow's history
    import pandas as pd

    csv = pd.read_csv(out / "runs.csv")
    assert set(csv["run_id"]) == {r.info.run_id for r in latest.values()}
    assert set(CURVE_METRICS) <= set(csv["metric"])
    for key, cv in curves.items():
        sub = csv[(csv["run_id"] == latest[key].info.run_id) & (csv["metric"] == "eval/gold")].sort_values("step")
        assert list(sub["value"]) == pytest.approx([x for _, x in cv["eval/gold"]], rel=1e-5)

    # frontier: refit on the evaluation points read with get_metric_history
    for v in spec.variants:
        d, g, per_seed = [], [], []
        for s in (0, 1):
            kl, gold = dict(curves[(v, s)]["eval/kl"]), dict(curves[(v, s)]["eval/gold"])
            ds = [math.sqrt(max(kl[step], 0.0)) for step in sorted(kl)]
            gs = [gold[step] - gold[0] for step in sorted(kl)]
            d += ds
            g += gs
            per_seed.append(fit_gao(ds, gs, "rl")["beta"])
        fit = fit_gao(d, g, "rl")
        got = summary["variants"][v]["frontier"]["gold"]
        assert set(summary["variants"][v]["frontier"]) == {"gold", "proxy"}
        assert got["n_points"] == fit["n_points"]
        if fit["alpha"] is not None:
            assert got["alpha"] == pytest.approx(fit["alpha"], rel=1e-6) and got["beta"] == pytest.approx(fit["beta"], rel=1e-6)
        fitted = [b for b in per_seed if b is not None]  # the per-seed t interval: mean ± t(0.975, n−1)·sd/√n
        assert got["seed_t"]["n_fitted"] == len(fitted)
        if len(fitted) == 2:
            half = 12.706205 * abs(fitted[0] - fitted[1]) / math.sqrt(2) / math.sqrt(2)
            m = (fitted[0] + fitted[1]) / 2
            assert got["seed_t"]["beta_ci"] == pytest.approx([m - half, m + half], rel=1e-5, abs=1e-9)


def test_report_all_keeps_a_report_whose_runs_no_longer_match_the_spec_and_says_why(tmp_path, monkeypatch):
    """The kl_placement smoke runs under a spec whose smoke scale now trains 4 iterations (3 before): their config hashes
    differ, so no run counts; report-all keeps the committed report and says how many runs it ignored."""
    from harness.infra import tracking
    from harness.experiments.spec import ablations_dir
    from harness.errors import HarnessError
    from harness.reporting.ablation import write_report
    from harness.reporting.scorecard import report_all

    kl_placement_smoke()
    with results_env():
        uri = tracking.tracking_uri()
        text = (ablations_dir() / "kl_placement.yaml").read_text()
    recorded = sum(r.data.tags.get("scale") == "smoke" for r in child_runs(experiment_name("kl_placement")))
    assert recorded >= 6  # 3 variants × 2 seeds, and any attempt another test added
    specs = tmp_path / "ablations"
    specs.mkdir()
    assert "  smoke: {seeds: 2}\n" in text
    (specs / "kl_placement.yaml").write_text(text.replace("  smoke: {seeds: 2}\n",
                                                          "  smoke: {seeds: 2, overrides: {ppo: {total_iterations: 4}}}\n"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the smoke runs' store; reports go under tmp_path
    monkeypatch.setenv("HARNESS_RESULTS", str(tmp_path))
    monkeypatch.setenv("HARNESS_ABLATIONS", str(specs))
    with pytest.raises(HarnessError) as err:
        write_report("kl_placement", scale="smoke", require_runs=True)
    assert str(err.value) == (f"no finished run of ablation 'kl_placement' at scale smoke ({recorded} recorded run(s) at "
                              "that scale ignored: their variant or config hash does not match the current spec)")
    lines: list[str] = []
    with pytest.raises(HarnessError, match=r"^nothing to report: no shipped ablation has a report under "):
        report_all(scale="smoke", echo=lines.append)  # nothing else is reported here: no scorecard of no rows
    assert lines == [f"kept the committed report of kl_placement: {err.value}"]
    assert not (tmp_path / "reports" / "README.md").exists() and not (tmp_path / "reports" / "kl_placement").exists()
    from typer.testing import CliRunner

    from harness.cli import app

    r = CliRunner().invoke(app, ["report-all", "--no-refresh"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error: nothing to report: "), r.output
    monkeypatch.setenv("HARNESS_ABLATIONS", str(tmp_path / "none"))
    (tmp_path / "none").mkdir()
    r = CliRunner().invoke(app, ["report-all"])
    assert r.exit_code != 0 and r.output == "error: nothing to report: no ablation spec is shipped (ablations/*.yaml)\n"


def test_report_all_at_a_scale_with_no_runs_keeps_the_report_and_names_the_scale(tmp_path, monkeypatch):
    """An experiment whose runs are all at another scale (here: smoke runs, report-all at the default scale) has
    nothing to report at that scale: one line naming the scale, not a pandas KeyError from an empty selection."""
    from harness.infra import tracking
    from harness.errors import HarnessError
    from harness.reporting.ablation import write_report
    from harness.reporting.scorecard import report_all

    kl_placement_smoke()
    with results_env():
        uri = tracking.tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("HARNESS_RESULTS", str(tmp_path))
    with pytest.raises(HarnessError, match=r"^no finished run of ablation 'kl_placement' at scale default$"):
        write_report("kl_placement", scale="default", require_runs=True)
    lines: list[str] = []
    with pytest.raises(HarnessError, match=r"^nothing to report"):
        report_all(scale="default", echo=lines.append)
    assert "kept the committed report of kl_placement: no finished run of ablation 'kl_placement' at scale default" in lines


def test_reading_runs_leaves_the_tracking_uri_variable_as_it_was():
    """``mlflow.set_tracking_uri`` writes ``$MLFLOW_TRACKING_URI``; reading an ablation's runs must not leave it set,
    or every experiment created later in the process gets MLflow's default artifact root (``./mlruns`` of the working
    directory) instead of ``<results>/mlartifacts``."""
    import os

    import mlflow

    from harness.infra import tracking
    from harness.reporting.runs import load_runs

    kl_placement_smoke()
    with results_env():
        mlflow.set_tracking_uri(None)  # MLflow's fluent store as a new process has it (it writes the variable on a change)
        rs = load_runs("kl_placement", "smoke")
        assert len(rs.runs) >= 6 and "MLFLOW_TRACKING_URI" not in os.environ
        assert tracking.artifact_root() == (tracking.results_root() / "mlartifacts").as_uri()


def test_artifact_root_defers_only_to_a_tracking_server(tmp_path, monkeypatch):
    """A server keeps its own artifact default; a database this process opens itself gets a local root (MLflow's
    fallback is ./mlruns of the working directory): beside a sqlite file, else under the results directory."""
    from harness.infra import tracking

    monkeypatch.setenv("HARNESS_RESULTS", str(tmp_path / "res"))
    results = (tracking.results_root() / "mlartifacts").as_uri()
    cases = {"": results, "http://host:5000": None, "HTTPS://user:pw@host": None, "databricks": None,
             f"sqlite:///{tmp_path}/db/store.db": (tmp_path / "db" / "mlartifacts").as_uri(),
             "postgresql://user@host/mlflow": results, "sqlite:///:memory:": results}
    for uri, expected in cases.items():
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        if not uri:
            monkeypatch.delenv("MLFLOW_TRACKING_URI")
        assert tracking.artifact_root() == expected, uri


def test_a_pair_matched_kl_claim_reads_both_arms_at_the_largest_kl_both_reach():
    """Hand-computed: arm a's runs reach KL 20 and 30, arm b's 16, a third variant only 3 (which sets the
    ablation-wide matched KL but not the pair's). At 16 nats: a/s0 1 + 0.6·1 = 1.6, a/s1 1 + (11/25)·3 = 2.32,
    b/s0 2 + (8/8)·0.5 = 2.5."""
    import pandas as pd

    from harness.reporting.runs import RunSet, add_matched_kl
    from harness.reporting.summary import claim_values

    spec = load_spec("overoptimization", validate_configs=False)
    curves = {("none_p1k", 0): ([0, 10, 20], [0, 1, 2]), ("none_p1k", 1): ([0, 5, 30], [0, 1, 4]),
              ("kl0.01_p1k", 0): ([0, 8, 16], [0, 2, 2.5]), ("kl0.2_p1k", 0): ([0, 1, 3], [0, 0.1, 0.2])}
    ids = {key: f"r{i}" for i, key in enumerate(curves)}
    runs = pd.DataFrame({"run_id": list(ids.values()), "variant": [v for v, _ in curves], "seed": [s for _, s in curves]})
    history = pd.DataFrame([{"run_id": ids[key], "variant": key[0], "seed": key[1], "metric": m, "step": st, "value": x}
                            for key, (kl, gold) in curves.items() for m, xs in (("eval/kl", kl), ("eval/gold", gold))
                            for st, x in enumerate(xs)])
    rs = RunSet(spec=spec, scale="full", experiment_id="0", runs=runs, history=history)
    va, vb, target = claim_values(rs, "none_p1k", "kl0.01_p1k", "pair_matched_kl/gold")
    assert target == 16.0 and va == [pytest.approx(1.6), pytest.approx(2.32)] and vb == [pytest.approx(2.5)]
    assert add_matched_kl(rs) == 3.0  # the ablation-wide target is set by the variant that drifts least
    assert claim_values(rs, "none_p1k", "kl0.01_p1k", "matched_kl/gold") == (
        [pytest.approx(0.3), pytest.approx(0.6)], [pytest.approx(0.75)], None)  # at 3 nats: 3/10, 3/5, (3/8)·2
    assert claim_values(rs, "none_p1k", "kl0.05_p1k", "pair_matched_kl/gold") == ([2.0, pytest.approx(2.8)], [], 20.0)  # 1 + (15/25)·3; b has no run


def test_a_pair_matched_responses_claim_reads_both_arms_at_the_most_responses_both_sampled():
    """Hand-computed, evaluations at steps 0, 2, 4; the evaluation at step s reads the responses sampled through
    iteration s − 1. zero_variance/s0 samples 10 an iteration (0, 20, 40 at its evaluations), dynamic_sampling/s0
    20 (0, 40, 80) and /s1 10, 20, 20, 20 (0, 30, 70); keep_all/s0 samples 5 (it would set a target of 20, but is
    no arm of the pair); zero_variance/s1 logged no responses (a run from before they were logged: skipped).
    Target 40: dynamic s0 0.4 (its step 2), s1 0.3 + (10/40)·0.3 = 0.375, zero_variance s0 0.3 (its end)."""
    import pandas as pd

    from harness.reporting.ablation import answer_row
    from harness.reporting.matched import matched_point, responses_at_evals
    from harness.reporting.runs import RunSet
    from harness.reporting.summary import claim_values

    spec = load_spec("reasoning_batch_filter", validate_configs=False)
    runs_ = {("zero_variance", 0): ([10, 10, 10, 10], [0.1, 0.2, 0.3]), ("dynamic_sampling", 0): ([20] * 4, [0.1, 0.4, 0.5]),
             ("dynamic_sampling", 1): ([10, 20, 20, 20], [0.0, 0.3, 0.6]), ("keep_all", 0): ([5] * 4, [0.1, 0.1, 0.1]),
             ("zero_variance", 1): (None, [0.2, 0.2, 0.2])}
    ids = {key: f"r{i}" for i, key in enumerate(runs_)}
    rows = []
    for key, (per_iteration, pass1) in runs_.items():
        rows += [{"run_id": ids[key], "variant": key[0], "seed": key[1], "metric": "eval/pass1_greedy", "step": 2 * i,
                  "value": x} for i, x in enumerate(pass1)]
        rows += [{"run_id": ids[key], "variant": key[0], "seed": key[1], "metric": "batch/responses_sampled", "step": i,
                  "value": float(sum(per_iteration[:i + 1]))} for i in range(4)] if per_iteration else []
    runs = pd.DataFrame({"run_id": list(ids.values()), "variant": [v for v, _ in runs_], "seed": [s for _, s in runs_]})
    rs = RunSet(spec=spec, scale="default", experiment_id="0", runs=runs, history=pd.DataFrame(rows))
    assert responses_at_evals(rs, ids[("dynamic_sampling", 1)]) == [0.0, 30.0, 70.0]
    assert responses_at_evals(rs, ids[("zero_variance", 1)]) is None
    va, vb, target = claim_values(rs, "dynamic_sampling", "zero_variance", "pair_matched_responses/pass1_greedy")
    assert target == 40.0 and va == [pytest.approx(0.4), pytest.approx(0.375)] and vb == [pytest.approx(0.3)]
    key, note = matched_point("pair_matched_responses/pass1_greedy", target)
    assert key == "matched_responses" and "40 sampled responses" in note
    row = {"claim": "c", "kind": "finding", "n_a": 2, "n_b": 1, "diff": 0.0875, "ci_low": -0.1, "ci_high": 0.2,
           "metric": "pair_matched_responses/pass1_greedy", "verdict": "undecided", "decisive": False, "margin": 0.05,
           "mde": 0.1, key: target}
    assert "`pair_matched_responses/pass1_greedy` at 40 sampled responses" in answer_row({**row, "title": "c"})


def test_each_proxy_has_its_own_best_of_n_curve_and_frontier_row(tmp_path, monkeypatch):
    """overoptimization at full scale: runs on two proxies carry two ``pipeline.bon`` keys; the report
    keeps both curves (each naming its variants), and the frontier plot has one row per proxy panel."""
    import pandas as pd
    from PIL import Image

    from harness.reporting.plots import plot_frontier
    from harness.reporting.runs import RunSet, bon_label, frontier_panels, load_bon

    monkeypatch.setenv("HARNESS_RESULTS", str(tmp_path))
    d = [0.0, (math.log(2) - 0.5) ** 0.5, (math.log(4) - 0.75) ** 0.5]
    for key, top in (("k1", 0.2), ("k9", 0.4)):
        stage = tmp_path / "results" / "pipeline" / "bon" / key
        stage.mkdir(parents=True)
        gold = [[0.0, top / 2, top], [0.2, 0.2 + top / 2, 0.2 + top]]
        curve = {"n": [1, 2, 4], "kl": [x * x for x in d], "d": d, "gold_gain": [0.0, top / 2, top],
                 "gold_per_prompt": gold, "proxy_per_prompt": [[0.0, 1.0, 2.0], [2.0, 3.0, 6.0]]}
        (stage / "bon.json").write_text(json.dumps(curve))
        # built here from a proxy whose weights the runs recorded (a curve from other weights is not theirs)
        (stage / "stage.json").write_text(json.dumps({"inputs": {"reward_model": f"rm{key}"}, "weights_sha256": None}))
        proxy = tmp_path / "results" / "pipeline" / "reward_model" / f"rm{key}"
        proxy.mkdir(parents=True)
        (proxy / "stage.json").write_text(json.dumps({"inputs": {}, "weights_sha256": f"w{key}"}))
    spec = load_spec("overoptimization", validate_configs=False)
    arms = [("none_p1k", "k1"), ("kl0.05_p1k", "k1"), ("none_p9k", "k9")]
    runs = pd.DataFrame({"run_id": [f"r{i}" for i in range(3)], "variant": [v for v, _ in arms], "seed": [0, 0, 0],
                         "tags.pipeline.bon": [k for _, k in arms], "tags.digest.reward_model": [f"w{k}" for _, k in arms]})
    history = pd.DataFrame([{"run_id": f"r{i}", "variant": v, "seed": 0, "metric": f"eval/{m}", "step": st,
                             "value": (st * (i + 1.0) if m == "kl" else 0.1 * st)}
                            for i, (v, _) in enumerate(arms) for m in ("kl", "gold", "proxy") for st in range(3)])
    rs = RunSet(spec=spec, scale="full", experiment_id="0", runs=runs, history=history)

    curves = load_bon(rs)
    assert [(c["key"], c["variants"]) for c in curves] == [("k1", ["none_p1k", "kl0.05_p1k"]), ("k9", ["none_p9k"])]
    # proxy gain: mean over the two prompts [1, 2, 4] minus the mean at n = 1 (1.0)
    assert curves[1]["proxy_gain"] == [0.0, 1.0, 3.0] and curves[1]["gold_gain"] == [0.0, 0.2, 0.4]
    assert bon_label(curves[1], True) == "best-of-n (SFT, n ≤ 4), proxy of none_p9k"
    assert bon_label(curves[1], False) == "best-of-n (SFT, n ≤ 4)"
    other = RunSet(spec=spec, scale="full", experiment_id="0", runs=runs.assign(**{"tags.digest.reward_model": "w0"}),
                   history=history)
    assert load_bon(other) == []  # runs of another build: this machine's curves describe other weights

    rows = frontier_panels(rs)
    assert [(t, vs[0]) for t, vs in rows] == [("proxy trained on 1k comparisons", "none_p1k"),
                                              ("proxy trained on 3k comparisons", "none_p3k"),
                                              ("proxy trained on 9k comparisons", "none_p9k")]
    assert frontier_panels(RunSet(spec=spec, scale="default", experiment_id="0", runs=runs, history=history)) == [
        ("proxy trained on 1k comparisons", ["none_p1k", "kl0.05_p1k", "kl0.2_p1k"])]
    empty_fit = {"gold": {}, "proxy": {}}
    summary = {"bon": curves, "variants": {v: {"frontier": empty_fit} for v in spec.variants}}
    png = plot_frontier(rs, summary, tmp_path / "frontier.png")
    assert Image.open(png).size == (12 * 110, round(3 * 4.8 * 110))  # three rows of two panels


def test_metric_stats_orientation_by_goal():
    from harness.reporting.summary import metric_stats

    kl = metric_stats([0.1, 0.2, 0.3], [0.2, 0.4], goal="min")  # lower KL than the baseline is better
    # pairs x < y: 0.1<0.2, 0.1<0.4, 0.2=0.2 (½), 0.2<0.4, 0.3<0.4 -> 4.5 of 6
    assert kl["p_improvement"] == 0.75 and kl["mean"] == pytest.approx(0.2) and kl["n"] == 3
    lo, hi = kl["p_improvement_ci"]
    assert 0.0 <= lo <= 0.75 <= hi <= 1.0
    assert metric_stats([1.0, 2.0], [0.0, 1.0], goal="none")["p_improvement"] is None
    assert metric_stats([1.0, 2.0], None, goal="max")["p_improvement"] is None  # the baseline itself
    assert metric_stats(list(range(8)), None, goal="max")["iqm"] == 3.5  # trims 2 at each end with n = 8


AA_SPEC = """\
question: A/A check - two identical configs on disjoint seed sets must not show an effect.
baseline: a
variants:
  a: {}
  b: {}
seed_offset: {b: 100}
claims:
  - {claim: b has higher held-out gold, kind: finding, source: A/A check, section: none, setting_note: identical configs,
     metric: eval_final/gold, a: b, expect: greater, b: a, margin: 0.05}
  - {claim: b drifts less, kind: finding, source: A/A check, section: none, setting_note: identical configs,
     metric: eval_final/kl, a: b, expect: less, b: a, margin: 0.5}
  - {claim: b has a higher proxy score, kind: finding, source: A/A check, section: none, setting_note: identical configs,
     metric: eval_final/proxy, a: b, expect: greater, b: a, margin: 0.1}
scales:
  smoke: {seeds: 4}
verdict: {rule: welch, min_seeds: 4}
"""


@pytest.mark.slow
def test_aa_ablation_yields_no_effect(tmp_path):
    from harness.experiments.ablate import run_ablation

    (tmp_path / "aa_check.yaml").write_text(AA_SPEC)
    with results_env(tmp_path):
        report = run_ablation("aa_check", scale="smoke", workers=2, progress=False)
    summary = json.loads((report.parent / "summary.json").read_text())
    assert summary["variants"]["a"]["seeds"] == [0, 1, 2, 3] and summary["variants"]["b"]["seeds"] == [100, 101, 102, 103]
    for v in summary["verdicts"]:
        assert v["n_a"] == v["n_b"] == 4 and v["p_raw"] is not None  # a real test ran on enough seeds ...
        # ... and found no effect: the test of d = 0 decides nothing; "below margin" (d = 0 lies below every margin) is
        # the one decision that is right here
        assert v["p_adj"] >= 0.04 and v["verdict"] in ("inconclusive", "below margin"), v


def test_scorecard_lists_every_claim_of_every_shipped_ablation(tmp_path):
    import shutil

    from harness.experiments.ablate import list_ablations
    from harness.reporting.render import claim_title, md_cell
    from harness.reporting.scorecard import write_scorecard

    report = kl_placement_smoke()["report"]
    shutil.copytree(report.parent, tmp_path / "kl_placement")
    (tmp_path / "dropout").mkdir()
    (tmp_path / "dropout" / "summary.json").write_text(json.dumps({"scale": "default", "verdicts": []}))  # an old report
    with results_env():
        path = write_scorecard(tmp_path)
        specs = {n: load_spec(n, validate_configs=False) for n in list_ablations()}
    text = path.read_text()
    tables, why_rows, full = _scorecard_parts(text)
    rows = [line for line in tables.splitlines() if line.startswith("| ") and not line.startswith("| ablation |")]
    assert len(rows) == len(full) == sum(len(s.claims) for s in specs.values())
    assert max(len(r) for r in rows) <= 300  # short rows; the long text is in full below and in the linked report
    findings = tables.split("## Findings")[1].split("## Mechanism checks")[0]
    undecided = [r for r in findings.splitlines() if r.startswith("| ") and not r.startswith("| ablation |")
                 and "**" not in r.split(" | ")[-1]]  # the verdict cell: bold when decided
    why = re.search(r"### Why (\d+) finding\(s\) decide nothing yet", text)
    assert int(why.group(1)) == len(why_rows) == len(undecided) > 0
    for name, spec in specs.items():
        linked = name in ("kl_placement", "dropout")  # those with a report (no link to a missing one)
        mine = [r for r in rows if r.startswith(f"| [{name}]({name}/report.md)" if linked else f"| {name} |")]
        in_full = [f for f in full if f.startswith(f"- **{name}: ")]
        assert len(mine) == len(in_full) == len(spec.claims)
        by_kind = [c for k in ("finding", "mechanism", "control") for c in spec.claims if c.kind == k]
        for row, item, claim in zip(mine, in_full, by_kind):  # findings first, then mechanism checks, controls
            assert f"({claim.kind})" in item and f"`{claim.metric}`" in item and md_cell(claim_title(claim.claim, claim.title)) in row
            if name == "kl_placement":
                cells = re.split(r"(?<!\\)\|", row)  # cells split on unescaped pipes
                assert "not enough seeds (n = 2 < 10)" in row and re.match(r" [+-][0-9.e-]+ \[", cells[4])  # effect [CI]
            elif name == "dropout":  # its old report recorded no configs digest
                assert "no verdict (why: in full below)" in row
                assert "no verdict (report made from runs of other configs than the spec resolves to now" in item
            else:
                assert "no verdict (no report yet)" in row
    assert "**reproduced**" not in text and "**contradicted**" not in text
    # the header: the decided fraction of findings, and the compute the reports record (kl_placement's smoke runs;
    # the old dropout summary has no cost)
    n_findings = sum(c.kind == "finding" for s in specs.values() for c in s.claims)
    assert f"Findings decided (reproduced or contradicted, equivalence shown included, or below margin): 0 of {n_findings} (0%)." in text
    cost = json.loads((tmp_path / "kl_placement" / "summary.json").read_text())["cost"]
    # (runs of identical configs that other ablations' smoke tests trained first are copied in, at no cost here)
    assert cost["runs"] == 6 and (cost["cpu_hours"] > 0) == (cost["copied"] < 6)
    copied = (f"; {cost['copied']} more counted where another ablation's run of the same config was copied in (no "
              "compute, no second training)") if cost["copied"] else ""
    assert (f"Compute recorded by 1 report(s): {6 - cost['copied']} runs trained, {cost['cpu_hours']:.1f} CPU-hours (one "
            f"core per run){copied}; 1 report(s) predate cost accounting.") in text

    # a full-scale report lives in <name>/full/ beside the default one and adds a row per claim it judged
    from harness.reporting.ablation import report_dir

    assert report_dir("kl_placement", "full", tmp_path) == tmp_path / "kl_placement" / "full"
    assert report_dir("kl_placement", "default", tmp_path) == report_dir("kl_placement", "smoke", tmp_path) == tmp_path / "kl_placement"
    full = json.loads((tmp_path / "kl_placement" / "summary.json").read_text())
    judged = [v for v in full["verdicts"] if not v["verdict"].startswith("no verdict")]
    assert judged
    (tmp_path / "kl_placement" / "full").mkdir()
    from harness.reporting.summary import configs_digest

    digest = configs_digest(specs["kl_placement"], "full")  # as if made from full-scale runs
    (tmp_path / "kl_placement" / "full" / "summary.json").write_text(json.dumps({**full, "scale": "full", "configs_digest": digest}))
    with results_env():
        whole = write_scorecard(tmp_path).read_text()
    text = _scorecard_parts(whole)[0]
    again = [line for line in text.splitlines() if line.startswith("| [kl_placement](kl_placement/full/report.md) (full) |")]
    assert len(again) == len(judged)  # the full-scale verdicts replace the default ones: one row per claim
    assert not [line for line in text.splitlines() if line.startswith("| [kl_placement](kl_placement/report.md)")]
    n = sum(len(s.claims) for s in specs.values())
    assert f"{n} claims ({len(judged)} read at full scale, whose seeds include the default scale's" in whole
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| ablation |")]
    assert len(rows) == n
    assert whole.index("![") < whole.index("## Findings") and (tmp_path / "scorecard_forest.png").stat().st_size > 10_000


def _scorecard_parts(text: str) -> tuple[str, list[str], list[str]]:
    """``(the three tables' text, the bullets of "Why … decide nothing yet", the bullets of "Claims in full")`` of
    a scorecard."""
    tables = text.split("## Findings", 1)[1].split("### Why")[0].split("## How to read it")[0]
    why = text.split("decide nothing yet", 1)[1].split("##", 1)[0] if "decide nothing yet" in text else ""
    full = text.split("## Claims in full", 1)[1]
    return ("## Findings" + tables, [x for x in why.splitlines() if x.startswith("- ")],
            [x for x in full.splitlines() if x.startswith("- **")])


def _scorecard_row(kind: str, verdict: str, decisive: bool, n: int | None = 10) -> dict:
    """One scorecard row as :func:`harness.reporting.scorecard.scorecard_rows` gives it (a judged one when ``n``)."""
    return {"ablation": "x", "scale": None, "claim": f"{kind} {verdict}", "kind": kind, "source": "s", "section": "§1",
            "setting_note": "-", "metric": "eval_final/gold", "expected": "a − b > 0", "n_a": n, "n_b": n,
            "diff": 0.01 if n else None, "ci_low": -0.02 if n else None, "ci_high": 0.04 if n else None, "p_adj": 0.5,
            "mde": 0.03, "margin": 0.05, "verdict": verdict, "decisive": decisive, "caveats": []}


def test_scorecard_counts_negative_controls_apart_from_the_findings():
    """Three findings (one reproduced, one below margin), a mechanism check, and three A/A controls (one a false
    positive, one inconclusive, one without a report): the findings' fraction is 2 of 3, one of them below margin;
    the controls' line says 3, judged 2, decided 1."""
    from harness.reporting.scorecard import render_scorecard

    rows = [_scorecard_row("finding", "reproduced", True), _scorecard_row("finding", "inconclusive", False),
            _scorecard_row("finding", "below margin", True),
            _scorecard_row("mechanism", "pass", True), _scorecard_row("control", "false positive", True),
            _scorecard_row("control", "inconclusive", False),
            _scorecard_row("control", "no verdict (no report yet)", False, n=None)]
    text = render_scorecard(rows)
    assert ("Findings decided (reproduced or contradicted, equivalence shown included, or below margin): 2 of 3 (67%), "
            "of which 1 below margin (an effect of the claim's size ruled out: neither reproduced nor contradicted).") in text
    assert ("Negative controls (false by construction, not counted among the findings): 3, judged 2, decided 1 (each "
            "decided one a false positive of the verdict rule).") in text
    assert "7 claims: below margin 1, false positive 1, inconclusive 2, no verdict 1, pass 1, reproduced 1." in text
    controls = text.split("## Negative controls")[1].split("## How to read it")[0]
    assert controls.count("| control ") == 3 and "**false positive**" in controls  # the short rows' titles


def test_scorecard_marks_the_verdicts_read_through_the_sentiment_only_gold():
    """The judge comes from each spec's resolved baseline config: review_sentiment's gold with or without its
    naturalness head, none for chain_sum. Of four rows, two judged under the sentiment-only gold (a decided finding
    and a mechanism check) carry the mark ‡ and are counted in the header; a row under the naturalness-aware gold and
    an unjudged sentiment-only one do not."""
    from harness.reporting.render import SENTIMENT_ONLY, judge_note, judge_of
    from harness.reporting.scorecard import render_scorecard

    specs = {n: load_spec(n, validate_configs=False) for n in ("kl_placement", "logprob_temperature", "off_policyness", "reasoning_kl")}
    # no shipped RLHF spec is judged by the sentiment-only gold any more: off_policyness without its base gold is
    specs["off_policyness"] = specs["off_policyness"].model_copy(update={"base": {}})
    assert [judge_of(s) for s in specs.values()] == ["sentiment + naturalness (loops_and_symbol_soup)",
                                                      "sentiment + naturalness (loops)", SENTIMENT_ONLY, None]
    # the report's Gold line warns under the sentiment-only gold only, and there is none for chain_sum
    notes = [judge_note(s, "default") for s in specs.values()]
    assert notes[2].startswith("sentiment only (`pipeline.gold.naturalness: off`). This gold rewards degenerate text")
    assert "rewards degenerate" not in notes[0] + notes[1] and notes[3] is None
    rows = [{**_scorecard_row("finding", "reproduced", True), "judge": SENTIMENT_ONLY},
            {**_scorecard_row("mechanism", "pass", True), "judge": SENTIMENT_ONLY, "metric": "last/policy/clipfrac"},
            {**_scorecard_row("finding", "below margin", True), "judge": "sentiment + naturalness (loops)"},
            {**_scorecard_row("finding", "no verdict (no report yet)", False, n=None), "judge": SENTIMENT_ONLY}]
    text = render_scorecard(rows)
    assert text.count("‡ Read through the sentiment-only gold: 2 judged claim(s) of 1 review_sentiment report(s), 1 of "
                      "them decided findings, come from runs trained against a proxy it labelled. 1 of them read that "
                      "gold itself (gold, gold at matched KL, collapse); the other 1 read what the policy does") == 1
    cells = [line.rsplit(" | ", 1)[-1] for line in _scorecard_parts(text)[0].splitlines()
             if line.startswith("| x |")]
    assert cells == ["**reproduced** ‡ |", "**below margin** |", "no verdict (no report yet) |", "**pass** ‡ |"]
    assert "Read through the sentiment-only gold" not in render_scorecard(rows[2:3])


def test_a_claim_reads_the_gold_when_its_metric_is_gold_or_collapse():
    """The ‡ paragraph's split: gold at the end, at matched KL (ablation-wide or per pair), its drop from the peak,
    its sentiment head and the collapse flag (named as the evaluation names it) read the gold; KL, clip fraction,
    entropy, degeneracy, distinct-2 and the proxy do not."""
    from harness.reporting.scorecard import _reads_gold
    from harness.rl.evaluation import COLLAPSED, DEGENERATE

    gold = ["eval_final/gold", "matched_kl/gold", "pair_matched_kl/gold", "eval_drop/gold", f"eval_final/{COLLAPSED}",
            "eval_final/gold_sentiment"]
    policy = ["eval_final/kl", "last/policy/clipfrac", "last/objective/entropy", f"eval_final/{DEGENERATE}",
              "eval_final/distinct_2", "final/proxy", None]
    assert [_reads_gold({"metric": m}) for m in gold + policy] == [True] * 6 + [False] * 7


def test_scorecard_takes_verdicts_only_from_a_report_judged_under_the_specs_whole_rule():
    """A report judged at min_seeds 5 (an older spec) lends no verdict once the spec asks for 10 seeds, nor one judged
    before the rule gave the margin tests their part of α."""
    from harness.reporting.scorecard import scorecard_rows, stale_reports, withheld_reason

    spec = load_spec("kl_estimator", validate_configs=False)
    verdicts = [{"claim": c.claim, "kind": c.kind, "metric": c.metric, "a": c.a, "b": c.b, "expect": c.expect,
                 "margin": c.margin, "n_a": 5, "n_b": 5, "verdict": "pass", "decisive": True} for c in spec.claims]
    from harness.reporting.summary import configs_digest

    rule = {"rule": "welch", "alpha": spec.verdict.alpha, "margin_alpha": spec.verdict.margin_alpha,
            "min_seeds": spec.verdict.min_seeds, "power": spec.verdict.power}
    now = configs_digest(spec, "default")
    same = scorecard_rows("kl_estimator", {"scale": "default", "rule": rule, "verdicts": verdicts, "configs_digest": now})
    assert [r["verdict"] for r in same] == ["pass", "pass"]
    no_margin = {k: v for k, v in rule.items() if k != "margin_alpha"}  # judged before the rule had margin tests
    for old, differs in (({**rule, "min_seeds": 5}, "min_seeds 5 vs the spec's 10"),
                         (no_margin, "margin_alpha – vs the spec's 0.01")):
        judged_then = {"scale": "default", "rule": old, "verdicts": verdicts, "configs_digest": now}
        older = scorecard_rows("kl_estimator", judged_then)
        why = f"report judged under another verdict rule ({differs}): `harness report kl_estimator` re-judges its runs"
        assert [r["verdict"] for r in older] == [f"no verdict ({why})"] * 2
        assert not any(r["decisive"] for r in older)
        assert withheld_reason("kl_estimator", spec, judged_then) == why
    assert withheld_reason("kl_estimator", spec, {"scale": "default", "rule": rule, "verdicts": verdicts,
                                                  "configs_digest": now}) is None
    # a claim the report has no row for (written after it) is pending on its own; the report is not stale
    one_row = {"scale": "default", "rule": rule, "verdicts": verdicts[:1], "configs_digest": now}
    unmatched = scorecard_rows("kl_estimator", one_row)
    assert [r["verdict"] for r in unmatched] == ["pass", "no verdict (report predates this claim: re-run pending)"]
    assert withheld_reason("kl_estimator", spec, one_row) is None
    # a report of runs whose configs the spec no longer resolves to (another regime, iterations, draws), or one made
    # before reports recorded the digest, lends no verdict either
    stale = "no verdict (report made from runs of other configs than the spec resolves to now (e.g. before its regime " \
            "or pipeline draws): re-run pending)"
    for digest in ("0123456789ab", None):
        other_configs = {"scale": "default", "rule": rule, "verdicts": verdicts, "configs_digest": digest}
        rows = scorecard_rows("kl_estimator", other_configs)
        assert [r["verdict"] for r in rows] == [stale] * 2 and not any(r["decisive"] for r in rows)
        assert withheld_reason("kl_estimator", spec, other_configs) == stale[len("no verdict ("):-1]
    # every report is looked at, the full-scale one apart (its verdicts would replace the default ones)
    summaries = {("kl_estimator", "default"): {"scale": "default", "rule": rule, "verdicts": verdicts, "configs_digest": now},
                 ("kl_estimator", "full"): {"scale": "full", "rule": rule, "verdicts": verdicts},
                 ("kl_placement", "default"): {"scale": "default", "rule": {**rule, "min_seeds": 6}, "verdicts": [],
                                               "configs_digest": configs_digest(load_spec("kl_placement", validate_configs=False),
                                                                                "default")}}
    assert stale_reports(lambda name, scale: summaries.get((name, scale))) == {
        "kl_estimator/full": stale[len("no verdict ("):-1],
        "kl_placement": "report judged under another verdict rule (min_seeds 6 vs the spec's 10): `harness report "
                        "kl_placement` re-judges its runs"}
    # the digest is what the spec resolves to: it moves with a variant's override and with the scale
    moved = spec.model_copy(deep=True)
    moved.variants["k3"]["ppo"]["kl_coef"] = 0.07  # k3 at another β
    assert configs_digest(moved, "default") != now != configs_digest(spec, "full")


def test_git_sha_ignores_rewritten_reports_but_not_code(tmp_path):
    import subprocess

    from harness.infra.tracking import display_uri, git_sha

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "r.md").write_text("old\n")
    (tmp_path / "ablations").mkdir()
    (tmp_path / "ablations" / "a.yaml").write_text("base: {}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "c")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert git_sha(tmp_path) == head
    (tmp_path / "reports" / "r.md").write_text("regenerated\n")  # a report rewritten over the committed one
    assert git_sha(tmp_path) == head
    (tmp_path / "ablations" / "a.yaml").write_text("base: {ppo: {kl_coef: 0.1}}\n")  # a spec edit: in each run's config
    assert git_sha(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_sha(tmp_path) == head + "+dirty"
    # URIs as they may be committed: no credentials, no absolute path of this machine
    assert display_uri("http://user:secret@host:5000") == "http://user:***@host:5000"
    assert display_uri(f"sqlite:///{tmp_path}/mlflow.db") == "sqlite:///<outside the project>/mlflow.db"
    assert display_uri("postgresql://u:p@db/x") == "postgresql://u:***@db/x"


def test_length_check_by_hand():
    """12 tokens before training, 2.66 at the end (a policy answering "."): ratio 0.2217, below the floor of one half;
    24 → 24 holds; exactly half is not below; bad input is refused."""
    c = stats.length_check(12.0, 2.66)
    assert c == {"sft": 12.0, "final": 2.66, "ratio": pytest.approx(0.221667, abs=1e-6), "below_floor": True}
    assert stats.length_check(24.0, 24.0)["below_floor"] is False and stats.length_check(10.0, 5.0)["below_floor"] is False
    assert stats.length_check(10.0, 4.99)["below_floor"] is True
    for bad in ((0.0, 1.0), (5.0, -1.0), (float("nan"), 3.0)):
        with pytest.raises(ValueError, match="length_check: need sft_length > 0"):
            stats.length_check(*bad)


def test_plateau_check_by_hand():
    """Curve 0 → 0.4 → 0.8 → 0.9 → 0.95 at iterations 0, 10, 20, 30, 40: total rise 0.95; the last quarter starts at
    iteration 30 (0.9), so the late rise is 0.05 = 5.3% of it: plateaued. Read at 35 of 0..40 with steps 0, 20, 40
    and values 0, 0.5, 1.0: the last quarter starts at 30, interpolated 0.75, late rise 0.25 = 25%: still rising."""
    p = stats.plateau_check([0, 10, 20, 30, 40], [0.0, 0.4, 0.8, 0.9, 0.95])
    assert p["read_at"] == 40.0 and p["total_rise"] == pytest.approx(0.95) and p["late_rise"] == pytest.approx(0.05)
    assert p["late_share"] == pytest.approx(0.05 / 0.95) and p["holds"] is True
    q = stats.plateau_check([0, 20, 40], [0.0, 0.5, 1.0])
    assert q["late_rise"] == pytest.approx(0.25) and q["holds"] is False
    fall = stats.plateau_check([0, 20, 40], [0.2, 0.5, 0.1])  # ends below where it started: nothing plateaued
    assert fall["holds"] is None and fall["late_share"] is None and fall["total_rise"] == pytest.approx(-0.1)
    peak = stats.plateau_check([0, 20, 30, 40], [0.0, 1.0, 1.2, 1.1])  # a fall at the end is no rise
    assert peak["late_rise"] == pytest.approx(-0.1) and peak["holds"] is True
    with pytest.raises(ValueError, match="strictly ascending"):
        stats.plateau_check([0, 10, 10], [0, 1, 2])
    with pytest.raises(ValueError, match="≥ 2"):
        stats.plateau_check([0], [1.0])


def _runset(histories: dict, spec_name: str = "policy_loss"):
    """A RunSet from ``{(variant, seed): {metric: [values by step]}}`` (run ids r0, r1, … in that order)."""
    import pandas as pd

    from harness.reporting.runs import RunSet

    ids = {key: f"r{i}" for i, key in enumerate(histories)}
    runs = pd.DataFrame({"run_id": list(ids.values()), "variant": [v for v, _ in histories],
                         "seed": [s for _, s in histories]})
    history = pd.DataFrame([{"run_id": ids[key], "variant": key[0], "seed": key[1], "metric": m, "step": st, "value": x}
                            for key, metrics in histories.items() for m, xs in metrics.items()
                            for st, x in enumerate(xs)], columns=["run_id", "variant", "seed", "metric", "step", "value"])
    return RunSet(spec=load_spec(spec_name, validate_configs=False), scale="default", experiment_id="0", runs=runs,
                  history=history)


def test_pass_at_k_table_gives_sft_end_and_both_standard_errors():
    """vanilla: final pass@16 0.70 and 0.76 (SEs over problems 0.028 and 0.026), 0.72 and 0.70 before training →
    mean 0.73, SE over seeds SD/√2 = 0.04243/1.414 = 0.03, SE over problems 0.027, SFT 0.71; final pass@1 0.10 and
    0.20 with no step-0 draw. clip_higher: pass@1 only (0.3, one seed: no SE over seeds), so its pass@16 cell is a
    dash. reinforce logged no pass@k and has no row."""
    from harness.reporting.passk import passk_rows
    from harness.reporting.passk import passk_stats

    rs = _runset({("vanilla", 0): {"eval/pass_at_16": [0.72, 0.70]}, ("vanilla", 1): {"eval/pass_at_16": [0.70, 0.76]},
                  ("clip_higher", 0): {"eval/gold": [0.1, 0.2]}, ("reinforce", 0): {"eval/gold": [0.1, 0.2]}})
    rs.runs["metrics.eval_final/pass_at_16"] = [0.70, 0.76, None, None]
    rs.runs["metrics.eval_final/pass_at_16_se"] = [0.028, 0.026, None, None]
    rs.runs["metrics.eval_final/pass_at_1"] = [0.10, 0.20, 0.3, None]
    stats_of = {v: passk_stats(rs, v) for v in ("vanilla", "clip_higher", "reinforce")}
    assert stats_of["vanilla"]["16"] == pytest.approx({"n": 2, "mean": 0.73, "se_seeds": 0.03, "se_problems": 0.027,
                                                       "sft": 0.71})
    assert stats_of["vanilla"]["1"] == pytest.approx({"n": 2, "mean": 0.15, "se_seeds": 0.05, "se_problems": None,
                                                      "sft": None})
    assert stats_of["clip_higher"] == {"1": {"n": 1, "mean": 0.3, "se_seeds": None, "se_problems": None, "sft": None}}
    assert stats_of["reinforce"] is None
    ks, rows = passk_rows({"variants": {v: {"passk": p} for v, p in stats_of.items()}})
    assert ks == ["1", "16"]
    assert rows == ["| vanilla | 2 | 0.15 ± 0.05 | 0.71 → 0.73 ± 0.03 (0.027) |",
                    "| clip_higher | 1 | 0.3 | – |"]
    assert passk_rows({"variants": {"reinforce": {"passk": None}}}) == ([], [])


def test_a_metric_an_arm_never_logs_is_named_under_its_table():
    """policy_loss's metrics with vanilla (2 seeds) logging all of them and gspo (1 seed) none of
    last/policy/clipfrac: that table names gspo as unlogged, the others name nobody; clip_higher has no finished
    run (seeds []) and dual_clip is skipped, so neither is named even with n = 0."""
    from harness.reporting.ablation import _metric_tables
    from harness.reporting.summary import variant_metrics

    rs = _runset({("vanilla", 0): {}, ("vanilla", 1): {}, ("gspo", 0): {}})
    metrics = variant_metrics(rs.spec, "default")
    stat = {"mean": 0.5, "sd": 0.1, "ci_low": None, "ci_high": None, "iqm": None, "p_improvement": None}
    n_of = {"vanilla": 2, "gspo": 1, "clip_higher": 0, "dual_clip": 0}
    summary = {"variants": {v: {"seeds": list(range(n)), "final": {
        m: stat | {"n": 0 if (v == "gspo" and m == "last/policy/clipfrac") else n} for m in metrics}}
        for v, n in n_of.items()}}
    tables = {t["metric"]: t["unlogged"] for t in _metric_tables(rs, summary, skip=frozenset({"dual_clip"}))}
    assert tables == {m: (["gspo"] if m == "last/policy/clipfrac" else []) for m in metrics}


def test_a_claim_read_at_the_end_says_which_arm_is_still_rising():
    """Mean gold curves at evaluations 0, 1, 2, 3, 4 (the last quarter spans 3 → 4): vanilla 0, 0.4, 0.8, 0.9, 0.95
    (late rise 0.05 of 0.95: 5%, plateaued); clip_higher 0, 0.1, 0.2, 0.3, 0.5 (0.2 of 0.5: 40%, still rising). A claim
    on eval_final/* gets the caveat for clip_higher only; one read at the peak gets none."""
    from harness.reporting.summary import _claim_caveats, _plateau

    rs = _runset({("vanilla", 0): {"eval/gold": [0, 0.4, 0.8, 0.9, 0.95]},
                  ("clip_higher", 0): {"eval/gold": [0, 0.1, 0.2, 0.3, 0.5]}})
    plateaus = {v: _plateau(rs, v) for v in ("vanilla", "clip_higher")}
    assert plateaus["vanilla"]["holds"] is True and plateaus["clip_higher"]["late_share"] == pytest.approx(0.4)
    row = {"a": "clip_higher", "b": "vanilla", "metric": "eval_final/gold", "caveats": []}
    _claim_caveats(rs, row, {}, plateaus)
    assert row["caveats"] == ["not converged: clip_higher is still rising at iteration 4 (its mean held-out gold rose 40% "
                              "of its total in the last quarter), so the arms are compared at the end of training, not at "
                              "their plateaus"]
    peak = {"a": "clip_higher", "b": "vanilla", "metric": "eval_peak/gold", "caveats": []}
    _claim_caveats(rs, peak, {}, plateaus)
    assert peak["caveats"] == []


def test_identical_runs_and_an_untestable_claim():
    """dual_clip's runs equal vanilla's on both shared seeds (timings aside): identical, and a claim on the pair is
    marked untestable; a single differing loss value on one seed makes them different; no shared seed → None."""
    from harness.reporting.runs import identical_runs, mean_eval_curve
    from harness.reporting.summary import UNTESTABLE, inert_reason, mark_untestable

    same = {"eval/gold": [0.1, 0.3], "loss/policy": [0.5, 0.4], "time/update": [1.0, 1.1]}
    rs = _runset({("vanilla", 0): same, ("vanilla", 1): {**same, "eval/gold": [0.2, 0.6]},
                  ("dual_clip", 0): {**same, "time/update": [9.0, 9.9]}, ("dual_clip", 1): {**same, "eval/gold": [0.2, 0.6]},
                  ("clip_higher", 5): same})
    assert identical_runs(rs, "dual_clip", "vanilla") is True
    assert identical_runs(rs, "clip_higher", "vanilla") is None  # seed 5 is not vanilla's: no shared seed
    rs2 = _runset({("vanilla", 0): same, ("dual_clip", 0): {**same, "loss/policy": [0.5, 0.4000001]}})
    assert identical_runs(rs2, "dual_clip", "vanilla") is False
    rs3 = _runset({("vanilla", 0): same, ("dual_clip", 7): same})
    assert identical_runs(rs3, "dual_clip", "vanilla") is None
    assert inert_reason(rs, "dual_clip", "vanilla") == "the runs of dual_clip and vanilla are bit-identical on every shared seed"
    row = {"a": "dual_clip", "b": "vanilla", "verdict": "reproduced", "decisive": True, "caveats": []}
    mark_untestable(row, inert_reason(rs, "dual_clip", "vanilla"))
    assert row["verdict"] == UNTESTABLE and row["decisive"] is False and "bit-identical" in row["caveats"][0]
    mark_untestable(row, inert_reason(rs, "dual_clip", "vanilla"))  # marked again: the reason is not repeated
    assert len(row["caveats"]) == 1
    kept = {"a": "x", "b": "y", "verdict": "inconclusive", "decisive": False, "caveats": []}
    mark_untestable(kept, None)
    assert kept["verdict"] == "inconclusive" and kept["caveats"] == []
    assert mean_eval_curve(rs, "vanilla") == ([0.0, 1.0], [pytest.approx(0.15), pytest.approx(0.45)])


def test_a_claim_against_an_arm_that_ran_as_the_baseline_is_untestable():
    """dual_clip's runs are vanilla's (the baseline's) on both seeds; clip_higher's differ (seed 0's loss). A claim
    clip_higher vs dual_clip compares vanilla with clip_higher, so it gets the reason naming dual_clip, either way
    round; clip_higher vs vanilla is an ordinary claim (None); the report's why says an arm never acted."""
    from harness.reporting.ablation import why_clause
    from harness.reporting.planning import why_undecided
    from harness.reporting.summary import UNTESTABLE, inert_reason, mark_untestable

    same = {"eval/gold": [0.1, 0.3], "loss/policy": [0.5, 0.4]}
    rs = _runset({("vanilla", 0): same, ("vanilla", 1): {**same, "eval/gold": [0.2, 0.6]},
                  ("dual_clip", 0): same, ("dual_clip", 1): {**same, "eval/gold": [0.2, 0.6]},
                  ("clip_higher", 0): {**same, "loss/policy": [0.5, 0.3]}, ("clip_higher", 1): same})
    why = ("the runs of dual_clip are bit-identical to the baseline vanilla's on every shared seed: dual_clip's switch "
           "never bound here, so the data compare vanilla with clip_higher, not dual_clip")
    assert inert_reason(rs, "clip_higher", "dual_clip") == why
    assert inert_reason(rs, "dual_clip", "clip_higher") == why
    assert inert_reason(rs, "clip_higher", "vanilla") is None
    row = {"a": "clip_higher", "b": "dual_clip", "verdict": "reproduced", "decisive": True, "caveats": []}
    mark_untestable(row, why)
    assert (row["verdict"], row["decisive"], row["caveats"]) == (UNTESTABLE, False, [why])
    assert why_clause(row) == "one arm never acted: its runs are the baseline's, seed by seed"
    assert why_undecided(row).startswith("one arm never acted")


def test_a_claim_on_a_switch_that_never_bound_stops_at_its_first_look():
    """rollout_correction: seq_mask's runs repeat none's (the baseline's) seed by seed, as when no sequence's
    geometric-mean weight leaves the band; tis's differ (pass@1 0.02 above on every seed, its history shifted too).
    "seq_mask matches TIS" stops at the look at 8, untestable, with the reason that names seq_mask; "TIS beats no
    correction" is judged as usual (its look at 8 taken, not marked untestable)."""
    import pandas as pd

    from harness.analysis.verdicts import UNTESTABLE, apply_sequential
    from harness.reporting.runs import RunSet
    from harness.reporting.summary import sequential_rows

    spec = load_spec("rollout_correction", validate_configs=False)
    claims = spec.claims_for("default")
    shift = {"none": 0.0, "seq_mask": 0.0, "tis": 0.02}
    runs = pd.DataFrame([{"run_id": f"{v}{s}", "variant": v, "seed": s,
                          "metrics.eval_final/pass1_greedy": 0.2 + 0.01 * s + shift[v]}
                         for v in shift for s in range(8)])
    hist = pd.DataFrame([{"run_id": f"{v}{s}", "variant": v, "seed": s, "metric": "eval/gold", "step": k,
                          "value": 0.1 + 0.01 * s + 0.001 * k + shift[v]} for v in shift for s in range(8)
                         for k in (0, 40)])
    out = sequential_rows(RunSet(spec=spec, scale="default", experiment_id="0", runs=runs, history=hist),
                          claims, 0.05, 8, 16)
    by = {(c.a, c.b): r for c, r in zip(claims, out)}
    mask = by[("tis", "seq_mask")]
    assert (mask["decided"], mask["untestable"], mask["n"]) == (True, True, 8)
    assert mask["why"].startswith("the runs of seq_mask are bit-identical to the baseline none's")
    assert by[("tis", "none")].get("untestable") is None and by[("tis", "none")]["path"]
    row = {"a": "tis", "b": "seq_mask", "metric": "eval_final/pass1_greedy", "kind": "finding", "verdict": "reproduced",
           "decisive": True, "caveats": [], "margin": 0.05}
    apply_sequential(row, mask, spec.verdict, 8, 16)
    assert row["verdict"] == UNTESTABLE
    assert row["caveats"] == [mask["why"] + " at the look at 8 seeds per arm, so no number of seeds can decide it: the "
                              "claim left the Holm family and no further seeds were run for it"]


def test_a_claim_whose_arms_run_bit_identically_stops_at_its_first_look():
    """aa_rollout_tis: tis_fp32's runs repeat plain's seed by seed (its weights are exactly 1), though the seeds
    differ from each other (pass@1 0.20, 0.21, … 0.27). The sequential rule stops the control at the look at 8
    (decided, untestable) rather than train to the cap of 16; with one seed's history changed it is an ordinary
    undecided claim (p = 1 at d = 0)."""
    import pandas as pd

    from harness.reporting.runs import RunSet
    from harness.reporting.summary import sequential_rows

    spec = load_spec("aa_rollout_tis", validate_configs=False)
    runs = pd.DataFrame([{"run_id": f"{v}{s}", "variant": v, "seed": s, "metrics.eval_final/pass1_greedy": 0.2 + 0.01 * s}
                         for v in ("plain", "tis_fp32") for s in range(8)])
    hist = pd.DataFrame([{"run_id": f"{v}{s}", "variant": v, "seed": s, "metric": "eval/gold", "step": k,
                          "value": 0.1 + 0.01 * s + 0.001 * k} for v in ("plain", "tis_fp32") for s in range(8)
                         for k in (0, 40)])
    out = sequential_rows(RunSet(spec=spec, scale="default", experiment_id="0", runs=runs, history=hist),
                          spec.claims_for("default"), 0.05, 8, 16)
    assert [(r["decided"], r.get("untestable"), r["n"], r["at_cap"]) for r in out] == [(True, True, 8, False)]
    moved = hist.copy()
    moved.loc[(moved["run_id"] == "tis_fp323") & (moved["step"] == 40), "value"] += 1e-6  # seed 3's last evaluation
    out = sequential_rows(RunSet(spec=spec, scale="default", experiment_id="0", runs=runs, history=moved),
                          spec.claims_for("default"), 0.05, 8, 16)
    assert [(r["decided"], r.get("untestable"), r["n"]) for r in out] == [(False, None, 8)]


def test_a_claim_whose_arms_never_differ_is_untestable_and_stops():
    """kl_placement's collapse claim (none > reward in eval_final/collapsed): no run of either arm collapsed, so every
    value is 0. The sequential rule stops the claim at the first look (decided, untestable, no support either way)
    instead of adding seeds to the cap; the KL mechanism claim (none > reward, margin 2 nats) on the same runs is
    judged as usual; and the report row says untestable."""
    import pandas as pd

    from harness.reporting.runs import RunSet
    from harness.reporting.summary import sequential_rows
    from harness.analysis.verdicts import UNTESTABLE, apply_sequential, never_triggered

    assert never_triggered([0, 0, 0], [0, 0]) and not never_triggered([0, 0], [0, 1])
    assert not never_triggered([0], [0]) and not never_triggered([1.0, 1.0], [2.0, 2.0])
    spec = load_spec("kl_placement", validate_configs=False)
    rows = [{"run_id": f"{v}{s}", "variant": v, "seed": s, "metrics.eval_final/collapsed": 0.0,
             "metrics.eval_final/kl": (40.0 if v == "none" else 8.0) + (s % 3)} for v in ("none", "reward") for s in range(10)]
    rs = RunSet(spec=spec, scale="default", experiment_id="0", runs=pd.DataFrame(rows),
                history=pd.DataFrame(columns=["run_id", "variant", "seed", "metric", "step", "value"]))
    claims = spec.claims_for("default")
    out = sequential_rows(rs, claims, 0.05, 10, 40)
    by_metric = {c.metric: (c, r) for c, r in zip(claims, out)}
    c, res = by_metric["eval_final/collapsed"]
    assert (res["decided"], res.get("untestable"), res["supports"], res["n"], res["at_cap"]) == (True, True, None, 10, False)
    _, kl = next((c2, r) for c2, r in zip(claims, out) if c2.metric == "eval_final/kl" and c2.b == "reward")
    assert kl["decided"] and kl["supports"] and kl.get("untestable") is None  # d = 32 nats, SD 0.9: crosses at look 1
    row = {"claim": c.claim, "kind": "finding", "metric": c.metric, "margin": c.margin, "expect": c.expect, "verdict": "inconclusive",
           "decisive": False, "caveats": ["underpowered: x", "below margin: none − reward < 0.3 shown"], "evidence": "",
           "blocks": 5, "se": 0.0, "df": 4.0,
           "sd_a": 0.0, "sd_b": 0.0, "n_a": 10, "n_b": 10}
    apply_sequential(row, res, spec.verdict, 10, 40)
    assert row["verdict"] == UNTESTABLE and row["decisive"] is False and row["mde"] is None
    assert row["caveats"] == [row["caveats"][-1]] and "left the Holm family" in row["caveats"][-1]
    from harness.reporting.ablation import _sequential_row

    assert _sequential_row(row).split(" | ")[1:3] == ["—", "untestable (n = 10)"]  # no looks, not "decided"
    # out of the family: the KL claims are tested at α/3, not α/4 (3 testable claims at the first look)
    assert {r["path"][0]["level"] for r in out if r["path"]} == {0.05 / 3}


def test_seeds_past_a_claims_deciding_look_are_named_beside_its_verdict():
    """kl_coef's shape: the TOST claim decided at look 1 (10 seeds per arm) while both arms finished 20 (a retraining
    ran look 2's seeds before look 1 was read here): named with both counts. A claim decided at its arms' last
    seeds, an undecided one, an untestable one and a fixed-seed report name nothing."""
    from harness.reporting.ablation import past_decision

    def verdict(claim, a, b, **seq):
        return {"claim": claim, "a": a, "b": b, "sequential": seq}

    summary = {"design": {"stage": 10, "cap": 40},
               "variants": {"kl0.01": {"seeds": list(range(20))}, "kl0.2": {"seeds": list(range(20))},
                            "adaptive": {"seeds": list(range(10))}, "adaptive_low": {"seeds": list(range(20))}},
               "verdicts": [verdict("A KL penalty acts like early stopping:   a larger β does not improve the frontier",
                                    "kl0.2", "kl0.01", decided=True, n=10),
                            verdict("Steers β.", "adaptive_low", "adaptive", decided=True, n=10),
                            verdict("Undecided", "kl0.2", "kl0.01", decided=False, n=20),
                            verdict("Never differs", "kl0.2", "kl0.01", decided=True, untestable=True, n=10)]}
    assert past_decision(summary) == (
        "Seeds past a claim's deciding look count in the metric tables, plots and samples, not in its verdict: a look "
        "reads seeds 0 to n − 1 of both arms, fixed in advance, so seeds trained past it leave its error rate as "
        "calibrated. A KL penalty acts like early stopping: a larger β does not…: decided at 10 seeds per "
        "arm, 20 finished.")
    assert past_decision({**summary, "design": None}) is None
    summary["variants"]["adaptive"]["seeds"] = list(range(20))  # both arms past look 1 now; its full stop dropped
    assert past_decision(summary).endswith("does not…: decided at 10 seeds per arm, 20 finished; Steers β: decided "
                                           "at 10 seeds per arm, 20 finished.")
    assert past_decision({**summary, "verdicts": summary["verdicts"][2:]}) is None


def test_a_staged_claim_shown_below_its_margin_stops_there():
    """kl_placement at the default scale's looks (10, 20, 30, 40 seeds per arm), on hand-made runs: none and reward
    end at the same KL on average (8 + s mod 3 vs 8 + (s + 1) mod 3 nats), loss far below (1 + s mod 3). "none −
    loss > 0" is reproduced at the first look; "none − reward > 0" (margin 2 nats) is decided by nothing at 10 seeds
    but its margin test (d ≥ 2 nats ruled out; scipy's Welch test on none − 2 vs reward) crosses its own boundary at
    20 seeds per arm: below margin, with the level 0.01 / 2 (the collapse claim never varies and leaves the family,
    so two claims have a margin test). The report's row and looks say so."""
    import pandas as pd
    from scipy.stats import ttest_ind

    from harness.reporting.ablation import _sequential_row
    from harness.reporting.runs import RunSet
    from harness.reporting.summary import sequential_rows
    from harness.analysis.sequential import information_fraction, nominal_levels
    from harness.analysis.verdicts import apply_sequential

    spec = load_spec("kl_placement", validate_configs=False)
    kl = {"none": lambda s: 8.0 + s % 3, "reward": lambda s: 8.0 + (s + 1) % 3, "loss": lambda s: 1.0 + s % 3}
    rows = [{"run_id": f"{v}{s}", "variant": v, "seed": s, "metrics.eval_final/collapsed": 0.0,
             "metrics.eval_final/kl": f(s)} for v, f in kl.items() for s in range(40)]
    rs = RunSet(spec=spec, scale="default", experiment_id="0", runs=pd.DataFrame(rows),
                history=pd.DataFrame(columns=["run_id", "variant", "seed", "metric", "step", "value"]))
    claims = spec.claims_for("default")
    out = sequential_rows(rs, claims, 0.05, 10, 40, margin_alpha=0.01)
    res = {(c.metric, c.b): r for c, r in zip(claims, out)}
    loss, reward = res[("eval_final/kl", "loss")], res[("eval_final/kl", "reward")]
    assert loss["decided"] and loss["supports"] and not loss["below_margin"] and loss["look"] == 0
    assert reward["decided"] and reward["below_margin"] and reward["supports"] is False and reward["look"] == 1
    assert reward["n"] == 20 and reward["margin_level"] == pytest.approx(0.005)
    first, second = reward["path"]
    none20 = [kl["none"](s) - 2.0 for s in range(20)]
    p20 = ttest_ind(none20, [kl["reward"](s) for s in range(20)], equal_var=False, alternative="less").pvalue
    fr = [information_fraction(n, n, 40) for n in (10, 20)]
    assert second["p_margin"] == pytest.approx(p20, rel=1e-9)
    assert second["margin_threshold"] == pytest.approx(nominal_levels(fr, 0.005, 1)[-1], rel=1e-9)
    assert second["margin_threshold"] >= p20
    assert first["p_margin"] > first["margin_threshold"] and not first["crossed"] and second["crossed"]
    assert first["p"] > first["threshold"] and second["p"] > second["threshold"]  # the test of d = 0 never crosses
    row = {"claim": "kl", "kind": "mechanism", "metric": "eval_final/kl", "a": "none", "b": "reward", "margin": 2.0,
           "expect": "greater", "verdict": "inconclusive", "decisive": False, "caveats": [], "evidence": "e",
           "sd_a": 0.8, "sd_b": 0.8, "n_a": 20, "n_b": 20}
    apply_sequential(row, {**reward, "looks_planned": [10, 20, 30, 40]}, spec.verdict, 10, 40)
    assert row["verdict"] == "below margin" and row["decisive"]
    assert row["caveats"] == ["below margin: none − reward < 2 shown at 20 seeds per arm, so any effect in the claimed "
                              "direction is smaller than the margin 2 the claim is judged at"]
    assert "by the margin test (H0: none − reward ≥ 2): one-sided p = " in row["evidence"]
    cells = _sequential_row(row).split(" | ")
    assert cells[2] == "n = 20 (below margin)" and f", margin {p20:.3g} ≤ " in cells[1]


def test_standing_columns_follow_the_spec_and_the_claims_when_recorded():
    """Length, distinct-2 and the degenerate flag join every report's final-metric tables (as diagnostics without a
    goal) when the runs recorded them, after the spec's metrics and the claims' metrics."""
    from harness.reporting.summary import variant_metrics

    spec = load_spec("kl_placement", validate_configs=False)
    named = [m.name for m in spec.metrics]
    cols = ["metrics.eval_final/length", "metrics.eval_final/distinct_2", "metrics.eval_final/degenerate"]
    assert variant_metrics(spec, "default", cols) == named + ["eval_final/length", "eval_final/distinct_2",
                                                               "eval_final/degenerate"]
    assert variant_metrics(spec, "default", cols[:1]) == named + ["eval_final/length"]
    assert variant_metrics(spec, "default") == named
    assert spec.metric_goal("eval_final/distinct_2") == "none" and spec.metric_goal("eval_final/gold") == "max"
    assert spec.metric_goal("rescored_final/gold") == "max"  # another judge's gold: higher is better all the same


def test_pipeline_draws_and_their_digests_from_the_run_tags():
    """Seeds 0, 2 on draw 0 and seed 1 on draw 1 (runs without the tag count as draw 0): each draw lists its seeds,
    its stage keys and weight digests; the claim's values carry their draws only when there are two or more."""
    import pandas as pd

    from harness.reporting.runs import RunSet
    from harness.reporting.summary import claim_draws, pipeline_draws

    spec = load_spec("kl_placement", validate_configs=False)
    runs = pd.DataFrame({"run_id": ["r0", "r1", "r2", "r3"], "variant": ["reward", "reward", "none", "none"],
                         "seed": [0, 1, 0, 2], "tags.replicate": ["0", "1", "0", None],
                         "tags.pipeline.sft": ["k0", "k1", "k0", "k0"], "tags.digest.sft": ["d0", "d1", "d0", "d0"],
                         "tags.pipeline.data": ["dk"] * 4, "metrics.eval_final/gold": [0.1, 0.2, 0.3, 0.4]})
    rs = RunSet(spec=spec, scale="default", experiment_id="0", runs=runs, history=pd.DataFrame())
    assert pipeline_draws(rs) == [
        {"draw": 0, "seeds": [0, 2], "stages": {"sft": {"digests": ["d0"], "keys": ["k0"]}, "data": {"keys": ["dk"]}},
         "proxy": None},  # no proxy named: nothing to read
        {"draw": 1, "seeds": [1], "stages": {"sft": {"digests": ["d1"], "keys": ["k1"]}, "data": {"keys": ["dk"]}},
         "proxy": None}]
    assert claim_draws(rs, "reward", "none", "eval_final/gold") is None  # seed 2 of none has no draw tag
    runs.loc[3, "tags.replicate"] = "0"
    assert claim_draws(rs, "reward", "none", "eval_final/gold") == (["0", "1"], ["0", "0"])
    one = RunSet(spec=spec, scale="default", experiment_id="0", runs=runs.assign(**{"tags.replicate": "0"}),
                 history=pd.DataFrame())
    assert claim_draws(one, "reward", "none", "eval_final/gold") is None  # one draw: compared by seed
    # the report: stages whose key and digest every draw shares are listed once, each row names the rest
    from harness.reporting.ablation import _draw_rows

    gold = {"keys": ["g"], "digests": ["1"]}
    shared, rows = _draw_rows({"draws": [
        {"draw": 0, "seeds": [0, 2], "stages": {"gold": gold, "sft": {"keys": ["k0"], "digests": ["d0"]}}},
        {"draw": 1, "seeds": [1], "stages": {"gold": gold, "sft": {"keys": ["k1"], "digests": ["d1", "d9"]}}}]})
    assert shared == "gold `g` sha256 `1`"
    assert rows == ["| 0 | 0, 2 | sft `k0` sha256 `d0` |", "| 1 | 1 | **sft `k1` sha256 `d1, d9`** |"]
    assert _draw_rows({"draws": [{"draw": 0, "seeds": [0], "stages": {"gold": gold}}]}) == (
        "", ["| 0 | 0 | gold `g` sha256 `1` |"])
    # a stage that draw 0 records under another label (its own SFT policy is the one every draw's human RM came from)
    sft0 = {"keys": ["k0"], "digests": ["d0"]}
    shared, rows = _draw_rows({"draws": [
        {"draw": 0, "seeds": [0], "stages": {"gold": gold, "sft": sft0}},
        {"draw": 1, "seeds": [1], "stages": {"gold": gold, "sft": {"keys": ["k1"], "digests": ["d1"]}, "sft_draw0": sft0}},
        {"draw": 2, "seeds": [2], "stages": {"gold": gold, "sft": {"keys": ["k2"], "digests": ["d2"]}, "sft_draw0": sft0}}]})
    assert shared == "gold `g` sha256 `1`; sft_draw0 `k0` sha256 `d0`"
    assert rows == ["| 0 | 0 | sft `k0` sha256 `d0` |", "| 1 | 1 | sft `k1` sha256 `d1` |", "| 2 | 2 | sft `k2` sha256 `d2` |"]
    # each draw's proxy: a fourth column when any draw has its metrics, and one line of means and ranges over draws
    from harness.reporting.ablation import _proxy_line

    summary = {"draws": [
        {"draw": 0, "seeds": [0], "stages": {"gold": gold}, "proxy": {"heldout_agreement": 0.56, "spearman_vs_gold": 0.35,
                                                                     "spearman_vs_length": 0.158}},
        {"draw": 1, "seeds": [1], "stages": {"gold": gold}, "proxy": {"heldout_agreement": 0.62, "spearman_vs_gold": 0.45,
                                                                     "spearman_vs_length": -0.1026}},
        {"draw": 2, "seeds": [2], "stages": {"gold": gold}, "proxy": None}]}
    assert _draw_rows(summary)[1] == ["| 0 | 0 | – (no digest recorded) | 0.56 / +0.35 / +0.16 |",
                                      "| 1 | 1 | – (no digest recorded) | 0.62 / +0.45 / -0.10 |",
                                      "| 2 | 2 | – (no digest recorded) | – |"]
    # means: (0.56 + 0.62) / 2 = 0.59, (0.35 + 0.45) / 2 = 0.40, (0.158 − 0.1026) / 2 = 0.0277
    assert _proxy_line(summary) == (
        "The proxy reward models of 2 draw(s), mean (range): held-out agreement with the gold 0.59 (0.56 to 0.62); "
        "Spearman with the gold +0.40 (+0.35 to +0.45); Spearman with response length +0.03 (-0.10 to +0.16).")
    fixed = {"draws": [{"draw": 0, "seeds": [0], "stages": {}, "proxy": {"heldout_agreement": 0.6, "spearman_vs_gold": 0.4}}]}
    assert _draw_rows(fixed)[1] == ["| 0 | 0 | – (no digest recorded) | 0.60 / +0.40 / – |"]
    assert _proxy_line(fixed).endswith("Spearman with the gold +0.40 (+0.40 to +0.40).")
    assert _proxy_line({"draws": [{"draw": 0, "seeds": [0], "stages": {}, "proxy": None}]}) == ""


def test_compute_separates_the_pipeline_draws_workers_built_and_skips_copied_runs():
    """Cost accounting by hand: three trained runs of 100, 350 and 120 s, of which the second spent 250 s building a
    pipeline draw, and one run copied in (600 s elsewhere, not counted): 570 s in all, 250 s of them on the pipeline.
    A run that predates ``pipeline_build_s`` counts as having built nothing."""
    import pandas as pd

    from harness.reporting.summary import _cost
    from harness.rl.run_models import pipeline_build_seconds

    runs = pd.DataFrame({"run_id": ["a", "b", "c", "d"], "tags.copied_from": [None, None, None, "x"],
                         "metrics.wall_time_s": [100.0, 350.0, 120.0, 600.0],
                         "metrics.pipeline_build_s": [0.0, 250.0, np.nan, 250.0]})
    cost = _cost(runs)
    assert cost == {"runs": 4, "cpu_hours": pytest.approx(570 / 3600), "pipeline_cpu_hours": pytest.approx(250 / 3600),
                    "copied": 1}
    assert _cost(runs.drop(columns="metrics.pipeline_build_s"))["pipeline_cpu_hours"] == 0.0
    stages = {"gold": {"cached": True, "wall_time_s": 0.01}, "sft": {"cached": False, "wall_time_s": 190.5},
              "proxy_data": {"cached": False, "wall_time_s": 39.5}, "reward_model": {"cached": True, "wall_time_s": 0.0}}
    assert pipeline_build_seconds({"stages": stages}) == 230.0 and pipeline_build_seconds({}) == 0.0


def test_trained_all_equal_derived_for_runs_recorded_before_it_was_logged():
    """Hand example: with dynamic sampling off the trained batch is the first rollout (its fraction is copied); with
    it on an iteration below the round cap trained informative groups only (0) and one at the cap is unknown (NaN);
    ``last/`` is the mean of the finite values over the last 10% of iterations (of 4 iterations: the last one); a run that logged the metric keeps its own value, a run with a critic gets none."""
    import pandas as pd

    from harness.config import PPOConfig
    from harness.rl.metrics import TRAINED_ALL_EQUAL, derive_trained_all_equal

    runs = pd.DataFrame({"run_id": ["off0", "on0", "on1", "ppo0"], "variant": ["off", "on", "on", "ppo"],
                         "seed": [0, 0, 1, 0], f"metrics.last/{TRAINED_ALL_EQUAL}": [np.nan, np.nan, 0.25, np.nan]})
    first = [0.5, 0.25, 0.125, 0.375]
    rows = [("off0", "off", 0, "objective/all_equal_groups", s, v) for s, v in enumerate(first)]
    rows += [("on0", "on", 0, "objective/all_equal_groups", s, v) for s, v in enumerate(first)]
    rows += [("on0", "on", 0, "dynamic/rounds", s, r) for s, r in enumerate([2, 4, 3, 4])]
    rows += [("on1", "on", 1, "objective/all_equal_groups", 0, 0.5), ("ppo0", "ppo", 0, "loss/value", 0, 1.0)]
    history = pd.DataFrame(rows, columns=["run_id", "variant", "seed", "metric", "step", "value"])
    ppo = {("off", 0): PPOConfig(adv_estimator="grpo"),
           ("on", 0): PPOConfig(adv_estimator="grpo", dynamic_sampling=True, dynamic_sampling_max_rounds=4),
           ("on", 1): PPOConfig(adv_estimator="grpo", dynamic_sampling=True, dynamic_sampling_max_rounds=4),
           ("ppo", 0): PPOConfig()}
    out_runs, out_hist = derive_trained_all_equal(runs, history, ppo)
    last = dict(zip(out_runs["run_id"], out_runs[f"metrics.last/{TRAINED_ALL_EQUAL}"]))
    assert last["off0"] == 0.375 and np.isnan(last["on0"]) and last["on1"] == 0.25 and np.isnan(last["ppo0"])
    d = out_hist[out_hist["metric"] == TRAINED_ALL_EQUAL]
    assert d[d["run_id"] == "off0"]["value"].tolist() == first
    on = d[d["run_id"] == "on0"]["value"].tolist()
    assert on[0] == 0.0 and on[2] == 0.0 and np.isnan(on[1]) and np.isnan(on[3])
    assert set(d["run_id"]) == {"off0", "on0"} and len(history) == 14  # inputs untouched

    history.loc[(history["run_id"] == "on0") & (history["step"] == 3) & (history["metric"] == "dynamic/rounds"), "value"] = 2
    out_runs, _ = derive_trained_all_equal(runs, history, ppo)
    assert out_runs.loc[out_runs["run_id"] == "on0", f"metrics.last/{TRAINED_ALL_EQUAL}"].item() == 0.0


def test_the_scorecard_counts_each_trained_run_once():
    """Two reports: 10 runs (4 copied from another ablation, 1.0 CPU-h for the 6 trained) and 5 runs (0.5 CPU-h); a third
    predates cost accounting."""
    from harness.reporting.scorecard import _compute_line

    line = _compute_line({"a": {"runs": 10, "cpu_hours": 1.0, "copied": 4}, "b": {"runs": 5, "cpu_hours": 0.5}, "c": None})
    assert line == ("Compute recorded by 2 report(s): 11 runs trained, 1.5 CPU-hours (one core per run); 4 more counted "
                    "where another ablation's run of the same config was copied in (no compute, no second training); "
                    "1 report(s) predate cost accounting.")


def test_committed_reports_of_the_current_configs_meet_the_testbeds_length_floor():
    """A standing check of the testbeds: every committed default-scale report whose runs are of the configs its spec
    resolves to now (its ``configs_digest``, the same test the scorecard lends verdicts by) gives each arm's held-out
    length from the SFT policy to the end, and no arm ends below 8 tokens or below half the SFT policy's length
    (a collapse to punctuation or to bare answers), except the arms of a claim about length or EOS: those run the
    variable-length regime, where where a response ends is what the claim is about (the EOS trick's arms end
    with EOS at a different rate, so at a different length)."""
    from harness.experiments.ablate import list_ablations
    from harness.reporting.ablation import report_dir
    from harness.reporting.summary import configs_digest

    checked = 0
    for name in list_ablations():
        path = report_dir(name, "default", pathlib.Path(__file__).resolve().parents[1] / "reports") / "summary.json"
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        spec = load_spec(name)
        if summary.get("scale") != "default" or summary.get("configs_digest") != configs_digest(spec, "default"):
            continue  # a report of earlier configs: the scorecard withholds its verdicts until it is regenerated
        about_length = {arm for c in spec.claims if "length" in c.metric or "eos_rate" in c.metric for arm in (c.a, c.b)}
        # a first look still training (an arm of a claim under min_seeds: the report gives no verdict yet) may have
        # claim arms with no run so far; the arms that ran are checked all the same
        in_progress = any(len(summary["variants"].get(arm, {}).get("seeds") or []) < spec.verdict.min_seeds
                          for arm in spec.claim_arms_for("default"))
        for arm, v in summary["variants"].items():
            if not v["seeds"]:  # an arm no claim compares: --seeds auto never runs it, so it has no runs to check
                assert in_progress or arm not in spec.claim_arms_for("default"), f"{name}/{arm}: a claim's arm without runs"
                continue
            length = v["length"]
            assert length is not None and length["sft"] > 0, f"{name}/{arm}: no held-out length"
            if arm not in about_length:
                assert length["final"] >= max(8.0, 0.5 * length["sft"]), (name, arm, length)
        checked += 1
    assert checked >= 6  # the chain_sum reports at least


def test_a_frontier_peak_beyond_the_kl_reached_is_not_reported_as_a_peak():
    """The frontier table's peak column: the fitted peak KL (d_peak²) with its interval when the runs reached it, "no
    peak" when β ≤ 0, and an extrapolation when the fit's peak lies beyond the largest KL any point had (a nearly flat
    fit with β ≈ 0⁺ puts it at 1e17 nats)."""
    from harness.reporting.ablation import _frontier_rows

    def fit(beta, d_peak, d_max):
        return {"alpha": 0.1, "alpha_ci": [0.0, 0.2], "beta": beta, "beta_ci": [beta - 0.01, beta + 0.01],
                "d_peak": d_peak, "d_max": d_max, "kl_peak": None if d_peak is None else d_peak * d_peak,
                "kl_peak_ci": None if d_peak is None else [(d_peak / 2) * (d_peak / 2), (2 * d_peak) * (2 * d_peak)],
                "n_points": 30, "rmse": 0.05, "error": None, "seed_t": {}}

    summary = {"variants": {"a": {"frontier": {"gold": fit(0.02, 3.0, 4.0)}},  # peak at 9 nats, KL reached 16
                            "b": {"frontier": {"gold": fit(0.001, 1e8, 5.0)}},  # peak at 1e16 nats, KL reached 25
                            "c": {"frontier": {"gold": fit(-0.03, None, 5.0)}}},
               "bon": [{"key": "k", "variants": ["a"], "n": [1, 2, 4], "fit": {"gold": fit(0.05, 2.0, 1.0)}},
                       # a near-flat best-of-n fit: its peak's square is beyond a float (d_peak ** 2 would raise)
                       {"key": "f", "variants": ["b"], "n": [1, 2, 4], "fit": {"gold": fit(1e-300, 1e200, 1.0)}}]}
    rows = _frontier_rows(summary, ("gold",))
    cells = [r.split(" | ")[4] for r in rows]
    assert cells == ["9 [2.25, 36]", "none in the data (the fit's at 1e+16, beyond the largest KL reached, 25)",
                     "no peak (β ≤ 0)", "none in the data (the fit's at 4, beyond the largest KL reached, 1)",
                     "none in the data (the fit's at –, beyond the largest KL reached, 1)"]  # fmt: – when not finite


def test_an_arm_no_claim_compares_and_never_run_is_named_once(monkeypatch, tmp_path):
    """kl_loss_estimator's ``none`` arm is in no claim, so ``--seeds auto`` never runs it. With two seeds of each of the
    four claimed arms, the report's variant table names it with the reason, and no other line of the report mentions
    it: no fewer-seeds warning, no row of dashes in the per-metric or frontier tables, no empty samples entry. The
    four claimed arms, all below ``min_seeds``, are the ones the warning names."""
    from harness.reporting.ablation import render_markdown
    from harness.reporting.summary import build_summary

    monkeypatch.setenv("HARNESS_RESULTS", str(tmp_path))
    h = {"eval/gold": [0.0, 0.1, 0.2], "eval/kl": [0.0, 1.0, 2.0], "eval/length": [24.0, 24.0, 24.0]}
    claimed = ("k1_reward", "k2_loss", "k3_loss", "k1_loss")
    rs = _runset({(v, s): h for v in claimed for s in range(2)}, "kl_loss_estimator")
    md = render_markdown(rs, build_summary(rs), {"curves": None, "final": None, "frontier": None, "claims": None})
    mentions = [line for line in md.splitlines() if "none" in line.replace("none in the data", "").split()
                or line.startswith("| none ") or "**none**" in line]
    assert mentions == ["| none | `ppo.kl_placement=none` | [] (no claim compares this arm: `--seeds auto` does not run "
                        "it) | 448 | – | – |"]
    # its spec names the naturalness-aware gold, and the report's Gold line says so once, above the answer
    assert md.split("## Answer")[0].count("**Gold.** sentiment + naturalness (loops_and_symbol_soup): the sentiment "
                                          "model less a penalty") == 1
    warning = next(line for line in md.splitlines() if "Fewer than" in line)
    assert warning.split("** for ")[1].split(":")[0] == ", ".join(claimed)
    # a claimed arm keeps its per-metric rows, with dashes where its runs lack the metric: two seeds only where this
    # history has the data (matched-KL gold, read from eval/gold and eval/kl)
    assert [line.split(" | ")[1] for line in md.splitlines() if line.startswith("| k1_loss | ")
            and line.count("|") == 7 and "`" not in line].count("2") == 1


def test_why_a_finding_is_undecided_row_by_row():
    """The scorecard's reasons, hand-computed. A ``greater`` claim (m = 0.05) paused at 10 of 40 seeds per arm with
    d̂ = 0.2 and seeds_needed 42: the observed distance from the null is 0.2, so 42 · (0.05 / 0.2)² = 2.625 → 3 seeds.
    A ``not_greater`` claim at the cap with d̂ = 0.025: distance m − d̂ = 0.025, 5 · 2² = 20. An ``equivalent`` claim
    whose estimate −0.06 lies beyond its margin: no observed distance. A decided row gets none; a stale report and an
    untestable claim say why."""
    from harness.reporting.planning import why_undecided
    from harness.analysis.verdicts import UNTESTABLE

    def row(**kw):
        return {"decisive": False, "verdict": "undecided (n = 10 of 40 per arm)", "margin": 0.05, "n_a": 10, **kw}

    paused = {"n": 10, "cap": 40, "at_cap": False, "looks": [{"p": 2.6e-4, "threshold": 7.4e-7}]}
    assert why_undecided(row(decisive=True, verdict="reproduced")) is None
    assert why_undecided(row(verdict="no verdict (re-run pending)")) == "re-run pending"
    assert why_undecided(row(verdict=UNTESTABLE)).startswith("the arms never differ here")
    assert why_undecided(row(expect="greater", diff=0.2, seeds_needed=42, sequential=paused)) == (
        "paused at 10 of 40 seeds per arm (look 1: p 0.00026 against its boundary 7.4e-07); at a fixed n, a true effect "
        "as observed needs about 3 seeds per arm (one at the margin's distance: 42): within the cap")
    at_cap = {"n": 16, "cap": 16, "at_cap": True, "looks": [{"p": 0.5, "threshold": 0.03}, {"p": 0.13, "threshold": 0.02}]}
    assert why_undecided(row(expect="not_greater", diff=0.025, seeds_needed=5, sequential=at_cap)) == (
        "undecided at the cap of 16 seeds per arm (look 2: p 0.13 against its boundary 0.02); at a fixed n, a true "
        "effect as observed needs about 20 seeds per arm (one at the margin's distance: 5)")
    assert why_undecided(row(expect="equivalent", diff=-0.06, seeds_needed=8, sequential=None, n_a=16)) == (
        "fixed seeds (16 per arm); the estimate sits on the claim's null, so more seeds would more likely contradict "
        "it (at a true difference of 0: 8 seeds per arm)")
    assert why_undecided(row(expect="less", diff=-0.01, seeds_needed=5, sequential={**paused, "looks": []})).endswith(
        "about 125 seeds per arm (one at the margin's distance: 5): beyond the cap of 40")
    # exceeds (d > m): d̂ = 0.125 is 0.075 beyond m = 0.05: 8 · (0.05 / 0.075)² = 3.56 → 4; d̂ = 0.04 sits below m
    assert why_undecided(row(expect="exceeds", diff=0.125, seeds_needed=8, sequential=at_cap)).endswith(
        "about 4 seeds per arm (one at the margin's distance: 8)")
    assert "the estimate sits on the claim's null" in why_undecided(
        row(expect="exceeds", diff=0.04, seeds_needed=5, sequential=at_cap))
    # with the spread, level and power: what the cap could detect. Blocked over 10 draws with sd_d 0.1 (se 0.1/√10),
    # α 0.05, power 0.8: (t_{0.975, 39} + t_{0.8, 39})·0.1/√40 = (2.0227 + 0.8509)·0.015811 = 0.0454 at the cap of 40;
    # an equivalence claim at its cap of 16: m/se = 0.05/(0.1/4) = 2, 2·F_t(2 − 1.7531; 15) − 1 = 2·0.5959 − 1 = 0.19
    spread = {"se": 0.1 / 10 ** 0.5, "blocks": 10, "sd_a": 0.2, "sd_b": 0.2, "alpha": 0.05, "power": 0.8}
    assert why_undecided(row(expect="greater", diff=0.2, seeds_needed=42, sequential=paused, **spread)).endswith(
        "within the cap; at the cap (40 seeds per arm, fixed n) the MDE is 0.0454 against the margin 0.05")
    assert why_undecided(row(expect="equivalent", diff=0.0, seeds_needed=30, sequential=at_cap, **spread)).endswith(
        "(at a true difference of 0: 30); at the cap (16 seeds per arm, fixed n) TOST's power at a true difference of "
        "0 is 0.19 (the rule asks 0.8)")


def test_what_going_on_would_cost_by_hand():
    """Claims (a, b) and (a, c) paused at 10 of 40 seeds per arm (stage 10), and one at the cap, one decided, one
    untestable (the rule drops it), one in another report: 6 trained runs cost 1.5 CPU-hours of which 0.3 built pipeline draws, so 0.2 per PPO run.
    Next look (20 seeds per arm): 3 arms × 10 = 30 runs (6.0 CPU-h); to the cap: 3 × 30 = 90 (18.0). c at 25 seeds
    (runs copied in beyond the look) adds 0 and 15 instead of 10 and 30. A report with no trained run is priced at
    the pooled cost of a run over the reports of its scale (x's 0.2 here), and has none when no report trained one."""
    from harness.reporting.planning import going_on, shared_runs
    from harness.reporting.scorecard import render_scorecard

    paused = {"n": 10, "cap": 40, "stage": 10, "at_cap": False, "looks": []}

    def row(a, b, n_b=10, **kw):
        return {"ablation": "x", "scale": "default", "kind": "finding", "decisive": False, "verdict": "undecided",
                "a": a, "b": b, "n_a": 10, "n_b": n_b, "sequential": paused, "margin": 0.05, "diff": 0.01,
                "ci_low": 0.0, "ci_high": 0.02, "claim": f"{a} vs {b}", "source": "s", "section": "§1",
                "setting_note": "", "metric": "m", "expected": f"{a} − {b} > 0", "p_adj": None, "mde": None, **kw}

    costs = {"x": {"runs": 10, "copied": 4, "cpu_hours": 1.5, "pipeline_cpu_hours": 0.3}, "y": {"runs": 4, "copied": 4}}
    rows = [row("a", "b"), row("a", "c"), row("d", "e", decisive=True, verdict="reproduced"),
            row("f", "g", sequential={**paused, "at_cap": True}), {**row("p", "q"), "ablation": "y"},
            row("u", "v", verdict="untestable (never triggered here)", sequential={**paused, "decided": True})]
    got = going_on(rows, costs)
    assert [(g["ablation"], g["claims"], g["arms"], g["next"], g["worst"]) for g in got] == [
        ("x", 2, ["a", "b", "c"], 30, 90), ("y", 1, ["p", "q"], 20, 60)]
    assert abs(got[0]["next_hours"] - 6.0) < 1e-12 and abs(got[0]["worst_hours"] - 18.0) < 1e-12
    # y trained none of its runs: priced at the pooled cost of a run over the reports of its scale (x's 0.2)
    assert got[1]["pooled"] and abs(got[1]["per_run"] - 0.2) < 1e-12 and abs(got[1]["next_hours"] - 4.0) < 1e-12
    assert going_on(rows, {"y": costs["y"]})[1]["per_run"] is None  # no report trained a run: no price
    later = going_on([row("a", "b"), row("a", "c", n_b=25)], costs)[0]
    assert (later["next"], later["worst"]) == (20, 75)
    text = render_scorecard(rows, costs, same={})
    assert "| x | 2 | a, b, c | 30 (6) | 90 (18) |" in text
    assert "| **total** | 3 | | 50 (10.0) | 150 (30.0) |" in text and "trained, in one store" not in text
    assert "| y ¹ | 1 | p, q | 20 (4) | 60 (12) |" in text and "(y: 0.200 CPU-h at the default scale)" in text
    # y's p is x's a (one config): y copies x's seeds 10-19 in the next look and 10-39 in the worst case; x's b and c
    # are one config too, but within one ablation nothing is copied
    same = {("x", "a"): "h1", ("y", "p"): "h1", ("x", "b"): "h2", ("x", "c"): "h2"}
    shared = shared_runs(got, same)
    assert (shared["next"], shared["worst"], shared["sets"]) == (10, 30, [["x: a", "y: p"]])
    assert abs(shared["next_hours"] - 2.0) < 1e-12  # y's 10 copies at its pooled 0.2 CPU-h a run
    ahead = going_on([row("a", "b", n_a=20, n_b=20), {**row("p", "q"), "ablation": "y"}], costs)
    # x's a has seeds 0-19 already (next look at 30): y's p copies 10-19 in the next look, and 10-39 to the cap
    assert [(s["next"], s["worst"]) for s in [shared_runs(ahead, same)]] == [(10, 30)]
    y_first = shared_runs(got[::-1], same)  # x copies now, at 0.2 CPU-h a run
    assert (y_first["next"], y_first["worst"]) == (10, 30) and abs(y_first["worst_hours"] - 6.0) < 1e-12
    text = render_scorecard(rows, costs, same=same)
    assert "| **trained, in one store** | | | 40 (8.0) | 120 (24.0) |" in text
    assert "(x: a = y: p)" in text


def test_claim_titles_and_why_clauses_by_hand():
    """A spec's title wins; else the first sentence, cut at a word boundary within 80 characters with "…"; the why
    clause names the deciding look, the margin test, the open MDE, or the missing seeds."""
    from harness.reporting.render import claim_title
    from harness.reporting.ablation import why_clause

    assert claim_title("A larger β keeps the policy closer. More text.") == "A larger β keeps the policy closer."
    assert claim_title("anything", "Short title") == "Short title"
    assert claim_title("Without the length term (Dr. GRPO), e.g. here, it grows. Then.") == (
        "Without the length term (Dr. GRPO), e.g. here, it grows.")  # no sentence ends at an abbreviation
    long = "word " * 30
    cut = claim_title(long)
    assert cut == ("word " * 15).strip() + "…" and len(cut) <= 80
    row = {"verdict": "pass", "decisive": True, "margin": 0.05, "mde": 0.01, "p_adj": 0.002, "alpha": 0.05,
           "enough_seeds": True}
    assert why_clause(row) == "adjusted p = 0.002 < 0.05"
    seq = {"n": 10, "level": 0.0125, "decided": True}
    assert why_clause({**row, "sequential": seq}) == "crossed its boundary at the look at n = 10 (level 0.0125)"
    assert why_clause({**row, "verdict": "below margin", "decisive": True, "sequential": seq}) == (
        "the margin test rules out an effect of 0.05 at n = 10")
    assert why_clause({**row, "verdict": "undecided (n = 20 of 40 per arm)", "decisive": False, "mde": 0.0617,
                       "sequential": {"n": 20}}) == "no boundary crossed by n = 20; MDE 0.0617 vs margin 0.05"
    assert why_clause({**row, "verdict": "untestable (never triggered here)"}).startswith("the arms never differed")
    assert why_clause({**row, "enough_seeds": False, "verdict": "no verdict"}) == "too few seeds per arm for the rule's minimum"


def test_the_compute_line_names_each_claim_by_its_short_title():
    """A claim without a title is named by its first sentence cut at a word boundary within 50 characters (here
    "CISPO learns faster than DAPO (MiniMax-M1 reports" is 49 characters, of which the cut keeps the words before
    the last, and "…" marks it); a claim with a title by its title, cut the same way; a claim with no cost is left
    out."""
    from harness.reporting.ablation import cost_per_claim

    verdicts = [{"claim": "CISPO learns faster than DAPO (MiniMax-M1 reports reaching DAPO's accuracy in half the steps).",
                 "cost": {"runs": 16, "cpu_hours": 1.684}},
                {"claim": "x", "title": "FP8 rollout mismatch exceeds bf16's", "cost": {"runs": 8, "cpu_hours": 0.5}},
                {"claim": "no look yet"},
                {"claim": "y", "title": "GRPO's k3 KL term in the loss keeps the policy closer to the reference than no…",
                 "cost": {"runs": 16, "cpu_hours": 0.9574}}]  # a summary row's title made at the tables' 80 characters
    assert cost_per_claim(verdicts) == ("CISPO learns faster than DAPO (MiniMax-M1…: 16 runs, 1.684 CPU-h; "
                                        "FP8 rollout mismatch exceeds bf16's: 8 runs, 0.5 CPU-h; "
                                        "GRPO's k3 KL term in the loss keeps the policy…: 16 runs, 0.9574 CPU-h")
