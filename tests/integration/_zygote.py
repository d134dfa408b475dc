"""A parent that forks each trial's processes after the heavy imports, and its driver.

A kill test needs a new process per phase of every trial; LangGraph or
PydanticAI plus tether take seconds to import. ``serve`` runs in a parent
that imported them once: it forks one child per request line, and each
child is a real, new process (a real SIGKILL ends it). ``Zygote`` drives
that parent from the test, with a time limit per child.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.integration._services import REPO

#: A child that neither ends nor dies by then is stuck: its whole group is killed.
CHILD_TIMEOUT_S = 120


def serve(run: Callable[[dict[str, Any]], int]) -> None:
    """Fork one child per request line (JSON) running ``run``; answer each with its exit status."""
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run(request)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


class Zygote:
    """``python -m MODULE zygote`` (under ``-O`` when the tests are), and one child per call."""

    def __init__(self, module: str, stderr: Path | None = None) -> None:
        self.stderr = stderr
        sink = None if stderr is None else open(stderr, "w")  # noqa: SIM115 (kept by the child)
        cmd = [sys.executable, *["-O"] * sys.flags.optimize, "-m", module, "zygote"]
        self.process = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
            start_new_session=True,  # its forked children share its group: one kill ends all
        )
        if sink is not None:
            sink.close()

    def run(self, **request: Any) -> int:
        """One new process for ``request``; its exit code (``-9``: killed by SIGKILL)."""
        if self.process.stdin is None or self.process.stdout is None:
            raise RuntimeError("the zygote has no pipes")
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], CHILD_TIMEOUT_S)
        if not ready:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise RuntimeError(f"{request} did not end in {CHILD_TIMEOUT_S} s")
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the zygote ended (exit {self.process.wait(timeout=10)})")
        return int(json.loads(answer)["exit"])

    def log(self) -> str:
        """The end of what the children wrote to stderr (when it goes to a file)."""
        return "" if self.stderr is None else self.stderr.read_text()[-2000:]

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()
