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
from harness.render import claim_title


def _summary(reports: Path, name: str, scale: str = "default") -> Optional[dict[str, Any]]:
    from harness.report import report_dir

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
    :class:`harness.ablation_spec.AblationSpec` now): its runs had other configs (its ``configs_digest`` is not
    :func:`harness.report_summary.configs_digest` of the spec at its scale, or it predates the digest), or it was
    judged under another rule (the fields of ``spec.verdict.reported()`` that differ, and the command that re-judges
    the runs). None for a current report or no report.

    Example: a report judged at min_seeds 6 where the spec asks for 10 → "report judged under another verdict rule
    (min_seeds 6 vs the spec's 10): `harness report NAME` re-judges its runs"."""
    from harness.report_summary import configs_digest

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
    differs from the spec's now (:func:`harness.report_summary.configs_digest`: its runs had other configs), gets a
    row whose ``verdict`` says why there is none (for another rule, the fields that differ and the command that
    re-judges the runs). ``as_written``: lend the summary's verdicts whatever its rule and
    configs (what a report said when it was committed, for :mod:`harness.verdict_changes`); unmatched claims still
    get no verdict.
    """
    from harness.ablate import load_spec
    from harness.verdicts import expected_text

    spec = load_spec(name, validate_configs=False)
    judged = {}
    withheld = None if as_written else withheld_reason(name, spec, summary)
    if summary and not withheld:
        for v in summary.get("verdicts", []):
            judged[(v.get("claim"), v.get("kind"), v.get("metric"), v.get("a"), v.get("b"), v.get("expect"), v.get("margin"))] = v
    rows = []
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
                     "power": spec.verdict.power})
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


def why_undecided(r: dict[str, Any]) -> Optional[str]:
    """Why a scorecard row decides nothing, and what more seeds would buy; None for a decided row.

    Reads the row's verdict, its sequential design (``sequential``: seeds per arm at the last look ``n``, the
    ``cap``, ``at_cap`` and the ``looks`` with each one's ``p`` and boundary ``threshold``), the observed effect
    ``diff``, the claim's ``expect`` and ``margin`` m, and ``seeds_needed``: the seeds per arm at which the claim's
    test has the rule's power at a fixed n and the Holm-adjusted level when the true distance from its null is m
    (:func:`harness.stats.seeds_needed`: a difference of m for ``greater``, ``less`` and ``not_greater``, whose
    null is d ≥ m; for ``equivalent`` a true difference of 0 inside ±m). The observed distance from the null is
    |d̂| (``greater``, ``less``), m − d̂ (``not_greater``) or m − |d̂| (``equivalent``); scaled to it with
    n ∝ 1/distance² (the normal approximation), the observed effect needs about ``ceil(seeds_needed · (m /
    distance)²)`` seeds per arm, at least 2, and none when the distance is ≤ 0 (the estimate sits on the null). The
    staged boundary spends α over the looks, so a claim needs somewhat more than a fixed n. A staged row ends with
    what its claim could detect at the cap (:func:`power_at_cap`: the MDE against the margin, or TOST's power). A
    planning estimate from the observed spread, not a verdict.

    Example: a ``greater`` claim, m = 0.05, paused at 10 of 40 seeds per arm with d̂ = 0.2, ``seeds_needed`` 42 and
    look 1's p 2.6e-4 against its boundary 7.4e-7 gives "paused at 10 of 40 seeds per arm (look 1: p 0.00026 against
    its boundary 7.4e-07); at a fixed n, a true effect as observed needs about 3 seeds per arm (one at the margin's
    distance: 42): within the cap".
    """
    import math

    from harness.verdicts import UNTESTABLE

    verdict = str(r.get("verdict") or "")
    if r.get("decisive"):
        return None
    if verdict.startswith("no verdict"):
        return verdict[len("no verdict"):].strip(" ()") or "no report"
    if verdict == UNTESTABLE:
        return "the arms never differ here (every seed gives the same value): more seeds cannot decide it"
    need, d, m, expect = r.get("seeds_needed"), r.get("diff"), float(r["margin"]), r.get("expect")
    seen = None
    if need is None:
        plan = "no spread to plan from" if d is None else "even the margin's distance needs more than 100000 seeds per arm"
    else:
        dist = {"not_greater": m - d, "equivalent": m - abs(d)}.get(expect, abs(d)) if d is not None else 0.0
        seen = max(2, math.ceil(need * (m / dist) ** 2)) if dist > 0 else None
        at_m = "at a true difference of 0" if expect == "equivalent" else "one at the margin's distance"
        plan = (f"at a fixed n, a true effect as observed needs about {seen} seeds per arm ({at_m}: {need})" if seen
                else f"the estimate sits on the claim's null, so more seeds would more likely contradict it ({at_m}: "
                     f"{need} seeds per arm)")
    seq = r.get("sequential") if isinstance(r.get("sequential"), dict) else None
    if seq is None:
        return f"fixed seeds ({r.get('n_a')} per arm); {plan}"
    cap, looks = seq.get("cap"), seq.get("looks") or []
    last = looks[-1] if looks else {}
    where = (f" (look {len(looks)}: p {last['p']:.2g} against its boundary {last['threshold']:.2g})"
             if last.get("p") is not None and last.get("threshold") is not None else "")
    there = power_at_cap(r, cap)
    there = f"; {there}" if there else ""
    if seq.get("at_cap"):
        return f"undecided at the cap of {cap} seeds per arm{where}; {plan}{there}"
    fits = "" if seen is None or cap is None else (": within the cap" if seen <= cap else f": beyond the cap of {cap}")
    return f"paused at {seq.get('n')} of {cap} seeds per arm{where}; {plan}{fits}{there}"


def power_at_cap(r: dict[str, Any], cap: Optional[int]) -> Optional[str]:
    """What a scorecard row's claim could detect with ``cap`` seeds per arm, at a fixed n and the row's
    Holm-adjusted level ``alpha`` with the rule's ``power``, from the observed spread: the minimum detectable
    effect against the claim's ``margin`` (:func:`harness.stats.blocked_mde` with ``se = sd_d/√cap`` and cap − 1 df
    for a comparison blocked by pipeline draw, whose per-draw SD is ``sd_d = se·√blocks``;
    :func:`harness.stats.mde` for Welch), or, for an ``equivalent`` claim, TOST's power at a true difference of 0
    (:func:`harness.stats.blocked_tost_power`, :func:`harness.stats.tost_power`). The staged boundary spends α over
    the looks, so the design's own MDE is somewhat larger. None without the spread, level, power or a cap.

    Example: a ``greater`` claim (m 0.05) blocked over 10 draws with se 0.1/√10 (sd_d 0.1), α 0.05, power 0.8, cap 40:
    (t_{0.975, 39} + t_{0.8, 39})·0.1/√40 = (2.0227 + 0.8509)·0.015811 = 0.0454 → "at the cap (40 seeds per arm,
    fixed n) the MDE is 0.0454 against the margin 0.05".

    Raises:
        nothing: a row without what it needs (or a cap below 2 seeds) gets None.
    """
    import math

    from harness import stats

    need = ("alpha", "power", "margin", "se", "sd_a", "sd_b")
    if not cap or cap < 2 or any(r.get(k) is None for k in need):
        return None
    m, alpha, power = float(r["margin"]), float(r["alpha"]), float(r["power"])
    sd_d = float(r["se"]) * math.sqrt(r["blocks"]) if r.get("blocks") else None
    head = f"at the cap ({cap} seeds per arm, fixed n)"
    if r.get("expect") == "equivalent":
        pw = (stats.blocked_tost_power(m, sd_d, cap, alpha) if sd_d is not None
              else stats.tost_power(m, float(r["sd_a"]), float(r["sd_b"]), cap, cap, alpha))
        return f"{head} TOST's power at a true difference of 0 is {pw:.2f} (the rule asks {power:g})"
    mde = (stats.blocked_mde(sd_d / math.sqrt(cap), cap - 1, alpha, power) if sd_d is not None
           else stats.mde(float(r["sd_a"]), float(r["sd_b"]), cap, cap, alpha, power))
    return f"{head} the MDE is {mde:.3g} against the margin {m:g}"


def pooled_run_cost(costs: dict[str, Optional[dict[str, Any]]]) -> Optional[float]:
    """CPU-hours of one PPO run over the reports' ``cost`` entries: their trained runs' CPU-hours less the pipeline
    draws those runs built, over their trained runs (runs less copies). None when none trained a run (or none
    records its cost).

    Example: {x: 10 runs, 4 copied, 1.5 CPU-h of which 0.3 built draws; y: 4 runs, 4 copied} → 1.2 / 6 = 0.2.

    Raises:
        nothing: missing fields count as 0.
    """
    trained = hours = 0.0
    for cost in costs.values():
        n = int((cost or {}).get("runs") or 0) - int((cost or {}).get("copied") or 0)
        if n > 0:
            trained += n
            hours += float(cost.get("cpu_hours") or 0) - float(cost.get("pipeline_cpu_hours") or 0)
    return hours / trained if trained else None


def _report_key(r: dict[str, Any]) -> str:
    """The report a scorecard row comes from, as :func:`all_rows` keys ``costs``: ``name/scale`` for a separate
    scale's report, ``name`` for the default scale's (also its directory under ``reports/``)."""
    from harness.report import SEPARATE_SCALES

    return f"{r['ablation']}/{r['scale']}" if r.get("scale") in SEPARATE_SCALES else r["ablation"]


def _run_price(key: str, scale: str, costs: dict[str, Optional[dict[str, Any]]]) -> tuple[Optional[float], bool]:
    """``(CPU-hours of one PPO run, pooled)`` for report ``key``: its own :func:`pooled_run_cost`, else (it trained
    no run) the pooled one over every report of ``scale``, with ``pooled`` True; ``(None, False)`` when no report
    trained a run."""
    own = pooled_run_cost({key: costs.get(key)})
    if own is not None:
        return own, False
    pooled = pooled_run_cost({k: c for k, c in costs.items() if (k.split("/", 1)[1] if "/" in k else "default") == scale})
    return pooled, pooled is not None


def going_on(rows: list[dict[str, Any]], costs: dict[str, Optional[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What re-running each paused staged ablation would cost: per ablation whose undecided claims stopped before
    their cap (``sequential`` with ``at_cap`` false: paused by ``--pause-at``, stopped by ``--max-cpu-hours`` or
    interrupted; not an untestable claim, which the rule drops), the arms those claims compare (an arm runs further only while a claim needing it is undecided),
    the runs of the next look (each arm to the first of :func:`harness.sequential.stage_sizes` past the last look's
    seeds per arm) and of the worst case (each arm to the
    cap, no claim decided on the way), and their CPU-hours at the report's cost of a PPO run (its trained runs'
    CPU-hours less the pipeline builds they did, per trained run). A report that trained none of its runs (all
    copied in from other ablations) is priced at the pooled cost of a run over every report of its scale in
    ``costs`` (:func:`pooled_run_cost`; ``pooled`` is then True), and None when no report trained one. Pipeline
    draws not yet built for the new seeds (one per seed at the default scale, shared by every ablation of a regime)
    add to that.

    Example: claims (a, b) and (a, c), all arms at 10 of 40 seeds, stage 10, and 6 trained runs costing 1.5 CPU-hours
    of which 0.3 built draws → arms [a, b, c], next look (20 seeds per arm) 30 runs (6 CPU-hours at 0.2 each), worst case 90 (18).
    """
    from harness.sequential import stage_sizes

    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        seq = r.get("sequential") if isinstance(r.get("sequential"), dict) else None
        if r.get("decisive") or seq is None or seq.get("decided") or seq.get("at_cap") or seq.get("cap") is None:
            continue  # decided, untestable (the rule drops it: more seeds cannot decide it), at its cap or not staged
        key, scale = _report_key(r), r.get("scale") or "default"
        if key not in out:
            per_run, pooled = _run_price(key, scale, costs)
            out[key] = {"ablation": key, "scale": scale, "claims": 0, "arms": {}, "cap": int(seq["cap"]),
                        "stage": int(seq.get("stage") or seq["cap"]), "per_run": per_run, "pooled": pooled, "look": 0}
        g = out[key]
        g["look"] = max(g["look"], int(seq.get("n") or 0))
        g["claims"] += 1
        for arm, n in ((r["a"], r.get("n_a")), (r["b"], r.get("n_b"))):
            g["arms"][arm] = int(n or 0)
    for g in out.values():
        g["target"] = target = next((k for k in stage_sizes(g["stage"], g["cap"]) if k > g["look"]), g["cap"])
        g["next"] = sum(max(0, target - n) for n in g["arms"].values())
        g["worst"] = sum(max(0, g["cap"] - n) for n in g["arms"].values())
        for k in ("next", "worst"):
            g[f"{k}_hours"] = None if g["per_run"] is None else g[k] * g["per_run"]
        g["seeds"], g["arms"] = dict(g["arms"]), list(g["arms"])
    return list(out.values())


def shared_runs(groups: list[dict[str, Any]], same: dict[tuple[str, str], str]) -> dict[str, Any]:
    """The runs of :func:`going_on`'s ``groups`` that repeat one config in several ablations: run in one store, the
    driver trains each (config, seed) once and copies it into the other ablations
    (:func:`harness.ablation_plan.find_reusable`), so they cost nothing there. ``same`` maps ``(ablation, arm)`` to
    the arm's config identity (:func:`arm_configs`); arms absent from it are taken as unique. Ablations are visited in
    ``groups``' order, the first one of a config training its seeds; a later one's seeds already trained in another
    ablation, or finished there before, are copies (never within one ablation: the driver copies from other
    ablations only).

    Returns:
        ``{"next", "worst"}``: copies among the next look's and the worst case's runs; ``"next_hours"``,
        ``"worst_hours"``: their CPU-hours at the copying ablation's cost of a run (none where it has no cost);
        ``"sets"``: the configs shared by several ablations, each as its ``"ablation: arm"`` names.

    Example: x's arm a and y's arm p one config, both at 10 seeds, x's next look at 20 and y's at 20, cap 40 → 10
    copies in the next look and 30 in the worst case, set ``["x: a", "y: p"]``; with x's a at 20 seeds already
    (next look at 30), y's seeds 10-19 are copies too: 10 in the next look, 30 in the worst case (y's 10-39; x's
    20-39 are trained first).

    Raises:
        KeyError: a group without :func:`going_on`'s ``seeds``, ``target``, ``cap`` or ``per_run``.
    """
    members: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for g in groups:
        for arm in g["arms"]:
            if (g["ablation"], arm) in same:
                members.setdefault(same[(g["ablation"], arm)], []).append((g, arm))
    out: dict[str, Any] = {"next": 0, "worst": 0, "next_hours": 0.0, "worst_hours": 0.0, "sets": []}
    for shared in members.values():
        if len({g["ablation"] for g, _ in shared}) < 2:
            continue
        out["sets"].append([f"{g['ablation']}: {arm}" for g, arm in shared])
        for k, end in (("next", "target"), ("worst", "cap")):
            trained: dict[str, set[int]] = {}  # by ablation: the driver copies from other ablations only
            for g, arm in shared:  # the seeds each has finished already
                trained.setdefault(g["ablation"], set()).update(range(g["seeds"][arm]))
            for g, arm in shared:
                seeds = set(range(g["seeds"][arm], g[end]))
                copies = seeds & set().union(*(t for a, t in trained.items() if a != g["ablation"]))
                out[k] += len(copies)
                out[f"{k}_hours"] += len(copies) * (g["per_run"] or 0.0)
                trained.setdefault(g["ablation"], set()).update(seeds - copies)
    return out


def arm_configs(groups: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """Each arm of :func:`going_on`'s ``groups`` mapped to its config identity: the config hash of its seed-0 run at the
    group's scale (:func:`harness.ablation_plan.plan_runs`; the hash covers the resolved config and the seed, so two
    arms with one hash at seed 0 are one config). An ablation whose spec no longer loads is left out.

    Raises:
        nothing of its own: a spec or config that fails to load or resolve (:class:`harness.errors.HarnessError`)
        leaves its ablation out."""
    from harness.ablate import load_spec
    from harness.ablation_plan import plan_runs
    from harness.errors import HarnessError

    out: dict[tuple[str, str], str] = {}
    for g in groups:
        try:
            spec = load_spec(g["ablation"].split("/")[0], validate_configs=False)
            hashes = {t.variant: t.config_hash for t in plan_runs(spec, g["scale"], [0])}
        except HarnessError:
            continue
        out.update({(g["ablation"], arm): hashes[arm] for arm in g["arms"] if arm in hashes})
    return out


def render_scorecard(rows: list[dict[str, Any]], costs: Optional[dict[str, Optional[dict[str, Any]]]] = None,
                     same: Optional[dict[tuple[str, str], str]] = None) -> str:
    """``reports/README.md`` text: counts by verdict, the decided fraction of findings (negative controls, which
    no verdict should decide, are counted apart: how many were judged and how many came out a false positive), the
    compute the reports record (``costs``: per report, its summary's ``cost`` or None for a report written before
    cost accounting), then one table row per claim, in three sections (findings, mechanism checks, negative
    controls), the findings followed by one row per undecided finding with :func:`why_undecided`'s reason, and what
    going on would cost (:func:`going_on`, less the runs one config shares across ablations, :func:`shared_runs`
    over ``same``, by default :func:`arm_configs`); rendered from ``harness/templates/scorecard.md.j2``."""
    from harness.render import md_cell, render
    from harness.report import SEPARATE_SCALES
    from harness.verdicts import BELOW_MARGIN

    counts: dict[str, int] = {}
    for r in rows:
        key = r["verdict"] if r["decisive"] or r["verdict"] == "inconclusive" else "no verdict"
        counts[key] = counts.get(key, 0) + 1
    again = sum(r.get("scale") in SEPARATE_SCALES for r in rows)
    findings = [r for r in rows if r["kind"] == "finding"]
    cells: list[dict[str, Any]] = []
    for r in rows:
        where = _report_key(r)
        cells.append({**r, "n": f"{r['n_a']} / {r['n_b']}" if r["n_a"] is not None else "–",
                      "eff": f"{r['diff']:+.4g} [{r['ci_low']:+.4g}, {r['ci_high']:+.4g}]" if r["diff"] is not None else "–",
                      "verdict": f"**{r['verdict']}**" if r["decisive"] else r["verdict"],
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
        compute=_compute_line(costs) if costs else "", going_on=groups,
        shared=shared_runs(groups, arm_configs(groups) if same is None else same))


def all_rows(read: Callable[[str, str], Optional[dict[str, Any]]],
             as_written: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every shipped ablation's :func:`scorecard_rows`, a committed full-scale report's verdicts replacing the default
    ones, and each report's ``cost`` (None for one that predates cost accounting), keyed ``name`` or ``name/scale``.

    Args:
        read: ``(name, scale) -> summary.json`` as a dict, or None where there is none (the reports directory, or
            a git revision of it: :func:`harness.verdict_changes.read_at`).
        as_written: the verdicts as each report wrote them, even where its rule or configs are not the spec's now
            (:func:`scorecard_rows`).
    """
    from harness.ablate import list_ablations
    from harness.report import SEPARATE_SCALES

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
    from harness.ablate import list_ablations, load_spec
    from harness.report import SEPARATE_SCALES

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
    path = reports / "README.md"
    path.write_text(render_scorecard(rows, costs))
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
    from harness.ablate import list_ablations
    from harness.errors import HarnessError
    from harness.presets import scale_overrides
    from harness.report import write_report

    scale_overrides(scale)  # an unknown scale fails here, listing the valid ones
    if not (names := list_ablations()):
        raise HarnessError("nothing to report: no ablation spec is shipped (ablations/*.yaml)")
    if refresh:
        from harness import tracking

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
