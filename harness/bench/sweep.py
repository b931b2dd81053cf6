"""``make bench-sweep``: trials per hour of a sweep with 1 and with 2 workers.

Run as ``python -m harness.bench.sweep [TRIALS_PER_WORKER]``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

from harness.experiments import engine
from harness.config import deep_update
from harness.experiments.study_spec import load_study_spec, parse_study_spec, resolve_trial_config, study_name
from harness.experiments.sweep import STORAGE_ENV, make_storage, run_sweep


def bench_sweep(trials_per_worker: int = 6, workers: tuple[int, ...] = (1, 2), scale: str = "smoke",
                name: str = "ppo_core", progress: bool = False) -> dict[str, Any]:
    """Trials per hour of a sweep at ``scale`` with 1 and with 2 workers, and their ratio.

    Each setting runs a fresh study of spec ``name`` (random sampler, no pruner, so every trial
    does the full work) with ``trials_per_worker × workers`` trials, with the results directory
    (Optuna journal, MLflow store, run outputs) in a temporary directory; the pipeline is the
    cached one of the real results directory, built first and not timed. Two throughputs:
    ``end_to_end`` (wall time of :func:`run_sweep` without the report: Ray start-up, worker imports
    and model loading included) and ``steady`` (trials / (last trial end − first trial start)).
    Prints one line per setting and the ratios; returns them.
    """
    import tempfile

    import optuna

    from harness.pipeline import build_pipeline

    base = load_study_spec(name)
    pipeline_dir = str(Path(resolve_trial_config(base, scale, None, 0).pipeline.out_dir).resolve())
    data = base.model_dump(mode="json")
    data.update(sampler={"type": "random", "seed": 0}, pruner={"type": "none"}, name=None)
    data["base"] = deep_update(data.get("base") or {}, {"pipeline": {"out_dir": pipeline_dir}})
    bench_name = f"{name}_bench"
    spec = parse_study_spec(data, bench_name)
    build_pipeline(resolve_trial_config(spec, scale, None, 0))
    results: dict[str, Any] = {"scale": scale, "trials_per_worker": trials_per_worker, "cpu_count": os.cpu_count()}
    with mock.patch.dict(os.environ):  # the environment is restored afterwards
        for w in workers:
            with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
                os.environ["HARNESS_RESULTS"] = tmp
                os.environ.pop(STORAGE_ENV, None)
                os.environ.pop("MLFLOW_TRACKING_URI", None)
                n = trials_per_worker * w
                load0 = os.getloadavg()[0]
                t0 = time.perf_counter()
                run_sweep(bench_name, trials=n, scale=scale, workers=w, progress=progress, report=False, spec=spec)
                wall = time.perf_counter() - t0
                engine.shutdown()  # the next setting starts its own local Ray instance
                study = optuna.load_study(study_name=study_name(bench_name, scale), storage=make_storage(bench_name))
                done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
                span = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds() if done else float("nan")
                r = {"workers": w, "trials": len(done), "wall_s": wall, "steady_span_s": span,
                     "trials_per_hour_end_to_end": 3600.0 * len(done) / wall,
                     "trials_per_hour_steady": 3600.0 * len(done) / span if span and span > 0 else float("nan"),
                     "mean_trial_s": sum(t.duration.total_seconds() for t in done) / max(1, len(done)),
                     "mean_trial_cpu_s": sum(t.user_attrs.get("cpu_s", 0.0) for t in done) / max(1, len(done)),
                     "cores_used_steady": sum(t.user_attrs.get("cpu_s", 0.0) for t in done) / span if span and span > 0 else float("nan"),
                     "worker_pids": sorted({t.user_attrs.get("worker_pid") for t in done}),
                     "load_avg_1m_before": load0, "load_avg_1m_after": os.getloadavg()[0]}
                results[f"w{w}"] = r
                print(f"bench-sweep {scale}: {w} worker(s): {len(done)} trials in {wall:.1f} s → "
                      f"{r['trials_per_hour_end_to_end']:.0f} trials/h end-to-end, {r['trials_per_hour_steady']:.0f} trials/h steady "
                      f"(mean trial {r['mean_trial_s']:.1f} s wall, {r['mean_trial_cpu_s']:.1f} s CPU; {r['cores_used_steady']:.2f} cores busy "
                      f"with trials; load avg {load0:.2f} → {r['load_avg_1m_after']:.2f})",
                      flush=True)
    if len(workers) >= 2:
        a, b = results[f"w{workers[0]}"], results[f"w{workers[1]}"]
        results["ratio_end_to_end"] = b["trials_per_hour_end_to_end"] / a["trials_per_hour_end_to_end"]
        results["ratio_steady"] = b["trials_per_hour_steady"] / a["trials_per_hour_steady"]
        print(f"bench-sweep: {workers[1]} vs {workers[0]} worker(s): ×{results['ratio_end_to_end']:.2f} end-to-end, "
              f"×{results['ratio_steady']:.2f} steady (target ≥ 1.8; {os.cpu_count()} CPU cores)", flush=True)
    return results


def _bench_main() -> None:
    """``python -m harness.bench.sweep [TRIALS_PER_WORKER]`` (the Makefile's ``bench-sweep``)."""
    args = sys.argv[1:]
    if not args or args[0] != "bench":
        raise SystemExit("usage: python -m harness.bench.sweep [TRIALS_PER_WORKER]")
    tpw = int(args[1]) if len(args) > 1 else 6
    res = bench_sweep(trials_per_worker=tpw)
    print(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    from harness.bench.sweep import _bench_main as _main  # the importable module, so workers can unpickle its functions

    _main()
