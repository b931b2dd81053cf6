"""Shared state for the ablation and report tests: one results directory (MLflow store, smoke
pipeline) per pytest run, and one end-to-end smoke run of ``kl_placement`` reused by both files
(a module-level cache, so the run happens once whichever file asks first).

Only ``HARNESS_RESULTS`` is redirected (to a temporary directory); ``HARNESS_CACHE`` keeps its
default so the offline data is not fetched again, and ``MLFLOW_TRACKING_URI`` is unset so the
embedded sqlite store under the temporary results directory is used.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional
from unittest import mock

_ROOT: Optional[Path] = None
_KL_PLACEMENT: Optional[dict] = None


def results_root() -> Path:
    """The results directory of this pytest run: ``$HARNESS_RESULTS`` as set by the autouse fixture
    in ``conftest.py`` (shared with the smoke pipeline of the other tests), else a temporary
    directory created once and removed at exit."""
    global _ROOT
    if _ROOT is None:
        env = os.environ.get("HARNESS_RESULTS")
        if env:
            _ROOT = Path(env)
        else:
            _ROOT = Path(tempfile.mkdtemp(prefix="harness-test-results-"))
            atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


@contextmanager
def results_env(ablations: Optional[Path] = None) -> Iterator[Path]:
    """Point ``HARNESS_RESULTS`` at the shared results directory (and optionally ``HARNESS_ABLATIONS`` at
    a spec directory), unset ``MLFLOW_TRACKING_URI``; restore the environment afterwards."""
    with mock.patch.dict(os.environ):
        os.environ["HARNESS_RESULTS"] = str(results_root())
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if ablations is not None:
            os.environ["HARNESS_ABLATIONS"] = str(ablations)
        else:
            os.environ.pop("HARNESS_ABLATIONS", None)
        yield results_root()


def kl_placement_smoke() -> dict:
    """Run ``harness ablate kl_placement --scale smoke --workers 2`` once per pytest run.

    Returns ``{"report": Path, "wall_s": float}``.
    """
    global _KL_PLACEMENT
    if _KL_PLACEMENT is None:
        from harness.experiments.ablate import run_ablation

        with results_env():
            t0 = time.time()
            report = run_ablation("kl_placement", scale="smoke", workers=2, progress=False)
            _KL_PLACEMENT = {"report": report, "wall_s": time.time() - t0}
    return _KL_PLACEMENT


def write_spec(d: Path, name: str, text: str) -> Path:
    """Write ablation spec ``text`` (dedented) to ``d/<name>.yaml``; returns the path."""
    p = d / f"{name}.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def child_runs(experiment: str) -> list:
    """Every child run of ``experiment`` in the shared store, newest first. The store is opened as a driver opens it
    (:func:`harness.infra.tracking.init_store`, under its lock), so polling a store that a driver is creating at that
    moment never races its schema migration."""
    from harness.infra import tracking

    with results_env():
        c = tracking.init_store()
        exp = c.get_experiment_by_name(experiment)
        if exp is None:
            return []
        return [r for r in tracking.search_all(c, [exp.experiment_id]) if r.data.tags.get("kind") == "child"]
