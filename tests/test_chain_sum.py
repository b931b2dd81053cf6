"""The chain-sum task's problems (reasoning-gym 0.1.25), scratchpad traces and exact-match verifier."""

from __future__ import annotations

import math
import random

import pytest

from harness.tasks.chain_sum.problems import (HELDOUT_SEED_OFFSET, dataset, direct_answer, direct_indices, extract,
                                              make_problems, prompt_text, reward,
                                              scratchpad, split_overlap)


def _value(expression: str) -> int:
    """The expression's value, computed here without the library (an independent oracle)."""
    parts = expression.split()
    total = int(parts[0])
    for op, term in zip(parts[1::2], parts[2::2]):
        total = total + int(term) if op == "+" else total - int(term)
    return total


def test_scratchpad_hand_example():
    entry = {"metadata": {"expression": "12 + 34 - 5"}, "answer": "41"}
    assert prompt_text(entry) == "12 + 34 - 5 ="
    assert scratchpad(entry) == " 12+34=46; 46-5=41; <answer>41</answer>"
    assert extract(scratchpad(entry)) == "41"
    with pytest.raises(ValueError, match="not a chain sum"):
        scratchpad({"metadata": {"expression": "12 * 3"}})


def test_every_scratchpad_trace_scores_one_with_the_librarys_scorer():
    train, heldout = make_problems(600, 400, seed=3, max_terms=6, max_digits=3)
    for data, entries in ((dataset(600, 3, max_terms=6, max_digits=3), train),
                          (dataset(400, 3 + HELDOUT_SEED_OFFSET, max_terms=6, max_digits=3), heldout)):
        for e in entries:
            trace = scratchpad(e)
            assert data.score_answer(extract(trace), e) == 1.0 and reward(trace, e, data) == 1.0
            assert int(e["answer"]) == _value(e["metadata"]["expression"])


def test_reward_is_exact_match_on_1000_problems_against_an_independent_oracle():
    """Correct, off-by-k, superset (the library's partial credit), untagged and empty answers: the reward is 1
    exactly when the extracted answer equals the value computed here, and agrees with the library's scorer
    where that scorer is exact (1.0) or gives nothing."""
    data = dataset(1000, 11)
    rng = random.Random(0)
    partial = 0
    for e in data:
        truth = _value(e["metadata"]["expression"])
        kind = rng.choice(["right", "off", "superset", "untagged", "empty"])
        said = {"right": str(truth), "off": str(truth + rng.choice([-10, -1, 1, 7])), "superset": f"{truth}9",
                "untagged": None, "empty": ""}[kind]
        response = " 1+1=2; " + (f"<answer>{said}</answer>" if said is not None else str(truth))
        r = reward(response, e, data)
        assert r == (1.0 if said is not None and said != "" and int(said) == truth else 0.0)
        lib = data.score_answer(extract(response), e)
        assert (lib == 1.0) == (r == 1.0)
        partial += 0.0 < lib < 1.0
    assert partial > 100  # the superset answers got the library's partial credit, and no reward


def test_training_and_heldout_problems_come_from_disjoint_generator_seeds():
    train, heldout = make_problems(200, 100, seed=5)
    assert heldout[0] == dataset(1, 5 + HELDOUT_SEED_OFFSET)[0] and train[0] == dataset(1, 5)[0]
    expressions = [e["metadata"]["expression"] for e in train]
    assert split_overlap(train, heldout) == sum(e["metadata"]["expression"] in expressions for e in heldout)
    assert split_overlap(train, heldout) < 20  # only chance repeats of short expressions
    with pytest.raises(ValueError, match="n_train"):
        make_problems(HELDOUT_SEED_OFFSET, 1, seed=0)


# ---- the registered task ------------------------------------------------------------------------------------


def _chain_cfg(overrides=None, scale="smoke"):
    from harness.config import load_config

    return load_config(None, ["task.name=chain_sum", *(overrides or [])], scale=scale)


def test_chain_sum_config_takes_the_tasks_defaults_scales_and_options():
    from harness.config import ConfigError, build_config, load_config

    cfg = _chain_cfg()
    assert (cfg.task.prompt_length, cfg.task.response_length, cfg.pipeline.model.n_positions) == (24, 72, 96)
    # GRPO's recipe: group-normalised advantages, not whitened again; each response's token mean; k3 KL in the loss
    assert (cfg.ppo.adv_estimator, cfg.ppo.advantage_whitening, cfg.ppo.loss_agg, cfg.ppo.kl_placement,
            cfg.ppo.kl_estimator) == ("grpo", False, "seq-mean-token-mean", "loss", "k3")
    assert cfg.ppo.critic_init == "policy" and cfg.pipeline.model.n_embd == 64  # defaults, then the task's smoke preset
    assert cfg.task.options["n_train"] == 2000 and cfg.task.options["max_terms"] == 6  # preset + option defaults
    assert _chain_cfg(["task.response_length=80"], scale="default").task.response_length == 80  # the user wins
    with pytest.raises(ConfigError, match=r"task.options: task chain_sum: max_digits \(1\) must be ≥ min_digits \(2\)"):
        _chain_cfg(["task.options.min_digits=2", "task.options.max_digits=1"])
    with pytest.raises(ConfigError, match="task.options: task chain_sum: terms: unknown key; allowed keys: min_terms"):
        _chain_cfg(["task.options.terms=3"])
    with pytest.raises(ConfigError, match="ppo.critic_init: reward_model, but task chain_sum is scored by a verifier"):
        _chain_cfg(["ppo.adv_estimator=gae", "ppo.critic_init=reward_model"])
    assert _chain_cfg(["ppo.critic_init=reward_model"]).ppo.critic_init == "reward_model"  # no critic: never read
    with pytest.raises(ConfigError, match="task.options: task review_sentiment takes no options"):
        build_config({"task": {"options": {"max_terms": 3}}})
    # review_sentiment's configs do not change: no options in the dump, the generic preset, the same hash
    review = load_config(None, [], scale="smoke")
    assert "options" not in review.to_dict()["task"] and review.pipeline.model.n_embd == 64
    assert review.task.response_length == 12 and review.hash() == build_config(review.to_dict()).hash()


class _Tok:
    """A character tokenizer (pad = 1, eos = 0, ids = ord) for the prompt encoder."""

    pad_token_id, eos_token_id, pad_token = 1, 0, "\x01"

    def __call__(self, texts, add_special_tokens=False):  # a string gives one list of ids, a list one per text
        if isinstance(texts, str):
            return {"input_ids": [ord(c) for c in texts]}
        return {"input_ids": [[ord(c) for c in t] for t in texts]}


def test_prompts_are_left_padded_to_the_prompt_length():
    from harness.tasks.chain_sum.task import encode_prompts, padded_prompt_text

    entries = [{"metadata": {"expression": "1 + 2"}}, {"metadata": {"expression": "12 - 3 + 4"}}]
    ids = encode_prompts(_Tok(), entries, 12)
    assert ids.tolist() == [[1] * 5 + [ord(c) for c in "1 + 2 ="], [ord(c) for c in "12 - 3 + 4 ="]]
    assert padded_prompt_text(_Tok(), entries[0], 12) == "\x01" * 5 + "1 + 2 ="
    with pytest.raises(ValueError, match="task.prompt_length: 10 tokens, but a chain_sum prompt has 12; set task.prompt_length ≥ 12"):
        encode_prompts(_Tok(), entries, 10)


def test_chain_sum_reward_is_exact_match_plus_the_format_reward():
    import torch

    from harness.tasks.chain_sum.task import ChainSumTask

    e1 = {"question": "q", "answer": "41", "metadata": {"expression": "12 + 34 - 5"}}
    e2 = {"question": "q", "answer": "7", "metadata": {"expression": "3 + 4"}}
    data = dataset(1, 0)
    task = ChainSumTask(prompt_ids=torch.tensor([[5, 6]]), eval_prompt_ids=torch.tensor([[7, 8]]),
                        entries={(5, 6): e1, (7, 8): e2}, data=data, format_reward=0.25)
    prompts = torch.tensor([[5, 6], [5, 6], [5, 6], [7, 8], [7, 8]])
    texts = [" 12+34=46; 46-5=41; <answer>41</answer>",  # correct
             " <answer>141</answer>",  # the library's partial credit (2/3): not correct
             " 12+34=46; 46-5=41;",  # no answer
             " <answer> 7 </answer>",  # extracted stripped: correct
             " <answer>8</answer>"]
    correct, formatted = task.verdicts(prompts, texts)
    assert data.score_answer("141", e1) == pytest.approx(2 / 3)
    assert correct.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0] and formatted.tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]

    class _Models:
        class tokenizer:  # noqa: N801  (decode_responses calls tokenizer.decode on the masked ids)
            @staticmethod
            def decode(ids, skip_special_tokens=True):
                return texts[ids[0]]

    responses = torch.arange(5).unsqueeze(1)
    out = task.score(_Models, None, prompts, responses, torch.ones_like(responses), with_gold=True)
    assert out["score"].tolist() == [1.25, 0.25, 0.0, 1.25, 0.25] and out["gold"].tolist() == correct.tolist()
    assert out["gold_lexicon"].tolist() == formatted.tolist() and out["texts"] == texts
    with pytest.raises(KeyError):
        task.verdicts(torch.tensor([[9, 9]]), ["x"])


def test_greedy_responses_match_a_step_by_step_argmax():
    """``greedy_responses`` (transformers' ``generate``) equals argmax decoding by full forwards, cut after EOS."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from harness.tasks.chain_sum.task import greedy_responses

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=12, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    prompts = torch.tensor([[1, 1, 5, 6], [7, 8, 9, 10], [1, 3, 3, 4]])
    eos, pad, T = 2, 1, 6
    responses, mask = greedy_responses(model, prompts, T, eos, pad)
    for i, p in enumerate(prompts):
        seq, want = p.tolist(), []
        with torch.no_grad():
            for _ in range(T):
                nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                seq.append(nxt)
                want.append(nxt)
                if nxt == eos:
                    break
        n = len(want)
        assert responses[i, :n].tolist() == want and mask[i].tolist() == [1] * n + [0] * (T - n)
        assert responses[i, n:].tolist() == [pad] * (T - n)


def test_chain_sum_pipeline_and_a_grpo_run_on_it(isolated_results, tmp_path):
    """The task's smoke pipeline builds (its traces all verified, no reward model), and a GRPO run trains on it
    with the task's evaluation metrics."""
    from harness.pipeline import build_pipeline
    from harness.rl.runner import run as train
    from harness.rl.metrics import run_metric_names
    from harness.tasks.chain_sum.stages import load_problems

    cfg = _chain_cfg(["ppo.adv_estimator=grpo"])
    art = build_pipeline(cfg, progress=False)
    assert art.rm_dir == "" and art.gold_dir == ""
    problems_metrics, sft = art.summary["problems"], art.summary["sft"]
    train_p, heldout = load_problems(art.summary["stages"]["problems"]["dir"])
    assert problems_metrics["traces_scored_correct"] == 1.0 and len(train_p) == 2000 and len(heldout) == 64
    assert problems_metrics["heldout_in_train"] == split_overlap(train_p, heldout)
    assert sum(problems_metrics["train_by_terms"].values()) == 2000
    assert 0.0 <= sft["heldout_pass1_greedy"] <= 1.0 and sft["n_heldout"] == 64 and sft["steps"] == 40
    from harness.rl.callbacks import MetricsRecorder
    from harness.tasks.chain_sum.problems import terms

    rec = MetricsRecorder()
    summary = train(cfg, tmp_path / "run", callbacks=[rec], progress=False)
    assert summary["iterations"] == 3 and set(summary["n_params"]) == {"policy", "ref"}
    assert {"eval/pass1_greedy", "eval/all_equal_groups", "eval/direct"} <= set(run_metric_names(cfg))
    # greedy pass@1 by length: one metric per length of the options' range (2..6), declared and logged at every
    # evaluation; weighted by how many held-out problems have each length they give back the overall greedy pass@1
    by_len = [f"eval/pass1_greedy_t{n}" for n in range(2, 7)]
    assert set(by_len) <= run_metric_names(cfg) and set(by_len) <= set(rec.history)
    eval_terms = [terms(e) for e in heldout[:cfg.eval.num_prompts]]
    count = {n: eval_terms.count(n) for n in range(2, 7)}
    for i, (step, overall) in enumerate(rec.history["eval/pass1_greedy"]):
        parts = {n: rec.history[f"eval/pass1_greedy_t{n}"][i] for n in range(2, 7)}
        assert all(p[0] == step for p in parts.values())
        assert sum(count[n] * parts[n][1] for n in count if count[n]) / sum(count.values()) == pytest.approx(overall)
        assert all(math.isnan(parts[n][1]) for n in count if not count[n])
    # and what the run records is exactly what harness.rl.metrics declares for this task
    from tests.test_ppo import _recorded_names

    declared = {m for m in run_metric_names(cfg) if not m.startswith(("matched_kl/", "pair_matched_kl/", "pair_matched_responses/"))}
    assert _recorded_names(rec, summary) == declared


def test_bench_reasoning_reports_the_sft_and_final_evaluations_it_ran(isolated_results, tmp_path):
    """``make bench-reasoning``'s numbers are the run's own first and last held-out evaluations (smoke scale)."""
    import json

    from harness.bench.reasoning import run_bench_reasoning

    lines = []
    res = run_bench_reasoning(["ppo.total_iterations=2"], scale="smoke", out_dir=tmp_path, echo=lines.append)
    run = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert res["grpo_pass1_greedy"] == run["eval_final"]["pass1_greedy"] and res["iterations"] == 2
    assert res["sft_pass1_sampled"] == run["initial"]["gold"] and res["grpo_pass1_sampled"] == run["eval_final"]["gold"]
    assert res["lift"] == res["grpo_pass1_greedy"] - res["sft_pass1_greedy"]
    assert json.loads((tmp_path / "summary.json").read_text()) == res and lines[-1] == f"lift={res['lift']:.3f}"
    # every evaluation (iterations 0, 1, 2 at the smoke scale's every=1) with its time into the run, in order
    assert [c[0] for c in res["curve"]] == [0, 1, 2] and res["curve"][0][1] == res["sft_pass1_greedy"]
    assert res["curve"][-1][1] == res["grpo_pass1_greedy"]
    assert 0 < res["curve"][0][2] < res["curve"][1][2] < res["curve"][2][2] <= res["run_wall_s"]
    from harness.bench.reasoning import first_lift

    want = first_lift([tuple(c) for c in res["curve"]], 0.15)
    assert res["lift_reached"] == ({"iteration": want[0], "seconds": want[1]} if want else None)


def test_pass1_by_terms_by_hand():
    """Four problems of 2, 2, 3 and 5 terms, correct 1, 0, 1, 1: by length 2 → 0.5, 3 → 1, 4 → NaN (none), 5 → 1;
    a length outside the range, or lists of different lengths, are refused."""
    from harness.tasks.chain_sum.task import pass1_by_terms, terms_metrics

    got = pass1_by_terms([1.0, 0.0, 1.0, 1.0], [2, 2, 3, 5], 2, 5)
    assert list(got) == [2, 3, 4, 5] and got[2] == 0.5 and got[3] == 1.0 and math.isnan(got[4]) and got[5] == 1.0
    assert terms_metrics(2, 4) == ("pass1_greedy_t2", "pass1_greedy_t3", "pass1_greedy_t4")
    with pytest.raises(ValueError, match=r"\[6\] terms lie outside .*2\.\.5"):
        pass1_by_terms([1.0], [6], 2, 5)
    with pytest.raises(ValueError, match="correct has 2 entries but n_terms 1"):
        pass1_by_terms([1.0, 0.0], [2], 2, 5)


def test_first_lift_by_hand():
    """pass@1 0.20 → 0.30 (+0.10) → 0.36 (+0.16) → 0.50: the target 0.15 is first reached at iteration 20, 250 s;
    exactly at the target counts (0.35 − 0.20 in floats is 0.1499…); a target never reached gives None."""
    from harness.bench.reasoning import first_lift

    curve = [(0, 0.20, 10.0), (10, 0.30, 130.0), (20, 0.36, 250.0), (30, 0.50, 370.0)]
    assert first_lift(curve, 0.15) == (20, 250.0)
    assert first_lift([(0, 0.20, 10.0), (10, 0.35, 130.0)], 0.15) == (10, 130.0)
    assert first_lift(curve, 0.40) is None and first_lift([], 0.15) is None
    assert first_lift([(0, 0.5, 1.0)], 0.0) is None  # the SFT evaluation itself is no lift


def test_direct_answer_traces_hand_example_and_exact_fraction():
    from harness.tasks.chain_sum.sft import sft_completions

    e = {"question": "q", "answer": "41", "metadata": {"expression": "12 + 34 - 5"}}
    assert direct_answer(e) == " <answer>41</answer>"
    train = make_problems(50, 1, seed=3)[0]
    direct = direct_indices(50, 0.3, seed=7)
    assert len(direct) == 15 and direct == direct_indices(50, 0.3, seed=7) and direct <= set(range(50))
    assert direct_indices(50, 0.0, seed=7) == set()
    done = sft_completions(train, 0.3, seed=7)
    assert [i for i, c in enumerate(done) if c == direct_answer(train[i])] == sorted(direct)
    assert all(c == scratchpad(train[i]) for i, c in enumerate(done) if i not in direct)
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\]"):
        direct_indices(10, 1.5, seed=0)


def test_direct_traces_only_for_problems_with_enough_terms():
    """``direct_min_terms``: the fraction applies to the eligible problems only (round(0.5 · m) of the m with ≥ 3
    terms), and every problem with fewer terms keeps its scratchpad."""
    from harness.tasks.chain_sum.problems import terms
    from harness.tasks.chain_sum.sft import sft_completions

    train = make_problems(200, 1, seed=5)[0]
    long_ones = [i for i, e in enumerate(train) if terms(e) >= 3]
    assert 0 < len(long_ones) < 200
    done = sft_completions(train, 0.5, seed=2, min_terms=3)
    direct = [i for i, c in enumerate(done) if c == direct_answer(train[i])]
    assert direct == sorted(direct_indices(200, 0.5, 2, long_ones)) and len(direct) == round(0.5 * len(long_ones))
    assert all(terms(train[i]) >= 3 for i in direct)
    assert all(done[i] == scratchpad(train[i]) for i in range(200) if terms(train[i]) == 2)
    with pytest.raises(ValueError, match=r"eligible indices must lie in range\(5\)"):
        direct_indices(5, 0.5, 0, [3, 7])


@pytest.mark.slow
def test_a_reasoning_report_speaks_of_its_verifier_and_stays_plain_text(isolated_results):
    """A smoke-scale reasoning ablation's report: the sample table names the exact-match reward and the answer
    format (not an RM score and VADER), the frontier section says there is no proxy and no best-of-n reference
    (and asks for no `bon` stage), and the smoke policy's sampled bytes (control characters among them) reach the
    report only as escapes."""
    import unicodedata

    from harness.experiments.ablate import run_ablation

    report = run_ablation("reasoning_loss_agg", scale="smoke", workers=1, progress=False)
    text = report.read_text(encoding="utf-8")
    assert text.count("| prompt | response | reward (exact match) | answer format (0/1) |") == 2  # one per variant
    assert "RM score" not in text and "VADER" not in text and "No best-of-n curve" not in text
    assert "This task is scored by a verifier, not a learned reward model" in text
    assert ("**One draw:** every run here uses the same pipeline draw, so the verdicts below hold for this draw's SFT "
            "policy") in text  # chain_sum has one draw: its verdicts are conditional on it, and the report says so
    # the smoke scale evaluates every run on the same 16 held-out problems: the verdicts are conditional on them too, and
    # a 0/1 mean over 16 prompts moves by up to 0.5 / √16 = 0.125 from one prompt set to another
    assert ("**Fixed evaluation prompts:** every run is evaluated on the same 16 held-out prompts (`eval.num_prompts`; 2 "
            "sampled responses each, and one greedy), so each interval and verdict below is over seeds given those prompts"
            ) in text and "one arm's mean over 16 prompts alone moves by up to 0.125 (the SE at a rate of 0.5)" in text
    frontier = text.split("## Reward vs KL frontier")[1].split("## Failed runs")[0]
    assert frontier.count("| gold |") == 2 and "| proxy |" not in frontier  # its proxy is its gold: one row each
    assert "`gold` (and `proxy`, the same number) is the exact-match reward of the sampled responses" in text
    assert not [c for c in text if unicodedata.category(c) in ("Cc", "Cf") and c != "\n"]
    # its learning curves are the task's: pass@1 first, the lengths of correct and incorrect responses among them
    from harness.experiments.spec import load_spec
    from harness.reporting.plots import CURVE_METRICS, curve_metrics

    mine = curve_metrics(load_spec("reasoning_loss_agg", validate_configs=False))
    assert mine[0] == "eval/pass1_greedy" and {"eval/length_correct", "eval/length_incorrect"} <= set(mine)
    assert curve_metrics(load_spec("kl_placement", validate_configs=False)) == CURVE_METRICS
    assert (report.parent / "learning_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_md_cell_by_hand():
    from harness.reporting.render import md_cell

    assert md_cell("a |\n  b") == "a \\| b"
    assert md_cell("x\x00y\x1bz\u200bw") == "x\\x00y\\x1bz\\u200bw"  # NUL, ESC, zero-width space
    assert md_cell("café – ok") == "café – ok"  # printable non-ASCII is kept
