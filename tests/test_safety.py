"""Hardening: secrets redacted, one bounded line per error with the right exit status, names and
output paths checked before any file is touched, a fresh store safe under concurrent invocations,
and property-based checks of the CLI's argument handling, the override parser and the spec loader."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from harness.cli import MAX_SEEDS, _parse_seeds, app
from harness.config import ConfigError, build_config, parse_overrides
from harness.errors import HarnessError
from harness.infra.safety import MAX_MESSAGE_CHARS, check_name, check_under, display_path, join_problems, one_line, redact

SECRET = "S3cr3tPassw0rd"


def _cli(args: list[str], env: dict | None = None):
    with mock.patch.dict(os.environ, env or {}):
        return CliRunner().invoke(app, args)


def _one_error_line(result) -> str:
    """The result printed exactly one line, ``error: …``, bounded, and raised no exception other than SystemExit."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert len(lines[0]) <= len("error: ") + MAX_MESSAGE_CHARS + 40
    return lines[0]


# --------------------------------------------------------------------------------------------
# The helpers, on hand-written cases
# --------------------------------------------------------------------------------------------


def test_redact_hand_cases():
    assert redact(f"http://user:{SECRET}@host:5000/x") == "http://user:***@host:5000/x"
    assert redact(f"postgresql+psycopg2://me:{SECRET}@db.example/optuna") == "postgresql+psycopg2://me:***@db.example/optuna"
    assert redact(f"https://{SECRET}@host") == "https://***@host"  # a bare user part may be a token
    assert redact(f"cannot reach http://a:{SECRET}@h:9 (refused); also https://b:c@d") == \
        "cannot reach http://a:***@h:9 (refused); also https://b:***@d"
    assert redact(f"http://host/api?password={SECRET}&x=1") == "http://host/api?password=***&x=1"
    for safe in ("sqlite:///results/mlflow.db", "http://127.0.0.1:5000", "file:///tmp/a@b", "user@example.com"):
        assert redact(safe) == safe


def test_one_line_folds_bounds_and_redacts():
    assert one_line("a\n  b\tc") == "a b c"
    long = "x" * 1000
    assert one_line(long, 100) == "x" * 100 + "… (+900 characters)"
    assert SECRET not in one_line(f"error at http://u:{SECRET}@h")
    assert join_problems([f"p{i}" for i in range(8)], 3) == "p0; p1; p2; … and 5 more problems"
    assert join_problems(["a", "b"]) == "a; b"


@pytest.mark.parametrize("name", ["kl_placement", "a", "A-b_9", "x" * 64])
def test_check_name_accepts(name):
    assert check_name("ablation", name) == name


@pytest.mark.parametrize("name", ["", "/abs/path/x", "../kl_placement", "a/b", "a.b", ".hidden", "-x", "x" * 65, "a b", "ü"])
def test_check_name_rejects_paths_and_odd_characters(name):
    with pytest.raises(HarnessError, match=r"ablation name .* is not allowed: use 1-64 letters, digits"):
        check_name("ablation", name)


def test_check_under_and_display_path(tmp_path):
    (tmp_path / "r").mkdir()
    assert check_under(tmp_path / "r" / "a" / "b", [tmp_path / "r"], "--out") == (tmp_path / "r" / "a" / "b").resolve()
    with pytest.raises(HarnessError, match="--out '/etc/passwd/sub' is outside the allowed directories"):
        check_under("/etc/passwd/sub", [tmp_path / "r"], "--out")
    with pytest.raises(HarnessError, match="outside"):
        check_under(tmp_path / "r" / ".." / "elsewhere", [tmp_path / "r"], "--out")
    os.symlink("/etc", tmp_path / "r" / "link")
    with pytest.raises(HarnessError, match="outside"):  # a symlink out of the root does not count as inside
        check_under(tmp_path / "r" / "link" / "x", [tmp_path / "r"], "--out")
    project = Path(__file__).resolve().parent.parent
    assert display_path(project / "results" / "mlflow.db") == "results/mlflow.db"
    assert display_path(Path.home() / ".cache" / "ppo-harness") == "~/.cache/ppo-harness"
    assert display_path("relative/x") == "relative/x"


# --------------------------------------------------------------------------------------------
# The CLI's contract: one line, exit 2 for usage errors, before any compute or write
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seeds, needle", [
    ("0", "a count must be between 1 and 1000, got 0"),
    ("-1", "expected a count"),
    (",", "expected a count"),
    ("", "expected a count"),
    ("1e30", "expected a count"),
    ("1000000", "a count must be between 1 and 1000, got 1000000"),
    ("1,1", "1 repeated"),
    ("3,99999999999", "expected a count"),
])
def test_bad_seeds_exit_2_before_any_run(seeds, needle, tmp_path):
    with mock.patch("harness.experiments.ablate.run_ablation", side_effect=AssertionError("must not run")), \
            mock.patch("harness.experiments.staged.run_staged", side_effect=AssertionError("must not run")):
        r = _cli(["ablate", "kl_placement", "--seeds", seeds], {"HARNESS_RESULTS": str(tmp_path)})
    assert r.exit_code == 2 and needle in _one_error_line(r)
    assert not any(tmp_path.iterdir())  # nothing written


def test_good_seeds_parse():
    assert _parse_seeds(None) is None
    assert _parse_seeds("3") == [0, 1, 2] and _parse_seeds(" 4, 2 ,7") == [4, 2, 7]
    assert len(_parse_seeds(str(MAX_SEEDS))) == MAX_SEEDS


@pytest.mark.parametrize("args, needle", [
    (["ablate", "/some/abs/path/x"], "ablation name '/some/abs/path/x' is not allowed"),
    (["ablate", "../ablations/kl_placement"], "is not allowed"),
    (["report", "../../etc/x"], "is not allowed"),
    (["sweep", "/tmp/study"], "study name '/tmp/study' is not allowed"),
    (["train", "ppo.lr=0.1", "ppo.lr.x=2"], "ppo.lr is set to a value by another override"),
    (["train", "ppo.lr.x=2", "ppo.lr=0.1"], "ppo.lr has keys set below it by another override"),
    (["train", "ppo.lr=[unclosed"], "the value is not valid YAML"),
    (["train", "ppo..lr=1"], "empty key part"),
    (["train", "--out", "/etc/passwd/sub"], "--out '/etc/passwd/sub' is outside the allowed directories"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, needle, tmp_path):
    with mock.patch("harness.rl.runner.run", side_effect=AssertionError("must not train")):
        r = _cli(args, {"HARNESS_RESULTS": str(tmp_path)})
    assert r.exit_code == 2 and needle in _one_error_line(r)
    assert not any(tmp_path.iterdir())


def test_huge_spec_of_unknown_keys_is_refused_fast_in_one_line(tmp_path):
    specs = tmp_path / "ablations"
    specs.mkdir()
    (specs / "big.yaml").write_text("".join(f"unknown_key_{i}: {i}\n" for i in range(600_000)))  # ~13 MB
    r = _cli(["ablate", "big"], {"HARNESS_ABLATIONS": str(specs), "HARNESS_RESULTS": str(tmp_path / "res")})
    assert r.exit_code == 2 and "spec big.yaml is 1" in _one_error_line(r) and "at most 1 MB" in r.output
    (specs / "many.yaml").write_text("".join(f"unknown_key_{i}: {i}\n" for i in range(2000)))
    r = _cli(["ablate", "many"], {"HARNESS_ABLATIONS": str(specs), "HARNESS_RESULTS": str(tmp_path / "res")})
    assert r.exit_code == 2 and "more problems" in _one_error_line(r)


def test_unreachable_server_with_password_is_one_line_exit_1_without_the_password(tmp_path):
    env = {"MLFLOW_TRACKING_URI": f"http://user:{SECRET}@127.0.0.1:9", "HARNESS_RESULTS": str(tmp_path),
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    r = _cli(["report", "kl_placement"], env)
    line = _one_error_line(r)
    assert r.exit_code == 1 and SECRET not in r.output and "user:***@127.0.0.1:9" in line


def test_missing_database_driver_is_one_line(tmp_path):
    env = {"MLFLOW_TRACKING_URI": f"mssql+notadriver://u:{SECRET}@127.0.0.1:9/db", "HARNESS_RESULTS": str(tmp_path)}
    r = _cli(["report", "kl_placement"], env)
    assert r.exit_code == 1 and SECRET not in r.output
    _one_error_line(r)


def test_diverged_training_exits_1(tmp_path):
    from harness.errors import TrainingDivergedError

    with mock.patch("harness.rl.runner.run", side_effect=TrainingDivergedError("loss is nan at iteration 3; the run was stopped")):
        r = _cli(["train", "ppo.total_iterations=1"], {"HARNESS_RESULTS": str(tmp_path)})
    assert r.exit_code == 1 and "loss is nan at iteration 3" in _one_error_line(r)


def test_password_never_reaches_printed_or_committed_uris(tmp_path):
    from harness.experiments import sweep
    from harness.infra import tracking

    with mock.patch.dict(os.environ, {"MLFLOW_TRACKING_URI": f"http://user:{SECRET}@10.0.0.1:5000",
                                      sweep.STORAGE_ENV: f"postgresql://me:{SECRET}@10.0.0.2/optuna"}):
        assert tracking.display_uri(tracking.tracking_uri()) == "http://user:***@10.0.0.1:5000"
        assert sweep.redacted_storage_url("ppo_core") == "postgresql://me:***@10.0.0.2/optuna"
    # `harness ui` on a server store points at the server; on a database store it hands the store to mlflow
    # through the environment, never on its command line (the reachability checks are stubbed: no traffic)
    with mock.patch.dict(os.environ, {"MLFLOW_TRACKING_URI": f"http://user:{SECRET}@10.0.0.1:5000"}), \
            mock.patch("harness.infra.services.check_tracking_store"), mock.patch("harness.infra.services.serve_redacted") as serve:
        r = CliRunner().invoke(app, ["ui"])
        assert r.exit_code == 0 and not serve.called and SECRET not in r.output
        assert "the tracking store is the MLflow server at http://user:***@10.0.0.1:5000" in r.output
    with mock.patch.dict(os.environ, {"MLFLOW_TRACKING_URI": f"postgresql://me:{SECRET}@10.0.0.2/mlflow"}), \
            mock.patch("harness.infra.services.check_tracking_store"), mock.patch("harness.infra.services.serve_redacted") as serve:
        r = CliRunner().invoke(app, ["ui"])
        argv = serve.call_args[0][0]
        assert r.exit_code == 0 and all(SECRET not in a for a in argv)
        assert os.environ["MLFLOW_BACKEND_STORE_URI"].endswith("@10.0.0.2/mlflow")


def test_params_show_paths_relative_or_under_home():
    from harness.infra.tracking import log_params

    logged = []
    c = mock.Mock()
    c.log_batch.side_effect = lambda run_id, params: logged.extend(params)
    log_params(c, "r", {"pipeline": {"data": {"cache_dir": str(Path.home() / ".cache" / "ppo-harness")}},
                        "uri": f"http://u:{SECRET}@h", "lr": 0.1})
    got = {p.key: p.value for p in logged}
    assert got == {"pipeline.data.cache_dir": "~/.cache/ppo-harness", "uri": "http://u:***@h", "lr": "0.1"}


# --------------------------------------------------------------------------------------------
# A fresh store, two independent invocations at once: 10 of 10 succeed
# --------------------------------------------------------------------------------------------


def _open_fresh_stores(roots: list[str], name: str, barrier: "mp.synchronize.Barrier", q: "mp.Queue") -> None:
    """For each root in turn: wait for the sibling, then open the (fresh) store and create an experiment."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from harness.infra import tracking

    tracking._quiet_mlflow()  # imports done before the first barrier: both open each store at the same moment
    for root in roots:
        os.environ["HARNESS_RESULTS"] = root
        try:
            barrier.wait(60)
            c = tracking.init_store()
            tracking.experiment_id(c, f"ablation/{name}")
            q.put((root, name, "ok"))
        except BaseException as e:  # noqa: BLE001
            q.put((root, name, f"{type(e).__name__}: {e}"))


@pytest.mark.slow
def test_two_ablations_at_once_on_a_fresh_store_never_crash(tmp_path):
    from mlflow import MlflowClient

    ctx = mp.get_context("spawn")
    roots = [str(tmp_path / f"fresh{trial}") for trial in range(10)]
    barrier, q = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_open_fresh_stores, args=(roots, n, barrier, q)) for n in ("a", "b")]
    for p in procs:
        p.start()
    outcomes = [q.get(timeout=300) for _ in range(2 * len(roots))]
    for p in procs:
        p.join(60)
    assert sorted(o for *_, o in outcomes) == ["ok"] * 20, outcomes
    for root in roots:  # each fresh store holds both experiments
        c = MlflowClient(tracking_uri=f"sqlite:///{root}/results/mlflow.db")
        assert {"ablation/a", "ablation/b"} <= {e.name for e in c.search_experiments()}


# --------------------------------------------------------------------------------------------
# Property-based: any input is accepted or refused in one line, never a traceback, never a write
# outside the roots, never the secret in the output
# --------------------------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
_key = st.lists(st.sampled_from(["ppo", "lr", "seed", "eval", "every", "task", "x", "", " ", "kl_coef", "pipeline"]),
                min_size=1, max_size=4).map(".".join)
_override = st.one_of(st.tuples(_key, _text).map(lambda kv: f"{kv[0]}={kv[1]}"), _text)
_fast = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_fast
@given(st.lists(_override, max_size=4))
def test_override_parser_accepts_or_raises_config_error(overrides):
    try:
        parse_overrides(overrides)
        build_config({}, overrides)
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 5000


@_fast
@given(st.one_of(st.none(), _text))
def test_seed_parser_accepts_or_raises_harness_error(seeds):
    try:
        out = _parse_seeds(seeds)
    except HarnessError as e:
        assert "\n" not in str(e) and len(str(e)) < 300
    else:
        assert out is None or (1 <= len(out) <= MAX_SEEDS and all(0 <= s < 2**31 for s in out))


_yaml_value = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False, width=32), _text),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.sampled_from(["a", "b", "ppo", "lr", "metric"]), inner, max_size=3)),
                           max_leaves=8)
_spec = st.dictionaries(st.sampled_from(["question", "baseline", "base", "variants", "claims", "metrics", "scales", "verdict",
                                         "unknown"]), _yaml_value, max_size=6)


@_fast
@given(_spec)
def test_spec_loader_accepts_or_raises_one_line(tmp_path_factory, spec):
    from harness.experiments.ablate import load_spec

    specs = tmp_path_factory.mktemp("specs")
    (specs / "gen.yaml").write_text(yaml.safe_dump(spec))
    with mock.patch.dict(os.environ, {"HARNESS_ABLATIONS": str(specs)}):
        try:
            load_spec("gen")
        except HarnessError as e:
            assert "\n" not in str(e)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_text, scale=_text, seeds=st.one_of(st.none(), _text), overrides=st.lists(_override, max_size=3))
def test_cli_arguments_one_line_or_success_never_a_write_outside(tmp_path_factory, name, scale, seeds, overrides):
    root = tmp_path_factory.mktemp("cli")
    outside = tmp_path_factory.mktemp("outside")
    env = {"HARNESS_RESULTS": str(root), "MLFLOW_TRACKING_URI": f"http://u:{SECRET}@127.0.0.1:9",
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"}
    calls = [["ablate", name, "--scale", scale] + (["--seeds", seeds] if seeds is not None else []),
             ["train", "--out", str(outside / "o")] + overrides, ["report", name]]
    with mock.patch("harness.experiments.ablate.run_ablation", return_value=Path("r.md")), \
            mock.patch("harness.experiments.staged.run_staged", return_value=Path("r.md")), \
            mock.patch("harness.rl.runner.run", return_value={}), mock.patch("harness.reporting.ablation.write_report", return_value=Path("r.md")):
        for args in calls:
            if args[1].startswith("-"):
                continue  # an option, not a name: typer's own usage error
            r = _cli(args, env)
            assert r.exit_code in (0, 1, 2), (args, r.exit_code, r.output)
            assert SECRET not in r.output
            if r.exit_code:
                _one_error_line(r)
    assert not any(outside.iterdir())


@pytest.mark.slow
def test_password_in_tracking_uri_reaches_no_file_and_no_output_through_a_real_server(tmp_path):
    """A smoke ablation through a local `mlflow server` whose URI carries a password (MLflow sends it
    as basic auth; the server ignores it): no line printed and no file written (results, report, the
    server's own store) contains the password."""
    import socket
    import subprocess
    import sys
    import time

    from ablation_fixtures import results_env

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = tmp_path / "server"
    store.mkdir()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{store}/mlflow.db", "--artifacts-destination",
                               str(store / "artifacts"), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # as docs/cluster.md
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        specs = tmp_path / "specs"
        specs.mkdir()
        (specs / "tiny_secret.yaml").write_text(
            "question: q\nbaseline: a\nvariants:\n  a: {}\n  b: {ppo: {kl_coef: 0.1}}\n"
            "claims:\n  - {claim: c, kind: finding, source: s, section: x, setting_note: n, metric: eval_final/gold, "
            "a: a, expect: greater, b: b, margin: 0.1}\n"
            "scales:\n  smoke: {seeds: 1, overrides: {ppo: {total_iterations: 2}}}\n")
        with results_env(specs) as root:
            env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://user:{SECRET}@127.0.0.1:{port}"}
            r = subprocess.run([sys.executable, "-m", "harness.cli", "ablate", "tiny_secret", "--scale", "smoke", "--workers", "1"],
                               env=env, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stderr[-2000:]
            assert SECRET not in r.stdout + r.stderr
            report = root / "reports" / "tiny_secret" / "report.md"
            assert report.is_file() and "user:***@127.0.0.1" in report.read_text()
            leaks = [p for d in (root, store) for p in Path(d).rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
            assert leaks == []
    finally:
        server.terminate()
        server.wait(30)


def test_committed_reports_hold_no_machine_detail():
    """Every file under reports/ that git tracks (archived runs decompressed): no absolute path of a home, work or temp directory, no
    `+dirty` sha, no host name of this machine, no process-id field, no credentials."""
    import gzip
    import re
    import socket
    import subprocess

    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files", "reports"], cwd=root, capture_output=True, text=True).stdout.split()
    text_files = [root / f for f in files if f.endswith((".md", ".json", ".csv", ".json.gz", ".yaml"))]
    assert text_files, "no committed reports"
    host = socket.gethostname()
    # credentials: scheme://user:password@, with a scheme character just before `://` (the user and password hold no
    # quote or backslash, so the generated soup of URL placeholders in archived responses, e.g.
    # `!://:url\",\"@anonymous`, is no match). Each alternative opens with a literal, which re finds fast: the
    # archives decompress to ~700 MB.
    bad = re.compile(r"/(?:root|home|Users|tmp|work)/|\+dirty|\"pid\"|worker_pid|"
                     r"://(?<=[A-Za-z0-9+.-]://)[^\s/@:\"\\]+:[^\s/@*\"\\]+@")
    assert [bool(bad.search(t)) for t in ("postgresql://user:secret@db/x", '"https://u:p@h"', 'x!://:url\\",\\"@a',
                                          "url://url_:// :)url@x", "sqlite:///results/mlflow.db",
                                          "cd /home/ann/x", "sha 1a2b3c+dirty")] == [
        True, True, False, False, False, True, True]
    for p in text_files:
        text = gzip.decompress(p.read_bytes()).decode() if p.name.endswith(".gz") else p.read_text()
        m = bad.search(text)
        assert m is None, f"{p.relative_to(root)}: {m.group(0)!r}"
        assert len(host) < 4 or host not in text, f"{p.relative_to(root)} names this host"


# --------------------------------------------------------------------------------------------
# Specs that cannot work are refused before any run, in one line each
# --------------------------------------------------------------------------------------------

_GOOD_SPEC = ("question: q\nbaseline: a\nvariants:\n  a: {}\n  b: {ppo: {kl_coef: 0.1}}\n"
              "claims:\n  - {claim: c, kind: finding, source: s, section: x, setting_note: n, metric: METRIC, "
              "a: a, expect: equivalent, b: b, margin: MARGIN}\n")


@pytest.mark.parametrize("body, needle", [
    (_GOOD_SPEC.replace("METRIC", "eval_final/gold").replace("MARGIN", ".inf"),
     "claims.0.margin: Input should be a finite number (got inf)"),
    (_GOOD_SPEC.replace("METRIC", "eval_final/gold").replace("MARGIN", ".nan"),
     "claims.0.margin: Input should be a finite number"),
    (_GOOD_SPEC.replace("METRIC", "eval_final/gold").replace("MARGIN", "0.1") + "question: another\n",
     "is not valid YAML (duplicate key 'question' on line 8 (first on line 1); a key may appear once)"),
    (_GOOD_SPEC.replace("METRIC", "eval_final/glod").replace("MARGIN", "0.1"),
     "claims.0.metric: no run records metric 'eval_final/glod' (did you mean 'eval_final/gold'"),
    (_GOOD_SPEC.replace("METRIC", "last/loss/value").replace("MARGIN", "0.1").replace("b: {ppo: {kl_coef: 0.1}}",
                                                                                      "b: {ppo: {adv_estimator: grpo}}"),
     "claims.0.metric: no run records metric 'last/loss/value'"),
    (_GOOD_SPEC.replace("METRIC", "eval_final/gold").replace("MARGIN", "0.1") + "metrics: [eval_final/goldd]\n",
     "metrics.0: no run records metric 'eval_final/goldd'"),
], ids=["inf-margin", "nan-margin", "duplicate-key", "unknown-metric", "metric-one-arm-lacks", "unknown-primary-metric"])
def test_specs_that_cannot_work_are_refused_before_any_run(body, needle, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "bad.yaml").write_text(body)
    with mock.patch("harness.experiments.ablate.run_tasks", side_effect=AssertionError("must not run")), \
            mock.patch("harness.experiments.ablate._build_pipelines", side_effect=AssertionError("must not build")):
        r = _cli(["ablate", "bad", "--scale", "smoke"], {"HARNESS_ABLATIONS": str(specs), "HARNESS_RESULTS": str(tmp_path / "res")})
    line = _one_error_line(r)
    assert r.exit_code == 2 and line.startswith("error: ablation bad: ") and needle in line, line
    assert not (tmp_path / "res").exists()


def test_duplicate_keys_are_refused_in_config_files_and_overrides_too(tmp_path):
    from harness.config import load_config
    from harness.infra.safety import load_yaml

    assert load_yaml("base: &b {k: 1}\nv:\n  <<: *b\n  j: 2\n") == {"base": {"k": 1}, "v": {"k": 1, "j": 2}}  # merge keys are fine
    f = tmp_path / "c.yaml"
    f.write_text("ppo:\n  kl_coef: 0.1\n  lr: 1.0e-4\n  kl_coef: 0.2\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'kl_coef' on line 4 \(first on line 2\)"):
        load_config(f, [])
    with pytest.raises(ConfigError, match=r"duplicate key 'a' on line 1"):
        parse_overrides(["ppo={a: 1, a: 2}"])
    with pytest.raises(ConfigError, match=r"ppo.kl_coef: Input should be a finite number"):
        build_config({}, ["ppo.kl_coef=.inf"])


def test_ports_outside_1_to_65535_are_one_line_exit_2(tmp_path):
    for cmd in ("ui", "dashboard"):
        for port in ("0", "99999"):
            with mock.patch("subprocess.Popen", side_effect=AssertionError("must not start")):
                r = _cli([cmd, "--port", port], {"HARNESS_RESULTS": str(tmp_path)})
            assert r.exit_code == 2 and f"--port: must be a TCP port in 1-65535, got {port}" in _one_error_line(r)


# --------------------------------------------------------------------------------------------
# Outside services: a deadline, one line, exit 1, no password
# --------------------------------------------------------------------------------------------


@pytest.fixture
def silent_port():
    """A TCP port on 127.0.0.1 whose socket listens and never accepts: connections complete in the
    kernel's backlog and then nothing answers, as with a hung server."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def closed_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", [["report", "kl_placement"], ["ablate", "kl_placement", "--scale", "smoke"],
                                     ["report-all"], ["sweep", "ppo_core"], ["ui"]])
def test_a_silent_mlflow_server_ends_each_command_within_the_deadline(command, silent_port, tmp_path):
    import time

    env = {"MLFLOW_TRACKING_URI": f"http://user:{SECRET}@127.0.0.1:{silent_port}", "HARNESS_RESULTS": str(tmp_path),
           "HARNESS_CONNECT_TIMEOUT": "2"}
    t0 = time.time()
    with mock.patch("harness.experiments.ablate._build_pipelines", side_effect=AssertionError("must not build")):
        r = _cli(command, env)
    line = _one_error_line(r)
    assert time.time() - t0 < 30 and r.exit_code == 1 and SECRET not in r.output
    assert f"the MLflow server at http://user:***@127.0.0.1:{silent_port} is unreachable (timed out" in line, line


def test_unreachable_ray_postgres_and_optuna_storage_are_one_line_each(silent_port, closed_port, tmp_path):
    import time

    from harness.infra import services

    base = {"HARNESS_RESULTS": str(tmp_path), "HARNESS_CONNECT_TIMEOUT": "2"}
    cases = [
        (["ablate", "dropout", "--scale", "smoke", "--seeds", "1"], {"RAY_ADDRESS": f"127.0.0.1:{closed_port}"},
         f"the Ray cluster at 127.0.0.1:{closed_port} is unreachable (", "connection refused"),
        (["report", "kl_placement"], {"MLFLOW_TRACKING_URI": f"postgresql+psycopg://me:{SECRET}@127.0.0.1:{silent_port}/mlflow"},
         f"the MLflow store at postgresql+psycopg://me:***@127.0.0.1:{silent_port}/mlflow is unreachable (", "timeout"),
        (["dashboard"], {"HARNESS_OPTUNA_STORAGE": f"postgresql://me:{SECRET}@127.0.0.1:{closed_port}/optuna"},
         f"the Optuna storage at postgresql://me:***@127.0.0.1:{closed_port}/optuna is unreachable (", "refused"),
        (["ui"], {"MLFLOW_TRACKING_URI": f"http://user:{SECRET}@127.0.0.1:{closed_port}"},
         f"the MLflow server at http://user:***@127.0.0.1:{closed_port} is unreachable (", "refused"),
    ]
    for args, env, needle, why in cases:
        services._REACHED.clear()
        t0 = time.time()
        with mock.patch("harness.experiments.ablate._build_pipelines", side_effect=AssertionError("must not build")), \
                mock.patch("subprocess.Popen", side_effect=AssertionError("must not start a server")):
            r = _cli(args, {**base, **env})
        line = _one_error_line(r)
        assert r.exit_code == 1 and time.time() - t0 < 30 and SECRET not in r.output, (args, r.output)
        assert needle in line and why in line.lower(), line
    # a silent Ray head: the TCP connection completes, so the check passes and Ray's own client takes over
    services.check_ray_address(f"127.0.0.1:{silent_port}")
    with pytest.raises(HarnessError, match="expected host:port or ray://host:port"):
        services.check_ray_address("nohost")
    with mock.patch.dict(os.environ, {"HARNESS_CONNECT_TIMEOUT": "0"}), pytest.raises(HarnessError, match=r"in \(0, 600\]"):
        services.connect_timeout()


def test_ui_output_is_redacted_and_a_server_traceback_is_one_line(tmp_path):
    """`harness ui` runs the server as a child and passes its lines through redact(); a traceback the
    server prints (some exit 0 after one) becomes one error line with the exception, exit 2."""
    import sys

    from harness.infra.services import serve_redacted

    script = tmp_path / "server.py"
    script.write_text("import sys\nprint('listening on http://u:%s@127.0.0.1:1', flush=True)\n"
                      "raise OverflowError('bind(): port must be 0-65535 for http://u:%s@h')\n" % (SECRET, SECRET))
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(HarnessError) as e:
        serve_redacted([sys.executable, str(script)], "server")
    assert err.getvalue() == "listening on http://u:***@127.0.0.1:1\n"
    assert str(e.value) == "server stopped (exit status 1): OverflowError: bind(): port must be 0-65535 for http://u:***@h"
    script.write_text("import sys\nprint('Traceback (most recent call last):')\nprint('  File \"x\", line 1')\n"
                      "print('ValueError: boom')\n")
    with redirect_stderr(io.StringIO()), pytest.raises(HarnessError, match=r"exit status 0\): ValueError: boom"):
        serve_redacted([sys.executable, str(script)], "server")


def test_an_exception_escaping_to_pythons_hooks_prints_one_redacted_line(capsys):
    import sys
    import threading

    from harness.infra.safety import install_redacting_hooks

    old = sys.excepthook, threading.excepthook
    try:
        install_redacting_hooks()
        try:
            raise RuntimeError(f"cannot reach http://u:{SECRET}@h:1\n  second line")
        except RuntimeError:
            sys.excepthook(*sys.exc_info())
        th = threading.Thread(target=lambda: (_ for _ in ()).throw(ValueError(f"postgresql://me:{SECRET}@db/x")), name="w")
        th.start()
        th.join()
    finally:
        sys.excepthook, threading.excepthook = old
    err = capsys.readouterr().err
    assert err == ("error: RuntimeError: cannot reach http://u:***@h:1 second line\n"
                   "error: in thread w: ValueError: postgresql://me:***@db/x\n")
