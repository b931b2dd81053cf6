"""Ablation reports: MLflow runs → pandas → statistics → seaborn PNGs, ``report.md``, ``summary.json``.

``write_report(name)`` reads the child runs of experiment ``ablation/<name>``
(:func:`harness.reporting.runs.load_runs`) and writes ``<reports>/<name>/``:

- ``report.md``: question, setup, a verdict per published claim, the final-metric table, learning
  curves, the gold-vs-√KL frontier, failed runs and sample completions, rendered from the template
  ``harness/reporting/templates/ablation.md.j2`` (:func:`render_markdown`);
- the figures of :mod:`harness.reporting.plots`;
- ``summary.json``: every number of the report (:func:`harness.reporting.summary.build_summary`);
- ``runs.csv``: every per-iteration metric of every counted run (long format).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from harness.config import default_reports_dir
from harness.errors import HarnessError
from harness.reporting.render import claim_title, fmt, judge_note, md_cell, render
from harness.config.presets import regime_note, task_name
from harness.reporting.plots import plot_claims, plot_final_metrics, plot_frontier, plot_learning_curves
from harness.reporting.builds import add_build_effects, build_notes, build_rows
from harness.reporting.passk import passk_rows
from harness.reporting.runs import RunSet, bon_label, frontier_rewards, load_runs, record_ids, scored_by_verifier, task_meta
from harness.reporting.summary import PROXY_METRICS, build_summary, variant_metrics
from harness.analysis.stats import LENGTH_FLOOR_SHARE
from harness.analysis.frontier import kl_at
from harness.analysis.verdicts import BELOW_MARGIN, arm_never_acted

SEPARATE_SCALES = ("full",)  # scales whose report lives beside, not in place of, the default scale's
#: The sample table's labels for a sample's ``score`` and ``gold_lexicon`` when the task registers none
#: (``sample_columns`` in :mod:`harness.tasks.registry`).
SAMPLE_COLUMNS = ("reward", "secondary score")

_RULE_TEXT = ("Welch's t test of each claim's difference of means over seeds, TOST for equivalence claims, "
              "Holm-adjusted across this ablation's claims; a verdict needs adjusted p < {alpha:g} and at least "
              "{min_seeds} seeds per arm. MDE: the smallest difference the test detects with 80% power at the "
              "observed SDs and n; seeds for margin: seeds per arm for 80% power at the claim's margin.")
_MARGIN_TEXT = (" The {k} directional claim(s) are also tested against their margins, with {margin_alpha:g} of the "
                "family-wise {total:g} (the tests above share the other {alpha:g}): a one-sided Welch test that the "
                "effect in the claimed direction is smaller than the margin, Bonferroni at {level:.3g} each; it decides "
                "a claim the test above leaves undecided *below margin* (an effect of the claim's size is ruled out, "
                "neither reproduced nor contradicted).")


def rule_text(spec: Any, scale: str) -> str:
    """The verdict rule in words for ``spec``'s report at ``scale``: the tests of the claims' nulls at their part of
    α (:func:`harness.analysis.sequential.split_alpha`) and, where the rule gives them α, the margin tests of its directional
    claims (:func:`harness.analysis.verdicts.margin_test`)."""
    rule = spec.verdict
    alpha, level, k = _levels(spec, scale)
    text = _RULE_TEXT.format(alpha=alpha, min_seeds=rule.min_seeds)
    if level is None:
        return text
    return text + _MARGIN_TEXT.format(k=k, margin_alpha=rule.margin_alpha, total=rule.alpha, alpha=alpha, level=level)


def _levels(spec: Any, scale: str) -> tuple[float, Optional[float], int]:
    """``(α of the tests of the claims' nulls, each margin test's level or None, claims with a margin test)``."""
    from harness.analysis.sequential import split_alpha
    from harness.analysis.verdicts import has_margin_test

    margined = [has_margin_test(c) for c in spec.claims_for(scale)]
    alpha, level = split_alpha(spec.verdict.alpha, spec.verdict.margin_alpha, margined)
    return alpha, level, sum(margined)


def last_samples(run_id: str, artifact_uri: Optional[str], k: int = 3) -> tuple[Optional[int], list[dict[str, Any]]]:
    """A run's end-of-training sample completions: ``(iteration, the first k samples)`` of its last
    ``samples/*.json`` artifact (each sample a dict: prompt, response, score, and the task's secondary score).

    Returns:
        ``(None, [])`` when the run logged no samples or they cannot be read (no ``artifact_uri``, a missing artifact
        store, a corrupt file): a report shows "no samples recorded" then. Raises nothing.
    """
    import mlflow

    from harness.infra import tracking

    if not artifact_uri:
        return None, []
    try:
        files = sorted(f.path for f in tracking.client().list_artifacts(run_id, "samples"))
        if not files:
            return None, []
        data = json.loads(mlflow.artifacts.load_text(f"{artifact_uri}/{files[-1]}"))
    except Exception:
        return None, []
    return data.get("iteration"), list(data.get("samples", []))[:k]


def _samples(rs: RunSet, variant: str, k: int = 3) -> tuple[Optional[int], Optional[int], list[dict[str, Any]]]:
    """End-of-run sample completions of ``variant``'s lowest-seed counted run: (seed, iteration, samples)."""
    sub = rs.runs[rs.runs["variant"] == variant].sort_values("seed") if not rs.runs.empty else rs.runs
    if sub.empty:
        return None, None, []
    row = sub.iloc[0]
    return (int(row["seed"]), *last_samples(row["run_id"], row.get("artifact_uri"), k))


def claim_row(v: dict[str, Any]) -> str:
    """One markdown table row of a judged claim (:func:`harness.analysis.verdicts.judge_claims` output):
    claim, kind, source (section), setting note, metric and expectation, n per arm, effect with its 95%
    Welch interval, raw and Holm-adjusted p, MDE, seeds for the margin, verdict, caveats."""
    eff = (f"{v['diff']:+.4g} [{v['ci_low']:+.4g}, {v['ci_high']:+.4g}]" if v["diff"] is not None else "–")
    need = v["seeds_needed"] if v["seeds_needed"] is not None else ("> 100000" if v["diff"] is not None else "–")
    verdict = f"**{v['verdict']}**" if v["decisive"] else v["verdict"]
    return (f"| {md_cell(v['claim'])} | {v['kind']} | {md_cell(v['source'])} ({md_cell(v['section'])}) | "
            f"{md_cell(v['setting_note'])} | `{v['metric']}`: {md_cell(v['expected'])} | {v['n_a']} / {v['n_b']} | {eff} | "
            f"{fmt(v['p_raw'], 3)} | {fmt(v['p_adj'], 3)} | {fmt(v['mde'], 3)} (margin {v['margin']:g}) | {need} | "
            f"{verdict} | {md_cell('; '.join(v['caveats'])) or '–'} |")


def why_clause(v: dict[str, Any]) -> str:
    """One clause of why a judged claim (:func:`harness.analysis.verdicts.judge_claims` row) has its verdict, for the report's
    first table: the look and level that decided it, the margin test, or what keeps it open (its MDE against the
    margin, or the seeds it lacks). Examples: ``"crossed its boundary at the look at n = 10 (level 0.0133)"``,
    ``"adjusted p = 0.002 < 0.05"``, ``"no boundary crossed by n = 20; MDE 0.0617 vs margin 0.05"``."""
    seq = v.get("sequential") or {}
    verdict = str(v.get("verdict", ""))
    if verdict.startswith("untestable"):
        if arm_never_acted(v):
            return "one arm never acted: its runs are the baseline's, seed by seed"
        return "the arms never differed: no seed count can tell them apart"
    if verdict.startswith("no verdict") or not v.get("enough_seeds", True):
        return "too few seeds per arm for the rule's minimum"
    mde = f"MDE {fmt(v.get('mde'), 3)} vs margin {v['margin']:g}"
    if verdict == BELOW_MARGIN:
        at = f" at n = {seq['n']}" if seq.get("n") else ""
        return f"the margin test rules out an effect of {v['margin']:g}{at}"
    if v.get("decisive"):
        if seq:
            return f"crossed its boundary at the look at n = {seq.get('n')} (level {fmt(seq.get('level'), 3)})"
        return f"adjusted p = {fmt(v.get('p_adj'), 3)} < {fmt(v.get('alpha'), 3)}"
    if seq:
        return f"no boundary crossed by n = {seq.get('n')}; {mde}"
    return f"adjusted p = {fmt(v.get('p_adj'), 3)}; {mde}"


def answer_row(v: dict[str, Any]) -> str:
    """A judged claim's row of the report's first table: title (≤ 80 characters), kind, n per arm, effect [95% CI]
    with its metric (and, for a claim read at matched KL, the KL in nats: a low one means both arms were read
    near the initial policy; at matched sampled responses, their count), verdict (bold when decided), and
    :func:`why_clause`."""
    at = (f" at {v['matched_kl']:.3g} nats" if v.get("matched_kl") is not None else
          f" at {v['matched_responses']:.0f} sampled responses" if v.get("matched_responses") is not None else "")
    eff = (f"{v['diff']:+.4g} [{v['ci_low']:+.4g}, {v['ci_high']:+.4g}] `{v['metric']}`{at}" if v["diff"] is not None
           else f"– `{v['metric']}`{at}")
    verdict = f"**{v['verdict']}**" if v["decisive"] else v["verdict"]
    title = v.get("title") or claim_title(v["claim"])
    return f"| {md_cell(title)} | {v['kind']} | {v['n_a']} / {v['n_b']} | {eff} | {verdict} | {md_cell(why_clause(v))} |"


def _sequential_row(v: dict[str, Any]) -> str:
    """A claim's looks under ``--seeds auto``: seeds per arm, information fraction, p-value against the
    boundary (nominal p-level) then in force, the margin test's one-sided p against its own boundary where it was
    made, and where the claim was decided or left undecided."""
    s = v.get("sequential") or {}

    def look(e: dict[str, Any]) -> str:
        text = f"{e['n_a']} ({e['t']:.2f}): {e['p']:.3g} {'≤' if e['p'] <= e['threshold'] else '>'} {e['threshold']:.3g}"
        if e.get("margin_threshold") is not None:  # the margin test, one-sided
            text += (f", margin {e['p_margin']:.3g} {'≤' if e['p_margin'] <= e['margin_threshold'] else '>'} "
                     f"{e['margin_threshold']:.3g}")
        return text

    looks = "; ".join(look(e) for e in s.get("looks", []))
    below = f" ({BELOW_MARGIN})" if v.get("verdict") == BELOW_MARGIN else ""
    at = (f"untestable (n = {s['n']})" if s.get("untestable") else f"n = {s['n']}{below}" if s.get("decided")
          else f"undecided at the cap (n = {s['n']})" if s.get("at_cap") else f"undecided (n = {s.get('n')})" if s.get("looks") else "undecided (no look yet)")
    tost = fmt(v.get("tost_power_at_zero")) if v.get("expect") == "equivalent" else "—"
    return f"| {md_cell(v['claim'])} | {looks or '—'} | {at} | {fmt(s.get('level'))} | {tost} |"


def past_decision(summary: dict[str, Any]) -> Optional[str]:
    """Under ``--seeds auto``, the decided claims whose arms have finished seeds past the look that decided them
    (a retraining, an overrun, or another claim that needed the arm further): one sentence saying that the metric
    tables, plots and samples count those seeds and the verdict does not, or None when there are none.

    A look's data are fixed in advance (seeds 0 to n − 1 of both arms), so seeds trained past it, even before it
    was read, leave the boundary's error rate as calibrated: which seeds a look reads never depends on their
    values (the rule of :mod:`harness.analysis.sequential`, whose calibration ``reports/calibration/`` measures).

    Example: a claim decided at n = 10 whose arms finished 20 seeds each →
    ``"… A larger β …: decided at 10 seeds per arm, 20 finished."``."""
    if not summary.get("design"):
        return None
    seeds = {v: len(d["seeds"]) for v, d in summary["variants"].items()}
    past = []
    for v in summary["verdicts"]:
        s = v.get("sequential") or {}
        if not s.get("decided") or s.get("untestable") or s.get("n") is None:
            continue
        n, done = int(s["n"]), min(seeds.get(v.get("a"), 0), seeds.get(v.get("b"), 0))
        if done > n:
            claim = md_cell(v["claim"]).rstrip(".")  # whitespace collapsed, escaped
            past.append(f"{claim if len(claim) <= 60 else claim[:59].rstrip() + '…'}: decided at {n} seeds per arm, "
                        f"{done} finished")
    if not past:
        return None
    return ("Seeds past a claim's deciding look count in the metric tables, plots and samples, not in its verdict: "
            "a look reads seeds 0 to n − 1 of both arms, fixed in advance, so seeds trained past it leave its error "
            "rate as calibrated. " + "; ".join(past) + ".")


def _metric_tables(rs: RunSet, summary: dict[str, Any], skip: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The final-metric tables: per metric its goal text, one row of cells per variant not in ``skip``, and
    ``unlogged``: the variants with finished runs none of which logs the metric (e.g. a rollout engine's mismatch in
    an arm without an engine), which the report names under the table rather than leave a row of dashes unexplained."""
    spec, tables = rs.spec, []
    for m in variant_metrics(spec, rs.scale, rs.runs.columns):
        goal = {"max": " (higher is better)", "min": " (lower is better)"}.get(spec.metric_goal(m), " (diagnostic: no better direction)")
        rows = []
        for v, d in summary["variants"].items():
            if v in skip:
                continue
            st = d["final"][m]
            if v == spec.baseline:
                p = "(baseline)"
            elif spec.metric_goal(m) == "none":
                p = "– (no goal)"
            else:
                pci = st.get("p_improvement_ci") or [None, None]
                p = f"{fmt(st['p_improvement'], 2)} [{fmt(pci[0], 2)}, {fmt(pci[1], 2)}]"
            rows.append({"variant": v, "n": st["n"], "mean": fmt(st["mean"]), "sd": fmt(st["sd"], 2), "p": p,
                         "ci": f"[{fmt(st['ci_low'])}, {fmt(st['ci_high'])}]" if st["ci_low"] is not None else "– (n < 2)",
                         "iqm": fmt(st["iqm"]) if st["iqm"] is not None else "– (n < 8)"})
        unlogged = [v for v, d in summary["variants"].items() if v not in skip and d["seeds"] and not d["final"][m]["n"]]
        tables.append({"metric": m, "goal": goal, "rows": rows, "unlogged": unlogged})
    return tables


def _frontier_rows(summary: dict[str, Any], rewards: tuple[str, ...], skip: frozenset[str] = frozenset()) -> list[str]:
    """The frontier table's rows: the RL fit of each variant not in ``skip`` and reward in ``rewards``
    (:func:`harness.reporting.runs.frontier_rewards`), then each best-of-n curve's fit."""
    def ci(f: dict[str, Any], key: str) -> str:
        c = f.get(f"{key}_ci")
        return f"{fmt(f.get(key))} [{fmt(c[0])}, {fmt(c[1])}]" if c else fmt(f.get(key))

    def peak(f: dict[str, Any], kl_peak: float | None, cell: str) -> str:
        if kl_peak is None:
            return "no peak (β ≤ 0)"
        seen = kl_at(f.get("d_max"))
        if seen is not None and kl_peak > seen:  # an extrapolation, not a peak the runs showed
            return f"none in the data (the fit's at {fmt(kl_peak)}, beyond the largest KL reached, {fmt(seen)})"
        return cell

    out = []
    for v, d in summary["variants"].items():
        if v in skip:
            continue
        for metric in rewards:
            f = d["frontier"][metric]
            if f.get("error"):
                out.append(f"| {v} | {metric} | – | – | – | {f['n_points']} | {md_cell(f['error'])} | – |")
                continue
            st = f.get("seed_t") or {}
            seed_cell = f"{ci(st, 'beta')} ({st['n_fitted']})" if st.get("beta") is not None else "–"
            out.append(f"| {v} | {metric} | {ci(f, 'alpha')} | {ci(f, 'beta')} | {peak(f, f.get('kl_peak'), ci(f, 'kl_peak'))} "
                       f"| {f['n_points']} | {fmt(f['rmse'])} "
                       f"| {seed_cell} |")
    curves = summary.get("bon") or []
    for bon in curves:
        for metric in rewards:
            f = bon["fit"][metric]
            kl_peak = kl_at(f.get("d_peak"))
            out.append(f"| {md_cell(bon_label(bon, len(curves) > 1))} | {metric} | {ci(f, 'alpha')} | {ci(f, 'beta')} | "
                       f"{peak(f, kl_peak, fmt(kl_peak))} | {f['n_points']} | {fmt(f['rmse'])} | – |")
    return out


def _stage_text(stage: str, v: dict[str, list[str]]) -> str:
    """``stage `key` sha256 `digest```, in bold when runs of one draw recorded several keys or digests."""
    keys, digests = ", ".join(v.get("keys", ["?"])), ", ".join(v["digests"])
    text = f"{stage} `{keys}` sha256 `{digests}`"
    return f"**{text}**" if len(v["digests"]) > 1 or len(v.get("keys", [])) > 1 else text


def _proxy_cell(proxy: Optional[dict[str, float]]) -> str:
    """A draw's proxy reward model in the draw table: held-out agreement with the gold, Spearman with the gold and
    with response length (:data:`harness.reporting.summary.PROXY_METRICS`); "–" for one the report cannot read."""
    if not proxy:
        return "–"
    return " / ".join(_two(proxy.get(k), signed=k in _SIGNED) for k in PROXY_METRICS)


#: How the report names each of :data:`harness.reporting.summary.PROXY_METRICS`; the Spearmans are shown with a sign.
_PROXY_LABELS = {"heldout_agreement": "held-out agreement with the gold", "spearman_vs_gold": "Spearman with the gold",
                 "spearman_vs_length": "Spearman with response length"}
_SIGNED = ("spearman_vs_gold", "spearman_vs_length")


def _two(x: Optional[float], signed: bool = False) -> str:
    """Two decimals (with a sign when ``signed``), "–" for None: ``_two(-0.1026, True) == "-0.10"``."""
    return "–" if x is None else f"{x:+.2f}" if signed else f"{x:.2f}"


def _proxy_line(summary: dict[str, Any]) -> str:
    """One sentence over the draws' proxies: mean and range of each metric the draw table gives; empty when no draw
    has them. Example: agreement 0.56 and 0.62 over two draws → "held-out agreement with the gold 0.59 (0.56 to
    0.62)"; Spearman with length −0.10 and +0.16 → "Spearman with response length +0.03 (-0.10 to +0.16)"."""
    proxies = [d["proxy"] for d in summary.get("draws") or [] if d.get("proxy")]
    parts = []
    for key in PROXY_METRICS:
        xs = [p[key] for p in proxies if key in p]
        if xs:
            sg = key in _SIGNED
            parts.append(f"{_PROXY_LABELS[key]} {_two(sum(xs) / len(xs), sg)} ({_two(min(xs), sg)} to {_two(max(xs), sg)})")
    return f"The proxy reward models of {len(proxies)} draw(s), mean (range): " + "; ".join(parts) + "." if parts else ""


def _draw_rows(summary: dict[str, Any]) -> tuple[str, list[str]]:
    """The pipeline draws for the report: ``(shared, rows)``. ``shared`` lists, once, the stages with weights whose
    key and digest are the same in every draw that records them, when two or more do (the gold, the reward model of
    human ratings, draw 0's SFT policy that trained it; empty with one draw);
    ``rows`` has one table row per draw: its seeds, and for each other stage with weights its key and weight digest
    (several, in bold, when runs of one draw disagree), then, when any draw has them, its proxy's metrics
    (:func:`_proxy_cell`).

    Example: two draws sharing gold ``g``/``1`` and differing in sft give ``shared = "gold `g` sha256 `1`"`` and
    rows naming only their sft."""
    draws = summary.get("draws") or []
    with_weights = [{st: v for st, v in d["stages"].items() if "digests" in v} for d in draws]
    seen: dict[str, list[Any]] = {}
    for w in with_weights:
        for st, v in w.items():
            seen.setdefault(st, []).append(v)
    # shared: one value in every draw that records the stage, recorded by two draws or more (a stage that one draw
    # has under another label, e.g. draw 0's SFT policy that builds the reward model of human ratings, is still shared)
    common = {st for st, vs in seen.items() if len(vs) > 1 and all(v == vs[0] for v in vs)} if len(draws) > 1 else set()
    shared = "; ".join(_stage_text(st, seen[st][0]) for st in sorted(common))
    rows = []
    with_proxy = any(d.get("proxy") for d in draws)
    for d, stages in zip(draws, with_weights):
        cells = [_stage_text(st, v) for st, v in stages.items() if st not in common]
        seeds = d["seeds"]
        shown = ", ".join(map(str, seeds[:12])) + (f", … ({len(seeds)})" if len(seeds) > 12 else "")
        proxy = f" {_proxy_cell(d.get('proxy'))} |" if with_proxy else ""
        rows.append(f"| {d['draw']} | {shown} | {md_cell('; '.join(cells)) or '– (no digest recorded)'} |{proxy}")
    return shared, rows


def _read_cell(p: Optional[dict[str, Any]]) -> str:
    """Where a variant's final metrics are read and whether its mean gold curve had plateaued there
    (:func:`harness.analysis.stats.plateau_check`)."""
    if not p:
        return "–"
    at = f"iteration {p['read_at']:g}"
    if p["holds"] is None:
        return f"{at}; gold never rose ({fmt(p['total_rise'])})"
    word = "plateaued" if p["holds"] else "**still rising**"
    return (f"{at}; {word}: last-quarter rise {fmt(p['late_rise'])} = {fmt(100 * p['late_share'], 2)}% of the "
            f"total {fmt(p['total_rise'])}")


def _length_cell(c: Optional[dict[str, Any]]) -> str:
    """The SFT policy's mean held-out length → the arm's at the end, flagged when below the floor
    (:func:`harness.analysis.stats.length_check`)."""
    if not c:
        return "–"
    cell = f"{fmt(c['sft'])} → {fmt(c['final'])} (×{fmt(c['ratio'], 2)})"
    return cell + " **below the floor**" if c["below_floor"] else cell


def cost_per_claim(verdicts: list[dict[str, Any]]) -> str:
    """The compute line's cost of each claim that has one (its ``cost``: the runs of its two arms up to its deciding
    look), named by its title (the spec's, or the one :func:`harness.reporting.render.claim_title` made) cut to at
    most 50 characters. Example:
    ``"CISPO learns faster than DAPO: 16 runs, 1.68 CPU-h; …"``."""
    return "; ".join(f"{md_cell(claim_title(v.get('title') or v['claim'], width=50))}: {v['cost']['runs']} runs, "
                     f"{fmt(v['cost']['cpu_hours'])} CPU-h" for v in verdicts if v.get("cost"))


def render_markdown(rs: RunSet, summary: dict[str, Any], figures: dict[str, Optional[Path]]) -> str:
    """The report text (GitHub markdown) from the summary and the written figures: the data of
    ``harness/reporting/templates/ablation.md.j2``, rendered by :func:`harness.reporting.render.render`."""
    spec = rs.spec
    cost = summary.get("cost") or {}
    per = cost_per_claim(summary["verdicts"])
    shared, draw_rows = _draw_rows(summary)
    claimed = set(spec.claim_arms_for(rs.scale))
    # an arm no claim compares and with no run (``--seeds auto`` leaves it out) keeps its variant-table row, which
    # says why; the fewer-seeds warning, per-metric tables, frontier and samples would only repeat dashes for it
    unrun = frozenset(v for v, d in summary["variants"].items() if not d["seeds"] and v not in claimed)
    builds, aside = build_notes(summary)
    return render(
        "ablation", spec=spec, scale=rs.scale, s=summary, n_runs=len(rs.runs), experiment_id=rs.experiment_id,
        regime=regime_note(spec.regime, task_name(spec.base)), judge=judge_note(spec, rs.scale),
        ignored=rs.ignored, builds=builds, aside=aside, build_rows=build_rows(summary), pipe="; ".join(f"{k} {', '.join(v)}" for k, v in summary.get("pipeline", {}).items()) or "unknown",
        few=[v for v, d in summary["variants"].items() if len(d["seeds"]) < spec.verdict.min_seeds and v not in unrun],
        variants=[{"name": v, "seeds": d["seeds"], "unrun": v in unrun,
                   "overrides": ", ".join(f"`{k}={val}`" for k, val in d["overrides"].items()) or "(base)",
                   "read": _read_cell(d.get("plateau")), "identical": d.get("identical_to_baseline"),
                   "length": _length_cell(d.get("length")),
                   "updates": d.get("updates") if d.get("updates") is not None else "–"}
                  for v, d in summary["variants"].items()],
        rule_text=rule_text(spec, rs.scale), margin_rule=_levels(spec, rs.scale)[1] is not None,
        length_floor=f"{LENGTH_FLOOR_SHARE:g}",
        claim_rows=[claim_row(v) for v in summary["verdicts"]], answer_rows=[answer_row(v) for v in summary["verdicts"]],
        draw_shared=shared, draw_rows=draw_rows,
        draw_proxy=_proxy_line(summary),
        sequential_rows=[_sequential_row(v) for v in summary["verdicts"]] if summary.get("design") else [],
        past_decision=past_decision(summary),
        cost=cost, cost_per_claim=per, metric_tables=_metric_tables(rs, summary, unrun),
        passk=dict(zip(("ks", "rows"), passk_rows(summary, unrun))),
        figures={k: (p.name if p else None) for k, p in figures.items()},
        frontier_rows=_frontier_rows(summary, frontier_rewards(spec), unrun), has_bon=bool(summary.get("bon")),
        running=", ".join(f"{r['variant']}/s{r['seed']} (`{r['run_id'][:8]}`)" for r in summary["running"]),
        samples=[dict(zip(("variant", "seed", "iteration", "samples"), (v, *_samples(rs, v))))
                 for v in spec.variants_for(rs.scale) if v not in unrun],
        sample_columns=task_meta(spec).get("sample_columns", SAMPLE_COLUMNS), verifier=scored_by_verifier(spec))


def report_dir(name: str, scale: str, reports: Optional[Path] = None) -> Path:
    """Where ablation ``name``'s report at ``scale`` is written: ``<reports>/<name>/`` for the default (and
    the smoke) scale, ``<reports>/<name>/<scale>/`` for a scale in :data:`SEPARATE_SCALES`, so that a
    full-scale report never replaces the shipped default one. ``reports`` defaults to the configured
    reports directory."""
    base = Path(reports or default_reports_dir()) / name
    return base / scale if scale in SEPARATE_SCALES else base


def rescored_judges(name: str, reports: Optional[Path] = None) -> list[dict[str, Any]]:
    """The golds that rescored ablation ``name``'s archived runs (``harness rescore``): ``[{"gold_key", "overrides"}]``
    from the files it kept in ``<reports>/NAME/archive/rescored/`` (``[]`` when it never ran; ``overrides`` ``[]`` for
    the spec's own gold)."""
    from harness.experiments import archive

    return [{"gold_key": str(d.get("gold_key", f.name.split(".")[0])), "overrides": list(d.get("overrides") or [])}
            for f in archive.rescored_files(name, reports) for d in [archive.read_record(f)]]


def write_report(name: str, scale: Optional[str] = None, require_runs: bool = False,
                 archive_reports: Optional[Path] = None) -> Path:
    """Write :func:`report_dir` (report.md, PNGs, summary.json, runs.csv) from the runs in MLflow.

    Args:
        name: ablation name.
        scale: which scale's runs (default: the latest invocation's).
        require_runs: raise instead of writing a report without any finished run.
        archive_reports: the reports directory whose ``NAME/archive/`` names the golds of the rescored columns
            (default: the configured one).
    Returns:
        Path of ``report.md``.
    Raises:
        HarnessError: unknown ablation, nothing recorded for it yet (at ``scale``, with ``require_runs``), or
            the reports directory is not writable (checked before the runs are read).
    """
    from harness.infra.services import check_writable

    check_writable(default_reports_dir(), "the reports directory")
    rs = load_runs(name, scale)
    if require_runs and rs.runs.empty:
        why = (f" ({rs.ignored} recorded run(s) at that scale ignored: their variant or config hash does not match the "
               "current spec)") if rs.ignored else ""
        raise HarnessError(f"no finished run of ablation {name!r} at scale {rs.scale}{why}")
    out = report_dir(name, rs.scale)
    out.mkdir(parents=True, exist_ok=True)
    summary = build_summary(rs)
    summary["rescored_by"] = rescored_judges(name, archive_reports)  # the gold(s) behind the rescored_* columns
    add_build_effects(rs, summary)  # each claim's effect per build and Cochran's Q (harness.reporting.builds)
    figures = {
        "curves": plot_learning_curves(rs, out / "learning_curves.png"),
        "final": plot_final_metrics(rs, summary, out / "final_metrics.png"),
        "frontier": plot_frontier(rs, summary, out / "frontier.png"),
        "claims": plot_claims(summary, out / "claims.png"),
    }
    summary["figures"] = [p.name for p in figures.values() if p is not None]
    record = dict(zip(rs.runs["run_id"], record_ids(rs.runs))) if not rs.runs.empty else {}
    rs.history.assign(run_id=rs.history["run_id"].map(lambda r: record.get(r, r))).sort_values(
        ["variant", "seed", "metric", "step"]).to_csv(out / "runs.csv", index=False, float_format="%.6g")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    path = out / "report.md"
    path.write_text(render_markdown(rs, summary, figures))
    return path
