"""The one formatter of validation errors: configs, ablation specs and study specs name the field, the problem and
the allowed keys or values in one line (:func:`format_validation_error`)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import BaseModel, ValidationError


def format_validation_error(err: ValidationError, root: type[BaseModel], empty: str = "config") -> str:
    """One line per problem of a pydantic error: ``field: message (got value)``, joined by ``; ``.

    The one formatter of configs, ablation specs and study specs. An unknown key names the keys its
    model allows (the model is found by walking ``root``'s field annotations, through ``Optional``,
    ``list[...]`` and ``dict[str, ...]``); ``(got value)`` is added for scalar inputs the message does not
    already show; a dict-key error names the dict. ``empty`` names a problem of the whole document.

    Args:
        err: the validation error.
        root: the model that was validated (e.g. :class:`harness.config.Config`).
    """
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        if loc and loc[-1] == "[key]":  # dict-key errors: name the key's dict, not pydantic's marker
            loc = loc[:-1]
        where = ".".join(loc) or empty
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        if e["type"] == "extra_forbidden":
            model = _model_at(root, tuple(e["loc"][:-1]))
            allowed = f"; allowed keys: {', '.join(model.model_fields)}" if model else ""
            msg = f"unknown key{allowed}"
        elif e["type"] != "missing" and not isinstance(got, (dict, list)) and repr(got) not in msg:
            msg = f"{msg} (got {got!r})"
        lines.append(f"{where}: {msg}")
    from harness.infra.safety import join_problems

    return join_problems(lines)


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> Optional[type[BaseModel]]:
    """The pydantic model at ``loc`` below ``root`` (list indices and dict keys skipped), or None."""
    import types
    import typing

    def unwrap(t: Any) -> Any:
        while typing.get_origin(t) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            if len(args) != 1:
                return None
            t = args[0]
        if typing.get_origin(t) is Annotated:
            t = typing.get_args(t)[0]
        return t

    node: Any = root
    path = list(loc)
    while path:
        part = path.pop(0)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return None
            node = unwrap(field.annotation)
        elif typing.get_origin(node) in (list, dict):  # the index or key at ``part``
            node = unwrap(typing.get_args(node)[-1])
        else:
            return None
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


__all__ = ["format_validation_error"]
