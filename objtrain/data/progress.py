"""Tokenize's progress (`data.tokenize.Progress`) drawn as rich progress bars on a console."""

from __future__ import annotations

from rich import progress as rp
from rich.console import Console

from objtrain.data.tokenize import Progress


class RichProgress(Progress):
    """A progress bar per phase (scanning, sampling, training, encoding) on stderr."""

    def __init__(self, console: Console) -> None:
        self.bar = rp.Progress(
            rp.TextColumn("[bold]{task.description:<18}"),
            rp.BarColumn(),
            rp.TaskProgressColumn(),
            rp.TextColumn("{task.fields[size]}"),
            rp.TimeElapsedColumn(),
            rp.TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,  # piped: no bar, and no stray empty line on stderr
        )
        self.task: rp.TaskID | None = None
        self.in_bytes = False

    def start(self, phase: str, total: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=self.bar.tasks[-1].total or 0)
        self.in_bytes = phase in ("sampling", "encoding")
        self.task = self.bar.add_task(phase, total=total or None, size="")

    def advance(self, n: int) -> None:
        assert self.task is not None
        self.bar.advance(self.task, n)
        if self.in_bytes:
            done = self.bar.tasks[-1].completed
            self.bar.update(self.task, size=f"{done / 1e6:.1f} MB")
