"""The benchmark's setting (:class:`BenchSpec`) and its arithmetic: analytic FLOPs of GPT-2 forwards and of a
PPO update, the roofline fraction against a measured fp32 matmul peak, the timed window of an iteration
series, and the summary that puts both sides of ``harness bench`` side by side (:mod:`harness.bench.loop`).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch


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
    arch: str = "gpt2"  # "gpt2", or "llama" (SmolLM2's family: n_kv_head key/value heads, intermediate_size MLP)
    n_kv_head: int = 0  # llama only: key/value heads (grouped-query attention)
    intermediate_size: int = 0  # llama only: the MLP's hidden width
    device: str = "cpu"  # "cpu", or "cuda" (bf16 autocast on both sides, as a run on a GPU)

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
    (:func:`harness.rl.rollout.response_logits`), so each LM-head forward counts
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
