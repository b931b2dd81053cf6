"""Pipeline: config errors, preference pairs, perplexity baselines, reward normalization, the review task,
and the stage cache (hit, miss, force) on a tiny synthetic corpus — never the full pipeline."""

from __future__ import annotations

import bz2
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from harness.config import ConfigError, build_config, load_config
from harness.tasks.review_sentiment import data as D
from harness.pipeline import draw_key, run_stage, stage_key
from harness.pipeline.stage import KERNEL_PINS, kernel_path
from harness.tasks.review_sentiment.reward_model import build_pairs, compute_reward_offset, load_reward_offset, score_texts
from harness.pipeline.sft import lm_perplexity, unigram_perplexity
from harness.pipeline.tokenizer import encode_with_eos, train_tokenizer

# --------------------------------------------------------------------------------------------
# config errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, expected",
    [
        ("pipeline.tokenizer.vocab_size=100", r"pipeline\.tokenizer\.vocab_size: .*greater than or equal to 300"),
        ("pipeline.reward_model.margin=-1", r"pipeline\.reward_model\.margin: .*greater than or equal to 0"),
        ("pipeline.sft.lr=0", r"pipeline\.sft\.lr: .*greater than 0"),
        ("pipeline.sft.epoch=2", r"pipeline\.sft\.epoch: unknown key; allowed keys: epochs, "),
        ("pipeline.model.n_embd=130", r"n_embd \(130\) must be divisible by model\.n_head \(4\)"),
        ("pipeline.data.val_fraction=0.7", r"pipeline\.data\.val_fraction: .*less than 0\.5"),
        ("pipeline.reward_model.batch_size=zero", r"pipeline\.reward_model\.batch_size: .*integer"),
    ],
)
def test_pipeline_config_errors_are_one_line(override, expected):
    with pytest.raises(ConfigError, match=expected) as ei:
        build_config({}, [override])
    assert "\n" not in str(ei.value)


# --------------------------------------------------------------------------------------------
# preference pairs
# --------------------------------------------------------------------------------------------


def test_build_pairs_margin_domain_and_order():
    df = pd.DataFrame(
        {
            "domain": ["a", "a", "a", "a", "b", "b"],
            "rating": [-2.0, -0.5, 0.5, 1.0, 3.0, 3.0],
            "text": ["a1", "a2", "a3", "a4", "b1", "b2"],
        }
    )
    pairs = build_pairs(df, margin=1.0, pairs_per_snippet=50, seed=0)
    got = {(c, r) for c, r in zip(pairs["chosen"], pairs["rejected"])}
    # |Δ| ≥ 1 inside domain a: (a3,a1) 2.5, (a4,a1) 3.0, (a2,a1) 1.5, (a4,a2) 1.5, (a3,a2) = 1.0 exactly.
    # a4 vs a3 differ by 0.5 (skipped); b1/b2 tie (never a pair); nothing across domains.
    assert got == {("a2", "a1"), ("a3", "a1"), ("a4", "a1"), ("a3", "a2"), ("a4", "a2")}
    assert len(pairs) == len(got)  # unordered duplicates removed
    assert (pairs["chosen_rating"] - pairs["rejected_rating"] >= 1.0 - 1e-9).all()
    pd.testing.assert_frame_equal(pairs, build_pairs(df, 1.0, 50, seed=0))  # deterministic
    assert len(build_pairs(df, 1.0, 50, seed=0, max_pairs=2)) == 2
    assert build_pairs(df, margin=0.0, pairs_per_snippet=50, seed=1).shape[0] == 6  # all non-tied pairs in a
    with pytest.raises(ValueError):
        build_pairs(df, margin=-1, pairs_per_snippet=1, seed=0)


# --------------------------------------------------------------------------------------------
# perplexities
# --------------------------------------------------------------------------------------------


def test_unigram_perplexity_hand_computed():
    # counts over train tokens: 0→2, 1→2, 2→1 (N = 5), V = 4 → denominator N + V = 9.
    # eval targets (positions ≥ 1): 0 and 3 → p = 3/9 and 1/9 → ppl = sqrt(81/3) = sqrt(27).
    assert unigram_perplexity([[0, 1, 1], [2, 0]], [[1, 0, 3]], vocab_size=4) == pytest.approx(math.sqrt(27))
    with pytest.raises(ValueError):
        unigram_perplexity([[0]], [[1]], vocab_size=4)


def test_lm_perplexity_uniform_model_equals_vocab_and_ignores_padding():
    torch.manual_seed(0)
    V = 50
    model = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0))
    with torch.no_grad():
        model.transformer.wte.weight.zero_()  # tied head: all logits 0 → uniform
    seqs = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    assert lm_perplexity(model, seqs, pad_id=0) == pytest.approx(V, rel=1e-5)
    torch.manual_seed(1)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0))
    batched = lm_perplexity(model, seqs, pad_id=0, batch_size=3)
    assert model.training  # the caller's mode is restored
    model.eval()
    # independent: per-sequence unpadded NLL sums
    nll, n = 0.0, 0
    with torch.no_grad():
        for s in seqs:
            logp = torch.log_softmax(model(input_ids=torch.tensor([s])).logits[0, :-1], -1)
            nll -= float(logp[torch.arange(len(s) - 1), torch.tensor(s[1:])].sum())
            n += len(s) - 1
    assert batched == pytest.approx(math.exp(nll / n), rel=1e-5)


# --------------------------------------------------------------------------------------------
# reward normalization (N+ detail 15)
# --------------------------------------------------------------------------------------------


def test_reward_offset_makes_mean_score_zero_on_sft_texts():
    texts = [f"review {i}: " + " ".join(random.Random(i).choice(["good", "bad", "film", "plot"]) for _ in range(i % 9 + 1))
             for i in range(40)]
    tok = train_tokenizer(texts, vocab_size=300, min_frequency=1)
    torch.manual_seed(0)
    rm = GPT2ForSequenceClassification(
        GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2, num_labels=1,
                   pad_token_id=tok.pad_token_id)
    ).eval()
    offset = compute_reward_offset(rm, tok, texts, max_length=32)
    raw = score_texts(rm, tok, texts, max_length=32, batch_size=7)  # different batching, same scores
    assert abs(float(np.mean(raw - offset))) < 1e-6
    assert np.std(raw) > 1e-4  # not trivially constant
    # independent reference: each text alone, unpadded, score at its final (EOS) position
    with torch.no_grad():
        singles = [float(rm.score(rm.transformer(input_ids=torch.tensor([s])).last_hidden_state)[0, -1, 0])
                   for s in encode_with_eos(tok, texts, 32)]
    assert offset == pytest.approx(float(np.mean(singles)), abs=1e-5)


# --------------------------------------------------------------------------------------------
# a tiny synthetic corpus in the real file formats
# --------------------------------------------------------------------------------------------

POS = ["great", "wonderful", "moving", "funny", "brilliant", "charming"]
NEG = ["dull", "awful", "tedious", "boring", "clumsy", "terrible"]
NOUNS = ["film", "movie", "plot", "cast", "script", "phone", "editorial", "story"]


def synthetic_cache(root: Path, n_per_domain: int = 60) -> D.DataConfig:
    rng = random.Random(0)
    root.mkdir(parents=True, exist_ok=True)
    for domain, fname in D.DOMAIN_FILES.items():
        lines = []
        for i in range(n_per_domain):
            k = rng.randint(-3, 3)
            words = [rng.choice(POS if k > 0 else NEG) for _ in range(abs(k))] or ["plain"]
            text = f"the {rng.choice(NOUNS)} {domain} number {i} was " + " and ".join(words) + "."
            lines.append(f"{i + 1}\t{k + rng.uniform(-0.3, 0.3):.4f}\t{text}")
        (root / fname).write_bytes(("\r\n".join(lines)).encode())
    rt = pd.DataFrame(
        {
            "category": ["fresh", "rotten"] * 15,
            "text": [f"a {rng.choice(POS + NEG)} {rng.choice(NOUNS)} review, number {i} of thirty." for i in range(30)],
            "movie_name": [f"m{i}" for i in range(30)],
            "has_plot_and_reviews": [False] * 30,
        }
    )
    (root / D.RT_FILE).write_bytes(bz2.compress(rt.to_csv(index=False).encode()))
    D.write_manifest(root)
    return D.DataConfig(cache_dir=str(root), val_fraction=0.15, test_fraction=0.15)


def tiny_config(cache: D.DataConfig, out_dir: Path, overrides: list[str] = ()):
    return build_config(
        {
            "device": "cpu",
            "torch_threads": 1,
            "pipeline": {
                "data": cache.model_dump(),
                "tokenizer": {"vocab_size": 300, "min_frequency": 1},
                "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 32},
                "sft": {"max_steps": 3, "batch_size": 16, "max_length": 24},
                "gold": {"finetune_layers": 1, "epochs": 1},
                "reward_model": {"labels": "human", "max_steps": 3, "batch_size": 8, "max_length": 24, "margin": 1.0},
                "bon": {"num_prompts": 2, "n_samples": 4},
                "out_dir": str(out_dir),
            },
            "task": {"prompt_length": 4, "response_length": 6},
            "eval": {"num_prompts": 4},  # the synthetic corpus has few held-out prompts
        },
        list(overrides),
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from harness.pipeline import build_pipeline

    root = tmp_path_factory.mktemp("tiny")
    cache = synthetic_cache(root / "cache")
    cfg = tiny_config(cache, root / "pipeline")
    t0 = time.perf_counter()
    first = build_pipeline(cfg, progress=False)
    t1 = time.perf_counter()
    second = build_pipeline(cfg, progress=False)
    t2 = time.perf_counter()
    return {"cfg": cfg, "cache": cache, "root": root, "first": first, "second": second,
            "t_first": t1 - t0, "t_second": t2 - t1}


def test_draw_key_tells_draws_and_regimes_apart_but_not_the_number_of_draws():
    """One key per (task, pipeline less ``replicates``, draw seed): the draw a seed maps to decides it, the number
    of draws does not, and a regime that changes the pipeline changes it."""
    one = load_config(overrides=["pipeline.replicates=1"], scale="default")
    forty = [load_config(overrides=["pipeline.replicates=40", f"seed={s}"], scale="default") for s in (0, 1, 41)]
    assert draw_key(one) == draw_key(forty[0]) == draw_key(forty[1], 0)  # draw 0 is the single pipeline
    assert draw_key(forty[1]) == draw_key(forty[2]) == draw_key(forty[0], 1) != draw_key(forty[0])  # 41 mod 40 = 1
    assert len({draw_key(forty[0], r) for r in range(40)}) == 40
    fixed, variable = (load_config(scale="default", regime=r) for r in ("fixed_length", "variable_length"))
    assert draw_key(fixed) != draw_key(variable)
    assert draw_key(load_config(overrides=["pipeline.replicates=1", "pipeline.out_dir=/elsewhere"],
                                scale="default")) == draw_key(one)  # a machine's directory is not the draw
    with pytest.raises(ValueError, match="replicate"):
        draw_key(one, -1)


def test_stage_cache_hit_on_rerun(tiny_run):
    a, b = tiny_run["first"], tiny_run["second"]
    stages = ("data", "gold", "tokenizer", "sft", "reward_model", "bon_samples", "bon")
    assert [a.summary["stages"][s]["cached"] for s in stages] == [False] * 7
    assert [b.summary["stages"][s]["cached"] for s in stages] == [True] * 7
    assert (a.tokenizer_dir, a.sft_dir, a.rm_dir, a.reward_offset) == (b.tokenizer_dir, b.sft_dir, b.rm_dir, b.reward_offset)
    assert tiny_run["t_second"] < 10.0
    out = Path(tiny_run["cfg"].pipeline.out_dir)
    summary = json.loads((out / "summary.json").read_text())
    for k in ("val_perplexity", "unigram_perplexity"):
        assert math.isfinite(summary["sft"][k]) and summary["sft"][k] > 1
    for k in ("pairwise_accuracy", "spearman_vs_vader", "reward_offset"):
        assert k in summary["reward_model"]
    assert set(summary["stages"]) == set(stages) and all("wall_time_s" in v for v in summary["stages"].values())
    assert summary["draw_key"] == draw_key(tiny_run["cfg"])  # which regime's draw this summary records
    # the resolved stage config sits next to every artifact
    for s in stages:
        d = Path(a.summary["stages"][s]["dir"])
        assert (d / "config.yaml").is_file() and (d / "stage.json").is_file()
    assert json.loads((Path(a.sft_dir) / "stage.json").read_text())["config"]["sft"]["max_steps"] == 3
    # the gold stage: correlations per domain beside VADER's, on the synthetic snippets' test split
    gold = summary["gold"]
    assert set(gold["test"]) == {"movie", "tweets", "nyt", "amazon", "all"} and len(gold["epoch_val"]) == 1
    assert gold["head"] == "top 1 of 6 layers fine-tuned + linear" and (Path(a.gold_dir) / "encoder" / "config.json").is_file()
    assert gold["test"]["all"]["n"] == sum(gold["test"][d]["n"] for d in ("movie", "tweets", "nyt", "amazon"))
    assert gold["test"]["all"]["gold"]["pearson"] > 0.5  # ratings follow the count of positive/negative words


def test_build_pipeline_uses_every_cpu_and_restores_the_callers_thread_count(tiny_run):
    """A run in a one-CPU worker loads the cached pipeline and must keep its one torch thread: left at
    every CPU, each of two workers on two cores ran its GEMMs on two OpenMP threads (four busy threads).
    Without a number from the caller or the config, a build takes every CPU, or ``$OMP_NUM_THREADS`` where that is
    a positive integer."""
    import os
    from unittest import mock

    import torch

    from harness.pipeline import build_pipeline, cpu_threads

    every = len(os.sched_getaffinity(0))
    for value, expected in (("3", 3), ("1", 1), ("0", every), ("two", every), ("", every)):
        with mock.patch.dict(os.environ, {"OMP_NUM_THREADS": value}):
            assert cpu_threads() == expected, value
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        cfg = tiny_run["cfg"].model_copy(update={"torch_threads": None})  # the default: cpu_threads()
        with mock.patch.dict(os.environ):
            os.environ.pop("OMP_NUM_THREADS", None)
            art = build_pipeline(cfg, progress=False)
        assert torch.get_num_threads() == 1
        assert all(st["cached"] for st in art.summary["stages"].values())
        assert art.summary["torch_threads"] == every  # what the stages were (or would be) built with
        with mock.patch.dict(os.environ, {"OMP_NUM_THREADS": "3"}):
            assert build_pipeline(cfg, progress=False).summary["torch_threads"] == 3
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_gold_reward_model_scores_texts(tiny_run):
    from harness.tasks.review_sentiment.gold import GoldRewardModel

    gold = GoldRewardModel(tiny_run["first"].gold_dir)
    # the fine-tuned encoder is reloaded from the stage with from_pretrained: its top layer differs from the wheel's
    from harness.tasks.review_sentiment.gold import load_encoder

    base, _ = load_encoder()
    assert torch.equal(gold.model.encoder.layer[0].output.dense.weight, base.encoder.layer[0].output.dense.weight)
    assert not torch.equal(gold.model.encoder.layer[5].output.dense.weight, base.encoder.layer[5].output.dense.weight)
    s = gold(["the film movie number 1 was great and wonderful and brilliant.", "the film movie number 2 was awful and terrible and dull.", ""])
    assert s.shape == (3,) and s.dtype == torch.float32 and s[0] > s[1]
    assert gold([]).shape == (0,)


def test_stage_cache_miss_rebuilds_only_downstream(tiny_run):
    from harness.pipeline import build_pipeline

    cfg = tiny_config(tiny_run["cache"], Path(tiny_run["cfg"].pipeline.out_dir), ["pipeline.reward_model.lr=0.002"])
    c = build_pipeline(cfg, progress=False)
    st = c.summary["stages"]
    assert [st[s]["cached"] for s in ("data", "tokenizer", "sft", "reward_model")] == [True, True, True, False]
    assert c.sft_dir == tiny_run["first"].sft_dir and c.rm_dir != tiny_run["first"].rm_dir
    # the PPO run's seed changes no stage; the pipeline's own seed feeds SFT and RM, not data/tokenizer
    run_seed = tiny_config(tiny_run["cache"], Path(tiny_run["cfg"].pipeline.out_dir), ["seed=1"])
    d = build_pipeline(run_seed, progress=False).summary["stages"]
    assert [d[s]["cached"] for s in ("data", "tokenizer", "sft", "reward_model")] == [True, True, True, True]
    cfg2 = tiny_config(tiny_run["cache"], Path(tiny_run["cfg"].pipeline.out_dir), ["pipeline.seed=1"])
    assert stage_key({"x": 1}, {}) != stage_key({"x": 2}, {})
    d = build_pipeline(cfg2, progress=False).summary["stages"]
    assert [d[s]["cached"] for s in ("data", "tokenizer", "sft", "reward_model")] == [True, True, False, False]


def test_built_artifacts_load_and_respect_specials(tiny_run):
    from harness.rl.models import load_policy, load_scalar_model, load_tokenizer

    art = tiny_run["first"]
    tok = load_tokenizer(art.tokenizer_dir)
    assert tok.pad_token_id != tok.eos_token_id and tok.padding_side == "right"
    pol = load_policy(art.sft_dir)
    assert (pol.config.eos_token_id, pol.config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert pol.config.resid_pdrop == pol.config.embd_pdrop == pol.config.attn_pdrop == 0.1
    rm = load_scalar_model(art.rm_dir)
    assert rm.config.num_labels == 1
    assert load_reward_offset(art.rm_dir) == art.reward_offset
    assert json.loads((Path(art.rm_dir) / "reward_offset.json").read_text())["reward_offset"] == art.reward_offset


def test_run_stage_hit_miss_and_force(tmp_path):
    calls = []

    def build(d: Path) -> dict:
        calls.append(d)
        (d / "artifact.txt").write_text("x")
        return {"n": len(calls)}

    d1, r1, c1 = run_stage(tmp_path, "s", {"a": 1}, {"up": "k1"}, build)
    d2, r2, c2 = run_stage(tmp_path, "s", {"a": 1}, {"up": "k1"}, build)
    assert (c1, c2, len(calls)) == (False, True, 1) and d1 == d2 and r2["metrics"] == {"n": 1}
    d3, _, c3 = run_stage(tmp_path, "s", {"a": 1}, {"up": "k2"}, build)  # input changed → miss
    assert (c3, len(calls)) == (False, 2) and d3 != d1
    d4, r4, c4 = run_stage(tmp_path, "s", {"a": 1}, {"up": "k1"}, build, force=True)
    assert (c4, len(calls), d4, r4["metrics"]) == (False, 3, d1, {"n": 3})
    assert (d4 / "artifact.txt").is_file() and (d4 / "config.yaml").is_file()
    assert r1["kernels"] == r4["kernels"] == kernel_path()  # recorded with what built it

    def boom(d: Path) -> dict:
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError):
        run_stage(tmp_path, "s", {"a": 9}, {}, boom)
    assert not (tmp_path / "s" / stage_key({"a": 9}, {})).exists()  # a failed build never looks finished
    assert not list((tmp_path / "s").glob(".*.tmp-*"))


def test_kernel_path_names_capability_threads_and_pins(monkeypatch):
    """torch's CPU capability, the intra-op threads (singular for one) and only the pins that are set, in
    KERNEL_PINS order."""
    import torch

    for k in KERNEL_PINS:
        monkeypatch.delenv(k, raising=False)
    cap = torch.backends.cpu.get_cpu_capability()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert kernel_path() == f"{cap}, 1 thread"
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
        monkeypatch.setenv("MKL_CBWR", "AVX2")
        monkeypatch.setenv("NPY_DISABLE_CPU_FEATURES", "")
        torch.set_num_threads(2)
        assert kernel_path() == f"{cap}, 2 threads, MKL_CBWR=AVX2, ONEDNN_MAX_CPU_ISA=AVX2"
    finally:
        torch.set_num_threads(before)


def test_build_pipeline_missing_data_cache(tmp_path):
    from harness.errors import DataCacheError
    from harness.pipeline import build_pipeline

    cfg = tiny_config(D.DataConfig(cache_dir=str(tmp_path / "none")), tmp_path / "p")
    with pytest.raises(DataCacheError, match=r"data cache not found at .*harness data"):
        build_pipeline(cfg, progress=False)


# --------------------------------------------------------------------------------------------
# task
# --------------------------------------------------------------------------------------------


def test_review_sentiment_task(tiny_run):
    from harness.rl.models import load_tokenizer
    from harness.tasks import TASKS

    cfg = tiny_run["cfg"]
    tok = load_tokenizer(tiny_run["first"].tokenizer_dir)
    task = TASKS.get("review_sentiment")(cfg, tok)
    P = cfg.task.prompt_length
    assert task.prompt_ids.dtype == torch.long and task.prompt_ids.shape[1] == P
    assert tok.pad_token_id not in task.prompt_ids and tok.eos_token_id not in task.prompt_ids
    # every prompt is the first P tokens of a test-split source text with ≥ P + 4 tokens
    from harness.tasks.review_sentiment.task import prompt_sources

    srcs = [tok(t, add_special_tokens=False)["input_ids"] for t in prompt_sources(cfg.pipeline.data)]
    allowed = {tuple(s[:P]) for s in srcs if len(s) >= P + 4}
    train_set, eval_set = {tuple(r) for r in task.prompt_ids.tolist()}, {tuple(r) for r in task.eval_prompt_ids.tolist()}
    assert train_set | eval_set == allowed and not train_set & eval_set  # the evaluation prompts are never trained on
    assert len(eval_set) == cfg.eval.num_prompts
    assert torch.equal(TASKS.get("review_sentiment")(cfg, tok).eval_prompt_ids, task.eval_prompt_ids)  # fixed set
    g = torch.Generator().manual_seed(3)
    a = task.sample_prompts(2, g)
    b = task.sample_prompts(2, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (2, P)
    big = task.sample_prompts(task.prompt_ids.shape[0] + 5, g)
    assert big.shape[0] == task.prompt_ids.shape[0] + 5
    from harness.tasks.review_sentiment.task import split_eval_prompts

    pool = torch.arange(20).reshape(10, 2)
    tr, ev = split_eval_prompts(pool, 3, seed=5)
    assert tr.shape == (7, 2) and ev.shape == (3, 2)
    assert sorted(torch.cat([tr, ev])[:, 0].tolist()) == list(range(0, 20, 2))
    assert torch.equal(split_eval_prompts(pool, 3, seed=5)[1], ev) and not torch.equal(split_eval_prompts(pool, 3, seed=6)[1], ev)
    with pytest.raises(ValueError, match="eval.num_prompts: 10 leaves no training prompt"):
        split_eval_prompts(pool, 10, seed=5)
    gold = task.gold_lexicon(["What a wonderful, brilliant film!", "An awful, terrible mess.", ""])
    assert gold.dtype == torch.float32 and gold[0] > 0.5 and gold[1] < -0.5 and gold[2] == 0.0


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers renames `gradient_checkpointing` in v6
def test_reward_trainer_loss_reads_scores_at_eos_even_when_pad_equals_eos(tmp_path):
    """EOSRewardTrainer's Bradley–Terry loss uses the EOS-position scores of each sequence alone."""
    from datasets import Dataset
    from trl import RewardConfig

    from harness.tasks.review_sentiment.reward_model import EOSRewardTrainer

    texts = ["a great and moving film", "dull", "so boring and far too long", "fine"]
    tok = train_tokenizer(texts * 3, vocab_size=300, min_frequency=1)
    tok.pad_token = tok.eos_token  # the TRL #3750 setting
    torch.manual_seed(0)
    rm = GPT2ForSequenceClassification(
        GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=16, n_layer=1, n_head=2, num_labels=1,
                   pad_token_id=tok.eos_token_id)
    )
    chosen, rejected = encode_with_eos(tok, texts[:2], 32), encode_with_eos(tok, texts[2:], 32)
    ds = Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": rejected})
    args = RewardConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                        gradient_checkpointing=False, per_device_train_batch_size=2, max_length=32)
    trainer = EOSRewardTrainer(model=rm, args=args, train_dataset=ds, processing_class=tok)
    batch = trainer.data_collator([ds[0], ds[1]])
    rm.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(rm, dict(batch))

        def alone(seq):  # each sequence unpadded, score at its last (EOS) position
            return rm.score(rm.transformer(input_ids=torch.tensor([seq])).last_hidden_state)[0, -1, 0]

        expected = -torch.nn.functional.logsigmoid(
            torch.stack([alone(c) - alone(r) for c, r in zip(chosen, rejected)])
        ).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_every_draw_starts_its_proxy_from_draw_0s_reward_model_of_human_ratings(smoke_pipeline):
    """Gold-labelled proxies (the smoke scale's) on 2 draws: draw 1 samples and labels its own comparisons from its
    own SFT policy and trains its own proxy, but the reward model of human ratings it starts from is draw 0's (same
    key, same weights), built from draw 0's SFT policy, which draw 1 loads as ``sft_draw0``."""
    from conftest import smoke_config

    from harness.pipeline import build_pipeline

    zero = smoke_pipeline.summary["stages"]
    one = build_pipeline(smoke_config(["seed=1", "pipeline.replicates=2"]), progress=False).summary["stages"]
    assert "sft_draw0" not in zero and one["sft_draw0"]["key"] == zero["sft"]["key"] != one["sft"]["key"]
    assert (one["human_rm"]["key"], one["human_rm"]["weights_sha256"]) == (zero["human_rm"]["key"],
                                                                          zero["human_rm"]["weights_sha256"])
    for s in ("proxy_data", "reward_model"):
        assert one[s]["key"] != zero[s]["key"]


def test_pipeline_draws_share_data_and_gold_and_redraw_sft_and_reward_model(tiny_run):
    """``pipeline.replicates = 2``: seed 3 uses draw 1, whose SFT policy and reward model are trained from the draw
    seed ``pipeline.seed + 1,000,003`` (new keys, other weights: other digests), while data, gold and tokenizer are
    the single pipeline's; seed 4 uses draw 0, exactly the single pipeline (same keys, same digests). One draw
    leaves the config's hash as it was."""
    from harness.config.pipeline import REPLICATE_STRIDE
    from harness.pipeline import build_pipeline
    from harness.pipeline.stage import weights_digest

    cache, root, base = tiny_run["cache"], tiny_run["root"], tiny_run["first"].summary["stages"]
    one = tiny_config(cache, root / "pipeline", ["seed=3"])
    assert one.hash() == tiny_config(cache, root / "pipeline", ["seed=3", "pipeline.replicates=1"]).hash()
    drawn = tiny_config(cache, root / "pipeline", ["seed=3", "pipeline.replicates=2"])
    assert (drawn.replicate, drawn.draw_seed) == (1, drawn.pipeline.seed + REPLICATE_STRIDE) and drawn.hash() != one.hash()
    st = build_pipeline(drawn, progress=False).summary["stages"]
    for s in ("data", "gold", "tokenizer"):
        assert st[s]["key"] == base[s]["key"] and st[s]["weights_sha256"] == base[s]["weights_sha256"]
    for s in ("sft", "reward_model"):
        assert st[s]["key"] != base[s]["key"] and st[s]["weights_sha256"] != base[s]["weights_sha256"]
        assert st[s]["weights_sha256"] == weights_digest(st[s]["dir"]) and len(st[s]["weights_sha256"]) == 16
    assert base["tokenizer"]["weights_sha256"] is None and base["gold"]["weights_sha256"] is not None
    assert "bon" in base and "bon" not in st and "bon_samples" not in st  # best-of-n on draw 0 only
    zero_cfg = tiny_config(cache, root / "pipeline", ["seed=4", "pipeline.replicates=2"])
    zero = build_pipeline(zero_cfg, progress=False).summary["stages"]
    assert {s: (v["key"], v["weights_sha256"]) for s, v in zero.items()} == \
        {s: (v["key"], v["weights_sha256"]) for s, v in base.items()}
    deferred = build_pipeline(zero_cfg, progress=False, defer=True)  # an ablation's driver leaves best-of-n out
    assert deferred.bon_dir == "" and "bon" not in deferred.summary["stages"] and deferred.sft_dir == zero["sft"]["dir"]


def test_a_stage_build_killed_mid_way_leaves_no_temp_folder_past_the_next_build_of_that_stage(tmp_path):
    """A build killed by SIGKILL leaves ``.KEY.tmp-PID`` (no ``except`` runs); the next build of that stage, cached or
    not, removes it, and leaves another key's temporary folder alone (that key's own build removes it)."""
    import signal
    import subprocess
    import sys

    key = stage_key({"a": 1}, {})
    other = stage_key({"a": 2}, {})
    script = ("import os, signal, sys\nfrom pathlib import Path\nfrom harness.pipeline import run_stage\n"
              "def build(d):\n    (d / 'half.bin').write_bytes(b'x' * 1000)\n    os.kill(os.getpid(), signal.SIGKILL)\n"
              f"run_stage(Path({str(tmp_path)!r}), 's', {{'a': 1}}, {{}}, build)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert r.returncode == -signal.SIGKILL
    left = list((tmp_path / "s").glob(f".{key}.tmp-*"))
    assert len(left) == 1 and (left[0] / "half.bin").is_file()  # what the kill left behind
    (tmp_path / "s" / f".{other}.tmp-99999999").mkdir()
    d, _, cached = run_stage(tmp_path, "s", {"a": 1}, {}, lambda p: {"n": 1})
    assert not cached and not list((tmp_path / "s").glob(f".{key}.tmp-*")) and (d / "stage.json").is_file()
    (tmp_path / "s" / f".{key}.tmp-12345").mkdir()  # stale beside a finished stage: a cache hit removes it too
    assert run_stage(tmp_path, "s", {"a": 1}, {}, lambda p: {"n": 2})[2]
    assert [p.name for p in (tmp_path / "s").glob(".*.tmp-*")] == [f".{other}.tmp-99999999"]
