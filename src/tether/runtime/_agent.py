"""The agent interface: the user's code, behind one small method.

Given the run's restored context and a fresh observation, the agent returns
its next decision: a proposal, or "finished". Its context (messages, memory,
plan cursor) is saved with each checkpoint by content digest, so a recovered
run hands the agent exactly the context of the checkpoint it resumed from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tether.core import (
    CanonicalJSONError,
    CheckpointCorruptError,
    Fields,
    JSONValue,
    Observation,
    Proposal,
    canonical_bytes,
    digest_bytes,
    strict_loads,
)


@dataclass(frozen=True, slots=True)
class AgentContext:
    """What the agent remembers. Everything in it must be JSON."""

    messages: tuple[JSONValue, ...] = ()
    memory: dict[str, Any] = field(default_factory=dict)
    plan_cursor: int = 0

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "messages": list(self.messages),
            "memory": self.memory,
            "plan_cursor": self.plan_cursor,
        }

    def encode(self) -> tuple[str, bytes]:
        """``(digest, canonical bytes)``: how the context is stored by content."""
        body = canonical_bytes(self.to_json())
        return digest_bytes(body), body

    @classmethod
    def decode(cls, expected_digest: str, body: bytes) -> AgentContext:
        """Parse stored context, refusing bytes whose digest is not ``expected_digest``."""
        if digest_bytes(body) != expected_digest:
            raise CheckpointCorruptError(
                f"agent context {expected_digest} does not match its bytes"
            )
        try:
            doc = strict_loads(body)
        except CanonicalJSONError as exc:
            raise CheckpointCorruptError(f"agent context is not JSON: {exc}") from exc

        def error(fld: str, problem: str) -> Exception:
            return CheckpointCorruptError(f"agent context {fld}: {problem}")

        f = Fields(doc, "", error)
        memory = f.raw("memory")
        if not isinstance(memory, dict):
            f.fail("memory", "expected an object")
        context = cls(
            messages=tuple(f.list("messages")), memory=memory, plan_cursor=f.int("plan_cursor")
        )
        f.done()
        return context


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
