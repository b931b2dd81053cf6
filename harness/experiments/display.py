"""The driver's console view of an ablation's runs: a rich live display on a terminal (a summary row and one
row per running (variant, seed)), or, when stderr is a file or pipe, one plain line per finished run and a
summary line at the end. Fed by the workers' progress events (:func:`harness.experiments.engine.emit`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from harness.experiments.plan import RunTask


class RunDisplay:
    """One rich progress display: a summary row (runs done / running / failed / queued, and the
    ETA over all iterations still to run) and one row per running (variant, seed)."""

    def __init__(self, name: str, scale: str, tasks: list[RunTask], skipped: int, enabled: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, \
            TimeElapsedColumn, TimeRemainingColumn

        self.name, self.scale, self.skipped = name, scale, skipped
        self.totals = {t.key: t.total_iterations for t in tasks}
        self.iters = {t.key: 0 for t in tasks}
        self.status: dict[str, str] = {}  # key -> final status, once counted
        self.rows: dict[str, Any] = {}  # key -> row of a running run
        console = Console(stderr=True)
        # a log file or pipe gets no live display (rich would print its last frame at the end): one plain
        # line per finished run instead, and one summary line at the end
        self.plain = enabled and not console.is_terminal
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("it"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=console, disable=not enabled or self.plain, transient=False,
        )
        self.main = self.progress.add_task(self._describe(), total=sum(self.totals.values()))
        self.t0 = time.time()

    def _describe(self) -> str:
        from rich.markup import escape

        done = sum(s == "FINISHED" for s in self.status.values())
        failed = len(self.status) - done
        queued = len(self.totals) - len(self.status) - len(self.rows)
        return (f"[bold]{escape(self.name)}[/] ({self.scale}) runs: [green]{done} done[/] · [cyan]{len(self.rows)} running[/] · "
                f"[red]{failed} failed[/] · {queued} queued" + (f" · {self.skipped} already finished" if self.skipped else ""))

    def _refresh(self) -> None:
        completed = sum(self.totals[k] if k in self.status else self.iters[k] for k in self.totals)
        self.progress.update(self.main, completed=completed, description=self._describe())

    def __enter__(self) -> "RunDisplay":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()
        if self.plain:
            self.note(self._describe())

    def note(self, message: str) -> None:
        """Print one line above the live display (a failure as it happens)."""
        self.progress.console.print(message, soft_wrap=True)

    def event(self, kind: str, key: str, value: Any) -> None:
        """Apply one worker event: ``start`` (pid), ``run`` (MLflow run id), ``iter`` (iterations
        done), ``end`` (status), ``retry`` (why an earlier attempt failed)."""
        if key not in self.totals or key in self.status:
            return
        if kind == "start":
            from rich.markup import escape

            self.reset(key)
            self.rows[key] = self.progress.add_task(f"  {escape(key)} (pid {value})", total=self.totals[key])
        elif kind == "iter":
            self.iters[key] = max(self.iters[key], int(value))
            if key in self.rows:
                self.progress.update(self.rows[key], completed=self.iters[key])
        elif kind == "end":
            self.finish(key, str(value))
        elif kind == "retry":
            from rich.markup import escape

            self.note(f"[yellow]FAILED[/] {escape(key)}: {escape(str(value))}")
            self.reset(key)
        self._refresh()

    def reset(self, key: str) -> None:
        """Forget a run's progress (its worker died; it will be retried)."""
        row = self.rows.pop(key, None)
        if row is not None:
            self.progress.remove_task(row)
        self.iters[key] = 0
        self._refresh()

    def finish(self, key: str, status: str, reason: Optional[str] = None) -> None:
        """Count a run once as FINISHED or failed (its remaining iterations count as done); a failed
        run gets a console line with its reason at once."""
        if key in self.status or key not in self.totals:
            return
        if status != "FINISHED":
            from rich.markup import escape

            self.note(f"[red]{escape(status)}[/] {escape(key)}" + (f": {escape(reason)}" if reason else ""))
        row = self.rows.pop(key, None)
        if row is not None:
            self.progress.remove_task(row)
        self.status[key] = status
        self._refresh()
        if self.plain and status == "FINISHED":
            self.note(self.plain_line(key))

    def plain_line(self, key: str) -> str:
        """``finished KEY: D/N runs done, elapsed M min, about R min left`` (the rest estimated from
        the iterations run so far)."""
        elapsed = time.time() - self.t0
        done_iters = sum(self.totals[k] if k in self.status else self.iters[k] for k in self.totals)
        left = sum(self.totals.values()) - done_iters
        eta = f", about {elapsed / done_iters * left / 60:.0f} min left" if done_iters and left else ""
        done = sum(s == "FINISHED" for s in self.status.values())
        return f"finished {key}: {done}/{len(self.totals)} runs done, elapsed {elapsed / 60:.1f} min{eta}"


__all__ = ["RunDisplay"]
