"""Admitting a recovery or a rewind: who resumes, under which current authority.

The pure bindings live in :mod:`tether.core._admission`; here the signed
document is verified against the deployment's trust roots as they are NOW,
the principal's role is checked against the current policy's ``authority``,
and the admission record that the new epoch will point to is built.

Three ways to be admitted, in order:

1. a signed admission document a person gave (``tether admit``, or
   ``Runtime.recover(run_id, admission=document)``);
2. the runtime's own ``principal`` key (a worker signs its own recovery; a
   worker whose key was removed from the trust roots is refused);
3. unsigned: a worker recovers as itself while the deployment's trust roots
   name no worker principals (operators named for other reasons do not
   change that), and the agent rewinds where the policy names ``agent``; the
   record says "unsigned", so the weaker assumption is written down rather
   than implied.

A recovery under another policy than the checkpoint's adopts it only as the
policy in force allows (:func:`tether.core.policy_rules.adoption`): where
that refuses, only the first way counts, and only from an operator.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tether.core import (
    AdmissionRefusedError,
    Binding,
    EvidenceError,
    PolicyChange,
    Purpose,
    RunState,
    TetherError,
    admission_request,
    canonical_bytes,
    digest_bytes,
    new_admission,
    strict_loads,
)
from tether.core import _policy_change as policy_rules
from tether.core._admission import admission_record, authorize, check_admission, occurrence_of
from tether.core._evidence import consumed_nonces
from tether.core._policy_change import Adoption
from tether.core._spec import describe_changes
from tether.crypto import TrustRoots
from tether.runtime._view import Runtime


@dataclass(frozen=True, slots=True)
class Admitted:
    """An admission decision: its record (canonical bytes, stored by digest) and what it changes."""

    digest: str
    body: bytes
    #: Applied to the state at the new epoch's first commit.
    changes: dict[str, Any]
    #: Traced with the event that opens the epoch.
    event: dict[str, Any]
    #: Whether the principal holds the read-secrets right under the current policy.
    may_read_secrets: bool


def policy_changed(state: RunState, current: Binding) -> bool:
    """Whether the run would continue under another policy than its checkpoint's."""
    got = state.binding
    return (got.policy_id, got.policy_version, got.policy_fingerprint) != (
        current.policy_id,
        current.policy_version,
        current.policy_fingerprint,
    )


def admit(
    rt: Runtime,
    state: RunState,
    *,
    checkpoint_digest: str,
    document: Any = None,
    purpose: Purpose = Purpose.RECOVERY,
    target_generation: int | None = None,
    reason: str = "",
    scope: str = "aligned",
    secrets_released: bool | None = None,
) -> Admitted:
    """Decide whether ``state`` (the checkpoint the mark names) may go on; raise if not.

    Raises :class:`~tether.core.AdmissionRefusedError` naming the binding
    that does not hold. Nothing is written here: the record lands with the
    new epoch's first commit, conditioned on the generation it was made for,
    so a second admission of the same epoch loses the race and is refused.
    """
    run_id = state.run_id
    if state.phase.terminal:
        raise AdmissionRefusedError(
            "run", f"run {run_id} is {state.phase}; nothing may resume it", run_id=run_id
        )
    authority = rt.policy.authority
    changed = policy_changed(state, rt.binding)
    allowed = authority.recover if purpose is Purpose.RECOVERY else authority.rewind
    request = admission_request(
        state,
        checkpoint_digest=checkpoint_digest,
        policy=rt.binding,
        purpose=purpose,
        target_generation=target_generation,
        reason=reason,
        scope=scope,
    )
    now = rt.clock.now()
    trust = rt.trust
    # A person's signed document, not the runtime vouching for itself.
    by_person = document is not None
    if document is None and rt.principal is not None:
        signer = rt.principal
        body = new_admission(
            request,
            signer.signer_id,
            issued_at=now,
            expires_at=now + timedelta(seconds=rt.policy.approval_ttl_s),
            nonce=secrets.token_hex(16),
        )
        document = signer.sign(body)
    if document is not None:
        principal_id, role = _verified(
            rt, trust, document, request, allowed, purpose, run_id, consumed_nonces(state)
        )
    else:
        principal_id, role = _unsigned(rt, trust, allowed, purpose, run_id)
    if purpose is Purpose.RECOVERY:
        # A rewind runs in a session a recovery (or the start) already admitted
        # under this policy: only a recovery adopts one.
        _adopt(
            state,
            rt.binding,
            changed=changed,
            admitted_by=role if by_person else None,
            changes=rules_changes(rt, state.binding.policy_fingerprint, rt.policy.to_json())
            if changed
            else (),
        )
    epoch_id = rt.ids.new_id("epoch")
    occurrence = rt.ids.new_id("occ") if changed else occurrence_of(state)
    may_read = role in authority.read_secrets
    # A rewind is applied by the process already running the agent: whether
    # the agent holds its secrets was that process's admission's to decide.
    withheld = not (may_read if secrets_released is None else secrets_released)
    record = admission_record(
        request,
        principal_id=principal_id,
        role=role,
        document=document,
        decided_at=now,
        epoch_id=epoch_id,
        occurrence_id=occurrence,
        withheld_secrets=withheld,
    )
    body_bytes = canonical_bytes(record)
    digest = digest_bytes(body_bytes)
    event: dict[str, Any] = {
        "admission": digest,
        "purpose": purpose.value,
        "principal": principal_id,
        "role": role,
        "signed": document is not None,
        "epoch_id": epoch_id,
        "previous_epoch_id": state.epoch_id,
        "checkpoint_digest": checkpoint_digest,
        "occurrence_id": occurrence,
    }
    if changed:
        event["previous_occurrence_id"] = occurrence_of(state)
        event["previous_policy"] = {
            "policy_id": state.binding.policy_id,
            "policy_version": state.binding.policy_version,
            "policy_fingerprint": state.binding.policy_fingerprint,
        }
    changes: dict[str, Any] = {
        "epoch_id": epoch_id,
        "admission": digest,
        "occurrence_id": occurrence,
        "binding": rt.binding,
        # From now on the clause of this policy decides the next change.
        "policy_change": authority.policy_change,
    }
    return Admitted(digest, body_bytes, changes, event, may_read)


def _adopt(
    state: RunState,
    current: Binding,
    *,
    changed: bool,
    admitted_by: str | None,
    changes: tuple[str, ...] = (),
) -> None:
    """Refuse the admission where the policy in force does not let it adopt ``current``."""
    if policy_rules.adoption(state.policy_change, changed=changed, admitted_by=admitted_by) is not (
        Adoption.REFUSED
    ):
        return
    was = state.binding
    what = "".join(f"\n  {change}" for change in changes)
    raise AdmissionRefusedError(
        "policy",
        f"the run is bound to policy {was.policy_id} {was.policy_version} "
        f"({was.policy_fingerprint}), which refuses a change (authority.policy_change: "
        f"{PolicyChange.REFUSE.value}); this runtime has {current.policy_id} "
        f"{current.policy_version} ({current.policy_fingerprint})"
        + (f". What changed:{what}\n" if what else ". ")
        + "Give the runtime the policy the run started with; or start the new policy under a "
        "new run id; or, to go on under it, an operator's signed admission adopts it "
        f"(`tether admit {state.run_id} --policy NEW_POLICY --key OPERATOR_KEY`); "
        "what the new policy says of itself does not count",
        run_id=state.run_id,
        expected=was.policy_fingerprint,
        actual=current.policy_fingerprint,
    )


def rules_changes(rt: Runtime, fingerprint: str, current: dict[str, Any]) -> tuple[str, ...]:
    """What differs between the task or policy document the store keeps under
    ``fingerprint`` (the one a run was made under) and ``current``; nothing when
    the store does not hold it (a run older than the documents' copies)."""
    try:
        blob = rt.store.get_blob(fingerprint)
        before = None if blob is None else strict_loads(blob)
    except TetherError:
        return ()
    return () if before is None else describe_changes(before, current)


def _verified(
    rt: Runtime,
    trust: TrustRoots | None,
    document: Any,
    request: dict[str, Any],
    allowed: frozenset[str],
    purpose: Purpose,
    run_id: str,
    consumed: frozenset[str],
) -> tuple[str, str]:
    """Check a signed admission against the trust roots and policy as they are now.

    ``consumed``: every nonce the run's state records (a decision's, a fork's,
    a cancel's, an approval's): an admission may reuse none of them.
    """
    signer_id = document.get("signer") if isinstance(document, dict) else None
    if not isinstance(signer_id, str):
        raise AdmissionRefusedError("document", "not a signed document", run_id=run_id)
    if trust is None:
        raise AdmissionRefusedError(
            "principal",
            "this runtime was given no trust roots to check the admission against",
            run_id=run_id,
        )
    held = trust.role_of(signer_id)
    role = authorize(
        signer_id,
        frozenset() if held is None else frozenset({held.value}),
        allowed,
        purpose,
        run_id=run_id,
    )
    if held is None:  # unreachable: authorize refuses a principal with no role
        raise AdmissionRefusedError("principal", f"{signer_id!r} is not trusted", run_id=run_id)
    try:
        body = trust.verify(document, held)
    except EvidenceError as exc:
        raise AdmissionRefusedError("document", str(exc), run_id=run_id) from exc
    check_admission(
        body,
        signer_id,
        request,
        now=rt.clock.now(),
        ttl_s=rt.policy.approval_ttl_s,
        run_id=run_id,
        consumed=consumed,
    )
    return signer_id, role


def _unsigned(
    rt: Runtime,
    trust: TrustRoots | None,
    allowed: frozenset[str],
    purpose: Purpose,
    run_id: str,
) -> tuple[str, str]:
    """The worker (or, for a rewind, the agent) acting as itself, unsigned.

    A worker may recover unsigned only while the deployment names no worker
    principals: once it does, workers are identities and each signs its own
    recoveries (a removed key is then a revoked worker). Operators named for
    other reasons (forks, rewinds) do not take that away.
    """
    role = "worker" if purpose is Purpose.RECOVERY else "agent"
    if role not in allowed:
        raise AdmissionRefusedError(
            "principal",
            f"the policy lets {sorted(allowed)} admit a {purpose.value}, and this one is "
            f"unsigned (by the {role}); give a signed admission",
            run_id=run_id,
            expected=sorted(allowed),
            actual=[role],
        )
    named = {r.value for r in trust.roles()} if trust is not None else set()
    if role == "worker" and "worker" in named:
        raise AdmissionRefusedError(
            "principal",
            "the trust roots name worker principals; this runtime has no principal= key "
            "to sign its recovery with (or give a signed admission)",
            run_id=run_id,
        )
    principal_id = rt.worker if role == "worker" else "agent"
    return principal_id, role
