"""The 2025–26 docket's components: hand-computed values, and checks against the definitions verl and TRL publish
(written here from their formulas: TRL's CISPO cap and entropy mask, verl's two-sided CISPO), and a brute-force
enumeration of the pass@k advantage."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from harness.rl.components.advantages import ADV_ESTIMATORS
from harness.rl.components.aggregation import agg_loss, group_mean_lengths
from harness.rl.components.covariance import token_covariance
from harness.rl.components.losses import POLICY_LOSSES
from harness.rl.components.outcome_advantages import pass_at_k_advantages
from harness.rl.components.rewards import kimi_length_reward
from harness.rl.components.token_selection import TOKEN_SELECTIONS

T_ = torch.tensor
LN2 = math.log(2.0)
KW = dict(cliprange=0.2, cliprange_high=0.28, clip_ratio_c=3.0)


def close(a, b, atol=1e-6):
    b = torch.as_tensor(b, dtype=a.dtype) if not isinstance(b, torch.Tensor) else b
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


def _loss(name, lp, old, adv, mask=None, knobs=None, **kw):
    lp = lp.clone().requires_grad_(True)
    mask = torch.ones_like(lp) if mask is None else mask
    out = POLICY_LOSSES.get(name)(lp, old, adv, mask, **{**KW, **kw}, knobs=knobs)
    return lp, out


# ------------------------------------------------------------------------------------------ policy losses


def test_cispo_hand_values_and_gradient():
    # token 1: r = 2 (capped at 1.28), A = 1; token 2: r = 1, A = -2; token 3: r = 0.5 (no lower bound), A = 1
    lp = T_([[math.log(0.5), math.log(0.5), math.log(0.25)]], dtype=torch.float64)
    old = T_([[math.log(0.25), math.log(0.5), math.log(0.5)]], dtype=torch.float64)
    adv = T_([[1.0, -2.0, 1.0]], dtype=torch.float64)
    lp_, (loss, clipped, ratio) = _loss("cispo", lp, old, adv)
    close(loss, [[1.28 * LN2, -2 * LN2, 0.5 * 2 * LN2]])
    close(ratio, [[2.0, 1.0, 0.5]])
    assert clipped.tolist() == [[True, False, False]]
    loss.sum().backward()
    close(lp_.grad, [[-1.28, 2.0, -0.5]])  # −sg(w)·A: every token keeps a gradient
    # verl's two-sided form: token 3's weight is raised to 1 − 0.2
    _, (loss2, clipped2, _) = _loss("cispo_two_sided", lp, old, adv)
    close(loss2, [[1.28 * LN2, -2 * LN2, 0.8 * 2 * LN2]])
    assert clipped2.tolist() == [[True, False, True]]


def test_cispo_matches_trls_definition_whose_epsilon_high_is_the_cap_itself():
    g = torch.Generator().manual_seed(0)
    lp, old = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3, -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    adv = torch.randn(4, 6, generator=g, dtype=torch.float64)
    # TRL GRPOTrainer, loss_type="cispo": −clamp(exp(lp − old), max=epsilon_high).detach() · A · lp
    trl_epsilon_high = 5.0
    want = -torch.clamp(torch.exp(lp - old), max=trl_epsilon_high) * adv * lp
    _, (loss, _, _) = _loss("cispo", lp, old, adv, cliprange_high=trl_epsilon_high - 1.0)
    close(loss, want, atol=1e-12)
    # verl cispo: the weight clamped to [1 − clip_ratio_low, 1 + clip_ratio_high]
    want_verl = -torch.clamp(torch.exp(lp - old), 1 - 0.2, 1 + 0.28) * adv * lp
    _, (loss_v, _, _) = _loss("cispo_two_sided", lp, old, adv)
    close(loss_v, want_verl, atol=1e-12)


def test_sapo_gate_hand_values_slope_one_at_ratio_one_and_temperatures_by_sign():
    lp = T_([[0.0, 0.0, math.log(2.0)]], dtype=torch.float64)
    old = T_([[0.0, 0.0, 0.0]], dtype=torch.float64)
    adv = T_([[1.0, -1.0, 1.0]], dtype=torch.float64)
    lp_, (loss, clipped, _) = _loss("sapo", lp, old, adv, knobs={"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05})
    sig1 = 1 / (1 + math.exp(-1.0))
    close(loss, [[-2.0, 2.0 / 1.05, -4.0 * sig1]])  # σ(0)·4/τ = 2/τ; r = 2: σ(1)·4
    assert not clipped.any()
    loss.sum().backward()
    # d/dlp of −σ(τ(r−1))·4/τ·A = −4σ(1−σ)·r·A: −A at r = 1; at r = 2, −4σ(1)(1−σ(1))·2
    close(lp_.grad, [[-1.0, 1.0, -8.0 * sig1 * (1 - sig1)]])
    # TRL's definition with its default temperatures
    g = torch.Generator().manual_seed(1)
    lp2, adv2 = -torch.rand(3, 5, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)
    old2 = lp2 + 0.3 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    tau = torch.where(adv2 > 0, T_(1.0, dtype=torch.float64), T_(1.05, dtype=torch.float64))
    want = -torch.sigmoid(tau * (torch.exp(lp2 - old2) - 1)) * 4 / tau * adv2
    _, (got, _, _) = _loss("sapo", lp2, old2, adv2, knobs={"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05})
    close(got, want, atol=1e-12)


def test_gmpo_geometric_mean_clipped_in_log_space_hand_values():
    old = torch.zeros(3, 2, dtype=torch.float64)
    lp = T_([[0.5, -0.1], [-0.5, 0.2], [0.3, 9.0]], dtype=torch.float64)  # row 3: its second token is padding
    adv = T_([[1.0, 1.0], [-1.0, -1.0], [2.0, 2.0]], dtype=torch.float64)
    mask = T_([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    _, (loss, clipped, ratio) = _loss("gmpo", lp, old, adv, mask, cliprange=0.4, cliprange_high=0.4)
    # A > 0: min(Δ, clip Δ) = [0.4, −0.1] → ρ̄ = e^0.15; A < 0: max(Δ, clip Δ) = [−0.4, 0.2] → ρ̄ = e^−0.1;
    # row 3: Δ = 0.3 → ρ̄ = e^0.3
    rho = [math.exp(0.15), math.exp(-0.1), math.exp(0.3)]
    close(ratio[:, 0], rho)
    close(loss[:, 0], [-rho[0], rho[1], -2 * rho[2]])
    assert clipped[:2].tolist() == [[True, False], [True, False]]
    close(agg_loss(loss, mask, "seq-mean-token-mean"), (-rho[0] + rho[1] - 2 * rho[2]) / 3)


def test_gmpo_requires_the_sequence_mean_aggregation_by_name():
    from harness.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=r"ppo.policy_loss 'gmpo' is a sequence-level objective: it needs "
                                          r"ppo.loss_agg 'seq-mean-token-mean'.*not 'token-mean'"):
        build_config({"ppo": {"policy_loss": "gmpo"}})
    assert build_config({"ppo": {"policy_loss": "gmpo", "loss_agg": "seq-mean-token-mean"}}).ppo.policy_loss == "gmpo"


def test_token_covariance_hand_values():
    lp = T_([[-1.0, -2.5, -2.25, -2.25, 0.0]])
    adv = T_([[2.0, -2.0, 0.0, 0.0, 7.0]])
    mask = T_([[1.0, 1.0, 1.0, 1.0, 0.0]])
    cov = token_covariance(lp, adv, mask)  # means over real tokens: Ā = 0, mean log p = −2
    close(cov[:, :4], [[2.0, 1.0, 0.0, 0.0]])
    assert cov[0, 4] == float("-inf")


def test_clip_cov_cuts_the_gradient_of_the_one_token_in_the_band():
    lp = T_([[-1.0, -2.5, -2.25, -2.25]], dtype=torch.float64)
    adv = T_([[2.0, -2.0, 0.0, 0.0]], dtype=torch.float64)
    knobs = {"clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0}
    lp_, (loss, clipped, _) = _loss("clip_cov", lp, lp.clone(), adv, knobs=knobs)  # r = 1: nothing PPO-clipped
    close(loss, [[0.0, 2.0, 0.0, 0.0]])  # cov 2 ∈ (1, 5) is cut; cov 1 is not strictly inside
    assert clipped.tolist() == [[True, False, False, False]]
    loss.sum().backward()
    close(lp_.grad, [[0.0, 2.0, 0.0, 0.0]])


def test_clip_cov_draws_its_count_among_the_candidates_only():
    torch.manual_seed(0)
    lp = T_([[-1.0, -3.0, -1.0, -3.0, -2.0, -2.0]], dtype=torch.float64)  # centred log p: ±1, 0
    adv = T_([[2.0, -2.0, 3.0, -3.0, 1.0, -1.0]], dtype=torch.float64)  # cov 2, 2, 3, 3, 0, 0
    for seed in range(5):
        torch.manual_seed(seed)
        _, (loss, clipped, _) = _loss("clip_cov", lp, lp.clone(), adv,
                                      knobs={"clip_cov_ratio": 0.5, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0})
        cut = clipped[0].tolist()
        assert sum(cut) == 3 and not cut[4] and not cut[5]  # ⌊0.5·6⌋ = 3 of the 4 candidates


def test_kl_cov_penalises_the_top_covariance_token():
    lp = T_([[-1.0, -2.5, -2.25, -2.25]], dtype=torch.float64)
    adv = T_([[2.0, -2.0, 0.0, 0.0]], dtype=torch.float64)
    old = lp - 0.1
    r = math.exp(0.1)
    _, (loss, chosen, _) = _loss("kl_cov", lp, old, adv, knobs={"kl_cov_ratio": 2e-4, "kl_cov_coef": 1.0})
    close(loss, [[-2 * r + 0.1, 2 * r, 0.0, 0.0]])
    assert chosen.tolist() == [[True, False, False, False]]


def test_registry_passes_each_variant_the_knobs_it_names():
    from harness.config import build_config

    p = build_config({"ppo": {"policy_loss": "sapo", "sapo_tau_neg": 2.0}}).ppo
    assert POLICY_LOSSES.knobs("sapo", p) == {"sapo_tau_pos": 1.0, "sapo_tau_neg": 2.0}
    assert POLICY_LOSSES.knobs("vanilla", p) == {}
    assert ADV_ESTIMATORS.knobs("pass_at_k", p) == {"pass_k": 4}


def test_new_knobs_at_their_defaults_leave_the_config_hash_unchanged():
    from harness.config import build_config

    dump = build_config({}).to_dict()["ppo"]
    for k in ("sapo_tau_pos", "clip_cov_ratio", "kl_cov_coef", "token_selection", "entropy_rho", "pass_k",
              "w_reinforce_lambda", "length_reward_coef", "zero_variance_filter", "no_positive_resampling"):
        assert k not in dump
    assert build_config({"ppo": {"token_selection": "top_entropy"}}).to_dict()["ppo"]["token_selection"] == "top_entropy"
    # chain_sum's options dump every field, so a new option is left out at its default (the reasoning runs keep
    # their config hashes and their reports their verdicts)
    chain = build_config({"task": {"name": "chain_sum"}})
    assert "disjoint_heldout" not in chain.task.options and "passk_samples" not in chain.to_dict()["eval"]
    on = build_config({"task": {"name": "chain_sum", "options": {"disjoint_heldout": True}}})
    assert on.task.options["disjoint_heldout"] is True and on.hash() != chain.hash()


# ------------------------------------------------------------------------------------------ token selection


def test_entropy_token_selection_hand_values_and_trls_quantile_rule():
    ent = T_([[0.0, 1.0, 2.0], [3.0, 4.0, 99.0]])
    mask = T_([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # quantile 0.8 of [0, 1, 2, 3, 4] (linear) = 3.2: only 4 is at or above it; padding never selected
    close(TOKEN_SELECTIONS.get("top_entropy")(ent, mask, rho=0.2), [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    close(TOKEN_SELECTIONS.get("bottom_entropy")(ent, mask, rho=0.2), [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    close(TOKEN_SELECTIONS.get("top_entropy")(ent, mask, rho=0.4), [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])  # q(0.6) = 2.4
    close(TOKEN_SELECTIONS.get("all")(ent, mask, rho=0.2), mask)
    g = torch.Generator().manual_seed(3)
    ent2, mask2 = torch.rand(8, 12, generator=g), (torch.rand(8, 12, generator=g) > 0.3).float()
    trl = (ent2 >= torch.quantile(ent2[mask2.bool()], 1 - 0.2)) & mask2.bool()  # TRL get_high_entropy_mask
    close(TOKEN_SELECTIONS.get("top_entropy")(ent2, mask2, rho=0.2), trl.float())
    with pytest.raises(ValueError, match="entropy_rho must be in"):
        TOKEN_SELECTIONS.get("top_entropy")(ent, mask, rho=1.0)


# ------------------------------------------------------------------------------------------ aggregation


def test_prompt_mean_hand_values_and_micro_batch_sums():
    loss = T_([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0], [3.0, 3.0, 0.0], [1.0, 1.0, 0.0]])
    mask = T_([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    gl = group_mean_lengths(mask, 2)
    close(gl, [2.0, 2.0, 2.0, 2.0])
    # group 1: (2 + 3) / 4 tokens = 1.25; group 2: (6 + 2) / 4 = 2; mean over prompts 1.625
    close(agg_loss(loss, mask, "prompt-mean", group_lengths=gl), 1.625)
    parts = sum(agg_loss(loss[i : i + 1], mask[i : i + 1], "prompt-mean", num_seqs=4, group_lengths=gl[i : i + 1])
                for i in range(4))
    close(parts, 1.625)
    # groups of one response (a critic): seq-mean-token-mean
    close(agg_loss(loss, mask, "prompt-mean", group_lengths=group_mean_lengths(mask, 1)),
          agg_loss(loss, mask, "seq-mean-token-mean"))
    close(group_mean_lengths(T_([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), 2), [3.0, 3.0])


# ------------------------------------------------------------------------------------------ advantages and rewards


def _score_rewards(scores, T=3):
    r = torch.zeros(len(scores), T)
    r[:, -1] = T_(scores)
    return r, torch.ones(len(scores), T)


def test_sample_polarity_advantages_hand_values():
    r, m = _score_rewards([1.0, 0.0, 1.0, 0.0])
    kw = dict(gamma=1.0, lam=1.0, group_size=2)
    close(ADV_ESTIMATORS.get("psr")(r, None, m, **kw)[0][:, 0], [1.0, 0.0, 1.0, 0.0])
    close(ADV_ESTIMATORS.get("nsr")(r, None, m, **kw)[0][:, 0], [0.0, -1.0, 0.0, -1.0])
    close(ADV_ESTIMATORS.get("w_reinforce")(r, None, m, **kw, knobs={"w_reinforce_lambda": 0.1})[0][:, 0],
          [0.1, -1.0, 0.1, -1.0])


def test_pass_at_k_advantage_hand_values_and_against_enumerating_every_k_subset():
    a_pos, a_neg = pass_at_k_advantages(4, 1, 2)  # ρ = 1 − C(3,2)/C(4,2) = 0.5, σ = 0.5
    assert math.isclose(a_pos, 1.0) and math.isclose(a_neg, -1 / 3)
    assert pass_at_k_advantages(4, 4, 2) == (0.0, 0.0) and pass_at_k_advantages(4, 0, 2) == (0.0, 0.0)
    # the closed form equals (mean group reward of the k-subsets holding the response − ρ) / σ, the group reward of a
    # subset being 1 if it holds a correct response
    for n in range(2, 8):
        for k in range(1, n + 1):
            for c in range(n + 1):
                correct = [1] * c + [0] * (n - c)
                subsets = list(itertools.combinations(range(n), k))
                rho = sum(max(correct[j] for j in s) for s in subsets) / len(subsets)
                sigma = math.sqrt(rho * (1 - rho))
                got = pass_at_k_advantages(n, c, k)
                for i in (0, n - 1):
                    holding = [s for s in subsets if i in s]
                    want = 0.0 if sigma < 1e-12 else (sum(max(correct[j] for j in s) for s in holding) / len(holding) - rho) / sigma
                    assert math.isclose(got[0 if correct[i] else 1], want, abs_tol=1e-9), (n, c, k, i)
    r, m = _score_rewards([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv, _ = ADV_ESTIMATORS.get("pass_at_k")(r, None, m, gamma=1.0, lam=1.0, group_size=4, knobs={"pass_k": 2})
    close(adv[:, 0], [1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0, 0.0])


def test_pass_k_above_the_group_size_is_refused_by_name():
    from harness.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=r"ppo.pass_k \(8\) must be ≤ ppo.num_generations \(4\)"):
        build_config({"ppo": {"adv_estimator": "pass_at_k", "pass_k": 8}})


def test_kimi_length_reward_hand_values():
    got = kimi_length_reward(T_([2, 4, 6, 3, 3, 3, 2, 6]), T_([1, 1, 0, 1, 0, 1, 0, 0]).bool(), 2)
    # groups: (2, 4) both correct: λ = 0.5, −0.5; (6 wrong, 3 correct): −0.5, 0.5; (3, 3): 0 (no span);
    # (2, 6) both wrong: min(0, 0.5) = 0, −0.5
    close(got, [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, -0.5])
    got3 = kimi_length_reward(T_([2, 4, 6]), T_([1, 1, 0]).bool(), 3)
    close(got3, [0.5, 0.0, -0.5])
    with pytest.raises(ValueError, match="multiple of group_size"):
        kimi_length_reward(T_([1, 2, 3]), T_([1, 1, 1]).bool(), 2)


# ------------------------------------------------------------------------------------------ in the loop

LOOP_VARIANTS = {
    "cispo+top_entropy": ["ppo.policy_loss=cispo", "ppo.cliprange_high=4.0", "ppo.token_selection=top_entropy"],
    "sapo+prompt-mean+length_reward": ["ppo.policy_loss=sapo", "ppo.loss_agg=prompt-mean", "ppo.length_reward_coef=0.5"],
    "gmpo+pass_at_k": ["ppo.policy_loss=gmpo", "ppo.loss_agg=seq-mean-token-mean", "ppo.cliprange=0.4",
                       "ppo.cliprange_high=0.4", "ppo.adv_estimator=pass_at_k", "ppo.pass_k=2"],
    "clip_cov+nsr": ["ppo.policy_loss=clip_cov", "ppo.adv_estimator=nsr", "ppo.token_selection=bottom_entropy"],
    "vapo (pretrained critic, adaptive λ)": ["ppo.adv_estimator=gae_length_adaptive", "ppo.critic_init=policy",
                                             "ppo.vapo_alpha=1.0", "ppo.critic_warmup_iterations=1"],
    "kl_cov+w_reinforce+pass@k eval+disjoint": ["ppo.policy_loss=kl_cov", "ppo.adv_estimator=w_reinforce",
                                                "eval.passk_samples=4", "task.options.disjoint_heldout=true"],
}


@pytest.mark.parametrize("name", list(LOOP_VARIANTS))
def test_each_docket_variant_trains_an_iteration_of_chain_sum_from_yaml_keys(name, isolated_results, tmp_path):
    """Selected by config keys alone, each variant runs the loop (one iteration at smoke scale, chain_sum) and logs
    finite losses; a token selection logs the fraction of tokens it kept."""
    from harness.rl.callbacks import MetricsRecorder
    from harness.rl.runner import run as train
    from tests.test_chain_sum import _chain_cfg

    cfg = _chain_cfg(["ppo.adv_estimator=grpo", "ppo.total_iterations=1", *LOOP_VARIANTS[name]])
    rec = MetricsRecorder()
    summary = train(cfg, tmp_path / "run", callbacks=[rec], progress=False)
    (_, loss), = rec.history["loss/policy"]
    assert math.isfinite(loss)
    if cfg.ppo.token_selection == "all":
        assert "policy/selected_frac" not in rec.history
    else:
        (_, frac), = rec.history["policy/selected_frac"]
        assert (0.0 < frac <= 0.5) if cfg.ppo.token_selection == "top_entropy" else (0.5 <= frac < 1.0)
    if cfg.eval.passk_samples:  # the pass@k draw: before the first update and after the last, read at the end
        assert [k for k, _ in rec.history["eval/pass_at_4"]] == [0, 1]
        assert {"pass_at_1", "pass_at_1_se", "pass_at_4", "pass_at_4_se"} <= set(summary["eval_final"])
        assert 0.0 <= summary["eval_final"]["pass_at_1"] <= summary["eval_final"]["pass_at_4"] <= 1.0
        from harness.rl.metrics import run_metric_names
        from tests.test_ppo import _recorded_names

        declared = {m for m in run_metric_names(cfg) if not m.startswith(("matched_kl/", "pair_matched_kl/", "pair_matched_responses/"))}
        assert _recorded_names(rec, summary) == declared


def test_pass_at_k_metrics_hand_values():
    from harness.rl.evaluation import pass_at_k_metrics

    got = pass_at_k_metrics(T_([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]), (1, 2, 4, 16))
    # problem 1: pass@1 = 1/4, pass@2 = 1 − C(3,2)/C(4,2) = 1/2, pass@4 = 1; problem 2: 1; problem 3: 0
    assert set(got) == {"pass_at_1", "pass_at_1_se", "pass_at_2", "pass_at_2_se", "pass_at_4", "pass_at_4_se"}
    assert math.isclose(got["pass_at_1"], 1.25 / 3) and math.isclose(got["pass_at_2"], 1.5 / 3)
    assert math.isclose(got["pass_at_4"], 2 / 3)
    assert math.isclose(got["pass_at_2_se"], torch.tensor([0.5, 1.0, 0.0]).std().item() / math.sqrt(3), rel_tol=1e-6)


def test_every_arm_on_the_disjoint_held_out_set_measures_pass_at_k_and_the_shared_arms_share_their_runs():
    """An ablation on chain_sum's disjoint held-out set reports unbiased pass@1/4/16, so each of its arms draws 16
    samples per held-out problem; and an arm whose config another ablation trains has that arm's config hash (so its
    runs are copied in, not trained twice): the GRPO of reasoning_loss_type is the fp32 arm of both mismatch
    ablations and the plain arm of their A/A control, its DAPO the entropy ablation's `all` and the prompt-mean
    ablation's `token_mean`."""
    from harness.experiments.ablate import list_ablations, load_spec
    from harness.experiments.plan import plan_runs

    arms = {}
    for name in list_ablations():
        spec = load_spec(name, validate_configs=False)
        if spec.base.get("task", {}).get("options", {}).get("disjoint_heldout"):
            for t in plan_runs(spec, "default", [0]):
                assert t.config["eval"].get("passk_samples") == 16, f"{name}:{t.variant}"
                arms[f"{name}:{t.variant}"] = t.config_hash
    assert len(arms) >= 30
    shared = [("reasoning_loss_type:grpo", "rollout_mismatch:fp32", "rollout_correction:fp32", "aa_rollout_tis:plain"),
              ("reasoning_loss_type:dapo", "reasoning_entropy_tokens:all", "reasoning_prompt_mean:token_mean"),
              ("rollout_mismatch:fp8", "rollout_correction:none")]
    for group in shared:
        assert len({arms[a] for a in group}) == 1, group


def test_disjoint_heldout_shares_no_expression_with_training_and_keeps_the_generators_order():
    from harness.tasks.chain_sum.problems import HELDOUT_SEED_OFFSET, dataset, make_problems, split_overlap

    train, seeded = make_problems(2000, 300, seed=0, max_digits=1)
    assert split_overlap(train, seeded) > 0  # the generator repeats short chains
    _, heldout = make_problems(2000, 100, seed=0, disjoint=True, max_digits=1)
    seen = {e["metadata"]["expression"] for e in train}
    want = [e for e in dataset(5000, HELDOUT_SEED_OFFSET, max_digits=1) if e["metadata"]["expression"] not in seen][:100]
    assert split_overlap(train, heldout) == 0 and len(heldout) == 100
    assert [e["metadata"]["expression"] for e in heldout] == [e["metadata"]["expression"] for e in want]
    with pytest.raises(ValueError, match="task.options.disjoint_heldout: only .* unseen in training"):
        make_problems(2000, 100, seed=0, disjoint=True, max_terms=2, max_digits=1)


def test_length_adaptive_gae_is_gae_with_each_responses_lambda_and_monte_carlo_returns():
    rewards = T_([[0.1, -0.2, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0]], dtype=torch.float64)
    values = T_([[0.3, 0.4, 0.2, 9.0], [0.1, -0.3, 9.0, 9.0]], dtype=torch.float64)
    mask = T_([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    adv, ret = ADV_ESTIMATORS.get("gae_length_adaptive")(rewards, values, mask, gamma=1.0, lam=0.95,
                                                        knobs={"vapo_alpha": 0.5})
    gae = ADV_ESTIMATORS.get("gae")
    # α·l = 1.5 → λ = 1/3 for the 3-token row; α·l = 1 → λ = 0 for the 2-token row
    close(adv[0], gae(rewards[:1], values[:1], mask[:1], gamma=1.0, lam=1 / 3, group_size=1)[0][0], atol=1e-12)
    close(adv[1], gae(rewards[1:], values[1:], mask[1:], gamma=1.0, lam=0.0, group_size=1)[0][0], atol=1e-12)
    close(adv[1, :2], [0.0 + (-0.3) - 0.1, 0.5 - (-0.3)], atol=1e-12)  # λ = 0: one-step TD errors
    close(ret, [[0.9, 0.8, 1.0, 0.0], [0.5, 0.5, 0.0, 0.0]], atol=1e-12)  # λ = 1: the reward-to-go


def test_value_pretraining_moves_the_critic_alone(isolated_results, tmp_path):
    """VAPO's value pretraining: an iteration of it changes the critic's weights and leaves the policy's as they
    were; a critic-free estimator with it is refused by name."""
    from harness.config import ConfigError
    from harness.rl.ppo import _critic_warmup, _start_run
    from harness.rl.runner import build_run
    from tests.test_chain_sum import _chain_cfg

    cfg = _chain_cfg(["ppo.adv_estimator=gae_length_adaptive", "ppo.critic_init=policy", "ppo.vapo_alpha=1.0",
                      "ppo.critic_warmup_iterations=1", "ppo.total_iterations=1"])
    run = _start_run(cfg, *build_run(cfg), [])
    policy0 = [q.detach().clone() for q in run.models.policy.parameters()]
    critic0 = [q.detach().clone() for q in run.models.critic.parameters()]
    _critic_warmup(run, 1)
    assert all(torch.equal(a, b) for a, b in zip(policy0, run.models.policy.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(critic0, run.models.critic.parameters()))
    with pytest.raises(ConfigError, match="ppo.critic_warmup_iterations pretrains a critic"):
        _chain_cfg(["ppo.adv_estimator=grpo", "ppo.critic_warmup_iterations=2"])
