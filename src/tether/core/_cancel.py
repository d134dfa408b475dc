"""A signed cancel: what it binds, the checks that enforce it, and the transition it asks for.

A person (an operator, or whoever the policy's ``authority.cancel`` names)
signs a cancel outside the runtime and leaves it in the run's inbox; the
runtime applies it at the run's next step, or a worker claims the run for
it. It binds the task, the run, the policy (id, version and fingerprint),
the reason, an expiry and a one-time nonce, and NOT the generation: the run
keeps moving while the document travels, and a cancel must still land.

A cancel that lands ends the run, so its nonce needs no record: a replayed
document finds the run finished. One the run read without ending (refused
because the run was frozen for review, or acted on by freezing it) has its
nonce recorded in the state, so the same document delivered again later is
refused. One that cannot land yet (a write whose outcome is still in
flight) leaves the inbox cursor where it is, so it is read again at the
next step, until it lands or expires.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from tether.core._errors import EvidenceBindingError, EvidenceSignatureError
from tether.core._evidence import (
    check_bound,
    check_lifetime,
    check_nonce,
    check_shape,
    consumed_nonces,
)
from tether.core._model import format_time
from tether.core._state import RunState
from tether.core._transition import Transition

CANCEL_FIELDS = (
    "kind", "operator_id", "task_id", "run_id", "policy_id", "policy_version",
    "policy_fingerprint", "reason", "issued_at", "expires_at", "nonce",
)  # fmt: skip

#: A reason longer than this is refused (it is copied into the trace).
MAX_REASON = 2000


def cancel_request(state: RunState) -> dict[str, Any]:
    """The fields a cancel of the run must carry: the run and the policy it runs under."""
    binding = state.binding
    return {
        "kind": "cancel",
        "task_id": binding.task_id,
        "run_id": state.run_id,
        "policy_id": binding.policy_id,
        "policy_version": binding.policy_version,
        "policy_fingerprint": binding.policy_fingerprint,
    }


def new_cancel(
    state: RunState,
    operator_id: str,
    *,
    reason: str,
    issued_at: datetime,
    expires_at: datetime,
    nonce: str,
) -> dict[str, Any]:
    """The body a person signs to cancel the run (``operator_id``: who signs it)."""
    _check_reason(reason)
    return {
        **cancel_request(state),
        "operator_id": operator_id,
        "reason": reason,
        "issued_at": format_time(issued_at),
        "expires_at": format_time(expires_at),
        "nonce": nonce,
    }


def check_cancel(
    body: dict[str, Any], signer_id: str, state: RunState, *, now: datetime, ttl_s: int
) -> str:
    """Refuse a cancel that is malformed, mis-bound, expired or too long-lived; its reason.

    The signature and the signer's role are checked by the runtime against
    its trust roots first; here the verified body is bound to the run now.
    """
    check_shape(body, CANCEL_FIELDS)
    if body["operator_id"] != signer_id:
        raise EvidenceBindingError("operator_id", signer_id, body["operator_id"])
    check_bound(body, cancel_request(state))
    reason = body["reason"]
    _check_reason(reason)
    check_lifetime(body, now=now, ttl_s=ttl_s)
    check_nonce(body, consumed_nonces(state))
    return str(reason)


def spent_cancel(state: RunState, body: dict[str, Any]) -> RunState:
    """``state`` with the verified cancel's nonce recorded: it was read, and is never read again."""
    return state.evolve(cancel_nonces=(*state.cancel_nonces, str(body["nonce"])))


def _check_reason(reason: Any) -> None:
    if not isinstance(reason, str) or not reason.strip():
        raise EvidenceSignatureError("a cancel needs a reason a person can read later")
    if len(reason) > MAX_REASON:
        raise EvidenceSignatureError(f"a cancel's reason is at most {MAX_REASON} characters")


def cancel_read(transition: Transition, document: dict[str, Any], cursor: int | None) -> Transition:
    """A cancel that froze the run instead of ending it: the freeze records the document.

    Asked to cancel while a write may have been sent, the runtime cannot make
    "never landed" final, so a person decides (``cancel_outcome_unknown``).
    The cancel was acted on: its inbox entry is read, with the freeze.
    """
    state = transition.state
    if state is None:
        return transition  # nothing committed (in flight): read again next step
    body = document.get("body")
    if isinstance(body, dict) and isinstance(body.get("nonce"), str):
        state = spent_cancel(state, body)  # verified before it froze the run
    data: dict[str, Any] = {"evidence": document, "outcome": transition.reason}
    if cursor is not None:
        data["seq"] = cursor
        state = state.evolve(inbox_cursor=max(state.inbox_cursor, cursor))
    return replace(transition, state=state, events=(*transition.events, ("cancel_read", data)))
