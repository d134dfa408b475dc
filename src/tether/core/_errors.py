"""One error root, shallow families, typed attributes.

Every message says what went wrong and, where it can, what to do next. No
message ever contains key material: errors name key *ids*, never secrets.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


class TetherError(Exception):
    """Root of every error tether raises on purpose."""


# --- input ---------------------------------------------------------------


class SpecError(TetherError):
    """A task spec, policy or scenario document is malformed.

    ``field`` is the dotted path of the offending field ("budgets.steps").
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class CanonicalJSONError(TetherError):
    """A document is not strict JSON (duplicate key, NaN, bad UTF-8...)."""


# --- integrity: restoring a checkpoint ------------------------------------


class IntegrityError(TetherError):
    """A checkpoint failed a restore check; nothing was loaded."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        self.run_id = run_id
        super().__init__(message)


class CheckpointCorruptError(IntegrityError):
    """The bytes are not a well-formed envelope, or its checksum is wrong."""


class SignatureError(IntegrityError):
    """The checksum is intact but the HMAC does not verify: tampering."""


class UnknownKeyError(IntegrityError):
    """The envelope names a key id the keyring does not hold.

    ``held`` is the key ids the keyring does hold and ``source`` where it was
    read from (a path, a variable's name), when known: never a secret.
    """

    def __init__(
        self,
        key_id: str,
        *,
        run_id: str | None = None,
        held: tuple[str, ...] | None = None,
        source: str | None = None,
    ) -> None:
        self.key_id = key_id
        self.held = held
        self.source = source
        super().__init__(
            f"checkpoint signed with unknown key id {key_id!r}" + _keyring_hint(held, source),
            run_id=run_id,
        )


class WrongKeyError(IntegrityError):
    """The keyring holds a different key under the envelope's key id."""

    def __init__(
        self,
        key_id: str,
        *,
        run_id: str | None = None,
        held: tuple[str, ...] | None = None,
        source: str | None = None,
    ) -> None:
        self.key_id = key_id
        self.held = held
        self.source = source
        super().__init__(
            f"key id {key_id!r} in the keyring is not the key that signed this checkpoint"
            + _keyring_hint(held, source),
            run_id=run_id,
        )


def _keyring_hint(held: tuple[str, ...] | None, source: str | None) -> str:
    """Which keyring was used, and what to do: give the runtime the one that sealed the run."""
    if held is None and source is None:
        return ""
    where = "this keyring" if source is None else f"the keyring from {source}"
    holds = "" if held is None else f" holds {list(held)}"
    return (
        f"; {where}{holds}: give the runtime the keyring the run was sealed with "
        "(Runtime(keyring=...), $TETHER_KEYRING_FILE or --keyring FILE)"
    )


class RetiredKeyError(IntegrityError):
    """The envelope's key id is retired: its signatures are no longer trusted."""

    def __init__(self, key_id: str, *, run_id: str | None = None) -> None:
        self.key_id = key_id
        super().__init__(f"checkpoint signed with retired key id {key_id!r}", run_id=run_id)


class SchemaVersionError(IntegrityError):
    """The payload's schema version is not one this code reads."""


class UnknownFieldError(IntegrityError):
    """The payload carries a field this schema does not define (or lacks one)."""

    def __init__(self, field: str, problem: str, *, run_id: str | None = None) -> None:
        self.field = field
        super().__init__(f"checkpoint field {field}: {problem}", run_id=run_id)


class BindingMismatchError(IntegrityError):
    """The checkpoint belongs to another task, policy or scenario than the caller named.

    ``changes`` says what differs between the two documents, field by field,
    when the store still holds the one the run was made under.
    """

    def __init__(
        self,
        what: str,
        expected: Any,
        actual: Any,
        *,
        run_id: str | None = None,
        changes: tuple[str, ...] = (),
    ) -> None:
        self.what = what
        self.expected = expected
        self.actual = actual
        self.changes = changes
        document = what.split(maxsplit=1)[0]  # "task", "policy" or "scenario"
        lines = [
            f"{what} mismatch: caller expects {expected!r}, checkpoint has {actual!r}"
            + ("" if run_id is None else f" (run {run_id})")
        ]
        if changes:
            lines.append(f"what changed in the {document} since the run started:")
            lines += [f"  {change}" for change in changes]
        lines.append(
            f"a run goes on only under the {document} it was started with: give the runtime "
            f"that {document} again, or start the changed one under a new run id"
            + ("" if run_id is None else f" (`tether inspect {run_id}` shows the run's)")
        )
        super().__init__("\n".join(lines), run_id=run_id)


class TaskMismatchError(BindingMismatchError):
    """The checkpoint was made for another task id or task version."""


class PolicyMismatchError(BindingMismatchError):
    """The checkpoint was made under another policy id or policy version."""


class ScenarioMismatchError(BindingMismatchError):
    """The checkpoint was made for another scenario (initial environment, verifier)."""


class StaleCheckpointError(IntegrityError):
    """The checkpoint's generation is not the store's high-water mark: a rollback."""

    def __init__(self, run_id: str, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"run {run_id}: checkpoint generation {actual} is not the high-water mark {expected}",
            run_id=run_id,
        )


class StaleMarkError(IntegrityError):
    """The content store holds checkpoints beyond the mark's next generation: the mark was rolled back."""

    def __init__(self, run_id: str, mark: int, newest: int) -> None:
        self.expected = newest
        self.actual = mark
        super().__init__(
            f"run {run_id}: the high-water mark is at generation {mark} but the content store "
            f"holds generation {newest}; the mark was put back (only one generation past the "
            "mark can be an orphan of a crash)",
            run_id=run_id,
        )


class MissingHighWaterMarkError(IntegrityError):
    """The generation store has no mark for the run: refuse rather than guess."""

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"run {run_id}: the generation store holds no high-water mark; refusing to restore",
            run_id=run_id,
        )


class EnvironmentDriftError(IntegrityError):
    """The live environment is neither the checkpointed state nor its one pending successor.

    ``expected`` and ``actual`` are the two environments (namespace, instance,
    version, fingerprint); the message shows both, whole, and ``hint`` says
    what to do.
    """

    def __init__(
        self,
        message: str,
        *,
        expected: Any = None,
        actual: Any = None,
        hint: str = "",
        run_id: str | None = None,
    ) -> None:
        self.expected = expected
        self.actual = actual
        self.hint = hint
        lines = [message]
        for label, env in (("expected", expected), ("found", actual)):
            if env is not None:
                lines.append(f"  {label + ':':<10}{_environment_text(env)}")
        if hint:
            lines.append(hint)
        super().__init__("\n".join(lines), run_id=run_id)


def _environment_text(env: Any) -> str:
    """An environment as one line: every field it has, the fingerprint whole."""
    to_json = getattr(env, "to_json", None)
    if callable(to_json):
        env = to_json()
    if not isinstance(env, dict):
        return repr(env)
    names = ("namespace", "instance_id", "version", "state_fingerprint", "fingerprint")
    shown = [f"{name}={env[name]}" for name in names if name in env]
    shown += [f"{name}={value}" for name, value in sorted(env.items()) if name not in names]
    return " ".join(shown)


class LedgerIntegrityError(IntegrityError):
    """The effect ledger does not chain to the head the signed checkpoint pins."""


class TraceIntegrityError(IntegrityError):
    """The trace is not one unbroken chain ending at the head the signed checkpoint pins."""


class InvariantError(IntegrityError):
    """Run state violates a cross-object invariant; it is never committed or loaded."""


# --- store ---------------------------------------------------------------


class StoreError(TetherError):
    """The store refused or failed an operation."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached or opened; the driver error is chained."""


class CommitOutcomeUnknownError(StoreUnavailableError):
    """The connection was lost after a write was sent: it may or may not have landed.

    Nothing may act on the run until its state is read back from the store
    (:meth:`~tether.runtime.RunSession.reload` does that; a worker recovers
    the run anew). ``generation`` and ``checkpoint_digest`` name the
    checkpoint that was being committed, where known.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        generation: int | None = None,
        checkpoint_digest: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.generation = generation
        self.checkpoint_digest = checkpoint_digest
        super().__init__(message)


class EffectUnrecordedError(StoreError):
    """An effect was carried out, but its receipt could not be recorded: it may have happened.

    The adapter (or a function effect's body) answered with a receipt, then
    the commit that records it failed (the store unavailable, the lease lost
    to another worker, a commit whose outcome is unknown). The run's durable
    ledger still says ``dispatched`` under ``idempotency_key``, so nothing
    is lost: calling again in the same block records the receipt this
    process holds; any recovery settles the write by its key (a look-up, a
    same-key resend where the callee deduplicates) or sends it to review.
    Never make the effect again under a new key. ``result`` is the
    receipt's result as the adapter returned it; ``__cause__`` the commit's
    error.
    """

    def __init__(
        self,
        *,
        run_id: str,
        kind: str,
        target: str,
        idempotency_key: str,
        result: dict[str, Any] | None,
        cause: BaseException,
    ) -> None:
        self.run_id = run_id
        self.kind = kind
        self.target = target
        self.idempotency_key = idempotency_key
        self.result = result
        super().__init__(
            f"run {run_id}: {kind} under key {idempotency_key} was carried out (the adapter "
            f"returned its receipt), but the receipt could not be recorded "
            f"({type(cause).__name__}: {cause}); the effect may have happened. The run's "
            "ledger says dispatched: call again in this block to record it, or recover the run "
            "(it is settled by its key, or goes to review); never send it under a new key"
        )


class GenerationConflictError(StoreError):
    """A compare-and-set on the generation lost: someone else advanced the run."""

    def __init__(self, run_id: str, expected: int, actual: int | None) -> None:
        self.run_id = run_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"run {run_id}: expected generation {expected}, store has {actual}; reload and retry"
        )


class RunExistsError(StoreError):
    """A run with this id already exists."""


class RunNotFoundError(StoreError):
    """The store has no run with this id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in this store")


class WriteOnceError(StoreError):
    """Content already written for this address differs: write-once was violated."""


class MigrationError(StoreError):
    """The database schema is newer than this code, or a migration failed."""


# --- leases --------------------------------------------------------------


class LeaseError(TetherError):
    """The caller does not hold the run's lease (or it moved on)."""

    def __init__(self, run_id: str, expected: int, actual: int | None) -> None:
        self.run_id = run_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"run {run_id}: lease version {expected} is not current ({actual}); stop working on it"
        )


# --- policy / contract ---------------------------------------------------


class PolicyError(TetherError):
    """The runtime refused an input under the task's contract or policy."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        self.run_id = run_id
        super().__init__(message)


class ContractViolationError(PolicyError):
    """A proposal failed the contract gate (schema, scope, permission, risk, ...)."""

    def __init__(self, reason: str, message: str, *, run_id: str | None = None) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {message}", run_id=run_id)


class BudgetExhaustedError(PolicyError):
    """A budget ran out; the run has moved to failed."""


class RunTerminalError(PolicyError):
    """The run is completed, failed or cancelled and refuses all further input."""


class RunBusyError(PolicyError):
    """The run is open already: in this process (another block, task or thread acts
    on it), or in another live process that opened it without a lease.

    Two blocks on one run in one process would race each other's steps (and,
    with leases, share one worker's lease): the second is refused before it
    recovers anything, so the first goes on undisturbed. Wait for the first
    block to end, or make the call through it. A second process is refused
    the same way while the first lives (its hold on the run dies with it, so
    a rerun after a crash opens the run at once); where several processes
    may work on one run, give every runtime ``lease_ttl_s=``. ``run_id`` names
    the run.
    """


class RunFrozenError(PolicyError):
    """The run is in needs_review: no proposal or execution until a signed decision."""


class NeedsReviewError(RunFrozenError):
    """An effect's call froze the run for a person (an unknown outcome, a conflict).

    ``case_id``, ``reason`` and ``detail`` name the open review case; nothing
    is sent until a signed decision (``tether review``) settles it.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        case_id: str | None = None,
        reason: str | None = None,
        detail: str = "",
    ) -> None:
        self.case_id = case_id
        self.reason = reason
        self.detail = detail
        super().__init__(message, run_id=run_id)


class EffectRejectedError(ContractViolationError):
    """The gate or the adapter refused an effect's call; nothing was sent.

    ``reason`` is the same stable word an :class:`~tether.core.Outcome` of a
    rejected step carries.
    """


class NotInRunError(PolicyError):
    """An effect was called outside a run: it is refused, never performed unguarded."""


class IllegalTransitionError(PolicyError):
    """A phase or effect-status move that the transition table does not allow."""


class VerificationRequiredError(PolicyError):
    """Completion needs a passing verifier event at the final environment version."""


# --- evidence: approvals and reviewer decisions --------------------------


class EvidenceError(PolicyError):
    """Signed evidence (an approval or a reviewer decision) was refused; nothing changed."""


class UnknownSignerError(EvidenceError):
    """The signer is not a trusted root for this role."""

    def __init__(self, signer_id: str, role: str, *, hint: str = "") -> None:
        self.signer_id = signer_id
        self.role = role
        super().__init__(f"{signer_id!r} is not a trusted {role}" + (f"; {hint}" if hint else ""))


class EvidenceSignatureError(EvidenceError):
    """The evidence is malformed or its signature does not verify: tampered."""


class EvidenceBindingError(EvidenceError):
    """The evidence is bound to another run, task, policy, action, key, intent or state."""

    def __init__(self, field: str, expected: Any, actual: Any) -> None:
        self.field = field
        self.expected = expected
        self.actual = actual
        super().__init__(f"evidence field {field}: bound to {actual!r}, the run needs {expected!r}")


class ApprovalExpiredError(EvidenceError):
    """The approval's expiry has passed on the runtime's clock; a fresh one is needed."""


class NonceReusedError(EvidenceError):
    """The evidence's one-time nonce was consumed before."""


class ApprovalRequiredError(PolicyError):
    """The pending write needs a valid approval before it may execute.

    ``request`` holds the fields a person's approval must carry (see
    :func:`~tether.core.approval_request`): sign them, deliver the document,
    and call again; the write waits, durable, with its key.
    ``for_this_call`` is false when the write waiting (``action_id``) is
    another one than the call that raised: that call waits behind it.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        action_id: str | None = None,
        request: dict[str, Any] | None = None,
        for_this_call: bool = True,
    ) -> None:
        self.action_id = action_id
        self.request = dict(request or {})
        self.for_this_call = for_this_call
        super().__init__(message, run_id=run_id)


class ReviewDriftError(EvidenceError):
    """The environment or the adapter's receipt changed since the decision was signed."""


class DecisionRefusedError(EvidenceError):
    """A reviewer's decision does not fit the case it was signed for; the case stays frozen.

    Each kind of case has its own ways out (see
    ``tether.core.case_rules.settlement``): ``landed`` and ``not_landed``
    settle a write whose outcome is unknown, ``accept`` a drift of the
    environment, ``compensate`` an effect whose kind declares an undo.
    ``case_id`` and ``reason`` name the case, ``decision`` what was signed,
    ``fits`` the decisions the case takes. ``found``: what the adapter,
    asked by the case's key, reported that contradicts the decision
    (``landed``, ``in_flight``, ``unreachable``, or ``unsearched``: its
    absence proves nothing now and the decision named no search; ``""``
    where the adapter was not the reason): a ``not_landed`` is refused while
    the write landed or may still land, or nobody can say it did not.
    """

    def __init__(
        self,
        message: str,
        *,
        case_id: str,
        reason: str,
        decision: str,
        fits: tuple[str, ...] = (),
        found: str = "",
    ) -> None:
        self.case_id = case_id
        self.reason = reason
        self.decision = decision
        self.fits = fits
        self.found = found
        super().__init__(message)


class AcceptRefusedError(DecisionRefusedError):
    """A reviewer's ``accept`` was signed for a case it cannot close.

    ``accept`` takes the environment as observed and goes on; it is for a
    case about drift alone. A case that names a write (its outcome unknown,
    a conflict, a receipt the ledger lacks) needs another way out (``landed``,
    ``not_landed``, ``replan`` with its key quarantined, or ``abort``):
    accepting would hide what that write did.
    """

    def __init__(
        self, message: str, *, case_id: str, reason: str, fits: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, case_id=case_id, reason=reason, decision="accept", fits=fits)


class CancelRefusedError(EvidenceError):
    """A signed cancel cannot end the run as it is now (frozen: a reviewer's abort ends it)."""


class AdmissionRefusedError(PolicyError):
    """A recovery or rewind was not admitted: one of its five bindings does not hold now.

    ``binding`` names which: ``checkpoint``, ``epoch``, ``principal``,
    ``policy``, ``effects``, ``run`` (task, run or a run that is over) or
    ``document`` (malformed, expired, replayed). Nothing changed.
    """

    def __init__(
        self,
        binding: str,
        message: str,
        *,
        run_id: str | None = None,
        expected: Any = None,
        actual: Any = None,
    ) -> None:
        self.binding = binding
        self.expected = expected
        self.actual = actual
        super().__init__(f"admission refused ({binding}): {message}", run_id=run_id)


class TrustRootsRequiredError(IntegrityError):
    """The checkpoint carries signed evidence but no trust roots were given to check it."""


# --- adapter -------------------------------------------------------------


class AdapterError(TetherError):
    """An adapter refused or failed an operation."""


class PreconditionFailedError(AdapterError):
    """A conditional write found the target in another state than expected."""

    def __init__(self, target: str, expected: str, actual: str) -> None:
        self.target = target
        self.expected = expected
        self.actual = actual
        super().__init__(f"{target}: expected content {expected}, found {actual}")


class IdempotencyConflictError(AdapterError):
    """The adapter holds a receipt for this key with a different intent digest."""

    def __init__(self, key: str, expected_digest: str, receipt: Any) -> None:
        self.key = key
        self.expected_digest = expected_digest
        self.receipt = receipt
        super().__init__(
            f"idempotency key already used for intent {receipt.intent_digest}, "
            f"not {expected_digest}"
        )


class AdapterUnavailableError(AdapterError):
    """The adapter could not be reached; the outcome of an in-flight write is unknown."""


class LookupInconclusiveError(AdapterError):
    """A look-up was answered, but not in the shape its declaration says proves anything.

    Neither a receipt nor proof of absence: a ``404`` that is not the look-up
    route's declared "no record" answer (a "no such route" page), a redirect,
    a record for another key. A write whose outcome hangs on it goes to a
    person (or, where a same-key resend is declared safe, is sent again under
    its key); it is never read as "nothing landed". Fix the profile's look-up
    declaration if the service answers another way.
    """


class EffectNotSettledError(AdapterError):
    """The call's effect was not carried out this time: call again.

    ``reason`` says why: ``in_flight`` (an earlier attempt is still running)
    or ``adapter_unavailable`` (nothing was sent, nothing moved), or
    ``settled_earlier_work`` (the step settled earlier work first, such as a
    person's decision or a write a crash left pending; nothing was sent for
    this call).
    """

    def __init__(self, reason: str, message: str, *, run_id: str | None = None) -> None:
        self.reason = reason
        self.run_id = run_id
        super().__init__(f"{reason}: {message}")


class VerifierRefusedError(AdapterError):
    """The verifier command is not on the adapter's allowlist."""


# --- leases: the typed cases ---------------------------------------------
#
# Each subclass sets the attributes of ``LeaseError`` (run_id, expected,
# actual) so code that catches the family keeps working, and adds what the
# case itself knows. Times are the store's clock, never the caller's.


class LeaseLostError(LeaseError):
    """The caller's lease version is no longer current: another worker took the run over,
    or the lease was released. Stop working on the run; do not retry with the old version.

    ``expected`` is the caller's version, ``actual`` the store's (``None`` when the
    run has no mark), ``owner`` the current holder, if any.
    """

    def __init__(
        self, run_id: str, expected: int, actual: int | None, owner: str | None = None
    ) -> None:
        self.run_id = run_id
        self.expected = expected
        self.actual = actual
        self.owner = owner
        if actual == expected:
            # Let go by its worker, or by an operator's `tether resume` once it expired.
            why = "was let go (released, or resumed by an operator after it expired)"
        else:
            holder = f" held by {owner!r}" if owner is not None else ""
            why = f"was superseded by version {actual}{holder}"
        TetherError.__init__(
            self, f"run {run_id}: lease version {expected} {why}; stop working on this run"
        )


class LeaseExpiredError(LeaseError):
    """The caller still holds the current lease version, but it expired by the store's clock.

    Nobody has taken the run over yet: renew the lease before acting again.
    ``expected`` and ``actual`` are both the lease version.
    """

    def __init__(self, run_id: str, lease_version: int, expires_at: datetime) -> None:
        self.run_id = run_id
        self.expected = lease_version
        self.actual = lease_version
        self.expires_at = expires_at
        TetherError.__init__(
            self,
            f"run {run_id}: lease version {lease_version} expired at {expires_at.isoformat()} "
            "(store clock); renew it before acting",
        )


class LeaseHeldError(LeaseError):
    """Another worker holds a live lease on the run; try another run or wait for expiry.

    ``owner``, ``lease_version`` and ``expires_at`` describe the holder's lease;
    ``expected`` and ``actual`` are both its version.
    """

    def __init__(self, run_id: str, owner: str, lease_version: int, expires_at: datetime) -> None:
        self.run_id = run_id
        self.expected = lease_version
        self.actual = lease_version
        self.owner = owner
        self.lease_version = lease_version
        self.expires_at = expires_at
        TetherError.__init__(
            self,
            f"run {run_id}: lease version {lease_version} is held by {owner!r} until "
            f"{expires_at.isoformat()} (store clock); try another run or wait",
        )
