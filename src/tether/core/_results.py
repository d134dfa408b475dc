"""A step's results: what the agent's next observation carries, stored by content.

A step that took a non-mutating action (or was refused, or replayed) hands
its result on in a results blob named by digest in the signed state, so the
agent sees it after a recovery as well; the newest outcome of what the agent
asked for is kept in the state as its ``last_outcome``.
"""

from __future__ import annotations

from dataclasses import replace

from tether.core._actions import ActionResult
from tether.core._canonical import canonical_bytes, digest_bytes, strict_loads
from tether.core._errors import CanonicalJSONError, CheckpointCorruptError
from tether.core._fields import Fields
from tether.core._model import LastOutcome
from tether.core._state import RunState
from tether.core._transition import OutcomeKind, Transition


def encode_results(results: tuple[ActionResult, ...]) -> tuple[str, bytes]:
    """``(digest, canonical bytes)`` of a step's results, as stored by content."""
    body = canonical_bytes([r.to_json() for r in results])
    return digest_bytes(body), body


def decode_results(expected_digest: str, body: bytes) -> tuple[ActionResult, ...]:
    """Parse stored results, refusing bytes whose digest is not ``expected_digest``."""
    if digest_bytes(body) != expected_digest:
        raise CheckpointCorruptError(f"action results {expected_digest} do not match their bytes")
    try:
        doc = strict_loads(body)
    except CanonicalJSONError as exc:
        raise CheckpointCorruptError(f"action results are not JSON: {exc}") from exc
    if not isinstance(doc, list):
        raise CheckpointCorruptError("action results: expected a list")

    def error(fld: str, problem: str) -> Exception:
        return CheckpointCorruptError(f"action results {fld}: {problem}")

    return tuple(ActionResult.parse(Fields(item, f"[{i}]", error)) for i, item in enumerate(doc))


def with_result(
    state: RunState, result: ActionResult
) -> tuple[RunState, tuple[tuple[str, bytes], ...]]:
    """``state`` naming ``result`` as the agent's next result, and the blob that holds it."""
    results_digest, body = encode_results((result,))
    return state.evolve(results_digest=results_digest), ((results_digest, body),)


#: Outcomes that end what the agent asked for (or say why it has not ended):
#: the agent's next observation carries the newest one.
NOTED_OUTCOMES = frozenset(
    {
        OutcomeKind.EXECUTED,
        OutcomeKind.REPLAYED,
        OutcomeKind.REJECTED,
        OutcomeKind.WAITING_FOR_APPROVAL,
        OutcomeKind.FROZEN,
        OutcomeKind.FAILED,
        OutcomeKind.CANCELLED,
        OutcomeKind.VERIFIER_FAILED,
        OutcomeKind.OBSERVED,
    }
)


def note_outcome(transition: Transition) -> Transition:
    """``transition`` whose committed state records its outcome as the run's last.

    Kind, reason word and message come from the transition; the output is
    the tail a verifier or test run printed (from the step's results). An
    outcome that is only a stage on the way (a write made durable, an
    approval recorded) leaves the last one as it was.
    """
    state = transition.state
    if state is None or transition.outcome not in NOTED_OUTCOMES:
        return transition
    action_id = next(
        (
            data["action_id"]
            for _, data in transition.events
            if isinstance(data.get("action_id"), str)
        ),
        None,
    )
    output = ""
    wanted = state.results_digest
    body = None if wanted is None else dict(transition.blobs).get(wanted)
    if wanted is not None and body is not None:
        for result in decode_results(wanted, body):
            tail = result.data.get("output_tail")
            if isinstance(tail, str):
                output = tail
    outcome = LastOutcome.bounded(
        transition.outcome.value,
        action_id=action_id,
        reason=transition.reason,
        message=transition.message,
        output=output,
    )
    return replace(transition, state=state.evolve(last_outcome=outcome))
