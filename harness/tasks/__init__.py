"""RL tasks, registered by name. A task supplies prompts and a gold scorer.

``TASKS.get(name)`` returns a factory ``(cfg: Config, tokenizer) -> Task`` (the registry is
:mod:`harness.tasks.registry`; importing this package registers every shipped task).
"""

from harness.tasks.registry import TASKS  # noqa: F401  (this package's public name)

from harness.tasks import chain_sum, review_sentiment  # noqa: E402,F401  (registration)
