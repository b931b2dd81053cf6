"""The metrics callback interface of the PPO loop.

The loop calls these hooks and knows nothing about where metrics go; MLflow tracking, Optuna
pruning and progress displays attach here without touching the loop.
"""

from __future__ import annotations

from typing import Any

#: The artifact folder of a run's held-out responses, one JSON per evaluation (``on_heldout``).
HELDOUT_DIR = "heldout"


class Callback:
    """Base class: every hook is optional and does nothing by default."""

    def on_start(self, cfg: Any, info: dict[str, Any]) -> None:
        """Called once after the models are loaded. ``info`` holds ``n_params`` and ``device``."""

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        """Called after every iteration with that iteration's metrics (standard names)."""

    def on_eval(self, iteration: int, metrics: dict[str, float]) -> None:
        """Called after each evaluation on the fixed held-out prompt set, ``iteration`` = PPO
        iterations done (0 = the SFT policy), with ``eval/gold``, ``eval/proxy``, ``eval/kl``,
        ``eval/eos_rate`` and ``eval/length``."""

    def on_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        """Called at the start, middle and end with sample completions
        (keys ``prompt``, ``response``, ``score``, ``gold``)."""

    def on_heldout(self, iteration: int, heldout: dict[str, Any]) -> None:
        """Called after each evaluation whose task keeps its held-out responses (the tasks of
        :mod:`harness.tasks.rm_scoring`), with ``{"iteration", "texts" (prompt + response), "responses",
        "response_ids", "gold", "proxy"}``, one entry per response: the data a new judge re-scores
        (``harness rescore``)."""

    def on_end(self, summary: dict[str, Any]) -> None:
        """Called once with the run summary (also written to ``summary.json``)."""


class MetricsRecorder(Callback):
    """Keeps every metric in memory: ``history[name] -> list of (iteration, value)``."""

    def __init__(self) -> None:
        self.history: dict[str, list[tuple[int, float]]] = {}
        self.samples: dict[int, list[dict[str, Any]]] = {}

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.history.setdefault(k, []).append((iteration, float(v)))

    def on_eval(self, iteration: int, metrics: dict[str, float]) -> None:
        self.on_metrics(iteration, metrics)

    def on_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        self.samples[iteration] = samples
