"""Function effects under attack: each test reproduces a defect found from outside, fixed.

Real SQLite files, real child processes killed with SIGKILL (see ``_fnchild``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.integration._fnchild import KIND, record, runtime, seen
from tether import effects
from tether.adapters import Found
from tether.core import (
    EffectNotSettledError,
    EffectStatus,
    NeedsReviewError,
    Phase,
    RunBusyError,
    SpecError,
)
from tether.crypto import Signer
from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash
from tether.store import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]


def child(root: Path, scenario: str, stage: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run one stage of a scenario in a child process (``DIE=tag`` kills it after that effect)."""
    return subprocess.run(
        [sys.executable, "-m", "tests.integration._fnchild", str(root), scenario, stage],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), **env},
    )


def ledger(root: Path) -> list[EffectStatus]:
    """Run r's ledger, status by status."""
    with SQLiteStore(root / "runs.sqlite", read_only=True) as store:
        return [e.status for e in store.ledger("r")]


@pytest.mark.parametrize("declared", ["idempotent", "final"])
def test_a_compensation_killed_after_its_send_goes_to_review_not_again(
    tmp_path: Path, declared: str
) -> None:
    """The charge's proofs are not the refund's: killed inside compensate, the refund is never resent."""
    (tmp_path / "reviewer.json").write_bytes(Signer.generate("rev", "reviewer").to_json())
    scenario = f"compensation:{declared}"
    assert child(tmp_path, scenario, "charge").returncode == 0
    killed = child(tmp_path, scenario, "undo", DIE="refund")
    assert killed.returncode == -9, killed.stderr
    for _ in range(2):  # reopened twice: never a second refund
        again = child(tmp_path, scenario, "charge")
        assert "NeedsReviewError" in again.stderr, again.stderr
    assert len(seen(tmp_path, "refund")) == 1 and len(seen(tmp_path, "charge")) == 1
    assert ledger(tmp_path)[-1] is EffectStatus.OUTCOME_UNKNOWN


@pytest.mark.parametrize("declared", [{}, {"idempotent": True}])
def test_a_second_block_on_an_open_run_in_one_process_is_refused(
    tmp_path: Path, declared: dict[str, Any]
) -> None:
    """Two tasks open one run at once: the second is refused typed; the first gets its result."""
    sent: list[str] = []

    @tether.effect(KIND, target=None, **declared)
    async def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        await asyncio.sleep(0.3)
        record(tmp_path, "charge", idempotency_key, cents)
        sent.append(idempotency_key)
        return {"charged": cents}

    rt = runtime(tmp_path, charge.adapter)

    async def block(delay: float) -> str:
        await asyncio.sleep(delay)
        try:
            async with effects.run_async(rt, "r"):
                return str((await charge(500)).outcome)
        except RunBusyError as exc:
            return type(exc).__name__

    async def both() -> list[str]:
        return list(await asyncio.gather(block(0), block(0.1)))

    assert asyncio.run(both()) == ["executed", "RunBusyError"]
    assert len(seen(tmp_path, "charge")) == 1
    with effects.run(rt, "r"):  # the first block ended: the run opens again
        assert charge_again(charge) == "replayed"


def charge_again(fn: Any) -> str:
    """Call the async effect ``fn`` once more from code with no loop; its outcome."""
    return str(asyncio.run(fn(500)).outcome)


@pytest.mark.parametrize("declared", ["unfenced", "fenced"])
def test_a_worker_paused_past_its_lease_inside_the_body_never_doubles(
    tmp_path: Path, declared: str
) -> None:
    """SIGSTOP inside the body, another worker takes over: an unfenced absence goes to review."""
    scenario = f"takeover:{declared}"
    paused = subprocess.Popen(
        [sys.executable, "-m", "tests.integration._fnchild", str(tmp_path), scenario, "send"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "SLOW": "1",
        },
    )
    try:
        deadline = time.monotonic() + 60
        while not seen(tmp_path, "entered"):
            assert time.monotonic() < deadline and paused.poll() is None
            time.sleep(0.02)
        os.kill(paused.pid, signal.SIGSTOP)  # inside the body, before its send
        time.sleep(1.5)  # past the 1 s lease
        taker = child(tmp_path, scenario, "send")
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        paused.communicate(timeout=60)
    if declared == "unfenced":
        assert "NeedsReviewError" in taker.stderr, taker.stderr
        assert ledger(tmp_path)[-1] is EffectStatus.OUTCOME_UNKNOWN
    else:  # the callee refuses the older worker's fence: the absence stays final
        assert taker.returncode == 0 and "executed" in taker.stdout, taker.stderr
    assert len(seen(tmp_path, "charge")) == 1


def test_a_generator_body_or_a_bad_declaration_is_refused_at_decoration() -> None:
    """A generator would be recorded committed without running; bad flags raise SpecError at once."""

    def gen(cents: int) -> Any:
        yield cents

    async def agen(cents: int) -> Any:
        yield cents

    for body in (gen, agen):
        with pytest.raises(SpecError, match="generator"):
            tether.effect(KIND, target=None)(body)
    for wrong in (
        {"absent_is_final": True},
        {"idempotent": 1},
        {"retention_s": -5},
        {"object_id": 123},
    ):
        with pytest.raises(SpecError):
            tether.effect(KIND, target=None, **wrong)(lambda cents: None)


class Clock:
    """A runtime clock a test moves forward."""

    def __init__(self) -> None:
        self.at = datetime.now(UTC)

    def now(self) -> datetime:
        """The moment the test set."""
        return self.at


def test_a_falsy_look_up_answer_is_no_receipt_and_goes_to_review_past_the_in_flight_limit(
    tmp_path: Path,
) -> None:
    """A look-up answering [] is neither absence nor receipt: in flight, then review at 900 s."""

    def rows(key: str) -> list[str]:
        return [b for k, b in seen(tmp_path, "charge") if k == key]

    @tether.effect(KIND, target=None, lookup=rows, absent_is_final=True)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(tmp_path, "charge", idempotency_key, cents)
        return {"charged": cents}

    clock = Clock()
    crash = CrashPlan(CrashPoint.INTENT_PERSISTED)
    with (
        pytest.raises(SimulatedCrash),
        effects.run(runtime(tmp_path, charge.adapter, crash=crash, clock=clock), "r"),
    ):
        charge(500)
    rt = runtime(tmp_path, charge.adapter, clock=clock)
    with effects.run(rt, "r"), pytest.raises(EffectNotSettledError, match="only None means absent"):
        charge(500)
    clock.at += timedelta(seconds=901)
    with effects.run(rt, "r"), pytest.raises(NeedsReviewError):
        charge(500)
    assert seen(tmp_path, "charge") == [] and ledger(tmp_path)[-1] is EffectStatus.OUTCOME_UNKNOWN


def test_a_body_returning_none_is_found_as_found_none_and_replays(tmp_path: Path) -> None:
    """A None-returning body whose look-up answers Found(None): settled by key, replayed, no drift."""

    def sent(key: str) -> Found | None:
        return Found(None) if any(k == key for k, _ in seen(tmp_path, "mail")) else None

    @tether.effect(KIND, target=None, lookup=sent)
    def mail(cents: int, idempotency_key: str) -> None:
        record(tmp_path, "mail", idempotency_key, cents)

    crash = CrashPlan(CrashPoint.EFFECT_SENT)
    with (
        pytest.raises(SimulatedCrash),
        effects.run(runtime(tmp_path, mail.adapter, crash=crash), "r"),
    ):
        mail(1)
    with effects.run(runtime(tmp_path, mail.adapter), "r"):
        again = mail(1)
        once_more = mail(1)
    assert again.replayed and again.result == {"value": None}
    assert once_more.replayed and len(seen(tmp_path, "mail")) == 1


def test_a_body_that_mutates_its_arguments_and_returns_odd_values_still_commits_once(
    tmp_path: Path,
) -> None:
    """Mutated arguments leave the intent whole; a tuple, a 2**60 id, a cycle: committed, replayed."""
    loop: list[Any] = []
    loop.append(loop)
    answers: dict[str, Any] = {
        "tuple": (17, "https://tickets/17"),
        "bigint": {"id": 2**60, "text": "hi"},
        "cycle": loop,
    }

    # Each call makes its own object: the three again are replays, not reverts.
    @tether.effect(KIND, target=None, targets="collection")
    def post(items: list[str], shape: str, idempotency_key: str) -> Any:
        items.append("changed by the body")  # a body that changes what it was handed
        record(tmp_path, "post", idempotency_key, shape)
        return answers[shape]

    with effects.run(runtime(tmp_path, post.adapter), "r") as run:
        with pytest.warns(UserWarning):
            done = {shape: post(["a"], shape) for shape in answers}
        again = {shape: post(["a"], shape) for shape in answers}
        assert run.phase is Phase.RUNNING
    assert done["tuple"].result == {"value": [17, "https://tickets/17"]}
    assert done["bigint"].result == {"not_json": "dict", "why": "not a safe integer"}
    assert done["cycle"].result == {"not_json": "list", "why": "not JSON"}
    assert all(d.outcome == "executed" for d in done.values())
    assert all(a.replayed for a in again.values()) and len(seen(tmp_path, "post")) == 3


def test_a_body_exception_text_is_stored_redacted(tmp_path: Path) -> None:
    """A secret in the body's exception text reaches neither the caller nor the SQLite file."""
    secret = "sk_live_" + "Z9" * 16

    @tether.effect(KIND, target=None)
    def charge(cents: int, idempotency_key: str) -> None:
        record(tmp_path, "charge", idempotency_key, cents)
        raise ConnectionError(f"GET https://api.example.com/v1/charge?api_key={secret} reset")

    rt = runtime(tmp_path, charge.adapter)
    with effects.run(rt, "r"), pytest.raises(NeedsReviewError) as caught:
        charge(500)
    assert secret not in str(caught.value) and "ConnectionError" in str(caught.value)
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("runs.sqlite*") if p.is_file())
    assert secret.encode() not in stored
