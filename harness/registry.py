"""Named registries of swappable components.

Every ablation axis owns one :class:`Registry`. A variant is one function, registered by name
with a decorator; the PPO loop looks variants up by the name found in the config and never
imports a variant directly. Adding a variant therefore means writing one decorated function.

Pattern after verl's ``@register_adv_est`` / ``@register_policy_loss`` decorators.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Generic, Iterator, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class UnknownComponentError(KeyError):
    """Raised when a config names a variant that no registry holds.

    The message names the axis, the bad name, the closest match and every registered name.
    """

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0])


class Registry(Generic[F]):
    """A mapping ``name -> component`` for one ablation axis.

    Args:
        axis: the config field this registry serves (e.g. ``"loss_agg"``); used in errors.

    Each entry may carry metadata (e.g. ``needs_critic=False`` for critic-free advantage
    estimators), read back with :meth:`meta`.
    """

    def __init__(self, axis: str) -> None:
        self.axis = axis
        self._items: dict[str, F] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[F], F]:
        """Decorator: register ``fn`` under ``name``.

        Raises:
            ValueError: if ``name`` is already registered on this axis.
        """

        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.axis}: variant {name!r} is already registered")
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

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
