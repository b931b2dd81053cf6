"""Report text from Jinja2 templates (``harness/reporting/templates/<kind>.md.j2``, one per report kind), and the two
cell formatters every report uses.

The templates get plain data (dicts, lists, strings, numbers) and two filters: ``fmt`` (:func:`fmt`) and
``cell`` (:func:`md_cell`). The environment keeps the text exactly as written: no autoescaping (the
output is markdown), block tags leave no blank lines behind (``trim_blocks``, ``lstrip_blocks``). Also here, as
every report kind says it: which gold judged an ablation's RLHF runs (:func:`judge_of`, :func:`judge_note`).
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


#: The short name of review_sentiment's gold when it scores sentiment alone (``pipeline.gold.naturalness: off``).
SENTIMENT_ONLY = "sentiment only"


def judge_of(spec: Any, scale: str = "default") -> Optional[str]:
    """Which gold judges ablation ``spec``'s RLHF runs (its baseline arm's config at ``scale``):
    ``"sentiment only"`` (:data:`SENTIMENT_ONLY`) where ``pipeline.gold.naturalness`` is off, else
    ``"sentiment + naturalness (<naturalness_negatives>)"``; None for a task without a gold scorer (chain_sum's
    verifier is exact) or a config that does not resolve.

    The sentiment-only gold rewards degenerate text (loops of a positive n-gram) as readily as natural text, so a
    verdict on gold read through it can be wrong where an arm degenerates (``docs/testbeds.md``).

    Raises nothing: a spec whose baseline does not resolve (:class:`~harness.errors.HarnessError`, including
    ``ConfigError``) has no judge to name, and its report says why elsewhere."""
    from harness.experiments.spec import resolve_config
    from harness.errors import HarnessError

    try:
        cfg = resolve_config(spec, scale, spec.baseline, 0)
    except (HarnessError, ValueError, KeyError):
        return None
    if cfg.task.name != "review_sentiment":
        return None
    gold = cfg.pipeline.gold
    return SENTIMENT_ONLY if gold.naturalness == "off" else f"sentiment + naturalness ({gold.naturalness_negatives})"


def judge_note(spec: Any, scale: str) -> Optional[str]:
    """The report's "Gold." line: which gold judged its RLHF runs (:func:`judge_of`),
    with a warning where it is the sentiment-only one; None for a task without a gold scorer."""
    judge = judge_of(spec, scale)
    if judge is None:
        return None
    if judge == SENTIMENT_ONLY:
        return (f"{judge} (`pipeline.gold.naturalness: off`). This gold rewards degenerate text as readily as natural "
                "text, so a verdict on gold can be wrong where an arm degenerates: read the distinct-2 and degenerate "
                "columns with it")
    return (f"{judge}: the sentiment model less a penalty for text its naturalness head calls degenerate "
            "(`docs/testbeds.md`)")
