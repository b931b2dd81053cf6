"""The chain-sum task's problems (reasoning-gym 0.1.25), scratchpad traces and exact-match verifier."""

from __future__ import annotations

import random

import pytest

from harness.tasks.chain_sum.problems import (HELDOUT_SEED_OFFSET, dataset, extract, make_problems, prompt_text, reward,
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
