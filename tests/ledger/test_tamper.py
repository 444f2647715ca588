"""A superuser who bypasses the append-only triggers: `ledger audit` catches every edit.

Each case builds a small ledger on its own Postgres database, exports an evidence bundle,
then edits the tables as a superuser (session_replication_role = replica, triggers disabled).
The audit must fail naming the first bad leaf; the bundle exported before still verifies; a
bundle exported after a forgery does not.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import pytest

from ledger import merkle
from ledger.canonical import canonicalize
from ledger.errors import LedgerError, VerificationError
from ledger.evidence import verify_bundle
from ledger.signing import SigningKey, public_key_pem, public_key_raw, sign_envelope
from ledger.storage import checkpoints, ingest, keystore, proofs, tree, verdicts
from ledger.storage.audit import audit
from ledger.storage.database import Database
from tests.support.documents import record_body, record_envelope
from tests.support.seed import seed_ledger

pytestmark = pytest.mark.postgres
ORIGIN = "test.example/log"
# No leaf is due a checkpoint within an hour: findings that compare runs, or that expect no
# leaf named, do not depend on how long the test took (leaves a tamper left uncovered are
# tests/ledger/test_audit_tables.py's subject).
NOT_DUE = {"checkpoint_interval": 3600}


@dataclass
class Ledger:
    db: Database
    url: str
    log_key: SigningKey
    collector: SigningKey
    fp: str
    records: list[tuple[str, int]]  # (request_id, log index)

    def sql(self, statements: list[tuple[str, tuple]], tables: tuple[str, ...]) -> None:
        """Run statements as a superuser with the append-only triggers out of the way."""
        with psycopg.connect(self.url) as conn:
            conn.execute("SET session_replication_role = replica")
            for t in tables:
                conn.execute(f"ALTER TABLE {t} DISABLE TRIGGER USER")
            for stmt, params in statements:
                conn.execute(stmt, params)
            for t in tables:
                conn.execute(f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER {t}_append_only")
                conn.execute(f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER {t}_no_truncate")
            conn.commit()

    def envelope(self, idx: int) -> dict:
        with psycopg.connect(self.url) as conn:
            row = conn.execute("SELECT envelope FROM log_entries WHERE idx = %s", (idx,)).fetchone()
        return json.loads(bytes(row[0]))

    def evidence(self, request_id: str) -> dict:
        return proofs.evidence(self.db, self.log_key, ORIGIN, request_id)


@pytest.fixture
def ledger(postgres_databases):
    url = postgres_databases.fresh()
    db = Database(url)
    seeded = seed_ledger(db)
    log_key, collector, fp = seeded.log_key, seeded.collector, seeded.fingerprint_id
    records = []
    for batch in (6, 3):
        envs = [record_envelope(collector, fp).to_dict() for _ in range(batch)]
        records += [(r.request_id, r.log_index) for r in ingest.ingest_records(db, envs)]
        checkpoints.sign_if_new(db, log_key, ORIGIN)
    assert audit(db, log_key.public_key).ok
    yield Ledger(db, url, log_key, collector, fp, records)
    db.dispose()


def change_logprob(lg: Ledger) -> int:
    _, idx = lg.records[2]
    env = lg.envelope(idx)
    lp = bytearray(base64.b64decode(env["body"]["choices"][0]["logprobs"]))
    lp[5] ^= 0x01
    env["body"]["choices"][0]["logprobs"] = base64.b64encode(bytes(lp)).decode()
    data = canonicalize(env)
    lg.sql(
        [
            (
                "UPDATE log_entries SET envelope = %s, leaf_hash = %s WHERE idx = %s",
                (data, merkle.leaf_hash(data), idx),
            )
        ],
        ("log_entries",),
    )
    return idx


def delete_row(lg: Ledger) -> int:
    _, idx = lg.records[3]
    lg.sql(
        [
            ("DELETE FROM records WHERE log_index = %s", (idx,)),
            ("DELETE FROM log_entries WHERE idx = %s", (idx,)),
        ],
        ("records", "log_entries"),
    )
    return idx


def swap_rows(lg: Ledger) -> int:
    (_, a), (_, b) = lg.records[1], lg.records[4]
    with psycopg.connect(lg.url) as conn:
        rows = dict(
            conn.execute(
                "SELECT idx, envelope FROM log_entries WHERE idx IN (%s, %s)", (a, b)
            ).fetchall()
        )
    lg.sql(
        [
            (
                "UPDATE log_entries SET envelope = %s, leaf_hash = %s WHERE idx = %s",
                (bytes(rows[b]), merkle.leaf_hash(bytes(rows[b])), a),
            ),
            (
                "UPDATE log_entries SET envelope = %s, leaf_hash = %s WHERE idx = %s",
                (bytes(rows[a]), merkle.leaf_hash(bytes(rows[a])), b),
            ),
        ],
        ("log_entries",),
    )
    return a


def forge_row(lg: Ledger) -> int:
    """A record signed by a key the log never registered, with a key row to cover it."""
    forger = SigningKey.generate()
    env = sign_envelope("inference_record", record_body(lg.fp, request_id="req-forged"), forger)
    idx = lg.records[-1][1] + 1
    with lg.db.read() as s:
        frontier = tree.node_reader(s)(merkle.append_plan(idx))
    leaf = merkle.leaf_hash(env.canonical)
    nodes = merkle.append_leaves(idx, [leaf], frontier)
    lg.sql(
        [
            (
                "INSERT INTO log_entries VALUES (%s, 'inference_record', %s, %s, now())",
                (idx, leaf, env.canonical),
            ),
            (
                "INSERT INTO signing_keys VALUES (%s, 'forger', 'collector', %s, %s, now())",
                (forger.key_id, public_key_raw(forger.public_key), idx),
            ),
            (
                "INSERT INTO records VALUES ('req-forged', %s, %s, %s, %s, 'test-model', 1,"
                " 'p1', 'w1', '/v1/completions', now())",
                (idx, env.body_digest, lg.fp, forger.key_id),
            ),
        ]
        + [
            ("INSERT INTO merkle_nodes VALUES (%s, %s, %s)", (lv, i, h))
            for (lv, i), h in nodes.items()
        ],
        ("log_entries", "signing_keys", "records", "merkle_nodes"),
    )
    return idx


def older_checkpoint(lg: Ledger) -> int | None:
    with psycopg.connect(lg.url) as conn:
        (old_note, old_root), (_, _) = conn.execute(
            "SELECT note, root_hash FROM checkpoints ORDER BY tree_size"
        ).fetchall()[-2:]
        latest = conn.execute("SELECT max(tree_size) FROM checkpoints").fetchone()[0]
    lg.sql(
        [
            (
                "UPDATE checkpoints SET note = %s, root_hash = %s WHERE tree_size = %s",
                (old_note, bytes(old_root), latest),
            )
        ],
        ("checkpoints",),
    )
    return None  # no leaf is bad: the finding names the checkpoint


def substitute_key(lg: Ledger) -> int:
    attacker = SigningKey.generate()
    lg.sql(
        [
            (
                "UPDATE signing_keys SET public_key = %s WHERE key_id = %s",
                (public_key_raw(attacker.public_key), lg.collector.key_id),
            )
        ],
        ("signing_keys",),
    )
    return 1  # the collector key's registration leaf


CASES: dict[str, tuple[Callable[[Ledger], int | None], str, bool]] = {
    # name: (tamper, the check that must fire, whether it is a forgery bundles must expose)
    "changed_logprob_byte": (change_logprob, "signature", True),
    "deleted_row": (delete_row, "sequence", False),
    "swapped_rows": (swap_rows, "index", True),
    "forged_row_unregistered_key": (forge_row, "signature", True),
    "older_checkpoint": (older_checkpoint, "checkpoint", True),
    # a bundle takes the key from its registration leaf, not the row: still the honest bundle
    "substituted_public_key": (substitute_key, "index", False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_audit_detects_and_bundles_tell(ledger: Ledger, case: str):
    tamper, check, forgery = CASES[case]
    victim = ledger.records[2][0] if case != "swapped_rows" else ledger.records[1][0]
    before = ledger.evidence(victim)
    verify_bundle(before, ledger.log_key.public_key)

    bad_index = tamper(ledger)

    report = audit(ledger.db, ledger.log_key.public_key, **NOT_DUE)
    assert not report.ok
    assert check in {f.check for f in report.findings}, [f.to_dict() for f in report.findings]
    assert report.first_bad_index == bad_index, [f.to_dict() for f in report.findings]

    verify_bundle(before, ledger.log_key.public_key)  # evidence taken earlier still holds
    if case == "substituted_public_key":
        assert ledger.evidence(victim)["keys"] == before["keys"]
    if forgery:
        target = "req-forged" if case == "forged_row_unregistered_key" else victim
        with pytest.raises((VerificationError, LedgerError)):
            verify_bundle(ledger.evidence(target), ledger.log_key.public_key)


def test_audit_cli_names_the_first_bad_leaf(ledger: Ledger):
    idx = change_logprob(ledger)
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "audit", "--db", ledger.url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is False and out["first_bad_index"] == idx
    text = subprocess.run(
        [sys.executable, "-m", "cli", "audit", "--db", ledger.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert text.returncode == 1 and f"first bad leaf index: {idx}" in text.stdout


def delete_tail(lg: Ledger) -> int:
    """Remove the newest record with its nodes and the checkpoint that covered it."""
    _, idx = lg.records[-1]
    with psycopg.connect(lg.url) as conn:
        latest = conn.execute("SELECT max(tree_size) FROM checkpoints").fetchone()[0]
    assert latest == idx + 1
    nodes = list(merkle.append_leaves(idx, [b"\0" * 32], frontier_of(lg, idx)))
    lg.sql(
        [
            ("DELETE FROM cache_keys WHERE log_index = %s", (idx,)),
            ("DELETE FROM records WHERE log_index = %s", (idx,)),
            ("DELETE FROM log_entries WHERE idx = %s", (idx,)),
            ("DELETE FROM checkpoints WHERE tree_size = %s", (latest,)),
        ]
        + [("DELETE FROM merkle_nodes WHERE level = %s AND idx = %s", n) for n in nodes],
        ("cache_keys", "records", "log_entries", "checkpoints", "merkle_nodes"),
    )
    return idx


def test_a_deleted_tail_is_caught_by_a_checkpoint_seen_before(ledger: Ledger, tmp_path):
    kept = ledger.evidence(ledger.records[-1][0])  # what an auditor kept from earlier
    idx = delete_tail(ledger)
    # Within the checkpoint interval, indistinguishable from a log that never had the leaf
    # (the leaves before it are not yet due a checkpoint) ...
    alone = audit(ledger.db, ledger.log_key.public_key, **NOT_DUE)
    assert alone.ok, [f.to_dict() for f in alone.findings]
    # ... and once it has passed, the leaves the deleted checkpoint covered are uncovered.
    late = audit(ledger.db, ledger.log_key.public_key, checkpoint_interval=0, clock_tolerance=0)
    assert [(f.check, f.index) for f in late.findings] == [("coverage", idx - 2)]
    report = audit(
        ledger.db, ledger.log_key.public_key, trusted_checkpoints=[kept["checkpoint"]], **NOT_DUE
    )
    assert not report.ok and report.first_bad_index == idx
    assert report.findings[0].check == "trusted_checkpoint"
    bundle = tmp_path / "kept.json"
    bundle.write_text(json.dumps(kept))
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "audit", "--db", ledger.url, "--checkpoint", str(bundle)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "were removed" in proc.stdout


def test_a_changed_inner_node_is_caught(ledger: Ledger):
    ledger.sql(
        [("UPDATE merkle_nodes SET hash = %s WHERE level = 1 AND idx = 0", (b"\0" * 32,))],
        ("merkle_nodes",),
    )
    report = audit(ledger.db, ledger.log_key.public_key)
    assert [f.check for f in report.findings][:1] == ["tree"]
    assert report.first_bad_index == 0


def test_node_hashes_with_shifted_boundaries_are_caught(ledger: Ledger):
    """Two neighbouring stored nodes rewritten as 31 and 33 bytes with the same 64 bytes in
    all: the level's concatenation is unchanged, each node is wrong."""
    with psycopg.connect(ledger.url) as conn:
        a, b = (
            bytes(
                conn.execute(
                    "SELECT hash FROM merkle_nodes WHERE level = 0 AND idx = %s", (i,)
                ).fetchone()[0]
            )
            for i in (4, 5)
        )
    joined = a + b
    ledger.sql(
        [
            ("UPDATE merkle_nodes SET hash = %s WHERE level = 0 AND idx = 4", (joined[:31],)),
            ("UPDATE merkle_nodes SET hash = %s WHERE level = 0 AND idx = 5", (joined[31:],)),
        ],
        ("merkle_nodes",),
    )
    report = audit(ledger.db, ledger.log_key.public_key, signatures=False)
    assert [(f.check, f.index) for f in report.findings] == [("tree", 4), ("tree", 5)]


def test_a_malformed_key_row_is_a_finding_not_a_crash(ledger: Ledger):
    ledger.sql(
        [
            (
                "UPDATE signing_keys SET public_key = %s WHERE key_id = %s",
                (b"\1" * 31, ledger.collector.key_id),
            )
        ],
        ("signing_keys",),
    )
    report = audit(ledger.db, ledger.log_key.public_key)
    assert not report.ok and {f.check for f in report.findings} == {"index"}


def frontier_of(lg: Ledger, size: int) -> dict:
    with lg.db.read() as s:
        return tree.node_reader(s)(merkle.append_plan(size))


@pytest.mark.parametrize(
    "case", ["changed_logprob_byte", "forged_row_unregistered_key", "swapped_rows"]
)
def test_parallel_audit_finds_the_same(ledger: Ledger, case: str, monkeypatch):
    monkeypatch.setattr("ledger.storage.audit.PARALLEL_FROM", 0)
    CASES[case][0](ledger)
    one = audit(ledger.db, ledger.log_key.public_key, **NOT_DUE)
    two = audit(ledger.db, ledger.log_key.public_key, workers=2, **NOT_DUE)
    assert not one.ok
    assert [f.to_dict() for f in one.findings] == [f.to_dict() for f in two.findings]


def test_parallel_audit_of_an_honest_ledger_with_a_revocation(ledger: Ledger, monkeypatch):
    monkeypatch.setattr("ledger.storage.audit.PARALLEL_FROM", 0)
    keystore.revoke_key(ledger.db, ledger.log_key, ledger.collector.key_id, "rotated")
    later = SigningKey.generate()
    keystore.register_key(
        ledger.db,
        ledger.log_key,
        name="c2",
        role="collector",
        public_key=public_key_pem(later.public_key),
    )
    ingest.ingest_records(ledger.db, [record_envelope(later, ledger.fp).to_dict()])
    report = audit(ledger.db, ledger.log_key.public_key, workers=2)
    assert report.ok, [f.to_dict() for f in report.findings]


def test_a_rewritten_replay_verdict_row_is_caught(ledger: Ledger):
    request_id, _ = ledger.records[0]
    stored = verdicts.append_verdict(
        ledger.db,
        ledger.log_key,
        {
            "replay_id": "rpl-tamper",
            "request_id": request_id,
            "verdict": "diverged",
            "pool": "p",
            "worker_id": "w",
        },
    )
    checkpoints.sign_if_new(ledger.db, ledger.log_key, ORIGIN)
    assert audit(ledger.db, ledger.log_key.public_key).ok
    ledger.sql(
        [("UPDATE replays SET verdict = 'bitwise' WHERE replay_id = 'rpl-tamper'", ())],
        ("replays",),
    )
    report = audit(ledger.db, ledger.log_key.public_key)
    assert not report.ok
    finding = report.findings[0]
    assert finding.check == "index" and "replays" in finding.message
    assert finding.index == stored.log_index


@pytest.mark.parametrize("case", list(CASES))
def test_a_chunked_audit_finds_the_same(ledger: Ledger, case: str, monkeypatch):
    """Chunk edges inside and between checkpoints, out-of-sequence chunks after a deleted
    row, nodes read ahead for chunks that are not where they were expected: the findings
    are those of the audit that reads the whole log as one chunk."""
    CASES[case][0](ledger)
    key = ledger.log_key.public_key
    whole = audit(ledger.db, key, **NOT_DUE)
    for chunk in (1, 2, 4, 5):
        monkeypatch.setattr("ledger.storage.audit.CHUNK", chunk)
        chunked = audit(ledger.db, key, **NOT_DUE)
        assert [f.to_dict() for f in chunked.findings] == [f.to_dict() for f in whole.findings]
        structure = audit(ledger.db, key, signatures=False, **NOT_DUE)
        monkeypatch.setattr("ledger.storage.audit.CHUNK", 2000)
        assert [f.to_dict() for f in structure.findings] == [
            f.to_dict() for f in audit(ledger.db, key, signatures=False, **NOT_DUE).findings
        ]


@pytest.mark.parametrize(
    "stored",
    [
        b'{"body":' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b',"kind":"inference_record"}',
        b'{"body":{"tier":123456789012345678901234567890},"kind":"inference_record",'
        b'"signature":{"alg":"ed25519","key_id":"x","sig":"y"}}',
    ],
    ids=["nested-5000-deep", "integer-beyond-64-bits"],
)
def test_an_envelope_no_parser_should_accept_is_a_finding_not_a_crash(ledger: Ledger, stored):
    """A superuser's envelope nested deeper than any JSON parser goes, or holding an integer
    that orjson reads as a float: the audit names the leaf (with a matching leaf hash, only
    its envelope check can), in one process and in workers."""
    _, idx = ledger.records[1]
    ledger.sql(
        [
            (
                "UPDATE log_entries SET envelope = %s, leaf_hash = %s WHERE idx = %s",
                (stored, merkle.leaf_hash(stored), idx),
            )
        ],
        ("log_entries",),
    )
    report = audit(ledger.db, ledger.log_key.public_key)
    assert not report.ok
    assert ("canonical", idx) in {(f.check, f.index) for f in report.findings}


@pytest.mark.parametrize(
    ("statements", "table", "says"),
    [
        (  # hides one logged record from every role but a superuser: no row is edited
            [
                "ALTER TABLE records ENABLE ROW LEVEL SECURITY",
                "CREATE POLICY hide ON records USING (request_id <> 'nobody')",
            ],
            "records",
            "row-level security",
        ),
        (
            ["ALTER TABLE log_entries DISABLE TRIGGER log_entries_append_only"],
            "log_entries",
            "ALWAYS",
        ),
        (["DROP TRIGGER checkpoints_no_truncate ON checkpoints"], "checkpoints", "missing"),
        (
            [  # the guard turned off without DISABLE TRIGGER: the function lets UPDATE through
                "CREATE OR REPLACE FUNCTION ledger_refuse_mutation() RETURNS trigger "
                "LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END; $$"
            ],
            "log_entries",
            "not the ledger's",
        ),
        (
            [  # the same, through a look-alike in another schema
                "CREATE SCHEMA evil",
                "CREATE FUNCTION evil.ledger_refuse_mutation() RETURNS trigger "
                "LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END; $$",
                "DROP TRIGGER records_append_only ON records",
                "CREATE TRIGGER records_append_only BEFORE UPDATE OR DELETE ON records "
                "FOR EACH ROW EXECUTE FUNCTION evil.ledger_refuse_mutation()",
                "ALTER TABLE records ENABLE ALWAYS TRIGGER records_append_only",
            ],
            "records",
            "not the ledger's",
        ),
        (
            [  # the real function, under a condition that never holds
                "DROP TRIGGER records_append_only ON records",
                "CREATE TRIGGER records_append_only BEFORE UPDATE OR DELETE ON records "
                "FOR EACH ROW WHEN (false) EXECUTE FUNCTION ledger_refuse_mutation()",
                "ALTER TABLE records ENABLE ALWAYS TRIGGER records_append_only",
            ],
            "records",
            "condition",
        ),
        (
            ["CREATE RULE quiet AS ON INSERT TO replays DO INSTEAD NOTHING"],
            "replays",
            "rules rewrite",
        ),
    ],
)
def test_a_database_that_no_longer_enforces_what_the_ledger_installed_fails_the_audit(
    ledger: Ledger, statements: list[str], table: str | None, says: str
):
    """A superuser can change what the ledger's role reads, or turn its guards off, without
    editing a row (so no row check sees it): the audit reads the catalog and names it."""
    with psycopg.connect(ledger.url) as conn:
        for stmt in statements:
            conn.execute(stmt)
        conn.commit()
    report = audit(ledger.db, ledger.log_key.public_key, **NOT_DUE)
    assert not report.ok
    assert all(f.check == "database" for f in report.findings), report.findings
    assert any(f.table == table and says in f.message for f in report.findings), report.findings
