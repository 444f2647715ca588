"""Evidence bundles (format v2) from a live ledger over HTTP, on SQLite and Postgres.

A bundle carries the fingerprint its record names, and every member that repeats a signed
fact must equal it: each edit below makes the bundle INVALID naming the check, and a walk over
every member of real bundles shows that no edit at all goes unnoticed (but ``exported_at``,
which nothing signs). ``ledger verify`` refuses to run without a pinned log key unless told.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ledger import merkle
from ledger.canonical import canonicalize, digest_of
from ledger.checkpoint import parse_checkpoint, sign_checkpoint
from ledger.errors import IndexMismatch, VerificationError
from ledger.evidence import CHECKS, FINGERPRINT_CHECKS, FORMAT, FORMAT_V1, verify_bundle
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.signing import SigningKey, public_key_pem, public_key_raw, sign_envelope
from ledger.storage import ingest, proofs, verdicts
from ledger.storage.database import Database
from tests.support.cli import ledger
from tests.support.documents import record_envelope
from tests.support.harness import Harness
from tests.support.seed import seed_ledger
from tests.support.walk import paths

RICH_FINGERPRINT = {
    "schema_version": 1,
    "model": {"digest": "sha256:" + "ab" * 32, "files": []},
    "engine": {"name": "vllm", "version": "0.32.0", "batch_invariance": "serial"},
    "gpu": {
        "driver_version": "580.65",
        "gpus": [{"index": 0, "name": "NVIDIA H200"}, {"index": 1, "name": "NVIDIA H200"}],
    },
}


@dataclass
class Scene:
    """Two records of one collector: ``own`` under a fingerprint it signed (with a replay
    verdict), ``shared`` under a fingerprint another collector signed; both bundles fetched
    over HTTP under the same checkpoint."""

    api: Harness
    own: dict[str, Any]
    shared: dict[str, Any]
    fingerprint_bytes: bytes  # the fingerprint of ``own`` as GET /v1/fingerprints serves it

    @property
    def log_key(self) -> Any:
        return self.api.log_key.public_key


def _register_fingerprint(api: Harness, key: SigningKey, body: dict[str, Any]) -> str:
    resp = api.client().post(
        "/v1/fingerprints", content=sign_envelope(FINGERPRINT_KIND, body, key).canonical
    )
    assert resp.status_code == 201, resp.text
    fp_id: str = resp.json()["fingerprint_id"]
    return fp_id


def _verdict_for(api: Harness, record: dict[str, Any], log_index: int) -> None:
    """A replay verdict in the log, signed by the log key (as the replayer writes one)."""
    body = record["body"]
    verdicts.append_verdict(
        api.db,
        api.log_key,
        {
            "schema_version": 1,
            "replay_id": f"rep-{uuid.uuid4().hex[:12]}",
            "request_id": body["request_id"],
            "record": {
                "log_index": log_index,
                "content_hash": digest_of(body),
                "fingerprint_id": body["fingerprint_id"],
            },
            "pool": body["pool"],
            "worker_id": "w-replay",
            "verdict": "bitwise",
            "reason": None,
        },
    )


@pytest.fixture(scope="module")
def scene(api: Harness) -> Iterator[Scene]:
    collector, other = api.collector(), api.collector()
    own_fp = _register_fingerprint(api, collector, {**RICH_FINGERPRINT, "nonce": uuid.uuid4().hex})
    shared_fp = api.fingerprint(other)
    filler = api.record(collector, own_fp)  # a leaf between the fingerprint and the record
    own, shared = api.record(collector, own_fp), api.record(collector, shared_fp)
    resp = api.post([filler, own, shared])
    assert resp.status_code == 201, resp.text
    own_index = resp.json()["results"][1]["log_index"]
    _verdict_for(api, own.to_dict(), own_index)
    c = api.client()
    assert c.post("/v1/log/checkpoint").status_code == 200
    bundles = [c.get(f"/v1/records/{e.body['request_id']}/evidence") for e in (own, shared)]
    assert all(b.status_code == 200 for b in bundles), [b.text for b in bundles]
    fp = c.get(f"/v1/fingerprints/{own_fp}")
    assert fp.status_code == 200
    yield Scene(api, bundles[0].json(), bundles[1].json(), fp.content)


def _invalid(bundle: dict[str, Any], log_key: Any) -> VerificationError:
    with pytest.raises(VerificationError) as err:
        verify_bundle(bundle, log_key)
    return err.value


# ---- the fingerprint -----------------------------------------------------------------------


def test_the_bundle_carries_the_fingerprint_as_logged(scene: Scene) -> None:
    own = scene.own
    assert own["format"] == FORMAT
    served = json.loads(scene.fingerprint_bytes)
    assert canonicalize(own["fingerprint"]["envelope"]) == canonicalize(served["envelope"])
    assert own["fingerprint"]["leaf_index"] == served["log_index"]
    result = verify_bundle(own, scene.log_key)
    assert result.checks == CHECKS and result.log_key_pinned
    assert result.checkpoint_signed_at is not None  # the log's signed time for the checkpoint
    fp = result.fingerprint
    assert fp is not None
    assert fp.fingerprint_id == own["envelope"]["body"]["fingerprint_id"]
    assert fp.fingerprint_id == served["fingerprint_id"]
    assert (fp.model_digest, fp.engine_name, fp.engine_version) == (
        "sha256:" + "ab" * 32,
        "vllm",
        "0.32.0",
    )
    assert fp.gpus == ("NVIDIA H200", "NVIDIA H200") and fp.batch_invariance == "serial"
    assert result.replay_verdicts == ("bitwise",)
    assert result.collector_name == own["keys"]["collector"]["name"]


def test_a_fingerprint_signed_by_another_collector_is_carried_with_its_key(scene: Scene) -> None:
    keys = scene.shared["keys"]
    assert keys["fingerprint_signer"]["key_id"] != keys["collector"]["key_id"]
    result = verify_bundle(scene.shared, scene.log_key)
    assert result.fingerprint is not None
    assert result.fingerprint.signer_key_id == keys["fingerprint_signer"]["key_id"]
    assert result.fingerprint.gpus == () and result.fingerprint.model_digest is None


# ---- every member edit is INVALID, naming the check ----------------------------------------


def _b64_flip(text: str) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[0] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def _other_key(entry: dict[str, Any]) -> None:
    """Replace a key entry's key by another valid key, consistently (key_id = its hash)."""
    key = SigningKey.generate()
    entry["key_id"] = key.key_id
    entry["public_key"] = "ed25519:" + base64.b64encode(public_key_raw(key.public_key)).decode()


def _resign_record(b: dict[str, Any], _: Scene) -> None:
    other = SigningKey.generate()
    b["envelope"] = sign_envelope(b["envelope"]["kind"], b["envelope"]["body"], other).to_dict()
    b["leaf_hash"] = base64.b64encode(merkle.leaf_hash(canonicalize(b["envelope"]))).decode()
    b["keys"]["collector"]["key_id"] = other.key_id
    b["keys"]["collector"]["public_key"] = (
        "ed25519:" + base64.b64encode(public_key_raw(other.public_key)).decode()
    )


def _flip_logprob(b: dict[str, Any], _: Scene) -> None:
    choice = b["envelope"]["body"]["choices"][0]
    choice["logprobs"] = _b64_flip(choice["logprobs"])


def _foreign_checkpoint(b: dict[str, Any], _: Scene) -> None:
    cp, _sigs = parse_checkpoint(b["checkpoint"])
    b["checkpoint"] = sign_checkpoint(cp, SigningKey.generate(), name=cp.origin)


def _resign_fingerprint(b: dict[str, Any], _: Scene) -> None:
    """The same body under a valid signature of another key (the signer entry follows)."""
    other = SigningKey.generate()
    env = b["fingerprint"]["envelope"]
    b["fingerprint"]["envelope"] = sign_envelope(env["kind"], env["body"], other).to_dict()
    b["keys"]["fingerprint_signer"]["key_id"] = other.key_id
    b["keys"]["fingerprint_signer"]["public_key"] = (
        "ed25519:" + base64.b64encode(public_key_raw(other.public_key)).decode()
    )


def _swap_fingerprint(with_signer: bool) -> Callable[[dict[str, Any], Scene], None]:
    def edit(b: dict[str, Any], s: Scene) -> None:
        b["fingerprint"] = copy.deepcopy(s.shared["fingerprint"])
        if with_signer:
            b["keys"]["fingerprint_signer"] = copy.deepcopy(s.shared["keys"]["fingerprint_signer"])

    return edit


def _set(path: str, value: Any) -> Callable[[dict[str, Any], Scene], None]:
    def edit(b: dict[str, Any], _: Scene) -> None:
        *parents, last = path.split(".")
        node: Any = b
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[int(last) if isinstance(node, list) else last] = (
            value(node[int(last) if isinstance(node, list) else last]) if callable(value) else value
        )

    return edit


def _pop(path: str) -> Callable[[dict[str, Any], Scene], None]:
    def edit(b: dict[str, Any], _: Scene) -> None:
        *parents, last = path.split(".")
        node: Any = b
        for p in parents:
            node = node[p]
        node.pop(last)

    return edit


def _plus(n: int) -> Callable[[int], int]:
    return lambda v: v + n


EDITS: dict[str, tuple[Callable[[dict[str, Any], Scene], None], str]] = {
    # top level
    "format_unknown": (_set("format", "inference-ledger/evidence/v9"), "format"),
    "format_downgraded_to_v1": (_set("format", FORMAT_V1), "format"),
    "request_id": (_set("request_id", "req-someone-else"), "request_id"),
    "request_id_of_the_other_record": (
        lambda b, s: b.update(request_id=s.shared["request_id"]),
        "request_id",
    ),
    "unknown_member": (_set("verdict", "bitwise"), "format"),
    "leaf_index_as_bool": (_set("leaf_index", True), "format"),
    # the record
    "record_logprob_bit": (_flip_logprob, "jcs"),
    "record_resigned_by_an_unregistered_key": (_resign_record, "inclusion_proof"),
    "record_extra_member": (_set("envelope.extra", 1), "format"),
    "leaf_hash": (_set("leaf_hash", base64.b64encode(b"\0" * 32).decode()), "jcs"),
    "leaf_index": (_set("leaf_index", _plus(1)), "inclusion_proof"),
    "tree_size": (_set("inclusion_proof.tree_size", _plus(1)), "inclusion_proof"),
    "proof_hash": (_set("inclusion_proof.hashes.0", _b64_flip), "inclusion_proof"),
    "proof_truncated": (_set("inclusion_proof.hashes", lambda h: h[:-1]), "inclusion_proof"),
    "checkpoint_of_another_log": (_foreign_checkpoint, "checkpoint_signature"),
    # the record's collector key
    "collector_name": (_set("keys.collector.name", "trusted-collector"), "collector_key"),
    "collector_role": (_set("keys.collector.role", "replayer"), "collector_key"),
    "collector_key_id": (_set("keys.collector.key_id", "ed25519:" + "0" * 64), "format"),
    "collector_other_key": (lambda b, s: _other_key(b["keys"]["collector"]), "collector_signature"),
    "collector_registration_index": (
        _set("keys.collector.registration.leaf_index", _plus(1)),
        "collector_key",
    ),
    "collector_registration_hash": (
        _set("keys.collector.registration.hashes.0", _b64_flip),
        "collector_key",
    ),
    "collector_registration_of_another_key": (
        lambda b, s: b["keys"]["collector"].update(
            registration=copy.deepcopy(s.shared["keys"]["fingerprint_signer"]["registration"])
        ),
        "collector_key",
    ),
    "collector_registration_renamed": (
        _set("keys.collector.registration.envelope.body.name", "trusted-collector"),
        "collector_key",
    ),
    "collector_missing": (_pop("keys.collector"), "format"),
    # the fingerprint
    "fingerprint_missing": (_pop("fingerprint"), "format"),
    "fingerprint_body": (_set("fingerprint.envelope.body.engine.version", "0.1.0"), "fingerprint"),
    "fingerprint_swapped": (_swap_fingerprint(False), "fingerprint"),
    "fingerprint_swapped_with_its_signer": (_swap_fingerprint(True), "fingerprint"),
    "fingerprint_kind": (_set("fingerprint.envelope.kind", "replay_output"), "fingerprint"),
    "fingerprint_after_the_record": (
        lambda b, s: b["fingerprint"].update(leaf_index=b["leaf_index"] + 1),
        "fingerprint",
    ),
    "fingerprint_signature": (
        _set("fingerprint.envelope.signature.sig", _b64_flip),
        "fingerprint_signature",
    ),
    "fingerprint_resigned_by_an_unregistered_key": (_resign_fingerprint, "fingerprint_inclusion"),
    "fingerprint_index": (_set("fingerprint.leaf_index", _plus(1)), "fingerprint_inclusion"),
    "fingerprint_proof_hash": (_set("fingerprint.hashes.0", _b64_flip), "fingerprint_inclusion"),
    "fingerprint_proof_truncated": (
        _set("fingerprint.hashes", lambda h: h[:-1]),
        "fingerprint_inclusion",
    ),
    "fingerprint_extra_member": (_set("fingerprint.fingerprint_id", "sha256:00"), "format"),
    # the fingerprint's signer
    "signer_missing": (_pop("keys.fingerprint_signer"), "format"),
    "signer_name": (_set("keys.fingerprint_signer.name", "gpu-host-1"), "fingerprint_key"),
    "signer_role": (_set("keys.fingerprint_signer.role", "replayer"), "fingerprint_key"),
    "signer_key_id": (_set("keys.fingerprint_signer.key_id", "ed25519:" + "0" * 64), "format"),
    "signer_other_key": (
        lambda b, s: _other_key(b["keys"]["fingerprint_signer"]),
        "fingerprint_signature",
    ),
    "signer_registration_index": (
        _set("keys.fingerprint_signer.registration.leaf_index", _plus(1)),
        "fingerprint_key",
    ),
    "signer_registration_of_another_key": (
        lambda b, s: b["keys"]["fingerprint_signer"].update(
            registration=copy.deepcopy(s.shared["keys"]["fingerprint_signer"]["registration"])
        ),
        "fingerprint_key",
    ),
    # the log key
    "log_origin": (_set("keys.log.origin", "ledger.example/other"), "checkpoint_signature"),
    "log_vkey": (_set("keys.log.vkey", lambda v: v[:-4] + "AAAA"), "checkpoint_signature"),
    "log_other_key": (lambda b, s: _other_key(b["keys"]["log"]), "log_key_pin"),
    "log_key_id": (_set("keys.log.key_id", "ed25519:" + "0" * 64), "format"),
    "keys_extra_member": (_set("keys.replayer", {}), "format"),
    # replay verdicts
    "replays_missing": (_pop("replays"), "format"),
    "replay_verdict": (_set("replays.0.envelope.body.verdict", "diverged"), "replays"),
    "replay_index": (_set("replays.0.leaf_index", _plus(1)), "replays"),
    "replay_proof_hash": (_set("replays.0.hashes.0", _b64_flip), "replays"),
    "replay_duplicated": (
        lambda b, s: b["replays"].append(copy.deepcopy(b["replays"][0])),
        "replays",
    ),
    "replay_summary_member": (_set("replays.0.verdict", "bitwise"), "format"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_each_member_edit_is_invalid_naming_the_check(scene: Scene, case: str) -> None:
    edit, check = EDITS[case]
    forged = copy.deepcopy(scene.own)
    edit(forged, scene)
    assert check in CHECKS
    err = _invalid(forged, scene.log_key)
    assert err.details["check"] == check, err.message


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "A"
    if value is None:
        return "x"
    if isinstance(value, list):
        return [*value, copy.deepcopy(value[-1]) if value else "x"]
    return {**value, "x": 1}


def _at(bundle: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        bundle = bundle[p]
    return bundle


@pytest.mark.parametrize("which", ["own", "shared"])
def test_no_member_of_a_bundle_can_be_changed_or_removed_unnoticed(scene: Scene, which: str):
    """Every value, object and array of real bundles, changed and (for members) removed."""
    bundle = getattr(scene, which)
    unnoticed = []
    tried = 0
    for path in paths(bundle):
        edits = [("change", lambda parent, key: parent.__setitem__(key, _changed(parent[key])))]
        if path and isinstance(path[-1], str):
            edits.append(("remove", lambda parent, key: parent.pop(key)))
        for name, edit in edits:
            forged = copy.deepcopy(bundle)
            if path:
                edit(_at(forged, path[:-1]), path[-1])
            else:
                forged = _changed(forged)
            tried += 1
            try:
                verify_bundle(forged, scene.log_key)
            except VerificationError:
                continue
            unnoticed.append((name, path))
    assert tried > 100
    # exported_at says when the file was made; nothing signs it (docs/EVIDENCE.md)
    assert unnoticed == [("change", ("exported_at",))], unnoticed


# ---- format v1 -----------------------------------------------------------------------------


def _as_v1(bundle: dict[str, Any]) -> dict[str, Any]:
    old = copy.deepcopy(bundle)
    old["format"] = FORMAT_V1
    old.pop("fingerprint")
    old.pop("disclosures")  # v3 members
    old["keys"].pop("fingerprint_signer")
    return old


def test_a_v1_bundle_verifies_saying_the_fingerprint_was_not_checked(scene: Scene) -> None:
    result = verify_bundle(_as_v1(scene.own), scene.log_key)
    assert result.fingerprint is None and result.format == FORMAT_V1
    assert not set(FINGERPRINT_CHECKS) & set(result.checks)
    old = _as_v1(scene.own)
    old["keys"]["collector"]["role"] = "replayer"  # v1 bundles get the key checks too
    assert _invalid(old, scene.log_key).details["check"] == "collector_key"


# ---- ledger verify -------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return ledger("verify", *args, check=False, env={"COLUMNS": "250"})


def test_verify_requires_a_pinned_log_key_or_the_named_opt_out(scene: Scene, tmp_path: Path):
    if scene.api.backend != "sqlite":
        pytest.skip("the CLI reads a file: one backend's bundle is enough")
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(scene.own))
    pem = tmp_path / "log.pub.pem"
    pem.write_text(public_key_pem(scene.api.log_key.public_key))

    unpinned = _cli(str(path))
    assert unpinned.returncode == 2, unpinned.stdout + unpinned.stderr
    assert "no log key pinned" in unpinned.stderr and "--log-key" in unpinned.stderr
    assert "VALID" not in unpinned.stdout

    trusted = _cli(str(path), "--trust-bundled-log-key")
    assert trusted.returncode == 0, trusted.stderr
    assert "LOG KEY NOT PINNED" in trusted.stdout and "NOT pinned" in trusted.stderr
    trusted_json = json.loads(_cli(str(path), "--trust-bundled-log-key", "--json").stdout)
    assert trusted_json["valid"] is True and trusted_json["log_key_pinned"] is False
    assert "NOT pinned" in trusted_json["warning"]

    pinned = _cli(str(path), "--log-key", str(pem))
    assert pinned.returncode == 0, pinned.stderr
    assert "NOT PINNED" not in pinned.stdout + pinned.stderr
    for fact in ("sha256:" + "ab" * 32, "vllm 0.32.0", "NVIDIA H200 x2", "serial", "580.65"):
        assert fact in pinned.stdout, pinned.stdout
    assert "bitwise" in pinned.stdout
    facts = json.loads(_cli(str(path), "--log-key", str(pem), "--json").stdout)
    assert facts["checks"] == list(CHECKS) and facts["skipped_checks"] == []
    assert facts["fingerprint"]["engine_version"] == "0.32.0"
    assert facts["fingerprint"]["gpus"] == ["NVIDIA H200", "NVIDIA H200"]
    assert facts["collector_key_name"] == scene.own["keys"]["collector"]["name"]

    forged = copy.deepcopy(scene.own)
    forged["keys"]["collector"]["role"] = "replayer"
    path.write_text(json.dumps(forged))
    # the opt-out does not make a forged bundle valid
    bad = _cli(str(path), "--trust-bundled-log-key", "--json")
    assert bad.returncode == 1 and json.loads(bad.stdout)["check"] == "collector_key"


# ---- the ledger does not export a bundle its index rows contradict -------------------------


@pytest.mark.postgres
@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE records SET fingerprint_id = %(other_fp)s WHERE request_id = %(victim)s",
        "UPDATE records SET key_id = %(other_key)s WHERE request_id = %(victim)s",
        "UPDATE fingerprints SET log_index = %(victim_index)s WHERE fingerprint_id = %(fp)s",
        "UPDATE fingerprints SET key_id = %(other_key)s WHERE fingerprint_id = %(fp)s",
        # rows deleted: an edited index (500), never a database to retry (503 storage_error)
        "DELETE FROM fingerprints WHERE fingerprint_id = %(fp)s",
        "DELETE FROM signing_keys WHERE key_id = %(key)s",
    ],
    ids=[
        "records.fingerprint_id",
        "records.key_id",
        "fingerprints.log_index",
        "fingerprints.key_id",
        "fingerprints-deleted",
        "signing_keys-deleted",
    ],
)
def test_index_rows_that_contradict_the_log_give_no_bundle(postgres_databases, edit: str) -> None:
    url = postgres_databases.fresh()
    db = Database(url)
    try:
        seeded = seed_ledger(db)
        other = seed_ledger(db, seeded.log_key, name="other")  # another key and fingerprint
        env = record_envelope(seeded.collector, seeded.fingerprint_id)
        (victim,) = ingest.ingest_records(db, [env.to_dict()])
        bundle = proofs.evidence(db, seeded.log_key, "t/log", victim.request_id)
        verify_bundle(bundle, seeded.log_key.public_key)
        with psycopg.connect(url) as conn:
            # as a superuser, past the append-only triggers and the foreign keys
            table = re.match(r"(?:UPDATE|DELETE FROM) (\w+)", edit)[1]  # type: ignore[index]
            conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
            conn.execute("SET session_replication_role = replica")
            conn.execute(
                edit,
                {
                    "victim": victim.request_id,
                    "fp": seeded.fingerprint_id,
                    "other_fp": other.fingerprint_id,
                    "victim_index": victim.log_index,
                    "other_key": other.collector.key_id,
                    "key": seeded.collector.key_id,
                },
            )
            conn.commit()
        with pytest.raises(IndexMismatch) as err:
            proofs.evidence(db, seeded.log_key, "t/log", victim.request_id)
        assert err.value.code == "index_mismatch", err.value.message
    finally:
        db.dispose()
