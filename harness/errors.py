"""Errors the harness reports as one clear line (the CLI prints them without a traceback)."""


class HarnessError(Exception):
    """Base class for user-facing errors: bad input, missing cache, diverged training."""


class DataCacheError(HarnessError):
    """The offline data cache is missing or corrupt. The message names the command that fetches it."""


class TrainingDivergedError(HarnessError):
    """A loss, reward or advantage became NaN or inf. The message names the quantity and iteration."""


class RunsFailedError(HarnessError):
    """Some runs of an invocation ended FAILED (each is recorded with its reason; the report lists
    them). The CLI exits with status 1 for it, as for a diverged run."""
