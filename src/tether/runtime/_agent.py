"""The agent interface: the user's code, behind one small method.

Given the run's restored context and a fresh observation, the agent returns
its next decision: a proposal, or "finished". Its context (messages, memory,
plan cursor, secrets) is saved with each checkpoint by content digest, so a
recovered run hands the agent exactly the context of the checkpoint it
resumed from.

Secret items (``AgentContext.secrets``) are stored sealed: the stored blob
holds their AES-256-GCM ciphertext only (see :class:`~tether.crypto.SecretBox`),
and the blob's digest, which the signed checkpoint pins, covers that
ciphertext. On restore they are released only when the caller says the
reader may see them and holds the key; otherwise each is replaced by
:data:`REDACTED` and named in ``AgentContext.redacted`` (or the restore is
refused). An item the agent leaves unchanged keeps its stored ciphertext, so a
redacted epoch can still commit and a later authorized one gets the value back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from tether.core import (
    CanonicalJSONError,
    CheckpointCorruptError,
    JSONValue,
    Observation,
    Proposal,
    SpecError,
    canonical_bytes,
    digest_bytes,
    strict_loads,
)
from tether.core._fields import Fields
from tether.crypto import SealedSecret, SecretAccessError, SecretBox, SecretKeyError

#: What a withheld secret item reads as; its name is in ``AgentContext.redacted``.
REDACTED = "[secret withheld]"


class Withheld(StrEnum):
    """What a restore does with secret items it may not release."""

    REDACT = "redact"  # hand them back as REDACTED, named in AgentContext.redacted
    REFUSE = "refuse"  # raise SecretAccessError; nothing is restored

    @classmethod
    def of(cls, value: Withheld | str, what: str = "on_withheld") -> Withheld:
        """``value`` as a :class:`Withheld`, or :class:`~tether.core.SpecError` naming ``what``."""
        try:
            return cls(value)
        except ValueError:
            raise SpecError(what, f"must be 'redact' or 'refuse', not {value!r}") from None


@dataclass(frozen=True, slots=True)
class _Held:
    """A stored sealed item, and (only if it was released) which plaintext it seals."""

    run_id: str
    plain: str | None  # SHA-256 of the canonical plaintext; None: never released here
    item: SealedSecret

    def seals(self, run_id: str, value: JSONValue) -> bool:
        if run_id != self.run_id:
            return False  # sealed for another run: it would not open here
        if self.plain is None:
            return isinstance(value, str) and value == REDACTED
        return self.plain == _plain_digest(value)


@dataclass(frozen=True, slots=True)
class AgentContext:
    """What the agent remembers. Everything in it must be JSON.

    ``secrets`` maps item names to JSON values the agent reads like
    ``memory``, but which are sealed at rest and never shown by ``repr``.
    ``redacted`` names the items this restore withheld (their value is
    :data:`REDACTED`); keep them (``dataclasses.replace`` does) and they keep
    their stored ciphertext; assign a new value and it is sealed anew;
    leave an item out and it is deleted.
    """

    messages: tuple[JSONValue, ...] = ()
    memory: dict[str, Any] = field(default_factory=dict)
    plan_cursor: int = 0
    secrets: dict[str, JSONValue] = field(default_factory=dict)
    redacted: tuple[str, ...] = ()
    # The stored ciphertext of each secret item; in memory only, never compared.
    _held: Mapping[str, _Held] = field(default_factory=dict, compare=False)

    def __repr__(self) -> str:
        # Names only: a secret's value never reaches a log line through repr.
        return (
            f"AgentContext(messages={self.messages!r}, memory={self.memory!r}, "
            f"plan_cursor={self.plan_cursor!r}, secrets={sorted(self.secrets)!r}, "
            f"redacted={self.redacted!r})"
        )

    def to_json(self) -> dict[str, JSONValue]:
        """The context without its secrets (those are stored sealed, see :meth:`encode`)."""
        return {
            "messages": list(self.messages),
            "memory": self.memory,
            "plan_cursor": self.plan_cursor,
        }

    def seal(
        self, *, run_id: str, box: SecretBox | None, previous: AgentContext | None = None
    ) -> AgentContext:
        """This context with every secret item sealed for ``run_id``, ready to :meth:`encode`.

        An item whose value is the one already sealed (here or in
        ``previous``, the context it replaces), or still :data:`REDACTED`
        where it was withheld, keeps its ciphertext; anything else is sealed
        under ``box``'s active key. Without a box a new value cannot be
        sealed: :class:`~tether.crypto.SecretKeyError`, before anything moves.
        """
        held: dict[str, _Held] = {}
        for name, value in self.secrets.items():
            if not isinstance(name, str) or not name:
                raise SecretKeyError("secret context item names must be non-empty strings")
            prior = self._held.get(name)
            if (prior is None or not prior.seals(run_id, value)) and previous is not None:
                prior = previous._held.get(name)
            if prior is not None and prior.seals(run_id, value):
                held[name] = prior
                continue
            if box is None:
                raise SecretKeyError(
                    f"run {run_id}: secret context item {name!r} is new or changed and no "
                    "secret box was given to seal it; nothing was committed"
                )
            held[name] = _Held(
                run_id, _plain_digest(value), box.seal(value, run_id=run_id, name=name)
            )
        redacted = tuple(sorted(n for n, h in held.items() if h.plain is None))
        return replace(self, redacted=redacted, _held=held)

    def encode(self) -> tuple[str, bytes]:
        """``(digest, canonical bytes)``: how the context is stored by content.

        Secret items are written as their ciphertext only; an item :meth:`seal`
        has not sealed (or whose value changed since) is refused, never
        written in plaintext.
        """
        doc = self.to_json()
        if self.secrets:
            sealed: dict[str, JSONValue] = {}
            for name, value in self.secrets.items():
                held = self._held.get(name)
                if held is None or not held.seals(held.run_id, value):
                    raise SecretKeyError(
                        f"secret context item {name!r} is not sealed; seal() the context "
                        "with the run's secret box first"
                    )
                sealed[name] = held.item.to_json()
            doc["secrets"] = sealed
        body = canonical_bytes(doc)
        return digest_bytes(body), body

    @classmethod
    def decode(
        cls,
        expected_digest: str,
        body: bytes,
        *,
        run_id: str = "",
        box: SecretBox | None = None,
        release: bool = False,
        on_withheld: Withheld | str = Withheld.REDACT,
    ) -> AgentContext:
        """Parse stored context, refusing bytes whose digest is not ``expected_digest``.

        Secret items are opened with ``box`` only when ``release`` is true
        and a box is given; otherwise they are withheld as ``on_withheld``
        says. A wrong or missing key id, or a ciphertext that does not
        authenticate for ``run_id`` and its name, fails closed.
        """
        withheld = Withheld.of(on_withheld)
        if digest_bytes(body) != expected_digest:
            raise CheckpointCorruptError(
                f"agent context {expected_digest} does not match its bytes", run_id=run_id or None
            )
        try:
            doc = strict_loads(body)
        except CanonicalJSONError as exc:
            raise CheckpointCorruptError(f"agent context is not JSON: {exc}") from exc

        def error(fld: str, problem: str) -> Exception:
            return CheckpointCorruptError(f"agent context {fld}: {problem}", run_id=run_id or None)

        f = Fields(doc, "", error)
        memory = f.raw("memory")
        if not isinstance(memory, dict):
            f.fail("memory", "expected an object")
        sealed: dict[str, SealedSecret] = {}
        stored = f.optional_raw("secrets")
        if stored is not None:
            # Written only when there is at least one item; an empty object is not ours.
            if not isinstance(stored, dict) or not stored:
                f.fail("secrets", "expected a non-empty object")
            for name, item in sorted(stored.items()):
                if not name:
                    f.fail("secrets", "an item name is empty")
                sealed[name] = SealedSecret.from_fields(Fields(item, f"secrets.{name}", error))
        context = cls(
            messages=tuple(f.list("messages")), memory=memory, plan_cursor=f.int("plan_cursor")
        )
        f.done()
        if not sealed:
            return context
        if release and box is not None:
            secrets = {n: box.open(s, run_id=run_id, name=n) for n, s in sealed.items()}
            held = {n: _Held(run_id, _plain_digest(secrets[n]), s) for n, s in sealed.items()}
            return replace(context, secrets=secrets, _held=held)
        names = tuple(sealed)
        if withheld is Withheld.REFUSE:
            why = "no secret key was given" if release else "the reader may not read secrets"
            raise SecretAccessError(run_id, names, why)
        return replace(
            context,
            secrets=dict.fromkeys(names, REDACTED),
            redacted=names,
            _held={n: _Held(run_id, None, s) for n, s in sealed.items()},
        )


def _plain_digest(value: JSONValue) -> str:
    try:
        plain = canonical_bytes(value)
    except CanonicalJSONError:
        raise SecretKeyError("a secret context item is not a JSON value") from None
    return hashlib.sha256(plain).hexdigest()


@dataclass(frozen=True, slots=True)
class Decision:
    """The agent's answer: a new context and either a proposal or ``finished``."""

    context: AgentContext
    proposal: Proposal | None = None
    finished: bool = False
    summary: str = ""


@runtime_checkable
class Agent(Protocol):
    """User code that decides the next write."""

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        """Return the next decision for ``observation`` given the restored ``context``."""
        ...
