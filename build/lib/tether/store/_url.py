"""Pick a store from a URL: ``sqlite:///...`` or ``postgresql://...``."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from tether.core import StoreError
from tether.store._sql import SQLBase
from tether.store._sqlite import SQLiteStore

_SQLITE = "sqlite:///"
_POSTGRES = ("postgresql://", "postgres://")
_SQLITE_OPTIONS = {"synchronous": str, "busy_timeout_ms": int}


def open_store(
    url: str, *, existing: bool = False, read_only: bool = False, **options: Any
) -> SQLBase:
    """Open the store a URL names; ``options`` go to the store's constructor.

    ``existing``: a SQLite file must already be there (never created).
    ``read_only``: a SQLite file is opened read-only (it must exist). A
    PostgreSQL database exists or the connection fails, so both are SQLite's.

    - ``sqlite:///relative/path.sqlite`` and ``sqlite:////absolute/path.sqlite``
      (query options: ``synchronous``, ``busy_timeout_ms``)
    - ``postgresql://user@host:port/db`` or ``postgres://...`` (any libpq URL;
      needs the ``[postgres]`` extra)

    Any other scheme raises :class:`~tether.core.StoreError`.
    """
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

        return PostgresStore(url, **options)
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


class Store:
    """Namespace for opening stores: ``Store.from_url("sqlite:///tether.sqlite")``."""

    @staticmethod
    def from_url(url: str, **options: Any) -> SQLBase:
        """The store a URL names; see :func:`open_store`."""
        return open_store(url, **options)
