"""A gated tool approved by the person in the MCP client (elicitation), signed in the gateway.

The client is the official SDK's ``mcp.Client`` with an elicitation callback
(the person), in both protocol eras: 2026-07-28, where the gateway answers
``InputRequiredResult`` and the client calls again with the answer, and
2025-11-25, where the gateway sends ``elicitation/create`` inside the open
call. The gateway is ``python -m tether.cli mcp --approver-key ...`` over
stdio; its upstream counts effects as rows in its own SQLite file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")

from mcp import Client

from tests.integration._mcp_kit import Setup, document, text
from tether.cli import main as tether_main
from tether.crypto import Keyring
from tether.runtime import open_run
from tether.store import open_store

pytestmark = pytest.mark.slow


def new_key(keys: Path, role: str, signer_id: str) -> None:
    """``tether keys new``: a private key and its trust file in ``keys``."""
    made = tether_main(["keys", "new", "--role", role, "--id", signer_id, "--out", str(keys)])
    assert made == 0


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    """A gateway whose policy gates add_note, given an approver's key and the trust naming it."""
    Keyring.generate("k1").write_file(tmp_path / "keyring.json")
    keys = tmp_path / "keys"
    new_key(keys, "approver", "alice")
    found = Setup(tmp_path)
    found.trust = keys / "alice.trust.json"
    found.approver_key = keys / "alice.key"
    found.policy = {"reads": ["count_notes"], "tools": {"add_note": {"needs_approval": True}}}
    return found


class Person:
    """The person at the client: answers each question as told, and remembers what was asked."""

    def __init__(self, *answers: types.ElicitResult) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def __call__(self, ctx: Any, params: Any) -> types.ElicitResult:
        self.asked.append(params.message)
        return self.answers.pop(0)


YES = types.ElicitResult(action="accept", content={"approve": True})
UNTICKED = types.ElicitResult(action="accept", content={"approve": False})
DECLINE = types.ElicitResult(action="decline")


def meta(result: Any) -> dict[str, Any]:
    return document(result)["_meta"]["tether/call"]


def inbox_signers(setup: Setup) -> list[tuple[str, str | None, str]]:
    """(kind, signer, status) of every document in the run's inbox."""
    store = open_store(setup.store)
    try:
        view = open_run(store, setup.run_id, keyring=Keyring.from_file(setup.keyring))
    finally:
        store.close()
    return [(item.kind, item.signer, item.status) for item in view.inbox]


async def session(setup: Setup, person: Person | None, mode: str, *calls: str) -> list[Any]:
    """One client session (``mode``: the SDK's protocol choice) making ``add_note`` calls."""
    answers = []
    async with Client(
        setup.gateway(), read_timeout_seconds=60, elicitation_callback=person, mode=mode
    ) as client:
        for note in calls:
            answers.append(await client.call_tool("add_note", {"text": note}))
    return answers


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_gated_call_approved_in_the_client_is_signed_and_sent_once(
    setup: Setup, mode: str
) -> None:
    """The person says yes in the client: the approval is signed as alice and delivered, the call is sent once, and asked again it is replayed under that approval."""
    person = Person(YES)
    first, again = anyio.run(session, setup, person, mode, "pay the rent", "pay the rent")
    assert not first.is_error, text(first)
    assert first.structured_content == {"id": 1, "text": "pay the rent"}
    assert meta(first)["outcome"] == "executed"
    assert meta(first)["approved_in_client"] == "alice"
    # The person read the call, its arguments and the run before saying yes.
    assert "add_note" in person.asked[0] and "pay the rent" in person.asked[0]
    assert setup.run_id in person.asked[0] and "alice" in person.asked[0]
    # The replay of a gated tool stands on the approval still in force (tether's rule):
    # nobody is asked again, and nothing is sent.
    assert len(person.asked) == 1
    assert meta(again)["outcome"] == "replayed"
    assert again.structured_content == first.structured_content
    assert setup.rows() == 1
    assert inbox_signers(setup) == [("approval", "alice", "applied")]


@pytest.mark.parametrize("answer", [DECLINE, UNTICKED], ids=["declined", "unticked"])
def test_a_call_the_person_does_not_approve_in_the_client_is_not_sent(
    setup: Setup, answer: types.ElicitResult
) -> None:
    """The person declines (or leaves approve unticked): nothing is signed or sent, and the call still waits for tether approve."""
    person = Person(answer)
    (refused,) = anyio.run(session, setup, person, "auto", "buy a boat")
    assert refused.is_error
    assert meta(refused)["waits_for"] == "approval"
    assert meta(refused)["asked_in_client"] == answer.action
    assert "did not approve" in text(refused) and "tether approve" in text(refused)
    assert setup.rows() == 0
    assert inbox_signers(setup) == []
    # A person may still approve it the usual way.
    action = meta(refused)["action_id"]
    approve = ["approve", setup.run_id, action, "--store", setup.store, "--yes"]
    assert tether_main([*approve, "--key", str(setup.approver_key)]) == 0
    (sent,) = anyio.run(session, setup, None, "auto", "buy a boat")
    assert not sent.is_error, text(sent)
    assert setup.rows() == 1


def test_a_client_without_elicitation_gets_todays_answer(setup: Setup) -> None:
    """A client that does not fill in forms is answered that the call waits for tether approve; nothing is signed."""
    (waiting,) = anyio.run(session, setup, None, "auto", "pay the rent")
    assert waiting.is_error and "tether approve" in text(waiting)
    assert meta(waiting)["waits_for"] == "approval"
    assert "asked_in_client" not in meta(waiting)
    assert setup.rows() == 0
    assert inbox_signers(setup) == []


def test_a_gateway_without_an_approver_key_never_asks_the_client(tmp_path: Path) -> None:
    """Without --approver-key a client that fills in forms is never asked: the call waits for tether approve."""
    Keyring.generate("k1").write_file(tmp_path / "keyring.json")
    keys = tmp_path / "keys"
    new_key(keys, "approver", "bob")
    setup = Setup(tmp_path)
    setup.trust = keys / "bob.trust.json"
    setup.policy = {"tools": {"add_note": {"needs_approval": True}}}
    person = Person(YES)
    (waiting,) = anyio.run(session, setup, person, "auto", "pay the rent")
    assert waiting.is_error and meta(waiting)["waits_for"] == "approval"
    assert person.asked == []
    assert setup.rows() == 0


@pytest.mark.parametrize(
    ("role", "trusted", "said"),
    [
        ("reviewer", True, "takes an approver's key"),
        ("approver", False, "does not trust"),
        ("approver", None, "needs --trust"),
    ],
)
def test_an_approver_key_the_run_would_refuse_stops_the_gateway_at_start(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    role: str,
    trusted: bool | None,
    said: str,
) -> None:
    """A key of another role, one the trust file lacks, or no --trust at all: the gateway refuses to start, in one line."""
    Keyring.generate("k1").write_file(tmp_path / "keyring.json")
    keys = tmp_path / "keys"
    new_key(keys, role, "carol")
    new_key(keys, "approver", "dan")
    setup = Setup(tmp_path)
    setup.approver_key = keys / "carol.key"
    if trusted is not None:
        setup.trust = keys / ("carol.trust.json" if trusted else "dan.trust.json")
    capsys.readouterr()
    code = tether_main(setup.gateway_argv()[2:])
    assert code != 0
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert setup.rows() == 0


@pytest.mark.parametrize(
    "policy",
    [
        {"tools": {"add_note": {"needs_approval": True}}},
        {"default": {"needs_approval": True}},
    ],
    ids=["a-tool", "by-default"],
)
def test_a_policy_that_gates_without_trust_stops_the_gateway_before_the_upstream_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: dict[str, Any]
) -> None:
    """A gated tool and no --trust: refused in one line naming --trust, and the upstream is never started."""
    Keyring.generate("k1").write_file(tmp_path / "keyring.json")
    setup = Setup(tmp_path)
    setup.policy = policy
    capsys.readouterr()
    code = tether_main(setup.gateway_argv()[2:])
    err = capsys.readouterr().err
    assert code != 0
    assert "--trust" in err and "gates" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not setup.db.exists()  # the upstream would have made its file as it started
