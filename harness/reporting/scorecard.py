"""One scorecard for every claim of every shipped ablation: ``reports/README.md``.

:func:`write_scorecard` reads each shipped spec (``ablations/*.yaml``) and the ``summary.json`` of its
report (and of its full-scale report, ``<name>/full/``, where one is committed, whose verdict replaces the default
one: its seeds include the default scale's), and writes one row per claim, findings, mechanism checks and negative
controls apart: claim, source, kind, setting note, metric, n per arm, effect [95% CI], p adj, MDE, verdict, caveats. A claim whose report was made under another spec or rule (or
is missing) is listed with no verdict and the reason. :func:`report_all` first rewrites each report
from the MLflow store where that store holds its runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

from harness.config import default_reports_dir
from harness.reporting.planning import _report_key, arm_configs, going_on, shared_runs, why_undecided
from harness.reporting.render import SENTIMENT_ONLY, claim_title, judge_of


def _summary(reports: Path, name: str, scale: str = "default") -> Optional[dict[str, Any]]:
    from harness.reporting.ablation import report_dir

    p = report_dir(name, scale, reports) / "summary.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def reports_reader(reports: Optional[Path] = None) -> Callable[[str, str], Optional[dict[str, Any]]]:
    """An :func:`all_rows` reader of the reports directory as it is on disk (default: the configured one): ``(name,
    scale) -> summary.json`` as a dict, or None where there is none or it does not parse."""
    root = Path(reports or default_reports_dir())
    return lambda name, scale: _summary(root, name, scale)


def withheld_reason(name: str, spec: Any, summary: Optional[dict[str, Any]]) -> Optional[str]:
    """Why ablation ``name``'s report (``summary.json`` as a dict) lends none of its verdicts under ``spec`` (its
    :class:`harness.experiments.spec.AblationSpec` now): its runs had other configs (its ``configs_digest`` is not
    :func:`harness.reporting.summary.configs_digest` of the spec at its scale, or it predates the digest), or it was
    judged under another rule (the fields of ``spec.verdict.reported()`` that differ, and the command that re-judges
    the runs). None for a current report or no report.

    Example: a report judged at min_seeds 6 where the spec asks for 10 → "report judged under another verdict rule
    (min_seeds 6 vs the spec's 10): `harness report NAME` re-judges its runs"."""
    from harness.reporting.summary import configs_digest

    if not summary:
        return None
    if summary.get("scale") and summary.get("configs_digest") != configs_digest(spec, summary["scale"]):
        return ("report made from runs of other configs than the spec resolves to now (e.g. before its regime or "
                "pipeline draws): re-run pending")
    # the whole rule: a report judged at min_seeds 5 lends no verdict under 10
    rule_then = summary.get("rule") or {}
    other_rule = ", ".join(f"{k} {rule_then.get(k, '–')} vs the spec's {v}" for k, v in spec.verdict.reported().items()
                           if rule_then.get(k) != v)
    return f"report judged under another verdict rule ({other_rule}): `harness report {name}` re-judges its runs" \
        if other_rule else None


def scorecard_rows(name: str, summary: Optional[dict[str, Any]], as_written: bool = False) -> list[dict[str, Any]]:
    """The judged rows of ablation ``name``'s claims, in spec order.

    A claim is matched to a row of ``summary["verdicts"]`` by its text, kind, metric, arms, expectation and
    margin; an unmatched claim, any claim of a summary judged under another rule than the spec's
    (another test, ``alpha``, ``min_seeds`` or ``power``), and every claim of a summary whose ``configs_digest``
    differs from the spec's now (:func:`harness.reporting.summary.configs_digest`: its runs had other configs), gets a
    row whose ``verdict`` says why there is none (for another rule, the fields that differ and the command that
    re-judges the runs). ``as_written``: lend the summary's verdicts whatever its rule and
    configs (what a report said when it was committed, for :mod:`harness.reporting.changes`); unmatched claims still
    get no verdict. Each row's ``judge`` is :func:`judge_of` the spec at the report's scale.
    """
    from harness.experiments.ablate import load_spec
    from harness.analysis.verdicts import expected_text

    spec = load_spec(name, validate_configs=False)
    judged = {}
    withheld = None if as_written else withheld_reason(name, spec, summary)
    if summary and not withheld:
        for v in summary.get("verdicts", []):
            judged[(v.get("claim"), v.get("kind"), v.get("metric"), v.get("a"), v.get("b"), v.get("expect"), v.get("margin"))] = v
    rows = []
    judge = judge_of(spec, (summary or {}).get("scale") or "default")
    run_here = spec.claims_for(summary["scale"]) if summary and summary.get("scale") else spec.claims
    for c in spec.claims:
        v = judged.get((c.claim, c.kind, c.metric, c.a, c.b, c.expect, c.margin))
        if v is None:
            why = "no report yet" if summary is None else (withheld or "report predates this claim: re-run pending")
            if summary is not None and c not in run_here:
                why = f"its arms are not run at the {summary['scale']} scale"
            v = {"claim": c.claim, "kind": c.kind, "source": c.source, "section": c.section, "setting_note": c.setting_note,
                 "metric": c.metric, "expected": expected_text(c), "margin": c.margin, "n_a": None, "n_b": None, "diff": None,
                 "ci_low": None, "ci_high": None, "p_adj": None, "mde": None, "verdict": f"no verdict ({why})",
                 "decisive": False, "caveats": []}
        rows.append({**v, "title": claim_title(c.claim, c.title), "ablation": name, "scale": (summary or {}).get("scale"),
                     "power": spec.verdict.power, "judge": judge})
    return rows


def _compute_line(costs: dict[str, Optional[dict[str, Any]]]) -> str:
    """The scorecard's compute sentence from the reports' ``cost`` entries (None: a report that predates cost
    accounting): runs trained, each once (a run copied in from another ablation is counted apart), and their
    CPU-hours."""
    known = {k: v for k, v in costs.items() if v}
    missing = len(costs) - len(known)
    if not known:
        return f"Compute: none of the {missing} report(s) records it yet (they predate cost accounting)."
    hours = sum(float(v.get("cpu_hours") or 0) for v in known.values())
    copied = sum(int(v.get("copied") or 0) for v in known.values())
    runs = sum(int(v.get("runs") or 0) for v in known.values()) - copied
    return (f"Compute recorded by {len(known)} report(s): {runs} runs trained, {hours:.1f} CPU-hours (one core per run)"
            + (f"; {copied} more counted where another ablation's run of the same config was copied in (no compute, "
               "no second training)" if copied else "")
            + (f"; {missing} report(s) predate cost accounting" if missing else "") + ".")


def short_verdict(verdict: str, width: int = 60) -> str:
    """A verdict for a table cell: as it is up to ``width`` characters, else its first words before the reason in
    parentheses and a pointer to the reason, which the scorecard gives in full ("no verdict (judged under …)" →
    "no verdict (why: in full below)")."""
    return verdict if len(verdict) <= width else verdict.split(" (", 1)[0][:width] + " (why: in full below)"


#: The last part of a claim metric that the gold scorer enters: gold itself (final, at matched KL, its area or drop)
#: and collapse (held-out gold below the SFT policy's; ``harness.rl.evaluation.COLLAPSED``, which the reporting
#: layer does not import, as that module loads torch). A part ``gold_*`` is one of the gold's heads (its sentiment).
GOLD_READS = ("gold", "collapsed")


def _reads_gold(row: dict[str, Any]) -> bool:
    """Whether a scorecard row's claim metric is computed from the gold scorer (:data:`GOLD_READS`:
    ``eval_final/gold``, ``matched_kl/gold``, ``eval_final/collapsed``, ``eval_final/gold_sentiment`` …), not from
    the policy alone (KL, clip fraction, entropy, EOS rate, distinct-n). Raises nothing: a row without a metric is
    not."""
    last = str(row.get("metric") or "").rsplit("/", 1)[-1]
    return last in GOLD_READS or last.startswith("gold_")


def _read_blind(row: dict[str, Any]) -> bool:
    """Whether a scorecard row is a judged claim read through review_sentiment's sentiment-only gold (its
    ``judge`` is :data:`~harness.reporting.render.SENTIMENT_ONLY` and it has seeds): the rows the scorecard marks ‡."""
    return row.get("judge") == SENTIMENT_ONLY and row["n_a"] is not None


def render_scorecard(rows: list[dict[str, Any]], costs: Optional[dict[str, Optional[dict[str, Any]]]] = None,
                     same: Optional[dict[tuple[str, str], str]] = None, figure: Optional[str] = None) -> str:
    """``reports/README.md`` text: counts by verdict, the decided fraction of findings (negative controls, which
    no verdict should decide, are counted apart: how many were judged and how many came out a false positive), the
    compute the reports record (``costs``: per report, its summary's ``cost`` or None for a report written before
    cost accounting), then one table row per claim, in three sections (findings, mechanism checks, negative
    controls: ablation, title, n, effect, :func:`short_verdict`), each undecided finding with :func:`why_undecided`'s
    reason, what going on would cost (:func:`going_on`, less the runs one config shares across ablations,
    :func:`shared_runs` over ``same``, by default :func:`arm_configs`), and every claim in full; ``figure``: the
    forest plot's file name, shown first. Rendered from ``harness/reporting/templates/scorecard.md.j2``."""
    from harness.reporting.render import md_cell, render
    from harness.reporting.ablation import SEPARATE_SCALES
    from harness.analysis.verdicts import BELOW_MARGIN

    counts: dict[str, int] = {}
    for r in rows:
        key = r["verdict"] if r["decisive"] or r["verdict"] == "inconclusive" else "no verdict"
        counts[key] = counts.get(key, 0) + 1
    again = sum(r.get("scale") in SEPARATE_SCALES for r in rows)
    findings = [r for r in rows if r["kind"] == "finding"]
    cells: list[dict[str, Any]] = []
    blind = [r for r in rows if _read_blind(r)]
    for r in rows:
        where = _report_key(r)
        mark = " ‡" if _read_blind(r) else ""
        cells.append({**r, "n": f"{r['n_a']} / {r['n_b']}" if r["n_a"] is not None else "–",
                      "eff": f"{r['diff']:+.4g} [{r['ci_low']:+.4g}, {r['ci_high']:+.4g}]" if r["diff"] is not None else "–",
                      "verdict": f"**{r['verdict']}**" if r["decisive"] else r["verdict"],
                      "title": r.get("title") or claim_title(r["claim"]),
                      "short_verdict": (f"**{r['verdict']}**" if r["decisive"] else short_verdict(r["verdict"])) + mark,
                      "link": f"[{r['ablation']}]({where}/report.md) ({r['scale']})" if r.get("scale") else r["ablation"],
                      "margin": f"{r['margin']:g}", "caveats": md_cell("; ".join(r.get("caveats") or [])) or "–",
                      "why": why_undecided(r)})
    head = f"{len(rows)} claims" + (f" ({again} read at full scale, whose seeds include the default scale's: the full-scale "
                                    "verdict replaces the default one, so no seed is counted twice)" if again else "")
    controls = [r for r in rows if r["kind"] == "control"]
    groups = going_on(rows, costs or {})
    return render(
        "scorecard", findings_rows=[c for c in cells if c["kind"] == "finding"],
        mechanism_rows=[c for c in cells if c["kind"] == "mechanism"],
        control_rows=[c for c in cells if c["kind"] == "control"], counts=sorted(counts.items()), head=head,
        findings={"decided": sum(bool(r["decisive"]) for r in findings), "n": len(findings),
                  "below": sum(r["verdict"] == BELOW_MARGIN for r in findings)} if findings else None,
        controls={"judged": sum(bool(r["decisive"]) or r["verdict"] == "inconclusive" for r in controls),
                  "false": sum(bool(r["decisive"]) for r in controls), "n": len(controls)} if controls else None,
        compute=_compute_line(costs) if costs else "", going_on=groups, figure=figure,
        blind={"n": len(blind), "findings": sum(r["kind"] == "finding" and bool(r["decisive"]) for r in blind),
               "reports": len({r["ablation"] for r in blind}), "gold": sum(_reads_gold(r) for r in blind)}
        if blind else None,
        shared=shared_runs(groups, arm_configs(groups) if same is None else same))


def all_rows(read: Callable[[str, str], Optional[dict[str, Any]]],
             as_written: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every shipped ablation's :func:`scorecard_rows`, a committed full-scale report's verdicts replacing the default
    ones, and each report's ``cost`` (None for one that predates cost accounting), keyed ``name`` or ``name/scale``.

    Args:
        read: ``(name, scale) -> summary.json`` as a dict, or None where there is none (the reports directory, or
            a git revision of it: :func:`harness.reporting.changes.read_at`).
        as_written: the verdicts as each report wrote them, even where its rule or configs are not the spec's now
            (:func:`scorecard_rows`).
    """
    from harness.experiments.ablate import list_ablations
    from harness.reporting.ablation import SEPARATE_SCALES

    rows: list[dict[str, Any]] = []
    costs: dict[str, Optional[dict[str, Any]]] = {}
    for name in list_ablations():
        summary = read(name, "default")
        mine = scorecard_rows(name, summary, as_written)
        if summary is not None:
            costs[name] = summary.get("cost")
        for scale in SEPARATE_SCALES:  # a committed full-scale report's verdict replaces the default one's
            summary = read(name, scale)
            if summary is not None and summary.get("scale") == scale:
                mine = [f if not f["verdict"].startswith("no verdict") else d
                        for d, f in zip(mine, scorecard_rows(name, summary, as_written))]
                costs[f"{name}/{scale}"] = summary.get("cost")
        rows += mine
    return rows, costs


def stale_reports(read: Callable[[str, str], Optional[dict[str, Any]]]) -> dict[str, str]:
    """Every shipped ablation's report (default scale, keyed ``name``, and a separate full-scale one, keyed
    ``name/scale``) that lends the scorecard no verdict, with :func:`withheld_reason`'s reason. ``read`` as for
    :func:`all_rows`. A stale full-scale report matters apart: its verdicts would replace the default ones."""
    from harness.experiments.ablate import list_ablations, load_spec
    from harness.reporting.ablation import SEPARATE_SCALES

    out: dict[str, str] = {}
    for name in list_ablations():
        for scale in ("default", *SEPARATE_SCALES):
            summary = read(name, scale)
            if summary is None or (scale != "default" and summary.get("scale") != scale):
                continue
            why = withheld_reason(name, load_spec(name, validate_configs=False), summary)
            if why:
                out[name if scale == "default" else f"{name}/{scale}"] = why
    return out


def write_scorecard(reports: Optional[Path] = None, echo: Optional[Callable[[str], None]] = None) -> Path:
    """Write ``<reports>/README.md`` from the committed or fresh ``summary.json`` of every shipped ablation; ``echo``
    (e.g. ``print``) gets one line per report that lends it no verdict (:func:`stale_reports`). Returns its path."""
    import functools

    reports = Path(reports or default_reports_dir())
    read = functools.cache(reports_reader(reports))  # each summary.json parsed once for the rows and the stale list
    rows, costs = all_rows(read)
    reports.mkdir(parents=True, exist_ok=True)
    from harness.reporting.plots import plot_scorecard_forest

    figure = plot_scorecard_forest(rows, reports / "scorecard_forest.png")
    path = reports / "README.md"
    path.write_text(render_scorecard(rows, costs, figure=figure.name if figure else None))
    for name, why in (stale_reports(read) if echo else {}).items():
        echo(f"no verdict from the report of {name}: {why}")
    return path


def report_all(refresh: bool = True, scale: str = "default", echo: Optional[Callable[[str], None]] = None) -> Path:
    """Rewrite each shipped ablation's report from its ``scale`` runs in the MLflow store where the store has finished
    ones (``refresh``; any other keeps its committed report), then the scorecard. ``echo`` (e.g. ``print``) gets one
    line per ablation: the report rewritten, or why the committed one was kept. Returns the scorecard's path.

    Raises:
        ServiceError: ``refresh`` and the tracking store is unreachable (nothing is rewritten).
        HarnessError: no ablation is shipped, or none has a report (one line; no scorecard is written)."""
    from harness.experiments.ablate import list_ablations
    from harness.errors import HarnessError
    from harness.config.presets import scale_overrides
    from harness.reporting.ablation import write_report

    scale_overrides(scale)  # an unknown scale fails here, listing the valid ones
    if not (names := list_ablations()):
        raise HarnessError("nothing to report: no ablation spec is shipped (ablations/*.yaml)")
    if refresh:
        from harness.infra import tracking

        tracking.client()  # an unreachable store stops here, in one line, not once per ablation
        for name in names:
            try:
                path = write_report(name, scale=scale, require_runs=True)
            except HarnessError as e:  # nothing recorded for it in this store
                if echo:
                    echo(f"kept the committed report of {name}: {e}")
                continue
            if echo:
                echo(f"rewrote {path}")
    if not any(reports_reader()(name, "default") for name in names):
        raise HarnessError(f"nothing to report: no shipped ablation has a report under {default_reports_dir()}")
    return write_scorecard(echo=echo)
