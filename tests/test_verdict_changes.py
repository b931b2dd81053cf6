"""`harness changes`: the reports' verdicts now against a git revision, one line per judged claim."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.errors import HarnessError
from harness.reporting.changes import change_lines, compare, read_at

REPORTS = Path(__file__).resolve().parent.parent / "reports"


def _row(claim: str, verdict: str, n: int | None = 8, diff: float | None = 0.02, kind: str = "finding") -> dict:
    judged = not verdict.startswith("no verdict")
    return {"ablation": "abl", "claim": claim, "kind": kind, "metric": "eval_final/pass1_greedy",
            "a": "x" if judged else None, "b": "y" if judged else None, "verdict": verdict, "n_a": n, "n_b": n,
            "diff": diff, "ci_low": None if diff is None else diff - 0.01, "ci_high": None if diff is None else diff + 0.01}


def test_each_judged_claim_is_new_unchanged_or_changed_with_what_it_was():
    old = [_row("A", "no verdict (no report yet)", None, None), _row("B", "reproduced", 8, 0.0200001),
           _row("C", "inconclusive", 8, 0.03), _row("D", "reproduced")]
    new = [_row("A", "reproduced", 16, 0.019), _row("B", "reproduced", 8, 0.02), _row("C", "below margin", 16, 0.004),
           _row("D", "no verdict (re-run pending)", None, None), _row("E", "pass", 8, 0.3, kind="mechanism")]
    entries = compare(old, new)
    # D has no verdict now: not listed; B differs only past 4 significant digits: unchanged
    assert [(e["row"]["claim"], e["status"]) for e in entries] == [("A", "new"), ("B", "unchanged"), ("C", "changed"),
                                                                    ("E", "new")]
    assert change_lines(entries) == [
        "abl (finding): A — n 16/16, +0.019 [+0.009, +0.029], reproduced; new",
        "abl (finding): B — n 8/8, +0.02 [+0.01, +0.03], reproduced; unchanged",
        "abl (finding): C — n 16/16, +0.004 [-0.006, +0.014], below margin; was n 8/8, +0.03 [+0.02, +0.04], inconclusive",
        "abl (mechanism): E — n 8/8, +0.3 [+0.29, +0.31], pass; new"]
    assert change_lines(entries, kinds=("mechanism",)) == ["abl (mechanism): E — n 8/8, +0.3 [+0.29, +0.31], pass; new"]


def test_a_verdict_from_another_scale_then_names_both_scales():
    # then: the full-scale report's verdict stood in the scorecard; now it is withheld and the default one shows
    then = {**_row("P", "contradicted", 10, -0.181), "scale": "full"}
    now = {**_row("P", "inconclusive", 10, -0.095), "scale": "default"}
    same = {**_row("Q", "inconclusive", 10, 0.05), "scale": "default"}
    assert change_lines(compare([then, {**same, "diff": 0.04}], [now, same])) == [
        "abl (finding): P — at the default scale: n 10/10, -0.095 [-0.105, -0.085], inconclusive; "
        "was at the full scale: n 10/10, -0.181 [-0.191, -0.171], contradicted",
        "abl (finding): Q — n 10/10, +0.05 [+0.04, +0.06], inconclusive; was n 10/10, +0.04 [+0.04, +0.06], inconclusive"]


def test_an_undecided_claim_says_what_its_seeds_could_detect_against_its_margin():
    directional = {**_row("F", "inconclusive", 40, 0.02), "decisive": False, "expect": "greater", "margin": 0.05,
                   "mde": 0.0812}
    equivalence = {**_row("G", "inconclusive", 16, 0.043), "decisive": False, "expect": "equivalent", "margin": 0.05,
                   "mde": 0.02, "tost_power_at_zero": 0.99963}
    decided = {**_row("H", "reproduced", 8, 0.02), "decisive": True, "expect": "greater", "margin": 0.05, "mde": 0.01}
    assert change_lines(compare([], [directional, equivalence, decided])) == [
        "abl (finding): F — n 40/40, +0.02 [+0.01, +0.03], inconclusive (MDE 0.0812 vs margin 0.05); new",
        "abl (finding): G — n 16/16, +0.043 [+0.033, +0.053], inconclusive (TOST power at zero difference 0.9996, "
        "margin 0.05; the interval contains the margin); new",
        "abl (finding): H — n 8/8, +0.02 [+0.01, +0.03], reproduced; new"]
    # a claim whose boundary is the margin, with the margin inside its interval: the estimate sits at the boundary
    at_margin = {**_row("J", "inconclusive", 16, 0.047), "decisive": False, "expect": "not_greater", "margin": 0.05,
                 "mde": 0.0238}
    clear = {**at_margin, "claim": "K", "diff": 0.02, "ci_low": 0.01, "ci_high": 0.03}
    flat = {**_row("M", "inconclusive", 10, 0.0), "decisive": False, "expect": "greater", "margin": 0.3, "mde": 0.0,
            "ci_low": 0.0, "ci_high": 0.0}
    assert change_lines(compare([], [flat])) == [
        "abl (finding): M — n 10/10, +0 [+0, +0], inconclusive (every seed of both arms gave the same value); new"]
    inside = {**equivalence, "claim": "L", "diff": 0.02, "ci_low": 0.01, "ci_high": 0.03}
    assert [ln.split(" — ")[1] for ln in change_lines(compare([], [at_margin, clear, inside]))] == [
        "n 16/16, +0.047 [+0.037, +0.057], inconclusive (MDE 0.0238 vs margin 0.05; the interval contains the margin); new",
        "n 16/16, +0.02 [+0.01, +0.03], inconclusive (MDE 0.0238 vs margin 0.05); new",
        "n 16/16, +0.02 [+0.01, +0.03], inconclusive (TOST power at zero difference 0.9996, margin 0.05); new"]


def test_reports_are_read_as_committed_at_a_revision(tmp_path):
    reports = tmp_path / "reports"
    (reports / "kl_placement").mkdir(parents=True)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    (reports / "kl_placement" / "summary.json").write_text(json.dumps({"scale": "default", "verdicts": [1]}))
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    (reports / "kl_placement" / "summary.json").write_text(json.dumps({"scale": "default", "verdicts": [2]}))
    read = read_at("HEAD", reports)
    assert read("kl_placement", "default") == {"scale": "default", "verdicts": [1]}  # the committed one, not the file
    assert read("kl_placement", "full") is None and read("dropout", "default") is None
    with pytest.raises(HarnessError, match="'nope' is not a git revision"):
        read_at("nope", reports)


def test_an_unknown_claim_kind_is_refused_with_the_allowed_ones():
    from typing import get_args

    from harness.experiments.spec import Claim
    from harness.reporting.changes import KINDS

    assert sorted(KINDS) == sorted(get_args(Claim.model_fields["kind"].annotation))  # the spec's kinds, no other
    r = CliRunner().invoke(app, ["changes", "--since", "HEAD", "--kind", "findings"])
    assert r.exit_code == 2
    assert "--kind: findings is not a claim kind; allowed: finding, mechanism, control" in r.output


def test_a_report_is_read_at_a_revision_as_it_was_written_even_if_its_configs_are_stale_now():
    """The scorecard withholds the verdicts of a report whose runs had other configs (or another rule) than the spec
    resolves to now; `harness changes` compares with what the report said when it was committed."""
    from harness.experiments.ablate import load_spec
    from harness.reporting.scorecard import all_rows, scorecard_rows

    spec = load_spec("kl_placement", validate_configs=False)
    c = spec.claims[0]
    verdict = {"claim": c.claim, "kind": c.kind, "metric": c.metric, "a": c.a, "b": c.b, "expect": c.expect,
               "margin": c.margin, "verdict": "pass", "decisive": True, "n_a": 10, "n_b": 10, "diff": 25.4,
               "ci_low": 12.0, "ci_high": 38.7}
    old = {"scale": "default", "configs_digest": "from-an-earlier-regime", "rule": {"test": "welch"}, "verdicts": [verdict]}
    withheld = scorecard_rows("kl_placement", old)[0]
    assert withheld["verdict"].startswith("no verdict (report made from runs of other configs") and not withheld["decisive"]
    written = scorecard_rows("kl_placement", old, as_written=True)
    assert (written[0]["verdict"], written[0]["n_a"], written[0]["diff"]) == ("pass", 10, 25.4)
    assert all(r["verdict"].startswith("no verdict (report predates this claim: re-run pending)") for r in written[1:])  # unmatched
    rows, _ = all_rows(lambda name, scale: old if (name, scale) == ("kl_placement", "default") else None, as_written=True)
    assert [r["verdict"] for r in rows if r["ablation"] == "kl_placement"][0] == "pass"


def test_a_report_not_rewritten_since_the_revision_is_unchanged_even_where_the_scorecard_withholds_it(tmp_path):
    """overoptimization's committed full-scale report is stale (its runs predate the spec's configs), so the scorecard
    shows the default-scale verdicts, while as written it would replace them. Neither summary rewritten since HEAD:
    every claim is unchanged, not "was at the full scale". Rewriting the default one moves only that ablation."""
    from harness.reporting.changes import untouched, verdict_changes
    from harness.reporting.scorecard import reports_reader

    reports = tmp_path / "reports"
    for rel in ("overoptimization/summary.json", "overoptimization/full/summary.json"):
        (reports / rel).parent.mkdir(parents=True, exist_ok=True)
        (reports / rel).write_text((REPORTS / rel).read_text())
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    from harness.reporting.scorecard import stale_reports

    assert "overoptimization/full" in stale_reports(reports_reader(reports))  # the premise: withheld now
    lines = verdict_changes("HEAD", reports)
    assert len(lines) == 3 and all(ln.startswith("overoptimization (") and ln.endswith("; unchanged") for ln in lines)
    assert all("at the default scale" not in ln for ln in lines)
    summary = json.loads((reports / "overoptimization/summary.json").read_text())
    summary["generated_at"] = "later"
    (reports / "overoptimization/summary.json").write_text(json.dumps(summary))
    assert untouched({"overoptimization", "dropout"}, read_at("HEAD", reports), reports_reader(reports)) == {"dropout"}
    moved = verdict_changes("HEAD", reports)
    assert sum("was at the full scale" in ln for ln in moved) >= 1  # as written then: the full-scale verdicts
