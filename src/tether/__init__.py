"""tether: long-running agent tasks that recover from crashes without repeating an effect.

Known effects are not repeated, unknown effects are not silently replayed,
and unreconcilable cases enter an explicit human gate.
"""

from tether.adapters import (
    Adapter,
    Capabilities,
    Fence,
    FileWorkspace,
    Observation,
    Sandbox,
    VerifierResult,
)
from tether.core import (
    EffectStatus,
    EnvironmentState,
    Intent,
    Phase,
    Policy,
    Proposal,
    Receipt,
    RunState,
    TaskSpec,
    TetherError,
)
from tether.crypto import Keyring
from tether.runtime import (
    Agent,
    AgentContext,
    CrashPlan,
    CrashPoint,
    Decision,
    RunSession,
    Runtime,
    SimulatedCrash,
)
from tether.store import SQLiteStore

__version__ = "0.1.0"

__all__ = [
    "Adapter",
    "Agent",
    "AgentContext",
    "Capabilities",
    "CrashPlan",
    "CrashPoint",
    "Decision",
    "EffectStatus",
    "EnvironmentState",
    "Fence",
    "FileWorkspace",
    "Intent",
    "Keyring",
    "Observation",
    "Phase",
    "Policy",
    "Proposal",
    "Receipt",
    "RunSession",
    "RunState",
    "Runtime",
    "SQLiteStore",
    "Sandbox",
    "SimulatedCrash",
    "TaskSpec",
    "TetherError",
    "VerifierResult",
    "__version__",
]
