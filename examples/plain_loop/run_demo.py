"""Run both loops against real services on loopback, kill each after its ticket went out, rerun.

    python -m examples.plain_loop.run_demo [--dir DIR] [--crashtest]

(from the repository root, after ``make .venv/.installed``; ``.venv/bin/python``).
It starts the reference ticket service (``python -m
tether.testing.effects_service``) and the reference mail server (``python -m
tether.testing.mail_server``, delivering into a Maildir) on free loopback
ports, the way ``tether demo --scenario support-desk`` does, and stops them
at the end. Then, for each version of the loop: one process runs a case and
is killed with SIGKILL right after the ticket was sent (the unguarded tool
returned; the guarded call's adapter committed, before tether recorded the
receipt), a second process runs the same case again, and what the ticket
service and the mailbox hold for the case is counted from their own books.
``--crashtest`` runs ``tether crashtest`` on the guarded loop instead, with
the same services started for it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import mailbox
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from examples.plain_loop.desk import DRAFT, Config, request

REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("unguarded", "guarded")
#: A loop that neither ends nor dies by then is stuck: the demo stops, it does not hang.
_TIMEOUT_S = 120


@contextmanager
def services(base: Path) -> Iterator[dict[str, str]]:
    """Start the ticket service and the mail server under ``base``; the loop's environment."""
    # The support-desk demo's starter (a private helper of tether's own demo):
    # free ports, first-line handshake, both stopped on the way out.
    from tether import _demo, _desk

    with _desk.running_services(_demo.DemoPaths.under(base), mail_lookup=True) as running:
        yield {
            "PLAIN_LOOP_TICKETS_URL": running.ticket_url,
            "PLAIN_LOOP_SMTP_HOST": running.smtp_host,
            "PLAIN_LOOP_SMTP_PORT": str(running.smtp_port),
            "PLAIN_LOOP_MAILDIR": str(running.maildir),
        }


def fresh_case(base: Path, version: str, env: dict[str, str]) -> dict[str, str]:
    """A workspace holding the draft reply, and tether's state directory, for one version."""
    workspace, state = base / version / "workspace", base / version / "tether"
    workspace.mkdir(parents=True)
    (workspace / "reply.txt").write_text(DRAFT)
    return {**env, "PLAIN_LOOP_WORKSPACE": str(workspace), "PLAIN_LOOP_STATE": str(state)}


def world(config: Config, case: str) -> dict[str, Any]:
    """What the systems hold for ``case``: the reply file, its tickets (``#id title``), email subjects."""
    answer = httpx.get(config.tickets_url + "/tickets", timeout=10)
    answer.raise_for_status()
    tickets = [(t["ticket_id"], json.loads(t["body"])["title"]) for t in answer.json()["tickets"]]
    subjects = []
    if config.maildir.exists():
        box = mailbox.Maildir(config.maildir, create=False)
        subjects = [str(box.get_message(key)["Subject"]) for key in box.iterkeys()]
    return {
        "reply.txt": (config.workspace / "reply.txt").read_text(),
        "tickets": sorted(f"#{n} {title}" for n, title in tickets if title.startswith(f"[{case}]")),
        "emails": sorted(s for s in subjects if s.startswith(f"[{case}]")),
    }


def crash_then_rerun(version: str, case: str, env: dict[str, str]) -> dict[str, Any]:
    """Kill ``version``'s loop right after its ticket is sent, run the case again; the world."""
    child = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    me = [sys.executable, "-m", "examples.plain_loop.run_demo"]
    killed = subprocess.run(
        [*me, "--kill-after-ticket", version, case],
        env=child,
        cwd=REPO,
        check=False,
        timeout=_TIMEOUT_S,
    )
    if killed.returncode != -signal.SIGKILL:
        raise SystemExit(f"the {version} loop was not killed (exit {killed.returncode})")
    again = [sys.executable, "-m", f"examples.plain_loop.{version}", case]
    subprocess.run(
        again, env=child, cwd=REPO, check=True, stdout=subprocess.DEVNULL, timeout=_TIMEOUT_S
    )
    return world(Config.from_env(env), case)


def kill_after_ticket(version: str, case: str) -> None:
    """Run ``case`` and SIGKILL this process right after the ticket left (the child's part)."""
    loop: Any = importlib.import_module(f"examples.plain_loop.{version}")
    if version == "unguarded":
        send = loop.TOOLS["open_ticket"]

        def send_then_die(*args: Any, **kwargs: Any) -> Any:
            sent = send(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
            return sent

        loop.TOOLS["open_ticket"] = send_then_die
        loop.main(case)
        return
    import tether
    from examples.plain_loop.tether_config import runtime
    from tether.runtime import CrashPlan, CrashPoint

    # tether's own crash window: the ticket (the run's 2nd effect) committed at the
    # service, its receipt not yet recorded; the kill is a real SIGKILL.
    plan = CrashPlan(CrashPoint.EFFECT_SENT, nth=2, mode="kill")
    with tether.effects.run(runtime(loop.CONFIG, crash=plan), case) as run:
        loop.agent_loop(request(case))
        run.finish("customer answered")


def main(argv: list[str] | None = None) -> int:
    """Both loops, killed and rerun, side by side."""
    parser = argparse.ArgumentParser(prog="python -m examples.plain_loop.run_demo")
    parser.add_argument(
        "--dir", type=Path, help="where services and workspaces live (default: a temp dir)"
    )
    parser.add_argument(
        "--crashtest",
        action="store_true",
        help="instead: run `tether crashtest` on the guarded loop, every window of every effect",
    )
    parser.add_argument(
        "--kill-after-ticket", nargs=2, metavar=("VERSION", "CASE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.kill_after_ticket:
        kill_after_ticket(*args.kill_after_ticket)
        return 0
    base = args.dir if args.dir is not None else Path(tempfile.mkdtemp(prefix="plain-loop-"))
    if args.crashtest:
        with services(base) as env:
            tether = [sys.executable, "-m", "tether.cli", "crashtest"]
            app = ["--app", "examples.plain_loop.crash_app:app"]
            child = {**os.environ, **env, "PYTHONPATH": str(REPO)}
            return subprocess.run([*tether, *app], env=child, cwd=REPO, check=False).returncode
    with services(base) as env:
        for version in VERSIONS:
            got = crash_then_rerun(version, f"{version}-1", fresh_case(base, version, env))
            print(f"{version}: killed after the ticket was sent, then run again:")
            print(f"  tickets {got['tickets']}\n  emails  {got['emails']}")
    print(f"services, workspaces and tether's store: {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
