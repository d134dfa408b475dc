"""Approval in the MCP client: a gated call put to the person there, signed in the gateway.

A tool the policy gates waits for a signed approval. ``tether approve`` and
the operator page sign one with an approver's key and leave it in the run's
inbox; the run reads it at its next step. Where the gateway is given an
approver's key at start (``--approver-key``) and the agent's MCP client
supports form elicitation, the gateway asks the person in the client
instead, and signs their yes with that key, the way the page signs:
``prepare_approval`` over the run as stored (bound to the run, the pending
action, its key and intent digest, the environment, the policy, an expiry
and a one-time nonce; checked against ``--trust`` before it is delivered),
then ``deliver`` to the inbox. The run applies it with every check it
applies to any approval; nothing here decides anything.

Two ways a client answers, by protocol era:

- a client of a handshake-era protocol (2025-11-25 and before) is sent an
  ``elicitation/create`` request while its ``tools/call`` is open;
- a client of 2026-07-28 (which takes no request from a server) is answered
  an ``InputRequiredResult`` carrying the question, and calls the tool again
  with the person's answer and the ``request_state`` it was given. That
  state is a one-time token the gateway remembers with the action it asked
  about; an answer with a token it did not hand out, or for another action,
  is not taken: the question is asked again.

What the person's answer is worth is what the client's prompt is worth: the
client, not the gateway, shows the question and collects the answer. The key
delegates approval to whoever answers that client's prompts; give it only
where that is the person who may approve.
"""

from __future__ import annotations

import json
import secrets
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import mcp_types as types

from tether.core import TetherError
from tether.crypto import Keyring, Role, Signer, TrustRoots
from tether.runtime import deliver, open_run, prepare_approval
from tether.store import ContentStore

#: The key of the question in an ``InputRequiredResult`` (and of its answer).
QUESTION_ID = "tether/approve"
#: Questions remembered for clients of 2026-07-28, oldest dropped first.
MAX_ASKED = 256
#: The form the person fills in: one yes/no.
FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve this call",
            "description": "Yes: the call is sent once, under your approval. No: nothing is sent.",
            "default": False,
        }
    },
    "required": ["approve"],
}


class ApproverKeyError(TetherError):
    """The approver's key given at start cannot sign approvals this gateway accepts."""


def check_approver(signer: Signer, trust: TrustRoots | None) -> None:
    """Refuse at start a key whose approvals the run would refuse: fail closed, before a call."""
    if signer.role is not Role.APPROVER:
        raise ApproverKeyError(
            f"--approver-key: {signer.signer_id}'s key is a {signer.role.value} key; an approval "
            "takes an approver's key (tether keys new --role approver)"
        )
    if trust is None:
        raise ApproverKeyError(
            "--approver-key needs --trust naming its public half: the run checks every approval "
            "against the trust roots"
        )
    try:
        trust.verify(signer.sign({"probe": "tether mcp --approver-key"}), Role.APPROVER)
    except TetherError as exc:
        raise ApproverKeyError(
            f"--approver-key: the trust file does not trust {signer.signer_id} as an approver "
            f"({exc}); add its .trust.json entry to --trust"
        ) from None


def elicits(ctx: Any) -> bool:
    """Whether the client of this request said it fills in forms (form elicitation)."""
    session = getattr(ctx, "session", None)
    caps = getattr(session, "client_capabilities", None)
    declared = getattr(caps, "elicitation", None)
    if declared is None:
        return False
    # An empty capability ({}) is form mode, as before modes existed.
    return declared.form is not None or declared.url is None


def can_ask_now(ctx: Any) -> bool:
    """Whether the server may send the client a request now (a handshake-era connection)."""
    return bool(getattr(ctx.session, "can_send_request", False))


class ClientApprover:
    """Puts a gated call to the person in the client and signs their yes (module docstring)."""

    def __init__(self, signer: Signer, trust: TrustRoots | None, keyring: Keyring) -> None:
        check_approver(signer, trust)
        self.signer = signer
        self._trust: TrustRoots | None = trust
        self._keyring = keyring
        # One-time tokens handed to clients of 2026-07-28: token -> the action asked about.
        self._asked: OrderedDict[str, str] = OrderedDict()

    @property
    def signer_id(self) -> str:
        """Who the approvals are signed as."""
        return self.signer.signer_id

    def question(self, tool: str, action_id: str, run_id: str, shown: str) -> str:
        """What the person reads: the call, the run, and what yes and no do."""
        return (
            f"The agent asks to call {tool} with arguments {shown}. The policy of run {run_id} "
            f"needs a person's approval first (action {action_id}); nothing has been sent. "
            f"Yes: the gateway signs the approval as {self.signer_id} and sends the call once. "
            "No: nothing is sent, and the call waits for a person (tether approve)."
        )

    def input_required(self, message: str, action_id: str) -> types.InputRequiredResult:
        """The question for a client of 2026-07-28, with a one-time token naming ``action_id``."""
        token = secrets.token_urlsafe(16)
        self._asked[token] = action_id
        while len(self._asked) > MAX_ASKED:
            self._asked.popitem(last=False)
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(message=message, requested_schema=FORM)
        )
        return types.InputRequiredResult(input_requests={QUESTION_ID: request}, request_state=token)

    def answer_in(self, params: Any, action_id: str) -> types.ElicitResult | None:
        """The person's answer a retried call carries for ``action_id``, or ``None`` (ask it).

        Taken once: its token is forgotten whether it matches or not.
        """
        responses = getattr(params, "input_responses", None) or {}
        answer = responses.get(QUESTION_ID)
        token = getattr(params, "request_state", None)
        if not isinstance(token, str):
            return None
        asked = self._asked.pop(token, None)
        if asked != action_id or not isinstance(answer, types.ElicitResult):
            return None
        return answer

    async def ask_now(self, ctx: Any, message: str) -> types.ElicitResult:
        """Ask a handshake-era client with ``elicitation/create`` inside the open call."""
        result: types.ElicitResult = await ctx.session.elicit_form(
            message, FORM, related_request_id=ctx.request_id
        )
        return result

    def sign(self, store: ContentStore, run_id: str, action_id: str) -> int:
        """Sign the approval of ``action_id`` as the operator page does and leave it in the inbox.

        Blocking (the store): call it from a worker thread. Refused, typed,
        where the runtime would refuse it (another pending action now, a
        lifetime over the policy's, a key the trust roots lack).
        """
        view = open_run(store, run_id, keyring=self._keyring, history=False)
        prepared = prepare_approval(
            view, self.signer, action_id, now=datetime.now(UTC), trust=self._trust
        )
        return deliver(store, prepared)


def said_yes(answer: types.ElicitResult | None) -> bool:
    """Whether the person accepted and ticked "approve"."""
    if answer is None or answer.action != "accept":
        return False
    content = answer.content or {}
    return content.get("approve") is True


def shown_arguments(arguments: Any, *, sensitive: bool, limit: int = 500) -> str:
    """A call's arguments as the person reads them (a sensitive tool's are not shown)."""
    if sensitive:
        return "(not shown: the tool is sensitive)"
    text = json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + " ..."
