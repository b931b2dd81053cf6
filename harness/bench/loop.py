"""Performance benchmark: one PPO iteration in our loop against TRL 1.12's ``PPOTrainer``.

``harness bench`` (``make bench``) builds one tiny GPT-2 setting (policy, reference, reward model and
critic from random weights saved with ``save_pretrained``, one fixed batch of prompts), then times
full PPO iterations (rollout + scoring + K epochs of updates) on it:

1. **ours**: :func:`harness.rl.ppo.train` on those models (injected with ``models=``/``task=``); the
   iteration time is the wall time between consecutive ``on_metrics`` callbacks, and the phase times
   are the loop's own ``time/*`` metrics;
2. **TRL**: ``trl.experimental.ppo.PPOTrainer`` of ``trl==1.12.0`` (the last release with PPO) in a
   separate virtualenv under ``.cache/bench-trl-venv`` (created on first use, then cached), driven by
   ``harness/bench/trl.py`` as a subprocess; the iteration time is the wall time between consecutive
   ``on_step_end`` callbacks.

Both sides: same weights, prompts and hyperparameters, float32 on CPU, dropout off, EOS trick on
(``stop_token="eos"``, missing-EOS penalty), gradient checkpointing off (TRL's default is on, which
recomputes the forward in the backward). Each side runs ``warmup`` untimed iterations, then reports
the median of ``iterations`` timed ones. The training phase is also placed on a roofline: its
analytic matmul FLOPs per second against the fp32 matmul peak measured in the same run.

Results go to ``results/bench/summary.json``; the last line printed is ``speedup_vs_trl=X.XX``
(TRL seconds / our seconds; ``nan`` with ``--skip-trl``).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from harness.rl.callbacks import Callback
from harness.bench.spec import BenchSpec, _best_matmul, matmul_peak_gflops, summarize, timed_window
from harness.bench.venv import DEFAULT_VENV, bench_trl, ensure_trl_venv
from harness.errors import HarnessError
from harness.tasks.rm_scoring import RewardModelScored

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

# ------------------------------------------------------------------------------------------------
# The shared setting: tokenizer, models, prompts
# ------------------------------------------------------------------------------------------------


def make_tokenizer(vocab_size: int):
    """A word-level ``PreTrainedTokenizerFast`` with ``vocab_size`` entries: EOS ``<|endoftext|>`` (id 0),
    PAD ``<|pad|>`` (id 1, distinct from EOS) and ``t2 … t{V−1}``. Only used to decode token ids.

    Raises:
        ValueError: ``vocab_size < 3``.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 3:
        raise ValueError(f"vocab_size must be >= 3 (got {vocab_size})")
    vocab = {EOS_TOKEN: 0, PAD_TOKEN: 1, **{f"t{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=PAD_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    fast.padding_side = "right"
    return fast


def build_setting(spec: BenchSpec, root: Path) -> dict[str, Any]:
    """Save the shared tokenizer, policy (``GPT2LMHeadModel``, or ``LlamaForCausalLM`` for ``spec.arch`` llama), reward
    model (``GPT2ForSequenceClassification`` / ``LlamaForSequenceClassification``, 1 label; also the critic's start, as
    N+ and TRL's examples do) and prompts under ``root``.

    Weights are drawn under ``spec.seed``; prompts are ``[B, P]`` ids drawn uniformly from the
    non-special tokens (no EOS/PAD inside a prompt). Returns ``{"tokenizer_dir", "policy_dir",
    "rm_dir", "prompts": [[int]*P]*B, "spec_path"}``; ``spec.json`` holds the spec plus these.
    """
    from transformers import (GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM, LlamaForSequenceClassification)

    root.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(spec.vocab_size)
    dirs = {k: root / k for k in ("tokenizer", "policy", "reward_model")}
    for d in dirs.values():
        tok.save_pretrained(d)
    if spec.arch == "llama":
        gcfg = dict(vocab_size=spec.vocab_size, max_position_embeddings=spec.n_positions, hidden_size=spec.n_embd,
                    num_hidden_layers=spec.n_layer, num_attention_heads=spec.n_head,
                    num_key_value_heads=spec.n_kv_head or spec.n_head,
                    intermediate_size=spec.intermediate_size or 4 * spec.n_embd, tie_word_embeddings=True,
                    bos_token_id=0, eos_token_id=0, pad_token_id=1)
        make, lm, cls = LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification
    elif spec.arch == "gpt2":
        gcfg = dict(vocab_size=spec.vocab_size, n_positions=spec.n_positions, n_embd=spec.n_embd, n_layer=spec.n_layer,
                    n_head=spec.n_head, bos_token_id=0, eos_token_id=0, pad_token_id=1)
        make, lm, cls = GPT2Config, GPT2LMHeadModel, GPT2ForSequenceClassification
    else:
        raise HarnessError(f"bench arch: must be one of gpt2, llama; got {spec.arch!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        lm(make(**gcfg)).save_pretrained(dirs["policy"])
        cls(make(**gcfg, num_labels=1)).save_pretrained(dirs["reward_model"])
    g = torch.Generator().manual_seed(spec.seed)
    prompts = torch.randint(2, spec.vocab_size, (spec.batch_size, spec.prompt_length), generator=g)
    setting = {"tokenizer_dir": str(dirs["tokenizer"]), "policy_dir": str(dirs["policy"]),
               "rm_dir": str(dirs["reward_model"]), "prompts": prompts.tolist()}
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps({**asdict(spec), **setting}))
    return {**setting, "spec_path": str(spec_path)}


class FixedPromptTask(RewardModelScored):
    """A task over one fixed prompt batch: ``sample_prompts`` returns the batch in a random order
    (as TRL's shuffling dataloader does over a one-batch dataset); ``gold_lexicon`` (and the gold
    scorer :func:`zero_gold` given to the models) is 0 for every text (TRL has no gold scorer, so
    none is timed on either side)."""

    def __init__(self, prompt_ids: torch.Tensor) -> None:
        self.prompt_ids = prompt_ids
        self.eval_prompt_ids = prompt_ids  # the loop's evaluations fall outside the timed iterations

    def sample_prompts(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        """``[batch_size, P]`` long: rows of the fixed batch in an order drawn from ``generator``.

        Raises:
            ValueError: ``batch_size`` exceeds the number of fixed prompts.
        """
        n = self.prompt_ids.shape[0]
        if batch_size > n:
            raise ValueError(f"batch_size {batch_size} > {n} fixed prompts")
        return self.prompt_ids[torch.randperm(n, generator=generator)[:batch_size]]

    def gold_lexicon(self, texts: list[str]) -> torch.Tensor:
        """``[len(texts)]`` float zeros."""
        return zero_gold(texts)


def zero_gold(texts: list[str]) -> torch.Tensor:
    """A gold scorer that costs nothing: ``[len(texts)]`` float zeros."""
    return torch.zeros(len(texts))


def bench_config(spec: BenchSpec):
    """The harness ``Config`` of the benchmark: the spec's sizes and hyperparameters, its device (CPU by default; on
    CUDA the loop runs under bf16 autocast), no samples."""
    from harness.config import build_config

    return build_config({
        "seed": spec.seed,
        "device": spec.device,
        "torch_threads": spec.threads,
        "num_sample_completions": 0,
        "task": {"prompt_length": spec.prompt_length, "response_length": spec.response_length},
        "ppo": {
            "total_iterations": spec.warmup + spec.iterations,
            "batch_size": spec.batch_size,
            "num_minibatches": spec.num_minibatches,
            "gradient_accumulation_steps": 1,
            "num_ppo_epochs": spec.num_ppo_epochs,
            "lr": spec.lr,
            "temperature": spec.temperature,
            "kl_coef": spec.kl_coef,
            "cliprange": spec.cliprange,
            "vf_coef": spec.vf_coef,
            "cliprange_value": spec.cliprange_value,
            "gamma": spec.gamma,
            "lam": spec.lam,
            "missing_eos_penalty": spec.missing_eos_penalty,
            "truncate_after_eos": True,
            "dropout": "off",
            "critic_init": "reward_model",
            "adv_estimator": "gae",
        },
    })


def load_models(cfg: Any, setting: dict[str, Any], device: torch.device):
    """``harness.rl.run_models.Models`` from the saved setting, prepared exactly as a run prepares the
    pipeline's (:func:`harness.rl.run_models.assemble_models`); one tokenizer for policy and RM, reward offset 0."""
    from harness.rl.models import load_tokenizer
    from harness.rl.run_models import assemble_models

    tok = load_tokenizer(setting["tokenizer_dir"])
    return assemble_models(cfg, device, setting["policy_dir"], setting["rm_dir"], tok, tok, 0.0)


# ------------------------------------------------------------------------------------------------
# Our side
# ------------------------------------------------------------------------------------------------


class IterationTimer(Callback):
    """Marks wall time (``time.perf_counter()``) and process CPU time (``time.process_time()``) at
    ``on_start`` and at every ``on_metrics`` (the end of an iteration's work), and keeps each
    iteration's ``time/*`` metrics."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.cpu_marks: list[float] = []
        self.phases: list[dict[str, float]] = []

    def on_start(self, cfg: Any, info: dict[str, Any]) -> None:
        self.marks, self.cpu_marks = [time.perf_counter()], [time.process_time()]

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        self.marks.append(time.perf_counter())
        self.cpu_marks.append(time.process_time())
        self.phases.append({k.split("/", 1)[1]: float(v) for k, v in metrics.items() if k.startswith("time/")})


def _median_time(fn: Callable[[], Any], reps: int = 3) -> float:
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def bench_ours(spec: BenchSpec, setting: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Time ``spec.warmup + spec.iterations`` iterations of :func:`harness.rl.ppo.train` on the setting.

    Returns ``{"iteration_s": [..], "iteration_cpu_s": [..], "phase_s": {"generate"|"score"|"forward"|"update": [..]},
    "forward_breakdown_s": {"policy_logprobs", "ref_logprobs", "critic_values"}, "peak_rss_mb",
    "n_params", "torch_threads"}`` (seconds; the first ``warmup`` iterations dropped). The forward
    breakdown times the three no-grad scoring forwards of ``time/forward`` one by one, after training,
    on one ``[B, P+T]`` batch (median of 3). Peak RSS is this process's ``ru_maxrss``.
    """
    from harness.rl.ppo import train
    from harness.rl.run_models import critic_values
    from harness.rl.rollout import response_logprobs

    cfg = bench_config(spec)
    device = torch.device(spec.device)
    models = load_models(cfg, setting, device)
    models.gold = zero_gold
    task = FixedPromptTask(torch.tensor(setting["prompts"], dtype=torch.long))
    timer = IterationTimer()
    train(cfg, workdir / "ours", models, task, [timer], progress=False)
    iteration_s = timed_window(timer.marks, spec.warmup, spec.iterations)
    iteration_cpu_s = timed_window(timer.cpu_marks, spec.warmup, spec.iterations)
    kept = timer.phases[spec.warmup : spec.warmup + spec.iterations]
    phase_s = {k: [p[k] for p in kept] for k in ("generate", "score", "forward", "update")}

    g = torch.Generator().manual_seed(spec.seed)
    qr = torch.cat([task.prompt_ids, torch.randint(2, spec.vocab_size, (spec.batch_size, spec.response_length),
                                                   generator=g)], 1).to(device)
    P, tau = spec.prompt_length, spec.temperature
    with torch.no_grad():
        models.policy.eval()
        breakdown = {
            "policy_logprobs": _median_time(lambda: response_logprobs(models.policy, qr, P, tau, with_entropy=True)),
            "ref_logprobs": _median_time(lambda: response_logprobs(models.ref, qr, P, tau)),
            "critic_values": _median_time(lambda: critic_values(models.critic.eval(), qr, P)),
        }
    return {
        "iteration_s": iteration_s,
        "iteration_cpu_s": iteration_cpu_s,
        "phase_s": phase_s,
        "forward_breakdown_s": breakdown,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "n_params": models.n_params(),
        "torch_threads": torch.get_num_threads(),
    }


# ------------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------------


def run_bench(iterations: int = 5, skip_trl: bool = False, *, out_dir: str | Path | None = None,
              spec: Optional[BenchSpec] = None, venv_dir: str | Path | None = None,
              echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Benchmark one PPO iteration of our loop and of TRL 1.12's PPOTrainer; write ``summary.json``.

    Args:
        iterations: timed iterations per side (after ``spec.warmup`` untimed ones); overrides the spec's.
        skip_trl: time only our loop (no venv, ``trl_s``/``speedup`` None).
        out_dir: where ``summary.json`` and ``trl.log`` go (default ``results/bench``; ``$HARNESS_RESULTS`` honoured).
        spec: the setting (default :class:`BenchSpec`: GPT-2 4×128, vocab 2050, 64 prompts × 8 tokens,
            24 response tokens, 1 minibatch, 4 epochs).
        venv_dir: the TRL venv (default ``.cache/bench-trl-venv`` under the working directory).
        echo: where progress lines go; the last line is ``speedup_vs_trl=X.XX`` (``nan`` when skipped).
    Returns:
        the summary dict (see :func:`summarize`).
    Raises:
        HarnessError: the TRL venv or the TRL run failed; ``summary.json`` then holds our side and
        the error under ``trl``.
    """
    from transformers.utils import logging as hf_logging

    if spec is None:
        spec = BenchSpec(threads=_env_threads(os.environ.get("HARNESS_BENCH_THREADS")))
    spec.iterations = iterations
    threads_before, bars_before = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    try:
        if spec.threads:
            torch.set_num_threads(spec.threads)
        hf_logging.disable_progress_bar()  # no save/load bars between the result lines
        return _run(spec, skip_trl, out_dir, venv_dir, echo)
    finally:
        torch.set_num_threads(threads_before)
        if bars_before:
            hf_logging.enable_progress_bar()


def _env_threads(value: Optional[str]) -> Optional[int]:
    """``$HARNESS_BENCH_THREADS``: unset → 1, ``auto`` → None (torch's default), else a positive int.

    Raises:
        HarnessError: anything else.
    """
    if value is None or value == "":
        return 1
    if value == "auto":
        return None
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise HarnessError(f"HARNESS_BENCH_THREADS must be a positive integer or 'auto' (got {value!r})")


def _run(spec: BenchSpec, skip_trl: bool, out_dir: str | Path | None, venv_dir: str | Path | None,
         echo: Callable[[str], None]) -> dict[str, Any]:
    from harness.config import default_results_dir

    out = Path(out_dir) if out_dir is not None else Path(default_results_dir()) / "bench"
    out.mkdir(parents=True, exist_ok=True)
    log = out / "trl.log"
    log.write_text("")
    venv = Path(venv_dir) if venv_dir is not None else DEFAULT_VENV
    trl_error: Optional[str] = None
    python = None
    if not skip_trl:  # build the venv first, so the timed runs do not overlap pip
        try:
            python = ensure_trl_venv(venv, log, echo)
        except HarnessError as e:
            trl_error = str(e)
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        work = Path(tmp)
        load_start = os.getloadavg()[0]
        matmul = matmul_peak_gflops(spec.matmul_n)
        setting = build_setting(spec, work / "setting")
        echo(f"ours: {spec.warmup} warm-up + {spec.iterations} timed iterations …")
        ours = bench_ours(spec, setting, work)
        echo(f"ours: median {statistics.median(ours['iteration_s']):.3f} s/iteration")
        matmul = _best_matmul(matmul, matmul_peak_gflops(spec.matmul_n))  # re-measured: load varies
        trl = None
        if python is not None:
            echo(f"TRL 1.12 PPOTrainer: {spec.warmup} warm-up + {spec.iterations} timed iterations …")
            try:
                trl = bench_trl(python, setting["spec_path"], work, log)
                echo(f"TRL: median {statistics.median(trl['iteration_s']):.3f} s/iteration")
            except HarnessError as e:
                trl_error = str(e)
    echo(f"fp32 matmul peak: {matmul['peak_gflops']:.1f} GFLOP/s ({matmul['threads']} threads)")
    summary = summarize(spec, ours, trl, matmul)
    summary["machine"]["load_avg_1m_start"] = load_start
    summary["machine"]["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY")
    if trl_error:
        summary["trl"] = {"error": trl_error}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    ph = summary["phases_s"]
    echo("phases (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()))
    echo(f"training phase: {summary['roofline']['update_gflops_per_s']:.1f} GFLOP/s = "
         f"{100 * summary['roofline_fraction']:.1f} % of the fp32 matmul peak; peak RSS ours "
         f"{summary['peak_rss_mb']['ours']:.0f} MB" + (f", TRL {summary['peak_rss_mb']['trl']:.0f} MB" if trl else ""))
    echo(f"summary: {out / 'summary.json'}")
    if trl_error:
        raise HarnessError(trl_error)
    if summary["speedup"] is None:
        echo("TRL skipped (--skip-trl)")
    if summary["speedup_cpu"] is not None:
        echo(f"CPU time per iteration: ours {summary['ours_cpu_s']:.3f} s, TRL {summary['trl_cpu_s']:.3f} s "
             f"(speedup {summary['speedup_cpu']:.2f}; less sensitive to other load)")
    echo(f"ours_s={summary['ours_s']:.3f} trl_s={summary['trl_s'] if summary['trl_s'] is None else round(summary['trl_s'], 3)}")
    speedup = summary["speedup"]
    echo(f"speedup_vs_trl={speedup:.2f}" if speedup is not None else "speedup_vs_trl=nan")
    return summary
