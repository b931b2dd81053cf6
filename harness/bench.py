"""Performance benchmark: one PPO iteration in our loop against TRL 1.12's ``PPOTrainer``.

``harness bench`` (``make bench``) builds one tiny GPT-2 setting (policy, reference, reward model and
critic from random weights saved with ``save_pretrained``, one fixed batch of prompts), then times
full PPO iterations (rollout + scoring + K epochs of updates) on it:

1. **ours**: :func:`harness.ppo.train` on those models (injected with ``models=``/``task=``); the
   iteration time is the wall time between consecutive ``on_metrics`` callbacks, and the phase times
   are the loop's own ``time/*`` metrics;
2. **TRL**: ``trl.experimental.ppo.PPOTrainer`` of ``trl==1.12.0`` (the last release with PPO) in a
   separate virtualenv under ``.cache/bench-trl-venv`` (created on first use, then cached), driven by
   ``harness/bench_trl.py`` as a subprocess; the iteration time is the wall time between consecutive
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
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from harness.callbacks import Callback
from harness.errors import HarnessError

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

#: The TRL side's virtualenv: torch is installed first on its own (the local CPU wheel), then TRL with
#: every shared dependency pinned to the harness's versions so that torch stays 2.13.0.
TRL_TORCH_PIN = "torch==2.13.0"
TRL_PINS = (
    "trl==1.12.0",
    TRL_TORCH_PIN,
    "transformers==5.23.0",
    "accelerate==1.15.0",
    "datasets==5.2.0",
    "tokenizers==0.23.3",
    "psutil==7.2.2",
)
DEFAULT_VENV = Path(".cache") / "bench-trl-venv"
TRL_TIMEOUT_S = 420


@dataclass
class BenchSpec:
    """The benchmarked setting, shared by both sides (written to ``spec.json`` for the TRL script).

    Model: GPT-2 with ``n_layer`` blocks of width ``n_embd``, ``vocab_size`` tokens (EOS id 0, PAD
    id 1), ``n_positions`` positions. Rollout: ``batch_size`` prompts of ``prompt_length`` tokens,
    ``response_length`` sampled tokens each. Update: ``num_ppo_epochs`` epochs of
    ``num_minibatches`` minibatches (one micro-batch each). The PPO hyperparameters are the
    harness defaults (N+ recipe); ``missing_eos_penalty`` is the score given to a response without
    EOS in our loop (TRL subtracts ``-missing_eos_penalty`` instead; same cost).

    ``threads`` sets ``torch.set_num_threads`` on both sides. The default, 1, is how ``harness
    ablate`` runs the loop (one thread per worker process) and is robust on a shared machine: with
    one thread per core while other processes hold a core, libgomp's spinning threads slow a
    2-thread fwd+bwd by ~10× (measured). ``$HARNESS_BENCH_THREADS`` (a number, or ``auto`` for
    torch's default) overrides it when no spec is given.
    """

    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    vocab_size: int = 2050
    n_positions: int = 64
    batch_size: int = 64
    prompt_length: int = 8
    response_length: int = 24
    num_minibatches: int = 1
    num_ppo_epochs: int = 4
    temperature: float = 0.7
    lr: float = 3e-4
    kl_coef: float = 0.05
    cliprange: float = 0.2
    vf_coef: float = 0.1
    cliprange_value: float = 0.2
    gamma: float = 1.0
    lam: float = 0.95
    missing_eos_penalty: float = -1.0
    warmup: int = 1
    iterations: int = 5
    seed: int = 0
    threads: Optional[int] = 1  # torch intra-op threads on both sides (None: torch's default, one per core)
    matmul_n: int = 1024  # size of the square matmuls that measure the fp32 peak

    @property
    def seq_len(self) -> int:
        """Tokens per sequence in the forward passes: prompt + response."""
        return self.prompt_length + self.response_length


# ------------------------------------------------------------------------------------------------
# Arithmetic: FLOPs, roofline, medians
# ------------------------------------------------------------------------------------------------


def gpt2_forward_flops_per_token(n_layer: int, n_embd: int, seq_len: int, head_out: int) -> int:
    """Matmul FLOPs of one GPT-2 forward pass, per token.

    Args:
        n_layer: transformer blocks ``L``; n_embd: width ``h`` (MLP width 4h, as GPT-2's default).
        seq_len: tokens per sequence ``S`` (attention length; the full ``S×S`` score matrix is counted,
            as dense SDPA kernels compute it).
        head_out: outputs of the final linear head: the vocabulary size ``V`` for a causal LM, 1 for
            a scalar (reward/value) head.
    Returns:
        ``L·(24h² + 4Sh) + 2h·head_out`` FLOPs (one multiply-add = 2 FLOPs): per block 2·3h² (QKV),
        2h² (attention output), 2·8h² (MLP), 2·2·S·h (QKᵀ and attention·V); embedding lookups,
        layer norms, softmax and biases are not counted. Equals ``torch.utils.flop_counter`` on a
        transformers ``GPT2LMHeadModel`` forward (tested). A backward pass costs twice a forward, so
        a training step is ``3×`` this (Kaplan et al. 2020, "Scaling Laws", sec. 2.1: C ≈ 6N per token).
    Raises:
        ValueError: a non-positive size.
    """
    if min(n_layer, n_embd, seq_len, head_out) <= 0:
        raise ValueError(f"sizes must be positive (n_layer={n_layer}, n_embd={n_embd}, seq_len={seq_len}, head_out={head_out})")
    h = n_embd
    return n_layer * (24 * h * h + 4 * seq_len * h) + 2 * h * head_out


def update_flops(spec: BenchSpec) -> int:
    """Matmul FLOPs of the training phase of one PPO iteration (policy and critic, forward + backward).

    Every epoch runs the policy (LM head) and the critic (scalar head) forward and backward over all
    ``batch_size × seq_len`` tokens: ``epochs · B · S · 3 · (F_policy + F_critic)`` with ``F`` from
    :func:`gpt2_forward_flops_per_token`. The minibatch split does not change the total.
    """
    f_pol = gpt2_forward_flops_per_token(spec.n_layer, spec.n_embd, spec.seq_len, spec.vocab_size)
    f_crit = gpt2_forward_flops_per_token(spec.n_layer, spec.n_embd, spec.seq_len, 1)
    return spec.num_ppo_epochs * spec.batch_size * spec.seq_len * 3 * (f_pol + f_crit)


def scoring_forward_flops(spec: BenchSpec) -> int:
    """Matmul FLOPs of the no-grad scoring forwards (``time/forward``): π_old logprobs, reference
    logprobs (two LM-head forwards) and critic values (one scalar-head forward) over ``B × S`` tokens.

    The scoring forwards apply the LM head to the ``T + 1`` last positions only
    (:func:`harness.rollout.response_logits`), so each LM-head forward counts
    ``B·S·(F_policy − 2hV) + B·(T+1)·2hV``; the critic counts ``B·S·F_critic``.
    """
    f_pol = gpt2_forward_flops_per_token(spec.n_layer, spec.n_embd, spec.seq_len, spec.vocab_size)
    f_crit = gpt2_forward_flops_per_token(spec.n_layer, spec.n_embd, spec.seq_len, 1)
    lm_head = 2 * spec.n_embd * spec.vocab_size
    policy_fwd = spec.batch_size * spec.seq_len * (f_pol - lm_head) + spec.batch_size * (spec.response_length + 1) * lm_head
    return 2 * policy_fwd + spec.batch_size * spec.seq_len * f_crit


def roofline_fraction(flops: float, seconds: float, peak_gflops: float) -> float:
    """Achieved FLOP rate as a fraction of the peak: ``flops / seconds / 1e9 / peak_gflops``.

    Args:
        flops: work done (FLOPs); seconds: wall time (s); peak_gflops: machine peak (GFLOP/s).
    Returns:
        a fraction (0.5 = 50 % of peak).
    Raises:
        ValueError: seconds or peak_gflops not positive.
    """
    if seconds <= 0 or peak_gflops <= 0:
        raise ValueError(f"seconds ({seconds}) and peak_gflops ({peak_gflops}) must be positive")
    return flops / seconds / 1e9 / peak_gflops


def matmul_peak_gflops(n: int = 1024, repeats: int = 7, inner: int = 4) -> dict[str, float]:
    """Measure the fp32 matmul rate of this machine with torch's current thread count.

    Times ``repeats`` rounds of ``inner`` ``[n, n] @ [n, n]`` float32 products (``2n³`` FLOPs each)
    after one warm-up product. Returns ``{"peak_gflops": best round, "median_gflops": median round,
    "n": n, "threads": torch.get_num_threads()}`` in GFLOP/s. The best round is the peak: other
    processes on the same cores can only slow a round down.
    """
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    torch.mm(a, b, out=c)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, b, out=c)
        dt = (time.perf_counter() - t0) / inner
        rates.append(2 * n**3 / dt / 1e9)
    return {"peak_gflops": max(rates), "median_gflops": statistics.median(rates), "n": n, "threads": torch.get_num_threads()}


def _best_matmul(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """The better of two :func:`matmul_peak_gflops` measurements (peak and median both the max)."""
    return {**a, "peak_gflops": max(a["peak_gflops"], b["peak_gflops"]),
            "median_gflops": max(a["median_gflops"], b["median_gflops"])}


def timed_window(timestamps: list[float], warmup: int, iterations: int) -> list[float]:
    """Per-iteration wall times from end-of-iteration timestamps.

    Args:
        timestamps: ``[t_start, t_end(0), t_end(1), ...]`` (s): a start mark followed by one mark at
            the end of every iteration.
        warmup: leading iterations to drop; iterations: how many to keep after them.
    Returns:
        ``[t_end(i) − t_end(i−1)]`` for ``i = warmup .. warmup + iterations − 1`` (s).
    Raises:
        ValueError: fewer than ``warmup + iterations`` iterations were recorded.
    """
    durations = [b - a for a, b in zip(timestamps, timestamps[1:])]
    if len(durations) < warmup + iterations:
        raise ValueError(f"recorded {len(durations)} iterations, need warmup {warmup} + {iterations} timed")
    return durations[warmup : warmup + iterations]


def summarize(spec: BenchSpec, ours: dict[str, Any], trl: Optional[dict[str, Any]], matmul: dict[str, float]) -> dict[str, Any]:
    """Assemble ``summary.json`` from the two sides' raw timings.

    Args:
        spec: the benchmarked setting.
        ours: ``{"iteration_s": [..], "phase_s": {phase: [..]}, "forward_breakdown_s": {..},
            "peak_rss_mb", "n_params", "torch_threads"}`` from :func:`bench_ours`.
        trl: the TRL script's result (``iteration_s``, ``peak_rss_mb``, ...), or None when skipped.
        matmul: :func:`matmul_peak_gflops`'s result.
    Returns:
        ``{"ours_s", "trl_s", "speedup", "ours_cpu_s", "trl_cpu_s", "speedup_cpu", "phases_s", "roofline_fraction", "peak_rss_mb", "roofline",
        "ours", "trl", "spec", "machine"}``: medians in seconds, ``speedup = trl_s / ours_s`` (> 1
        means our loop is faster; the ``*_cpu_*`` twins use process CPU time, which other processes
        on the machine inflate far less than wall time when each side runs one thread), phase medians (``generate``, ``score``, ``forward`` = π_old +
        reference + critic forwards, ``update``, ``other`` = median over iterations of the iteration
        time minus its four phases: advantages, metrics, callbacks), the training phase's achieved GFLOP/s over the matmul peak. ``trl_s``/``speedup`` are None when skipped.
    """
    ours_s = statistics.median(ours["iteration_s"])
    phases = {k: statistics.median(v) for k, v in ours["phase_s"].items()}
    per_iter = zip(ours["iteration_s"], *ours["phase_s"].values())
    phases["other"] = statistics.median(it - sum(ph) for it, *ph in per_iter)
    peak = matmul["peak_gflops"]
    upd_flops, fwd_flops = update_flops(spec), scoring_forward_flops(spec)
    roof = {
        "matmul_peak_gflops": peak,
        "matmul_median_gflops": matmul["median_gflops"],
        "update_flops": upd_flops,
        "update_gflops_per_s": upd_flops / phases["update"] / 1e9,
        "update_fraction": roofline_fraction(upd_flops, phases["update"], peak),
        "forward_flops": fwd_flops,
        "forward_gflops_per_s": fwd_flops / phases["forward"] / 1e9,
        "forward_fraction": roofline_fraction(fwd_flops, phases["forward"], peak),
    }
    trl_s = statistics.median(trl["iteration_s"]) if trl else None
    ours_cpu = statistics.median(ours["iteration_cpu_s"])
    trl_cpu = statistics.median(trl["iteration_cpu_s"]) if trl else None
    return {
        "ours_s": ours_s,
        "trl_s": trl_s,
        "speedup": trl_s / ours_s if trl_s is not None else None,
        "ours_cpu_s": ours_cpu,
        "trl_cpu_s": trl_cpu,
        "speedup_cpu": trl_cpu / ours_cpu if trl_cpu is not None else None,
        "phases_s": phases,
        "roofline_fraction": roof["update_fraction"],
        "peak_rss_mb": {"ours": ours["peak_rss_mb"], "trl": trl["peak_rss_mb"] if trl else None},
        "roofline": roof,
        "ours": ours,
        "trl": trl if trl else {"skipped": True},
        "spec": {k: v for k, v in asdict(spec).items()},
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0],
        },
    }


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
    """Save the shared tokenizer, policy (``GPT2LMHeadModel``), reward model (``GPT2ForSequenceClassification``,
    1 label; also the critic's start, as N+ and TRL's examples do) and prompts under ``root``.

    Weights are drawn under ``spec.seed``; prompts are ``[B, P]`` ids drawn uniformly from the
    non-special tokens (no EOS/PAD inside a prompt). Returns ``{"tokenizer_dir", "policy_dir",
    "rm_dir", "prompts": [[int]*P]*B, "spec_path"}``; ``spec.json`` holds the spec plus these.
    """
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    root.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(spec.vocab_size)
    dirs = {k: root / k for k in ("tokenizer", "policy", "reward_model")}
    for d in dirs.values():
        tok.save_pretrained(d)
    gcfg = dict(vocab_size=spec.vocab_size, n_positions=spec.n_positions, n_embd=spec.n_embd, n_layer=spec.n_layer,
                n_head=spec.n_head, bos_token_id=0, eos_token_id=0, pad_token_id=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        GPT2LMHeadModel(GPT2Config(**gcfg)).save_pretrained(dirs["policy"])
        GPT2ForSequenceClassification(GPT2Config(**gcfg, num_labels=1)).save_pretrained(dirs["reward_model"])
    g = torch.Generator().manual_seed(spec.seed)
    prompts = torch.randint(2, spec.vocab_size, (spec.batch_size, spec.prompt_length), generator=g)
    setting = {"tokenizer_dir": str(dirs["tokenizer"]), "policy_dir": str(dirs["policy"]),
               "rm_dir": str(dirs["reward_model"]), "prompts": prompts.tolist()}
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps({**asdict(spec), **setting}))
    return {**setting, "spec_path": str(spec_path)}


class FixedPromptTask:
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
    """The harness ``Config`` of the benchmark: the spec's sizes and hyperparameters, CPU, no samples."""
    from harness.config import build_config

    return build_config({
        "seed": spec.seed,
        "device": "cpu",
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
    """``harness.run_models.Models`` from the saved setting, prepared exactly as a run prepares the
    pipeline's (:func:`harness.run_models.assemble_models`); one tokenizer for policy and RM, reward offset 0."""
    from harness.models import load_tokenizer
    from harness.run_models import assemble_models

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
    """Time ``spec.warmup + spec.iterations`` iterations of :func:`harness.ppo.train` on the setting.

    Returns ``{"iteration_s": [..], "iteration_cpu_s": [..], "phase_s": {"generate"|"score"|"forward"|"update": [..]},
    "forward_breakdown_s": {"policy_logprobs", "ref_logprobs", "critic_values"}, "peak_rss_mb",
    "n_params", "torch_threads"}`` (seconds; the first ``warmup`` iterations dropped). The forward
    breakdown times the three no-grad scoring forwards of ``time/forward`` one by one, after training,
    on one ``[B, P+T]`` batch (median of 3). Peak RSS is this process's ``ru_maxrss``.
    """
    from harness.ppo import train
    from harness.run_models import critic_values
    from harness.rollout import response_logprobs

    cfg = bench_config(spec)
    device = torch.device("cpu")
    models = load_models(cfg, setting, device)
    models.gold = zero_gold
    task = FixedPromptTask(torch.tensor(setting["prompts"], dtype=torch.long))
    timer = IterationTimer()
    train(cfg, workdir / "ours", callbacks=[timer], progress=False, models=models, task=task)
    iteration_s = timed_window(timer.marks, spec.warmup, spec.iterations)
    iteration_cpu_s = timed_window(timer.cpu_marks, spec.warmup, spec.iterations)
    kept = timer.phases[spec.warmup : spec.warmup + spec.iterations]
    phase_s = {k: [p[k] for p in kept] for k in ("generate", "score", "forward", "update")}

    g = torch.Generator().manual_seed(spec.seed)
    qr = torch.cat([task.prompt_ids, torch.randint(2, spec.vocab_size, (spec.batch_size, spec.response_length), generator=g)], 1)
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
# TRL side
# ------------------------------------------------------------------------------------------------


def _run_logged(cmd: list[str], log: Path, timeout: Optional[float] = None, env: Optional[dict[str, str]] = None) -> int:
    """Run ``cmd`` with stdout and stderr appended to ``log``; return its exit code (124 on timeout)."""
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, env=env).returncode
        except subprocess.TimeoutExpired:
            fh.write(f"timed out after {timeout} s\n")
            return 124


def _log_tail(log: Path, n: int = 3) -> str:
    """The last ``n`` non-empty lines of ``log`` joined on one line (for one-line errors)."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    return " | ".join(lines[-n:])


def ensure_trl_venv(venv_dir: Path, log: Path, echo: Callable[[str], None] = print) -> Path:
    """Create (once) the TRL 1.12 virtualenv and return its python.

    ``python -m venv``, then ``pip install torch==2.13.0`` alone (the local CPU wheel), then
    ``pip install`` :data:`TRL_PINS` (torch pinned again so nothing replaces it), then an import
    check. A stamp file holding the pins marks a finished venv; a venv without a matching stamp is
    rebuilt. pip's output goes to ``log``.

    Raises:
        HarnessError: a step failed (one line naming the log).
    """
    py = venv_dir / "bin" / "python"
    stamp = venv_dir / ".bench-pins"
    want = "\n".join(TRL_PINS)
    if py.exists() and stamp.is_file() and stamp.read_text() == want:
        return py
    if venv_dir.exists():
        shutil.rmtree(venv_dir)
    venv_dir.parent.mkdir(parents=True, exist_ok=True)
    echo(f"creating the TRL 1.12 venv at {venv_dir} (first run only; ~1.5 min, log: {log})")
    check = ("import torch, trl; from trl.experimental.ppo import PPOTrainer; "
             "assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__; "
             "assert trl.__version__ == '1.12.0', trl.__version__")
    steps = [
        [sys.executable, "-m", "venv", str(venv_dir)],
        [str(py), "-m", "pip", "install", "-q", TRL_TORCH_PIN],
        [str(py), "-m", "pip", "install", "-q", *TRL_PINS],
        [str(py), "-c", check],
    ]
    for cmd in steps:
        if _run_logged(cmd, log) != 0:
            raise HarnessError(f"creating the TRL venv failed at `{' '.join(cmd[:4])} …`: {_log_tail(log)} (full log: {log})")
    stamp.write_text(want)
    return py


def bench_trl(python: Path, spec_path: str, workdir: Path, log: Path) -> dict[str, Any]:
    """Run ``harness/bench_trl.py`` with the TRL venv's ``python`` on ``spec_path``; return its JSON.

    Raises:
        HarnessError: the script failed or timed out (one line naming the log).
    """
    out = workdir / "trl_result.json"
    script = Path(__file__).with_name("bench_trl.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ACCELERATE_MIXED_PRECISION")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               WANDB_DISABLED="true", TRANSFORMERS_NO_ADVISORY_WARNINGS="1", TRL_EXPERIMENTAL_SILENCE="1")
    rc = _run_logged([str(python), str(script), "--spec", spec_path, "--out", str(out), "--workdir", str(workdir / "trl")],
                     log, timeout=TRL_TIMEOUT_S, env=env)
    if rc != 0 or not out.is_file():
        raise HarnessError(f"the TRL benchmark failed (exit {rc}): {_log_tail(log)} (full log: {log})")
    return json.loads(out.read_text())


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
