"""The run archive (harness/experiments/archive.py): runs written to the repository come back into a new store exactly (status,
times, tags, params, every metric point, artifacts, parent links), once, and a new machine's report and staged driver
count them as the original store's do."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from unittest import mock

import pytest

from ablation_fixtures import kl_placement_smoke, results_env
from harness.experiments import archive
from harness.experiments.plan import ARCHIVE_INDEX, restore_sources
from harness.infra import tracking
from harness.errors import HarnessError


def _store(root: Path):
    """A fresh embedded store under ``root`` (``HARNESS_RESULTS`` must point there)."""
    return tracking.init_store()


def _seed_runs(c, exp_id: str) -> dict[str, str]:
    """An invocation with a FINISHED child (params, a 3-point metric, a sample artifact), a FAILED child with its
    reason, and a RUNNING child; returns their ids by role."""
    parent = c.create_run(exp_id, start_time=1_000, tags={"kind": "parent", "scale": "smoke"}, run_name="inv")
    pid = parent.info.run_id
    c.log_text(pid, "name: x\n", "spec.yaml")
    c.set_terminated(pid, "FINISHED", end_time=9_000)
    done = c.create_run(exp_id, start_time=2_000, run_name="a-s0",
                        tags={"kind": "child", "variant": "a", "seed": "0", "mlflow.parentRunId": pid})
    rid = done.info.run_id
    c.log_param(rid, "ppo.kl_coef", "0.05")
    for step, value in enumerate([0.5, 0.25, -1.0]):
        c.log_metric(rid, "eval/gold", value, timestamp=3_000 + step, step=step * 10)
    c.log_text(rid, '{"samples": ["héllo"]}', "samples/iter_0010.json")
    c.set_terminated(rid, "FINISHED", end_time=5_000)
    bad = c.create_run(exp_id, start_time=2_500, run_name="a-s1",
                       tags={"kind": "child", "variant": "a", "seed": "1", "mlflow.parentRunId": pid})
    tracking.fail_run(c, bad.info.run_id, "diverged at iteration 3")
    live = c.create_run(exp_id, start_time=2_600, tags={"kind": "child", "variant": "a", "seed": "2"})
    return {"parent": pid, "done": rid, "bad": bad.info.run_id, "live": live.info.run_id}


def test_runs_come_back_exactly_once_with_status_times_metrics_artifacts_and_parents(tmp_path):
    reports = tmp_path / "repo_reports"
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path / "old")}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = _store(tmp_path / "old")
        exp = tracking.experiment_id(c, "ablation/x")
        ids = _seed_runs(c, exp)
        assert archive.export_runs(c, exp, "x", reports) == 3  # the RUNNING run is not archived
        assert archive.export_runs(c, exp, "x", reports) == 0  # nothing rewritten
        files = sorted(p.name for p in archive.archive_dir("x", reports).glob("*.json.gz"))
        assert files == sorted(f"{ids[k]}.json.gz" for k in ("parent", "done", "bad"))
        original = {k: archive.read_record(archive.archive_dir("x", reports) / f"{ids[k]}.json.gz")
                    for k in ("parent", "done", "bad")}
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path / "new")}):
        c = _store(tmp_path / "new")
        exp = tracking.experiment_id(c, "ablation/x")
        assert archive.restore_runs(c, exp, "x", reports) == 3
        assert archive.restore_runs(c, exp, "x", reports) == 0  # restoring twice adds nothing
        runs = {r.data.tags[archive.RESTORED_TAG]: r for r in tracking.search_all(c, [exp])}
        assert len(runs) == 3
        done, bad, parent = runs[ids["done"]], runs[ids["bad"]], runs[ids["parent"]]
        assert (done.info.status, done.info.start_time, done.info.end_time) == ("FINISHED", 2_000, 5_000)
        assert bad.info.status == "FAILED" and bad.data.tags["failure_reason"] == "diverged at iteration 3"
        assert done.data.tags["mlflow.parentRunId"] == parent.info.run_id == bad.data.tags["mlflow.parentRunId"]
        assert done.data.params == {"ppo.kl_coef": "0.05"}
        history = [(m.step, m.timestamp, m.value) for m in c.get_metric_history(done.info.run_id, "eval/gold")]
        assert sorted(history) == [(0, 3_000, 0.5), (10, 3_001, 0.25), (20, 3_002, -1.0)]
        text = Path(c.download_artifacts(done.info.run_id, "samples/iter_0010.json", str(tmp_path))).read_text()
        assert text == '{"samples": ["héllo"]}'
        # a restored run is archived under its original id: exporting the new store writes nothing new, and a
        # fresh archive of it holds the same records as the original one
        assert archive.export_runs(c, exp, "x", reports) == 0
        again = tmp_path / "again"
        assert archive.export_runs(c, exp, "x", again) == 3
        for role, record in original.items():
            assert archive.read_record(archive.archive_dir("x", again) / f"{ids[role]}.json.gz") == record


def test_a_bad_record_is_refused_with_its_path_before_anything_is_restored(tmp_path):
    folder = archive.archive_dir("x", tmp_path)
    folder.mkdir(parents=True)
    (folder / "abc.json.gz").write_bytes(gzip.compress(b'{"format": 99}'))
    (folder / "abd.json.gz").write_bytes(b"not gzip")
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path / "store")}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = _store(tmp_path / "store")
        exp = tracking.experiment_id(c, "ablation/x")
        with pytest.raises(HarnessError, match=r"abc\.json\.gz: format 99, this harness reads format 1"):
            archive.restore_runs(c, exp, "x", tmp_path)
        (folder / "abc.json.gz").unlink()
        with pytest.raises(HarnessError, match=r"abd\.json\.gz: unreadable"):
            archive.restore_runs(c, exp, "x", tmp_path)
        assert tracking.search_all(c, [exp]) == []


def test_a_new_machine_reads_the_same_runs_from_the_archive_and_trains_none_again(tmp_path):
    from harness.experiments.ablate import load_spec, plan_runs
    from harness.experiments.plan import resume_state
    from harness.config.pipeline import PipelineConfig
    from harness.reporting.runs import load_bon, load_runs
    from harness.reporting.summary import pipeline_draws

    kl_placement_smoke()
    with results_env():
        before = load_runs("kl_placement", scale="smoke")
        spec = load_spec("kl_placement")
        c = tracking.client()
        exp = c.get_experiment_by_name("ablation/kl_placement").experiment_id
        # the driver archived every run it finished, and its invocation, into the reports directory it writes
        kept = {p.name.removesuffix(".json.gz") for p in archive.archive_dir("kl_placement").glob("*.json.gz")}
        ended = {archive.archive_key(r) for r in tracking.search_all(c, [exp]) if r.info.status in archive.ENDED}
        assert set(before.runs["run_id"]) <= kept and ended <= kept
        assert archive.export_runs(c, exp, "kl_placement", tmp_path / "new" / "reports") >= len(before.runs) + 1
        # the runs' best-of-n curve is kept with them: a new machine's frontier needs it and has no pipeline
        [bon_key] = set(before.runs["tags.pipeline.bon"].dropna())
        kept_bon = archive.archive_dir("kl_placement", tmp_path / "new" / "reports") / "bon" / f"{bon_key}.json.gz"
        built = json.loads((Path(PipelineConfig().out_dir) / "bon" / bon_key / "bon.json").read_text())
        assert archive.read_record(kept_bon)["curve"] == built
        users = archive.stage_users([r.data.tags for r in tracking.search_all(c, [exp]) if r.info.status == "FINISHED"])
        digests = {str(x) for col in before.runs.columns if col.startswith("tags.digest.")
                   for x in before.runs[col].dropna()}
        assert users["bon"] == {bon_key: digests} and len(digests) >= 3  # gold, SFT, proxy at least
        assert archive.export_stage_copies("kl_placement", users, tmp_path / "new" / "reports") == 0  # kept once
        # a stage built here from other weights than the runs recorded is neither kept nor read: with no kept copy,
        # the report reads the built curve only when every weight it comes from (proxy, SFT, gold) is the runs'
        bare = tmp_path / "bare" / "reports"
        assert archive.stage_copy("kl_placement", "bon", bon_key, digests, reports=bare) == built
        [proxy_digest] = set(before.runs["tags.digest.reward_model"])
        assert archive.stage_copy("kl_placement", "bon", bon_key, digests - {proxy_digest}, reports=bare) is None
        assert archive.export_stage_copies("kl_placement", {"bon": {bon_key: digests - {proxy_digest}}}, bare) == 0
        assert not archive.archive_dir("kl_placement", bare).exists()
        # so is the proxy's stage record (its metrics), which the report's pipeline-draw table reads
        [rm_key] = set(before.runs["tags.pipeline.reward_model"].dropna())
        kept_rm = archive.archive_dir("kl_placement", tmp_path / "new" / "reports") / "proxy" / f"{rm_key}.json.gz"
        rm_metrics = json.loads((Path(PipelineConfig().out_dir) / "reward_model" / rm_key / "stage.json").read_text())["metrics"]
        assert archive.read_record(kept_rm)["metrics"]["heldout_agreement"] == rm_metrics["heldout_agreement"]
        # a kept copy wins over a stage of the same key built here: it is what the runs' own machine built (a
        # rebuild here may have other weights)
        other = tmp_path / "other" / "reports"
        archive._write(archive._kept_path("kl_placement", "bon", bon_key, other),
                       {"format": archive.FORMAT, "stage": "bon", "key": bon_key, "curve": {"n": [1]}})
        assert archive.stage_copy("kl_placement", "bon", bon_key, digests, reports=other) == {"n": [1]} != built
        bon_before = load_bon(before)
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path / "new")}):
        after = load_runs("kl_placement", scale="smoke")  # restores from <new>/reports/kl_placement/archive
        assert not (tmp_path / "new" / "results" / "pipeline" / "bon").exists()
        assert archive.stage_copy("kl_placement", "bon", bon_key, digests) == built
        assert load_bon(after) == bon_before and bon_before[0]["n"] == built["n"]
        assert archive.stage_copy("kl_placement", "bon", "0123456789ab", digests) is None  # neither built nor kept
        [draw] = pipeline_draws(after)  # the smoke scale's one draw, its proxy read from the archived copy
        # (a fixed-length proxy has no Spearman with length: every response is as long as the next)
        assert rm_metrics["spearman_vs_length"] is None
        assert draw["proxy"] == {k: rm_metrics[k] for k in ("heldout_agreement", "spearman_vs_gold")}
        cols = ["variant", "seed", "metrics.eval_final/gold", "metrics.eval_final/kl", "tags.config_hash"]
        assert after.runs[cols].reset_index(drop=True).equals(before.runs[cols].reset_index(drop=True))
        key = ["variant", "seed", "metric", "step", "value"]
        h0 = before.history[key].sort_values(key).reset_index(drop=True)
        h1 = after.history[key].sort_values(key).reset_index(drop=True)
        assert len(h1) == len(h0) > 0 and h1.equals(h0)
        # the new store gives the restored runs new ids; the reports name them by the ids they were archived under
        assert not set(after.runs["run_id"]) & set(before.runs["run_id"])
        assert list(after.runs["record_id"]) == list(before.runs["record_id"]) == list(before.runs["run_id"])
        c = tracking.client()
        exp = c.get_experiment_by_name("ablation/kl_placement").experiment_id
        tasks = plan_runs(spec, "smoke")
        assert set(resume_state(c, exp, tasks, mark_stale=False).finished) == {t.key for t in tasks}


def test_a_new_machines_dry_run_counts_the_archived_runs_as_the_run_would(tmp_path):
    """On a new machine (an empty store; the archives in its reports directory), ``harness ablate --dry-run`` restores
    what the invocation would before it counts: kl_placement's 6 smoke runs are finished, not to train; kl_estimator's
    k1 arm (kl_placement's ``reward`` config, hash for hash) is to copy in from kl_placement's archive, so only its k2
    and k3 arms are to train. Each restore is said in one line on stderr."""
    from typer.testing import CliRunner

    from harness.cli import app

    kl_placement_smoke()
    new = tmp_path / "new"
    with results_env():
        c = tracking.client()
        exp = c.get_experiment_by_name("ablation/kl_placement").experiment_id
        kept = archive.export_runs(c, exp, "kl_placement", new / "reports")  # 6 runs and each invocation of them
        assert kept >= 7
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(new)}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        own = CliRunner().invoke(app, ["ablate", "kl_placement", "--scale", "smoke", "--dry-run"])
        other = CliRunner().invoke(app, ["ablate", "kl_estimator", "--scale", "smoke", "--dry-run"])
        again = CliRunner().invoke(app, ["ablate", "kl_estimator", "--scale", "smoke", "--dry-run"])
    assert own.exit_code == 0, own.output
    assert f"restored {kept} run(s) of kl_placement from its archive" in own.output  # every record, once
    assert ("kl_placement (smoke): 6 runs planned; 6 finished here, 0 running elsewhere, 0 to copy in (same config "
            "hash), 0 to train") in own.output
    assert other.exit_code == 0, other.output
    assert ("kl_estimator (smoke): 6 runs planned; 0 finished here, 0 running elsewhere, 2 to copy in (same config "
            "hash), 4 to train\n  copy in: 2 from ablation/kl_placement\n  train: k2/s0, k2/s1, k3/s0, k3/s1") in other.output
    assert "restored" not in again.output and "2 to copy in" in again.output  # the store has them now


def test_scrub_leaves_no_machine_detail(tmp_path):
    project = Path(archive.__file__).resolve().parents[2]
    name = tracking.host()
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path / "res"), "HARNESS_CACHE": str(tmp_path / "c")}):
        text = (f"{tmp_path}/res/results/pipeline/sft/ab12 read {tmp_path}/c/imdb.tar, /tmp/other/x.log; "
                f"http://u:pw@h:5000 {project}/harness/rl/ppo.py {Path.home()}/.netrc on {name}")
        assert archive.scrub(text) == ("<results>/pipeline/sft/ab12 read <cache>/imdb.tar, <path>; http://u:***@h:5000 "
                                       f"<project>/harness/rl/ppo.py ~/.netrc on {'<host>' if len(name) >= 4 else name}")
        assert archive.scrub(archive.scrub(text)) == archive.scrub(text)


def _good_record(run_id: str = "a" * 32) -> dict:
    """A record of the archive's format that :class:`archive.RunRecord` accepts."""
    return {"format": 1, "run_id": run_id, "parent": None, "status": "FINISHED", "start_time": 1_000, "end_time": 2_000,
            "tags": {"kind": "child", "variant": "a", "seed": "0"}, "params": {"ppo.kl_coef": "0.05"},
            "metrics": {"eval/gold": [[0, 1_500, 0.25], [10, 1_600, 0.5]]},
            "artifacts": {"samples/iter_0010.json": "{}"}, "skipped_artifacts": []}


def _bad(record: dict, **changes) -> dict:
    out = json.loads(json.dumps(record))
    for key, value in changes.items():
        if value is _DROP:
            out.pop(key)
        else:
            out[key] = value
    return out


_DROP = object()


@pytest.mark.parametrize("changes, field", [
    ({"artifacts": {"../../../../../../tmp/x/PWNED_rel.txt": "x"}}, "artifacts"),
    ({"artifacts": {"/tmp/x/PWNED_abs.txt": "x"}}, "artifacts"),
    ({"artifacts": {"samples/../../up.txt": "x"}}, "artifacts"),
    ({"artifacts": {"C:\\evil.txt": "x"}}, "artifacts"),
    ({"params": _DROP}, "params"),
    ({"tags": {"seed": 0}}, "tags.seed"),
    ({"status": "RUNNING"}, "status"),
    ({"start_time": "yesterday"}, "start_time"),
    ({"metrics": {"eval/gold": [[0, 1, "high"]]}}, "metrics.eval/gold.0.2"),
    ({"metrics": {"eval/gold": [[0, 1]]}}, "metrics.eval/gold.0"),
    ({"run_id": "../../etc"}, "run_id"),
    ({"artifacts": {"big.txt": "x" * (archive.MAX_ARTIFACT_BYTES + 1)}}, "artifacts.big.txt"),
    ({"extra": 1}, "extra"),
], ids=["traversal", "absolute", "inner-dotdot", "drive", "no-params", "tag-type", "running", "time-type",
        "metric-type", "metric-arity", "bad-id", "oversized", "unknown-field"])
def test_a_crafted_record_is_refused_in_one_line_naming_file_and_field_and_nothing_is_written(changes, field, tmp_path):
    folder = archive.archive_dir("x", tmp_path / "reports")
    folder.mkdir(parents=True)
    ok = _good_record("b" * 32)
    (folder / f"{ok['run_id']}.json.gz").write_bytes(gzip.compress(json.dumps(ok).encode()))
    bad = _bad(_good_record(), **changes)
    path = folder / f"{'a' * 32}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(bad).encode()))
    outside = tmp_path / "x"
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path / "store")}), \
            mock.patch("tempfile.tempdir", str(tmp_path / "tmp")):
        (tmp_path / "tmp").mkdir()
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = _store(tmp_path / "store")
        exp = tracking.experiment_id(c, "ablation/x")
        with pytest.raises(HarnessError) as e:
            archive.restore_runs(c, exp, "x", tmp_path / "reports")
        assert str(e.value).startswith(f"archive record {path}: field {field}") and "\n" not in str(e.value), str(e.value)
        assert tracking.search_all(c, [exp]) == []  # the good record was not restored either
        with pytest.raises(HarnessError, match=f"field {field}"):
            archive.validate_archive("x", tmp_path / "reports")  # what the dry run calls
    assert not outside.exists() and not Path("/tmp/x/PWNED_abs.txt").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_records_that_are_oversized_misnamed_or_links_are_refused_and_names_inside_the_run_folder_pass(tmp_path):
    folder = archive.archive_dir("x", tmp_path)
    folder.mkdir(parents=True)
    good = folder / f"{'a' * 32}.json.gz"
    good.write_bytes(gzip.compress(json.dumps(_good_record()).encode()))
    assert archive.validate_archive("x", tmp_path) == 1
    misnamed = folder / f"{'c' * 32}.json.gz"
    misnamed.write_bytes(good.read_bytes())
    with pytest.raises(HarnessError, match=r"c{32}\.json\.gz: field run_id: 'a{32}' is not the file's name"):
        archive.validate_archive("x", tmp_path)
    misnamed.unlink()
    link = folder / f"{'d' * 32}.json.gz"
    link.symlink_to(good)
    with pytest.raises(HarnessError, match=r"d{32}\.json\.gz: a symbolic link"):
        archive.validate_archive("x", tmp_path)
    link.unlink()
    with mock.patch.object(archive, "MAX_RECORD_BYTES", 100):
        with pytest.raises(HarnessError, match=r"a{32}\.json\.gz: over 100 bytes once decompressed"):
            archive.validate_archive("x", tmp_path)
    for name in ("samples/iter_0010.json", "summary.json", "heldout/iter_0050.json.gz.b64"):
        assert archive.artifact_name(name) == name
    for name in ("", "/x", "a/../b", "./a", "a//b", "a/", "a\\b", "a\x00b", "c:x"):
        with pytest.raises(ValueError):
            archive.artifact_name(name)


@pytest.mark.slow
def test_rescore_with_the_runs_own_gold_reproduces_their_gold_and_a_new_machine_reads_it_back(tmp_path, monkeypatch):
    """The kl_placement smoke runs kept their held-out responses; rescoring them with the gold their spec names (the
    same gold they were evaluated by) gives back each evaluation's ``eval/gold`` (an independent path: the texts
    kept, scored again) and ``eval_final/collapsed``; the metrics are kept in the archive, and a new store that
    restores the archive gets them again."""
    from harness.experiments.rescore import FOLDER, heldout, rescore

    kl_placement_smoke()
    reports = tmp_path / "reports"
    with results_env():
        c = tracking.client()
        exp = c.get_experiment_by_name("ablation/kl_placement").experiment_id
        archive.export_runs(c, exp, "kl_placement", reports)
        smoke = [r for r in tracking.search_all(c, [exp]) if r.data.tags.get("kind") == "child"
                 and r.data.tags.get("scale") == "smoke" and r.info.status == "FINISHED"]
        own = {archive.archive_key(r): {m.step: m.value for m in c.get_metric_history(r.info.run_id, "eval/gold")}
               for r in smoke}
        collapsed = {archive.archive_key(r): r.data.metrics["eval_final/collapsed"] for r in smoke}
        records = {p.name.removesuffix(".json.gz"): archive.read_run_record(p)
                   for p in archive.archive_dir("kl_placement", reports).glob("*.json.gz")}
        assert all(heldout(records[k]) and set(heldout(records[k])) == set(own[k]) for k in own)  # every evaluation kept
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'fresh.db'}")
        report = rescore("kl_placement", scale="smoke", echo=lambda _: None, reports=reports)
        assert report.is_file()
        [kept] = list((archive.archive_dir("kl_placement", reports) / FOLDER).glob("*.json.gz"))
        data = archive.read_record(kept)["runs"]
        assert set(own) <= set(data)
        for key, curve in own.items():
            rescored = dict((int(s), v) for s, v in data[key]["rescored/gold"])
            assert rescored.keys() == curve.keys()
            assert all(abs(rescored[s] - curve[s]) < 1e-4 for s in curve), (rescored, curve)
            assert data[key]["rescored_final/collapsed"] == [[0, collapsed[key]]]
        # a new store: restoring the archive brings the rescored metrics back with the runs
        from harness.experiments.archive import apply_rescored

        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'newer.db'}")
        c2 = tracking.init_store()
        exp2 = tracking.experiment_id(c2, "ablation/kl_placement")
        archive.restore_runs(c2, exp2, "kl_placement", reports)
        assert apply_rescored(c2, exp2, "kl_placement", reports) >= len(own)
        assert apply_rescored(c2, exp2, "kl_placement", reports) == 0  # once
        back = {archive.archive_key(r): r.data.metrics.get("rescored_final/gold") for r in tracking.search_all(c2, [exp2])}
        assert all(back[k] == pytest.approx(dict(data[k]["rescored_final/gold"])[0]) for k in own)
        assert "`rescored_final/*`: the same held-out responses scored again" in report.read_text()
        # another judge for the same runs (--set): the spec untouched, its file replaces the first, the report names it
        from harness.experiments.rescore import judge
        from harness.reporting.ablation import rescored_judges

        soup = ["pipeline.gold.naturalness_negatives=loops_and_soup"]
        report = rescore("kl_placement", scale="smoke", echo=lambda _: None, reports=reports, overrides=soup)
        [kept2] = list((archive.archive_dir("kl_placement", reports) / FOLDER).glob("*.json.gz"))
        gold2, key2 = judge("kl_placement", "smoke", soup)
        assert kept2 != kept and rescored_judges("kl_placement", reports) == [{"gold_key": key2, "overrides": soup}]
        key = next(iter(own))
        texts = heldout(records[key])[max(own[key])]["texts"]
        data2 = archive.read_record(kept2)["runs"][key]
        assert dict(data2["rescored_final/gold"])[0] == pytest.approx(float(gold2.parts(texts)["gold"].mean()), abs=1e-5)
        assert gold2.naturalness["features"] == "repetition+long_words"
        assert (f"by the gold `{key2}`, the spec's baseline gold with `pipeline.gold.naturalness_negatives="
                "loops_and_soup`.") in report.read_text()


def test_archives_of_other_ablations_holding_a_planned_config_are_restored_whole(tmp_path):
    """A new machine restores, besides the ablation's own archive, every other ablation's archive that holds an
    original FINISHED run of a config hash it plans (so that run is copied in, not trained again): ``src`` holds one
    (hash h1), ``copies`` holds h1 only as a copy and ``other`` holds h2 only, so only ``src`` comes back (its three
    runs, parent links included), once; a corrupt archive is skipped with one line naming it. What it read of each
    record is cached under the results root and read again only from a file that changed."""
    reports = tmp_path / "repo_reports"
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path / "old")}):
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        c = _store(tmp_path / "old")
        for name, tags in (("src", {"config_hash": "h1"}), ("copies", {"config_hash": "h1", "copied_from": "src/x"}),
                           ("other", {"config_hash": "h2"})):
            exp = tracking.experiment_id(c, f"ablation/{name}")
            ids = _seed_runs(c, exp)
            for k, v in tags.items():
                c.set_tag(ids["done"], k, v)
            assert archive.export_runs(c, exp, name, reports) == 3
    (reports / "broken" / "archive").mkdir(parents=True)
    (reports / "broken" / "archive" / "abc.json.gz").write_bytes(gzip.compress(b"not json"))
    with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path / "new")}):
        c = _store(tmp_path / "new")
        lines: list[str] = []
        assert restore_sources(c, "dst", {"h1"}, reports, warn=lines.append) == {"src": 3}
        assert len(lines) == 1 and lines[0].startswith("archive of broken skipped") and "abc.json.gz" in lines[0]
        assert restore_sources(c, "dst", {"h1"}, reports) == {"src": 0}  # already in the store
        assert restore_sources(c, "src", {"h1"}, reports) == {}  # its own archive is restore_runs' business
        assert restore_sources(c, "dst", set(), reports) == {}
        names = {e.name for e in c.search_experiments()}
        assert "ablation/src" in names and not {"ablation/copies", "ablation/other"} & names
        runs = tracking.search_all(c, [tracking.experiment_id(c, "ablation/src")])
        done = [r for r in runs if r.data.tags.get("config_hash") == "h1"]
        assert len(runs) == 3 and len(done) == 1 and done[0].info.status == "FINISHED"
        parent = [r for r in runs if r.data.tags.get("kind") == "parent"][0]
        assert done[0].data.tags["mlflow.parentRunId"] == parent.info.run_id
        # what was read is cached under the results root, by file: looking again reads no record it knows (an
        # archive that matches is still read whole, to be validated and restored) ...
        index = json.loads((tracking.results_root() / ARCHIVE_INDEX).read_text())
        copies = sorted(str(p.resolve()) for p in (reports / "copies" / "archive").glob("*.json.gz"))
        assert len(copies) == 3 and [index[k][2] for k in copies if index[k][2][1]] == [["FINISHED", "h1", True]]
        (reports / "broken" / "archive" / "abc.json.gz").unlink()  # unreadable, so never cached: read every time
        with mock.patch.object(archive, "read_record", side_effect=AssertionError("read again")):
            assert restore_sources(c, "dst", {"h3"}, reports) == {}
        # ... and reads again a record rewritten since (its size or mtime changed): h3 is now in `other`'s
        changed = next(p for p in (reports / "other" / "archive").glob("*.json.gz")
                       if archive.read_record(p)["tags"].get("config_hash") == "h2")
        record = archive.read_record(changed)
        record["tags"]["config_hash"] = "h3"
        archive.write_record(changed, record)
        assert restore_sources(c, "dst", {"h3"}, reports) == {"other": 3}
