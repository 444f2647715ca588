"""The core imports no web framework, CLI framework, HTTP client, nor our outer packages."""

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
        "client",
        "demo",
        "cli",
        "migrations",
    },
    "api": {"collectors", "client", "demo", "cli", "typer", "migrations"},
    "collectors": {"api", "demo", "cli", "fastapi", "migrations"},
    # the API client: the core and httpx, nothing of the servers or the CLI
    "client": {
        "api",
        "collectors",
        "demo",
        "cli",
        "migrations",
        "fastapi",
        "starlette",
        "uvicorn",
        "typer",
        "click",
        "rich",
        "sqlalchemy",
    },
    # the demo's scenarios: everything but the CLI, which parses and prints for them
    "demo": {"cli", "typer", "click", "rich"},
}


def imported_roots(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path)}


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


@pytest.mark.parametrize("package", ["ledger", "collectors", "api", "client", "demo", "cli"])
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


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, by its full dotted name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# (files, imports they may not make, unless the file is under an allowed folder)
LAYERS = [
    # the database drivers stay in the storage layer
    ("ledger", ("sqlalchemy", "psycopg", "sqlite3", "alembic"), ("ledger/storage",)),
    # the auditor is a pure core over a reader: storage supplies the reader, never the reverse
    ("ledger/audit", ("ledger.storage",), ()),
    # collectors reach the ledger over HTTP only
    ("collectors", ("ledger.storage", "sqlalchemy"), ()),
    ("client", ("ledger.storage",), ()),
]


@pytest.mark.parametrize("folder, banned, allowed", LAYERS, ids=[x[0] for x in LAYERS])
def test_layers_within_the_core(folder: str, banned: tuple[str, ...], allowed: tuple[str, ...]):
    violations = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if any(rel.startswith(a + "/") for a in allowed):
            continue
        bad = sorted(m for m in imported_modules(path) if any(_under(m, b) for b in banned))
        if bad:
            violations.append(f"{rel} imports {bad}")
    assert not violations, "\n".join(violations)


def test_tests_mirror_the_packages():
    """Each folder of tests is named after the package it tests (or says what else it is)."""
    others = {"support", "assets", "docs", "deploy", "__pycache__"}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()} - others
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert folders <= packages, sorted(folders - packages)
    for package in ("ledger", "api", "collectors", "client", "cli", "demo"):
        assert any((ROOT / "tests" / package).glob("test_*.py")), package


def test_every_typed_package_ships_its_marker():
    """A package that says it is typed (py.typed) ships the marker in the wheel; only the
    migrations (Alembic's scripts) say nothing."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    included = [p.rstrip("*") for p in setuptools["packages"]["find"]["include"]]
    data = setuptools["package-data"]
    typed = [p for p in included if (ROOT / p / "py.typed").exists()]
    assert sorted(set(included) - set(typed)) == ["migrations"]
    for package in typed:
        assert "py.typed" in data.get(package, []), f"{package}'s py.typed is not in the wheel"
