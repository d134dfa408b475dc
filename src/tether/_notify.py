"""The notify demo: the second seed's own example, end to end.

A digital employee marks an order shipped in a real workspace, emails the
customer through a real SMTP server, then makes a bad edit and fails its
verifier. An operator rewinds context and workspace to before the send. The
recovered agent is handed the rewind memory; when its restored plan proposes
the notification again, the ledger answers with the receipt of the one
already in the customer's inbox (replayed, not sent). It then makes the right
edit and finishes. The mailbox holds exactly one message; the trace shows
both epochs, the signed admission of the rewind and the email that crossed
the rewind boundary.
"""

from __future__ import annotations

import secrets
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

from tether import _demo, _desk
from tether.adapters import Adapters, FileWorkspace, SmtpEffect
from tether.core import Observation, Proposal, Purpose, TaskSpec, new_admission
from tether.core._rewind import REWIND_MEMORY_KEY
from tether.crypto import Keyring, Signer
from tether.runtime import AgentContext, Decision

RUN_ID = "notify-1"
CUSTOMER = "customer@example.com"
ORDER = "order 1042: packed\n"
SHIPPED = "order 1042: shipped\n"
WRONG = "order 1042: shipped\nrefund: issued\n"  # the bad edit the verifier catches
RIGHT = "order 1042: shipped\ntracking: 1Z999\n"
NOTICE = {"subject": "Your order 1042 has shipped", "body": "It is on its way. Thank you!\n"}
VERIFIER = (
    "python",
    "-c",
    "import pathlib, sys; t = pathlib.Path('order.txt').read_text(); "
    "sys.exit(not ('tracking' in t and 'refund' not in t))",
)


class NotifyAgent:
    """Ships, notifies, edits, finishes; after a rewind it reads its memory and edits right."""

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        cursor = context.plan_cursor
        version = observation.environment.version
        rewound = bool(context.memory.get(REWIND_MEMORY_KEY))
        plan: list[Proposal | None] = [
            Proposal("mark-shipped", "file.write", "order.txt", {"content": SHIPPED}, version),
            Proposal("notify-customer", "email.send", CUSTOMER, dict(NOTICE), version),
            Proposal(
                "record-outcome",
                "file.write",
                "order.txt",
                {"content": RIGHT if rewound else WRONG},
                version,
            ),
        ]
        nxt = AgentContext(context.messages, context.memory, cursor + 1, secrets=context.secrets)
        if cursor < len(plan):
            return Decision(nxt, plan[cursor])
        if cursor == len(plan):
            return Decision(nxt, finished=True, summary="order shipped and customer told")
        return Decision(context)  # the verifier said no: wait for a person


def prepare(paths: _demo.DemoPaths) -> Signer:
    """Seed the order file; write keys, trust roots, task and policy. The operator's key."""
    paths.workspace.mkdir(parents=True, exist_ok=True)
    paths.db.parent.mkdir(parents=True, exist_ok=True)
    (paths.workspace / "order.txt").write_text(ORDER)
    if not paths.keyring.exists():
        Keyring.generate("demo-1").write_file(paths.keyring)
    with workspace(paths) as ws:
        fingerprint = ws.environment().state_fingerprint
    task = {
        "task_id": "notify",
        "task_version": "1",
        "allowed_kinds": ["file.write", "email.send"],
        "allowed_paths": ["order.txt", CUSTOMER],
        "permissions": ["workspace.write", "mail.send"],
        "budgets": {"proposals": 12, "steps": 20, "wall_time_s": 600, "cost": 20},
        "initial_environment": {"namespace": "file-workspace", "state_fingerprint": fingerprint},
        "verifier": {"argv": list(VERIFIER), "timeout_s": 60},
    }
    TaskSpec.from_json(_demo._json(task))
    paths.task.write_text(_demo._json(task))
    policy = {
        "policy_id": "demo-notify",
        "policy_version": "1",
        "kinds": {
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False},
            "email.send": {"risk": "medium", "permission": "mail.send", "needs_approval": False},
        },
        "max_risk": "medium",
        "approval_ttl_s": 900,
        "authority": {"rewind": ["operator"]},
    }
    paths.policy.write_text(_demo._json(policy))
    operator = Signer.generate("demo-operator", "operator")
    operator.write_file(paths.signer_key("operator"))
    paths.trust.write_text(_demo._json({"signers": [operator.trust_root()]}))
    return operator


def workspace(paths: _demo.DemoPaths) -> FileWorkspace:
    return FileWorkspace(paths.workspace, paths.journal, verifier_allowlist=[VERIFIER])


def run(paths: _demo.DemoPaths) -> dict[str, Any]:
    """The whole story in this process, against a real mail server; the summary."""
    operator = prepare(paths)
    home = _desk.desk_dir(paths)
    home.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        mail = stack.enter_context(
            _desk._child_service(
                ["tether.testing.mail_server", "--maildir", str(home / "Maildir")],
                home / "mail.log",
            )
        )
        maildir = home / "Maildir"
        smtp = SmtpEffect(
            str(mail["host"]),
            int(mail["port"]),
            sender="orders@shop.test",
            domain="shop.test",
            instance_id="demo-mail",
            timeout_s=10,
        )
        ws = stack.enter_context(workspace(paths))
        store = _demo.open_demo_store(paths)
        stack.callback(store.close)
        rt = _demo.runtime(paths, Adapters(ws, smtp), store=store, agent=NotifyAgent())
        story: list[str] = []
        session = rt.start(RUN_ID)
        before_send = 0
        while session.state.plan_cursor < 4 and not session.state.phase.terminal:
            outcome = session.step()
            if outcome.event == "effect_committed" and session.state.plan_cursor == 1:
                # The write's rewind point: its own checkpoint, or, while its receipt
                # waits, the next commit's (which records the state right after it).
                before_send = session.state.generation + int(session.receipt_waiting)
        sent = len(_desk.delivered(maildir))
        story.append(
            f"1. the agent marked the order shipped (generation {before_send}), emailed the "
            f"customer ({sent} message in the mailbox), then wrote a wrong line and its "
            "verifier failed"
        )
        # An operator signs a rewind to before the send and leaves it in the inbox.
        request = rt.admission_request(
            RUN_ID,
            purpose=Purpose.REWIND,
            target_generation=before_send,
            reason="the outcome line was wrong; redo from before the notification",
        )
        now = rt.clock.now()
        body = new_admission(
            request,
            operator.signer_id,
            issued_at=now,
            expires_at=now + timedelta(seconds=600),
            nonce=secrets.token_hex(16),
        )
        store.put_evidence(RUN_ID, "rewind", operator.sign(body))
        story.append(
            f"2. an operator signed a rewind to generation {before_send} (what `tether rewind "
            f"{RUN_ID} --to {before_send} --reason ... --key demo-operator.key` does)"
        )
        again = _demo.open_demo_store(paths)
        stack.callback(again.close)
        recovered = _demo.runtime(paths, Adapters(ws, smtp), store=again, agent=NotifyAgent())
        session = recovered.recover(RUN_ID)
        final = session.run()
        memory = session.context.memory.get(REWIND_MEMORY_KEY, [])
        done = memory[-1]["effects_already_done"] if memory else []
        trace = session.trace()
        replayed = [e for e in trace if e.kind == "effect_replayed"]
        story.append(
            "3. the run restored order.txt and the agent's context together and handed the agent "
            f"its rewind memory: {len(done)} effect(s) already done ("
            + ", ".join(f"{c['kind']} to {c['target']}" for c in done)
            + ")"
        )
        story.append(
            f"4. the restored plan proposed the notification again: {len(replayed)} replayed "
            "from the ledger, nothing sent; the agent then wrote the right line and finished "
            f"({final.state.phase})"
        )
        delivered = len(_desk.delivered(maildir))
        story.append(f"5. the customer's mailbox holds {delivered} message(s)")
        epochs = [e for e in trace if e.kind in {"run_started", "recovered", "rewind_started"}]
        rewound = next(e for e in trace if e.kind == "rewound")
        summary = {
            "scenario": "notify",
            "run_id": RUN_ID,
            "db": str(paths.db),
            "workspace": str(paths.workspace),
            "keyring": str(paths.keyring),
            "maildir": str(maildir),
            "phase": final.state.phase.value,
            "delivered": delivered,
            "rewound_to": before_send,
            "replayed": len(replayed),
            "crossed": rewound.data["crossed"],
            "undone": rewound.data["undone"],
            "epochs": [
                {
                    "event": e.kind,
                    "principal": e.data.get("principal"),
                    "signed": e.data.get("signed"),
                    "admission": e.data.get("admission"),
                }
                for e in epochs
            ],
            "order": Path(paths.workspace / "order.txt").read_text(),
            "story": story,
        }
        return summary
