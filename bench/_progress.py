"""A progress bar for the benchmarks' long loops: stderr, a terminal only, drawn between rounds.

The bar is redrawn only when the loop hands over the next item (no refresh
thread), so nothing it does lands inside a timed section.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def rounds(items: Iterable[T], title: str, total: int | None = None) -> Iterator[T]:
    """Yield ``items``, showing how many are done when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        auto_refresh=False,  # drawn between rounds only, never while one is timed
        transient=True,
    )
    with progress:
        task = progress.add_task(title, total=total)
        for item in items:
            progress.refresh()
            yield item
            progress.advance(task)
        progress.refresh()
