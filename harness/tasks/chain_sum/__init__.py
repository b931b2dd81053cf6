"""Task ``chain_sum``: verifiable-reward arithmetic from reasoning-gym 0.1.25.

A prompt is a chain of 2–6 one-digit terms joined by ``+``/``-`` (``"5 - 8 + 7 ="``; ``task.options`` allow more
digits); a response is a scratchpad of running partial sums with the answer in the library's tags
(``" 5-8=-3; -3+7=4; <answer>4</answer>"``);
the reward is exact match by the library's scorer (:mod:`.problems`). No reward model, no gold model: the
verifier is both the training reward and the held-out measure (``eval/gold`` is sampled pass@1,
``eval/pass1_greedy`` the greedy one). The policy is the harness's small GPT-2 trained from scratch on the
scratchpad traces.

The package: :mod:`.problems` (generator, scratchpad writer, verifier), :mod:`.task` (options, prompts, reward,
evaluation, the factory), :mod:`.stages` (problems → tokenizer → SFT), :mod:`.sft`. The registration gives the
task's config defaults (lengths, positions, SFT schedule, a critic from the policy) and its scale presets.
"""

from __future__ import annotations

from harness.tasks.chain_sum.stages import build_stages
from harness.tasks.chain_sum.task import ChainSumOptions, eval_metrics, final_metrics, make_chain_sum
from harness.tasks.registry import TASKS

#: Config defaults of a chain_sum run (under a spec's base and the scale preset): prompts of ≤ 23 tokens left-padded
#: to 24, scratchpads of ≤ ~62 tokens in 72; three passes of SFT over 40k traces in random order (batches grouped by
#: length learned markedly worse), of which the problems with 3–6 terms state the answer directly in 60% of cases
#: (task.options.direct_fraction / direct_min_terms): the SFT policy works 2-term sums out and guesses longer ones
#: (greedy pass@1 0.241 on the 1,000 held-out problems; 80% of its greedy answers direct; correct responses 11.3 ±
#: 3.0 tokens), so the RL has a behaviour to find. With scratchpads only (0.474 greedy) its errors were arithmetic
#: facts, and 100 GRPO iterations sharpened the sampled policy (sampled pass@1 0.305 -> 0.418) without moving the greedy
#: one (0.523 -> 0.527). The RL is GRPO's recipe: group-normalised advantages (not whitened again), each response's
#: token mean (Shao et al. 2024, Eq. 3), the k3 KL in the loss with β 0.04, sampling at τ = 1, G = 8 responses to
#: each of 64 prompts per batch, 8 minibatches × 2 epochs per batch (so the ratio moves), Adam at 4e-5 (1e-4 and above
#: first lose greedy pass@1; smaller batches are too noisy); a critic, when an arm asks for one, starts from the
#: policy (there is no reward model). Measured (seed 0, one thread, load 4.5): after 40 iterations (608 s) greedy
#: pass@1 0.242 -> 0.457 and sampled 0.214 -> 0.312 on 256 held-out problems, direct answers 0.56 -> 0.09 of the
#: sampled responses, which grow from 7 to 26 tokens.
DEFAULTS = {
    "task": {"prompt_length": 24, "response_length": 72},
    "pipeline": {"model": {"n_positions": 96}, "sft": {"epochs": 3.0, "batch_size": 64, "lr": 1e-3, "max_length": 96,
                                                            "group_by_length": False}},
    "ppo": {"critic_init": "policy", "adv_estimator": "grpo", "loss_agg": "seq-mean-token-mean", "kl_placement": "loss",
            "kl_estimator": "k3", "kl_coef": 0.04, "temperature": 1.0, "num_generations": 8, "batch_size": 512,
            "num_minibatches": 8, "num_ppo_epochs": 2, "lr": 4e-5},
    "eval": {"num_prompts": 256, "samples_per_prompt": 4, "every": 10},
}

#: Scale presets of chain_sum (they replace the generic ones, which size review_sentiment's pipeline).
SCALES = {
    "smoke": {
        "task": {"options": {"n_train": 2000, "n_heldout": 64, "rl_prompts": 256}},
        "pipeline": {"model": {"n_layer": 2, "n_embd": 64, "n_head": 2}, "sft": {"max_steps": 40, "batch_size": 32}},
        "ppo": {"total_iterations": 3, "batch_size": 16, "num_minibatches": 2, "num_ppo_epochs": 2},
        "eval": {"every": 1, "num_prompts": 16, "samples_per_prompt": 2},
        "num_sample_completions": 4,
    },
    "default": {"ppo": {"total_iterations": 40}},
    "full": {"ppo": {"total_iterations": 150}},
    # SmolLM2-135M-Instruct fine-tuned on the solved problems (harness.pipeline.pretrained), sized for one GPU: its
    # tokenizer writes a 6-term prompt in ≤ 17 tokens and a scratchpad in ≤ 52; GRPO at DeepSeekMath's rate (1e-6).
    "real_model": {
        "pipeline": {"model": {"preset": "smollm2-135m"}},
        "task": {"prompt_length": 20, "response_length": 64},
        "ppo": {"total_iterations": 200, "batch_size": 256, "num_minibatches": 4, "lr": 1e-6},
    },
}

#: The reports' learning curves: greedy and sampled pass@1 (``eval/gold``), drift, the lengths of correct and
#: incorrect responses, entropy, the share of groups whose rewards are all equal, direct answers, and the ratio.
CURVE_METRICS = ["eval/pass1_greedy", "eval/gold", "eval/kl", "eval/length", "eval/length_correct",
                 "eval/length_incorrect", "eval/entropy", "eval/all_equal_groups", "eval/direct", "policy/clipfrac",
                 "policy/ratio_mean"]

#: Typical wall time of one run (one core of a two-core machine, the other busy), for the plan printed before the
#: first run of a scale (measured: default-scale GRPO runs, ~9.4 min; full scaled by its iterations).
RUN_SECONDS = {"default": 560, "full": 2100}

TASKS.register("chain_sum", stages=build_stages, options=ChainSumOptions, reward_model=False, defaults=DEFAULTS,
               scales=SCALES, gold_lexicon="answer_format", sample_columns=("reward (exact match)", "answer format (0/1)"),
               eval_metrics=eval_metrics, run_seconds=RUN_SECONDS, curve_metrics=CURVE_METRICS,
               final_metrics=final_metrics, distinct_floor=None)(make_chain_sum)  # ~15 symbols: few bigrams anyway
