"""The core imports no web framework, CLI framework, HTTP client, nor our outer packages."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "ledger": {
        "fastapi",
        "starlette",
        "uvicorn",
        "typer",
        "click",
        "rich",
        "httpx",
        "requests",
        "api",
        "collectors",
        "cli",
        "migrations",
    },
    "api": {"collectors", "cli", "typer", "migrations"},
    "collectors": {"api", "cli", "fastapi", "migrations"},
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_import_rules():
    violations = []
    for package, banned in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            bad = imported_roots(path) & banned
            if bad:
                violations.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)


def test_the_rule_checker_sees_a_violation(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("import fastapi\nfrom httpx import Client\n")
    assert {"fastapi", "httpx"} <= imported_roots(sample)


def test_cli_main_module_is_safe_for_spawned_workers():
    """`ledger audit --workers` spawns processes that import the parent's __main__ module
    under the name __mp_main__: running `python -m cli` must not start the CLI again there."""
    import runpy

    runpy.run_module("cli.__main__", run_name="__mp_main__")  # raises SystemExit if unguarded


def _own_imports(path: Path, package: str, modules: set[str]) -> set[str]:
    """The modules of ``package`` that ``path`` imports, type-checking-only imports included
    (``from pkg import sub`` names the submodule ``pkg.sub``, not the package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return {name for name in found if name.startswith(package + ".") or name == package}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


@pytest.mark.parametrize("package", ["ledger", "collectors", "api"])
def test_no_import_cycles_within_a_package(package: str):
    """Modules of one package import each other in one direction only (no cycle hidden behind
    TYPE_CHECKING either): the collector's state has its own module, so the replay endpoint
    and the proxy both take it from there."""
    paths = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    graph = {module: _own_imports(path, package, set(paths)) for module, path in paths.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_sees_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
