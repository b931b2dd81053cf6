"""The PPO loop: every registered variant runs, determinism, dropout/ratio, KL placement, NaN stop."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import smoke_config
from typer.testing import CliRunner

from harness.rl.callbacks import MetricsRecorder
from harness.cli import app
from harness.config import ConfigError, flatten
from harness.rl.components.advantages import ADV_ESTIMATORS
from harness.rl.components.aggregation import agg_loss
from harness.rl.components.critic import CRITIC_INIT
from harness.rl.components.dropout import DROPOUT
from harness.rl.components.kl import KL_CONTROLLERS, KL_ESTIMATORS, KL_PLACEMENTS
from harness.rl.components.aggregation import LOSS_AGG
from harness.rl.components.losses import POLICY_LOSSES
from harness.rl.components.whitening import masked_mean, masked_whiten
from harness.errors import TrainingDivergedError
from harness.rl.ppo import compute_advantages, train
from harness.rl.runner import run
from harness.rl.metrics import run_metric_names
from harness.rl.rollout import (
    SAMPLERS,
    entropy_from_logits,
    inverse_cdf_draw,
    response_logprobs_from_logits,
    sample,
    selective_log_softmax,
)

REQUIRED_METRICS = {
    "objective/score", "objective/gold_lexicon", "objective/kl", "objective/entropy", "policy/clipfrac",
    "policy/approxkl", "policy/ratio_mean", "policy/ratio_std", "loss/policy", "response/length",
    "response/eos_rate", "perf/tokens_per_s", "time/generate", "time/score", "time/forward", "time/update",
}
CRITIC_METRICS = {"val/clipfrac", "val/explained_variance", "loss/value"}


def _variant_cases() -> list[list[str]]:
    cases = []
    for axis, reg in [("kl_placement", KL_PLACEMENTS), ("kl_estimator", KL_ESTIMATORS), ("kl_ctl", KL_CONTROLLERS),
                      ("loss_agg", LOSS_AGG), ("dropout", DROPOUT), ("critic_init", CRITIC_INIT),
                      ("adv_estimator", ADV_ESTIMATORS)]:
        cases += [[f"ppo.{axis}={name}"] for name in reg.names()]
    cases += [["ppo.whiten_advantages=false"], ["ppo.whiten_rewards=true"], ["ppo.normalize_reward=false"],
              ["ppo.reward_clip=0.5"], ["ppo.value_loss=mse"], ["ppo.truncate_after_eos=false"],
              ["ppo.missing_eos_penalty=null"], ["ppo.pad_equals_eos=true"],
              # the other policy losses and KL as a loss with the importance weight run in test_ablate's smoke
              # ablations (policy_loss, kl_loss_estimator); the unclipped one as RLOO's authors ran it:
              ["ppo.policy_loss=reinforce", "ppo.num_ppo_epochs=1", "ppo.num_minibatches=1"], ["ppo.kl_placement=loss", "ppo.kl_estimator=k3"],
              ["ppo.gradient_accumulation_steps=2"], ["ppo.sampler=multinomial"], ["ppo.fused_gelu=false"],
              ["ppo.adv_estimator=grpo", "ppo.dynamic_sampling=true"], ["ppo.overlong_buffer=4"]]
    return cases


@pytest.mark.parametrize("overrides", _variant_cases(), ids=lambda o: ",".join(o))
def test_every_variant_runs_at_smoke_scale(smoke_pipeline, tmp_path, overrides):
    cfg = smoke_config(overrides + ["ppo.total_iterations=2"])
    rec = MetricsRecorder()
    summary = run(cfg, tmp_path, callbacks=[rec], progress=False)
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "config.yaml").is_file()
    for part in ("initial", "final"):
        assert all(math.isfinite(v) for v in summary[part].values()), summary[part]
    needs_critic = ADV_ESTIMATORS.meta(cfg.ppo.adv_estimator)["needs_critic"]
    expected = REQUIRED_METRICS | (CRITIC_METRICS if needs_critic else set())
    assert expected <= set(rec.history), expected - set(rec.history)
    assert [i for i, _ in rec.history["objective/kl"]] == [0, 1]
    assert ("critic" in summary["n_params"]) == needs_critic
    # what a run records is exactly what harness.rl.metrics declares (specs are checked against it)
    declared = run_metric_names(cfg) - {m for m in run_metric_names(cfg) if m.startswith(("matched_kl/", "pair_matched_kl/", "pair_matched_responses/"))}
    assert _recorded_names(rec, summary) == declared


def _recorded_names(rec: MetricsRecorder, summary: dict) -> set[str]:
    """The metric names MLflow receives from one run (``harness.infra.tracking.MLflowCallback``): every
    per-iteration and evaluation metric, ``last/<per-iteration metric>`` and the summary's numeric leaves."""
    per_iteration = {k for k in rec.history if not k.startswith("eval/")}
    leaves = {k.replace(".", "/") for k, v in flatten(summary).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return set(rec.history) | {f"last/{k}" for k in per_iteration} | leaves


def test_a_policy_loss_defined_here_is_selectable_from_yaml_with_no_other_edit(smoke_pipeline, tmp_path):
    import yaml

    from harness.config import deep_update, load_config
    from harness.config.presets import scale_overrides

    @POLICY_LOSSES.register("test_half_vanilla")
    def half_vanilla(logprobs, old_logprobs, advantages, response_mask, *, cliprange, cliprange_high, clip_ratio_c,
                     knobs=None):
        loss, clipped, ratio = POLICY_LOSSES.get("vanilla")(logprobs, old_logprobs, advantages, response_mask,
                                                            cliprange=cliprange, cliprange_high=cliprange_high,
                                                            clip_ratio_c=clip_ratio_c)
        calls.append(loss.shape)
        return 0.5 * loss, clipped, ratio

    calls: list = []
    try:
        spec = deep_update(scale_overrides("smoke"), {"ppo": {"policy_loss": "test_half_vanilla", "total_iterations": 1}})
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(spec))
        cfg = load_config(tmp_path / "c.yaml")
        assert cfg.ppo.policy_loss == "test_half_vanilla"
        run(cfg, tmp_path / "run", progress=False)
        assert len(calls) == cfg.ppo.num_ppo_epochs * cfg.ppo.num_minibatches * cfg.ppo.gradient_accumulation_steps
    finally:
        del POLICY_LOSSES._items["test_half_vanilla"], POLICY_LOSSES._meta["test_half_vanilla"]
    r = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "x"), "ppo.policy_loss=test_half_vanilla"])
    assert r.exit_code == 2 and "ppo.policy_loss: unknown variant 'test_half_vanilla'; choose from: vanilla" in r.output


def test_evaluation_never_changes_training(smoke_pipeline, tmp_path):
    """The held-out evaluation draws from its own generator: evaluating every iteration or only at the
    ends gives the same training metrics, and the same evaluations where both evaluate."""
    recs = {}
    for every in (1, 100):
        recs[every] = MetricsRecorder()
        summary = run(smoke_config([f"eval.every={every}", "ppo.total_iterations=3"]), tmp_path / str(every),
                        callbacks=[recs[every]], progress=False)
    train_keys = [k for k in recs[1].history if not k.startswith(("eval/", "time/", "perf/tokens"))]
    assert train_keys and all(recs[1].history[k] == recs[100].history[k] for k in train_keys)
    assert [i for i, _ in recs[1].history["eval/gold"]] == [0, 1, 2, 3]
    assert [i for i, _ in recs[100].history["eval/gold"]] == [0, 3]
    for k in ("eval/gold", "eval/gold_lexicon", "eval/proxy", "eval/kl", "eval/eos_rate", "eval/length"):
        ev1, ev100 = dict(recs[1].history[k]), dict(recs[100].history[k])
        assert ev1[0] == ev100[0] and ev1[3] == ev100[3]
    assert recs[100].history["eval/kl"][0][1] == 0.0  # the policy is the reference before any update
    assert summary["eval_final"]["gold"] == recs[100].history["eval/gold"][-1][1]
    assert summary["initial"]["gold"] == recs[100].history["eval/gold"][0][1]


def test_a_draw_without_kl_is_the_same_draw_and_spends_no_forward_pass(smoke_pipeline):
    """``eval_rollout(with_kl=False)`` (the pass@k draw) returns the same prompts, responses, mask and EOS flags as
    the draw with its KL, bit for bit, and calls neither model's forward pass over the responses; asking it for the
    entropy without the KL is refused by name."""
    import contextlib
    from unittest import mock

    from harness.rl import evaluation
    from harness.rl.models import load_tokenizer
    from harness.rl.run_models import assemble_models
    from harness.tasks import TASKS

    cfg = smoke_config(["ppo.adv_estimator=grpo"])  # no critic: the policy and the reference are all it loads
    tok = load_tokenizer(smoke_pipeline.tokenizer_dir)
    models = assemble_models(cfg, torch.device("cpu"), smoke_pipeline.sft_dir, "", tok, tok, 0.0)
    prompts = TASKS.get("review_sentiment")(cfg, tok).eval_prompt_ids[:5]
    args = (models, cfg, prompts, 3, torch.device("cpu"), contextlib.nullcontext, tok.eos_token_id, tok.pad_token_id)
    full = evaluation.eval_rollout(*args, samples_per_prompt=4)
    with mock.patch.object(evaluation, "response_logprobs", side_effect=AssertionError("no forward pass")):
        bare = evaluation.eval_rollout(*args, samples_per_prompt=4, with_kl=False)
    assert set(full) - set(bare) == {"kl"} and full["kl"].shape == (20,)
    for key in bare:
        assert torch.equal(full[key], bare[key]), key
    with pytest.raises(ValueError, match="with_entropy needs with_kl"):
        evaluation.eval_rollout(*args, with_entropy=True, with_kl=False)


def test_eval_summary_hand_computed():
    from harness.rl.evaluation import eval_summary

    def ev(g: float) -> dict[str, float]:
        return {"eval/gold": g, "eval/proxy": 10 * g, "eval/kl": 2 * g, "eval/eos_rate": 1.0, "eval/length": 5.0}

    s = eval_summary([(0, ev(0.1)), (2, ev(0.5)), (4, ev(0.3))], 4)
    assert s["eval_final"] == {"gold": 0.3, "proxy": 3.0, "kl": 0.6, "eos_rate": 1.0, "length": 5.0, "collapsed": 0.0,
                               "degenerate": 0.0}
    assert s["eval_peak"] == {"gold": 0.5, "iteration": 2.0, "kl": 1.0}  # the KL at the peak evaluation
    assert s["eval_drop"]["gold"] == pytest.approx(0.2)  # 0.5 at the peak − 0.3 at the end
    # trapezoids: 2·(0.1 + 0.5)/2 + 2·(0.5 + 0.3)/2 = 1.4, over 4 iterations
    assert s["eval_auc"]["gold"] == pytest.approx(0.35)
    down = eval_summary([(0, ev(0.2)), (5, ev(0.4)), (10, ev(0.1))], 10)
    assert down["eval_final"]["collapsed"] == 1.0 and down["eval_peak"]["iteration"] == 5.0
    tie = eval_summary([(0, ev(0.2)), (5, ev(0.4)), (10, ev(0.4))], 10)
    assert tie["eval_peak"]["iteration"] == 5.0  # the first iteration that reached the peak
    with pytest.raises(ValueError):
        eval_summary([], 10)
    # degenerate: "." + EOS everywhere (length 2), or one phrase repeated (distinct-2 0.05), whatever the gold says
    dot = eval_summary([(0, ev(0.1)), (4, {**ev(0.3), "eval/length": 2.0})], 4)["eval_final"]
    assert dot["degenerate"] == 1.0 and dot["collapsed"] == 0.0
    loop = eval_summary([(0, ev(0.1)), (4, {**ev(0.3), "eval/distinct_2": 0.05})], 4)["eval_final"]
    assert loop["degenerate"] == 1.0 and loop["distinct_2"] == 0.05
    fine = eval_summary([(0, ev(0.1)), (4, {**ev(0.3), "eval/length": 2.5, "eval/distinct_2": 0.1})], 4)["eval_final"]
    assert fine["degenerate"] == 0.0
    # a task without a distinct floor (chain_sum: digits and signs only) is judged by length alone
    digits = eval_summary([(0, ev(0.1)), (4, {**ev(0.3), "eval/distinct_2": 0.007})], 4, distinct_floor=None)
    assert digits["eval_final"]["degenerate"] == 0.0


def test_distinct_n_by_hand():
    """Responses [5 6 5 6 EOS], [5 6 7 EOS pad], [9 EOS pad pad pad] (EOS = 0): unigrams 5 6 5 6 | 5 6 7 | 9 → 4
    distinct of 8; bigrams 56 65 56 | 56 67 → 3 distinct of 5; trigrams 565 656 | 567 → 3 of 3; EOS never counts
    (with it, the bigrams gain 60, 70, 90: 6 distinct of 8)."""
    from harness.rl.evaluation import distinct_n

    r = torch.tensor([[5, 6, 5, 6, 0], [5, 6, 7, 0, 1], [9, 0, 1, 1, 1]])
    m = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    assert distinct_n(r, m, 1, eos_id=0) == 4 / 8 and distinct_n(r, m, 2, eos_id=0) == 3 / 5
    assert distinct_n(r, m, 3, eos_id=0) == 1.0 and distinct_n(r, m, 2) == 6 / 8
    dots = torch.tensor([[4, 0], [4, 0]])  # "." and EOS: no bigram at all
    assert distinct_n(dots, torch.ones_like(dots), 2, eos_id=0) == 0.0
    with pytest.raises(ValueError, match="n must be ≥ 1"):
        distinct_n(r, m, 0)
    with pytest.raises(ValueError, match="differ"):
        distinct_n(r, m[:, :3], 1)


def test_rep_n_and_msttr_by_hand():
    """The same responses as above (EOS = 0 not counted): rep-1 per response 1 − 2/4, 1 − 3/3, 1 − 1/1 → mean
    (0.5 + 0 + 0) / 3; rep-2: [56 65 56] → 1 − 2/3, [56 67] → 0, [9] has no bigram (left out) → (1/3) / 2.
    MSTTR over the pooled tokens 5 6 5 6 5 6 7 9 with segments of 3: [5 6 5] 2/3, [6 5 6] 2/3 (the last 2 dropped)
    → 2/3; with segments of 10 (more than the 8 tokens) the type-token ratio 4/8."""
    from harness.rl.evaluation import msttr, rep_n

    r = torch.tensor([[5, 6, 5, 6, 0], [5, 6, 7, 0, 1], [9, 0, 1, 1, 1]])
    m = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    assert rep_n(r, m, 1, eos_id=0) == pytest.approx(0.5 / 3) and rep_n(r, m, 2, eos_id=0) == pytest.approx(1 / 6)
    assert rep_n(r, m, 4, eos_id=0) == 0.0  # the one 4-gram (5 6 5 6) is unique
    assert msttr(r, m, segment=3, eos_id=0) == pytest.approx(2 / 3) and msttr(r, m, segment=10, eos_id=0) == 0.5
    loop = torch.tensor([[7, 7, 7, 7, 7, 7]])  # one token looped: rep-1 5/6, MSTTR 1/3
    assert rep_n(loop, torch.ones_like(loop), 1) == pytest.approx(5 / 6) and msttr(loop, torch.ones_like(loop), 3) == 1 / 3
    with pytest.raises(ValueError, match="rep_n: n must be ≥ 1"):
        rep_n(r, m, 0)
    with pytest.raises(ValueError, match="msttr: responses"):
        msttr(r, m[:, :2], 3)


def test_top_response_share_by_hand():
    """Responses 5 6 <eos>, 5 6 <eos>, 7 <eos> (EOS = 0 not counted): "5 6" is two of the three → 2/3. With a mask
    that cuts the second before its EOS, counting EOS makes all three differ (1/3); leaving it out, 2/3 again. One
    response → 1; none → 0. Distinct-2 of the same batch, 1/2 (two bigrams, one distinct), says nothing of how many
    responses are one and the same."""
    from harness.rl.evaluation import distinct_n, top_response_share

    r = torch.tensor([[5, 6, 0], [5, 6, 0], [7, 0, 1]])
    m = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]])
    assert top_response_share(r, m, eos_id=0) == pytest.approx(2 / 3)
    cut = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]])  # the second loses its EOS: "5 6 0" vs "5 6" with EOS counted
    assert top_response_share(r, cut) == pytest.approx(1 / 3) and top_response_share(r, cut, eos_id=0) == pytest.approx(2 / 3)
    assert top_response_share(r[:1], m[:1]) == 1.0 and top_response_share(r[:0], m[:0]) == 0.0
    assert distinct_n(r, m, 2, eos_id=0) == pytest.approx(1 / 2)  # bigrams (5 6), (5 6): one distinct of two
    with pytest.raises(ValueError, match="top_response_share: responses"):
        top_response_share(r, m[:, :2])


def test_same_seed_gives_identical_metrics(smoke_pipeline, tmp_path):
    runs = []
    for k in range(2):
        rec = MetricsRecorder()
        run(smoke_config(["seed=3"]), tmp_path / str(k), callbacks=[rec], progress=False)
        runs.append({n: v for n, v in rec.history.items() if not n.startswith(("time/", "perf/tokens"))})
    assert runs[0] == runs[1]
    rec = MetricsRecorder()
    run(smoke_config(["seed=4"]), tmp_path / "other", callbacks=[rec], progress=False)
    assert rec.history["objective/score"] != runs[0]["objective/score"]


def test_ratio_is_one_on_first_minibatch_unless_dropout_or_a_temperature_mismatch(smoke_pipeline, tmp_path):
    """Before any update, π_θ = π_old: ratio exactly 1 and approx-KL 0 with dropout off and the update
    forwards at the sampling τ; dropout on, or update logprobs at τ = 1 against π_old at τ = 0.7
    (``logprob_temperature: unit``), make the first-minibatch ratio differ from 1."""
    first = {}
    cases = {"off": ["ppo.dropout=off"], "on": ["ppo.dropout=on"], "unit": ["ppo.logprob_temperature=unit"]}
    for mode, overrides in cases.items():
        rec = MetricsRecorder()
        run(smoke_config(overrides + ["ppo.total_iterations=1"]), tmp_path / mode, callbacks=[rec], progress=False)
        first[mode] = (rec.history["policy/ratio_mean_first"][0][1], rec.history["policy/approxkl_first"][0][1])
    assert first["off"] == (1.0, 0.0)
    for mode in ("on", "unit"):
        assert first[mode][0] != 1.0 and first[mode][1] > 0.0, (mode, first[mode])


def test_grpo_builds_no_critic(smoke_pipeline, tmp_path):
    summary = run(smoke_config(["ppo.adv_estimator=grpo", "ppo.total_iterations=1"]), tmp_path, progress=False)
    assert set(summary["n_params"]) == {"policy", "ref", "reward_model"}
    assert summary["n_params"]["policy"] == summary["n_params"]["ref"] > 0


def test_nan_score_stops_run_naming_quantity_and_iteration(smoke_pipeline, tmp_path, monkeypatch):
    from harness.tasks.rm_scoring import RewardModelScored

    real = RewardModelScored.score

    def nan_scores(*args, **kwargs):
        out = real(*args, **kwargs)
        return {**out, "score": torch.full_like(out["score"], float("nan"))}

    monkeypatch.setattr(RewardModelScored, "score", nan_scores)
    with pytest.raises(TrainingDivergedError, match=r"^rewards is nan at iteration 0"):
        run(smoke_config(["ppo.missing_eos_penalty=null"]), tmp_path, progress=False)


# --------------------------------------------------------------------------------------------
# KL placement: in the reward it moves the advantages; in the loss it does not, but has a gradient
# --------------------------------------------------------------------------------------------


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 5
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.float)
    logprobs = -torch.rand(B, T, generator=g) * 3
    ref_logprobs = -torch.rand(B, T, generator=g) * 3
    values = torch.randn(B, T, generator=g)
    score = torch.randn(B, generator=g)
    return score, logprobs, ref_logprobs, values, mask


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_reward_changes_advantages_kl_in_loss_does_not(estimator):
    score, logprobs, ref_logprobs, values, mask = _batch()
    p = smoke_config([f"ppo.kl_estimator={estimator}", "ppo.kl_coef=0.1"]).ppo
    adv = {}
    for placement in ("reward", "loss", "none"):
        reward_coef, loss_coef = KL_PLACEMENTS.get(placement)(p.kl_coef)
        _, adv[placement], _ = compute_advantages(p, score, logprobs, ref_logprobs, values, mask, reward_coef, 1)
    assert torch.equal(adv["loss"], adv["none"])
    assert not torch.allclose(adv["reward"], adv["none"])


def test_advantage_whitening_follows_each_estimators_recipe_unless_set():
    # GAE is whitened over the batch (N+, TRL); GRPO is not (its group std is its own normalisation): with kl_coef 0
    # and one group of 4, GRPO's advantage of row i is (R_i − mean)/(std + 1e-6), the raw scores' z-score
    score = torch.tensor([1.0, 0.0, 0.0, 1.0])
    _, logprobs, ref_logprobs, values, mask = _batch()
    grpo = smoke_config(["ppo.adv_estimator=grpo", "ppo.kl_coef=0.0"]).ppo
    assert grpo.whiten_advantages is None and not grpo.advantage_whitening
    assert grpo.model_dump()["whiten_advantages"] is False  # the dump (and hash) holds the resolved recipe
    _, adv, _ = compute_advantages(grpo, score, logprobs, ref_logprobs, None, mask, 0.0, 4)
    z = (score - 0.5) / (torch.tensor(1 / 3).sqrt() + 1e-6)  # unbiased std of [1, 0, 0, 1] = √(1/3)
    torch.testing.assert_close(adv, z[:, None] * mask)
    forced = smoke_config(["ppo.adv_estimator=grpo", "ppo.kl_coef=0.0", "ppo.whiten_advantages=true"]).ppo
    _, adv_w, _ = compute_advantages(forced, score, logprobs, ref_logprobs, None, mask, 0.0, 4)
    torch.testing.assert_close(adv_w, masked_whiten(adv, mask))
    gae = smoke_config([]).ppo
    assert gae.advantage_whitening and gae.model_dump()["whiten_advantages"] is True
    _, adv_gae, _ = compute_advantages(gae, score, logprobs, ref_logprobs, values, mask, 0.0, 1)
    torch.testing.assert_close(masked_mean(adv_gae, mask), torch.tensor(0.0), atol=1e-6, rtol=0)


def test_trl_loss_type_is_an_alias_of_the_aggregation_it_names():
    from harness.config import build_config

    for name, agg in [("grpo", "seq-mean-token-mean"), ("bnpo", "token-mean"), ("dapo", "token-mean"),
                      ("dr_grpo", "seq-mean-token-sum-norm")]:
        cfg = build_config({}, [f"ppo.loss_type={name}"])
        assert cfg.ppo.loss_agg == agg
        assert cfg.hash() == build_config({}, [f"ppo.loss_agg={agg}"]).hash()  # one config, one hash
    # a later layer's alias replaces an earlier loss_agg, and the other way round
    assert build_config({"ppo": {"loss_agg": "token-mean"}}, ["ppo.loss_type=grpo"]).ppo.loss_agg == "seq-mean-token-mean"
    assert build_config({"ppo": {"loss_type": "grpo"}}, ["ppo.loss_agg=token-mean"]).ppo.loss_agg == "token-mean"
    with pytest.raises(ConfigError, match="ppo.loss_type 'grpo' means ppo.loss_agg 'seq-mean-token-mean'"):
        build_config({"ppo": {"loss_type": "grpo", "loss_agg": "token-mean"}})
    with pytest.raises(ConfigError, match="allowed: grpo, bnpo, dapo, dr_grpo"):
        build_config({}, ["ppo.loss_type=gspo"])
    # the alias lives under ppo only: keys of those names elsewhere merge like any other key
    from harness.config import deep_update

    assert deep_update({"x": {"loss_agg": 1}}, {"x": {"loss_type": 2}}) == {"x": {"loss_agg": 1, "loss_type": 2}}
    assert deep_update({"ppo": {"loss_agg": 1}}, {"ppo": {"loss_type": 2}}) == {"ppo": {"loss_type": 2}}


def test_kl_in_loss_has_a_gradient():
    _, logprobs, ref_logprobs, _, mask = _batch()
    new_logprobs = logprobs.clone().requires_grad_(True)
    kl_loss = agg_loss(KL_ESTIMATORS.get("k3")(new_logprobs, ref_logprobs), mask, "token-mean")
    kl_loss.backward()
    # d/dx [exp(r - x) - 1 + x - r] = 1 - exp(r - x), on masked tokens, / number of tokens
    expected = (1 - torch.exp(ref_logprobs - logprobs)) * mask / mask.sum()
    torch.testing.assert_close(new_logprobs.grad, expected)
    assert new_logprobs.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------
# Rollout primitives against independent references
# --------------------------------------------------------------------------------------------


def test_selective_log_softmax_matches_log_softmax_and_trl():
    from trl.trainer.utils import selective_log_softmax as trl_sls

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 11, generator=g) * 3
    index = torch.randint(0, 11, (3, 4), generator=g)
    ours = selective_log_softmax(logits, index)
    ref = torch.log_softmax(logits, -1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(ours, trl_sls(logits, index))


@pytest.mark.parametrize("B, L, V, P, tau", [(3, 7, 11, 3, 0.7), (8, 12, 300, 4, 0.7), (5, 9, 50, 1, 1.0), (4, 6, 40, 2, 0.3)])
def test_fused_response_logprobs_equal_autograd_bit_for_bit(B, L, V, P, tau):
    g = torch.Generator().manual_seed(B * 100 + V)
    logits = torch.randn(B, L, V, generator=g) * 4
    idx = torch.randint(0, V, (B, L - P), generator=g)
    upstream = torch.randn(B, L - P, generator=g)
    a = logits.clone().requires_grad_()
    ref = selective_log_softmax(a[:, P - 1 : -1] / tau, idx)  # plain autograd
    (ref * upstream).sum().backward()
    b = logits.clone().requires_grad_()
    fused = response_logprobs_from_logits(b, idx, P, tau)
    (fused * upstream).sum().backward()
    assert torch.equal(fused, ref) and torch.equal(b.grad, a.grad)
    assert torch.equal(b.grad[:, : P - 1], torch.zeros_like(b.grad[:, : P - 1])) and torch.equal(b.grad[:, -1], torch.zeros_like(b.grad[:, -1]))
    # the analytic gradient: (onehot − softmax(z)) · g / τ on the response rows
    z = logits[:, P - 1 : -1].double() / tau
    expected = (torch.nn.functional.one_hot(idx, V).double() - torch.softmax(z, -1)) * upstream.double().unsqueeze(-1) / tau
    torch.testing.assert_close(b.grad[:, P - 1 : -1].double(), expected, rtol=1e-5, atol=1e-6)


def test_entropy_matches_definition():
    logits = torch.tensor([[[0.0, 0.0]], [[math.log(3.0), 0.0]]])  # p = (1/2,1/2) and (3/4,1/4)
    h = entropy_from_logits(logits)
    expected = torch.tensor([[math.log(2)], [-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]])
    torch.testing.assert_close(h, expected)


def test_inverse_cdf_draw_hand_example():
    # softmax(log p) = p = (0.1, 0.2, 0, 0.7): cumulative 0.1, 0.3, 0.3, 1.0
    logits = torch.log(torch.tensor([0.1, 0.2, 1e-45, 0.7])).expand(6, 4)
    logits = torch.where(torch.isinf(logits), torch.full_like(logits, -1e30), logits)
    u = torch.tensor([[0.0], [0.09], [0.1001], [0.2999], [0.3001], [0.999]])
    assert inverse_cdf_draw(logits, u).squeeze(1).tolist() == [0, 0, 1, 1, 3, 3]  # token 2 (p=0) never
    # temperature: z/τ with τ=0.5 squares the weights: (1, 4, 0, 49)/54
    assert inverse_cdf_draw(logits, torch.tensor([[1 / 54 - 1e-4], [5 / 54 + 1e-4]] + [[0.0]] * 4), 0.5)[:2].squeeze(1).tolist() == [0, 3]
    with pytest.raises(ValueError, match=r"u must have shape \[6, 1\]"):
        inverse_cdf_draw(logits, torch.zeros(6))


@pytest.mark.parametrize("sampler", SAMPLERS.names())
def test_samplers_draw_from_softmax_over_temperature(sampler):
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).expand(40_000, 5)
    draws = SAMPLERS.get(sampler)(logits, 0.7, g).squeeze(1)
    freq = torch.bincount(draws, minlength=5).double() / draws.numel()
    expected = torch.softmax(logits[0].double() / 0.7, -1)
    # 4 standard errors of a binomial proportion at n = 40,000
    assert torch.all((freq - expected).abs() <= 4 * (expected * (1 - expected) / draws.numel()).sqrt() + 1e-12), (freq, expected)


def test_sample_is_reproducible_and_names_unknown_sampler():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=17, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    prompts = torch.randint(0, 17, (3, 4))
    a = sample(lm, prompts, 5, 0.7, torch.Generator().manual_seed(1))
    b = sample(lm, prompts, 5, 0.7, torch.Generator().manual_seed(1))
    assert a.shape == (3, 5) and torch.equal(a, b)
    with pytest.raises(KeyError, match="ppo.sampler: unknown variant 'gumbel'; choose from: inverse_cdf, multinomial"):
        sample(lm, prompts, 5, 0.7, sampler="gumbel")


# --------------------------------------------------------------------------------------------
# Bad input: one clear line, before any compute
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, needle",
    [
        ("ppo.loss_agg=token_sum", "ppo.loss_agg: unknown variant 'token_sum'"),
        ("ppo.adv_estimator=ppo", "choose from: " + ", ".join(ADV_ESTIMATORS.names())),
        ("ppo.cliprange=0", "ppo.cliprange"),
        ("ppo.lam=1.5", "ppo.lam"),
        ("ppo.kl_coef=-0.1", "ppo.kl_coef"),
        ("ppo.batch_size=33", "divisible"),
        ("ppo.klcoef=0.1", "unknown key; allowed keys:"),
        ("ppo.whiten_advantages=maybe", "ppo.whiten_advantages"),
        ("ppo.sampler=gumbel", "choose from: " + ", ".join(SAMPLERS.names())),
        ("ppo.logprob_temperature=one", "ppo.logprob_temperature: Input should be 'sampling' or 'unit'"),
    ],
)
def test_bad_config_is_one_line_before_compute(override, needle, tmp_path):
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "x"), override])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output
    assert not (tmp_path / "x").exists()  # nothing ran


# --------------------------------------------------------------------------------------------
# Padding columns: cutting them and stopping early change nothing that is kept
# --------------------------------------------------------------------------------------------


def test_mask_extent_hand_values():
    from harness.rl.components.eos import mask_extent

    assert mask_extent(torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])) == 2
    assert mask_extent(torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]])) == 4
    assert mask_extent(torch.zeros(2, 3)) == 1
    with pytest.raises(ValueError, match=r"response_mask must be \[B, T\]; got shape \(3,\)"):
        mask_extent(torch.ones(3))


def test_sampling_stops_at_eos_and_keeps_exactly_what_truncation_keeps():
    from transformers import GPT2Config, GPT2LMHeadModel

    from harness.rl.components.eos import truncate_after_eos

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=6, n_positions=64, n_embd=16, n_layer=1, n_head=2)).eval()
    prompts = torch.randint(0, 6, (5, 3))
    eos = 2
    full = sample(lm, prompts, 40, 1.0, torch.Generator().manual_seed(1))
    early = sample(lm, prompts, 40, 1.0, torch.Generator().manual_seed(1), stop_token=eos)
    assert early.shape == full.shape == (5, 40)
    # every row of this draw holds an EOS well before 40 tokens, so sampling stopped early
    first = (full == eos).int().argmax(1)
    assert bool((full == eos).any(1).all()) and int(first.max()) < 39
    assert bool((early[:, int(first.max()) + 1 :] == eos).all())
    a, b = truncate_after_eos(full, eos, 0), truncate_after_eos(early, eos, 0)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_update_on_cut_micro_batches_equals_update_on_padded_ones():
    """_update cuts each micro-batch to its real columns; with the cut disabled (compile mode's one
    shape), the losses, statistics and updated weights agree to float32 rounding."""
    import copy

    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    from harness.rl.ppo import Rollout, _update
    from harness.rl.run_models import update_forwards

    torch.manual_seed(0)
    gcfg = GPT2Config(vocab_size=11, n_positions=32, n_embd=16, n_layer=2, n_head=2, num_labels=1,
                      attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)
    policy, critic = GPT2LMHeadModel(gcfg), GPT2ForSequenceClassification(gcfg)
    B, P, T = 8, 3, 10
    lengths = torch.tensor([1, 2, 3, 2, 4, 1, 6, 2])  # the longest response fills 6 of 10 columns
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    g = torch.Generator().manual_seed(3)
    qr = torch.randint(0, 11, (B, P + T), generator=g)
    logprobs, ref_logprobs = -torch.rand(B, T, generator=g), -torch.rand(B, T, generator=g)
    values, returns, advantages = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    results = []
    for compile_mode in (False, True):
        p = smoke_config(["ppo.batch_size=8", "ppo.num_minibatches=2", "ppo.gradient_accumulation_steps=2",
                          "ppo.loss_agg=seq-mean-token-sum-norm", "ppo.kl_estimator=k3",
                          f"ppo.compile={str(compile_mode).lower()}"]).ppo
        models = type("M", (), {})()
        models.policy, models.critic = copy.deepcopy(policy), copy.deepcopy(critic)
        pf, cf = update_forwards(models, P, 0.7, compile=False)  # eager forwards either way
        # plain SGD: Adam would turn a 1e-12 rounding difference in a zero gradient into a full step
        opt = torch.optim.SGD(list(models.policy.parameters()) + list(models.critic.parameters()), lr=0.5)
        batch = Rollout(qr, P, mask, logprobs, ref_logprobs, values, advantages, returns, max_len=T)
        stats = _update(models, p, batch, 0.1, opt, torch.Generator().manual_seed(5),
                        lambda: torch.autocast("cpu", enabled=False), 0, pf, cf)
        results.append((stats, models))
    (s_cut, m_cut), (s_pad, m_pad) = results
    assert s_cut.keys() == s_pad.keys()
    for k in s_cut:
        assert s_cut[k] == pytest.approx(s_pad[k], rel=1e-5, abs=1e-7), k
    for a, b in zip(list(m_cut.policy.parameters()) + list(m_cut.critic.parameters()),
                    list(m_pad.policy.parameters()) + list(m_pad.critic.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# The task contract: a task scored by a rule, no reward model in memory
# --------------------------------------------------------------------------------------------


class _EvenFirstTokenTask:
    """A task whose reward is a rule (1 when a response's first token id is even, else 0), holding the smoke
    task's prompts: the contract of ``harness.tasks.registry`` without a learned reward model."""

    def __init__(self, prompt_ids, eval_prompt_ids):
        self.prompt_ids, self.eval_prompt_ids, self.returned = prompt_ids, eval_prompt_ids, []

    def sample_prompts(self, batch_size, generator):
        return self.prompt_ids[torch.randperm(self.prompt_ids.shape[0], generator=generator)[:batch_size]]

    def _rule(self, responses, mask):
        return ((responses[:, 0] % 2 == 0) & (mask[:, 0] > 0)).float()

    def score(self, models, cfg, prompt_ids, responses, response_mask, with_gold=False):
        s = self._rule(responses, response_mask)
        self.returned.append(s.clone())
        return {"score": s, "gold_lexicon": torch.zeros_like(s), "gold": s if with_gold else None, "texts": [""] * len(s)}

    def evaluate(self, models, cfg, prompts, k, device, autocast, eos_id, pad_id):
        from harness.rl.evaluation import eval_rollout

        b = eval_rollout(models, cfg, prompts, k, device, autocast, eos_id, pad_id)
        s = self._rule(b["responses"], b["mask"])
        return {"eval/gold": s.mean().item(), "eval/proxy": s.mean().item(), "eval/proxy_std": s.std().item(),
                "eval/eos_rate": b["has_eos"].float().mean().item(), "eval/kl": b["kl"].mean().item()}


def test_the_loop_trains_through_the_task_contract_without_a_reward_model(smoke_pipeline, tmp_path):
    """``train`` reads the reward from ``task.score`` and the evaluation from ``task.evaluate``; with no reward
    model loaded (``rm_dir=""``, a verifier-scored task), ``n_params`` has none, and each iteration's
    ``objective/score`` is exactly the mean of what the task returned for that batch."""
    from harness.rl.models import load_tokenizer
    from harness.rl.run_models import assemble_models
    from harness.tasks import TASKS

    cfg = smoke_config(["ppo.adv_estimator=grpo", "ppo.total_iterations=3", "eval.every=2"])
    tok = load_tokenizer(smoke_pipeline.tokenizer_dir)
    models = assemble_models(cfg, torch.device("cpu"), smoke_pipeline.sft_dir, "", tok, tok, 0.0)
    review = TASKS.get("review_sentiment")(cfg, tok)
    task = _EvenFirstTokenTask(review.prompt_ids, review.eval_prompt_ids)
    rec = MetricsRecorder()
    summary = train(cfg, tmp_path, models, task, [rec], progress=False)
    assert models.reward_model is None and set(summary["n_params"]) == {"policy", "ref"}
    scores = rec.history["objective/score"]
    assert len(task.returned) == 3 and [it for it, _ in scores] == [0, 1, 2]
    for (_, v), s in zip(scores, task.returned):
        assert v == pytest.approx(s.mean().item(), abs=1e-7)
    evals = rec.history["eval/gold"]
    assert [k for k, _ in evals] == [0, 2, 3] and summary["eval_final"]["gold"] == evals[-1][1]


def test_dynamic_sampling_keeps_informative_groups_and_refills(smoke_pipeline, tmp_path):
    """With ``ppo.dynamic_sampling`` the groups whose scores are all equal are dropped and more prompts drawn: each
    trained batch is made of the rounds' informative groups first (``fill_groups``), keeps ``batch_size`` rows, and
    ``dynamic/rounds`` counts the rollouts drawn; the trained scores are exactly the task's scores of those rows."""
    from harness.rl.components.rewards import fill_groups, informative_groups
    from harness.rl.models import load_tokenizer
    from harness.rl.run_models import assemble_models
    from harness.tasks import TASKS

    cfg = smoke_config(["ppo.adv_estimator=grpo", "ppo.total_iterations=4", "eval.every=4", "ppo.dynamic_sampling=true",
                        "ppo.dynamic_sampling_max_rounds=3", "ppo.missing_eos_penalty=null"])
    tok = load_tokenizer(smoke_pipeline.tokenizer_dir)
    models = assemble_models(cfg, torch.device("cpu"), smoke_pipeline.sft_dir, "", tok, tok, 0.0)
    review = TASKS.get("review_sentiment")(cfg, tok)
    task = _EvenFirstTokenTask(review.prompt_ids, review.eval_prompt_ids)
    rec = MetricsRecorder()
    train(cfg, tmp_path, models, task, [rec], progress=False)
    rounds = [int(v) for _, v in rec.history["dynamic/rounds"]]
    assert len(task.returned) == sum(rounds) and all(1 <= r <= 3 for r in rounds)
    G, n_groups, i = cfg.ppo.num_generations, cfg.ppo.batch_size // cfg.ppo.num_generations, 0
    for (it, trained), (_, first_equal), (_, trained_equal), r in zip(
            rec.history["objective/score_train"], rec.history["objective/all_equal_groups"],
            rec.history["objective/all_equal_groups_trained"], rounds):
        scores = task.returned[i : i + r]
        i += r
        keep = [informative_groups(s, G) for s in scores]
        assert first_equal == pytest.approx(1.0 - keep[0].float().mean().item())
        picks = fill_groups(keep, n_groups)
        want = torch.cat([scores[rr][g * G : (g + 1) * G] for rr, g in picks])
        assert len(want) == cfg.ppo.batch_size and trained == pytest.approx(want.mean().item(), abs=1e-6)
        assert trained_equal == pytest.approx(1.0 - informative_groups(want, G).float().mean().item())
        assert r == 3 or trained_equal == 0.0  # a batch filled before the cap holds informative groups only
        assert r == 3 or sum(int(k.sum()) for k in keep) >= n_groups  # stopped early only when the batch was full


@pytest.mark.parametrize("spec_name, variant, eos_allowed", [
    ("kl_placement", "reward", False),  # fixed length: nothing cuts a response at EOS, so EOS would hide text
    ("eos_trick", "eos_trick", True), ("eos_trick", "no_truncation", True),  # evaluated cut at EOS: EOS ends it
    ("eos_trick", "pad_equals_eos", True)])
def test_the_policy_and_reference_never_emit_the_special_tokens_their_text_would_hide(smoke_pipeline, spec_name,
                                                                                        variant, eos_allowed):
    """``task.suppress_special_tokens`` (on in both review_sentiment regimes): the policy's and the reference's LM
    heads give padding the suppressed logit always, and EOS too unless a response is cut at its EOS in training or in
    the held-out evaluation; eos_trick's no_truncation arm keeps EOS, since its evaluation measures where EOS falls."""
    from harness.experiments.spec import resolve_config
    from harness.experiments.ablate import load_spec
    from harness.rl.models import SUPPRESSED_LOGIT, load_tokenizer
    from harness.rl.run_models import assemble_models

    cfg = resolve_config(load_spec(spec_name), "smoke", variant, 0)
    assert cfg.task.suppress_special_tokens
    tok = load_tokenizer(smoke_pipeline.tokenizer_dir)
    models = assemble_models(cfg, torch.device("cpu"), smoke_pipeline.sft_dir, smoke_pipeline.rm_dir, tok, tok, 0.0)
    ids = torch.tensor([[5, 9, 14, 3]])
    for lm in (models.policy, models.ref):
        with torch.no_grad():
            logits = lm(input_ids=ids).logits
        assert (logits[..., tok.pad_token_id] == SUPPRESSED_LOGIT).all()
        assert bool((logits[..., tok.eos_token_id] == SUPPRESSED_LOGIT).all()) is not eos_allowed
        assert (logits[..., 5] > SUPPRESSED_LOGIT).all()
