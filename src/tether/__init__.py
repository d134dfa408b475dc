"""tether: long-running agent tasks that recover from crashes without repeating an effect.

Known effects are not repeated, unknown effects are not silently replayed,
and unreconcilable cases enter an explicit human gate.
"""

from tether import effects
from tether.adapters import (
    Adapter,
    Capabilities,
    Fence,
    FileWorkspace,
    Sandbox,
    VerifierResult,
)
from tether.core import (
    ActionResult,
    EffectStatus,
    EnvironmentState,
    Intent,
    LedgerEntry,
    Observation,
    Outcome,
    OutcomeKind,
    Phase,
    Policy,
    Proposal,
    Receipt,
    RunState,
    TaskSpec,
    TetherError,
)
from tether.crypto import Keyring, SecretBox, Signer, TrustRoots
from tether.effects import current_fence, current_key, effect, function_effect
from tether.runtime import (
    Agent,
    AgentContext,
    Decision,
    RunSession,
    Runtime,
    Worker,
)
from tether.store import PostgresStore, SQLiteStore, open_store

__version__ = "0.1.0"

__all__ = [
    "ActionResult",
    "Adapter",
    "Agent",
    "AgentContext",
    "Capabilities",
    "Decision",
    "EffectStatus",
    "EnvironmentState",
    "Fence",
    "FileWorkspace",
    "Intent",
    "Keyring",
    "LedgerEntry",
    "Observation",
    "Outcome",
    "OutcomeKind",
    "Phase",
    "Policy",
    "PostgresStore",
    "Proposal",
    "Receipt",
    "RunSession",
    "RunState",
    "Runtime",
    "SQLiteStore",
    "Sandbox",
    "SecretBox",
    "Signer",
    "TaskSpec",
    "TetherError",
    "TrustRoots",
    "VerifierResult",
    "Worker",
    "__version__",
    "current_fence",
    "current_key",
    "effect",
    "effects",
    "function_effect",
    "open_store",
]
