"""The worked example in docs/EVIDENCE.md verifies, and fails as documented when edited."""

import base64
import copy
import json
from pathlib import Path

import pytest

from ledger.errors import VerificationError
from ledger.evidence import verify_bundle
from ledger.signing import load_public_key

DOCS = Path(__file__).resolve().parents[2] / "docs" / "examples"
BUNDLE = json.loads((DOCS / "evidence-example.json").read_text())
LOG_KEY = load_public_key((DOCS / "log-key.pub.pem").read_text())


def test_the_worked_example_verifies():
    result = verify_bundle(BUNDLE, LOG_KEY)
    assert (result.leaf_index, result.tree_size) == (3, 4)


def test_one_flipped_logprob_bit_fails_jcs():
    forged = copy.deepcopy(BUNDLE)
    choice = forged["envelope"]["body"]["choices"][0]
    raw = bytearray(base64.b64decode(choice["logprobs"]))
    raw[0] ^= 1
    choice["logprobs"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(VerificationError) as err:
        verify_bundle(forged, LOG_KEY)
    assert err.value.details["check"] == "jcs"
