"""`tether mcp` between the official MCP SDK's client and an upstream server written with the SDK.

Every part is real: the client is ``mcp.Client`` (in the test process, or a
process of its own killed with SIGKILL), the gateway is ``python -m
tether.cli mcp`` started by the client over stdio, and the upstream is a
child of the gateway (or a streamable HTTP server) that inserts a row in its
own SQLite file per effect: the rows are what the world received, whatever
any process believes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")

from mcp import StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.integration._mcp_kit import (
    ROOT,
    UPSTREAM,
    Setup,
    call_in_child,
    child_env,
    connected,
    document,
    text,
)
from tether.cli import main as tether_main
from tether.crypto import Keyring
from tether.runtime import open_run
from tether.store import open_store

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    Keyring.generate("k1").write_file(tmp_path / "keyring.json")
    return Setup(tmp_path)


def run_view(setup: Setup) -> Any:
    """The run as `tether inspect` reads it, verified under the keyring."""
    store = open_store(setup.store)
    try:
        return open_run(store, setup.run_id, keyring=Keyring.from_file(setup.keyring))
    finally:
        store.close()


def operator_page(setup: Setup) -> str:
    """The run's page of `tether serve` (read-only), as a person's browser gets it."""
    from starlette.testclient import TestClient

    from tether.web import WebConfig, create_app

    token = "t" * 32
    app = create_app(
        WebConfig(
            store=setup.store,
            token=token,
            keyring=Keyring.from_file(setup.keyring),
            hosts=("testserver",),
        )
    )
    with TestClient(app) as browser:
        browser.get(f"/runs?token={token}")
        answer = browser.get(f"/runs/{setup.run_id}")
        assert answer.status_code == 200, answer.text
        return answer.text


def meta(result: Any) -> dict[str, Any]:
    return document(result)["_meta"]["tether/call"]


async def call_killed(setup: Setup, tool: str, args: dict[str, Any]) -> str:
    """Call ``tool`` through a gateway that is killed meanwhile; what the client saw."""
    try:
        async with connected(setup.gateway()) as client:
            await client.call_tool(tool, args)
    except BaseExceptionGroup as group:  # the SDK's task groups wrap the closed connection
        errors = group.exceptions
        while len(errors) == 1 and isinstance(errors[0], BaseExceptionGroup):
            errors = errors[0].exceptions
        assert all(isinstance(e, MCPError) for e in errors), errors
        return " ".join(str(e) for e in errors)
    raise AssertionError("the gateway answered: it was not killed")


def test_an_effect_is_sent_once_and_its_twin_answered_from_the_record(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """The upstream's tools are offered unchanged; the same call in one run reaches the upstream once; a read passes through."""

    async def main() -> None:
        async with connected(setup.direct()) as direct:
            upstream = (await direct.list_tools()).tools
        async with connected(setup.gateway()) as client:
            offered = (await client.list_tools()).tools
            # Names, schemas, descriptions, annotations and _meta, as the upstream lists them.
            assert [t.model_dump(mode="json") for t in offered] == [
                t.model_dump(mode="json") for t in upstream
            ]
            assert {t.name for t in offered} == {"add_note", "count_notes", "charge"}
            first = await client.call_tool("add_note", {"text": "milk"})
            again = await client.call_tool("add_note", {"text": "milk"})
            other = await client.call_tool("add_note", {"text": "eggs"})
            count = await client.call_tool("count_notes", {})
        assert not first.is_error and first.structured_content == {"id": 1, "text": "milk"}
        assert meta(first)["outcome"] == "executed"
        assert again.structured_content == first.structured_content
        assert meta(again)["outcome"] == "replayed"
        assert meta(again)["effect"] == meta(first)["effect"]
        assert other.structured_content == {"id": 2, "text": "eggs"}
        assert meta(count)["outcome"] == "observed" and count.structured_content == {"result": 2}

    anyio.run(main)
    assert setup.rows() == 2
    store = open_store(setup.store)
    try:
        mark = store.get_mark(setup.run_id)
    finally:
        store.close()
    assert mark is not None and mark.lease_owner is None  # the ended session let the run go
    view = run_view(setup)
    kinds = [e.terms.kind for e in view.ledger if e.status.value == "committed" and e.terms]
    assert kinds == ["add_note", "add_note"]
    committed = [e for e in view.ledger if e.status.value == "committed"]
    assert committed[0].receipt["result"]["structuredContent"] == {"id": 1, "text": "milk"}
    assert committed[0].receipt["namespace"] == "mcp"
    assert any(
        e.kind == "action_observed" or "count_notes" in json.dumps(e.data) for e in view.trace
    )


def test_a_client_killed_after_the_tool_returned_gets_the_recorded_answer(setup: Setup) -> None:
    """A client SIGKILLed right after add_note returned, started again, asks again: one row, not two."""
    answer = setup.base / "answer.json"
    code = call_in_child(setup.gateway(), "add_note", {"text": "call the plumber"}, answer)
    assert code == -signal.SIGKILL
    assert setup.rows() == 1
    first = json.loads(answer.read_text())

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            again = await client.call_tool("add_note", {"text": "call the plumber"})
        assert not again.is_error
        assert again.structured_content == first["structuredContent"]
        assert meta(again)["outcome"] == "replayed"

    anyio.run(main)
    assert setup.rows() == 1
    assert run_view(setup).state.epoch >= 2  # the same run, continued in a new epoch


def test_a_gateway_sent_sigterm_after_answering_records_the_receipt_and_lets_the_run_go(
    setup: Setup,
) -> None:
    """SIGTERM right after an effect was answered: the gateway commits its receipt and gives the lease up before it exits."""
    setup.lease_ttl = "60"  # a lease not given up would still hold the run below

    async def main() -> None:
        try:
            async with connected(setup.gateway()) as client:
                first = await client.call_tool("add_note", {"text": "water the plants"})
                assert not first.is_error, text(first)
                (gateway,) = setup.gateway_pids()
                os.kill(gateway, signal.SIGTERM)
                for _ in range(200):
                    if not setup.gateway_pids():
                        break
                    await anyio.sleep(0.05)
        except BaseExceptionGroup:  # the connection closed under the client: expected
            pass

    anyio.run(main)
    assert not setup.gateway_pids()
    view = run_view(setup)
    assert view.state.phase.value == "running"
    assert [e.status.value for e in view.ledger][-1] == "committed"
    store = open_store(setup.store)
    try:
        store.acquire_lease(setup.run_id, "probe", 5.0)  # given up: free at once
    finally:
        store.close()


def test_a_second_sigterm_ends_a_gateway_whose_upstream_call_hangs(setup: Setup) -> None:
    """SIGTERM waits for the call under way; when the upstream hangs, a second SIGTERM ends the gateway at once."""
    setup.arm("hang")
    seen: dict[str, bool] = {}

    async def main() -> None:
        async def call(client: Any) -> None:
            with contextlib.suppress(Exception):
                await client.call_tool("add_note", {"text": "hangs upstream"})

        try:
            async with connected(setup.gateway()) as client, anyio.create_task_group() as group:
                group.start_soon(call, client)
                for _ in range(200):  # the row is in: the upstream now hangs
                    if setup.rows() == 1:
                        break
                    await anyio.sleep(0.05)
                (gateway,) = setup.gateway_pids()
                os.kill(gateway, signal.SIGTERM)
                await anyio.sleep(1.0)
                seen["alive after the first"] = setup.gateway_pids() == [gateway]
                os.kill(gateway, signal.SIGTERM)
                for _ in range(100):
                    if not setup.gateway_pids():
                        break
                    await anyio.sleep(0.05)
                seen["gone after the second"] = not setup.gateway_pids()
                group.cancel_scope.cancel()
        except BaseExceptionGroup:  # the connection closed under the client: expected
            pass

    try:
        anyio.run(main)
        # Both read before the client let go (its exit would end the gateway anyway).
        assert seen == {"alive after the first": True, "gone after the second": True}
        assert setup.rows() == 1
    finally:
        for pid in setup.upstream_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_unguarded_control_repeats_the_effect(setup: Setup) -> None:
    """The same client straight to the upstream, killed and asking again, makes the effect twice."""
    answer = setup.base / "answer.json"
    code = call_in_child(setup.direct(), "add_note", {"text": "call the plumber"}, answer)
    assert code == -signal.SIGKILL
    assert setup.rows() == 1

    async def main() -> None:
        async with connected(setup.direct()) as client:
            await client.call_tool("add_note", {"text": "call the plumber"})

    anyio.run(main)
    assert setup.rows() == 2


def test_a_gateway_killed_after_forwarding_leaves_the_call_to_a_person(setup: Setup) -> None:
    """The gateway SIGKILLed after add_note landed upstream: asked again, the agent is told a person decides; one row."""
    setup.arm("parent")

    seen = anyio.run(call_killed, setup, "add_note", {"text": "wire the money"})
    assert "Connection closed" in seen
    assert setup.rows() == 1

    async def again() -> None:
        async with connected(setup.gateway()) as client:
            answer = await client.call_tool("add_note", {"text": "wire the money"})
            assert answer.is_error
            assert "tether review" in text(answer) and "agent-run" in text(answer)
            assert meta(answer)["waits_for"] == "review"
            assert meta(answer)["case_id"] in text(answer)
            # This call is the one whose outcome is unknown: made again only after a fork.
            assert "with these arguments was sent" in text(answer)
            assert "tether fork agent-run sha256:" in text(answer)
            assert "started without --trust" in text(answer)  # no decision can be checked yet
            other = await client.call_tool("add_note", {"text": "something else"})
            assert other.is_error and meta(other)["waits_for"] == "review"
            assert "with these arguments" not in text(other)

    anyio.run(again)
    assert setup.rows() == 1
    view = run_view(setup)
    assert view.state.phase.value == "needs_review"
    assert [e.status.value for e in view.ledger][-1] == "outcome_unknown"
    # The operator page shows the MCP effect and its review case like any other.
    page = operator_page(setup)
    assert "add_note" in page and "outcome_unknown" in page
    assert view.state.review_cases[-1].case_id in page


def test_a_call_a_person_signs_landed_is_answered_from_the_record_and_never_made_again(
    setup: Setup, tmp_path: Path
) -> None:
    """A call left unknown by a killed gateway; a reviewer finds the row and signs landed: asked again, the agent is answered from the record, the upstream never sees it twice, and the run goes on."""
    keys = tmp_path / "keys"
    made = tether_main(["keys", "new", "--role", "reviewer", "--id", "rita", "--out", str(keys)])
    assert made == 0
    setup.trust = keys / "rita.trust.json"
    setup.arm("parent")
    anyio.run(call_killed, setup, "add_note", {"text": "wire the money"})
    assert setup.rows() == 1

    async def frozen() -> str:
        async with connected(setup.gateway()) as client:
            answer = await client.call_tool("add_note", {"text": "wire the money"})
            assert answer.is_error and meta(answer)["waits_for"] == "review", text(answer)
            return str(meta(answer)["case_id"])

    case = anyio.run(frozen)
    code = tether_main(
        [
            "review",
            setup.run_id,
            case,
            "--decision",
            "landed",
            "--evidence",
            "notes row 1 in upstream.sqlite",
            "--store",
            setup.store,
            "--key",
            str(keys / "rita.key"),
            "--yes",
        ]
    )
    assert code == 0

    async def again() -> None:
        async with connected(setup.gateway()) as client:
            answer = await client.call_tool("add_note", {"text": "wire the money"})
            # An error answer (the tool's output schema binds only its success), saying
            # the call happened, who found it, and that nothing is made again.
            said = meta(answer)
            assert said["outcome"] == "replayed" and said["settled_by"] == "review", said
            assert said["reviewer_id"] == "rita" and said["answer_kept"] is False
            assert "a person looked and signed that it happened" in text(answer)
            assert "rita" in text(answer) and "notes row 1" in text(answer)
            other = await client.call_tool("add_note", {"text": "tell the bank"})
            assert not other.is_error and meta(other)["outcome"] == "executed", text(other)

    anyio.run(again)
    assert setup.rows() == 2  # the landed call once, the new one once
    view = run_view(setup)
    assert view.state.phase.value == "running"
    landed = [e for e in view.ledger if e.receipt and e.receipt.get("namespace") == "tether.review"]
    assert len(landed) == 1 and landed[0].status.value == "committed"


def test_a_gateway_killed_after_forwarding_a_keyed_call_is_settled_by_its_key(setup: Setup) -> None:
    """charge accepts a key: the gateway killed after it landed, asked again, sends it again under the same key; one charge."""
    setup.arm("parent")

    anyio.run(call_killed, setup, "charge", {"account": "acme", "cents": 500})
    assert setup.rows("charges") == 1

    async def again() -> None:
        async with connected(setup.gateway()) as client:
            answer = await client.call_tool("charge", {"account": "acme", "cents": 500})
            assert not answer.is_error, text(answer)
            assert answer.structured_content == {"charge_id": 1, "account": "acme", "cents": 500}

    anyio.run(again)
    assert setup.rows("charges") == 1
    assert run_view(setup).state.phase.value == "running"


def test_an_upstream_killed_mid_call_is_never_repeated(setup: Setup) -> None:
    """The upstream SIGKILLed after add_note landed and before it answered: one row, and a person decides."""
    setup.arm("self")

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            first = await client.call_tool("add_note", {"text": "order the parts"})
            assert first.is_error
            again = await client.call_tool("add_note", {"text": "order the parts"})
            assert again.is_error and "tether review" in text(again)
            keyed = await client.call_tool("count_notes", {})
            assert keyed.is_error  # the run is frozen: nothing is asked until a person decides

    anyio.run(main)
    assert setup.rows() == 1
    assert run_view(setup).state.phase.value == "needs_review"


def test_an_upstream_killed_mid_keyed_call_is_asked_again_under_its_key(setup: Setup) -> None:
    """The upstream SIGKILLed mid-charge is started again by the gateway and asked under the same key: one charge."""
    setup.arm("self")

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            first = await client.call_tool("charge", {"account": "acme", "cents": 700})
            assert first.is_error
            again = await client.call_tool("charge", {"account": "acme", "cents": 700})
            assert not again.is_error, text(again)
            assert again.structured_content == {"charge_id": 1, "account": "acme", "cents": 700}

    anyio.run(main)
    assert setup.rows("charges") == 1


def test_an_upstream_that_died_between_calls_is_started_again_before_the_next_effect(
    setup: Setup,
) -> None:
    """An upstream killed while idle is found dead by a ping and started again: nothing goes to review."""

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            first = await client.call_tool("add_note", {"text": "one"})
            assert not first.is_error
            (pid,) = setup.upstream_pids()
            os.kill(pid, signal.SIGKILL)
            await anyio.sleep(1.2)  # idle past the ping threshold
            second = await client.call_tool("add_note", {"text": "two"})
            assert not second.is_error, text(second)
            assert meta(second)["outcome"] == "executed"
            assert setup.upstream_pids() not in ([], [pid])

    anyio.run(main)
    assert setup.rows() == 2
    assert run_view(setup).state.phase.value == "running"


def test_an_effect_after_an_idle_gap_keeps_the_same_upstream(setup: Setup) -> None:
    """An effect sent after more than a second idle reaches the upstream already running, not a new one."""

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            first = await client.call_tool("add_note", {"text": "one"})
            assert not first.is_error, text(first)
            (pid,) = setup.upstream_pids()
            for n in ("two", "three"):
                await anyio.sleep(1.2)  # idle past the liveness check's threshold
                later = await client.call_tool("add_note", {"text": n})
                assert not later.is_error, text(later)
                assert meta(later)["outcome"] == "executed"
                assert setup.upstream_pids() == [pid]

    anyio.run(main)
    assert setup.rows() == 3


def test_a_gateway_killed_while_the_upstream_starts_again_leaves_a_call_made_again(
    setup: Setup,
) -> None:
    """The gateway SIGKILLed while it starts a dead upstream again for an effect: nothing was dispatched, so asked again it is simply made."""

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            first = await client.call_tool("add_note", {"text": "one"})
            assert not first.is_error, text(first)
            (upstream,) = setup.upstream_pids()
            os.kill(upstream, signal.SIGKILL)
            setup.slow_start_marker.write_text("slow")
            await anyio.sleep(1.2)  # idle past the liveness check's threshold
            (gateway,) = setup.gateway_pids()

            async def kill_once_restarting() -> None:
                while setup.slow_start_marker.exists():  # the new upstream is starting
                    await anyio.sleep(0.02)
                os.kill(gateway, signal.SIGKILL)

            async with anyio.create_task_group() as group:
                group.start_soon(kill_once_restarting)
                await client.call_tool("add_note", {"text": "two"})

    with pytest.raises(BaseExceptionGroup):
        anyio.run(main)
    assert setup.rows() == 1
    for pid in setup.upstream_pids():  # the slow upstream outlived its gateway
        os.kill(pid, signal.SIGKILL)

    async def again() -> None:
        async with connected(setup.gateway()) as client:
            answer = await client.call_tool("add_note", {"text": "two"})
            assert not answer.is_error, text(answer)
            assert meta(answer)["outcome"] == "executed"

    anyio.run(again)
    assert setup.rows() == 2
    assert run_view(setup).state.phase.value == "running"


def test_the_upstream_child_gets_none_of_tethers_variables(setup: Setup) -> None:
    """The gateway given tether's keyring, secret keys and tokens in its environment starts the upstream without any of them."""
    seen = setup.base / "upstream-env.json"
    setup.extra_env = {
        "NOTES_TEST_ENV_FILE": str(seen),
        "TETHER_KEYRING": setup.keyring.read_text(),
        "TETHER_SECRET_KEYS": '{"k": "secret"}',
        "TETHER_SERVE_TOKEN": "t" * 32,
    }

    async def main() -> None:
        async with connected(setup.gateway()) as client:
            answer = await client.call_tool("add_note", {"text": "one"})
            assert not answer.is_error, text(answer)

    anyio.run(main)
    assert json.loads(seen.read_text()) == []
    assert setup.rows() == 1


def test_another_upstream_behind_the_same_run_is_refused(setup: Setup) -> None:
    """The same --run with the upstream started on another file is refused with a line naming a new --run; --upstream-moved continues it."""

    async def first() -> None:
        async with connected(setup.gateway()) as client:
            answer = await client.call_tool("add_note", {"text": "deploy v2"})
            assert not answer.is_error, text(answer)

    anyio.run(first)
    other_db = setup.base / "production.sqlite"
    argv = [*setup.gateway_argv()[:-1], str(other_db)]
    refused = subprocess.run(
        [sys.executable, *argv],
        env=child_env(),
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode != 0
    assert "new --run" in refused.stderr and "--upstream-moved" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr

    moved = StdioServerParameters(
        command=sys.executable,
        args=[*argv[: argv.index("--")], "--upstream-moved", *argv[argv.index("--") :]],
        env=child_env(),
        cwd=str(ROOT),
    )

    async def again() -> None:
        async with connected(moved) as client:
            answer = await client.call_tool("add_note", {"text": "deploy v2"})
            assert meta(answer)["outcome"] == "replayed"  # the person said: the same server

    anyio.run(again)
    assert setup.rows() == 1


@pytest.fixture
def http_upstream(setup: Setup) -> Iterator[str]:
    """The test upstream served over streamable HTTP on loopback (a process of its own)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [*UPSTREAM, str(setup.db), "--http", str(port)],
        env=child_env(NOTES_TOKEN="s3cret-token"),
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the HTTP upstream did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        server.wait()


def test_an_upstream_over_streamable_http_is_guarded_the_same(
    setup: Setup, http_upstream: str
) -> None:
    """With --upstream URL (and its bearer token from the environment) an effect is sent once across two sessions."""
    setup.upstream_url = http_upstream
    setup.upstream_headers = ["Authorization: Bearer ${NOTES_TOKEN}"]
    setup.extra_env = {"NOTES_TOKEN": "s3cret-token"}

    async def session(text_: str) -> Any:
        async with connected(setup.gateway()) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"add_note", "count_notes", "charge"}
            return await client.call_tool("add_note", {"text": text_})

    first = anyio.run(session, "over http")
    again = anyio.run(session, "over http")
    assert meta(first)["outcome"] == "executed" and meta(again)["outcome"] == "replayed"
    assert again.structured_content == first.structured_content == {"id": 1, "text": "over http"}
    assert setup.rows() == 1
    # Without the token the upstream refuses; the gateway recorded that answer, not a row.
    setup.extra_env = {"NOTES_TOKEN": "wrong"}
    refused = anyio.run(session, "without the token")
    assert refused.is_error and "bearer token" in text(refused)
    assert setup.rows() == 1


def test_a_gated_tool_waits_for_tether_approve(setup: Setup, tmp_path: Path) -> None:
    """A tool the policy gates answers that it waits for a person; `tether approve` lets it through once."""
    keys = tmp_path / "keys"
    made = tether_main(["keys", "new", "--role", "approver", "--id", "alice", "--out", str(keys)])
    assert made == 0
    setup.trust = keys / "alice.trust.json"
    setup.policy = {"reads": ["count_notes"], "tools": {"add_note": {"needs_approval": True}}}

    async def ask() -> dict[str, Any]:
        async with connected(setup.gateway()) as client:
            answer = await client.call_tool("add_note", {"text": "pay the rent"})
        assert answer.is_error and "tether approve" in text(answer), text(answer)
        return meta(answer)

    waiting = anyio.run(ask)
    assert waiting["waits_for"] == "approval"
    assert setup.rows() == 0
    action = run_view(setup).state.pending.action_id
    assert waiting["action_id"] == action
    code = tether_main(
        [
            "approve",
            setup.run_id,
            action,
            "--store",
            setup.store,
            "--key",
            str(keys / "alice.key"),
            "--yes",
        ]
    )
    assert code == 0

    async def again() -> None:
        async with connected(setup.gateway()) as client:
            answer = await client.call_tool("add_note", {"text": "pay the rent"})
            assert not answer.is_error, text(answer)
            assert answer.structured_content == {"id": 1, "text": "pay the rent"}
            twice = await client.call_tool("add_note", {"text": "pay the rent"})
            assert meta(twice)["outcome"] == "replayed"

    anyio.run(again)
    assert setup.rows() == 1


def test_an_approved_call_carried_out_by_another_call_is_said_and_replayed(
    setup: Setup, tmp_path: Path
) -> None:
    """A call with other arguments after an approval is told the approved call was carried out; the approved call asked again gets its recorded answer."""
    keys = tmp_path / "keys"
    made = tether_main(["keys", "new", "--role", "approver", "--id", "alice", "--out", str(keys)])
    assert made == 0
    setup.trust = keys / "alice.trust.json"
    setup.policy = {"reads": ["count_notes"], "tools": {"add_note": {"needs_approval": True}}}

    async def ask(note: str) -> Any:
        async with connected(setup.gateway()) as client:
            return await client.call_tool("add_note", {"text": note})

    waiting = anyio.run(ask, "pay the rent")
    action = meta(waiting)["action_id"]
    approve = ["approve", setup.run_id, action, "--store", setup.store]
    assert tether_main([*approve, "--key", str(keys / "alice.key"), "--yes"]) == 0

    other = anyio.run(ask, "buy a boat")
    assert other.is_error and meta(other)["waits_for"] == "approval"
    assert meta(other)["settled_first"] == action
    said = text(other)
    assert "carried out the call a person approved" in said and "pay the rent" in said, said
    assert action in said
    assert setup.rows() == 1

    again = anyio.run(ask, "pay the rent")
    assert not again.is_error, text(again)
    assert meta(again)["outcome"] == "replayed"
    assert again.structured_content == {"id": 1, "text": "pay the rent"}
    assert setup.rows() == 1
