"""What an HTTP service promises about ``Idempotency-Key``: :class:`ServiceProfile` and its presets.

A profile is a declaration by the service's operators (or the user who read
its documentation), never a guess by tether. ``ServiceProfile()`` declares
nothing: no identity path, no look-up, no deduplication, so every uncertain
outcome of a send goes to a person. Each field that promises more lets
tether do more, and only that:

========================  =====================================================
the profile says          tether
========================  =====================================================
nothing (the default)     a send whose reply was lost: review
``replay`` is             a same-key resend settles a lost reply
``first_response`` and    (:attr:`~ServiceProfile.settles_by_resend`): after a
``refuses_in_flight``     crash between the send and its record, the write is
                          sent again under its key (within ``retention_s``)
                          and the stored response is its receipt
``replay`` is             a same-key resend is never a second effect, but its
``conflict`` and          409 says nothing of the first: a lost reply still
``refuses_in_flight``     goes to review (unless a look-up is declared)
``lookup`` (a route)      a lost reply is settled by asking the route by key;
                          only its declared "no record" answer is absence
``lookup`` and a safe     absence is final: resent under the same key at once
resend
========================  =====================================================

The presets name the common semantics; each is tested against a real server
on loopback that behaves so (``tests/integration/test_http_presets.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from tether.adapters._errors import HttpConfigError
from tether.core._http_lookup import LookupShape

_REPLAYS = ("first_response", "conflict", "new_effect")


def _default_absent() -> Mapping[str, str]:
    return MappingProxyType({"idempotency_key": "{key}"})


@dataclass(frozen=True, slots=True)
class ServiceProfile:
    """What a service promises about ``Idempotency-Key``, as its operators declare it.

    The defaults promise nothing (every uncertain outcome goes to review); see
    the module's table, ``notes/docs-adapters.md`` and the presets
    (:data:`IETF_DRAFT`, :data:`STRIPE_REPLAY`, :data:`CONFLICT_409`,
    :data:`REFERENCE_PROFILE`).

    ``replay``: what a second request with a completed key gets:
    ``new_effect`` (it executes again: the default, nothing promised),
    ``first_response`` (the stored response, the draft's way) or ``conflict``
    (a 409). ``refuses_in_flight``: a second request while the first is still
    running gets 409 (never a second execution). ``detects_mismatch``: the
    same key with another payload is refused with ``mismatch_status`` (422 in
    the draft; a 400 counts only if its body speaks of idempotency).
    ``retention_s``: keys are kept at least this long (``None``: for ever).
    ``in_flight_limit_s``: a key the service still reports in flight this long
    after it was sent is stuck; the effect goes to review (``None``: wait for
    ever). ``lookup``: the path, relative to the base URL, that answers for a
    key (``{key}`` is replaced), in the reference service's record format;
    ``None``: the service cannot be asked. ``lookup_absent`` and
    ``lookup_absent_status``: the route's own "no record under this key"
    answer: that status with a JSON object holding each of these fields with
    this value (``{key}`` replaced); any other answer is never absence.
    ``identity``: a path answering ``{"instance_id": ...}``; ``None``: the base
    URL alone names the service. ``verifies_instance``: the service refuses
    (``421``) a send or a look-up whose ``Tether-Instance`` names another
    instance than its own, before applying anything, and names itself in that
    header on every answer; without it, the identity path is asked again
    before every send and look-up. ``fencing``: the service refuses a lower
    ``Tether-Fence``. ``identity_ignores``: body fields that do not make the
    effect (see :meth:`HttpEffect.effect_identity`).
    """

    replay: str = "new_effect"
    refuses_in_flight: bool = False
    detects_mismatch: bool = False
    mismatch_status: int = 422
    retention_s: float | None = 24 * 3600.0
    lookup: str | None = None
    lookup_absent: Mapping[str, str] = field(default_factory=_default_absent, hash=False)
    lookup_absent_status: int = 404
    identity: str | None = None
    verifies_instance: bool = False
    fencing: bool = False
    object_id_field: str = "id"
    committed_at_field: str | None = None
    in_flight_retries: int = 5
    in_flight_wait_s: float = 0.1
    in_flight_limit_s: float | None = 900.0
    #: The path, relative to the base URL, that undoes what a POST created
    #: (``{object_id}`` is replaced by the receipt's business object id): POSTed
    #: under its own ``Idempotency-Key`` with ``{"compensates": ORIGINAL_KEY}``,
    #: answered like a POST, and asked by key the same way. ``None``: only a
    #: person can undo it (the kind declares ``human`` compensation).
    compensate: str | None = None
    #: Top-level fields of the JSON body that do not change what the request
    #: does (a client request id, a client timestamp): two requests differing
    #: only there are the same effect, and the second is replayed, not sent.
    identity_ignores: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.replay not in _REPLAYS:
            raise HttpConfigError(f"replay must be one of {list(_REPLAYS)}, not {self.replay!r}")
        if self.retention_s is not None and not 0 < self.retention_s <= 10 * 366 * 86400:
            raise HttpConfigError("retention_s must be positive and at most ten years")
        if not 0 <= self.in_flight_retries <= 100 or not 0 <= self.in_flight_wait_s <= 60:
            raise HttpConfigError("in_flight_retries must be 0-100 and in_flight_wait_s 0-60")
        if self.in_flight_limit_s is not None and not 0 < self.in_flight_limit_s <= 30 * 86400:
            raise HttpConfigError("in_flight_limit_s must be positive and at most 30 days")
        if self.lookup is not None and "{key}" not in self.lookup:
            raise HttpConfigError("a lookup path must contain {key}")
        if self.compensate is not None and "{object_id}" not in self.compensate:
            raise HttpConfigError("a compensate path must contain {object_id}")
        if self.verifies_instance and self.identity is None:
            raise HttpConfigError("verifies_instance needs an identity path to learn the instance")
        if not 400 <= self.mismatch_status <= 499 or self.mismatch_status in (409, 412):
            raise HttpConfigError(
                "mismatch_status must be a 4xx other than 409 (in flight) and 412 (fence)"
            )
        self._check_absent()

    def _check_absent(self) -> None:
        absent = self.lookup_absent
        if not isinstance(absent, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in absent.items()
        ):
            raise HttpConfigError("lookup_absent must map field names to text")
        if not any("{key}" in value for value in absent.values()):
            # A body that names the key asked is what tells the route's own answer
            # from any server's "Not Found": without it, absence proves nothing.
            raise HttpConfigError(
                "lookup_absent must hold a field whose value contains {key} (the key asked, "
                "echoed by the route's 'no record' answer)"
            )
        status = self.lookup_absent_status
        if not (200 <= status <= 299 or 400 <= status <= 499):
            raise HttpConfigError("lookup_absent_status must be a 2xx or a 4xx")
        # Kept read-only: a profile is a value, shared by every adapter given it.
        object.__setattr__(self, "lookup_absent", MappingProxyType(dict(absent)))

    @property
    def resend_safe(self) -> bool:
        """Whether a second request under a key can never be a second effect.

        The service answers a completed key with its stored response or a 409,
        and a key still in flight with a 409. tether resends only the same
        request under a key, so whether the service compares payloads does
        not matter here (``detects_mismatch`` is evidence, not safety).
        """
        return self.replay != "new_effect" and self.refuses_in_flight

    @property
    def settles_by_resend(self) -> bool:
        """Whether a same-key resend is safe AND answers with the first response (a receipt).

        Only then is the service idempotent in the runtime's sense: a write whose
        reply was lost is settled by sending it again under its key. A service
        that answers a held key with 409 (``replay="conflict"``) never says
        whether the first request landed, so a resend cannot settle it.
        """
        return self.resend_safe and self.replay == "first_response"

    @property
    def lookup_shape(self) -> LookupShape:
        """The look-up route's declared "no record" answer, as the core rule reads it."""
        fields = tuple(sorted(self.lookup_absent.items()))
        return LookupShape(self.lookup_absent_status, fields)

    def mismatch(self, status: int, text: str) -> bool:
        """Whether an answer ``status`` with body ``text`` is the service's "key reused"."""
        if not self.detects_mismatch or status != self.mismatch_status:
            return False
        return status != 400 or "idempotency" in text.lower()

    def in_flight(self, status: int) -> bool:
        """Whether ``status`` answering a send means "a request under this key is running"."""
        return status == 409 and (self.refuses_in_flight or self.replay == "conflict")


#: The IETF httpapi Idempotency-Key draft: a completed key gets its stored
#: response, a key in flight 409, the same key with another payload 422. The
#: draft defines no look-up by key and no retention: a crash in the window
#: between the send and its record is settled by resending under the key
#: (within 24 h, the shortest retention commonly kept).
IETF_DRAFT = ServiceProfile(
    replay="first_response",
    refuses_in_flight=True,
    detects_mismatch=True,
    mismatch_status=422,
    retention_s=24 * 3600.0,
)

#: Stripe-style replay: the same key returns the stored response (errors
#: included), a request while the first is running gets 409, another payload
#: under the key a 400 naming an idempotency error; keys are kept 24 hours; no
#: look-up by key. ``object_id_field`` names the created object (``id``).
STRIPE_REPLAY = ServiceProfile(
    replay="first_response",
    refuses_in_flight=True,
    detects_mismatch=True,
    mismatch_status=400,
    retention_s=24 * 3600.0,
    object_id_field="id",
)

#: A service that answers 409 to any request under a key it already holds,
#: in flight or completed (a unique key column), and never returns the stored
#: response. A same-key resend is never a second effect: after a crash before
#: the send it goes out and lands once; after a crash past the send its 409
#: cannot say whether the first landed, so a person decides at once.
CONFLICT_409 = ServiceProfile(
    replay="conflict",
    refuses_in_flight=True,
    detects_mismatch=False,
    retention_s=24 * 3600.0,
)

#: The reference effects service that ships in ``tether.testing.effects_service``:
#: the draft, plus a look-up by key (``GET idempotency/{key}``, 404
#: ``{"error": "unknown_key", "idempotency_key": KEY}`` when it has no record),
#: its identity (``GET instance``, verified per request through
#: ``Tether-Instance``), fencing, and ticket cancellation as compensation.
REFERENCE_PROFILE = replace(
    IETF_DRAFT,
    lookup="idempotency/{key}",
    lookup_absent={"error": "unknown_key", "idempotency_key": "{key}"},
    identity="instance",
    verifies_instance=True,
    fencing=True,
    object_id_field="ticket_id",
    committed_at_field="created_at",
    compensate="tickets/{object_id}/cancel",
)

#: Every named preset, by name (for the docs and the conformance tests).
PRESETS: Mapping[str, ServiceProfile] = MappingProxyType(
    {
        "IETF_DRAFT": IETF_DRAFT,
        "STRIPE_REPLAY": STRIPE_REPLAY,
        "CONFLICT_409": CONFLICT_409,
        "REFERENCE_PROFILE": REFERENCE_PROFILE,
    }
)
