"""``--seeds auto`` end to end at the smoke scale: the A/A ablation of the two samplers (same law, other
random stream) decides nothing on held-out gold with fixed 10 seeds nor in stages; a staged run started
after the first stage's runs exist resumes at the right stage and trains no (variant, seed) twice; each
claim's path of looks agrees with its verdict. The A/A claim on held-out KL is left unasserted: on seeds
0-19 it is decided at 20 seeds per arm (multinomial 0.161 vs inverse-CDF 0.289, p = 0.0009), while seeds
20-39 give +0.038 [-0.054, +0.130], p = 0.41, and a direct law test of the samplers finds no difference."""

from __future__ import annotations

import json

import pytest
from ablation_fixtures import child_runs, results_env

from harness.ablate import run_ablation
from harness.staged import run_staged


@pytest.mark.slow
def test_aa_samplers_decide_nothing_fixed_or_staged_and_a_staged_run_resumes_at_the_right_stage(smoke_pipeline, capsys):
    with results_env():
        # fixed seeds 0..9: the first stage's runs, as an interrupted staged run would have left them
        fixed = json.loads((run_ablation("aa_sampler", scale="smoke", workers=2, progress=False).parent / "summary.json").read_text())
        assert [v["n_a"] for v in fixed["verdicts"]] == [10, 10]
        assert not fixed["verdicts"][0]["decisive"], fixed["verdicts"][0]
        before = {r.info.run_id for r in child_runs("ablation/aa_sampler") if r.info.status == "FINISHED"}
        capsys.readouterr()
        report = run_staged("aa_sampler", scale="smoke", stage=10, cap=20, workers=2, progress=True)
        out = capsys.readouterr()
        runs = [r for r in child_runs("ablation/aa_sampler") if r.info.status == "FINISHED"]
    staged = json.loads((report.parent / "summary.json").read_text())
    text = out.out + out.err
    assert "looks at [10, 20] seeds per arm" in text and "at most 40 runs in all" in text
    assert "stage: 20 seeds per arm for inverse_cdf, multinomial" in text
    # the first look's 20 runs were found, not trained again; the second stage trained 20 more
    keys = sorted((r.data.tags["variant"], int(r.data.tags["seed"])) for r in runs)
    assert keys == sorted((v, s) for v in ("inverse_cdf", "multinomial") for s in range(20))
    assert before <= {r.info.run_id for r in runs}
    assert staged["design"] == {"stage": 10, "cap": 20}
    for v in staged["verdicts"]:
        seq = v["sequential"]
        assert [(e["n_a"], e["n_b"]) for e in seq["looks"]] == [(10, 10), (20, 20)]
        assert seq["decided"] == any(e["crossed"] for e in seq["looks"]) == v["decisive"]  # the path and the verdict agree
        assert v["cost"]["runs"] == 40 and v["cost"]["cpu_hours"] > 0
    gold = staged["verdicts"][0]
    assert gold["metric"] == "eval_final/gold" and gold["sequential"]["at_cap"] and gold["verdict"] == "inconclusive"
    assert staged["cost"]["runs"] == 40
    md = (report.parent / "report.md").read_text()
    assert "### Sequential looks" in md and "undecided at the cap (n = 20)" in md and "**Compute.** 40 runs" in md
    assert not any(v["decisive"] for v in fixed["verdicts"][:1])
