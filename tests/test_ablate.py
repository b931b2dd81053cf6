"""Ablation runner: spec validation, config resolution, MLflow child runs, failures, resume and
recovery of runs left RUNNING by a killed process.

The end-to-end tests run real smoke-scale PPO runs (the smoke pipeline is built once per pytest run
in a temporary ``HARNESS_RESULTS``; see ``ablation_fixtures.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ablation_fixtures import child_runs, kl_placement_smoke, results_env, results_root, write_spec as _write

from harness.experiments.ablate import (
    experiment_name,
    is_study,
    list_ablations,
    load_spec,
    plan_runs,
    resolve_config,
    run_ablation,
    run_hash,
)
from harness.config import ConfigError, flatten
from harness.errors import HarnessError
from harness.config.presets import SCALE_PRESETS
from harness.infra.safety import display_path

SHIPPED = ["aa_rollout_tis", "aa_sampler", "advantage_estimator", "advantage_whitening", "critic_init", "dropout", "eos_trick", "grpo_length_bias", "kl_coef",
           "kl_estimator", "kl_loss_estimator", "kl_pattern_collapse", "kl_placement", "logprob_temperature", "loss_aggregation", "off_policyness",
           "overoptimization", "policy_loss", "reasoning_adv_norm", "reasoning_batch_filter", "reasoning_clipping", "reasoning_dynamic_sampling",
           "reasoning_entropy_tokens", "reasoning_estimators", "reasoning_kl", "reasoning_kl_free", "reasoning_loss_agg",
           "reasoning_loss_type", "reasoning_passk_training", "reasoning_polarity", "reasoning_prompt_mean",
           "reasoning_vapo", "reward_normalization", "rollout_correction", "rollout_mismatch",
           "value_clipping"]


TINY = """\
question: Is a diverging run recorded while the ablation goes on?
baseline: ok
variants:
  ok: {}
  # a KL coefficient at the top of the float range (an infinite one is refused as a typo): the per-token
  # KL penalties overflow to inf and the rewards to NaN at iteration 0, which the loop's finiteness check
  # turns into TrainingDivergedError
  diverge: {ppo: {kl_coef: 1.0e+308}}
claims:
  - {claim: the finite run beats the diverged one, kind: finding, source: test, section: none, setting_note: a test,
     metric: final/score, a: ok, expect: greater, b: diverge, margin: 0.1}
scales:
  smoke: {seeds: 1, overrides: {ppo: {total_iterations: 2}}}
"""


# ------------------------------------------------------------------------------------------------
# Specs (fast)
# ------------------------------------------------------------------------------------------------


def _gold_as(config, **fields):
    """``config`` with these ``pipeline.gold`` fields changed (the same run judged by another gold)."""
    gold = config.pipeline.gold.model_copy(update=fields)
    return config.model_copy(update={"pipeline": config.pipeline.model_copy(update={"gold": gold})})


def test_shipped_specs_list_and_validate():
    with results_env():
        assert list_ablations() == SHIPPED
        for name in SHIPPED:
            spec = load_spec(name)  # resolves and validates every variant at every scale
            assert spec.baseline in spec.variants
            # the A/A control judges at the smoke scale too, so it runs the rule's 10 seeds there
            assert spec.seeds_for("smoke") == (list(range(10)) if name == "aa_sampler" else [0, 1])
            if name == "overoptimization":  # the proxy sizes only at full scale; 10 seeds of 80 iterations by default
                assert spec.seeds_for("default") == list(range(10)) and spec.seeds_for("full") == list(range(10))
                assert spec.verdict.min_seeds == 10
                assert len(spec.variants_for("default")) == 3 and len(spec.variants_for("full")) == 12
                assert len(spec.claims_for("default")) == 3
                assert resolve_config(spec, "default", "none_p1k", 0).ppo.total_iterations == 80
            elif resolve_config(spec, "default", spec.baseline, 0).task.name == "chain_sum":  # 8 seeds a stage, verdict from 6
                assert name.startswith(("reasoning_", "rollout_", "aa_rollout_"))
                assert spec.seeds_for("default") == list(range(8)) and spec.verdict.min_seeds == 6
            else:
                assert spec.seeds_for("default") == list(range(10)) and spec.seeds_for("full") == list(range(20))
                assert spec.verdict.min_seeds == 10
            assert spec.verdict.rule == "welch"
            for c in spec.claims:  # every claim says what kind it is, where its source says it, how we differ
                assert c.section and c.setting_note and c.margin > 0
                # negative controls are the A/A comparisons, and only they
                assert c.kind == "control" if name.startswith("aa_") else c.kind in ("mechanism", "finding")
        kp = load_spec("kl_placement")
        loss = resolve_config(kp, "default", "loss", 0)
        assert (loss.ppo.kl_placement, loss.ppo.kl_estimator) == ("loss", "k3")
        assert loss.pipeline.gold.naturalness == "on"  # kl_placement's gold judges naturalness too
        assert [m.name for m in kp.metrics] == ["eval_final/gold", "matched_kl/gold", "eval_final/gold_sentiment",
                                                "eval_final/proxy", "eval_final/kl", "eval_final/collapsed"]
        agg = load_spec("loss_aggregation")
        assert sorted(resolve_config(agg, "default", v, 0).ppo.loss_agg for v in agg.variants) == sorted(
            ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
        ae = load_spec("advantage_estimator")
        assert [resolve_config(ae, "default", v, 0).ppo.adv_estimator for v in ae.variants] == [
            "gae", "grpo", "rloo", "rloo", "reinforce_pp"]
        assert not resolve_config(ae, "default", "gae", 0).ppo.truncate_after_eos  # fixed length: no claim on length
        bias = load_spec("grpo_length_bias")  # Dr. GRPO's claim is about length: variable-length responses
        dr = resolve_config(bias, "default", "dr_grpo", 0)
        assert (dr.ppo.truncate_after_eos, dr.ppo.adv_estimator, dr.ppo.loss_agg, dr.ppo.whiten_advantages) == (
            True, "dr_grpo", "seq-mean-token-sum-norm", False)
        # advantage_estimator's GRPO arm in the variable-length regime with GRPO's KL (k3 in the loss), judged by the
        # naturalness-aware gold: the config its setting note's `harness train` probe runs
        grpo = resolve_config(bias, "default", "grpo", 0)
        assert (grpo.ppo.kl_placement, grpo.ppo.kl_estimator, grpo.ppo.kl_coef) == ("loss", "k3", 0.05)
        from harness.config import load_config
        assert grpo.hash() == load_config(None, [
            "seed=0", "ppo.num_generations=4", "ppo.adv_estimator=grpo", "ppo.kl_placement=loss", "ppo.kl_estimator=k3",
            "pipeline.gold.naturalness=on", "pipeline.gold.naturalness_negatives=loops_and_symbol_soup"],
            scale="default", regime="variable_length").hash()
        published = resolve_config(ae, "default", "rloo_published", 0).ppo  # Ahmadian et al.: one unclipped update per batch
        assert (published.policy_loss, published.num_ppo_epochs, published.num_minibatches) == ("reinforce", 1, 1)
        # the default config is the baseline of the new axes too (its runs are reused across ablations)
        default = load_config(None, ["seed=0"], scale="default", regime="default").hash()
        # kl_placement's baseline is that config judged by the gold with its naturalness head (trained against loops
        # and soup), and nothing else
        judged = resolve_config(kp, "default", "reward", 0)
        assert judged.pipeline.gold.naturalness_negatives == "loops_and_symbol_soup"
        assert judged.hash() != default and _gold_as(judged, naturalness="off", naturalness_negatives="loops").hash() == default
        # the axes already moved to that gold share its runs: their baseline is kl_placement's, config for config
        for name, base in (("kl_loss_estimator", "k1_reward"), ("kl_estimator", "k1"), ("value_clipping", "on"),
                           ("dropout", "off"), ("advantage_whitening", "on"), ("policy_loss", "vanilla"),
                           ("reward_normalization", "normalized"), ("aa_sampler", "inverse_cdf"), ("kl_coef", "kl0.05"),
                           ("off_policyness", "e4_mb2")):
            assert resolve_config(load_spec(name), "default", base, 0).hash() == judged.hash(), name
        # the variable-length axes moved to that gold share one baseline: the EOS trick is the regime's default
        agg_base = resolve_config(agg, "default", "token-mean", 0)
        assert agg_base.pipeline.gold == judged.pipeline.gold
        assert agg_base.hash() == resolve_config(load_spec("eos_trick"), "default", "eos_trick", 0).hash()
        # with the KL term in the loss (k3), as grpo_length_bias has it: in the reward it halved every arm's length
        assert (agg_base.ppo.kl_placement, agg_base.ppo.kl_estimator, agg_base.ppo.truncate_after_eos) == ("loss", "k3", True)
        # overoptimization trains its proxies on that gold's labels (its own 9k-comparison pools, so no run is shared)
        oo = resolve_config(load_spec("overoptimization"), "default", "kl0.05_p1k", 0).pipeline
        assert oo.gold == judged.pipeline.gold and oo.reward_model.proxy_pool_pairs == 9000
        kle = load_spec("kl_loss_estimator")  # and its k3-as-a-loss and KL-free arms are kl_placement's other two
        assert [resolve_config(kle, "default", v, 0).hash() for v in ("k3_loss", "none")] == [
            resolve_config(kp, "default", v, 0).hash() for v in ("loss", "none")]
        # logprob_temperature, not yet run again, is that config judged by the loops-only head
        loops = _gold_as(judged, naturalness_negatives="loops")
        assert resolve_config(load_spec("logprob_temperature"), "default", "sampling", 0).hash() == loops.hash()


def test_config_resolution_order(tmp_path):
    _write(tmp_path, "order", """\
        question: q
        baseline: a
        base: {ppo: {total_iterations: 100, kl_coef: 0.2, cliprange: 0.3}}
        variants:
          a: {}
          b: {ppo: {cliprange: 0.1, num_ppo_epochs: 3}}
        claims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]
        scales:
          smoke: {seeds: [3, 5], overrides: {ppo: {num_ppo_epochs: 1}}}
        """)
    with results_env(tmp_path):
        spec = load_spec("order")
        smoke_b = resolve_config(spec, "smoke", "b", 5)
        # the smoke preset beats the base, the spec's scale overrides beat the preset, the variant beats both
        assert smoke_b.ppo.total_iterations == SCALE_PRESETS["smoke"]["ppo"]["total_iterations"]
        assert smoke_b.ppo.kl_coef == 0.2 and smoke_b.ppo.cliprange == 0.1 and smoke_b.ppo.num_ppo_epochs == 3
        assert smoke_b.seed == 5
        assert resolve_config(spec, "smoke", "a", 3).ppo.num_ppo_epochs == 1
        default_a = resolve_config(spec, "default", "a", 0)
        assert default_a.ppo.total_iterations == SCALE_PRESETS["default"]["ppo"]["total_iterations"] != 100
        assert default_a.ppo.cliprange == 0.3
        assert [(t.variant, t.seed) for t in plan_runs(spec, "smoke")] == [("a", 3), ("a", 5), ("b", 3), ("b", 5)]
        assert [t.seed for t in plan_runs(spec, "smoke", seeds=[7, 2])] == [2, 7, 2, 7]
        # the run identity ignores machine-local paths but not knobs
        moved = resolve_config(spec, "smoke", "a", 3).model_copy(deep=True)
        moved.pipeline.out_dir = "/elsewhere/pipeline"
        assert run_hash(moved) == run_hash(resolve_config(spec, "smoke", "a", 3))
        assert run_hash(resolve_config(spec, "smoke", "a", 5)) != run_hash(resolve_config(spec, "smoke", "a", 3))


@pytest.mark.parametrize(
    "body, expected",
    [
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\nseedz: 3\n",
         "seedz: unknown key; allowed keys: name, question, claims, baseline"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: bb, margin: 0.1}]\n",
         "claims.0.b: unknown variant 'bb' (did you mean 'b'?); variants: a, b"),
        ("question: q\nbaseline: z\nvariants: {a: {}, b: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\n",
         "baseline: unknown variant 'z'"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: better, b: b, margin: 0.1}]\n",
         "claims.0.expect: Input should be 'greater', 'less', 'not_greater', 'exceeds' or 'equivalent'"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: equivalent, b: b, margin: 0}]\n",
         "claims.0.margin: Input should be greater than 0"),
        ("question: q\nbaseline: a\nvariants: {a: {seed: 1}, b: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\n",
         "variants.a: 'seed' is set by the seeds axis"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\nscales: {huge: {seeds: 2}}\n",
         "scales.huge: Input should be 'smoke', 'default' or 'full' (got 'huge')"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {ppo: {kl_placment: loss}}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\n",
         "variant 'b' at scale smoke: invalid config: ppo.kl_placment: unknown key"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {ppo: {kl_placement: middle}}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\n",
         "ppo.kl_placement: unknown variant 'middle'"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\nclaims: [{claim: c, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\n",
         "claims.0.kind: Field required"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\nseed_offset: {c: 5}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\n",
         "seed_offset: unknown variant 'c'"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}, c: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\nscales: {default: {variants: [a, d]}}\n",
         "scales.default.variants: unknown variant 'd'"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}, c: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\nscales: {default: {variants: [b, c]}}\n",
         "scales.default.variants: must include the baseline 'a'"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\npanels: {small: [a, bb]}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: final/score, a: a, expect: greater, b: b, margin: 0.1}]\n",
         "panels.small: unknown variant 'bb' (did you mean 'b'?); variants: a, b"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: pair_matched_kl/kl, a: a, expect: greater, b: b, margin: 0.1}]\n",
         "claims.0: metric 'pair_matched_kl/kl': pair_matched_kl/ takes one of gold, proxy, gold_lexicon"),
        ("question: q\nbaseline: a\nvariants: {a: {}, b: {}}\nclaims: [{claim: c, kind: finding, source: s, section: t, setting_note: n, metric: pair_matched_responses/kl, a: a, expect: greater, b: b, margin: 0.1}]\n",
         "claims.0: metric 'pair_matched_responses/kl': pair_matched_responses/ takes one of pass1_greedy, gold"),
    ],
    ids=["unknown-key", "claim-variant", "baseline", "expect", "equivalent-margin", "seed-override", "scale", "knob", "knob-value",
         "claim-kind", "seed-offset", "scale-variant", "scale-baseline", "panel-variant", "pair-metric",
         "pair-responses-metric"],
)
def test_spec_validation_errors_are_one_line(tmp_path, body, expected):
    (tmp_path / "bad.yaml").write_text(body)
    with results_env(tmp_path), pytest.raises(ConfigError) as err:
        load_spec("bad")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("ablation bad: ")
    assert expected in msg


def test_scale_runs_only_its_variants_and_claims(tmp_path):
    from harness.experiments.ablate import plan_runs

    (tmp_path / "sub.yaml").write_text(
        "question: q\nbaseline: a\nvariants: {a: {}, b: {ppo: {kl_coef: 0.1}}, c: {ppo: {kl_coef: 0.2}}}\n"
        "claims: [{claim: x, kind: finding, source: s, section: t, setting_note: n, metric: eval_final/gold, a: a, expect: greater, b: b, margin: 0.1},"
        " {claim: y, kind: finding, source: s, section: t, setting_note: n, metric: eval_final/gold, a: c, expect: greater, b: a, margin: 0.1}]\n"
        "scales: {smoke: {seeds: 2, variants: [a, b]}}\n")
    with results_env(tmp_path):
        spec = load_spec("sub")
    assert spec.variants_for("smoke") == ["a", "b"] and spec.variants_for("full") == ["a", "b", "c"]
    assert [c.claim for c in spec.claims_for("smoke")] == ["x"] and len(spec.claims_for("full")) == 2
    assert [(t.variant, t.seed) for t in plan_runs(spec, "smoke")] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]


def test_unknown_ablation_name_lists_available(tmp_path):
    with results_env():
        with pytest.raises(HarnessError) as err:
            run_ablation("kl_placment", scale="smoke", progress=False)
    msg = str(err.value)
    assert "\n" not in msg
    assert "unknown ablation 'kl_placment' (did you mean 'kl_placement'?)" in msg
    assert "available: " + ", ".join(SHIPPED) in msg
    # and the CLI prints it as one line with exit status 2
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "ablate", "nope", "--scale", "smoke"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: unknown ablation 'nope'; available: {', '.join(SHIPPED)} "
                                                f"(in {Path(__file__).resolve().parent.parent / 'ablations'})"]


def test_is_study(tmp_path):
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "ppo_core.yaml").write_text("{}")
    (tmp_path / "kl.yaml").write_text("{}")
    with results_env(tmp_path):
        assert is_study("ppo_core") and not is_study("kl")
        assert list_ablations() == ["kl"]


# ------------------------------------------------------------------------------------------------
# End to end (smoke scale, real PPO runs)
# ------------------------------------------------------------------------------------------------


def test_kl_placement_smoke_records_nested_child_runs():
    res = kl_placement_smoke()
    assert res["report"].name == "report.md" and res["report"].is_file()
    runs = child_runs(experiment_name("kl_placement"))
    with results_env():
        from harness.infra import tracking

        c = tracking.client()
        spec = load_spec("kl_placement")
        assert sorted((r.data.tags["variant"], int(r.data.tags["seed"])) for r in runs) == sorted(
            (v, s) for v in ("reward", "loss", "none") for s in (0, 1))
        parents = {r.data.tags["mlflow.parentRunId"] for r in runs}
        assert len(parents) == 1
        parent = c.get_run(parents.pop())
        assert parent.data.tags["kind"] == "parent" and parent.info.status == "FINISHED"
        assert parent.data.tags["scale"] == "smoke" and parent.data.tags["workers"] == "2"
        for r in runs:
            tags, variant, seed = r.data.tags, r.data.tags["variant"], int(r.data.tags["seed"])
            cfg = resolve_config(spec, "smoke", variant, seed)
            assert r.info.status == "FINISHED"
            assert tags["config_hash"] == run_hash(cfg) and tags["pid"].isdigit() and tags["host"] == tracking.host()
            assert tags["git_sha"] and tags["ablation"] == "kl_placement" and tags["scale"] == "smoke"
            # the whole resolved config as flattened params
            # (paths as display_path shows them: relative to the project or under ~, no user name)
            assert r.data.params == {k: display_path(str(v)) if str(v).startswith("/") else str(v)
                                     for k, v in flatten(cfg.to_dict()).items()}
            assert all(not v.startswith(str(Path.home())) for v in r.data.params.values())
            # per-iteration metrics (batched) and the run summary's final values
            history = c.get_metric_history(r.info.run_id, "objective/gold_lexicon")
            assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(cfg.ppo.total_iterations))
            for k in ("final/score", "final/gold_lexicon", "final/kl", "initial/score", "initial/gold", "eval_final/gold",
                      "eval_final/gold_lexicon", "eval_peak/kl", "eval_drop/gold"):
                assert k in r.data.metrics
            # summary.json artifact == the metrics logged from it
            import mlflow

            summary = json.loads(mlflow.artifacts.load_text(f"{r.info.artifact_uri}/summary.json"))
            assert r.data.metrics["final/gold_lexicon"] == pytest.approx(summary["final"]["gold_lexicon"], rel=1e-12)
            assert r.data.metrics["eval_drop/gold"] == pytest.approx(summary["eval_peak"]["gold"] - summary["eval_final"]["gold"])
            names = {f.path for f in c.list_artifacts(r.info.run_id)}
            assert {"config.yaml", "summary.json", "samples", "run.log"} <= names
            samples = [f.path for f in c.list_artifacts(r.info.run_id, "samples")]
            assert len(samples) == len({0, cfg.ppo.total_iterations // 2, cfg.ppo.total_iterations - 1})
            assert yaml.safe_load(mlflow.artifacts.load_text(f"{r.info.artifact_uri}/config.yaml")) == cfg.to_dict()


def test_second_invocation_starts_no_new_child_run():
    kl_placement_smoke()
    before = {r.info.run_id for r in child_runs(experiment_name("kl_placement"))}
    with results_env():
        report = run_ablation("kl_placement", scale="smoke", workers=2, progress=False)
        from harness.infra import tracking

        c = tracking.client()
        exp = c.get_experiment_by_name(experiment_name("kl_placement")).experiment_id
        parents = [r for r in tracking.search_all(c, [exp]) if r.data.tags.get("kind") == "parent"]
    assert report.is_file()
    assert {r.info.run_id for r in child_runs(experiment_name("kl_placement"))} == before
    assert len(parents) == 2  # one parent run per invocation
    assert parents[0].data.metrics["runs/skipped"] == 6 and parents[0].data.metrics["runs/finished"] == 0


def test_a_second_live_invocation_of_one_ablation_is_refused_and_named(tmp_path):
    """While one invocation holds the ablation's lock, another is refused with the holder's pid before it
    starts anything; once released, the lock is free again."""
    from harness.experiments.ablate import _invocation_lock

    first = _invocation_lock(tmp_path / "kl_placement")
    with pytest.raises(HarnessError, match=rf"ablation 'kl_placement' is already running in process {os.getpid()} "
                                           r"on this machine; wait for it or stop it first"):
        _invocation_lock(tmp_path / "kl_placement")
    first.release()
    _invocation_lock(tmp_path / "kl_placement").release()


@pytest.fixture(scope="module")
def tiny_first(tmp_path_factory):
    """First invocation of a tiny spec (1 seed, 2 iterations) with a variant that diverges."""
    d = tmp_path_factory.mktemp("specs")
    _write(d, "tiny_fail", TINY)
    with results_env(d):
        report = run_ablation("tiny_fail", scale="smoke", workers=1, progress=False)
    return d, report


def test_failing_variant_is_recorded_and_the_ablation_completes(tiny_first):
    _, report = tiny_first
    runs = child_runs(experiment_name("tiny_fail"))
    by = {r.data.tags["variant"]: r for r in runs}
    assert len(runs) == 2
    assert by["ok"].info.status == "FINISHED"
    assert by["diverge"].info.status == "FAILED"
    reason = by["diverge"].data.tags["failure_reason"]
    assert reason.startswith("TrainingDivergedError: ") and "nan" in reason and "\n" not in reason
    summary = json.loads((report.parent / "summary.json").read_text())
    assert [(f["variant"], f["seed"], f["status"], f["reason"], f["retried"]) for f in summary["failed"]] == [
        ("diverge", 0, "FAILED", reason, False)]
    assert summary["variants"]["diverge"]["seeds"] == [] and summary["variants"]["ok"]["seeds"] == [0]
    assert summary["verdicts"][0]["verdict"] == "not enough seeds (n = 0 < 10)" and not summary["verdicts"][0]["decisive"]
    assert "TrainingDivergedError" in report.read_text().split("## Failed runs")[1]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_killed_run_is_marked_failed_and_rerun_failed_runs_retried_finished_kept(tiny_first):
    """Second invocation with seeds 0,1 after a simulated SIGKILL of an invocation that held ok/s1:
    the RUNNING ghost (dead pid) is marked FAILED and rerun, the FAILED diverge/s0 is retried as a
    new child run, the FINISHED ok/s0 is not run again."""
    d, _ = tiny_first
    with results_env(d):
        from harness.infra import tracking

        spec = load_spec("tiny_fail")
        c = tracking.client()
        exp = tracking.experiment_id(c, experiment_name("tiny_fail"))
        dead = _dead_pid()
        parent = c.create_run(exp, run_name="killed", tags={"kind": "parent", "ablation": "tiny_fail", "scale": "smoke",
                                                             "pid": str(dead), "host": tracking.host()})
        ghost = c.create_run(exp, run_name="ok-s1", tags={
            "kind": "child", "mlflow.parentRunId": parent.info.run_id, "ablation": "tiny_fail", "variant": "ok",
            "seed": "1", "scale": "smoke", "config_hash": run_hash(resolve_config(spec, "smoke", "ok", 1)),
            "pid": str(dead), "host": tracking.host()})
        finished_before = [r.info.run_id for r in child_runs(experiment_name("tiny_fail")) if r.info.status == "FINISHED"]
        report = run_ablation("tiny_fail", scale="smoke", seeds=[0, 1], workers=2, progress=False)
        ghost_after, parent_after = c.get_run(ghost.info.run_id), c.get_run(parent.info.run_id)
    assert ghost_after.info.status == "FAILED" and "worker process died" in ghost_after.data.tags["failure_reason"]
    assert parent_after.info.status == "FAILED"
    runs = child_runs(experiment_name("tiny_fail"))
    status = sorted((r.data.tags["variant"], int(r.data.tags["seed"]), r.info.status) for r in runs)
    assert status == [("diverge", 0, "FAILED"), ("diverge", 0, "FAILED"), ("diverge", 1, "FAILED"),
                      ("ok", 0, "FINISHED"), ("ok", 1, "FAILED"), ("ok", 1, "FINISHED")]
    ok0 = [r.info.run_id for r in runs if r.data.tags["variant"] == "ok" and r.data.tags["seed"] == "0"]
    assert ok0 == finished_before  # never re-created
    summary = json.loads((report.parent / "summary.json").read_text())
    assert summary["variants"]["ok"]["seeds"] == [0, 1]
    assert sorted((f["variant"], f["seed"]) for f in summary["failed"]) == [
        ("diverge", 0), ("diverge", 0), ("diverge", 1), ("ok", 1)]
    assert [f["retried"] for f in summary["failed"] if f["variant"] == "ok"] == [True]


# ------------------------------------------------------------------------------------------------
# Tracking pieces (no training)
# ------------------------------------------------------------------------------------------------


def test_mlflow_callback_batches_metrics_and_logs_final_values():
    import mlflow

    from harness.infra import tracking
    from harness.infra.tracking import MLflowCallback

    with results_env():
        c = tracking.init_store()
        exp = tracking.experiment_id(c, "test/callback")
        run_id = c.create_run(exp).info.run_id
        batches: list[int] = []
        log_batch = c.log_batch

        def counting(rid, metrics=(), **kw):
            batches.append(len(metrics))
            return log_batch(rid, metrics=metrics, **kw)

        c.log_batch = counting
        cb = MLflowCallback(c, run_id, flush_every=10)
        for it in range(25):
            cb.on_metrics(it, {"objective/gold": it / 10, "policy/clipfrac": 0.5, "flag": True})
        assert batches == [20, 20]  # two flushes of 10 iterations × 2 numeric metrics (the bool is skipped)
        cb.on_samples(12, [{"prompt": "p", "response": "r", "score": 0.1, "gold": 0.2}])
        cb.on_end({"final": {"score": 1.0, "gold": 2.3, "kl": 0.5}, "initial": {"gold": 0.1}, "iterations": 25,
                   "config_hash": "abc"})
        assert batches[2] == 10  # the last 5 iterations, flushed at the end
        run = c.get_run(run_id)
    m = run.data.metrics
    assert (m["final/score"], m["final/gold"], m["final/kl"], m["initial/gold"], m["iterations"]) == (1.0, 2.3, 0.5, 0.1, 25)
    # last/*: mean over the last ceil(10% of 25) = 3 iterations: (2.2 + 2.3 + 2.4) / 3
    assert m["last/objective/gold"] == pytest.approx(2.3) and m["last/policy/clipfrac"] == 0.5
    with results_env():
        hist = tracking.client().get_metric_history(run_id, "objective/gold")
        samples = json.loads(mlflow.artifacts.load_text(f"{run.info.artifact_uri}/samples/iter_0012.json"))
        summary = json.loads(mlflow.artifacts.load_text(f"{run.info.artifact_uri}/summary.json"))
    assert sorted((h.step, h.value) for h in hist) == [(i, i / 10) for i in range(25)]
    assert samples == {"iteration": 12, "samples": [{"prompt": "p", "response": "r", "score": 0.1, "gold": 0.2}]}
    assert summary["config_hash"] == "abc"


def test_stale_runs_other_host_orphans_and_live_owners():
    from harness.infra import tracking

    with results_env():
        c = tracking.init_store()
        exp = tracking.experiment_id(c, "test/stale")
        me = tracking.owner_tags()
        live_parent = c.create_run(exp, tags={"kind": "parent", **me})
        ended_parent = c.create_run(exp, tags={"kind": "parent", "pid": "1", "host": "elsewhere"})
        c.set_terminated(ended_parent.info.run_id, "FINISHED")
        orphan = c.create_run(exp, tags={"kind": "child", "mlflow.parentRunId": ended_parent.info.run_id,
                                         "pid": "123", "host": "elsewhere"})
        remote_alive = c.create_run(exp, tags={"kind": "child", "mlflow.parentRunId": live_parent.info.run_id,
                                               "pid": "123", "host": "elsewhere"})
        mine_alive = c.create_run(exp, tags={"kind": "child", "mlflow.parentRunId": ended_parent.info.run_id, **me})
        marked = dict(tracking.mark_stale_runs(c, exp))
        status = {r: c.get_run(r).info.status for r in (live_parent.info.run_id, orphan.info.run_id,
                                                          remote_alive.info.run_id, mine_alive.info.run_id)}
    assert list(marked) == [orphan.info.run_id] and "ended (FINISHED)" in marked[orphan.info.run_id]
    assert status == {live_parent.info.run_id: "RUNNING", orphan.info.run_id: "FAILED",
                      remote_alive.info.run_id: "RUNNING", mine_alive.info.run_id: "RUNNING"}


REUSE = """\
question: Are runs whose config another ablation already finished copied in instead of trained again?
baseline: same
base: {pipeline: {gold: {naturalness: "on", naturalness_negatives: loops_and_symbol_soup}}}
variants:
  same: {ppo: {kl_placement: reward, kl_estimator: k1}}
  other: {ppo: {kl_placement: reward, kl_estimator: k1, kl_coef: 0.1}}
claims:
  - {claim: c, kind: finding, source: test, section: none, setting_note: a test, metric: eval_final/gold, a: same,
     expect: greater, b: other, margin: 0.1}
scales:
  smoke: {seeds: 2}
"""


def test_finished_runs_of_other_ablations_are_copied_not_retrained(tmp_path, capsys):
    """A run whose config hash another ablation already finished is copied in, not trained: the source is, per
    seed, the newest original (never a copy) FINISHED run of that hash in any ablation (``find_reusable``'s rule).
    kl_placement's smoke ``reward`` runs have the same config as ``same`` here; another ablation of the suite
    (aa_sampler's baseline) may hold the same config too, so the expected source is found by the rule, not assumed."""
    from harness.infra import tracking

    from harness.experiments.ablate import plan_ablation
    from harness.cli import _plan_text

    kl_placement_smoke()  # its "reward" variant at smoke scale has the same resolved config as "same" here
    (tmp_path / "reuse_check.yaml").write_text(REUSE)
    with results_env(tmp_path):
        plan = plan_ablation("reuse_check", scale="smoke")
        assert plan_ablation("reuse_check", scale="smoke", reuse=False)["train"] == ["same/s0", "same/s1", "other/s0", "other/s1"]
        hashes = {t.seed: t.config_hash for t in plan_runs(load_spec("reuse_check"), "smoke", None) if t.variant == "same"}
        c = tracking.client()
        names = {e.experiment_id: e.name for e in c.search_experiments() if e.name.startswith("ablation/")}
        source = {}  # seed -> (experiment name, run): the newest original FINISHED run of that seed's hash
        for name in names.values():
            for r in child_runs(name):
                seed = int(r.data.tags.get("seed", -1))
                if (r.info.status == "FINISHED" and not r.data.tags.get("copied_from") and seed in hashes
                        and r.data.tags.get("config_hash") == hashes[seed]
                        and (seed not in source or r.info.start_time > source[seed][1].info.start_time)):
                    source[seed] = (name, r)
        capsys.readouterr()
        run_ablation("reuse_check", scale="smoke", workers=2, progress=True)
        err = capsys.readouterr().err
        after = plan_ablation("reuse_check", scale="smoke")
    assert sorted(source) == [0, 1]  # kl_placement's smoke runs at least
    expected = {}
    for name, _ in source.values():
        expected[name] = expected.get(name, 0) + 1
    assert (plan["planned"], plan["finished"], plan["train"], plan["sources"]) == \
        (4, [], ["other/s0", "other/s1"], expected)
    assert sorted(plan["reusable"]) == ["same/s0", "same/s1"]
    # each copy is said on one line, however narrow the terminal a log file stands for (rich wraps at 80 by default)
    said = [ln for ln in err.splitlines() if ln.startswith("reused ")]
    assert said == [f"reused same/s{seed}: run {source[seed][1].info.run_id[:8]} of {source[seed][0]} (same config hash), "
                    "copied in" for seed in (0, 1)], err[-2000:]
    lines = _plan_text(plan).splitlines()
    assert lines[0] == ("reuse_check (smoke): 4 runs planned; 0 finished here, 0 running elsewhere, "
                        "2 to copy in (same config hash), 2 to train")
    assert lines[1] == "  copy in: " + ", ".join(f"{n} from {name}" for name, n in sorted(expected.items()))
    assert (sorted(after["finished"]), after["reusable"], after["train"]) == (["other/s0", "other/s1", "same/s0", "same/s1"], {}, [])
    kids = child_runs(experiment_name("reuse_check"))
    same = {int(r.data.tags["seed"]): r for r in kids if r.data.tags["variant"] == "same"}
    other = [r for r in kids if r.data.tags["variant"] == "other"]
    assert sorted(same) == [0, 1] and len(other) == 2
    assert all("copied_from" not in r.data.tags and r.info.status == "FINISHED" for r in other)  # trained here
    with results_env(tmp_path):
        c = tracking.client()
        for seed, copy in same.items():
            src = source[seed][1]
            assert copy.info.status == "FINISHED" and copy.data.tags["copied_from"] == src.info.run_id
            assert copy.data.tags["config_hash"] == src.data.tags["config_hash"] and copy.data.tags["ablation"] == "reuse_check"
            assert copy.data.metrics == src.data.metrics and copy.data.params == src.data.params
            for key in ("eval/gold", "objective/kl"):
                hist = lambda r: [(m.step, m.value) for m in sorted(c.get_metric_history(r.info.run_id, key), key=lambda m: m.step)]
                assert hist(copy) == hist(src)
            assert {a.path for a in c.list_artifacts(copy.info.run_id)} == {a.path for a in c.list_artifacts(src.info.run_id)}
    summary = json.loads((results_root() / "reports" / "reuse_check" / "summary.json").read_text())
    assert summary["variants"]["same"]["run_ids"] == [same[0].info.run_id, same[1].info.run_id]
    md = (results_root() / "reports" / "reuse_check" / "report.md").read_text()
    assert ("**Compute.** 4 runs (2 of them copied in from another ablation's runs of the same config, which cost "
            "nothing here), ") in md


def test_a_finished_run_at_another_scale_of_the_same_ablation_is_copied_in_not_resumed_or_retrained():
    """The full scale of an ablation repeats some of its default-scale runs (same config, same seed):
    they are copied in as runs of the full scale (so its report holds them), never trained again, and a
    run already at the asked scale is resumed, not copied."""
    from harness.infra import tracking
    from harness.experiments.ablate import RunTask, resume_state, reuse_finished_runs

    def task(scale, variant, seed, h):
        return RunTask(ablation="xscale", scale=scale, variant=variant, seed=seed, config={}, config_hash=h,
                       total_iterations=1)

    with results_env():
        c = tracking.init_store()
        exp = tracking.experiment_id(c, experiment_name("xscale"))
        old_parent = c.create_run(exp, tags={"kind": "parent", "scale": "default"}).info.run_id
        c.set_terminated(old_parent, "FINISHED")
        src = {}
        for variant, seed, h, scale in [("v", 0, "h0", "default"), ("v", 1, "h1", "full"), ("w", 0, "w0", "default")]:
            r = c.create_run(exp, tags={"kind": "child", "mlflow.parentRunId": old_parent, "variant": variant,
                                        "seed": str(seed), "config_hash": h, "scale": scale})
            c.log_metric(r.info.run_id, "eval/gold", 0.5 + seed, step=0)
            c.set_terminated(r.info.run_id, "FINISHED")
            src[(variant, seed)] = r.info.run_id
        tasks = [task("full", "v", 0, "h0"), task("full", "v", 1, "h1"), task("full", "v", 2, "h2"),
                 task("full", "w", 0, "w0-changed")]
        state = resume_state(c, exp, tasks)
        assert state.finished == {"v/s1": src[("v", 1)]} and state.running == {}
        todo = [t for t in tasks if t.key not in state.finished]
        parent = c.create_run(exp, tags={"kind": "parent", "scale": "full"}).info.run_id
        copied = reuse_finished_runs(c, exp, parent, todo)
        assert copied == {"v/s0": ("ablation/xscale", src[("v", 0)])}
        copy = [r for r in tracking.search_all(c, [exp]) if r.data.tags.get("copied_from") == src[("v", 0)]]
        assert len(copy) == 1 and copy[0].info.status == "FINISHED"
        assert {k: copy[0].data.tags[k] for k in ("scale", "variant", "seed", "config_hash", "mlflow.parentRunId")} == \
            {"scale": "full", "variant": "v", "seed": "0", "config_hash": "h0", "mlflow.parentRunId": parent}
        assert copy[0].data.metrics == {"eval/gold": 0.5}
        assert resume_state(c, exp, tasks).finished == {"v/s0": copy[0].info.run_id, "v/s1": src[("v", 1)]}
        assert reuse_finished_runs(c, exp, parent, [tasks[2], tasks[3]]) == {}  # nothing with those hashes


KILL = """\
question: Does a worker killed mid-run take only its own run with it?
baseline: ok
variants:
  ok: {ppo: {total_iterations: 40}, eval: {every: 20}}
  victim: {ppo: {kl_coef: 0.0625, total_iterations: 40}, eval: {every: 20}}
claims:
  - {claim: none, kind: finding, source: test, section: none, setting_note: a test,
     metric: final/score, a: ok, expect: greater, b: victim, margin: 0.1}
scales:
  smoke: {seeds: 1}
"""


@pytest.mark.slow
def test_dead_worker_fails_only_its_own_run_and_ray_retries_it(tmp_path, capsys):
    """SIGKILL one worker mid-run (as the OOM killer would): Ray re-runs its task; the new attempt marks the
    dead attempt's run FAILED (the dead pid named), says so once on the console, and finishes as attempt 2.
    The sibling's run is not disturbed: FINISHED once, at attempt 1. No (variant, seed) is FINISHED twice."""
    import signal
    import threading

    from harness.experiments import engine

    _write(tmp_path, "tiny_kill", KILL)
    engine.connect(2)  # on the main thread: a local instance's processes die with the thread that started it
    with results_env(tmp_path):
        from harness.infra import tracking

        out: dict = {}
        th = threading.Thread(target=lambda: out.setdefault("report", run_ablation("tiny_kill", scale="smoke", workers=2,
                                                                                     progress=False)))
        th.start()
        c, killed, deadline = None, None, time.time() + 300
        while killed is None and time.time() < deadline and th.is_alive():
            time.sleep(0.2)
            with contextlib.suppress(Exception):
                c = c or tracking.client()
                exp = c.get_experiment_by_name(experiment_name("tiny_kill"))
                running = {r.data.tags.get("variant"): r for r in c.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'")
                           if r.data.tags.get("kind") == "child"}
                if "victim" in running and "ok" in running:  # both runs started: kill the victim's worker
                    killed = int(running["victim"].data.tags["pid"])
                    os.kill(killed, signal.SIGKILL)
        th.join(600)
    assert killed is not None and "report" in out
    runs = child_runs(experiment_name("tiny_kill"))
    got = sorted((r.data.tags["variant"], r.data.tags["attempt"], r.info.status, r.data.tags.get("failure_reason", "")) for r in runs)
    assert [g[:3] for g in got] == [("ok", "1", "FINISHED"), ("victim", "1", "FAILED"), ("victim", "2", "FINISHED")]
    reason = got[1][3]
    assert reason == (f"its worker process died (pid {killed} on {tracking.host()}: out of memory, killed, or its node was "
                      "removed); retried (attempt 2)")
    err = capsys.readouterr()
    assert (err.out + err.err).count(f"its worker process died (pid {killed}") == 1


def test_a_local_ray_instance_is_not_started_off_the_main_thread():
    """Ray ties a local instance's processes to the thread that starts them (PR_SET_PDEATHSIG): started
    from a helper thread they would all be SIGKILLed when it ends, and every later task would hang until
    Ray's 60 s GCS timeout kills this process. connect() refuses, naming the fix, before starting anything."""
    import threading

    import ray

    from harness.experiments import engine

    if ray.is_initialized():
        ray.shutdown()
    out: dict = {}

    def _connect() -> None:
        try:
            engine.connect(2)
        except HarnessError as e:
            out["error"] = str(e)

    th = threading.Thread(target=_connect)
    th.start()
    th.join(60)
    assert not ray.is_initialized()
    assert out["error"] == ("a local Ray instance must be started from the main thread (its processes die with the "
                            "thread that starts them): call harness.experiments.engine.connect() there first")


def test_a_local_instance_is_started_even_when_another_ray_cluster_runs_on_this_machine(monkeypatch):
    """With no address, Ray's own ``init()`` joins the cluster that ``ray start`` (or a test cluster) last
    recorded in its temp directory, and then refuses ``num_cpus``. connect() without an address must start
    the documented new local instance instead: here Ray is shown a recorded cluster that does not exist."""
    import ray
    from ray._private import services

    from harness.experiments import engine

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.delenv(engine.ADDRESS_ENV, raising=False)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir=None: "127.0.0.1:1")
    where = engine.connect(2)
    try:
        assert where.startswith("local (") and ray.is_initialized()
        assert ray.cluster_resources()["CPU"] >= 2
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kl_loss_estimator", "policy_loss", "off_policyness", "kl_coef", "logprob_temperature"])
def test_new_ablations_run_at_smoke_scale(name):
    """Each ablation of the KL-as-loss, policy-loss and off-policyness axes runs end to end at smoke scale
    (one seed: every variant FINISHED once, the claims' metrics logged, no verdict below min_seeds)."""
    from harness.experiments.ablate import run_ablation

    with results_env():
        report = run_ablation(name, scale="smoke", seeds=[0], workers=2, progress=False, raise_on_failure=True)
    spec = load_spec(name)
    runs = [r for r in child_runs(experiment_name(name)) if r.info.status == "FINISHED"]
    assert sorted(r.data.tags["variant"] for r in runs) == sorted(spec.variants)
    summary = json.loads((report.parent / "summary.json").read_text())
    for c, row in zip(spec.claims, summary["verdicts"]):  # run metrics, or (matched_kl/*) read off the curves
        if c.metric.startswith(("pair_matched_kl/", "pair_matched_responses/")):  # a claim-level readout: both arms
            key = "matched_kl" if c.metric.startswith("pair_matched_kl/") else "matched_responses"  # at a matched point
            assert (row["n_a"], row["n_b"]) == (1, 1) and row.get(key) is not None, row
            continue
        for v in (c.a, c.b):
            assert summary["variants"][v]["final"][c.metric]["n"] == 1, (c.metric, v)
            if not c.metric.startswith("matched_kl/"):
                assert all(c.metric in r.data.metrics for r in runs if r.data.tags["variant"] == v), c.metric
    from harness.reporting.summary import UNTESTABLE

    # two arms whose switch never binds in 3 iterations (the adaptive controller's targets, both clipped at the
    # same step) give bit-identical runs: their claims are untestable here, whatever the seeds
    def values(r):  # final values, timings aside (and the time a worker spent building a deferred pipeline stage)
        return {k: v for k, v in r.data.metrics.items() if "time" not in k and "perf/" not in k and k != "pipeline_build_s"}

    same = {(c.a, c.b) for c in spec.claims
            if all(values(r) == values(s) for r in runs for s in runs
                   if r.data.tags["variant"] == c.a and s.data.tags["variant"] == c.b)}
    assert [v["verdict"] for v in summary["verdicts"]] == [
        UNTESTABLE if (c.a, c.b) in same else f"not enough seeds (n = 1 < {spec.verdict.min_seeds})"
        for c in spec.claims]


def test_progress_is_one_plain_line_per_finished_run_when_not_on_a_terminal(capsys):
    from harness.experiments.ablate import RunTask
    from harness.experiments.display import RunDisplay as _Display

    tasks = [RunTask("x", "smoke", v, 0, {}, "h", 10) for v in ("a", "b")]
    keys = [t.key for t in tasks]
    display = _Display("x", "smoke", tasks, skipped=0)
    assert display.plain  # pytest captures stderr: not a terminal
    with display:
        display.event("start", keys[0], 1)
        display.event("iter", keys[0], 4)
        display.event("end", keys[0], "FINISHED")
        display.event("start", keys[1], 2)
        display.event("end", keys[1], "FAILED")
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("finished ")]
    assert len(lines) == 1 and lines[0].startswith("finished a/s0: 1/2 runs done, elapsed ") and "min left" in lines[0]
    assert "FAILED b/s0" in err


def test_a_spec_runs_in_its_tasks_regime():
    """review_sentiment specs run fixed-length continuations unless they name ``variable_length`` (EOS and length
    claims), whose proxy learns from length-matched comparisons; a regime the task lacks is refused by name."""
    from harness.experiments.spec import AblationSpec, resolve_config
    from harness.errors import HarnessError
    from harness.config.presets import regime_note, regime_overrides

    fixed = resolve_config(load_spec("kl_placement"), "default", "reward", 0)
    assert (fixed.ppo.truncate_after_eos, fixed.eval.truncate_after_eos, fixed.ppo.missing_eos_penalty,
            fixed.pipeline.reward_model.proxy_truncate_after_eos, fixed.pipeline.reward_model.proxy_match_length,
            fixed.task.suppress_special_tokens) == (False, False, None, False, False, True)
    var = resolve_config(load_spec("eos_trick"), "default", "eos_trick", 0)
    assert (var.ppo.truncate_after_eos, var.eval.truncate_after_eos, var.pipeline.reward_model.proxy_match_length,
            var.pipeline.reward_model.proxy_pool_pairs, var.task.suppress_special_tokens) == (True, True, True, 1000, True)
    # at its default the switch is left out of the dumped config, so the configs of every other setting keep their hash
    plain = resolve_config(load_spec("reasoning_kl"), "default", load_spec("reasoning_kl").baseline, 0)
    assert "suppress_special_tokens" not in plain.to_dict()["task"] and fixed.to_dict()["task"]["suppress_special_tokens"]
    assert regime_overrides(None, "chain_sum") == {} and regime_note(None, "chain_sum") == ""
    assert regime_note("variable_length", "review_sentiment").startswith("variable_length: responses end at the first EOS")
    spec = AblationSpec.model_validate({**load_spec("kl_placement").model_dump(), "regime": "short"})
    with pytest.raises(HarnessError, match="regime: unknown value 'short' for task review_sentiment; choose from: "
                                           "fixed_length, variable_length"):
        resolve_config(spec, "default", "reward", 0)


def test_harness_train_runs_in_the_tasks_default_regime_like_an_ablation():
    """``harness train --scale default seed=0`` resolves to the very config of off_policyness's baseline (4 epochs, 2
    minibatches, β 0.05) at seed 0 judged by the task's default gold (sentiment alone; the spec sets the gold's
    naturalness head)
    (same hash: the task's default regime, fixed_length, under the scale preset); ``--regime none`` is the bare
    config (responses end at EOS), ``--regime variable_length`` matches the proxy's comparisons in length, and a regime
    the task lacks is refused by name, as are regimes for a task without any."""
    from harness.experiments.spec import resolve_config
    from harness.config import load_config
    from harness.errors import HarnessError

    baseline = _gold_as(resolve_config(load_spec("off_policyness"), "default", "e4_mb2", 0), naturalness="off",
                        naturalness_negatives="loops")
    assert load_config(None, ["seed=0"], scale="default", regime="default").hash() == baseline.hash()
    bare = load_config(None, ["seed=0"], scale="default")
    assert bare.hash() != baseline.hash() and (bare.ppo.truncate_after_eos, bare.eval.truncate_after_eos) == (True, True)
    var = load_config(None, [], scale="default", regime="variable_length")
    assert (var.ppo.truncate_after_eos, var.pipeline.reward_model.proxy_match_length) == (True, True)
    assert load_config(None, ["ppo.truncate_after_eos=true"], regime="default").ppo.truncate_after_eos is True  # overrides win
    with pytest.raises(HarnessError, match="regime: unknown value 'short' for task review_sentiment; choose from: "
                                           "fixed_length, variable_length"):
        load_config(None, [], regime="short")
    assert load_config(None, ["task.name=chain_sum"], scale="smoke", regime="default").hash() == \
        load_config(None, ["task.name=chain_sum"], scale="smoke").hash()
    with pytest.raises(HarnessError, match="regime: unknown value 'fixed_length' for task chain_sum; choose from: "
                                           r"\(none: the task defines no regime\)"):
        load_config(None, ["task.name=chain_sum"], regime="fixed_length")
