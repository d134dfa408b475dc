"""The benchmarks page's comparison table is rendered from bench/compare.py's saved figures, never typed."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
# Loaded from its file: putting bench/ on sys.path would let its scripts shadow other modules.
_spec = importlib.util.spec_from_file_location("_compare_report", BENCH / "_compare_report.py")
assert _spec is not None and _spec.loader is not None
compare_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_report)

FIGURES = compare_report.load(BENCH / "compare.json")
BEFORE = "# A README\n\nSome text above.\n\n"
AFTER = "\nSome text below, with a | pipe | and 1,234 figures.\n"


def _readme(region: str = "<!-- compare:begin -->\nold table\n<!-- compare:end -->\n") -> str:
    return BEFORE + region + AFTER


def _region(text: str) -> str:
    start = text.index(compare_report.BEGIN)
    end = text.index("\n", text.index(compare_report.END)) + 1
    return text[start:end]


def test_the_saved_figures_render_the_committed_report_byte_for_byte() -> None:
    """bench/compare.json renders exactly the committed bench/compare.md, so both are one run."""
    assert compare_report.report(FIGURES) == (BENCH / "compare.md").read_text()


PAGE = REPO / "docs" / "explanation" / "benchmarks.md"


def test_the_benchmarks_page_table_is_the_one_the_saved_figures_render() -> None:
    """The benchmarks page's marked region equals what the saved figures render (a hand edit fails)."""
    readme = PAGE.read_text()
    assert compare_report.readme_with(readme, FIGURES) == readme
    assert "| tether Runtime | SQLite |" in _region(readme)


def test_a_hand_edited_figure_on_the_page_is_caught() -> None:
    """Changing one number inside the marked region makes the page differ from its rendering."""
    readme = PAGE.read_text()
    region = _region(readme)
    row = next(line for line in region.splitlines() if line.startswith("| tether Runtime |"))
    cells = row.split("|")
    cells[3] = " 99,999 "  # the durable steps/s cell
    edited = readme.replace(row, "|".join(cells), 1)
    assert edited != readme
    assert compare_report.readme_with(edited, FIGURES) != edited
    assert compare_report.readme_with(edited, FIGURES) == readme


def test_the_splice_replaces_only_the_marked_region() -> None:
    """Every byte before the begin marker and after the end marker comes back unchanged."""
    text = compare_report.readme_with(_readme(), FIGURES)
    assert text.startswith(BEFORE + compare_report.BEGIN)
    assert text.endswith(compare_report.END_LINE + "\n" + AFTER)
    assert "old table" not in text
    assert f"- date: {FIGURES['date']}" in text
    assert f"- machine: {FIGURES['machine']}" in text
    assert all(f"- {line}" in text for line in FIGURES["targets"])
    assert compare_report.readme_with(text, FIGURES) == text


def test_new_figures_change_the_region_and_nothing_else() -> None:
    """A run with other figures rewrites the table cells and the date inside the markers only."""
    other: dict[str, Any] = copy.deepcopy(FIGURES)
    other["date"] = "2030-01-01 00:00 UTC"
    other["rows"][0][2] = "123,456"
    first = compare_report.readme_with(_readme(), FIGURES)
    second = compare_report.readme_with(first, other)
    assert "2030-01-01 00:00 UTC" in second and "| 123,456 |" in second
    assert FIGURES["date"] not in second
    assert second.startswith(BEFORE) and second.endswith(AFTER)


@pytest.mark.parametrize(
    "region",
    [
        "no markers at all\n",
        "<!-- compare:begin -->\n",
        "<!-- compare:end -->\n",
        "<!-- compare:begin -->\n<!-- compare:begin -->\n<!-- compare:end -->\n",
        "<!-- compare:begin -->\n<!-- compare:end -->\n<!-- compare:end -->\n",
        "<!-- compare:end -->\n<!-- compare:begin -->\n",
    ],
    ids=["none", "no-end", "no-begin", "two-begins", "two-ends", "end-first"],
)
def test_missing_duplicated_or_reversed_markers_are_refused(region: str) -> None:
    """Without exactly one begin marker followed by one end marker the splice raises a typed error."""
    with pytest.raises(compare_report.ReadmeMarkersError, match="compare:"):
        compare_report.readme_with(_readme(region), FIGURES)


def test_readme_only_exits_non_zero_and_leaves_a_readme_without_markers(tmp_path: Path) -> None:
    """compare.py --readme-only on a README without markers exits 2, says why, and writes nothing."""
    readme = tmp_path / "README.md"
    readme.write_text(_readme("no markers\n"))
    done = subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), "--readme-only", "--readme", str(readme)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2
    assert "compare:begin" in done.stderr
    assert readme.read_text() == _readme("no markers\n")


def test_readme_only_renders_the_region_from_the_saved_figures(tmp_path: Path) -> None:
    """compare.py --readme-only checks bench/compare.json against its measurements, then renders."""
    assert FIGURES.get("measured") is not None  # a real run's figures, not a converted report
    readme = tmp_path / "README.md"
    readme.write_text(_readme())
    subprocess.run(
        [sys.executable, str(BENCH / "compare.py"), "--readme-only", "--readme", str(readme)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert readme.read_text() == compare_report.readme_with(_readme(), FIGURES)


@pytest.mark.parametrize("part", ["rows", "targets"])
def test_a_figure_edited_by_hand_is_refused(tmp_path: Path, part: str) -> None:
    """A table cell or a verdict no longer matching the saved measurements makes it exit 2."""
    edited = copy.deepcopy(FIGURES)
    if part == "rows":
        edited["rows"][0][2] = "9,519"
    else:
        edited["targets"][0] = edited["targets"][0].replace("**MISSED**", "**met**")
    compare_report.save(tmp_path / "compare.json", edited)
    readme = tmp_path / "README.md"
    readme.write_text(_readme())
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "compare.py"),
            "--readme-only",
            "--out",
            str(tmp_path / "compare.md"),
            "--readme",
            str(readme),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2 and f"the saved {part} are not" in done.stderr
    assert readme.read_text() == _readme()
