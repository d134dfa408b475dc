"""How a page's code blocks run: Python executed, shell lines run, JSON loaded by its loader.

One :class:`sybil.Sybil` parses a page; its examples run in order in one
namespace (a page reads top to bottom, like a notebook), in a fresh
directory that is also ``$HOME``. A shell block's lines run one by one:
``tether ...`` in this process through :func:`tether.cli.main` (no
interpreter start-up per command), ``export`` and ``. .venv/bin/activate``
as a shell would, anything else in ``bash``. A JSON block is parsed strictly
and then given to the loader its fields name (a task, a policy, an MCP
gateway policy, a client's ``mcpServers`` entry), so a field the API no
longer takes fails. ``<!-- skip: next "why" -->`` before a block says it is
not run, and why.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from sybil import Example, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, SkipParser

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: The languages a fence may name. ``text`` is output shown to the reader, never run.
LANGUAGES = frozenset({"python", "sh", "json", "text"})
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[^`\s]*)", re.MULTILINE)


def pages() -> list[Path]:
    """The README and every page of the docs site."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def fences(text: str) -> Iterator[tuple[int, str, str]]:
    """Each opening fence: its line number, its indent and its language."""
    inside = False
    for match in FENCE.finditer(text):
        if not inside:
            line = text.count("\n", 0, match.start()) + 1
            yield line, match["indent"], match["lang"]
        inside = not inside


class CommandFailedError(AssertionError):
    """A shell line of a page exited non-zero."""


def _logical_lines(source: str) -> Iterator[str]:
    pending = ""
    for raw in source.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        yield pending + raw
        pending = ""
    if pending:
        yield pending


def _run_tether(argv: list[str]) -> tuple[int, str]:
    from tether.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    text = out.buffer.getvalue().decode() + err.buffer.getvalue().decode()  # type: ignore[attr-defined]
    return code, text


def run_shell_line(line: str) -> str | None:
    """Run one logical line of a shell block in the current directory; its output, or None."""
    if re.search(r"(?<![&|])&\s*(#.*)?$", line):
        raise CommandFailedError(
            f"{line!r} starts a background process: mark the block not-run "
            '(<!-- skip: next "why" -->) and have the page\'s fixture start it'
        )
    argv = [os.path.expanduser(a) for a in shlex.split(os.path.expandvars(line), comments=True)]
    if not argv:
        return None
    head = argv[0]
    if head == "export":
        for assignment in argv[1:]:
            name, _, value = assignment.partition("=")
            os.environ[name] = os.path.expanduser(value)
        return None
    if head in {".", "source"} and argv[1:] == [".venv/bin/activate"]:
        return None  # the tests already run in the venv
    line = re.sub(r"(^|\s)\.venv/bin/", rf"\g<1>{BIN}/", line)
    if head == "tether" or head.endswith("/bin/tether"):
        code, text = _run_tether(argv[1:])
    else:  # a shell's own line: bash runs it, with this venv's python and tether first on PATH
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", line],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=300,
        )
        code, text = done.returncode, done.stdout + done.stderr
    if code != 0:
        raise CommandFailedError(f"{line!r} exited {code}:\n{text[-4000:]}")
    return None


def evaluate_shell(example: Example) -> None:
    """Every line of a ``sh`` block, in order; the first that fails fails the page."""
    for line in _logical_lines(example.parsed):
        try:
            run_shell_line(line)
        except CommandFailedError as exc:
            raise CommandFailedError(f"{example.path}, line {example.line}: {exc}") from None


def _strict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def _load_mcp_client(document: dict[str, Any]) -> None:
    from tether.cli import build_parser

    for server in document["mcpServers"].values():
        if server["command"] != "tether":
            raise ValueError("an mcpServers entry of the docs starts tether")
        build_parser().parse_args(server["args"])


def _loaders() -> list[tuple[Callable[[dict[str, Any]], bool], Callable[[dict[str, Any]], Any]]]:
    import tether

    loaders: list[tuple[Callable[[dict[str, Any]], bool], Callable[[dict[str, Any]], Any]]] = [
        (lambda d: "task_id" in d, tether.TaskSpec.from_json),
        (lambda d: "policy_id" in d and "kinds" in d, tether.Policy.from_json),
        (lambda d: "mcpServers" in d, _load_mcp_client),
    ]
    try:
        from tether.integrations.mcp import GatewayPolicy
    except ImportError:  # without the [mcp] extra the gateway's policy is only parsed
        return loaders
    loaders.append((lambda d: "reads" in d or "tools" in d, GatewayPolicy.from_json))
    return loaders


def evaluate_json(example: Example) -> None:
    """Parse strictly (no duplicate key, no NaN), then load with the loader the fields name."""
    document = json.loads(example.parsed, object_pairs_hook=_strict, parse_constant=_no_constant)
    if isinstance(document, dict):
        for matches, load in _loaders():
            if matches(document):
                load(document)
                return


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


FILE_MARKER = re.compile(r"<!-- docs-test: file (\S+) -->\s*$")


def evaluate_python(example: Example) -> None:
    """Run the block in the page's namespace; after ``<!-- docs-test: file NAME -->`` also save it.

    A saved block is a module the page's later commands import (an app for
    ``tether crashtest --app NAME:factory``), exactly as the reader saves it.
    """
    before = example.document.text[: example.start].rstrip("\n").rsplit("\n", 1)[-1]
    marker = FILE_MARKER.search(before)
    if marker is not None:
        Path(marker[1]).write_text(example.parsed)
    _python(example)


_python = PythonEvaluator()


def sybil() -> Sybil:
    """The parser of every page."""
    return Sybil(
        parsers=[
            CodeBlockParser("python", evaluate_python),
            CodeBlockParser("sh", evaluate_shell),
            CodeBlockParser("json", evaluate_json),
            SkipParser(),
        ],
        patterns=["*.md"],
    )
