"""A store put back from a full backup while the world moved on goes to review, never loops."""

from __future__ import annotations

import secrets
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, finish, make_policy, make_task, write
from tether.adapters import FileWorkspace
from tether.core import EffectStatus, Observation, Phase, new_approval, new_decision
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import AgentContext, Decision, Runtime, Worker
from tether.store import SQLiteStore

VERIFIER = ("python", "-c", "pass")


def copy_database(source: Path, target: Path) -> None:
    """A consistent copy by SQLite's online backup API, as an operator's backup job takes it."""
    src = sqlite3.connect(source)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


class Site:
    """One real SQLite store and one real file workspace whose journal is never restored."""

    def __init__(self, tmp_path: Path, *, needs_approval: bool = False) -> None:
        self.db = tmp_path / "tether.sqlite"
        self.backup = tmp_path / "backup.sqlite"
        root = tmp_path / "tree"
        root.mkdir()
        (root / "notes.txt").write_text("draft\n")
        self.workspace = FileWorkspace(root, tmp_path / "journal", verifier_allowlist=[VERIFIER])
        self.keyring = Keyring.generate("k1")
        self.approver = Signer.generate("alice", "approver")
        self.reviewer = Signer.generate("rev", "reviewer")
        self.trust = TrustRoots.of(self.approver.trust_root(), self.reviewer.trust_root())
        self.task = make_task(
            self.workspace.environment().state_fingerprint,
            initial_environment={"namespace": "file-workspace"},
            verifier={"argv": list(VERIFIER), "timeout_s": 30},
        )
        rule = {"risk": "low", "permission": "workspace.write", "needs_approval": needs_approval}
        self.policy = make_policy(kinds={"file.write": rule})
        self.agent: Any = None

    def runtime(self, store: Any, run_id: str = "r", worker: str = "starter") -> Runtime:
        return Runtime(
            store=store,
            keyring=self.keyring,
            adapter=self.workspace,
            task=self.task,
            policy=self.policy,
            agent=self.agent,
            worker=worker,
            trust=self.trust,
            lease_ttl_s=0.2,
        )

    def take_backup(self) -> None:
        copy_database(self.db, self.backup)

    def restore_backup(self) -> None:
        copy_database(self.backup, self.db)

    def serve(self, until: Any, seconds: float = 10) -> Worker:
        """One real worker polls until ``until(mark)`` holds or ``seconds`` pass."""
        time.sleep(0.25)  # the restored lease, taken before the backup, expires
        with SQLiteStore(self.db) as store:
            worker = Worker(store, self.runtime, "w1", lease_ttl_s=0.2, poll_s=0.01, max_attempts=3)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not until(store.get_mark("r")):
                worker.serve(idle_exit=True)
                time.sleep(0.02)
        return worker

    def state(self) -> Any:
        with SQLiteStore(self.db) as store:
            return self.runtime(store, worker="reader").checkpointer.load("r").state

    def close(self) -> None:
        self.workspace.close()


class BacksUpBeforeSecondWrite:
    """Writes one, two, three, then finishes; the store is backed up when it plans the second."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.script = ScriptedAgent(
            [
                write("notes.txt", "one\n"),
                write("notes.txt", "two\n"),
                write("notes.txt", "three\n"),
                finish,
            ]
        )

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        if context.plan_cursor == 1 and not self.site.backup.exists():
            self.site.take_backup()  # write one was sent (its receipt waits): the backup's moment
        return self.script.decide(context, observation)


def reviewed(site: Site, state: Any, choice: str) -> None:
    """A trusted reviewer signs ``choice`` for the open case and delivers it to the inbox."""
    now = datetime.now(UTC)
    body = new_decision(
        state,
        state.review_cases[-1],
        "rev",
        choice,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    with SQLiteStore(site.db) as store:
        store.put_evidence("r", "review_decision", site.reviewer.sign(body))


def test_a_restored_store_behind_committed_writes_goes_to_review_with_the_receipts(
    tmp_path: Path,
) -> None:
    """Backup after write one, two more writes land, the backup is restored: review, not a loop."""
    site = Site(tmp_path)
    try:
        site.agent = BacksUpBeforeSecondWrite(site)
        with SQLiteStore(site.db) as store:
            site.runtime(store).start("r").run()
        assert site.workspace.write_count() == 3
        later = {entry.idempotency_key for entry in site.workspace.receipts_after(1, limit=10)}
        assert len(later) == 2

        site.restore_backup()
        worker = site.serve(until=lambda mark: mark.phase == "needs_review")

        state = site.state()
        assert state.phase is Phase.NEEDS_REVIEW
        (case,) = state.review_cases
        assert case.reason == "environment_ahead"
        shown = {e["idempotency_key"] for e in case.evidence if e["kind"] == "unrecorded_receipt"}
        assert shown == later  # the adapter's receipts the restored ledger lacks
        ahead = next(e for e in case.evidence if e["kind"] == "environment_ahead")
        # The backup was taken as the agent planned write two: write one's receipt was
        # still waiting for the next commit, so the restored checkpoint holds write one
        # dispatched, at version 0 (its key is in the restored ledger: not "unrecorded").
        assert (ahead["checkpoint"]["version"], ahead["live"]["version"]) == (0, 3)
        assert worker.stats.parked == 0  # parked by the protocol, not by failing attempts
        assert site.workspace.write_count() == 3  # nothing was repeated

        reviewed(site, state, "abort")
        site.serve(until=lambda mark: mark.phase == "failed")
        final = site.state()
        assert final.phase is Phase.FAILED
        with SQLiteStore(site.db) as store:
            trace = site.runtime(store, worker="reader").checkpointer.verified_trace(final)
        (sealed,) = [e for e in trace if e.kind == "review_sealed"]
        assert sealed.data["case"]["evidence"] == list(case.evidence)  # kept whole in the trace
        assert site.workspace.write_count() == 3
    finally:
        site.close()


def test_a_restored_store_with_a_consumed_approval_refuses_it_and_a_replan_finishes(
    tmp_path: Path,
) -> None:
    """Backup while a write waits for approval; after it ran, the restore cannot run it again."""
    site = Site(tmp_path, needs_approval=True)
    try:
        site.agent = ScriptedAgent([write("notes.txt", "approved\n"), finish])
        with SQLiteStore(site.db) as store:
            site.runtime(store).start("r").run()
        waiting = site.state()
        assert waiting.phase is Phase.PENDING
        site.take_backup()

        now = datetime.now(UTC)
        body = new_approval(
            waiting,
            "alice",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
        approval = site.approver.sign(body)
        with SQLiteStore(site.db) as store:
            store.put_evidence("r", "approval", approval)
        site.serve(until=lambda mark: mark.phase == "completed")
        assert site.state().phase is Phase.COMPLETED
        assert site.workspace.write_count() == 1

        site.restore_backup()
        with SQLiteStore(site.db) as store:
            store.put_evidence("r", "approval", approval)  # the consumed approval, delivered again
        site.serve(until=lambda mark: mark.phase == "needs_review")
        state = site.state()
        assert state.phase is Phase.NEEDS_REVIEW
        (case,) = state.review_cases
        assert case.reason == "environment_ahead"
        keys = [e["idempotency_key"] for e in case.evidence if e["kind"] == "unrecorded_receipt"]
        assert keys == [waiting.pending.idempotency_key]  # the adapter's receipt says it ran
        assert site.workspace.write_count() == 1  # the approval was not accepted again

        reviewed(site, state, "replan")
        site.serve(until=lambda mark: mark.phase == "completed")
        final = site.state()
        assert final.phase is Phase.COMPLETED
        assert final.environment == site.workspace.environment()
        assert site.workspace.write_count() == 1
        with SQLiteStore(site.db) as store:
            trace = site.runtime(store, worker="reader").checkpointer.verified_trace(final)
        refusals = [e.data for e in trace if e.kind == "evidence_refused"]
        assert [r["kind"] for r in refusals] == ["approval"]  # traced as refused, not dropped
    finally:
        site.close()


def test_the_world_moving_under_review_refreshes_the_case_and_a_new_decision_applies(
    tmp_path: Path,
) -> None:
    """A colleague edits the tree after the park: the stale abort is refused, the next applies."""
    site = Site(tmp_path)
    try:
        site.agent = BacksUpBeforeSecondWrite(site)
        with SQLiteStore(site.db) as store:
            site.runtime(store).start("r").run()
        site.restore_backup()
        site.serve(until=lambda mark: mark.phase == "needs_review")
        parked = site.state()
        (site.workspace.root / "notes.txt").write_text("a colleague's edit\n")
        reviewed(site, parked, "abort")  # signed against the case as it was opened
        site.serve(until=lambda mark: False, seconds=0.5)
        state = site.state()
        assert state.phase is Phase.NEEDS_REVIEW  # the stale decision never applied
        (case,) = state.review_cases
        assert case.case_id != parked.review_cases[0].case_id
        assert case.environment == site.workspace.environment()
        reviewed(site, state, "abort")
        site.serve(until=lambda mark: mark.phase == "failed")
        assert site.state().phase is Phase.FAILED
        assert site.workspace.write_count() == 3
    finally:
        site.close()


def test_a_mark_behind_dispatched_content_with_the_world_ahead_parks_soundly(
    tmp_path: Path,
) -> None:
    """Mark apart, one generation behind content that says dispatched, world ahead: the park
    records dispatched in the ledger first, so every later restore still verifies."""
    from tether.core import Intent
    from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash

    site = Site(tmp_path, needs_approval=True)
    marks = tmp_path / "marks.sqlite"
    site.agent = ScriptedAgent([write("notes.txt", "mine\n"), finish])

    def runtime(worker: str, crash: CrashPlan | None = None) -> Runtime:
        return Runtime(
            store=SQLiteStore(site.db),
            marks=SQLiteStore(marks),
            keyring=site.keyring,
            adapter=site.workspace,
            task=site.task,
            policy=site.policy,
            agent=site.agent,
            worker=worker,
            trust=site.trust,
            crash=crash or CrashPlan(),
        )

    try:
        waiting = runtime("w0").start("r")
        waiting.run()  # pending, intended, waiting for the approval
        now = datetime.now(UTC)
        body = new_approval(
            waiting.state,
            "alice",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
        with SQLiteStore(site.db) as store:
            store.put_evidence("r", "approval", site.approver.sign(body))
        # hit 1 records the approval; hit 2 is the checkpoint that says dispatched: its
        # content lands, the mark does not move, the write is never sent
        with pytest.raises(SimulatedCrash):
            runtime("w1", CrashPlan(CrashPoint.CONTENT_BEFORE_MARK, nth=2)).recover("r").run()
        ws = site.workspace
        for n in range(2):  # another runtime writes here meanwhile
            args = ws.normalize("file.write", "notes.txt", {"content": f"other {n}\n"})
            ws.execute(
                f"other-{n}", Intent("file.write", "notes.txt", args, "low"), ws.environment()
            )
        parked = runtime("w2").recover("r")
        assert parked.state.phase is Phase.NEEDS_REVIEW
        assert parked.state.review_cases[0].reason == "environment_ahead"
        again = runtime("w3").recover("r")  # the ledger agrees with the checkpoint
        assert again.state.phase is Phase.NEEDS_REVIEW
        assert again.state.pending is not None
        assert again.state.pending.status is EffectStatus.DISPATCHED
        assert site.workspace.write_count() == 2  # our write never went
    finally:
        site.close()


def test_an_adapter_that_cannot_list_or_look_up_still_parks_with_both_environments(
    tmp_path: Path,
) -> None:
    """A blind adapter ahead of a restored store: review with the environments, no receipts."""
    from tests.integration import _blindkit as kit

    kit.prepare(tmp_path)
    db, _, _ = kit.paths(tmp_path)
    backup = tmp_path / "backup.sqlite"
    with SQLiteStore(db) as store:
        kit.runtime(tmp_path, store).start(kit.RUN_ID)
    copy_database(db, backup)
    with SQLiteStore(db) as store:
        kit.runtime(tmp_path, store).recover(kit.RUN_ID).run()
    assert kit.effects(tmp_path) == 1
    copy_database(backup, db)
    with SQLiteStore(db) as store:
        session = kit.runtime(tmp_path, store).recover(kit.RUN_ID)
    assert session.state.phase is Phase.NEEDS_REVIEW
    (case,) = session.state.review_cases
    kinds = [e["kind"] for e in case.evidence]
    assert kinds == ["environment_ahead"]  # nothing to list: the environments say it
    assert kit.effects(tmp_path) == 1
