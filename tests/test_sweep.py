"""Optuna sweeps: spec validation, the pruning hook, and end-to-end smoke sweeps on Ray (exact trial
cap, resume, a trial left RUNNING by a killed driver or whose worker was SIGKILLed failed and retried,
pruning wired through the PPO loop, one MLflow child run per trial, report).

The end-to-end tests run real smoke-scale PPO trials (2 iterations) on the test run's smoke
pipeline; the conftest points ``HARNESS_RESULTS`` at a temporary directory, so the Optuna journal
and the MLflow store live there too.
"""

from __future__ import annotations

import json
import os
import time

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from harness.experiments import engine

from harness.reporting import study as study_report

from harness.experiments import study_spec

from harness.experiments import study_storage

from harness.experiments import sweep

from harness.experiments import sweep_trial
from harness.config import ConfigError
from harness.errors import HarnessError

VALID = {
    "search_space": {
        "cliprange": {"low": 0.05, "high": 0.4},
        "lam": {"low": 0.8, "high": 1.0},
        "kl_coef": {"low": 0.001, "high": 0.5, "log": True},
    },
}


def _spec(name: str, **changes) -> study_spec.StudySpec:
    """A smoke study spec: random sampler, 2 PPO iterations per trial, one seed."""
    data = {**VALID, "sampler": {"type": "random", "seed": 0}, "pruner": {"type": "none"},
            "scales": {"smoke": {"overrides": {"ppo": {"total_iterations": 2}}}}}
    data.update(changes)
    return study_spec.parse_study_spec(data, name)


def _trial_runs(name: str) -> list:
    from harness.infra import tracking

    c = tracking.client()
    exp = c.get_experiment_by_name(study_spec.experiment_name(name))
    return [] if exp is None else tracking.search_all(c, [exp.experiment_id], "tags.role = 'trial'")


def _parent_runs(name: str) -> list:
    from harness.infra import tracking

    c = tracking.client()
    exp = c.get_experiment_by_name(study_spec.experiment_name(name))
    return [] if exp is None else tracking.search_all(c, [exp.experiment_id], "tags.role = 'sweep'")


def _load(name: str) -> optuna.Study:
    return optuna.load_study(study_name=study_spec.study_name(name, "smoke"), storage=study_storage.make_storage(name))


# ------------------------------------------------------------------------------------------------
# Specs (fast)
# ------------------------------------------------------------------------------------------------


def test_shipped_ppo_core_spec():
    spec = study_spec.load_study_spec("ppo_core")
    space = {k: (p.low, p.high, spec.param_log(k)) for k, p in spec.search_space.items()}
    assert space == {"cliprange": (0.05, 0.4, False), "lam": (0.8, 1.0, False), "kl_coef": (0.001, 0.5, True)}
    assert (spec.objective, spec.sampler.type, spec.pruner.type) == ("gold", "tpe", "median")
    assert spec.directions == ["maximize"]
    assert not set(spec.reevaluation.seed_list()) & set(spec.seeds_for("full"))
    # two seeds (two pipeline draws) per trial at the default scale; the re-evaluation on 10 draws no trial saw
    assert (spec.seeds_for("smoke"), spec.seeds_for("default"), spec.reevaluation.seed_list()) == (
        [0], [0, 1], list(range(1010, 1020)))
    from harness.experiments.ablate import is_study

    assert is_study("ppo_core") and not is_study("kl_placement")


@pytest.mark.parametrize("space, fragment", [
    ({"cliprange": {"low": 0.01, "high": 0.4}}, "search_space.cliprange: bounds [0.01, 0.4] are outside the allowed range [0.05, 0.4]"),
    ({"lam": {"low": 0.8, "high": 1.2}}, "search_space.lam: bounds [0.8, 1.2] are outside the allowed range [0.8, 1]"),
    ({"kl_coef": {"low": 0.0, "high": 0.5, "log": True}}, "search_space.kl_coef: bounds [0, 0.5] are outside"),
    ({"cliprange": {"low": 0.3, "high": 0.1}}, "search_space.cliprange: low (0.3) must be < high (0.1)"),
    ({"lam": {"low": 0.9, "high": 0.9}}, "search_space.lam: low (0.9) must be < high (0.9)"),
    ({"clip_range": {"low": 0.1, "high": 0.2}}, "unknown parameter 'clip_range' (did you mean 'cliprange'?)"),
    ({"gamma": {"low": 0.9, "high": 1.0}}, "unknown parameter 'gamma'; searchable: cliprange, lam, kl_coef, lr"),
    ({"lam": {"low": 0.9, "high": 1.0, "step": 0.1}}, "search_space.lam.step: unknown key; allowed keys: low, high, log, grid"),
])
def test_bad_search_space_is_one_clear_line_before_any_compute(tmp_path, monkeypatch, space, fragment):
    studies = tmp_path / "ablations" / "studies"
    studies.mkdir(parents=True)
    (studies / "bad.yaml").write_text(json.dumps({"search_space": space}))
    monkeypatch.setenv("HARNESS_ABLATIONS", str(tmp_path / "ablations"))
    with pytest.raises(ConfigError) as e:
        sweep.run_sweep("bad", trials=2, workers=1, progress=False, report=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("study bad: ") and fragment in msg, msg
    assert not (study_storage.optuna_dir() / "bad.log").exists()  # nothing was created


def test_other_spec_errors_are_one_line():
    cases = [
        ({"objective": "gold_kl", "pruner": {"type": "median"}}, "cannot prune a multi-objective study"),
        ({"reevaluation": {"seeds": [0, 1, 2, 3, 4]}}, "reevaluation.seeds: [0] are used by the sweep"),
        ({"reevaluation": {"seeds": 3}}, "reevaluation.seeds: need at least 5 distinct seeds"),
        ({"base": {"ppo": {"cliprnge": 0.1}}}, "ppo.cliprnge: unknown key"),
        ({"trails": 3}, "trails: unknown key"),
    ]
    for change, fragment in cases:
        with pytest.raises(ConfigError) as e:
            study_spec.parse_study_spec({**VALID, **change}, "x")
        assert "\n" not in str(e.value) and fragment in str(e.value), str(e.value)


def test_multi_objective_defaults_to_no_pruner_and_grid_caps_trials():
    spec = study_spec.parse_study_spec({**VALID, "objective": "gold_kl"}, "x")
    assert spec.pruner.type == "none" and spec.directions == ["maximize", "minimize"]
    grid = study_spec.parse_study_spec({**VALID, "sampler": {"type": "grid", "grid_points": 2},
                                   "search_space": {**VALID["search_space"], "lam": {"low": 0.8, "high": 1.0, "grid": [0.9]}}}, "x")
    values = study_storage.grid_values(grid)
    assert values["cliprange"] == [0.05, 0.4] and values["lam"] == [0.9]
    assert values["kl_coef"] == pytest.approx([0.001, 0.5])  # geometric spacing of a log parameter
    assert study_storage.effective_cap(grid, "smoke", 10) == 4  # 2 × 1 × 2 grid points


# ------------------------------------------------------------------------------------------------
# Pruning hook and stale trials (fast, in-memory studies)
# ------------------------------------------------------------------------------------------------


def _seeded_study(good: float, n: int = 3) -> optuna.Study:
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0))
    dist = {"cliprange": FloatDistribution(0.05, 0.4)}
    for i in range(n):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=good, params={"cliprange": 0.1 + 0.05 * i},
                                     distributions=dist, intermediate_values={0: good, 1: good}))
    return study


def test_pruning_callback_reports_and_prunes_below_the_median():
    study = _seeded_study(good=1.0)
    good = study.ask()
    sweep_trial.PruningCallback(good).on_metrics(0, {"objective/score": 1.5})  # above the median 1.0: goes on
    assert study.trials[-1].intermediate_values == {0: 1.5}
    poor = study.ask()
    cb = sweep_trial.PruningCallback(poor, offset=0)
    cb.on_metrics(0, {"objective/score": float("nan")})  # not reported, not pruned
    assert study.trials[-1].intermediate_values == {}
    cb.offset = 1  # a second seed starts one step later
    with pytest.raises(optuna.TrialPruned, match="pruned at step 1"):
        cb.on_metrics(0, {"objective/score": 0.25})
    assert study.trials[-1].intermediate_values == {1: 0.25}
    assert (cb.last_step, cb.last_value) == (1, 0.25)
    # on held-out gold: read at the held-out evaluations only, never from an iteration's metrics
    study = _seeded_study(good=1.0)
    cb = sweep_trial.PruningCallback(study.ask(), metric="eval/gold")
    cb.on_metrics(1, {"objective/score": 5.0, "eval/gold": 0.1})
    assert study.trials[-1].intermediate_values == {}
    with pytest.raises(optuna.TrialPruned, match=r"pruned at step 1 \(eval/gold = 0.1\)"):
        cb.on_eval(1, {"eval/gold": 0.1})


# ------------------------------------------------------------------------------------------------
# End to end (smoke PPO trials in worker processes)
# ------------------------------------------------------------------------------------------------


def test_sweep_cap_resume_abandoned_retry_and_report(smoke_pipeline):
    name = "t_resume"
    # a floor every trial keeps (distinct-2 ≥ 0): the constraint is recorded without changing which trial is best
    spec = _spec(name, constraints=[{"metric": "eval_final/distinct_2", "min": 0.0, "margin": 0.1}])
    # 1) the driver runs trials two at a time as Ray tasks; the cap is met exactly
    sweep.run_sweep(name, trials=3, scale="smoke", workers=2, progress=False, report=False, spec=spec)
    study = _load(name)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert len({t.user_attrs["worker_pid"] for t in study.trials}) >= 2  # two trials ran at once
    runs = _trial_runs(name)
    assert len(runs) == 3
    by_number = {int(r.data.tags["trial_number"]): r for r in runs}
    for t in study.trials:
        r = by_number[t.number]
        assert r.info.status == "FINISHED" and r.data.tags["state"] == "complete"
        assert r.data.metrics["value"] == pytest.approx(t.value)
        assert float(r.data.params["cliprange"]) == pytest.approx(t.params["cliprange"])
        assert r.data.tags["pid"] == str(t.user_attrs["worker_pid"])
        assert r.info.run_id == t.user_attrs["mlflow_run_id"]
        d2 = t.user_attrs["constraint_values"]["eval_final/distinct_2"]
        assert 0.0 < d2 <= 1.0 and t.constraints == {"eval_final/distinct_2": pytest.approx(-d2)}

    # 2) the same command again starts no new trial (and no new invocation)
    parents = len(_parent_runs(name))
    sweep.run_sweep(name, trials=3, scale="smoke", workers=2, progress=False, report=False, spec=spec)
    assert len(_load(name).trials) == 3 and len(_trial_runs(name)) == 3 and len(_parent_runs(name)) == parents

    # 3) a trial left RUNNING by a killed driver: failed, retried with the same params, cap exact
    stale = _load(name).ask()
    params = {k: stale.suggest_float(k, p.low, p.high, log=spec.param_log(k)) for k, p in spec.search_space.items()}
    sweep.run_sweep(name, trials=4, scale="smoke", workers=1, progress=False, report=False, spec=spec)
    study = _load(name)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states and states.count(TrialState.COMPLETE) == 4
    failed = study.trials[stale.number]
    assert failed.state == TrialState.FAIL and "its sweep driver stopped" in failed.user_attrs["fail_reason"]
    retry = [t for t in study.trials if t.user_attrs.get("retry_of") == stale.number]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE and retry[0].params == params
    assert retry[0].user_attrs["attempt"] == 2
    runs = _trial_runs(name)
    assert len(runs) == len(study.trials) == 5  # one MLflow child run per trial, the failed one included
    failed_run = [r for r in runs if r.data.tags["trial_number"] == str(stale.number)][0]
    assert failed_run.info.status == "FAILED" and failed_run.data.tags["state"] == "failed"

    # 4) the report: plots, best config, counts (the re-evaluation is exercised by `make report`)
    path = study_report.write_study_report(name, scale="smoke", progress=False, reevaluate=False, spec=spec)
    summary = json.loads((path.parent / "summary.json").read_text())
    assert (summary["n_trials_complete"], summary["n_trials_pruned"], summary["n_trials_failed"]) == (4, 0, 1)
    assert summary["n_mlflow_child_runs"] == 5
    best = max((t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert summary["best_value"] == pytest.approx(best.value)
    assert set(summary["best_params"]) == {"cliprange", "lam", "kl_coef"}
    assert summary["default_params"] == {"cliprange": 0.2, "lam": 0.95, "kl_coef": 0.05}
    assert summary["constraints"] == [{"metric": "eval_final/distinct_2", "min": 0.0, "margin": 0.1}]
    assert [t["feasible"] for t in summary["trials"]] == [t.state == TrialState.COMPLETE for t in study.trials]
    for fig in ("history.png", "slice.png", "contour.png"):
        assert fig in summary["figures"] and (path.parent / fig).stat().st_size > 5000
    assert (path.parent / "best_config.yaml").is_file() and "## Best configuration" in path.read_text()
    best = yaml.safe_load((path.parent / "best_config.yaml").read_text())  # no machine's data directories in it
    assert "cache_dir" not in best["pipeline"]["data"] and "out_dir" not in best["pipeline"] and "seed" not in best
    assert "/tmp/" not in (path.parent / "summary.json").read_text()  # the store's directory is written <results>


@pytest.mark.slow
def test_a_killed_trial_worker_fails_its_trial_which_is_retried_and_the_cap_is_exact(smoke_pipeline):
    """SIGKILL the worker of a running trial: the driver tells the study FAIL (reason named), marks the
    trial's MLflow run FAILED, enqueues a retry with the same parameters, and stops at exactly the cap."""
    import signal
    import threading

    name = "t_kill"
    spec = _spec(name, scales={"smoke": {"overrides": {"ppo": {"total_iterations": 30}}}})
    engine.connect(2)  # on the main thread: a local instance's processes die with the thread that started it
    th = threading.Thread(target=lambda: sweep.run_sweep(name, trials=3, scale="smoke", workers=2, progress=False,
                                                         report=False, spec=spec))
    th.start()
    killed, deadline = None, time.time() + 300
    while killed is None and time.time() < deadline and th.is_alive():
        time.sleep(0.3)
        try:
            trials = _load(name).get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        except Exception:
            continue
        for t in trials:
            if "mlflow_run_id" in t.user_attrs:
                killed = (t.number, int(t.user_attrs["worker_pid"]))
                os.kill(killed[1], signal.SIGKILL)
                break
    th.join(600)
    assert killed is not None and not th.is_alive()
    study = _load(name)
    victim = study.trials[killed[0]]
    assert victim.state == TrialState.FAIL
    assert victim.user_attrs["fail_reason"] == "its worker process died (out of memory or killed?) while the trial was RUNNING"
    retry = [t for t in study.trials if t.user_attrs.get("retry_of") == killed[0]]
    assert len(retry) == 1 and retry[0].params == victim.params and retry[0].state == TrialState.COMPLETE
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 3 and states.count(TrialState.FAIL) == 1 and len(states) == 4
    runs = {r.data.tags["trial_number"]: r for r in _trial_runs(name)}
    assert len(runs) == 4 and runs[str(killed[0])].info.status == "FAILED"
    assert sorted(r.info.status for r in runs.values()) == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]


def test_pruning_is_wired_through_the_loop(smoke_pipeline):
    """A trial pruned on held-out gold (reported at each evaluation: every iteration at the smoke scale) by finished
    trials far better at every step; it still records its constraint from its last held-out evaluation."""
    name = "t_prune"
    spec = _spec(name, pruner={"type": "median", "n_startup_trials": 2, "warmup_fraction": 0.0, "metric": "eval/gold"},
                 constraints=[{"metric": "eval_final/distinct_2", "min": 2.0, "margin": 0.1}])
    study = study_storage.open_study(spec, "smoke")
    dist = {k: FloatDistribution(p.low, p.high, log=spec.param_log(k)) for k, p in spec.search_space.items()}
    for i in range(3):  # finished trials whose proxy score was far better at every step
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=10.0, distributions=dist,
                                     params={"cliprange": 0.1 + 0.1 * i, "lam": 0.9, "kl_coef": 0.01},
                                     intermediate_values={0: 10.0, 1: 10.0}))
    sweep.run_sweep(name, trials=4, scale="smoke", workers=1, progress=False, report=False, spec=spec)
    t = _load(name).trials[3]
    assert t.state == TrialState.PRUNED
    assert list(t.intermediate_values) == [0] and t.intermediate_values[0] < 10.0  # pruned after iteration 0
    (run,) = _trial_runs(name)
    assert run.data.tags["state"] == "pruned" and run.info.status == "FINISHED"
    assert run.data.metrics["pruned_at_step"] == 0.0 and run.data.metrics["value"] == pytest.approx(t.intermediate_values[0])
    from harness.infra import tracking

    gold0 = [m.value for m in tracking.client().get_metric_history(run.info.run_id, "eval/gold") if m.step == 0]
    assert gold0 == [pytest.approx(t.intermediate_values[0])]  # the pruner read held-out gold, not the proxy score
    d2 = [m.value for m in tracking.client().get_metric_history(run.info.run_id, "eval/distinct_2") if m.step == 0]
    assert t.user_attrs["constraint_values"] == {"eval_final/distinct_2": pytest.approx(d2[0])}
    assert t.constraints == {"eval_final/distinct_2": pytest.approx(2.0 - d2[0])}  # above 1: infeasible


@pytest.mark.slow
def test_a_sweep_is_archived_and_a_machine_without_it_reports_and_resumes_it(smoke_pipeline, tmp_path, monkeypatch):
    """The sweep writes its journal (gzipped, the host scrubbed) and its runs (the invocation and one per trial) to
    reports/NAME/archive/. A machine with neither the journal nor the MLflow runs renders the same trials from the
    archive, and a sweep with a cap one higher there runs exactly one new trial."""
    import gzip

    from harness.experiments import archive
    from harness.infra import tracking

    name = "t_archived"
    spec = _spec(name)
    sweep.run_sweep(name, trials=2, scale="smoke", workers=1, progress=False, report=False, spec=spec)
    before = {t.number: (t.state, t.value, t.params) for t in _load(name).trials}
    assert len(before) == 2
    journal = archive.archive_dir(name) / study_storage.JOURNAL_ARCHIVE
    local = study_storage.optuna_dir() / f"{name}.log"
    assert gzip.decompress(journal.read_bytes()).decode() == archive.scrub(local.read_text())
    roles = sorted(r["tags"]["role"] for r in archive.archive_records(name).values())
    assert roles == ["sweep", "trial", "trial"]

    # another machine: no journal, an empty MLflow store; the same reports directory (a clone of the repository)
    local.rename(tmp_path / "journal.log")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'fresh.db'}")
    path = study_report.write_study_report(name, scale="smoke", progress=False, reevaluate=False, spec=spec)
    summary = json.loads((path.parent / "summary.json").read_text())
    assert (summary["n_trials_complete"], summary["n_mlflow_child_runs"]) == (2, 2)
    assert summary["best_value"] == pytest.approx(max(v for _, v, _ in before.values()))
    restored = _load(name).trials
    assert {t.number: (t.state, t.value, t.params) for t in restored} == before
    if len(tracking.host()) >= 4:
        assert {t.user_attrs["host"] for t in restored} == {"<host>"}
    sweep.run_sweep(name, trials=3, scale="smoke", workers=1, progress=False, report=False, spec=spec)
    assert [t.state for t in _load(name).trials] == [TrialState.COMPLETE] * 3
    assert len(_trial_runs(name)) == 3 and len(_parent_runs(name)) == 2  # the restored invocation and the new one
    assert sorted(r["tags"]["role"] for r in archive.archive_records(name).values()) == ["sweep"] * 2 + ["trial"] * 3


def test_study_from_another_spec_is_not_resumed(smoke_pipeline):
    name = "t_fingerprint"
    study_storage.open_study(_spec(name), "smoke")
    other = _spec(name, search_space={**VALID["search_space"], "lam": {"low": 0.9, "high": 1.0}})
    with pytest.raises(HarnessError, match="was created from a different spec"):
        sweep.run_sweep(name, trials=1, workers=1, progress=False, report=False, spec=other)


def test_a_study_report_shows_its_storage_without_machine_paths(tmp_path, monkeypatch):
    """The journal file inside the project is shown relative to it, one elsewhere by its file name only, and a
    database URL with its password redacted."""
    from pathlib import Path

    root = Path(study_storage.__file__).resolve().parents[2]
    monkeypatch.setenv(study_storage.STORAGE_ENV, str(root / "results" / "optuna" / "ppo_core.log"))
    assert study_storage.display_storage("ppo_core") == "results/optuna/ppo_core.log"
    monkeypatch.setenv(study_storage.STORAGE_ENV, str(tmp_path / "x" / "ppo_core.log"))
    assert study_storage.display_storage("ppo_core") == "<outside the project>/ppo_core.log"
    monkeypatch.setenv(study_storage.STORAGE_ENV, "postgresql+psycopg://u:secret@db/optuna")
    assert study_storage.display_storage("ppo_core") == "postgresql+psycopg://u:***@db/optuna"


def _reeval_values():
    """Ten re-evaluation seeds per arm on draws 10..19; best − default per draw: 0.10, 0.03, 0.10, 0.10, 0.10, 0.08,
    0.09, 0.09, 0.09, 0.09 (mean 0.087)."""
    best = [0.30, 0.25, 0.28, 0.35, 0.31, 0.27, 0.33, 0.29, 0.26, 0.32]
    default = [0.20, 0.22, 0.18, 0.25, 0.21, 0.19, 0.24, 0.20, 0.17, 0.23]
    return best, default, [str(d) for d in range(10, 20)]


def test_the_reevaluation_is_judged_by_the_ablations_rule_on_per_draw_differences():
    """The study's selection gets a verdict: best − default > 0 on the first objective metric, tested on the
    per-draw differences when the seeds ran on pipeline draws (scipy's paired t test is the reference), else by
    Welch's test; fewer seeds than the rule's minimum decide nothing."""
    from scipy import stats as st

    spec = study_spec.load_study_spec("ppo_core")
    best, default, draws = _reeval_values()
    row = study_report.reevaluation_verdict(spec, best, default, draws, draws)
    ref = st.ttest_rel(best, default)
    lo, hi = ref.confidence_interval(0.95)
    assert row["blocks"] == 10 and row["diff"] == pytest.approx(0.087)
    assert (row["p_raw"], row["ci_low"], row["ci_high"]) == pytest.approx((ref.pvalue, lo, hi))
    assert row["verdict"] == "reproduced" and row["metric"] == "eval_final/gold" and row["margin"] == 0.05
    assert row["expected"] == "best − default > 0" and row["caveats"] == []
    # the default better on every draw: contradicted
    assert study_report.reevaluation_verdict(spec, default, best, draws, draws)["verdict"] == "contradicted"
    # without draw labels: Welch over seeds
    welch = study_report.reevaluation_verdict(spec, best, default)
    assert "blocks" not in welch and welch["p_raw"] == pytest.approx(st.ttest_ind(best, default, equal_var=False).pvalue)
    # identical arms up to noise far below the margin: the one-sided margin test rules an advantage of 0.05 out
    flat = [0.2 + 0.001 * (i % 3) for i in range(10)]
    assert study_report.reevaluation_verdict(spec, flat, flat[::-1], draws, draws)["verdict"] == "below margin"
    assert study_report.reevaluation_verdict(spec, best[:5], default[:5], draws[:5], draws[:5])["verdict"] == \
        "not enough seeds (n = 5 < 10)"
    # from the finished runs: each value paired with its run's pipeline draw (tag ``replicate``)
    from types import SimpleNamespace as NS

    def run(v, d, i):
        return NS(info=NS(run_id=f"r{i}"), data=NS(metrics={"eval_final/gold": v, "eval_final/proxy": 0.0,
                                                             "eval_final/kl": 1.0, "eval_final/length": 24.0},
                                                    tags={"replicate": d}))
    runs = {"best": {1010 + i: run(v, d, i) for i, (v, d) in enumerate(zip(best, draws))},
            "default": {1010 + i: run(v, d, 10 + i) for i, (v, d) in enumerate(zip(default, draws))}}
    out = study_report._compare_arms(spec, "default", list(range(1010, 1020)), {"cliprange": 0.1}, runs)
    assert out["verdict"]["blocks"] == 10 and out["verdict"]["p_raw"] == pytest.approx(ref.pvalue)
    assert out["comparison"]["eval_final/gold"]["diff_mean"] == pytest.approx(0.087)
    assert out["arms"]["default"]["params"] == {"cliprange": 0.2, "lam": 0.95, "kl_coef": 0.05}
    # length stands beside the objective as a diagnostic (no better direction); distinct-2, logged by no run, is left out
    length = out["comparison"]["eval_final/length"]
    assert list(out["comparison"]) == ["eval_final/gold", "eval_final/proxy", "eval_final/kl", "eval_final/length"]
    assert length["goal"] == "none" and length["p_best_better"] is None and length["best"]["mean"] == 24.0
    assert study_report._reeval_row("eval_final/length", length, ["eval_final/gold"]).startswith(
        "| `eval_final/length` (diagnostic) | 24 [24, 24] (n=10) |")


#: A re-evaluation comparison of final gold with no runs behind it (every statistic empty).
_EMPTY_GOLD = {"eval_final/gold": {
    "goal": "max", "best": {"mean": None, "ci_low": None, "ci_high": None, "n": 0, "iqm": None},
    "default": {"mean": None, "ci_low": None, "ci_high": None, "n": 0, "iqm": None}, "diff_mean": None,
    "diff_ci_low": None, "diff_ci_high": None, "p_welch": None, "p_best_better": None}}


def _reevaluation(seeds: list, comparison: dict, **fields) -> dict:
    """A study summary's ``reevaluation`` (sweep seeds 0-1, gold the objective, no runs failed) with ``fields``."""
    return {"seeds": seeds, "sweep_seeds": [0, 1], "primary": ["eval_final/gold"], "arms": {}, "failed": [],
            "comparison": comparison, **fields}


def _study_summary(reevaluation: dict, **fields) -> dict:
    """A ppo_core study summary as :func:`harness.reporting.study.write_study_report` keeps it: no trials, the given
    ``reevaluation``, and ``fields`` in place of the defaults."""
    return {"study": "ppo_core", "scale": "default", "sampler": "tpe", "pruner": "median", "optuna_study": "s",
            "storage": "x", "experiment": "study:ppo_core", "tracking_uri": "x", "generated_at": "t", "cap": 30,
            "n_trials": 0, "n_trials_complete": 0, "n_trials_pruned": 0, "n_trials_failed": 0,
            "n_trials_running": 0, "n_trials_waiting": 0, "n_mlflow_child_runs": 0, "n_workers_seen": 0,
            "trials": [], "best_trial": None, "best_values": None, "best_params": None, "default_params": {},
            "importances": {}, "pareto_front": [], "figure_notes": {}, "reevaluation": reevaluation, **fields}


def test_the_study_report_prints_the_reevaluation_verdict():
    spec = study_spec.load_study_spec("ppo_core")
    best, default, draws = _reeval_values()
    summary = _study_summary(_reevaluation(list(range(1010, 1020)), _EMPTY_GOLD,
                                           verdict=study_report.reevaluation_verdict(spec, best, default, draws, draws)))
    text = study_report.render_study_markdown(spec, summary, {})
    assert ("**Verdict on the selection** (`eval_final/gold`: best − default > 0, margin 0.05; the ablations' rule: "
            "α 0.05, at least 10 seeds per arm, the t test of the per-draw differences, a one-sided margin test for "
            "\"below margin\"): **reproduced** — the best configuration's advantage holds on seeds and pipeline draws "
            "the sweep never saw. eval_final/gold: best 0.296") in text
    assert "not a verdict" not in text
    answer = [ln for ln in text.splitlines() if ln.startswith("**Answer.**")]
    assert answer == ["**Answer.** No feasible complete trial yet, so no configuration is recommended."]
    # one pipeline draw (the smoke scale, or a study whose seeds share a draw): Welch over seeds, no ``blocks`` key
    summary["reevaluation"]["verdict"] = study_report.reevaluation_verdict(spec, best, default)
    text = study_report.render_study_markdown(spec, summary, {})
    assert ("the ablations' rule: α 0.05, at least 10 seeds per arm, Welch's test over seeds, a one-sided margin test "
            "for \"below margin\"): **reproduced**") in text


def test_the_study_report_counts_each_arms_degenerate_seeds_and_shows_its_most_repetitive_seeds_samples():
    """A mean can keep the floor while seeds loop: per seed, each arm's final gold and distinct-2 (ppo_core's floor
    0.6 on distinct-2), the evaluation's degenerate flag counted and the seeds below the floor counted, by hand."""
    from types import SimpleNamespace

    from harness.reporting.reevaluation import _standing

    spec = study_spec.load_study_spec("ppo_core")

    def run(gold, d2, flag):
        return SimpleNamespace(data=SimpleNamespace(metrics={"eval_final/gold": gold, "eval_final/distinct_2": d2,
                                                             "eval_final/degenerate": flag}))

    runs = {"best": {1010: run(0.3, 0.21, 0.0), 1011: run(0.2, 0.65, 0.0), 1012: run(0.4, 0.05, 1.0)},
            "default": {1010: run(0.1, 0.7, 0.0), 1011: run(0.12, 0.59, 0.0)}}
    per_seed, standing = _standing(spec, runs)
    assert standing == {"best": {"n": 3, "degenerate": 1, "below": {"eval_final/distinct_2": {"floor": 0.6, "count": 2}}},
                        "default": {"n": 2, "degenerate": 0, "below": {"eval_final/distinct_2": {"floor": 0.6, "count": 1}}}}
    assert [x["seed"] for x in per_seed] == [1010, 1011, 1012] and per_seed[2]["default"] == {}
    table = study_report._seed_table(spec, {"per_seed": per_seed, "standing": standing})
    assert table["metrics"] == ["eval_final/gold", "eval_final/distinct_2"]
    assert table["rows"] == ["| 1010 | 0.3 | 0.21 ↓ | 0.1 | 0.7 |", "| 1011 | 0.2 | 0.65 | 0.12 | 0.59 ↓ |",
                             "| 1012 | 0.4 ⚠ | 0.05 ↓ | – | – |"]
    assert table["counts"] == ("best: 1 of 3 seeds degenerate; 2 below the floor of `eval_final/distinct_2` (0.6); "
                               "default: 0 of 2 seeds degenerate; 1 below the floor of `eval_final/distinct_2` (0.6)")
    best, default, draws = _reeval_values()
    summary = _study_summary(_reevaluation(
        [1010, 1011, 1012], _EMPTY_GOLD, verdict=study_report.reevaluation_verdict(spec, best, default),
        per_seed=per_seed, standing=standing,
        samples=[{"variant": "best", "seed": 1012, "distinct_2": 0.05, "iteration": 55,
                  "samples": [{"prompt": "The film", "response": "great great great", "score": 2.5, "gold_lexicon": 0.9}]},
                 {"variant": "default", "seed": 1011, "distinct_2": 0.59, "iteration": None, "samples": []}]))
    lines = study_report.render_study_markdown(spec, summary, {}).splitlines()
    at = lines.index("| seed | best: `eval_final/gold` | best: `eval_final/distinct_2` | default: `eval_final/gold` | "
                     "default: `eval_final/distinct_2` |")
    assert lines[at + 1] == "|---|---|---|---|---|" and lines[at + 2:at + 5] == table["rows"]
    assert any(ln.endswith("Best: 1 of 3 seeds degenerate; 2 below the floor of `eval_final/distinct_2` (0.6); default: 0 "
                           "of 2 seeds degenerate; 1 below the floor of `eval_final/distinct_2` (0.6).") for ln in lines)
    assert "*best*, seed 1012 (distinct-2 0.05, iteration 55)" in lines
    assert "| The film | great great great | 2.5 | 0.9 |" in lines
    assert "*default*, seed 1011 (distinct-2 0.59): no samples recorded." in lines


def test_a_pruned_trials_row_does_not_show_its_pruning_signal_as_the_objective():
    """Optuna stores a pruned trial's last intermediate value (here the proxy score) as its value; the trials table
    says so instead of printing it in the objective's column as if it were final gold."""
    from harness.reporting.study import _trial_row

    base = {"number": 3, "params": {"cliprange": 0.2, "lam": 0.9, "kl_coef": 0.01}, "worker": 1, "retry_of": None,
            "fail_reason": None}
    assert _trial_row({**base, "state": "pruned", "values": [1.408]})["vals"] == \
        "– (pruned at an intermediate proxy score of 1.408)"
    assert _trial_row({**base, "state": "complete", "values": [0.4333]})["vals"] == "0.4333"
    assert _trial_row({**base, "state": "fail", "values": None})["vals"] == "–"


# ------------------------------------------------------------------------------------------------
# Constraints (issue: the study must not recommend degenerate text)
# ------------------------------------------------------------------------------------------------


def test_a_constrained_study_records_each_trials_violation_and_chooses_the_best_feasible_trial():
    """ppo_core's floor distinct-2 ≥ 0.6: a trial's violation is 0.6 − (mean distinct-2 over its seeds), a pruned
    trial's comes from its last held-out value, and the best trial is the best *feasible* one (Optuna's own
    best_trial agrees); the trials table marks the infeasible ones."""
    spec = study_spec.load_study_spec("ppo_core")
    assert [(c.metric, c.min, c.margin) for c in spec.constraints] == [("eval_final/distinct_2", 0.6, 0.1)]
    study = optuna.create_study(direction="maximize")
    dist = {k: FloatDistribution(0.0, 1.0) for k in ("cliprange", "lam", "kl_coef")}

    def finish(gold, d2s, last=None):
        t = study.ask(dist)
        summaries = [{"eval_final": {"gold": gold, "distinct_2": d}} for d in d2s]
        values = sweep_trial.record_constraints(t, spec, summaries, last)
        study.tell(t, gold if d2s else None, state=TrialState.COMPLETE if d2s else TrialState.PRUNED)
        return values

    assert finish(0.50, [0.30, 0.20]) == {"eval_final/distinct_2": pytest.approx(0.25)}  # the loops win gold
    assert finish(0.30, [0.70, 0.65]) == {"eval_final/distinct_2": pytest.approx(0.675)}
    finish(0.20, [0.80, 0.80])
    assert finish(None, [], {"eval_final/distinct_2": 0.35}) == {"eval_final/distinct_2": 0.35}  # pruned
    finish(None, [], {})  # pruned before any held-out evaluation: no value, no constraint set
    ts = study.trials
    assert [t.constraints.get("eval_final/distinct_2") for t in ts] == \
        [pytest.approx(0.35), pytest.approx(-0.075), pytest.approx(-0.2), pytest.approx(0.25), None]
    assert study_report.choose_best(study, spec).number == 1 and study.best_trial.number == 1
    assert study_report.choose_best(optuna.create_study(), spec) is None
    records = study_report._trial_records(ts, spec)
    assert [study_report._trial_row(r)["constraints"] for r in records] == \
        ["0.25 (infeasible)", "0.675", "0.8", "0.35 (infeasible)", "– (infeasible)"]
    # an unconstrained spec: every complete trial counts, and the rows carry no constraint cell
    plain = study_spec.parse_study_spec(VALID, "plain")
    assert plain.constraints == [] and study_report.choose_best(study, plain).number == 0
    assert study_report._trial_row(study_report._trial_records(ts, plain)[0])["constraints"] is None
    # the floor enters the fingerprint, so a study run without it is not resumed under it
    assert study_spec.spec_fingerprint(spec, "default") != study_spec.spec_fingerprint(
        spec.model_copy(update={"constraints": []}), "default")


def test_constraint_specs_are_checked_before_any_compute():
    with pytest.raises(ConfigError, match=r"constraints: each metric at most once"):
        study_spec.parse_study_spec({**VALID, "constraints": [{"metric": "eval_final/distinct_2", "min": 0.4, "margin": 0.1}] * 2}, "x")
    with pytest.raises(ConfigError, match=r"constraints.0.metric"):
        study_spec.parse_study_spec({**VALID, "constraints": [{"metric": "distinct_2", "min": 0.4, "margin": 0.1}]}, "x")
    with pytest.raises(ConfigError, match=r"constraints.0.margin"):
        study_spec.parse_study_spec({**VALID, "constraints": [{"metric": "eval_final/distinct_2", "min": 0.4, "margin": 0}]}, "x")


def test_the_constraint_is_judged_on_fresh_seeds_as_non_inferiority():
    """default − best < margin (0.1 distinct-2), by the ablations' rule: on per-draw differences the one-sided test
    of d = margin, d̂ < margin supporting the claim (scipy's one-sample t test is the reference); a best configuration 0.3 lower is contradicted."""
    from scipy import stats as st

    spec = study_spec.load_study_spec("ppo_core")
    [con] = spec.constraints
    default = [0.50, 0.45, 0.55, 0.48, 0.52, 0.47, 0.51, 0.49, 0.53, 0.46]
    best = [v + 0.01 * (i % 3) for i, v in enumerate(default)]
    draws = [str(d) for d in range(10, 20)]
    row = study_report.constraint_verdict(spec, con, best, default, draws, draws)
    diffs = [d - b for d, b in zip(default, best)]
    ref = st.ttest_1samp([x - 0.1 for x in diffs], 0.0)
    assert row["expected"] == "default − best < 0.1" and row["floor"] == 0.6 and row["blocks"] == 10
    assert row["diff"] == pytest.approx(sum(diffs) / 10) and row["p_raw"] == pytest.approx(ref.pvalue)
    assert row["verdict"] == "reproduced"
    worse = [v - 0.3 for v in default]
    assert study_report.constraint_verdict(spec, con, worse, default, draws, draws)["verdict"] == "contradicted"


def test_the_study_report_states_the_constraint_the_sft_policys_naturalness_and_its_verdict():
    spec = study_spec.load_study_spec("ppo_core")
    [con] = spec.constraints
    default = [0.50, 0.45, 0.55, 0.48, 0.52, 0.47, 0.51, 0.49, 0.53, 0.46]
    draws = [str(d) for d in range(10, 20)]
    summary = _study_summary(
        _reevaluation(list(range(1010, 1020)), {}, verdict=None,
                      sft={"eval_final/gold": {"mean": 0.02, "n": 10}, "eval_final/distinct_2": {"mean": 0.68, "n": 10}},
                      constraint_verdicts=[study_report.constraint_verdict(spec, con, default, default, draws, draws)]),
        n_trials=1, n_trials_complete=1, n_mlflow_child_runs=1, n_workers_seen=1,
        trials=[{"number": 0, "state": "complete", "values": [0.3], "params": {"cliprange": 0.2, "lam": 0.9, "kl_coef": 0.01},
                 "worker": 1, "retry_of": None, "fail_reason": None, "constraint_values": {"eval_final/distinct_2": 0.65},
                 "feasible": True}],
        best_trial=0, best_values={"eval_final/gold": 0.3}, best_params={"cliprange": 0.2}, default_params={"cliprange": 0.2})
    text = study_report.render_study_markdown(spec, summary, {})
    assert "Objective: **final gold reward ↑**, subject to `eval_final/distinct_2` ≥ 0.6 (mean over a trial's seeds" in text
    assert "- `eval_final/distinct_2` ≥ 0.6: the SFT policy's held-out value is 0.68" in text
    assert "`eval_final/gold` 0.02, `eval_final/distinct_2` 0.68." in text
    assert "| # | state | value(s) | eval_final/distinct_2 | cliprange |" in text and "| 0 | complete | 0.3 | 0.65 | 0.2 |" in text
    assert "Trial #0 (best objective value among the feasible trials)" in text
    # the answer comes first: the chosen configuration and both verdicts (here no gold verdict yet)
    assert text.splitlines()[4].startswith("**Answer.** Trial #0 (best objective value among the feasible trials: "
                                           "cliprange 0.2); not yet re-run on fresh seeds.")
    best, dflt, draws = _reeval_values()
    summary["reevaluation"]["verdict"] = study_report.reevaluation_verdict(spec, best, dflt, draws, draws)
    text = study_report.render_study_markdown(spec, summary, {})
    from scipy import stats as st

    from harness.reporting.render import fmt

    lo, hi = st.ttest_rel(best, dflt).confidence_interval(0.95)  # the per-draw differences' t interval
    assert text.splitlines()[4] == (
        "**Answer.** Trial #0 (best objective value among the feasible trials: cliprange 0.2), re-run against the "
        f"default configuration on fresh seeds: `eval_final/gold` best − default 0.087 [{fmt(lo)}, {fmt(hi)}], "
        "**reproduced**; `eval_final/distinct_2` default − best 0 [0, 0] (margin 0.1), **reproduced**.")
    assert ("**Verdict on the constraint** (`eval_final/distinct_2`: default − best < 0.1, margin 0.1; floor 0.6 on the "
            "sweep's seeds): **reproduced**") in text
