"""Shared fixtures: an isolated results directory per test session and a smoke-scale pipeline.

The data cache (``$HARNESS_CACHE`` or ``~/.cache/ppo-harness``, filled by ``make setup``) is shared,
so the tests never download anything. Everything the tests write goes to a temporary
``HARNESS_RESULTS``; the smoke pipeline is built once per session there.
"""

from __future__ import annotations

import os

import pytest


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
