"""A signed cancel read from the run's inbox: verified, bound, then carried out.

Signed by a principal whose role the policy's ``authority.cancel`` names
(operators by default), bound by :func:`tether.core.check_cancel`, and
carried out by the same path as :meth:`~tether.runtime.RunSession.cancel`
(``_stopping.cancel``): a write that may have been sent is settled first,
never dropped. A refused cancel is traced as ``evidence_refused`` and its
inbox entry read, like any other refused evidence.
"""

from __future__ import annotations

from typing import Any

from tether.core import (
    CancelRefusedError,
    EvidenceError,
    Outcome,
    Phase,
    PolicyError,
    UnknownSignerError,
)
from tether.core import _people as people
from tether.core._cancel import check_cancel, spent_cancel
from tether.crypto import Role
from tether.runtime import _hints, _stopping
from tether.runtime._view import Session


def from_inbox(session: Session, document: Any, *, cursor: int) -> Outcome:
    """Apply the signed cancel at inbox entry ``cursor``; a refusal is traced, then raised."""
    rt, state = session.rt, session.state
    verified: dict[str, Any] | None = None
    try:
        if rt.trust is None:
            raise EvidenceError(_hints.trust_roots(Role.OPERATOR))
        body, role = _verify(rt.trust, document, sorted(rt.policy.authority.cancel))
        reason = check_cancel(
            body, document["signer"], state, now=rt.clock.now(), ttl_s=rt.policy.approval_ttl_s
        )
        verified = body
        if state.phase is Phase.NEEDS_REVIEW:
            raise CancelRefusedError(
                f"run {state.run_id} is frozen for review; a reviewer's signed abort ends it "
                "(`tether review --decision abort`)",
                run_id=state.run_id,
            )
    except (EvidenceError, PolicyError) as exc:
        if not session.state.phase.terminal:
            refused = people.refused(session.state, "cancel", document, exc, cursor=cursor)
            if refused.state is not None:
                after = refused.state
                if verified is not None:  # authentic, read, refused: never read again
                    after = spent_cancel(after, verified)
                session.commit(after, list(refused.events))
        raise
    return _stopping.cancel(
        session, reason, f"{role}:{document['signer']}", document=document, cursor=cursor
    )


def _verify(trust: Any, document: Any, roles: list[str]) -> tuple[dict[str, Any], str]:
    """The body, signed by a trusted principal in one of ``roles``, and that role."""
    for role in roles:
        try:
            return trust.verify(document, Role(role)), role
        except UnknownSignerError:
            continue
    signer = document.get("signer") if isinstance(document, dict) else None
    raise UnknownSignerError(str(signer), " or ".join(roles) or "canceller")
