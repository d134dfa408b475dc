"""One stage of a demo run in its own process: the process the demo may SIGKILL."""

from __future__ import annotations

import subprocess
import sys

from tether import _demo


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
        "_demo-child",
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
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        preexec_fn=_demo.die_with_parent(),  # safe: the demo starts no threads
    )
