"""The worked example in docs/EVIDENCE.md verifies, prints what the page shows, and fails as
documented when edited; the v1 example still verifies, saying the fingerprint was not checked."""

import base64
import copy
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from ledger import merkle
from ledger.canonical import canonicalize
from ledger.errors import VerificationError
from ledger.evidence import CHECKS, FINGERPRINT_CHECKS, FORMAT, FORMAT_V1, verify_bundle
from ledger.evidence_format import load_bundle
from ledger.signing import load_public_key

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "examples"
PAGE = (ROOT / "docs" / "EVIDENCE.md").read_text()
BUNDLE = json.loads((DOCS / "evidence-example.json").read_text())
LOG_KEY = load_public_key((DOCS / "log-key.pub.pem").read_text())
V1 = json.loads((DOCS / "evidence-example-v1.json").read_text())
V1_LOG_KEY = load_public_key((DOCS / "log-key-v1.pub.pem").read_text())
COMMAND = (
    "ledger verify docs/examples/evidence-example.json --log-key docs/examples/log-key.pub.pem"
)


def test_the_worked_example_verifies():
    assert BUNDLE["format"] == FORMAT
    result = verify_bundle(BUNDLE, LOG_KEY)
    assert (result.leaf_index, result.tree_size) == (3, 4)
    assert result.checks == CHECKS
    assert result.fingerprint is not None and result.fingerprint.leaf_index == 2
    assert result.fingerprint.engine_name == "none"
    assert result.checkpoint_signed_at is not None


def test_the_page_shows_what_ledger_verify_prints(monkeypatch: pytest.MonkeyPatch):
    shown = re.search(r"```console\n\$ \.venv/bin/(.+)\n((?:[^$].*\n)+)\$ echo \$\?\n0\n```", PAGE)
    assert shown is not None and shown.group(1) == COMMAND
    monkeypatch.chdir(ROOT)
    out = CliRunner().invoke(app, COMMAND.split()[1:])
    assert out.exit_code == 0, out.output
    assert out.stdout == shown.group(2)
    assert f"```\n{BUNDLE['checkpoint']}```" in PAGE  # "Its checkpoint, as signed"


def test_the_proofs_are_as_the_page_explains():
    leaf = merkle.leaf_hash(canonicalize(BUNDLE["envelope"]))
    fingerprint = merkle.leaf_hash(canonicalize(BUNDLE["fingerprint"]["envelope"]))
    record_proof = [base64.b64decode(h) for h in BUNDLE["inclusion_proof"]["hashes"]]
    fp_proof = [base64.b64decode(h) for h in BUNDLE["fingerprint"]["hashes"]]
    assert record_proof[0] == fingerprint and fp_proof[0] == leaf
    assert record_proof[1] == fp_proof[1]  # the node over leaves 0-1


def _flip_logprob(bundle: dict) -> None:
    choice = bundle["envelope"]["body"]["choices"][0]
    raw = bytearray(base64.b64decode(choice["logprobs"]))
    raw[0] ^= 1
    choice["logprobs"] = base64.b64encode(bytes(raw)).decode()


def _flip_and_rehash(bundle: dict) -> None:
    _flip_logprob(bundle)
    bundle["leaf_hash"] = base64.b64encode(
        merkle.leaf_hash(canonicalize(bundle["envelope"]))
    ).decode()


def _fingerprint_byte(bundle: dict) -> None:
    bundle["fingerprint"]["envelope"]["body"]["engine"]["name"] = "vllm"


DOCUMENTED = {
    "jcs": _flip_logprob,
    "collector_signature": _flip_and_rehash,
    "collector_key": lambda b: b["keys"]["collector"].update(role="replayer"),
    "fingerprint": _fingerprint_byte,
}


@pytest.mark.parametrize("check", sorted(DOCUMENTED))
def test_documented_edits_fail_the_documented_check(check: str):
    forged = copy.deepcopy(BUNDLE)
    DOCUMENTED[check](forged)
    with pytest.raises(VerificationError) as err:
        verify_bundle(forged, LOG_KEY)
    assert err.value.details["check"] == check


def test_the_v1_example_verifies_without_its_fingerprint():
    assert V1["format"] == FORMAT_V1
    result = verify_bundle(V1, V1_LOG_KEY)
    assert (result.leaf_index, result.tree_size) == (3, 4)
    assert result.fingerprint is None and result.checkpoint_signed_at is None
    assert result.checks == tuple(c for c in CHECKS if c not in FINGERPRINT_CHECKS)
    forged = copy.deepcopy(V1)
    _flip_logprob(forged)
    with pytest.raises(VerificationError) as err:
        verify_bundle(forged, V1_LOG_KEY)
    assert err.value.details["check"] == "jcs"


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b["keys"]["collector"].update(name="trusted-collector"),
        lambda b: b["keys"]["collector"].update(role="replayer"),
    ],
    ids=["name", "role"],
)
def test_a_v1_bundle_cannot_rename_its_collector(edit):
    forged = copy.deepcopy(V1)
    edit(forged)
    with pytest.raises(VerificationError) as err:
        verify_bundle(forged, V1_LOG_KEY)
    assert err.value.details["check"] == "collector_key"


def test_a_v1_bundle_claiming_a_fingerprint_or_a_v2_lacking_one_is_refused():
    claimed = copy.deepcopy(V1)
    claimed["fingerprint"] = copy.deepcopy(BUNDLE["fingerprint"])
    lacking = copy.deepcopy(BUNDLE)
    lacking.pop("fingerprint")
    for forged, key in ((claimed, V1_LOG_KEY), (lacking, LOG_KEY)):
        with pytest.raises(VerificationError) as err:
            verify_bundle(forged, key)
        assert err.value.details["check"] == "format"


def test_a_member_named_twice_or_nan_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A reader that keeps the first of two members sees another bundle than one that keeps
    the last: such a file is INVALID, as is one holding NaN (not JSON)."""
    text = (DOCS / "evidence-example.json").read_text()
    twice = text.replace('"role": "collector",', '"role": "collector", "role": "replayer",', 1)
    nan = text.replace('"leaf_index": 3', '"leaf_index": NaN', 1)
    assert twice != text and nan != text
    for forged in (twice, nan):
        with pytest.raises(VerificationError) as err:
            verify_bundle(load_bundle(forged.encode()), LOG_KEY)
        assert err.value.details["check"] == "format"
    path = tmp_path / "twice.json"
    path.write_text(twice)
    monkeypatch.chdir(ROOT)
    out = CliRunner().invoke(
        app, ["verify", str(path), "--log-key", "docs/examples/log-key.pub.pem", "--json"]
    )
    assert out.exit_code == 1 and json.loads(out.stdout)["check"] == "format"
    assert verify_bundle(load_bundle(text.encode()), LOG_KEY).leaf_index == 3
