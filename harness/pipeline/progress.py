"""A tqdm progress bar for TRL/transformers trainers that shows the current loss in its postfix."""

from __future__ import annotations

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
    labelled ``desc`` (``progress=True``) or with nothing (``progress=False``).

    Raises:
        nothing.
    """
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    if progress:
        trainer.add_callback(LossProgressCallback(desc))


__all__ = ["LossProgressCallback", "install_progress"]
