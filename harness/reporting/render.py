"""Report text from Jinja2 templates (``harness/reporting/templates/<kind>.md.j2``, one per report kind), and the two
cell formatters every report uses.

The templates get plain data (dicts, lists, strings, numbers) and two filters: ``fmt`` (:func:`fmt`) and
``cell`` (:func:`md_cell`). The environment keeps the text exactly as written: no autoescaping (the
output is markdown), block tags leave no blank lines behind (``trim_blocks``, ``lstrip_blocks``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from functools import lru_cache
from typing import Any, Optional

TEMPLATE_DIR = "templates"


def fmt(x: Any, digits: int = 4) -> str:
    """A number for a report cell: ``digits`` significant digits (``g`` format) for a float, ``–`` for None,
    NaN or ±inf, ``str(x)`` for anything else. Example: ``fmt(0.123456) == "0.1235"``."""
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if math.isfinite(x) else "–"
    return str(x)


def md_cell(s: Any) -> str:
    """``s`` as one markdown table cell: whitespace runs (newlines included) collapsed to one space, ``|``
    escaped, and control and format characters (Unicode categories Cc, Cf: NUL, ESC, zero-width marks, which a
    policy's sampled bytes can hold) written as ``\\xNN`` / ``\\uNNNN`` escapes, so a report stays plain text.
    Examples: ``md_cell("a |\\n b") == "a \\\\| b"``, ``md_cell("a\\x00b") == "a\\\\x00b"``."""
    text = " ".join(str(s).split()).replace("|", "\\|")
    return "".join(_visible(ch) for ch in text)


def _visible(ch: str) -> str:
    """``ch``, or its escape when it is a control or format character (category Cc or Cf)."""
    if unicodedata.category(ch) not in ("Cc", "Cf"):
        return ch
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def claim_title(claim: str, title: Optional[str] = None, width: int = 80) -> str:
    """A claim's short name for the first tables of a report and the scorecard: its spec's ``title`` when given, else
    the claim's first sentence (a full stop after an abbreviation such as "Dr." or "e.g." ends none), cut at the
    last word boundary that keeps it within ``width`` characters (``…`` marking the cut). Example:
    ``claim_title("A larger β keeps the policy closer. More text.") == "A larger β keeps the policy closer."``."""
    if title:
        return title
    text = " ".join(claim.split())
    ends = [m.start() for m in re.finditer(r"\. ", text) if not re.search(r"(\b(Dr|e\.g|i\.e|vs|al|cf|Fig|Eq|Sec)|\b[A-Z])$", text[:m.start()])]
    first = text[: ends[0]] + "." if ends else text
    if len(first) <= width:
        return first
    cut = first[: width - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("harness.reporting", TEMPLATE_DIR), autoescape=False,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["fmt"] = fmt
    env.filters["cell"] = md_cell
    return env


def render(kind: str, **data: Any) -> str:
    """The text of template ``<kind>.md.j2`` (``ablation``, ``study``, ``scorecard``) filled with ``data``.

    Raises:
        jinja2.TemplateNotFound: no template of that kind.
        jinja2.UndefinedError: the template reads a name ``data`` does not provide.
    """
    return _environment().get_template(f"{kind}.md.j2").render(**data)
