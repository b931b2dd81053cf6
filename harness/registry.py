"""Named registries of swappable components.

Every ablation axis owns one :class:`Registry`. A variant is one function, registered by name
with a decorator; the PPO loop looks variants up by the name found in the config and never
imports a variant directly. Adding a variant therefore means writing one decorated function:
the config field that names the axis is a :func:`component` type, which validates a name against
the registry when a config is built, so a variant registered anywhere (a test module, a user's
plugin) is selectable from YAML with no other edit.

A registry may declare its variants' signature as a ``typing.Protocol``; a function whose
parameters differ from the protocol's ``__call__`` is refused at registration.

Pattern after verl's ``@register_adv_est`` / ``@register_policy_loss`` decorators.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Annotated, Any, Callable, Generic, Iterator, Optional, TypeVar

from pydantic import AfterValidator

F = TypeVar("F", bound=Callable[..., Any])

#: Every registry by its axis (the config field it serves, e.g. ``"ppo.loss_agg"``).
REGISTRIES: dict[str, "Registry[Any]"] = {}
#: Modules whose import registers the shipped variants of every axis.
_REGISTERING_MODULES = ("harness.rl.components", "harness.rl.rollout", "harness.tasks")


class UnknownComponentError(KeyError):
    """Raised when a config names a variant that no registry holds.

    The message names the axis, the bad name, the closest match and every registered name.
    """

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0])


class Registry(Generic[F]):
    """A mapping ``name -> component`` for one ablation axis.

    Args:
        axis: the config field this registry serves (e.g. ``"ppo.loss_agg"``); used in errors and
            as the key of :data:`REGISTRIES`.
        signature: a ``typing.Protocol`` whose ``__call__`` every variant must match (the same
            parameter names, kinds and order), or None (no check; classes are registered as factories).
        doc: one line on what the axis decides (docs/components.md's component list).

    Each entry may carry metadata (e.g. ``needs_critic=False`` for critic-free advantage
    estimators), read back with :meth:`meta`.

    Raises:
        ValueError: another registry already serves ``axis``.
    """

    def __init__(self, axis: str, signature: Optional[type] = None, doc: str = "") -> None:
        if axis in REGISTRIES:
            raise ValueError(f"a registry for {axis!r} already exists")
        self.axis = axis
        self.signature = signature
        self.doc = doc
        self._items: dict[str, F] = {}
        self._meta: dict[str, dict[str, Any]] = {}
        REGISTRIES[axis] = self

    def register(self, name: str, **meta: Any) -> Callable[[F], F]:
        """Decorator: register ``fn`` under ``name``.

        Raises:
            ValueError: if ``name`` is already registered on this axis, or ``fn``'s parameters differ
                from the axis's declared signature.
        """

        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.axis}: variant {name!r} is already registered")
            if self.signature is not None:
                want = _params(self.signature.__call__, skip_self=True)
                got = _params(fn)
                if got != want:
                    raise ValueError(f"{self.axis}: variant {name!r} takes ({', '.join(got)}), but the axis "
                                     f"declares ({', '.join(want)}) ({self.signature.__name__})")
            self._items[name] = fn
            self._meta[name] = dict(meta)
            return fn

        return deco

    def get(self, name: str) -> F:
        """Return the component registered under ``name``.

        Raises:
            UnknownComponentError: naming the axis, a close match if any, and all valid names.
        """
        if name not in self._items:
            raise UnknownComponentError(self.unknown_message(name))
        return self._items[name]

    def unknown_message(self, name: str, with_axis: bool = True) -> str:
        """The one-line error for an unknown variant ``name`` on this axis (prefixed by the axis
        unless ``with_axis`` is False, for callers that name the field themselves)."""
        close = difflib.get_close_matches(str(name), self.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        msg = f"unknown variant {name!r}{hint}; choose from: {', '.join(self.names())}"
        return f"{self.axis}: {msg}" if with_axis else msg

    def meta(self, name: str) -> dict[str, Any]:
        """Metadata given at registration for ``name`` (empty dict if none)."""
        self.get(name)
        return self._meta[name]

    def knobs(self, name: str, source: Any) -> dict[str, Any]:
        """The config knobs that variant ``name`` reads (registry meta ``knobs``: field names), with their values
        on ``source`` (e.g. the ``PPOConfig``): ``{}`` for a variant that names none.

        Example: a policy loss registered with ``knobs=("sapo_tau_pos",)`` → ``{"sapo_tau_pos": 1.0}``.
        Raises:
            UnknownComponentError: ``name`` is not registered. AttributeError: ``source`` lacks a named knob.
        """
        return {k: getattr(source, k) for k in self.meta(name).get("knobs", ())}

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def _params(fn: Callable[..., Any], skip_self: bool = False) -> list[str]:
    """``fn``'s parameters as ``name`` (positional), ``*name`` / ``**name`` or ``name=`` (keyword-only)."""
    out = []
    for i, q in enumerate(inspect.signature(fn).parameters.values()):
        if skip_self and i == 0:
            continue
        out.append({q.VAR_POSITIONAL: f"*{q.name}", q.VAR_KEYWORD: f"**{q.name}",
                    q.KEYWORD_ONLY: f"{q.name}="}.get(q.kind, q.name))
    return out


def _register_shipped() -> None:
    """Import the modules whose import registers the shipped variants (cached after the first call)."""
    for module in _REGISTERING_MODULES:
        importlib.import_module(module)


def registry(axis: str) -> Registry[Any]:
    """The registry serving config field ``axis`` (e.g. ``"ppo.policy_loss"``), after importing the
    modules that register the shipped variants.

    Raises:
        KeyError: no registry serves ``axis``.
    """
    _register_shipped()
    if axis not in REGISTRIES:
        raise KeyError(f"no registry serves {axis!r}; registries: {', '.join(sorted(REGISTRIES))}")
    return REGISTRIES[axis]


def component(axis: str) -> Any:
    """A pydantic field type for a config field naming a variant of ``axis``: a ``str`` validated
    against :func:`registry` ``(axis)`` when the config is built (not when this module is imported),
    so variants registered after the config classes are defined are accepted too.

    Usage: ``kl_estimator: component("ppo.kl_estimator") = "k1"``. An unknown name fails validation
    with the registry's one-line message (the closest match and every valid name).
    """

    def check(value: str) -> str:
        reg = registry(axis)
        if value not in reg:
            raise ValueError(reg.unknown_message(value, with_axis=False))
        return value

    return Annotated[str, AfterValidator(check)]


def component_table() -> str:
    """The component list of docs/components.md, generated from the registries: one line per axis,
    ``axis`` followed by its variants in registration order and the axis's one-line doc."""
    _register_shipped()
    lines = []
    for axis in sorted(REGISTRIES):
        reg = REGISTRIES[axis]
        doc = f": {reg.doc}" if reg.doc else ""
        lines.append(f"- `{axis}`: {' | '.join(f'`{n}`' for n in reg.names())}{doc}")
    return "\n".join(lines)


#: The generated component list of ``docs/components.md`` lies between these two lines.
DOCS_MARKERS = ("<!-- components: generated by `harness components --write-docs` -->", "<!-- components: end -->")


def write_docs_components(page: Optional[str] = None) -> str:
    """Replace the block between :data:`DOCS_MARKERS` in ``docs/components.md`` (or ``page``) with
    :func:`component_table`. Returns the page's path.

    Raises:
        ValueError: the page lacks the markers.
    """
    from pathlib import Path

    path = Path(page) if page else Path(__file__).resolve().parent.parent / "docs" / "components.md"
    text = path.read_text()
    begin, end = DOCS_MARKERS
    if begin not in text or end not in text:
        raise ValueError(f"{path.name} has no component block ({begin} ... {end})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{component_table()}\n{end}{tail}")
    return str(path)
