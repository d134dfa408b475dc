"""Pick a store from a URL (``sqlite:///...``, ``postgresql://...``) or a SQLite file path."""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import parse_qsl

from tether.core import StoreError
from tether.store._sql import SQLBase
from tether.store._sqlite import SQLiteStore

_SQLITE = "sqlite:///"
_POSTGRES = ("postgresql://", "postgres://")
_SQLITE_OPTIONS = {"synchronous": str, "busy_timeout_ms": int}
#: libpq's other spelling (``host=h dbname=d``), which would otherwise read as a file name.
_KEY_VALUE = re.compile(r"\s*(host|hostaddr|port|dbname|user|password|service)\s*=")


def open_store(
    url: str | os.PathLike[str],
    *,
    existing: bool = False,
    read_only: bool = False,
    **options: Any,
) -> SQLBase:
    """Open the store a URL or a SQLite file path names; ``options`` go to its constructor.

    ``existing``: the store must already be there: a SQLite file, or a
    PostgreSQL database holding tether's tables (never created; an older
    schema is migrated). ``read_only``: nothing is created or migrated and
    nothing can be written; the store must exist at this tether's schema.

    - ``sqlite:///relative/path.sqlite`` and ``sqlite:////absolute/path.sqlite``
      (query options: ``synchronous``, ``busy_timeout_ms``)
    - a plain path (no ``scheme://``): that SQLite file, as ``sqlite:///`` would
    - ``postgresql://user@host:port/db`` or ``postgres://...`` (any libpq URL;
      needs the ``[postgres]`` extra)

    An empty string and any other scheme raise :class:`~tether.core.StoreError`.
    """
    url = os.fspath(url)
    if not url.strip():
        raise StoreError(
            "no store named: give a SQLite file path, sqlite:///path.sqlite or "
            "postgresql://user@host/db"
        )
    if _KEY_VALUE.match(url):
        raise StoreError(
            "a store is named by URL or SQLite file path, not a key=value DSN: write "
            "postgresql://user@host:port/dbname"
        )
    if not _is_url(url):
        return SQLiteStore(url, read_only=read_only, create=not existing, **options)
    if url.startswith(_SQLITE):
        path, _, query = url[len(_SQLITE) :].partition("?")
        if not path:
            raise StoreError(f"store URL {url!r} names no file; use sqlite:///path/to/file.sqlite")
        for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
            kind = _SQLITE_OPTIONS.get(key)
            if kind is None:
                raise StoreError(
                    f"unknown SQLite store option {key!r}; known: {sorted(_SQLITE_OPTIONS)}"
                )
            try:
                options.setdefault(key, kind(value))
            except ValueError:
                raise StoreError(f"SQLite store option {key}={value!r} is not valid") from None
        return SQLiteStore(path, read_only=read_only, create=not existing, **options)
    if url.startswith(_POSTGRES):
        from tether.store._postgres import PostgresStore

        return PostgresStore(url, read_only=read_only, create=not existing, **options)
    if url.startswith("sqlite:"):
        raise StoreError(
            "a SQLite store URL has three slashes before a relative path "
            "(sqlite:///dir/file.sqlite) and four before an absolute one"
        )
    scheme = url.partition(":")[0] if ":" in url else url
    raise StoreError(
        f"unknown store URL scheme {scheme!r}; use sqlite:///path.sqlite, "
        "sqlite:////absolute/path.sqlite or postgresql://user@host/db"
    )


def _is_url(text: str) -> bool:
    """Whether ``text`` names a store by URL (else it is a SQLite file path)."""
    scheme, sep, _ = text.partition(":")
    # "sqlite:x" and "postgres:x" are URLs gone wrong (a hint follows), not file names.
    return bool(sep) and (
        text.startswith(("sqlite:", "postgres:", "postgresql:"))
        or (scheme.isidentifier() and text[len(scheme) :].startswith("://"))
    )


class Store:
    """Namespace for opening stores: ``Store.from_url("sqlite:///tether.sqlite")``."""

    @staticmethod
    def from_url(url: str, **options: Any) -> SQLBase:
        """The store a URL names; see :func:`open_store`."""
        return open_store(url, **options)
