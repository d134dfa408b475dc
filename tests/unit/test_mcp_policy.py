"""The MCP gateway's policy file and the run it derives: reads only by name, everything else an effect."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")

from mcp.types import Tool, ToolAnnotations

from tether.core import EnvironmentState, Risk, SpecError, Targets
from tether.integrations.mcp import (
    GatewayPolicy,
    ToolRule,
    key_declaration,
    kind_of,
    result_document,
    run_rules,
    shown_store,
    tool_of,
)

ENV = EnvironmentState("mcp", "notes", 0, "sha256:" + "0" * 64)
TOOLS = ["add_note", "count_notes", "charge"]


def rules(document: dict[str, Any]) -> dict[str, Any]:
    """What the run's policy says of each tool, from a policy file."""
    derived = run_rules(GatewayPolicy.from_json(document), TOOLS, ENV, "mcp:notes")
    return {
        name: (rule.permission, rule.risk.value, rule.needs_approval, rule.sensitive)
        for name, rule in derived.policy.kinds.items()
    }


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {},
            {
                "add_note": ("mcp.tools", "medium", False, False),
                "count_notes": ("mcp.tools", "medium", False, False),
                "charge": ("mcp.tools", "medium", False, False),
            },
        ),
        (
            {"reads": ["count_notes"]},
            {
                "add_note": ("mcp.tools", "medium", False, False),
                "count_notes": ("mcp.tools", "low", False, False),
                "charge": ("mcp.tools", "medium", False, False),
            },
        ),
        (
            {
                "reads": ["count_notes"],
                "default": {"needs_approval": True, "risk": "high"},
                "tools": {"add_note": {"needs_approval": False, "sensitive": True}},
            },
            {
                "add_note": ("mcp.tools", "high", False, True),
                "count_notes": ("mcp.tools", "low", False, False),
                "charge": ("mcp.tools", "high", True, False),
            },
        ),
    ],
)
def test_every_tool_the_policy_does_not_name_a_read_is_an_effect(
    document: dict[str, Any], expected: dict[str, Any]
) -> None:
    """A table: each policy file gives each tool a read's rule only when it names it a read."""
    assert rules(document) == expected


def test_a_changed_policy_file_changes_the_policy_not_the_task() -> None:
    """Naming a tool a read or gating one is a policy change; the task is the tool list alone."""
    plain = run_rules(GatewayPolicy(), TOOLS, ENV, "mcp:notes")
    gated = run_rules(
        GatewayPolicy.from_json({"reads": ["count_notes"], "default": {"needs_approval": True}}),
        TOOLS,
        ENV,
        "mcp:notes",
    )
    assert plain.task.fingerprint == gated.task.fingerprint
    assert plain.policy.fingerprint != gated.policy.fingerprint
    other = run_rules(GatewayPolicy(), [*TOOLS, "delete_note"], ENV, "mcp:notes")
    assert other.task.fingerprint != plain.task.fingerprint


def test_the_run_is_the_same_for_the_same_configuration() -> None:
    """The same file and tools give the same task and policy fingerprints (a restart continues the run)."""
    doc = {"reads": ["count_notes"], "tools": {"charge": {"needs_approval": True}}}
    one = run_rules(GatewayPolicy.from_json(doc), TOOLS, ENV, "mcp:notes")
    two = run_rules(GatewayPolicy.from_json(doc), list(reversed(TOOLS)), ENV, "mcp:notes")
    assert one.task.fingerprint == two.task.fingerprint
    assert one.policy.fingerprint == two.policy.fingerprint
    assert one.policy.max_risk is Risk.MEDIUM
    assert one.task.allowed_kinds == tuple(sorted(TOOLS))


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"reads": ["count_note"]}, "reads"),  # a typo must not leave the read an unknown tool
        ({"tools": {"add_notes": {"needs_approval": True}}}, "tools"),  # nor a gate unapplied
        ({"reads": ["count_notes"], "tools": {"count_notes": {}}}, "tools.count_notes"),
        ({"tools": {"add_note": {"risk": "huge"}}}, "tools.add_note.risk"),
        ({"tools": {"add_note": {"needs_aproval": True}}}, "tools.add_note.needs_aproval"),
        ({"default": {"accepts_key": True}}, "default.accepts_key"),
        ({"approval_ttl_s": 0}, "approval_ttl_s"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_policy_file_that_could_leave_a_tool_ungated_is_refused(
    document: dict[str, Any], field: str
) -> None:
    """Unknown names, unknown fields and bad values are refused, naming the field."""
    with pytest.raises(SpecError) as refused:
        run_rules(GatewayPolicy.from_json(document), TOOLS, ENV, "mcp:notes")
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("tool", "kind"),
    [
        ("add_note", "add_note"),
        ("finish", "mcp:finish"),
        ("cancel", "mcp:cancel"),
        ("tests.run", "mcp:tests.run"),
        ("mcp:finish", "mcp:mcp:finish"),
        ("mcp:", "mcp:mcp:"),
        ("mcp", "mcp"),
        ("Finish", "Finish"),
    ],
)
def test_a_tool_gets_its_own_name_as_kind_unless_a_run_action_has_it(tool: str, kind: str) -> None:
    """A table: a tool's kind is its name, but a run's own action's name (or the escape) is prefixed; tool_of undoes it."""
    assert kind_of(tool) == kind
    assert tool_of(kind) == tool


def test_tools_named_like_a_runs_own_actions_are_guarded_under_kinds_of_their_own() -> None:
    """Tools called finish, cancel and tests.run (and one called mcp:finish) start a run: each its own kind, none the run's own."""
    tools = ["finish", "cancel", "tests.run", "mcp:finish", "add_note"]
    policy = GatewayPolicy.from_json({"tools": {"finish": {"needs_approval": True}}})
    rules = run_rules(policy, tools, ENV, "mcp:notes")
    assert rules.task.allowed_kinds == (
        "add_note",
        "mcp:cancel",
        "mcp:finish",
        "mcp:mcp:finish",
        "mcp:tests.run",
    )
    assert rules.policy.kinds["mcp:finish"].needs_approval
    assert not rules.policy.kinds["mcp:mcp:finish"].needs_approval
    assert len({kind_of(t) for t in tools}) == len(tools)


def test_a_policy_file_is_parsed_strictly() -> None:
    """Duplicate keys are refused like any doubtful JSON."""
    with pytest.raises(SpecError):
        GatewayPolicy.from_json('{"reads": [], "reads": ["x"]}')
    assert GatewayPolicy.from_json(b'{"tools": {"x": {"accepts_key": false}}}').rule("x") == (
        ToolRule(accepts_key=False)
    )


def test_what_a_tools_target_is_is_declared_per_tool_only() -> None:
    """targets: state, collection or unknown per tool; a collection otherwise; never a default for every tool."""
    policy = GatewayPolicy.from_json(
        {"tools": {"add_note": {"targets": "collection"}, "charge": {"targets": "state"}}}
    )
    assert policy.rule("add_note").targets is Targets.COLLECTION
    assert policy.rule("charge").targets is Targets.STATE
    assert policy.rule("other").targets is Targets.COLLECTION
    with pytest.raises(SpecError, match="targets"):
        GatewayPolicy.from_json({"tools": {"add_note": {"targets": "maybe"}}})
    with pytest.raises(SpecError):
        GatewayPolicy.from_json({"default": {"targets": "state"}})


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        (None, (False, None)),
        ({"idempotencyKey": {"accepted": True}}, (True, None)),
        ({"idempotencyKey": {"accepted": True, "retentionSeconds": 86400}}, (True, 86400.0)),
        ({"idempotencyKey": {"accepted": "yes"}}, (False, None)),
        ({"idempotencyKey": True}, (False, None)),
        ({"idempotencyKey": {"accepted": True, "retentionSeconds": -1}}, (True, None)),
    ],
)
def test_a_tool_accepts_a_key_only_when_its_listing_says_so_exactly(
    meta: dict[str, Any] | None, expected: tuple[bool, float | None]
) -> None:
    """The declaration in a tool's `_meta` counts only as documented; the annotations never do."""
    tool = Tool(
        name="charge",
        input_schema={"type": "object"},
        annotations=ToolAnnotations(idempotent_hint=True),
        _meta=meta,
    )
    assert key_declaration(tool) == expected


def test_a_recorded_answer_drops_what_the_connection_stamped() -> None:
    """The SDK's per-connection `_meta` keys are not part of the tool's answer."""
    from mcp.types import CallToolResult, TextContent

    result = CallToolResult(
        content=[TextContent(type="text", text="ok")],
        _meta={"io.modelcontextprotocol/serverInfo": {"name": "x"}, "mine": 1},
    )
    assert result_document(result) == {
        "content": [{"type": "text", "text": "ok"}],
        "isError": False,
        "_meta": {"mine": 1},
    }


def test_a_store_url_is_shown_without_its_password() -> None:
    """The command a person is told to run never carries the store's password."""
    assert (
        shown_store("postgresql://bob:s3cret@db:5432/runs") == "postgresql://bob:***@db:5432/runs"
    )
    assert shown_store("sqlite:///runs.sqlite") == "sqlite:///runs.sqlite"


def test_a_header_reads_its_secret_from_the_environment_or_is_refused() -> None:
    """`${VAR}` in an upstream header comes from the environment; an unset one is never sent as written."""
    from tether.integrations.mcp import UpstreamDownError, expanded_header

    env = {"TOKEN": "abc"}
    assert expanded_header("Authorization: Bearer ${TOKEN}", env) == ("Authorization", "Bearer abc")
    with pytest.raises(UpstreamDownError, match="TOKEN"):
        expanded_header("Authorization: Bearer ${TOKEN}", {})
    with pytest.raises(UpstreamDownError):
        expanded_header("no colon here", env)


def test_the_upstream_child_never_gets_tethers_own_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The upstream started as a child gets the gateway's environment without any TETHER_* variable but those passed."""
    from tether.integrations.mcp import UpstreamDownError, stdio_target

    monkeypatch.setenv("TETHER_KEYRING", '{"keys": "secret"}')
    monkeypatch.setenv("TETHER_KEYRING_FILE", "/home/me/keyring.json")
    monkeypatch.setenv("TETHER_SECRET_KEYS", '{"k": "secret"}')
    monkeypatch.setenv("TETHER_SERVE_TOKEN", "operator-token")
    monkeypatch.setenv("TETHER_LOG_LEVEL", "debug")
    monkeypatch.setenv("ACME_TOKEN", "for-the-upstream")
    target = stdio_target(["npx", "-y", "@acme/issues-mcp"])
    assert target.env is not None and target.env["ACME_TOKEN"] == "for-the-upstream"
    assert not [k for k in target.env if k.startswith("TETHER_")]
    assert (target.command, target.args) == ("npx", ["-y", "@acme/issues-mcp"])
    passed = stdio_target(["npx"], passed=["TETHER_LOG_LEVEL"])
    assert passed.env is not None
    assert [k for k in passed.env if k.startswith("TETHER_")] == ["TETHER_LOG_LEVEL"]
    with pytest.raises(UpstreamDownError, match="--pass-env"):
        stdio_target(["npx"], passed=["ACME_TOKEN"])


@pytest.mark.parametrize("bad", ["", " r1", "a/b", "a b", "r1\n"])
def test_a_run_id_that_cannot_be_typed_back_is_a_usage_error(
    bad: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tether mcp --run` refuses an empty id, whitespace and '/' with a usage error naming --run."""
    from tether.cli import main as tether_main

    store = f"sqlite:///{tmp_path / 't.sqlite'}"
    assert tether_main(["mcp", "--store", store, "--run", bad, "--", "true"]) == 2
    assert "argument --run" in capsys.readouterr().err


def test_the_cli_says_why_an_upstream_cannot_be_reached_in_one_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad URL scheme, a command that exits at once and a missing policy file each give one clear line, no exception group."""
    from tether.cli import main as tether_main
    from tether.crypto import Keyring

    keyring = tmp_path / "keyring.json"
    Keyring.generate("k1").write_file(keyring)
    base = ["mcp", "--store", f"sqlite:///{tmp_path / 't.sqlite'}", "--run", "r1"]
    base += ["--keyring", str(keyring)]
    cases = [
        (["--upstream", "ftp://host/mcp"], "http:// or https://"),
        (["--upstream", "not-a-url"], "has no scheme"),
        (["--", "false"], "exited or closed its output before it answered"),
        (["--policy", str(tmp_path / "nosuch.json"), "--", "false"], "--policy: cannot read"),
    ]
    for extra, said in cases:
        assert tether_main([*base, *extra]) != 0
        err = capsys.readouterr().err
        assert said in err, err
        assert "ExceptionGroup" not in err and "TaskGroup" not in err, err
        assert len(err.strip().splitlines()) == 1, err
