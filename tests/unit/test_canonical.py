"""Canonical JSON out, strict JSON in: equal values always give equal digests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.core import CanonicalJSONError, canonical_bytes, digest, strict_loads

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_canonical_bytes_survive_a_strict_round_trip(value: object) -> None:
    """Parsing canonical bytes strictly and encoding again gives the same bytes."""
    data = canonical_bytes(value)
    assert canonical_bytes(strict_loads(data)) == data


@given(st.dictionaries(st.text(max_size=6), st.integers(-1000, 1000), min_size=2, max_size=6))
def test_key_order_does_not_change_the_digest(value: dict[str, int]) -> None:
    """Two dicts with the same items in another order have the same digest."""
    reordered = dict(reversed(list(value.items())))
    assert digest(value) == digest(reordered)


@pytest.mark.parametrize(
    "text", ['{"a": 1, "a": 2}', '{"a": NaN}', "[Infinity]", '{"a": 1', "\ufeff{}"]
)
def test_doubtful_json_is_refused(text: str) -> None:
    """Duplicate keys, NaN, Infinity, truncation and a BOM are refused."""
    with pytest.raises(CanonicalJSONError):
        strict_loads(text)


def test_integers_beyond_the_json_safe_range_are_refused() -> None:
    """An integer that a JSON reader may round is refused, not silently changed."""
    with pytest.raises(CanonicalJSONError):
        canonical_bytes({"n": 2**53})


any_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=600)
@given(any_json)
def test_the_fast_path_agrees_with_the_reference_encoder(value: object) -> None:
    """Whatever the value, canonical_bytes equals rfc8785's output or both refuse it."""
    import rfc8785

    try:
        expected = bytes(rfc8785.dumps(value))
    except Exception:
        with pytest.raises(CanonicalJSONError):
            canonical_bytes(value)
        return
    assert canonical_bytes(value) == expected


def test_control_characters_and_key_order_match_rfc8785_on_the_fast_path() -> None:
    """Escapes of control characters and the order of ASCII keys are the reference's."""
    import rfc8785

    value = {"b": 'tab\tnl\nbell\x07quote"back\\', "a": [1, -2, True, None], "A": {}}
    assert canonical_bytes(value) == bytes(rfc8785.dumps(value))


@pytest.mark.parametrize(
    "value",
    [
        [1.5],
        {"a": 1e-07},
        {"a": [2, 1e16]},
        {"n": 2**53 - 1},
        {"n": -(2**53) + 1},
        {"t": "12:00:00.000000Z"},
        {"s": ":1.5,"},
        [0.0],
        {"a": {"b": -3.25}},
    ],
)
def test_numbers_that_need_the_reference_encoder_get_it(value: object) -> None:
    """Floats and long integers anywhere in a value are encoded exactly as RFC 8785 says."""
    import rfc8785

    assert canonical_bytes(value) == bytes(rfc8785.dumps(value))


@pytest.mark.parametrize(
    "value", [{1: "a"}, {"a": [{"b": {2: 3}}]}, {None: 1}, {True: 1}, {"a": ({1: "x"},)}]
)
def test_object_keys_that_are_not_strings_are_refused(value: object) -> None:
    """RFC 8785 keys are strings: {1: "a"} must not share {"1": "a"}'s digest."""
    with pytest.raises(CanonicalJSONError, match=r"not a string|tuple"):
        canonical_bytes(value)
    assert canonical_bytes({"1": "a"}) == b'{"1":"a"}'


@pytest.mark.parametrize(
    "text", [b'"\\ud800"', b'{"a":["x\\udc00"]}', b'{"\\udbff":1}', '"\ud800"']
)
def test_lone_surrogates_are_refused_by_the_strict_parser(text: bytes | str) -> None:
    """A lone surrogate is not text: parsing it fails closed; a real pair is fine."""
    with pytest.raises(CanonicalJSONError, match="surrogate"):
        strict_loads(text)
    assert strict_loads(b'"\\ud83d\\ude00"') == "\U0001f600"


def test_a_value_that_holds_itself_or_nests_too_deeply_is_refused_typed() -> None:
    """A cycle (list or dict) or nesting past the recursion limit raises CanonicalJSONError, not a hang."""
    loop: list[Any] = []
    loop.append(loop)
    mapping: dict[str, Any] = {}
    mapping["self"] = mapping
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    for value in (loop, mapping, {"a": [loop]}, deep, (deep,)):
        with pytest.raises(CanonicalJSONError):
            canonical_bytes(value)
    shared = [1]
    assert canonical_bytes([shared, shared]) == b"[[1],[1]]"  # shared, not cyclic: fine
