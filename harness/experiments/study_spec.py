"""Study specs as data: ``ablations/studies/NAME.yaml`` validated into a :class:`StudySpec`.

A study spec (``ablations/studies/ppo_core.yaml`` is a complete example) names a base config, a search
space over PPO's core coefficients (ε ``cliprange``, GAE λ ``lam``, β ``kl_coef``, optionally ``lr``),
the objective (final gold ↑, final proxy score ↑, or the Pareto front of gold ↑ and KL ↓), the sampler
(TPE, grid, random), the pruner (median of the intermediate proxy score, single-objective only), the
trial cap, the seeds per trial and per-scale settings. It is validated before any compute: a bound out
of the allowed range, reversed bounds or an unknown parameter is one :class:`~harness.config.ConfigError`
line. Running a study is :mod:`harness.experiments.sweep`; its report is :mod:`harness.reporting.study`.

Config of one trial (later wins)::

    Config defaults ← the task's defaults ← the spec's regime (the task's default regime unless
    spec.regime names another) ← spec.base ← the scale preset (the task's own, else
    SCALE_PRESETS[scale]) ← spec.scales[scale].overrides
                    ← sampled parameters (ppo.cliprange, ppo.lam, ppo.kl_coef, ppo.lr) ← {"seed": s}
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.config import Config, ConfigError, build_config, deep_update, fingerprint
from harness.config.presets import CHECKED_SCALES, regime_overrides, scale_overrides, task_name


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

_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


def held_out_metric(final: str) -> str:
    """The held-out evaluation's metric a run's final one is read from: ``eval_final/distinct_2`` → ``eval/distinct_2``
    (:func:`harness.rl.evaluation.eval_summary` takes ``eval_final/*`` from the last ``eval/*``)."""
    return "eval/" + final.split("/", 1)[1]


# ------------------------------------------------------------------------------------------------
# Spec schema
# ------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a margin of .inf or .nan is a typo, not a bound


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
    """``median``: Optuna's MedianPruner on ``metric`` (the proxy score ``objective/score``, reported each iteration,
    or the held-out gold ``eval/gold``, reported at each held-out evaluation); a trial is pruned when its value at a
    step is below the median of earlier trials' values at that step. Steps before ``ceil(warmup_fraction × steps per
    trial)`` are never pruned. Prune on the objective's own metric where the proxy can be gamed: a proxy that rewards
    repetition would prune the natural configurations first."""

    type: Literal["median", "none"] = "median"
    metric: Literal["objective/score", "eval/gold"] = "objective/score"
    n_startup_trials: int = Field(3, ge=0)
    warmup_fraction: float = Field(0.3, ge=0.0, lt=1.0)
    interval_steps: int = Field(1, ge=1)


class ConstraintSpec(_Strict):
    """A floor on a run-summary metric that a trial must keep to count as feasible, e.g. held-out distinct-2 so that
    the study cannot recommend a policy that writes loops. ``metric``: an ``eval_final/...`` metric of the run summary
    (the mean over the trial's seeds is compared); ``min``: the floor, in the metric's units. The trial records the
    violation ``min − value`` (Optuna's ``Trial.set_constraint``: feasible when ≤ 0), which the TPE sampler uses when it
    proposes (random and grid samplers ignore it), and
    :func:`harness.reporting.study.choose_best` picks the best *feasible* trial. ``margin``: the drop below the default
    configuration's value that the re-evaluation still accepts (a non-inferiority claim in the metric's units)."""

    metric: str = Field(pattern=r"^eval_final/[A-Za-z0-9_@.-]+$")
    min: float
    margin: float = Field(gt=0.0)


class StudyScaleSpec(_Strict):
    """Per-scale settings: trial cap, seeds per trial and nested config overrides merged over
    ``SCALE_PRESETS[scale]``."""

    trials: Optional[int] = Field(None, ge=1)
    seeds_per_trial: Optional[int] = Field(None, ge=1)
    overrides: dict[str, Any] = Field(default_factory=dict)


class ReevaluationSpec(_Strict):
    """The best config against the default one on fresh seeds. ``seeds``: a count N (seeds
    ``first_seed .. first_seed+N-1``) or a list; at least 5 and disjoint from the sweep's seeds. ``margin``: the
    advantage the verdict is judged at (units of the first objective metric)."""

    seeds: Union[int, list[int]] = 5
    first_seed: int = Field(1000, ge=0)
    #: the smallest advantage of the best config that matters, in units of the first objective metric (its verdict:
    #: :func:`harness.reporting.study.reevaluation_verdict`)
    margin: float = Field(0.05, gt=0.0)

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
    regime: Optional[str] = None  # one of the task's regimes (harness.config.presets.regime_overrides); None: its default
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
    #: floors a trial must keep to be feasible (:class:`ConstraintSpec`); none: every complete trial is
    constraints: list[ConstraintSpec] = Field(default_factory=list)

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
        metrics = [c.metric for c in self.constraints]
        if len(set(metrics)) != len(metrics):
            raise ValueError(f"constraints: each metric at most once (got {metrics})")
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
    """Where study specs live: ``<ablations>/studies`` (see :func:`harness.experiments.ablate.ablations_dir`)."""
    from harness.experiments.ablate import ablations_dir

    return ablations_dir() / "studies"


def list_studies() -> list[str]:
    """Names of the study specs, sorted."""
    from harness.experiments.ablate import list_specs

    return list_specs(studies_dir())


def study_spec_path(name: str) -> Path:
    """Path of study ``name``'s spec.

    Raises:
        HarnessError: unknown name; the message lists the available studies (one line).
    """
    from harness.experiments.ablate import find_spec

    return find_spec(studies_dir(), name, "study")


def parse_study_spec(data: Any, name: str) -> StudySpec:
    """Validate a study spec given as data and check every scale's config at the corners of the
    search space (so a bad knob fails here, before any compute).

    Raises:
        ConfigError: one line starting ``study NAME:``.
    """
    from harness.experiments.ablate import validate_spec

    spec = validate_spec(data, StudySpec, "study", name)
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
    from harness.experiments.ablate import read_spec

    return parse_study_spec(read_spec(study_spec_path(name), "study", name), name)


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
    task = task_name(spec.base)
    data = deep_update(copy.deepcopy(regime_overrides(spec.regime, task)), copy.deepcopy(spec.base))
    data = deep_update(data, copy.deepcopy(scale_overrides(scale, task)))
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
        "base": spec.base, "regime": regime_overrides(spec.regime, task_name(spec.base)),
        "overrides": s.overrides if s is not None else {}, "objective": spec.objective,
        "seeds": spec.seeds_for(scale), "preset": scale_overrides(scale, task_name(spec.base)),
        "space": {k: [p.low, p.high, spec.param_log(k)] for k, p in sorted(spec.search_space.items())},
    }
    if spec.constraints:  # left out when empty, so an unconstrained study keeps its fingerprint
        d["constraints"] = [[c.metric, c.min] for c in spec.constraints]
    return fingerprint(d)


def study_name(name: str, scale: str) -> str:
    """The Optuna study of spec ``name`` at ``scale``: ``NAME@SCALE``."""
    return f"{name}@{scale}"


def experiment_name(name: str) -> str:
    """The MLflow experiment of study ``name``: ``study:NAME``."""
    return f"study:{name}"


