"""The TRL side of ``harness bench``: its virtualenv (``trl==1.12.0``, the last release with ``PPOTrainer``, on
the local torch 2.13 CPU wheel), created on first use under ``.cache/bench-trl-venv``, and the subprocess
that runs ``harness/bench/trl.py`` in it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from harness.errors import HarnessError

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
    """Run ``harness/bench/trl.py`` with the TRL venv's ``python`` on ``spec_path``; return its JSON.

    Raises:
        HarnessError: the script failed or timed out (one line naming the log).
    """
    out = workdir / "trl_result.json"
    script = Path(__file__).with_name("trl.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ACCELERATE_MIXED_PRECISION")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               WANDB_DISABLED="true", TRANSFORMERS_NO_ADVISORY_WARNINGS="1", TRL_EXPERIMENTAL_SILENCE="1")
    rc = _run_logged([str(python), str(script), "--spec", spec_path, "--out", str(out), "--workdir", str(workdir / "trl")],
                     log, timeout=TRL_TIMEOUT_S, env=env)
    if rc != 0 or not out.is_file():
        raise HarnessError(f"the TRL benchmark failed (exit {rc}): {_log_tail(log)} (full log: {log})")
    return json.loads(out.read_text())
