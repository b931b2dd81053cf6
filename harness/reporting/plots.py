"""The figures of an ablation report (seaborn/matplotlib PNGs):

- ``learning_curves.png``: per-iteration metrics, mean ± 95% Student t interval over seeds per variant;
- ``final_metrics.png``: each primary metric per variant (seeds as points, mean and its 95% t interval);
- ``frontier.png``: held-out gold gain vs d = √KL with the fitted Gao et al. curve per variant;
- ``claims.png``: each claim's difference with its 95% Welch interval against its bound(s);
- ``scorecard_forest.png`` (the scorecard's): every claim of every ablation, its effect against its margin.

Each ``plot_*`` returns the written path, or None when there is nothing to draw.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from harness.analysis.stats import mean_ci
from harness.reporting.runs import RunSet, bon_label, frontier_panels, frontier_points, frontier_rewards, task_meta

if TYPE_CHECKING:
    from harness.experiments.spec import AblationSpec

#: Per-iteration metrics drawn as learning curves: the held-out evaluations first (distinct-2 shows a policy falling into
#: repetition, as length shows one falling silent), then training batches.
CURVE_METRICS = [
    "eval/gold", "eval/proxy", "eval/kl", "eval/gold_lexicon", "eval/length", "eval/distinct_2", "objective/score", "objective/kl",
    "objective/entropy", "policy/clipfrac", "policy/ratio_mean",
]


def _palette(spec: "AblationSpec") -> dict[str, Any]:
    import seaborn as sns

    names = list(spec.variants)
    return dict(zip(names, sns.color_palette("colorblind", len(names))))


def curve_metrics(spec: "AblationSpec") -> list[str]:
    """The learning curves of ``spec``'s task: its registered ``curve_metrics``, else :data:`CURVE_METRICS`.

    Raises:
        UnknownComponentError: the spec's task is not registered.
    """
    return list(task_meta(spec).get("curve_metrics", CURVE_METRICS))


def plot_learning_curves(rs: RunSet, path: Path) -> Optional[Path]:
    """Grid of the task's :func:`curve_metrics` vs iteration; line = mean over seeds, band = the 95% Student t
    interval of that mean (:func:`harness.analysis.stats.mean_ci`, as the final-metrics plot and the verdicts use;
    none where an arm has one seed): at the few seeds an arm has, a percentile bootstrap's band is too narrow. The
    legend and the title's seed counts name the arms with runs. None if no history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    if rs.history.empty:
        return None
    pal = _palette(rs.spec)
    metrics = curve_metrics(rs.spec)
    ncols = 4
    nrows = math.ceil((len(metrics) + 1) / ncols)  # + the legend's panel
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        sub = rs.history[rs.history["metric"] == metric]
        if sub.empty:
            ax.set_visible(False)
            continue
        sns.lineplot(data=sub, x="step", y="value", hue="variant", hue_order=[v for v in pal if v in set(sub["variant"])],
                     palette=pal, errorbar=mean_ci, ax=ax, legend=False)
        ax.set_title(metric)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("iteration")
        ax.set_ylabel("")
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    n = rs.runs.groupby("variant")["seed"].nunique().to_dict() if not rs.runs.empty else {}
    shown = [v for v in pal if n.get(v)]  # an arm without runs (e.g. one no claim compares) has no curve to name
    handles = [plt.Line2D([0], [0], color=pal[v], lw=2) for v in shown]
    legend_ax = list(axes.flat)[-1]
    legend_ax.legend(handles, shown, title="variant", loc="center")
    fig.suptitle(f"{rs.spec.name} [{rs.scale}]: mean ± 95% t interval over seeds (n per variant: "
                 + ", ".join(f"{v}={n[v]}" for v in shown) + ")")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_final_metrics(rs: RunSet, summary: dict[str, Any], path: Path) -> Optional[Path]:
    """One panel per primary metric: each seed's final value (points) and the mean with its 95%
    Student t 95% interval (bars) per variant with runs. None if no finished run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    if rs.runs.empty:
        return None
    pal = _palette(rs.spec)
    metrics = [m["name"] for m in summary["metrics"]]
    ncols = min(4, len(metrics))
    nrows = math.ceil(len(metrics) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.6 * nrows), squeeze=False)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    ran = set(rs.runs["variant"])
    names = [v for v in rs.spec.variants_for(rs.scale) if v in ran]  # an arm without runs gets no empty column
    for ax, metric in zip(axes.flat, metrics):
        col = f"metrics.{metric}"
        if col in rs.runs.columns:
            state = np.random.get_state()  # seaborn jitters with numpy's global RNG: same report → same PNG
            np.random.seed(0)
            sns.stripplot(data=rs.runs, x="variant", y=col, order=names, hue="variant", hue_order=names, palette=pal,
                          ax=ax, size=6, alpha=0.6, jitter=0.15, legend=False)
            np.random.set_state(state)
        for i, v in enumerate(names):
            st = summary["variants"][v]["final"][metric]
            if st["mean"] is None:
                continue
            lo, hi = st["ci_low"], st["ci_high"]
            yerr = [[st["mean"] - lo], [hi - st["mean"]]] if lo is not None and hi is not None else None
            ax.errorbar([i + 0.3], [st["mean"]], yerr=yerr, fmt="D", color="black", capsize=4, ms=5)
        goal = {"max": " (↑ better)", "min": " (↓ better)"}.get(rs.spec.metric_goal(metric), "")
        ax.set_title(f"{metric}{goal}")
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set_xlim(-0.5, len(names) - 0.2)
        ax.set_xlabel("")
        ax.set_ylabel("")
    fig.suptitle(f"{rs.spec.name} [{rs.scale}]: final metrics (points: seeds; ◆: mean with its 95% t interval)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_frontier(rs: RunSet, summary: dict[str, Any], path: Path) -> Optional[Path]:
    """Gold gain and proxy gain vs d = √KL (gold alone for a verifier-scored task: :func:`frontier_rewards`), one
    row of panels per :func:`frontier_panels` row: every
    evaluation of every seed (points), the fitted ``R_RL(d) = d(α − β log d)`` per variant (lines), and the
    SFT policy's best-of-n curve of the row's proxy with its fitted ``R_bon(d) = d(α − β d)`` (black;
    dotted when a row holds several proxies' curves). None if no history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    from harness.analysis.frontier import gao_curve

    if rs.history.empty:
        return None
    rows = frontier_panels(rs)
    curves = summary.get("bon") or []
    several = len(curves) > 1
    # rows share each column's axes, so the peaks of different rows (e.g. proxy sizes) line up
    rewards = frontier_rewards(rs.spec)
    fig, axes = plt.subplots(len(rows), len(rewards), figsize=(6 * len(rewards), 4.8 * len(rows)), squeeze=False,
                             sharex=True, sharey="col")
    for (title, variants), row in zip(rows, axes):
        # one colour per position in the row, so a factor level (e.g. β) keeps its colour from row to row
        pal = dict(zip(variants, sns.color_palette("colorblind", len(variants)))) if title else _palette(rs.spec)
        bons = [b for b in curves if set(b["variants"]) & set(variants)]
        for ax, metric in zip(row, rewards):
            for v in variants:
                d, r = frontier_points(rs, v, metric)
                if not len(d):
                    continue
                color = pal[v]
                ax.scatter(d, r, s=10, alpha=0.35, color=color)
                fit = summary["variants"][v]["frontier"][metric]
                label = v
                if fit.get("alpha") is not None and fit.get("d_max"):
                    xs = np.linspace(1e-3, fit["d_max"], 200)
                    ax.plot(xs, gao_curve(xs, fit["alpha"], fit["beta"], "rl"), color=color, lw=2)
                    label = f"{v}: α={fit['alpha']:.3g}, β={fit['beta']:.3g}"
                ax.plot([], [], color=color, lw=2, label=label)
            for k, bon in enumerate(bons):
                style = "--" if len(bons) == 1 else [":", "-.", "--"][k % 3]
                ax.plot(bon["d"], bon[f"{metric}_gain"], "ko", ms=4)
                f = bon["fit"][metric]
                label = bon_label(bon, several and len(bons) > 1)
                if f.get("alpha") is not None:
                    xs = np.linspace(0, max(bon["d"]), 200)
                    ax.plot(xs, gao_curve(xs, f["alpha"], f["beta"], "bon"), "k" + style, lw=1.5)
                    label += f": α={f['alpha']:.3g}, β={f['beta']:.3g}"
                ax.plot([], [], "k" + style + "o", ms=4, label=label)
            ax.axhline(0, color="grey", lw=0.8, ls=":")
            ax.set_xlabel("d = √KL(π‖π_init)  [nats^½, k1 summed over the response]")
            ax.set_ylabel(f"held-out {metric} − SFT policy's {metric}")
            ax.tick_params(labelbottom=True)
            fits_text = "RL fit d(α − β log d)" + (", best-of-n fit d(α − β d)" if bons else "")
            ax.set_title(f"{title}: {metric}" if title else f"{metric}: {fits_text}", fontsize=10)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fits = "; lines: RL fit d(α − β log d), dashed: best-of-n fit d(α − β d)" if rows[0][0] else ""
    fig.suptitle(f"{rs.spec.name} [{rs.scale}]: reward vs √KL frontier (Gao et al. 2022){fits}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_claims(summary: dict[str, Any], path: Path) -> Optional[Path]:
    """Forest plot: each claim's difference ``a − b`` with its 95% Welch interval, the claimed bound(s)
    dashed (a directional claim's margin dotted; zero dotted for a claim of size, ``exceeds``), titles wrapped at 95
    characters, coloured by verdict (grey: inconclusive or no verdict). None if no
    claim has an interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vs = summary["verdicts"]
    if not any(v["ci_low"] is not None for v in vs):
        return None
    colors = VERDICT_COLORS
    fig, axes = plt.subplots(len(vs), 1, figsize=(7.5, 1.3 * len(vs) + 0.8), squeeze=False)
    for ax, v in zip(axes.flat, vs):
        if v["ci_low"] is not None:
            ax.errorbar([v["diff"]], [0], xerr=[[v["diff"] - v["ci_low"]], [v["ci_high"] - v["diff"]]], fmt="o",
                        color=colors.get(v["verdict"], "tab:grey"), capsize=5, ms=7)
        bounds = [0.0] if v["expect"] in ("greater", "less") else ([v["margin"]] if v["expect"] in ("not_greater", "exceeds") else [-v["margin"], v["margin"]])
        for b in bounds:
            ax.axvline(b, color="black", ls="--", lw=1)
        if v["expect"] in ("greater", "less"):  # the margin a directional claim is judged at (its margin test)
            ax.axvline(v["margin"] if v["expect"] == "greater" else -v["margin"], color="grey", ls=":", lw=1)
        if v["expect"] == "exceeds":  # zero, against which a claim of size is not judged, for reference
            ax.axvline(0.0, color="grey", ls=":", lw=1)
        ax.set_yticks([])
        title = f"{v['metric']}: {v['a']} − {v['b']} (expected {v['expected']}) → {v['verdict']}"
        ax.set_title(textwrap.fill(title, 95), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path




#: Verdict colours of the forest plots (grey: inconclusive or no verdict).
VERDICT_COLORS = {"reproduced": "tab:green", "pass": "tab:green", "contradicted": "tab:red", "fail": "tab:red",
                  "below margin": "tab:olive", "false positive": "tab:purple"}


def plot_scorecard_forest(rows: list[dict[str, Any]], path: Path) -> Optional[Path]:
    """The scorecard's figure: every claim of every ablation on one axis, its effect ``a − b`` and 95% interval
    divided by the claim's margin (so ±1 is the margin, 0 no difference), coloured by verdict; a claim with no
    interval yet keeps its row, marked "no runs". ``rows``: the scorecard's rows (``ablation``, ``title``, ``kind``,
    ``diff``, ``ci_low``, ``ci_high``, ``margin``, ``verdict``, ``decisive``). None if there is no row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(12, 0.2 * len(rows) + 1.4))
    labels = []
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i
        label = f"{r['ablation']}: {r['title']}"
        labels.append(label if len(label) <= 88 else label[:87] + "…")
        m = float(r["margin"]) if r.get("margin") else 1.0
        if r.get("diff") is None or r.get("ci_low") is None:
            ax.text(0, y, "no runs", fontsize=6, color="tab:grey", va="center", ha="center")
            continue
        color = VERDICT_COLORS.get(r["verdict"], "tab:grey") if r.get("decisive") else "tab:grey"
        ax.errorbar([r["diff"] / m], [y], xerr=[[(r["diff"] - r["ci_low"]) / m], [(r["ci_high"] - r["diff"]) / m]],
                    fmt="o", color=color, ms=3.5, capsize=2, lw=1)
    for x, ls in ((0.0, "-"), (-1.0, "--"), (1.0, "--")):
        ax.axvline(x, color="black", ls=ls, lw=0.8)
    ax.set_yticks(range(len(rows)), labels[::-1], fontsize=6)
    ax.set_xscale("symlog", linthresh=2.0)
    ticks = [t for t in (-100, -10, -2, -1, 0, 1, 2, 10, 100) if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlabel("effect ÷ margin (a − b as each claim states it; dashed: ±margin; log beyond ±2)")
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=k) for k, c in
               (("reproduced / pass", "tab:green"), ("contradicted / fail", "tab:red"), ("below margin", "tab:olive"),
                ("false positive", "tab:purple"), ("undecided", "tab:grey"))]
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.set_ylim(-1, len(rows))
    fig.subplots_adjust(left=0.42, right=0.98, top=0.995, bottom=0.6 / (0.2 * len(rows) + 1.4))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
