"""tether.testing.counting: what reached a real adapter, as a world that deduplicates nothing sees it."""

from __future__ import annotations

import pytest

from tether.core import Intent
from tether.testing import Sandbox
from tether.testing.counting import Call, Calls, count_calls


def test_a_resend_the_sandbox_absorbs_is_still_counted_as_a_second_send() -> None:
    """The Sandbox writes once under a key; the log still shows both sends and the look-up."""
    sandbox = Sandbox({"a.txt": "alpha"}, instance_id="inst-1")
    calls = count_calls(sandbox)
    args = sandbox.normalize("file.write", "a.txt", {"content": "omega"})
    intent, prestate = Intent("file.write", "a.txt", args, "low"), sandbox.environment()
    first = sandbox.execute("key-1", intent, prestate)
    assert sandbox.lookup("key-1") == first  # the wrapped adapter still does the work
    assert sandbox.execute("key-1", intent, prestate) == first
    assert sandbox.write_count() == 1
    assert calls.log == [("send", "key-1"), ("lookup", "key-1"), ("send", "key-1")]
    assert (calls.sends("key-1"), calls.lookups("key-1"), calls.sends("key-2")) == (2, 1, 0)
    assert calls.sent() == {"key-1": 2}


@pytest.mark.parametrize(
    ("log", "unasked"),
    [
        ([], []),
        ([("send", "k")], []),
        ([("lookup", "k"), ("send", "k")], []),  # asked before the first send
        ([("send", "k"), ("lookup", "k"), ("send", "k")], []),
        ([("send", "k"), ("send", "k")], ["k"]),
        ([("send", "k"), ("lookup", "j"), ("send", "k")], ["k"]),  # another key's look-up
        ([("send", "k"), ("lookup", "k"), ("send", "k"), ("send", "k")], ["k"]),
        ([("send", "k"), ("send", "j"), ("send", "k"), ("send", "j")], ["k", "j"]),
    ],
)
def test_a_resend_counts_as_unasked_unless_its_key_was_looked_up_since_its_last_send(
    log: list[tuple[Call, str]], unasked: list[str]
) -> None:
    """resent_unasked names each send of a key not preceded by a look-up of it since its last send."""
    calls = Calls()
    for call, key in log:
        calls.record(call, key)
    assert calls.resent_unasked() == unasked
