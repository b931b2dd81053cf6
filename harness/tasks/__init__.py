"""RL tasks, registered by name. A task supplies prompts and a gold scorer.

``TASKS.get(name)`` returns a factory ``(cfg: Config, tokenizer) -> Task``.
"""

from harness.registry import Registry

TASKS: Registry = Registry("task.name", None, "the RL task: prompts, proxy and gold scorers")

from harness.tasks import review_sentiment  # noqa: E402,F401  (registration)
