"""bench/compare.py end to end at a tiny size: the table comes from a run, and the control repeats."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance._pg import pg_dsn

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"

pytestmark = pytest.mark.postgres


def _compare(tmp_path: Path, *args: str) -> str:
    out = tmp_path / "compare.md"
    subprocess.run(
        [
            sys.executable,
            str(BENCH / "compare.py"),
            "--pg",
            pg_dsn(),  # skips without a server, fails instead under TETHER_REQUIRE_PG=1
            "--dir",
            str(tmp_path),
            "--out",
            str(out),
            "--rounds",
            "2",
            "--steps",
            "10",
            "--early",
            "20",
            "--late",
            "40",
            "--window",
            "10",
            "--jobs",
            "1",
            *args,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return out.read_text()


def test_the_tether_row_is_measured_and_its_killed_effect_is_seen_once(tmp_path: Path) -> None:
    """A tiny run writes a table whose tether row has a rate, a bare ratio and 0 duplicates."""
    text = _compare(tmp_path, "--only", "tether-sqlite", "--trials", "2")
    row = next(line for line in text.splitlines() if line.startswith("| tether Runtime | SQLite"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert float(cells[2].replace(",", "")) > 0
    assert cells[3].endswith("x")
    assert cells[6].startswith("0 of 2 ")
    assert "| bare commit (sqlite-wal) | SQLite |" in text
    assert "- date: " in text and "SQLite " in text and "PostgreSQL " in text


def test_the_run_saves_the_figures_its_report_is_rendered_from(tmp_path: Path) -> None:
    """A run writes compare.json beside compare.md, and the JSON renders that same Markdown."""
    text = _compare(tmp_path, "--only", "tether-sqlite", "--trials", "0")
    spec = importlib.util.spec_from_file_location("_compare_report", BENCH / "_compare_report.py")
    assert spec is not None and spec.loader is not None
    compare_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare_report)
    figures = compare_report.load(tmp_path / "compare.json")
    assert compare_report.report(figures) == text
    assert figures["measured"]["rates"]["tether-sqlite"]


def test_the_sqlitesaver_control_really_repeats_the_killed_effect(tmp_path: Path) -> None:
    """The control measures something: plain SqliteSaver re-sends a killed node's request."""
    text = _compare(tmp_path, "--only", "langgraph-sqlite", "--trials", "1")
    row = next(line for line in text.splitlines() if line.startswith("| LangGraph SqliteSaver"))
    assert row.rstrip(" |").split("|")[-1].strip().startswith("1 of 1 ")


def test_langgraph_on_tethersaver_with_a_guarded_effect_sends_it_once(tmp_path: Path) -> None:
    """The TetherSaver row's graph sends through tether.effects: killed after the send, no repeat."""
    text = _compare(tmp_path, "--only", "tethersaver-sqlite", "--trials", "2")
    row = next(line for line in text.splitlines() if line.startswith("| LangGraph on TetherSaver"))
    assert row.rstrip(" |").split("|")[-1].strip().startswith("0 of 2 ")
