"""HttpEffect: mutating HTTP requests under ``Idempotency-Key``, as the service's profile allows.

Each ``http.post`` carries the idempotency key as a Structured Field string
and the run's fencing token (``Tether-Fence``). Answers map onto the adapter
protocol's typed outcomes:

=========================  ====================================================
the service answers        HttpEffect
=========================  ====================================================
2xx                        the receipt (the response is the authority)
409, where the profile     wait and ask again with the SAME key, bounded; then
declares in-flight 409s    in progress (the run waits, then looks the key up)
(or 409 replays)
421 naming another         the service is another instance than the run's
instance                   (``Tether-Instance``): drift, nothing was applied
the profile's mismatch     a key conflict: needs_review, the response as evidence
status (422)
400 about the key          a configuration error (never retried by the runtime)
412 stale fence            the fencing token was superseded: stop
other 4xx                  refused: no effect (a retry's refusal: outcome unknown)
5xx, timeout, reset        outcome unknown: looked up by key where the profile
                           declares a look-up, resent under the key where it
                           declares a same-key resend safe, else review
=========================  ====================================================

What the service promises is declared, not assumed (:class:`ServiceProfile`);
``HttpEffect(url)`` alone assumes nothing, so every uncertain outcome goes
to review. A send whose first attempt may have landed goes again only where
the profile makes a same-key resend safe (the service replays or refuses a
key it holds), and, where it declares a look-up, only after the look-up
found no record. A look-up's answer counts as "no record" only from the
declared route in its declared shape (:func:`tether.core.read_lookup`): a
"no such route" 404, a redirect or an error page proves nothing. A key older
than the declared retention is never sent again.

The environment is the service's identity (base URL and the instance id the
service reports), not its state: what a remote service holds cannot be
fingerprinted, so the effect ledger, not the environment, remembers it. No
request goes to another instance that took over the URL (a restore, a
failover to an empty replica): a service whose profile says it
``verifies_instance`` is told the bound instance in ``Tether-Instance`` on
every send and look-up and refuses one meant for another before it applies
anything; any other service is asked for its identity again before each.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tether.adapters._base import Fence
from tether.adapters._errors import (
    FenceRejectedError,
    HttpConfigError,
    KeyHeldError,
    KeyInFlightError,
    KeyReusedError,
    NotQueryableError,
    RequestRefusedError,
)
from tether.adapters._httpfields import (
    FENCE,
    IDEMPOTENCY_KEY,
    INSTANCE,
    HeaderFieldError,
    fence_header,
    parse_sf_string,
    sf_string,
)
from tether.adapters._httpprofile import ServiceProfile
from tether.adapters._remote import RemoteEffect
from tether.core import (
    ActionClass,
    ActionKind,
    AdapterUnavailableError,
    CanonicalJSONError,
    Capabilities,
    Compensation,
    ContractViolationError,
    EnvironmentDriftError,
    EnvironmentState,
    Intent,
    LookupInconclusiveError,
    Receipt,
    TargetKind,
    Targets,
    TetherError,
    canonical_bytes,
    strict_loads,
)
from tether.core._compensation import compensated_effect
from tether.core._http_lookup import LookupReply, read_lookup
from tether.core._spec import check_canonical_path
from tether.core._transition import LookupStatus

if TYPE_CHECKING:  # imported where a client is made: `import tether` does not pay for httpx
    import httpx

ADAPTER_VERSION = "1"
# What a POST created, a person can withdraw (close the ticket, refund the
# charge); the draft gives no generic way for an adapter to undo it.
HTTP_POST = ActionKind(
    "http.post",
    ActionClass.WRITE,
    TargetKind.PATH,
    frozenset({"json"}),
    compensation=Compensation.HUMAN,
)

_KIND_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
#: The part of a response body kept in a receipt (the ledger stores receipts).
MAX_RECEIPT_BODY = 16_384


def reference_fingerprint(method: str, path: str, body: bytes) -> str:
    """The payload fingerprint the reference service keeps: method, path and body bytes."""
    hashed = hashlib.sha256(method.encode() + b" " + path.encode() + b"\n" + body)
    return "sha256:" + hashed.hexdigest()


#: The methods an HttpEffect sends, and what A, B, A does by default for each:
#: an equal request made before is answered from its record (``collection``)
#: whatever the method, so a program rerun from its top after a crash (which
#: re-proposes A, then B) sends nothing it sent before. Declare
#: ``targets="state"`` (a PUT of a setting a run may revert) to write A again
#: after B; a rerun from the top then sends such writes again (the target
#: moved since), as it does on the file workspace.
METHOD_TARGETS = {
    "POST": Targets.COLLECTION,
    "PUT": Targets.COLLECTION,
    "PATCH": Targets.COLLECTION,
    "DELETE": Targets.COLLECTION,
}


class HttpEffect(RemoteEffect):
    """An adapter for one HTTP service: ``http.post`` to paths under ``base_url``.

    ``method``: the request method (``POST``, ``PUT``, ``PATCH``, ``DELETE``;
    the kind defaults to ``http.`` and the method in lower case).
    ``targets``: what a path is (:class:`~tether.core.Targets`): by default
    ``"collection"`` whatever the method (a request equal to one made before
    is answered from its record, so a program rerun from its top sends
    nothing twice); ``"state"`` for a path whose state a run may set back (A,
    B, A sends A again; a rerun from the top then sends such writes again);
    ``"unknown"`` to have a person decide A, B, A.

    ``profile`` declares what the service promises about keys
    (:class:`ServiceProfile`, or a preset: ``IETF_DRAFT``, ``STRIPE_REPLAY``,
    ``CONFLICT_409``, ``REFERENCE_PROFILE``); without one nothing is assumed
    and every uncertain outcome goes to review.

    Two services in one run each need their own action kind and namespace:
    ``HttpEffect(url, kind="stripe.post", namespace="stripe")``.
    """

    ADAPTER_VERSION = ADAPTER_VERSION

    def __init__(
        self,
        base_url: str,
        *,
        profile: ServiceProfile | None = None,
        namespace: str = "http",
        kind: str | None = None,
        timeout_s: float = 10.0,
        method: str = "POST",
        targets: Targets | str | None = None,
    ) -> None:
        if method not in METHOD_TARGETS:
            raise HttpConfigError(f"method must be one of {sorted(METHOD_TARGETS)}, not {method!r}")
        kind = kind if kind is not None else "http." + method.lower()
        declared = METHOD_TARGETS[method]
        if targets is not None:
            try:
                declared = Targets(targets)
            except ValueError:
                raise HttpConfigError(
                    f"targets must be one of {[t.value for t in Targets]}, not {targets!r}"
                ) from None
        if not _KIND_NAME.fullmatch(kind):
            raise HttpConfigError(
                f"kind {kind!r} must be dotted lower-case words, like 'http.post' or 'stripe.post'"
            )
        if not base_url.startswith(("http://", "https://")):
            raise HttpConfigError(f"base_url must be http:// or https://, not {base_url!r}")
        if not 0 < timeout_s <= 3600:
            raise HttpConfigError("timeout_s must be positive and at most an hour")
        if not namespace:
            raise HttpConfigError("namespace must not be empty")
        if profile is None:
            profile = ServiceProfile()  # promises nothing: uncertain outcomes go to review
        if not isinstance(profile, ServiceProfile):
            raise HttpConfigError(f"profile must be a ServiceProfile, not {type(profile).__name__}")
        self.base_url = base_url.rstrip("/")
        self.profile = profile
        self.method = method
        self._namespace = namespace
        # Undone by the adapter only where the service offers a way (a profile's
        # compensate path); otherwise by a person, as before.
        undo = Compensation.ADAPTER if profile.compensate is not None else Compensation.HUMAN
        self._kind = replace(HTTP_POST, name=kind, compensation=undo)
        import httpx

        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s)
        self._reported: str | None = None  # the instance id the service named, asked once
        # What the profile declares, and nothing more: a same-key resend only where
        # it cannot be a second effect; absence only from a declared look-up.
        self._capabilities = Capabilities(
            idempotent=profile.settles_by_resend,
            queryable=profile.lookup is not None,
            conditional_writes=False,
            fencing=profile.fencing,
            absent_is_final=profile.lookup is not None and profile.resend_safe,
            retention_s=profile.retention_s,
            in_flight_limit_s=profile.in_flight_limit_s,
            stateful=False,
            targets=declared,
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> HttpEffect:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- identity -----------------------------------------------------

    @property
    def instance_id(self) -> str:
        """The base URL and the instance id the service reports (asked once per object)."""
        return f"{self.base_url}#{self._bound()}"

    def _bound(self) -> str:
        """The instance id this adapter is bound to: the first one the service reported."""
        if self._reported is None:
            self._reported = self._ask_identity()
        return self._reported

    def _ask_identity(self) -> str:
        if self.profile.identity is None:
            return ""
        body = self._get_json(self.profile.identity, "identity")
        value = body.get("instance_id") if isinstance(body, dict) else None
        if not isinstance(value, str) or not value:
            raise AdapterUnavailableError(
                f"{self.base_url}: the identity endpoint named no instance_id"
            )
        return value

    def _same_service(self) -> dict[str, str]:
        """Before every send and look-up: what keeps it from reaching another instance.

        A long-lived adapter must not carry a ticket to a new database that took
        over the address (a restore, a failover to an empty replica). A service
        that verifies ``Tether-Instance`` checks the header itself, in the
        transaction that would apply the request, so the headers returned here
        are enough (and leave no gap between a check and the send); any other
        is asked for its identity now, and a change is refused before sending.
        """
        if self.profile.identity is None:
            return {}
        bound = self._bound()
        if self.profile.verifies_instance:
            return {INSTANCE: sf_string(bound, "an instance id")}
        now = self._ask_identity()
        if now != bound:
            raise self._drift(now, "nothing was sent")
        return {}

    def _check_instance(self, response: httpx.Response, *, acted_on: bool) -> None:
        """A verifying service's answer must come from the bound instance.

        ``421`` naming another instance: it refused before applying anything.
        Any other answer naming another instance, or an answer the runtime acts
        on (``acted_on``) naming none, means the service does not check what its
        profile says: the request may have been applied unverified.
        """
        if not self.profile.verifies_instance:
            return
        bound, echoed = self._bound(), response.headers.get(INSTANCE)
        if echoed is None:
            if acted_on:
                raise HttpConfigError(
                    f"the profile says {self.base_url} verifies {INSTANCE}, but its "
                    f"{response.status_code} answer names no instance: the request may have "
                    "been applied by an unverified instance; fix the profile or the service"
                )
            return
        try:
            named = parse_sf_string(echoed, f"a {INSTANCE}")
        except HeaderFieldError:
            named = echoed  # not the bound instance in any form: drift
        if named == bound:
            return
        if response.status_code == 421:
            raise self._drift(named, "it refused the request before applying anything")
        raise self._drift(named, "the request may have been applied there")

    def _drift(self, now: str, what_happened: str) -> EnvironmentDriftError:
        bound = f"{self.base_url}#{self._bound()}"
        actual = f"{self.base_url}#{now}"
        return EnvironmentDriftError(
            f"{self.base_url} is now service instance {actual!r}, not {bound!r} that this "
            f"run is bound to; {what_happened}",
            expected=bound,
            actual=actual,
        )

    # --- writing ------------------------------------------------------

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """``{"json": OBJECT}`` exactly; the target is a canonical path under the base URL."""
        self._check_kind(kind)
        check_canonical_path(target, "target")
        if set(args) != {"json"} or not isinstance(args["json"], dict):
            raise ContractViolationError(
                "bad_args", f"{kind} takes exactly one argument, json: an object"
            )
        canonical_bytes(args["json"])  # refuses what has no canonical JSON form
        return {"json": args["json"]}

    def effect_identity(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """Method and JSON body (the path is the target), less the profile's ``identity_ignores``.

        Never the ``Idempotency-Key``: it names one attempt, not the effect.
        """
        body = args.get("json")
        if isinstance(body, dict):
            ignored = self.profile.identity_ignores
            body = {k: v for k, v in body.items() if k not in ignored}
        return {"method": self.method, "json": body}

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        """Send ``intent`` under ``key``; a 409 is asked again with the same key, bounded."""
        self._check_send(key, intent, prestate)
        if compensated_effect(intent) is not None:
            raise ContractViolationError(
                "bad_args", "a compensation intent is carried out by compensate(), not execute()"
            )
        return self._post(key, intent, prestate, fence, self.method)

    def compensate(self, key: str, intent: Intent, fence: Fence | None = None) -> Receipt:
        """Undo what a POST created: POST the profile's compensate path under ``key``.

        Answers map exactly as for :meth:`execute` (see the module's table), so
        a lost reply is settled by looking ``key`` up, never by a second send
        the service would not deduplicate.
        """
        prestate = self.environment()
        self._check_send(key, intent, prestate)
        self._request(intent)  # refuses what is not a compensation this service can carry out
        return self._post(key, intent, prestate, fence, "POST")

    def _request(self, intent: Intent) -> tuple[str, bytes]:
        """The path and body the service receives for ``intent`` (a write or a compensation)."""
        named = compensated_effect(intent)
        if named is None:
            return "/" + intent.target, canonical_bytes(intent.args["json"])
        template = self.profile.compensate
        object_id = str(named.get("business_object_id") or "")
        if template is None or not object_id:
            raise ContractViolationError(
                "no_compensation",
                f"{self.base_url} cannot undo this effect: "
                + (
                    "its profile declares no compensate path"
                    if template is None
                    else "no object id"
                ),
            )
        body = canonical_bytes({"compensates": str(named.get("idempotency_key", ""))})
        return "/" + template.replace("{object_id}", object_id).lstrip("/"), body

    def _post(
        self,
        key: str,
        intent: Intent,
        prestate: EnvironmentState,
        fence: Fence | None,
        method: str,
    ) -> Receipt:
        """Send ``intent``'s request under ``key``; a 409 is asked again with the same key."""
        import httpx  # bound by __init__; here for its error types

        path, body = self._request(intent)
        headers = self._same_service()
        headers |= {IDEMPOTENCY_KEY: sf_string(key), "content-type": "application/json"}
        if fence is not None:
            headers[FENCE] = fence_header(fence.run_id, fence.lease_version)
        for attempt in range(self.profile.in_flight_retries + 1):
            try:
                response = self._client.request(method, path, content=body, headers=headers)
            except httpx.HTTPError as exc:
                raise AdapterUnavailableError(
                    f"{method} {path} under key {key}: {type(exc).__name__}: {exc}; the outcome is "
                    "unknown (the request may have been applied)"
                ) from exc
            self._check_instance(response, acted_on=200 <= response.status_code < 300)
            if not self.profile.in_flight(response.status_code):
                return self._answer(key, intent, prestate, fence, response)
            if self.profile.replay == "conflict" and self.profile.lookup is None:
                # 409 for any key it holds, in flight or done: no wait and no resend
                # can tell which, and nothing can be asked. A resend's: a person decides.
                raise KeyHeldError(intent.target, key, response.text[:500])
            if attempt < self.profile.in_flight_retries:
                time.sleep(self.profile.in_flight_wait_s * 2**attempt)
        raise KeyInFlightError(key, f"{method} {path} is still in flight at the service (409)")

    def _answer(
        self,
        key: str,
        intent: Intent,
        prestate: EnvironmentState,
        fence: Fence | None,
        response: httpx.Response,
    ) -> Receipt:
        status = response.status_code
        text = response.text[:2000]
        if 200 <= status < 300:
            try:
                # 204 No Content (or any empty 2xx) is a success with nothing to keep.
                body = None if not response.content.strip() else response.json()
            except ValueError:
                raise AdapterUnavailableError(
                    f"the request under key {key} answered {status} without a JSON body; the outcome "
                    "is unknown"
                ) from None
            return self._receipt(key, intent.digest, status, body, prestate)
        if self.profile.mismatch(status, text):
            raise KeyReusedError(key, intent.digest, text, status)
        if status == 412 and fence is not None:
            raise FenceRejectedError(fence.run_id, fence.lease_version, None)
        if status == 400 and "idempotency" in text.lower():
            raise HttpConfigError(f"the service refused the Idempotency-Key header: {text}")
        if 400 <= status < 500:
            raise RequestRefusedError(intent.target, status, text)
        raise AdapterUnavailableError(
            f"the request under key {key} answered {status}: {text[:500]}; the outcome is unknown"
        )

    def _receipt(
        self, key: str, intent_digest: str, status: int, body: Any, post: EnvironmentState
    ) -> Receipt:
        """The same fields whether built from the reply or from a later look-up."""
        kept: Any = body
        try:
            encoded = canonical_bytes(body)
        except TetherError:
            # The effect landed; a body RFC 8785 cannot carry (an id past 2**53,
            # a NaN) must not make it unrecordable. Its digest stands in for it,
            # taken over a stable re-encoding both the reply and a look-up give.
            encoded = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
            kept = {"body_sha256": "sha256:" + hashlib.sha256(encoded).hexdigest()}
        if len(encoded) > MAX_RECEIPT_BODY:
            kept = {"body_sha256": "sha256:" + hashlib.sha256(encoded).hexdigest()}
        object_id = body.get(self.profile.object_id_field, "") if isinstance(body, dict) else ""
        committed = ""
        field_name = self.profile.committed_at_field
        if field_name is not None and isinstance(body, dict):
            committed = str(body.get(field_name) or "")
        return Receipt(
            namespace=self._namespace,
            adapter_version=ADAPTER_VERSION,
            receipt_id=f"{self.instance_id}/{key}",
            idempotency_key=key,
            intent_digest=intent_digest,
            result={"status": status, "body": kept},
            business_object_id=str(object_id),
            committed_at=committed,
            post_state=post,
        )

    # --- asking by key ------------------------------------------------

    def where_to_look(self, key: str, intent: Intent) -> dict[str, str]:
        """Where a person finds the request ``key`` sent: the URL, the key header, the look-up."""
        hints = {
            "request": f"{self.method} {self.base_url}/{intent.target.lstrip('/')}",
            f"{IDEMPOTENCY_KEY} header": sf_string(key),
        }
        if self.profile.lookup is not None:
            hints["look-up"] = f"GET {self.base_url}/{self.profile.lookup.replace('{key}', key)}"
        hints["how"] = (
            "find the object the request created in the service (its records, logs or UI, "
            "by that key): found, sign landed with its id or URL; not there, sign not_landed "
            "(it is sent again under the same key). Where the card warns that a look-up by "
            "key proves nothing (the service forgot it), look for the object by its content"
        )
        return hints

    def lookup(self, key: str) -> Receipt | None:
        """What the service recorded under ``key``, as evidence (its intent is not judged)."""
        return self._look_up(key, None)

    def lookup_intent(self, key: str, intent: Intent) -> Receipt | None:
        """What the service recorded under ``key``, judged against ``intent`` (see LooksUpIntents)."""
        return self._look_up(key, intent)

    def _look_up(self, key: str, intent: Intent | None) -> Receipt | None:
        """Ask the declared route; its answer is read by :func:`tether.core.read_lookup`."""
        import httpx  # bound by __init__; here for its error types

        template = self.profile.lookup
        if template is None:
            raise NotQueryableError(f"{self.base_url} declares no look-up by key")
        path = "/" + template.replace("{key}", key).lstrip("/")
        bound = self._same_service()
        try:
            # Never followed: a redirect is not the declared route's answer.
            response = self._client.get(path, headers=bound, follow_redirects=False)
        except httpx.HTTPError as exc:
            raise AdapterUnavailableError(
                f"{self.base_url}: the look-up request failed: {type(exc).__name__}: {exc}"
            ) from exc
        sent = None
        if intent is not None:
            method = "POST" if compensated_effect(intent) is not None else self.method
            sent = reference_fingerprint(method, *self._request(intent))
        reading = read_lookup(_reply(response), key=key, shape=self.profile.lookup_shape, sent=sent)
        # An answer naming another instance is drift whatever it says; one the run
        # would act on must name the bound instance (an inconclusive one acts on nothing).
        unproven = {LookupStatus.UNAVAILABLE, LookupStatus.INCONCLUSIVE}
        self._check_instance(response, acted_on=reading.status not in unproven)
        where = f"{self.base_url}: the look-up for key {key}"
        status = reading.status
        if status is LookupStatus.UNAVAILABLE:
            raise AdapterUnavailableError(f"{where}: {reading.detail}; asked again later")
        if status is LookupStatus.INCONCLUSIVE:
            raise LookupInconclusiveError(
                f"{where} proves nothing: {reading.detail}; the outcome is unknown (if the "
                "service answers its look-up another way, declare it in the profile)"
            )
        if status is LookupStatus.IN_PROGRESS:
            raise KeyInFlightError(key, reading.detail)
        if status is LookupStatus.ABSENT:
            return None
        code = reading.response_status or 0
        if status is LookupStatus.REFUSED and intent is not None:
            # The service stored its refusal of this very request: nothing landed,
            # and a resend would only be answered with the same refusal.
            raise RequestRefusedError(intent.target, code, json.dumps(reading.response_body))
        ours = "sha256:service-" + str(reading.fingerprint or "")
        if intent is not None and not reading.foreign:
            ours = intent.digest  # tether mints one key per intent: the record is this intent
        return self._receipt(key, ours, code, reading.response_body, self.environment())

    def _get_json(self, path: str, what: str) -> Any:
        """GET ``path`` as JSON (the identity path)."""
        import httpx  # bound by __init__; here for its error types

        try:
            response = self._client.get("/" + path.lstrip("/"))
        except httpx.HTTPError as exc:
            raise AdapterUnavailableError(
                f"{self.base_url}: the {what} request failed: {type(exc).__name__}: {exc}"
            ) from exc
        if response.status_code != 200:
            raise AdapterUnavailableError(
                f"{self.base_url}: the {what} request answered {response.status_code}"
            )
        try:
            return json.loads(response.content)
        except ValueError:
            raise AdapterUnavailableError(
                f"{self.base_url}: the {what} answer is not JSON"
            ) from None


def _reply(response: httpx.Response) -> LookupReply:
    """A look-up's answer as values: JSON only if it says so and parses strictly."""
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        return LookupReply(response.status_code, False)
    try:
        return LookupReply(response.status_code, True, strict_loads(response.content))
    except CanonicalJSONError:
        return LookupReply(response.status_code, False)
