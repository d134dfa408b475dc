"""tether: long-running agent tasks that recover from crashes without repeating an effect.

Known effects are not repeated, unknown effects are not silently replayed,
and unreconcilable cases enter an explicit human gate.

The shortest path: declare your effects, guard them with a store, run your loop::

    runtime = tether.guard("sqlite:///runs.sqlite", send_email)
    with tether.effects.run(runtime, "case-1") as run:
        send_email("ana@example.com", "Hello")
        run.finish()

Test doubles (``Sandbox``) and the crash harness live in :mod:`tether.testing`.
"""

from tether import effects
from tether.adapters import (
    Adapter,
    Adapters,
    Capabilities,
    Fence,
    FileWorkspace,
    VerifierResult,
)
from tether.core import (
    ActionResult,
    AdapterError,
    AdmissionRefusedError,
    ApprovalRequiredError,
    EffectNotSettledError,
    EffectRejectedError,
    EffectStatus,
    EffectUnrecordedError,
    EnvironmentDriftError,
    EnvironmentState,
    EvidenceError,
    IntegrityError,
    Intent,
    LedgerEntry,
    NeedsReviewError,
    NotInRunError,
    Observation,
    Outcome,
    OutcomeKind,
    Phase,
    Policy,
    PolicyError,
    PolicyMismatchError,
    Proposal,
    Receipt,
    ReviewDecision,
    RunBusyError,
    RunState,
    RunTerminalError,
    SpecError,
    StoreError,
    TaskMismatchError,
    TaskSpec,
    TetherError,
    TrustRootsRequiredError,
    new_approval,
    new_decision,
)
from tether.crypto import Keyring, KeyringError, SecretBox, Signer, TrustRoots
from tether.effects import current_fence, current_key, effect, function_effect
from tether.runtime import (
    Agent,
    AgentContext,
    Decision,
    RunSession,
    Runtime,
    Worker,
    guard,
)
from tether.store import PostgresStore, SQLiteStore, open_store

__version__ = "0.1.0"

__all__ = [
    "ActionResult",
    "Adapter",
    "AdapterError",
    "Adapters",
    "AdmissionRefusedError",
    "Agent",
    "AgentContext",
    "ApprovalRequiredError",
    "Capabilities",
    "Decision",
    "EffectNotSettledError",
    "EffectRejectedError",
    "EffectStatus",
    "EffectUnrecordedError",
    "EnvironmentDriftError",
    "EnvironmentState",
    "EvidenceError",
    "Fence",
    "FileWorkspace",
    "IntegrityError",
    "Intent",
    "Keyring",
    "KeyringError",
    "LedgerEntry",
    "NeedsReviewError",
    "NotInRunError",
    "Observation",
    "Outcome",
    "OutcomeKind",
    "Phase",
    "Policy",
    "PolicyError",
    "PolicyMismatchError",
    "PostgresStore",
    "Proposal",
    "Receipt",
    "ReviewDecision",
    "RunBusyError",
    "RunSession",
    "RunState",
    "RunTerminalError",
    "Runtime",
    "SQLiteStore",
    "SecretBox",
    "Signer",
    "SpecError",
    "StoreError",
    "TaskMismatchError",
    "TaskSpec",
    "TetherError",
    "TrustRoots",
    "TrustRootsRequiredError",
    "VerifierResult",
    "Worker",
    "__version__",
    "current_fence",
    "current_key",
    "effect",
    "effects",
    "function_effect",
    "guard",
    "new_approval",
    "new_decision",
    "open_store",
]
