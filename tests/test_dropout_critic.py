"""Dropout variants make train-mode forwards deterministic (off) or not (on); critic initialisation."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

from harness.rl.components.critic import CRITIC_INIT
from harness.rl.components.dropout import DROPOUT
from harness.errors import HarnessError

VOCAB = 64


def tiny_gpt2(attn: str, **pdrop) -> nn.Module:
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2, **pdrop)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)


def tiny_llama(attn: str) -> nn.Module:
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16, attention_dropout=0.5,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)


IDS = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(0))


def two_forwards(model: nn.Module, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    model.train(train)
    with torch.no_grad():
        return model(IDS).logits, model(IDS).logits


MODELS = [
    ("gpt2-all-0.1", lambda attn: tiny_gpt2(attn)),  # config defaults: embd/resid/attn pdrop 0.1
    ("gpt2-attn-only", lambda attn: tiny_gpt2(attn, embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.5)),
    ("llama-attn-float", tiny_llama),  # attention dropout is a float attribute, not an nn.Dropout
]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name,build", MODELS, ids=[m[0] for m in MODELS])
def test_dropout_on_is_stochastic_in_train_only(name, build, attn):
    model = DROPOUT.get("on")(build(attn))
    a, b = two_forwards(model, train=True)
    assert not torch.equal(a, b)
    a, b = two_forwards(model, train=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name,build", MODELS, ids=[m[0] for m in MODELS])
def test_dropout_off_is_bit_identical_in_train_mode(name, build, attn):
    model = build(attn)
    assert DROPOUT.get("off")(model) is model
    a, b = two_forwards(model, train=True)
    assert torch.equal(a, b)
    e, _ = two_forwards(model, train=False)
    assert torch.equal(a, e)  # train-mode output equals the eval-mode output
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, nn.Dropout))
    for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout", "summary_first_dropout"):
        assert getattr(model.config, key, 0.0) == 0.0, key


def test_dropout_on_keeps_configured_p():
    model = DROPOUT.get("on")(tiny_gpt2("eager"))
    assert sorted({m.p for m in model.modules() if isinstance(m, nn.Dropout)}) == [0.1]
    assert model.config.attn_pdrop == 0.1


def test_dropout_off_plain_module():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 4))
    DROPOUT.get("off")(model).train()
    x = torch.randn(8, 4)
    assert torch.equal(model(x), model(x))


# ------------------------------------------------------------------------------------- critic


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("critic")
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")

    torch.manual_seed(1)
    sft = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    assert sft.config.pad_token_id is None
    sft.save_pretrained(root / "sft")
    tokenizer.save_pretrained(root / "sft")

    torch.manual_seed(2)
    rm = GPT2ForSequenceClassification(
        GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2, num_labels=1, pad_token_id=0)
    )
    rm.save_pretrained(root / "rm")
    return str(root / "sft"), str(root / "rm"), sft, rm


def test_critic_from_policy(dirs):
    sft_dir, rm_dir, sft, _ = dirs
    rng_before = torch.get_rng_state()
    critic = CRITIC_INIT.get("policy")(sft_dir, rm_dir, "cpu", seed=0)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global RNG is untouched
    assert isinstance(critic, GPT2ForSequenceClassification)
    assert critic.config.num_labels == 1 and critic.score.weight.shape == (1, 32)
    assert critic.config.pad_token_id == 0  # taken from the saved tokenizer
    sft_state = sft.transformer.state_dict()
    for k, v in critic.transformer.state_dict().items():
        assert torch.equal(v, sft_state[k]), k
    assert critic.score.weight.abs().sum() > 0
    again = CRITIC_INIT.get("policy")(sft_dir, rm_dir, "cpu", seed=0)
    other = CRITIC_INIT.get("policy")(sft_dir, rm_dir, "cpu", seed=1)
    assert torch.equal(critic.score.weight, again.score.weight)
    assert not torch.equal(critic.score.weight, other.score.weight)
    with torch.no_grad():
        assert critic(IDS).logits.shape == (3, 1)  # batch > 1 works: pad id is set


def test_critic_from_reward_model(dirs):
    sft_dir, rm_dir, _, rm = dirs
    critic = CRITIC_INIT.get("reward_model")(sft_dir, rm_dir, "cpu")
    rm_state = rm.state_dict()
    for k, v in critic.state_dict().items():
        assert torch.equal(v, rm_state[k]), k
    with pytest.raises(HarnessError, match="not found"):
        CRITIC_INIT.get("reward_model")(sft_dir, rm_dir + "-missing", "cpu")
    assert CRITIC_INIT.names() == ["reward_model", "policy"]
