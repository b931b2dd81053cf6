"""The benchmark's arithmetic (FLOPs, roofline, medians, speedup) and its summary.json on a tiny setting.

No timing is asserted: only exact counts against hand-computed values and torch's own FLOP counter,
and the structure and internal consistency of what ``harness bench`` writes.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from harness.bench.loop import FixedPromptTask, _env_threads, build_setting, make_tokenizer, run_bench
from harness.bench.spec import (BenchSpec, gpt2_forward_flops_per_token, roofline_fraction, scoring_forward_flops,
                                summarize, timed_window, update_flops)
from harness.bench.venv import TRL_PINS, ensure_trl_venv
from harness.errors import HarnessError

TINY = dict(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=16, batch_size=4, prompt_length=3,
            response_length=4, num_ppo_epochs=1, warmup=1, iterations=2, matmul_n=64)


def test_flops_per_token_hand_computed():
    # L=2, h=8, S=4: per block 24·64 + 4·4·8 = 1536 + 128 = 1664; two blocks 3328
    assert gpt2_forward_flops_per_token(2, 8, 4, head_out=10) == 3328 + 2 * 8 * 10  # LM head 160
    assert gpt2_forward_flops_per_token(2, 8, 4, head_out=1) == 3328 + 16  # scalar head
    with pytest.raises(ValueError):
        gpt2_forward_flops_per_token(0, 8, 4, 1)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_flops_match_torch_flop_counter(attn):
    L, h, V, B, S = 2, 16, 40, 3, 8
    cfg = dict(n_layer=L, n_embd=h, n_head=2, vocab_size=V, n_positions=16, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(**cfg, attn_implementation=attn))
    x = torch.randint(0, V, (B, S))
    with FlopCounterMode(display=False) as fwd:
        lm(input_ids=x)
    with FlopCounterMode(display=False) as train:
        lm(input_ids=x).logits.sum().backward()
    per_tok = gpt2_forward_flops_per_token(L, h, S, V)
    assert fwd.get_total_flops() == B * S * per_tok
    assert train.get_total_flops() == 3 * B * S * per_tok  # backward = 2 × forward

    clf = GPT2ForSequenceClassification(GPT2Config(**cfg, num_labels=1, attn_implementation=attn))
    with FlopCounterMode(display=False) as scalar:
        clf.score(clf.transformer(input_ids=x).last_hidden_state)
    assert scalar.get_total_flops() == B * S * gpt2_forward_flops_per_token(L, h, S, 1)


def test_scoring_forward_flops_match_torch_flop_counter():
    from harness.rl.run_models import critic_values
    from harness.rl.rollout import response_logprobs

    spec = BenchSpec(n_layer=1, n_embd=16, n_head=2, vocab_size=40, batch_size=3, prompt_length=3, response_length=5)
    # eager attention: the counter does not see the fused CPU SDPA kernel used under no_grad
    cfg = dict(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=16, bos_token_id=0, eos_token_id=0,
               attn_implementation="eager")
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(**cfg)).eval()
    clf = GPT2ForSequenceClassification(GPT2Config(**cfg, num_labels=1, pad_token_id=1)).eval()
    qr = torch.randint(2, 40, (3, spec.seq_len))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        response_logprobs(lm, qr, spec.prompt_length, 0.7, with_entropy=True)
        response_logprobs(lm, qr, spec.prompt_length, 0.7)
        critic_values(clf, qr, spec.prompt_length)
    assert counter.get_total_flops() == scoring_forward_flops(spec)


def test_update_and_scoring_flops_hand_computed():
    spec = BenchSpec(n_layer=1, n_embd=4, vocab_size=6, batch_size=2, prompt_length=2, response_length=2,
                     num_ppo_epochs=3, num_minibatches=2)
    # S = 4; F_policy = 24·16 + 4·4·4 + 2·4·6 = 384 + 64 + 48 = 496; F_critic = 448 + 8 = 456
    assert update_flops(spec) == 3 * 2 * 4 * 3 * (496 + 456)  # epochs · B · S · 3 · (F_pol + F_crit) = 68544
    # LM head (2·4·6 = 48 per row) only on the T + 1 = 3 last positions: 2·(2·4·448 + 2·3·48) + 2·4·456
    assert scoring_forward_flops(spec) == 2 * (2 * 4 * 448 + 2 * 3 * 48) + 2 * 4 * 456  # 11392


def test_roofline_fraction():
    assert roofline_fraction(50e9, 1.0, 100.0) == pytest.approx(0.5)
    assert roofline_fraction(93.4e9, 1.5, 100.0) == pytest.approx(93.4 / 1.5 / 100)
    with pytest.raises(ValueError):
        roofline_fraction(1.0, 0.0, 100.0)
    with pytest.raises(ValueError):
        roofline_fraction(1.0, 1.0, 0.0)


def test_timed_window_drops_warmup():
    marks = [10.0, 11.0, 13.0, 16.0, 20.0]  # iterations took 1, 2, 3, 4 s
    assert timed_window(marks, warmup=1, iterations=2) == [2.0, 3.0]
    assert timed_window(marks, warmup=0, iterations=4) == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError):
        timed_window(marks, warmup=2, iterations=3)


def _fake_ours():
    return {"iteration_s": [2.0, 1.0, 4.0], "iteration_cpu_s": [1.8, 1.0, 1.2], "phase_s": {"generate": [0.2, 0.1, 0.3], "score": [0.05, 0.05, 0.05],
            "forward": [0.2, 0.25, 0.3], "update": [1.5, 0.5, 1.0]}, "forward_breakdown_s": {},
            "peak_rss_mb": 800.0, "n_params": {}, "torch_threads": 1}


def test_summarize_speedup_phases_and_roofline():
    spec = BenchSpec()
    matmul = {"peak_gflops": 100.0, "median_gflops": 95.0, "n": 1024, "threads": 1}
    trl = {"iteration_s": [3.0, 2.5, 9.0, 2.0, 3.5], "iteration_cpu_s": [2.0, 1.8, 1.5, 1.6, 1.7], "peak_rss_mb": 990.0}
    s = summarize(spec, _fake_ours(), trl, matmul)
    assert s["ours_s"] == 2.0 and s["trl_s"] == 3.0 and s["speedup"] == pytest.approx(1.5)
    assert s["ours_cpu_s"] == 1.2 and s["trl_cpu_s"] == 1.7 and s["speedup_cpu"] == pytest.approx(1.7 / 1.2)
    assert s["phases_s"]["generate"] == pytest.approx(0.2) and s["phases_s"]["update"] == pytest.approx(1.0)
    # per iteration: 2.0 − 1.95 = 0.05, 1.0 − 0.9 = 0.1, 4.0 − 1.65 = 2.35 → median 0.1
    assert s["phases_s"]["other"] == pytest.approx(0.1)
    # default spec: 4 epochs · 64 · 32 tokens · 3 · (2 163 200 + 1 638 656) FLOPs in the 1.0 s update
    assert s["roofline"]["update_flops"] == 4 * 64 * 32 * 3 * (2_163_200 + 1_638_656)
    assert s["roofline_fraction"] == pytest.approx(93_434_413_056 / 1.0 / 1e9 / 100.0)
    assert s["peak_rss_mb"] == {"ours": 800.0, "trl": 990.0}
    skipped = summarize(spec, _fake_ours(), None, matmul)
    assert skipped["trl_s"] is None and skipped["speedup"] is None and skipped["trl"] == {"skipped": True}
    assert skipped["trl_cpu_s"] is None and skipped["speedup_cpu"] is None
    json.dumps(s)  # serialisable as is


def test_env_threads():
    assert _env_threads(None) == 1 and _env_threads("") == 1
    assert _env_threads("auto") is None and _env_threads("2") == 2
    for bad in ("0", "-1", "two"):
        with pytest.raises(HarnessError):
            _env_threads(bad)


def test_tokenizer_and_fixed_prompt_task():
    tok = make_tokenizer(10)
    assert len(tok) == 10 and tok.eos_token_id == 0 and tok.pad_token_id == 1
    assert tok.decode([2, 3, 0], skip_special_tokens=True) == "t2 t3"
    prompts = torch.arange(12).view(4, 3)
    task = FixedPromptTask(prompts)
    got = task.sample_prompts(4, torch.Generator().manual_seed(0))
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, prompts.tolist()))
    assert task.gold_lexicon(["a", "b"]).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        task.sample_prompts(5, torch.Generator())


def test_spec_json_has_every_key_the_trl_script_reads(tmp_path):
    setting = build_setting(BenchSpec(**TINY), tmp_path / "setting")
    spec = json.loads(Path(setting["spec_path"]).read_text())
    script = (Path(__file__).parents[1] / "harness" / "bench" / "trl.py").read_text()
    keys = set(re.findall(r'spec\[\s*"(\w+)"\s*\]', script)) | set(re.findall(r'spec\.get\(\s*"(\w+)"', script))
    assert {"policy_dir", "rm_dir", "prompts", "batch_size"} <= keys
    assert keys <= set(spec), keys - set(spec)
    assert torch.tensor(spec["prompts"]).shape == (TINY["batch_size"], TINY["prompt_length"])
    assert min(min(r) for r in spec["prompts"]) >= 2  # no EOS (0) or PAD (1) inside a prompt


def test_cached_trl_venv_is_reused_without_pip(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".bench-pins").write_text("\n".join(TRL_PINS))
    log = tmp_path / "log"
    assert ensure_trl_venv(venv, log, echo=lambda s: None) == venv / "bin" / "python"
    assert not log.exists()  # nothing was run
    assert "torch==2.13.0" in TRL_PINS and "trl==1.12.0" in TRL_PINS


def test_run_bench_skip_trl_writes_consistent_summary(tmp_path):
    lines: list[str] = []
    threads = torch.get_num_threads()
    summary = run_bench(iterations=2, skip_trl=True, out_dir=tmp_path, spec=BenchSpec(**TINY), echo=lines.append)
    assert torch.get_num_threads() == threads  # restored
    assert lines[-1] == "speedup_vs_trl=nan"
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    for key in ("ours_s", "trl_s", "speedup", "phases_s", "roofline_fraction", "peak_rss_mb", "roofline", "spec", "machine"):
        assert key in on_disk
    assert on_disk["trl_s"] is None and on_disk["speedup"] is None and on_disk["trl"] == {"skipped": True}
    ours = on_disk["ours"]
    assert len(ours["iteration_cpu_s"]) == 2 and on_disk["ours_cpu_s"] == pytest.approx(statistics.median(ours["iteration_cpu_s"]))
    assert len(ours["iteration_s"]) == 2 and on_disk["ours_s"] == pytest.approx(statistics.median(ours["iteration_s"]))
    assert set(on_disk["phases_s"]) == {"generate", "score", "forward", "update", "other"}
    assert on_disk["phases_s"]["other"] >= 0  # the phases are timed inside the iteration
    assert all(len(v) == 2 for v in ours["phase_s"].values())
    assert set(ours["forward_breakdown_s"]) == {"policy_logprobs", "ref_logprobs", "critic_values"}
    roof = on_disk["roofline"]
    assert roof["update_flops"] == update_flops(BenchSpec(**TINY))
    assert on_disk["roofline_fraction"] == pytest.approx(
        roof["update_flops"] / on_disk["phases_s"]["update"] / 1e9 / roof["matmul_peak_gflops"])
    assert on_disk["peak_rss_mb"]["ours"] > 0 and on_disk["peak_rss_mb"]["trl"] is None
    assert set(ours["n_params"]) == {"policy", "ref", "reward_model", "critic"}
