"""Shared fixtures: an isolated results directory per test session and a smoke-scale pipeline.

The data cache (``$HARNESS_CACHE`` or ``~/.cache/ppo-harness``, filled by ``make setup``) is shared,
so the tests never download anything. Everything the tests write goes to a temporary
``HARNESS_RESULTS``; the smoke pipeline is built once per session there.

``make test`` runs the suite on pytest-xdist workers: each worker is a session of its own (its own results
directory and store). The smoke pipelines' stages (:func:`_shared_smoke_configs`) are built once per pytest run: the
first worker to start builds them in a directory the workers share (the others wait on its file lock) and every worker
copies the finished stage directories into its own results directory, where the pipelines find them cached. That
directory is the run's temporary one, or ``$HARNESS_TEST_PIPELINE`` when set: a directory kept between runs, where
only stages whose keys changed are built again (a developer's repeated runs skip the build). The tests
that share runs, e.g. those reading the one end-to-end smoke run of ``kl_placement``
(:func:`tests.ablation_fixtures.kl_placement_smoke`, cached per process), are sent to one worker together by this
file's scheduler (:func:`pytest_xdist_make_scheduler`), so those runs happen once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The group of the tests that call :func:`tests.ablation_fixtures.kl_placement_smoke`.
KL_PLACEMENT_SMOKE_GROUP = "kl_placement_smoke"


def shared_run_groups(tests_dir: Path) -> dict[str, str]:
    """``{"tests/<file>.py::<test>": group}`` for the tests that must run on one xdist worker because they share runs
    that worker's store holds: a test whose body calls ``kl_placement_smoke()`` (group :data:`KL_PLACEMENT_SMOKE_GROUP`)
    and a test decorated ``@pytest.mark.xdist_group("name")`` (group ``name``). Read from the files' syntax trees, so
    the controller, which collects nothing, can group the node ids its workers report."""
    import ast

    groups: dict[str, str] = {}
    for path in sorted(tests_dir.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            key = f"{tests_dir.name}/{path.name}::{node.name}"
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "xdist_group"
                        and dec.args and isinstance(dec.args[0], ast.Constant)):
                    groups[key] = str(dec.args[0].value)
            calls = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
            if key not in groups and "kl_placement_smoke" in calls:
                groups[key] = KL_PLACEMENT_SMOKE_GROUP
    return groups


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` as this suite needs it: the tests of one :func:`shared_run_groups` group are one work unit
    (one worker runs them, in file order), every other test is a unit of its own, and the largest units are handed
    out first. pytest-xdist 3.8's own loadgroup renames a grouped item's node id, which pytest 9 no longer lets a
    plugin do, so its groups silently fall apart; this scheduler groups by the node ids as they are. (Handing the slow
    tests out first was measured slower, 723 s against 687 s for more work in the default order: two of them at once, each
    driving its own Ray workers, oversubscribe the two cores while the light tests later leave one idle.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    groups = shared_run_groups(Path(__file__).resolve().parent)

    class SharedRunScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return groups.get(nodeid.split("[", 1)[0], nodeid)

    return SharedRunScheduling(config, log)


def pytest_configure(config):
    """Under xdist, each worker gets its share of the CPUs for torch's threads (``$OMP_NUM_THREADS``, which the
    processes it starts inherit, and ``torch.set_num_threads``): the workers run side by side, and two processes
    with as many threads as cores each oversubscribe them. Measured on 2 cores, test_ppo and test_pipeline on 2
    workers: 410-566 CPU-seconds with torch's default of 2 threads a process (its threads spin at each parallel
    region while the other process holds a core), 140-156 with one."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        share = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(share)
        import torch

        torch.set_num_threads(share)


@pytest.fixture(scope="session", autouse=True)
def isolated_results(tmp_path_factory):
    """Point ``HARNESS_RESULTS`` at a session temp dir and use the embedded MLflow store."""
    root = tmp_path_factory.mktemp("harness_results")
    old = {k: os.environ.get(k) for k in ("HARNESS_RESULTS", "MLFLOW_TRACKING_URI")}
    os.environ["HARNESS_RESULTS"] = str(root)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    _seed_smoke_stages(root, tmp_path_factory)
    yield root
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def smoke_config(overrides: list[str] | None = None):
    """The smoke-scale config (tiny pipeline, a few PPO iterations) plus dotted overrides."""
    from harness.config import build_config
    from harness.config.presets import scale_overrides

    return build_config(scale_overrides("smoke"), overrides)


def _shared_smoke_configs() -> list:
    """The smoke pipelines most of the suite runs on: the bare smoke config (:func:`smoke_config`), the same in
    review_sentiment's default regime (what ``harness train --scale smoke`` and an ablation's runs resolve to: another
    proxy), that with the gold's naturalness head (the study's, trained against loops) and with the head
    ``kl_placement`` judges by (trained against loops and soup), and chain_sum's."""
    from harness.config import load_config

    natural = ["pipeline.gold.naturalness=on"]
    return [smoke_config(), load_config(None, [], scale="smoke", regime="default"),
            load_config(None, natural, scale="smoke", regime="default"),
            load_config(None, [*natural, "pipeline.gold.naturalness_negatives=loops_and_symbol_soup"], scale="smoke",
                        regime="default"),
            load_config(None, ["task.name=chain_sum"], scale="smoke")]


def _seed_smoke_stages(root: Path, tmp_path_factory) -> None:
    """Under xdist, copy the smoke pipelines' stage directories (:func:`_shared_smoke_configs`) into
    ``root/results/pipeline``, building them first (once per pytest run, under a file lock) in a directory the workers
    share. Each stage directory is self-contained and named by its key, so the pipeline finds the copies cached and
    writes this session's own summary. Outside xdist, nothing: the smoke pipeline is built where it is first needed."""
    import shutil
    from unittest import mock

    from filelock import FileLock

    from harness.pipeline import build_pipeline

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    kept = os.environ.get("HARNESS_TEST_PIPELINE")
    shared = Path(kept) if kept else tmp_path_factory.getbasetemp().parent / "shared_smoke_pipeline"
    shared.mkdir(parents=True, exist_ok=True)
    with FileLock(str(shared / ".build.lock")):
        if not (shared / f"built-{os.environ.get('PYTEST_XDIST_TESTRUNUID', '')}").is_file():
            with mock.patch.dict(os.environ, {"HARNESS_RESULTS": str(shared)}):
                for cfg in _shared_smoke_configs():  # stages already there (a kept directory) are found cached
                    # every CPU: the other workers wait on this lock meanwhile
                    build_pipeline(cfg, progress=False, threads=len(os.sched_getaffinity(0)))
            (shared / f"built-{os.environ.get('PYTEST_XDIST_TESTRUNUID', '')}").touch()
    for stage_dir in (shared / "results" / "pipeline").glob("*/*"):
        if stage_dir.is_dir() and not stage_dir.name.startswith("."):
            shutil.copytree(stage_dir, root / "results" / "pipeline" / stage_dir.parent.name / stage_dir.name)


@pytest.fixture(scope="session")
def smoke_pipeline(isolated_results):
    """Build (once per session; under xdist the stages are already in place) the smoke-scale pipeline; returns its
    artifacts."""
    from harness.pipeline import build_pipeline

    return build_pipeline(smoke_config())
