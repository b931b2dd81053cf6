"""Where a sweep's Optuna study lives, and the study's sampler and pruner.

Storage (:func:`storage_url`): the study ``NAME@SCALE`` lives in
``JournalStorage(JournalFileBackend(<results>/optuna/NAME.log))`` (one file per spec, one study per
scale in it), or, for a cluster, in the database named by ``$HARNESS_OPTUNA_STORAGE`` (e.g.
``postgresql+psycopg://user:pw@host/db``; ``RDBStorage``), which the driver and every worker reach.
The driver is :mod:`harness.experiments.sweep`.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from harness.errors import HarnessError
from harness.experiments.study_spec import StudySpec, spec_fingerprint, study_name

if TYPE_CHECKING:
    import optuna

#: Environment variable naming a shared storage (an RDB URL such as PostgreSQL, or a journal file).
STORAGE_ENV = "HARNESS_OPTUNA_STORAGE"
#: How many times a trial whose worker or node died is tried in all (the first attempt and its retries).
MAX_ATTEMPTS = 3


# ------------------------------------------------------------------------------------------------
# Storage
# ------------------------------------------------------------------------------------------------


def optuna_dir() -> Path:
    """``<results>/optuna`` (absolute; honours ``$HARNESS_RESULTS``)."""
    from harness.infra.tracking import results_root

    return results_root() / "optuna"


def storage_url(name: Optional[str] = None) -> str:
    """Where the Optuna studies live, as ``optuna-dashboard`` and :func:`make_storage` take it.

    ``$HARNESS_OPTUNA_STORAGE`` if set (an RDB URL such as ``postgresql+psycopg://u:p@host/db``
    for several machines, or a journal file path); else the journal file
    ``<results>/optuna/NAME.log``. Without ``name``: the most recently written journal file.

    Raises:
        HarnessError: no ``name`` and no journal file exists yet.
    """
    env = os.environ.get(STORAGE_ENV)
    if env:
        return env
    d = optuna_dir()
    if name is not None:
        return str(d / f"{name}.log")
    logs = sorted(d.glob("*.log"), key=lambda p: p.stat().st_mtime) if d.is_dir() else []
    if not logs:
        raise HarnessError(f"no sweep storage in {d} yet; run `make sweep NAME=...` first (or set {STORAGE_ENV})")
    return str(logs[-1])


def trial_counts(study: "optuna.Study") -> dict[str, int]:
    """Trials of ``study`` per state, ``{"running": …, "complete": …, "pruned": …, "fail": …, "waiting": …}``."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    return {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}


def is_rdb(url: str) -> bool:
    """Whether an Optuna storage URL names a database (``sqlite:///…``, ``postgresql://…``: Optuna's RDBStorage)
    rather than a journal file path. Raises nothing."""
    return "://" in url


def redacted_storage_url(name: Optional[str] = None) -> str:
    """:func:`storage_url` with any password replaced by ``***`` (for tags, reports, logs;
    :func:`harness.infra.safety.redact`)."""
    from harness.infra.safety import redact

    return redact(storage_url(name))


def display_storage(name: Optional[str] = None) -> str:
    """:func:`redacted_storage_url` as a committed report may show it: a journal file inside this project relative
    to the project root (``results/optuna/NAME.log``), any other local path as ``<outside the project>/<file
    name>``, a database URL with its password redacted (what :func:`harness.infra.tracking.display_uri` does for the
    MLflow store)."""
    url = redacted_storage_url(name)
    if is_rdb(url):
        return url
    path = Path(url).resolve()
    root = Path(__file__).resolve().parents[2]
    try:
        return str(path.relative_to(root))
    except ValueError:
        return f"<outside the project>/{path.name}"


def make_storage(name: str) -> "optuna.storages.BaseStorage":
    """Open the storage of study spec ``name`` (:func:`storage_url`; :func:`open_storage`)."""
    return open_storage(storage_url(name))


def open_storage(url: str) -> "optuna.storages.BaseStorage":
    """Open an Optuna storage: ``RDBStorage(url)`` for a database URL (PostgreSQL for a cluster),
    else ``JournalStorage(JournalFileBackend(url))`` (one machine; its file lock lets the driver and
    the workers write concurrently).

    Raises:
        ServiceError: the database does not answer within ``$HARNESS_CONNECT_TIMEOUT`` seconds.
        HarnessError: the RDB cannot be opened (one line, password redacted).
    """
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend

    if is_rdb(url):
        from harness.infra.services import check_database

        check_database("the Optuna storage", url)
        try:
            return RDBStorage(url, engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None)
        except Exception as e:  # driver missing, host unreachable, bad URL
            from harness.infra.safety import redact

            raise HarnessError(f"{STORAGE_ENV}={redact(url)}: cannot open the Optuna storage ({' '.join(str(e).split())[:300]})") from None
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(url))


def open_study(spec: StudySpec, scale: str, storage: Any = None, sampler: Any = None, pruner: Any = None,
               create: bool = True) -> "optuna.Study":
    """Load (or create, with the spec's directions) the study ``NAME@SCALE``.

    Raises:
        HarnessError: the stored study was created from another spec (search space, objective,
        base or seeds changed: :func:`spec_fingerprint`), or does not exist and not ``create``.
    """
    import optuna

    sname = study_name(spec.name or "", scale)
    url = storage_url(spec.name)
    if storage is None and not create and not is_rdb(url) and not Path(url).is_file():
        raise HarnessError(f"no study {sname!r}: {url} does not exist; run `make sweep NAME={spec.name} SCALE={scale}` first")
    storage = storage if storage is not None else make_storage(spec.name or "")
    fp = spec_fingerprint(spec, scale)
    try:
        study = optuna.load_study(study_name=sname, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        if not create:
            raise HarnessError(f"no study {sname!r} in {redacted_storage_url(spec.name)}; run `make sweep NAME={spec.name} SCALE={scale}` first") from None
        study = optuna.create_study(study_name=sname, storage=storage, directions=spec.directions, sampler=sampler,
                                    pruner=pruner, load_if_exists=True)
        if "spec_fingerprint" not in study.user_attrs:
            study.set_user_attr("spec_fingerprint", fp)
            study.set_user_attr("scale", scale)
            study.set_user_attr("objective", spec.objective)
            study.set_user_attr("objective_metrics", spec.objective_metrics)
    stored = study.user_attrs.get("spec_fingerprint")
    if stored is not None and stored != fp:
        raise HarnessError(f"study {sname!r} in {redacted_storage_url(spec.name)} was created from a different spec "
                           f"(fingerprint {stored} ≠ {fp}: base, scale preset or overrides, search space, objective or seeds changed); "
                           f"delete that study or give the spec a new name")
    return study


def make_sampler(spec: StudySpec, seed: int) -> "optuna.samplers.BaseSampler":
    """The spec's sampler seeded with ``seed``: TPE (multivariate, constant liar: Optuna 5
    defaults; ``n_startup_trials`` random trials first), grid (the product of each parameter's
    grid values) or random."""
    import optuna

    s = spec.sampler
    if s.type == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if s.type == "grid":
        return optuna.samplers.GridSampler(grid_values(spec), seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=s.n_startup_trials, constant_liar=True)


def grid_values(spec: StudySpec) -> dict[str, list[float]]:
    """Grid-sampler values per parameter: the spec's ``grid`` or ``grid_points`` evenly spaced
    values from low to high (geometric spacing for log parameters)."""
    import numpy as np

    out = {}
    for k, p in spec.search_space.items():
        if p.grid is not None:
            out[k] = [float(v) for v in p.grid]
        elif spec.param_log(k):
            out[k] = [float(v) for v in np.geomspace(p.low, p.high, spec.sampler.grid_points)]
        else:
            out[k] = [float(v) for v in np.linspace(p.low, p.high, spec.sampler.grid_points)]
    return out


def effective_cap(spec: StudySpec, scale: str, trials: Optional[int]) -> int:
    """The global trial cap: ``trials`` or the spec's, at most the grid size for a grid sampler."""
    cap = trials if trials is not None else spec.trials_for(scale)
    if spec.sampler.type == "grid":
        cap = min(cap, math.prod(len(v) for v in grid_values(spec).values()))
    return cap


def make_pruner(spec: StudySpec, steps_per_trial: int) -> "optuna.pruners.BasePruner":
    """MedianPruner (warm-up ``ceil(warmup_fraction × steps_per_trial)`` steps) or NopPruner.
    Optuna's MedianPruner prunes when the trial's *best* reported score so far is worse than the
    median of the completed trials' scores at the same step."""
    import optuna

    p = spec.pruner
    if p is None or p.type == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials,
                                       n_warmup_steps=math.ceil(p.warmup_fraction * steps_per_trial),
                                       interval_steps=p.interval_steps)


# ------------------------------------------------------------------------------------------------
# Archive: the study kept in the repository beside its report
# ------------------------------------------------------------------------------------------------

#: The archived copy of a study's journal, in ``<reports>/<name>/archive/`` beside its MLflow runs' records.
JOURNAL_ARCHIVE = "optuna-journal.log.gz"


def _journal_archive(name: str, reports: Optional[Path] = None) -> Path:
    from harness.experiments.archive import archive_dir

    return archive_dir(name, reports) / JOURNAL_ARCHIVE


def archive_study(c: Any, experiment_id: str, name: str, reports: Optional[Path] = None) -> tuple[int, bool]:
    """Keep study ``name`` in the repository: every ended MLflow run of its experiment (trials, sweep invocations,
    re-evaluation runs) as a record in ``<reports>/<name>/archive/`` (:func:`harness.experiments.archive.export_runs`),
    and its Optuna journal ``<results>/optuna/NAME.log``, gzipped and without machine detail
    (:func:`harness.experiments.archive.scrub`: the trials' ``host`` attribute reads ``<host>``), as
    :data:`JOURNAL_ARCHIVE`. The journal is copied whole (it is the study's complete, append-only history), and only
    when it changed. A study in a shared database (``$HARNESS_OPTUNA_STORAGE``) keeps its trials there: only its runs
    are archived.

    Returns:
        (run records written, whether the journal copy was written).
    Raises:
        OSError: the archive folder cannot be written.
    """
    import gzip

    from harness.experiments.archive import export_runs, scrub

    written = export_runs(c, experiment_id, name, reports)
    src = optuna_dir() / f"{name}.log"
    if os.environ.get(STORAGE_ENV) or not src.is_file():
        return written, False
    text = scrub(src.read_text(encoding="utf-8"))
    dst = _journal_archive(name, reports)
    if dst.is_file() and gzip.decompress(dst.read_bytes()).decode("utf-8") == text:
        return written, False
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")  # two processes at once write their own
    tmp.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    tmp.replace(dst)
    return written, True


def restore_study(name: str, c: Any = None, reports: Optional[Path] = None,
                  echo: Optional[Any] = None) -> tuple[bool, int]:
    """Before a sweep or a study report, on a machine without the study: write the archived journal
    (:func:`archive_study`) back to ``<results>/optuna/NAME.log``, so that the sweep resumes where the archive left it
    and the report reads its trials, and (given the MLflow client ``c``) put the archived runs the store lacks back
    into the experiment ``study:NAME`` (:func:`harness.experiments.archive.restore_runs`). The journal is left alone
    when that file exists (the study of this machine is the newer), when none is archived, or with a shared database
    (``$HARNESS_OPTUNA_STORAGE``). Each restore is said in one line to ``echo``.

    Returns:
        (whether the journal was restored, runs restored).
    Raises:
        HarnessError: the archived journal is not gzip (a damaged or hand-edited file), named with its path; an
            archived run record that fails validation (:func:`harness.experiments.archive.restore_runs`).
    """
    import gzip

    from harness.experiments.archive import archive_dir, restore_runs
    from harness.experiments.study_spec import experiment_name
    from harness.infra.tracking import experiment_id

    src, dst = _journal_archive(name, reports), optuna_dir() / f"{name}.log"
    journal = not os.environ.get(STORAGE_ENV) and not dst.exists() and src.is_file()
    if journal:
        try:
            text = gzip.decompress(src.read_bytes())
        except (OSError, EOFError) as e:
            raise HarnessError(f"{src}: not a gzipped Optuna journal ({e})") from None
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")  # two processes at once write their own
        tmp.write_bytes(text)
        tmp.replace(dst)
        if echo:
            echo(f"restored study {name}'s Optuna journal from its archive")
    exp_id = experiment_id(c, experiment_name(name), create=archive_dir(name, reports).is_dir()) if c else None
    runs = restore_runs(c, exp_id, name, reports) if exp_id else 0
    if runs and echo:
        echo(f"restored {runs} run(s) of study {name} from its archive")
    return journal, runs


__all__ = [
    "STORAGE_ENV", "MAX_ATTEMPTS", "optuna_dir", "storage_url", "is_rdb", "redacted_storage_url", "make_storage",
    "open_storage", "open_study", "make_sampler", "grid_values", "effective_cap", "make_pruner", "JOURNAL_ARCHIVE",
    "archive_study", "restore_study",
]
