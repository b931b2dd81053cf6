"""Ablations as data: ``ablations/NAME.yaml`` → (variant, seed) runs → worker pool → MLflow → report.

A spec states the question, the published claim(s) with their source and expected direction, a
base config, the variants (each a nested config override), seeds and scales, the primary metrics
and the verdict rule (see :class:`AblationSpec`; ``ablations/kl_placement.yaml`` is a complete
example). :func:`run_ablation` runs every (variant, seed) not yet FINISHED in parallel worker
processes, records each as a nested MLflow child run (:mod:`harness.tracking`), then writes the
report (:func:`harness.report.write_report`).

Config resolution for one run (later wins)::

    Config defaults ← spec.base ← SCALE_PRESETS[scale] ← spec.scales[scale].overrides
                    ← spec.variants[variant] ← {"seed": seed}

Resume rules: a (variant, seed) with a FINISHED child run of the same config hash (any earlier
invocation) is skipped; one RUNNING in a live process is left alone; FAILED/KILLED ones, and
RUNNING ones whose process is dead (marked FAILED first), are run again as a new child run.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, TypeVar, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.callbacks import Callback
from harness.config import Config, ConfigError, build_config, deep_update, format_validation_error
from harness.errors import HarnessError
from harness.presets import CHECKED_SCALES, scale_overrides

#: Seeds per scale when a spec does not say.
DEFAULT_SEEDS: dict[str, int] = {"smoke": 2, "default": 10, "full": 20}
#: Primary metrics when a spec does not say (``goal``: which direction is better).
DEFAULT_METRICS: list[dict[str, str]] = [
    {"name": "eval_final/gold", "goal": "max"},
    {"name": "eval_final/proxy", "goal": "max"},
    {"name": "eval_final/kl", "goal": "min"},
]
_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_METRIC_RE = r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z0-9_]+)+$"


# ------------------------------------------------------------------------------------------------
# Spec schema
# ------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MetricSpec(_Strict):
    """A run-level metric logged to MLflow (``eval_final/gold``, ``last/response/eos_rate`` ...) and
    which direction is better (``max``/``min``; used for the probability of improvement), or
    ``none`` for a diagnostic without a better direction (e.g. response length)."""

    name: str = Field(pattern=_METRIC_RE)
    goal: Literal["max", "min", "none"] = "max"


class Claim(_Strict):
    """A published claim as a testable statement about the difference ``d = a − b`` of the mean of
    ``metric`` between variants ``a`` and ``b`` (each mean over seeds).

    ``expect``:
      - ``greater``: ``d > 0``; ``less``: ``d < 0``;
      - ``not_greater``: ``d < margin`` ("a does not help over b by more than the margin");
      - ``equivalent``: ``|d| < margin`` ("little effect": shown only by an equivalence test, TOST).
    ``margin`` (> 0, in the metric's units) is the smallest difference that matters: the bound of
    ``not_greater`` / ``equivalent`` claims, and for every claim the effect whose required seeds the
    report states. ``kind`` says whether the claim is a ``mechanism`` check (true by construction,
    reported pass/fail) or an empirical ``finding`` (reproduced/contradicted); ``section`` names the
    source's section, table or equation; ``setting_note`` says how the source's setting differs from
    ours. The verdict rule is in :mod:`harness.verdicts`.
    """

    claim: str = Field(min_length=1)
    kind: Literal["mechanism", "finding"]
    source: str = Field(min_length=1)
    section: str = Field(min_length=1)
    setting_note: str = Field(min_length=1)
    metric: str = Field(pattern=_METRIC_RE)
    a: str
    expect: Literal["greater", "less", "not_greater", "equivalent"]
    b: str
    margin: float = Field(gt=0.0)

    @model_validator(mode="after")
    def _check(self) -> "Claim":
        if self.a == self.b:
            raise ValueError(f"claim compares variant {self.a!r} with itself")
        return self


class ScaleSpec(_Strict):
    """Per-scale settings: seeds (a count N → 0..N-1, or a list), nested config overrides merged over
    ``SCALE_PRESETS[scale]``, and ``variants``: the variants run at this scale (default: all), so a
    ``full`` scale can cross more settings than the ``default`` one."""

    seeds: Optional[Union[int, list[int]]] = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    variants: Optional[list[str]] = Field(None, min_length=2)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: Any) -> Any:
        return _check_seeds(v)


class VerdictRule(_Strict):
    """How claims are judged (:mod:`harness.verdicts`): ``welch``: Welch's t test per claim (TOST for
    ``equivalent`` claims) at level ``alpha``, Holm-adjusted across the ablation's claims; no verdict
    when an arm has fewer than ``min_seeds`` seeds; the minimum detectable effect at ``power``;
    ``n_resamples`` bootstrap resamples for the (descriptive) P(improvement) intervals."""

    rule: Literal["welch"] = "welch"
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    min_seeds: int = Field(10, ge=2)
    power: float = Field(0.8, gt=0.0, lt=1.0)
    n_resamples: int = Field(9999, ge=100)

    def reported(self) -> dict[str, Any]:
        """The rule as a report's ``summary.json`` records it (what a scorecard compares with the spec's)."""
        return {"rule": self.rule, "alpha": self.alpha, "min_seeds": self.min_seeds, "power": self.power}


class AblationSpec(_Strict):
    """One ablation, as written in ``ablations/NAME.yaml``.

    ``seed_offset`` (optional, ``{variant: k}``) runs that variant on seeds ``s + k`` instead of ``s``:
    an A/A check compares two identical configs on disjoint seed sets this way.

    Raises (through :func:`load_spec`): :class:`harness.config.ConfigError` with one line naming
    every bad field: unknown keys, a claim or baseline naming an unknown variant, a variant
    override that fails config validation.
    """

    name: Optional[str] = Field(None, pattern=_NAME_RE)
    question: str = Field(min_length=1)
    claims: list[Claim] = Field(min_length=1)
    baseline: str
    base: dict[str, Any] = Field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = Field(min_length=2)
    seeds: Optional[Union[int, list[int]]] = None
    seed_offset: dict[str, int] = Field(default_factory=dict)
    scales: dict[Literal["smoke", "default", "full"], ScaleSpec] = Field(default_factory=dict)
    metrics: list[Union[str, MetricSpec]] = Field(default_factory=lambda: [MetricSpec(**m) for m in DEFAULT_METRICS])
    verdict: VerdictRule = Field(default_factory=VerdictRule)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: Any) -> Any:
        return _check_seeds(v)

    @field_validator("variants", mode="before")
    @classmethod
    def _variants(cls, v: Any) -> Any:
        if isinstance(v, dict):
            import re

            for k, ov in v.items():
                if not re.match(_NAME_RE, str(k)):
                    raise ValueError(f"variant name {k!r} must match {_NAME_RE}")
                if ov is None:
                    v[k] = {}
        return v

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: list[Any]) -> list[MetricSpec]:
        out = []
        for m in v:
            if isinstance(m, str):
                m = MetricSpec(name=m, goal="min" if m.rsplit("/", 1)[-1] == "kl" else "max")
            out.append(m)
        return out

    @model_validator(mode="after")
    def _references(self) -> "AblationSpec":
        names = list(self.variants)
        if self.baseline not in self.variants:
            raise ValueError(_unknown_variant("baseline", self.baseline, names))
        for v, off in self.seed_offset.items():
            if v not in self.variants:
                raise ValueError(_unknown_variant("seed_offset", v, names))
            if off < 0:
                raise ValueError(f"seed_offset.{v}: must be ≥ 0 (got {off})")
        for i, c in enumerate(self.claims):
            for role in ("a", "b"):
                v = getattr(c, role)
                if v not in self.variants:
                    raise ValueError(_unknown_variant(f"claims.{i}.{role}", v, names))
        for k, sc in self.scales.items():
            for v in sc.variants or []:
                if v not in self.variants:
                    raise ValueError(_unknown_variant(f"scales.{k}.variants", v, names))
            if sc.variants is not None and self.baseline not in sc.variants:
                raise ValueError(f"scales.{k}.variants: must include the baseline {self.baseline!r}")
        for where, ov in [("base", self.base)] + [(f"variants.{k}", v) for k, v in self.variants.items()] + \
                [(f"scales.{k}.overrides", s.overrides) for k, s in self.scales.items()]:
            if "seed" in ov:
                raise ValueError(f"{where}: 'seed' is set by the seeds axis, not by overrides")
        return self

    # ---- lookups ------------------------------------------------------------------------------
    def variants_for(self, scale: str) -> list[str]:
        """The variants run at ``scale`` (the scale's ``variants`` list, else all), in spec order."""
        s = self.scales.get(scale)  # type: ignore[call-overload]
        keep = set(s.variants) if s is not None and s.variants is not None else set(self.variants)
        return [v for v in self.variants if v in keep]

    def claims_for(self, scale: str) -> list["Claim"]:
        """The claims whose two arms are both run at ``scale``."""
        vs = set(self.variants_for(scale))
        return [c for c in self.claims if c.a in vs and c.b in vs]

    def seeds_for(self, scale: str) -> list[int]:
        """Seeds of ``scale``: the scale's own, else the spec's ``seeds``, else DEFAULT_SEEDS."""
        s = self.scales.get(scale)  # type: ignore[call-overload]
        v = s.seeds if s is not None and s.seeds is not None else self.seeds
        if v is None:
            v = DEFAULT_SEEDS.get(scale, 3)
        return list(range(v)) if isinstance(v, int) else list(v)

    def metric_goal(self, metric: str) -> str:
        """``"max"``, ``"min"`` or ``"none"`` for ``metric`` (the primary metrics' goals; otherwise
        ``*/kl`` is min and anything else max)."""
        for m in self.metrics:
            if m.name == metric:  # type: ignore[union-attr]
                return m.goal  # type: ignore[union-attr]
        return "min" if metric.rsplit("/", 1)[-1] == "kl" else "max"


def _check_seeds(v: Any) -> Any:
    if v is None:
        return v
    if isinstance(v, int):
        if v < 1:
            raise ValueError("seeds: a count must be ≥ 1")
    elif len(v) == 0 or len(set(v)) != len(v) or min(v) < 0:
        raise ValueError("seeds: a list must be non-empty, unique and ≥ 0")
    return v


def _unknown_variant(where: str, name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}: unknown variant {name!r}{hint}; variants: {', '.join(names)}"


# ------------------------------------------------------------------------------------------------
# Spec files
# ------------------------------------------------------------------------------------------------


def ablations_dir() -> Path:
    """Where specs live: ``$HARNESS_ABLATIONS``, else ``ablations/`` of this repository, else
    ``./ablations``."""
    env = os.environ.get("HARNESS_ABLATIONS")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent / "ablations"
    return repo if repo.is_dir() else Path("ablations")


def list_specs(directory: Path) -> list[str]:
    """Names (file stems) of the ``*.yaml`` specs directly in ``directory``, sorted; [] if it is missing."""
    return sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []


def find_spec(directory: Path, name: str, kind: str) -> Path:
    """``directory/NAME.yaml``, the spec of ablation or study ``name``.

    Args:
        directory: where the specs of this kind live.
        name: spec name (file stem).
        kind: ``"ablation"`` or ``"study"``, used in the error message.
    Raises:
        HarnessError: ``name`` breaks the naming rule (:func:`harness.safety.check_name`: no paths), or
            no such file; the one-line message lists the available names (and the closest one).
    """
    from harness.safety import check_name

    check_name(kind, name)
    p = directory / f"{name}.yaml"
    if not p.is_file():
        names = list_specs(directory)
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise HarnessError(f"unknown {kind} {name!r}{hint}; available: {', '.join(names) or 'none'} (in {directory})")
    return p


def read_spec(path: Path, kind: str, name: str) -> Any:
    """The YAML data of the spec file ``path`` of ablation or study ``name`` (size-checked read).

    Raises:
        ConfigError: not valid YAML; one line starting ``KIND NAME:``.
    """
    from harness.safety import one_line, read_small_text

    try:
        return yaml.safe_load(read_small_text(path, "spec"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{kind} {name}: {path.name} is not valid YAML ({one_line(e, 200)})") from None


SpecT = TypeVar("SpecT", bound=BaseModel)


def validate_spec(data: Any, model: type[SpecT], kind: str, name: str) -> SpecT:
    """``data`` validated as ``model`` (an ablation or study spec) whose ``name`` is set to the file's.

    Raises:
        ConfigError: not a mapping, a schema violation (:func:`harness.config.format_validation_error`),
            or a ``name:`` that differs from the file name; one line starting ``KIND NAME:``.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{kind} {name}: the spec must be a mapping at the top level")
    try:
        spec = model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{kind} {name}: {format_validation_error(err, model, 'spec')}") from None
    if spec.name is not None and spec.name != name:
        raise ConfigError(f"{kind} {name}: name: {spec.name!r} differs from the file name {name}.yaml")
    spec.name = name
    return spec


def list_ablations() -> list[str]:
    """Names of the ablation specs (``ablations/*.yaml``, studies excluded), sorted."""
    return list_specs(ablations_dir())


def is_study(name: str) -> bool:
    """True if ``name`` is an Optuna study spec (``ablations/studies/NAME.yaml`` exists).

    Raises:
        HarnessError: ``name`` breaks the naming rule (:func:`harness.safety.check_name`).
    """
    from harness.safety import check_name

    check_name("ablation or study", name)
    return (ablations_dir() / "studies" / f"{name}.yaml").is_file()


def spec_path(name: str) -> Path:
    """Path of ablation ``name``'s spec.

    Raises:
        HarnessError: unknown name; the message lists the available ablations (one line).
    """
    return find_spec(ablations_dir(), name, "ablation")


def load_spec(name: str, validate_configs: bool = True) -> AblationSpec:
    """Load and validate ``ablations/NAME.yaml``.

    With ``validate_configs``, the config of every variant at every scale is also resolved and
    validated (seed 0), so a misspelt knob fails here and not in a worker.

    Raises:
        HarnessError: unknown name (lists the available ones).
        ConfigError: not YAML / not a mapping / schema violation / invalid variant config; one line.
    """
    spec = validate_spec(read_spec(spec_path(name), "ablation", name), AblationSpec, "ablation", name)
    if validate_configs:
        for scale in CHECKED_SCALES:
            for variant in spec.variants_for(scale):
                resolve_config(spec, scale, variant, 0)
    return spec


def resolve_config(spec: AblationSpec, scale: str, variant: str, seed: int) -> Config:
    """The validated config of one run (merge order in the module docstring).

    Raises:
        HarnessError: unknown scale.
        ConfigError: the merged config is invalid; the message names ablation, scale and variant.
    """
    preset = scale_overrides(scale)
    data = copy.deepcopy(spec.base)
    data = deep_update(data, copy.deepcopy(preset))
    if scale in spec.scales:
        data = deep_update(data, copy.deepcopy(spec.scales[scale].overrides))  # type: ignore[index]
    data = deep_update(data, copy.deepcopy(spec.variants[variant]))
    data["seed"] = int(seed)
    try:
        return build_config(data)
    except ConfigError as e:
        raise ConfigError(f"ablation {spec.name}: variant {variant!r} at scale {scale}: {e}") from None


def run_hash(cfg: Config) -> str:
    """The identity of a run for resuming and reuse: :meth:`Config.hash` (12 hex digits, without
    machine-local paths). Tagged ``config_hash`` on every child run."""
    return cfg.hash()


def experiment_name(name: str) -> str:
    """The MLflow experiment of ablation ``name``: ``ablation/<name>``."""
    return f"ablation/{name}"


# ------------------------------------------------------------------------------------------------
# Planning
# ------------------------------------------------------------------------------------------------


@dataclass
class RunTask:
    """Everything a worker needs to run one (variant, seed): plain data, picklable."""

    ablation: str
    scale: str
    variant: str
    seed: int
    config: dict[str, Any]
    config_hash: str
    total_iterations: int
    experiment_id: str = ""
    parent_run_id: str = ""
    tracking_uri: str = ""
    out_root: str = ""
    git_sha: str = "unknown"
    attempt: int = 1

    @property
    def key(self) -> str:
        """``variant/s<seed>``: the display and bookkeeping key."""
        return f"{self.variant}/s{self.seed}"


def plan_runs(spec: AblationSpec, scale: str, seeds: Optional[list[int]] = None) -> list[RunTask]:
    """One :class:`RunTask` per (variant run at ``scale``, seed), variants in spec order, seeds ascending; a variant's
    run seeds are the planned seeds plus its ``seed_offset`` (0 unless the spec sets one)."""
    seeds = sorted(set(seeds)) if seeds else spec.seeds_for(scale)
    if any(s < 0 for s in seeds):
        raise HarnessError(f"--seeds: seeds must be ≥ 0, got {seeds}")
    tasks = []
    for variant in spec.variants_for(scale):
        for seed in (s + spec.seed_offset.get(variant, 0) for s in seeds):
            cfg = resolve_config(spec, scale, variant, seed)
            tasks.append(RunTask(ablation=spec.name or "", scale=scale, variant=variant, seed=seed, config=cfg.to_dict(),
                                 config_hash=run_hash(cfg), total_iterations=cfg.ppo.total_iterations))
    return tasks


@dataclass
class ResumeState:
    """What the store already holds for a plan."""

    finished: dict[str, str] = field(default_factory=dict)  # key -> run_id (latest FINISHED, same hash)
    running: dict[str, str] = field(default_factory=dict)  # key -> run_id (RUNNING in a live process)
    marked_stale: list[tuple[str, str]] = field(default_factory=list)


def resume_state(client: Any, exp_id: str, tasks: list[RunTask]) -> ResumeState:
    """Mark runs of killed processes FAILED, then find which planned runs are already FINISHED
    (same ``config_hash``, any earlier invocation) or RUNNING elsewhere."""
    from harness.tracking import iter_children, mark_stale_runs, search_all

    state = ResumeState(marked_stale=mark_stale_runs(client, exp_id))
    want = {(t.variant, str(t.seed), t.config_hash): t.key for t in tasks}
    for run in iter_children(search_all(client, [exp_id])):  # newest first
        tags = run.data.tags
        key = want.get((tags.get("variant"), tags.get("seed"), tags.get("config_hash")))
        if key is None:
            continue
        if run.info.status == "FINISHED":
            state.finished.setdefault(key, run.info.run_id)
        elif run.info.status == "RUNNING":
            state.running.setdefault(key, run.info.run_id)
    for key in state.finished:
        state.running.pop(key, None)
    return state


# ------------------------------------------------------------------------------------------------
# Worker side
# ------------------------------------------------------------------------------------------------

_EVENTS: Any = None  # a multiprocessing queue of progress events, set by _init_worker


def _init_worker(events: Any) -> None:
    """Worker process initializer: one torch thread, no SIGINT (the parent handles Ctrl-C), die
    with the parent (Linux ``PR_SET_PDEATHSIG``), progress events to ``events``."""
    import signal

    global _EVENTS
    _EVENTS = events
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    import torch

    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


def _emit(*event: Any) -> None:
    if _EVENTS is not None:
        with contextlib.suppress(Exception):
            _EVENTS.put(event)


@contextlib.contextmanager
def _output_to(path: Path):
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:500]


def execute_run(task: RunTask) -> dict[str, Any]:
    """Run one (variant, seed) as an MLflow child run; never raises for a failed run.

    Creates the child run (tags ``kind=child``, ``mlflow.parentRunId``, ``ablation``, ``variant``,
    ``seed``, ``scale``, ``config_hash``, ``git_sha``, ``pid``, ``host``), logs the flattened
    resolved config as params and ``config.yaml``, trains with :class:`harness.tracking.MLflowCallback`
    attached (stdout/stderr go to ``run.log``, logged too), and terminates the run FINISHED, or
    FAILED with a ``failure_reason`` tag when training raises (e.g. TrainingDivergedError).

    Returns:
        ``{"key", "variant", "seed", "run_id", "status": "FINISHED"|"FAILED", "reason", "wall_s",
        "final": summary["final"] | None}``.
    """
    from harness.tracking import MLflowCallback, client, fail_run, log_params, owner_tags

    t0 = time.time()
    result: dict[str, Any] = {"key": task.key, "variant": task.variant, "seed": task.seed, "run_id": None,
                              "status": "FAILED", "reason": None, "wall_s": 0.0, "final": None}
    _emit("start", task.key, os.getpid())
    try:
        c = client(task.tracking_uri)
        tags = {
            "kind": "child", "mlflow.parentRunId": task.parent_run_id, "ablation": task.ablation,
            "variant": task.variant, "seed": str(task.seed), "scale": task.scale, "config_hash": task.config_hash,
            "git_sha": task.git_sha, "mlflow.source.git.commit": task.git_sha, "attempt": str(task.attempt),
            **owner_tags(),
        }
        run = c.create_run(task.experiment_id, run_name=f"{task.variant}-s{task.seed}", tags=tags)
    except Exception as e:  # the store is unreachable: nothing was created
        result["reason"] = f"could not create the MLflow run: {_one_line(e)}"
        _emit("end", task.key, "FAILED")
        return result
    run_id = result["run_id"] = run.info.run_id
    _emit("run", task.key, run_id)
    out_dir = Path(task.out_root) / task.variant / f"seed{task.seed}-{run_id[:8]}"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = out_dir / "run.log"
    callback = MLflowCallback(c, run_id)
    try:
        cfg = build_config(task.config)
        log_params(c, run_id, task.config)
        c.log_text(run_id, yaml.safe_dump(task.config, sort_keys=False), "config.yaml")
        with _output_to(log_file):
            try:
                from harness.ppo import train

                summary = train(cfg, out_dir, [callback, ProgressCallback(task.key)], progress=False)
            except BaseException:
                traceback.print_exc()
                raise
        c.log_artifact(run_id, str(log_file))
        c.set_terminated(run_id, "FINISHED")
        result.update(status="FINISHED", final=summary.get("final"))
    except BaseException as e:  # any failure of the run is recorded, and the ablation goes on
        result["reason"] = _one_line(e)
        status = "FAILED" if isinstance(e, Exception) else "KILLED"
        result["status"] = status
        with contextlib.suppress(Exception):
            callback.flush()
        with contextlib.suppress(Exception):
            if log_file.exists():
                c.log_artifact(run_id, str(log_file))
        with contextlib.suppress(Exception):
            fail_run(c, run_id, result["reason"], status=status)
    result["wall_s"] = time.time() - t0
    _emit("end", task.key, result["status"])
    return result


class ProgressCallback(Callback):
    """Report each finished iteration of run ``key`` to the parent's progress display
    (through the worker's event queue; a no-op outside a worker)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        """Emit ``("iter", key, iteration + 1)``."""
        _emit("iter", self.key, iteration + 1)


# ------------------------------------------------------------------------------------------------
# Parent side
# ------------------------------------------------------------------------------------------------


class _Display:
    """One rich progress display: a summary row (runs done / running / failed / queued, and the
    ETA over all iterations still to run) and one row per running (variant, seed)."""

    def __init__(self, name: str, scale: str, tasks: list[RunTask], skipped: int, enabled: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, \
            TimeElapsedColumn, TimeRemainingColumn

        self.name, self.scale, self.skipped = name, scale, skipped
        self.totals = {t.key: t.total_iterations for t in tasks}
        self.iters = {t.key: 0 for t in tasks}
        self.status: dict[str, str] = {}  # key -> final status, once counted
        self.rows: dict[str, Any] = {}  # key -> row of a running run
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("it"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=Console(stderr=True), disable=not enabled, transient=False,
        )
        self.main = self.progress.add_task(self._describe(), total=sum(self.totals.values()))
        # a log file or pipe shows no live display: one plain line per finished run instead
        self.plain = enabled and not self.progress.console.is_terminal
        self.t0 = time.time()

    def _describe(self) -> str:
        from rich.markup import escape

        done = sum(s == "FINISHED" for s in self.status.values())
        failed = len(self.status) - done
        queued = len(self.totals) - len(self.status) - len(self.rows)
        return (f"[bold]{escape(self.name)}[/] ({self.scale}) runs: [green]{done} done[/] · [cyan]{len(self.rows)} running[/] · "
                f"[red]{failed} failed[/] · {queued} queued" + (f" · {self.skipped} already finished" if self.skipped else ""))

    def _refresh(self) -> None:
        completed = sum(self.totals[k] if k in self.status else self.iters[k] for k in self.totals)
        self.progress.update(self.main, completed=completed, description=self._describe())

    def __enter__(self) -> "_Display":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def note(self, message: str) -> None:
        """Print one line above the live display (a failure as it happens)."""
        self.progress.console.print(message)

    def event(self, kind: str, key: str, value: Any) -> None:
        """Apply one worker event: ``start`` (pid), ``run`` (MLflow run id), ``iter`` (iterations
        done), ``end`` (status)."""
        if key not in self.totals or key in self.status:
            return
        if kind == "start":
            from rich.markup import escape

            self.reset(key)
            self.rows[key] = self.progress.add_task(f"  {escape(key)} (pid {value})", total=self.totals[key])
        elif kind == "iter":
            self.iters[key] = max(self.iters[key], int(value))
            if key in self.rows:
                self.progress.update(self.rows[key], completed=self.iters[key])
        elif kind == "end":
            self.finish(key, str(value))
        self._refresh()

    def reset(self, key: str) -> None:
        """Forget a run's progress (its worker died; it will be retried)."""
        row = self.rows.pop(key, None)
        if row is not None:
            self.progress.remove_task(row)
        self.iters[key] = 0
        self._refresh()

    def finish(self, key: str, status: str, reason: Optional[str] = None) -> None:
        """Count a run once as FINISHED or failed (its remaining iterations count as done); a failed
        run gets a console line with its reason at once."""
        if key in self.status or key not in self.totals:
            return
        if status != "FINISHED":
            from rich.markup import escape

            self.note(f"[red]{escape(status)}[/] {escape(key)}" + (f": {escape(reason)}" if reason else ""))
        row = self.rows.pop(key, None)
        if row is not None:
            self.progress.remove_task(row)
        self.status[key] = status
        self._refresh()
        if self.plain and status == "FINISHED":
            self.note(self.plain_line(key))

    def plain_line(self, key: str) -> str:
        """``finished KEY: D/N runs done, elapsed M min, about R min left`` (the rest estimated from
        the iterations run so far)."""
        elapsed = time.time() - self.t0
        done_iters = sum(self.totals[k] if k in self.status else self.iters[k] for k in self.totals)
        left = sum(self.totals.values()) - done_iters
        eta = f", about {elapsed / done_iters * left / 60:.0f} min left" if done_iters and left else ""
        done = sum(s == "FINISHED" for s in self.status.values())
        return f"finished {key}: {done}/{len(self.totals)} runs done, elapsed {elapsed / 60:.1f} min{eta}"


def _build_pipelines(tasks: list[RunTask]) -> None:
    """Build (or find cached) the pipeline stages of every task, in this process, so that workers
    only load them. The stages depend on ``pipeline`` (its own seed, not the run's), the task, the PPO
    temperature (proxy data and best-of-n sample at it) and the evaluation prompts: one build per
    distinct combination."""
    from harness.pipeline import build_pipeline

    seen: set[str] = set()
    for t in tasks:
        key = json.dumps([t.config["pipeline"], t.config["task"], t.config["ppo"]["temperature"], t.config["eval"]],
                         sort_keys=True)
        if key not in seen:
            seen.add(key)
            build_pipeline(build_config(t.config))


def _kill_pool(executor: Any) -> None:
    """Kill the worker processes of a ProcessPoolExecutor (used on Ctrl-C)."""
    procs = list((getattr(executor, "_processes", None) or {}).values())
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=5)
    executor.shutdown(wait=False, cancel_futures=True)


def _run_pool(tasks: list[RunTask], workers: int, display: _Display, max_pool_restarts: int = 2) -> list[dict[str, Any]]:
    """Run ``tasks`` in ``workers`` spawned processes; returns one result dict per finished task.

    If a worker dies (SIGKILL, OOM), the pool breaks and ``concurrent.futures`` stops every other
    worker too. The dead worker is told from its stopped siblings by its exit code (the pool stops
    siblings with SIGTERM), and the runs are told apart by the worker events (``start`` pid, ``run``
    id): the dead worker's run is marked FAILED with the worker's exit code; a sibling's run that was
    stopped with it is marked FAILED as interrupted by the restart, not as killed; each gets a console
    line. Both are retried with ``attempt`` + 1; tasks that had not started are resubmitted with their
    attempt unchanged. At most ``max_pool_restarts`` restarts; then the rest are FAILED.
    """
    import signal
    import multiprocessing as mp
    import queue as queue_mod
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    results: list[dict[str, Any]] = []
    pending = list(tasks)
    restarts = 0

    worker_of: dict[str, int] = {}  # key -> pid of the worker running it
    run_of: dict[str, str] = {}  # key -> MLflow run id of its current attempt

    def drain() -> None:
        while True:
            try:
                kind, key, value = events.get_nowait()
            except (queue_mod.Empty, EOFError, OSError):
                return
            if kind == "start":
                worker_of[key] = int(value)
                run_of.pop(key, None)
            elif kind == "run":
                run_of[key] = str(value)
            elif kind == "end":
                worker_of.pop(key, None)
            display.event(kind, key, value)

    while pending:
        broken: list[RunTask] = []
        executor = ProcessPoolExecutor(max_workers=min(workers, len(pending)), mp_context=ctx,
                                       initializer=_init_worker, initargs=(events,))
        procs: dict[int, Any] = {}  # every worker process of this pool, by pid (kept after the pool breaks)
        try:
            futures = {executor.submit(execute_run, t): t for t in pending}
            remaining = set(futures)
            while remaining:
                procs.update(getattr(executor, "_processes", None) or {})
                done, remaining = wait(remaining, timeout=0.2, return_when=FIRST_COMPLETED)
                drain()
                for f in done:
                    try:
                        res = f.result()
                    except BrokenProcessPool:
                        broken.append(futures[f])
                        continue
                    except Exception as e:  # pickling or other infrastructure failure
                        res = {"key": futures[f].key, "variant": futures[f].variant, "seed": futures[f].seed,
                               "run_id": None, "status": "FAILED", "reason": _one_line(e), "wall_s": 0.0, "final": None}
                    results.append(res)
                    display.finish(res["key"], res["status"], res.get("reason"))
            executor.shutdown(wait=True)
        except BaseException:
            _kill_pool(executor)
            raise
        drain()
        if not broken:
            break
        restarts += 1
        from rich.markup import escape

        from harness.tracking import client, fail_run, mark_stale_runs

        for p in procs.values():
            with contextlib.suppress(Exception):
                p.join(timeout=10)
        codes = {pid: p.exitcode for pid, p in procs.items()}
        dead = {pid for pid, code in codes.items() if code not in (None, 0, -signal.SIGTERM)} or set(codes)
        c = client(tasks[0].tracking_uri)
        give_up = restarts > max_pool_restarts
        for t in broken:
            pid = worker_of.pop(t.key, None)
            if pid is None:
                continue  # had not started: resubmitted as it was
            code = codes.get(pid)
            died = f"exit code {code}" + (f", {signal.Signals(-code).name}" if code and code < 0 and -code in signal.Signals._value2member_map_ else "")
            reason = (f"its worker process died ({died}; out of memory or killed?)" if pid in dead else
                      "interrupted: a sibling worker died and the pool was restarted")
            reason += "; not retried (the pool broke too often)" if give_up else f"; retried (attempt {t.attempt + 1})"
            run_id = run_of.pop(t.key, None)
            if run_id:
                with contextlib.suppress(Exception):
                    fail_run(c, run_id, reason)
            display.note(f"[yellow]FAILED[/] {escape(t.key)}: {escape(reason)}")
            t.attempt += 1
        if give_up:
            for t in broken:
                results.append({"key": t.key, "variant": t.variant, "seed": t.seed, "run_id": None, "status": "FAILED",
                                "reason": "a worker process died (killed?) and the pool broke too often",
                                "wall_s": 0.0, "final": None})
                display.finish(t.key, "FAILED", results[-1]["reason"])
            break
        for t in broken:
            display.reset(t.key)
        mark_stale_runs(c, tasks[0].experiment_id)  # anything else left RUNNING by a dead pid
        pending = broken
    return results


def run_ablation(name: str, scale: str = "default", seeds: Optional[list[int]] = None, workers: int = 2,
                 progress: bool = True, reuse: bool = True, raise_on_failure: bool = False) -> Path:
    """Run every (variant, seed) of ablation ``name`` not yet FINISHED, then write the report.

    Steps: load and validate the spec; create the MLflow store (once, here) and the experiment
    ``ablation/<name>``; mark runs of killed processes FAILED; skip (variant, seed) already
    FINISHED with the same config hash; open a parent run for this invocation; build the
    pipeline stages here; run the rest in ``workers`` spawned processes (1 torch thread each)
    with one progress display; close the parent run; write ``reports/<name>/``.

    Args:
        name: spec name (``ablations/<name>.yaml``).
        scale: ``smoke`` | ``default`` | ``full``.
        seeds: explicit seeds (default: the spec's seeds for ``scale``).
        workers: parallel worker processes (≥ 1).
        progress: show the rich progress display (on stderr).
        reuse: copy in FINISHED runs of other ablations with the same config hash instead of
            training them again (:func:`reuse_finished_runs`).
        raise_on_failure: after the report is written, raise :class:`RunsFailedError` if a run of
            this invocation FAILED (the CLI does, to exit with status 1).
    Returns:
        Path of ``reports/<name>/report.md``.
    Raises:
        HarnessError: unknown ablation or scale, invalid spec (ConfigError), pipeline errors.
        RunsFailedError: only with ``raise_on_failure``. Otherwise a failing *run* never raises: it
            is recorded FAILED with its reason and listed in the report.
    """
    from rich.console import Console

    from harness import tracking
    from harness.report import write_report

    if workers < 1:
        raise HarnessError(f"--workers: must be ≥ 1, got {workers}")
    scale_overrides(scale)
    spec = load_spec(name)
    tasks = plan_runs(spec, scale, seeds)
    console = Console(stderr=True, quiet=not progress)

    uri = tracking.tracking_uri()
    c = tracking.init_store(uri)
    exp_id = tracking.experiment_id(c, experiment_name(name))
    lock = _invocation_lock(tracking.results_root() / "ablations" / name)
    try:
        failed = _invoke(c, uri, exp_id, spec, name, scale, tasks, workers, progress, console, reuse)
    finally:
        lock.release()
    report = write_report(name, scale=scale)
    if failed and raise_on_failure:
        from harness.errors import RunsFailedError

        raise RunsFailedError(f"{len(failed)} of {len(tasks)} runs FAILED ({', '.join(r['key'] for r in failed[:5])}"
                              f"{', …' if len(failed) > 5 else ''}); each is recorded with its reason; report: {report}")
    return report


def reuse_finished_runs(c: Any, exp_id: str, parent_id: str, tasks: list[RunTask]) -> dict[str, tuple[str, str]]:
    """Copy in, as child runs of ``parent_id``, FINISHED runs of *other* ablations whose config hash
    equals a task's (the same resolved config and seed, so the same training; e.g. the default
    config is the baseline of most ablations). The latest such run per hash is copied with
    :func:`harness.tracking.copy_run`, tagged with this ablation, variant and ``copied_from``.

    Returns:
        ``{task key: (source experiment name, source run id)}`` for the tasks now FINISHED here.
    """
    from harness.tracking import copy_run, iter_children, search_all

    by_hash: dict[str, list[RunTask]] = {}
    for t in tasks:
        by_hash.setdefault(t.config_hash, []).append(t)
    others = {e.experiment_id: e.name for e in c.search_experiments()
              if e.name.startswith("ablation/") and e.experiment_id != exp_id}
    if not others:
        return {}
    copied: dict[str, tuple[str, str]] = {}
    runs = iter_children(search_all(c, list(others), "attributes.status = 'FINISHED'"))  # newest first
    for run in runs:
        if run.data.tags.get("copied_from"):
            continue  # copy from the original only
        waiting = by_hash.get(run.data.tags.get("config_hash", ""), [])
        if not waiting or run.data.tags.get("scale") != waiting[0].scale:
            continue
        for t in by_hash.pop(run.data.tags["config_hash"]):
            copy_run(c, run, exp_id, {"mlflow.parentRunId": parent_id, "mlflow.runName": f"{t.variant}-s{t.seed}",
                                      "ablation": t.ablation, "variant": t.variant, "seed": str(t.seed), "scale": t.scale})
            copied[t.key] = (others[run.info.experiment_id], run.info.run_id)
    return copied


def _invoke(c: Any, uri: str, exp_id: str, spec: AblationSpec, name: str, scale: str, tasks: list[RunTask],
            workers: int, progress: bool, console: Any, reuse: bool = True) -> list[dict[str, Any]]:
    """One invocation under the lock: resume bookkeeping, parent run, pipelines, worker pool.
    Returns the results of the runs that FAILED in this invocation."""
    from harness import tracking

    state = resume_state(c, exp_id, tasks)
    for run_id, reason in state.marked_stale:
        console.print(f"[yellow]marked FAILED[/] run {run_id[:8]}: {reason}")
    for key, run_id in state.running.items():
        console.print(f"[yellow]skipping[/] {key}: run {run_id[:8]} is RUNNING in a live process")
    todo = [t for t in tasks if t.key not in state.finished and t.key not in state.running]
    sha = tracking.git_sha()
    parent = c.create_run(exp_id, run_name=f"{name}-{scale}-{time.strftime('%Y%m%d-%H%M%S')}", tags={
        "kind": "parent", "ablation": name, "scale": scale, "seeds": ",".join(str(s) for s in sorted({t.seed for t in tasks})),
        "workers": str(workers), "git_sha": sha, "mlflow.source.git.commit": sha, **tracking.owner_tags(),
    })
    parent_id = parent.info.run_id
    out_root = tracking.results_root() / "ablations" / name / scale
    try:
        c.log_text(parent_id, spec_path(name).read_text(), "spec.yaml")
        tracking.log_metric_dict(c, parent_id, {"runs/planned": len(tasks), "runs/skipped": len(tasks) - len(todo)})
        results: list[dict[str, Any]] = []
        if reuse and todo:
            copied = reuse_finished_runs(c, exp_id, parent_id, todo)
            for t in todo:
                if t.key in copied:
                    console.print(f"[green]reused[/] {t.key}: run {copied[t.key][1][:8]} of {copied[t.key][0]} "
                                  "(same config hash), copied in")
            todo = [t for t in todo if t.key not in copied]
            tracking.log_metric_dict(c, parent_id, {"runs/reused": len(copied)})
        if todo:
            _build_pipelines(todo)
            for t in todo:
                t.experiment_id, t.parent_run_id, t.tracking_uri = exp_id, parent_id, uri
                t.out_root, t.git_sha = str(out_root), sha
            display = _Display(name, scale, todo, skipped=len(tasks) - len(todo), enabled=progress)
            with display:
                results = _run_pool(todo, workers, display)
        failed = [r for r in results if r["status"] != "FINISHED"]
        for r in failed:
            console.print(f"[red]FAILED[/] {r['key']} (run {str(r['run_id'])[:8]}): {r['reason']}")
        tracking.log_metric_dict(c, parent_id, {"runs/finished": len(results) - len(failed), "runs/failed": len(failed)})
        c.set_terminated(parent_id, "FINISHED")
        return failed
    except KeyboardInterrupt:
        tracking.fail_run(c, parent_id, "interrupted (Ctrl-C)", status="KILLED")
        tracking.mark_stale_runs(c, exp_id)
        raise
    except BaseException as e:
        tracking.fail_run(c, parent_id, _one_line(e))
        raise


def _invocation_lock(directory: Path) -> Any:
    """Hold an exclusive ``filelock.FileLock`` on ``directory/.invocation.lock`` (call ``release()`` on
    the returned lock; the OS drops it when the process dies), so two invocations of one ablation on this
    machine cannot both start the same (variant, seed). The holder's pid is kept in ``.invocation.pid``.

    Raises:
        HarnessError: another live process holds the lock (its pid is named).
    """
    from filelock import FileLock, Timeout

    directory.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(directory / ".invocation.lock"), timeout=0)
    pid_file = directory / ".invocation.pid"
    try:
        lock.acquire()
    except Timeout:
        holder = pid_file.read_text().strip() if pid_file.is_file() else "?"
        raise HarnessError(f"ablation {directory.name!r} is already running in process {holder} on this machine; "
                           "wait for it or stop it first") from None
    pid_file.write_text(str(os.getpid()))
    return lock


__all__ = [
    "AblationSpec", "Claim", "MetricSpec", "ScaleSpec", "VerdictRule", "RunTask", "ablations_dir", "list_ablations",
    "is_study", "load_spec", "resolve_config", "plan_runs", "run_hash", "experiment_name", "execute_run",
    "run_ablation", "resume_state",
]
