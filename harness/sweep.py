"""Optuna sweeps as data: ``ablations/studies/NAME.yaml`` → one shared study → worker processes → MLflow → report.

A study spec (:class:`StudySpec`; ``ablations/studies/ppo_core.yaml`` is a complete example) names a
base config, a search space over PPO's core coefficients (ε ``cliprange``, GAE λ ``lam``, β
``kl_coef``, optionally ``lr``), the objective (final gold ↑, final proxy score ↑, or the Pareto front
of gold ↑ and KL ↓), the sampler (TPE, grid, random), the pruner (median of the intermediate proxy
score, single-objective only), the trial cap, the seeds per trial and per-scale settings. It is
validated before any compute: a bound out of the allowed range, reversed bounds or an unknown
parameter is one :class:`~harness.config.ConfigError` line.

Config of one trial (later wins)::

    Config defaults ← spec.base ← SCALE_PRESETS[scale] ← spec.scales[scale].overrides
                    ← sampled parameters (ppo.cliprange, ppo.lam, ppo.kl_coef, ppo.lr) ← {"seed": s}

Storage (:func:`storage_url`): the Optuna study ``NAME@SCALE`` lives in
``JournalStorage(JournalFileBackend(<results>/optuna/NAME.log))`` (one file per spec, one study per
scale in it), or, for several machines, in the RDB named by ``$HARNESS_OPTUNA_STORAGE`` (e.g.
``postgresql+psycopg2://user:pw@host/db``; RDBStorage with heartbeats).

:func:`run_sweep` (``make sweep``):

1. validates the spec, opens (or creates) the study, creates the MLflow store and the experiment
   ``study:NAME`` in this process;
2. finds trials left RUNNING by killed workers (owner pid dead, :func:`recover_stale_trials`),
   marks them FAIL (and their MLflow runs FAILED) and enqueues a retry with the same parameters;
3. builds the pipeline stages here, opens a parent MLflow run, starts ``workers`` spawned processes
   (one torch thread each) that share the study. Each worker loops: under a file lock, count the
   trials that are COMPLETE, PRUNED or RUNNING (Optuna's ``MaxTrialsCallback`` states) and create
   the next trial only while that count is below the cap — so the cap is met exactly, across
   workers and across invocations (running the command again resumes);
4. every trial is one MLflow child run (tags ``trial_number``, ``state``, ``worker_pid``; params;
   metrics ``value`` and the PPO curves); the proxy score is reported to Optuna every iteration
   (:class:`PruningCallback`) and a poor trial is pruned;
5. a worker that dies (SIGKILL, OOM) is noticed: its trial is failed and retried, the worker is
   replaced; a rich display shows trials done and the best value;
6. writes the report (:func:`write_study_report`): Optuna plots, the best config, and a
   re-evaluation of the best config against the default on fresh seeds.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, Union
from unittest import mock

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.callbacks import Callback
from harness.config import Config, ConfigError, build_config, deep_update, default_reports_dir, fingerprint, flatten, format_validation_error
from harness.errors import HarnessError
from harness.presets import CHECKED_SCALES, SCALE_PRESETS, scale_overrides

if TYPE_CHECKING:  # optuna and mlflow take seconds to import; only pay for them where used
    import optuna
    from mlflow import MlflowClient

#: Environment variable naming a shared storage (an RDB URL such as PostgreSQL, or a journal file).
STORAGE_ENV = "HARNESS_OPTUNA_STORAGE"


@dataclass(frozen=True)
class ParamDef:
    """A searchable parameter: its config path, the allowed range and whether it is sampled on a
    log scale by default."""

    path: str
    low: float
    high: float
    log: bool
    doc: str


#: The parameters a study may search, with the range a spec's bounds must lie in.
SEARCHABLE: dict[str, ParamDef] = {
    "cliprange": ParamDef("ppo.cliprange", 0.05, 0.4, False, "policy ratio clip ε (Schulman et al. 2017, eq. 7)"),
    "lam": ParamDef("ppo.lam", 0.8, 1.0, False, "GAE λ (Schulman et al. 2016)"),
    "kl_coef": ParamDef("ppo.kl_coef", 1e-3, 0.5, True, "KL penalty β to the reference (Ziegler et al. 2019)"),
    "lr": ParamDef("ppo.lr", 1e-6, 1e-2, True, "Adam learning rate of policy and critic"),
}

#: Objectives: the run-summary metric(s) each one optimizes, and the direction(s).
OBJECTIVES: dict[str, tuple[tuple[str, str], ...]] = {
    "gold": (("eval_final/gold", "maximize"),),
    "score": (("eval_final/proxy", "maximize"),),
    "gold_kl": (("eval_final/gold", "maximize"), ("eval_final/kl", "minimize")),
}

#: Trial states counted towards the global cap (as ``MaxTrialsCallback(N, states=...)``).
CAP_STATES_NAMES = ("COMPLETE", "PRUNED", "RUNNING")
#: A RUNNING trial with no owner recorded after this many seconds is considered orphaned.
ORPHAN_AFTER_S = 60.0
#: How many times a trial whose worker died is retried (attempts in all).
MAX_ATTEMPTS = 3
_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


# ------------------------------------------------------------------------------------------------
# Spec schema
# ------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParamSpec(_Strict):
    """Bounds of one searched parameter: ``low < high``, inside the allowed range of
    :data:`SEARCHABLE`; ``log`` defaults to the parameter's own (True for ``kl_coef`` and ``lr``).
    ``grid``: explicit values for the grid sampler (default: ``sampler.grid_points`` evenly spaced,
    geometrically when ``log``)."""

    low: float
    high: float
    log: Optional[bool] = None
    grid: Optional[list[float]] = None


class SamplerSpec(_Strict):
    """``tpe`` (Optuna's TPESampler: multivariate, constant liar), ``grid`` or ``random``.
    ``seed`` makes each worker's proposals reproducible given the trials it sees."""

    type: Literal["tpe", "grid", "random"] = "tpe"
    seed: int = Field(0, ge=0)
    n_startup_trials: int = Field(4, ge=0)  # TPE: random trials before the model is used
    grid_points: int = Field(3, ge=2, le=50)  # grid: values per parameter when none are given


class PrunerSpec(_Strict):
    """``median``: Optuna's MedianPruner on the proxy score reported each iteration; a trial is
    pruned when its score at a step is below the median of earlier trials' scores at that step.
    Steps before ``ceil(warmup_fraction × steps per trial)`` are never pruned."""

    type: Literal["median", "none"] = "median"
    n_startup_trials: int = Field(3, ge=0)
    warmup_fraction: float = Field(0.3, ge=0.0, lt=1.0)
    interval_steps: int = Field(1, ge=1)


class StudyScaleSpec(_Strict):
    """Per-scale settings: trial cap, seeds per trial and nested config overrides merged over
    ``SCALE_PRESETS[scale]``."""

    trials: Optional[int] = Field(None, ge=1)
    seeds_per_trial: Optional[int] = Field(None, ge=1)
    overrides: dict[str, Any] = Field(default_factory=dict)


class ReevaluationSpec(_Strict):
    """The best config against the default one on fresh seeds. ``seeds``: a count N (seeds
    ``first_seed .. first_seed+N-1``) or a list; at least 5 and disjoint from the sweep's seeds."""

    seeds: Union[int, list[int]] = 5
    first_seed: int = Field(1000, ge=0)

    def seed_list(self) -> list[int]:
        """The re-evaluation seeds."""
        return list(range(self.first_seed, self.first_seed + self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)


class StudySpec(_Strict):
    """One Optuna study, as written in ``ablations/studies/NAME.yaml``.

    Raises (through :func:`load_study_spec`): :class:`~harness.config.ConfigError`, one line, for
    unknown keys or parameters, bounds reversed or outside the allowed range, a pruner on a
    multi-objective study, too few or overlapping re-evaluation seeds, or a config that fails
    validation.
    """

    name: Optional[str] = Field(None, pattern=_NAME_RE)
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    search_space: dict[str, ParamSpec] = Field(min_length=1)
    objective: Literal["gold", "score", "gold_kl"] = "gold"
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    pruner: Optional[PrunerSpec] = None
    trials: int = Field(20, ge=1)
    seeds_per_trial: int = Field(1, ge=1)
    max_failed_trials: Optional[int] = Field(None, ge=1)
    scales: dict[Literal["smoke", "default", "full"], StudyScaleSpec] = Field(default_factory=dict)
    reevaluation: ReevaluationSpec = Field(default_factory=ReevaluationSpec)

    @field_validator("search_space", mode="before")
    @classmethod
    def _known_params(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for k in v:
                if k not in SEARCHABLE:
                    close = difflib.get_close_matches(str(k), list(SEARCHABLE), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(f"unknown parameter {k!r}{hint}; searchable: {', '.join(SEARCHABLE)}")
        return v

    @model_validator(mode="after")
    def _check(self) -> "StudySpec":
        for k, p in self.search_space.items():
            d = SEARCHABLE[k]
            if not p.low < p.high:
                raise ValueError(f"search_space.{k}: low ({p.low:g}) must be < high ({p.high:g})")
            if p.low < d.low or p.high > d.high:
                raise ValueError(f"search_space.{k}: bounds [{p.low:g}, {p.high:g}] are outside the allowed range "
                                 f"[{d.low:g}, {d.high:g}] of {d.path}")
            if p.grid is not None and (not p.grid or any(not p.low <= g <= p.high for g in p.grid)):
                raise ValueError(f"search_space.{k}.grid: values must lie in [{p.low:g}, {p.high:g}] (got {p.grid})")
        multi = len(OBJECTIVES[self.objective]) > 1
        if self.pruner is None:
            self.pruner = PrunerSpec(type="none" if multi else "median")
        elif multi and self.pruner.type != "none":
            raise ValueError(f"pruner: {self.pruner.type!r} cannot prune a multi-objective study (objective {self.objective}); "
                             "use pruner: {type: none}")
        for where, ov in [("base", self.base)] + [(f"scales.{k}.overrides", s.overrides) for k, s in self.scales.items()]:
            if "seed" in ov:
                raise ValueError(f"{where}: 'seed' is set per trial (seeds_per_trial), not by overrides")
        rs = self.reevaluation.seed_list()
        if len(rs) < 5 or len(set(rs)) != len(rs) or min(rs) < 0:
            raise ValueError(f"reevaluation.seeds: need at least 5 distinct seeds ≥ 0 (got {rs})")
        sweep_seeds = set(range(max([self.seeds_per_trial] + [s.seeds_per_trial or 0 for s in self.scales.values()])))
        if sweep_seeds & set(rs):
            raise ValueError(f"reevaluation.seeds: {sorted(sweep_seeds & set(rs))} are used by the sweep "
                             f"(seeds 0..{max(sweep_seeds)}); re-evaluation needs fresh seeds")
        return self

    # ---- per-scale settings ---------------------------------------------------------------------
    def trials_for(self, scale: str) -> int:
        """Trial cap at ``scale`` (the scale's own, else ``trials``)."""
        s = self.scales.get(scale)  # type: ignore[call-overload]
        return s.trials if s is not None and s.trials is not None else self.trials

    def seeds_for(self, scale: str) -> list[int]:
        """Seeds each trial runs at ``scale``: ``0 .. seeds_per_trial-1``."""
        s = self.scales.get(scale)  # type: ignore[call-overload]
        n = s.seeds_per_trial if s is not None and s.seeds_per_trial is not None else self.seeds_per_trial
        return list(range(n))

    @property
    def multi_objective(self) -> bool:
        """True for ``gold_kl`` (Pareto front of gold ↑ and KL ↓)."""
        return len(OBJECTIVES[self.objective]) > 1

    @property
    def directions(self) -> list[str]:
        """Optuna directions of the objective(s)."""
        return [d for _, d in OBJECTIVES[self.objective]]

    @property
    def objective_metrics(self) -> list[str]:
        """Run-summary metrics of the objective(s) (``final/gold`` ...)."""
        return [m for m, _ in OBJECTIVES[self.objective]]

    def param_log(self, name: str) -> bool:
        """Whether ``name`` is sampled log-uniformly."""
        p = self.search_space[name]
        return SEARCHABLE[name].log if p.log is None else p.log


# ------------------------------------------------------------------------------------------------
# Spec files
# ------------------------------------------------------------------------------------------------


def studies_dir() -> Path:
    """Where study specs live: ``<ablations>/studies`` (see :func:`harness.ablate.ablations_dir`)."""
    from harness.ablate import ablations_dir

    return ablations_dir() / "studies"


def list_studies() -> list[str]:
    """Names of the study specs, sorted."""
    from harness.ablate import list_specs

    return list_specs(studies_dir())


def study_spec_path(name: str) -> Path:
    """Path of study ``name``'s spec.

    Raises:
        HarnessError: unknown name; the message lists the available studies (one line).
    """
    from harness.ablate import find_spec

    return find_spec(studies_dir(), name, "study")


def parse_study_spec(data: Any, name: str) -> StudySpec:
    """Validate a study spec given as data and check every scale's config at the corners of the
    search space (so a bad knob fails here, before any compute).

    Raises:
        ConfigError: one line starting ``study NAME:``.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"study {name}: the spec must be a mapping at the top level")
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"study {name}: {format_validation_error(err, StudySpec, 'spec')}") from None
    if spec.name is not None and spec.name != name:
        raise ConfigError(f"study {name}: name: {spec.name!r} differs from the file name {name}.yaml")
    spec.name = name
    for scale in CHECKED_SCALES:
        for corner in ("low", "high"):
            params = {k: getattr(p, corner) for k, p in spec.search_space.items()}
            resolve_trial_config(spec, scale, params, 0)
    return spec


def load_study_spec(name: str) -> StudySpec:
    """Load and validate ``ablations/studies/NAME.yaml`` (:func:`parse_study_spec`).

    Raises:
        HarnessError: unknown study (lists the available ones).
        ConfigError: not YAML, not a mapping, or invalid; one line.
    """
    from harness.safety import one_line, read_small_text

    p = study_spec_path(name)
    try:
        data = yaml.safe_load(read_small_text(p, "spec"))
    except yaml.YAMLError as e:
        raise ConfigError(f"study {name}: {p.name} is not valid YAML ({one_line(e, 200)})") from None
    return parse_study_spec(data, name)


def _set_path(d: dict[str, Any], dotted: str, value: Any) -> None:
    node = d
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def resolve_trial_config(spec: StudySpec, scale: str, params: Optional[dict[str, float]], seed: int) -> Config:
    """The validated config of one trial seed (merge order in the module docstring). With
    ``params=None`` it is the *default* config: the searched knobs keep their base values.

    Raises:
        HarnessError: unknown scale.
        ConfigError: the merged config is invalid; the message names the study and scale.
    """
    data = copy.deepcopy(spec.base)
    data = deep_update(data, copy.deepcopy(scale_overrides(scale)))
    if scale in spec.scales:
        data = deep_update(data, copy.deepcopy(spec.scales[scale].overrides))  # type: ignore[index]
    for k, v in (params or {}).items():
        _set_path(data, SEARCHABLE[k].path, float(v))
    data["seed"] = int(seed)
    try:
        return build_config(data)
    except ConfigError as e:
        raise ConfigError(f"study {spec.name}: scale {scale}: {e}") from None


def spec_fingerprint(spec: StudySpec, scale: str) -> str:
    """12-hex-digit hash of what gives a trial's value its meaning at ``scale``: base config,
    scale overrides, search space, objective and seeds (not the cap, sampler or pruner). A study
    created from a different fingerprint is not resumed."""
    s = spec.scales.get(scale)  # type: ignore[call-overload]
    d = {
        "base": spec.base, "overrides": s.overrides if s is not None else {}, "objective": spec.objective,
        "seeds": spec.seeds_for(scale), "preset": SCALE_PRESETS[scale],
        "space": {k: [p.low, p.high, spec.param_log(k)] for k, p in sorted(spec.search_space.items())},
    }
    return fingerprint(d)


def study_name(name: str, scale: str) -> str:
    """The Optuna study of spec ``name`` at ``scale``: ``NAME@SCALE``."""
    return f"{name}@{scale}"


def experiment_name(name: str) -> str:
    """The MLflow experiment of study ``name``: ``study:NAME``."""
    return f"study:{name}"


# ------------------------------------------------------------------------------------------------
# Storage
# ------------------------------------------------------------------------------------------------


def optuna_dir() -> Path:
    """``<results>/optuna`` (absolute; honours ``$HARNESS_RESULTS``)."""
    from harness.tracking import results_root

    return results_root() / "optuna"


def storage_url(name: Optional[str] = None) -> str:
    """Where the Optuna studies live, as ``optuna-dashboard`` and :func:`make_storage` take it.

    ``$HARNESS_OPTUNA_STORAGE`` if set (an RDB URL such as ``postgresql+psycopg2://u:p@host/db``
    for several machines, or a journal file path); else the journal file
    ``<results>/optuna/NAME.log``. Without ``name``: the most recently written journal file.

    Raises:
        HarnessError: no ``name`` and no journal file exists yet.
    """
    env = os.environ.get(STORAGE_ENV)
    if env:
        return env
    d = optuna_dir()
    if name is not None:
        return str(d / f"{name}.log")
    logs = sorted(d.glob("*.log"), key=lambda p: p.stat().st_mtime) if d.is_dir() else []
    if not logs:
        raise HarnessError(f"no sweep storage in {d} yet; run `make sweep NAME=...` first (or set {STORAGE_ENV})")
    return str(logs[-1])


def _is_rdb(url: str) -> bool:
    return "://" in url


def redacted_storage_url(name: Optional[str] = None) -> str:
    """:func:`storage_url` with any password replaced by ``***`` (for tags, reports, logs;
    :func:`harness.safety.redact`)."""
    from harness.safety import redact

    return redact(storage_url(name))


def make_storage(name: str) -> "optuna.storages.BaseStorage":
    """Open the storage of study spec ``name`` (:func:`storage_url`).

    Journal file (default): ``JournalStorage(JournalFileBackend(path))``; a killed worker leaves
    its trial RUNNING, found later by :func:`recover_stale_trials`. RDB URL: ``RDBStorage`` with a
    60 s heartbeat (grace 180 s) whose stale trials are failed and retried with the same parameters
    (:func:`retry_failed_trial`), for workers on other machines.

    Raises:
        HarnessError: the RDB cannot be opened (one line).
    """
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend

    url = storage_url(name)
    if _is_rdb(url):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # heartbeat_interval is marked experimental
                return RDBStorage(url, heartbeat_interval=60, grace_period=180, heartbeat_stale_trial_callback=_heartbeat_stale,
                                  engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None)
        except Exception as e:  # driver missing, host unreachable, bad URL
            raise HarnessError(f"{STORAGE_ENV}={redacted_storage_url(name)}: cannot open the Optuna storage ({' '.join(str(e).split())[:300]})") from None
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(url))


def _file_lock(path: str) -> Any:
    """An exclusive ``filelock.FileLock`` on ``path`` (its directory created), used as a context manager."""
    from filelock import FileLock

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)


def _cap_states() -> tuple[Any, ...]:
    from optuna.trial import TrialState

    return tuple(TrialState[s] for s in CAP_STATES_NAMES)


def count_capped(study: "optuna.Study") -> int:
    """Trials counted towards the cap: COMPLETE, PRUNED or RUNNING (WAITING and FAIL are not)."""
    return len(study.get_trials(deepcopy=False, states=_cap_states()))


def open_study(spec: StudySpec, scale: str, storage: Any = None, sampler: Any = None, pruner: Any = None,
               create: bool = True) -> "optuna.Study":
    """Load (or create, with the spec's directions) the study ``NAME@SCALE``.

    Raises:
        HarnessError: the stored study was created from another spec (search space, objective,
        base or seeds changed: :func:`spec_fingerprint`), or does not exist and not ``create``.
    """
    import optuna

    sname = study_name(spec.name or "", scale)
    url = storage_url(spec.name)
    if storage is None and not create and not _is_rdb(url) and not Path(url).is_file():
        raise HarnessError(f"no study {sname!r}: {url} does not exist; run `make sweep NAME={spec.name} SCALE={scale}` first")
    storage = storage if storage is not None else make_storage(spec.name or "")
    fp = spec_fingerprint(spec, scale)
    try:
        study = optuna.load_study(study_name=sname, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        if not create:
            raise HarnessError(f"no study {sname!r} in {redacted_storage_url(spec.name)}; run `make sweep NAME={spec.name} SCALE={scale}` first") from None
        study = optuna.create_study(study_name=sname, storage=storage, directions=spec.directions, sampler=sampler,
                                    pruner=pruner, load_if_exists=True)
        if "spec_fingerprint" not in study.user_attrs:
            study.set_user_attr("spec_fingerprint", fp)
            study.set_user_attr("scale", scale)
            study.set_user_attr("objective", spec.objective)
            study.set_user_attr("objective_metrics", spec.objective_metrics)
    stored = study.user_attrs.get("spec_fingerprint")
    if stored is not None and stored != fp:
        raise HarnessError(f"study {sname!r} in {redacted_storage_url(spec.name)} was created from a different spec "
                           f"(fingerprint {stored} ≠ {fp}: base, scale preset or overrides, search space, objective or seeds changed); "
                           f"delete that study or give the spec a new name")
    return study


def make_sampler(spec: StudySpec, seed: int) -> "optuna.samplers.BaseSampler":
    """The spec's sampler seeded with ``seed``: TPE (multivariate, constant liar: Optuna 5
    defaults; ``n_startup_trials`` random trials first), grid (the product of each parameter's
    grid values) or random."""
    import optuna

    s = spec.sampler
    if s.type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.type == "grid":
        return optuna.samplers.GridSampler(grid_values(spec), seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=s.n_startup_trials, constant_liar=True)


def grid_values(spec: StudySpec) -> dict[str, list[float]]:
    """Grid-sampler values per parameter: the spec's ``grid`` or ``grid_points`` evenly spaced
    values from low to high (geometric spacing for log parameters)."""
    import numpy as np

    out = {}
    for k, p in spec.search_space.items():
        if p.grid is not None:
            out[k] = [float(v) for v in p.grid]
        elif spec.param_log(k):
            out[k] = [float(v) for v in np.geomspace(p.low, p.high, spec.sampler.grid_points)]
        else:
            out[k] = [float(v) for v in np.linspace(p.low, p.high, spec.sampler.grid_points)]
    return out


def effective_cap(spec: StudySpec, scale: str, trials: Optional[int]) -> int:
    """The global trial cap: ``trials`` or the spec's, at most the grid size for a grid sampler."""
    cap = trials if trials is not None else spec.trials_for(scale)
    if spec.sampler.type == "grid":
        cap = min(cap, math.prod(len(v) for v in grid_values(spec).values()))
    return cap


def make_pruner(spec: StudySpec, steps_per_trial: int) -> "optuna.pruners.BasePruner":
    """MedianPruner (warm-up ``ceil(warmup_fraction × steps_per_trial)`` steps) or NopPruner.
    Optuna's MedianPruner prunes when the trial's *best* reported score so far is worse than the
    median of the completed trials' scores at the same step."""
    import optuna

    p = spec.pruner
    if p is None or p.type == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials,
                                       n_warmup_steps=math.ceil(p.warmup_fraction * steps_per_trial),
                                       interval_steps=p.interval_steps)


# ------------------------------------------------------------------------------------------------
# Stale trials
# ------------------------------------------------------------------------------------------------


def trial_stale_reason(trial: Any, this_host: Optional[str] = None, now: Optional[float] = None,
                       only_pids: Optional[set[int]] = None) -> Optional[str]:
    """Why a RUNNING trial is dead, or None if it may be alive.

    A trial records its owner in user attrs ``worker_pid``, ``host`` and ``started_ms`` (epoch
    ms). On this host the owner's liveness decides (:func:`harness.tracking.process_alive`, which
    also rejects a reused pid). A trial without an owner after :data:`ORPHAN_AFTER_S` seconds is
    orphaned (its worker died between creating it and recording itself). Trials of other hosts
    are left to the RDB heartbeat. ``only_pids`` restricts the check to those owners.
    """
    from harness.tracking import host, process_alive

    this_host = this_host or host()
    now = time.time() if now is None else now
    attrs = trial.user_attrs
    pid = attrs.get("worker_pid")
    if pid is None:
        started = trial.datetime_start.timestamp() if trial.datetime_start is not None else now
        if now - started > ORPHAN_AFTER_S:
            return f"no worker recorded {now - started:.0f} s after the trial started (its worker died?)"
        return None
    if only_pids is not None and int(pid) not in only_pids:
        return None
    if attrs.get("host") != this_host:
        return None
    if process_alive(int(pid), attrs.get("started_ms")):
        return None
    return "its worker process died (killed?) while the trial was RUNNING (pid and host are in the trial's attributes)"


def retry_failed_trial(study: "optuna.Study", trial: Any) -> None:
    """Enqueue a retry of failed ``trial`` with the same parameters (user attrs ``retry_of`` and
    ``attempt``), unless it already had :data:`MAX_ATTEMPTS` attempts."""
    attempt = int(trial.user_attrs.get("attempt", 1))
    if attempt >= MAX_ATTEMPTS or not trial.params:
        return
    study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number, "attempt": attempt + 1},
                        skip_if_exists=False)


def _heartbeat_stale(study: "optuna.Study", trial: Any) -> None:
    """RDB heartbeat callback: a trial whose worker (on any machine) stopped beating was failed by
    Optuna; retry it and mark its MLflow run FAILED (tracking URI from this process's env)."""
    retry_failed_trial(study, trial)
    run_id = trial.user_attrs.get("mlflow_run_id")
    if run_id:
        with contextlib.suppress(Exception):
            from harness import tracking

            c = tracking.client()
            c.set_tag(run_id, "state", "failed")
            tracking.fail_run(c, run_id, "no heartbeat from its worker (killed?; pid and host are in the trial's "
                                         "attributes); retried")


def recover_stale_trials(study: "optuna.Study", c: Optional["MlflowClient"] = None, experiment_id: Optional[str] = None,
                         parent_run_id: Optional[str] = None, only_pids: Optional[set[int]] = None,
                         scale: str = "") -> list[tuple[int, str]]:
    """Fail the RUNNING trials whose worker is dead (:func:`trial_stale_reason`) and retry them.

    For each: user attr ``fail_reason`` set, state FAIL, a retry enqueued
    (:func:`retry_failed_trial`); its MLflow run (user attr ``mlflow_run_id``) marked FAILED with
    tag ``state=failed``, or, if the worker died before creating one, a FAILED child run created
    (under ``parent_run_id``) so that every trial has exactly one run.
    Returns ``[(trial number, reason), ...]``.
    """
    from optuna.trial import TrialState

    from harness import tracking

    storage = study._storage  # the public Study API cannot end another process's trial
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        reason = trial_stale_reason(t, only_pids=only_pids)
        if reason is None:
            continue
        with contextlib.suppress(Exception):
            storage.set_trial_user_attr(t._trial_id, "fail_reason", reason)
        try:
            if not storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                continue
        except Exception:  # finished meanwhile
            continue
        retry_failed_trial(study, t)
        out.append((t.number, reason))
        if c is None:
            continue
        run_id = t.user_attrs.get("mlflow_run_id")
        try:
            if run_id is None:
                if experiment_id is None:
                    continue
                tags = _trial_tags(study.study_name.split("@")[0], scale, t.number, t.user_attrs, parent_run_id)
                run_id = c.create_run(experiment_id, run_name=f"trial-{t.number:04d}", tags=tags).info.run_id
                tracking.log_params(c, run_id, dict(t.params))
            c.set_tag(run_id, "state", "failed")
            tracking.fail_run(c, run_id, reason)  # also a run FINISHED just before the worker died
        except Exception:  # the store is unreachable: the trial is failed all the same
            pass
    return out


def _trial_tags(name: str, scale: str, number: int, attrs: dict[str, Any], parent_run_id: Optional[str]) -> dict[str, str]:
    tags = {"kind": "child", "role": "trial", "study": name, "scale": scale, "trial_number": str(number),
            "attempt": str(attrs.get("attempt", 1)), "state": "running", "optuna.storage": redacted_storage_url(name)}
    if attrs.get("retry_of") is not None:
        tags["retry_of"] = str(attrs["retry_of"])
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    return tags


# ------------------------------------------------------------------------------------------------
# Callbacks
# ------------------------------------------------------------------------------------------------


class PruningCallback(Callback):
    """Report the proxy score ``objective/score`` of every iteration to an Optuna trial and prune.

    ``trial.report(score, step)`` with ``step = offset + iteration`` (seeds of a trial run one
    after another, so step ``k·T + t`` is seed ``k``'s iteration ``t``); then if
    ``trial.should_prune()`` raise ``optuna.TrialPruned`` — the PPO loop propagates exceptions
    from callbacks, so the run stops there (Optuna's pruning protocol; Akiba et al. 2019).
    A non-finite score is not reported.
    """

    def __init__(self, trial: "optuna.Trial", offset: int = 0, metric: str = "objective/score") -> None:
        self.trial, self.offset, self.metric = trial, int(offset), metric
        self.last_step: Optional[int] = None
        self.last_value: Optional[float] = None

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        """Report, then raise ``optuna.TrialPruned`` if the pruner says so."""
        import optuna

        v = metrics.get(self.metric)
        if v is None or not math.isfinite(float(v)):
            return
        step = self.offset + int(iteration)
        self.trial.report(float(v), step)
        self.last_step, self.last_value = step, float(v)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} ({self.metric} = {float(v):.4g})")


class _Offset(Callback):
    """Forward ``on_start``, ``on_metrics`` and ``on_samples`` to ``inner`` with iterations
    shifted by ``offset`` (one trial's seeds share one MLflow run)."""

    def __init__(self, inner: Callback, offset: int) -> None:
        self.inner, self.offset = inner, int(offset)

    def on_start(self, cfg: Any, info: dict[str, Any]) -> None:
        self.inner.on_start(cfg, info)

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        self.inner.on_metrics(self.offset + iteration, metrics)

    def on_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        self.inner.on_samples(self.offset + iteration, samples)


# ------------------------------------------------------------------------------------------------
# Worker side
# ------------------------------------------------------------------------------------------------


@dataclass
class SweepJob:
    """Everything a worker needs: plain data, picklable."""

    name: str
    scale: str
    spec: dict[str, Any]
    cap: int
    max_failed: int
    lock_path: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    out_root: str
    git_sha: str
    sampler_seed: int
    report_mlflow_samples: bool = True


class _OverCap(Exception):
    """This trial was created beyond the global cap by a process on another machine."""


def _spec_from(job: SweepJob) -> StudySpec:
    spec = StudySpec.model_validate(job.spec)
    spec.name = job.name
    return spec


def _should_stop(study: "optuna.Study", job: SweepJob) -> Optional[str]:
    from optuna.trial import TrialState

    if count_capped(study) >= job.cap:
        return "cap reached"
    if len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,))) >= job.max_failed:
        return f"{job.max_failed} failed trials"
    return None


def sweep_worker(job: SweepJob, index: int, events: Any = None, init: bool = True) -> None:
    """Worker process entry: one torch thread; loop over trials of the shared study until the cap.

    Each iteration takes the study's file lock, stops if COMPLETE+PRUNED+RUNNING ≥ cap (or too
    many trials failed), else creates the next trial with ``study.optimize(n_trials=1)`` — the
    objective releases the lock as soon as the trial exists — and runs it. ``init``: set up the
    process as a worker (:func:`harness.ablate._init_worker`: 1 torch thread, no SIGINT, dies with
    its parent); False when the loop runs inside the calling process.
    """
    import optuna

    from harness.ablate import _init_worker

    if init:
        _init_worker(events)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    spec = _spec_from(job)
    steps = len(spec.seeds_for(job.scale)) * resolve_trial_config(spec, job.scale, None, 0).ppo.total_iterations
    study = open_study(spec, job.scale, sampler=make_sampler(spec, job.sampler_seed), pruner=make_pruner(spec, steps))
    from harness.tracking import client

    c = client(job.tracking_uri)
    while True:
        lock = _file_lock(job.lock_path)
        t_lock = time.perf_counter()
        lock.acquire()
        lock_wait = time.perf_counter() - t_lock
        held = [True]

        def release() -> None:
            if held[0]:
                held[0] = False
                lock.release()

        try:
            if _should_stop(study, job):
                break
            study.optimize(lambda t: _objective(t, job, spec, c, study, index, release, lock_wait), n_trials=1,
                           catch=(Exception,), gc_after_trial=False, show_progress_bar=False)
        finally:
            release()


def _objective(trial: "optuna.Trial", job: SweepJob, spec: StudySpec, c: "MlflowClient", study: "optuna.Study",
               index: int, release: Any, lock_wait: float = 0.0) -> Any:
    """One trial: record the owner, release the lock, sample, run every seed, return the value(s).
    User attrs: ``worker_pid``, ``host``, ``started_ms``, ``worker``, ``mlflow_run_id``,
    ``lock_wait_s`` (seconds waited for the cap lock) and ``cpu_s`` (this process's CPU seconds)."""
    import optuna

    from harness import tracking
    from harness.ablate import ProgressCallback, _emit, _one_line, _output_to

    cpu0 = time.process_time()
    pid = os.getpid()
    trial.set_user_attr("worker_pid", pid)
    trial.set_user_attr("host", tracking.host())
    trial.set_user_attr("started_ms", int(time.time() * 1000))
    trial.set_user_attr("worker", index)
    trial.set_user_attr("lock_wait_s", round(lock_wait, 4))
    release()
    n = trial.number
    over = sum(t.number < n for t in study.get_trials(deepcopy=False, states=_cap_states()))
    params = {k: trial.suggest_float(k, p.low, p.high, log=spec.param_log(k)) for k, p in spec.search_space.items()}
    seeds = spec.seeds_for(job.scale)
    cfgs = [resolve_trial_config(spec, job.scale, params, s) for s in seeds]
    attrs = dict(trial.user_attrs)
    tags = {**_trial_tags(job.name, job.scale, n, attrs, job.parent_run_id), "worker": str(index),
            "worker_pid": str(pid), "git_sha": job.git_sha, "mlflow.source.git.commit": job.git_sha,
            "config_hash": _run_hash(cfgs[0]),
            "optuna.study_name": study.study_name, **tracking.owner_tags()}
    run_id = c.create_run(job.experiment_id, run_name=f"trial-{n:04d}", tags=tags).info.run_id
    trial.set_user_attr("mlflow_run_id", run_id)
    _emit("start", n, pid)
    out_dir = Path(job.out_root) / f"trial-{n:04d}"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = out_dir / "run.log"
    mlcb = tracking.MLflowCallback(c, run_id)
    pruning = PruningCallback(trial) if not spec.multi_objective else None
    summaries: list[dict[str, Any]] = []
    try:
        if over >= job.cap:
            raise _OverCap(f"trial {n} was created beyond the cap of {job.cap} (another machine got there first)")
        cfg_dict = cfgs[0].to_dict()
        cfg_dict.pop("seed", None)
        tracking.log_params(c, run_id, {**params, **cfg_dict, "seeds": ",".join(map(str, seeds))})
        from harness.ppo import train

        with _output_to(log_file):
            for i, cfg in enumerate(cfgs):
                offset = i * cfg.ppo.total_iterations
                cbs: list[Callback] = [_Offset(mlcb, offset), _Offset(ProgressCallback(str(n)), offset)]
                if pruning is not None:
                    pruning.offset = offset
                    cbs.append(pruning)
                try:
                    summaries.append(train(cfg, out_dir / f"seed{cfg.seed}", cbs, progress=False))
                finally:
                    mlcb.flush()
        values = [float(sum(_metric(s, m) for s in summaries) / len(summaries)) for m in spec.objective_metrics]
        for v in values:
            if not math.isfinite(v):
                raise HarnessError(f"objective is {v} (non-finite)")
        _log_trial_end(c, run_id, summaries, seeds, spec, "complete", values)
        c.log_artifact(run_id, str(log_file))
        c.set_terminated(run_id, "FINISHED")
        trial.set_user_attr("cpu_s", round(time.process_time() - cpu0, 3))
        _emit("end", n, "COMPLETE")
        return values[0] if len(values) == 1 else values
    except optuna.TrialPruned as e:
        with contextlib.suppress(Exception):
            trial.set_user_attr("cpu_s", round(time.process_time() - cpu0, 3))
        last = pruning.last_value if pruning is not None else None
        with contextlib.suppress(Exception):
            _log_trial_end(c, run_id, summaries, seeds, spec, "pruned", [last] if last is not None else [],
                           extra={"pruned_at_step": float(pruning.last_step) if pruning and pruning.last_step is not None else float("nan")})
            c.set_tag(run_id, "pruned_reason", str(e))
            c.log_artifact(run_id, str(log_file))
            c.set_terminated(run_id, "FINISHED")
        _emit("end", n, "PRUNED")
        raise
    except BaseException as e:
        reason = _one_line(e)
        with contextlib.suppress(Exception):
            trial.set_user_attr("fail_reason", reason)
        with contextlib.suppress(Exception):
            c.set_tag(run_id, "state", "failed")
            if log_file.exists():
                c.log_artifact(run_id, str(log_file))
            tracking.fail_run(c, run_id, reason, status="FAILED" if isinstance(e, Exception) else "KILLED")
        _emit("end", n, "FAIL")
        raise


def _run_hash(cfg: Config) -> str:
    from harness.ablate import run_hash

    return run_hash(cfg)


def _metric(summary: dict[str, Any], metric: str) -> float:
    """``eval_final/gold`` → ``summary["eval_final"]["gold"]``."""
    node: Any = summary
    for part in metric.split("/"):
        node = node[part]
    return float(node)


def _log_trial_end(c: "MlflowClient", run_id: str, summaries: list[dict[str, Any]], seeds: list[int], spec: StudySpec,
                   state: str, values: list[Any], extra: Optional[dict[str, float]] = None) -> None:
    """Trial-level metrics: ``value`` (``value/<metric>`` per objective when multi-objective),
    the mean over seeds of every numeric summary leaf (``final/gold`` ...), per seed
    ``seed<k>/final/*``; tag ``state``; each seed's ``summary.json`` as an artifact."""
    from harness.tracking import log_metric_dict

    m: dict[str, float] = dict(extra or {})
    if values:
        if len(values) == 1:
            m["value"] = float(values[0])
        else:
            for name, v in zip(spec.objective_metrics, values):
                m[f"value/{name.split('/')[-1]}"] = float(v)
    leaves: dict[str, list[float]] = {}
    for seed, s in zip(seeds, summaries):
        for k, v in flatten(s).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                leaves.setdefault(k.replace(".", "/"), []).append(float(v))
        for k in ("gold", "score", "kl"):
            if k in s.get("final", {}):
                m[f"seed{seed}/final/{k}"] = float(s["final"][k])
    for k, vs in leaves.items():
        m[k] = sum(vs) / len(vs)
    m["seeds_finished"] = float(len(summaries))
    log_metric_dict(c, run_id, m)
    c.set_tag(run_id, "state", state)
    for seed, s in zip(seeds, summaries):
        c.log_text(run_id, json.dumps(s, indent=2, default=str), f"summaries/seed{seed}.json")


# ------------------------------------------------------------------------------------------------
# Parent side
# ------------------------------------------------------------------------------------------------


class _Display:
    """Rich progress: one summary row (trials done of the cap, complete / pruned / failed /
    running, best value so far) and one row per running trial (iterations)."""

    def __init__(self, label: str, cap: int, steps: int, multi: bool, enabled: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.label, self.cap, self.steps, self.multi = label, cap, steps, multi
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), disable=not enabled)
        self.main = self.progress.add_task(label, total=cap)
        self.rows: dict[str, Any] = {}

    def __enter__(self) -> "_Display":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def refresh(self, study: "optuna.Study") -> None:
        """Update the summary row from the study (all workers, all machines)."""
        from optuna.trial import TrialState

        trials = study.get_trials(deepcopy=False)
        n = {s: sum(t.state == s for t in trials) for s in TrialState}
        done = n[TrialState.COMPLETE] + n[TrialState.PRUNED]
        best = ""
        if n[TrialState.COMPLETE]:
            if self.multi:
                best = f" · Pareto front: {len(study.best_trials)} trial(s)"
            else:
                bt = study.best_trial
                best = f" · best {bt.value:.4g} (#{bt.number})"
        desc = (f"[bold]{self.label}[/] trials: [green]{n[TrialState.COMPLETE]} complete[/] · {n[TrialState.PRUNED]} pruned · "
                f"[red]{n[TrialState.FAIL]} failed[/] · [cyan]{n[TrialState.RUNNING]} running[/]{best}")
        self.progress.update(self.main, completed=min(done, self.cap), description=desc)

    def event(self, kind: str, key: Any, value: Any) -> None:
        """Worker events: ``start`` (pid), ``iter`` (iterations done), ``end`` (state)."""
        key = str(key)
        if kind == "start":
            self.end(key)
            self.rows[key] = self.progress.add_task(f"  trial #{key} (pid {value})", total=self.steps)
        elif kind == "iter" and key in self.rows:
            self.progress.update(self.rows[key], completed=int(value))
        elif kind == "end":
            self.end(key)

    def end(self, key: str) -> None:
        """Remove a trial's row."""
        row = self.rows.pop(key, None)
        if row is not None:
            self.progress.remove_task(row)


def _sampler_seed(spec: StudySpec, n_existing: int, index: int, spawn: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence([spec.sampler.seed, n_existing, index, spawn]).generate_state(1)[0])


def _run_workers(job_base: SweepJob, spec: StudySpec, study: "optuna.Study", workers: int, display: _Display,
                 console: Any, c: "MlflowClient", max_respawns: int) -> dict[str, Any]:
    """Start ``workers`` spawned worker processes; replace one that dies (after failing and
    retrying its trial) while work is left; return ``{"pids": [...], "respawns": k, "died": [...]}``."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    # one event queue per worker: a worker killed while it holds its queue's lock cannot block the others
    queues: list[Any] = []
    procs: dict[int, Any] = {}
    pids: list[int] = []
    died: list[dict[str, Any]] = []
    spawned = [0]
    n_existing = len(study.get_trials(deepcopy=False))

    def spawn(index: int) -> None:
        job = SweepJob(**{**asdict(job_base), "sampler_seed": _sampler_seed(spec, n_existing, index, spawned[0])})
        events = ctx.Queue()
        queues.append(events)
        p = ctx.Process(target=sweep_worker, args=(job, index, events), name=f"sweep-worker-{index}", daemon=False)
        p.start()
        spawned[0] += 1
        procs[index] = p
        pids.append(p.pid)

    def drain() -> None:
        for events in queues:
            while True:
                try:
                    ev = events.get_nowait()
                except (queue_mod.Empty, EOFError, OSError, ValueError):
                    break
                display.event(*ev)

    respawns = 0
    try:
        for i in range(workers):
            spawn(i)
        last_refresh = 0.0
        while procs:
            drain()
            if time.time() - last_refresh > 1.0:
                display.refresh(study)
                last_refresh = time.time()
            for i, p in list(procs.items()):
                if p.is_alive():
                    continue
                p.join()
                del procs[i]
                if p.exitcode != 0:
                    rec = recover_stale_trials(study, c, job_base.experiment_id, job_base.parent_run_id,
                                               only_pids={p.pid}, scale=job_base.scale)
                    died.append({"pid": p.pid, "exitcode": p.exitcode, "trials": [n for n, _ in rec]})
                    for n, _ in rec:
                        display.end(str(n))
                    console.print(f"[yellow]worker {i} (pid {p.pid}) died with exit code {p.exitcode}[/]; "
                                  f"trial(s) {[n for n, _ in rec] or 'none'} failed and queued for retry")
                    if respawns < max_respawns and _should_stop(study, job_base) is None:
                        respawns += 1
                        spawn(i)
            time.sleep(0.2)
        drain()
    except BaseException:
        for p in procs.values():
            with contextlib.suppress(Exception):
                p.kill()
        for p in procs.values():
            with contextlib.suppress(Exception):
                p.join(timeout=5)
        recover_stale_trials(study, c, job_base.experiment_id, job_base.parent_run_id,
                             only_pids={p.pid for p in procs.values()}, scale=job_base.scale)
        raise
    finally:
        display.refresh(study)
        for events in queues:
            with contextlib.suppress(Exception):
                events.close()
                events.join_thread()
    return {"pids": pids, "respawns": respawns, "died": died}


def _n_finished(study: "optuna.Study") -> int:
    return sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))


def _trial_counts(study: "optuna.Study") -> dict[str, int]:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    return {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}


def run_sweep(name: str, trials: Optional[int] = None, scale: str = "smoke", workers: int = 2, progress: bool = True,
              report: bool = True, spec: Optional[StudySpec] = None, inprocess: bool = False) -> Path:
    """Run (or resume) study ``name`` at ``scale`` until ``trials`` trials are COMPLETE, PRUNED
    or RUNNING, in ``workers`` processes sharing one Optuna study; then write the report.

    Steps in the module docstring. Safe to run again: it resumes (a finished study starts no new
    trial); trials left RUNNING by killed workers are failed and retried; the cap is exact.

    Args:
        name: spec name (``ablations/studies/NAME.yaml``).
        trials: global trial cap (default: the spec's for ``scale``).
        scale: ``smoke`` | ``default`` | ``full``.
        workers: worker processes (≥ 1), one torch thread each.
        progress: show the rich display (stderr).
        report: write ``reports/NAME/`` at the end (:func:`write_study_report`, including the
            re-evaluation on fresh seeds).
        spec: an already validated spec (default: loaded from the file).
        inprocess: run the single worker's loop in this process (``workers`` must be 1; for tests
            and debugging: no process start-up, but this process's torch threads are used as set).
    Returns:
        The report path, or the sweep's output directory when ``report`` is False.
    Raises:
        HarnessError / ConfigError: unknown study or scale, invalid spec (before any compute),
        a stored study from another spec, storage errors. Failing *trials* never raise.
    """
    import optuna
    from rich.console import Console

    from harness import tracking
    from harness.pipeline import build_pipeline

    if workers < 1:
        raise HarnessError(f"--workers: must be ≥ 1, got {workers}")
    if inprocess and workers != 1:
        raise HarnessError(f"inprocess runs one worker, got workers={workers}")
    scale_overrides(scale)
    spec = spec or load_study_spec(name)
    cap = effective_cap(spec, scale, trials)
    console = Console(stderr=True, quiet=not progress)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    storage = make_storage(name)
    study = open_study(spec, scale, storage=storage)
    uri = tracking.tracking_uri()
    c = tracking.init_store(uri)
    exp_id = tracking.experiment_id(c, experiment_name(name))
    from harness.ablate import run_hash

    base_hash = run_hash(resolve_trial_config(spec, scale, None, 0))
    if "base_config_hash" not in study.user_attrs:
        study.set_user_attr("base_config_hash", base_hash)
    elif study.user_attrs["base_config_hash"] != base_hash:
        console.print(f"[yellow]note[/]: the resolved default config of {study.study_name} changed since the study started "
                      f"({study.user_attrs['base_config_hash']} → {base_hash}: code defaults changed?); new trials are not "
                      "strictly comparable with earlier ones")
    for n, reason in recover_stale_trials(study, c, exp_id, None, scale=scale):
        console.print(f"[yellow]trial {n} failed[/] ({reason}); queued for retry")
    tracking.mark_stale_runs(c, exp_id)
    out_root = tracking.results_root() / "sweeps" / name / scale
    lock_path = str(optuna_dir() / f"{name}@{scale}.lock")
    max_failed = spec.max_failed_trials or max(cap, 3)
    base_cfg = resolve_trial_config(spec, scale, None, 0)
    steps = len(spec.seeds_for(scale)) * base_cfg.ppo.total_iterations

    job = SweepJob(name=name, scale=scale, spec=spec.model_dump(mode="json"), cap=cap, max_failed=max_failed,
                   lock_path=lock_path, tracking_uri=uri, experiment_id=exp_id, parent_run_id="",
                   out_root=str(out_root), git_sha="unknown", sampler_seed=0)
    stop = _should_stop(study, job)
    if stop:
        counts = _trial_counts(study)
        console.print(f"study {study.study_name}: nothing to run ({stop}: {count_capped(study)}/{cap}; "
                      f"{counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed)")
    else:
        for seed in spec.seeds_for(scale):  # stage keys include the seed: build each one here, not in racing workers
            build_pipeline(resolve_trial_config(spec, scale, None, seed))
        sha = tracking.git_sha()
        parent = c.create_run(exp_id, run_name=f"{name}-{scale}-{time.strftime('%Y%m%d-%H%M%S')}", tags={
            "kind": "parent", "role": "sweep", "study": name, "scale": scale, "workers": str(workers), "cap": str(cap),
            "optuna.study_name": study.study_name, "optuna.storage": redacted_storage_url(name), "git_sha": sha,
            "mlflow.source.git.commit": sha, **tracking.owner_tags()})
        job.parent_run_id, job.git_sha = parent.info.run_id, sha
        t0 = time.time()
        before = len(study.get_trials(deepcopy=False))
        try:
            c.log_text(parent.info.run_id, study_spec_path(name).read_text() if (studies_dir() / f"{name}.yaml").is_file()
                       else yaml.safe_dump(job.spec), "study.yaml")
            label = f"{study.study_name} [cap {cap}, {workers} worker{'s' if workers > 1 else ''}]"
            display = _Display(label, cap, steps, spec.multi_objective, enabled=progress)
            with display:
                info = {"pids": [], "died": [], "respawns": 0}
                if inprocess:
                    job.sampler_seed = _sampler_seed(spec, before, 0, 0)
                    sweep_worker(job, 0, None, init=False)
                    display.refresh(study)
                for _round in range(0 if inprocess else 3):  # a worker that died last may leave work: fresh workers pick it up
                    finished_before = _n_finished(study)
                    more = _run_workers(job, spec, study, workers, display, console, c, max_respawns=2 * workers)
                    for k in info:
                        info[k] += more[k]
                    if _should_stop(study, job) is not None:
                        break
                    if _n_finished(study) == finished_before:
                        raise HarnessError(f"study {study.study_name}: the workers stopped without finishing a trial "
                                           f"({len(info['died'])} died); see the messages above")
            counts = _trial_counts(study)
            tracking.log_metric_dict(c, parent.info.run_id, {
                "trials/new": len(study.get_trials(deepcopy=False)) - before, "trials/complete": counts["complete"],
                "trials/pruned": counts["pruned"], "trials/failed": counts["fail"], "sweep/wall_s": time.time() - t0,
                "workers/died": len(info["died"])})
            c.set_terminated(parent.info.run_id, "FINISHED")
        except KeyboardInterrupt:
            tracking.fail_run(c, parent.info.run_id, "interrupted (Ctrl-C)", status="KILLED")
            raise
        except BaseException as e:
            tracking.fail_run(c, parent.info.run_id, " ".join(f"{type(e).__name__}: {e}".split())[:500])
            raise
        counts = _trial_counts(study)
        console.print(f"study {study.study_name}: {count_capped(study)}/{cap} trials "
                      f"({counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed) "
                      f"in {time.time() - t0:.1f} s")
    if report:
        return write_study_report(name, scale=scale, workers=workers, progress=progress, spec=spec)
    return out_root


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def _latest_scale(name: str, c: "MlflowClient") -> Optional[str]:
    from harness.tracking import search_all

    exp = c.get_experiment_by_name(experiment_name(name))
    if exp is None:
        return None
    parents = search_all(c, [exp.experiment_id], "tags.role = 'sweep'")
    return parents[0].data.tags.get("scale") if parents else None


def choose_best(study: "optuna.Study", spec: StudySpec) -> Optional[Any]:
    """The best trial: Optuna's ``best_trial`` (single objective); for ``gold_kl``, the trial of
    the Pareto front with the highest gold (ties: lower KL). None without a COMPLETE trial."""
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    if not spec.multi_objective:
        return study.best_trial
    return sorted(study.best_trials, key=lambda t: (-t.values[0], t.values[1]))[0]


def _save_axes(ax: Any, path: Path, title: Optional[str] = None, size: Optional[tuple[float, float]] = None) -> Path:
    """Save the figure of an Optuna matplotlib plot (one Axes or an array of them) as a PNG."""
    import matplotlib.pyplot as plt
    import numpy as np

    axes = np.asarray(ax, dtype=object)
    fig = axes.flat[0].figure
    if size is not None:
        fig.set_size_inches(*size)
    if title and axes.size == 1:
        for loc in ("left", "right"):  # Optuna's generic titles
            axes.flat[0].set_title("", loc=loc)
        axes.flat[0].set_title(title)
    elif title:
        fig.suptitle(title)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_study(study: "optuna.Study", spec: StudySpec, out: Path) -> tuple[dict[str, Optional[Path]], dict[str, str]]:
    """Optuna's matplotlib plots of the study into ``out``: ``history.png``, ``importances.png``
    (fANOVA, seed 0), ``contour.png`` and ``slice.png`` of the searched parameters, and
    ``pareto_front.png`` for ``gold_kl``. Multi-objective plots show the gold objective.
    Returns ``(figures, notes)``: a figure is None, with a note why, when Optuna cannot draw it
    (e.g. too few COMPLETE trials)."""
    import matplotlib

    matplotlib.use("Agg")
    import optuna
    from optuna.visualization import matplotlib as ovm

    params = [p for p in ("cliprange", "lam", "kl_coef", "lr") if p in spec.search_space]
    kw: dict[str, Any] = {}
    if spec.multi_objective:
        kw = {"target": lambda t: t.values[0], "target_name": "final gold"}
    else:
        kw = {"target_name": f"final {spec.objective}"}
    figs: dict[str, Optional[Path]] = {}
    notes: dict[str, str] = {}
    plots = {
        "history": lambda: ovm.plot_optimization_history(study, **kw),
        "importances": lambda: ovm.plot_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), params=params, **kw),
        "contour": lambda: ovm.plot_contour(study, params=params, **kw),
        "slice": lambda: ovm.plot_slice(study, params=params, **kw),
    }
    if spec.multi_objective:
        plots["pareto_front"] = lambda: ovm.plot_pareto_front(study, target_names=["final gold ↑", "final KL ↓"])
        plots["importances_kl"] = lambda: ovm.plot_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), params=params,
            target=lambda t: t.values[1], target_name="final KL")
    elif any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
        plots["intermediate"] = lambda: ovm.plot_intermediate_values(study)
    titles = {"history": "optimization history", "importances": "parameter importances (fANOVA)",
              "importances_kl": "parameter importances for the final KL (fANOVA)",
              "contour": "contour", "slice": "slice", "pareto_front": "Pareto front",
              "intermediate": "intermediate proxy score (pruning signal)"}
    k = len(params)
    sizes = {"history": (8, 4.5), "importances": (8, 3.5), "importances_kl": (8, 3.5), "contour": (4.2 * k + 1.5, 3.6 * k), "slice": (4.2 * k, 4.2),
             "pareto_front": (7, 5), "intermediate": (9, 5)}
    for key, fn in plots.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = fn()
            figs[key] = _save_axes(ax, out / f"{key}.png", f"{study.study_name}: {titles[key]}", sizes[key])
        except Exception as e:  # too few trials, a single distinct value ...
            import matplotlib.pyplot as plt

            plt.close("all")
            figs[key] = None
            notes[key] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    return figs, notes


def _reevaluate(spec: StudySpec, scale: str, best_params: dict[str, float], workers: int, progress: bool,
                c: "MlflowClient", exp_id: str) -> dict[str, Any]:
    """Run the best and the default config on the re-evaluation seeds in worker processes (child
    runs of experiment ``study:NAME`` tagged ``reevaluation``; FINISHED ones with the same config
    hash are skipped), then compare them (:func:`harness.report.metric_stats`; Welch's interval and
    p-value of the difference, :func:`harness.stats.welch`)."""
    from harness import tracking
    from harness.ablate import RunTask, _Display as RunDisplay, _build_pipelines, _run_pool, resume_state, run_hash
    from harness import stats
    from harness.report import metric_stats

    name = spec.name or ""
    seeds = spec.reevaluation.seed_list()
    arms = {"best": best_params, "default": None}
    tasks = []
    for arm, params in arms.items():
        for s in seeds:
            cfg = resolve_trial_config(spec, scale, params, s)
            tasks.append(RunTask(ablation=name, scale=scale, variant=arm, seed=s, config=cfg.to_dict(),
                                 config_hash=run_hash(cfg), total_iterations=cfg.ppo.total_iterations))
    state = resume_state(c, exp_id, tasks)
    todo = [t for t in tasks if t.key not in state.finished and t.key not in state.running]
    if todo:
        sha = tracking.git_sha()
        parent = c.create_run(exp_id, run_name=f"{name}-{scale}-reevaluation-{time.strftime('%Y%m%d-%H%M%S')}", tags={
            "kind": "parent", "role": "reevaluation", "reevaluation": "true", "study": name, "scale": scale,
            "git_sha": sha, **tracking.owner_tags()})
        _build_pipelines(todo)
        out_root = tracking.results_root() / "sweeps" / name / scale / "reevaluation"
        for t in todo:
            t.experiment_id, t.parent_run_id, t.tracking_uri = exp_id, parent.info.run_id, tracking.tracking_uri()
            t.out_root, t.git_sha = str(out_root), sha
        try:
            display = RunDisplay(f"{name} re-evaluation", scale, todo, skipped=len(tasks) - len(todo), enabled=progress)
            with display:
                _run_pool(todo, workers, display)
            c.set_terminated(parent.info.run_id, "FINISHED")
        except BaseException as e:
            tracking.fail_run(c, parent.info.run_id, " ".join(f"{type(e).__name__}: {e}".split())[:500],
                              status="KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
            raise
        state = resume_state(c, exp_id, tasks)
    runs: dict[str, dict[int, Any]] = {a: {} for a in arms}
    for t in tasks:
        rid = state.finished.get(t.key)
        if rid is None:
            continue
        run = c.get_run(rid)
        if run.data.tags.get("reevaluation") != "true":
            c.set_tag(rid, "reevaluation", "true")
            c.set_tag(rid, "role", "reevaluation")
        runs[t.variant][t.seed] = run
    metrics = [("eval_final/gold", "max"), ("eval_final/proxy", "max"), ("eval_final/kl", "min")]
    out: dict[str, Any] = {"seeds": seeds, "sweep_seeds": spec.seeds_for(scale), "primary": spec.objective_metrics,
                           "arms": {}, "comparison": {}}
    for arm in arms:
        out["arms"][arm] = {
            "params": best_params if arm == "best" else {k: _get_path(resolve_trial_config(spec, scale, None, 0).to_dict(), SEARCHABLE[k].path)
                                                         for k in spec.search_space},
            "run_ids": {str(s): r.info.run_id for s, r in sorted(runs[arm].items())},
            "seeds_finished": sorted(runs[arm]),
        }
    for m, goal in metrics:
        vals = {a: [float(r.data.metrics[m]) for _, r in sorted(runs[a].items()) if m in r.data.metrics] for a in arms}
        st_default = metric_stats(vals["default"], None, goal)
        st_best = metric_stats(vals["best"], vals["default"], goal)
        try:
            w = stats.welch(vals["best"], vals["default"])
            (lo, hi), p_welch = w.ci(0.95), w.p()
        except ValueError:  # fewer than 2 finished seeds in an arm
            lo = hi = p_welch = float("nan")
        out["comparison"][m] = {"goal": goal, "best": st_best, "default": st_default,
                                "diff_mean": (st_best["mean"] - st_default["mean"]) if vals["best"] and vals["default"] else None,
                                "diff_ci_low": lo, "diff_ci_high": hi, "p_welch": p_welch,
                                "p_best_better": st_best["p_improvement"]}
    out["failed"] = [{"variant": t.variant, "seed": t.seed} for t in tasks if t.key not in state.finished]
    return out


def _get_path(d: dict[str, Any], dotted: str) -> Any:
    node: Any = d
    for part in dotted.split("."):
        node = node[part]
    return node


def write_study_report(name: str, scale: Optional[str] = None, workers: int = 2, progress: bool = True,
                       reevaluate: bool = True, spec: Optional[StudySpec] = None) -> Path:
    """Write ``<reports>/<name>/`` for study ``name``: ``report.md``, PNGs and ``summary.json``.

    Contents: trial counts by state, MLflow child runs, the best trial and its resolved config
    (``best_config.yaml``), Optuna plots (:func:`plot_study`), the Pareto front for ``gold_kl``, and
    (``reevaluate``) the best config against the default config on the spec's fresh re-evaluation
    seeds, run in ``workers`` processes (:func:`_reevaluate`): mean with its t interval, IQM (n ≥ 8),
    Welch's 95% interval and p-value of the difference, and the probability of improvement
    (Agarwal et al. 2021; :mod:`harness.stats`).

    ``summary.json`` keys: ``study, optuna_study, scale, storage, experiment, objective,
    directions, cap, n_trials, n_trials_complete, n_trials_pruned, n_trials_failed,
    n_trials_running, n_trials_waiting, n_mlflow_child_runs, n_workers_seen, best_trial,
    best_params, best_value, best_values, default_params, best_config, pareto_front, importances,
    figures, figure_notes, trials, reevaluation, generated_at``; ``reevaluation`` holds
    ``seeds, sweep_seeds, primary, arms {best, default: {params, run_ids, seeds_finished}},
    comparison {metric: {goal, best, default, diff_mean, diff_ci_low, diff_ci_high, p_welch,
    p_best_better}}, failed``.

    Args:
        name: study spec name.
        scale: which study (default: the scale of the latest sweep invocation).
    Returns:
        Path of ``report.md``.
    Raises:
        HarnessError: unknown study, or no sweep recorded for it yet.
    """
    import optuna

    from harness import tracking
    from harness.stats import clean

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = spec or load_study_spec(name)
    uri = tracking.tracking_uri()
    c = tracking.init_store(uri)
    if scale is None:
        scale = _latest_scale(name, c)
        if scale is None:
            raise HarnessError(f"no sweep recorded for study {name!r} in {tracking.display_uri(uri)}; run `make sweep NAME={name}` first")
    study = open_study(spec, scale, create=False)
    exp_id = tracking.experiment_id(c, experiment_name(name))
    trials = study.get_trials(deepcopy=False)
    counts = _trial_counts(study)
    children = [r for r in tracking.search_all(c, [exp_id], f"tags.role = 'trial' and tags.scale = '{scale}'")
                if r.data.tags.get("optuna.storage", redacted_storage_url(name)) == redacted_storage_url(name)]  # this storage's study only
    out = Path(default_reports_dir()) / name
    out.mkdir(parents=True, exist_ok=True)
    figs, notes = plot_study(study, spec, out)

    best = choose_best(study, spec)
    best_params = dict(best.params) if best is not None else None
    best_cfg = None
    if best is not None:
        cfg = resolve_trial_config(spec, scale, best_params, 0).to_dict()
        cfg.pop("seed", None)
        best_cfg = cfg
        (out / "best_config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    importances: dict[str, dict[str, float]] = {}  # objective metric -> {param: fANOVA importance}
    for i, metric in enumerate(spec.objective_metrics):
        if counts["complete"] < 2:
            break
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances[metric] = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
                target=(lambda t, i=i: t.values[i]))
    pareto = []
    if spec.multi_objective and counts["complete"]:
        pareto = [{"number": t.number, "values": list(t.values), "params": t.params} for t in
                  sorted(study.best_trials, key=lambda t: t.values[0], reverse=True)]
    reeval: Optional[dict[str, Any]] = None
    if reevaluate and best_params is not None:
        reeval = _reevaluate(spec, scale, best_params, workers, progress, c, exp_id)
    workers: dict[Any, int] = {}  # worker processes numbered in order of appearance: no process id in a committed report
    for t in trials:
        if t.user_attrs.get("worker_pid") is not None:
            workers.setdefault(t.user_attrs["worker_pid"], len(workers) + 1)
    summary = clean({
        "study": name, "optuna_study": study.study_name, "scale": scale, "storage": redacted_storage_url(name),
        "experiment": experiment_name(name), "experiment_id": exp_id, "tracking_uri": tracking.display_uri(uri),
        "objective": spec.objective, "objective_metrics": spec.objective_metrics, "directions": spec.directions,
        "sampler": spec.sampler.type, "pruner": spec.pruner.type if spec.pruner else "none",
        "cap": max((int(r.data.tags.get("cap", 0)) for r in tracking.search_all(c, [exp_id], "tags.role = 'sweep'")
                    if r.data.tags.get("scale") == scale), default=None),
        "n_trials": len(trials), "n_trials_complete": counts["complete"], "n_trials_pruned": counts["pruned"],
        "n_trials_failed": counts["fail"], "n_trials_running": counts["running"], "n_trials_waiting": counts["waiting"],
        "n_mlflow_child_runs": len(children),  # workers below: numbered 1, 2, … in trial order (no process ids)
        "n_workers_seen": len({t.user_attrs["worker_pid"] for t in trials if "worker_pid" in t.user_attrs}),
        "best_trial": best.number if best is not None else None,
        "best_params": best_params,
        "best_value": (best.values[0] if best is not None else None),
        "best_values": dict(zip(spec.objective_metrics, best.values)) if best is not None else None,
        "default_params": {k: _get_path(resolve_trial_config(spec, scale, None, 0).to_dict(), SEARCHABLE[k].path)
                           for k in spec.search_space},
        "best_config": best_cfg, "pareto_front": pareto, "importances": importances,
        "figures": [p.name for p in figs.values() if p is not None], "figure_notes": notes,
        "trials": [{"number": t.number, "state": t.state.name.lower(), "values": t.values, "params": t.params,
                    "worker": workers.get(t.user_attrs.get("worker_pid")), "retry_of": t.user_attrs.get("retry_of"),
                    "fail_reason": t.user_attrs.get("fail_reason"),
                    "duration_s": t.duration.total_seconds() if t.duration is not None else None} for t in trials],
        "reevaluation": reeval,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    path = out / "report.md"
    path.write_text(render_study_markdown(spec, summary, figs))
    return path


def _fmt(x: Any, digits: int = 4) -> str:
    """Format a number for the study report exactly as the ablation report does."""
    from harness.report import _fmt as report_fmt

    return report_fmt(x, digits)


def render_study_markdown(spec: StudySpec, s: dict[str, Any], figs: dict[str, Optional[Path]]) -> str:
    """The study report (GitHub markdown) from the summary and the written figures."""
    L: list[str] = []
    obj = {"gold": "final gold reward ↑", "score": "final proxy (RM) score ↑",
           "gold_kl": "Pareto front of final gold ↑ and final KL ↓"}[spec.objective]
    L.append(f"# Study `{s['study']}` ({s['scale']} scale)\n")
    if spec.description.strip():
        L.append(spec.description.strip() + "\n")
    L.append(f"Objective: **{obj}**; sampler `{s['sampler']}`, pruner `{s['pruner']}`; Optuna study `{s['optuna_study']}` "
             f"in `{s['storage']}`; MLflow experiment `{s['experiment']}` at `{s['tracking_uri']}`; generated {s['generated_at']}.\n")
    L.append("## Search space\n")
    L.append("| parameter | config key | low | high | scale |")
    L.append("|---|---|---|---|---|")
    for k, p in spec.search_space.items():
        L.append(f"| {k} | `{SEARCHABLE[k].path}` | {p.low:g} | {p.high:g} | {'log' if spec.param_log(k) else 'linear'} |")
    L.append("")
    L.append("## Trials\n")
    L.append(f"Cap {s['cap'] if s['cap'] is not None else '–'} (COMPLETE + PRUNED + RUNNING): {s['n_trials']} trials in storage — "
             f"{s['n_trials_complete']} complete, {s['n_trials_pruned']} pruned, {s['n_trials_failed']} failed, "
             f"{s['n_trials_running']} running, {s['n_trials_waiting']} waiting; {s['n_mlflow_child_runs']} MLflow child runs; "
             f"worker processes seen: {s['n_workers_seen']}.\n")
    L.append("| # | state | value(s) | cliprange | lam | kl_coef | worker | note |")
    L.append("|---|---|---|---|---|---|---|---|")
    for t in s["trials"]:
        vals = ", ".join(_fmt(v) for v in (t["values"] or [])) or "–"
        note = (f"retry of #{t['retry_of']}" if t["retry_of"] is not None else "") + \
               ((" · " if t["retry_of"] is not None else "") + " ".join(str(t["fail_reason"]).split())[:80] if t["fail_reason"] else "")
        p = t["params"]
        L.append(f"| {t['number']} | {t['state']} | {vals} | {_fmt(p.get('cliprange'))} | {_fmt(p.get('lam'))} | "
                 f"{_fmt(p.get('kl_coef'))} | {t['worker'] or '–'} | {note.replace('|', '/')} |")
    L.append("")
    L.append("## Best configuration\n")
    if s["best_trial"] is None:
        L.append("No COMPLETE trial yet.\n")
    else:
        how = "highest gold on the Pareto front" if spec.multi_objective else "best objective value"
        vals = ", ".join(f"{k} = {_fmt(v)}" for k, v in (s["best_values"] or {}).items())
        L.append(f"Trial #{s['best_trial']} ({how}): {vals}.\n")
        complete = [t["values"] for t in s["trials"] if t["state"] == "complete" and t["values"]]
        if len(complete) > 1 and all(v[0] == complete[0][0] for v in complete):
            then = ("the choice falls to the lowest KL" if spec.multi_objective else
                    "so this \"best\" is only the first of them")
            L.append(f"> All {len(complete)} COMPLETE trials have the same {spec.objective_metrics[0]} ({_fmt(complete[0][0])}): it "
                     f"does not tell the configurations apart at this scale; {then}.\n")
        L.append("| parameter | best | default |")
        L.append("|---|---|---|")
        defaults = s["default_params"]
        for k, v in s["best_params"].items():
            L.append(f"| {k} | {_fmt(v)} | {_fmt(defaults.get(k))} |")
        L.append("\nFull resolved config: `best_config.yaml`.\n")
    for metric, imp in s["importances"].items():
        L.append(f"Parameter importances for `{metric}` (fANOVA): " + ", ".join(f"{k} {v:.2f}" for k, v in imp.items()) + ".\n")
    if s["pareto_front"]:
        L.append("### Pareto front\n")
        L.append("| # | final gold | final KL | cliprange | lam | kl_coef |")
        L.append("|---|---|---|---|---|---|")
        for t in s["pareto_front"]:
            p = t["params"]
            L.append(f"| {t['number']} | {_fmt(t['values'][0])} | {_fmt(t['values'][1])} | {_fmt(p.get('cliprange'))} | "
                     f"{_fmt(p.get('lam'))} | {_fmt(p.get('kl_coef'))} |")
        L.append("")
    L.append("## Re-evaluation on fresh seeds\n")
    r = s.get("reevaluation")
    if not r:
        L.append("Not run (no COMPLETE trial, or disabled).\n")
    else:
        L.append(f"The best config and the default config (searched knobs at their base values), each on seeds {r['seeds']} "
                 f"(the sweep used seeds {r['sweep_seeds']}). Mean over seeds with its 95% t interval, IQM (with ≥ 8 seeds), "
                 "Welch's 95% interval and p-value of the difference best − default, and P(best better than default) = "
                 "Mann–Whitney U / (n·n) (Agarwal et al. 2021). The best config was selected on the sweep's seeds; "
                 "fresh seeds keep the comparison honest, but it is one comparison, not a verdict.\n")
        L.append("| metric | best: mean [95% CI] | IQM | default: mean [95% CI] | IQM | best − default [95% Welch CI] (p) | P(best better) |")
        L.append("|---|---|---|---|---|---|---|")
        for m, d in r["comparison"].items():
            b, df = d["best"], d["default"]
            star = " (objective)" if m in r["primary"] else ""
            L.append(f"| `{m}`{star} {'↑' if d['goal'] == 'max' else '↓'} | {_fmt(b['mean'])} [{_fmt(b['ci_low'])}, {_fmt(b['ci_high'])}] "
                     f"(n={b['n']}) | {_fmt(b['iqm'])} | {_fmt(df['mean'])} [{_fmt(df['ci_low'])}, {_fmt(df['ci_high'])}] (n={df['n']}) | "
                     f"{_fmt(df['iqm'])} | {_fmt(d['diff_mean'])} [{_fmt(d['diff_ci_low'])}, {_fmt(d['diff_ci_high'])}] "
                     f"(p = {_fmt(d.get('p_welch'), 3)}) | "
                     f"{_fmt(d['p_best_better'], 2)} |")
        L.append("")
        if r["failed"]:
            L.append("Runs without a FINISHED result: " + ", ".join(f"{f['variant']}/s{f['seed']}" for f in r["failed"]) + ".\n")
    L.append("## Figures\n")
    captions = {"history": "Optimization history", "importances": "Parameter importances (fANOVA)",
                "importances_kl": "Parameter importances for the final KL (fANOVA)",
                "contour": "Contour plots of the searched parameters", "slice": "Slice plots",
                "pareto_front": "Pareto front (gold ↑, KL ↓)", "intermediate": "Intermediate proxy score per trial (the pruning signal)"}
    for k, p in figs.items():
        if p is not None:
            L.append(f"**{captions[k]}**\n\n![{k}]({p.name})\n")
        else:
            L.append(f"**{captions[k]}**: not drawn ({s['figure_notes'].get(k, 'unknown reason')}).\n")
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------------
# Benchmark
# ------------------------------------------------------------------------------------------------


def bench_sweep(trials_per_worker: int = 6, workers: tuple[int, ...] = (1, 2), scale: str = "smoke",
                name: str = "ppo_core", progress: bool = False) -> dict[str, Any]:
    """Trials per hour of a sweep at ``scale`` with 1 and with 2 workers, and their ratio.

    Each setting runs a fresh study of spec ``name`` (random sampler, no pruner, so every trial
    does the full work) with ``trials_per_worker × workers`` trials, with the results directory
    (Optuna journal, MLflow store, run outputs) in a temporary directory; the pipeline is the
    cached one of the real results directory, built first and not timed. Two throughputs:
    ``end_to_end`` (wall time of :func:`run_sweep` without the report: worker start-up, imports
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
                study = optuna.load_study(study_name=study_name(bench_name, scale), storage=make_storage(bench_name))
                done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
                span = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds() if done else float("nan")
                r = {"workers": w, "trials": len(done), "wall_s": wall, "steady_span_s": span,
                     "trials_per_hour_end_to_end": 3600.0 * len(done) / wall,
                     "trials_per_hour_steady": 3600.0 * len(done) / span if span and span > 0 else float("nan"),
                     "mean_trial_s": sum(t.duration.total_seconds() for t in done) / max(1, len(done)),
                     "mean_trial_cpu_s": sum(t.user_attrs.get("cpu_s", 0.0) for t in done) / max(1, len(done)),
                     "cores_used_steady": sum(t.user_attrs.get("cpu_s", 0.0) for t in done) / span if span and span > 0 else float("nan"),
                     "max_lock_wait_s": max((t.user_attrs.get("lock_wait_s", 0.0) for t in done), default=0.0),
                     "worker_pids": sorted({t.user_attrs.get("worker_pid") for t in done}),
                     "load_avg_1m_before": load0, "load_avg_1m_after": os.getloadavg()[0]}
                results[f"w{w}"] = r
                print(f"bench-sweep {scale}: {w} worker(s): {len(done)} trials in {wall:.1f} s → "
                      f"{r['trials_per_hour_end_to_end']:.0f} trials/h end-to-end, {r['trials_per_hour_steady']:.0f} trials/h steady "
                      f"(mean trial {r['mean_trial_s']:.1f} s wall, {r['mean_trial_cpu_s']:.1f} s CPU; {r['cores_used_steady']:.2f} cores busy "
                      f"with trials; max cap-lock wait {r['max_lock_wait_s']:.3f} s; load avg {load0:.2f} → {r['load_avg_1m_after']:.2f})",
                      flush=True)
    if len(workers) >= 2:
        a, b = results[f"w{workers[0]}"], results[f"w{workers[1]}"]
        results["ratio_end_to_end"] = b["trials_per_hour_end_to_end"] / a["trials_per_hour_end_to_end"]
        results["ratio_steady"] = b["trials_per_hour_steady"] / a["trials_per_hour_steady"]
        print(f"bench-sweep: {workers[1]} vs {workers[0]} worker(s): ×{results['ratio_end_to_end']:.2f} end-to-end, "
              f"×{results['ratio_steady']:.2f} steady (target ≥ 1.8; {os.cpu_count()} CPU cores)", flush=True)
    return results


def _bench_main() -> None:
    """``python -m harness.sweep bench [TRIALS_PER_WORKER]`` (the Makefile's ``bench-sweep``)."""
    args = sys.argv[1:]
    if not args or args[0] != "bench":
        raise SystemExit("usage: python -m harness.sweep bench [TRIALS_PER_WORKER]")
    tpw = int(args[1]) if len(args) > 1 else 6
    res = bench_sweep(trials_per_worker=tpw)
    print(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    from harness.sweep import _bench_main as _main  # the importable module, so workers can unpickle its functions

    _main()


__all__ = [
    "SEARCHABLE", "OBJECTIVES", "StudySpec", "ParamSpec", "SamplerSpec", "PrunerSpec", "StudyScaleSpec", "ReevaluationSpec",
    "load_study_spec", "parse_study_spec", "resolve_trial_config", "storage_url", "make_storage", "open_study",
    "count_capped", "recover_stale_trials", "retry_failed_trial", "trial_stale_reason", "PruningCallback",
    "run_sweep", "write_study_report", "plot_study", "choose_best", "bench_sweep",
]
