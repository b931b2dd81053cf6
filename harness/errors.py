"""Errors the harness reports as one clear line (the CLI prints them without a traceback)."""


def one_line(e: BaseException, limit: int = 500) -> str:
    """``"TypeName: message"`` of exception ``e`` with all whitespace folded to single spaces, cut to
    ``limit`` characters: how a failure reason is recorded (MLflow ``failure_reason`` tags, trial
    ``fail_reason`` attrs, console lines)."""
    return " ".join(f"{type(e).__name__}: {e}".split())[:limit]


class HarnessError(Exception):
    """Base class for user-facing errors: bad input, missing cache, diverged training."""


class DataCacheError(HarnessError):
    """The offline data cache is missing or corrupt. The message names the command that fetches it."""


class TrainingDivergedError(HarnessError):
    """A loss, reward or advantage became NaN or inf. The message names the quantity and iteration."""


class RunsFailedError(HarnessError):
    """Some runs of an invocation ended FAILED (each is recorded with its reason; the report lists
    them). The CLI exits with status 1 for it, as for a diverged run."""


class ServiceError(HarnessError):
    """An outside service (MLflow server, database, Ray cluster) could not be reached in time. The
    message names the service and its redacted address; the CLI exits with status 1 for it."""
