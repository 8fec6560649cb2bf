"""Progress of long evaluation work: a live bar on a terminal, plain lines in a log.

Light on purpose (rich only, imported when asked): ``kvpolicy evict --help`` imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

__all__ = ["LogProgress", "progress_for"]


class LogProgress:
    """The progress of long work as plain lines, for a console that is no terminal (a log
    file, ``nohup``), where a live bar draws nothing: a line when a task starts or is
    renamed, and one at most every ``every_s`` seconds with the steps done, the time so far
    and the time left at the rate so far. The part of rich's ``Progress`` the commands use.
    """

    def __init__(self, console: Console, every_s: float = 60.0) -> None:
        import time

        self._console = console
        self._every = every_s
        self._clock = time.monotonic
        self._tasks: dict[int, list[Any]] = {}  # id -> [description, total, done, start, last]

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        for task in self._tasks:
            self._line(task)

    def add_task(self, description: str, total: float | None = None) -> int:
        """A new task of ``total`` steps; its first line."""
        task = len(self._tasks)
        now = self._clock()
        self._tasks[task] = [description, total, 0.0, now, now]
        self._line(task)
        return task

    def update(self, task: int, *, description: str | None = None) -> None:
        """Rename ``task`` (a line with the new name)."""
        if description is not None and description != self._tasks[task][0]:
            self._tasks[task][0] = description
            self._line(task)

    def advance(self, task: int, advance: float = 1.0) -> None:
        """``advance`` more steps of ``task`` done (a line when ``every_s`` has passed)."""
        state = self._tasks[task]
        state[2] += advance
        if self._clock() - state[4] >= self._every:
            self._line(task)

    def _line(self, task: int) -> None:
        description, total, done, start, _ = self._tasks[task]
        now = self._clock()
        self._tasks[task][4] = now
        spent = now - start
        text = f"{description}: {done:,.0f}"
        if total:
            text += f" / {total:,.0f} ({100 * done / total:.0f}%)"
        text += f", {_minutes(spent)}"
        if total and 0 < done < total:
            text += f", about {_minutes(spent * (total - done) / done)} left"
        self._console.print(text, markup=False, highlight=False, soft_wrap=True)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def progress_for(console: Console) -> Progress | LogProgress:
    """A live bar on a terminal; plain lines elsewhere (:class:`LogProgress`)."""
    if not console.is_terminal:
        return LogProgress(console)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
