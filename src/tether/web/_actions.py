"""The documents people sign from the page, by the operator layer's rules.

The page adds only what a form needs: which of the operator's keys signs
(the one whose role the action takes), the fields the form sent, and a
title. Building, signing and every refusal the runtime would make (a wrong
role, a key the trust roots lack, a lifetime over the policy's, a run that
moved since the person looked) are ``tether.runtime``'s ``prepare_*``, the
same the CLI calls. The signed document stays in this process until the
person confirms; then :func:`tether.runtime.deliver` leaves it in the inbox.
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tether.core import Policy, PolicyError, ReviewDecision
from tether.crypto import Signer, TrustRoots
from tether.runtime import (
    Prepared,
    RunView,
    prepare_approval,
    prepare_cancel,
    prepare_review,
    prepare_rewind,
    signer_roles,
)


class ActionRefusedError(PolicyError):
    """The page will not prepare this: no key of the role it takes, or a form it cannot read.

    Raised before anything is signed; the message says what to do instead.
    """


@dataclass(frozen=True, slots=True)
class Draft:
    """A signed document shown to the person, not yet delivered."""

    title: str
    prepared: Prepared


def decisions() -> list[str]:
    """Every review decision core knows (each case takes some: ``CaseEffect.decisions``)."""
    return [d.value for d in ReviewDecision]


#: What each decision does, in the words the page shows beside its button.
DECISION_HELP = {
    "landed": "You found it in the world: the ledger records it committed by you, with what "
    "you found; it is not sent again and the run goes on.",
    "not_landed": "It never arrived: it is sent once more, under the same key, and the run "
    "goes on (refused while the adapter, asked by key, holds it or still has it in flight).",
    "compensate": "It landed and must be undone: it is recorded committed by you and undone "
    "the way its kind declares (name what to undo).",
    "replan": "Set its key aside for good and let the run plan again from the world as it is.",
    "abort": "Fail the run; the ledger keeps what is known.",
    "accept": "Take the environment as observed and go on.",
}


def signer_for(signers: list[Signer], roles: AbstractSet[str], what: str) -> Signer:
    """The first of the operator's keys whose role may sign ``what``."""
    for signer in signers:
        if signer.role.value in roles:
            return signer
    held = ", ".join(f"{s.signer_id} ({s.role.value})" for s in signers) or "none"
    raise ActionRefusedError(
        f"to {what} the page needs a key of role {' or '.join(sorted(roles))}; "
        f"tether serve was given: {held}"
    )


def prepare(
    view: RunView,
    form: dict[str, str],
    signers: list[Signer],
    *,
    trust: TrustRoots | None,
    policy: Policy | None,
) -> Draft:
    """The document ``form`` asks for, built and checked by the operator layer, signed."""
    action = form.get("action", "")
    seen = _number(form.get("seen"), "seen generation")
    common: dict[str, Any] = {
        "now": datetime.now(UTC),
        "ttl_s": _number(form.get("ttl"), "ttl"),
        "trust": trust,
        "policy": policy,
        "seen_generation": None if seen is None else int(seen),
    }
    if action == "approve":
        signer = signer_for(signers, signer_roles("approval", view), "approve a write")
        action_id = form.get("action_id", "")
        prepared = prepare_approval(view, signer, action_id, **common)
        return Draft(f"Approve {action_id}", prepared)
    if action == "review":
        signer = signer_for(signers, signer_roles("review_decision", view), "decide a review")
        case_id, decision = form.get("case_id", ""), form.get("decision", "")
        if decision not in decisions():
            raise ActionRefusedError(f"unknown decision {decision!r}; one of {decisions()}")
        evidence = form.get("evidence", "").strip() or None
        prepared = prepare_review(view, signer, case_id, decision, evidence=evidence, **common)
        return Draft(f"Decide {decision} on case {case_id}", prepared)
    if action == "rewind":
        signer = signer_for(signers, signer_roles("rewind", view, policy), "rewind a run")
        target = _number(form.get("to"), "rewind target")
        if target is None or target != int(target):
            raise ActionRefusedError("rewind to: a generation number")
        scope = form.get("scope", "aligned")
        if scope not in {"aligned", "files", "context"}:
            raise ActionRefusedError(f"unknown scope {scope!r}; aligned, files or context")
        prepared = prepare_rewind(
            view, signer, int(target), form.get("reason", ""), scope=scope, **common
        )
        return Draft(f"Rewind to generation {int(target)}", prepared)
    if action == "cancel":
        signer = signer_for(signers, signer_roles("cancel", view, policy), "cancel a run")
        # A cancel binds no generation: it must land on a run that keeps moving.
        prepared = prepare_cancel(
            view, signer, form.get("reason", ""), **{**common, "seen_generation": None}
        )
        return Draft("Cancel the run", prepared)
    raise ActionRefusedError(f"unknown action {action!r}")


def _number(value: str | None, what: str) -> float | None:
    text = (value or "").strip()
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        raise ActionRefusedError(f"{what} {text!r} is not a number") from None
    if not math.isfinite(number):
        raise ActionRefusedError(f"{what} {text!r} is not a number")
    return number
