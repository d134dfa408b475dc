"""examples/quickstart.py, run as written in a real interpreter, killed with SIGKILL mid-loop, run again.

Nothing here drives tether from the test: the script is the user's, its
keyring is made on first use in the data directory the test gives it, and
the world is counted from the script's own outbox file.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.py"


def start(cwd: Path, data: Path) -> subprocess.Popen[str]:
    """The quickstart in its own interpreter, its default keyring under ``data``."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TETHER_KEYRING")},
        "XDG_DATA_HOME": str(data),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    return subprocess.Popen(
        [sys.executable, str(QUICKSTART)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def outbox(cwd: Path) -> list[dict[str, str]]:
    """The emails the script's stand-in mail service holds."""
    path = cwd / "outbox.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_the_quickstart_killed_mid_loop_and_run_again_sends_each_email_once(
    tmp_path: Path,
) -> None:
    """SIGKILL once two emails are out, run again: five emails, one each, the first ones replayed."""
    data = tmp_path / "data"
    first = start(tmp_path, data)
    deadline = time.monotonic() + 120
    while len(outbox(tmp_path)) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    first.send_signal(signal.SIGKILL)
    out, err = first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL, (out, err)
    landed = len(outbox(tmp_path))
    assert 2 <= landed < 5  # killed mid-loop, as meant

    again = start(tmp_path, data)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    expected = [
        f"{'replayed' if n <= landed else 'executed'} user{n}@example.com" for n in range(1, 6)
    ]
    assert out.splitlines() == expected
    emails = outbox(tmp_path)
    assert [e["to"] for e in emails] == [f"user{n}@example.com" for n in range(1, 6)]
    assert len({e["key"] for e in emails}) == 5  # each email under its own key, sent once

    last = start(tmp_path, data)
    out, err = last.communicate(timeout=120)
    assert (last.returncode, out) == (0, "run welcome is completed\n"), err
    assert len(outbox(tmp_path)) == 5


def test_the_quickstart_makes_its_keyring_private_and_never_prints_it(tmp_path: Path) -> None:
    """The first run makes ~/.local/share/tether/keyring.json (0600, dir 0700); no output holds it."""
    data = tmp_path / "data"
    run = start(tmp_path, data)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    keyring = data / "tether" / "keyring.json"
    assert stat.S_IMODE(keyring.stat().st_mode) == 0o600
    assert stat.S_IMODE(keyring.parent.stat().st_mode) == 0o700
    assert not (tmp_path / "keyring.json").exists()  # beside the store: never
    (entry,) = json.loads(keyring.read_text())["keys"]
    assert entry["secret"] not in out + err
    assert entry["id"].startswith("k-")
