"""The orchestration: propose, gate, persist, execute, reconcile, advance, recover."""

from tether.runtime._agent import REDACTED, Agent, AgentContext, Decision, Withheld
from tether.runtime._checkpointer import (
    Checkpointer,
    Restored,
    check_binding,
    check_environment,
    environment_ahead,
)
from tether.runtime._clock import Clock, IdSource, RandomIds, SystemClock
from tether.runtime._crash import NO_CRASH, CrashPlan, CrashPoint, SimulatedCrash
from tether.runtime._runtime import Runtime
from tether.runtime._session import RunSession
from tether.runtime._worker import (
    AppLoadError,
    RuntimeFactory,
    Worker,
    WorkerStats,
    install_signal_handlers,
    load_factory,
)

__all__ = [
    "NO_CRASH",
    "REDACTED",
    "Agent",
    "AgentContext",
    "AppLoadError",
    "Checkpointer",
    "Clock",
    "CrashPlan",
    "CrashPoint",
    "Decision",
    "IdSource",
    "RandomIds",
    "Restored",
    "RunSession",
    "Runtime",
    "RuntimeFactory",
    "SimulatedCrash",
    "SystemClock",
    "Withheld",
    "Worker",
    "WorkerStats",
    "check_binding",
    "check_environment",
    "environment_ahead",
    "install_signal_handlers",
    "load_factory",
]
