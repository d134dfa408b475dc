"""Short, bounded renderings of trace data for a terminal.

A trace event's data is the reason a run did what it did (the signer that
was not trusted, the approval that had expired, the verifier's output), so
``inspect`` prints it with every event. One line each: long strings and deep
values are elided with an ellipsis; ``--full`` prints the data whole.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

#: Longest rendering of one value, and of one event's data, in the short form.
VALUE_WIDTH = 48
LINE_WIDTH = 160
ELLIPSIS = "…"


def short(data: Any, *, width: int = LINE_WIDTH) -> str:
    """``key=value`` pairs of ``data`` on one line, each value and the whole bounded."""
    if not isinstance(data, dict):
        return _clip(_value(data), width)
    parts = [f"{key}={_value(value)}" for key, value in data.items()]
    return _clip(" ".join(parts), width)


def full(data: Any) -> str:
    """The whole of ``data``: its JSON, keys in order, one line."""
    return json.dumps(data, sort_keys=True, ensure_ascii=False)


#: A SHA-256 digest: 12 hex digits tell digests apart on a screen.
_DIGEST = re.compile(r"\b(sha256:[0-9a-f]{12})[0-9a-f]{52}\b")


def _value(value: Any) -> str:
    if isinstance(value, str):
        text = _DIGEST.sub(r"\1" + ELLIPSIS, value.replace("\n", "\\n"))
        # A bare word reads as itself; anything else keeps its quotes so the
        # boundaries of a message with spaces stay visible.
        text = (
            text
            if text and " " not in text and "=" not in text
            else json.dumps(text, ensure_ascii=False)
        )
        return _clip(text, VALUE_WIDTH)
    if isinstance(value, dict | list):
        text = json.dumps(value, sort_keys=True, ensure_ascii=False)
        return _clip(_DIGEST.sub(r"\1" + ELLIPSIS, text), VALUE_WIDTH)
    return _clip(json.dumps(value), VALUE_WIDTH)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + ELLIPSIS


def tether_command() -> str:
    """How to run ``tether`` from here, so a printed next command works when pasted.

    ``tether`` when the one on PATH is this installation's; else the script
    beside this interpreter (``.venv/bin/tether`` from the repository, before
    the venv is activated); else ``python -m tether.cli`` with this interpreter.
    """
    here = Path(sys.executable).parent / "tether"
    on_path = shutil.which("tether")
    if on_path is not None and (not here.exists() or _same(Path(on_path), here)):
        return "tether"
    if here.exists():
        return _shown(here)
    return f"{_shown(Path(sys.executable))} -m tether.cli"


def _same(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def _shown(path: Path) -> str:
    # Relative to the working directory when it is below it: `.venv/bin/tether`.
    try:
        rel = path.absolute().relative_to(Path.cwd())
    except ValueError:
        return shlex.quote(str(path))
    return shlex.quote(str(rel))
