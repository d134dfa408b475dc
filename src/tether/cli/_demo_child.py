"""One stage of a demo run in its own process: the process the demo may SIGKILL."""

from __future__ import annotations

import json
import subprocess
import sys

from tether import _demo
from tether.runtime import CrashPlan

#: The hidden command a demo runs its stages as (kept out of --help).
CHILD_COMMAND = "_demo-child"


def child(
    paths: _demo.DemoPaths,
    stage: str,
    crash_at: str | None,
    hit: int,
    scenario: str = "repair",
) -> subprocess.CompletedProcess[str]:
    """Run ``tether _demo-child STAGE`` over ``paths``, armed to die at ``crash_at``'s ``hit``."""
    cmd = [
        sys.executable,
        "-m",
        "tether.cli",
        CHILD_COMMAND,
        stage,
        "--db",
        str(paths.db),
        "--workspace",
        str(paths.workspace),
        "--scenario",
        scenario,
    ]
    if paths.marks is not None:
        cmd += ["--marks", str(paths.marks)]
    if crash_at is not None:
        cmd += ["--crash-at", crash_at, "--crash-hit", str(hit)]
    with _demo.signals_held():
        child = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
            preexec_fn=_demo.die_with_parent(),  # noqa: PLW1509 - the demo starts no threads
        )
    # Out of the held section: a signal now reaches the demo while it waits.
    try:
        out, err = child.communicate()
    except BaseException:
        child.kill()
        child.wait()
        raise
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


def report_unfired(crash: CrashPlan) -> None:
    """In the child, after a run that finished: how often it passed the point armed to kill it."""
    if crash.point is not None:
        print(json.dumps({"crash_point": crash.point.value, "hits": crash.hits}), flush=True)


def unfired(
    result: subprocess.CompletedProcess[str], crash_at: str, hit: int
) -> _demo.DemoCrashPointError:
    """Why ``--crash-at crash_at --crash-hit hit`` did not kill ``result``'s run, as the error.

    The hits that exist come from the child's own count (see :func:`report_unfired`),
    so the advice stays true whatever the scenario's agent does.
    """
    passed = _hits(result.stdout, crash_at) if result.returncode == 0 else None
    if passed is None:
        message = (
            f"the run did not reach crash point {crash_at} (hit {hit}); "
            f"exit {result.returncode}: {result.stderr.strip()[-400:]}"
        )
    elif passed == 0:
        message = f"the run finished without passing crash point {crash_at} at all; pick another"
    else:
        hits = "hit 1" if passed == 1 else f"hits 1-{passed}"
        message = (
            f"the run finished without reaching crash point {crash_at} hit {hit}: it passed "
            f"{crash_at} {passed} time(s), so --crash-hit reaches {hits}"
        )
    return _demo.DemoCrashPointError(crash_at, hit, passed, message)


def _hits(stdout: str, crash_at: str) -> int | None:
    lines = stdout.strip().splitlines()
    try:
        said = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if not isinstance(said, dict) or said.get("crash_point") != crash_at:
        return None
    hits = said.get("hits")
    return hits if isinstance(hits, int) else None
