"""What the scorecard plans with: why an undecided claim decides nothing and what more seeds would buy
(:func:`why_undecided`, :func:`power_at_cap`), and what going on with the paused staged ablations would cost
(:func:`going_on`, at each report's cost of a run, :func:`pooled_run_cost`, less the runs one config shares across
ablations, :func:`shared_runs` over :func:`arm_configs`). Planning estimates, not verdicts.
"""

from __future__ import annotations

from typing import Any, Optional


def why_undecided(r: dict[str, Any]) -> Optional[str]:
    """Why a scorecard row decides nothing, and what more seeds would buy; None for a decided row.

    Reads the row's verdict, its sequential design (``sequential``: seeds per arm at the last look ``n``, the
    ``cap``, ``at_cap`` and the ``looks`` with each one's ``p`` and boundary ``threshold``), the observed effect
    ``diff``, the claim's ``expect`` and ``margin`` m, and ``seeds_needed``: the seeds per arm at which the claim's
    test has the rule's power at a fixed n and the Holm-adjusted level when the true distance from its null is m
    (:func:`harness.analysis.stats.seeds_needed`: a difference of m for ``greater``, ``less``, ``not_greater`` and
    ``exceeds``, whose null is d = m; for ``equivalent`` a true difference of 0 inside ±m). The observed distance from
    the null is |d̂| (``greater``, ``less``), m − d̂ (``not_greater``), d̂ − m (``exceeds``) or m − |d̂| (``equivalent``); scaled to it with
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

    from harness.analysis.verdicts import UNTESTABLE, arm_never_acted

    verdict = str(r.get("verdict") or "")
    if r.get("decisive"):
        return None
    if verdict.startswith("no verdict"):
        return verdict[len("no verdict"):].strip(" ()") or "no report"
    if verdict == UNTESTABLE:
        if arm_never_acted(r):
            return "one arm never acted (its runs are the baseline's, seed by seed): more seeds cannot decide it"
        return "the arms never differ here (every seed gives the same value): more seeds cannot decide it"
    need, d, m, expect = r.get("seeds_needed"), r.get("diff"), float(r["margin"]), r.get("expect")
    seen = None
    if need is None:
        plan = "no spread to plan from" if d is None else "even the margin's distance needs more than 100000 seeds per arm"
    else:
        dist = {"not_greater": m - d, "exceeds": d - m, "equivalent": m - abs(d)}.get(expect, abs(d)) if d is not None else 0.0
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
    effect against the claim's ``margin`` (:func:`harness.analysis.stats.blocked_mde` with ``se = sd_d/√cap`` and cap − 1 df
    for a comparison blocked by pipeline draw, whose per-draw SD is ``sd_d = se·√blocks``;
    :func:`harness.analysis.stats.mde` for Welch), or, for an ``equivalent`` claim, TOST's power at a true difference of 0
    (:func:`harness.analysis.stats.blocked_tost_power`, :func:`harness.analysis.stats.tost_power`). The staged boundary spends α over
    the looks, so the design's own MDE is somewhat larger. None without the spread, level, power or a cap.

    Example: a ``greater`` claim (m 0.05) blocked over 10 draws with se 0.1/√10 (sd_d 0.1), α 0.05, power 0.8, cap 40:
    (t_{0.975, 39} + t_{0.8, 39})·0.1/√40 = (2.0227 + 0.8509)·0.015811 = 0.0454 → "at the cap (40 seeds per arm,
    fixed n) the MDE is 0.0454 against the margin 0.05".

    Raises:
        nothing: a row without what it needs (or a cap below 2 seeds) gets None.
    """
    import math

    from harness.analysis import stats

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
    from harness.reporting.ablation import SEPARATE_SCALES

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
    the runs of the next look (each arm to the first of :func:`harness.analysis.sequential.stage_sizes` past the last look's
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
    from harness.analysis.sequential import stage_sizes

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
    (:func:`harness.experiments.plan.find_reusable`), so they cost nothing there. ``same`` maps ``(ablation, arm)`` to
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
    group's scale (:func:`harness.experiments.plan.plan_runs`; the hash covers the resolved config and the seed, so two
    arms with one hash at seed 0 are one config). An ablation whose spec no longer loads is left out.

    Raises:
        nothing of its own: a spec or config that fails to load or resolve (:class:`harness.errors.HarnessError`)
        leaves its ablation out."""
    from harness.experiments.ablate import load_spec
    from harness.experiments.plan import plan_runs
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


__all__ = ["why_undecided", "power_at_cap", "pooled_run_cost", "going_on", "shared_runs", "arm_configs"]
