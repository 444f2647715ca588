"""The collector's table of vLLM's options (``collectors/vllm_flags.py``) is the installed
vLLM's: every option with the number of arguments its parser takes, in vLLM's own environment
(a subprocess: the collector never imports vLLM)."""

from __future__ import annotations

import json
import subprocess

import pytest

from collectors import vllm_flags
from collectors.engine import FLAGS
from tests.support.engine import engine_python

pytestmark = pytest.mark.engine

VLLM_SIDE = """
import json
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
parser = make_arg_parser(FlexibleArgumentParser())
out = {}
for action in parser._actions:
    kind = {0: "switch", "+": "list", "?": "optional", None: "value"}[action.nargs]
    for option in action.option_strings:
        out[option] = [kind, action.dest]
print("RESULT " + json.dumps(out))
"""


def _installed() -> dict[str, list[str]]:
    run = subprocess.run(
        [engine_python(), "-c", VLLM_SIDE], capture_output=True, text=True, timeout=300, check=True
    )
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    found: dict[str, list[str]] = json.loads(line[len("RESULT ") :])
    return found


def test_the_table_is_the_installed_vllms_parser() -> None:
    installed = _installed()
    table = {
        **dict.fromkeys(vllm_flags.SWITCHES, "switch"),
        **dict.fromkeys(vllm_flags.LISTS, "list"),
        **dict.fromkeys(vllm_flags.OPTIONAL_VALUE, "optional"),
        **dict.fromkeys(vllm_flags.ONE_VALUE, "value"),
    }
    assert table == {option: kind for option, (kind, _) in installed.items()}
    # a short form is read as the long one with the same destination
    for short, long in vllm_flags.ALIASES.items():
        assert installed[short][1] == installed[long][1], short
    shorts = {o for o in installed if not o.startswith("--")}
    assert shorts == set(vllm_flags.ALIASES)
    # every deployment-only name is one vLLM has (a typo would record a flag meant to be left out)
    assert set(installed) >= vllm_flags.DEPLOYMENT_ONLY
    # the flags the collector interprets take as many arguments as vLLM gives them
    arity = {"bool": "switch", "list": "list"}
    for flag, (_, kind) in FLAGS.items():
        if flag in installed:
            assert installed[flag][0] == arity.get(kind, "value"), flag
