"""Typed configuration: the run's config models (schema), their strict base and hashing (base), the pipeline's
settings (pipeline) and the scale presets (presets). ``from harness.config import Config`` re-exports the schema."""

from harness.config.schema import *  # noqa: F401,F403
from harness.config.schema import __all__  # noqa: F401
