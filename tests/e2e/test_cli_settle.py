"""`tether review` settles an unknown outcome: the prompt shows the write whole, landed needs evidence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e._settlekit import BODY, Frozen, frozen
from tests.integration._services import delivered
from tether.core import Phase
from tether.crypto import Keyring
from tether.runtime import Checkpointer
from tether.store import SQLiteStore

__all__ = ["frozen"]


def review(frozen: Frozen, *args: str, answer: str = "") -> subprocess.CompletedProcess[str]:
    """`tether review r1 CASE ARGS` as a person types it, answering the prompt with ``answer``."""
    store = SQLiteStore(frozen.db, read_only=True)
    try:
        case = Checkpointer(store, Keyring.from_file(frozen.keyring)).load("r1").state
    finally:
        store.close()
    case_id = case.review_cases[-1].case_id
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.cli",
            "review",
            "r1",
            case_id,
            "--key",
            str(frozen.reviewer_key),
            "--db",
            str(frozen.db),
            "--keyring",
            str(frozen.keyring),
            *args,
        ],
        input=answer,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def inbox(db: Path) -> list[object]:
    store = SQLiteStore(db, read_only=True)
    try:
        return list(store.evidence("r1"))
    finally:
        store.close()


def test_the_prompt_shows_the_write_whole_and_where_to_look_and_a_no_signs_nothing(
    frozen: Frozen,
) -> None:
    """The prompt prints the action, recipient, every line of the arguments, the key, when it was sent and the Message-ID; answered no, nothing is delivered."""
    (mid,) = delivered(frozen.maildir)
    shown = review(frozen, "--decision", "not_landed", answer="n\n")
    assert shown.returncode == 1, shown.stderr
    out = shown.stdout
    assert json.dumps(BODY) in out  # the whole body, never cut
    for wanted in ("email.send -> customer@example.com", "idempotency key", "sent at", mid):
        assert wanted in out, wanted
    assert "decisions it takes" in out and "landed, not_landed" in out
    assert inbox(frozen.db) == []


def test_landed_without_evidence_is_refused_before_signing_and_with_it_settles_the_run(
    frozen: Frozen,
) -> None:
    """No --evidence: refused, one line, nothing delivered; with the Message-ID the reviewer found: delivered, applied, one message."""
    refused = review(frozen, "--decision", "landed", "--yes")
    assert refused.returncode != 0
    assert "--evidence" in refused.stderr and "Traceback" not in refused.stderr
    assert inbox(frozen.db) == []
    wrong = review(frozen, "--decision", "accept", "--yes")
    assert wrong.returncode != 0 and "landed" in wrong.stderr
    (mid,) = delivered(frozen.maildir)
    done = review(frozen, "--decision", "landed", "--evidence", mid, "--yes", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["signed"]["evidence"] == mid and report["signed"]["decision"] == "landed"
    again = frozen.runtime().recover("r1")
    again.run()
    assert again.state.phase is Phase.COMPLETED
    again.rt.store.close()
    assert delivered(frozen.maildir) == [mid]
