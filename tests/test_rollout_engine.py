"""The rollout engine apart from the trainer (harness.rl.engine) and the mismatch corrections
(harness.rl.components.rollout_correction): hand values, the peers' published definitions, and the loop."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from harness.rl.components.rollout_correction import ROLLOUT_CORRECTIONS, mismatch_metrics

KW = dict(c=2.0, low=0.5, high=2.0)


def _lw(*ws):
    return torch.log(torch.tensor([list(ws)], dtype=torch.float32))


def test_token_corrections_hand_values():
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    lw = _lw(3.0, 1.5, 0.4, 5.0)  # the last token is padding
    get = ROLLOUT_CORRECTIONS.get
    assert get("none")(lw, mask, **KW).tolist() == [[1.0, 1.0, 1.0, 0.0]]
    assert get("tis")(lw, mask, **KW) == pytest.approx(torch.tensor([[2.0, 1.5, 0.4, 0.0]]))  # min(w, 2)
    assert get("mis")(lw, mask, **KW).tolist() == [[0.0, 1.0, 0.0, 0.0]]  # 1 inside [0.5, 2], 0 outside
    assert get("icepop")(lw, mask, **KW) == pytest.approx(torch.tensor([[0.0, 1.5, 0.0, 0.0]]))  # w inside the band
    # the band's ends are inside
    assert get("mis")(_lw(0.5, 2.0), torch.ones(1, 2), **KW).tolist() == [[1.0, 1.0]]


def test_sequence_corrections_hand_values():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    lw = torch.log(torch.tensor([[2.0, 2.0, 0.5],    # product 2, geometric mean 2^(1/3)
                                 [4.0, 4.0, 99.0],   # product 16 (the padding's 99 ignored), geometric mean 4
                                 [0.5, 0.5, 1.0]]))  # product 1/4, geometric mean 4^(-1/3)
    seq_tis = ROLLOUT_CORRECTIONS.get("seq_tis")(lw, mask, c=3.0, low=0.5, high=2.0)
    assert seq_tis == pytest.approx(torch.tensor([[2.0] * 3, [3.0, 3.0, 0.0], [0.25] * 3]))  # min(Π w, 3)
    seq_mask = ROLLOUT_CORRECTIONS.get("seq_mask")(lw, mask, **KW)
    assert seq_mask.tolist() == [[1.0] * 3, [0.0] * 3, [1.0] * 3]  # 4 is outside [0.5, 2]; 0.63 and 1.26 inside
    # an overflowing product is capped in log space (no inf): 200 tokens of w = 2 → 2^200 → c
    big = ROLLOUT_CORRECTIONS.get("seq_tis")(torch.full((1, 200), math.log(2.0)), torch.ones(1, 200), **KW)
    assert torch.isfinite(big).all() and big.max().item() == pytest.approx(2.0)


def test_corrections_against_the_peers_published_definitions():
    """TRL's vllm_importance_sampling_mode and verl's rollout_is/rollout_rs, each written here from its definition
    (the ratio, then clamp or mask), on random log-ratios: the registry's functions agree."""
    g = torch.Generator().manual_seed(0)
    lw = torch.randn(6, 9, generator=g) * 0.8
    mask = (torch.rand(6, 9, generator=g) > 0.2).float()
    mask[:, 0] = 1.0
    ratio = torch.exp(lw)
    token_truncate = torch.clamp(ratio, max=2.0) * mask                                      # TRL token_truncate
    seq_ratio = torch.exp((lw * mask).sum(-1, keepdim=True))
    sequence_truncate = torch.clamp(seq_ratio, max=2.0).expand_as(lw) * mask                 # TRL sequence_truncate
    token_rs = ((ratio >= 0.5) & (ratio <= 2.0)).float() * mask                               # verl rollout_rs=token
    geo = torch.exp((lw * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True))
    geometric_rs = ((geo >= 0.5) & (geo <= 2.0)).float().expand_as(lw) * mask                # verl rollout_rs=geometric
    icepop = ratio * ((ratio >= 0.5) & (ratio <= 2.0)).float() * mask                         # IcePop's M(k)
    for name, want in (("tis", token_truncate), ("seq_tis", sequence_truncate), ("mis", token_rs),
                       ("seq_mask", geometric_rs), ("icepop", icepop)):
        got = ROLLOUT_CORRECTIONS.get(name)(lw, mask, **KW)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), name
        assert not got.requires_grad


def test_mismatch_metrics_hand_values():
    lp = torch.log(torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.3, 0.3]]))
    ep = torch.log(torch.tensor([[0.25, 0.2, 0.7], [0.3, 0.9, 0.3]]))  # w = (2, 1, ·), (1, 1/3, ·)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    m = mismatch_metrics(lp, ep, mask)
    l2, l3 = math.log(2.0), math.log(3.0)
    assert m["rollout/mismatch_abs_mean"] == pytest.approx((l2 + l3) / 4)
    assert m["rollout/mismatch_abs_max"] == pytest.approx(l3)
    assert m["rollout/seq_log_ratio"] == pytest.approx((l2 - l3) / 2)
    assert m["rollout/seq_log_ratio_abs"] == pytest.approx((l2 + l3) / 2)
    # k3 = w − 1 − log w: (2 − 1 − ln 2) + (1/3 − 1 + ln 3), over 4 tokens
    assert m["rollout/kl_engine_trainer"] == pytest.approx(((1 - l2) + (1 / 3 - 1 + l3)) / 4)
    assert m["rollout/outside_band"] == pytest.approx(1 / 4)  # only w = 1/3 is outside [1/2, 2]
    assert all(v == 0.0 for v in mismatch_metrics(lp, lp, mask).values())
    with pytest.raises(ValueError, match="no real token"):
        mismatch_metrics(lp, ep, torch.zeros_like(mask))


def test_fp8_round_hand_values_and_channel_axis():
    from harness.rl.engine import FP8_MAX, fp8_round

    assert FP8_MAX == 448.0
    w = torch.tensor([[448.0, 1.3], [0.0, 0.0], [2.0, -0.3]])
    got = fp8_round(w)  # rows are output channels; scale 1 for the first row, 2/448 for the third
    assert got[0].tolist() == [448.0, 1.25] and got[1].tolist() == [0.0, 0.0]
    s = 2.0 / 448.0
    want = torch.tensor([448.0, -0.3 / s]).to(torch.float8_e4m3fn).float() * s
    assert torch.allclose(got[2], want) and got[2, 0].item() == pytest.approx(2.0)
    assert torch.equal(fp8_round(w.T, out_dim=1), got.T)  # Conv1D's [in, out] weight: the same rounding


def _tiny_policy(seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=24, n_embd=32, n_layer=2, n_head=2)).eval()


def test_engine_precisions_order_the_mismatch_and_leave_the_trainer_alone():
    from harness.rl.engine import PRECISIONS, RolloutEngine
    from harness.rl.rollout import response_logprobs

    policy = _tiny_policy()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    qr = torch.randint(0, 40, (8, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        trainer, _ = response_logprobs(policy, qr, 6, 0.7)
    mask = torch.ones_like(trainer)
    gaps = {}
    for precision in PRECISIONS:
        engine = RolloutEngine(policy, precision)
        gaps[precision] = mismatch_metrics(trainer, engine.logprobs(qr, 6, 0.7), mask)["rollout/mismatch_abs_mean"]
    assert gaps["fp32"] <= 1e-6
    assert 0 < gaps["bf16_fp32_head"] <= gaps["bf16"] < gaps["fp8"]
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())  # the trainer is not modified
    assert policy.lm_head.weight is policy.transformer.wte.weight  # its tie kept
    head = RolloutEngine(policy, "bf16_fp32_head").model
    assert head.lm_head.weight.dtype == torch.float32 and head.transformer.h[0].attn.c_attn.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="ppo.rollout_precision: unknown precision 'fp16'; choose from: fp32"):
        RolloutEngine(policy, "fp16")


def test_sync_pushes_the_trainers_new_weights():
    from harness.rl.engine import RolloutEngine, fp8_round

    policy = _tiny_policy()
    engine, fp8 = RolloutEngine(policy, "fp32"), RolloutEngine(policy, "fp8")
    with torch.no_grad():
        for q in policy.parameters():
            q.add_(0.01)
    assert not torch.equal(engine.model.transformer.h[0].mlp.c_fc.weight, policy.transformer.h[0].mlp.c_fc.weight)
    assert engine.sync(policy) >= 0.0 and fp8.sync(policy) >= 0.0
    assert all(torch.equal(a, b) for a, b in zip(engine.model.state_dict().values(), policy.state_dict().values()))
    w = policy.transformer.h[0].mlp.c_fc.weight  # GPT-2 Conv1D: [in, out], rounded per output channel
    assert torch.equal(fp8.model.transformer.h[0].mlp.c_fc.weight, fp8_round(w, out_dim=1).to(torch.bfloat16))


def test_correct_decoupled_and_bypass():
    from harness.config import build_config
    from harness.rl.engine import correct

    lp, ep = torch.log(torch.tensor([[0.6, 0.1]])), torch.log(torch.tensor([[0.2, 0.1]]))  # w = (3, 1)
    mask = torch.ones(1, 2)
    p = build_config({"ppo": {"rollout_precision": "bf16", "rollout_correction": "tis"}}).ppo
    old, w, m = correct(p, lp, ep, mask)
    assert torch.equal(old, lp) and w == pytest.approx(torch.tensor([[2.0, 1.0]]))
    assert m["rollout/weight_mean"] == pytest.approx(1.5) and m["rollout/outside_band"] == pytest.approx(0.5)
    assert m["rollout/weight_std"] == pytest.approx(0.5)  # weights (2, 1): population SD 0.5
    p = build_config({"ppo": {"rollout_precision": "bf16", "rollout_bypass": True}}).ppo
    old, w, m = correct(p, lp, ep, mask)
    assert torch.equal(old, ep) and w is None and m["rollout/weight_mean"] == 1.0 and m["rollout/weight_std"] == 0.0


def test_rollout_settings_are_validated_and_left_out_of_the_dump_at_their_defaults():
    from harness.config import ConfigError, build_config

    base = build_config({})
    assert not base.ppo.uses_engine and "rollout_precision" not in base.to_dict()["ppo"]
    assert build_config({"ppo": {"rollout_correction": "tis"}}).ppo.uses_engine
    with pytest.raises(ConfigError, match="ppo.rollout_correction must be 'none' with it, not 'tis'"):
        build_config({"ppo": {"rollout_bypass": True, "rollout_correction": "tis"}})
    with pytest.raises(ConfigError, match=r"ppo.rollout_band_high \(0.4\) must be > ppo.rollout_band_low \(0.5\)"):
        build_config({"ppo": {"rollout_band_high": 0.4}})
    with pytest.raises(ConfigError, match="ppo.rollout_correction: unknown variant 'tiss'"):
        build_config({"ppo": {"rollout_correction": "tiss"}})
    with pytest.raises(ConfigError, match="ppo.rollout_precision"):
        build_config({"ppo": {"rollout_precision": "fp16"}})


def test_tis_with_an_fp32_engine_gives_the_uncorrected_losses(isolated_results, tmp_path):
    """The negative control: an fp32 engine is an exact copy, w ≡ 1, so TIS changes no loss (within 1e-6) and the
    mismatch metrics are 0; a bf16 engine's are not, and every declared metric is logged."""
    from harness.rl.callbacks import MetricsRecorder
    from harness.rl.metrics import run_metric_names
    from harness.rl.runner import run
    from tests.test_chain_sum import _chain_cfg

    history = {}
    for name, extra in (("plain", []), ("tis", ["ppo.rollout_correction=tis"]),
                        ("bf16", ["ppo.rollout_precision=bf16", "ppo.rollout_correction=tis"])):
        cfg = _chain_cfg(["ppo.adv_estimator=grpo", "ppo.total_iterations=2", *extra])
        rec = MetricsRecorder()
        run(cfg, tmp_path / name, callbacks=[rec], progress=False)
        history[name] = rec.history
        if extra:
            assert set(run_metric_names(cfg)) >= {"rollout/mismatch_abs_mean", "time/sync"}
            assert all(k in rec.history for k in ("rollout/mismatch_abs_mean", "rollout/weight_mean", "time/sync"))
    for key in ("loss/policy", "policy/ratio_mean", "objective/score"):
        a, b = [v for _, v in history["plain"][key]], [v for _, v in history["tis"][key]]
        assert a == pytest.approx(b, abs=1e-6), key
    assert [v for _, v in history["tis"]["rollout/mismatch_abs_max"]] == [0.0, 0.0]
    assert [v for _, v in history["tis"]["rollout/weight_mean"]] == [1.0, 1.0]
    assert all(v > 0 for _, v in history["bf16"]["rollout/mismatch_abs_mean"])


def test_mismatch_command_refuses_bad_input_before_any_build_and_measures_the_sft_policy(isolated_results):
    """``harness mismatch``: an unknown precision or task is one line naming the allowed ones, before anything is
    built; on chain_sum's smoke SFT policy, fp32 gives 0 (≤ 1e-5 nats a token) and the lower precisions more."""
    from typer.testing import CliRunner

    from harness.bench.mismatch import COLUMNS, format_rows, measure
    from harness.cli import app
    from tests.test_chain_sum import _chain_cfg

    result = CliRunner().invoke(app, ["mismatch", "--precision", "fp16"])
    assert result.exit_code != 0
    assert "--precision: unknown precision 'fp16'; choose from: fp32, bf16_fp32_head, bf16, fp8" in result.output
    result = CliRunner().invoke(app, ["mismatch", "--task", "chain_sums"])
    assert result.exit_code != 0 and "chain_sums" in result.output and "chain_sum" in result.output
    # an override is checked against every named task's config before any build: chain_sum's option, review_sentiment
    with mock.patch("harness.bench.mismatch.measure", side_effect=AssertionError("must not build")):
        result = CliRunner().invoke(app, ["mismatch", "task.options.disjoint_heldout=true"])
    assert result.exit_code != 0 and "task.options" in result.output and "disjoint_heldout" in result.output, result.output
    with pytest.raises(ValueError, match="--prompts must be ≥ 1"):
        measure(_chain_cfg(), ["fp32"], n_prompts=0)
    rows = {r["precision"]: r for r in measure(_chain_cfg(), ["fp32", "bf16", "fp8"], n_prompts=8)}
    assert rows["fp32"]["mismatch_abs_max"] <= 1e-5 and rows["fp32"]["kl_engine_trainer"] <= 1e-5
    assert rows["bf16"]["mismatch_abs_mean"] > 1e-5 and rows["fp8"]["mismatch_abs_mean"] > 1e-5
    assert all(r["tokens"] > 0 and r["generate_s"] > 0 and r["sync_s"] >= 0 for r in rows.values())
    table = format_rows(list(rows.values())).splitlines()
    assert table[0].split() == ["task", "precision", "tokens", *COLUMNS] and len(table) == 4
