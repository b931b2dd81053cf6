"""Ablation axes: one module per axis, each a set of small pure tensor functions registered by name.

Importing this package registers every shipped variant.
"""

from harness.rl.components import (  # noqa: F401  (import for registration side effects)
    advantages,
    aggregation,
    covariance,
    critic,
    dropout,
    eos,
    kl,
    losses,
    outcome_advantages,
    rewards,
    rollout_correction,
    token_selection,
    whitening,
)
