"""Batch composition (ScaleRL, arXiv 2510.13786): zero-variance filtering and No-Positive-Resampling, by hand and in
the loop."""

from __future__ import annotations

import math

import pytest
import torch

from harness.rl.components.batch_filters import draw_active, retired_prompts, update_pass_counts, zero_variance_rows


def test_zero_variance_rows_hand_values():
    # three groups of two: (1, 1) all equal, (0, 1) informative, (0, 0) all equal
    got = zero_variance_rows(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), 2)
    assert got.tolist() == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="group_size must be ≥ 2"):
        zero_variance_rows(torch.ones(4), 1)
    with pytest.raises(ValueError, match="multiple of group_size"):
        zero_variance_rows(torch.ones(5), 2)


def test_pass_counts_and_retirement_by_hand():
    """Pool of 4 prompts, groups of 2. Batch 1: prompt 2 twice right, prompt 0 once right; batch 2: prompt 2 once
    right, prompt 1 twice wrong. Running rates: prompt 0 1/2, prompt 1 0/2, prompt 2 3/4, prompt 3 unseen."""
    passed, seen = torch.zeros(4), torch.zeros(4)
    passed, seen = update_pass_counts(passed, seen, torch.tensor([2, 0]), torch.tensor([1.0, 1.0, 1.0, 0.0]), 2)
    assert passed.tolist() == [1.0, 0.0, 2.0, 0.0] and seen.tolist() == [2.0, 0.0, 2.0, 0.0]
    assert retired_prompts(passed, seen, 0.9).tolist() == [False, False, True, False]  # 2/2 ≥ 0.9
    passed, seen = update_pass_counts(passed, seen, torch.tensor([2, 1]), torch.tensor([1.0, 0.0, 0.0, 0.0]), 2)
    assert passed.tolist() == [1.0, 0.0, 3.0, 0.0] and seen.tolist() == [2.0, 2.0, 4.0, 0.0]
    assert retired_prompts(passed, seen, 0.9).tolist() == [False, False, False, False]  # 3/4 < 0.9: back in
    assert retired_prompts(passed, seen, 0.75).tolist() == [False, False, True, False]  # 3/4 ≥ 0.75
    # a prompt drawn twice in one batch counts both groups
    p2, s2 = update_pass_counts(torch.zeros(2), torch.zeros(2), torch.tensor([1, 1]), torch.tensor([1.0, 0.0, 1.0, 1.0]), 2)
    assert p2.tolist() == [0.0, 3.0] and s2.tolist() == [0.0, 4.0]
    with pytest.raises(ValueError, match="must be 1 groups of 2"):
        update_pass_counts(torch.zeros(2), torch.zeros(2), torch.tensor([1]), torch.ones(3), 2)
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\]"):
        retired_prompts(passed, seen, 1.5)


def test_draw_active_matches_the_tasks_draw_until_a_prompt_retires():
    from harness.tasks.base import draw_prompt_rows

    pool = torch.arange(10).unsqueeze(1)
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    none = torch.zeros(10, dtype=torch.bool)
    assert draw_active(10, 4, a, none).tolist() == draw_prompt_rows(pool, 4, b).flatten().tolist()
    retired = torch.tensor([True] * 8 + [False, False])
    got = draw_active(10, 5, torch.Generator().manual_seed(0), retired)  # 2 active, 5 asked: with replacement
    assert set(got.tolist()) <= {8, 9} and len(got) == 5
    with pytest.raises(ValueError, match="every one of the 10 prompts is retired"):
        draw_active(10, 1, a, torch.ones(10, dtype=torch.bool))


def test_filtered_rows_count_neither_in_the_loss_nor_in_its_normaliser():
    """The loss of a minibatch with zero-variance filtering is the loss of its kept rows alone (token-mean and
    seq-mean-token-mean), and the step is taken with their gradients."""
    from harness.rl.components.aggregation import agg_loss

    loss = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [5.0, 7.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    rows = torch.tensor([1.0, 0.0, 1.0])
    kept = mask * rows[:, None]
    # token-mean over the kept tokens: (1 + 2 + 5 + 7 + 9) / 5 = 4.8; seq-mean-token-mean: (1.5 + 7) / 2 = 4.25
    assert agg_loss(loss, kept, "token-mean", num_tokens=kept.sum()).item() == pytest.approx(4.8)
    assert agg_loss(loss, kept, "seq-mean-token-mean", num_seqs=2).item() == pytest.approx(4.25)
    assert agg_loss(loss[[0, 2]], mask[[0, 2]], "seq-mean-token-mean").item() == pytest.approx(4.25)


@pytest.mark.parametrize("option", ["ppo.zero_variance_filter=true", "ppo.no_positive_resampling=0.5"])
def test_each_filter_runs_the_loop_and_logs_what_it_consumed(option, isolated_results, tmp_path):
    from harness.rl.callbacks import MetricsRecorder
    from harness.rl.metrics import run_metric_names
    from harness.rl.runner import run
    from tests.test_chain_sum import _chain_cfg

    cfg = _chain_cfg(["ppo.adv_estimator=grpo", "ppo.total_iterations=2", option])
    rec = MetricsRecorder()
    run(cfg, tmp_path / "run", callbacks=[rec], progress=False)
    G, B = cfg.ppo.num_generations, cfg.ppo.batch_size
    assert [v for _, v in rec.history["batch/responses_sampled"]] == [B, 2 * B]
    assert [v for _, v in rec.history["batch/prompts_sampled"]] == [B // G, 2 * B // G]
    key = "batch/groups_in_loss" if "zero_variance" in option else "batch/prompts_retired"
    assert key in run_metric_names(cfg) and len(rec.history[key]) == 2
    if key == "batch/groups_in_loss":  # the all-equal groups are out of the loss, so none is "trained"
        assert all(0.0 <= v <= 1.0 for _, v in rec.history[key])
        assert [v for _, v in rec.history["objective/all_equal_groups_trained"]] == [0.0, 0.0]
    else:
        assert all(0 <= v <= B // G * 2 and math.isfinite(v) for _, v in rec.history[key])


def test_filters_are_refused_with_a_critic_or_together():
    from harness.config import ConfigError, build_config

    with pytest.raises(ConfigError, match="ppo.zero_variance_filter needs groups of responses per prompt"):
        build_config({"ppo": {"adv_estimator": "gae", "zero_variance_filter": True}})
    with pytest.raises(ConfigError, match="ppo.no_positive_resampling needs groups"):
        build_config({"ppo": {"adv_estimator": "gae", "no_positive_resampling": 0.9}})
    with pytest.raises(ConfigError, match="choose one"):
        build_config({"ppo": {"adv_estimator": "grpo", "zero_variance_filter": True, "dynamic_sampling": True}})
