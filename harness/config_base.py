"""The base of every config model: strict pydantic models, the one hash behind config identities, the
config error, and the default directories (``$HARNESS_CACHE``, ``$HARNESS_RESULTS``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, ClassVar

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
