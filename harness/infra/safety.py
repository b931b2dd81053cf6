"""What the harness may print, log or write: secrets redacted, messages on one bounded line, names
and output paths checked before any file is touched.

Every URI the harness shows (MLflow tracking URI, Optuna storage URL, any server) goes through
:func:`redact`; every error the CLI prints goes through :func:`one_line`; every run, ablation,
study and report name through :func:`check_name`; every output directory through
:func:`check_under`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

from harness.errors import HarnessError

#: ``scheme://user:password@`` or ``scheme://token@`` in any text.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s:/@?#]*)(?::[^\s/@?#]*)?@")
#: secrets passed as query parameters (``?password=…``, ``&token=…``).
_QUERY_SECRET = re.compile(r"(?i)(?P<key>[?&;](?:password|passwd|pwd|pass|token|access_token|secret|api_key|apikey|key)=)[^&;\s#]*")

#: Longest error line the CLI prints (characters); longer messages are cut with a count of the rest.
MAX_MESSAGE_CHARS = 800

#: A run, ablation, study or report name: a letter or digit, then letters, digits, ``_``, ``-``; no dots
#: or slashes, so a name can never reach outside its directory.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,63}")


def redact(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***``.

    ``http://user:pw@host`` → ``http://user:***@host``; ``https://TOKEN@host`` → ``https://***@host``
    (a user name alone may be a token); ``...?password=pw&x=1`` → ``...?password=***&x=1``.
    Anything else is left as it is. Applied to any string, so whole error messages can be passed.
    """
    def userinfo(m: re.Match) -> str:
        has_password = ":" in m.group(0)[len(m.group("scheme")):]
        user = m.group("user") if has_password else ""
        return f"{m.group('scheme')}{user + ':' if has_password else ''}***@"

    return _QUERY_SECRET.sub(lambda m: m.group("key") + "***", _USERINFO.sub(userinfo, str(text)))


def one_line(message: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` redacted (:func:`redact`), its whitespace runs folded to single spaces, and cut to
    ``limit`` characters with ``… (+N characters)`` when longer."""
    s = " ".join(redact(str(message)).split())
    if len(s) > limit:
        rest = len(s) - limit
        s = f"{s[:limit]}… (+{rest} characters)"
    return s


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a valid ``kind`` name (:data:`NAME_PATTERN`).

    Raises:
        HarnessError: the name is empty, too long, or holds a character outside ``A-Z a-z 0-9 _ -``
            (a path, ``..``, a dot); the message names the rule.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        shown = one_line(repr(name), 80)
        raise HarnessError(f"{kind} name {shown} is not allowed: use 1-64 letters, digits, '_' or '-', "
                           "starting with a letter or digit (no paths)")
    return name


def check_under(path: str | Path, roots: Iterable[str | Path], what: str) -> Path:
    """``path`` resolved (symlinks followed), checked to lie inside one of ``roots``.

    Raises:
        HarnessError: it lies outside every root; the message names ``what`` and the allowed roots.
    """
    p = Path(path).expanduser().resolve()
    resolved = [Path(r).expanduser().resolve() for r in roots]
    if not any(p == r or r in p.parents for r in resolved):
        raise HarnessError(f"{what} {str(path)!r} is outside the allowed directories: "
                           f"{', '.join(str(r) for r in resolved)}")
    return p


#: Problems listed in one error line; the rest are counted.
MAX_PROBLEMS = 5
#: Largest spec or config file read (bytes): a spec is a page of YAML, not a data file.
MAX_SPEC_BYTES = 1_000_000


def join_problems(problems: list[str], limit: int = MAX_PROBLEMS) -> str:
    """The first ``limit`` problems joined by ``; ``, then ``; … and N more problems``."""
    shown = "; ".join(problems[:limit])
    return shown + (f"; … and {len(problems) - limit} more problems" if len(problems) > limit else "")


def read_small_text(path: str | Path, what: str, limit: int = MAX_SPEC_BYTES) -> str:
    """The text of ``path``, refused before reading when it exceeds ``limit`` bytes.

    Raises:
        HarnessError: the file is larger than ``limit`` (the message gives both sizes), or is not UTF-8.
    """
    p = Path(path)
    size = p.stat().st_size
    if size > limit:
        raise HarnessError(f"{what} {p.name} is {size / 1e6:.1f} MB; a {what} is at most {limit / 1e6:.0f} MB of YAML")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise HarnessError(f"{what} {p.name} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def display_path(path: str | Path) -> str:
    """An absolute path as it may be shown or stored: relative to the project root when inside it,
    ``~/…`` when inside the home directory, else unchanged. Relative paths are returned as they are."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    project = Path(__file__).resolve().parents[2]
    for root, prefix in ((project, ""), (Path.home(), "~/")):
        try:
            rel = p.relative_to(root)
        except ValueError:
            continue
        return f"{prefix}{rel}" if str(rel) != "." else (prefix.rstrip("/") or ".")
    return str(path)


def _unique_key_loader() -> type:
    """A ``yaml.SafeLoader`` subclass whose mappings refuse a key that appears twice (PyYAML keeps the
    later value silently). Built once, on first use, so importing this module does not import yaml."""
    import yaml
    from yaml.constructor import ConstructorError

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # '<<' merge keys may repeat
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: SafeLoader's own error names it below
                        break
                    if first is not None:
                        raise ConstructorError(None, None, f"duplicate key {key!r} on line {key_node.start_mark.line + 1} "
                                               f"(first on line {first.line + 1}); a key may appear once")
                    seen[key] = key_node.start_mark
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


_LOADER: Any = None


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, except that a mapping with a duplicate key is refused: the YAML spec
    forbids it, and PyYAML would keep the later value without a word (a spec with two ``claims:`` keys
    would lose the first list).

    Raises:
        yaml.YAMLError: not valid YAML, or a duplicate key (``yaml.constructor.ConstructorError``, whose
            message names the key and the lines of both occurrences).
    """
    import yaml

    global _LOADER
    if _LOADER is None:
        _LOADER = _unique_key_loader()
    return yaml.load(text, Loader=_LOADER)  # noqa: S506  (a SafeLoader subclass)


def install_redacting_hooks() -> None:
    """Route exceptions that escape to Python's last-resort printers (``sys.excepthook`` for the main
    thread, ``threading.excepthook`` for others) through :func:`one_line`: one redacted line on stderr
    instead of a traceback whose frames may quote a URI with its password. Idempotent."""
    import sys
    import threading

    def show(kind: str, exc_type: type, exc: BaseException | None) -> None:
        sys.stderr.write(f"error: {one_line(f'{kind}{exc_type.__name__}: {exc}')}\n")

    sys.excepthook = lambda t, e, tb: show("", t, e)
    threading.excepthook = lambda a: show(f"in thread {a.thread.name if a.thread else '?'}: ", a.exc_type, a.exc_value)
