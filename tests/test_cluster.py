"""Several machines' set-up, for real on this one: a PostgreSQL server behind an ``mlflow server`` and
the Optuna study (the stores many writers share), and a two-node Ray cluster that loses a node while
its runs are in flight.

PostgreSQL comes from the ``pgserver`` wheel (its binaries inside; installed by ``make setup``), the
MLflow server is ``python -m mlflow server`` on 127.0.0.1, the Ray nodes are started with Ray's own
multi-node test utility (``ray.cluster_utils.Cluster``). Nothing here is skipped when missing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from unittest import mock

import pytest

from harness.experiments import engine

from ablation_fixtures import child_runs, results_env, write_spec as _write

pytestmark = pytest.mark.slow

TWO_ARMS = """\
question: Does a run survive its node?
baseline: a
variants:
  a: {ppo: {total_iterations: %d}, eval: {every: %d}}
  b: {ppo: {kl_coef: 0.0625, total_iterations: %d}, eval: {every: %d}}
claims:
  - {claim: none, kind: finding, source: test, section: none, setting_note: a test,
     metric: final/score, a: a, expect: greater, b: b, margin: 0.1}
scales:
  smoke: {seeds: %d}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _postgres_and_mlflow_server(tmp: Path):
    """A PostgreSQL server (databases ``mlflow`` and ``optuna``) and an ``mlflow server`` on it at
    127.0.0.1; yields ``(tracking URI, Optuna storage URL)``; both stopped afterwards."""
    import pgserver

    pg = pgserver.get_server(str(tmp / "pg"), cleanup_mode="stop")
    proc = None
    try:
        for db in ("mlflow", "optuna"):
            pg.psql(f"CREATE DATABASE {db};")
        url = {db: pg.get_uri(db).replace("postgresql://", "postgresql+psycopg://") for db in ("mlflow", "optuna")}
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", url["mlflow"],
                                 "--artifacts-destination", str(tmp / "artifacts"), "--host", "127.0.0.1",
                                 "--port", str(port), "--workers", "1"],
                                stdout=open(tmp / "mlflow-server.log", "w"), stderr=subprocess.STDOUT,
                                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # as docs/cluster.md
        deadline = time.time() + 180
        while True:
            with contextlib.suppress(Exception):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            assert proc.poll() is None and time.time() < deadline, (tmp / "mlflow-server.log").read_text()[-2000:]
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", url["optuna"]
    finally:
        if proc is not None:
            proc.terminate()
            with contextlib.suppress(Exception):
                proc.wait(30)
        pg.cleanup()


@pytest.mark.slow
def test_ablation_and_sweep_through_postgresql_and_an_mlflow_server(tmp_path, smoke_pipeline):
    """A smoke ablation (2 variants × 2 seeds) and a 4-trial sweep record into an ``mlflow server``
    backed by PostgreSQL, the sweep's study lives in PostgreSQL too; the runs and trials are all there."""
    import optuna
    from optuna.trial import TrialState

    from harness.experiments import study_spec

    from harness.experiments import sweep

    from harness.infra import tracking
    from harness.experiments.ablate import experiment_name, run_ablation

    _write(tmp_path, "two_arms", TWO_ARMS % (2, 2, 2, 2, 2))
    with _postgres_and_mlflow_server(tmp_path) as (mlflow_uri, optuna_url), results_env(tmp_path):
        with mock.patch.dict(os.environ, {"MLFLOW_TRACKING_URI": mlflow_uri, sweep.STORAGE_ENV: optuna_url}):
            run_ablation("two_arms", scale="smoke", workers=2, progress=False, raise_on_failure=True)
            spec = study_spec.parse_study_spec({
                "search_space": {"cliprange": {"low": 0.05, "high": 0.4}, "kl_coef": {"low": 0.001, "high": 0.5, "log": True}},
                "sampler": {"type": "random", "seed": 0}, "pruner": {"type": "none"},
                "scales": {"smoke": {"overrides": {"ppo": {"total_iterations": 2}}}}}, "pg_study")
            sweep.run_sweep("pg_study", trials=4, scale="smoke", workers=2, progress=False, report=False, spec=spec)
            c = tracking.client()
            exp = c.get_experiment_by_name(experiment_name("two_arms"))
            runs = [r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("kind") == "child"]
            trial_runs = c.search_runs([c.get_experiment_by_name(study_spec.experiment_name("pg_study")).experiment_id],
                                       "tags.role = 'trial'")
            study = optuna.load_study(study_name=study_spec.study_name("pg_study", "smoke"),
                                      storage=optuna.storages.RDBStorage(optuna_url))
            trials = study.get_trials()
    assert sorted((r.data.tags["variant"], r.data.tags["seed"], r.info.status) for r in runs) == [
        ("a", "0", "FINISHED"), ("a", "1", "FINISHED"), ("b", "0", "FINISHED"), ("b", "1", "FINISHED")]
    assert all("eval_final/gold" in r.data.metrics for r in runs)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert sorted(int(r.data.tags["trial_number"]) for r in trial_runs) == [0, 1, 2, 3]
    assert {r.info.run_id for r in trial_runs} == {t.user_attrs["mlflow_run_id"] for t in trials}
    assert all(r.info.status == "FINISHED" and r.data.metrics["value"] == pytest.approx(t.value)
               for t in trials for r in trial_runs if r.info.run_id == t.user_attrs["mlflow_run_id"])


@pytest.mark.slow
def test_two_node_cluster_loses_a_node_and_every_run_finishes_exactly_once(tmp_path, smoke_pipeline):
    """Two Ray nodes of one CPU each share a smoke ablation (2 variants × 2 seeds); the second node is
    removed while a run is in flight on it. Ray re-runs that task on the head node, the new attempt marks
    the lost run FAILED, and every (variant, seed) ends FINISHED exactly once."""
    from ray.cluster_utils import Cluster

    from harness.infra import tracking
    from harness.experiments.ablate import experiment_name, run_ablation

    engine.shutdown()  # this test process joins the test cluster, not a local instance of an earlier test
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    _write(tmp_path, "two_nodes", TWO_ARMS % (12, 6, 12, 6, 2))
    out: dict = {}
    try:
        with results_env(tmp_path):
            th = threading.Thread(target=lambda: out.setdefault("report", run_ablation(
                "two_nodes", scale="smoke", workers=2, progress=False, address=cluster.address)))
            th.start()
            removed, deadline = None, time.time() + 300
            while removed is None and time.time() < deadline and th.is_alive():
                time.sleep(0.3)
                with contextlib.suppress(Exception):
                    c = tracking.client()
                    exp = c.get_experiment_by_name(experiment_name("two_nodes"))
                    running = [r for r in c.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'")
                               if r.data.tags.get("kind") == "child" and r.data.tags.get("ray_node") == worker.node_id]
                    if running:
                        removed = running[0].data.tags["variant"], running[0].data.tags["seed"]
                        cluster.remove_node(worker)
            th.join(900)
        assert removed is not None and "report" in out
        runs = child_runs(experiment_name("two_nodes"))
    finally:
        engine.shutdown()
        cluster.shutdown()
    finished = sorted((r.data.tags["variant"], r.data.tags["seed"]) for r in runs if r.info.status == "FINISHED")
    assert finished == [("a", "0"), ("a", "1"), ("b", "0"), ("b", "1")]  # each exactly once
    lost = [r for r in runs if r.info.status == "FAILED"]
    assert [(r.data.tags["variant"], r.data.tags["seed"]) for r in lost] == [removed]
    assert "its worker process died" in lost[0].data.tags["failure_reason"]
    again = [r for r in runs if (r.data.tags["variant"], r.data.tags["seed"]) == removed and r.info.status == "FINISHED"]
    assert again[0].data.tags["attempt"] == "2" and again[0].data.tags["ray_node"] != worker.node_id
