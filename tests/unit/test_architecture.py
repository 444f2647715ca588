"""The core imports no web framework, CLI framework, HTTP client, nor our outer packages."""

import ast
from pathlib import Path

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
