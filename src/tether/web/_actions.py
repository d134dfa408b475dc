"""The documents people sign from the page, prepared and checked before anything is signed.

Like ``tether approve``/``review``/``rewind``: the fields are read from the
run as it is now and built by core's own builders (``new_approval``,
``new_decision``, ``new_admission``); every refusal the page can know of
(wrong phase, a key of the wrong role, a key the trust roots do not name, a
lifetime over the policy's) is raised before signing. Signing happens here,
in the server's process, with the operator's own key; the signed document
goes to the store's inbox, where the runtime checks it again at its next step.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tether.core import (
    Phase,
    Policy,
    PolicyError,
    Purpose,
    ReviewDecision,
    RewindRefusedError,
    RunState,
    TetherError,
    admission_request,
    new_admission,
    new_approval,
    new_decision,
)
from tether.crypto import Signer, TrustRoots
from tether.store import Mark, SQLBase

#: The lifetime signed when neither the form nor a policy says otherwise (the CLI's too).
DEFAULT_TTL_S = 900


class ActionRefusedError(PolicyError):
    """The page will not sign this: the run, the key or the form does not allow it.

    Raised before anything is signed; the message says what to do instead.
    """


@dataclass(frozen=True, slots=True)
class Prepared:
    """A document ready to sign: the inbox kind, the exact body, who signs, and where it goes."""

    run_id: str
    kind: str
    body: dict[str, Any]
    signer_id: str
    generation: int
    title: str


def decisions() -> list[str]:
    """The review decisions core knows (``accept`` appears once core defines it)."""
    return [d.value for d in ReviewDecision]


def signer_for(signers: list[Signer], roles: set[str], what: str) -> Signer:
    """The first of the operator's keys whose role may sign ``what``."""
    for signer in signers:
        if signer.role.value in roles:
            return signer
    held = ", ".join(f"{s.signer_id} ({s.role.value})" for s in signers) or "none"
    raise ActionRefusedError(
        f"to {what} the page needs a key of role {' or '.join(sorted(roles))}; "
        f"tether serve was given: {held}"
    )


def check_trusted(signer: Signer, trust: TrustRoots | None) -> None:
    """With trust roots given, the key must be one of them, in the role it signs as."""
    if trust is None:
        return
    if trust.role_of(signer.signer_id) is not signer.role:
        raise ActionRefusedError(
            f"key {signer.signer_id} ({signer.role.value}) is not in the trust roots given to "
            "tether serve: the runtime would refuse what it signs"
        )


def lifetime(ttl: float | None, state: RunState, policy: Policy | None) -> float:
    """Seconds the document lives: the form's, else the policy's (or 900 s), never above it.

    The policy must be the run's own: evidence is judged under the policy the run runs under.
    """
    if policy is not None and policy.fingerprint != state.binding.policy_fingerprint:
        binding = state.binding
        raise ActionRefusedError(
            f"run {state.run_id} runs under policy {binding.policy_id} version "
            f"{binding.policy_version}; the policy given to tether serve is "
            f"{policy.policy_id} version {policy.policy_version}"
        )
    return bounded(ttl, policy)


def bounded(ttl: float | None, policy: Policy | None) -> float:
    """``ttl`` (default: the policy's, at most 900 s) checked against the policy's limit."""
    if ttl is not None and not 0 < ttl <= DEFAULT_TTL_S:
        raise ActionRefusedError(f"ttl must be more than 0 and at most {DEFAULT_TTL_S} seconds")
    if policy is None:
        return DEFAULT_TTL_S if ttl is None else ttl
    allowed = policy.approval_ttl_s
    if ttl is None:
        return min(DEFAULT_TTL_S, allowed)
    if ttl > allowed:
        raise ActionRefusedError(
            f"ttl {ttl:g} s is longer than the policy's approval_ttl_s ({allowed} s): "
            "the runtime would refuse it"
        )
    return ttl


def _window(ttl: float) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "issued_at": now,
        "expires_at": now + timedelta(seconds=ttl),
        "nonce": secrets.token_hex(16),
    }


def prepare_approval(
    state: RunState,
    action_id: str,
    signers: list[Signer],
    *,
    trust: TrustRoots | None,
    policy: Policy | None,
    ttl: float | None,
) -> Prepared:
    """An approval of the run's pending write ``action_id``."""
    pending = state.pending
    if state.phase is not Phase.PENDING or pending is None:
        raise ActionRefusedError(
            f"run {state.run_id} is {state.phase}; no pending write to approve"
        )
    if pending.action_id != action_id:
        raise ActionRefusedError(
            f"run {state.run_id}'s pending action is {pending.action_id!r}, not {action_id!r}: "
            "the page is stale; look again"
        )
    signer = signer_for(signers, {"approver"}, "approve a write")
    check_trusted(signer, trust)
    body = new_approval(state, signer.signer_id, **_window(lifetime(ttl, state, policy)))
    return Prepared(
        state.run_id, "approval", body, signer.signer_id, state.generation, f"Approve {action_id}"
    )


def prepare_review(
    state: RunState,
    case_id: str,
    decision: str,
    signers: list[Signer],
    *,
    trust: TrustRoots | None,
    policy: Policy | None,
    ttl: float | None,
) -> Prepared:
    """A reviewer's ``decision`` on the open case ``case_id``."""
    case = next((c for c in state.review_cases if c.case_id == case_id), None)
    if state.phase is not Phase.NEEDS_REVIEW or case is None:
        raise ActionRefusedError(f"run {state.run_id} has no open review case {case_id!r}")
    if decision not in decisions():
        raise ActionRefusedError(f"unknown decision {decision!r}; one of {decisions()}")
    signer = signer_for(signers, {"reviewer"}, "decide a review")
    check_trusted(signer, trust)
    body = new_decision(
        state, case, signer.signer_id, decision, **_window(lifetime(ttl, state, policy))
    )
    return Prepared(
        state.run_id,
        "review_decision",
        body,
        signer.signer_id,
        state.generation,
        f"Decide {decision} on case {case_id}",
    )


def prepare_rewind(
    state: RunState,
    mark: Mark,
    target: int,
    reason: str,
    scope: str,
    signers: list[Signer],
    *,
    trust: TrustRoots | None,
    policy: Policy | None,
    ttl: float | None,
) -> Prepared:
    """A rewind of context and workspace to generation ``target`` (``tether rewind``'s document)."""
    if state.phase is not Phase.RUNNING:
        raise RewindRefusedError(
            f"run {state.run_id} is {state.phase}: only a running run is rewound (settle a "
            "pending write, or decide a review, first)",
            run_id=state.run_id,
        )
    if not 1 <= target < state.generation:
        raise RewindRefusedError(
            f"rewind to {target}: name an earlier generation (the run is at {state.generation})",
            run_id=state.run_id,
        )
    if not reason.strip():
        raise ActionRefusedError("a rewind needs a reason: it goes to the trace and the agent")
    if scope not in {"aligned", "files", "context"}:
        raise ActionRefusedError(f"unknown scope {scope!r}; aligned, files or context")
    roles = {"operator", "reviewer"} if policy is None else set(policy.authority.rewind) - {"agent"}
    signer = signer_for(signers, roles, "rewind a run")
    check_trusted(signer, trust)
    binding = state.binding
    if policy is not None:
        binding = replace(
            binding,
            policy_id=policy.policy_id,
            policy_version=policy.policy_version,
            policy_fingerprint=policy.fingerprint,
        )
    # The ttl is checked against the policy the document will be judged by.
    ttl_s = bounded(ttl, policy)
    request = admission_request(
        state,
        checkpoint_digest=mark.checkpoint_digest,
        policy=binding,
        purpose=Purpose.REWIND,
        target_generation=target,
        reason=reason.strip(),
        scope=scope,
    )
    body = new_admission(request, signer.signer_id, **_window(ttl_s))
    return Prepared(
        state.run_id,
        "rewind",
        body,
        signer.signer_id,
        state.generation,
        f"Rewind to generation {target}",
    )


def sign_and_deliver(
    store: SQLBase, prepared: Prepared, signers: list[Signer], trust: TrustRoots | None
) -> int:
    """Sign ``prepared.body`` with its signer's key and leave it in the run's inbox."""
    signer = next((s for s in signers if s.signer_id == prepared.signer_id), None)
    if signer is None:
        raise TetherError(f"no key for signer {prepared.signer_id!r}")
    document = signer.sign(prepared.body)
    if trust is not None:
        # What the runtime will do first: a document its roots refuse is not delivered.
        trust.verify(document, signer.role)
    return store.put_evidence(prepared.run_id, prepared.kind, document)
