"""What the reports say now against what they said at a git revision: one line per judged claim.

``harness changes --since REF`` reads every shipped ablation's ``summary.json`` from the reports directory and from
git revision ``REF`` of it (``git show REF:./<name>/summary.json``), turns both into scorecard rows
(:func:`harness.reporting.scorecard.all_rows`, so a full-scale verdict replaces the default one exactly as in the scorecard) and
prints, for every claim with a verdict now, its n per arm, interval and verdict, and whether that changed: ``new`` (no
verdict at REF), ``unchanged``, or ``was`` with the verdict, n and interval it had. At REF each report's verdicts are
taken as it wrote them (``as_written``), also where its runs' configs or its rule are not the spec's now, as for a
report that a regeneration replaced: the scorecard withholds those, but what changed is what a reader saw. A report
not rewritten since REF (the same summaries then and now, :func:`untouched`) is read as now on both sides: unchanged. This is the list a researcher reads
after regenerating reports (and the one line per finding a change's note gives).
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional

from harness.config import default_reports_dir
from harness.errors import HarnessError

#: The fields a row's verdict is compared on.
COMPARED = ("verdict", "n_a", "n_b", "diff", "ci_low", "ci_high")
#: The claim kinds (``harness.experiments.spec.Claim.kind``), in the scorecard's order.
KINDS = ("finding", "mechanism", "control")


def read_at(ref: str, reports: Optional[Path] = None) -> Callable[[str, str], Optional[dict[str, Any]]]:
    """A :func:`harness.reporting.scorecard.all_rows` reader of the reports directory as committed at git revision ``ref``.

    Raises:
        HarnessError: ``ref`` is not a revision of the repository holding the reports directory (or git is missing).
    """
    from harness.reporting.ablation import report_dir

    reports = Path(reports or default_reports_dir()).resolve()
    try:
        subprocess.run(["git", "-C", str(reports), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                       check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        raise HarnessError(f"--since: {ref!r} is not a git revision of the repository of {reports}") from None

    @functools.lru_cache(maxsize=None)
    def committed(name: str, scale: str) -> Optional[str]:  # one `git show` per report, however often it is read
        rel = report_dir(name, scale, Path(".")) / "summary.json"
        r = subprocess.run(["git", "-C", str(reports), "show", f"{ref}:./{rel.as_posix()}"], capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None  # None: no report at that revision

    def read(name: str, scale: str) -> Optional[dict[str, Any]]:
        text = committed(name, scale)
        if text is None:
            return None
        try:
            return json.loads(text)  # parsed afresh: a reader may change what it is given
        except ValueError:
            return None

    return read


def _has_verdict(row: dict[str, Any]) -> bool:
    return not str(row["verdict"]).startswith("no verdict")


def _key(row: dict[str, Any]) -> tuple:
    return row["ablation"], row["claim"], row["metric"], row.get("a"), row.get("b")


def compare(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pair each judged row of ``new`` with the row of the same claim in ``old`` (ablation, claim text, metric, arms).

    Returns:
        one entry per row of ``new`` that has a verdict, in ``new``'s order: ``{"row", "status", "old"}`` with
        ``status`` ``"new"`` (no verdict in ``old``), ``"unchanged"`` (same verdict, n per arm and interval to 4
        significant digits) or ``"changed"``; ``old`` is the old row or None.
    """
    before = {_key(r): r for r in old}
    out = []
    for r in new:
        if not _has_verdict(r):
            continue
        o = before.get(_key(r))
        if o is None or not _has_verdict(o):
            status = "new"
        elif all(_same(r.get(f), o.get(f)) for f in COMPARED):
            status = "unchanged"
        else:
            status = "changed"
        out.append({"row": r, "status": status, "old": o if o is not None and _has_verdict(o) else None})
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return f"{a:.4g}" == f"{b:.4g}"
    return a == b


def _judged(r: dict[str, Any]) -> str:
    """``n 8/8, +0.0189 [+0.005, +0.034], reproduced``; an undecided row adds why it could not decide (:func:`_power`)."""
    eff = f"{r['diff']:+.3g} [{r['ci_low']:+.3g}, {r['ci_high']:+.3g}]" if r.get("diff") is not None else "no interval"
    power = _power(r)
    return f"n {r.get('n_a')}/{r.get('n_b')}, {eff}, {r['verdict']}" + (f" ({power})" if power else "")


def _power(r: dict[str, Any]) -> Optional[str]:
    """For a judged row that decided nothing: what its seeds could detect against its margin, ``MDE 0.08 vs margin
    0.05`` (an effect of the margin's size would mostly go unseen when the MDE is larger), or for an equivalence
    claim ``TOST power at zero difference 0.62, margin 0.05``; for a claim whose boundary is the margin itself
    (``not_greater``: d < m; ``exceeds``: d > m; ``equivalent``: |d| < m) whose 95% interval contains ±m, also ``the interval contains
    the margin``: the estimate sits at the boundary, which more seeds narrow towards but a sharper test alone would
    not decide; an MDE of 0 (no spread) says every seed gave the same value. None for a decided row or when neither
    is known."""
    if r.get("decisive") is not False or r.get("margin") is None:
        return None
    m = float(r["margin"])
    if r.get("expect") == "equivalent":
        p = r.get("tost_power_at_zero")
        why = f"TOST power at zero difference {p:.4g}, margin {m:g}" if p is not None else None
        bounds = (-m, m)
    else:
        why = f"MDE {r['mde']:.3g} vs margin {m:g}" if r.get("mde") is not None else None
        if r.get("mde") == 0:  # no spread: every seed of both arms gave one value, so no seed count would decide it
            why = "every seed of both arms gave the same value"
        bounds = (m,) if r.get("expect") in ("not_greater", "exceeds") else ()
    lo, hi = r.get("ci_low"), r.get("ci_high")
    if why and lo is not None and hi is not None and any(lo <= b <= hi for b in bounds):
        why += "; the interval contains the margin"
    return why


def _at_scale(r: dict[str, Any]) -> str:
    return f"at the {r.get('scale') or 'default'} scale: "


def change_lines(entries: list[dict[str, Any]], kinds: tuple[str, ...] = KINDS) -> list[str]:
    """One line per :func:`compare` entry of the given claim kinds: ``ablation (kind): claim — judged; status``.
    Where the verdict then and now come from reports of different scales (a full-scale report's verdict replaced the
    default one then, and is withheld now, or the reverse), both sides name their scale:
    ``… — at the default scale: n 10/10, …; was at the full scale: n 10/10, …``."""
    lines = []
    for e in entries:
        r = e["row"]
        if r["kind"] not in kinds:
            continue
        claim = " ".join(str(r["claim"]).split())
        claim = claim if len(claim) <= 90 else claim[:89] + "…"
        now, status = _judged(r), {"new": "new", "unchanged": "unchanged"}.get(e["status"])
        if status is None:
            was = _judged(e["old"])
            if e["old"].get("scale") != r.get("scale"):  # e.g. a full-scale verdict then, the default one now
                now, was = f"{_at_scale(r)}{now}", f"{_at_scale(e['old'])}{was}"
            status = f"was {was}"
        lines.append(f"{r['ablation']} ({r['kind']}): {claim} — {now}; {status}")
    return lines


def untouched(names: set[str], then: Callable[[str, str], Optional[dict[str, Any]]],
              now: Callable[[str, str], Optional[dict[str, Any]]]) -> set[str]:
    """The ablations of ``names`` whose every report (the default scale's and each separate scale's, e.g. a
    full-scale one) reads the same ``summary.json`` through ``then`` (:func:`read_at`) as through ``now``: reports not
    rewritten between the two. Raises nothing."""
    from harness.reporting.ablation import SEPARATE_SCALES

    return {n for n in names if all(then(n, s) == now(n, s) for s in ("default", *SEPARATE_SCALES))}


def verdict_changes(since: str, reports: Optional[Path] = None, kinds: tuple[str, ...] = KINDS,
                    only_changed: bool = False) -> list[str]:
    """The lines of ``harness changes``: every judged claim of the reports now against revision ``since``.

    Args:
        kinds: the claim kinds to list (of :data:`KINDS`).
        only_changed: leave out the claims whose verdict, n and interval are unchanged.
    Raises:
        HarnessError: a kind not in :data:`KINDS` (before anything is read); ``since`` is not a git revision
            (:func:`read_at`).
    """
    from harness.reporting.scorecard import all_rows, reports_reader

    bad = sorted(set(kinds) - set(KINDS))
    if bad:
        raise HarnessError(f"--kind: {', '.join(bad)} is not a claim kind; allowed: {', '.join(KINDS)}")
    then, now = read_at(since, reports), reports_reader(reports)
    old, _ = all_rows(then, as_written=True)
    new, _ = all_rows(now)
    # a report not rewritten since REF cannot have moved: read it the same way on both sides (as_written would bring
    # back a verdict the scorecard withheld at REF already, e.g. a stale full-scale one, and list it at every REF)
    same = untouched({r["ablation"] for r in new}, then, now)
    old = [r for r in old if r["ablation"] not in same] + [r for r in new if r["ablation"] in same]
    entries = [e for e in compare(old, new) if not (only_changed and e["status"] == "unchanged")]
    return change_lines(entries, kinds)


__all__ = ["COMPARED", "KINDS", "read_at", "compare", "change_lines", "untouched", "verdict_changes"]
