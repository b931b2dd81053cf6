"""``harness rescore NAME``: a new judge for old runs, without training.

Every evaluation of a run of a task scored by a learned reward model keeps its held-out responses with the run
(``heldout/iter_XXXX.json``: prompt + response texts, token ids, gold and proxy scores; :mod:`harness.infra.tracking`), and
the archive keeps them in the repository. Rescoring applies the gold that ablation NAME's spec names now (the gold
stage of its baseline's seed-0 config at the scale, built here if it is not cached) to the held-out responses of
every archived run, and records per run, at each evaluation's step:

* ``rescored/gold`` and, where that gold has them, ``rescored/gold_sentiment`` and ``rescored/gold_p_natural``
  (:meth:`harness.tasks.review_sentiment.gold.GoldRewardModel.parts`), means over the evaluation's responses;
* ``rescored_final/gold`` (and its heads) at the last evaluation, and ``rescored_final/collapsed``: 1.0 when the last
  evaluation's rescored gold is below the first's (the SFT policy's), as ``eval_final/collapsed`` reads the gold.

The metrics are written into the MLflow store's runs and kept in the archive beside the runs
(``archive/rescored/<gold key>.json.gz``, applied again whenever the archive is restored), and the report is
rendered again: its standing columns show ``rescored_final/gold`` beside the runs' own gold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from harness.errors import HarnessError

from harness.experiments.archive import RESCORED_FOLDER as FOLDER
from harness.experiments.archive import apply_rescored


def judge(name: str, scale: str = "default", overrides: Sequence[str] = ()) -> tuple[Any, str]:
    """``(gold scorer, its stage key)``: the gold of ablation ``name``'s baseline at seed 0 and ``scale`` as its spec
    resolves now, with the dotted ``overrides`` on top (e.g. ``pipeline.gold.naturalness_negatives=loops_and_soup``:
    another judge for the same runs, the spec untouched), its pipeline built (or read from the cache) up to the gold
    stage only.

    Raises:
        HarnessError: unknown ablation or scale; the task has no gold stage (a verifier task has nothing to rescore).
        ConfigError: an override names no field or gives a value the field refuses (the field named).
    """
    from harness.config import build_config
    from harness.experiments.spec import load_spec, resolve_config
    from harness.pipeline import build_pipeline
    from harness.tasks.review_sentiment.gold import GoldRewardModel

    spec = load_spec(name)
    cfg = resolve_config(spec, scale, spec.baseline, 0)
    if overrides:
        cfg = build_config(cfg.to_dict(), list(overrides))
    found: dict[str, Any] = {}

    class _Built(Exception):
        pass

    def check(label: str, record: dict) -> None:
        if label == "gold":
            found.update(record)
            raise _Built()

    try:
        build_pipeline(cfg, defer=True, check=check)
    except _Built:
        pass
    if not found:
        raise HarnessError(f"rescore: task {cfg.task.name!r} of {name} has no gold stage; nothing to rescore")
    return GoldRewardModel(Path(cfg.pipeline.out_dir) / "gold" / found["key"]), str(found["key"])


def heldout(record: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """An archive record's held-out responses by evaluation step (its ``heldout/iter_XXXX.json`` artifacts)."""
    from harness.rl.callbacks import HELDOUT_DIR

    out = {}
    for path, text in record.get("artifacts", {}).items():
        if path.startswith(f"{HELDOUT_DIR}/") and path.endswith(".json"):
            data = json.loads(text)
            out[int(data["iteration"])] = data
    return dict(sorted(out.items()))


def rescored_metrics(gold: Callable[..., Any], evaluations: dict[int, dict[str, Any]]) -> dict[str, list[list[float]]]:
    """The rescored metrics of one run (module docstring) from its held-out responses by step: ``{metric: [[step,
    value], ...]}``, the ``rescored_final/*`` ones at step 0. Empty without evaluations.

    ``gold`` has ``parts(texts) -> {"gold", "sentiment", "p_natural": [B]}`` (the gold RM) or is a plain
    ``texts -> [B]`` scorer (only ``rescored/gold`` then)."""
    out: dict[str, list[list[float]]] = {}
    for step, ev in evaluations.items():
        parts = gold.parts(ev["texts"]) if hasattr(gold, "parts") else {"gold": gold(ev["texts"])}
        for part, values in parts.items():
            name = "gold" if part == "gold" else f"gold_{part}"
            out.setdefault(f"rescored/{name}", []).append([step, float(values.float().mean())])
    if not out:
        return out
    for key in list(out):
        out[key.replace("rescored/", "rescored_final/")] = [[0, out[key][-1][1]]]
    gold_curve = out["rescored/gold"]
    out["rescored_final/collapsed"] = [[0, float(gold_curve[-1][1] < gold_curve[0][1])]]
    return out


def _sidecar(name: str, key: str, reports: Optional[Path] = None) -> Path:
    from harness.experiments.archive import archive_dir

    return archive_dir(name, reports) / FOLDER / f"{key}.json.gz"


def rescore(name: str, scale: str = "default", echo: Callable[[str], None] = print,
            reports: Optional[Path] = None, overrides: Sequence[str] = ()) -> Path:
    """Rescore every archived run of ablation ``name`` that kept held-out responses (module docstring), keep the
    metrics in the archive, write them into the store's runs and render the report again; returns its path.
    ``overrides`` choose another gold than the spec's (:func:`judge`); the archive records them with the gold's key,
    and the report names both. One judge per ablation: rescoring with another gold replaces the earlier one's file.

    Raises:
        HarnessError: a bad archive record (named), no archived run with held-out responses, or what
            :func:`judge` raises.
    """
    from harness.experiments import archive
    from harness.infra import tracking
    from harness.experiments.ablate import experiment_name
    from harness.reporting.ablation import write_report

    records = archive.archive_records(name, reports)
    kept = {r["run_id"]: heldout(r) for r in records.values() if r["status"] == "FINISHED"}
    kept = {k: v for k, v in kept.items() if v}
    if not kept:
        raise HarnessError(f"rescore: no archived run of {name} kept its held-out responses (runs trained before "
                           f"they were kept cannot be rescored)")
    gold, key = judge(name, scale, overrides)
    echo(f"rescoring the held-out responses of {len(kept)} run(s) of {name} with the gold {key}")
    from tqdm.auto import tqdm

    # progress per run (a run's evaluations hold a few thousand responses: tens of seconds each on CPU)
    runs = {run_id: rescored_metrics(gold, evals)
            for run_id, evals in tqdm(kept.items(), total=len(kept), desc=f"rescore {name}", unit="run",
                                      mininterval=10.0, dynamic_ncols=True)}
    for old in archive.rescored_files(name, reports):
        old.unlink()  # another judge's metrics would share the rescored_* names
    archive.write_record(_sidecar(name, key, reports), {"format": archive.FORMAT, "gold_key": key,
                                                        "overrides": list(overrides), "runs": runs})
    c = tracking.init_store()
    exp_id = tracking.experiment_id(c, experiment_name(name))
    archive.restore_runs(c, exp_id, name, reports)
    applied = apply_rescored(c, exp_id, name, reports)
    echo(f"rescored metrics written to {applied} run(s) of the store and kept in {_sidecar(name, key, reports)}")
    return write_report(name, scale=scale, archive_reports=reports)


__all__ = ["FOLDER", "judge", "heldout", "rescored_metrics", "rescore", "apply_rescored"]
