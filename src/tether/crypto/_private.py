"""Key files: written whole with mode 0600, never over an existing file unless asked.

A keyring and a secret-key document are the only copies of keys that old
checkpoints and sealed contexts need; a write that silently replaced one
would lose them. So a write goes to a private temporary file first, is
fsynced, and then takes the name with ``link`` (which refuses an existing
name) or, when the caller asked to replace, ``os.replace``.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: str | os.PathLike[str], data: bytes, *, what: str, replace: bool) -> None:
    """Write ``data`` to ``path`` (mode 0600, atomically); ``OSError`` subclasses say what failed.

    ``FileExistsError`` (with ``what`` and what to do in its message) when
    ``path`` exists and ``replace`` is false: nothing is written over it.
    """
    target = Path(path)
    if not replace and target.exists():
        raise FileExistsError(
            f"{what} {os.fspath(target)!r} already exists; nothing was written over it. Write "
            "elsewhere, or replace it on purpose (replace=True) once its keys are kept"
        )
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # an existing .tmp keeps its mode through O_CREAT
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, target)
        else:
            os.link(tmp, target)  # refuses a name that appeared since the check above
    finally:
        tmp.unlink(missing_ok=True)
