"""Runs of several builds of the pipeline (the same stage keys, other weights) are pooled as strata (harness.experiments.builds):
hand examples of the helpers, the report's choice of one build per seed, the per-build effects and their
heterogeneity test, the driver's retraining of a seed only where its arms would span builds, and the error rate of
the rule when builds shift an arm-independent level."""

from __future__ import annotations

import dataclasses
import os
from unittest import mock

import pandas as pd

from harness.experiments.builds import build_ids, choose_build, machine_stages, pool_builds, recorded_digests, run_matches

X = {"pipeline.gold": "g", "digest.gold": "x1", "pipeline.human_rm": "h", "digest.human_rm": "x2"}
Y = {"pipeline.gold": "g", "digest.gold": "y1", "pipeline.human_rm": "h", "digest.human_rm": "y2"}


def test_machine_stages_and_run_matches_by_hand():
    """Stages without a digest are left out; a run matches when every stage it used under this machine's key has
    this machine's digest; another draw's SFT (another key) is not compared; a missing digest does not match."""
    machine = machine_stages([{"stages": {"gold": {"key": "g", "weights_sha256": "y1"},
                                          "data": {"key": "d", "weights_sha256": None},
                                          "human_rm": {"key": "h", "weights_sha256": "y2"},
                                          "sft": {"key": "s0", "weights_sha256": "y3"}}},
                              {"stages": {"gold": {"key": "other", "weights_sha256": "z"}}}])
    assert machine == {"gold": ("g", "y1"), "human_rm": ("h", "y2"), "sft": ("s0", "y3")}
    assert run_matches({**Y, "pipeline.sft": "s7", "digest.sft": "q"}, machine)
    assert not run_matches({**X, "pipeline.sft": "s7", "digest.sft": "q"}, machine)
    assert not run_matches({**Y, "pipeline.sft": "s0", "digest.sft": "x3"}, machine)  # draw 0 itself built elsewhere
    assert not run_matches({"pipeline.gold": "g"}, machine)
    assert run_matches({"pipeline.gold": "another recipe", "digest.gold": "z"}, machine)


def _frame(rows):
    return pd.DataFrame([{"variant": v, "seed": s, "start_time": t, **{f"tags.{k}": x for k, x in tags.items()},
                          "tags.pipeline.sft": f"s{s}", "tags.digest.sft": f"{v}{s}"} for v, s, t, tags in rows])


def test_build_ids_and_choose_build_by_hand():
    """Shared stages are those every run recorded under one key (gold, human_rm; each seed's SFT has its own key,
    and sft_draw0 is recorded by two runs only: both left out). X holds 3 (variant, seed), Y 2 → X is counted and Y named; at 2 against 2 the build whose first run
    started first wins, whatever the row order."""
    d0 = {"pipeline.sft_draw0": "s0", "digest.sft_draw0": "q"}  # recorded by some runs only: not compared
    runs = _frame([("a", 0, 5, X), ("b", 0, 6, X), ("a", 1, 7, {**X, **d0}), ("a", 0, 1, Y), ("b", 1, 2, {**Y, **d0})])
    assert build_ids(runs).tolist() == ["gold=x1; human_rm=x2"] * 3 + ["gold=y1; human_rm=y2"] * 2
    chosen, others = choose_build(runs)
    assert chosen == "gold=x1; human_rm=x2"
    assert others == [{"build": "gold=y1; human_rm=y2", "runs": 2, "keys": ["a/s0", "b/s1"]}]
    tie = _frame([("a", 0, 5, X), ("b", 0, 6, X), ("a", 0, 1, Y), ("b", 1, 9, Y)])
    assert choose_build(tie)[0] == "gold=y1; human_rm=y2"
    assert choose_build(tie.iloc[::-1])[0] == "gold=y1; human_rm=y2"
    assert choose_build(_frame([("a", 0, 5, X), ("a", 1, 6, X)]))[1] == []
    one_arm = _frame([("a", s, s, X) for s in range(4)] + [("a", 0, 9, Y), ("b", 0, 9, Y)])
    assert choose_build(one_arm)[0] == "gold=y1; human_rm=y2"  # 4 runs of one arm judge nothing; 2 arms do


def _child(c, exp, variant, seed, config_hash, tags, scale="smoke", gold=0.5):
    run = c.create_run(exp, tags={"kind": "child", "variant": variant, "seed": str(seed), "scale": scale,
                                  "config_hash": config_hash, **tags})
    c.log_metric(run.info.run_id, "eval_final/gold", gold)
    c.log_metric(run.info.run_id, "eval_final/kl", gold)
    c.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def test_the_driver_retrains_a_seed_only_where_its_arms_would_span_builds(tmp_path):
    """Plan a, b × seeds 0-4 on this machine's build Y. Seed 0: a and b FINISHED on X, nothing to train → kept (pooled).
    Seed 1: a FINISHED on X, b to train → a set aside, trained again here. Seed 2: a FINISHED on Y → kept. Seed 3: a
    FINISHED on Y and later on X → the older Y run stands in. Seed 4: a has a newer X and an older Y run in another
    ablation → the Y one is copied. The pipeline is built once, for the runs to train; with nothing to train, nothing
    is built and every run is accepted."""
    from harness.infra import tracking
    from harness.experiments.ablate import RunTask, find_reusable, resume_state, reusable_candidates
    from harness.experiments.plan import accept_for_training

    def task(variant, seed):
        return RunTask(ablation="bld", scale="smoke", variant=variant, seed=seed, config={},
                       config_hash=f"{variant}{seed}", total_iterations=1)

    built = []

    def build_pipelines(tasks):
        built.append(sorted(t.key for t in tasks))
        return [{"stages": {"gold": {"key": "g", "weights_sha256": "y1"}, "human_rm": {"key": "h", "weights_sha256": "y2"}}}]

    console = mock.Mock()
    tasks = [task(v, s) for s in range(5) for v in ("a", "b")]
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = tracking.init_store()
        exp, other = tracking.experiment_id(c, "ablation/bld"), tracking.experiment_id(c, "ablation/src")
        _child(c, exp, "a", 0, "a0", X)
        _child(c, exp, "b", 0, "b0", X)
        _child(c, exp, "a", 1, "a1", X)
        _child(c, exp, "a", 2, "a2", Y)
        mine_y = _child(c, exp, "a", 3, "a3", Y)
        _child(c, exp, "a", 3, "a3", X)
        old_y = _child(c, other, "a", 4, "a4", Y)
        new_x = _child(c, other, "a", 4, "a4", X)
        state = resume_state(c, exp, tasks)
        todo = [t for t in tasks if t.key not in state.finished]
        cands = reusable_candidates(c, exp, tasks)
        assert {k: [run.info.run_id for _, run in v] for k, v in cands.items()} == {"a/s4": [new_x, old_y]}
        accept = accept_for_training(c, exp, tasks, todo, state, True, console, build_pipelines, cands)
        assert built == [["b/s1", "b/s2", "b/s3", "b/s4"]]
        assert {k: accept(state.finished_tags[k]) for k in sorted(state.finished)} == {
            "a/s0": True, "a/s1": False, "a/s2": True, "a/s3": True, "b/s0": True}
        assert state.finished["a/s3"] == mine_y
        assert find_reusable(c, exp, todo, accept, cands)["a/s4"][1].info.run_id == old_y
        said = " ".join(str(call.args[0]) for call in console.print.call_args_list)
        assert "set aside[/] a/s1" in said and "a/s0" not in said and "not copied[/] a/s4" in said

        built.clear()
        done = [task("a", 0), task("b", 0)]
        state = resume_state(c, exp, done)
        assert accept_for_training(c, exp, done, [], state, True, console, build_pipelines)(Y) is True
        assert built == []


def test_copies_in_take_one_build_per_seed(tmp_path):
    """With nothing to train, every candidate is acceptable, but a seed's copies come from one build. Seed 0: a has a
    newer X and an older Y run in another ablation, b only a Y run → both copied from Y (the newest pick would span
    builds and the report would set one aside). Seed 1: a has a newer Y and an older X run and b is FINISHED here on
    X → a's X run. Seed 2: a only on X, b only on Y → a tie, each takes its only run (the report sets one aside)."""
    from harness.infra import tracking
    from harness.experiments.ablate import RunTask, find_reusable, resume_state
    from harness.experiments.plan import seed_builds

    def task(variant, seed):
        return RunTask(ablation="bld", scale="smoke", variant=variant, seed=seed, config={},
                       config_hash=f"{variant}{seed}", total_iterations=1)

    assert seed_builds([task("a", 0), task("b", 0)], {"a/s0": [{**X, "seed": "0"}, {**Y, "seed": "0"}],
                                                      "b/s0": [{**Y, "seed": "0"}]}, {}) == {
        "a/s0": [False, True], "b/s0": [True]}
    tasks = [task(v, s) for s in range(3) for v in ("a", "b")]
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = tracking.init_store()
        exp, other = tracking.experiment_id(c, "ablation/bld"), tracking.experiment_id(c, "ablation/src")
        a0_y = _child(c, other, "a", 0, "a0", Y)
        _child(c, other, "a", 0, "a0", X)
        b0_y = _child(c, other, "b", 0, "b0", Y)
        a1_x = _child(c, other, "a", 1, "a1", X)
        _child(c, other, "a", 1, "a1", Y)
        _child(c, exp, "b", 1, "b1", X)
        a2_x = _child(c, other, "a", 2, "a2", X)
        b2_y = _child(c, other, "b", 2, "b2", Y)
        state = resume_state(c, exp, tasks)
        todo = [t for t in tasks if t.key not in state.finished]
        found = find_reusable(c, exp, todo, finished=state.finished_tags)
        assert {k: run.info.run_id for k, (_, run) in found.items()} == {
            "a/s0": a0_y, "b/s0": b0_y, "a/s1": a1_x, "a/s2": a2_x, "b/s2": b2_y}


def test_a_seed_with_arms_to_train_here_takes_only_runs_of_this_build():
    """The rule the driver and the planner share (harness.experiments.plan.seeds_on_build), by hand: seed 3 has arms
    to train here, the machine's gold is ``g`` of digest ``x1``."""
    from harness.experiments.plan import seeds_on_build

    accept = seeds_on_build({3}, {"gold": ("g", "x1")})
    assert [accept({"seed": seed, "pipeline.gold": "g", "digest.gold": digest})
            for seed, digest in (("3", "y1"), ("3", "x1"), ("7", "y1"))] == [False, True, True]
    assert accept({"seed": "3", "pipeline.gold": "h", "digest.gold": "y1"})  # another gold key: not compared
    assert not accept({"seed": "3", "pipeline.gold": "g"})  # the same key and no digest: nothing shows it is x1


def test_the_rule_keeps_its_error_rate_when_builds_shift_an_arm_independent_level():
    """2,000 A/A ablations judged by the sequential rule (looks at 8 and 16 seeds per arm): each seed its own pipeline
    draw, seeds alternating between two builds, the second build shifting both arms' level by 3 seed SDs, the effect
    varying by draw as in the calibration (harness.analysis.calibrate.replicated_pair). One build per seed and blocked by draw
    on build, a decisive verdict comes in ≤ α + 3 MC SEs; with each seed's arms on different builds (what pooling per
    seed prevents), far more often."""
    import math

    import numpy as np

    from harness.experiments.spec import Claim
    from harness.analysis.calibrate import replicated_pair
    from harness.analysis.sequential import sequential_decisions
    from harness.analysis.verdicts import claim_look

    rng = np.random.default_rng(3)
    claim = Claim(claim="c", kind="finding", source="s", section="-", setting_note="-", metric="x/y", a="a", b="b",
                  expect="greater", margin=0.5)
    reps, errors, split = 2000, 0, 0
    for _ in range(reps):
        a, b, draws = replicated_pair(rng, 16, 0.0, replicates=16)
        build = np.arange(16) % 2
        labels = [f"{d}@{k}" for d, k in zip(draws, build)]
        pooled = [claim_look(claim, a[:n] + 3.0 * build[:n], b[:n] + 3.0 * build[:n], labels[:n], labels[:n])
                  for n in (8, 16)]
        errors += sequential_decisions([pooled], 0.05, 16)[0]["decided"]
        # arm a on one build, arm b on the other: the build is confounded with the arm
        crossed = [claim_look(claim, a[:n] + 3.0, b[:n], [str(d) for d in draws[:n]], [str(d) for d in draws[:n]])
                   for n in (8, 16)]
        split += sequential_decisions([crossed], 0.05, 16)[0]["decided"]
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)
    assert errors / reps <= bound and split / reps > 0.5, (errors / reps, split / reps)


def test_pool_builds_keeps_one_build_per_seed_by_hand():
    """Seed 0: X holds a and b, Y holds a → X counted, Y's a/s0 set aside; seed 1: b on X, a on Y (one variant each)
    → the main build (Y: 4 (variant, seed) keys against 3); seed 2: only Y. A RUNNING run stays, with no build."""
    runs = _frame([("a", 0, 5, X), ("b", 0, 6, X), ("a", 0, 1, Y), ("b", 1, 3, X), ("a", 1, 2, Y), ("a", 2, 4, Y),
                   ("b", 2, 9, Y)])
    runs = pd.concat([runs.assign(status="FINISHED"), _frame([("b", 2, 10, X)]).assign(status="RUNNING")],
                     ignore_index=True)
    kept, aside, every = pool_builds(runs)
    assert len(every) == 7 and set(every["build"]) == {"gold=x1; human_rm=x2", "gold=y1; human_rm=y2"}
    bx, by = "gold=x1; human_rm=x2", "gold=y1; human_rm=y2"
    got = sorted(zip(kept["variant"], kept["seed"], kept["build"]))
    assert got == [("a", 0, bx), ("a", 1, by), ("a", 2, by), ("b", 0, bx), ("b", 2, ""), ("b", 2, by)]
    assert aside == [{"build": bx, "runs": 1, "keys": ["b/s1"]}, {"build": by, "runs": 1, "keys": ["a/s0"]}]
    from harness.experiments.builds import counted_builds, draw_labels, short_build

    done = kept[kept["status"] == "FINISHED"]
    assert counted_builds(done) == {bx: {"runs": 2, "seeds": [0]}, by: {"runs": 3, "seeds": [1, 2]}}
    assert short_build("gold=" + "a" * 64 + "; human_rm=" + "b" * 64) == "gold=aaaaaaaa; human_rm=bbbbbbbb"
    assert short_build("") == "one build"
    assert draw_labels(["0", "1", None], ["x", "x", "y"]) == ["0@x", "1@x", None]
    assert pool_builds(runs[runs["variant"] == "zzz"].assign(status=[]))[1] == []


def test_cochran_q_by_hand_and_against_its_formula():
    """Effects 0 and 2 with SEs 1 and 1: pooled 1, Q = 2 on 1 df, p = P(χ²₁ ≥ 2) = 0.15730; effects 1, 2, 4 with SEs
    1, 2, 2: weights 1, ¼, ¼, pooled (1 + ½ + 1)/1.5 = 5/3, Q = (2/3)² + ¼(1/3)² + ¼(7/3)² = 1.8333, p = e^{−Q/2} on
    2 df = 0.39985. Fewer than 2 usable strata (an SE of 0 or NaN): None."""
    import math

    from harness.analysis.verdicts import heterogeneity

    two = heterogeneity([0.0, 2.0], [1.0, 1.0])
    assert two["pooled"] == 1.0 and two["q"] == 2.0 and two["df"] == 1.0 and abs(two["p"] - 0.157299207) < 1e-8
    assert abs(two["pooled_se"] - math.sqrt(0.5)) < 1e-12 and abs(two["i2"] - 0.5) < 1e-12
    three = heterogeneity([1.0, 2.0, 4.0], [1.0, 2.0, 2.0])
    assert abs(three["pooled"] - 5 / 3) < 1e-12 and abs(three["q"] - 11 / 6) < 1e-12
    assert abs(three["p"] - math.exp(-11 / 12)) < 1e-12 and three["strata"] == 3.0
    assert heterogeneity([1.0, 2.0], [1.0, 0.0]) is None and heterogeneity([1.0, 2.0], [1.0, float("nan")]) is None


def test_the_report_pools_the_runs_of_every_build_one_build_per_seed(tmp_path):
    """kl_placement at the smoke scale: build X holds reward s0, s1 and none s0, s1; build Y (trained later on a
    machine that built the gold and the human-ratings RM with other weights) reward s0-s2 and none s2. Seeds 0 and 1
    are counted on X (both arms there), seed 2 on Y: Y's reward s0, s1 are set aside and named; the claims' per-build
    effects are in the summary."""
    from harness.infra import tracking
    from harness.experiments.spec import experiment_name, load_spec, resolve_config, run_hash
    from harness.reporting.runs import load_runs
    from harness.reporting.builds import build_effects

    spec = load_spec("kl_placement")
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = tracking.init_store()
        exp = tracking.experiment_id(c, experiment_name("kl_placement"))
        h = {(v, s): run_hash(resolve_config(spec, "smoke", v, s)) for v in ("reward", "none") for s in range(3)}
        xs = [_child(c, exp, v, s, h[(v, s)], X, gold=0.1 * s + (v == "none"))
              for v, s in [("reward", 0), ("reward", 1), ("none", 0), ("none", 1)]]
        ys = [_child(c, exp, v, s, h[(v, s)], Y, gold=9.0 + (v == "none"))
              for v, s in [("reward", 0), ("reward", 1), ("reward", 2), ("none", 2)]]
        rs = load_runs("kl_placement", scale="smoke")
    assert sorted(rs.runs["run_id"]) == sorted(xs + ys[2:])
    bx, by = "gold=x1; human_rm=x2", "gold=y1; human_rm=y2"
    assert rs.builds == {bx: {"runs": 4, "seeds": [0, 1]}, by: {"runs": 2, "seeds": [2]}}
    assert rs.other_builds == [{"build": by, "runs": 2, "keys": ["reward/s0", "reward/s1"]}]
    claim = next(cl for cl in spec.claims if {cl.a, cl.b} == {"reward", "none"} and cl.metric == "eval_final/kl")
    by_build = build_effects(rs, claim)
    sign = 1.0 if claim.a == "none" else -1.0
    x_row, y_row = by_build["builds"]
    assert x_row["build"] == "gold=x1; human_rm=x2" and (x_row["n_a"], x_row["n_b"]) == (2, 2)
    assert abs(x_row["diff"] - sign) < 1e-9 and y_row["diff"] is None and by_build["q"] is None  # Y: 1 seed per arm


def test_recorded_digests_by_hand():
    """Every digest of every stage the runs recorded, and only those: a missing tag (None) adds nothing."""
    runs = _frame([("a", 0, 5, X), ("b", 1, 6, {**Y, "digest.sft_draw0": None})])
    assert recorded_digests(runs) == {"x1", "x2", "a0", "y1", "y2", "b1"}
    assert recorded_digests(runs.iloc[:1]) == {"x1", "x2", "a0"}
    assert recorded_digests(runs.drop(columns=[c for c in runs.columns if c.startswith("tags.digest.")])) == set()


def test_counted_stages_by_hand():
    """The shared stages of the build the report counts, with their key and digest: X holds 3 (variant, seed), Y 2 →
    X's; each seed's SFT (its own key) is not shared; no runs → nothing."""
    from harness.experiments.builds import counted_stages, shared_stages

    runs = _frame([("a", 0, 5, X), ("b", 0, 6, X), ("a", 1, 7, X), ("a", 0, 1, Y), ("b", 1, 2, Y)])
    assert shared_stages(runs) == ["gold", "human_rm"]
    assert counted_stages(runs) == {"gold": ("g", "x1"), "human_rm": ("h", "x2")}
    assert counted_stages(runs.iloc[3:]) == {"gold": ("g", "y1"), "human_rm": ("h", "y2")}
    assert counted_stages(runs.iloc[:0]) == {}


def test_build_check_matches_the_runs_of_this_machine_and_stops_at_the_first_stage_that_differs():
    """The smoke kl_placement runs were trained here: every stage they share agrees (exit 0). With the runs' digest of
    the first shared stage changed, the check stops there (the next stage is not reached), names both digests, and
    the CLI exits 1."""
    import torch
    from typer.testing import CliRunner

    from ablation_fixtures import kl_placement_smoke, results_env
    from harness.reporting import runs as report_runs
    from harness.experiments.build_check import check_build
    from harness.experiments.builds import counted_stages
    from harness.cli import app
    from harness.pipeline import build_pipeline

    kl_placement_smoke()
    seen: list[str] = []

    def build(cfg, defer, check):
        def spy(label, record):
            seen.append(label)
            check(label, record)
        return build_pipeline(cfg, defer=defer, check=spy)

    with results_env():
        rs = report_runs.load_runs("kl_placement", scale="smoke", history_prefixes=())
        expected = counted_stages(rs.runs)
        assert {"sft", "human_rm", "reward_model"} <= set(expected)  # the smoke gold scorer saves no weights
        cap = torch.backends.cpu.get_cpu_capability()  # every run tagged with the kernels it ran on (one thread a worker)
        assert set(rs.runs["tags.kernels"]) == {f"{cap}, 1 thread"}
        ok = check_build("kl_placement", "smoke", build=build)
        assert ok.matches and ok.runs == len(rs.runs) > 0 and ok.expected == expected and ok.differs is None
        assert set(ok.agree) | set(ok.unbuilt) == set(expected) and ok.agree == [s for s in seen if s in expected]
        first = ok.agree[0]
        after = seen[seen.index(first) + 1]
        assert ok.text().startswith(f"kl_placement (smoke): MATCHES: {first} {expected[first][1]}")
        result = CliRunner().invoke(app, ["build-check", "kl_placement", "--scale", "smoke"])
        assert result.exit_code == 0 and "MATCHES" in result.output

        other = rs.runs.assign(**{f"tags.digest.{first}": "0" * 16})
        seen.clear()
        with mock.patch.object(report_runs, "load_runs", return_value=dataclasses.replace(rs, runs=other)):
            bad = check_build("kl_placement", "smoke", build=build)
            result = CliRunner().invoke(app, ["build-check", "kl_placement", "--scale", "smoke"])
        key, digest = expected[first]
        assert bad.differs == (first, key, digest, "0" * 16) and not bad.matches
        assert seen[-1] == first and after not in seen  # stopped there: the next stage was not reached
        assert f"DIFFERS at {first} (key {key}): this machine builds {digest}" in bad.text()
        assert f"sets aside all {len(rs.runs)} of them" in bad.text()
        assert result.exit_code == 1 and f"DIFFERS at {first}" in result.output


def test_cached_stages_reads_this_machines_digests_without_building(tmp_path):
    """The shared stages (gold, human_rm; each seed's SFT has its own key) found built under any stage directory of the
    cache, with their digest; a stage not built here, or with an unreadable record, is not known."""
    import json

    from harness.experiments.builds import cached_stages

    recorded = [{**X, "pipeline.sft": "s0", "digest.sft": "a"}, {**X, "pipeline.sft": "s1", "digest.sft": "b"}]
    assert cached_stages(recorded, tmp_path) == {}
    (tmp_path / "gold" / "g").mkdir(parents=True)
    (tmp_path / "gold" / "g" / "stage.json").write_text(json.dumps({"key": "g", "weights_sha256": "5"}))
    (tmp_path / "sft" / "s0").mkdir(parents=True)
    (tmp_path / "sft" / "s0" / "stage.json").write_text(json.dumps({"key": "s0", "weights_sha256": "a"}))
    (tmp_path / "reward_model" / "h").mkdir(parents=True)
    (tmp_path / "reward_model" / "h" / "stage.json").write_text("{not json")
    machine = cached_stages(recorded, tmp_path)
    assert machine == {"gold": ("g", "5")}
    assert not run_matches(recorded[0], machine) and run_matches({**Y, "digest.gold": "5"}, machine)
    assert cached_stages([], tmp_path) == {}


def test_the_runs_to_train_go_arm_by_arm_in_the_plans_order_set_aside_ones_in_their_place():
    """reasoning_loss_type's first stage, as a machine of another build met it: GRPO's 8 runs finished on the other
    build and set aside, CISPO and DAPO finished here, SAPO's first 4 too. The runs to train go GRPO's first (its
    place in the spec), then SAPO's last 4, then GMPO's, so that an invocation stopped midway leaves whole arms."""
    from harness.experiments.ablate import in_plan_order, load_spec, plan_runs

    tasks = plan_runs(load_spec("reasoning_loss_type", validate_configs=False), "default", list(range(8)))
    assert [t.key for t in tasks[::8]] == ["grpo/s0", "dapo/s0", "cispo/s0", "gspo/s0", "sapo/s0", "gmpo/s0"]
    by_key = {t.key: t for t in tasks}
    todo = [by_key[f"sapo/s{s}"] for s in range(4, 8)] + [by_key[f"gmpo/s{s}"] for s in range(8)]
    set_aside = [by_key[f"grpo/s{s}"] for s in (7, 6, 5, 4, 3, 2, 0, 1)]  # the order the build check names them
    order = [t.key for t in in_plan_order(tasks, todo + set_aside)]
    assert order == [f"grpo/s{s}" for s in range(8)] + [f"sapo/s{s}" for s in range(4, 8)] + [f"gmpo/s{s}" for s in range(8)]
    assert in_plan_order(tasks, todo + todo[:2]) == todo  # each once
