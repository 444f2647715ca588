"""api/ui/static/verify.js against the Python verifier it ports (``ledger.evidence``).

Differential tests in Chromium: every bundle below verifies in the browser with every check
passing and the facts ``ledger verify`` reports; every edit of every member of those bundles
fails in the browser at exactly the check ``VerificationError.details["check"]`` names in
Python (or verifies in both); and the pieces that decide a check on their own (strict base64,
reading JSON numbers, RFC 8785, timestamps, disclosures, pinned keys) answer as their Python
originals do. Each test sends its whole batch into the page in one ``page.evaluate`` call.

The bundles: the two documented examples (v3, and v1 under its own log key), and v3 bundles
of a SQLite ledger built here: a schema v1 record, a schema v2 record with all of its
disclosures and two replay verdicts, the same with its output redacted, and a record whose
content was erased, exported before and after the erasure.
"""

from __future__ import annotations

import base64
import json
import random
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ledger import merkle
from ledger.canonical import canonicalize, digest_of
from ledger.checkpoint import Checkpoint, parse_checkpoint, sign_checkpoint, verifier_key
from ledger.clock import rfc3339
from ledger.disclosures import parse as parse_disclosure
from ledger.errors import LedgerError, VerificationError
from ledger.evidence import CHECKS, VerifiedBundle, verify_bundle
from ledger.evidence_format import load_bundle
from ledger.fingerprint import FINGERPRINT_KIND
from ledger.packing import pack_float32, unpack_float32
from ledger.records import RECORD_KIND, _parse_time
from ledger.signing import (
    Envelope,
    SigningKey,
    load_public_key,
    public_key_pem,
    public_key_raw,
    sign_envelope,
)
from ledger.storage import erasures, ingest, keystore, proofs, verdicts
from ledger.storage.checkpoints import default_origin
from ledger.storage.database import Database
from tests.api.ui.conftest import BrowserPage
from tests.support.databases import SqliteDatabases
from tests.support.documents import record_envelope, record_item_v2
from tests.support.seed import seed_ledger
from tests.support.walk import paths

if shutil.which("chromium") is None:
    pytest.skip(
        "chromium is not on PATH: verify.js is tested in Debian's chromium (apt install chromium)",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "docs" / "examples"
RICH_FINGERPRINT = {
    "schema_version": 1,
    "model": {"digest": "sha256:" + "ab" * 32, "files": []},
    "engine": {"name": "vllm", "version": "0.32.0", "batch_invariance": "serial"},
    "gpu": {
        "driver_version": "580.65",
        # a device whose name NVML did not give is recorded as null, and shown as such
        "gpus": [
            {"index": 0, "name": "NVIDIA H200"},
            {"index": 1, "name": "NVIDIA H200"},
            {"index": 2, "name": None},
        ],
    },
}


@dataclass(frozen=True)
class Case:
    """A bundle as its JSON text, and the log key (PEM) to pin, or None."""

    name: str
    text: str
    pem: str | None


@dataclass
class Ledger:
    """Bundles of a SQLite ledger, and what the tamper cases need of it."""

    log_key: SigningKey
    host: SigningKey  # a second registered collector: it signed the records' fingerprint
    pem: str
    bundles: dict[str, dict[str, Any]]
    # A record naming a pool its key's registration does not allow, logged by a ledger that
    # did not check scopes (an older one, or one whose check was bypassed).
    out_of_scope: dict[str, Any]
    # A record whose erasure event, signed by the log key, names a digest nothing commits to
    # (a ledger that took its digests from an edited index row).
    overreaching_erasure: dict[str, Any]

    def case(self, name: str) -> Case:
        return Case(name, json.dumps(self.bundles[name]), self.pem)


def _verdict(log_key: SigningKey, envelope: dict[str, Any], index: int, verdict: str) -> Any:
    body = envelope["body"]
    return {
        "schema_version": 1,
        "replay_id": f"rep-{uuid.uuid4().hex[:12]}",
        "request_id": body["request_id"],
        "record": {
            "log_index": index,
            "content_hash": digest_of(body),
            "fingerprint_id": body["fingerprint_id"],
        },
        "pool": body["pool"],
        "worker_id": "w-replay",
        "worker_key_id": log_key.key_id,
        "verdict": verdict,
        "reason": None,
    }


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    """A small ledger: a collector, a second collector that signed the records' fingerprint,
    records of schema v1 and v2, replay verdicts, an erasure; bundles exported from it."""
    db = Database(SqliteDatabases(tmp_path_factory.mktemp("verify-js-db")).fresh())
    seeded = seed_ledger(db)
    log_key, collector = seeded.log_key, seeded.collector
    host = SigningKey.generate()
    keystore.register_key(
        db, log_key, name="gpu-host-7", role="collector", public_key=public_key_pem(host.public_key)
    )
    fingerprint = sign_envelope(FINGERPRINT_KIND, RICH_FINGERPRINT, host).to_dict()
    fp = ingest.add_fingerprint(db, fingerprint).fingerprint_id
    v1 = record_envelope(collector, fp, top_k=2, out_len=4, prompt_len=5).to_dict()
    full = record_item_v2(collector, fp, top_k=2, out_len=4, prompt_len=5, text_prompt=True)
    gone = record_item_v2(collector, seeded.fingerprint_id, out_len=3, prompt_len=4)
    logged = ingest.ingest_records(db, [v1, full, gone])
    index = {r.request_id: r.log_index for r in logged}
    ids = {"v1": v1["body"]["request_id"], "full": full.envelope["body"]["request_id"]}
    ids["gone"] = gone.envelope["body"]["request_id"]
    for verdict in ("bitwise", "diverged"):
        body = _verdict(log_key, full.envelope, index[ids["full"]], verdict)
        verdicts.append_verdict(db, log_key, body)
    body = _verdict(log_key, v1, index[ids["v1"]], "bitwise")
    verdicts.append_verdict(db, log_key, body)
    origin = default_origin(log_key)

    def export(name: str, redact: tuple[str, ...] = ()) -> dict[str, Any]:
        return proofs.evidence(db, log_key, origin, ids[name], redact)

    scoped = SigningKey.generate()
    keystore.register_key(
        db,
        log_key,
        name="pool-a-collector",
        role="collector",
        public_key=public_key_pem(scoped.public_key),
        pools=["pool-a"],
    )
    stray = record_envelope(scoped, fp, pool="pool-b").to_dict()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keystore, "out_of_scope", lambda *_: None)
        ingest.ingest_records(db, [stray])
    ids["stray"] = stray["body"]["request_id"]
    out_of_scope = export("stray")
    liar = record_item_v2(collector, seeded.fingerprint_id, out_len=3, prompt_len=4)
    ingest.ingest_records(db, [liar])
    ids["liar"] = liar.envelope["body"]["request_id"]
    bogus = "sha256:" + "ab" * 32
    with pytest.MonkeyPatch.context() as patch:
        checked = erasures._checked_content
        patch.setattr(
            erasures,
            "_checked_content",
            lambda s, records: {r: {*d, bogus} for r, d in checked(s, records).items()},
        )
        erasures.erase(db, log_key, ids["liar"], reason="data subject request", requested_by="x")
    with pytest.MonkeyPatch.context() as patch:
        # the route refuses such a bundle (its event names a digest nothing in it commits
        # to): built as a ledger without that check served it, for the verifiers to refuse
        patch.setattr(proofs, "_check_erased", lambda *_: None)
        overreaching = export("liar")
    bundles = {"erasable": export("gone")}
    erasures.erase(db, log_key, ids["gone"], reason="data subject request", requested_by="dpo")
    bundles |= {
        "v1-record": export("v1"),
        "disclosed": export("full"),
        "redacted": export("full", ("output",)),
        "erased": export("gone"),
    }
    yield Ledger(
        log_key, host, public_key_pem(log_key.public_key), bundles, out_of_scope, overreaching
    )
    db.dispose()


def _example(name: str, key: str) -> Case:
    return Case(name, (EXAMPLES / name).read_text(), (EXAMPLES / key).read_text())


@pytest.fixture(scope="module")
def cases(ledger: Ledger) -> dict[str, Case]:
    found = {
        "example": _example("evidence-example.json", "log-key.pub.pem"),
        "example-v1": _example("evidence-example-v1.json", "log-key-v1.pub.pem"),
    }
    found |= {name: ledger.case(name) for name in ledger.bundles}
    return found


CASE_NAMES = ["example", "example-v1", "v1-record", "disclosed", "redacted", "erasable", "erased"]


# --- the Python side ------------------------------------------------------------------------


def _summary(result: VerifiedBundle) -> dict[str, Any]:
    """VerifiedBundle as verify.js names its summary's members."""
    signed_at = result.checkpoint_signed_at
    return {
        "format": result.format,
        "checks": list(result.checks),
        "request_id": result.request_id,
        "kind": result.kind,
        "leaf_index": result.leaf_index,
        "tree_size": result.tree_size,
        "root_hash": base64.b64encode(result.root_hash).decode(),
        "origin": result.origin,
        "checkpoint_signed_at": rfc3339(signed_at) if signed_at else None,
        "collector_key_id": result.collector_key_id,
        "collector_name": result.collector_name,
        "collector_role": result.collector_role,
        "log_key_id": result.log_key_id,
        "log_key_pinned": result.log_key_pinned,
        "fingerprint": result.fingerprint.to_dict() if result.fingerprint else None,
        "replays": [r.to_dict() for r in result.replays],
        "replay_verdicts": list(result.replay_verdicts),
        "content": result.content.to_dict(),
    }


def python_check(text: str, pem: str | None) -> str:
    """The check Python's verifier fails ("" when the bundle verifies)."""
    pinned = load_public_key(pem) if pem else None
    try:
        verify_bundle(load_bundle(text.encode()), pinned)
    except VerificationError as exc:
        return str(exc.details.get("check"))
    except Exception as exc:  # reported as a disagreement, never hidden
        return f"python raised {type(exc).__name__}: {exc}"
    return ""


def js_checks(page: BrowserPage, texts: list[str], pem: str | None) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = page.evaluate("([t, k]) => verifyAll(t, k)", [texts, pem])
    return results


def disagreements(
    page: BrowserPage,
    batch: list[tuple[str, str, str | None]],
    verdicts: dict[str, str] | None = None,
) -> list[str]:
    """Verify (label, text, pem) items in both verifiers: where they fail at different checks.

    One known difference is left out and checked instead: a checkpoint note holding a lone
    surrogate (JSON can escape one) makes Python's verifier raise UnicodeEncodeError (encoding
    the note to check its signature) rather than a VerificationError; verify.js fails it at
    ``checkpoint_signature``, which is what the note is. ``verdicts`` collects Python's
    (label -> failed check, "" when valid).
    """
    out = []
    by_key: dict[str | None, list[tuple[str, str]]] = {}
    for label, text, pem in batch:
        by_key.setdefault(pem, []).append((label, text))
    for pem, items in by_key.items():
        got = js_checks(page, [text for _, text in items], pem)
        for (label, text), js in zip(items, got, strict=True):
            expected = python_check(text, pem)
            if verdicts is not None:
                verdicts[label] = expected
            if expected.startswith(PYTHON_ENCODE_ERROR) and _lone_surrogate_in_note(text):
                assert js["failed"] == "checkpoint_signature", label
            elif (js["failed"] or "") != expected:
                out.append(f"{label}: python {expected}, js {js['failed']} ({js['message']})")
    return out


PYTHON_ENCODE_ERROR = "python raised UnicodeEncodeError"


def _lone_surrogate_in_note(text: str) -> bool:
    note = json.loads(text).get("checkpoint")
    return isinstance(note, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in note)


# --- valid bundles ----------------------------------------------------------------------


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "not-pinned"])
def test_a_valid_bundle_verifies_with_the_facts_python_reports(
    verify_page: BrowserPage, cases: dict[str, Case], name: str, pinned: bool
) -> None:
    case = cases[name]
    pem = case.pem if pinned else None
    expected = _summary(
        verify_bundle(load_bundle(case.text.encode()), load_public_key(pem) if pem else None)
    )
    got = verify_page.evaluate("([t, k]) => verifyOne(t, k)", [case.text, pem])

    assert got["valid"] is True and got["failed"] is None, got["message"]
    assert got["pinned"] is pinned
    assert [s["check"] for s in got["steps"]] == list(CHECKS) == got["seen"]
    assert all(s["message"] for s in got["steps"])
    assert all(s["ok"] is (None if s["status"] == "skipped" else True) for s in got["steps"])
    statuses = {s["check"]: s["status"] for s in got["steps"]}
    assert statuses.pop("log_key_pin") == ("passed" if pinned else "not_pinned")
    pin = next(s for s in got["steps"] if s["check"] == "log_key_pin")
    assert pin.get("pinned", True) is pinned
    skipped = {c for c, s in statuses.items() if s == "skipped"}
    assert skipped == set(CHECKS) - set(expected["checks"])  # v1: the fingerprint checks
    assert set(statuses.values()) <= {"passed", "skipped"}

    summary = got["summary"]
    # what the console page does with the bundle it fetches: resp.json(), then verifyBundle
    parsed = verify_page.evaluate("([t, k]) => verifyOne(JSON.parse(t), k)", [case.text, pem])
    assert parsed["summary"] == summary and parsed["steps"] == got["steps"]
    for item in summary["content"]["content"]:
        assert item.pop("label")
    assert {k: summary[k] for k in expected} == expected
    assert summary["skipped_checks"] == sorted(skipped, key=CHECKS.index)


def test_the_ledger_bundles_cover_what_the_console_shows(cases: dict[str, Case]) -> None:
    """The bundles above hold every kind of fact the page shows (so the test above sees them)."""
    seen = {
        name: _summary(verify_bundle(load_bundle(cases[name].text.encode()), None))
        for name in ("disclosed", "redacted", "erased", "erasable", "v1-record")
    }
    statuses = {n: Counter(i["status"] for i in s["content"]["content"]) for n, s in seen.items()}
    assert set(statuses["disclosed"]) == {"disclosed"} and statuses["disclosed"]["disclosed"] >= 5
    assert set(statuses["redacted"]) == {"disclosed", "redacted"}
    assert set(statuses["erased"]) == {"erased"} and set(statuses["erasable"]) == {"disclosed"}
    assert seen["erased"]["content"]["erasure"]["reason"] == "data subject request"
    assert seen["disclosed"]["replay_verdicts"] == ["bitwise", "diverged"]
    assert seen["v1-record"]["content"]["schema_version"] == 1
    assert seen["v1-record"]["replay_verdicts"] == ["bitwise"]
    fingerprint = seen["disclosed"]["fingerprint"]
    assert fingerprint["gpus"] == ["NVIDIA H200", "NVIDIA H200", None]
    assert fingerprint["engine_name"] == "vllm" and fingerprint["batch_invariance"] == "serial"


# --- every member of every bundle, edited ------------------------------------------------


def _changed(value: Any) -> Any:
    """tests/api/test_erasure.py's edit: another value of the same shape."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + ("A" if value[-1:] != "A" else "B") if value else "x"
    if value is None:
        return "x"
    if isinstance(value, list):
        return [*value, json.loads(json.dumps(value[-1])) if value else "x"]
    return {**value, "x": 1}


Edit = Callable[[Any, Any], None]


def _set(make: Callable[[Any], Any]) -> Edit:
    def edit(parent: Any, key: Any) -> None:
        parent[key] = make(parent[key])

    return edit


def _remove(parent: Any, key: Any) -> None:
    parent.pop(key)


# Every member: changed, removed, nulled; every integer: written as a float (1 -> 1.0).
WALK: dict[str, Edit] = {
    "change": _set(_changed),
    "remove": _remove,
    "null": _set(lambda v: None),
    "float": _set(float),
}
# Every scalar member of one bundle, also: a boolean, integers beyond 2**53, -0.0 and 1e21,
# infinity (json.dumps writes Infinity), a lone surrogate, and a float's last digit changed.
NUMBERS: dict[str, Edit] = {
    "true": _set(lambda v: True),
    "big": _set(lambda v: 2**60 + 1),
    "past-safe": _set(lambda v: 2**53 + 1),
    "-0.0": _set(lambda v: -0.0),
    "1e21": _set(lambda v: 1e21),
    "inf": _set(lambda v: float("inf")),
    "surrogate": _set(lambda v: "\ud800" + v if isinstance(v, str) else "\udc00"),
}


def _applies(name: str, value: Any, key: Any) -> bool:
    if name == "remove":
        return isinstance(key, str)
    if name == "float":
        return type(value) is int
    if name in NUMBERS:
        return not isinstance(value, dict | list)
    return True


def mutations(bundle: dict[str, Any], edits: dict[str, Edit]) -> Iterator[tuple[str, str]]:
    """(label, JSON text) of the bundle with one member edited, for every member and edit."""
    for path in paths(bundle):
        if not path:
            continue
        value: Any = bundle
        for p in path:
            value = value[p]
        for name, edit in edits.items():
            if not _applies(name, value, path[-1]):
                continue
            forged = json.loads(json.dumps(bundle))
            parent = forged
            for p in path[:-1]:
                parent = parent[p]
            edit(parent, path[-1])
            yield f"{name} {'.'.join(map(str, path))}", json.dumps(forged)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_edit_of_a_member_fails_at_the_check_python_names(
    verify_page: BrowserPage, cases: dict[str, Case], name: str
) -> None:
    case = cases[name]
    batch = [(label, text, case.pem) for label, text in mutations(json.loads(case.text), WALK)]
    verdicts: dict[str, str] = {}
    assert not disagreements(verify_page, batch, verdicts)
    assert len(batch) > 300
    valid = [label for label, failed in verdicts.items() if not failed]
    assert "change exported_at" in valid and len(valid) < len(batch) / 10
    print(f"{name}: {len(batch)} edits, {Counter(verdicts.values())}")


def test_numbers_and_strings_json_parse_would_read_differently(
    verify_page: BrowserPage, cases: dict[str, Case]
) -> None:
    """What a parser may read apart from Python (1.0 and 1, 2**53 + 1, -0.0, 1e21, Infinity,
    a lone surrogate, a member named twice, a byte order mark) in every scalar member: the
    browser reads the bundle's text as ``load_bundle`` does, so it fails where Python fails."""
    case = cases["disclosed"]
    batch = [(label, text, case.pem) for label, text in mutations(json.loads(case.text), NUMBERS)]
    text = case.text
    body = '"body": {'
    raw = [
        ("a member named twice", '{"format": "x", ' + text[1:]),
        ("a body member named twice", text.replace(body, body + '"pool": "p0", ', 1)),
        ("NaN", text.replace('"leaf_index": ', '"leaf_index": NaN, "x": ', 1)),
        ("a byte order mark", "\ufeff" + text),
        ("trailing data", text + " {}"),
        ("a trailing comma", text[:-1] + ", }"),
        ("single quotes", text.replace('"format"', "'format'", 1)),
        ("a control character", text.replace('"exported_at": "', '"exported_at": "\x01', 1)),
        ("no bundle", ""),
        ("an array", "[]"),
    ]
    batch += [(label, t, case.pem) for label, t in raw]
    assert len(batch) > 700
    assert not disagreements(verify_page, batch)


# --- tampering, case by case -------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _flip_logprob_bit(encoded: str) -> str:
    """The disclosure with one bit of its first logprob flipped, re-encoded canonically."""
    d = parse_disclosure(encoded)
    packed = bytearray(base64.b64decode(d.value))
    packed[0] ^= 1
    value = base64.b64encode(bytes(packed)).decode()
    return _b64url(canonicalize([d.salt, d.member, value]))


def _resigned_note(note: str, key: SigningKey) -> str:
    """The note with its signature replaced by the log key's signature of another tree."""
    cp, _ = parse_checkpoint(note)
    other = Checkpoint(cp.origin, cp.tree_size + 1, cp.root_hash, cp.signed_at, cp.extensions)
    signature = sign_checkpoint(other, key).split("\n\n", 1)[1]
    return note.split("\n\n", 1)[0] + "\n\n" + signature


def relogged(bundle: dict[str, Any], body: dict[str, Any], key: SigningKey | None) -> None:
    """The bundle's record given another body and a leaf_hash that matches it: re-signed by
    ``key`` (whose registered entry becomes keys.collector), or keeping the old signature."""
    envelope = bundle["envelope"]
    if key is None:
        envelope["body"] = body
    else:
        envelope = bundle["envelope"] = sign_envelope(RECORD_KIND, body, key).to_dict()
        bundle["keys"]["collector"] = bundle["keys"]["fingerprint_signer"]
    leaf = merkle.leaf_hash(Envelope.from_dict(envelope).canonical)
    bundle["leaf_hash"] = base64.b64encode(leaf).decode()


def tamper_cases(ledger: Ledger, cases: dict[str, Case]) -> list[tuple[str, str, str | None, str]]:
    """(what, forged text, pinned PEM, the check that must fail)."""
    out: list[tuple[str, str, str | None, str]] = []

    def forge(name: str, what: str, check: str, edit: Callable[[dict[str, Any]], Any]) -> None:
        bundle = json.loads(cases[name].text)
        edit(bundle)
        out.append((what, json.dumps(bundle), cases[name].pem, check))

    def flip_logprob(b: dict[str, Any]) -> None:
        i = next(
            i
            for i, d in enumerate(b["disclosures"])
            if parse_disclosure(d).member == "choices[0].logprobs"
        )
        b["disclosures"][i] = _flip_logprob_bit(b["disclosures"][i])

    def digit_in_v1_logprob(b: dict[str, Any]) -> None:
        choice = b["envelope"]["body"]["choices"][0]
        values = unpack_float32(choice["logprobs"])
        text = repr(values[0])
        digit = text.index(".") + 1  # the first decimal: the float32 surely changes
        values[0] = float(text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1 :])
        choice["logprobs"] = pack_float32(values)

    def alter_proof(b: dict[str, Any]) -> None:
        h = bytearray(base64.b64decode(b["inclusion_proof"]["hashes"][0]))
        h[7] ^= 0x80
        b["inclusion_proof"]["hashes"][0] = base64.b64encode(bytes(h)).decode()

    def add(path: tuple[str, ...], delta: int) -> Callable[[dict[str, Any]], None]:
        def edit(b: dict[str, Any]) -> None:
            parent = b
            for p in path[:-1]:
                parent = parent[p]
            parent[path[-1]] += delta

        return edit

    def put(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
        def edit(b: dict[str, Any]) -> None:
            parent = b
            for p in path[:-1]:
                parent = parent[p]
            parent[path[-1]] = value(parent[path[-1]]) if callable(value) else value

        return edit

    erased = json.loads(cases["erased"].text)
    v1_record = json.loads(cases["v1-record"].text)
    other_signature = json.loads(cases["example-v1"].text)["checkpoint"].split("\n\n")[1]
    forge("disclosed", "a bit of a logprob flipped in a disclosure", "disclosures", flip_logprob)
    forge("example-v1", "a digit of a logprob changed in a v1 envelope", "jcs", digit_in_v1_logprob)
    forge("example", "a digit of a logprob changed in a v3 envelope", "jcs", digit_in_v1_logprob)
    forge("disclosed", "a proof hash altered", "inclusion_proof", alter_proof)
    forge(
        "disclosed",
        "the tree size changed",
        "inclusion_proof",
        add(("inclusion_proof", "tree_size"), 1),
    )
    forge("disclosed", "leaf_index one less", "inclusion_proof", add(("leaf_index",), -1))
    forge("example", "leaf_index one more", "inclusion_proof", add(("leaf_index",), 1))
    forge(
        "disclosed",
        "the checkpoint's signature swapped for one of another tree",
        "checkpoint_signature",
        put(("checkpoint",), lambda note: _resigned_note(note, ledger.log_key)),
    )
    forge(
        "example",
        "the checkpoint's signature line swapped for another log's",
        "checkpoint_signature",
        put(("checkpoint",), lambda note: note.split("\n\n")[0] + "\n\n" + other_signature),
    )
    forge(
        "disclosed",
        "keys.collector.role changed",
        "collector_key",
        put(("keys", "collector", "role"), "replayer"),
    )
    forge(
        "disclosed",
        "keys.collector.name changed",
        "collector_key",
        put(("keys", "collector", "name"), "c2"),
    )
    forge(
        "disclosed",
        "keys.fingerprint_signer.name changed",
        "fingerprint_key",
        put(("keys", "fingerprint_signer", "name"), "x"),
    )
    forge(
        "disclosed",
        "keys.fingerprint_signer swapped for the collector's entry",
        "fingerprint_signature",
        lambda b: b["keys"].__setitem__("fingerprint_signer", b["keys"]["collector"]),
    )
    forge("disclosed", "request_id changed", "request_id", put(("request_id",), lambda r: r + "x"))
    forge(
        "disclosed",
        "a disclosure duplicated",
        "disclosures",
        lambda b: b["disclosures"].append(b["disclosures"][0]),
    )
    forge(
        "disclosed",
        "a disclosure of another record",
        "disclosures",
        lambda b: b["disclosures"].append(json.loads(cases["erasable"].text)["disclosures"][0]),
    )
    forge(
        "disclosed",
        "the fingerprint member swapped for another fingerprint",
        "fingerprint",
        put(("fingerprint",), erased["fingerprint"]),
    )
    forge(
        "disclosed",
        "a replay verdict about another record",
        "replays",
        lambda b: b["replays"].append(v1_record["replays"][0]),
    )
    forge("disclosed", "the replay verdicts reordered", "replays", lambda b: b["replays"].reverse())
    forge(
        "disclosed",
        "an erasure event of another record",
        "erasure",
        put(("erasure",), erased["erasure"]),
    )
    forge(
        "erased",
        "an erased record's bundle given another record's disclosure",
        "disclosures",
        put(("disclosures",), json.loads(cases["disclosed"].text)["disclosures"][:1]),
    )
    forge(
        "disclosed",
        "keys.log.vkey of another origin",
        "checkpoint_signature",
        put(("keys", "log", "vkey"), verifier_key("another/origin", ledger.log_key.public_key)),
    )
    pem = public_key_pem(ledger.log_key.public_key)
    for what, spelled in (
        ("its PEM", pem),
        ("its PEM with a header", pem.replace("KEY-----\n", "KEY-----\nComment: any text\n", 1)),
        ("its PEM with text after it", pem + "words the key does not sign\n"),
        ("its bare base64", base64.b64encode(public_key_raw(ledger.log_key.public_key)).decode()),
    ):
        forge(
            "disclosed",
            f"keys.log.public_key respelled as {what}",
            "format",
            put(("keys", "log", "public_key"), spelled),
        )
    forge("example-v1", "a v1 bundle given a fingerprint", "format", put(("fingerprint",), {}))

    def relabelled(older: str) -> Callable[[dict[str, Any]], None]:
        def edit(b: dict[str, Any]) -> None:
            b["format"] = older
            del b["disclosures"]
            if older.endswith("v1"):
                del b["fingerprint"], b["keys"]["fingerprint_signer"]

        return edit

    for older in ("inference-ledger/evidence/v2", "inference-ledger/evidence/v1"):
        forge("disclosed", f"a v2 record's bundle relabelled {older}", "format", relabelled(older))
    forge(
        "disclosed",
        "the record edited, its leaf_hash recomputed",
        "collector_signature",
        lambda b: relogged(b, b["envelope"]["body"] | {"pool": "p2"}, None),
    )
    forge(
        "disclosed",
        "keys.collector swapped for the fingerprint signer's entry",
        "collector_signature",
        lambda b: b["keys"].__setitem__("collector", b["keys"]["fingerprint_signer"]),
    )
    forge(
        "disclosed",
        "the record re-signed by another registered collector",
        "inclusion_proof",
        lambda b: relogged(b, b["envelope"]["body"] | {"pool": "p2"}, ledger.host),
    )
    forge(
        "disclosed",
        "a hash of the fingerprint's proof altered",
        "fingerprint_inclusion",
        put(("fingerprint", "hashes", 0), lambda h: base64.b64encode(bytes(32)).decode()),
    )
    out.append(
        (
            "a record naming a pool its key's registration does not allow",
            json.dumps(ledger.out_of_scope),
            ledger.pem,
            "collector_key",
        )
    )
    out.append(
        (
            "an erasure event naming a digest neither the record nor its verdicts commit to",
            json.dumps(ledger.overreaching_erasure),
            ledger.pem,
            "erasure",
        )
    )
    for name in ("example", "disclosed"):
        wrong = cases["example-v1"].pem
        out.append(
            (f"{name} under another log's pinned key", cases[name].text, wrong, "log_key_pin")
        )
    return out


def test_each_tampering_fails_at_its_check_in_both(
    verify_page: BrowserPage, ledger: Ledger, cases: dict[str, Case]
) -> None:
    forged = tamper_cases(ledger, cases)
    for what, text, pem, check in forged:
        assert python_check(text, pem) == check, what
    for pem in {pem for _, _, pem, _ in forged}:
        batch = [(what, text, check) for what, text, k, check in forged if k == pem]
        got = js_checks(verify_page, [text for _, text, _ in batch], pem)
        assert [(w, g["failed"]) for (w, _, _), g in zip(batch, got, strict=True)] == [
            (w, check) for w, _, check in batch
        ]
        assert all(g["valid"] is False and g["message"] for g in got)


def test_what_a_bundle_may_leave_out_verifies_in_both(
    verify_page: BrowserPage, cases: dict[str, Case]
) -> None:
    """A disclosure removed is a member redacted; an erasure event removed leaves the erased
    members reported redacted (the bundle then carries none of them: that is true)."""
    disclosed = json.loads(cases["disclosed"].text)
    disclosed["disclosures"].pop()
    erased = json.loads(cases["erased"].text)
    erased.pop("erasure")
    for bundle in (disclosed, erased):
        text = json.dumps(bundle)
        got = verify_page.evaluate("([t, k]) => verifyOne(t, k)", [text, cases["erased"].pem])
        expected = _summary(verify_bundle(load_bundle(text.encode()), None))["content"]
        assert got["valid"]
        content = got["summary"]["content"]
        assert [(i["member"], i["status"]) for i in content["content"]] == [
            (i["member"], i["status"]) for i in expected["content"]
        ]
        assert "redacted" in {i["status"] for i in content["content"]}
        assert "redacted in this bundle" in {i["label"] for i in content["content"]}


# --- the pieces, against their Python originals ------------------------------------------


def _raw_b64(key: SigningKey) -> str:
    return base64.b64encode(public_key_raw(key.public_key)).decode()


def test_pinned_keys_pem_and_verifier_key(verify_page: BrowserPage, ledger: Ledger) -> None:
    key = ledger.log_key.public_key
    origin = default_origin(ledger.log_key)
    vkey = verifier_key(origin, key)
    name, hash_hex, data = vkey.split("+", 2)
    wrong_hash = f"{name}+{int(hash_hex, 16) ^ 1:08x}+{data}"
    renamed = f"another/log+{hash_hex}+{data}"
    plus = next(k for k in iter(SigningKey.generate, None) if "+" in _raw_b64(k))
    texts = {
        "pem": ledger.pem,
        "vkey": vkey,
        "raw": "ed25519:" + base64.b64encode(public_key_raw(key)).decode(),
        "bare": _raw_b64(plus),  # load_public_key reads base64 without its prefix too
        "garbage": "not a key",
        "empty": "  ",
        "bad pem": "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
        "wrong key hash": wrong_hash,
        "renamed": renamed,
        "short vkey": f"{name}+{hash_hex}+" + base64.b64encode(b"\x01" + b"k" * 31).decode(),
        "zero key": "ed25519:" + base64.b64encode(bytes(32)).decode(),
        "private key": ledger.log_key.private_pem().decode(),
    }
    got = verify_page.evaluate(
        """async (texts) => {
          const out = {};
          for (const [name, text] of Object.entries(texts)) {
            try {
              const k = await LedgerVerify.parsePinnedKey(text);
              out[name] = {keyId: k.keyId, raw: Array.from(k.raw), length: k.raw.length};
            } catch (e) { out[name] = {error: e.message}; }
          }
          return out;
        }""",
        texts,
    )
    want = {"keyId": ledger.log_key.key_id, "raw": list(public_key_raw(key)), "length": 32}
    assert got["pem"] == got["vkey"] == got["raw"] == want
    assert got["bare"]["keyId"] == plus.key_id
    refused = {n: r["error"] for n, r in got.items() if "error" in r}
    assert set(refused) == set(texts) - {"pem", "vkey", "raw", "bare"}
    assert "key hash" in refused["wrong key hash"] and "key hash" in refused["renamed"]
    assert "small-order" in refused["zero key"] and "private key" in refused["private key"]


def _b64_corpus() -> list[str]:
    rng = random.Random(8785)
    alphabet = "AQUJDRa0+/=-_ \n\u00e9"
    corpus = ["", "QQ==", "QQ=", "QQ", "QR==", "QUJD=", "QUJD====", "Q===", "=QQ=", "QQ==QQ=="]
    corpus += ["QQ==\n", "QQ=x", "QUJD=QQ==", "QUI==", "QUJDRA==", "QUJDRA=", "QUJDRA", "YQ"]
    corpus += [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 10))) for _ in range(600)
    ]
    return corpus


def test_base64_is_decoded_as_binascii_strict_mode_does(verify_page: BrowserPage) -> None:
    import binascii

    corpus = _b64_corpus()
    expected: list[Any] = []
    for text in corpus:
        try:
            expected.append(list(binascii.a2b_base64(text, strict_mode=True)))
        except (binascii.Error, ValueError):
            expected.append(None)
    got = verify_page.evaluate(
        """(corpus) => corpus.map((t) => {
          try { return Array.from(LedgerVerify._internals.a2b(t)); } catch (e) { return null; }
        })""",
        corpus,
    )
    assert [(t, g) for t, g, e in zip(corpus, got, expected, strict=True) if g != e] == []
    assert 0 < sum(e is None for e in expected) < len(corpus)


JSON_TEXTS = [
    "[1, 1.0, -0, -0.0, 0.0, 2, 2.5e0]",
    "[1e21, 1E21, 1e+21, 1e400, -1e400, 1e-400]",
    "[1e20]",
    "[100000000000000000000]",
    "[9007199254740992.0]",
    "[9007199254740991.0, -9007199254740991.0, 999999999999999900000.0]",
    "[-3.607410259360783e16]",
    "[9007199254740991, 9007199254740992, 9007199254740993, -9007199254740993]",
    "[123456789012345678901234567890, 18446744073709551616]",
    "[0.1, 5e-324, 1e-7, 0.00001, 123456789.125, 9.999e-05, 1.5e300]",
    '["\\u00e9", "\\ud83d\\ude00", "\\ud800", "\\udc00x", "\\u2028\\u007f\\u0000\\u001f"]',
    '{"b": 1, "a": 2, "\\u20ac": 3, "\\ud83d\\ude00": 4, "\\uff61": 5, "A": 6, "": 7}',
    '{"a": {"a": 1, "a": 2}}',
    '{"a": NaN}',
    "[Infinity]",
    "[-Infinity]",
    "[1,]",
    "[01]",
    "[1.]",
    "[.5]",
    "[1e]",
    "[-]",
    '"\x01"',
    '"\\x"',
    "[true, false, null]",
    '  {"x": [ ]}  ',
    "{} x",
    "",
    "[" + "1" * 4301 + "]",
    "[" + "1" * 4300 + "]",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
]


def _python_canonical(text: str) -> str:
    """What load_bundle reads of the text, written canonically, or which of them refused it."""
    try:
        value = load_bundle(text.encode())
    except (LedgerError, ValueError):
        return "refused: not JSON"
    try:
        return canonicalize(value).decode()
    except LedgerError:
        return "refused: no canonical form"


def test_json_is_read_and_canonicalized_as_python_does(verify_page: BrowserPage) -> None:
    """Integers of any size stay integers (refused beyond 2**53), 1.0 is a float written 1,
    1e21 a float written 1e+21, 1e20 a float refused (its digits would read back as an integer
    beyond 2**53), -0 is 0; member names sort by UTF-16 code units."""
    expected = [_python_canonical(t) for t in JSON_TEXTS]
    got = verify_page.evaluate(
        """(texts) => texts.map((t) => {
          let value;
          try { value = LedgerVerify._internals.parseJson(t); }
          catch (e) { return "refused: not JSON"; }
          try { return LedgerVerify.canonicalize(value); }
          catch (e) { return "refused: no canonical form"; }
        })""",
        JSON_TEXTS,
    )
    assert [
        (t[:60], g, e) for t, g, e in zip(JSON_TEXTS, got, expected, strict=True) if g != e
    ] == []
    assert expected[0] == "[1,1,0,0,0,2,2.5]"


def test_canonicalize_of_parsed_values_agrees_or_refuses(verify_page: BrowserPage) -> None:
    """``canonicalize`` on what JSON.parse gives: RFC 8785 text; an integral number beyond 2**53
    (an int Python refuses, or a float it writes: JSON.parse cannot say) is refused loudly."""
    values = {
        "b": [1, "\u00e9\n\x1f", None, True, -0.0, 0.1, 1e-7],
        "a": {"\U0001f600": 2.5, "\uff61": 1},
    }
    got = verify_page.evaluate(
        """(v) => {
          const out = {value: LedgerVerify.canonicalize(v)};
          for (const x of [2 ** 53, 1e21, NaN, Infinity, "\\ud800", undefined, () => 1]) {
            try { LedgerVerify.canonicalize([x]); out[String(x)] = "accepted"; }
            catch (e) { out[String(x)] = "refused"; }
          }
          out.safe = LedgerVerify.canonicalize([2 ** 53 - 1, -(2 ** 53 - 1)]);
          return out;
        }""",
        values,
    )
    assert got.pop("value") == canonicalize(values).decode()
    assert got.pop("safe") == f"[{2**53 - 1},{-(2**53 - 1)}]"
    assert set(got.values()) == {"refused"} and len(got) == 7


def test_a_parsed_object_verifies_but_ambiguous_numbers_fail_loudly(
    verify_page: BrowserPage, cases: dict[str, Case]
) -> None:
    case = cases["disclosed"]
    got = verify_page.evaluate(
        """async ([text, pem]) => {
          const key = await LedgerVerify.parsePinnedKey(pem);
          const plain = await LedgerVerify.verifyBundle(JSON.parse(text), key);
          const big = JSON.parse(text);
          big.envelope.body.usage.prompt_tokens = 2 ** 60;
          const ambiguous = await LedgerVerify.verifyBundle(big, key);
          const bytes = await LedgerVerify.verifyBundle(new TextEncoder().encode(text), key);
          return {plain: plain.valid, bytes: bytes.valid, failed: ambiguous.failed,
                  message: ambiguous.message};
        }""",
        [case.text, case.pem],
    )
    assert got["plain"] is True and got["bytes"] is True
    assert got["failed"] == "format" and "JSON text" in got["message"]


TIMES = [
    "2026-11-29T09:00:00.123456Z",
    "2026-11-29T09:00:00Z",
    "2026-11-29 09:00:00+01:00",
    "20261129T0900Z",
    "2026-W48-7T09:00Z",
    "2026W487T09Z",
    "2026-W53-1T00:00Z",
    "2025-W53-1T00:00Z",
    "2026-11-29T09:00:00.1234567Z",
    "2026-11-29T24:00:00Z",
    "2026-11-29T09:00:00:00Z",
    "2026-11-29",
    "2026-11-29T09:00:00",
    "2026-11-29T09Z",
    "2026-11-29T0900Z",
    "2026-11-29T09:00:00,5Z",
    "2026-11-29T09:00:00.Z",
    "2026-11-29T09:00:00+0100",
    "2026-11-29T09:00:00+01",
    "2026-11-29T09:00:00+1",
    "2026-11-29T09:00:00+01:00:30.5",
    "2026-11-29T09:00:00-00:00",
    "2026-02-29T09:00Z",
    "2028-02-29T09:00Z",
    "2026-13-01T09:00Z",
    "2026-11-29T09:00:00+24:00",
    "2026-11-29T09:00:00+23:99",
    "2026-11-29T09:00:00.12345x7Z",
    "2026-11-29\u00e909:00:00Z",
    "2026-11-29T09:00:00ZZ",
    "2026-11-29T09:00:00+01:00Z",
    "2026-11-29T09:00:0Z",
    "+2026-11-29T09:00Z",
    "2026-11-29T9:00Z",
    "2026-11-2909:00Z",
    "2026-1129T09:00Z",
    "0000-01-01T00:00Z",
    "9999-12-31T23:59:59.999999Z",
    "2026-W48-",
    "short",
    "",
]


def test_timestamps_parse_as_datetime_fromisoformat_does(verify_page: BrowserPage) -> None:
    expected = []
    for text in TIMES:
        try:
            _parse_time(text, "t")
            expected.append(True)
        except LedgerError:
            expected.append(False)
    got = verify_page.evaluate(
        """(times) => times.map((t) => {
          try { LedgerVerify._internals.parseTime(t, "t"); return true; }
          catch (e) { return false; }
        })""",
        TIMES,
    )
    assert [(t, g) for t, g, e in zip(TIMES, got, expected, strict=True) if g != e] == []


def _disclosure_corpus() -> list[Any]:
    salt = _b64url(bytes(range(16)))

    def made(member: str, raw: bytes) -> str:
        return _b64url(b'["' + salt.encode() + b'","' + member.encode() + b'",' + raw + b"]")

    corpus: list[Any] = [
        made("request", raw)
        for raw in (
            b"1",
            b"1.0",
            b"1e+21",
            b"100000000000000000000",
            b"18446744073709551615",
            b"9007199254740993",
            b"-0",
            b'{"b":1,"a":2}',
            b'{"a":1,"b":2}',
            b'{"a":1,"a":1}',
            b'"\\ud800"',
            b'"\xc3\xa9"',
            b'"\\u00e9"',
            b"NaN",
            b"[1,2]",
            b" 1",
            b"null",
        )
    ]
    corpus += [
        made("choices[0].text", b'"x"'),
        made("choices[00].text", b'"x"'),
        made("choices[100000].text", b'"x"'),
        made("request\n", b"1"),
        _b64url(b'["' + _b64url(bytes(15)).encode() + b'","request",1]'),
        _b64url(b'["' + salt.encode() + b'=","request",1]'),
        _b64url(b'["' + salt.encode() + b'","request"]'),
        _b64url(b'\xef\xbb\xbf["' + salt.encode() + b'","request",1]'),
        made("request", b"1") + "=",
        made("request", b"1").replace("-", "+"),
        "",
        7,
        None,
    ]
    return corpus


def test_disclosures_open_as_ledger_disclosures_parse_does(verify_page: BrowserPage) -> None:
    corpus = _disclosure_corpus()
    expected: list[list[str] | None] = []
    for item in corpus:
        try:
            d = parse_disclosure(item)
            expected.append([d.member, canonicalize(d.value).decode()])
        except VerificationError:
            expected.append(None)
    got = verify_page.evaluate(
        """(corpus) => corpus.map((item) => {
          try {
            const d = LedgerVerify._internals.parseDisclosure(item);
            return [d.member, LedgerVerify.canonicalize(d.value)];
          } catch (e) { return null; }
        })""",
        corpus,
    )
    assert [(c, g, e) for c, g, e in zip(corpus, got, expected, strict=True) if g != e] == []
    assert expected.count(None) < len(corpus) - 5


# --- timing ----------------------------------------------------------------------------


def median_verify_ms(page: BrowserPage, case: Case, runs: int = 15) -> dict[str, float]:
    """Median, min and max milliseconds of one verification in the page (performance.now()).
    The first run of a page is the slowest (keys imported, code compiled): it counts too."""
    times: dict[str, float] = page.evaluate(
        "([t, k, n]) => timeVerify(t, k, n)", [case.text, case.pem, runs]
    )
    return times


def test_verification_time_is_measured(
    verify_page: BrowserPage, cases: dict[str, Case], record_property: Any
) -> None:
    """Reported, never asserted (timings depend on the machine): ``-rP`` shows them."""
    for name in ("example", "disclosed"):
        times = median_verify_ms(verify_page, cases[name])
        record_property(f"verify_ms_{name}", times)
        print(f"verify.js, {name}: median {times['median']:.1f} ms ({times})")
        assert times["median"] >= 0


def test_a_lone_surrogate_in_the_checkpoint_fails_its_signature_check(
    verify_page: BrowserPage, cases: dict[str, Case]
) -> None:
    """JSON can escape a lone surrogate into the note: no UTF-8 text holds it, so no signature
    covers it. verify.js says ``checkpoint_signature``; Python's verifier (for now) raises
    UnicodeEncodeError out of ``verify_checkpoint`` instead of a VerificationError."""
    bundle = json.loads(cases["example"].text)
    bundle["checkpoint"] = bundle["checkpoint"].replace("Timestamp", "Time\udc00stamp")
    text = json.dumps(bundle)
    python = python_check(text, cases["example"].pem)
    assert python == "checkpoint_signature" or python.startswith(PYTHON_ENCODE_ERROR)
    (got,) = js_checks(verify_page, [text], cases["example"].pem)
    assert got["failed"] == "checkpoint_signature"


def test_verification_stops_at_the_first_failed_check(
    verify_page: BrowserPage, cases: dict[str, Case]
) -> None:
    """As ``verify_bundle`` raises at the first failed check: the steps before it passed, the
    ones after it are reported not run, and no fact of the bundle is reported."""
    bundle = json.loads(cases["disclosed"].text)
    bundle["request_id"] += "x"
    got = verify_page.evaluate(
        "([t, k]) => verifyOne(t, k)", [json.dumps(bundle), cases["disclosed"].pem]
    )
    assert (got["valid"], got["failed"], got["summary"]) == (False, "request_id", None)
    assert [s["check"] for s in got["steps"]] == list(CHECKS) == got["seen"]
    failed_at = CHECKS.index("request_id")
    assert [(s["status"], s["ok"]) for s in got["steps"]] == (
        [("passed", True)] * failed_at
        + [("failed", False)]
        + [("not_run", None)] * (len(CHECKS) - failed_at - 1)
    )
    assert got["message"] == got["steps"][failed_at]["message"] != ""


_L = 2**252 + 27742317777372353535851937790883648493  # the order of Ed25519's base point


def _identity_r_signature(key: Any, message: bytes) -> bytes:
    """An Ed25519 signature of ``message`` whose R is the identity (a small-order point) and
    S = h·a: it satisfies the verification equation, libsodium refuses it, WebCrypto not."""
    import hashlib

    from cryptography.hazmat.primitives import serialization

    seed = key.private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    a = bytearray(hashlib.sha512(seed).digest()[:32])
    a[0] &= 248
    a[31] = (a[31] & 127) | 64
    r = (1).to_bytes(32, "little")
    public = key.private_key.public_key().public_bytes_raw()
    h = int.from_bytes(hashlib.sha512(r + public + message).digest(), "little") % _L
    return r + (h * int.from_bytes(a, "little") % _L).to_bytes(32, "little")


def test_a_signature_with_a_small_order_r_fails_in_both(
    verify_page: BrowserPage, ledger: Ledger, cases: dict[str, Case]
) -> None:
    """The log key's own signature of the checkpoint, made with R the identity point: the
    equation holds, so WebCrypto accepts it, but libsodium (``ledger verify``) refuses a
    small-order R; verify.js refuses it too, at ``checkpoint_signature``."""
    from ledger.checkpoint import note_key_hash

    bundle = json.loads(cases["disclosed"].text)
    note = bundle["checkpoint"]
    cp, _ = parse_checkpoint(note)
    signed = note.split("\n\n")[0] + "\n"
    sig = _identity_r_signature(ledger.log_key, signed.encode())
    blob = base64.b64encode(note_key_hash(cp.origin, ledger.log_key.public_key) + sig).decode()
    bundle["checkpoint"] = signed + "\n\u2014 " + cp.origin + " " + blob + "\n"
    text = json.dumps(bundle)
    assert python_check(text, ledger.pem) == "checkpoint_signature"
    (got,) = js_checks(verify_page, [text], ledger.pem)
    assert got["failed"] == "checkpoint_signature", got


def test_bundle_bytes_are_read_as_strict_utf8_in_both(
    verify_page: BrowserPage, cases: dict[str, Case]
) -> None:
    """A bundle given as bytes is read as ``ledger verify`` reads a file: UTF-8 with one
    leading BOM skipped verifies in both; UTF-16 (with or without its BOM) and an encoded
    surrogate fail ``format`` in both."""
    case = cases["disclosed"]
    text = json.dumps(json.loads(case.text))
    forms = {
        "utf-8 with a BOM": b"\xef\xbb\xbf" + text.encode(),
        "utf-16": text.encode("utf-16"),
        "utf-16-le": text.encode("utf-16-le"),
        # in the member nothing signs: still not UTF-8 text
        "encoded surrogate": text.encode().replace(
            b'"exported_at": "', b'"exported_at": "\xed\xa0\x80'
        ),
    }
    pinned = load_public_key(case.pem)
    for label, data in forms.items():
        try:
            verify_bundle(load_bundle(data), pinned)
            python = ""
        except VerificationError as exc:
            python = str(exc.details.get("check"))
        got = verify_page.evaluate(
            """async ([bytes, pem]) => {
              const key = await LedgerVerify.parsePinnedKey(pem);
              const r = await LedgerVerify.verifyBundle(Uint8Array.from(bytes), key);
              return {valid: r.valid, failed: r.failed};
            }""",
            [list(data), case.pem],
        )
        expected = "" if label == "utf-8 with a BOM" else "format"
        assert python == expected, (label, python)
        assert (got["failed"] or "") == expected, (label, got)
