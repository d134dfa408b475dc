"""A strict reader for JSON objects: exact types, no unknown fields, named errors.

The same reader parses task specs (errors become ``SpecError``) and checkpoint
payloads (errors become ``UnknownFieldError``), so both refuse the same things
the same way: a bool where an int belongs, a missing field, an extra field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

ErrorFactory = Callable[[str, str], Exception]


# Aliases: inside Fields the method names str/int/bool/list shadow the builtins.
_Str = str
_Int = int
_Bool = bool
_List = list


class Fields:
    """Reads the fields of one JSON object; call :meth:`done` to refuse leftovers."""

    __slots__ = ("_error", "_obj", "_path", "_seen")

    def __init__(self, obj: Any, path: _Str, error: ErrorFactory) -> None:
        self._path = path
        self._error = error
        if not isinstance(obj, dict):
            self.fail(path or "document", f"expected an object, got {_kind(obj)}")
        self._obj: dict[str, Any] = obj
        self._seen: set[_Str] = set()

    def fail(self, field: _Str, problem: _Str) -> NoReturn:
        raise self._error(field, problem)

    def name(self, key: _Str) -> _Str:
        """The dotted path of ``key`` inside this object."""
        return f"{self._path}.{key}" if self._path else key

    def has(self, key: _Str) -> _Bool:
        return key in self._obj

    def raw(self, key: _Str) -> Any:
        self._seen.add(key)
        if key not in self._obj:
            self.fail(self.name(key), "missing")
        return self._obj[key]

    def optional_raw(self, key: _Str) -> Any:
        self._seen.add(key)
        return self._obj.get(key)

    def str(self, key: _Str, *, nonempty: _Bool = True) -> _Str:
        value = self.raw(key)
        if not isinstance(value, str):
            self.fail(self.name(key), f"expected a string, got {_kind(value)}")
        if nonempty and not value:
            self.fail(self.name(key), "must not be empty")
        return value

    def optional_str(self, key: _Str) -> _Str | None:
        if self._obj.get(key) is None:
            self._seen.add(key)
            return None
        return self.str(key)

    def int(self, key: _Str, *, minimum: _Int | None = 0, maximum: _Int | None = None) -> _Int:
        value = self.raw(key)
        # bool is a subclass of int in Python; JSON's true is not a number.
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(self.name(key), f"expected an integer, got {_kind(value)}")
        if minimum is not None and value < minimum:
            self.fail(self.name(key), f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            self.fail(self.name(key), f"must be <= {maximum}, got {value}")
        return value

    def optional_bool(self, key: _Str) -> _Bool | None:
        if key not in self._obj:
            self._seen.add(key)
            return None
        return self.bool(key)

    def bool(self, key: _Str) -> _Bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            self.fail(self.name(key), f"expected true or false, got {_kind(value)}")
        return value

    def list(self, key: _Str) -> _List[Any]:
        value = self.raw(key)
        if not isinstance(value, list):
            self.fail(self.name(key), f"expected a list, got {_kind(value)}")
        return value

    def str_list(self, key: _Str, *, unique: _Bool = True) -> tuple[_Str, ...]:
        items = self.list(key)
        for index, item in enumerate(items):
            if not isinstance(item, str) or not item:
                self.fail(f"{self.name(key)}[{index}]", "expected a non-empty string")
        if unique and len(set(items)) != len(items):
            self.fail(self.name(key), "entries must be unique")
        return tuple(items)

    def obj(self, key: _Str) -> Fields:
        return Fields(self.raw(key), self.name(key), self._error)

    def optional_obj(self, key: _Str) -> Fields | None:
        if self._obj.get(key) is None:
            self._seen.add(key)
            return None
        return self.obj(key)

    def items(self, key: _Str) -> _List[Fields]:
        return [
            Fields(item, f"{self.name(key)}[{index}]", self._error)
            for index, item in enumerate(self.list(key))
        ]

    def done(self) -> None:
        extra = sorted(set(self._obj) - self._seen)
        if extra:
            self.fail(self.name(extra[0]), "unknown field")


def _kind(value: Any) -> _Str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
