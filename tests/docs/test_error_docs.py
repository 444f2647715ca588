"""docs/ERRORS.md documents every stable error code, and only codes that exist: neither drifts.

The codes are read with ``ast`` from every module of ledger/, api/, collectors/, client/,
demo/ and cli/ (nothing is imported), wherever the code base sets one:

- an exception class's ``code = "..."`` (``ledger/errors.py`` and subclasses elsewhere);
- a ``code="..."`` keyword in a call (``InvalidInput("...", code="invalid_json")``);
- a string passed positionally to, or the default of, a function's ``code`` parameter
  (``_fail(message, code="schema_violation")``, ``error_response(500, "internal_error", ...)``),
  the function defined in the same module or imported from one scanned here;
- an f-string code built from the function's parameters, resolved at its call sites in the
  module (``code=f"{what}_not_found"`` called with ``"replay"``);
- a ``{"code": ...}`` error dict (a certification job's error, ``ledger verify --json``);
- the values of a module-level ``*_CODES`` table (``api/errors.py``: the framework's errors).

A string constant named in capitals (``INTERRUPTED``) counts as its value. A code taken from
another variable (``code=exc.code``, ``code=code``) passes on one set elsewhere.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("ledger", "api", "collectors", "client", "demo", "cli", "migrations")
DOC = ROOT / "docs" / "ERRORS.md"
CODE = re.compile(r"[a-z][a-z0-9_]*")
CONSTANT = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    code_params: dict[str, int] = field(default_factory=dict)  # function -> `code` position
    constants: dict[str, str] = field(default_factory=dict)  # NAME -> "value"


def _modules() -> dict[str, Module]:
    modules = {}
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            module = Module(name, path, ast.parse(path.read_text(encoding="utf-8")))
            for node in ast.walk(module.tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    params = [a.arg for a in node.args.posonlyargs + node.args.args]
                    params = params[1:] if params[:1] in (["self"], ["cls"]) else params
                    if "code" in params:
                        module.code_params[node.name] = params.index("code")
            for stmt in module.tree.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and CONSTANT.fullmatch(stmt.targets[0].id)
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                ):
                    module.constants[stmt.targets[0].id] = stmt.value.value
            modules[name] = module
    return modules


def _imports(module: Module, modules: dict[str, Module]) -> None:
    """Let the module's names include the code functions and constants it imports."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            source = modules[node.module]
            for alias in node.names:
                local = alias.asname or alias.name
                if alias.name in source.code_params:
                    module.code_params[local] = source.code_params[alias.name]
                if alias.name in source.constants:
                    module.constants[local] = source.constants[alias.name]


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _bound(call: ast.Call, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
    """The call's arguments by the function's parameter names."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    bound = dict(zip(params, call.args, strict=False))
    bound.update({k.arg: k.value for k in call.keywords if k.arg is not None})
    return bound


class _Reader:
    """Collects one module's codes; ``unread`` lists code expressions it cannot follow."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.found: dict[str, list[str]] = {}
        self.unread: list[str] = []

    def where(self, node: ast.AST) -> str:
        return f"{self.module.path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"

    def add(self, value: object, node: ast.AST) -> None:
        if isinstance(value, str):
            self.found.setdefault(value, []).append(self.where(node))

    def expression(self, expr: ast.expr, within: ast.AST | None) -> None:
        """A code given as ``expr``, inside the function ``within`` (if any)."""
        if isinstance(expr, ast.Constant):
            self.add(expr.value, expr)
        elif isinstance(expr, ast.Name):
            if expr.id in self.module.constants:
                self.add(self.module.constants[expr.id], expr)
        elif isinstance(expr, ast.JoinedStr):
            self.formatted(expr, within)
        elif not isinstance(expr, ast.Attribute):
            self.unread.append(f"{self.where(expr)}: {ast.unparse(expr)}")

    def formatted(self, expr: ast.JoinedStr, within: ast.AST | None) -> None:
        """An f-string of the enclosing function's parameters, at each call of it here."""
        rendered = 0
        if isinstance(within, ast.FunctionDef | ast.AsyncFunctionDef):
            for call in ast.walk(self.module.tree):
                if not isinstance(call, ast.Call) or _callee(call) != within.name:
                    continue
                args = _bound(call, within)
                text = ""
                for part in expr.values:
                    if isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name):
                        arg = args.get(part.value.id)
                        if not isinstance(arg, ast.Constant):
                            break
                        text += str(arg.value)
                    elif isinstance(part, ast.Constant):
                        text += str(part.value)
                    else:
                        break
                else:
                    self.add(text, call)
                    rendered += 1
        if not rendered:
            self.unread.append(f"{self.where(expr)}: {ast.unparse(expr)}")

    def read(self) -> None:
        self.visit(self.module.tree, None)

    def visit(self, node: ast.AST, within: ast.AST | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            within = node
            self.defaults(node.args)
        elif isinstance(node, ast.ClassDef):
            self.class_code(node)
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "code":
                    self.expression(keyword.value, within)
            position = self.module.code_params.get(_callee(node) or "")
            if position is not None and position < len(node.args):
                self.expression(node.args[position], within)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code":
                    self.expression(value, within)
        elif isinstance(node, ast.Assign) and within is None:
            self.table(node)
        for child in ast.iter_child_nodes(node):
            self.visit(child, within)

    def defaults(self, args: ast.arguments) -> None:
        """The default of a ``code`` parameter."""
        positional = args.posonlyargs + args.args
        with_default = positional[len(positional) - len(args.defaults) :]
        pairs = [*zip(with_default, args.defaults, strict=True)]
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d]
        for arg, default in pairs:
            if arg.arg == "code":
                self.expression(default, None)

    def class_code(self, node: ast.ClassDef) -> None:
        """An exception class's ``code = "..."`` (a model's ``code: str = Field()`` is not)."""
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                target, value = stmt.target, stmt.value
            else:
                continue
            is_code = isinstance(target, ast.Name) and target.id == "code"
            if is_code and isinstance(value, ast.Constant | ast.Name):
                self.expression(value, None)

    def table(self, node: ast.Assign) -> None:
        """The values of a module-level ``*_CODES`` dict or set."""
        if any(isinstance(t, ast.Name) and t.id.endswith("_CODES") for t in node.targets):
            value = node.value
            items = value.values if isinstance(value, ast.Dict) else getattr(value, "elts", [])
            for item in items:
                self.expression(item, None)


@functools.cache
def source_codes() -> dict[str, list[str]]:
    """Every error code the source sets, with where."""
    modules = _modules()
    for module in modules.values():
        _imports(module, modules)
    codes: dict[str, list[str]] = {}
    unread: list[str] = []
    for module in modules.values():
        reader = _Reader(module)
        reader.read()
        unread += reader.unread
        for code, places in reader.found.items():
            codes.setdefault(code, []).extend(places)
    assert not unread, f"error codes this test cannot read; teach it the pattern: {unread}"
    # An exit status (``fail(message, 2)``) is an int and never collected; anything else that
    # reached here must look like a code.
    odd = {c: p for c, p in codes.items() if not CODE.fullmatch(c)}
    assert not odd, f"strings taken for codes that do not look like one: {odd}"
    return codes


def documented_codes() -> dict[str, list[int]]:
    """The first cell of each row of every table in ERRORS.md whose header begins ``| code |``,
    with its line numbers."""
    codes: dict[str, list[int]] = {}
    in_code_table = False
    previous = ""
    for number, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            in_code_table = False
        elif not previous.startswith("|"):  # a header row
            in_code_table = cells[0] == "code"
        elif in_code_table and not set(cells[0]) <= set("-: "):
            found = re.fullmatch(r"`([a-z][a-z0-9_]*)`", cells[0])
            assert found, f"ERRORS.md:{number}: the first cell must be one `code`: {cells[0]!r}"
            codes.setdefault(found[1], []).append(number)
        previous = line
    return codes


def test_every_code_the_source_sets_is_documented():
    documented = documented_codes()
    missing = {c: p for c, p in sorted(source_codes().items()) if c not in documented}
    assert not missing, f"codes missing from docs/ERRORS.md (code: where set): {missing}"


def test_every_documented_code_is_set_somewhere_in_the_source():
    codes = source_codes()
    unknown = {c: n for c, n in sorted(documented_codes().items()) if c not in codes}
    assert not unknown, f"docs/ERRORS.md documents codes no source sets (code: lines): {unknown}"


def test_each_code_has_one_row():
    twice = {c: n for c, n in documented_codes().items() if len(n) > 1}
    assert not twice, f"codes with more than one row in docs/ERRORS.md (code: lines): {twice}"


def test_the_scan_finds_each_pattern():
    # One known code per pattern, so a change that blinds the reader fails here by name.
    codes = source_codes()
    for code in (
        "index_mismatch",  # class attribute
        "record_conflict",  # keyword
        "bad_evidence",  # default of a `code` parameter
        "fingerprint_mismatch",  # positional, imported helper (ledger.evidence_format.fail)
        "internal_error",  # positional, local function
        "replay_not_found",  # f-string resolved at its call site
        "interrupted",  # {"code": CONSTANT}
        "log_key_not_pinned",  # {"code": "..."}
        "method_not_allowed",  # a *_CODES table
    ):
        assert code in codes, code
