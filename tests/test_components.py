"""Exact checks of the PPO math components against hand-computed numbers and plain-loop references."""

from __future__ import annotations

import math

import pytest
import torch

from harness.rl.components.advantages import ADV_ESTIMATORS
from harness.rl.components.aggregation import LOSS_AGG, agg_loss
from harness.rl.components.eos import apply_missing_eos_penalty, last_token_index, pad_based_mask, truncate_after_eos
from harness.rl.components.kl import KL_CONTROLLERS, KL_ESTIMATORS, KL_PLACEMENTS, kl_loss_terms
from harness.rl.components.losses import POLICY_LOSSES, VALUE_LOSSES
from harness.rl.components.rewards import clip_scores, token_rewards, whiten_token_rewards
from harness.rl.components.whitening import masked_mean, masked_var, masked_whiten
from harness.registry import UnknownComponentError

T_ = torch.tensor
LN2 = math.log(2.0)


def close(a, b, atol=1e-6):
    b = torch.as_tensor(b, dtype=a.dtype) if not isinstance(b, torch.Tensor) else b
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


# ------------------------------------------------------------------------------------------ KL


def test_kl_estimators_hand_values():
    # log_ratio = [0, ln2, -ln2]
    logprobs = T_([[math.log(0.5), math.log(0.5), math.log(0.25)]], dtype=torch.float64)
    ref = T_([[math.log(0.5), math.log(0.25), math.log(0.5)]], dtype=torch.float64)
    close(KL_ESTIMATORS.get("k1")(logprobs, ref), [[0.0, LN2, -LN2]])
    close(KL_ESTIMATORS.get("k2")(logprobs, ref), [[0.0, 0.5 * LN2**2, 0.5 * LN2**2]])
    # k3(ln2) = 1/2 - 1 + ln2 ; k3(-ln2) = 2 - 1 - ln2
    close(KL_ESTIMATORS.get("k3")(logprobs, ref), [[0.0, LN2 - 0.5, 1.0 - LN2]])


def test_k3_nonnegative_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    lp, ref = torch.randn(64, 50, generator=g) * 3, torch.randn(64, 50, generator=g) * 3
    assert (KL_ESTIMATORS.get("k3")(lp, ref) >= 0).all()
    assert (KL_ESTIMATORS.get("k2")(lp, ref) >= 0).all()
    assert (KL_ESTIMATORS.get("k1")(lp, ref) < 0).any()  # k1 can be negative


P = T_([0.5, 0.3, 0.2], dtype=torch.float64)  # policy π
Q = T_([0.3, 0.3, 0.4], dtype=torch.float64)  # reference π_ref
TRUE_KL = float((P * (P / Q).log()).sum())  # 0.5 ln(5/3) + 0.2 ln(1/2) ≈ 0.1168


def test_kl_estimators_exact_expectation():
    # E_{x~π}[k] computed exactly over the 3-symbol support: k1 and k3 are unbiased.
    lp, ref = P.log().unsqueeze(0), Q.log().unsqueeze(0)
    assert abs(TRUE_KL - (0.5 * math.log(5 / 3) + 0.2 * math.log(0.5))) < 1e-12
    for name in ("k1", "k3"):
        assert abs(float((P * KL_ESTIMATORS.get(name)(lp, ref)[0]).sum()) - TRUE_KL) < 1e-12, name
    e_k2 = float((P * KL_ESTIMATORS.get("k2")(lp, ref)[0]).sum())
    assert 0 < abs(e_k2 - TRUE_KL) < 0.01  # biased, but close for this small KL


def test_kl_estimators_sampled_mean_near_true_kl():
    # 200k samples from π with a fixed generator; tolerance 0.01 nats (≈10 standard errors for k1).
    g = torch.Generator().manual_seed(1234)
    x = torch.multinomial(P, 200_000, replacement=True, generator=g).unsqueeze(0)
    lp, ref = P.log()[x], Q.log()[x]
    for name in ("k1", "k2", "k3"):
        est = float(KL_ESTIMATORS.get(name)(lp, ref).mean())
        assert abs(est - TRUE_KL) < 0.01, (name, est, TRUE_KL)


def test_kl_placements():
    assert KL_PLACEMENTS.get("reward")(0.05) == (0.05, 0.0)
    assert KL_PLACEMENTS.get("loss")(0.05) == (0.0, 0.05)
    assert KL_PLACEMENTS.get("none")(0.05) == (0.0, 0.0)


def test_fixed_kl_controller():
    ctl = KL_CONTROLLERS.get("fixed")(0.05, 6.0, 10000)
    ctl.update(100.0, 64)
    assert ctl.value == 0.05


def test_adaptive_kl_controller_by_hand():
    ctl = KL_CONTROLLERS.get("adaptive")(0.1, 6.0, 10000)
    ctl.update(9.0, 64)  # 9/6 - 1 = 0.5 -> clipped to 0.2: β = 0.1·(1 + 0.2·64/10000) = 0.100128
    assert ctl.value == pytest.approx(0.100128, abs=1e-12)
    ctl.update(3.0, 64)  # -0.5 -> -0.2: β = 0.100128·(1 - 0.00128) = 0.09999983616
    assert ctl.value == pytest.approx(0.09999983616, abs=1e-12)
    ctl = KL_CONTROLLERS.get("adaptive")(1.0, 6.0, 1000)
    ctl.update(6.6, 100)  # 0.1 (inside the clip): β = 1·(1 + 0.1·0.1) = 1.01
    assert ctl.value == pytest.approx(1.01, abs=1e-12)
    with pytest.raises(ValueError):
        KL_CONTROLLERS.get("adaptive")(0.1, 0.0, 1000)


# ------------------------------------------------------------------------------------ whitening

X = T_([[1.0, 2.0, 3.0], [5.0, float("nan"), -7.0]], dtype=torch.float64)
M = T_([[1, 1, 1], [1, 0, 0]])
# masked entries 1, 2, 3, 5: mean 11/4 = 2.75; squared deviations 3.0625 + 0.5625 + 0.0625 + 5.0625
# = 8.75; unbiased var = 8.75 / 3 = 35/12.
MEAN, VAR = 2.75, 35.0 / 12.0


def test_masked_mean_and_var_by_hand():
    assert float(masked_mean(X, M)) == pytest.approx(MEAN, abs=1e-12)
    assert float(masked_var(X, M)) == pytest.approx(VAR, abs=1e-12)
    assert float(masked_var(X, M, unbiased=False)) == pytest.approx(8.75 / 4, abs=1e-12)
    close(masked_mean(X, M, dim=1), [2.0, 5.0])
    with pytest.raises(ValueError):
        masked_var(X, torch.zeros_like(M))
    with pytest.raises(ValueError):
        masked_var(X, T_([[1, 0, 0], [0, 0, 0]]))


def test_masked_whiten_by_hand():
    s = math.sqrt(VAR + 1e-8)
    expected = [[(1 - MEAN) / s, (2 - MEAN) / s, (3 - MEAN) / s], [(5 - MEAN) / s, 0.0, 0.0]]
    w = masked_whiten(X, M)
    close(w, expected, atol=1e-12)
    assert w[1, 1] == 0 and w[1, 2] == 0  # padding (even NaN) zeroed
    assert float(masked_mean(w, M)) == pytest.approx(0.0, abs=1e-12)
    assert float(masked_var(w, M)) == pytest.approx(1.0, abs=1e-6)


def test_masked_whiten_keep_mean():
    s = math.sqrt(VAR + 1e-8)
    w = masked_whiten(X, M, shift_mean=False)
    expected = [[(1 - MEAN) / s + MEAN, (2 - MEAN) / s + MEAN, (3 - MEAN) / s + MEAN], [(5 - MEAN) / s + MEAN, 0, 0]]
    close(w, T_(expected, dtype=torch.float64), atol=1e-12)
    assert float(masked_mean(w, M)) == pytest.approx(MEAN, abs=1e-12)  # mean kept, sign kept
    close(whiten_token_rewards(X, M), w, atol=0)


# ------------------------------------------------------------------------------------------ GAE

gae = ADV_ESTIMATORS.get("gae")


def test_gae_hand_example():
    # γ = 1, λ = 0.5.
    # row 0 (3 tokens): r = [0, 0, 1], V = [0.5, 0.5, 0.5]
    #   δ2 = 1 + 0 - 0.5 = 0.5 → A2 = 0.5 ; δ1 = 0 + 0.5 - 0.5 = 0 → A1 = 0.5·0.5 = 0.25
    #   δ0 = 0 → A0 = 0.5·0.25 = 0.125 ; returns = A + V = [0.625, 0.75, 1.0]
    # row 1 (2 tokens + garbage padding): r = [0, 2], V = [1, 0.5]
    #   δ1 = 2 + 0 - 0.5 = 1.5 → A1 = 1.5 ; δ0 = 0 + 0.5 - 1 = -0.5 → A0 = -0.5 + 0.5·1.5 = 0.25
    rewards = T_([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    values = T_([[0.5, 0.5, 0.5], [1.0, 0.5, 7.0]])
    mask = T_([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5, group_size=None)
    close(adv, [[0.125, 0.25, 0.5], [0.25, 1.5, 0.0]])
    close(ret, [[0.625, 0.75, 1.0], [1.25, 2.0, 0.0]])


def _gae_loop(rewards, values, lengths, gamma, lam):
    B, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for i in range(B):
        a = 0.0
        for t in reversed(range(lengths[i])):
            v_next = values[i][t + 1] if t + 1 < lengths[i] else 0.0
            a = rewards[i][t] + gamma * v_next - values[i][t] + gamma * lam * a
            adv[i][t] = a
            ret[i][t] = a + values[i][t]
    return adv, ret


def test_gae_matches_python_loop_ragged():
    g = torch.Generator().manual_seed(7)
    lengths = [7, 3, 1, 5]
    rewards = torch.randn(4, 7, generator=g, dtype=torch.float64)
    values = torch.randn(4, 7, generator=g, dtype=torch.float64)
    mask = (torch.arange(7)[None] < T_(lengths)[:, None]).long()
    rewards_garbage = torch.where(mask.bool(), rewards, T_(123.0, dtype=torch.float64))
    values_garbage = torch.where(mask.bool(), values, T_(-55.0, dtype=torch.float64))
    for gamma, lam in [(0.9, 0.8), (1.0, 0.95), (1.0, 1.0), (0.5, 0.0)]:
        adv, ret = gae(rewards_garbage, values_garbage, mask, gamma=gamma, lam=lam, group_size=None)
        ref_adv, ref_ret = _gae_loop(rewards.tolist(), values.tolist(), lengths, gamma, lam)
        close(adv, T_(ref_adv, dtype=torch.float64), atol=1e-12)
        close(ret, T_(ref_ret, dtype=torch.float64), atol=1e-12)


def test_gae_requires_values():
    with pytest.raises(ValueError, match="critic"):
        gae(torch.zeros(1, 2), None, torch.ones(1, 2), gamma=1.0, lam=0.95, group_size=None)


# ------------------------------------------------------------------------------- critic-free

# 2 groups of 3; sequence returns R = [1, 2, 3 | 0, 0, 6] (padding holds garbage).
CF_REWARDS = T_([[0.5, 0.5], [2.0, 99.0], [1.0, 2.0], [0.0, 0.0], [-1.0, 1.0], [6.0, 50.0]])
CF_MASK = T_([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0]])


def _run(name, group_size=3):
    return ADV_ESTIMATORS.get(name)(CF_REWARDS, None, CF_MASK, gamma=1.0, lam=0.95, group_size=group_size)


def _expand(seq_adv):
    return T_(seq_adv).unsqueeze(1) * CF_MASK


def test_grpo_by_hand():
    # group 1: mean 2, unbiased std 1 → (R - 2)/(1 + 1e-6)
    # group 2: mean 2, unbiased var (4 + 4 + 16)/2 = 12, std 2√3 → (R - 2)/(2√3 + 1e-6)
    s2 = 2 * math.sqrt(3) + 1e-6
    adv, ret = _run("grpo")
    close(adv, _expand([-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), -2 / s2, -2 / s2, 4 / s2]))
    close(ret, adv, atol=0)


def test_rloo_by_hand():
    # group 1: 1 - (2+3)/2 = -1.5, 2 - (1+3)/2 = 0, 3 - (1+2)/2 = 1.5 ; group 2: -3, -3, 6
    adv, ret = _run("rloo")
    close(adv, _expand([-1.5, 0.0, 1.5, -3.0, -3.0, 6.0]))
    close(ret, adv, atol=0)


def test_reinforce_by_hand():
    # batch mean of R = 12/6 = 2
    adv, ret = _run("reinforce")
    close(adv, _expand([-1.0, 0.0, 1.0, -2.0, -2.0, 4.0]))
    close(ret, adv, atol=0)


def test_dr_grpo_by_hand():
    # groups of 2: R = [1, 2 | 3, 0 | 0, 6], means 1.5, 1.5, 3; no division by the std
    adv, ret = _run("dr_grpo", group_size=2)
    close(adv, _expand([-0.5, 0.5, 1.5, -1.5, -3.0, 3.0]))
    close(ret, adv, atol=0)


def test_reinforce_pp_by_hand():
    # returns-to-go (γ = 1) on the real tokens: [1, .5], [2, –], [3, 2], [0, 0], [0, 1], [6, –]
    togo = T_([[1.0, 0.5], [2.0, 0.0], [3.0, 2.0], [0.0, 0.0], [0.0, 1.0], [6.0, 0.0]])
    real = [1.0, 0.5, 2.0, 3.0, 2.0, 0.0, 0.0, 0.0, 1.0, 6.0]
    mean = sum(real) / len(real)  # 1.55
    var = sum((x - mean) ** 2 for x in real) / (len(real) - 1)  # 31.225 / 9
    adv, ret = _run("reinforce_pp", group_size=3)
    close(ret, togo)
    close(adv, (togo - mean) / math.sqrt(var + 1e-8) * CF_MASK, atol=1e-6)
    adv, ret = ADV_ESTIMATORS.get("reinforce_pp")(CF_REWARDS, None, CF_MASK, gamma=0.5, lam=1.0, group_size=1)
    close(ret[2], T_([2.0, 2.0]))  # 1 + 0.5·2, 2


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce", "dr_grpo"])
def test_critic_free_group_size_must_divide(name):
    with pytest.raises(ValueError, match="group_size"):
        _run(name, group_size=4)


def test_adv_estimator_meta():
    assert ADV_ESTIMATORS.names() == ["gae", "grpo", "rloo", "reinforce", "dr_grpo", "reinforce_pp", "grpo_batch_std",
                                      "gae_length_adaptive", "psr", "nsr", "w_reinforce", "pass_at_k"]
    critic = {"gae", "gae_length_adaptive"}
    assert [ADV_ESTIMATORS.meta(n)["needs_critic"] for n in ADV_ESTIMATORS.names()] == [n in critic for n in ADV_ESTIMATORS.names()]


# -------------------------------------------------------------------------------- aggregation


def test_loss_agg_modes_by_hand():
    L = T_([[1.0, 2.0, 3.0], [4.0, 100.0, float("nan")]])
    mask = T_([[1, 1, 1], [1, 0, 0]])
    assert float(agg_loss(L, mask, "token-mean")) == pytest.approx(10 / 4)  # (1+2+3+4)/4
    assert float(agg_loss(L, mask, "seq-mean-token-mean")) == pytest.approx(3.0)  # (6/3 + 4/1)/2
    assert float(agg_loss(L, mask, "seq-mean-token-sum")) == pytest.approx(5.0)  # (6 + 4)/2
    assert float(agg_loss(L, mask, "seq-mean-token-sum-norm")) == pytest.approx(10 / 6)  # 10/(2·3)
    assert float(agg_loss(L, mask, "seq-mean-token-sum-norm", max_len=4)) == pytest.approx(10 / 8)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_loss_agg_micro_batches_sum_to_full(mode):
    g = torch.Generator().manual_seed(3)
    L = torch.randn(6, 5, generator=g, dtype=torch.float64)
    lengths = T_([5, 1, 3, 2, 4, 5])
    mask = (torch.arange(5)[None] < lengths[:, None]).long()
    full = agg_loss(L, mask, mode)
    counts = dict(num_tokens=mask.sum(), num_seqs=6, max_len=5)
    parts = sum(agg_loss(L[i : i + 2], mask[i : i + 2], mode, **counts) for i in range(0, 6, 2))
    close(parts, full, atol=1e-12)
    # with per-micro-batch counts the token-mean would differ (this batch is ragged)
    if mode == "token-mean":
        local = sum(agg_loss(L[i : i + 2], mask[i : i + 2], mode) / 3 for i in range(0, 6, 2))
        assert abs(float(local - full)) > 1e-3


# ------------------------------------------------------------------------------------- losses


def test_policy_loss_clipping_by_hand():
    eps = 0.2
    ratio = T_([[1.5, 0.5, 0.5, 1.5, 1.1]], dtype=torch.float64)
    adv = T_([[1.0, -1.0, 1.0, -1.0, 2.0]], dtype=torch.float64)
    old = torch.zeros_like(ratio)
    loss, clipped, r = _pg("vanilla", ratio.log(), old, adv, cliprange=eps)
    # A>0, r=1.5>1.2: max(-1.5, -1.2) = -1.2 (clipped) ; A<0, r=0.5<0.8: max(0.5, 0.8) = 0.8 (clipped)
    # A>0, r=0.5: max(-0.5, -0.8) = -0.5 ; A<0, r=1.5: max(1.5, 1.2) = 1.5 ; inside: -2·1.1 = -2.2
    close(loss, T_([[-1.2, 0.8, -0.5, 1.5, -2.2]], dtype=torch.float64), atol=1e-12)
    assert clipped.tolist() == [[True, True, False, False, False]]
    close(r, ratio, atol=1e-12)


def test_pad_equals_eos_mask_drops_the_eos_token_by_hand():
    eos = 9
    raw = T_([[5, 2, 9, 4], [9, 3, 3, 3], [5, 6, 7, 8]])
    # pad = EOS: after truncation the EOS and the padding look alike, and the first "pad" is the EOS itself
    ids, mask, has_eos = truncate_after_eos(raw, eos, eos)
    assert ids.tolist() == [[5, 2, 9, 9], [9, 9, 9, 9], [5, 6, 7, 8]] and has_eos.tolist() == [True, True, False]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]  # the right mask keeps the EOS
    assert pad_based_mask(ids, eos).tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]  # the EOS falls out
    assert last_token_index(pad_based_mask(ids, eos)).tolist() == [1, 0, 3]  # the score is read before the EOS
    # with a distinct pad id (0) the pad-based mask is the right one
    ids, mask, _ = truncate_after_eos(raw, eos, 0)
    assert torch.equal(pad_based_mask(ids, 0), mask)


def _pg(name, logprobs, old, adv, mask=None, cliprange=0.2, cliprange_high=0.28, clip_ratio_c=3.0):
    mask = torch.ones_like(logprobs) if mask is None else mask
    return POLICY_LOSSES.get(name)(logprobs, old, adv, mask, cliprange=cliprange, cliprange_high=cliprange_high,
                                   clip_ratio_c=clip_ratio_c)


def test_clip_higher_by_hand():
    ratio = T_([[1.3, 1.3, 0.7, 0.75]], dtype=torch.float64)
    adv = T_([[1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    loss, clipped, r = _pg("clip_higher", ratio.log(), torch.zeros_like(ratio), adv)
    # clip(r, 0.8, 1.28) = [1.28, 1.28, 0.8, 0.8]
    # A=1, r=1.3: max(-1.3, -1.28) = -1.28 (clipped; vanilla would stop at -1.2) ; A=-1, r=1.3: max(1.3, 1.28) = 1.3
    # A=-1, r=0.7: max(0.7, 0.8) = 0.8 (clipped) ; A=1, r=0.75: max(-0.75, -0.8) = -0.75
    close(loss, T_([[-1.28, 1.3, 0.8, -0.75]], dtype=torch.float64), atol=1e-12)
    assert clipped.tolist() == [[True, False, True, False]]
    close(_pg("vanilla", ratio.log(), torch.zeros_like(ratio), adv)[0][:, :1], T_([[-1.2]], dtype=torch.float64), atol=1e-12)


def test_dual_clip_by_hand():
    ratio = T_([[5.0, 2.0, 5.0, 0.5]], dtype=torch.float64)
    adv = T_([[-1.0, -1.0, 1.0, -2.0]], dtype=torch.float64)
    loss, clipped, _ = _pg("dual_clip", ratio.log(), torch.zeros_like(ratio), adv, clip_ratio_c=3.0)
    # A=-1, r=5: vanilla max(5, 1.2) = 5, bounded by -c·A = 3 ; A=-1, r=2: 2 < 3 stays
    # A=+1, r=5: vanilla -1.2 (no bound for A > 0) ; A=-2, r=0.5: vanilla max(1, 1.6) = 1.6 < 6 stays
    close(loss, T_([[3.0, 2.0, -1.2, 1.6]], dtype=torch.float64), atol=1e-12)
    assert clipped.tolist() == [[True, False, True, True]]


def test_gspo_sequence_ratio_by_hand():
    logr = T_([[math.log(2.0), 0.0], [math.log(1.1), 5.0]], dtype=torch.float64).requires_grad_(True)
    mask = T_([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    adv = T_([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    loss, clipped, ratio = _pg("gspo", logr, torch.zeros_like(logr), adv, mask, cliprange=0.2, cliprange_high=0.2)
    # row 0: s = exp((ln 2 + 0)/2) = √2, A = 1: max(-√2, -1.2) = -1.2 on both tokens (clipped)
    # row 1: s = exp(ln 1.1 / 1) = 1.1 (the padding's log-ratio 5 is ignored), A = -1: max(1.1, 1.1) = 1.1
    close(ratio.detach(), T_([[math.sqrt(2)] * 2, [1.1] * 2], dtype=torch.float64), atol=1e-12)
    close(loss.detach(), T_([[-1.2, -1.2], [1.1, 1.1]], dtype=torch.float64), atol=1e-12)
    assert clipped.tolist() == [[True, True], [False, False]]
    # ∂(-A·s)/∂log r_t = -A·s/n on real tokens: row 1 has n = 1, so 1.1 at its token and 0 at its padding
    (loss * mask).sum().backward()
    close(logr.grad, T_([[0.0, 0.0], [1.1, 0.0]], dtype=torch.float64), atol=1e-12)
    # the upper bound is ε_high: with 0.5 row 0 stays inside (s = √2 < 1.5), loss -√2
    loss, _, _ = _pg("gspo", logr.detach(), torch.zeros_like(logr), adv, mask, cliprange=0.2, cliprange_high=0.5)
    close(loss[0], T_([-math.sqrt(2)] * 2, dtype=torch.float64), atol=1e-12)


def test_gspo_token_gradient_by_hand():
    # inside the clip range (ε = 1): s = exp((0.1 + 0.3)/2) = e^0.2 on both tokens of the row
    logr = T_([[0.1, 0.3]], dtype=torch.float64).requires_grad_(True)
    mask = torch.ones_like(logr)
    s = math.exp(0.2)
    # per-token advantages: GSPO-token gives token t the gradient -A_t·s (not -mean(A)·s as d s/d log r_t would)
    adv = T_([[2.0, -1.0]], dtype=torch.float64)
    loss, clipped, ratio = _pg("gspo", logr, torch.zeros_like(logr), adv, mask, cliprange=1.0, cliprange_high=1.0)
    close(ratio.detach(), T_([[s, s]], dtype=torch.float64), atol=1e-12)
    assert not clipped.any()
    loss.sum().backward()
    close(logr.grad, T_([[-2.0 * s, 1.0 * s]], dtype=torch.float64), atol=1e-12)
    # one advantage per sequence: the row's token mean has the gradient of GSPO's -A·s_i (eq. 7), -A·s/n per token
    logr.grad = None
    loss, _, _ = _pg("gspo", logr, torch.zeros_like(logr), T_([[3.0, 3.0]], dtype=torch.float64), mask,
                     cliprange=1.0, cliprange_high=1.0)
    loss.mean().backward()
    close(logr.grad, T_([[-3.0 * s / 2, -3.0 * s / 2]], dtype=torch.float64), atol=1e-12)


def test_reinforce_loss_is_unclipped_and_its_gradient_at_ratio_one_is_minus_advantage():
    logprobs = T_([[-0.5, -1.0, -2.0]], dtype=torch.float64).requires_grad_(True)
    adv = T_([[2.0, -3.0, 0.5]], dtype=torch.float64)
    loss, clipped, ratio = _pg("reinforce", logprobs, logprobs.detach(), adv)
    close(ratio.detach(), torch.ones_like(adv), atol=0)
    assert not clipped.any()
    loss.sum().backward()
    close(logprobs.grad, -adv, atol=1e-12)
    far, clipped, _ = _pg("reinforce", T_([[math.log(3.0)]], dtype=torch.float64), T_([[0.0]], dtype=torch.float64),
                          T_([[1.0]], dtype=torch.float64))
    close(far, T_([[-3.0]], dtype=torch.float64), atol=1e-12)  # no clip at r = 3


# ------------------------------------------------------------- KL as a loss, by exact enumeration


def _categorical():
    """A 5-way categorical policy π = softmax(θ), a reference and an older policy (float64)."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(1, 5, dtype=torch.float64, generator=g).requires_grad_(True)
    ref = torch.log_softmax(torch.randn(1, 5, dtype=torch.float64, generator=g), dim=1)
    old = torch.log_softmax(torch.randn(1, 5, dtype=torch.float64, generator=g), dim=1)
    return theta, ref, old


def _grad(loss, theta):
    return torch.autograd.grad(loss, theta, retain_graph=True)[0]


def test_kl_as_loss_gradients_by_exact_enumeration():
    theta, ref, _ = _categorical()
    logp = torch.log_softmax(theta, dim=1)
    pi = logp.exp()
    exact = _grad((pi * (logp - ref)).sum(), theta)  # ∇ KL(π ‖ π_ref), closed form
    # k1 in the reward: the detached k1 times the score function, in expectation over π
    k1_in_reward = _grad((pi.detach() * (logp - ref).detach() * logp).sum(), theta)
    torch.testing.assert_close(k1_in_reward, exact, rtol=0, atol=1e-14)

    def as_loss(name):  # E_π[∇ k_n] with the sampling distribution held fixed (on-policy: old = current)
        return _grad((pi.detach() * kl_loss_terms(logp, ref, logp.detach(), KL_ESTIMATORS.get(name))).sum(), theta)

    torch.testing.assert_close(as_loss("k2"), exact, rtol=0, atol=1e-14)  # k2 as loss ≡ k1 in reward
    torch.testing.assert_close(as_loss("k1"), torch.zeros_like(exact), rtol=0, atol=1e-15)  # E_π[∇log π] = 0
    k3 = as_loss("k3")  # E_π[(1 − π_ref/π) ∇log π] = Σ (π − π_ref) ∇log π: biased
    torch.testing.assert_close(k3, _grad(((pi - ref.exp()).detach() * logp).sum(), theta), rtol=0, atol=1e-14)
    assert (k3 - exact).abs().max() > 1e-2


def test_off_policy_kl_as_loss_needs_the_importance_weight():
    theta, ref, old = _categorical()
    logp = torch.log_softmax(theta, dim=1)
    exact = _grad((logp.exp() * (logp - ref)).sum(), theta)
    k2 = KL_ESTIMATORS.get("k2")
    # samples drawn from π_old ≠ π_θ: the expectation weights are π_old
    plain = _grad((old.exp() * kl_loss_terms(logp, ref, old, k2)).sum(), theta)
    weighted = _grad((old.exp() * kl_loss_terms(logp, ref, old, k2, importance_weight=True)).sum(), theta)
    torch.testing.assert_close(weighted, exact, rtol=0, atol=1e-14)
    assert (plain - exact).abs().max() > 1e-2
    # on-policy the weight is exactly 1: same values, same gradient
    a = kl_loss_terms(logp, ref, logp.detach(), k2, importance_weight=True)
    b = kl_loss_terms(logp, ref, logp.detach(), k2)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(_grad(a.sum(), theta), _grad(b.sum(), theta), rtol=0, atol=0)


def test_value_losses_by_hand():
    assert VALUE_LOSSES.names() == ["clipped", "mse"]
    old = T_([[0.0, 0.0, 0.0]])
    values = T_([[1.0, 1.0, 0.1]])
    returns = T_([[1.0, -1.0, 0.5]])
    loss, clipped = VALUE_LOSSES.get("clipped")(values, old, returns, cliprange_value=0.2)
    # V_clip = [0.2, 0.2, 0.1]
    # col 0: (V-R)² = 0, (V_clip-R)² = 0.64 → 0.32, clipped ; col 1: 4 vs 1.44 → 2.0, not clipped
    # col 2: inside the range, 0.16 both → 0.08
    close(loss, [[0.32, 2.0, 0.08]])
    assert clipped.tolist() == [[True, False, False]]
    loss, clipped = VALUE_LOSSES.get("mse")(values, old, returns, cliprange_value=0.2)
    close(loss, [[0.0, 2.0, 0.08]])
    assert not clipped.any()


# ---------------------------------------------------------------------------------------- EOS


def test_truncate_after_eos_cases():
    eos, pad = 2, 0
    ids = T_([[5, 2, 7, 8], [5, 6, 7, 8], [2, 5, 2, 6], [5, 6, 7, 2]])
    out, mask, has_eos = truncate_after_eos(ids, eos, pad)
    assert out.tolist() == [[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0], [5, 6, 7, 2]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert has_eos.tolist() == [True, False, True, True]
    assert last_token_index(mask).tolist() == [1, 3, 0, 3]


def test_truncate_after_eos_pad_equals_eos():
    eos = pad = 2
    ids = T_([[5, 2, 7, 2], [5, 6, 2, 2], [5, 6, 7, 8]])
    out, mask, has_eos = truncate_after_eos(ids, eos, pad)
    assert out.tolist() == [[5, 2, 2, 2], [5, 6, 2, 2], [5, 6, 7, 8]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert has_eos.tolist() == [True, True, False]
    # the score lands on the EOS token, not on a trailing pad (TRL #3750), and the penalty applies
    scores = apply_missing_eos_penalty(T_([0.3, 0.4, 0.9]), has_eos, -1.0)
    close(scores, [0.3, 0.4, -1.0])
    rewards = token_rewards(scores, torch.zeros(3, 4), 0.1, mask)
    close(rewards, [[0, 0.3, 0, 0], [0, 0, 0.4, 0], [0, 0, 0, -1.0]])


def test_missing_eos_penalty():
    scores, has_eos = T_([0.7, -3.0, 0.2]), T_([False, False, True])
    close(apply_missing_eos_penalty(scores, has_eos, -1.0), [-1.0, -1.0, 0.2])  # replaced, not added
    close(apply_missing_eos_penalty(scores, has_eos, None), scores, atol=0)
    with pytest.raises(ValueError):
        last_token_index(T_([[1, 1], [0, 0]]))


# ------------------------------------------------------------------------------------ rewards


def test_token_rewards_by_hand():
    scores = T_([1.0, -2.0])
    kl = T_([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    mask = T_([[1, 1, 1], [1, 1, 0]])
    # row 0: [-0.05, -0.1, -0.15 + 1] ; row 1: [-0.2, -0.25 - 2, 0 (padding)]
    close(token_rewards(scores, kl, 0.5, mask), [[-0.05, -0.1, 0.85], [-0.2, -2.25, 0.0]])
    with pytest.raises(ValueError):
        token_rewards(scores, kl, 0.5, T_([[1, 1, 1], [0, 0, 0]]))


def test_clip_scores():
    s = T_([-3.0, 0.5, 2.0])
    close(clip_scores(s, 1.0), [-1.0, 0.5, 1.0])
    close(clip_scores(s, None), s, atol=0)
    with pytest.raises(ValueError):
        clip_scores(s, 0.0)


# ----------------------------------------------------------------------------------- registry


def test_unknown_names_list_registered():
    for reg, bad in ((KL_ESTIMATORS, "k4"), (KL_PLACEMENTS, "both"), (KL_CONTROLLERS, "pid"), (ADV_ESTIMATORS, "vtrace"),
                     (LOSS_AGG, "token_sum")):
        with pytest.raises(UnknownComponentError) as e:
            reg.get(bad)
        assert str(e.value).startswith(f"{reg.axis}: unknown variant {bad!r}")
        assert str(e.value).endswith("choose from: " + ", ".join(reg.names()))
    with pytest.raises(UnknownComponentError) as e:
        agg_loss(torch.ones(1, 1), torch.ones(1, 1), "token_mean")
    assert "did you mean 'token-mean'" in str(e.value)
    # the four verl modes, the three Schulman estimators (reference names; shared/reference)
    assert LOSS_AGG.names() == ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                                "prompt-mean"]
    assert KL_ESTIMATORS.names()[:3] == ["k1", "k2", "k3"]


# ------------------------------------------------------------------------------------------ registries


def test_registration_checks_the_axis_signature():
    with pytest.raises(ValueError, match=r"takes \(logprobs\), but the axis declares \(logprobs, ref_logprobs\)"):
        KL_ESTIMATORS.register("half")(lambda logprobs: logprobs)
    assert "half" not in KL_ESTIMATORS
    with pytest.raises(ValueError, match="already registered"):
        KL_ESTIMATORS.register("k1")(lambda logprobs, ref_logprobs: logprobs)


def test_a_variant_registered_anywhere_is_selectable_from_a_config():
    from harness.config import ConfigError, build_config

    @LOSS_AGG.register("token-sum-test")
    def token_sum(loss_mat, mask, num_tokens, num_seqs, max_len, group_lengths=None):
        return (loss_mat * mask).sum()

    try:
        cfg = build_config({"ppo": {"loss_agg": "token-sum-test"}})
        assert cfg.ppo.loss_agg == "token-sum-test"
        close(agg_loss(T_([[1.0, 2.0]]), T_([[1.0, 0.0]]), cfg.ppo.loss_agg), 1.0)
    finally:
        del LOSS_AGG._items["token-sum-test"], LOSS_AGG._meta["token-sum-test"]
    with pytest.raises(ConfigError, match="ppo.loss_agg: unknown variant 'token-sum-test'"):
        build_config({"ppo": {"loss_agg": "token-sum-test"}})


def test_docs_component_list_is_the_generated_one():
    from pathlib import Path

    from harness.registry import DOCS_MARKERS, component_table

    page = (Path(__file__).resolve().parent.parent / "docs" / "components.md").read_text()
    begin, end = DOCS_MARKERS
    block = page.split(begin, 1)[1].split(end, 1)[0].strip()
    assert block == component_table(), "run `harness components --write-docs`"
    assert "- `ppo.kl_estimator`: `k1` | `k2` | `k3`" in block


def test_overlong_penalty_hand_values():
    """DAPO Eq. 13 with L_max = 10, L_cache = 4: no penalty up to 6 tokens, then −1/4 per token, −1 at and past 10."""
    from harness.rl.components.rewards import overlong_penalty

    got = overlong_penalty(torch.tensor([3, 6, 7, 9, 10, 11]), 10, 4)
    assert got.tolist() == [0.0, 0.0, -0.25, -0.75, -1.0, -1.0]
    with pytest.raises(ValueError, match=r"buffer must be in \[1, 10\]"):
        overlong_penalty(torch.tensor([3]), 10, 11)


def test_informative_groups_and_fill_groups_hand_values():
    from harness.rl.components.rewards import fill_groups, informative_groups

    keep = informative_groups(torch.tensor([1.0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1]), 4)
    assert keep.tolist() == [True, False, False]
    rounds = [torch.tensor([False, True, False]), torch.tensor([True, False, False])]
    assert fill_groups(rounds, 3) == [(0, 1), (1, 0), (0, 0)]  # informative first, then topped up in round order
    assert fill_groups(rounds, 1) == [(0, 1)]
    with pytest.raises(ValueError, match="multiple of group_size"):
        informative_groups(torch.zeros(6), 4)


def test_grpo_batch_std_hand_values():
    """Lite PPO: returns [1, 0 | 1, 1] → group-centred [0.5, −0.5, 0, 0] divided by the batch's unbiased std 0.5."""
    from harness.rl.components.advantages import grpo_batch_std

    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.5, 0.5], [1.0, 0.0]])
    adv, ret = grpo_batch_std(rewards, None, mask, group_size=2)
    want = torch.tensor([1.0, -1.0, 0.0, 0.0]) * 0.5 / (0.5 + 1e-6)
    assert torch.allclose(adv, want[:, None] * mask, atol=1e-7) and torch.equal(adv, ret)
