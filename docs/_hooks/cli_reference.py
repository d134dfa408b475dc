"""The CLI reference page, rendered from ``tether``'s own argparse parser at build time.

``docs/reference/cli.md`` holds one marker line; this MkDocs hook replaces it
with a section per command (its one-line help and its whole ``--help``), so
the page cannot say anything the parser does not. ``tests/docs`` imports
:func:`render` and :func:`commands` to check every command is on the page and
is explained on some hand-written page as well.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- cli-reference: generated from tether.cli.build_parser() by docs/_hooks/cli_reference.py -->"
#: Help is wrapped at this width whatever the terminal that builds the site.
WIDTH = "80"


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def commands(
    parser: argparse.ArgumentParser | None = None, prefix: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """Every runnable command (``keys new``, not ``keys``), its parser and its one-line help.

    Aliases (``retry`` for ``resume``) share their command's parser and are
    listed once, under the first name; names starting with ``_`` are internal.
    """
    if parser is None:
        from tether.cli import build_parser

        parser = build_parser()
    sub = _subparsers(parser)
    if sub is None:
        return
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    seen: set[int] = set()
    for name, child in sub.choices.items():
        if name.startswith("_") or id(child) in seen:
            continue
        seen.add(id(child))
        full = f"{prefix} {name}".strip()
        nested = list(commands(child, full))
        if nested:
            yield from nested
        else:
            yield full, child, helps.get(name, "")


def aliases(parser: argparse.ArgumentParser | None = None) -> dict[str, list[str]]:
    """Each top-level command's other names (``resume``: ``["retry"]``)."""
    if parser is None:
        from tether.cli import build_parser

        parser = build_parser()
    sub = _subparsers(parser)
    found: dict[str, list[str]] = {}
    first: dict[int, str] = {}
    for name, child in sub.choices.items() if sub else []:
        if id(child) in first:
            found.setdefault(first[id(child)], []).append(name)
        else:
            first[id(child)] = name
    return found


def render() -> str:
    """The markdown that replaces :data:`MARKER`: one section per command, in parser order."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        other_names = aliases()
        out: list[str] = []
        for name, parser, helptext in commands():
            out.append(f"## `tether {name}`\n")
            if helptext:
                out.append(helptext[0].upper() + helptext[1:] + ".\n")
            also = other_names.get(name, [])
            if also:
                out.append("Also: " + ", ".join(f"`tether {a}`" for a in also) + ".\n")
            out.append("```text\n" + parser.format_help().rstrip() + "\n```\n")
        return "\n".join(out)
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: put the rendered reference where the CLI page has its marker."""
    if MARKER in markdown:
        return markdown.replace(MARKER, render())
    return markdown
