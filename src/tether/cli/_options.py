"""What every ``tether`` command spells the same way: the store, the output, names, the groups.

- ``--store STORE``: a store URL (``sqlite:///path``, ``postgresql://...``)
  or a plain SQLite file path, on every command that reads or writes runs.
  ``--db`` is the old spelling, kept as a hidden alias that takes the same
  values (a URL given to ``--db`` is a URL, never a file name).
- ``--out PATH``: where a command writes what it makes (a file or a
  directory, as the command says). ``keyring new PATH`` and ``trust add
  --to FILE`` are the old spellings, kept hidden.
- The commands, grouped in ``tether --help`` by what a person is doing.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from tether.store import SQLBase, open_store

#: The groups of ``tether --help``: (title, what the group is for, its commands in order).
GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("run", "start runs and drive them", ("init", "start", "worker", "mcp")),
    ("inspect", "read runs back; never writes", ("runs", "inspect", "ledger", "epochs", "verify")),
    (
        "people",
        "sign what a person decides, for the run's next step",
        ("approve", "review", "fork", "rewind", "admit", "cancel"),
    ),
    ("keys", "signing keys, the checkpoint keyring, trust roots", ("keys", "keyring", "trust")),
    ("operate", "watch runs and keep them moving", ("serve", "resume")),
    ("test", "try tether, and crash your own app on purpose", ("demo", "crashtest")),
)

STORE_HELP = (
    "the store: a SQLite file path, sqlite:///path.sqlite, or postgresql://user@host/db "
    "(--db is the same option)"
)

#: A signer id becomes a file name (``keys new``): letters, digits and ``._@+-``,
#: starting with a letter or digit, so it never leaves ``--out`` nor reads as an option.
_SIGNER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")


def add_store(
    parser: argparse.ArgumentParser, *, required: bool = True, help: str = STORE_HELP
) -> None:
    """``--store STORE`` (and its hidden alias ``--db``), both into ``args.store``."""
    where = parser.add_mutually_exclusive_group(required=required)
    where.add_argument("--store", metavar="STORE", help=help)
    where.add_argument("--db", dest="store", metavar="STORE", help=argparse.SUPPRESS)


def open_read(where: str) -> SQLBase:
    """The store ``--store`` names, read-only: nothing is created, migrated or written."""
    return open_store(where, read_only=True)


def open_existing(where: str) -> SQLBase:
    """The store ``--store`` names, for writing; it must already exist (never created here).

    Evidence delivered to a store no worker reads is lost in plain sight, so a
    missing SQLite file or a database without tether's tables is refused.
    """
    return open_store(where, existing=True)


def as_url(where: str) -> str:
    """``where`` as a store URL: a plain path becomes ``sqlite:///`` its absolute path.

    For stores handed to other processes, which may run in another directory.
    """
    if "://" in where or where.startswith(("sqlite:", "postgres")):
        return where
    return f"sqlite:///{Path(where).resolve()}"


def sqlite_file(text: str) -> Path:
    """An argparse type: a SQLite file, named by path or by ``sqlite:///`` URL (the demo's store)."""
    if text.startswith("sqlite:///"):
        path, _, query = text[len("sqlite:///") :].partition("?")
        if not path or query:
            raise argparse.ArgumentTypeError(
                f"{text!r}: give sqlite:///path/to/file.sqlite (no options)"
            )
        return Path(path)
    if "://" in text or text.startswith(("sqlite:", "postgres")):
        raise argparse.ArgumentTypeError(
            f"{text!r}: this command keeps its run in a SQLite file; give a path or "
            "sqlite:///path.sqlite"
        )
    return Path(text)


def signer_id(text: str) -> str:
    """An argparse type: a signer id that is safe as a file name (see ``_SIGNER_ID``)."""
    if not _SIGNER_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a signer id: use letters, digits and . _ @ + - "
            "(starting with a letter or digit, at most 128), e.g. alice"
        )
    return text


def grouped_help(parser: argparse.ArgumentParser, commands: Any) -> str:
    """``parser``'s help with its commands listed by :data:`GROUPS`, one line each."""
    formatter = parser._get_formatter()
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    formatter.add_text(parser.description)
    by_name = {action.dest: action for action in commands._choices_actions}
    for title, about, names in GROUPS:
        formatter.start_section(f"{title} ({about})")
        formatter.add_arguments([by_name[name] for name in names])
        formatter.end_section()
    formatter.start_section("options")
    formatter.add_arguments([action for action in parser._actions if action.option_strings])
    formatter.end_section()
    formatter.add_text(parser.epilog)
    return formatter.format_help()
