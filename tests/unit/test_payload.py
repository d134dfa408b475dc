"""The signed payload of a state: RFC 8785 bytes spliced from cached parts, parts stored by digest."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether.core import (
    Binding,
    CanonicalJSONError,
    CheckpointCorruptError,
    CompletedWrite,
    EffectStatus,
    EnvironmentState,
    Intent,
    InvariantError,
    PendingWrite,
    Phase,
    ReviewCase,
    RunState,
    Spent,
    UnknownFieldError,
    canonical_bytes,
    digest_bytes,
)
from tether.core._model import LastOutcome
from tether.core._payload import (
    PART_FIELDS,
    encode_state,
    encode_valid_state,
    expand_payload,
    parts_named,
    whole_payload,
)
from tether.core._state import GENESIS_HASH

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
PRE = EnvironmentState("ns", "inst", 3, "sha256:" + "a" * 64)
POST = EnvironmentState("ns", "inst", 4, "sha256:" + "b" * 64)
DIGEST = "sha256:" + "c" * 64


def pending(args: dict[str, Any] | None = None, *, approvals: tuple[Any, ...] = ()) -> PendingWrite:
    intent = Intent("file.write", "a.txt", args or {"content": "x"}, "low")
    return PendingWrite(
        action_id="a1",
        intent=intent,
        intent_digest=intent.digest,
        idempotency_key="idem-1",
        prestate=PRE,
        expected_post=POST,
        generation=2,
        proposed_at=NOW,
        cost=0,
        status=EffectStatus.DISPATCHED,
        approvals=approvals,
        dispatched_at=NOW,
    )


def state(**changes: Any) -> RunState:
    base = RunState(
        run_id="r1",
        generation=2,
        epoch=1,
        worker="w",
        binding=Binding("task", "1", DIGEST, "policy", "1", DIGEST, "sha256:" + "d" * 64),
        phase=Phase.PENDING,
        stop_reason=None,
        started_at=NOW,
        updated_at=NOW + timedelta(seconds=1),
        plan_cursor=1,
        agent_context_digest=DIGEST,
        spent=Spent(1, 1, 0, 5),
        environment=PRE,
        adapter_version="1",
        observed_version=3,
        pending=pending(),
        last_write=CompletedWrite("a0", "idem-0", DIGEST, "rcpt-0", DIGEST, DIGEST, 3),
        writes_committed=1,
        verification=None,
        review_cases=(),
        quarantined_keys=(),
        trace_head=GENESIS_HASH,
        trace_length=0,
        ledger_head=GENESIS_HASH,
        ledger_length=0,
    )
    return base.evolve(**changes)


def read_back(payload: bytes, parts: dict[str, bytes]) -> Any:
    return expand_payload(json.loads(payload), parts.get, run_id="r1")


hard_text = st.text(
    alphabet=st.one_of(
        st.characters(max_codepoint=0x7F),
        st.sampled_from("\x00\x1f\x7f\xe9\u2028\ue000\uffff\U0001f600"),
        st.characters(min_codepoint=0x80, exclude_categories=("Cs",)),
    ),
    max_size=12,
)
documents = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | hard_text,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(hard_text, children, max_size=3)
    ),
    max_leaves=12,
)
# What a caller's documents (an intent's arguments, a decision, a receipt) may
# hold besides: floats of every magnitude (RFC 8785 spells them as
# ECMAScript does, not as Python's repr), integers near 2**53, and nesting.
numbers = st.one_of(
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.sampled_from([0, -1, 10**15 - 1, 10**15, 2**53 - 1, -(2**53) + 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.0, 1e21, 1e-7, 1e-6, 5e-324, 1.7976931348623157e308, 0.1, 100.0]),
)
rich_documents = st.recursive(
    st.none() | st.booleans() | numbers | hard_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(hard_text, children, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def states(draw: st.DrawFn, documents: st.SearchStrategy[Any] = documents) -> RunState:
    """States with every kind of member: odd text, big documents, optional members set or not."""
    text = draw(hard_text.filter(bool))
    changes: dict[str, Any] = {
        "run_id": text,
        "worker": draw(hard_text.filter(bool)),
        "epoch_id": draw(hard_text),
        "plan_cursor": draw(st.integers(0, 2**53 - 1)),
        "decisions": tuple(draw(st.lists(st.dictionaries(hard_text, documents), max_size=2))),
        "quarantined_keys": tuple(draw(st.lists(hard_text.filter(bool), max_size=3, unique=True))),
        "forks": tuple(draw(st.lists(hard_text.filter(bool), max_size=2, unique=True))),
        "last_outcome": draw(
            st.none()
            | st.builds(
                LastOutcome.bounded, st.sampled_from(["executed", "rejected"]), output=hard_text
            )
        ),
    }
    if draw(st.booleans()):
        changes["pending"] = pending(
            draw(st.dictionaries(hard_text, documents, max_size=4)),
            approvals=tuple(draw(st.lists(st.dictionaries(hard_text, documents), max_size=2))),
        )
    else:
        changes.update(phase=Phase.NEEDS_REVIEW, pending=None)
        changes["review_cases"] = (
            ReviewCase(
                "case-1",
                "receipt_drift",
                "a1",
                "idem-1",
                DIGEST,
                draw(st.none() | st.dictionaries(hard_text, documents, max_size=3)),
                None,
                PRE,
                NOW,
                draw(hard_text),
            ),
        )
    return state(**changes)


@settings(max_examples=150)
@given(states())
def test_the_spliced_payload_is_the_canonical_encoding_of_the_whole_state(s: RunState) -> None:
    """Built member by member from cached parts, the bytes equal canonical_bytes(state.to_json())."""
    assert whole_payload(s) == canonical_bytes(s.to_json())


@settings(max_examples=300)
@given(states(rich_documents))
def test_the_payload_and_each_part_are_rfc8785s_bytes(s: RunState) -> None:
    """Numbers, non-ASCII and astral text, nesting: the payload and its parts are rfc8785's bytes, or both refuse."""
    import rfc8785

    document = s.to_json()
    try:
        expected = bytes(rfc8785.dumps(document))
    except rfc8785.CanonicalizationError:
        with pytest.raises(CanonicalJSONError):
            whole_payload(s)
        return
    assert whole_payload(s) == expected
    encoded = encode_state(s)
    for member, found in parts_named(json.loads(encoded.payload)).items():
        assert encoded.parts[found] == bytes(rfc8785.dumps(document[member]))


@settings(max_examples=150)
@given(states())
def test_a_payload_and_its_parts_read_back_as_the_state(s: RunState) -> None:
    """The payload names each big part by digest; read back with its parts it is the whole state."""
    encoded = encode_state(s)
    document = read_back(encoded.payload, dict(encoded.parts))
    assert document == json.loads(canonical_bytes(s.to_json()))
    assert RunState.from_json(document) == s
    for found, data in encoded.parts.items():
        assert digest_bytes(data) == found
    assert set(parts_named(json.loads(encoded.payload)).values()) == set(encoded.parts)


def test_big_members_are_parts_and_small_ones_stay_inline() -> None:
    """The binding, pending write and last write are parts; the environment and spent stay inline."""
    payload = json.loads(encode_state(state()).payload)
    assert set(payload["parts"]) == {"binding", "pending", "last_write"}
    assert payload["environment"] == PRE.to_json()
    assert payload["spent"] == Spent(1, 1, 0, 5).to_json()
    assert payload["schema_version"] == 4
    assert set(payload["parts"]) <= PART_FIELDS


def test_an_unchanged_part_is_not_encoded_again() -> None:
    """Evolving a state reuses its unchanged parts' bytes (the same object), so nothing is re-encoded."""
    first = state()
    second = first.evolve(generation=3, updated_at=NOW + timedelta(seconds=2))
    one, two = encode_state(first), encode_state(second)
    assert one.parts.keys() == two.parts.keys()
    for found in one.parts:
        assert two.parts[found] is one.parts[found]
    assert one.payload != two.payload


def test_a_new_pending_write_is_the_only_new_part() -> None:
    """A step that changes the pending write stores that part; the binding and last write are as they were."""
    first = encode_state(state())
    second = encode_state(state(pending=pending({"content": "y"})))
    assert len(set(second.parts) - set(first.parts)) == 1


@pytest.mark.parametrize(
    ("previous", "parts", "inline"),
    [
        # Nothing known of the previous generation: every big member is a part.
        ("none", {"binding", "pending", "last_write"}, set()),
        # The same state again: every big member is unchanged, so named.
        ("same", {"binding", "pending", "last_write"}, set()),
        # A new pending write: it changed, so it travels inline; the rest are named.
        ("new pending", {"binding", "last_write"}, {"pending"}),
        # A previous generation without a binding (or another one): inline now.
        ("no binding", {"pending", "last_write"}, {"binding"}),
    ],
)
def test_a_member_changed_since_the_previous_generation_is_written_inline(
    previous: str, parts: set[str], inline: set[str]
) -> None:
    """Given the previous generation's digests, changed members are inline and unchanged ones parts."""
    s = state()
    digests = encode_state(s).digests
    known = {
        "none": None,
        "same": digests,
        "new pending": encode_state(state(pending=pending({"content": "y"}))).digests,
        "no binding": {k: v for k, v in digests.items() if k != "binding"},
    }[previous]
    encoded = encode_state(s, known)
    payload = json.loads(encoded.payload)
    assert set(payload["parts"]) == parts
    assert {name for name in ("binding", "pending", "last_write") if name in payload} == inline
    assert set(encoded.parts) == {digests[name] for name in parts}
    document = expand_payload(payload, dict(encoded.parts).get)
    assert RunState.from_json(document) == s
    assert canonical_bytes(document) == whole_payload(s)


def test_a_missing_or_altered_part_is_corruption() -> None:
    """A part the store lacks, whose bytes do not hash to the signed digest, or are not JSON, fails closed."""
    encoded = encode_state(state())
    parts = dict(encoded.parts)
    victim = json.loads(encoded.payload)["parts"]["pending"]
    with pytest.raises(CheckpointCorruptError, match="missing"):
        read_back(encoded.payload, {k: v for k, v in parts.items() if k != victim})
    altered = {**parts, victim: parts[victim].replace(b'"x"', b'"y"')}
    with pytest.raises(CheckpointCorruptError, match="altered"):
        read_back(encoded.payload, altered)
    broken = b"{not json"
    payload = {**json.loads(encoded.payload), "parts": {"pending": digest_bytes(broken)}}
    with pytest.raises(CheckpointCorruptError, match="not strict JSON"):
        expand_payload(payload, {digest_bytes(broken): broken}.get)


@pytest.mark.parametrize(
    "parts",
    [
        None,
        [],
        {"worker": DIGEST},
        {"binding": 7},
        {"binding": "sha256:short"},
        {"environment": DIGEST},  # given inline too
    ],
)
def test_a_malformed_parts_object_is_an_unknown_field(parts: Any) -> None:
    """A schema-4 payload whose parts are missing, misnamed, malformed or doubled is refused."""
    payload = json.loads(encode_state(state()).payload)
    if parts is None:
        del payload["parts"]
    else:
        payload["parts"] = parts
    with pytest.raises(UnknownFieldError):
        expand_payload(payload, lambda found: None)


def test_a_schema_3_payload_reads_as_it_always_did() -> None:
    """A checkpoint written before parts (every member inline, schema 3) passes through whole."""
    s = state()
    document = {**s.to_json(), "schema_version": 3}
    assert expand_payload(document, lambda found: None) is document
    assert RunState.from_json(document) == s


def test_a_state_that_is_not_json_is_an_invariant_error() -> None:
    """A state holding a value JSON cannot carry (a datetime in a decision) is refused before any commit."""
    with pytest.raises(InvariantError, match="not serializable"):
        encode_valid_state(state(decisions=({"when": NOW},)))


@settings(max_examples=50)
@given(states(), st.text(min_size=1, max_size=6))
def test_a_sealed_envelope_is_the_canonical_json_of_its_fields(s: RunState, key_id: str) -> None:
    """The envelope spliced around the payload is RFC 8785 JSON itself, and opens to the payload."""
    from tether.crypto import Keyring, open_envelope, seal

    keyring = Keyring.generate(key_id.encode("utf-8", "replace").decode("utf-8"))
    payload = encode_state(s).payload
    envelope = seal(payload, keyring)
    assert canonical_bytes(json.loads(envelope)) == envelope
    assert open_envelope(envelope, keyring) == json.loads(payload)


def test_every_field_of_a_run_state_is_a_payload_member() -> None:
    """A field added to RunState without a payload member would be dropped from every checkpoint."""
    from dataclasses import fields

    from tether.core._payload import STATE_MEMBERS

    assert {f.name for f in fields(RunState)} | {"schema_version"} == STATE_MEMBERS


def test_a_state_with_every_member_set_encodes_and_reads_back_whole() -> None:
    """Every optional member set at once: the spliced payload is the whole document, parts and all."""
    from tether.core import PolicyChange, Verification
    from tether.core._rewind import RewindPlan, RewindScope
    from tether.core._state import ReplayApproval, SpentNonce

    full = state(
        phase=Phase.RUNNING,
        pending=None,
        stop_reason=None,
        results_digest=DIGEST,
        admission=DIGEST,
        epoch_id="epoch-1",
        occurrence_id="r1",
        verification=Verification(3, PRE.state_fingerprint, True, 0, DIGEST, NOW),
        quarantined_keys=("idem-q",),
        decisions=({"body": {"decision": "replan"}, "signature": "x" * 300},),
        rewinding=RewindPlan(
            1, 2, PRE, DIGEST, 0, RewindScope.ALIGNED, "why", "ops", DIGEST, 0, 0, DIGEST, 2
        ),
        forks=(DIGEST,),
        fork_nonces=("n" * 32,),
        cancel_nonces=("c" * 32,),
        replay_approvals=(ReplayApproval(DIGEST, NOW, "1"),),
        approval_nonces=(SpentNonce("a" * 32, NOW),),
        last_outcome=LastOutcome.bounded("executed", output="o" * 400),
        policy_change=PolicyChange.NEW_OCCURRENCE,
    )
    document = full.to_json()
    assert whole_payload(full) == canonical_bytes(document)
    encoded = encode_state(full)
    assert read_back(encoded.payload, dict(encoded.parts)) == json.loads(canonical_bytes(document))
    assert RunState.from_json(read_back(encoded.payload, dict(encoded.parts))) == full


def test_the_part_cache_does_not_hold_a_huge_part_alive() -> None:
    """A small part stays cached (held) after use; one of several megabytes is encoded but not kept."""
    import gc
    import weakref

    from tether.core._canonical import part_bytes

    class Doc(list):  # a list that can be weakly referenced
        pass

    small, huge = Doc(["x"]), Doc(["y" * (5 * 2**20)])
    small_ref, huge_ref = weakref.ref(small), weakref.ref(huge)
    assert part_bytes(huge, list)[0].startswith(b'["yyy')
    assert part_bytes(small, list)[0] == b'["x"]'  # last in: nothing can evict it here
    del small, huge
    gc.collect()
    assert small_ref() is not None
    assert huge_ref() is None
