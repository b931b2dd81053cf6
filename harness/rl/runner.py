"""The runner: a config in, one trained run out. It builds what :func:`harness.rl.ppo.train` is given (the run's
models from the pipeline's artifacts, building missing stages, and its task) and then trains; every caller that
starts a run from a config (``harness train``, an ablation's worker, a sweep trial, the reasoning benchmark) comes
through here, so a run is built in one place.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import torch

from harness.config import Config
from harness.rl.callbacks import Callback


def build_run(cfg: Config, defer: bool = False) -> tuple[Any, Any]:
    """``(models, task)`` of ``cfg`` on its device: seeded with ``cfg.seed`` and on ``cfg.torch_threads`` threads
    before anything is loaded (as :func:`harness.rl.ppo.train` seeds again before its first draw). ``defer``: the
    pipeline without the stages no PPO run reads (:func:`harness.rl.run_models.build_models`).

    Returns:
        :class:`harness.rl.run_models.Models` (:func:`harness.rl.run_models.build_models`) and the task
        (``TASKS.get(cfg.task.name)(cfg, models.tokenizer)``).
    Raises:
        KeyError: an unknown task name (the config's validation refuses it first).
        HarnessError: a pipeline stage could not be built (see :func:`harness.pipeline.build_pipeline`).
    """
    import transformers

    from harness.rl.models import resolve_device
    from harness.rl.run_models import build_models
    from harness.tasks import TASKS

    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    device, _ = resolve_device(cfg.device)
    transformers.logging.set_verbosity_error()  # no per-load weight bars or padding hints
    transformers.utils.logging.disable_progress_bar()
    models = build_models(cfg, device, defer=defer)
    return models, TASKS.get(cfg.task.name)(cfg, models.tokenizer)


def run(cfg: Config, out_dir: str | Path, callbacks: Sequence[Callback] = (), progress: bool = True) -> dict[str, Any]:
    """Build ``cfg``'s models and task (:func:`build_run`) and train them (:func:`harness.rl.ppo.train`).

    Returns:
        the run's summary (:func:`harness.rl.ppo.train`), whose ``wall_time_s`` counts the building too.
    Raises:
        what :func:`build_run` and :func:`harness.rl.ppo.train` raise (e.g. ``TrainingDivergedError``).
    """
    from harness.rl.ppo import train

    started = time.perf_counter()
    models, task = build_run(cfg)
    return train(cfg, out_dir, models, task, callbacks, progress, started=started)


__all__ = ["build_run", "run"]
