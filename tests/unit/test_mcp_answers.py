"""What the gateway's run keeps of arguments and answers that canonical JSON cannot hold whole."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")

from tether.core import ContractViolationError, canonical_bytes
from tether.integrations.mcp._answers import (
    KEPT_APART,
    SAFE_INTEGER,
    carried,
    fits,
    has_big_integer,
    kept_apart,
    read_back,
    sent,
)


@pytest.mark.parametrize(
    ("arguments", "as_text"),
    [
        ({"n": SAFE_INTEGER}, False),
        ({"n": -SAFE_INTEGER}, False),
        ({"n": SAFE_INTEGER + 1}, True),
        ({"n": -(SAFE_INTEGER + 1)}, True),
        ({"deep": [{"x": [2**64]}]}, True),
        ({"flag": True, "f": 1.5, "s": "9007199254740993"}, False),
    ],
)
def test_arguments_are_carried_as_text_exactly_when_canonical_json_cannot_hold_them(
    arguments: dict[str, Any], as_text: bool
) -> None:
    """A table: only an integer past 2**53-1 makes the intent carry the JSON text; either way the upstream gets the same object back."""
    found = carried(arguments)
    assert isinstance(found, str) is as_text
    assert has_big_integer(arguments) is as_text
    canonical_bytes({"arguments": found})  # the intent can always be written
    assert sent(found) == arguments


def test_equal_arguments_are_one_text_and_different_integers_another() -> None:
    """Key order does not change the carried text; one more unit does."""
    one = carried({"b": 2**60, "a": 1})
    assert one == carried({"a": 1, "b": 2**60})
    assert one != carried({"a": 1, "b": 2**60 + 1})


@pytest.mark.parametrize("bad", ["[1, 2]", "not json", 7])
def test_carried_arguments_that_are_not_an_object_are_refused(bad: Any) -> None:
    """What the intent carries must give back an object; anything else is refused, typed."""
    with pytest.raises(ContractViolationError):
        sent(bad)


def test_an_answer_kept_apart_is_read_back_only_when_its_bytes_match_its_digest() -> None:
    """An answer over 16 KiB is kept apart by digest; read back exactly, and refused when the bytes are not the ones named."""
    doc = {"content": [{"type": "text", "text": "x" * 20_000}], "structuredContent": {"n": 2**60}}
    assert not fits(doc)
    record, body = kept_apart(doc)
    assert fits(record)
    name = record[KEPT_APART]["sha256"]
    assert name == "sha256:" + hashlib.sha256(body).hexdigest()
    assert record[KEPT_APART]["why"] == "holds integers beyond 2**53"
    assert read_back(record, {name: body}.get) == doc
    assert read_back(record, {name: body + b" "}.get) is None
    assert read_back(record, {}.get) is None
