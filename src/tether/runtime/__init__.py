"""The orchestration: propose, gate, persist, execute, reconcile, advance, recover."""

from tether.runtime._agent import REDACTED, Agent, AgentContext, Decision, Withheld
from tether.runtime._cases import CaseEffect, case_effect
from tether.runtime._checkpointer import (
    Checkpointer,
    Restored,
    check_binding,
    check_environment,
    environment_ahead,
)
from tether.runtime._clock import Clock, IdSource, RandomIds, SystemClock
from tether.runtime._crash import NO_CRASH, CrashPlan, CrashPoint, SimulatedCrash
from tether.runtime._operator import (
    Prepared,
    StaleViewError,
    deliver,
    prepare_admission,
    prepare_approval,
    prepare_cancel,
    prepare_fork,
    prepare_review,
    prepare_rewind,
    signer_roles,
)
from tether.runtime._runs import RunsPage, RunSummary, list_runs, runs_page
from tether.runtime._runtime import Runtime
from tether.runtime._runview import InboxItem, Page, RecordedTrust, RunView, open_run
from tether.runtime._session import RunSession
from tether.runtime._setup import guard
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
    "CaseEffect",
    "Checkpointer",
    "Clock",
    "CrashPlan",
    "CrashPoint",
    "Decision",
    "IdSource",
    "InboxItem",
    "Page",
    "Prepared",
    "RandomIds",
    "RecordedTrust",
    "Restored",
    "RunSession",
    "RunSummary",
    "RunView",
    "RunsPage",
    "Runtime",
    "RuntimeFactory",
    "SimulatedCrash",
    "StaleViewError",
    "SystemClock",
    "Withheld",
    "Worker",
    "WorkerStats",
    "case_effect",
    "check_binding",
    "check_environment",
    "deliver",
    "environment_ahead",
    "guard",
    "install_signal_handlers",
    "list_runs",
    "load_factory",
    "open_run",
    "prepare_admission",
    "prepare_approval",
    "prepare_cancel",
    "prepare_fork",
    "prepare_review",
    "prepare_rewind",
    "runs_page",
    "signer_roles",
]
