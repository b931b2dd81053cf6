"""The base of every config model: strict pydantic models, the one hash behind config identities, the
config error, the default directories (``$HARNESS_CACHE``, ``$HARNESS_RESULTS``), and the merging of config
mappings and dotted overrides (:func:`deep_update`, :func:`parse_overrides`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, model_serializer

from harness.errors import HarnessError


def fingerprint(data: Any) -> str:
    """12 hex digits of the sha256 of ``data`` as sorted JSON: the one hash behind config identities
    (:meth:`Config.hash`), pipeline stage keys and study fingerprints.

    Raises:
        TypeError: ``data`` is not JSON-serialisable.
    """
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def portable(config: dict[str, Any]) -> dict[str, Any]:
    """A resolved config's dict (``Config.to_dict()``) without its machine-local paths, ``pipeline.out_dir`` and
    ``pipeline.data.cache_dir``, which a config loaded elsewhere takes from its own environment: the same on every
    machine (what :meth:`Config.hash` fingerprints). Returns a new dict; ``config`` is left as it is.

    Raises:
        KeyError: ``config`` has no ``pipeline`` or ``pipeline.data`` section.
    """
    pipeline = {k: v for k, v in config["pipeline"].items() if k != "out_dir"}
    pipeline["data"] = {k: v for k, v in config["pipeline"]["data"].items() if k != "cache_dir"}
    return {**config, "pipeline": pipeline}


#: The task a config names when it names none (``task.name``).
DEFAULT_TASK = "review_sentiment"


class ConfigError(HarnessError, ValueError):
    """A config is invalid. The message is one line naming the field and the allowed values."""


def _yaml_switch(v: Any) -> Any:
    """YAML 1.1 reads a bare ``on`` / ``off`` as a boolean: map it back to the name."""
    return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class _Strict(BaseModel):
    """A config model: unknown keys, non-finite numbers and wrong types are rejected.

    Fields named in a subclass's ``_omit_at_default`` are left out of the dump while they hold their default:
    a knob added later does not change the dump, hence the hash, of the configs that existed before it.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=False, allow_inf_nan=False)
    _omit_at_default: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for name in self._omit_at_default:
            field = type(self).model_fields[name]
            default = field.default_factory() if field.default_factory is not None else field.default
            if name in out and getattr(self, name) == default:
                out.pop(name)
        return self._resolve_dump(out)

    def _resolve_dump(self, out: dict[str, Any]) -> dict[str, Any]:
        """Hook: a subclass writes into the dump what an unset knob resolves to (the dump, hence the hash, says
        what runs)."""
        return out


# --------------------------------------------------------------------------------------------
# Default directories
# --------------------------------------------------------------------------------------------


def default_cache_dir() -> str:
    """Data cache directory: ``$HARNESS_CACHE`` or ``~/.cache/ppo-harness``."""
    return os.environ.get("HARNESS_CACHE", str(Path.home() / ".cache" / "ppo-harness"))


def default_results_dir() -> str:
    """Results directory: ``$HARNESS_RESULTS/results`` if set, else ``./results``."""
    root = os.environ.get("HARNESS_RESULTS")
    return str(Path(root) / "results") if root else "results"


def default_reports_dir() -> str:
    """Reports directory: ``$HARNESS_RESULTS/reports`` if set, else ``./reports``."""
    root = os.environ.get("HARNESS_RESULTS")
    return str(Path(root) / "reports") if root else "reports"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts to dotted keys: ``{"ppo": {"lam": 1}} -> {"ppo.lam": 1}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


#: Keys that are aliases of another key of the same mapping, by the mapping's path: a layer that sets the alias
#: replaces the other key of the layers below it (a variant's ``ppo.loss_type: grpo`` overrides a base's
#: ``ppo.loss_agg``). Only under ``ppo``: another section may one day have a key of the same name.
ALIAS_KEYS: dict[tuple[str, ...], dict[str, str]] = {("ppo",): {"loss_type": "loss_agg"}}


def deep_update(base: dict[str, Any], upd: dict[str, Any], _path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Recursively merge ``upd`` into a copy of ``base`` (dicts merge, other values replace; in a mapping that
    :data:`ALIAS_KEYS` names, an alias in ``upd`` drops what it aliases from ``base``, and the other way round)."""
    out = dict(base)
    for alias, target in ALIAS_KEYS.get(_path, {}).items():
        if alias in upd and target not in upd:
            out.pop(target, None)
        if target in upd and alias not in upd:
            out.pop(alias, None)
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_update(out[k], v, (*_path, k))
        else:
            out[k] = v
    return out


def parse_overrides(overrides: list[str] | None) -> dict[str, Any]:
    """Turn ``["ppo.kl_coef=0.1", "seed=2"]`` into a nested dict; values are parsed as YAML.

    Raises:
        ConfigError: an item without ``=``, an empty key part (``ppo..lr``), a value that is not
            YAML, or a key that both sets a value and goes below it (``ppo.lr=1 ppo.lr.x=2``); one line.
    """
    from harness.infra.safety import load_yaml, one_line

    nested: dict[str, Any] = {}
    for item in overrides or []:
        shown = one_line(repr(item), 80)
        if "=" not in item:
            raise ConfigError(f"override {shown}: expected key=value, e.g. ppo.kl_coef=0.1")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(p.strip() for p in parts):
            raise ConfigError(f"override {shown}: empty key part; expected dotted keys, e.g. ppo.kl_coef=0.1")
        try:
            value = load_yaml(raw) if raw != "" else None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {shown}: the value is not valid YAML ({one_line(e, 120)})") from None
        node = nested
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {shown}: {'.'.join(parts[: i + 1])} is set to a value by another "
                                  "override, so it has no keys below it")
        if isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict):
            raise ConfigError(f"override {shown}: {key.strip()} has keys set below it by another override")
        node[parts[-1]] = value
    return nested
