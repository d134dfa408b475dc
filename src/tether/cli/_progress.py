"""Progress bars for long commands: on stderr, only for a person at a terminal.

Never under ``--json`` and never when stderr is a file or a pipe, so what a
script reads is exactly what it read before, and a log holds no escape codes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

#: ``update(done, total, what)``: how far a long command has come.
Update = Callable[[int, int, str], None]


def wanted(json_out: bool) -> bool:
    """Show progress: stderr is a terminal and the caller did not ask for JSON."""
    return not json_out and sys.stderr.isatty()


@contextlib.contextmanager
def bar(title: str, *, enabled: bool) -> Iterator[Update | None]:
    """A bar titled ``title`` while the block runs, or ``None`` (nothing shown) when disabled."""
    if not enabled:
        yield None
        return
    # Imported only for a bar that shows: every other command (and every command a
    # script runs) starts without loading rich.
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[what]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,  # the bar goes; the command's own output stays
    )
    task = progress.add_task(title, total=None, what="")

    def update(done: int, total: int, what: str) -> None:
        progress.update(task, completed=done, total=total, what=what)

    with progress:
        yield update
