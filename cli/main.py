"""``ledger``: one Typer app; each sub-command lives in its own module, imported on first use.

``ledger --help`` lists the commands from :data:`COMMANDS` without importing them (the API,
the database layer and the engine harness take seconds to import); a command's module is
imported when it runs or its own help is asked for. ``tests/cli/test_cli_lazy.py`` holds each
summary equal to the first paragraph of the loaded command's own help.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib import metadata
from typing import Any

import typer
from typer._click.exceptions import (  # typer's own click, which it raises
    ClickException,
    NoArgsIsHelpError,
    UsageError,
)
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.exceptions import Abort

DEBUG_FLAG = "--debug"

# name -> (module, attribute, "command" (a function) or "group" (a Typer app), and a group's
# summary; a command's is the first paragraph of its function's docstring, read by ``ast``)
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "serve": ("cli.serve", "serve", "command", ""),
    "demo": ("cli.demo", "demo", "command", ""),
    "verify": ("cli.verify", "verify", "command", ""),
    "audit": ("cli.audit", "run_audit", "command", ""),
    "evidence": ("cli.evidence", "evidence", "command", ""),
    "erase": ("cli.erase", "erase", "command", ""),
    "fixture-model": ("cli.fixture_model", "fixture_model", "command", ""),
    "fingerprint": ("cli.fingerprint", "fingerprint", "command", ""),
    "diff": ("cli.diff", "diff_command", "command", ""),
    "collect": ("cli.collect", "collect", "command", ""),
    "replay": ("cli.replay", "replay", "command", ""),
    "certify": ("cli.certify", "certify", "command", ""),
    "gpu-check": ("cli.gpu_check", "gpu_check", "command", ""),
    "db": ("cli.db", "app", "group", "Database schema (Alembic migrations)."),
    "keys": ("cli.keys", "app", "group", "Signing keys (Ed25519)."),
    "tokens": ("cli.tokens", "app", "group", "API bearer tokens (stored hashed)."),
    "records": ("cli.records", "app", "group", "Records: search them (as the console does)."),
}


_typer_value_label = TyperOption.display_type_rich


def _value_label(self: TyperOption, ctx: Any) -> str | None:
    """What the help shows after an option: typer's ``<int>``, ``<path>`` and choices, but
    nothing for a flag (it takes no value; typer shows ``<bool>``), and a repeatable option as
    what each occurrence takes, ``<a | b>...`` (typer shows ``<list[a|b]>``)."""
    if self.metavar is None and self.is_flag:
        return None
    label = _typer_value_label(self, ctx)
    if label and label.startswith("<list[") and label.endswith("]>"):
        inner = label[len("<list[") : -len("]>")]
        label = f"<{'path' if inner == 'Path' else inner}>..."
    # choices spaced, so a narrow terminal wraps the list between them, never inside one
    return label.replace("|", " | ") if label else label


TyperOption.display_type_rich = _value_label  # type: ignore[method-assign]


def load_command(name: str) -> Any:
    """The real command ``name`` (its module imported now)."""
    module_name, attribute, kind, _ = COMMANDS[name]
    target = getattr(importlib.import_module(module_name), attribute)
    if kind == "group":
        target._add_completion = False  # as when it was added to this app: no shell setup
        command = typer.main.get_command(target)
        for sub in command.commands.values():  # listed as one flowing line, like the top's
            if sub.short_help is None and sub.help:
                sub.short_help = " ".join(sub.help.split("\n\n")[0].split())
    else:
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


def summary(name: str) -> str:
    """What ``ledger --help`` shows for ``name``: the table's summary, else the first
    paragraph of the command's docstring, read without importing its module's imports."""
    text = COMMANDS[name][3]
    if text:
        return text
    return _docstring_summary(name)


def _docstring_summary(name: str) -> str:
    import ast
    from importlib.util import find_spec

    module_name, attribute, _, _ = COMMANDS[name]
    spec = find_spec(module_name)
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attribute:
            doc = ast.get_docstring(node) or ""
            return " ".join(doc.split("\n\n")[0].split())
    return ""


class LazyGroup(TyperGroup):
    """Lists every command from the table; imports one only to run it or show its help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loaded: dict[str, Any] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if cmd_name in self._loaded:
            return self._loaded[cmd_name]
        # for the listing: the name and its summary, nothing imported
        return TyperCommand(cmd_name, help=summary(cmd_name))

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        if args and args[0] in COMMANDS and args[0] not in self._loaded:
            self._loaded[args[0]] = load_command(args[0])
        return super().resolve_command(ctx, args)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ledger {metadata.version('inference-ledger')}")
        raise typer.Exit()


app = typer.Typer(
    name="ledger",
    cls=LazyGroup,
    help="Fingerprint and audit-trail ledger for self-hosted LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
    debug: bool = typer.Option(
        False,
        DEBUG_FLAG,
        help="show the traceback of an unexpected error (also LEDGER_DEBUG=1; any position)",
    ),
) -> None:
    """Fingerprint and audit-trail ledger for self-hosted LLM inference."""


def _run(args: list[str]) -> Any:
    """The command line run, its exit code returned (usage errors raised, not printed)."""
    return typer.main.get_command(app).main(args, prog_name="ledger", standalone_mode=False)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. An error the command did not turn into its one-line message is still one
    line and exit status 2; ``--debug`` (anywhere before a ``--``) shows its traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    debug = DEBUG_FLAG in args[:end] or os.environ.get("LEDGER_DEBUG", "") not in ("", "0")
    args = [a for i, a in enumerate(args) if i >= end or a != DEBUG_FLAG]
    try:
        # standalone_mode=False: usage errors come back here, to be one line like every other
        # error (click would print a usage block and a boxed message).
        status = _run(args)
    except NoArgsIsHelpError as exc:  # a group without its command: its help
        if exc.format_message():  # typer's rich help is printed already, on stdout
            exc.show()
        sys.exit(exc.exit_code)
    except UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        sys.stderr.write(f"error: {exc.format_message()}{where}\n")
        sys.exit(2)
    except ClickException as exc:
        sys.stderr.write(f"error: {exc.format_message()}\n")
        sys.exit(exc.exit_code)
    except Abort:
        sys.stderr.write("error: aborted\n")
        sys.exit(1)
    except Exception as exc:  # the CLI's last line of defence
        if debug:
            raise
        message = " ".join(str(exc).split()) or "(no message)"
        sys.stderr.write(
            f"error: {type(exc).__name__}: {message} (this is a bug or an unexpected "
            f"condition; run again with {DEBUG_FLAG} for the traceback)\n"
        )
        sys.exit(2)
    if isinstance(status, int) and status:  # a command's exit code (typer.Exit), returned
        sys.exit(status)
