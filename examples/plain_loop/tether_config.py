"""What tether needs besides the loop, written once per app: the run's scope, rules, keys, store.

``guarded.py`` imports :func:`runtime` from here. It builds the three
adapters that perform the loop's effects in one :class:`~tether.adapters.Adapters`
(the workspace's files, the ticket service over HTTP with an
``Idempotency-Key``, the mail server over SMTP, asked by ``Message-ID`` in
its Maildir after a crash), the task (which kinds and targets this run may
touch, its budgets, the verifier that judges the finished work) and the
policy (the risk of each kind, whether a person must approve it).
"""

from __future__ import annotations

import tether
from examples.plain_loop.desk import DRAFT, Config
from tether.adapters import (
    REFERENCE_PROFILE,
    Adapters,
    FileWorkspace,
    HttpEffect,
    MaildirLookup,
    SmtpEffect,
)
from tether.runtime import CrashPlan
from tether.store import ContentStore
from tether.testing import Sandbox

CUSTOMERS = ["customer@example.com"]
#: The finished run is judged on the workspace it owns: the reply promises a technician.
VERIFIER = (
    # "python": the workspace runs its own interpreter, so a case resumed under
    # another path to Python (an activated venv, python3) keeps the task's fingerprint.
    "python",
    "-c",
    "import pathlib, sys; sys.exit('technician' not in pathlib.Path('reply.txt').read_text())",
)
RULES = {
    "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False},
    "http.post": {"risk": "low", "permission": "service.write", "needs_approval": False},
    "email.send": {"risk": "medium", "permission": "mail.send", "needs_approval": False},
}


def adapters(config: Config) -> Adapters:
    """The workspace, the ticket service and the mail server, as one run's adapters."""
    return Adapters(
        FileWorkspace(config.workspace, config.state / "journal", verifier_allowlist=[VERIFIER]),
        # Each POST files a ticket of its own: the same ticket again is a replay.
        HttpEffect(config.tickets_url, profile=REFERENCE_PROFILE, targets="collection"),
        SmtpEffect(
            config.smtp_host,
            config.smtp_port,
            sender=config.sender,
            domain="shop.test",
            instance_id="plain-loop-mail",
            mailbox_lookup=MaildirLookup(config.maildir),
        ),
    )


def task() -> tether.TaskSpec:
    """What a run may do: write reply.txt, post tickets, email the customers; then be verified."""
    return tether.TaskSpec.from_json(
        {
            "task_id": "plain-loop-desk",
            "task_version": "1",
            "allowed_kinds": ["file.write", "http.post", "email.send"],
            "allowed_paths": ["reply.txt", "tickets", *CUSTOMERS],
            "permissions": ["workspace.write", "service.write", "mail.send"],
            "budgets": {"proposals": 40, "steps": 80, "wall_time_s": 3600, "cost": 100},
            # The workspace a case starts from holds the draft reply only.
            "initial_environment": {
                "namespace": "file-workspace",
                "state_fingerprint": Sandbox({"reply.txt": DRAFT}).environment().state_fingerprint,
            },
            "verifier": {"argv": list(VERIFIER), "timeout_s": 60},
        }
    )


def policy() -> tether.Policy:
    """No approvals here; ``"needs_approval": True`` on a kind would make a person sign first."""
    return tether.Policy.from_json(
        {
            "policy_id": "plain-loop",
            "policy_version": "1",
            "kinds": RULES,
            "max_risk": "medium",
            "approval_ttl_s": 600,
        }
    )


def keyring(config: Config) -> tether.Keyring:
    """The key that seals the run's checkpoints (made on first use; keep it, never print it)."""
    where = config.state / "keyring.json"
    if not where.exists():
        config.state.mkdir(parents=True, exist_ok=True)
        tether.Keyring.generate("plain-loop-1").write_file(where)
    return tether.Keyring.from_file(where)


def runtime(
    config: Config,
    *,
    store: ContentStore | None = None,
    keys: tether.Keyring | None = None,
    crash: CrashPlan | None = None,
) -> tether.Runtime:
    """The runtime a guarded loop's runs go through (store and keys default to ``config.state``)."""
    if store is None:
        config.state.mkdir(parents=True, exist_ok=True)
        store = tether.open_store(f"sqlite:///{config.state / 'runs.sqlite'}")
    return tether.Runtime(
        store=store,
        keyring=keys if keys is not None else keyring(config),
        adapter=adapters(config),
        task=task(),
        policy=policy(),
        crash=crash if crash is not None else CrashPlan(),
    )
