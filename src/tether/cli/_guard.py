"""How every ``tether`` command ends: one place that turns errors into exit codes.

A library error becomes one line on stderr and, under ``--json``, also one
JSON object on stdout (``{"error": {"type", "message", "exit", ...}}``), so a
script reading stdout always gets a document. A closed pipe (``tether ... |
head``) ends the command quietly, as the CPython docs on SIGPIPE recommend:
the rest of stdout goes to ``/dev/null`` and nothing is printed about it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from tether.core import IntegrityError, TetherError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTEGRITY = 3
#: Ctrl-C: the shell's convention (128 + SIGINT).
EXIT_INTERRUPTED = 130

#: Error attributes worth a script's reading; anything else (a key, a payload) stays out.
_ATTRIBUTES = (
    "run_id",
    "field",
    "key_id",
    "path",
    "point",
    "hit",
    "passed",
    "expected",
    "actual",
    "reason",
    "signer",
)


class UsageError(Exception):
    """Bad usage found by the parser: ``usage`` is the (sub)command's usage line."""

    def __init__(self, usage: str, prog: str, message: str) -> None:
        super().__init__(message)
        self.usage = usage
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors reach :func:`guarded` instead of exiting.

    An empty (or blank) value for any option or argument is a usage error:
    ``--store ""`` names nothing, and must not fall through to a default or a
    traceback further on. Only the words after ``--`` (a command to start) are
    passed on as typed.
    """

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.format_usage(), self.prog, message)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        # argparse converts every typed value (and string defaults) here, one by one.
        passed_on = action.nargs in (argparse.REMAINDER, argparse.PARSER)  # a subcommand's own
        if not passed_on and not arg_string.strip():
            raise argparse.ArgumentError(action, "must not be empty")
        return super()._get_value(action, arg_string)


class TopParser(Parser):
    """The ``tether`` parser: its help lists the commands in groups (``_options.GROUPS``)."""

    commands: Any = None

    def format_help(self) -> str:
        if self.commands is None:
            return super().format_help()
        from tether.cli._options import grouped_help

        return grouped_help(self, self.commands)


def wants_json(argv: Sequence[str]) -> bool:
    """``--json`` among the arguments (before a ``--``), also when parsing failed."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def guarded(argv: Sequence[str], body: Callable[[], int], *, json_out: bool) -> int:
    """Run ``body`` (returning the exit code), translating what it raises.

    An :class:`IntegrityError` exits 3 from ``verify`` and ``inspect`` (the
    checkpoint is not sound) and 1 elsewhere; any other tether error, and an
    OS error naming a file the user gave, exit 1; bad usage exits 2.
    """
    command: str | None = argv[0] if argv else None
    try:
        code = body()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _pipe_closed()
    except UsageError as exc:
        # One line: what was wrong, and where the whole usage is.
        return _fail(
            exc,
            f"{exc.prog}: error: {exc} (see {exc.prog} --help)",
            EXIT_USAGE,
            json_out,
            prefix=False,
        )
    except IntegrityError as exc:
        code = EXIT_INTEGRITY if command in {"verify", "inspect"} else EXIT_ERROR
        return _fail(exc, f"integrity: {type(exc).__name__}: {exc}", code, json_out)
    except TetherError as exc:
        return _fail(exc, f"{type(exc).__name__}: {exc}", EXIT_ERROR, json_out)
    except OSError as exc:
        # A file the user named is missing, unreadable or in the way: their input,
        # not a bug, so one line like any other refusal rather than a traceback.
        return _fail(exc, f"{type(exc).__name__}: {exc}", EXIT_ERROR, json_out)
    except KeyboardInterrupt:
        print("tether: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def error_document(exc: BaseException, code: int) -> dict[str, Any]:
    """The JSON a ``--json`` caller reads on stdout when a command fails."""
    detail: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc), "exit": code}
    for name in _ATTRIBUTES:
        value = getattr(exc, name, None)
        if isinstance(value, str | int | float | bool) and not isinstance(value, bytes):
            detail[name] = value
        elif value is not None and hasattr(value, "__fspath__"):
            detail[name] = os.fspath(value)
    return {"error": detail}


def _fail(exc: BaseException, line: str, code: int, json_out: bool, *, prefix: bool = True) -> int:
    # One line, whatever the message carries (a driver's text runs over several).
    line = " ".join(line.split())
    try:
        if json_out:
            print(json.dumps(error_document(exc, code), sort_keys=True), flush=True)
        print(f"tether: error: {line}" if prefix else line, file=sys.stderr)
    except BrokenPipeError:
        return _pipe_closed()
    return code


def _pipe_closed() -> int:
    # Whoever read stdout has gone (`| head`): nothing more can reach them, and
    # Python's own flush at exit would raise again, so point stdout at devnull.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # in-process callers (tests) hand in a stdout without a descriptor
    return EXIT_ERROR
