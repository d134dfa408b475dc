"""Admission: the decision that lets a recovery or a rewind proceed.

A checkpoint says where to restore; admission says whether this principal
may resume this work occurrence now. It binds five things, all under one
work-occurrence id:

1. the selected checkpoint (the high-water mark, or the chosen rewind point);
2. the interrupted epoch (a second admission of the same epoch is refused:
   the first one moved the run to a new epoch);
3. the recovering principal and its CURRENT roles (the deployment's trust
   roots now, against the policy's ``authority``; a revoked key is unknown);
4. the policy version (a change is adopted only as the policy in force
   allows, see :func:`tether.core.policy_rules.adoption`, and opens a new
   work occurrence linked to the old one);
5. the state of effects beyond the checkpoint (the ledger's signed head and
   length: an admission signed before an effect landed is stale).

Pure: the signature is checked in ``crypto``; here a verified body is
compared field by field with what the run needs now.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from tether.core._errors import AdmissionRefusedError, ApprovalExpiredError, EvidenceError
from tether.core._evidence import check_lifetime, check_nonce
from tether.core._model import format_time
from tether.core._state import Binding, RunState

ADMISSION_FIELDS = (
    "kind", "purpose", "principal_id", "task_id", "run_id", "occurrence_id",
    "checkpoint_generation", "checkpoint_digest", "interrupted_epoch", "interrupted_epoch_id",
    "policy_id", "policy_version", "policy_fingerprint", "ledger_head", "ledger_length",
    "target_generation", "scope", "reason", "issued_at", "expires_at", "nonce",
)  # fmt: skip

# Which of the five bindings each bound field belongs to (for the refusal).
_BINDING_OF = {
    "task_id": "run",
    "run_id": "run",
    "occurrence_id": "run",
    "checkpoint_generation": "checkpoint",
    "checkpoint_digest": "checkpoint",
    "interrupted_epoch": "epoch",
    "interrupted_epoch_id": "epoch",
    "policy_id": "policy",
    "policy_version": "policy",
    "policy_fingerprint": "policy",
    "ledger_head": "effects",
    "ledger_length": "effects",
    "purpose": "document",
    "target_generation": "document",
    "scope": "document",
    "reason": "document",
}


class Purpose(StrEnum):
    """What an admission lets proceed."""

    RECOVERY = "recovery"
    REWIND = "rewind"


def occurrence_of(state: RunState) -> str:
    """The run's work-occurrence id (its run id for checkpoints older than the field)."""
    return state.occurrence_id or state.run_id


def admission_request(
    state: RunState,
    *,
    checkpoint_digest: str,
    policy: Binding,
    purpose: Purpose,
    target_generation: int | None = None,
    reason: str = "",
    scope: str = "aligned",
) -> dict[str, Any]:
    """The fields an admission of ``state`` (the checkpoint the mark names) must carry.

    ``policy`` is the binding the run would continue under: the current
    policy, which may differ from the checkpoint's. A rewind names its
    target generation and scope (``aligned``, or a split made on purpose:
    ``files`` or ``context``) and why.
    """
    return {
        "kind": "admission",
        "purpose": purpose.value,
        "task_id": state.binding.task_id,
        "run_id": state.run_id,
        "occurrence_id": occurrence_of(state),
        "checkpoint_generation": state.generation,
        "checkpoint_digest": checkpoint_digest,
        "interrupted_epoch": state.epoch,
        "interrupted_epoch_id": state.epoch_id,
        "policy_id": policy.policy_id,
        "policy_version": policy.policy_version,
        "policy_fingerprint": policy.policy_fingerprint,
        "ledger_head": state.ledger_head,
        "ledger_length": state.ledger_length,
        "target_generation": target_generation,
        "scope": scope,
        "reason": reason,
    }


def new_admission(
    request: dict[str, Any],
    principal_id: str,
    *,
    issued_at: datetime,
    expires_at: datetime,
    nonce: str,
) -> dict[str, Any]:
    """The body a principal signs to admit ``request`` (the nonce comes from outside)."""
    return {
        **request,
        "principal_id": principal_id,
        "issued_at": format_time(issued_at),
        "expires_at": format_time(expires_at),
        "nonce": nonce,
    }


def check_admission(
    body: dict[str, Any],
    signer_id: str,
    request: dict[str, Any],
    *,
    now: datetime,
    ttl_s: int,
    run_id: str,
    consumed: frozenset[str] = frozenset(),
) -> None:
    """Refuse an admission that is malformed, bound to anything but ``request``, expired,
    or whose nonce is in ``consumed`` (the run's :func:`~tether.core.consumed_nonces`).

    A replayed admission finds its epoch superseded (the first one opened a
    new epoch); its nonce is one-time across every kind of document all the
    same.
    """
    missing = [name for name in ADMISSION_FIELDS if name not in body]
    extra = sorted(set(body) - set(ADMISSION_FIELDS))
    if missing or extra:
        raise AdmissionRefusedError(
            "document", f"missing fields {missing} or unknown fields {extra}", run_id=run_id
        )
    if body["principal_id"] != signer_id:
        raise AdmissionRefusedError(
            "principal",
            f"signed by {signer_id!r} for principal {body['principal_id']!r}",
            run_id=run_id,
            expected=signer_id,
            actual=body["principal_id"],
        )
    for name, want in request.items():
        have = body.get(name)
        if have != want or type(have) is not type(want):
            binding = _BINDING_OF.get(name, "document")
            raise AdmissionRefusedError(
                binding,
                f"{name} is {have!r}, the run is at {want!r}"
                + (
                    "; that epoch was already admitted and superseded" if binding == "epoch" else ""
                ),
                run_id=run_id,
                expected=want,
                actual=have,
            )
    try:
        check_lifetime(body, now=now, ttl_s=ttl_s)
        check_nonce(body, consumed)
    except ApprovalExpiredError as exc:
        raise AdmissionRefusedError(
            "document",
            f"the admission expired at {body.get('expires_at')}; a fresh one is needed",
            run_id=run_id,
        ) from exc
    except EvidenceError as exc:
        raise AdmissionRefusedError("document", str(exc), run_id=run_id) from exc


def authorize(
    principal_id: str,
    roles: frozenset[str],
    allowed: frozenset[str],
    purpose: Purpose,
    *,
    run_id: str,
) -> str:
    """The role under which ``principal_id`` may do ``purpose``, or a refusal naming why."""
    for role in sorted(roles):
        if role in allowed:
            return role
    held = sorted(roles) or ["none (not in the trust roots)"]
    raise AdmissionRefusedError(
        "principal",
        f"{principal_id!r} holds {held}; the policy lets {sorted(allowed)} admit a {purpose.value}",
        run_id=run_id,
        expected=sorted(allowed),
        actual=sorted(roles),
    )


def admission_record(
    request: dict[str, Any],
    *,
    principal_id: str,
    role: str,
    document: dict[str, Any] | None,
    decided_at: datetime,
    epoch_id: str,
    occurrence_id: str,
    withheld_secrets: bool,
) -> dict[str, Any]:
    """What is stored (by digest, in the new epoch's state) and traced for an admission.

    ``document`` is the signed admission, or ``None`` where the deployment
    names no principals and the worker recovered as itself (recorded as
    unsigned, so an auditor sees exactly what authority there was).
    """
    return {
        "kind": "admission_record",
        "bindings": request,
        "principal": {"id": principal_id, "role": role, "signed": document is not None},
        "document": document,
        "decided_at": format_time(decided_at),
        "epoch_id": epoch_id,
        "occurrence_id": occurrence_id,
        "withheld_secrets": withheld_secrets,
    }
