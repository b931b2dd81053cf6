"""A tqdm progress bar for TRL/transformers trainers that shows the current loss in its postfix."""

from __future__ import annotations

import sys

from transformers import PrinterCallback, ProgressCallback


class LossProgressCallback(ProgressCallback):
    """transformers' ``ProgressCallback`` whose ``on_log`` puts loss (and accuracy, lr) in the bar's postfix
    instead of printing one dict line per log step (every ``logging_steps`` optimizer steps)."""

    KEYS = ("loss", "accuracy", "mean_token_accuracy", "learning_rate")
    SHORT = {"mean_token_accuracy": "acc", "accuracy": "acc", "learning_rate": "lr"}

    def __init__(self, desc: str) -> None:
        super().__init__()
        self.desc = desc

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        if self.training_bar is not None:
            self.training_bar.set_description(self.desc)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            post = {self.SHORT.get(k, k): f"{logs[k]:.3g}" for k in self.KEYS if isinstance(logs.get(k), (int, float))}
            if post:
                self.training_bar.set_postfix(post, refresh=True)


def install_progress(trainer, desc: str, progress: bool) -> None:
    """Replace a transformers ``Trainer``'s default progress/printer callbacks with a loss-showing bar
    labelled ``desc`` (``progress=True`` and stderr is a terminal) or with nothing (``progress=False``, or
    stderr is a file or pipe: tqdm would write every frame into it, joined by carriage returns).

    Raises:
        nothing.
    """
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    if progress and sys.stderr.isatty():  # a log file gets the pipeline's one line per stage, not bar frames
        trainer.add_callback(LossProgressCallback(desc))


__all__ = ["LossProgressCallback", "install_progress"]


def trainer_args(stage_cfg, *, output_dir: str, max_length: int, seed: int, bf16: bool, device) -> dict:
    """Keyword arguments shared by the SFT and reward-model TRL configs: an offline, seeded,
    checkpoint-free cosine run with the loss logged every 10 steps.

    Args:
        stage_cfg: ``SFTConfig`` or ``RewardModelConfig`` (epochs, max_steps, batch_size, lr,
            group_by_length).
        output_dir: the trainer's scratch directory.
        max_length: tokens per sequence.
        seed: seeds both the model init and the data order.
        bf16: bf16 mixed precision (CUDA only).
        device: where training runs; CPU sets ``use_cpu``.
    Returns:
        a dict for ``trl.SFTConfig(**...)`` / ``trl.RewardConfig(**...)``.
    """
    import torch

    return dict(
        output_dir=output_dir,
        num_train_epochs=stage_cfg.epochs,
        max_steps=stage_cfg.max_steps,
        per_device_train_batch_size=stage_cfg.batch_size,
        learning_rate=stage_cfg.lr,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
        weight_decay=0.0,
        max_length=max_length,
        logging_steps=10,
        logging_first_step=True,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        push_to_hub=False,
        gradient_checkpointing=False,
        bf16=bf16,
        use_cpu=torch.device(device).type == "cpu",
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=not sys.stderr.isatty(),
        train_sampling_strategy="group_by_length" if stage_cfg.group_by_length else "random",
    )
