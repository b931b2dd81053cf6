"""The fault kit, run for real: the driver interrupted (SIGINT, as Ctrl-C sends it to the terminal's
foreground process group) and then killed (SIGKILL) mid-ablation, each time re-run, until every
(variant, seed) is FINISHED exactly once and no finished run is trained again; an empty or a corrupt
``mlflow.db`` (one line, the file untouched); a read-only results directory (one line, before any
compute). A SIGKILLed Ray worker is ``test_ablate.py::test_dead_worker_fails_only_its_own_run_and_ray_retries_it``;
two ablations at once on a fresh store is ``test_safety.py::test_two_ablations_at_once_on_a_fresh_store_never_crash``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
from ablation_fixtures import results_env, write_spec
from typer.testing import CliRunner

from harness.experiments import archive
from harness.cli import app

FAULT = """\
question: Does an interrupted or killed driver lose or duplicate a run?
baseline: a
variants:
  a: {}
  b: {ppo: {kl_coef: 0.1}}
claims:
  - {claim: none, kind: finding, source: test, section: none, setting_note: a test,
     metric: eval_final/gold, a: a, expect: greater, b: b, margin: 0.1}
scales:
  smoke: {seeds: 4, overrides: {ppo: {total_iterations: 4}, eval: {every: 2}}}
"""


def _children(name: str) -> list:
    from ablation_fixtures import child_runs

    return child_runs(f"ablation/{name}")


def _start(env: dict, log: Path) -> subprocess.Popen:
    """A driver with one Ray worker: its runs go one after another, so one has finished while the next runs and
    others wait (what the faults need), and the driver starts one worker process instead of two (~8 CPU-s each)."""
    with open(log, "w") as fh:
        # SIGINT at its default in the driver: a library earlier in the suite may leave this process ignoring it, and
        # an ignored signal is inherited (Python then installs no KeyboardInterrupt handler)
        return subprocess.Popen([sys.executable, "-m", "harness.cli", "ablate", "faults", "--scale", "smoke", "--workers", "1"],
                                env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


TOTAL = 8  # runs of the FAULT spec at the smoke scale: 2 variants × 4 seeds


def _wait_for_running_and_finished(proc: subprocess.Popen, already: set[str], timeout: float = 300) -> tuple[set, dict]:
    """Poll the store until at least one run beyond ``already`` has FINISHED, another is RUNNING and one is still
    queued (so the driver is mid-ablation when the fault comes, even if polling a loaded store lags);
    returns (FINISHED run ids, {RUNNING run id: worker pid})."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        with contextlib.suppress(Exception):
            runs = _children("faults")
            done = {r.info.run_id for r in runs if r.info.status == "FINISHED"}
            running = {r.info.run_id: int(r.data.tags["pid"]) for r in runs if r.info.status == "RUNNING" and "pid" in r.data.tags}
            if done - already and running and len(done) + len(running) < TOTAL:
                return done, running
        time.sleep(0.3)
    raise AssertionError(f"no run finished while another ran (driver exit {proc.poll()})")


def _wait_dead(pids, timeout: float = 60) -> None:
    import psutil

    deadline = time.time() + timeout
    while time.time() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                         for p in pids):
        time.sleep(0.3)


@pytest.mark.slow
def test_interrupted_then_killed_driver_loses_and_duplicates_nothing(smoke_pipeline, tmp_path):
    write_spec(tmp_path, "faults", FAULT)
    with results_env(tmp_path):
        env = {**os.environ, "HARNESS_CONNECT_TIMEOUT": "10", "HARNESS_RAY_RECORDS": str(tmp_path / "ray-records")}
        # 1) Ctrl-C: SIGINT to the driver's process group while a run is in flight
        proc = _start(env, tmp_path / "1.log")
        done1, running1 = _wait_for_running_and_finished(proc, set())
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(120) == 130
        log1 = (tmp_path / "1.log").read_text()
        assert log1.strip().splitlines()[-1] == "error: interrupted", log1[-1000:]
        _wait_dead(running1.values())
        # 2) re-run, then SIGKILL the driver alone while a run is in flight (its Ray processes die with it)
        proc = _start(env, tmp_path / "2.log")
        done2, running2 = _wait_for_running_and_finished(proc, done1)
        killed_record = json.loads((tmp_path / "ray-records" / f"driver-{proc.pid}.json").read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        _wait_dead(running2.values())
        finished_before_3 = {r.info.run_id for r in _children("faults") if r.info.status == "FINISHED"}
        # 3) re-run to the end (one Ray worker, as the others: what is tested is the store, not parallel runs)
        r = subprocess.run([sys.executable, "-m", "harness.cli", "ablate", "faults", "--scale", "smoke", "--workers", "1"],
                           env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        runs = _children("faults")
    # the killed driver's Ray processes (its agents outlive it by minutes on their own) were reaped by the rerun, by
    # recorded pid and create time; the rerun's own instance ended with it, and both records are gone
    from harness.experiments import engine

    with mock.patch.dict(os.environ, {"HARNESS_RAY_RECORDS": str(tmp_path / "ray-records")}):
        left = [i for i in killed_record["procs"] if engine._alive(i) is not None]
        assert len(killed_record["procs"]) >= 3 and not left, (killed_record, left)
        assert not list((tmp_path / "ray-records").glob("driver-*.json"))
    finished = [r for r in runs if r.info.status == "FINISHED"]
    keys = sorted((r.data.tags["variant"], r.data.tags["seed"]) for r in finished)
    assert keys == sorted({(v, str(s)) for v in "ab" for s in range(4)}), keys  # every pair FINISHED exactly once
    assert finished_before_3 <= {r.info.run_id for r in finished}  # nothing that had finished was trained again
    # and every run that ended, killed ones with their reasons, is in the repository's archive for a new machine
    with results_env(tmp_path):
        kept = {p.name.removesuffix(".json.gz") for p in archive.archive_dir("faults").glob("*.json.gz")}
    assert {r.info.run_id for r in runs if r.info.status in archive.ENDED} <= kept
    by_id = {r.info.run_id: r for r in runs}
    # the runs in flight at each fault: ended with a reason, unless one finished between the poll and the signal
    in_flight = [by_id[rid] for rid in set(running1) | set(running2)]
    interrupted = [r for r in in_flight if r.info.status != "FINISHED"]
    assert interrupted and all(r.info.status in ("FAILED", "KILLED") and r.data.tags.get("failure_reason") for r in interrupted)
    # the last invocation's log, as a file shows it: no carriage returns, Ray banner or numpy warning;
    # one line per finished run
    out = r.stdout + r.stderr
    assert "\r" not in out and "Token authentication" not in out and "RuntimeWarning" not in out, out[-2000:]
    trained = TOTAL - len(finished_before_3)
    assert sum(ln.startswith("finished ") for ln in out.splitlines()) == trained, out[-2000:]


@pytest.mark.parametrize("content, needle", [(b"", "is empty (0 bytes), not a tracking store"),
                                             (b"this is not a database" * 100, "is not a usable SQLite database (file is not a database)")],
                         ids=["empty", "corrupt"])
def test_an_empty_or_corrupt_store_is_one_line_and_left_untouched(content, needle, tmp_path):
    from harness.infra import services

    db = tmp_path / "results" / "mlflow.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(content)
    before = db.stat().st_mtime_ns
    for args in (["report", "kl_placement"], ["ablate", "kl_placement", "--scale", "smoke"], ["ui"]):
        services._REACHED.clear()
        with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(tmp_path)}), mock.patch.dict(os.environ), \
                mock.patch("harness.experiments.ablate._build_pipelines", side_effect=AssertionError("must not build")), \
                mock.patch("harness.infra.services.serve_redacted", side_effect=AssertionError("must not start a server")):
            os.environ.pop("MLFLOW_TRACKING_URI", None)
            r = CliRunner().invoke(app, args)
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith(f"error: the MLflow store {db}")
        assert needle in lines[0] and "it was left as it is" in lines[0], lines
    assert db.read_bytes() == content and db.stat().st_mtime_ns == before
    # nothing written beside it but the (empty) lock that serialises a store's first opening: no journal, no artifacts
    assert {p.name for p in db.parent.iterdir()} <= {"mlflow.db", ".mlflow.db.lock"}


@contextlib.contextmanager
def _read_only_dir(path: Path):
    """``path`` as a directory this process cannot write: mode 0555, or (as root, whom modes do not stop)
    a read-only tmpfs mounted there. Skips when neither can be had."""
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot make a read-only directory as root here: {r.stderr.strip()[:200]}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_a_read_only_results_directory_is_one_line_before_any_compute(tmp_path):
    with _read_only_dir(tmp_path / "ro") as ro:
        for args in (["ablate", "kl_placement", "--scale", "smoke"], ["train", "--scale", "smoke"], ["pipeline"],
                     ["report", "kl_placement"]):
            with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(ro)}), mock.patch.dict(os.environ), \
                    mock.patch("harness.experiments.ablate._build_pipelines", side_effect=AssertionError("must not build")), \
                    mock.patch("harness.pipeline.build_pipeline", side_effect=AssertionError("must not build")), \
                    mock.patch("harness.rl.runner.run", side_effect=AssertionError("must not train")):
                os.environ.pop("MLFLOW_TRACKING_URI", None)
                r = CliRunner().invoke(app, args)
            lines = [ln for ln in r.output.splitlines() if ln.strip()]
            assert r.exit_code == 2 and len(lines) == 1, (args, r.output)
            assert "is not writable (Read-only file system" in lines[0] or "is not writable (Permission denied" in lines[0], lines
            assert "set HARNESS_RESULTS to a writable directory" in lines[0]
