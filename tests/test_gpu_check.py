"""The GPU check (harness/bench/gpu_check.py): its arithmetic by hand, its one-line refusal where there is no CUDA device,
and its whole ``--device cpu`` path (every step a GPU machine runs, at a tiny size) end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ablation_fixtures import results_env

from harness.bench.gpu_check import mfu, training_flops

ROOT = Path(__file__).resolve().parent.parent


def test_training_flops_and_mfu_by_hand():
    assert training_flops(1_000_000, 200_000, 1_000, 4) == 6 * 1_200_000 * 1_000 * 4 == 2.88e10
    assert mfu(2.88e10, 0.5, 0.576) == pytest.approx(2.88e10 / 0.5 / 1e12 / 0.576) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        mfu(1.0, 0.0, 1.0)
    with pytest.raises(ValueError):
        training_flops(-1, 0, 1, 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA device")
def test_make_gpu_check_without_a_gpu_says_so_in_one_line_and_exits_non_zero(tmp_path):
    r = subprocess.run(["make", "-s", "-C", str(ROOT), "gpu-check", f"ARGS=--out {tmp_path / 'out'}"],
                       capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1, r.stdout + r.stderr
    assert lines[0].startswith("gpu-check: no CUDA device here (torch ") and "--device cpu" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing measured, nothing written


@pytest.mark.slow
def test_the_cpu_path_runs_every_step_and_writes_one_summary(smoke_pipeline, tmp_path):
    out = tmp_path / "gpu_check"
    with results_env():
        r = subprocess.run([sys.executable, "-m", "harness.bench.gpu_check", "--device", "cpu", "--out", str(out)],
                           capture_output=True, text=True, timeout=900, cwd=ROOT, env=dict(os.environ))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    steps = summary["steps"]
    assert list(steps) == ["bench_tiny", "trl_tiny", "bench_smollm2", "trl_smollm2", "seeds_sharing", "smoke_ablation"]
    for name in ("bench_tiny", "bench_smollm2", "seeds_sharing", "smoke_ablation"):
        assert steps[name]["status"] == "ok", steps[name]
    for name in ("trl_tiny", "trl_smollm2"):  # TRL 1.12 is in the bench venv only where `make bench` built it
        assert steps[name]["status"] in ("ok", "skipped"), steps[name]
    for name in ("bench_tiny", "bench_smollm2"):
        s = steps[name]
        assert 0 < s["mfu"] < 1 and s["iteration_s"] > 0 and set(s["phases_s"]) == {"generate", "score", "forward", "update"}
        assert s["mfu"] == pytest.approx(s["update_model_tflops"] / s["phases_s"]["update"] / summary["matmul_peak_tflops"])
    assert steps["bench_smollm2"]["spec"]["arch"] == "llama" and steps["bench_tiny"]["spec"]["arch"] == "gpt2"
    assert set(steps["seeds_sharing"]["iterations_per_s"]) == {"1", "2"} and steps["seeds_sharing"]["vs_one"]["1"] == 1.0
    assert summary["device"] == "cpu" and summary["matmul_peak_tflops"] > 0
    assert r.stdout.strip().splitlines()[-1] == f"summary: {out / 'summary.json'}"
