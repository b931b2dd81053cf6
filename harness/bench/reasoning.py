"""Benchmark of the reasoning testbed: does a default GRPO run on ``chain_sum`` lift the SFT policy's held-out
greedy pass@1, and how long does it take on one core?

``make bench-reasoning`` (``python -m harness.bench.reasoning``) builds (or loads) the chain_sum pipeline at the
default scale, then runs one default GRPO run (the task's recipe: group-normalised advantages, k3 KL in the loss)
with one torch thread, and prints the SFT policy's greedy pass@1 on the held-out evaluation problems (the
evaluation before the first update), the run's final greedy pass@1, the lift, and the run's wall time, with the
greedy pass@1 of every held-out evaluation and the seconds into the run it was taken at, and when the lift first
reached ``target_lift`` (0.15: the testbed's target, within 10 minutes of one core). The same numbers go to
``<results>/bench_reasoning/summary.json``. It is a benchmark, not a test: the numbers depend on
the machine and its load (printed with them).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from harness.rl.callbacks import MetricsRecorder


#: The lift over the SFT policy's held-out greedy pass@1 that a default GRPO run should reach within 10 minutes.
TARGET_LIFT = 0.15


class EvalClock(MetricsRecorder):
    """A :class:`~harness.rl.callbacks.MetricsRecorder` that also notes when each held-out evaluation ended:
    ``eval_seconds[iteration]``, seconds of wall time since :meth:`start` (the run's start)."""

    def __init__(self) -> None:
        super().__init__()
        self.t0 = time.perf_counter()
        self.eval_seconds: dict[int, float] = {}

    def start(self) -> None:
        """Start the clock (call right before the run)."""
        self.t0 = time.perf_counter()

    def on_eval(self, iteration: int, metrics: dict[str, float]) -> None:
        """Record the evaluation's metrics and the seconds since :meth:`start` at which it ended."""
        super().on_eval(iteration, metrics)
        self.eval_seconds[iteration] = time.perf_counter() - self.t0


def first_lift(curve: list[tuple[int, float, float]], target: float) -> Optional[tuple[int, float]]:
    """The first evaluation whose greedy pass@1 is at least ``target`` above the first one's.

    Args:
        curve: ``[(iteration, pass@1, seconds into the run)]`` in run order; the first entry is the SFT policy's
            evaluation (before the first update).
        target: the lift sought (pass@1 units, e.g. 0.15).
    Returns:
        ``(iteration, seconds)`` of that evaluation, or None when no evaluation reaches it (or ``curve`` is empty).
    """
    if not curve:
        return None
    base = curve[0][1]
    return next(((it, s) for it, v, s in curve[1:] if v - base >= target - 1e-12), None)


def run_bench_reasoning(overrides: Optional[list[str]] = None, *, threads: int = 1, seed: int = 0,
                        out_dir: str | Path | None = None, echo: Callable[[str], None] = print,
                        scale: str = "default", target_lift: float = TARGET_LIFT) -> dict[str, Any]:
    """Build the chain_sum pipeline (``scale``, default the default scale), run one GRPO run of that scale with
    ``threads`` torch threads and report the held-out greedy pass@1 before and after.

    Args:
        overrides: further ``key=value`` config overrides (e.g. ``ppo.total_iterations=20``).
        scale: the scale preset (``smoke`` for a quick check of the benchmark itself).
        threads: torch threads of the run (the pipeline build uses every core).
        seed: the run's seed.
        out_dir: where ``summary.json`` and the run's own outputs go (default ``<results>/bench_reasoning``).
        echo: where the result lines go; the last one is ``lift=X.XXX``.
        target_lift: the lift whose first evaluation is reported (``lift_reached``).
    Returns:
        ``{"sft_pass1_greedy", "grpo_pass1_greedy", "lift", "sft_pass1_sampled", "grpo_pass1_sampled",
        "run_wall_s", "iterations", "threads", "loadavg_1m", "config_hash", "sft_stage_pass1_greedy", "curve"
        ([[iteration, greedy pass@1, seconds into the run], …] per evaluation), "target_lift", "lift_reached"
        ({"iteration", "seconds"} of the first evaluation at the target lift, or None)}``.
    Raises:
        ConfigError: a bad override (before any compute).
        HarnessError: an unknown scale.
    """
    from harness.config import default_results_dir, load_config
    from harness.pipeline import build_pipeline
    from harness.rl.runner import run

    cfg = load_config(None, ["task.name=chain_sum", "ppo.adv_estimator=grpo", f"seed={seed}", *(overrides or [])],
                      scale=scale)
    out = Path(out_dir) if out_dir is not None else Path(default_results_dir()) / "bench_reasoning"
    out.mkdir(parents=True, exist_ok=True)
    art = build_pipeline(cfg, progress=False)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    evals = EvalClock()
    try:
        echo(f"chain_sum GRPO run: {cfg.ppo.total_iterations} iterations, {threads} thread(s), seed {seed} …")
        t0 = time.perf_counter()
        evals.start()
        summary = run(cfg, out / "run", callbacks=[evals], progress=sys.stderr.isatty())
        wall = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    greedy, sampled = evals.history["eval/pass1_greedy"], evals.history["eval/gold"]  # [(iteration, value)]
    curve = [(it, v, evals.eval_seconds[it]) for it, v in greedy]
    reached = first_lift(curve, target_lift)
    result = {
        "sft_pass1_greedy": greedy[0][1], "grpo_pass1_greedy": greedy[-1][1], "lift": greedy[-1][1] - greedy[0][1],
        "sft_pass1_sampled": sampled[0][1], "grpo_pass1_sampled": sampled[-1][1],
        "eval_problems": cfg.eval.num_prompts, "run_wall_s": wall, "iterations": cfg.ppo.total_iterations,
        "threads": threads, "loadavg_1m": os.getloadavg()[0], "config_hash": summary["config_hash"],
        "sft_stage_pass1_greedy": art.summary.get("sft", {}).get("heldout_pass1_greedy"),
        "curve": [list(c) for c in curve], "target_lift": target_lift,
        "lift_reached": {"iteration": reached[0], "seconds": reached[1]} if reached else None,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    echo(f"held-out greedy pass@1 ({cfg.eval.num_prompts} problems): SFT {result['sft_pass1_greedy']:.3f} -> "
         f"GRPO {result['grpo_pass1_greedy']:.3f}; sampled pass@1 {result['sft_pass1_sampled']:.3f} -> "
         f"{result['grpo_pass1_sampled']:.3f}")
    echo("greedy pass@1 by evaluation (iteration: value, seconds into the run): "
         + ", ".join(f"{it}: {v:.3f} ({s:.0f} s)" for it, v, s in curve))
    echo(f"lift >= {target_lift:g} first at iteration {reached[0]}, {reached[1]:.0f} s into the run" if reached
         else f"lift >= {target_lift:g} not reached")
    echo(f"run wall time {wall:.0f} s on {threads} thread(s) (1-min load {result['loadavg_1m']:.2f})")
    echo(f"lift={result['lift']:.3f}")
    return result


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m harness.bench.reasoning [key=value ...]``: :func:`run_bench_reasoning` with overrides."""
    run_bench_reasoning(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
