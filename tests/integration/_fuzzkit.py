"""A seeded damage generator and the readers it is fed to (shared by test_fuzz and bench/fuzz.py).

:func:`build_base` makes one real home once: a SQLite store with four real
runs (completed, waiting for approval with evidence in its inbox, frozen in
needs_review with a decision in its inbox, and one left running), their
FileWorkspaces, a keyring, trust roots, signing keys, task and policy files.
:func:`run_case` copies that home, damages the copy as the seed says, then
calls every reader of the damaged thing and every CLI command in-process,
and sorts what came back: accepted, a typed :class:`TetherError`, or an
untyped failure (with its traceback) that :func:`replay` reproduces.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.integration._fuzzdamage import RUNS, SIGNERS, damage
from tether import _demo
from tether.adapters import FileWorkspace
from tether.cli import main as cli_main
from tether.core import (
    Policy,
    TaskSpec,
    TetherError,
    new_approval,
    new_decision,
)
from tether.crypto import Keyring, Role, Signer, TrustRoots
from tether.runtime import Checkpointer, CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import SQLiteStore

VERIFIER = ("python", "-c", "pass")
DOCUMENTED_EXITS = {0, 1, 2, 3}
#: Every call must end within this (seconds); trace and verify on a cycle too.
BOUND_S = {"default": 5.0, "verify": 1.0, "trace": 1.0, "cli verify": 1.0}
HANG_S = 20.0
#: A worker that exits on idle is done in well under this; past it, it is retrying a claim.
WORKER_HANG_S = 4.0
HOME_ENV = "TETHER_FUZZ_HOME"
#: Copies live in memory where there is a tmpfs: fsyncs there cost nothing, and
#: what is measured is the readers, not the disk.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


class Hung(BaseException):
    """A call ran past :data:`HANG_S` (raised by the alarm, so no except clause eats it)."""


# -- the base home -------------------------------------------------------------


def _task(fingerprint: str) -> dict[str, Any]:
    return {
        "task_id": "fuzz",
        "task_version": "1",
        "allowed_kinds": ["file.read", "file.write"],
        "allowed_paths": ["calc.py"],
        "permissions": ["workspace.read", "workspace.write"],
        "budgets": {"proposals": 5, "steps": 10, "wall_time_s": 31_622_400, "cost": 10},
        "initial_environment": {"namespace": "file-workspace", "state_fingerprint": fingerprint},
        "verifier": {"argv": list(VERIFIER), "timeout_s": 60},
    }


def workspace(home: Path, run_id: str) -> FileWorkspace:
    """The run's own workspace under ``home`` (its journal beside it)."""
    return FileWorkspace(
        home / "ws" / run_id, home / "ws" / f"{run_id}.journal", verifier_allowlist=[VERIFIER]
    )


_OPEN: list[Any] = []


def factory(store: Any, run_id: str, worker: str) -> Runtime:
    """``--app tests.integration._fuzzkit:factory``: the run's runtime, from ``$TETHER_FUZZ_HOME``."""
    home = Path(os.environ[HOME_ENV])
    ws = workspace(home, run_id)
    _OPEN.append(ws)
    policy = "guarded.json" if run_id == "wait" else "policy.json"
    return Runtime(
        store=store,
        keyring=Keyring.from_file(home / "keyring.json"),
        adapter=ws,
        task=TaskSpec.from_json((home / "task.json").read_bytes()),
        policy=Policy.from_json((home / policy).read_bytes()),
        agent=_demo.RepairAgent(),
        worker=worker,
        trust=TrustRoots.from_file(home / "trust.json"),
    )


def _close_opened() -> None:
    while _OPEN:
        with contextlib.suppress(Exception):
            _OPEN.pop().close()


@contextlib.contextmanager
def _home(home: Path) -> Iterator[None]:
    before = os.environ.get(HOME_ENV)
    os.environ[HOME_ENV] = str(home)
    try:
        yield
    finally:
        _close_opened()
        if before is None:
            os.environ.pop(HOME_ENV, None)
        else:
            os.environ[HOME_ENV] = before


def build_base(home: Path) -> Path:
    """Write the pristine home: four real runs in one SQLite store and every file they use."""
    home.mkdir(parents=True, exist_ok=True)
    for run_id in RUNS:
        root = home / "ws" / run_id
        root.mkdir(parents=True)
        (root / "calc.py").write_text(_demo.BUGGY)
    Keyring.generate("fz-1").write_file(home / "keyring.json")
    approver = Signer.generate("fz-approver", "approver")
    reviewer = Signer.generate("fz-reviewer", "reviewer")
    approver.write_file(home / "approver.key")
    reviewer.write_file(home / "reviewer.key")
    trust = {"signers": [approver.trust_root(), reviewer.trust_root()]}
    (home / "trust.json").write_text(json.dumps(trust))
    with workspace(home, "done") as ws:
        fingerprint = ws.environment().state_fingerprint
    (home / "task.json").write_text(json.dumps(_task(fingerprint)))
    (home / "policy.json").write_text(json.dumps(_demo.policy_doc("repair")))
    (home / "guarded.json").write_text(json.dumps(_demo.policy_doc("approval")))
    now = datetime.now(UTC)
    ttl = timedelta(days=3650)  # the base outlives any bench run
    with _home(home):
        store = SQLiteStore(home / "store.sqlite")
        try:
            factory(store, "done", "w0").start("done").run()
            factory(store, "live", "w0").start("live").run(max_steps=1)
            wait = factory(store, "wait", "w0").start("wait")
            wait.run()
            body = new_approval(
                wait.state, approver.signer_id, issued_at=now, expires_at=now + ttl, nonce="n1"
            )
            store.put_evidence("wait", "approval", approver.sign(body))
            factory(store, "wait", "w0").recover("wait").consume_inbox()
            state = Checkpointer(store, Keyring.from_file(home / "keyring.json")).load("wait")
            again = new_approval(
                state.state, approver.signer_id, issued_at=now, expires_at=now + ttl, nonce="n2"
            )
            (home / "approval.json").write_text(json.dumps(approver.sign(again)))
            store.put_evidence("wait", "approval", approver.sign(again))
            rt = factory(store, "frozen", "w0")
            rt.crash = CrashPlan(CrashPoint.EFFECT_SENT)
            with contextlib.suppress(SimulatedCrash):
                rt.start("frozen").run()
            pending = rt.checkpointer.load("frozen").state.pending
            if pending is None:
                raise RuntimeError("the frozen run has no pending write after the crash")
            with workspace(home, "frozen") as ws:
                ws.tamper_receipt(pending.idempotency_key, intent_digest="sha256:" + "c0" * 32)
            frozen = factory(store, "frozen", "w0").recover("frozen")
            frozen.step()
            case = frozen.state.review_cases[0]
            decision = new_decision(
                frozen.state,
                case,
                reviewer.signer_id,
                "replan",
                issued_at=now,
                expires_at=now + ttl,
                nonce="n3",
            )
            (home / "decision.json").write_text(json.dumps(reviewer.sign(decision)))
            (home / "case.txt").write_text(case.case_id)
            store.put_evidence("frozen", "review_decision", reviewer.sign(decision))
        finally:
            store.close()
    # A connection the runs left in a reference cycle closes when the collector
    # finds it; the last one to close deletes -wal and -shm, so it must not be in
    # the middle of a later copy of this home.
    gc.collect()
    with contextlib.closing(sqlite3.connect(home / "store.sqlite")) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        phases = dict(conn.execute("SELECT run_id, phase FROM tether_marks").fetchall())
    if phases != {
        "done": "completed",
        "wait": "pending",
        "frozen": "needs_review",
        "live": "running",
    }:
        raise RuntimeError(f"the base runs are not in the phases the fuzzer expects: {phases}")
    return home


# -- readers -------------------------------------------------------------------------


@dataclass
class Result:
    """What one damaged input did to every reader."""

    seed: int
    family: str
    damage: str
    typed: dict[str, int] = field(default_factory=dict)
    accepted: int = 0
    untyped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.untyped


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def ring(signum: int, frame: Any) -> None:
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _call(result: Result, name: str, fn: Callable[[], Any]) -> Any:
    bound = BOUND_S.get(name.split(":", maxsplit=1)[0], BOUND_S["default"])
    hang = WORKER_HANG_S if name == "cli worker" else HANG_S
    start = time.monotonic()
    try:
        with _deadline(hang):
            value = fn()
        result.accepted += 1
        return value
    except TetherError as exc:
        kind = type(exc).__name__
        result.typed[kind] = result.typed.get(kind, 0) + 1
        return None
    except Hung:
        result.untyped.append(f"{name}: hung past {hang} s")
        return None
    except Exception:
        result.untyped.append(f"{name}: {traceback.format_exc(limit=-6)}")
        return None
    finally:
        took = time.monotonic() - start
        if took > bound:
            result.untyped.append(f"{name}: took {took:.2f} s (bound {bound} s)")


def _cli(result: Result, name: str, argv: list[str], integrity: bool) -> None:
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                return cli_main(argv)
            except SystemExit as exc:  # argparse's usage errors
                return exc.code if isinstance(exc.code, int) else 2

    code = _call(result, f"cli {name}", run)
    text = err.getvalue()
    if code is None:
        return
    if code not in DOCUMENTED_EXITS:
        result.untyped.append(f"cli {name}: exit {code} is not documented: {text[-400:]}")
    if (
        "Traceback (most recent call last)" in text
        or "Traceback (most recent call last)" in out.getvalue()
    ):
        result.untyped.append(f"cli {name}: printed a traceback: {text[-800:]}")
    # Damage to what verify reads is an integrity failure: exit 3, not 1.
    allowed = ("integrity:", "KeyringError", "MigrationError", "StoreUnavailableError: cannot open")
    if name == "verify" and code == 1 and "image is malformed" in text:
        result.untyped.append(f"cli verify: a damaged database file exited 1, not 3: {text[-400:]}")
    if name == "verify" and integrity and code == 1 and not any(k in text for k in allowed):
        result.untyped.append(f"cli verify: a damaged store exited 1, not 3: {text[-400:]}")


def _readers(result: Result, home: Path, runs: list[str]) -> None:
    db = home / "store.sqlite"
    keyring_path = home / "keyring.json"
    call = lambda name, fn: _call(result, name, fn)  # noqa: E731
    keyring = call("keyring", lambda: Keyring.from_file(keyring_path))
    call("trust", lambda: TrustRoots.from_file(home / "trust.json"))
    call("task", lambda: TaskSpec.from_json((home / "task.json").read_bytes()))
    for name in ("policy.json", "guarded.json"):
        call("policy", lambda n=name: Policy.from_json((home / n).read_bytes()))
    for name in SIGNERS:
        signer = call("signer", lambda n=name: Signer.from_file(home / n))
        if signer is not None:
            call("sign", lambda s=signer: s.sign({"probe": 1}))
    trust = call("trust", lambda: TrustRoots.from_file(home / "trust.json"))
    if trust is not None:
        for name, role in (("approval.json", Role.APPROVER), ("decision.json", Role.REVIEWER)):
            call("evidence", lambda n=name, r=role: trust.verify(_load(home / n), r))
    store = call("open", lambda: SQLiteStore(db))
    if store is not None:
        try:
            call("schema_version", store.schema_version)
            call("runs", store.runs)
            for run in runs:
                mark = call("mark", lambda r=run: store.get_mark(r))
                call("envelopes", lambda r=run: store.envelopes(r))
                call("newest_generation", lambda r=run: store.newest_generation(r))
                call("ledger", lambda r=run: store.ledger(r))
                # The by-index and by-page reads a recovery, a step and a page make.
                call("ledger_between", lambda r=run: store.ledger_between(r, 1))
                call("trace_between", lambda r=run: store.trace_between(r, 1))
                call("ledger_for_effect", lambda r=run: store.ledger_for_effect(r, "sha256:x"))
                call("trace_for_action", lambda r=run: store.trace_for_action(r, "fix-calc"))
                call("trace_landmarks", lambda r=run: store.trace_landmarks(r, ["recovered"]))
                call("evidence", lambda r=run: store.evidence(r))
                call("action_seen", lambda r=run: store.action_seen(r, "fix-calc"))
                call("check_lease", lambda r=run: store.check_lease(r, 0))
                if mark is not None:
                    call(
                        "checkpoint",
                        lambda r=run, m=mark: store.get_checkpoint(r, m.checkpoint_digest),
                    )
                if keyring is not None:
                    _restore(result, store, keyring, run)
            leases = call("claim", lambda: store.claim_expired("fz-claimer", 30.0, limit=4))
            for lease in leases or ():
                # Given back, so the commands below find the runs as the damage left them.
                call(
                    "release",
                    lambda le=lease: store.release_lease(le.run_id, le.owner, le.lease_version),
                )
            call("put_evidence", lambda: store.put_evidence("wait", "approval", {"probe": 1}))
        finally:
            store.close()
    with _home(home):
        for run in runs:
            call("recover", lambda r=run: factory(_opened(SQLiteStore(db)), r, "fz-rec").recover(r))


def _opened(store: SQLiteStore) -> SQLiteStore:
    _OPEN.append(store)
    return store


def _restore(result: Result, store: SQLiteStore, keyring: Keyring, run: str) -> None:
    cp = Checkpointer(store, keyring)
    restored = _call(result, "load", lambda: cp.load(run))
    if restored is None:
        return
    state = restored.state
    _call(result, "verify", lambda: cp.check_generation(restored))
    _call(result, "trace", lambda: cp.verified_trace(state))
    _call(result, "trace", lambda: store.trace(run, state.trace_head))
    _call(result, "ledger", lambda: cp.verified_ledger(state))
    _call(result, "ledger", lambda: cp.read_recent(state))
    _call(result, "context", lambda: cp.context(state))
    _call(result, "results", lambda: cp.results(state))
    for blob in (state.agent_context_digest, state.results_digest):
        if blob is not None:
            _call(result, "blob", lambda b=blob: store.get_blob(b))


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return None  # the document is unreadable as JSON at all: verify gets None


def _commands(
    result: Result, home: Path, integrity: bool, runs: list[str], rng: random.Random, full: bool
) -> None:
    db, keyring = str(home / "store.sqlite"), str(home / "keyring.json")
    url = f"sqlite:///{db}"
    app = "tests.integration._fuzzkit:factory"
    approver, reviewer = str(home / "approver.key"), str(home / "reviewer.key")
    case = (home / "case.txt").read_text()
    review = ("review", "frozen", case, "--decision", "abort", "--db", db, "--key", reviewer)
    worker = ("worker", "--store", url, "--app", app, "--poll", "0.01", "--max-runs", "2")
    others = [
        ("approve", ["approve", "wait", "fix-calc", "--db", db, "--key", approver, "--yes"]),
        (
            "approve",
            [*("approve", "wait", "fix-calc", "--store", url), "--key", approver, "--yes"],
        ),
        ("review", [*review, "--keyring", keyring, "--yes"]),
        ("cancel", ["cancel", "live", "--store", url, "--app", app, "--reason", "fuzz"]),
        ("worker", [*worker, "--idle-exit", "--lease-ttl", "30"]),
    ]
    with _home(home):
        for run in runs:
            for command in ("inspect", "verify"):
                if rng.random() < 0.5:
                    argv = [command, run, "--db", db, "--keyring", keyring]
                else:
                    argv = [command, run, "--store", url, "--keyring", keyring, "--json"]
                _cli(result, command, argv, integrity and run == runs[0])
        for name, argv in others if full else [rng.choice(others)]:
            _cli(result, name, argv, False)


def run_case(base: Path, seed: int, *, full: bool = True) -> Result:
    """Copy ``base``, damage it as ``seed`` says, and feed it to every reader and command.

    ``full`` reads every run and runs every command; otherwise (the bench) the
    damaged run and one other are read, and one of the signing, cancel and
    worker commands is run, chosen by the seed.
    """
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(dir=SCRATCH) as tmp:
        home = Path(tmp) / "home"
        shutil.copytree(base, home, copy_function=shutil.copyfile)
        (home / "keyring.json").chmod(0o600)  # copyfile drops the mode; a keyring must be private
        family, text = damage(home, rng)
        result = Result(seed, family, text)
        named = [run for run in RUNS if f" {run}" in text]
        integrity = bool(named) and (
            family in {"cycle", "reseal", "envelope"}
            or (family == "sql" and "tether_inbox" not in text)
        )
        runs = [*named[:1], rng.choice(RUNS)]
        _readers(result, home, list(RUNS) if full else runs[:1])
        _commands(result, home, integrity, runs if full else runs[:1], rng, full)
        return result


_BASES: dict[str, Path] = {}


def base_for_process() -> Path:
    """One pristine home per process (built on first use, removed at exit)."""
    key = str(os.getpid())
    if key not in _BASES:
        import atexit

        root = Path(tempfile.mkdtemp(prefix="tether-fuzz-", dir=SCRATCH))
        atexit.register(shutil.rmtree, root, True)
        _BASES[key] = build_base(root / "base")
    return _BASES[key]


def replay(seed: int, *, full: bool = True) -> Result:
    """Re-run one seed from scratch (what a failure message tells you to call)."""
    return run_case(base_for_process(), seed, full=full)


def replay_command(seed: int, full: bool = True) -> str:
    """The shell command that replays ``seed`` (run from the repository root)."""
    return (
        ".venv/bin/python -c 'from tests.integration._fuzzkit import replay; "
        f"r = replay({seed}, full={full}); print(r.damage); print(*r.untyped, sep=chr(10))'"
    )


def signature(text: str) -> str:
    """A short name for one untyped failure: the call, the exception line, where it was raised."""
    text = re.sub(r"/tmp/[^'\" ]*/home/", "HOME/", text)
    call = text.split(":", 1)[0]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    where = next(
        (line for line in reversed(lines) if line.startswith('File "') and "/src/tether/" in line),
        "",
    )
    where = where.split("/src/tether/")[-1].replace('", line', ":").split(", in ")
    last = lines[-1] if lines else ""
    if not last.startswith(("Traceback", "File")) and len(lines) > 1:
        last = last[:120]
    return f"{call} | {last[:120]} | {' in '.join(where)}"


def check_undamaged(result: Result, home: Path) -> None:
    """Every reader and command over an undamaged copy (the control case)."""
    _readers(result, home, list(RUNS))
    _commands(result, home, False, list(RUNS), random.Random(0), True)
