"""TRL side of ``harness bench``: time TRL 1.12 ``PPOTrainer`` iterations on the benchmark's setting.

Runs with the benchmark venv's python (``trl==1.12.0``, torch 2.13 CPU), never with the harness
venv (TRL 1.16 has no PPOTrainer), and imports nothing from ``harness``::

    .cache/bench-trl-venv/bin/python harness/bench/trl.py --spec SPEC.json --out RESULT.json --workdir DIR

``SPEC.json`` is written by ``harness.bench.loop.build_setting``: model directories, prompts and
hyperparameters. The trainer gets the same policy, reference (a second load of the policy), reward
model and critic (loaded from the reward model) as our loop, float32 on CPU, gradient checkpointing
off, the EOS trick (``stop_token="eos"``, ``missing_eos_penalty``), one micro-batch per minibatch.
The result JSON holds ``iteration_s`` (the timed iterations: wall time between consecutive
``on_step_end`` callbacks, after ``warmup`` untimed ones), ``iteration_cpu_s`` (the same in process CPU
time), ``peak_rss_mb``, versions and settings.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


def ppo_settings(spec: dict) -> dict:
    """The ``PPOConfig`` arguments (TRL 1.12) for the benchmark's ``spec``: its sizes and PPO hyperparameters,
    float32 on CPU (bf16 mixed precision on CUDA, ``spec["device"]``), gradient checkpointing off, the EOS trick on, no logging, saving or evaluation."""
    # TRL's rollout batch is per_device_train_batch_size × gradient_accumulation_steps and each
    # minibatch is walked in micro-batches of per_device_train_batch_size: B and 1 give one
    # micro-batch per minibatch, as in our loop with gradient_accumulation_steps=1.
    warmup, iterations, B = spec["warmup"], spec["iterations"], spec["batch_size"]
    return dict(
        per_device_train_batch_size=B,
        gradient_accumulation_steps=1,
        num_mini_batches=spec["num_minibatches"],
        num_ppo_epochs=spec["num_ppo_epochs"],
        response_length=spec["response_length"],
        temperature=spec["temperature"],
        total_episodes=B * (warmup + iterations),
        local_rollout_forward_batch_size=B,
        stop_token="eos",
        missing_eos_penalty=-spec["missing_eos_penalty"],  # TRL subtracts a positive penalty
        kl_coef=spec["kl_coef"],
        kl_estimator="k1",
        cliprange=spec["cliprange"],
        vf_coef=spec["vf_coef"],
        cliprange_value=spec["cliprange_value"],
        gamma=spec["gamma"],
        lam=spec["lam"],
        learning_rate=spec["lr"],
        seed=spec["seed"],
        bf16=spec.get("device", "cpu") == "cuda",  # as our loop's autocast on a GPU
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=spec.get("device", "cpu") == "cpu",
        num_sample_generations=0,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run ``warmup + iterations`` PPOTrainer updates, write the result JSON. Returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True, help="spec.json written by harness.bench.loop")
    ap.add_argument("--out", required=True, help="result JSON path")
    ap.add_argument("--workdir", required=True, help="scratch directory (trainer output_dir)")
    args = ap.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())

    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    tok = AutoTokenizer.from_pretrained(spec["tokenizer_dir"])
    policy = AutoModelForCausalLM.from_pretrained(spec["policy_dir"], dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(spec["policy_dir"], dtype=torch.float32)
    value = AutoModelForSequenceClassification.from_pretrained(spec["rm_dir"], num_labels=1, dtype=torch.float32)
    reward = AutoModelForSequenceClassification.from_pretrained(spec["rm_dir"], num_labels=1, dtype=torch.float32)
    ds = datasets.Dataset.from_dict({"input_ids": spec["prompts"]})

    warmup, iterations = spec["warmup"], spec["iterations"]
    settings = ppo_settings(spec)
    config = PPOConfig(output_dir=args.workdir, **settings)

    class StepTimer(TrainerCallback):
        """``time.perf_counter()`` at train begin and at the end of every PPO update."""

        def __init__(self) -> None:
            self.marks: list[float] = []
            self.cpu_marks: list[float] = []

        def on_train_begin(self, args, state, control, **kw):
            self.marks.append(time.perf_counter())
            self.cpu_marks.append(time.process_time())

        def on_step_end(self, args, state, control, **kw):
            self.marks.append(time.perf_counter())
            self.cpu_marks.append(time.process_time())

    timer = StepTimer()
    trainer = PPOTrainer(args=config, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                         value_model=value, train_dataset=ds, eval_dataset=ds, callbacks=[timer])
    trainer.train()
    durations = [b - a for a, b in zip(timer.marks, timer.marks[1:])]
    cpu = [b - a for a, b in zip(timer.cpu_marks, timer.cpu_marks[1:])]
    if len(durations) < warmup + iterations:
        raise SystemExit(f"PPOTrainer ran {len(durations)} updates, expected {warmup + iterations}")
    result = {
        "iteration_s": durations[warmup : warmup + iterations],
        "all_iteration_s": durations,
        "iteration_cpu_s": cpu[warmup : warmup + iterations],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "torch_threads": torch.get_num_threads(),
        "versions": {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "settings": {k: v for k, v in settings.items() if isinstance(v, (int, float, str, bool)) or v is None},
        "attn_implementation": policy.config._attn_implementation,
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
