"""bench/compare.py's report, rendered from one run's figures: bench/compare.md and the README table.

A run of ``bench/compare.py`` turns what it measured into *figures*: a plain
JSON-able mapping of the formatted cells and lines (date, machine, the
table, the targets). Both outputs are rendered from that one mapping, here,
so the README's table cannot say anything the Markdown report does not:

- :func:`report` renders ``bench/compare.md``;
- :func:`readme_with` renders the README's table and splices it between the
  ``<!-- compare:begin`` and ``<!-- compare:end`` marker lines, leaving every
  other byte of the README as it was.

The figures are saved beside the report (``bench/compare.json``), so the
README can be rendered again without rerunning the bench:
``bench/compare.py --readme-only``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BEGIN = "<!-- compare:begin"
END = "<!-- compare:end"
BEGIN_LINE = (
    BEGIN + ": written by bench/compare.py from bench/compare.json, the run that wrote "
    "bench/compare.md; do not edit by hand (bench/compare.py --readme-only renders it again) -->"
)
END_LINE = END + " -->"
# The table's columns: text on the left, figures on the right.
ALIGN = ("---", "---", "---:", "---:", "---:", "---:", "---")
HEADER_KEYS = ("command", "date", "machine", "stack", "disk", "versions", "settings")


class ReadmeMarkersError(Exception):
    """The README does not hold exactly one well-ordered pair of compare markers."""


class FiguresError(Exception):
    """A figures file is not what bench/compare.py writes."""


def header_lines(figures: dict[str, Any]) -> list[str]:
    """The date, machine and versions lines the report opens with."""
    return [
        f"- command: `{figures['command']}`",
        f"- date: {figures['date']}",
        f"- machine: {figures['machine']}",
        f"- {figures['stack']}",
        f"- disk: {figures['disk']}",
        f"- {figures['versions']}",
        f"- settings: {figures['settings']}",
    ]


def table_lines(figures: dict[str, Any]) -> list[str]:
    """The side-by-side table in Markdown."""
    columns: list[str] = figures["columns"]
    lines = [_row(columns), _row(list(ALIGN))]
    for cells in figures["rows"]:
        if len(cells) != len(columns):
            raise FiguresError(f"a table row has {len(cells)} cells, not {len(columns)}: {cells}")
        lines.append(_row(cells))
    return lines


def _row(cells: list[str]) -> str:
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def report(figures: dict[str, Any]) -> str:
    """The Markdown report (bench/compare.md): header, table, durability, steps, targets."""
    parts = ["### tether, LangGraph and DBOS side by side", "", *header_lines(figures), ""]
    parts += [*table_lines(figures), ""]
    parts += ["Durability each side ran with (read from the live connection where it can be):", ""]
    parts += [f"- {name}: {text}" for name, text in figures["durability"]]
    parts += ["", "One durable step, per side:", "", *(f"- {s}" for s in figures["steps"])]
    parts += ["", "Targets:", ""]
    parts += [f"- {line}" for line in [*figures["targets"], *figures["informational"]]]
    parts.append("")
    return "\n".join(parts)


def readme_with(readme: str, figures: dict[str, Any]) -> str:
    """``readme`` with the region between its compare markers rendered again from ``figures``.

    Exactly one line starting ``<!-- compare:begin`` and, after it, exactly
    one starting ``<!-- compare:end`` must be there; anything else raises
    :class:`ReadmeMarkersError` and nothing is rewritten. Text outside the
    markers comes back byte for byte.
    """
    lines = readme.splitlines(keepends=True)
    begin, end = _region(lines)
    block = [
        BEGIN_LINE,
        "",
        "The last `make bench-compare` run:",
        "",
        *header_lines(figures),
        "",
        *table_lines(figures),
        "",
        "Targets, from the same run:",
        "",
        *(f"- {line}" for line in figures["targets"]),
        "",
        END_LINE,
    ]
    newline = "\r\n" if lines[begin].endswith("\r\n") else "\n"
    return "".join(lines[:begin]) + newline.join(block) + newline + "".join(lines[end + 1 :])


def check_markers(readme: str) -> None:
    """Raise :class:`ReadmeMarkersError` unless ``readme`` has one well-ordered marker pair."""
    _region(readme.splitlines(keepends=True))


def _region(lines: list[str]) -> tuple[int, int]:
    """The indexes of the begin and end marker lines."""
    begins = [i for i, line in enumerate(lines) if line.startswith(BEGIN)]
    ends = [i for i, line in enumerate(lines) if line.startswith(END)]
    if len(begins) != 1 or len(ends) != 1:
        raise ReadmeMarkersError(
            f"the README needs exactly one line starting {BEGIN!r} and one starting {END!r} "
            f"(found {len(begins)} and {len(ends)}); put them around the comparison table "
            "in the Benchmarks section"
        )
    begin, end = begins[0], ends[0]
    if end < begin:
        raise ReadmeMarkersError(
            f"the README's {END!r} line (line {end + 1}) comes before its {BEGIN!r} line "
            f"(line {begin + 1})"
        )
    return begin, end


def save(path: Path, figures: dict[str, Any]) -> None:
    """Write ``figures`` as indented JSON (one run's machine-readable result)."""
    path.write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")


def load(path: Path) -> dict[str, Any]:
    """The figures saved at ``path``, checked for the keys the renderers read."""
    try:
        figures = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FiguresError(f"{path}: cannot read the figures: {exc}") from exc
    needed = {*HEADER_KEYS, "columns", "rows", "durability", "steps", "targets", "informational"}
    if not isinstance(figures, dict) or not needed <= set(figures):
        missing = sorted(needed - set(figures)) if isinstance(figures, dict) else sorted(needed)
        raise FiguresError(f"{path}: not bench/compare.py figures (missing {missing})")
    return figures
