"""The transparency log over real HTTP on both backends: checkpoints, proofs, evidence."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledger import merkle
from ledger.canonical import canonicalize
from ledger.checkpoint import parse_checkpoint, sign_checkpoint, verify_checkpoint
from ledger.errors import VerificationError
from ledger.evidence import verify_bundle
from ledger.signing import SigningKey, public_key_raw, sign_envelope
from ledger.storage import log as log_store
from ledger.storage.audit import audit
from tests.support.harness import Harness
from tests.support.http import assert_error


def b64d(s: str) -> bytes:
    return base64.b64decode(s)


def ingest(api: Harness, n: int) -> list[dict]:
    key, fp = api.setup_collector()
    envs = [api.record(key, fp) for _ in range(n)]
    resp = api.post(envs)
    assert resp.status_code == 201
    return resp.json()["results"]


def checkpoint(api: Harness) -> dict:
    resp = api.client().post("/v1/log/checkpoint")
    assert resp.status_code == 200, resp.text
    cp = resp.json()
    verify_checkpoint(cp["note"], api.log_key.public_key)
    return cp


def test_inclusion_and_consistency_proofs_verify_against_signed_checkpoints(api: Harness):
    first_batch = ingest(api, 5)
    cp1 = checkpoint(api)
    ingest(api, 7)
    cp2 = checkpoint(api)
    assert cp2["tree_size"] == cp1["tree_size"] + 9  # a key, a fingerprint, 7 records
    c = api.client()
    for item in first_batch:
        proof = c.get(
            "/v1/log/proof/inclusion",
            params={"index": item["log_index"], "tree_size": cp2["tree_size"]},
        ).json()
        env = c.get(f"/v1/records/{item['request_id']}").json()["envelope"]
        leaf = merkle.leaf_hash(canonicalize(env))
        assert b64d(proof["leaf_hash"]) == leaf
        merkle.verify_inclusion(
            leaf,
            item["log_index"],
            cp2["tree_size"],
            [b64d(h) for h in proof["hashes"]],
            b64d(cp2["root_hash"]),
        )
    cons = c.get(
        "/v1/log/proof/consistency",
        params={"first": cp1["tree_size"], "second": cp2["tree_size"]},
    ).json()
    merkle.verify_consistency(
        cp1["tree_size"],
        cp2["tree_size"],
        b64d(cp1["root_hash"]),
        b64d(cp2["root_hash"]),
        [b64d(h) for h in cons["hashes"]],
    )
    latest = c.get("/v1/log/checkpoint").json()
    assert latest["tree_size"] >= cp2["tree_size"]
    assert_error(
        c.get("/v1/log/proof/inclusion", params={"index": 0, "tree_size": 10**9}),
        422,
        "invalid_tree_size",
    )
    assert_error(
        c.get("/v1/log/proof/inclusion", params={"index": 5, "tree_size": 5}), 422, "invalid_index"
    )
    assert_error(
        c.get("/v1/log/proof/consistency", params={"first": 9, "second": 3}),
        422,
        "invalid_tree_size",
    )
    # proofs that read no node (first 0, or first == second) were answered for trees the log
    # does not have
    size = latest["tree_size"]
    for first, second in ((0, 2**63 - 1), (10**12, 10**12), (0, 10**12)):
        assert_error(
            c.get("/v1/log/proof/consistency", params={"first": first, "second": second}),
            422,
            "invalid_tree_size",
        )
    same = c.get("/v1/log/proof/consistency", params={"first": size, "second": size})
    assert same.status_code == 200 and same.json()["hashes"] == []


def test_checkpoints_are_signed_in_the_background(api: Harness):
    ingest(api, 2)
    size = api.client().get("/v1/log/proof/inclusion", params={"index": 0, "tree_size": 1})
    assert size.status_code == 200
    deadline = time.monotonic() + 10
    c = api.client()
    while time.monotonic() < deadline:
        cp = c.get("/v1/log/checkpoint")
        if cp.status_code == 200:
            with api.db.read() as s:
                current = log_store.log_size(s)
            if cp.json()["tree_size"] == current:
                return
        time.sleep(0.2)
    raise AssertionError("no checkpoint of the current tree within 10 s (interval 1 s)")


def test_log_key_is_served(api: Harness):
    info = api.client(token=None).get("/v1/log/key").json()
    assert info["key_id"] == api.log_key.key_id
    assert info["pem"].startswith("-----BEGIN PUBLIC KEY-----")
    assert info["vkey"].startswith(info["origin"] + "+")


@pytest.fixture
def bundle(api: Harness) -> dict:
    item = ingest(api, 3)[1]
    resp = api.client().get(f"/v1/records/{item['request_id']}/evidence")
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_evidence_bundle_verifies_offline(api: Harness, bundle: dict):
    result = verify_bundle(bundle, api.log_key.public_key)
    assert result.log_key_pinned and result.leaf_index == bundle["leaf_index"]
    assert bundle["format"] == "inference-ledger/evidence/v3"
    assert_error(api.client().get("/v1/records/nope/evidence"), 404, "record_not_found")


def _flip_logprob(b: dict) -> None:
    lp = bytearray(b64d(b["envelope"]["body"]["choices"][0]["logprobs"]))
    lp[0] ^= 1
    b["envelope"]["body"]["choices"][0]["logprobs"] = base64.b64encode(bytes(lp)).decode()


def _resign_with_other_key(b: dict) -> None:
    other = SigningKey.generate()
    env = sign_envelope(b["envelope"]["kind"], b["envelope"]["body"], other)
    b["envelope"] = env.to_dict()
    b["leaf_hash"] = base64.b64encode(merkle.leaf_hash(canonicalize(b["envelope"]))).decode()
    b["keys"]["collector"]["key_id"] = other.key_id
    b["keys"]["collector"]["public_key"] = (
        "ed25519:" + base64.b64encode(public_key_raw(other.public_key)).decode()
    )


def _foreign_checkpoint(b: dict) -> None:

    cp, _ = parse_checkpoint(b["checkpoint"])
    b["checkpoint"] = sign_checkpoint(cp, SigningKey.generate(), name=cp.origin)


def _bump_leaf_hash(b: dict) -> None:
    b["leaf_hash"] = base64.b64encode(b"\x00" * 32).decode()


TAMPERS = {
    "flipped_logprob": (_flip_logprob, "jcs"),
    "resigned_by_unregistered_key": (_resign_with_other_key, "inclusion_proof"),
    "foreign_checkpoint": (_foreign_checkpoint, "checkpoint_signature"),
    "wrong_index": (lambda b: b.update(leaf_index=b["leaf_index"] + 1), "inclusion_proof"),
    "truncated_proof": (
        lambda b: b["inclusion_proof"].update(hashes=b["inclusion_proof"]["hashes"][:-1]),
        "inclusion_proof",
    ),
    "missing_member": (lambda b: b.pop("checkpoint"), "format"),
    "leaf_hash": (_bump_leaf_hash, "jcs"),
    "no_registration": (lambda b: b["keys"]["collector"].pop("registration"), "format"),
}


@pytest.mark.parametrize("case", sorted(TAMPERS))
def test_tampered_bundles_fail_naming_the_check(api: Harness, bundle: dict, case: str):
    edit, check = TAMPERS[case]
    forged = copy.deepcopy(bundle)
    edit(forged)
    with pytest.raises(VerificationError) as err:
        verify_bundle(forged, api.log_key.public_key)
    assert err.value.details["check"] == check, err.value.message


def test_a_bundle_signed_by_another_log_fails_the_pin(api: Harness, bundle: dict):
    with pytest.raises(VerificationError) as err:
        verify_bundle(bundle, SigningKey.generate().public_key)
    assert err.value.details["check"] == "log_key_pin"


def test_verify_cli_exit_codes(api: Harness, bundle: dict, tmp_path: Path):
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle))
    pub = tmp_path / "log.pub.pem"
    pub.write_text(api.client(token=None).get("/v1/log/key").json()["pem"])
    run = [sys.executable, "-m", "cli", "verify", str(path), "--log-key", str(pub), "--json"]
    ok = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["valid"] is True
    forged = copy.deepcopy(bundle)
    _flip_logprob(forged)
    path.write_text(json.dumps(forged))
    bad = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["check"] == "jcs"


def test_audit_of_an_honest_ledger_passes(api: Harness):
    ingest(api, 4)
    checkpoint(api)
    report = audit(api.db, api.log_key.public_key)
    assert report.ok, [f.to_dict() for f in report.findings]
    assert report.checkpoints >= 1 and report.leaves > 4
