"""Move names between modules in every ``from X import ...`` of src, tests, examples, bench.

Used once on h/setup when ``tether.core`` stopped exporting its internals and
``Sandbox`` moved to ``tether.testing``; kept so a branch merged after it can
be brought along: ``python notes/rewrite_imports.py`` from the repository
root, then ``ruff check --fix`` and ``ruff format`` (the imports it writes are
not sorted). It rewrites a name only where the module it is imported from no
longer exports it, so running it twice changes nothing.

The moves: every name a private module of core defines that
``tether.core.__all__`` does not list is imported from that module (a public
name of a private module, as ``tests/unit/test_architecture.py`` allows; the
rule modules core exported as ``people_rules`` and the like are imported as
modules, ``from tether.core import _people as people_rules``);
``Sandbox`` from ``tether.adapters`` or ``tether`` is imported from ``tether.testing``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOTS = ("src", "tests", "examples", "bench")


#: Rule modules core used to export under another name.
RULE_MODULES = {
    "compensation_rules": "_compensation",
    "listing_rules": "_listing",
    "people_rules": "_people",
    "policy_rules": "_policy_change",
    "replay_rules": "_replay",
    "retry_rules": "_retry",
    "settle_rules": "_settle",
    "step_rules": "_steps",
}


def core_moves(repo: Path) -> dict[str, tuple[str, str]]:
    """Each name defined in a private module of core that core does not export: where it is."""
    core = repo / "src/tether/core"
    public: set[str] = set()
    for node in ast.parse((core / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign | ast.AugAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "__all__":
                public |= set(ast.literal_eval(node.value))
    moves = {
        alias: ("tether.core", module)
        for alias, module in RULE_MODULES.items()
        if alias not in public
    }
    for path in sorted(core.glob("_*.py")):
        module = f"tether.core.{path.stem}"
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for name in names:
                if name not in public and not name.startswith("_"):
                    moves.setdefault(name, (module, name))
    return moves


def rewrite(path: Path, moves: dict[str, dict[str, tuple[str, str]]]) -> bool:
    """Rewrite the imports of ``path`` that name a moved name; whether it changed."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in moves):
            continue
        table = moves[node.module]
        if not any(alias.name in table for alias in node.names):
            continue
        stay: list[str] = []
        moved: dict[str, list[str]] = {}
        for alias in node.names:
            local = alias.asname or alias.name
            if alias.name in table:
                module, name = table[alias.name]
                moved.setdefault(module, []).append(name if name == local else f"{name} as {local}")
            else:
                stay.append(alias.name if alias.asname is None else f"{alias.name} as {local}")
        indent = lines[node.lineno - 1][: node.col_offset]
        new = [f"{indent}from {node.module} import {', '.join(stay)}\n"] if stay else []
        new += [f"{indent}from {module} import {', '.join(names)}\n" for module, names in moved.items()]
        comment = lines[(node.end_lineno or node.lineno) - 1][node.end_col_offset :].strip()
        if comment:  # a comment after the statement stays with it
            new[-1] = new[-1].rstrip("\n") + "  " + comment + "\n"
        edits.append((node.lineno, node.end_lineno or node.lineno, new))
    for start, end, new in sorted(edits, reverse=True):
        lines[start - 1 : end] = new
    if edits:
        path.write_text("".join(lines))
    return bool(edits)


def main() -> None:
    repo = Path.cwd()
    core = core_moves(repo)
    sandbox = {"Sandbox": ("tether.testing", "Sandbox")}
    moves = {"tether.core": core, "tether.adapters": sandbox, "tether": sandbox}
    changed = [
        str(path)
        for root in ROOTS
        for path in sorted((repo / root).rglob("*.py"))
        if path != repo / "src/tether/core/__init__.py" and rewrite(path, moves)
    ]
    print(f"{len(changed)} files rewritten", file=sys.stderr)
    for name in changed:
        print(name)


if __name__ == "__main__":
    main()
