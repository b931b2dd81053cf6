"""The Makefile passes what a user types (NAME, ARGS, SEEDS, ...) to ``harness`` as arguments, never as shell text:
``make ablate NAME='x;touch PWNED'`` calls ``harness ablate 'x;touch PWNED'`` once and runs no other command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _make(tmp_path: Path, *args: str) -> list[list[str]]:
    """Run ``make`` in the project with a stand-in ``harness`` that records its argv (one JSON line per call) and a
    stamp newer than pyproject.toml (so that nothing is installed); returns the recorded calls."""
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "harness"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    fake.chmod(0o755)
    stamp = tmp_path / "stamp"
    stamp.touch()
    future = time.time() + 3600
    os.utime(stamp, (future, future))
    r = subprocess.run(["make", "-s", "-C", str(ROOT), *args, f"HARNESS={fake}", f"STAMP={stamp}"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("name", ["x;touch PWNED", "x && touch PWNED", "$$(touch PWNED)", "`touch PWNED`", "x|touch PWNED"])
def test_name_is_an_argument_not_shell_text(name, tmp_path):
    calls = _make(tmp_path, "ablate", f"NAME={name}", "SEEDS=3", "ARGS=--reuse --no-reuse")
    assert not (tmp_path / "PWNED").exists() and not (ROOT / "PWNED").exists()
    shown = name.replace("$$", "$")
    words = shown.split()
    assert calls[0] == ["data"]  # make setup's own step
    assert calls[1:] == [["ablate", w, "--scale", "default", "--workers", "2", "--seeds", "3", "--reuse", "--no-reuse"]
                         for w in words], calls


def test_several_names_run_one_after_another_and_args_split_into_words(tmp_path):
    calls = _make(tmp_path, "ablate", "NAME=a b", "SCALE=smoke", "ARGS=--pause-at 10")
    assert calls[1:] == [["ablate", n, "--scale", "smoke", "--workers", "2", "--pause-at", "10"] for n in ("a", "b")]
    (tmp_path / "r").mkdir()
    assert _make(tmp_path / "r", "report", "NAME=y;touch PWNED")[1:] == [["report", "y;touch PWNED"]]
    assert not (tmp_path / "r" / "PWNED").exists()


def test_the_suites_scheduler_keeps_the_tests_that_share_runs_on_one_worker(tmp_path):
    """``make test``'s loadgroup is the suite's own (tests/conftest.py): a test that calls ``kl_placement_smoke()`` or
    carries ``@pytest.mark.xdist_group("name")`` is in that group, found in the files' syntax trees (a call, not the
    name in a string or a helper); a test that does neither is a unit of its own."""
    from conftest import KL_PLACEMENT_SMOKE_GROUP, shared_run_groups

    (tmp_path / "test_a.py").write_text(
        "import pytest\n\n"
        "def test_reads_it():\n    x = kl_placement_smoke()\n\n"
        "@pytest.mark.slow\n@pytest.mark.xdist_group(\"runs\")\ndef test_first(p):\n    pass\n\n"
        "def test_alone():\n    kl_placement_smoke  # named, not called\n\n"
        "def helper():\n    kl_placement_smoke()\n")
    (tmp_path / "test_b.py").write_text("import pytest\n\n@pytest.mark.xdist_group(\"runs\")\ndef test_second():\n    pass\n")
    d = tmp_path.name
    assert shared_run_groups(tmp_path) == {f"{d}/test_a.py::test_reads_it": KL_PLACEMENT_SMOKE_GROUP,
                                           f"{d}/test_a.py::test_first": "runs", f"{d}/test_b.py::test_second": "runs"}
    # the shipped suite: both aa_sampler tests in one group, kl_placement's smoke readers in another
    shipped = shared_run_groups(ROOT / "tests")
    assert shipped["tests/test_staged.py::test_aa_samplers_decide_nothing_fixed_or_staged_and_a_staged_run_resumes_at_the_right_stage"] \
        == shipped["tests/test_staged.py::test_a_paused_or_budgeted_staged_run_keeps_the_design_and_counts_only_runs_still_to_train"] \
        == "aa_sampler_smoke"
    assert shipped["tests/test_ablate.py::test_kl_placement_smoke_records_nested_child_runs"] == KL_PLACEMENT_SMOKE_GROUP
    assert "tests/test_makefile.py::test_the_suites_scheduler_keeps_the_tests_that_share_runs_on_one_worker" not in shipped
