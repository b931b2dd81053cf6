"""The ablation spec: ``ablations/NAME.yaml`` as a validated :class:`AblationSpec`, and the resolved
config of each (variant, scale, seed).

A spec states the question, the published claim(s) with their source and expected direction, a
base config, the variants (each a nested config override), seeds and scales, the primary metrics
and the verdict rule (``ablations/kl_placement.yaml`` is a complete example). Running the spec is
:mod:`harness.experiments.ablate`.

Config resolution for one run (later wins)::

    Config defaults ← the task's defaults ← the spec's regime (the task's default regime unless
    spec.regime names another) ← spec.base ← the scale preset (the task's own, else
    SCALE_PRESETS[scale]) ← spec.scales[scale].overrides
                    ← spec.variants[variant] ← {"seed": seed}
"""

from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import Any, Literal, Optional, TypeVar, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.config import Config, ConfigError, build_config, deep_update, format_validation_error
from harness.errors import HarnessError
from harness.config.presets import CHECKED_SCALES, regime_overrides, scale_overrides, task_name

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
PAIR_MATCHED = "pair_matched_kl/"  # a claim metric: eval/<m> at the largest KL every run of the claim's two arms reaches
PAIR_MATCHED_OUTCOMES = ("gold", "proxy", "gold_lexicon")  # the held-out curves a pair_matched_kl/ claim can read
PAIR_MATCHED_RESPONSES = "pair_matched_responses/"  # eval/<m> at the most sampled responses every run of the two drew
#: The claim metrics read off both arms' evaluation curves at a matched point (harness.reporting.matched), and the
#: held-out curves each can read.
PAIR_READINGS = {PAIR_MATCHED: PAIR_MATCHED_OUTCOMES, PAIR_MATCHED_RESPONSES: ("pass1_greedy", "gold")}


# ------------------------------------------------------------------------------------------------
# Spec schema
# ------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a margin of .inf or .nan is a typo, not a bound


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
      - ``exceeds``: ``d > margin`` ("a beats b by more than the margin": a claim of size, e.g. "removes most of"
        an effect, where ``greater`` would only test its sign);
      - ``equivalent``: ``|d| < margin`` ("little effect": shown only by an equivalence test, TOST).
    ``margin`` (> 0, in the metric's units) is the smallest difference that matters: the bound of
    ``not_greater`` / ``exceeds`` / ``equivalent`` claims, and for every claim the effect whose required seeds the
    report states. ``kind`` says whether the claim is a ``mechanism`` check (true by construction,
    reported pass/fail), an empirical ``finding`` (reproduced/contradicted), or a negative ``control`` (false by
    construction, e.g. an A/A comparison: a decisive verdict either way is a *false positive* of the verdict rule,
    and the scorecard counts controls apart from findings); ``section`` names the source's section, table or
    equation; ``setting_note`` says how the source's setting differs from ours; ``title`` (≤ 80 characters) names
    the claim in the reports' first tables (default: :func:`harness.reporting.render.claim_title`). The verdict rule: :mod:`harness.analysis.verdicts`.
    """

    claim: str = Field(min_length=1)
    title: Optional[str] = Field(None, min_length=1, max_length=80)
    kind: Literal["mechanism", "finding", "control"]
    source: str = Field(min_length=1)
    section: str = Field(min_length=1)
    setting_note: str = Field(min_length=1)
    metric: str = Field(pattern=_METRIC_RE)
    a: str
    expect: Literal["greater", "less", "not_greater", "exceeds", "equivalent"]
    b: str
    margin: float = Field(gt=0.0)

    @model_validator(mode="after")
    def _check(self) -> "Claim":
        if self.a == self.b:
            raise ValueError(f"claim compares variant {self.a!r} with itself")
        for prefix, outcomes in PAIR_READINGS.items():
            if self.metric.startswith(prefix) and self.metric.removeprefix(prefix) not in outcomes:
                raise ValueError(f"metric {self.metric!r}: {prefix} takes one of {', '.join(outcomes)}")
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
    """How claims are judged (:mod:`harness.analysis.verdicts`): ``welch``: Welch's t test per claim (TOST for
    ``equivalent`` claims) at level ``alpha``, Holm-adjusted across the ablation's claims; no verdict
    when an arm has fewer than ``min_seeds`` seeds; the minimum detectable effect at ``power``;
    ``n_resamples`` bootstrap resamples for the (descriptive) P(improvement) intervals. With ``--seeds
    auto`` seeds are added ``stage`` per arm at a time up to ``cap`` and the claims are judged by the
    group-sequential rule (:mod:`harness.analysis.sequential`) at each stage. ``margin_alpha``: the part of ``alpha`` given
    to the margin tests of directional claims (:func:`harness.analysis.verdicts.margin_test`: "below margin" when any effect
    in the claimed direction is shown smaller than the claim's margin), Bonferroni across them; the tests of the
    claims' nulls share the rest; 0 turns the margin tests off."""

    rule: Literal["welch"] = "welch"
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    margin_alpha: float = Field(0.01, ge=0.0)
    min_seeds: int = Field(10, ge=2)
    power: float = Field(0.8, gt=0.0, lt=1.0)
    n_resamples: int = Field(9999, ge=100)
    stage: int = Field(10, ge=2)  # --seeds auto: seeds per arm added at each stage
    cap: int = Field(40, ge=2)  # --seeds auto: at most this many seeds per arm

    @model_validator(mode="after")
    def _stages(self) -> "VerdictRule":
        if self.cap < self.stage:
            raise ValueError(f"cap: must be ≥ stage ({self.stage}), got {self.cap}")
        if self.margin_alpha >= self.alpha:
            raise ValueError(f"margin_alpha: must be < alpha ({self.alpha}), got {self.margin_alpha}")
        return self

    def reported(self) -> dict[str, Any]:
        """The rule as a report's ``summary.json`` records it (what a scorecard compares with the spec's)."""
        return {"rule": self.rule, "alpha": self.alpha, "margin_alpha": self.margin_alpha, "min_seeds": self.min_seeds,
                "power": self.power}


class AblationSpec(_Strict):
    """One ablation, as written in ``ablations/NAME.yaml``.

    ``seed_offset`` (optional, ``{variant: k}``) runs that variant on seeds ``s + k`` instead of ``s``:
    an A/A check compares two identical configs on disjoint seed sets this way.

    ``regime`` (optional) names one of the task's regimes (``harness.config.presets.regime_overrides``; review_sentiment:
    ``fixed_length``, its default, or ``variable_length``), applied under ``base``.

    ``panels`` (optional, ``{title: [variant, ...]}``) splits the report's frontier plot into one row per
    title, for an ablation whose variants cross two factors (e.g. β × proxy size); each row draws its
    variants and the best-of-n curve of their proxy. Without it, one row holds every variant.

    Raises (through :func:`load_spec`): :class:`harness.config.ConfigError` with one line naming
    every bad field: unknown keys, a claim or baseline naming an unknown variant, a variant
    override that fails config validation.
    """

    name: Optional[str] = Field(None, pattern=_NAME_RE)
    question: str = Field(min_length=1)
    claims: list[Claim] = Field(min_length=1)
    baseline: str
    regime: Optional[str] = None
    base: dict[str, Any] = Field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = Field(min_length=2)
    seeds: Optional[Union[int, list[int]]] = None
    seed_offset: dict[str, int] = Field(default_factory=dict)
    panels: dict[str, list[str]] = Field(default_factory=dict)
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
        for title, vs in self.panels.items():
            for v in vs:
                if v not in self.variants:
                    raise ValueError(_unknown_variant(f"panels.{title}", v, names))
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

    def claim_arms_for(self, scale: str) -> list[str]:
        """The variants run at ``scale`` that a claim there compares (spec order): the arms ``--seeds auto`` runs."""
        named = {arm for c in self.claims_for(scale) for arm in (c.a, c.b)}
        return [v for v in self.variants_for(scale) if v in named]

    def seeds_for(self, scale: str) -> list[int]:
        """Seeds of ``scale``: the scale's own, else the spec's ``seeds``, else DEFAULT_SEEDS."""
        s = self.scales.get(scale)  # type: ignore[call-overload]
        v = s.seeds if s is not None and s.seeds is not None else self.seeds
        if v is None:
            v = DEFAULT_SEEDS.get(scale, 3)
        return list(range(v)) if isinstance(v, int) else list(v)

    def metric_goal(self, metric: str) -> str:
        """``"max"``, ``"min"`` or ``"none"`` for ``metric`` (the primary metrics' goals; otherwise the diagnostic
        standing columns (``harness.rl.metrics.STANDING_DIAGNOSTIC``) have none, ``*/kl`` is min and anything else,
        ``rescored_final/gold`` included, max)."""
        from harness.rl.metrics import STANDING_DIAGNOSTIC

        for m in self.metrics:
            if m.name == metric:  # type: ignore[union-attr]
                return m.goal  # type: ignore[union-attr]
        if metric in STANDING_DIAGNOSTIC:
            return "none"
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
    repo = Path(__file__).resolve().parents[2] / "ablations"
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
        HarnessError: ``name`` breaks the naming rule (:func:`harness.infra.safety.check_name`: no paths), or
            no such file; the one-line message lists the available names (and the closest one).
    """
    from harness.infra.safety import check_name

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
        ConfigError: not valid YAML, or a key repeated in one mapping (:func:`harness.infra.safety.load_yaml`);
            one line starting ``KIND NAME:``.
    """
    from harness.infra.safety import load_yaml, one_line, read_small_text

    try:
        return load_yaml(read_small_text(path, "spec"))
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
        HarnessError: ``name`` breaks the naming rule (:func:`harness.infra.safety.check_name`).
    """
    from harness.infra.safety import check_name

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
    validated (seed 0), so a misspelt knob fails here and not in a worker, and every claim's and
    primary metric is checked against what those runs record (:func:`check_metrics`).

    Raises:
        HarnessError: unknown name (lists the available ones).
        ConfigError: not YAML / not a mapping / schema violation / invalid variant config; one line.
    """
    spec = validate_spec(read_spec(spec_path(name), "ablation", name), AblationSpec, "ablation", name)
    if validate_configs:
        for scale in CHECKED_SCALES:
            configs = {variant: resolve_config(spec, scale, variant, 0) for variant in spec.variants_for(scale)}
            check_metrics(spec, configs)
    return spec


def check_metrics(spec: AblationSpec, configs: dict[str, Config]) -> None:
    """Refuse a claim whose metric a run of either arm would not record, or a primary metric that no
    variant records (:func:`harness.rl.metrics.run_metric_names`), before any run starts.

    Args:
        spec: the validated spec.
        configs: the resolved config of each variant run at one scale.
    Raises:
        ConfigError: one line naming the field (``claims.I.metric`` or ``metrics.I``), the metric, the
            closest recorded names and the families a run records.
    """
    from harness.rl.metrics import run_metric_names, unknown_metric

    names = {v: run_metric_names(cfg) for v, cfg in configs.items()}
    for i, c in enumerate(spec.claims):
        for arm in (c.a, c.b):
            if arm in names and c.metric not in names[arm]:
                raise ConfigError(f"ablation {spec.name}: claims.{i}.metric: {unknown_metric(c.metric, names[arm])}"
                                  + (f" (arm {arm!r})" if c.metric in set().union(*names.values()) else ""))
    recorded = set().union(*names.values()) if names else set()
    for i, m in enumerate(spec.metrics):
        if recorded and m.name not in recorded:  # type: ignore[union-attr]
            raise ConfigError(f"ablation {spec.name}: metrics.{i}: {unknown_metric(m.name, recorded)}")  # type: ignore[union-attr]


def resolve_config(spec: AblationSpec, scale: str, variant: str, seed: int) -> Config:
    """The validated config of one run (merge order in the module docstring).

    Raises:
        HarnessError: unknown scale.
        ConfigError: the merged config is invalid; the message names ablation, scale and variant.
    """
    task = task_name(spec.base)
    preset = scale_overrides(scale, task)
    data = deep_update(copy.deepcopy(regime_overrides(spec.regime, task)), copy.deepcopy(spec.base))
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


__all__ = ["DEFAULT_SEEDS", "DEFAULT_METRICS", "MetricSpec", "Claim", "ScaleSpec", "VerdictRule", "AblationSpec",
           "ablations_dir", "list_specs", "find_spec", "read_spec", "validate_spec", "list_ablations", "is_study",
           "spec_path", "load_spec", "check_metrics", "resolve_config", "run_hash", "experiment_name"]
