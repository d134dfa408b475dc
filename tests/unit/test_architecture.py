"""The layering and the public surface are what DESIGN.md and STYLE.md say they are."""

from __future__ import annotations

import ast
from pathlib import Path

import tether

SRC = Path(tether.__file__).parent
FORBIDDEN_IN_CORE = {
    "sqlite3",
    "psycopg",
    "httpx",
    "os",
    "time",
    "random",
    "secrets",
    "subprocess",
    "socket",
    "smtplib",
    "pathlib",
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_core_is_pure() -> None:
    """core/ imports no I/O, clock or randomness module, and nothing of tether outside core."""
    for path in (SRC / "core").glob("*.py"):
        for name in imports_of(path):
            top = name.split(".")[0]
            assert top not in FORBIDDEN_IN_CORE, f"{path.name} imports {name}"
            if top == "tether":
                assert name.startswith("tether.core"), f"{path.name} imports {name}"
        assert ".now(" not in path.read_text(), f"{path.name} reads the clock"


def test_arrows_point_down_only() -> None:
    """Nothing imports cli; store and adapters import only core of tether."""
    for path in SRC.rglob("*.py"):
        layer = path.relative_to(SRC).parts[0]
        for name in imports_of(path):
            if not name.startswith("tether."):
                continue
            target = name.split(".")[1]
            if layer != "cli":
                assert target != "cli", f"{path} imports the CLI"
            if layer in {"store", "adapters", "crypto"}:
                assert target in {"core", layer}, f"{path} imports {name}"


WEB_MAY_IMPORT = {"runtime", "core", "crypto", "store", "adapters"}


def test_web_uses_only_the_public_api_and_only_the_cli_imports_web() -> None:
    """web imports runtime, core, crypto, store and adapters by their packages; only `tether serve` imports web."""
    for path in (SRC / "web").rglob("*.py"):
        for name in imports_of(path):
            parts = name.split(".")
            if parts[0] != "tether" or len(parts) < 2 or parts[1] == "web":
                continue
            assert parts[1] in WEB_MAY_IMPORT and len(parts) == 2, f"{path} imports {name}"
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "web" or rel == Path("cli/_serve.py"):
            continue
        assert not any(n.startswith("tether.web") for n in imports_of(path)), f"{path} imports web"


def test_no_assert_in_src() -> None:
    """Runtime checks never use assert, so python -O behaves the same."""
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        assert not any(isinstance(node, ast.Assert) for node in ast.walk(tree)), path


def test_modules_stay_readable_in_one_sitting() -> None:
    """No module grows past 800 lines."""
    for path in SRC.rglob("*.py"):
        assert len(path.read_text().splitlines()) < 800, path


def test_public_api_is_pinned() -> None:
    """The names tether exports are exactly these; a change here is a deliberate API change."""
    assert sorted(tether.__all__) == [
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
    assert sorted(tether.effects.__all__) == sorted(
        [
            "FIRST_PARAMETER",
            "CallResult",
            "EffectFunction",
            "EffectToUndo",
            "Found",
            "GuardedRun",
            "call",
            "call_async",
            "current",
            "current_fence",
            "current_key",
            "effect",
            "function_effect",
            "run",
            "run_async",
        ]
    )
    for name in tether.__all__:
        assert getattr(tether, name) is not None
        if name != "__version__":
            assert getattr(tether, name).__doc__, f"{name} has no docstring"


def test_core_exports_what_users_and_adapter_authors_need() -> None:
    """tether.core exports its errors and the values a user or an adapter's author handles,
    never the rules (transition functions, rule modules): those are its private modules'."""
    exported = set(tether.core.__all__)
    errors = {name for name in exported if name.endswith("Error")}
    assert all(issubclass(getattr(tether.core, name), tether.TetherError) for name in errors)
    assert sorted(exported - errors) == [
        "ANY_TARGET",
        "ActionClass",
        "ActionKind",
        "ActionResult",
        "Authority",
        "Binding",
        "Budgets",
        "Capabilities",
        "Compensation",
        "CompletedWrite",
        "Contract",
        "EffectDecision",
        "EffectRecord",
        "EffectStatus",
        "EffectTerms",
        "EnvironmentState",
        "InitialEnvironment",
        "Intent",
        "JSONValue",
        "KindRule",
        "LedgerEntry",
        "Observation",
        "Outcome",
        "OutcomeKind",
        "OutcomeReason",
        "PendingWrite",
        "Phase",
        "Policy",
        "PolicyChange",
        "Proposal",
        "Purpose",
        "Receipt",
        "RetrySemantics",
        "ReviewCase",
        "ReviewDecision",
        "ReviewReason",
        "Risk",
        "RunState",
        "Spent",
        "TargetKind",
        "Targets",
        "TaskSpec",
        "TraceEvent",
        "Verification",
        "Verifier",
        "WithheldSecrets",
        "admission_request",
        "answer_body",
        "approval_request",
        "cancel_request",
        "canonical_bytes",
        "decision_request",
        "digest",
        "digest_bytes",
        "effect_decision_request",
        "format_time",
        "new_admission",
        "new_approval",
        "new_cancel",
        "new_decision",
        "new_effect_decision",
        "new_fork",
        "parse_time",
        "strict_loads",
    ]
    assert not {"step_rules", "people_rules", "Transition", "Facts", "seal_commit"} & exported


def test_test_doubles_live_in_tether_testing() -> None:
    """Sandbox is tether.testing's, and neither tether nor tether.adapters exports it."""
    import tether.adapters
    import tether.testing

    assert "Sandbox" in tether.testing.__all__
    assert not hasattr(tether, "Sandbox")
    assert not hasattr(tether.adapters, "Sandbox")


def test_integrations_use_only_the_stores_public_names() -> None:
    """No integration module reaches a private method or attribute of tether's SQL stores."""
    from tether.store import PostgresStore, SQLiteStore

    private = {
        name
        for cls in (PostgresStore, SQLiteStore)
        for name in dir(cls)
        if name.startswith("_") and not name.startswith("__")
    }
    for path in (SRC / "integrations").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                assert isinstance(owner, ast.Name) and owner.id == "self", (
                    f"{path}:{node.lineno} uses {node.attr}"
                )


def test_no_private_name_is_imported_across_modules() -> None:
    """A module imports another's public names only: a private helper shared is a rule misplaced."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tether")):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                module = SRC.parent / (f"{node.module}.{alias.name}".replace(".", "/"))
                is_module = module.with_suffix(".py").exists() or module.is_dir()
                if private and not is_module:
                    found.append(f"{path.relative_to(SRC)}: {node.module}.{alias.name}")
    assert found == []
