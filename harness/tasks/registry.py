"""The task registry, apart from the tasks themselves, so that a task module imports it without
importing the package that imports the task (no import circle).

``TASKS.get(name)`` returns a factory ``(cfg: Config, tokenizer) -> Task``; a task registers its factory with
``@TASKS.register(name, eval_metrics=(...), ...)``, declaring the ``eval/*`` metrics its evaluation logs
(:mod:`harness.run_metrics`).
"""

from harness.registry import Registry

TASKS: Registry = Registry("task.name", None, "the RL task: prompts, proxy and gold scorers")

__all__ = ["TASKS"]
