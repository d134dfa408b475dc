"""The deployment contract a run is recorded under: effects beyond versioned storage, or none.

The recovery contract (ledger, keys, compensation, human gates) exists for
effects that a rewind cannot take back. A fully local deployment (a coding
workspace, an in-memory sandbox) may declare that it has none: ``local-only``.
That is an assumption to record, not to infer, so it is written into every
checkpoint, refused for a runtime whose adapters can reach the world, and a
recovery under another contract than the one the run was begun under is
refused: the run's history was judged under its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from tether.core._errors import BindingMismatchError, PolicyError, SpecError


class Contract(StrEnum):
    """What a deployment promises about the effects its runs can have.

    ``standard``: effects may reach the world outside versioned storage (HTTP,
    mail); the whole recovery contract applies. ``local-only``: every effect
    lands in local, versioned storage the run can rewind; no adapter that can
    reach the world is allowed.
    """

    STANDARD = "standard"
    LOCAL_ONLY = "local-only"


class ExternalEffectsError(PolicyError):
    """A ``local-only`` runtime was given adapters that declare effects outside it.

    ``external`` names those adapters (their namespaces). Remove them, or run
    under the ``standard`` contract.
    """

    def __init__(self, external: tuple[str, ...]) -> None:
        self.external = external
        super().__init__(
            f"the local-only contract allows no effects outside versioned storage, and these "
            f"adapters declare some: {list(external)}; drop them or use contract='standard'"
        )


class ContractMismatchError(BindingMismatchError):
    """A run is recovered under another contract than the one its checkpoint records."""

    def __init__(self, expected: Contract, actual: Contract, *, run_id: str | None = None) -> None:
        super().__init__("contract", expected.value, actual.value, run_id=run_id)


def parse_contract(value: object) -> Contract:
    """``value`` as a :class:`Contract`, or :class:`~tether.core.SpecError` naming the choices."""
    if isinstance(value, Contract):
        return value
    if isinstance(value, str) and value in {c.value for c in Contract}:
        return Contract(value)
    raise SpecError("contract", f"must be one of {[c.value for c in Contract]}, not {value!r}")


def check_local_only(contract: Contract, external: Iterable[str]) -> None:
    """Refuse a ``local-only`` contract for adapters that declare external effects."""
    outside = tuple(sorted(external))
    if contract is Contract.LOCAL_ONLY and outside:
        raise ExternalEffectsError(outside)


def check_recovery_contract(run_id: str, recorded: Contract, now: Contract) -> None:
    """A recovery under another contract than the checkpoint's is refused."""
    if recorded is not now:
        raise ContractMismatchError(now, recorded, run_id=run_id)
