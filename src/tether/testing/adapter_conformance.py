"""The adapter conformance suite: does your adapter keep the promises it declares?

In a test module::

    import pytest
    from tether.testing.adapter_conformance import *  # noqa: F403

    @pytest.fixture
    def tether_adapter(tmp_path):
        world = start_my_service(tmp_path)
        yield AdapterSubject(
            make=lambda: MyAdapter(world.url),       # a fresh object on the SAME world
            write=lambda n: ("ticket.open", "tickets", {"title": f"t{n}"}),
            effects=lambda: world.count_tickets(),   # what the world received
        )

``make`` is called once per check and again where a check needs a second
object on the same world (a recovering process). A function effect is an
adapter like any other: ``make=lambda: open_ticket.adapter`` (or a
``tether.function_effect(kind, fn, ...)``) puts your own function through
the same checks, for what it declares (idempotent, a look-up, a compensation). ``write(n)`` gives the
n-th of as many distinct writes as a check needs: ``(kind, target, args)``
before the adapter's ``normalize``. ``effects()`` counts what the world
really received, by the world's own books, never the adapter's. Optionally
``lose_next_reply()`` makes the next send land and its reply be lost (a
hostile service mode, a dropped connection), so the unknown-outcome checks
run too, and ``unproven_lookup()`` makes the adapter's look-ups answered by
something other than its declared route (a server's "no such route" 404, a
redirect), so the check that such an answer is never "nothing landed" runs.

The protocol simulator (``tether.testing.simulate.run(seed, capabilities=...)``)
drives the whole runtime against the capabilities you declare; it covers every
combination of idempotent, queryable (blind: neither), absence final or not,
retention, in-flight limit, fencing and stateful or remote, with lost replies,
hostile look-ups, outages, requests in flight and a look-up route that 404s;
its directed cases play each hard case against the combinations an
``HttpEffect`` profile can declare, from ``ServiceProfile()`` (blind: nothing
promised) and a safe same-key resend without a look-up (idempotent, not
queryable) to a look-up whose absence is final.

What is checked, for the capabilities the adapter DECLARES: a receipt is
bound to the key, the intent digest and the post-state ``derive_post_state``
promised; an idempotent adapter replays the first receipt without a second
effect and refuses the same key with another intent; a queryable adapter's
look-up from a fresh object equals the receipt field for field, finds
nothing for a key never used, and finds a landed write whose reply was lost;
an idempotent adapter that cannot be asked settles such a write by a resend
under its key, with no second effect; a look-up answered by anything but its
declared route is never "nothing" (``LookupInconclusiveError`` or unavailable);
a fencing adapter refuses a superseded token and writes nothing; bad input
and another instance's prestate are typed ``TetherError`` refusals. An
adapter that claims idempotent but writes twice fails. A kind that declares
``adapter`` compensation must be backed by ``compensate()``; given
``compensations()`` (the world's count of undone effects), a compensation
is bound to its own key and intent, undoes once however often it is sent
under that key, and is found by that key where the adapter is queryable.

Checks raise ``AssertionError`` explicitly (never ``assert``), so the suite
behaves the same under ``python -O``. The suite needs pytest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tether.adapters._base import (
    Adapter,
    Fence,
    capabilities_for,
    look_up,
    offers_compensation,
)
from tether.adapters._errors import FenceRejectedError, UnresolvedWriteError
from tether.core import (
    AdapterUnavailableError,
    Capabilities,
    Compensation,
    EffectStatus,
    EffectTerms,
    EnvironmentState,
    IdempotencyConflictError,
    Intent,
    LookupInconclusiveError,
    Receipt,
    TetherError,
)
from tether.core import _compensation as compensation_rules
from tether.core._compensation import EffectRecord
from tether.core._ledger import retry_semantics

__all__ = [
    "AdapterSubject",
    "test_a_fencing_adapter_refuses_a_superseded_token",
    "test_a_landed_write_whose_reply_was_lost_is_found_by_key",
    "test_a_look_up_from_no_declared_route_is_never_absence",
    "test_a_queryable_adapter_answers_by_key_from_a_fresh_object",
    "test_a_receipt_is_bound_to_key_intent_and_post_state",
    "test_an_idempotent_adapter_refuses_the_same_key_with_another_intent",
    "test_an_idempotent_adapter_replays_without_a_second_effect",
    "test_an_offered_compensation_is_one_effect_under_its_own_key",
    "test_bad_input_is_a_typed_refusal",
    "test_the_adapter_declares_itself",
]


@dataclass
class AdapterSubject:
    """An adapter under test and the world it acts on (see the module docstring)."""

    make: Callable[[], Any]
    write: Callable[[int], tuple[str, str, dict[str, Any]]]
    effects: Callable[[], int]
    lose_next_reply: Callable[[], None] | None = None
    #: How many effects the world has undone, by its own books (compensating adapters).
    compensations: Callable[[], int] | None = None
    #: Make the look-ups from now on be answered by something that is not the
    #: declared route (a "no such route" 404, a redirect); queryable adapters.
    unproven_lookup: Callable[[], None] | None = None


def _fail(message: str) -> None:
    raise AssertionError(message)


def _intent(adapter: Any, subject: AdapterSubject, n: int) -> Intent:
    kind, target, args = subject.write(n)
    return Intent(kind, target, adapter.normalize(kind, target, args), "low")


def _send(adapter: Any, subject: AdapterSubject, key: str, n: int) -> tuple[Intent, Receipt]:
    intent = _intent(adapter, subject, n)
    return intent, adapter.execute(key, intent, adapter.environment())


def _caps(adapter: Any) -> Capabilities:
    caps = adapter.capabilities
    if not isinstance(caps, Capabilities):
        _fail(f"capabilities must be a tether Capabilities, not {type(caps).__name__}")
    return caps  # type: ignore[no-any-return]


def test_the_adapter_declares_itself(tether_adapter: AdapterSubject) -> None:
    """The protocol's members exist, and identity, kinds and capabilities are well formed."""
    adapter = tether_adapter.make()
    if not isinstance(adapter, Adapter):
        _fail(f"{type(adapter).__name__} does not implement tether.adapters.Adapter")
    _caps(adapter)
    env = adapter.environment()
    if not isinstance(env, EnvironmentState) or env.namespace != adapter.namespace:
        _fail(f"environment() must be an EnvironmentState in namespace {adapter.namespace!r}")
    if env.instance_id != adapter.instance_id:
        _fail("environment().instance_id must equal instance_id")
    kind = tether_adapter.write(0)[0]
    if kind not in {k.name for k in adapter.kinds}:
        _fail(f"the subject's write kind {kind!r} is not among the adapter's kinds")


def test_a_receipt_is_bound_to_key_intent_and_post_state(tether_adapter: AdapterSubject) -> None:
    """One send: one effect, and a receipt naming the key, the intent and the promised state."""
    adapter = tether_adapter.make()
    before = tether_adapter.effects()
    intent = _intent(adapter, tether_adapter, 0)
    prestate = adapter.environment()
    promised = adapter.derive_post_state(prestate, intent)
    receipt = adapter.execute("conformance-key-1", intent, prestate)
    if tether_adapter.effects() != before + 1:
        _fail(f"one send made {tether_adapter.effects() - before} effects, not 1")
    if not isinstance(receipt, Receipt):
        _fail("execute must return a Receipt")
    if receipt.idempotency_key != "conformance-key-1" or receipt.intent_digest != intent.digest:
        _fail("the receipt must carry the key and the intent digest it was sent under")
    if receipt.namespace != adapter.namespace:
        _fail("the receipt must carry the adapter's namespace")
    if receipt.post_state != promised:
        _fail(f"the receipt's post-state {receipt.post_state} is not {promised} as derived")


def test_an_idempotent_adapter_replays_without_a_second_effect(
    tether_adapter: AdapterSubject,
) -> None:
    """Declared idempotent: the same key and intent returns the first receipt, no new effect."""
    adapter = tether_adapter.make()
    if not _caps(adapter).idempotent:
        pytest.skip("the adapter does not declare itself idempotent")
    intent, first = _send(adapter, tether_adapter, "conformance-key-2", 0)
    after_one = tether_adapter.effects()
    again = adapter.execute("conformance-key-2", intent, adapter.environment())
    if tether_adapter.effects() != after_one:
        _fail("an adapter declared idempotent made a second effect for the same key and intent")
    if again != first:
        _fail("the replay must return the first receipt, field for field")


def test_an_idempotent_adapter_refuses_the_same_key_with_another_intent(
    tether_adapter: AdapterSubject,
) -> None:
    """Declared idempotent: a key reused with another intent is a conflict, and no effect."""
    adapter = tether_adapter.make()
    if not _caps(adapter).idempotent:
        pytest.skip("the adapter does not declare itself idempotent")
    _send(adapter, tether_adapter, "conformance-key-3", 0)
    after_one = tether_adapter.effects()
    other = _intent(adapter, tether_adapter, 1)
    try:
        adapter.execute("conformance-key-3", other, adapter.environment())
    except IdempotencyConflictError:
        pass
    else:
        _fail("the same key with another intent must raise IdempotencyConflictError")
    if tether_adapter.effects() != after_one:
        _fail("a refused key reuse still made an effect")


def test_a_queryable_adapter_answers_by_key_from_a_fresh_object(
    tether_adapter: AdapterSubject,
) -> None:
    """Declared queryable: a recovering process's look-up equals the receipt; unknown is None."""
    adapter = tether_adapter.make()
    if not _caps(adapter).queryable:
        pytest.skip("the adapter does not declare itself queryable")
    intent, receipt = _send(adapter, tether_adapter, "conformance-key-4", 0)
    fresh = tether_adapter.make()
    found = look_up(fresh, "conformance-key-4", intent)
    if found != receipt:
        _fail(f"the look-up from a fresh object returned {found!r}, not the receipt {receipt!r}")
    if look_up(fresh, "conformance-key-never-used", intent) is not None:
        _fail("a key never used must look up as None")


def test_a_landed_write_whose_reply_was_lost_is_found_by_key(
    tether_adapter: AdapterSubject,
) -> None:
    """The send lands, its reply is lost: a typed error, one effect, and the key finds it."""
    if tether_adapter.lose_next_reply is None:
        pytest.skip("the subject cannot lose a reply (no lose_next_reply)")
    adapter = tether_adapter.make()
    before = tether_adapter.effects()
    intent = _intent(adapter, tether_adapter, 0)
    tether_adapter.lose_next_reply()
    try:
        adapter.execute("conformance-key-5", intent, adapter.environment())
    except (AdapterUnavailableError, UnresolvedWriteError):
        pass  # unknown or in flight: the runtime asks again, never calls it nothing
    except TetherError as exc:
        _fail(
            f"a send that landed but lost its reply raised {type(exc).__name__}: a refusal "
            "tells the runtime nothing happened; it must be AdapterUnavailableError"
        )
    else:
        _fail("a send whose reply was lost must raise AdapterUnavailableError, not return")
    if tether_adapter.effects() != before + 1:
        _fail("the lost-reply send did not land exactly once")
    caps = _caps(adapter)
    if caps.queryable:
        found = look_up(tether_adapter.make(), "conformance-key-5", intent)
        if found is None or found.intent_digest != intent.digest:
            _fail("a queryable adapter must find the landed write by its key")
    elif caps.idempotent:
        # Nothing to ask: the runtime settles it by sending again under the key.
        again = tether_adapter.make().execute("conformance-key-5", intent, adapter.environment())
        if again.intent_digest != intent.digest or tether_adapter.effects() != before + 1:
            _fail("an idempotent adapter's resend of a landed write must replay it, no new effect")


def test_a_look_up_from_no_declared_route_is_never_absence(
    tether_adapter: AdapterSubject,
) -> None:
    """A look-up answered by anything but its declared route says "unknown", never "nothing"."""
    adapter = tether_adapter.make()
    if not _caps(adapter).queryable:
        pytest.skip("the adapter does not declare itself queryable")
    if tether_adapter.unproven_lookup is None:
        pytest.skip("the subject cannot break its look-up route (no unproven_lookup)")
    intent, _ = _send(adapter, tether_adapter, "conformance-key-8", 0)
    tether_adapter.unproven_lookup()
    for key in ("conformance-key-8", "conformance-key-never-used"):
        try:
            found = look_up(tether_adapter.make(), key, intent)
        except (LookupInconclusiveError, AdapterUnavailableError):
            continue  # unknown: the runtime never reads it as "nothing landed"
        if found is None:
            _fail(
                f"a look-up for {key!r} answered by no declared route returned None: "
                "that is 'nothing landed', which such an answer never proves"
            )


def test_a_fencing_adapter_refuses_a_superseded_token(tether_adapter: AdapterSubject) -> None:
    """Declared fencing: once a higher lease version wrote, a lower one is refused, no effect."""
    adapter = tether_adapter.make()
    if not _caps(adapter).fencing:
        pytest.skip("the adapter does not declare fencing")
    first = _intent(adapter, tether_adapter, 0)
    adapter.execute("conformance-key-6", first, adapter.environment(), Fence("conf-run", 5))
    after_one = tether_adapter.effects()
    stale = _intent(adapter, tether_adapter, 1)
    try:
        adapter.execute("conformance-key-7", stale, adapter.environment(), Fence("conf-run", 4))
    except FenceRejectedError:
        pass
    except TetherError as exc:
        _fail(f"a superseded token must raise FenceRejectedError, not {type(exc).__name__}")
    else:
        _fail("a superseded fencing token must be refused")
    if tether_adapter.effects() != after_one:
        _fail("a refused stale token still made an effect")


def test_bad_input_is_a_typed_refusal(tether_adapter: AdapterSubject) -> None:
    """An empty key and another instance's prestate are TetherErrors, and nothing is sent."""
    adapter = tether_adapter.make()
    intent = _intent(adapter, tether_adapter, 0)
    before = tether_adapter.effects()
    live = adapter.environment()
    elsewhere = EnvironmentState(
        live.namespace, live.instance_id + "-other", 0, "sha256:" + "0" * 64
    )
    for key, prestate, what in (("", live, "an empty key"), ("k-x", elsewhere, "another instance")):
        try:
            adapter.execute(key, intent, prestate)
        except TetherError:
            pass
        except Exception as exc:  # the very thing this check exists to catch
            _fail(f"{what} raised {type(exc).__name__}, not a TetherError: {exc}")
        else:
            _fail(f"{what} was accepted")
    if tether_adapter.effects() != before:
        _fail("a refused send still made an effect")


def test_an_offered_compensation_is_one_effect_under_its_own_key(
    tether_adapter: AdapterSubject,
) -> None:
    """Declared adapter compensation is offered; it undoes once per key, and is found by key."""
    adapter = tether_adapter.make()
    kind, target, _ = tether_adapter.write(0)
    declared = next((k for k in adapter.kinds if k.name == kind), None)
    if declared is None or declared.compensation is not Compensation.ADAPTER:
        pytest.skip("the write kind does not declare adapter compensation")
    if not offers_compensation(adapter, kind):
        _fail(f"{kind!r} declares adapter compensation, but the adapter has no compensate()")
    count = tether_adapter.compensations
    if count is None:
        pytest.skip("the subject gives no compensations() count")
    intent, receipt = _send(adapter, tether_adapter, "conformance-undo-original", 0)
    terms = EffectTerms(
        adapter.namespace, kind, target, retry_semantics(_caps(adapter)), Compensation.ADAPTER
    )
    effect = EffectRecord(
        receipt.idempotency_key,
        "a0",
        intent.digest,
        EffectStatus.COMMITTED,
        receipt.to_json(),
        terms,
    )
    undo = compensation_rules.compensation_intent(effect, risk="low")
    before = count()
    first = adapter.compensate("conformance-undo-1", undo, None)
    if first.idempotency_key != "conformance-undo-1" or first.intent_digest != undo.digest:
        _fail("a compensation's receipt must carry its own key and its intent's digest")
    undo_caps = capabilities_for(adapter, undo)  # a compensation may declare its own proofs
    if undo_caps.idempotent:
        again = tether_adapter.make().compensate("conformance-undo-1", undo, None)
        if again != first:
            _fail("the same compensation sent again under its key must return the first receipt")
    if count() != before + 1:
        _fail(f"one compensation under one key undid {count() - before} effects")
    if undo_caps.queryable:
        found = look_up(tether_adapter.make(), "conformance-undo-1", undo)
        if found != first:
            _fail("a look-up by the compensation's key must rebuild its receipt field for field")
