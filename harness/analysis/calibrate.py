"""Calibration of the sequential verdict rule by simulation of the whole procedure, looks included.

``python -m harness.analysis.calibrate [--reps 4000] [--stage 10] [--cap 40]`` (``make calibrate``) prints, for
each seed distribution and claim type, the false-positive rate of one claim, the family-wise error
rate of an ablation of 4 claims under the global null, the power at the claim's margin (for an
equivalence claim: at zero difference), and the mean seeds per arm spent; beside them the same claim
judged once at the cap (fixed n) and by naive peeking (every look at the full α, no spending), which
shows what the spending buys. ``tests/test_sequential.py`` runs a smaller version.

Seed distributions (one value per seed, both arms alike under the null):

- ``normal``: N(0, 1);
- ``collapsing``: N(0, 1) with probability 0.9, else a collapsed seed near −4 (N(−4, 0.1²));
- ``baseline``: the final held-out gold of the baseline's seeds in a committed ``runs.csv``
  (``reports/kl_placement/runs.csv``, variant ``none``), resampled with replacement and centred;
- ``replicated``: seeds on pipeline draws (the default scale's 40: each seed its own) whose effect differs from
  draw to draw (:func:`replicated_pair`: interaction SD 0.5, shared draw level SD 1, in units of the seeds' SD),
  judged on the draws
  (:func:`harness.analysis.stats.blocked`); the margin there is 0.75 of the seeds' SD as well.

Claim types (:mod:`harness.analysis.verdicts`): ``greater`` (two-sided Welch test of d = 0 at α less the margin tests'
0.01; "reproduced" or "contradicted" at d = 0 is an error, "below margin" there is right; at d = m "below margin"
or "contradicted" is the error of its margin test), ``not_greater`` (the one-sided claim d < m, tested two-sided at d = m; any
decisive verdict at d = m is an error; ``exceeds``, d > m, is the same test with the other side supporting, so its
error rates are ``not_greater``'s and are not simulated apart) and ``equivalent`` (TOST with margin m; "equivalent" at |d| = m
is the error). The margin is 0.75 of the distribution's SD.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from harness.analysis import sequential
from harness.experiments.spec import Claim, VerdictRule
from harness.config.presets import REPLICATES as PRESET_REPLICATES
from harness.analysis.verdicts import claim_look, has_margin_test

#: The committed per-run metrics whose baseline seeds the ``baseline`` distribution resamples.
BASELINE_RUNS = Path(__file__).resolve().parents[2] / "reports" / "kl_placement" / "runs.csv"
CLAIM_TYPES = ("greater", "not_greater", "equivalent")
MARGIN_SD = 0.75
#: The margin tests' part of α, as :class:`harness.experiments.spec.VerdictRule` sets it by default.
MARGIN_ALPHA = float(VerdictRule.model_fields["margin_alpha"].default)


def baseline_values(path: Path = BASELINE_RUNS, variant: str = "none", metric: str = "eval/gold") -> np.ndarray:
    """The last ``metric`` value of each seed of ``variant`` in a report's ``runs.csv``.

    Raises:
        FileNotFoundError: no such file; ValueError: the variant has no such metric.
    """
    last: dict[str, tuple[float, float]] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            if r["variant"] == variant and r["metric"] == metric:
                step = float(r["step"])
                if r["seed"] not in last or step >= last[r["seed"]][0]:
                    last[r["seed"]] = (step, float(r["value"]))
    if not last:
        raise ValueError(f"{path}: no {metric} for variant {variant!r}")
    return np.array([v for _, v in last.values()])


def samplers(path: Path = BASELINE_RUNS) -> dict[str, Callable[[np.random.Generator, int], np.ndarray]]:
    """The seed distributions, each standardised to unit SD: ``draw(rng, n) -> [n]``."""
    def normal(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.normal(size=n)

    def collapsing(rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.where(rng.random(n) < 0.1, rng.normal(-4.0, 0.1, n), rng.normal(size=n))
        return x / math.sqrt(0.9 + 0.1 * 16.01 - 0.4 ** 2)  # unit SD: E[x²] − E[x]² of the mixture

    out = {"normal": normal, "collapsing": collapsing}
    try:
        base = baseline_values(path)
        base = (base - base.mean()) / base.std(ddof=1)
        out["baseline"] = lambda rng, n: rng.choice(base, size=n, replace=True)
    except (FileNotFoundError, ValueError):
        pass
    return out


def _claim(expect: str, margin: float) -> Claim:
    return Claim(claim="simulated", kind="finding", source="simulation", section="-", setting_note="-", metric="x/y",
                 a="a", b="b", expect=expect, margin=margin)  # type: ignore[arg-type]


def _looks(claim: Claim, a: np.ndarray, b: np.ndarray, sizes: Sequence[int],
           draws: Optional[np.ndarray] = None) -> list[sequential.Look]:
    if draws is None:
        return [lk for n in sizes if (lk := claim_look(claim, a[:n], b[:n])) is not None]
    return [lk for n in sizes if (lk := claim_look(claim, a[:n], b[:n], list(draws[:n]), list(draws[:n]))) is not None]


#: Pipeline draws of the ``replicated`` case (the default scale's, :data:`harness.config.presets.REPLICATES`) and the SD (in
#: units of the seeds' SD) of the draw-to-draw variation of the arms' difference (arm × draw interaction) and of the
#: level both arms share.
REPLICATES, INTERACTION_SD, DRAW_SD = PRESET_REPLICATES, 0.5, 1.0


def replicated_pair(rng: np.random.Generator, n: int, shift: float, replicates: int = REPLICATES,
                    interaction_sd: float = INTERACTION_SD, draw_sd: float = DRAW_SD) -> tuple[np.ndarray, ...]:
    """Seed values of two arms run on ``replicates`` pipeline draws (seed ``s`` on draw ``s mod r``): N(0, 1) per
    seed, plus a level per draw that both arms share (N(0, draw_sd²)), plus a per-draw effect on arm ``a``
    (N(shift, interaction_sd²)): the effect averaged over draws is ``shift``, but any one set of draws shows it
    with an error no number of seeds removes. Returns ``(a [n], b [n], draws [n])``."""
    draws = np.arange(n) % replicates
    level = rng.normal(0.0, draw_sd, replicates)
    effect = rng.normal(shift, interaction_sd, replicates)
    a = rng.normal(size=n) + level[draws] + effect[draws]
    b = rng.normal(size=n) + level[draws]
    return a, b, draws


def simulate(draw: Optional[Callable[[np.random.Generator, int], np.ndarray]], expect: str, shift: float, reps: int,
             stage: int = sequential.DEFAULT_STAGE, cap: int = sequential.DEFAULT_CAP, alpha: float = 0.05,
             n_claims: int = 1, seed: int = 0, blocked: bool = True, margin_alpha: float = MARGIN_ALPHA) -> dict[str, float]:
    """Simulate the sequential rule on ``n_claims`` independent claims of type ``expect`` whose arm ``a``
    is shifted by ``shift`` (SD units; margin :data:`MARGIN_SD`), with ``margin_alpha`` of ``alpha`` for the margin
    tests of the ``greater`` claims (the verdict rule's default). ``draw=None``: the ``replicated`` case
    (:func:`replicated_pair`), judged on the pipeline draws (``blocked``) or, to show what ignoring them costs, as if
    every seed were an independent draw (``blocked=False``).

    Returns:
        ``{"decisive": P(at least one claim decided by the test of its null, reproduced or contradicted),
        "supported": P(at least one decided for the claim), "not_supported": P(at least one decided against the
        claim: contradicted or below margin), "below": P(at least one decided below margin), "seeds": mean seeds
        per arm per claim, "fixed_decisive", "fixed_supported": the same for the first
        claim judged once at the cap, "peeking_decisive", "peeking_supported": for the first claim tested at
        every look at the full α, stopping at the first crossing}``.
    """
    rng = np.random.default_rng(seed)
    claim = _claim(expect, MARGIN_SD)
    sizes = sequential.stage_sizes(stage, cap)
    any_dec = any_sup = any_not = any_below = 0
    fixed = {"decisive": 0, "supported": 0}
    peek = {"decisive": 0, "supported": 0}
    seeds = 0.0
    margined = [has_margin_test(claim)] * n_claims
    level = sequential.split_alpha(alpha, margin_alpha, margined[:1])[0]  # the Holm tests' α for one claim
    for _ in range(reps):
        looks = []
        for _c in range(n_claims):
            if draw is None:
                a, b, draws = replicated_pair(rng, cap, shift)
                looks.append(_looks(claim, a, b, sizes, draws if blocked else None))
            else:
                a, b = draw(rng, cap) + shift, draw(rng, cap)
                looks.append(_looks(claim, a, b, sizes))
        res = sequential.sequential_decisions(looks, alpha, cap, margin_alpha, margined)
        any_dec += any(r["decided"] and not r["below_margin"] for r in res)
        any_sup += any(r["decided"] and r["supports"] for r in res)
        any_not += any(r["decided"] and not r["supports"] for r in res)
        any_below += any(r["decided"] and r["below_margin"] for r in res)
        seeds += sum(sizes[r["look"]] if r["decided"] else cap for r in res) / n_claims
        first = looks[0]
        fixed["decisive"] += first[-1].p <= level  # one look at the cap at the plain level
        fixed["supported"] += first[-1].p <= level and first[-1].supports
        crossed = [lk for lk in first if lk.p <= level]  # naive peeking: stop at the first look below the level
        peek["decisive"] += bool(crossed)
        peek["supported"] += bool(crossed) and crossed[0].supports
    return {"decisive": any_dec / reps, "supported": any_sup / reps, "not_supported": any_not / reps,
            "below": any_below / reps, "seeds": seeds / reps,
            **{f"fixed_{k}": v / reps for k, v in fixed.items()}, **{f"peeking_{k}": v / reps for k, v in peek.items()}}


def mixed_fwer(draw: Optional[Callable[[np.random.Generator, int], np.ndarray]], reps: int,
               stage: int = sequential.DEFAULT_STAGE, cap: int = sequential.DEFAULT_CAP, alpha: float = 0.05,
               seed: int = 0, margin_alpha: float = MARGIN_ALPHA) -> float:
    """The family-wise error of an ablation of 4 ``greater`` claims, 2 with no effect (d = 0: reproduced or
    contradicted is wrong) and 2 at d = m (below margin or contradicted is wrong): the case where the Holm tests'
    level passing and the margin tests could add up. ``draw=None``: the ``replicated`` case, judged on the draws."""
    rng = np.random.default_rng(seed)
    claim = _claim("greater", MARGIN_SD)
    sizes = sequential.stage_sizes(stage, cap)
    errors = 0
    for _ in range(reps):
        looks = []
        for shift in (0.0, 0.0, MARGIN_SD, MARGIN_SD):
            if draw is None:
                a, b, draws = replicated_pair(rng, cap, shift)
                looks.append(_looks(claim, a, b, sizes, draws))
            else:
                looks.append(_looks(claim, draw(rng, cap) + shift, draw(rng, cap), sizes))
        res = sequential.sequential_decisions(looks, alpha, cap, margin_alpha, [True] * 4)
        wrong = [r["decided"] and not r["below_margin"] for r in res[:2]]  # at d = 0
        wrong += [r["decided"] and not r["supports"] for r in res[2:]]  # at d = m
        errors += any(wrong)
    return errors / reps


def calibration_table(reps: int = 4000, stage: int = sequential.DEFAULT_STAGE, cap: int = sequential.DEFAULT_CAP,
                      alpha: float = 0.05, seed: int = 0,
                      cases: Optional[Sequence[str]] = None) -> list[dict[str, Any]]:
    """One row per (distribution, claim type): the error rate of one claim under its null (``fpr``; for
    ``equivalent`` the rate of declaring equivalence at |d| = m; for ``greater`` reproduced or contradicted at
    d = 0, where "below margin" is right), the FWER over 4 such claims, the power at the alternative
    (``greater``/``not_greater``: d = margin beyond the null; ``equivalent``: d = 0), the mean seeds per arm
    under the null and at the alternative, and the fixed-n and naive-peeking error rates. For ``greater`` also the
    error at d = m, the margin test's null ("below margin" or "contradicted" there: ``fpr_margin`` for one claim,
    ``fwer_4_margin`` over 4), the rate of "below margin" at d = 0 (``below_null``: what the margin test is for) and
    the FWER of 4 claims of which 2 sit at d = 0 and 2 at d = m (``fwer_4_mixed``); NaN for the other claim types."""
    rows = []
    for name, draw in {**samplers(), "replicated": None}.items():
        if cases is not None and name not in cases:
            continue
        for expect in CLAIM_TYPES:
            null_shift = {"greater": 0.0, "not_greater": MARGIN_SD, "equivalent": MARGIN_SD}[expect]
            alt_shift = {"greater": MARGIN_SD, "not_greater": 0.0, "equivalent": 0.0}[expect]
            one = simulate(draw, expect, null_shift, reps, stage, cap, alpha, 1, seed)
            four = simulate(draw, expect, null_shift, max(reps // 4, 1), stage, cap, alpha, 4, seed + 1)
            # greater: the alternative d = m is also the margin test's null, judged with the full repetitions
            alt = simulate(draw, expect, alt_shift, reps if expect == "greater" else max(reps // 4, 1), stage, cap,
                           alpha, 1, seed + 2)
            extra = {"fpr_margin": math.nan, "fwer_4_margin": math.nan, "below_null": math.nan, "fwer_4_mixed": math.nan}
            if expect == "greater":
                four_m = simulate(draw, expect, alt_shift, max(reps // 4, 1), stage, cap, alpha, 4, seed + 3)
                extra = {"fpr_margin": alt["not_supported"], "fwer_4_margin": four_m["not_supported"],
                         "below_null": one["below"],
                         "fwer_4_mixed": mixed_fwer(draw, max(reps // 4, 1), stage, cap, alpha, seed + 4)}
            # the error: any decisive verdict at the null, except for TOST, where only "equivalent" is the error
            key = "supported" if expect == "equivalent" else "decisive"
            err, fwer = one[key], four[key]
            rows.append({"distribution": name, "claim": expect, "reps": reps, "fpr": err,
                         "fpr_mc_se": math.sqrt(max(err * (1 - err), 1e-12) / reps), "fwer_4": fwer,
                         "power": alt["supported"], "seeds_null": one["seeds"], "seeds_alt": alt["seeds"],
                         "fpr_fixed_n": one[f"fixed_{key}"], "fpr_peeking": one[f"peeking_{key}"], **extra})
    return rows


def format_table(rows: Sequence[dict[str, Any]], stage: int, cap: int, alpha: float) -> str:
    """The table as aligned text, with a header naming the design."""
    head = (f"sequential rule: looks at {sequential.stage_sizes(stage, cap)} seeds per arm, O'Brien-Fleming-type "
            f"spending, alpha {alpha}, Holm over claims; margin {MARGIN_SD} SD; margin tests of greater claims with "
            f"{MARGIN_ALPHA} of alpha (Bonferroni)\n")
    cols = ["distribution", "claim", "reps", "fpr", "fpr_mc_se", "fwer_4", "power", "seeds_null", "seeds_alt",
            "fpr_fixed_n", "fpr_peeking", "fpr_margin", "fwer_4_margin", "below_null", "fwer_4_mixed"]
    lines = [" ".join(f"{c:>12}" for c in cols)]
    for r in rows:
        lines.append(" ".join(f"{r[c]:>12.4f}" if isinstance(r[c], float) else f"{r[c]:>12}" for c in cols))
    return head + "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m harness.analysis.calibrate``: print the calibration table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=4000)
    ap.add_argument("--stage", type=int, default=sequential.DEFAULT_STAGE)
    ap.add_argument("--cap", type=int, default=sequential.DEFAULT_CAP)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", nargs="+", default=None,
                    help="seed distributions to simulate (normal collapsing baseline replicated; default all)")
    args = ap.parse_args(argv)
    rows = calibration_table(args.reps, args.stage, args.cap, args.alpha, args.seed, cases=args.cases)
    print(format_table(rows, args.stage, args.cap, args.alpha))


if __name__ == "__main__":
    main()
