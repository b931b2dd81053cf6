"""Model loading and scalar heads: the RM score is read at the EOS token, also when pad == EOS and for a
response without EOS; save/load round trips through ``from_pretrained`` on a local path."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel, PreTrainedTokenizerFast

from harness.errors import HarnessError
from harness.rl.models import (
    load_policy,
    load_scalar_model,
    load_tokenizer,
    resolve_device,
    scalar_head_outputs,
    score_at,
    use_fused_gelu,
)
from harness.pipeline.tokenizer import EOS_TOKEN, PAD_TOKEN, encode_with_eos, train_tokenizer

TEXTS = [
    "what a wonderful film, truly great acting",
    "a dull and tedious mess of a movie",
    "the plot is thin but the jokes land",
    "i loved it and i will watch it again",
] * 5


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return train_tokenizer(TEXTS, vocab_size=300, min_frequency=1)


def tiny_rm(vocab: int, pad_id: int | None, seed: int = 0) -> GPT2ForSequenceClassification:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=2, n_head=2, num_labels=1, pad_token_id=pad_id)
    return GPT2ForSequenceClassification(cfg).eval()


def right_pad(seqs, pad_id):
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad_id)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def single_sequence_score(model, seq) -> float:
    """Independent reference: the sequence alone, unpadded; HF pools the last position when pad_token_id is None."""
    saved = model.config.pad_token_id
    model.config.pad_token_id = None
    try:
        with torch.no_grad():
            return float(model(input_ids=torch.tensor([seq])).logits[0, 0])
    finally:
        model.config.pad_token_id = saved


# --------------------------------------------------------------------------------------------
# tokenizer specials
# --------------------------------------------------------------------------------------------


def test_pad_and_eos_distinct_and_eos_appended(tok):
    assert tok.eos_token == EOS_TOKEN and tok.pad_token == PAD_TOKEN
    assert tok.eos_token_id != tok.pad_token_id
    assert tok.padding_side == "right"
    plain = tok("a dull movie", add_special_tokens=False)["input_ids"]
    assert tok.eos_token_id not in plain and tok.pad_token_id not in plain  # no implicit specials
    seqs = encode_with_eos(tok, ["a dull movie", TEXTS[0] * 4], max_length=10)
    assert seqs[0] == plain + [tok.eos_token_id]
    assert len(seqs[1]) == 10 and seqs[1][-1] == tok.eos_token_id and seqs[1].count(tok.eos_token_id) == 1
    # the special token written in text is one token (how SFT texts carry their EOS)
    assert tok("a dull movie" + EOS_TOKEN)["input_ids"] == plain + [tok.eos_token_id]
    assert tok.decode(plain) == "a dull movie"


def test_tokenizer_save_and_reload(tok, tmp_path):
    tok.save_pretrained(str(tmp_path / "tok"))
    t2 = load_tokenizer(tmp_path / "tok")
    assert (t2.eos_token_id, t2.pad_token_id, len(t2)) == (tok.eos_token_id, tok.pad_token_id, len(tok))
    assert t2(TEXTS[0])["input_ids"] == tok(TEXTS[0])["input_ids"]


# --------------------------------------------------------------------------------------------
# score at EOS
# --------------------------------------------------------------------------------------------


def test_scalar_head_outputs_is_score_of_hidden_states(tok):
    model = tiny_rm(len(tok), tok.pad_token_id)
    ids, mask = right_pad(encode_with_eos(tok, TEXTS[:3], 64), tok.pad_token_id)
    with torch.no_grad():
        v = scalar_head_outputs(model, ids, mask)
        h = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    assert v.shape == ids.shape and v.dtype == torch.float32
    torch.testing.assert_close(v, (h @ model.score.weight.T).squeeze(-1))


def test_score_at_eos_matches_unpadded_and_hf_pooling_when_pad_differs(tok):
    model = tiny_rm(len(tok), tok.pad_token_id)
    seqs = encode_with_eos(tok, TEXTS[:4], 64)
    ids, mask = right_pad(seqs, tok.pad_token_id)
    eos_index = mask.sum(1) - 1
    assert (ids[torch.arange(4), eos_index] == tok.eos_token_id).all()
    with torch.no_grad():
        s = score_at(model, ids, mask, eos_index)
        hf = model(input_ids=ids, attention_mask=mask).logits[:, 0]  # HF: last token != pad_token_id
    expected = torch.tensor([single_sequence_score(model, q) for q in seqs])
    torch.testing.assert_close(s, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hf, expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # attention_mask=None is fine under right padding (causal attention)
        torch.testing.assert_close(score_at(model, ids, None, eos_index), s, rtol=1e-5, atol=1e-5)


def test_score_at_eos_when_pad_equals_eos(tok):
    """The TRL #3750 case: pad == EOS. HF pooling lands on the token before the EOS; score_at does not."""
    eos = tok.eos_token_id
    model = tiny_rm(len(tok), pad_id=eos)
    seqs = encode_with_eos(tok, TEXTS[:4], 64)
    ids, mask = right_pad(seqs, eos)  # padding with the EOS id
    eos_index = mask.sum(1) - 1
    with torch.no_grad():
        s = score_at(model, ids, mask, eos_index)
        hf = model(input_ids=ids, attention_mask=mask).logits[:, 0]
    expected = torch.tensor([single_sequence_score(model, q) for q in seqs])
    before_eos = torch.tensor([single_sequence_score(model, q[:-1]) for q in seqs])
    torch.testing.assert_close(s, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hf, before_eos, rtol=1e-5, atol=1e-5)  # the bug we avoid
    assert not torch.allclose(s, hf)


def test_score_at_response_without_eos(tok):
    """A truncated response with no EOS: the caller passes its last real token; padding after it is ignored."""
    model = tiny_rm(len(tok), tok.pad_token_id)
    no_eos = tok(TEXTS[1], add_special_tokens=False)["input_ids"][:7]
    with_eos = encode_with_eos(tok, [TEXTS[0]], 64)[0]
    ids, mask = right_pad([no_eos, with_eos], tok.pad_token_id)
    index = torch.tensor([len(no_eos) - 1, len(with_eos) - 1])
    with torch.no_grad():
        s = score_at(model, ids, mask, index)
    expected = torch.tensor([single_sequence_score(model, no_eos), single_sequence_score(model, with_eos)])
    torch.testing.assert_close(s, expected, rtol=1e-5, atol=1e-5)


def test_score_at_rejects_bad_index(tok):
    model = tiny_rm(len(tok), tok.pad_token_id)
    ids = torch.zeros((2, 5), dtype=torch.long)
    with pytest.raises(ValueError, match="out of range"):
        score_at(model, ids, None, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="shape"):
        score_at(model, ids, None, torch.tensor([0]))


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------


def test_load_locally_saved_models_via_from_pretrained(tok, tmp_path):
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2)).eval()
    lm.save_pretrained(str(tmp_path / "lm"))
    x = torch.tensor([encode_with_eos(tok, [TEXTS[2]], 32)[0]])
    loaded = load_policy(tmp_path / "lm", "cpu")
    assert not loaded.training and next(loaded.parameters()).dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=x).logits, lm(input_ids=x).logits)
    # an LM directory loads as a scalar model too (new score head), the way the RM starts from SFT
    rm = load_scalar_model(tmp_path / "lm", "cpu")
    assert rm.config.num_labels == 1 and rm.score.out_features == 1
    with torch.no_grad():
        torch.testing.assert_close(
            rm.base_model(input_ids=x).last_hidden_state, lm.transformer(input_ids=x).last_hidden_state
        )
    rm.save_pretrained(str(tmp_path / "rm"))
    rm2 = load_scalar_model(tmp_path / "rm")
    with torch.no_grad():
        torch.testing.assert_close(scalar_head_outputs(rm2, x), scalar_head_outputs(rm, x))


def test_missing_paths_raise_harness_error(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(HarnessError, match=f"model path not found: {missing}"):
        load_policy(missing)
    with pytest.raises(HarnessError, match="model path not found"):
        load_scalar_model(str(missing))
    with pytest.raises(HarnessError, match=f"tokenizer path not found: {missing}"):
        load_tokenizer(missing)
    with pytest.raises(HarnessError, match="model path not found"):
        load_policy("./relative/missing/dir")


def test_resolve_device():
    assert resolve_device("cpu") == (torch.device("cpu"), None)
    dev, dt = resolve_device("auto")
    if torch.cuda.is_available():
        assert (dev.type, dt) == ("cuda", torch.bfloat16)
    else:
        assert (dev, dt) == (torch.device("cpu"), None)
        with pytest.raises(HarnessError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(HarnessError, match="unknown device"):
        resolve_device("tpu")


def test_use_fused_gelu_swaps_gelu_new_only_and_keeps_outputs():
    from transformers.activations import GELUTanh, NewGELUActivation

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=3, n_head=2)).eval()
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        before = lm(input_ids=ids).logits
        assert use_fused_gelu(lm) == 3  # one per block
        after = lm(input_ids=ids).logits
    assert not any(isinstance(m, NewGELUActivation) for m in lm.modules())
    assert sum(isinstance(m, GELUTanh) for m in lm.modules()) == 3
    assert lm.config.activation_function == "gelu_pytorch_tanh"
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)  # same function, different kernel
    relu = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=2, activation_function="relu"))
    assert use_fused_gelu(relu) == 0 and relu.config.activation_function == "relu"



def test_suppressed_tokens_get_probability_zero_everywhere_the_loop_reads_the_policy(tok):
    """The hooked LM head: the suppressed columns are SUPPRESSED_LOGIT; the loop's log-probabilities (scoring path
    and the fused-backward update path) equal log-softmax over the other tokens computed from the unhooked logits;
    their gradient there is 0; the entropy is that of the renormalised distribution; sampling never draws them; the
    handle undoes it; an id outside the vocabulary is refused."""
    from harness.rl.models import SUPPRESSED_LOGIT, suppress_tokens
    from harness.rl.rollout import entropy_from_logits, response_logprobs, sample

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=12, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    banned = [0, 1]
    ids = torch.tensor([[5, 7, 3, 2, 9, 4, 6, 8]])  # a prompt of 3 and a response of 5 tokens, none banned
    P, tau = 3, 0.7
    with torch.no_grad():
        plain = lm(input_ids=ids).logits[:, P - 1 : -1] / tau  # [1, 5, 12]
    keep = [i for i in range(12) if i not in banned]
    ref = torch.log_softmax(plain[..., keep], dim=-1)  # the distribution over the 10 allowed tokens
    want = torch.gather(ref, -1, torch.tensor([[keep.index(t) for t in ids[0, P:].tolist()]]).unsqueeze(-1)).squeeze(-1)
    p_ref = ref.exp()
    want_entropy = -(p_ref * ref).sum(-1)

    handle = suppress_tokens(lm, banned)
    with torch.no_grad():
        hooked = lm(input_ids=ids).logits
        scored, entropy = response_logprobs(lm, ids, P, tau, with_entropy=True)
    assert (hooked[..., banned] == SUPPRESSED_LOGIT).all()
    assert torch.allclose(scored, want, atol=1e-6) and torch.allclose(entropy, want_entropy, atol=1e-6)
    assert torch.isfinite(entropy_from_logits(hooked / tau)).all()
    trained, _ = response_logprobs(lm, ids, P, tau)  # grad-enabled: the update's path (fused backward)
    assert torch.allclose(trained, want, atol=1e-6)
    logits = lm(input_ids=ids).logits.detach().requires_grad_(True)
    from harness.rl.rollout import response_logprobs_from_logits

    response_logprobs_from_logits(logits, ids[:, P:], P, tau).sum().backward()
    assert (logits.grad[:, P - 1 : -1][..., banned] == 0).all() and logits.grad[:, P - 1 : -1][..., keep].abs().sum() > 0
    gen = torch.Generator().manual_seed(0)
    drawn = sample(lm, ids[:, :P].repeat(64, 1), 20, 1.0, gen)
    assert drawn.shape == (64, 20) and not torch.isin(drawn, torch.tensor(banned)).any()
    handle.remove()
    with torch.no_grad():
        assert torch.equal(lm(input_ids=ids).logits[:, P - 1 : -1] / tau, plain)
    with pytest.raises(HarnessError, match=r"cannot suppress tokens \[12\]: outside the vocabulary of 12 ids"):
        suppress_tokens(lm, [1, 12])


def test_where_responses_end_at_eos_only_padding_is_suppressed_and_the_padded_positions_stay_finite(tok):
    """hidden_special_ids: every special id where responses do not end at EOS, all but EOS where they do, and a clear
    error without an EOS token. With padding suppressed and EOS allowed, sampling draws EOS but never padding; the
    padding written after an EOS (masked positions the loop still scores) gets a finite log-probability that moves
    only by the change of the log-normaliser when the weights change, so the PPO ratio there stays finite and so does
    the masked loss's gradient (at a logit of −1e9 float32 spaces those log-probabilities 64 nats apart, and a ratio
    of exp(128) overflows)."""
    from types import SimpleNamespace

    from harness.rl.components.eos import truncate_after_eos
    from harness.rl.components.losses import vanilla
    from harness.rl.models import SUPPRESSED_LOGIT, hidden_special_ids, suppress_tokens
    from harness.rl.rollout import response_logprobs, sample

    eos, pad = tok.eos_token_id, tok.pad_token_id
    assert sorted(tok.all_special_ids) == sorted([eos, pad]) and eos != pad
    assert hidden_special_ids(tok, ends_at_eos=False) == sorted([eos, pad])
    assert hidden_special_ids(tok, ends_at_eos=True) == [pad]
    with pytest.raises(HarnessError, match="responses end at EOS .* the tokenizer has no eos_token_id"):
        hidden_special_ids(SimpleNamespace(all_special_ids=[3], eos_token_id=None), ends_at_eos=True)

    torch.manual_seed(0)
    V = 12
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=40, n_embd=16, n_layer=1, n_head=2))
    lm.get_output_embeddings().register_forward_hook(lambda m, a, out: out + 3.0 * (torch.arange(V) == 0))  # EOS likely
    suppress_tokens(lm, [1])  # EOS = 0 allowed, padding = 1 suppressed
    P, tau = 3, 0.7
    prompts = torch.randint(2, V, (64, P), generator=torch.Generator().manual_seed(1))
    raw = sample(lm.eval(), prompts, 12, tau, torch.Generator().manual_seed(2))
    assert (raw == 0).any() and not (raw == 1).any()
    responses, mask, has_eos = truncate_after_eos(raw, 0, 1)
    assert (responses == 1).any() and has_eos.any()  # padding after an EOS: masked, but scored
    query_responses = torch.cat([prompts, responses], dim=1)
    with torch.no_grad():
        old, _ = response_logprobs(lm, query_responses, P, tau)
    padded = responses == 1
    with torch.no_grad():  # the exact value: the suppressed logit minus the log-normaliser, resolved to 0.01 nats
        lse = torch.logsumexp(lm(input_ids=query_responses).logits[:, P - 1 : -1].double() / tau, dim=-1)
    assert torch.isfinite(old).all()
    assert (old.double() - (SUPPRESSED_LOGIT / tau - lse))[padded].abs().max() < 0.01
    with torch.no_grad():  # an update's worth of change in the weights
        for w in lm.parameters():
            w.add_(0.05 * torch.randn_like(w))
    lm.train()
    new, _ = response_logprobs(lm, query_responses, P, tau)
    assert (new[padded] - old[padded]).abs().max() < 2.0
    advantages = torch.randn(new.shape, generator=torch.Generator().manual_seed(3))
    pg_loss, _, ratio = vanilla(new, old, advantages, mask, cliprange=0.2, cliprange_high=0.2, clip_ratio_c=3.0)
    torch.where(mask.bool(), pg_loss, torch.zeros(())).sum().backward()
    assert torch.isfinite(ratio).all() and all(torch.isfinite(w.grad).all() for w in lm.parameters())
