"""Progress of the offline tools' long steps, on stderr, only when stderr is a terminal.

The work itself takes plain callbacks (`Advance`), so it knows nothing of the display; the CLI
opens a `Steps` and hands each step's `advance` down."""

from __future__ import annotations

from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

Advance = Callable[[], None]
"""Called once per unit of work done (a resource registered, a file written, a check run)."""


class Steps:
    """A context manager showing one line per step: a bar when the step's size is known, a spinner
    and a count when not. Shows nothing with `quiet` or when stderr is not a terminal, so logs and
    pipes get only the commands' own output."""

    def __init__(self, quiet: bool = False):
        console = Console(stderr=True)
        self.enabled = not quiet and console.is_terminal
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not self.enabled,
        )
        self._current: TaskID | None = None

    def __enter__(self) -> Steps:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._finish()
        self._progress.stop()

    def step(self, description: str, total: int | None = None) -> Advance:
        """Start a step (ending the previous one) and return its `advance`."""
        self._finish()
        task = self._progress.add_task(description, total=total)
        self._current = task
        self._progress.refresh()  # a step shorter than the refresh period still shows
        return lambda: self._progress.advance(task)

    def _finish(self) -> None:
        """The current step is done: what it counted is its total."""
        for task in self._progress.tasks:
            if task.id == self._current:
                self._progress.update(task.id, total=task.completed)
                self._progress.refresh()
