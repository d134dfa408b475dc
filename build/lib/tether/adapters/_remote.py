"""What every adapter of a remote system shares: its identity is its environment.

A ticket service or a mail server holds state tether cannot fingerprint, so
its environment is who it is (namespace and instance id, version 0) and its
effects live in the ledger. It offers no reads and runs no verifier; a
remote effect derives no new environment. Subclasses set
``ADAPTER_VERSION``, ``_kind``, ``_namespace`` and ``_capabilities``, and implement
``instance_id``, ``normalize``, ``execute`` and ``lookup``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tether.adapters._base import VerifierResult
from tether.adapters._filewrite import check_instance
from tether.core import (
    ActionKind,
    Capabilities,
    ContractViolationError,
    EnvironmentState,
    Intent,
    JSONValue,
    VerifierRefusedError,
    digest,
)


class RemoteEffect:
    """The shared half of :class:`~tether.adapters.HttpEffect` and ``SmtpEffect``."""

    _kind: ActionKind
    ADAPTER_VERSION: ClassVar[str] = "1"
    #: A remote system's effects leave the process: never allowed under ``local-only``.
    local_effects: ClassVar[bool] = False
    _namespace: str
    _capabilities: Capabilities

    @property
    def instance_id(self) -> str:  # pragma: no cover - every subclass names itself
        raise NotImplementedError

    @property
    def namespace(self) -> str:
        """Stable name of the kind of environment."""
        return self._namespace

    @property
    def version(self) -> str:
        """Adapter code version; bound into receipts."""
        return self.ADAPTER_VERSION

    @property
    def capabilities(self) -> Capabilities:
        """As the subclass declares them; never stateful."""
        return self._capabilities

    def environment(self) -> EnvironmentState:
        """The system's identity; version 0: a remote state is not fingerprinted."""
        instance = self.instance_id
        return EnvironmentState(self._namespace, instance, 0, digest({"instance": instance}))

    @property
    def kinds(self) -> tuple[ActionKind, ...]:
        """The one write kind this adapter carries out."""
        return (self.kind,)

    @property
    def kind(self) -> ActionKind:
        """The write kind this adapter carries out."""
        return self._kind

    def read(
        self, kind: str, target: str, args: dict[str, Any], scope: Any
    ) -> dict[str, JSONValue]:
        """A remote system offers no read kinds here."""
        raise ContractViolationError("unknown_kind", f"{self._namespace} has no read kind {kind!r}")

    def verify(self, argv: tuple[str, ...], timeout_s: int) -> VerifierResult:
        """A remote system runs no commands: verifiers run on a workspace."""
        raise VerifierRefusedError(f"{self._namespace} runs no verifier commands")

    def derive_post_state(self, prestate: EnvironmentState, intent: Intent) -> EnvironmentState:
        """The same identity: a remote effect leaves nothing here to fingerprint."""
        check_instance(prestate, self._namespace, self.instance_id)
        return prestate

    def _check_kind(self, kind: str) -> None:
        if kind != self.kind.name:
            raise ContractViolationError("unknown_kind", f"{self._namespace} cannot {kind!r}")

    def _check_send(self, key: str, intent: Intent, prestate: EnvironmentState) -> None:
        """What every send checks first: a key, this instance, this adapter's kind."""
        if not key:
            raise ContractViolationError("bad_key", "the idempotency key must not be empty")
        check_instance(prestate, self._namespace, self.instance_id)
        self._check_kind(intent.kind)
