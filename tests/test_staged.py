"""``--seeds auto`` end to end at the smoke scale: the A/A ablation of the two samplers (same law, other
random stream) decides nothing on held-out gold with fixed seeds nor in stages; a staged run started after the first
stage's runs exist resumes at the right stage and trains no (variant, seed) twice; each claim's path of looks agrees
with its verdict. The end-to-end tests run the shipped aa_sampler spec with a smaller design (:func:`_small_aa`: 5
seeds per arm a stage and as the minimum, instead of 10), so that its staged runs take 20 smoke runs, not 40; the
design's own numbers are checked at the shipped size by the plan and dry-run tests below. The A/A claim on held-out
KL is left unasserted: on seeds 0-19 at the shipped size it was decided at 20 seeds per arm (multinomial 0.161 vs
inverse-CDF 0.289, p = 0.0009), while seeds 20-39 give +0.038 [-0.054, +0.130], p = 0.41, and a direct law test of
the samplers finds no difference."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest
from ablation_fixtures import child_runs, results_env

from harness.experiments.ablate import run_ablation
from harness.experiments.staged import run_staged


def _small_aa(d: Path) -> Path:
    """The shipped aa_sampler spec written to ``d`` with a smaller design: 5 fixed seeds at the smoke scale, and
    ``--seeds auto`` adding 5 seeds per arm a stage with 5 as the minimum (the shipped spec: 10). Its runs' configs
    are the shipped spec's, so both end-to-end tests below find each other's runs."""
    import yaml

    from harness.experiments.ablate import ablations_dir

    spec = yaml.safe_load((ablations_dir() / "aa_sampler.yaml").read_text())
    spec["scales"]["smoke"]["seeds"] = 5
    spec["verdict"] = {**spec.get("verdict", {}), "min_seeds": 5, "stage": 5, "cap": 15}
    d.mkdir(parents=True, exist_ok=True)
    (d / "aa_sampler.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return d


@pytest.mark.slow
# aa_sampler's smoke runs (seeds 0-9 of both arms) are trained once: this test and the paused one run on one xdist
# worker (tests/conftest.py), so the second finds the first's runs in its store instead of training them again
@pytest.mark.xdist_group("aa_sampler_smoke")
def test_aa_samplers_decide_nothing_fixed_or_staged_and_a_staged_run_resumes_at_the_right_stage(smoke_pipeline, capsys, tmp_path):
    with results_env(_small_aa(tmp_path / "specs")):
        # fixed seeds 0..4: the first stage's runs, as an interrupted staged run would have left them
        fixed = json.loads((run_ablation("aa_sampler", scale="smoke", workers=2, progress=False).parent / "summary.json").read_text())
        assert [v["n_a"] for v in fixed["verdicts"]] == [5, 5]
        assert not fixed["verdicts"][0]["decisive"], fixed["verdicts"][0]
        before = {r.info.run_id for r in child_runs("ablation/aa_sampler") if r.info.status == "FINISHED"}
        capsys.readouterr()
        report = run_staged("aa_sampler", scale="smoke", stage=5, cap=10, workers=2, progress=True)
        out = capsys.readouterr()
        runs = [r for r in child_runs("ablation/aa_sampler") if r.info.status == "FINISHED"]
    staged = json.loads((report.parent / "summary.json").read_text())
    text = out.out + out.err
    assert "looks at [5, 10] seeds per arm" in text and "at most 20 runs in all" in text
    assert "stage: 10 seeds per arm for inverse_cdf, multinomial" in text
    # the first look's 10 runs were found, not trained again; the second stage trained 10 more
    keys = sorted((r.data.tags["variant"], int(r.data.tags["seed"])) for r in runs)
    assert keys == sorted((v, s) for v in ("inverse_cdf", "multinomial") for s in range(10))
    assert before <= {r.info.run_id for r in runs}
    assert staged["design"] == {"stage": 5, "cap": 10}
    for v in staged["verdicts"]:
        seq = v["sequential"]
        assert [(e["n_a"], e["n_b"]) for e in seq["looks"]] == [(5, 5), (10, 10)]
        assert seq["decided"] == any(e["crossed"] for e in seq["looks"]) == v["decisive"]  # the path and the verdict agree
        assert v["cost"]["runs"] == 20 and v["cost"]["cpu_hours"] > 0
    gold = staged["verdicts"][0]
    assert gold["metric"] == "eval_final/gold" and gold["sequential"]["at_cap"] and gold["verdict"] == "inconclusive"
    assert staged["cost"]["runs"] == 20
    md = (report.parent / "report.md").read_text()
    assert "### Sequential looks" in md and "undecided at the cap (n = 10)" in md and "**Compute.** 20 runs" in md
    assert not any(v["decisive"] for v in fixed["verdicts"][:1])


def test_the_plan_estimates_time_from_the_tasks_typical_run_before_any_run_exists():
    """Before any run of a scale is in the store, the plan's time comes from the task's typical run time
    (review_sentiment 140 s, chain_sum 560 s at the default scale); given 100 s: 3 arms × 10 seeds on 2 workers is
    25 min for the first stage; 120 runs at most, 1.7 h on 2 workers (3.3 CPU-hours). A median from the store wins."""
    from harness.experiments.ablate import load_spec
    from harness.experiments.staged import plan_text, typical_run_seconds

    assert typical_run_seconds(load_spec("kl_placement"), "default") == 140.0
    assert typical_run_seconds(load_spec("reasoning_estimators"), "default") == 560.0
    assert typical_run_seconds(load_spec("kl_placement"), "smoke") is None
    from harness.experiments.staged import draw_seconds

    assert draw_seconds(load_spec("kl_placement"), "default") == 370.0 and draw_seconds(load_spec("reasoning_estimators"), "default") is None
    text = plan_text("kl_placement", "default", [10, 20, 30, 40], 3, 4, 2, None, 100.0)
    assert text.endswith("30 runs in the first stage, at most 120 runs in all; at the task's typical 100 s a run and 2 "
                         "at once: first stage ~25 min, worst case ~1.7 h (3.3 CPU-hours), plus the pipeline stages not "
                         "yet built")
    assert "at the median 50 s a run" in plan_text("x", "default", [10], 3, 1, 2, 50.0, 100.0)
    # with pipeline draws to build: 4 new draws of the first stage's 10 at 370 s add 4 · 370 / 2 s to its 25 min
    # (37.3 min), 34 of the worst case's 40 add 34 · 370 s = 3.49 CPU-hours to 3.33
    text = plan_text("kl_placement", "default", [10, 20, 30, 40], 3, 4, 2, None, 100.0, (10, 4, 40, 34), 370.0)
    assert text.endswith("at the task's typical 100 s a run and 2 at once: first stage ~37 min, worst case ~3.4 h "
                         "(6.8 CPU-hours), with 4 of the first stage's 10 pipeline draws and 34 of the worst case's 40 "
                         "to build (~370 s of one core each)")
    assert plan_text("x", "smoke", [2], 2, 1, 2, None, None).endswith("no finished run at this scale in the store to "
                                                                       "estimate the time from")
    # 10 of the first stage's 30 runs finished or to copy in: its time counts the 20 to train (20 · 100 / 2 s)
    text = plan_text("kl_placement", "default", [10, 20, 30, 40], 3, 4, 2, None, 100.0, first_to_train=20)
    assert text.endswith("30 runs in the first stage (20 of them to train; the other 10 finished here or found to "
                         "copy in), at most 120 runs in all; at the task's typical 100 s a run and 2 at once: first stage "
                         "~17 min, worst case ~1.7 h (3.3 CPU-hours), plus the pipeline stages not yet built")
    # resumed after the look at 10 (its 30 runs finished): the stage up to the look at 20 is priced, its 30 runs to
    # train (30 · 100 s) and 10 unbuilt draws (10 · 370 s) on 2 workers = 6700 / 2 s ~ 56 min; the worst case counts
    # the 90 runs still to train and 30 unbuilt draws: 9000 + 11100 s = 5.6 CPU-hours, 2.8 h on 2 workers
    text = plan_text("kl_placement", "default", [10, 20, 30, 40], 3, 4, 2, None, 100.0, (20, 10, 40, 30), 370.0,
                     first_to_train=30, at=20, worst_to_train=90)
    assert text == ("kl_placement (default), --seeds auto: 4 claim(s), looks at [10, 20, 30, 40] seeds per arm; 60 runs "
                    "in the stage up to the look at 20 seeds per arm (30 of them to train; the other 30 finished here or "
                    "found to copy in), at most 120 runs in all (90 still to train); at the task's typical 100 s a run "
                    "and 2 at once: stage up to the look at 20 seeds per arm ~56 min, worst case ~2.8 h (5.6 "
                    "CPU-hours), with 10 of the 20 pipeline draws up to that look and 30 of the worst case's 40 to "
                    "build (~370 s of one core each)")
    # every run of the first look finished (restored from the archive): no time for it, only what an undecided
    # look would add (90 runs · 100 s = 2.5 CPU-hours), and nothing at all once no run is left to train
    text = plan_text("kl_placement", "default", [10, 20, 30, 40], 3, 4, 2, None, 100.0, first_to_train=0, worst_to_train=90)
    assert text.endswith("(0 of them to train; the other 30 finished here or found to copy in), at most 120 runs in all "
                         "(90 still to train); nothing to train before the first stage's look (its runs are finished or "
                         "copied in); should it leave claims undecided, at most 90 runs more (~2.5 CPU-hours)")
    assert text.count("min") == 0
    text = plan_text("x", "default", [10], 3, 1, 2, 50.0, None, first_to_train=0, worst_to_train=0)
    assert text.endswith("nothing to train before the first stage's look (its runs are finished or copied in)")


def test_the_plan_counts_the_pipeline_draws_this_machine_has_not_built(tmp_path):
    """kl_placement at the default scale (40 draws): seeds 0-9 use draws 0-9. Here draws 0-4 are built (each summary
    names stage directories that exist); draw 5's summary names a directory since deleted, draw 6's summary is not
    JSON, and a finished run on draw 7 sits in the store (restored from an archive, its draw built elsewhere): so 5
    of the 10 draws are unbuilt, and 35 of the worst case's 40. At the smoke scale (one draw, built by the driver)
    nothing is counted."""
    import os
    from unittest import mock

    from harness.infra import tracking
    from harness.experiments.ablate import load_spec
    from harness.experiments.spec import resolve_config
    from harness.pipeline import draw_key
    from harness.experiments.staged import draw_built, draws_to_build

    spec = load_spec("kl_placement")
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        out = tmp_path / "results" / "pipeline"
        for r in range(6):
            stage = out / "sft" / f"key{r}"
            stage.mkdir(parents=True)
            name = "summary.json" if r == 0 else f"summary-draw{r}.json"
            (out / name).write_text(json.dumps({"stages": {"sft": {"dir": str(stage)}}}))
        (out / "sft" / "key5").rmdir()
        (out / "summary-draw6.json").write_text("{not json")
        c = tracking.init_store()
        rid = c.create_run(tracking.experiment_id(c, "ablation/other"),
                           tags={"kind": "child", "scale": "default", "replicate": "7", "restored_from": "x"}).info.run_id
        c.set_terminated(rid, "FINISHED")
        assert [draw_built(out, r) for r in range(8)] == [True] * 5 + [False] * 3
        # a summary that records its draw key counts only for that key (another regime may share out_dir)
        (out / "summary-draw4.json").write_text(json.dumps({"stages": {"sft": {"dir": str(out / "sft" / "key4")}},
                                                             "draw_key": "abc"}))
        assert [draw_built(out, 4, k) for k in (None, "abc", "xyz")] == [True, True, False]
        assert draw_built(out, 3, "xyz")  # written before draw keys: judged by its directories
        assert draws_to_build(spec, "default", [10]) == [(10, 6)]  # draw 4's summary is another regime's
        (out / "summary-draw4.json").write_text(json.dumps({"stages": {"sft": {"dir": str(out / "sft" / "key4")}},
                                                             "draw_key": draw_key(resolve_config(spec, "default", spec.baseline, 4))}))
        assert draws_to_build(spec, "default", [10, 40]) == [(10, 5), (40, 35)]
        assert draws_to_build(spec, "smoke", [10]) == [(1, 0)]
        # only the draws of the seeds still to train: seeds 3-7 and 13 use draws 3-7 and 13, of which 5, 6, 7 and 13
        # are unbuilt (of the 14 draws that seeds 0-13 use)
        assert draws_to_build(spec, "default", [14], [{3, 4, 5, 6, 7, 13}]) == [(14, 4)]
        assert draws_to_build(spec, "smoke", [14], [{3, 13}]) == [(1, 0)]


def test_the_plans_median_run_time_counts_only_runs_of_the_same_task_and_length():
    """The median that times the plan: this ablation's FINISHED runs of the same task and iteration count (wall time
    less the draw build), else any ablation's; a run of an older default length, another task or one still RUNNING
    is left out. Here: own runs of 56 iterations at 150 s and 130 s (less a 20 s draw build: 130, 130 → 130); runs
    of 40 iterations (95 s) and chain_sum (560 s) do not count; with none of its own of 48 iterations, another
    ablation's 140 s."""
    from harness.infra import tracking
    from harness.experiments.staged import median_run_seconds

    with results_env():
        c = tracking.init_store()
        own, other = tracking.experiment_id(c, "ablation/own"), tracking.experiment_id(c, "ablation/other")
        for exp, task, its, wall, build, status in [
                (own, "review_sentiment", 56, 150.0, 20.0, "FINISHED"), (own, "review_sentiment", 56, 130.0, 0.0, "FINISHED"),
                (own, "review_sentiment", 40, 95.0, 0.0, "FINISHED"), (own, "chain_sum", 56, 560.0, 0.0, "FINISHED"),
                (own, "review_sentiment", 56, 900.0, 0.0, "RUNNING"), (other, "review_sentiment", 48, 140.0, 0.0, "FINISHED")]:
            rid = c.create_run(exp, tags={"kind": "child", "scale": "default"}).info.run_id
            c.log_param(rid, "task.name", task)
            c.log_param(rid, "ppo.total_iterations", str(its))
            c.log_metric(rid, "wall_time_s", wall)
            c.log_metric(rid, "pipeline_build_s", build)
            if status != "RUNNING":
                c.set_terminated(rid, status)
        assert median_run_seconds(c, own, "default", "review_sentiment", 56) == 130.0
        assert median_run_seconds(c, own, "default") == 130.0  # any task and length: 130, 130, 95, 560 → 130 (even count: 130)
        assert median_run_seconds(c, own, "default", "review_sentiment", 40) == 95.0
        assert median_run_seconds(c, own, "default", "chain_sum", 40) is None
        assert median_run_seconds(c, own, "default", "review_sentiment", 48) == 140.0  # none of its own: the others'
        empty = tracking.experiment_id(c, "ablation/empty")
        assert median_run_seconds(c, empty, "default", "review_sentiment", 56) == 130.0


@pytest.mark.slow
@pytest.mark.xdist_group("aa_sampler_smoke")
def test_a_paused_or_budgeted_staged_run_keeps_the_design_and_counts_only_runs_still_to_train(smoke_pipeline, capsys, tmp_path):
    """``--pause-at`` stops after a look without changing the looks or their boundaries (the report's design is the
    full one, the claims undecided short of the cap); ``--max-cpu-hours`` weighs only the runs a stage still has to
    train: a stage whose runs are all finished goes ahead on a budget of what is spent, one with 10 runs to train
    stops, and says what those 10 would add (the smaller design of :func:`_small_aa`)."""
    from harness.infra import tracking
    from harness.experiments.ablate import experiment_name
    from harness.errors import HarnessError
    from harness.experiments.staged import _cpu_hours, variant_run_seconds

    with results_env(_small_aa(tmp_path / "specs")):
        run_ablation("aa_sampler", scale="smoke", seeds=list(range(10)), workers=2, progress=False)  # found if they exist
        with pytest.raises(HarnessError, match=r"--pause-at: must be from the first look's seeds per arm \(5"):
            run_staged("aa_sampler", scale="smoke", stage=5, cap=15, pause_at=4, progress=False)
        capsys.readouterr()
        report = run_staged("aa_sampler", scale="smoke", stage=5, cap=15, pause_at=10, workers=2, progress=True)
        paused = capsys.readouterr()
        summary = json.loads((report.parent / "summary.json").read_text())
        c = tracking.client()
        exp_id = c.get_experiment_by_name(experiment_name("aa_sampler")).experiment_id
        spent, t = _cpu_hours(c, exp_id, "smoke"), variant_run_seconds(c, exp_id, "smoke", ["inverse_cdf", "multinomial"])
        budget = spent + 0.5 * min(t.values()) / 3600  # what is spent, and less than one more run
        run_staged("aa_sampler", scale="smoke", stage=5, cap=10, max_cpu_hours=budget, workers=2, progress=True, reuse=False)
        all_done = capsys.readouterr()
        run_staged("aa_sampler", scale="smoke", stage=5, cap=15, max_cpu_hours=budget, workers=2, progress=True, reuse=False)
        over = capsys.readouterr()
        n_after = len([r for r in child_runs("ablation/aa_sampler") if r.info.status == "FINISHED"])
    text = paused.out + paused.err
    assert "looks at [5, 10, 15] seeds per arm" in text
    assert "pausing before the look at 15 seeds per arm (--pause-at 10)" in text and "stage: 15" not in text
    assert [ln.split(": ")[0] for ln in text.splitlines() if ln.startswith("report after")] == [
        "report after the look at 5 seeds per arm", "report after the look at 10 seeds per arm"]  # one per stage
    assert ("the staged run has not reached the cap (still running, interrupted, paused by --pause-at or stopped by "
            "--max-cpu-hours): run it again to go on") in summary["verdicts"][0]["caveats"]
    assert summary["design"] == {"stage": 5, "cap": 15}
    for v in summary["verdicts"]:
        assert [(e["n_a"], e["n_b"]) for e in v["sequential"]["looks"]] == [(5, 5), (10, 10)]
        assert not v["sequential"]["at_cap"]
    assert not summary["verdicts"][0]["decisive"]  # the A/A gold claim: undecided, with a look still to come
    assert "stage: 10 seeds per arm" in all_done.out + all_done.err and "stopping" not in all_done.out + all_done.err
    # the stage at 15 has 2 arms × 5 new seeds to train (not the 30 runs it counts in all), each at its arm's median
    assert (f"stopping before the look at 15 seeds per arm: {spent:.2f} CPU-hours spent, the stage could add "
            f"{5 * (t['inverse_cdf'] + t['multinomial']) / 3600:.2f}, over --max-cpu-hours {budget}") in over.out + over.err
    assert n_after == 20  # nothing trained beyond seeds 0-9


@pytest.mark.parametrize("flag", [["--pause-at", "10"], ["--max-cpu-hours", "1"], ["--stage", "5"], ["--max-seeds", "20"]])
def test_the_staged_flags_with_fixed_seeds_are_one_line_before_any_compute(flag, tmp_path):
    from unittest import mock

    from typer.testing import CliRunner

    from harness.cli import app

    with mock.patch.dict("os.environ", {"HARNESS_RESULTS": str(tmp_path)}), \
            mock.patch("harness.experiments.ablate._build_pipelines", side_effect=AssertionError("must not build")):
        r = CliRunner().invoke(app, ["ablate", "aa_sampler", "--scale", "smoke", "--seeds", "2", *flag])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and lines == ["error: --stage, --max-seeds, --max-cpu-hours and --pause-at apply to --seeds "
                                          "auto only"], r.output


def test_each_variant_is_timed_by_its_own_runs_in_the_plan():
    """Arms can cost several-fold apart (a critic doubles a run), so the plan times each by the median of its own
    FINISHED runs, else by the ablation's median: here a 100 and 120 s (110), b 300 s, c none (the median of 100,
    120, 300: 120); the plan's run time is their mean (176.7 s), and its text says it is an average of the variants'."""
    from harness.infra import tracking
    from harness.experiments.staged import plan_text, variant_run_seconds

    with results_env():
        c = tracking.init_store()
        own = tracking.experiment_id(c, "ablation/arms")
        for variant, wall, status in [("a", 100.0, "FINISHED"), ("a", 120.0, "FINISHED"), ("b", 300.0, "FINISHED"),
                                      ("b", 900.0, "RUNNING")]:
            rid = c.create_run(own, tags={"kind": "child", "scale": "default", "variant": variant}).info.run_id
            c.log_param(rid, "task.name", "review_sentiment")
            c.log_metric(rid, "wall_time_s", wall)
            if status != "RUNNING":
                c.set_terminated(rid, status)
        t = variant_run_seconds(c, own, "default", ["a", "b", "c"], "review_sentiment")
        assert t == {"a": 110.0, "b": 300.0, "c": 120.0}
    text = plan_text("arms", "default", [10, 20], 3, 1, 2, sum(t.values()) / 3, None, by_variant=True)
    # 30 runs × 176.7 s / 2 workers = 44 min; 60 runs: 2.9 CPU-hours, 1.5 h on 2 workers
    assert text.endswith("at the variants' median run times, on average 177 s a run and 2 at once: first stage ~44 min, "
                         "worst case ~1.5 h (2.9 CPU-hours)")


def test_the_plan_counts_only_the_arms_the_claims_compare_and_the_runs_still_to_train():
    """kl_loss_estimator has 5 variants, but its 3 claims compare 4 of them (``none`` is in none), and a stage runs
    only those: the first stage is 4 × 10 = 40 runs, 160 at most. With k1_reward's seeds 0-9 FINISHED in another
    ablation (same config hashes), 30 of the 40 are still to train, and the first stage's time counts those. Once
    the first look's runs are all finished, the plan prices the next stage instead."""
    from harness.infra import tracking
    from harness.experiments.ablate import load_spec, plan_runs
    from harness.experiments.plan import plan_ablation
    from harness.cli import _plan_text
    from harness.config.pipeline import PipelineConfig
    from harness.experiments.staged import _plan

    spec = load_spec("kl_loss_estimator")
    claims = spec.claims_for("default")
    assert set(spec.variants_for("default")) - {arm for cl in claims for arm in (cl.a, cl.b)} == {"none"}
    with results_env():
        c = tracking.init_store()
        own, other = tracking.experiment_id(c, "ablation/kl_loss_estimator"), tracking.experiment_id(c, "ablation/src")
        for t in plan_runs(spec, "default", list(range(10))):
            if t.variant == "k1_reward":
                rid = c.create_run(other, tags={"kind": "child", "scale": "default", "variant": "base",
                                                "seed": str(t.seed), "config_hash": t.config_hash}).info.run_id
                c.set_terminated(rid, "FINISHED")
        text = _plan(c, own, spec, "kl_loss_estimator", "default", [10, 20, 30, 40], claims, 2, {})
        # paused after its first look (all 40 runs of seeds 0-9 FINISHED here): the plan prices the stage up to the
        # look at 20, whose 40 runs of seeds 10-19 are to train, and 120 of the worst case's 160
        arms = {cl.a for cl in claims} | {cl.b for cl in claims}
        for t in plan_runs(spec, "default", list(range(10))):
            if t.variant in arms:
                rid = c.create_run(own, tags={"kind": "child", "scale": "default", "variant": t.variant,
                                              "seed": str(t.seed), "config_hash": t.config_hash,
                                              "pipeline.gold": "feedbeef0001", "digest.gold": "x1"}).info.run_id
                c.set_terminated(rid, "FINISHED")
        resumed = _plan(c, own, spec, "kl_loss_estimator", "default", [10, 20, 30, 40], claims, 2, {})
        # this machine has built that gold scorer with other weights: the 40 finished runs are of another build, but
        # their seeds have no arm left to train, so they are pooled, not trained again (harness.experiments.builds)
        cached = Path(PipelineConfig().out_dir) / "gold" / "feedbeef0001"
        cached.mkdir(parents=True)
        (cached / "stage.json").write_text(json.dumps({"key": "feedbeef0001", "weights_sha256": "y1"}))
        aside = _plan(c, own, spec, "kl_loss_estimator", "default", [10, 20, 30, 40], claims, 2, {})
        dry = plan_ablation("kl_loss_estimator", "default", list(range(10)), variants=sorted(arms))
        assert len(dry["finished"]) == 40 and dry["other_build"] == [] and dry["train"] == []
        assert "another build" not in _plan_text(dry)
        (cached / "stage.json").write_text(json.dumps({"key": "feedbeef0001", "weights_sha256": "x1"}))
        same = _plan(c, own, spec, "kl_loss_estimator", "default", [10, 20, 30, 40], claims, 2, {})
    assert ("40 runs in the first stage (30 of them to train; the other 10 finished here or found to copy in), "
            "at most 160 runs in all (150 still to train)") in text
    assert ("80 runs in the stage up to the look at 20 seeds per arm (40 of them to train; the other 40 finished here "
            "or found to copy in), at most 160 runs in all (120 still to train)") in resumed
    assert "another build" not in resumed and same == resumed == aside


def _claimed_arms(name: str) -> tuple:
    """``(spec, its default-scale claims, the arms they compare, sorted)`` of ablation ``name``."""
    from harness.experiments.ablate import load_spec

    spec = load_spec(name)
    claims = spec.claims_for("default")
    return spec, claims, sorted({cl.a for cl in claims} | {cl.b for cl in claims})


def _cache_gold(out_dir: str, key: str, digest: str) -> None:
    """A gold stage ``key`` built here with weight digest ``digest`` (its ``stage.json`` alone: what the plan reads)."""
    cached = Path(out_dir) / "gold" / key
    cached.mkdir(parents=True)
    (cached / "stage.json").write_text(json.dumps({"key": key, "weights_sha256": digest}))


def test_the_plan_counts_again_the_runs_of_a_seed_whose_arms_would_span_two_builds(tmp_path):
    """Seeds 0-9 of the 4 claimed arms: seeds 0-4 finished on the build cached here (gold digest x1); seeds 5-9 have 3
    arms finished on another (y1) and one still to train. The driver trains that arm here and, so that no seed's arms
    span builds, the seed's 3 others again (harness.experiments.plan.accept_for_training): the first stage is priced with
    20 runs to train (5 new, 15 of another build), and the dry run names the 15."""
    from harness.infra import tracking
    from harness.experiments.ablate import plan_runs
    from harness.experiments.plan import plan_ablation
    from harness.cli import _plan_text
    from harness.config.pipeline import PipelineConfig
    from harness.experiments.staged import _plan

    spec, claims, arms = _claimed_arms("kl_loss_estimator")
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}):  # a store of its own
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = tracking.init_store()
        own = tracking.experiment_id(c, "ablation/kl_loss_estimator")
        for t in plan_runs(spec, "default", list(range(10))):
            if t.variant in arms and not (t.seed >= 5 and t.variant == arms[-1]):
                digest = "y1" if t.seed >= 5 else "x1"
                rid = c.create_run(own, tags={"kind": "child", "scale": "default", "variant": t.variant,
                                              "seed": str(t.seed), "config_hash": t.config_hash,
                                              "pipeline.gold": "feedbeef0001", "digest.gold": digest}).info.run_id
                c.set_terminated(rid, "FINISHED")
        _cache_gold(PipelineConfig().out_dir, "feedbeef0001", "x1")
        text = _plan(c, own, spec, "kl_loss_estimator", "default", [10, 20, 30, 40], claims, 2, {})
        dry = plan_ablation("kl_loss_estimator", "default", list(range(10)), variants=arms)
    assert ("40 runs in the first stage (20 of them to train; the other 20 finished here or found to copy in), "
            "at most 160 runs in all (140 still to train)") in text
    assert text.endswith("; 15 of the runs to train finished on another build of the pipeline than the stages cached "
                         "here and are trained again (`harness build-check kl_loss_estimator`)")
    assert dry["other_build"] == sorted(f"{v}/s{s}" for v in arms[:-1] for s in range(5, 10))
    assert len(dry["train"]) == 5 and "trained again beside their seed's runs to train" in _plan_text(dry)


def _plan_beside_copies(tmp_path, digests: Callable[[int], list[str]]) -> tuple[str, dict, list[str], dict]:
    """``kl_loss_estimator``'s first stage (seeds 0-9 of its 4 claimed arms) planned in a store of its own where
    another ablation holds FINISHED runs of the baseline arm's config, for seed ``s`` one per gold digest of
    ``digests(s)``, oldest first, with the gold stage cached here of digest ``x1``. Returns ``(the stage's plan line,
    the dry run, the claimed arms, {(key, digest): "ablation/elsewhere/<run id prefix>"})``."""
    from harness.infra import tracking
    from harness.experiments.ablate import plan_runs
    from harness.experiments.plan import plan_ablation
    from harness.config.pipeline import PipelineConfig
    from harness.experiments.staged import _plan

    spec, claims, arms = _claimed_arms("kl_loss_estimator")
    ids = {}
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}):  # a store of its own
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = tracking.init_store()
        own = tracking.experiment_id(c, "ablation/kl_loss_estimator")
        other = tracking.experiment_id(c, "ablation/elsewhere")
        for t in plan_runs(spec, "default", list(range(10))):
            for i, digest in enumerate(digests(t.seed) if t.variant == arms[0] else []):
                rid = c.create_run(other, start_time=1_000 * (i + 1) + t.seed, tags={
                    "kind": "child", "scale": "default", "variant": t.variant, "seed": str(t.seed),
                    "config_hash": t.config_hash, "pipeline.gold": "feedbeef0001", "digest.gold": digest}).info.run_id
                c.set_terminated(rid, "FINISHED")
                ids[(t.key, digest)] = f"ablation/elsewhere/{rid[:8]}"
        _cache_gold(PipelineConfig().out_dir, "feedbeef0001", "x1")
        text = _plan(c, own, spec, "kl_loss_estimator", "default", [10, 20, 30, 40], claims, 2, {})
        dry = plan_ablation("kl_loss_estimator", "default", list(range(10)), variants=arms)
    return text, dry, arms, ids


def test_runs_to_copy_in_of_another_build_are_priced_and_named_as_runs_to_train(tmp_path):
    """Another ablation holds the baseline arm's runs of the same config for seeds 0-9: seeds 0-4 on the build cached
    here (gold digest x1), seeds 5-9 on another (y1); the other 3 claimed arms are to train for every seed. The driver
    copies in seeds 0-4 and trains seeds 5-9 here (harness.experiments.plan.accept_for_training refuses a copy of
    another build where its seed has arms to train), so the first stage is priced with 35 runs to train (30 + 5), the
    plan line says why, and the dry run names the 5 instead of counting them as copies."""
    from harness.cli import _plan_text

    text, dry, arms, _ = _plan_beside_copies(tmp_path, lambda seed: ["y1" if seed >= 5 else "x1"])
    assert ("40 runs in the first stage (35 of them to train; the other 5 finished here or found to copy in), "
            "at most 160 runs in all (155 still to train)") in text, text
    assert text.endswith("; 5 of the runs to train have a run of the same config in another ablation, of another build "
                         "than the stages cached here: trained here, not copied in (a seed's arms are compared on one "
                         "build)"), text
    refused = sorted(f"{arms[0]}/s{s}" for s in range(5, 10))
    assert dry["not_copied"] == refused and sorted(dry["reusable"]) == sorted(f"{arms[0]}/s{s}" for s in range(5))
    assert len(dry["train"]) == 35 and set(refused) <= set(dry["train"]) and dry["sources"] == {"ablation/elsewhere": 5}
    assert "trained here, not copied in" in _plan_text(dry)


def test_a_run_to_copy_in_of_this_build_is_planned_as_a_copy_where_a_newer_one_is_of_another(tmp_path):
    """Another ablation holds the baseline arm's runs of the same config twice for seeds 0-9: an older one on the build
    cached here (gold digest x1) and a newer one on another (y1); the other 3 claimed arms are to train. The driver
    copies in each seed's x1 run (harness.experiments.plan.accept_for_training), so the dry run and the stage's price
    count those 10 as copies, not as runs to train because the newest is of another build."""
    text, dry, arms, ids = _plan_beside_copies(tmp_path, lambda seed: ["x1", "y1"])
    assert dry["reusable"] == {f"{arms[0]}/s{s}": ids[(f"{arms[0]}/s{s}", "x1")] for s in range(10)}, dry
    assert dry["not_copied"] == [] and len(dry["train"]) == 30, dry
    assert "40 runs in the first stage (30 of them to train; the other 10 finished here or found to copy in)" in text, text


def test_the_auto_dry_run_plans_the_arms_a_stage_runs(tmp_path):
    """``harness ablate kl_loss_estimator --dry-run`` (the default scale: ``--seeds auto``) plans the first stage as the
    driver runs it: the 4 arms the claims compare × 10 seeds, not the spec's 5 variants; fixed seeds plan every
    variant."""
    from unittest import mock

    from typer.testing import CliRunner

    from harness.cli import app

    with mock.patch.dict("os.environ", {"HARNESS_RESULTS": str(tmp_path)}):
        auto = CliRunner().invoke(app, ["ablate", "kl_loss_estimator", "--dry-run"])
        fixed = CliRunner().invoke(app, ["ablate", "kl_loss_estimator", "--dry-run", "--seeds", "2"])
    assert auto.exit_code == 0 and auto.output.startswith(
        "--seeds auto, looks at [10, 20, 30, 40] seeds per arm; first stage: kl_loss_estimator (default): 40 runs "
        "planned; 0 finished here"), auto.output
    assert fixed.exit_code == 0 and "kl_loss_estimator (default): 10 runs planned" in fixed.output, fixed.output


def test_the_driver_says_at_which_look_every_claim_was_decided():
    """Decided after a stage this invocation ran: that look; decided on runs already recorded (a re-run, or runs
    restored from the archive on a new machine): no look of this invocation is named, since none ran."""
    from harness.experiments.staged import _all_decided_line

    assert _all_decided_line([10, 20]) == "every claim is decided at the look at 20 seeds per arm"
    assert _all_decided_line([]) == "every claim is decided on the runs already recorded: no stage to run"
    # then the plan line is that alone, with the design and no time estimate (nothing is priced: nothing runs)
    from harness.experiments.staged import decided_plan_text

    assert decided_plan_text("kl_placement", "default", [10, 20, 30, 40], 4) == (
        "kl_placement (default), --seeds auto: 4 claim(s), looks at [10, 20, 30, 40] seeds per arm; every claim is "
        "decided on the runs already recorded: no stage to run")


@pytest.mark.parametrize("args, error", [
    (["--stage", "0"], "--stage: must be an integer from 2 to the cap (40), got 0"),
    (["--stage", "-3"], "--stage: must be an integer from 2 to the cap (40), got -3"),
    (["--stage", "1"], "--stage: must be an integer from 2 to the cap (40), got 1"),
    (["--max-seeds", "0"], "--max-seeds: must be at least the spec's min_seeds (10), got 0"),
    (["--max-seeds", "-1"], "--max-seeds: must be at least the spec's min_seeds (10), got -1"),
    (["--max-seeds", "20", "--stage", "30"], "--stage: must be an integer from 2 to the cap (20), got 30"),
    (["--max-cpu-hours", "0"], "--max-cpu-hours: must be > 0, got 0.0"),
    (["--max-cpu-hours", "-2"], "--max-cpu-hours: must be > 0, got -2.0"),
    (["--pause-at", "0"], "--pause-at: must be from the first look's seeds per arm (10) to the cap (40; looks at [10, 20, 30, 40]), got 0"),
    (["--pause-at", "100"], "--pause-at: must be from the first look's seeds per arm (10) to the cap (40; looks at [10, 20, 30, 40]), got 100"),
    (["--stage", "15", "--max-seeds", "30", "--pause-at", "15"], None),
    (["--stage", "12"], None),
    ([], None),
], ids=["stage0", "stage-neg", "stage1", "cap0", "cap-neg", "stage-over-cap", "cpu0", "cpu-neg", "pause0", "pause-over-cap",
        "custom", "uneven", "defaults"])
def test_staged_options_mean_what_they_say_and_the_dry_run_accepts_refuses_and_plans_as_the_run(args, error, tmp_path):
    """Each staged option is refused in one line and a non-zero exit (0 is never read as "the default"), by the dry run
    and the run alike, before any compute; an accepted one gives the dry run the looks the run plans
    (:func:`harness.experiments.staged.staged_design`), and the run gets as far as opening the ablation."""
    from typer.testing import CliRunner

    from harness.experiments.ablate import load_spec
    from harness.cli import app
    from harness.experiments.staged import staged_design

    base = ["ablate", "aa_sampler", "--scale", "smoke", "--seeds", "auto", *args]
    opened = AssertionError("validated: the run went on to open the ablation")
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}), \
            mock.patch("harness.experiments.ablate._build_pipelines", side_effect=AssertionError("must not build")), \
            mock.patch("harness.experiments.ablate.open_ablation", side_effect=opened):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        dry = CliRunner().invoke(app, [*base, "--dry-run"])
        run = CliRunner().invoke(app, base)
    if error is not None:
        for r in (dry, run):
            lines = [ln for ln in r.output.splitlines() if ln.strip()]
            assert r.exit_code != 0 and lines == [f"error: {error}"], r.output
        return
    assert dry.exit_code == 0, dry.output
    assert "validated: the run went on to open the ablation" in run.output, run.output  # accepted, then opened
    value = dict(zip(args[::2], args[1::2]))
    _, _, looks = staged_design(load_spec("aa_sampler").verdict, *(int(value[k]) if k in value else None
                                                                    for k in ("--stage", "--max-seeds")))
    assert f"looks at {looks} seeds per arm" in dry.output
    first = dry.output.split("first stage: ")[1]
    assert f"{len(load_spec('aa_sampler').claim_arms_for('smoke')) * looks[0]} runs planned" in first, dry.output
