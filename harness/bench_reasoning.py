"""Benchmark of the reasoning testbed: does a default GRPO run on ``chain_sum`` lift the SFT policy's held-out
greedy pass@1, and how long does it take on one core?

``make bench-reasoning`` (``python -m harness.bench_reasoning``) builds (or loads) the chain_sum pipeline at the
default scale, then runs one default GRPO run (the task's recipe: group-normalised advantages, k3 KL in the loss)
with one torch thread, and prints the SFT policy's greedy pass@1 on the held-out evaluation problems (the
evaluation before the first update), the run's final greedy pass@1, the lift, and the run's wall time. The same
numbers go to ``<results>/bench_reasoning/summary.json``. It is a benchmark, not a test: the numbers depend on
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

from harness.callbacks import MetricsRecorder


def run_bench_reasoning(overrides: Optional[list[str]] = None, *, threads: int = 1, seed: int = 0,
                        out_dir: str | Path | None = None, echo: Callable[[str], None] = print,
                        scale: str = "default") -> dict[str, Any]:
    """Build the chain_sum pipeline (``scale``, default the default scale), run one GRPO run of that scale with
    ``threads`` torch threads and report the held-out greedy pass@1 before and after.

    Args:
        overrides: further ``key=value`` config overrides (e.g. ``ppo.total_iterations=20``).
        scale: the scale preset (``smoke`` for a quick check of the benchmark itself).
        threads: torch threads of the run (the pipeline build uses every core).
        seed: the run's seed.
        out_dir: where ``summary.json`` and the run's own outputs go (default ``<results>/bench_reasoning``).
        echo: where the result lines go; the last one is ``lift=X.XXX``.
    Returns:
        ``{"sft_pass1_greedy", "grpo_pass1_greedy", "lift", "sft_pass1_sampled", "grpo_pass1_sampled",
        "run_wall_s", "iterations", "threads", "loadavg_1m", "config_hash", "sft_stage_pass1_greedy"}``.
    Raises:
        ConfigError: a bad override (before any compute).
        HarnessError: an unknown scale.
    """
    from harness.config import default_results_dir, load_config
    from harness.pipeline import build_pipeline
    from harness.ppo import train

    cfg = load_config(None, ["task.name=chain_sum", "ppo.adv_estimator=grpo", f"seed={seed}", *(overrides or [])],
                      scale=scale)
    out = Path(out_dir) if out_dir is not None else Path(default_results_dir()) / "bench_reasoning"
    out.mkdir(parents=True, exist_ok=True)
    art = build_pipeline(cfg, progress=False)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    evals = MetricsRecorder()
    try:
        echo(f"chain_sum GRPO run: {cfg.ppo.total_iterations} iterations, {threads} thread(s), seed {seed} …")
        t0 = time.perf_counter()
        summary = train(cfg, out / "run", callbacks=[evals], progress=sys.stderr.isatty())
        wall = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    greedy, sampled = evals.history["eval/pass1_greedy"], evals.history["eval/gold"]  # [(iteration, value)]
    result = {
        "sft_pass1_greedy": greedy[0][1], "grpo_pass1_greedy": greedy[-1][1], "lift": greedy[-1][1] - greedy[0][1],
        "sft_pass1_sampled": sampled[0][1], "grpo_pass1_sampled": sampled[-1][1],
        "eval_problems": cfg.eval.num_prompts, "run_wall_s": wall, "iterations": cfg.ppo.total_iterations,
        "threads": threads, "loadavg_1m": os.getloadavg()[0], "config_hash": summary["config_hash"],
        "sft_stage_pass1_greedy": art.summary.get("sft", {}).get("heldout_pass1_greedy"),
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    echo(f"held-out greedy pass@1 ({cfg.eval.num_prompts} problems): SFT {result['sft_pass1_greedy']:.3f} -> "
         f"GRPO {result['grpo_pass1_greedy']:.3f}; sampled pass@1 {result['sft_pass1_sampled']:.3f} -> "
         f"{result['grpo_pass1_sampled']:.3f}")
    echo(f"run wall time {wall:.0f} s on {threads} thread(s) (1-min load {result['loadavg_1m']:.2f})")
    echo(f"lift={result['lift']:.3f}")
    return result


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m harness.bench_reasoning [key=value ...]``: :func:`run_bench_reasoning` with overrides."""
    run_bench_reasoning(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
