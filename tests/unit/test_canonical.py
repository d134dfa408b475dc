"""Canonical JSON out, strict JSON in: equal values always give equal digests."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.core import CanonicalJSONError, canonical_bytes, digest, strict_loads
from tether.core._canonical import object_bytes, scalar_bytes, text_bytes

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


@pytest.mark.parametrize("text", ['{"a": 1', "\ufeff{}", "[1,]", '"\\x"', "", "[1] 2"])
def test_a_refusal_of_malformed_json_names_what_the_standard_parser_names(text: str) -> None:
    """The decoder made once refuses malformed text as json.loads does, at the same place."""
    with pytest.raises(json.JSONDecodeError) as standard:
        json.loads(text)
    with pytest.raises(CanonicalJSONError) as ours:
        strict_loads(text)
    assert f"{standard.value.msg} at position {standard.value.pos}" in str(ours.value)


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


# Text that stresses every difference between code point and UTF-16 order and
# every escape: ASCII, control characters, DEL, Latin-1, the line separators,
# characters just below and above the surrogate block, private use, the BOM,
# astral characters (surrogate pairs in UTF-16), and lone surrogates.
hard_text = st.text(
    alphabet=st.one_of(
        st.characters(max_codepoint=0x7F),
        st.sampled_from(
            "\x00\x01\x08\x09\x0a\x0b\x0c\x0d\x1f\x7f\x80\xe9\u2028\u2029"
            "\ud7ff\ue000\uf8ff\ufeff\uffff\U00010000\U0001f600\U0010ffff\ud800\udfff"
        ),
        st.characters(min_codepoint=0x80),
    ),
    max_size=8,
)
numbers = st.one_of(
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 10**15 - 1, 10**15, 2**53 - 1, 2**53, -(2**53), 10**21]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.0, 0.0, 1e21, 1e-7, 1e-6, 5e-324, 1.7976931348623157e308, 0.1, 100.0]),
)
# Keys from a small alphabet, so one object often holds keys that sort apart by
# code point and by UTF-16 unit (an astral character against U+E000..U+FFFF).
hard_keys = st.one_of(
    hard_text,
    st.text(
        alphabet=st.sampled_from("a\xe9\ud7ff\ue000\uff61\uffff\U00010000\U0001f600"),
        min_size=1,
        max_size=3,
    ),
)
hard_json = st.recursive(
    st.none() | st.booleans() | numbers | hard_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(hard_keys, children, max_size=5)
    ),
    max_leaves=25,
)


def reference(value: object) -> bytes | None:
    """rfc8785's bytes for ``value``, or None when it refuses it."""
    import rfc8785

    try:
        return bytes(rfc8785.dumps(value))
    except Exception:
        return None


@settings(max_examples=800)
@given(hard_json)
def test_the_native_encoder_equals_rfc8785_byte_for_byte(value: object) -> None:
    """Numbers, non-ASCII and astral keys and strings, control characters, nesting: rfc8785's bytes, or both refuse."""
    expected = reference(value)
    if expected is None:
        with pytest.raises(CanonicalJSONError):
            canonical_bytes(value)
    else:
        assert canonical_bytes(value) == expected


@settings(max_examples=600)
@given(st.none() | st.booleans() | numbers | hard_text)
def test_scalars_and_strings_are_spelled_as_rfc8785_spells_them(value: object) -> None:
    """scalar_bytes (and text_bytes for strings) give rfc8785's bytes, or refuse what it refuses."""
    expected = reference(value)
    if expected is None:
        with pytest.raises(CanonicalJSONError):
            scalar_bytes(value)
        return
    assert scalar_bytes(value) == expected
    if isinstance(value, str):
        assert text_bytes(value) == expected


@settings(max_examples=150)
@given(st.dictionaries(st.text(alphabet=st.characters(max_codepoint=0x7F)), hard_json, max_size=6))
def test_an_object_spliced_from_encoded_members_is_the_reference_object(value: dict) -> None:
    """object_bytes over the members' canonical bytes equals the whole object's encoding."""
    expected = reference(value)
    if expected is None:
        return
    assert object_bytes({k: canonical_bytes(v) for k, v in value.items()}) == expected


def test_keys_that_sort_differently_in_utf16_go_to_the_reference_encoder() -> None:
    """An astral key sorts before U+E000..U+FFFF in UTF-16 (after them by code point): rfc8785's order wins."""
    value = {"\U0001f600": 1, "\uff61": 2, "a": 3, "\xe9": {"\ue000": 4, "\U00010000": 5}}
    import rfc8785

    assert canonical_bytes(value) == bytes(rfc8785.dumps(value))
    assert canonical_bytes(value).index("\U0001f600".encode()) < canonical_bytes(value).index(
        "\uff61".encode()
    )


def test_a_lone_surrogate_is_refused_on_every_path() -> None:
    """A string or key holding a lone surrogate is not text: refused, never written."""
    for value in ("\ud800", ["x\udc00"], {"\udbff": 1}, {"k": "\ud800\u00e9"}):
        with pytest.raises(CanonicalJSONError):
            canonical_bytes(value)
    with pytest.raises(CanonicalJSONError):
        text_bytes("\udfff")
