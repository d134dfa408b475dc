"""What the page tests share: Debian's chromium under Playwright, `tether serve` as a child, demo runs."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tether import _demo
from tether.cli._demo_child import child

ARTIFACTS = Path(__file__).parent / "artifacts"


def why_no_browser() -> str | None:
    """One line saying why the page tests cannot run here, or ``None`` when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; never `playwright install`)"
    if shutil.which("chromium") is None:
        return "Debian's chromium is not installed (apt-get install -y chromium)"
    return None


@dataclass(frozen=True)
class Served:
    """A running `tether serve`: where it is and the token it printed."""

    base: str
    token: str
    process: subprocess.Popen[str]

    def login(self, path: str = "/runs") -> str:
        return f"{self.base}{path}?token={self.token}"


@contextlib.contextmanager
def serve(db: Path, *args: str) -> Iterator[Served]:
    """`tether serve --store DB --port 0 ARGS` as a child process, stopped with SIGTERM after."""
    env = {k: v for k, v in os.environ.items() if k != "TETHER_SERVE_TOKEN"}
    process = subprocess.Popen(
        [sys.executable, "-m", "tether.cli", "serve", "--store", str(db), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        line = _first_line(process, timeout_s=30)
        # "tether serve: http://127.0.0.1:PORT/?token=T (mode)"
        url = line.split()[2]
        base, _, token = url.partition("/?token=")
        yield Served(base, token, process)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        if process.stderr is not None:
            process.stderr.close()


def _first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    stdout = process.stdout
    if stdout is None:
        raise AssertionError("tether serve has no stdout")
    with selectors.DefaultSelector() as sel:
        sel.register(stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise AssertionError(f"tether serve said nothing in {timeout_s} s")
    line = stdout.readline()
    if not line.startswith("tether serve: http://"):
        err = process.stderr.read() if process.stderr and process.poll() is not None else ""
        raise AssertionError(f"tether serve did not start: {line!r} {err}")
    return line


def approval_run(home: Path) -> _demo.DemoPaths:
    """A demo run waiting for a person to approve its write of calc.py."""
    paths = _demo.DemoPaths.under(home)
    _demo.prepare(paths, "approval")
    _stage(paths, "start")
    return paths


def conflict_run(home: Path) -> _demo.DemoPaths:
    """A demo run frozen in needs_review: same key, different intent (the conflict demo, by hand)."""
    paths = _demo.DemoPaths.under(home)
    _demo.prepare(paths, "conflict")
    crashed = child(paths, "start", "effect_sent", 1, "conflict")
    if crashed.returncode != -signal.SIGKILL:
        raise AssertionError(f"the start stage was to die at effect_sent: {crashed.stderr}")
    store = _demo.open_demo_store(paths)
    try:
        from tether.runtime import Checkpointer

        state = Checkpointer(store, _demo.keyring(paths)).load(_demo.RUN_ID).state
    finally:
        store.close()
    if state.pending is None:
        raise AssertionError("expected a pending write after the crash")
    with _demo.workspace(paths) as ws:
        ws.tamper_receipt(
            state.pending.idempotency_key, intent_digest="sha256:" + "c0ffee" * 10 + "c0ff"
        )
    _stage(paths, "recover")
    return paths


def _stage(paths: _demo.DemoPaths, stage: str) -> None:
    done = child(paths, stage, None, 1)
    if done.returncode != 0:
        raise AssertionError(f"demo stage {stage} failed: {done.stderr}")


def recover(paths: _demo.DemoPaths) -> None:
    """One more step of the demo run in its own process (it reads its inbox first)."""
    _stage(paths, "recover")


def worker(paths: _demo.DemoPaths) -> subprocess.CompletedProcess[str]:
    """`tether worker --idle-exit` over the demo's store: claims the run and drives it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.cli",
            "worker",
            "--store",
            f"sqlite:///{paths.db}",
            "--app",
            "tether._demo:worker_factory",
            "--idle-exit",
            "--poll",
            "0.2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "TETHER_DEMO_HOME": str(paths.home)},
        check=False,
    )


def take_evidence(paths: _demo.DemoPaths) -> None:
    """The demo run reads its inbox once and stops (a new checkpoint if it took anything)."""
    _stage(paths, "take-evidence")


def running_run(home: Path) -> _demo.DemoPaths:
    """A demo run at rest in phase running past its first generation (killed before its second proposal)."""
    paths = _demo.DemoPaths.under(home)
    _demo.prepare(paths, "repair")
    killed = child(paths, "start", "before_proposal", 2)
    if killed.returncode != -signal.SIGKILL:
        raise AssertionError(
            f"the start stage was to die before its second proposal: {killed.stderr}"
        )
    return paths
