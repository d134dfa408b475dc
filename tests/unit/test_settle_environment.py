"""Which settle steps read the environment: the rule says so (``ReadEnvironment``), never the session.

Every settle rule is run, on every cell of capabilities x signed status x
approval x policy verdict x adapter answer, first with no environment and
then with each environment a cell can meet. A rule asks for the environment
exactly where it decides the step (a freeze records it in its case; the
approval gate judges against it), and then commits nothing; anywhere else
its answer is the same whatever the world holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests._states import pending_state, pending_write
from tether.core import (
    Capabilities,
    EffectStatus,
    EnvironmentState,
    Execute,
    ExecuteAnswer,
    ExecuteStatus,
    Facts,
    Intent,
    LookupAnswer,
    LookupStatus,
    OutcomeKind,
    Phase,
    ReadEnvironment,
    Receipt,
    Rejection,
    RunState,
    Transition,
    format_time,
    settle_rules,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
PRE = EnvironmentState("ns", "inst", 3, "sha256:" + "a" * 64)
POST = EnvironmentState("ns", "inst", 4, "sha256:" + "b" * 64)
OTHER = EnvironmentState("ns", "inst", 4, "sha256:" + "c" * 64)
INTENT = Intent("file.write", "a.txt", {"content": "x"}, "low")
KEY = "idem-1"
LIVES = (PRE, POST, OTHER)

CAPS = [
    Capabilities(idempotent=i, queryable=q, conditional_writes=True, absent_is_final=f)
    for i, q, f in itertools.product([False, True], repeat=3)
]
FORBIDDEN = {"allowed": None, "forbidden": Rejection("risk", "the policy in force forbids it")}


def receipt(*, intent_digest: str | None = None, post: EnvironmentState = POST) -> Receipt:
    return Receipt(
        namespace="ns",
        adapter_version="1",
        receipt_id="rcpt-1",
        idempotency_key=KEY,
        intent_digest=intent_digest or INTENT.digest,
        result={"ok": True},
        business_object_id="a.txt",
        committed_at=format_time(NOW - timedelta(seconds=5)),
        post_state=post,
    )


def held(status: EffectStatus, approval: str) -> RunState:
    approvals: tuple[dict[str, Any], ...] = ()
    if approval in {"valid", "expired"}:
        expires = NOW + timedelta(minutes=5) if approval == "valid" else NOW - timedelta(seconds=1)
        approvals = (
            {
                "body": {
                    "state_fingerprint": PRE.state_fingerprint,
                    "environment_instance_id": PRE.instance_id,
                    "expires_at": format_time(expires),
                    "nonce": "n" * 16,
                }
            },
        )
    pending = pending_write(
        INTENT, prestate=PRE, expected_post=POST, at=NOW, status=status, approvals=approvals
    )
    return pending_state(pending, at=NOW)


LOOKUPS = [
    LookupAnswer(LookupStatus.COMMITTED, receipt()),
    LookupAnswer(LookupStatus.COMMITTED, receipt(intent_digest="sha256:" + "d" * 64)),
    LookupAnswer(LookupStatus.COMMITTED, receipt(post=OTHER)),
    LookupAnswer(LookupStatus.ABSENT),
    LookupAnswer(LookupStatus.IN_PROGRESS, detail="busy"),
    LookupAnswer(LookupStatus.UNAVAILABLE, detail="down"),
    LookupAnswer(LookupStatus.REFUSED, detail="400"),
]
EXECUTES = [
    ExecuteAnswer(ExecuteStatus.COMMITTED, receipt()),
    ExecuteAnswer(ExecuteStatus.CONFLICT, receipt(intent_digest="sha256:" + "d" * 64)),
    ExecuteAnswer(ExecuteStatus.PRECONDITION_FAILED, detail="changed"),
    ExecuteAnswer(ExecuteStatus.IN_PROGRESS, detail="busy"),
    ExecuteAnswer(ExecuteStatus.UNAVAILABLE, detail="down"),
]

Rule = Callable[[RunState, Facts], Transition]

RULES: list[tuple[str, Rule]] = [
    ("settle", settle_rules.settle),
    ("dispatch", settle_rules.dispatch),
    ("send_again", settle_rules.send_again),
    *[
        (f"after_lookup:{a.status}", lambda s, f, a=a: settle_rules.after_lookup(s, f, a))
        for a in LOOKUPS
    ],
    *[
        (
            f"after_execute:{a.status}:{'retry' if retry else 'first'}",
            lambda s, f, a=a, r=retry: settle_rules.after_execute(
                s, f, Execute(KEY, INTENT, PRE, retry=r), a
            ),
        )
        for a in EXECUTES
        for retry in (False, True)
    ],
    ("cancel_pending:unaskable", lambda s, f: settle_rules.cancel_pending(s, f, None)),
    *[
        (f"cancel_pending:{a.status}", lambda s, f, a=a: settle_rules.cancel_pending(s, f, a))
        for a in LOOKUPS
    ],
]


@pytest.mark.parametrize("caps", CAPS, ids=repr)
@pytest.mark.parametrize("status", [EffectStatus.INTENDED, EffectStatus.DISPATCHED])
@pytest.mark.parametrize("approval", ["not_needed", "valid", "missing", "expired"])
@pytest.mark.parametrize("verdict", sorted(FORBIDDEN))
def test_a_rule_reads_the_environment_exactly_where_it_decides_the_step(
    caps: Capabilities, status: EffectStatus, approval: str, verdict: str
) -> None:
    """Asked only for a freeze or the approval gate, committing nothing; else blind to the world."""
    state = held(status, approval)
    blind = Facts(
        now=NOW,
        live=None,
        needs_approval=approval != "not_needed",
        case_id="case-1",
        capabilities=caps,
        namespace="ns",
        forbidden=FORBIDDEN[verdict],
    )
    for name, rule in RULES:
        asked = rule(state, blind)
        seen = {live: rule(state, replace(blind, live=live)) for live in LIVES}
        for live, decided in seen.items():
            assert not isinstance(decided.call, ReadEnvironment), name  # given, never asked again
            if decided.outcome is OutcomeKind.FROZEN and decided.state is not None:
                # The case records the world as it was read for it.
                assert decided.state.review_cases[-1].environment == live, name
        if isinstance(asked.call, ReadEnvironment):
            assert (asked.state, asked.events, asked.ledger) == (None, (), ()), name
            frozen = all(d.outcome is OutcomeKind.FROZEN for d in seen.values())
            assert frozen or blind.needs_approval, name
        else:
            assert all(d == asked for d in seen.values()), name
            assert asked.state is None or asked.state.phase is not Phase.NEEDS_REVIEW, name
