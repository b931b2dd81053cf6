"""Runs of two builds of the pipeline (the same stage keys, other weights) are never counted or trained side by side
(harness.builds): hand examples of the helpers, the report's choice of one build, and the driver's refusal of
finished and reusable runs of another build."""

from __future__ import annotations

import dataclasses
import os
from unittest import mock

import pandas as pd

from harness.builds import build_ids, choose_build, machine_stages, recorded_digests, run_matches

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
    c.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def test_the_report_counts_the_runs_of_one_build_and_names_the_others(tmp_path):
    """kl_placement at the smoke scale: build X holds reward s0, s1 and none s0, s1; build Y (trained later on a
    machine that built the gold and the human-ratings RM with other weights) reward s0-s2. The report's runs are
    X's four, none of Y's, and Y is named with its three runs."""
    from harness import tracking
    from harness.ablation_spec import experiment_name, load_spec, resolve_config, run_hash
    from harness.report_runs import load_runs

    spec = load_spec("kl_placement")
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = tracking.init_store()
        exp = tracking.experiment_id(c, experiment_name("kl_placement"))
        h = {(v, s): run_hash(resolve_config(spec, "smoke", v, s)) for v in ("reward", "none") for s in range(3)}
        xs = [_child(c, exp, v, s, h[(v, s)], X) for v, s in [("reward", 0), ("reward", 1), ("none", 0), ("none", 1)]]
        ys = [_child(c, exp, "reward", s, h[("reward", s)], Y, gold=9.0) for s in range(3)]
        rs = load_runs("kl_placement", scale="smoke")
    assert sorted(rs.runs["run_id"]) == sorted(xs) and not set(ys) & set(rs.runs["run_id"])
    assert rs.build == "gold=x1; human_rm=x2"
    assert rs.other_builds == [{"build": "gold=y1; human_rm=y2", "runs": 3,
                                "keys": ["reward/s0", "reward/s1", "reward/s2"]}]


def test_the_driver_trains_again_the_finished_runs_of_another_build_and_copies_in_only_its_own(tmp_path):
    """Plan v/s0-v/s3. v/s0 FINISHED here on build Y (this machine's), v/s1 FINISHED here on build X; v/s2
    has a newer run of X and an older one of Y in another ablation; v/s3 FINISHED here twice, on Y and later on X.
    Nothing needs training (v/s2 could be copied), but the recorded runs span two builds, so the pipeline is built
    (once) and only Y is accepted: v/s1 is set aside to train again, v/s2's copy is the older Y run, and v/s3's older
    Y run stands in for its newest (not set aside). With everything finished on one build, nothing is built."""
    from harness import tracking
    from harness.ablate import RunTask, find_reusable, resume_state, reusable_candidates
    from harness.ablation_plan import accept_for_training

    def task(seed):
        return RunTask(ablation="bld", scale="smoke", variant="v", seed=seed, config={}, config_hash=f"h{seed}",
                       total_iterations=1)

    built = []

    def build_pipelines(tasks):
        built.append([t.key for t in tasks])
        return [{"stages": {"gold": {"key": "g", "weights_sha256": "y1"}, "human_rm": {"key": "h", "weights_sha256": "y2"}}}]

    console = mock.Mock()
    tasks = [task(0), task(1), task(2), task(3)]
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = tracking.init_store()
        exp, other = tracking.experiment_id(c, "ablation/bld"), tracking.experiment_id(c, "ablation/src")
        _child(c, exp, "v", 0, "h0", Y)
        _child(c, exp, "v", 1, "h1", X)
        old_y = _child(c, other, "v", 2, "h2", Y)
        new_x = _child(c, other, "v", 2, "h2", X)
        mine_y = _child(c, exp, "v", 3, "h3", Y)
        theirs_x = _child(c, exp, "v", 3, "h3", X)
        state = resume_state(c, exp, tasks)
        assert state.finished["v/s3"] == theirs_x and state.older == {"v/s3": [(mine_y, state.older["v/s3"][0][1])]}
        todo = [t for t in tasks if t.key not in state.finished]
        cands = reusable_candidates(c, exp, tasks)  # this ablation's own runs at this scale are never candidates
        assert {k: [run.info.run_id for _, run in v] for k, v in cands.items()} == {"v/s2": [new_x, old_y]}
        with mock.patch("harness.tracking.search_all", side_effect=AssertionError("searched the store again")):
            accept = accept_for_training(c, exp, tasks, todo, state, True, console, build_pipelines, cands)
            assert find_reusable(c, exp, todo, accept, cands)["v/s2"][1].info.run_id == old_y
        assert built == [["v/s0", "v/s1", "v/s2", "v/s3"]]  # all reusable, but the recorded runs span two builds
        assert [accept(state.finished_tags[k]) for k in ("v/s0", "v/s1", "v/s3")] == [True, False, True]
        assert state.finished["v/s3"] == mine_y and state.finished_tags["v/s3"]["digest.gold"] == "y1"
        assert find_reusable(c, exp, todo, accept)["v/s2"][1].info.run_id == old_y
        assert find_reusable(c, exp, todo)["v/s2"][1].info.run_id == new_x  # without a predicate: the newest
        said = " ".join(str(call.args[0]) for call in console.print.call_args_list)
        assert "set aside[/] v/s1" in said and "v/s0" not in said and "not copied[/] v/s2" in said
        assert "v/s3" not in said

        built.clear()
        done = [task(0)]
        state = resume_state(c, exp, done)
        assert accept_for_training(c, exp, done, [], state, True, console, build_pipelines)(X) is True
        assert built == []


def test_recorded_digests_by_hand():
    """Every digest of every stage the runs recorded, and only those: a missing tag (None) adds nothing."""
    runs = _frame([("a", 0, 5, X), ("b", 1, 6, {**Y, "digest.sft_draw0": None})])
    assert recorded_digests(runs) == {"x1", "x2", "a0", "y1", "y2", "b1"}
    assert recorded_digests(runs.iloc[:1]) == {"x1", "x2", "a0"}
    assert recorded_digests(runs.drop(columns=[c for c in runs.columns if c.startswith("tags.digest.")])) == set()


def test_counted_stages_by_hand():
    """The shared stages of the build the report counts, with their key and digest: X holds 3 (variant, seed), Y 2 →
    X's; each seed's SFT (its own key) is not shared; no runs → nothing."""
    from harness.builds import counted_stages, shared_stages

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
    from harness import report_runs
    from harness.build_check import check_build
    from harness.builds import counted_stages
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

    from harness.builds import cached_stages

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
