"""Proxy reward models on gold labels (Gao et al. 2022 §2): the comparisons are labelled by the gold
scorer, and the proxy trains on the first ``proxy_pairs`` of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch


def longer_is_better(texts: list[str]) -> torch.Tensor:
    """A stub gold scorer that prefers the longer text."""
    return torch.tensor([float(len(t)) for t in texts])


def test_labels_come_from_the_gold_scorer():
    from harness.tasks.review_sentiment.proxy import comparisons_frame, label_comparisons

    a, b = ["short", "a much longer text", "same", "xx"], ["longer text", "tiny", "four", "yyy"]
    ga, gb, a_chosen = label_comparisons(a, b, longer_is_better)
    assert ga.tolist() == [5, 18, 4, 2] and gb.tolist() == [11, 4, 4, 3] and a_chosen.tolist() == [False, True, False, False]
    df = comparisons_frame([[1], [2], [3], [4]], [[5], [6], [7], [8]], ga, gb, "train")
    # the tie (pair 3) is dropped; chosen = the higher gold
    assert df["chosen_ids"].tolist() == [[5], [2], [8]] and df["rejected_ids"].tolist() == [[1], [6], [4]]
    assert (df["chosen_gold"] > df["rejected_gold"]).all() and df["chosen_gold"].tolist() == [11.0, 18.0, 3.0]


def test_proxy_data_from_the_sft_policy_is_labelled_by_gold(smoke_pipeline, tmp_path):
    from harness.rl.models import load_tokenizer
    from harness.tasks.review_sentiment.proxy import build_proxy_data, load_proxy_data

    tok = load_tokenizer(smoke_pipeline.tokenizer_dir)
    texts = ["The film was a quiet and moving portrait of a family in crisis, told with care.",
             "I did not expect much from this movie but it surprised me in every scene.",
             "A dull, lifeless remake that nobody asked for and nobody will remember.",
             "Some of the jokes land, most of them do not, and the ending is a mess."] * 3
    texts = [f"{i} {t}" for i, t in enumerate(texts)]  # distinct prompts
    m = build_proxy_data(tmp_path, smoke_pipeline.sft_dir, tok, texts[:8], texts[8:], longer_is_better,
                         pool_pairs=6, heldout_pairs=3, prompt_length=4, response_length=12, temperature=1.0, seed=0)
    df = load_proxy_data(tmp_path)
    assert m["n_pool"] == (df["split"] == "train").sum() and m["n_heldout"] == (df["split"] == "heldout").sum()
    assert 0 < m["n_pool"] <= 6 and 0 < m["n_heldout"] <= 3
    for c, r, gc, gr in zip(df["chosen_ids"], df["rejected_ids"], df["chosen_gold"], df["rejected_gold"]):
        tc, tr = tok.decode(c, skip_special_tokens=True), tok.decode(r, skip_special_tokens=True)
        assert len(tc) > len(tr) and gc == len(tc) and gr == len(tr)  # chosen = the longer decoded text
        assert c[:4] == r[:4]  # both responses continue the same prompt
        assert len(c) <= 4 + 12 and len(r) <= 4 + 12
    assert m["gold_gap_mean"] == pytest.approx(float((df["chosen_gold"] - df["rejected_gold"]).mean()))
    # fixed-length comparisons from an SFT policy that never emits special tokens (task.suppress_special_tokens):
    # every response is all 12 tokens, none of them EOS or padding
    out = tmp_path / "fixed"
    out.mkdir()
    m = build_proxy_data(out, smoke_pipeline.sft_dir, tok, texts[:8], texts[8:], longer_is_better, pool_pairs=6,
                         heldout_pairs=3, prompt_length=4, response_length=12, temperature=1.0, seed=0, truncate=False,
                         suppress_special=True)
    fixed = load_proxy_data(out)
    responses = [ids[4:] for col in ("chosen_ids", "rejected_ids") for ids in fixed[col]]
    assert m["eos_rate"] == 0.0 and all(len(r) == 12 for r in responses)
    assert not any(set(r) & set(tok.all_special_ids) for r in responses)


def test_length_matched_pairs_are_the_first_equal_length_distinct_responses(smoke_pipeline):
    """8 responses per prompt from the SFT policy, truncated after EOS; the pair is the first response whose length
    an earlier, different response already had (recomputed here from the same draws), and prompts without one get
    none; one candidate per prompt gives no pair at all."""
    from harness.rl.models import load_policy, load_tokenizer
    from harness.rl.rollout import sample_sequences
    from harness.tasks.review_sentiment.proxy import length_matched_pairs

    tok, policy = load_tokenizer(smoke_pipeline.tokenizer_dir), load_policy(smoke_pipeline.sft_dir)
    prompts = torch.randint(5, 200, (12, 4), generator=torch.Generator().manual_seed(0))
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows, a, b = length_matched_pairs(policy, prompts, 12, 1.0, eos, pad, seed=3, k=8)
    seqs = sample_sequences(policy, prompts.repeat_interleave(8, dim=0), 12, 1.0, torch.Generator().manual_seed(3), eos,
                            pad, truncate=True, batch_size=512)
    want = []
    for i in range(12):
        cand = seqs[8 * i:8 * i + 8]
        pair = next(((cand[j], cand[k]) for k in range(8) for j in range(k)
                     if len(cand[j]) == len(cand[k]) and cand[j] != cand[k]
                     and all(len(cand[m]) != len(cand[j]) for m in range(j)) ), None)
        if pair is not None:
            want.append((i, *pair))
    assert [(r, x, y) for r, x, y in zip(rows, a, b)] == want and len(rows) > 0
    assert all(len(x) == len(y) and x != y and x[:4] == y[:4] for x, y in zip(a, b))
    assert length_matched_pairs(policy, prompts, 12, 1.0, eos, pad, seed=3, k=1) == ([], [], [])


def test_proxy_trains_on_the_first_proxy_pairs_and_rejects_too_many(smoke_pipeline, tmp_path):
    from harness.config.pipeline import RewardModelConfig
    from harness.rl.models import load_tokenizer
    from harness.tasks.review_sentiment.proxy import train_proxy_reward_model

    tok = load_tokenizer(smoke_pipeline.tokenizer_dir)
    rng = np.random.default_rng(0)
    rows = []
    for split, n in (("train", 40), ("heldout", 10)):
        for _ in range(n):
            p = rng.integers(5, 100, size=4).tolist()
            rows.append((p + rng.integers(5, 100, size=8).tolist(), p + rng.integers(5, 100, size=3).tolist(), 1.0, 0.0, split))
    data = pd.DataFrame(rows, columns=["chosen_ids", "rejected_ids", "chosen_gold", "rejected_gold", "split"])
    cfg = RewardModelConfig(max_steps=3, batch_size=8, proxy_pairs=24, proxy_pool_pairs=40)
    m = train_proxy_reward_model(data, 24, smoke_pipeline.sft_dir, tok, cfg, tmp_path / "rm", progress=False)
    assert m["n_train_pairs"] == 24 and m["n_heldout_pairs"] == 10 and m["steps"] == 3
    assert 0.0 <= m["heldout_agreement"] <= 1.0 and (tmp_path / "rm" / "reward_offset.json").is_file()
    assert -1.0 <= m["spearman_vs_length"] <= 1.0  # held-out responses of 12 and 7 tokens: a length signal to read
    with pytest.raises(ValueError, match="proxy_pairs=41 but the proxy data pool has 40"):
        train_proxy_reward_model(data, 41, smoke_pipeline.sft_dir, tok, cfg, tmp_path / "rm2", progress=False)


def test_proxy_pairs_above_the_pool_is_a_config_error():
    from harness.config import ConfigError, build_config

    with pytest.raises(ConfigError, match="proxy_pairs"):
        build_config({}, ["pipeline.reward_model.proxy_pairs=20000"])


def test_pipeline_summary_reports_every_cached_proxy_size(smoke_pipeline, monkeypatch):
    """A plain build (as `harness train` or an ablation does) keeps the proxies that `harness pipeline`
    built in summary.json, read from their cached stages, and builds none of them."""
    import json

    import harness.pipeline as P
    import harness.tasks.review_sentiment.stages as S
    from conftest import smoke_config

    monkeypatch.setattr(S, "PROXY_SIZES", (64,))
    built = P.build_pipeline(smoke_config(), full=True, progress=False)
    plain = P.build_pipeline(smoke_config(), progress=False)
    assert list(built.summary["proxies"]) == ["64", "128"]
    assert plain.summary["proxies"] == built.summary["proxies"]
    assert built.summary["proxies"]["64"]["n_train_pairs"] == 64 and "proxy_64" not in plain.summary["stages"]
    on_disk = json.loads((Path(plain.summary["stages"]["sft"]["dir"]).parents[1] / "summary.json").read_text())
    assert on_disk["proxies"] == built.summary["proxies"]
