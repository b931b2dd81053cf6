"""Shared fixtures: an isolated results directory per test session and a smoke-scale pipeline.

The data cache (``$HARNESS_CACHE`` or ``~/.cache/ppo-harness``, filled by ``make setup``) is shared,
so the tests never download anything. Everything the tests write goes to a temporary
``HARNESS_RESULTS``; the smoke pipeline is built once per session there.

``make test`` runs the suite on pytest-xdist workers: each worker is a session of its own (its own results
directory, store and smoke pipeline). The tests that read the one end-to-end smoke run of ``kl_placement``
(:func:`tests.ablation_fixtures.kl_placement_smoke`, cached per process) are sent to one worker together
(``--dist loadgroup``), so that run happens once.
"""

from __future__ import annotations

import inspect
import os

import pytest

#: The xdist group of the tests that call :func:`tests.ablation_fixtures.kl_placement_smoke`.
KL_PLACEMENT_SMOKE_GROUP = "kl_placement_smoke"


def pytest_collection_modifyitems(config, items):
    """Put every test whose body calls ``kl_placement_smoke()`` in one xdist group (one worker runs them all)."""
    for item in items:
        fn = getattr(item, "function", None)
        try:
            source = inspect.getsource(fn) if fn is not None else ""
        except (OSError, TypeError):
            source = ""
        if "kl_placement_smoke()" in source:
            item.add_marker(pytest.mark.xdist_group(KL_PLACEMENT_SMOKE_GROUP))


@pytest.fixture(scope="session", autouse=True)
def isolated_results(tmp_path_factory):
    """Point ``HARNESS_RESULTS`` at a session temp dir and use the embedded MLflow store."""
    root = tmp_path_factory.mktemp("harness_results")
    old = {k: os.environ.get(k) for k in ("HARNESS_RESULTS", "MLFLOW_TRACKING_URI")}
    os.environ["HARNESS_RESULTS"] = str(root)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
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


@pytest.fixture(scope="session")
def smoke_pipeline(isolated_results):
    """Build (once per session) the smoke-scale pipeline; returns its artifacts."""
    from harness.pipeline import build_pipeline

    return build_pipeline(smoke_config())
