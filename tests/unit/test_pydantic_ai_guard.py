"""Guard: how a PydanticAI tool's validated arguments become an effect's target and arguments."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic_ai", reason="needs the [pydantic-ai] extra")

from tether.core import SpecError
from tether.integrations.pydantic_ai import Guard
from tether.integrations.pydantic_ai._toolset import as_guard


def test_the_target_parameter_is_taken_out_and_the_rest_are_the_arguments() -> None:
    """("email.send", "to") sends to the 'to' argument with the others as the email."""
    guard = as_guard(("email.send", "to"))
    args = {"to": "a@example.com", "subject": "hi", "body": "x"}
    assert guard.split("send_email", args) == ("a@example.com", {"subject": "hi", "body": "x"})
    assert args["to"] == "a@example.com"  # the tool's own arguments are left alone


def test_a_kind_without_target_keeps_every_argument() -> None:
    """A None target gives an empty target and every argument."""
    assert Guard("notify.send").split("notify", {"text": "x"}) == ("", {"text": "x"})


def test_a_call_mapper_builds_target_and_arguments() -> None:
    """A call mapper turns the tool's parameters into the adapter's own arguments."""
    guard = Guard("http.post", call=lambda a: ("tickets", {"json": a}))
    assert guard.split("open_ticket", {"title": "t"}) == ("tickets", {"json": {"title": "t"}})


@pytest.mark.parametrize(
    ("guard", "args"),
    [
        (Guard("email.send", "to"), {"subject": "no recipient"}),
        (Guard("email.send", "to"), {"to": 7}),
        (Guard("http.post", call=lambda a: (None, a)), {"title": "t"}),
    ],
)
def test_a_call_that_names_no_string_target_is_refused(
    guard: Guard, args: dict[str, object]
) -> None:
    """A missing or non-string target, or a mapper returning no string target, raises SpecError."""
    with pytest.raises(SpecError):
        guard.split("tool", args)


@pytest.mark.parametrize("spec", [("email.send",), "email.send", ("", "to")])
def test_a_malformed_guard_spec_is_refused(spec: object) -> None:
    """A spec that is neither a Guard nor (kind, target parameter) with a kind raises SpecError."""
    with pytest.raises(SpecError):
        as_guard(spec)  # type: ignore[arg-type]


def test_a_guard_with_both_a_target_and_a_mapper_is_refused() -> None:
    """Target parameter and call mapper are two answers to one question: giving both is an error."""
    with pytest.raises(SpecError):
        Guard("http.post", "title", call=lambda a: ("tickets", a))


def test_the_tools_a_toolset_holds_are_found_through_its_wrappers() -> None:
    """Function tools count as held through combining, prefixing, renaming and filtering."""
    from pydantic_ai.toolsets import CombinedToolset, FunctionToolset

    from tether.integrations.pydantic_ai._toolset import registered

    own: FunctionToolset[None] = FunctionToolset()

    @own.tool_plain
    def send(to: str) -> str:
        """Send."""
        return to

    @own.tool_plain
    def read(order: str) -> str:
        """Read."""
        return order

    wrapped = CombinedToolset(
        [own.prefixed("mail"), own.renamed({"notify": "send"}).filtered(lambda ctx, tool: False)]
    )
    assert registered(wrapped) == {"mail_send", "mail_read", "notify", "read"}
