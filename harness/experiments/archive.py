"""The run archive: an ablation's finished runs kept in the repository, so that hours of runs survive a new machine.

The MLflow store lives under the ignored ``results/``; a clean clone has none of its runs. ``export_runs`` writes
every ended run of an ablation's experiment (invocations and PPO runs; FINISHED, FAILED and KILLED alike, never a
RUNNING one) to ``<reports>/<name>/archive/<run id>.json.gz``: status, start and end times, tags, params, the full
history of every metric (step, timestamp, value) and the text artifacts (samples, ``summary.json``, ``config.yaml``,
``spec.yaml``, the run's log), without machine detail (:func:`scrub`; the ``host`` and ``pid`` tags are left out).
Two things each pipeline the runs used built are kept beside them (:data:`KEPT_STAGES`), since a report reads them
and a new machine could rebuild them only by building that pipeline: the best-of-n curve (``pipeline.bon`` tag;
``archive/bon/<stage key>.json.gz``, for the frontier) and the proxy reward model's metrics (``pipeline.reward_model``;
``archive/proxy/<stage key>.json.gz``: its held-out agreement with the gold and its Spearman with the gold and with
response length, for the pipeline-draw table); :func:`stage_copy` reads that copy, else the stage built here when its
weights are the runs' (their ``digest.<stage>`` tags).
``restore_runs`` puts the archived runs that the store lacks back into it with the
same status, times and values, tagged ``restored_from = <archived run id>``; a child's ``mlflow.parentRunId`` points
at its restored invocation. A run is known by its archive key (``restored_from`` if set, else its own id), so
exporting a restored run rewrites nothing and restoring twice adds nothing: results are never lost or duplicated.

Both drivers restore before they plan (so they train only the seeds no machine finished) and export each run as it
ends and again at the end of the invocation; ``harness report`` restores before it reads; ``harness archive NAME``
exports on demand.

Why not ``mlflow-export-import`` (1.2.0): its importer marks every imported run FINISHED (a FAILED run would count
as a result) and gives it the import time as start time; the harness's counting rule reads both.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from harness.errors import HarnessError

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

#: Version of the archive's record layout; a record of another version is refused with its path named.
FORMAT = 1
#: The tag a restored run carries: the id of the run it was archived from.
RESTORED_TAG = "restored_from"
#: Artifacts larger than this (bytes) are left out of a record (named in ``skipped_artifacts``).
MAX_ARTIFACT_BYTES = 2_000_000
ENDED = ("FINISHED", "FAILED", "KILLED")
#: A record larger than this once decompressed (bytes) is refused unread (a gzip bomb would otherwise fill memory).
MAX_RECORD_BYTES = 256_000_000
#: The pipeline stages of which a report reads what was built, kept with the runs: stage → (the archive's folder of
#: the copies, the record's field holding the copy). A run names the stage's key in its tag ``pipeline.<stage>``.
KEPT_STAGES = {"bon": ("bon", "curve"), "reward_model": ("proxy", "metrics")}
#: The archive's folder of rescored metrics (``harness rescore``), one file per judge (its gold stage key).
RESCORED_FOLDER = "rescored"
#: Tags that name the machine or process that owned a run: meaningless elsewhere, and kept out of the repository.
MACHINE_TAGS = ("host", "pid")
#: An absolute path under a home, work or temporary directory that :func:`scrub` did not already shorten.
_MACHINE_PATH = re.compile(r"(?<![\w.~<>-])/(?:root|home|Users|tmp|work|var/folders)(?:/[^\s'\"`,;)\]}]*)?")


def scrub(text: str) -> str:
    """``text`` without machine detail, as a committed file must be: credentials redacted
    (:func:`harness.infra.safety.redact`), the results, cache and project directories written ``<results>``, ``<cache>``
    and ``<project>``, the home directory ``~``, any other absolute path under a home, work or temporary directory
    ``<path>``, and this machine's host name ``<host>``."""
    from harness.config.base import default_cache_dir
    from harness.infra.safety import redact
    from harness.infra.tracking import host, results_root

    project = Path(__file__).resolve().parents[2]
    text = redact(text)
    for root, shown in ((results_root(), "<results>"), (Path(default_cache_dir()).resolve(), "<cache>"),
                        (project, "<project>"), (Path.home(), "~")):
        if len(str(root)) > 1:
            text = text.replace(str(root), shown)
    text = _MACHINE_PATH.sub("<path>", text)
    name = host()
    return text.replace(name, "<host>") if len(name) >= 4 else text


def archive_dir(name: str, reports: Optional[Path] = None) -> Path:
    """``<reports>/<name>/archive``: where ablation ``name``'s archived runs live (``reports`` defaults to the
    configured reports directory, ``$HARNESS_RESULTS/reports`` or ``./reports``)."""
    from harness.config.base import default_reports_dir

    return Path(reports or default_reports_dir()) / name / "archive"


def archive_key(run: "Run") -> str:
    """The id a run is archived under: the ``restored_from`` tag of a restored run, else its own run id."""
    return record_key(run.data.tags.get(RESTORED_TAG), run.info.run_id)


def record_key(restored_from: Any, run_id: str) -> str:
    """:func:`archive_key` from a run's ``restored_from`` tag value (None, NaN or empty when the run was not restored,
    as a pandas frame of runs gives it) and its run id."""
    return restored_from if isinstance(restored_from, str) and restored_from else run_id


def _artifacts(c: "MlflowClient", run_id: str) -> tuple[dict[str, str], list[str]]:
    """``({path: text}, skipped paths)`` of every artifact of ``run_id`` (binary or > MAX_ARTIFACT_BYTES: skipped)."""
    texts: dict[str, str] = {}
    skipped: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        if not c.list_artifacts(run_id):
            return texts, skipped
        root = Path(c.download_artifacts(run_id, "", tmp))
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = f.relative_to(root).as_posix()
            if f.stat().st_size > MAX_ARTIFACT_BYTES:
                skipped.append(rel)
                continue
            try:
                texts[rel] = scrub(f.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                skipped.append(rel)
    return texts, skipped


def run_record(c: "MlflowClient", run: "Run", keys: dict[str, str]) -> dict[str, Any]:
    """One ended run as a JSON-ready record (module docstring); ``keys`` maps the store's run ids to archive keys
    (a child's parent is recorded by its key)."""
    tags = {k: scrub(v) for k, v in run.data.tags.items()
            if (not k.startswith("mlflow.") or k == "mlflow.runName") and k not in (RESTORED_TAG, *MACHINE_TAGS)}
    parent = run.data.tags.get("mlflow.parentRunId")
    metrics = {key: [[int(m.step), int(m.timestamp), float(m.value)] for m in c.get_metric_history(run.info.run_id, key)]
               for key in sorted(run.data.metrics)}
    artifacts, skipped = _artifacts(c, run.info.run_id)
    return {"format": FORMAT, "run_id": keys[run.info.run_id], "parent": keys.get(parent, parent) if parent else None,
            "status": run.info.status, "start_time": run.info.start_time, "end_time": run.info.end_time,
            "tags": tags, "params": {k: scrub(v) for k, v in run.data.params.items()}, "metrics": metrics, "artifacts": artifacts,
            "skipped_artifacts": skipped}


def artifact_name(name: str) -> str:
    """``name`` if it is a safe artifact path inside a run's folder: relative, POSIX, no ``..``, ``.`` or empty part,
    no backslash, control character or drive letter, at most 255 characters (the names :func:`run_record` writes:
    ``samples/iter_0010.json``, ``summary.json``).

    Raises:
        ValueError: any other name (pydantic reports it as the field's error).
    """
    if (not name or len(name) > 255 or name.startswith("/") or "\\" in name or ":" in name
            or any(ord(ch) < 32 for ch in name) or any(p in ("..", ".", "") for p in name.split("/"))):
        raise ValueError(f"not a relative path inside the run's folder: {name[:80]!r}")
    return name


_Id = Annotated[str, Field(pattern=r"^[0-9A-Za-z_-]{1,64}$")]
_Time = Annotated[int, Field(ge=0)]


class RunRecord(BaseModel):
    """The schema of one archived run (the module docstring's format :data:`FORMAT`), checked before anything of an
    archive is restored: records are committed files that a new machine restores on its own, so untrusted input."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal[1]
    run_id: _Id
    parent: Optional[_Id]
    status: Literal["FINISHED", "FAILED", "KILLED"]
    start_time: Optional[_Time]
    end_time: Optional[_Time]
    tags: dict[Annotated[str, Field(max_length=250)], Annotated[str, Field(max_length=5000)]]
    params: dict[Annotated[str, Field(max_length=250)], Annotated[str, Field(max_length=6000)]]
    metrics: dict[Annotated[str, Field(max_length=250)], list[Annotated[tuple[int, _Time, float], Field(strict=False)]]]
    artifacts: dict[Annotated[str, AfterValidator(artifact_name)], Annotated[str, Field(max_length=MAX_ARTIFACT_BYTES)]]
    skipped_artifacts: list[str]


def _field_error(path: Path, e: ValidationError) -> HarnessError:
    """One line naming the record's file, the first bad field (its location, e.g. ``artifacts.../x``) and why."""
    err = e.errors()[0]
    loc = ".".join(str(part) for part in err["loc"]) or "(record)"
    return HarnessError(f"archive record {path}: field {loc[:120]}: {' '.join(err['msg'].split())[:200]} "
                        f"({e.error_count()} error(s) in all); nothing restored")


def read_run_record(path: Path) -> dict[str, Any]:
    """An archived run's record (:func:`read_record`), validated against :class:`RunRecord` and its file name (a
    record is named by its ``run_id``).

    Raises:
        HarnessError: unreadable, too large, of another format, a field missing, of the wrong type or out of bounds
            (an artifact name outside the run's folder), or a ``run_id`` that is not the file's name: one line naming
            the file and the field.
    """
    raw = read_record(path)
    try:
        record = RunRecord.model_validate(raw)
    except ValidationError as e:
        raise _field_error(path, e) from None
    if f"{record.run_id}.json.gz" != path.name:
        raise HarnessError(f"archive record {path}: field run_id: {record.run_id!r} is not the file's name; "
                           f"nothing restored")
    return raw


def archive_records(name: str, reports: Optional[Path] = None) -> dict[Path, dict[str, Any]]:
    """Every run record of ablation ``name``'s archive, each read and validated (:func:`read_run_record`), by path;
    the stage copies (:data:`KEPT_STAGES`) are read too, so that a bad one is refused here rather than at report time.
    Empty without an archive. The dry run of ``harness ablate`` calls it, so it refuses exactly what a run refuses.

    Raises:
        HarnessError: the first bad record (one line naming the file and the field).
    """
    folder = archive_dir(name, reports)
    if not folder.is_dir():
        return {}
    records = {f: read_run_record(f) for f in sorted(folder.glob("*.json.gz"))}
    for stage, (sub, field) in KEPT_STAGES.items():
        for f in sorted((folder / sub).glob("*.json.gz")):
            copy = read_record(f)
            if copy.get("stage") != stage or f"{copy.get('key')}.json.gz" != f.name or not isinstance(copy.get(field), dict):
                raise HarnessError(f"archive record {f}: fields stage, key and {field}: expected stage {stage!r}, the "
                                   f"file's key and a mapping of {field}")
    return records


def validate_archive(name: str, reports: Optional[Path] = None) -> int:
    """How many run records ablation ``name``'s archive holds, all of them valid (:func:`archive_records`).

    Raises:
        HarnessError: the first bad record, named with its field."""
    return len(archive_records(name, reports))


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write an archive file (a run record, a stage copy, rescored metrics): :func:`_write`."""
    _write(path, record)


def _write(path: Path, record: dict[str, Any]) -> None:
    """Write ``record`` gzipped (mtime 0: the same record gives the same bytes) through a temporary file and a rename,
    so that a killed export never leaves half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(json.dumps(record, sort_keys=True, separators=(",", ":")).encode())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_record(path: Path) -> dict[str, Any]:
    """An archived run's record.

    Raises:
        HarnessError: the file is not a readable archive record of :data:`FORMAT` (its path is named).
    """
    if path.is_symlink():
        raise HarnessError(f"archive record {path}: a symbolic link, not a record file")
    try:
        with gzip.open(path, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
        if len(data) > MAX_RECORD_BYTES:
            raise HarnessError(f"archive record {path}: over {MAX_RECORD_BYTES:,} bytes once decompressed; refused unread")
        record = json.loads(data.decode("utf-8"))
    except (OSError, EOFError, ValueError) as e:
        raise HarnessError(f"archive record {path}: unreadable ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise HarnessError(f"archive record {path}: format {record.get('format') if isinstance(record, dict) else '?'}, "
                           f"this harness reads format {FORMAT}")
    return record


def export_runs(c: "MlflowClient", experiment_id: str, name: str, reports: Optional[Path] = None) -> int:
    """Archive every ended run of ``experiment_id`` not yet in ``archive_dir(name, reports)``; returns how many
    records were written. Runs already archived (by :func:`archive_key`) are not rewritten."""
    from harness.infra.tracking import search_all

    runs = search_all(c, [experiment_id])
    keys = {r.info.run_id: archive_key(r) for r in runs}
    out = archive_dir(name, reports)
    written = 0
    for run in runs:
        path = out / f"{keys[run.info.run_id]}.json.gz"
        if run.info.status not in ENDED or path.exists():
            continue
        _write(path, run_record(c, run, keys))
        written += 1
    export_stage_copies(name, stage_users([r.data.tags for r in runs if r.info.status == "FINISHED"]), reports)
    return written


def stage_users(tags: "list[dict[str, str]]") -> dict[str, dict[str, "set[str]"]]:
    """For each stage of :data:`KEPT_STAGES`, the keys that runs (their MLflow tags) name in ``pipeline.<stage>``, each
    with the weight digests (values of every ``digest.<stage>`` tag) of the runs that name it.

    Example: ``[{"pipeline.bon": "b", "digest.gold": "1", "digest.sft": "2"}]`` → ``{"bon": {"b": {"1", "2"}},
    "reward_model": {}}``."""
    out: dict[str, dict[str, set[str]]] = {stage: {} for stage in KEPT_STAGES}
    for t in tags:
        digests = {v for k, v in t.items() if k.startswith("digest.") and v}
        for stage in KEPT_STAGES:
            if t.get(f"pipeline.{stage}"):
                out[stage].setdefault(t[f"pipeline.{stage}"], set()).update(digests)
    return out


def _kept_path(name: str, stage: str, key: str, reports: Optional[Path] = None) -> Path:
    return archive_dir(name, reports) / KEPT_STAGES[stage][0] / f"{key}.json.gz"


def _built_digests(out_dir: Path, key: str) -> Optional[set[str]]:
    """The weight digests (``weights_sha256`` of each ``stage.json``) of the stage with cache key ``key`` built under
    ``out_dir`` and of every stage it was built from, found by key (``<out_dir>/<stage>/<key>``); None when it or one
    of its inputs is not built here (nothing then shows which weights it came from)."""
    digests: set[str] = set()
    todo, seen = [key], set()
    while todo:
        k = todo.pop()
        if k in seen:
            continue
        seen.add(k)
        found = sorted(out_dir.glob(f"*/{k}/stage.json"))
        if not found:
            return None
        rec = json.loads(found[0].read_text())
        if rec.get("weights_sha256"):
            digests.add(str(rec["weights_sha256"]))
        todo.extend(str(v) for v in (rec.get("inputs") or {}).values())
    return digests


def _built_copy(stage: str, key: str, digests: "set[str]") -> Optional[dict[str, Any]]:
    """What a report reads of pipeline stage ``stage`` with cache key ``key`` as built on this machine (the best-of-n
    curve; the numeric metrics the proxy's stage record holds), None when it is not built here or, given the weight
    digests ``digests`` that the runs using it recorded, when a stage it comes from has weights of another build (a
    digest not among ``digests``): this machine's copy would then describe other weights than the runs'."""
    from harness.config.pipeline import PipelineConfig
    from harness.analysis.frontier import load_bon_curve

    out_dir = Path(PipelineConfig().out_dir)
    stage_dir = out_dir / stage / key
    try:
        built = _built_digests(out_dir, key)
        if built is None or not built <= digests:
            return None
        if stage == "bon":
            return load_bon_curve(stage_dir)
        metrics = json.loads((stage_dir / "stage.json").read_text()).get("metrics") or {}
        return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def export_stage_copies(name: str, users: dict[str, dict[str, "set[str]"]], reports: Optional[Path] = None) -> int:
    """Keep, for each stage of :data:`KEPT_STAGES` and each of its keys in ``users`` (stage → key → the weight digests
    the runs using it recorded, :func:`stage_users`) that is built on this machine from those weights, what a report
    reads of it in ``archive_dir(name, reports)/<folder>/<key>.json.gz``, unless already kept; returns how many were
    written. A key whose stage is not built here, or is built here from other weights, is skipped (the runs of
    another machine may name it, and their machine's copy is the one to keep).

    Raises:
        KeyError: a stage that is not in :data:`KEPT_STAGES`.
    """
    written = 0
    for stage, keys in users.items():
        field = KEPT_STAGES[stage][1]
        for key in sorted(keys):
            path = _kept_path(name, stage, key, reports)
            copy = None if path.exists() else _built_copy(stage, key, keys[key])
            if copy is None:
                continue
            _write(path, {"format": FORMAT, "stage": stage, "key": key, field: copy})
            written += 1
    return written


def stage_copy(name: str, stage: str, key: str, digests: "set[str]",
               reports: Optional[Path] = None) -> Optional[dict[str, Any]]:
    """What ablation ``name``'s report reads of pipeline stage ``stage`` (a :data:`KEPT_STAGES` key) with cache key
    ``key``: the copy in ``name``'s archive (:func:`export_stage_copies`), else the stage as built on this machine if
    every weight digest in it and in the stages it was built from is among ``digests`` (those the runs using it
    recorded), else None. For ``bon`` the curve (:data:`harness.analysis.frontier.BON_CURVE_FILE`); for
    ``reward_model`` the proxy's metrics (e.g. ``heldout_agreement``, ``spearman_vs_length``).

    The archived copy comes first: it was kept by the machine that trained the runs (the driver keeps it as each run
    ends), while a stage of the same key built here may be another build of it (other weights, which the runs' digest
    tags show), and what the report reads must be what the runs used.

    Raises:
        HarnessError: the archived copy is unreadable or of another format (its path is named).
        KeyError: a stage that is not in :data:`KEPT_STAGES`.
    """
    path = _kept_path(name, stage, key, reports)
    return read_record(path)[KEPT_STAGES[stage][1]] if path.is_file() else _built_copy(stage, key, digests)


def _restore_one(c: "MlflowClient", experiment_id: str, record: dict[str, Any], parent_id: Optional[str]) -> str:
    """Create one run from ``record`` (status, times, tags, params, metric histories, artifacts); returns its id.
    A restore that fails half-way leaves the new run FAILED with the reason, never FINISHED."""
    from mlflow.entities import Metric

    from harness.infra.tracking import fail_run, log_metric_points, log_params

    tags = {**record["tags"], RESTORED_TAG: record["run_id"]}
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    run = c.create_run(experiment_id, start_time=record["start_time"], tags=tags, run_name=tags.get("mlflow.runName"))
    rid = run.info.run_id
    try:
        log_params(c, rid, record["params"])  # already flat and scrubbed: written as they are, in batches
        log_metric_points(c, rid, [Metric(k, v, ts, step) for k, points in sorted(record["metrics"].items())
                                   for step, ts, v in points])
        if record["artifacts"]:
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp).resolve()
                for rel, text in record["artifacts"].items():
                    f = (root / artifact_name(rel)).resolve()
                    if root not in f.parents:  # checked by the schema already; a second guard costs nothing
                        raise HarnessError(f"artifact {rel!r} leaves the run's folder")
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_text(text, encoding="utf-8")
                c.log_artifacts(rid, tmp)
        c.set_terminated(rid, record["status"], end_time=record["end_time"])
    except BaseException as e:
        fail_run(c, rid, f"restore of archived run {record['run_id']} failed: {' '.join(str(e).split())[:300]}")
        raise
    return rid


def restore_runs(c: "MlflowClient", experiment_id: str, name: str, reports: Optional[Path] = None) -> int:
    """Put every run of ``archive_dir(name, reports)`` that the experiment lacks (by :func:`archive_key`) back into it,
    invocations before their runs; returns how many runs were restored (0 without an archive). Holds a file lock
    (``<results>/ablations/<name>/.restore.lock``) so that two processes restoring at once cannot both restore a run.

    Raises:
        HarnessError: a record that is unreadable, of another format or fails :class:`RunRecord` (an artifact name
            outside its run's folder, a missing or mistyped field, an oversized value): one line naming the file and
            the field, before anything is restored.
    """
    from filelock import FileLock

    from harness.infra.tracking import results_root, search_all

    every = archive_records(name, reports)  # every record valid, or nothing is restored
    if not every:
        return 0
    lock = results_root() / "ablations" / name / ".restore.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        known = {archive_key(r): r.info.run_id for r in search_all(c, [experiment_id])}
        records = [r for f, r in every.items() if f.name.removesuffix(".json.gz") not in known]
        records.sort(key=lambda r: (r["parent"] is not None, r["start_time"] or 0))  # invocations first
        for record in records:
            parent = record["parent"]
            known[record["run_id"]] = _restore_one(c, experiment_id, record, known.get(parent) if parent else None)
    return len(records)


def rescored_files(name: str, reports: Optional[Path] = None) -> list[Path]:
    """The files ``harness rescore`` kept for ablation ``name`` (``archive/rescored/*.json.gz``), sorted; ``[]``."""
    folder = archive_dir(name, reports) / RESCORED_FOLDER
    return sorted(folder.glob("*.json.gz")) if folder.is_dir() else []


def apply_rescored(c: Any, exp_id: str, name: str, reports: Optional[Path] = None) -> int:
    """Log the archive's rescored metrics (every ``archive/rescored/*.json.gz``, :mod:`harness.experiments.rescore`) into the
    store's runs of the experiment that lack them (by archive key); returns how many runs got metrics.

    Raises:
        HarnessError: an unreadable or malformed rescored file (named)."""
    from mlflow.entities import Metric

    from harness.infra import tracking

    files = rescored_files(name, reports)
    if not files:
        return 0
    runs = {archive_key(r): r for r in tracking.search_all(c, [exp_id])}
    applied = 0
    for f in files:
        data = read_record(f)
        if not isinstance(data.get("runs"), dict):
            raise HarnessError(f"archive record {f}: field runs: expected a mapping of run ids to metrics")
        for run_id, metrics in data["runs"].items():
            run = runs.get(run_id)
            if run is None or any(k in run.data.metrics for k in metrics):
                continue
            try:
                points = [Metric(k, float(v), 0, int(step)) for k, pts in metrics.items() for step, v in pts]
            except (TypeError, ValueError):
                raise HarnessError(f"archive record {f}: field runs.{run_id}: expected [[step, value], ...]") from None
            tracking.log_metric_points(c, run.info.run_id, points)
            applied += 1
    return applied
