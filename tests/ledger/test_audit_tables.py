"""A superuser edits what routes serve and filter on: `ledger audit` names the leaf and column.

Every case edits one ledger table of a small ledger that has a row in each (tests/support/
audited_ledger.py) the way a database superuser can (triggers and foreign keys out of the
way, tests/support/superuser.py), on SQLite and Postgres, and the audit must fail with a
finding that names the leaf the edited row belongs to and the table and column edited. The
last cases check the readers: an edited field is never served (it is read from the leaf or
the signed note), and a row pointing elsewhere is an index mismatch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from api.metrics import LogGauges
from ledger.audit import AuditReport
from ledger.errors import IndexMismatch, VerificationError
from ledger.evidence import verify_bundle
from ledger.heartbeat import HEARTBEAT_KIND
from ledger.records import RECORD_KIND
from ledger.replay import OUTPUT_KIND
from ledger.signing import sign_envelope
from ledger.storage import checkpoints, ingest, keystore, log, proofs, verdicts
from ledger.storage.audit import audit
from ledger.storage.database import Database, utcnow
from tests.conftest import BACKENDS, fresh_url
from tests.support.audited_ledger import ORIGIN, Built, build
from tests.support.documents import record_envelope
from tests.support.superuser import Superuser


@dataclass
class Tampered:
    db: Database
    url: str
    built: Built
    su: Superuser

    def audit(self, **kw: Any) -> AuditReport:
        return audit(self.db, self.built.log_key.public_key, **kw)

    def leaf(self, request_id: str) -> int:
        return self.built.records[request_id]

    def value(self, table: str, column: str, where: str, params: tuple[Any, ...]) -> Any:
        rows = self.su.query(f"SELECT {column} FROM {table} WHERE {where}", params)
        assert len(rows) == 1, rows
        return rows[0][0]

    def update(self, table: str, column: str, value: Any, where: str, *params: Any) -> None:
        self.su.execute(
            [(f"UPDATE {table} SET {column} = %s WHERE {where}", (value, *params))], [table]
        )

    def shifted(self, table: str, column: str, delta: timedelta, where: str, *params: Any) -> Any:
        at = self.su.read_time(self.value(table, column, where, params))
        return self.su.time(at + delta)


@pytest.fixture(scope="module", params=BACKENDS)
def template(request: pytest.FixtureRequest) -> tuple[str, Built]:
    url = fresh_url(request, request.param)
    db = Database(url)
    built = build(db)
    report = audit(db, built.log_key.public_key, checkpoint_interval=0, clock_tolerance=0)
    assert report.ok, [f.to_dict() for f in report.findings]
    db.dispose()
    return url, built


@pytest.fixture
def ledger(template, request, tmp_path) -> Iterator[Tampered]:
    url, built = template
    if url.startswith("postgresql"):
        pg = request.getfixturevalue("postgres_databases")
        clone = pg.create(template=url.rpartition("/")[2])
    else:
        path = tmp_path / "clone.db"
        shutil.copyfile(url.removeprefix("sqlite:///"), path)
        clone = f"sqlite:///{path}"
    db = Database(clone)
    yield Tampered(db, clone, built, Superuser(clone))
    db.dispose()


def named(report: AuditReport, index: int | None, table: str, column: str | None) -> bool:
    return any(
        (f.index, f.table) == (index, table) and (column is None or f.column == column)
        for f in report.findings
    )


def dump(report: AuditReport) -> list[dict[str, Any]]:
    return [f.to_dict() for f in report.findings]


def test_the_untouched_ledger_passes_every_way(ledger: Tampered, monkeypatch):
    assert ledger.audit().ok
    assert ledger.audit(signatures=False).ok
    monkeypatch.setattr("ledger.storage.audit.PARALLEL_FROM", 0)
    assert ledger.audit(workers=2).ok


CLI = (sys.executable, "-m", "cli", "audit")
SECOND = timedelta(seconds=1)
MICRO = timedelta(microseconds=1)
RECORD_EDITS: dict[str, tuple[str, Any, str]] = {
    # column: (record, new value, the column the finding names)
    "model": ("req-text", "forged-model", "model"),
    "tier": ("req-text", 2, "tier"),
    "pool": ("req-text", "p9", "pool"),
    "worker_id": ("req-text", "w9", "worker_id"),
    "endpoint": ("req-text", "/v1/chat/completions", "endpoint"),
    "content_hash": ("req-text", "sha256:" + "0" * 64, "content_hash"),
    "request_id": ("req-text", "req-renamed", "request_id"),
}


@pytest.mark.parametrize("column", [*RECORD_EDITS, "fingerprint_id", "key_id", "received_at"])
def test_an_edited_records_column_is_named(ledger: Tampered, column: str):
    b = ledger.built
    if column in RECORD_EDITS:
        request_id, value, _ = RECORD_EDITS[column]
    elif column == "fingerprint_id":
        request_id, value = "req-plain", b.chat_fingerprint_id
    elif column == "key_id":
        request_id, value = "req-plain", b.log_key.key_id
    else:
        request_id = "req-plain"
        value = ledger.shifted("records", column, MICRO, "request_id = %s", request_id)
    ledger.update("records", column, value, "request_id = %s", request_id)
    report = ledger.audit()
    assert not report.ok
    assert named(report, ledger.leaf(request_id), "records", column), dump(report)


def test_a_records_row_moved_to_another_leaf_is_named_at_both(ledger: Tampered):
    leaf = ledger.leaf("req-plain")
    ledger.update("records", "log_index", 2, "request_id = %s", "req-plain")  # a fingerprint
    report = ledger.audit()
    assert named(report, leaf, "records", None), dump(report)  # no row for the record
    assert named(report, 2, "records", "log_index"), dump(report)  # a row at a non-record


def test_a_cache_key_repointed_at_another_record_is_misdirected(ledger: Tampered):
    ledger.update("cache_keys", "request_id", "req-plain", "request_id = %s", "req-greedy")
    report = ledger.audit()
    assert named(report, ledger.leaf("req-greedy"), "cache_keys", "request_id"), dump(report)


def test_a_cache_key_moved_with_its_log_index_is_missing_and_extra(ledger: Tampered):
    plain = ledger.leaf("req-plain")
    ledger.su.execute(
        [
            (
                "UPDATE cache_keys SET request_id = 'req-plain', log_index = %s "
                "WHERE request_id = 'req-chat'",
                (plain,),
            )
        ],
        ["cache_keys"],
    )
    report = ledger.audit()
    assert named(report, ledger.leaf("req-chat"), "cache_keys", "cache_key"), dump(report)
    assert named(report, plain, "cache_keys", "cache_key"), dump(report)


def test_a_deleted_cache_key_is_missing(ledger: Tampered):
    (key,) = ledger.su.query(
        "SELECT cache_key FROM cache_keys WHERE request_id = 'req-text' ORDER BY cache_key LIMIT 1"
    )[0]
    ledger.su.execute([("DELETE FROM cache_keys WHERE cache_key = %s", (key,))], ["cache_keys"])
    report = ledger.audit()
    assert named(report, ledger.leaf("req-text"), "cache_keys", "cache_key"), dump(report)
    assert key in " ".join(f.message for f in report.findings)


def test_an_added_cache_key_is_extra(ledger: Tampered):
    leaf = ledger.leaf("req-greedy")
    ledger.su.execute(
        [
            (
                "INSERT INTO cache_keys VALUES (%s, 'req-greedy', %s, 2, %s)",
                ("ck1:sha256:" + "ab" * 32, leaf, True),
            )
        ],
        ["cache_keys"],
    )
    report = ledger.audit()
    assert named(report, leaf, "cache_keys", "cache_key"), dump(report)


@pytest.mark.parametrize("column,value", [("tier", 0), ("deterministic", False)])
def test_an_edited_cache_key_column_is_named(ledger: Tampered, column: str, value: Any):
    ledger.update("cache_keys", column, value, "request_id = %s", "req-greedy")
    report = ledger.audit()
    assert named(report, ledger.leaf("req-greedy"), "cache_keys", column), dump(report)


def test_an_edited_log_entry_kind_is_named(ledger: Tampered):
    leaf = ledger.leaf("req-text")
    ledger.update("log_entries", "kind", "fingerprint", "idx = %s", leaf)
    report = ledger.audit()
    assert named(report, leaf, "log_entries", "kind"), dump(report)


@pytest.mark.parametrize("direction", ["before", "after"])
def test_a_receive_time_moved_outside_its_checkpoints_is_named(ledger: Tampered, direction):
    """The receive time and the records row agree (a careful forger): only the signed times
    of the checkpoints around the leaf tell."""
    leaf = ledger.leaf("req-plain")  # between the first and second checkpoints
    delta = -timedelta(days=1) if direction == "before" else timedelta(hours=1)
    moved = ledger.shifted("log_entries", "appended_at", delta, "idx = %s", leaf)
    ledger.update("log_entries", "appended_at", moved, "idx = %s", leaf)
    ledger.update("records", "received_at", moved, "request_id = %s", "req-plain")
    report = ledger.audit()
    assert [(f.check, f.index, f.table, f.column) for f in report.findings] == [
        ("time", leaf, "log_entries", "appended_at")
    ], dump(report)
    assert direction in report.findings[0].message


def test_a_receive_time_moved_by_a_microsecond_disagrees_with_its_row(ledger: Tampered):
    leaf = ledger.leaf("req-plain")
    moved = ledger.shifted("log_entries", "appended_at", MICRO, "idx = %s", leaf)
    ledger.update("log_entries", "appended_at", moved, "idx = %s", leaf)
    report = ledger.audit()
    assert named(report, leaf, "records", "received_at"), dump(report)


def test_a_key_event_time_disagrees_with_its_signed_body(ledger: Tampered):
    moved = ledger.shifted("log_entries", "appended_at", MICRO, "idx = %s", 1)
    ledger.update("log_entries", "appended_at", moved, "idx = %s", 1)
    report = ledger.audit()
    assert named(report, 1, "log_entries", "appended_at"), dump(report)


def test_a_log_with_every_checkpoint_deleted_fails_and_names_the_leaves(ledger: Tampered):
    size = ledger.su.query("SELECT count(*) FROM log_entries")[0][0]
    ledger.su.execute([("DELETE FROM checkpoints", ())], ["checkpoints"])
    # Once the checkpoint interval has passed (here: at once) every leaf is uncovered.
    report = ledger.audit(checkpoint_interval=0, clock_tolerance=0)
    assert report.checkpoints == 0
    assert [(f.check, f.index, f.table) for f in report.findings] == [
        ("coverage", 0, "checkpoints")
    ], dump(report)
    assert f"leaves 0..{size - 1} are covered by no checkpoint" in report.findings[0].message
    proc = subprocess.run(
        [
            *CLI,
            "--db",
            ledger.url,
            "--json",
            "--checkpoint-interval",
            "0",
            "--clock-tolerance",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is False and out["first_bad_index"] == 0
    assert out["findings"][0]["check"] == "coverage"


def test_the_newest_checkpoint_deleted_uncovers_only_its_leaves(ledger: Tampered):
    sizes = [r[0] for r in ledger.su.query("SELECT tree_size FROM checkpoints ORDER BY 1")]
    ledger.su.execute(
        [("DELETE FROM checkpoints WHERE tree_size = %s", (sizes[-1],))], ["checkpoints"]
    )
    report = ledger.audit(checkpoint_interval=0, clock_tolerance=0)
    assert [(f.check, f.index) for f in report.findings] == [("coverage", sizes[-2])]


@pytest.mark.parametrize("which", ["first", "middle"])
def test_a_deleted_checkpoint_is_named_by_the_next_one(ledger: Tampered, which: str):
    """Deleting a checkpoint widens the time bounds of the leaves around it (a receive time
    moved within the wider bounds passes the time check): the next note names it."""
    sizes = [r[0] for r in ledger.su.query("SELECT tree_size FROM checkpoints ORDER BY 1")]
    assert len(sizes) >= 3
    gone = sizes[0] if which == "first" else sizes[1]
    ledger.su.execute([("DELETE FROM checkpoints WHERE tree_size = %s", (gone,))], ["checkpoints"])
    report = ledger.audit()
    assert [(f.check, f.index, f.table) for f in report.findings] == [
        ("checkpoint", gone - 1, "checkpoints")
    ], dump(report)
    assert f"names the checkpoint of size {gone}" in report.findings[0].message
    assert "no longer holds it" in report.findings[0].message


def _log_one_and_sign(ledger: Tampered, request_id: str) -> checkpoints.StoredCheckpoint:
    built = ledger.built
    envelope = record_envelope(built.collector, built.fingerprint_id, request_id=request_id)
    ingest.ingest_records(ledger.db, [envelope.to_dict()])
    signed = checkpoints.sign_if_new(ledger.db, built.log_key, ORIGIN)
    assert signed is not None
    return signed


def test_a_checkpoint_row_deleted_while_the_ledger_runs_is_named_by_its_next_note(
    ledger: Tampered,
):
    """The process that signed the deleted one chains the next note to it, not to the latest
    row left."""
    first = checkpoints.sign_if_new(ledger.db, ledger.built.log_key, ORIGIN)
    assert first is not None
    signed = _log_one_and_sign(ledger, "r-a")
    assert signed.tree_size > first.tree_size
    ledger.su.execute(
        [("DELETE FROM checkpoints WHERE tree_size = %s", (signed.tree_size,))], ["checkpoints"]
    )
    latest = _log_one_and_sign(ledger, "r-b")
    assert f"Previous: {signed.tree_size}\n" in latest.note
    report = ledger.audit()
    assert [(f.check, f.index) for f in report.findings] == [
        ("checkpoint", signed.tree_size - 1)
    ], dump(report)


def test_two_signers_that_finish_out_of_order_leave_the_newer_in_memory(ledger: Tampered):
    """Two threads of one process sign one after the other (the append lock orders them) but
    note what they signed after their commits, in either order: the memory keeps the newer,
    so a deletion of the newest row is still named by the next note."""
    older = _log_one_and_sign(ledger, "r-d")
    newer = _log_one_and_sign(ledger, "r-e")
    checkpoints._remember(ledger.db, older)  # the first signer gets there last
    ledger.su.execute(
        [("DELETE FROM checkpoints WHERE tree_size = %s", (newer.tree_size,))], ["checkpoints"]
    )
    latest = _log_one_and_sign(ledger, "r-f")
    assert f"Previous: {newer.tree_size}\n" in latest.note


def test_a_deleted_row_of_a_tree_that_did_not_grow_is_put_back_as_signed(ledger: Tampered):
    """Never a second note for the same tree (one naming itself as its previous one)."""
    signed = _log_one_and_sign(ledger, "r-c")
    ledger.su.execute(
        [("DELETE FROM checkpoints WHERE tree_size = %s", (signed.tree_size,))], ["checkpoints"]
    )
    again = checkpoints.sign_if_new(ledger.db, ledger.built.log_key, ORIGIN)
    assert again == signed
    assert ledger.audit().ok


@pytest.mark.parametrize("kind", [HEARTBEAT_KIND, OUTPUT_KIND])
def test_a_leaf_of_a_kind_the_ledger_never_logs_is_named(ledger: Tampered, kind: str):
    """A collector signs heartbeats and replay outputs; a superuser who appends one to the log
    gets it covered by the ledger's next signed checkpoint. The audit names it."""
    env = sign_envelope(kind, {"schema_version": 1, "worker_id": "w1"}, ledger.built.collector)
    with ledger.db.write() as s:
        (idx,) = log.append(s, [env], utcnow())
    signed = checkpoints.sign_if_new(ledger.db, ledger.built.log_key, ORIGIN)
    assert signed is not None and signed.tree_size == idx + 1
    report = ledger.audit()
    assert [(f.check, f.index, f.table) for f in report.findings] == [
        ("canonical", idx, "log_entries")
    ], dump(report)
    assert f"a {kind} is never a leaf of this log" in report.findings[0].message


def test_an_edited_checkpoint_time_disagrees_with_its_signed_note(ledger: Tampered):
    size = ledger.su.query("SELECT max(tree_size) FROM checkpoints")[0][0]
    moved = ledger.shifted("checkpoints", "signed_at", SECOND, "tree_size = %s", size)
    ledger.update("checkpoints", "signed_at", moved, "tree_size = %s", size)
    report = ledger.audit()
    assert named(report, None, "checkpoints", "signed_at"), dump(report)


Pick = Callable[[Built], Any]
INDEX_EDITS: dict[str, tuple[str, str, Any, str, Pick, Pick]] = {
    # name: (table, column, new value, WHERE, its parameter, the leaf named)
    "replays.verdict": (
        "replays", "verdict", "diverged", "replay_id = %s", lambda b: b.replay_id,
        lambda b: b.replay_leaf,
    ),
    "replays.request_id": (
        "replays", "request_id", "req-plain", "replay_id = %s", lambda b: b.replay_id,
        lambda b: b.replay_leaf,
    ),
    "replays.pool": (
        "replays", "pool", "p9", "replay_id = %s", lambda b: b.replay_id, lambda b: b.replay_leaf,
    ),
    "replays.worker_id": (
        "replays", "worker_id", "w9", "replay_id = %s", lambda b: b.replay_id,
        lambda b: b.replay_leaf,
    ),
    "certificates.invariant": (
        "certificates", "invariant", False, "certificate_id = %s", lambda b: b.certificate_id,
        lambda b: b.certificate_leaf,
    ),
    "certificates.pool": (
        "certificates", "pool", "p9", "certificate_id = %s", lambda b: b.certificate_id,
        lambda b: b.certificate_leaf,
    ),
    "certificates.fingerprint_id": (
        "certificates", "fingerprint_id", "sha256:" + "1" * 64, "certificate_id = %s",
        lambda b: b.certificate_id, lambda b: b.certificate_leaf,
    ),
    "fingerprints.key_id": (
        "fingerprints", "key_id", "ed25519:" + "2" * 64, "log_index = %s", lambda b: 2,
        lambda b: 2,
    ),
    "fingerprints.fingerprint_id": (
        "fingerprints", "fingerprint_id", "sha256:" + "3" * 64, "log_index = %s", lambda b: 2,
        lambda b: 2,
    ),
    "signing_keys.name": (
        "signing_keys", "name", "someone-else", "log_index = %s", lambda b: 1, lambda b: 1,
    ),
    "signing_keys.role": (
        "signing_keys", "role", "replayer", "log_index = %s", lambda b: 1, lambda b: 1,
    ),
    "key_revocations.reason": (
        "key_revocations", "reason", "never", "key_id = %s", lambda b: b.revoked_key_id,
        lambda b: b.revocation_leaf,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(INDEX_EDITS))
def test_an_edited_index_column_is_named(ledger: Tampered, case: str):
    table, column, value, where, param, leaf = INDEX_EDITS[case]
    b = ledger.built
    ledger.update(table, column, value, where, param(b))
    report = ledger.audit()
    assert not report.ok
    assert named(report, leaf(b), table, column), dump(report)


@pytest.mark.parametrize(
    "table,column,where,param,leaf",
    [
        ("replays", "created_at", "replay_id = %s", lambda b: b.replay_id, lambda b: b.replay_leaf),
        (
            "certificates", "created_at", "certificate_id = %s", lambda b: b.certificate_id,
            lambda b: b.certificate_leaf,
        ),
        ("fingerprints", "registered_at", "log_index = %s", lambda b: 2, lambda b: 2),
        ("signing_keys", "registered_at", "log_index = %s", lambda b: 1, lambda b: 1),
        (
            "key_revocations", "revoked_at", "key_id = %s", lambda b: b.revoked_key_id,
            lambda b: b.revocation_leaf,
        ),
    ],
)  # fmt: skip
def test_an_edited_index_time_is_named(ledger: Tampered, table, column, where, param, leaf):
    b = ledger.built
    moved = ledger.shifted(table, column, SECOND, where, param(b))
    ledger.update(table, column, moved, where, param(b))
    report = ledger.audit()
    assert named(report, leaf(b), table, column), dump(report)


def test_findings_name_table_and_column_in_the_cli(ledger: Tampered):
    ledger.update("records", "tier", 0, "request_id = %s", "req-greedy")
    proc = subprocess.run(
        [*CLI, "--db", ledger.url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    leaf = ledger.leaf("req-greedy")
    assert out["first_bad_index"] == leaf
    assert {"check": "index", "index": leaf, "table": "records", "column": "tier"}.items() <= (
        out["findings"][0].items()
    )


def test_chunks_and_worker_processes_find_the_same(ledger: Tampered, monkeypatch):
    """Several edits at once; chunk edges everywhere; batches checked in worker processes."""
    b = ledger.built
    ledger.update("cache_keys", "request_id", "req-plain", "request_id = %s", "req-greedy")
    ledger.update("log_entries", "kind", "fingerprint", "idx = %s", ledger.leaf("req-text"))
    moved = ledger.shifted("log_entries", "appended_at", -timedelta(days=1), "idx = %s", 2)
    ledger.update("log_entries", "appended_at", moved, "idx = %s", 2)
    ledger.update("replays", "verdict", "diverged", "replay_id = %s", b.replay_id)
    ledger.su.execute([("DELETE FROM records WHERE request_id = 'req-chat'", ())], ["records"])
    whole = [f.to_dict() for f in ledger.audit().findings]
    assert len(whole) >= 5
    monkeypatch.setattr("ledger.storage.audit.PARALLEL_FROM", 0)
    for chunk in (1, 2, 5):
        monkeypatch.setattr("ledger.storage.audit.CHUNK", chunk)
        assert [f.to_dict() for f in ledger.audit().findings] == whole, chunk
        assert [f.to_dict() for f in ledger.audit(workers=2).findings] == whole, chunk


def test_rows_pointing_past_the_log_are_named(ledger: Tampered):
    """A row for a leaf that does not exist (yet) is left out only while a leaf could still
    come: one past the log's end now is a finding."""
    far = 10**6
    ledger.su.execute(
        [
            (
                "INSERT INTO cache_keys VALUES (%s, 'req-greedy', %s, 2, %s)",
                ("ck1:sha256:" + "cd" * 32, far, True),
            ),
            (
                "INSERT INTO fingerprints VALUES (%s, %s, %s, %s)",
                ("sha256:" + "9" * 64, ledger.built.collector.key_id, far + 1, "2026-01-01"),
            ),
        ],
        ["cache_keys", "fingerprints"],
    )
    report = ledger.audit()
    assert named(report, far, "cache_keys", "log_index"), dump(report)
    assert named(report, far + 1, "fingerprints", "log_index"), dump(report)


@pytest.mark.parametrize(
    ("table", "where"),
    [
        ("records", "request_id = 'req-greedy'"),
        ("cache_keys", "request_id = 'req-greedy'"),
        ("replays", "replay_id = (SELECT min(replay_id) FROM replays)"),
        ("fingerprints", "log_index = 2"),
        ("signing_keys", "log_index = 1"),
        ("key_revocations", "key_id = (SELECT min(key_id) FROM key_revocations)"),
    ],
)
def test_a_log_index_that_is_no_integer_is_named_not_a_crash(
    ledger: Tampered, table: str, where: str
):
    """SQLite keeps any value in an INTEGER column: a text log_index made the audit raise
    (comparing str with int) instead of naming the row, while routes lost the record."""
    if ledger.db.is_postgres:
        pytest.skip("Postgres keeps integers in an integer column")
    ledger.update(table, "log_index", "3x", where)
    report = ledger.audit()
    assert not report.ok
    assert any(
        (f.table, f.column) == (table, "log_index") and "'3x'" in f.message for f in report.findings
    ), dump(report)


def test_merkle_nodes_beyond_the_logs_complete_subtrees_are_named(ledger: Tampered):
    """Nodes the rebuild never compares (past the log's complete subtrees) are named: one at
    the next leaf's place would block the append that completes it."""
    (size,) = ledger.su.query("SELECT count(*) FROM log_entries")[0]
    ledger.su.execute(
        [
            ("INSERT INTO merkle_nodes VALUES (%s, %s, %s)", (0, size, b"\x01" * 32)),
            ("INSERT INTO merkle_nodes VALUES (%s, %s, %s)", (5, 7, b"\x02" * 32)),
        ],
        ["merkle_nodes"],
    )
    report = ledger.audit()
    named_ = [f.message for f in report.findings if (f.table, f.column) == ("merkle_nodes", "idx")]
    assert len(named_) == 2, dump(report)
    assert any(f"level 0 (indexes 0 to {size})" in m for m in named_), named_
    assert any("level 5 (indexes 7 to 7)" in m for m in named_), named_


# ---- what SQLite holds in any column: a finding, never a crash or a silent pass ------------

_SQLITE_EDITS = {
    "invalid UTF-8 in a checkpoint note": (
        "UPDATE checkpoints SET note = CAST(x'ff41' AS TEXT) WHERE tree_size = "
        "(SELECT max(tree_size) FROM checkpoints)",
        "checkpoints",
    ),
    "invalid UTF-8 in an envelope": (
        "UPDATE log_entries SET envelope = CAST(x'ff41' AS TEXT) WHERE idx = 3",
        "log_entries",
    ),
    "invalid UTF-8 in a record's model": (
        "UPDATE records SET model = CAST(x'ff41' AS TEXT) WHERE request_id = 'req-text'",
        "records",
    ),
    "a checkpoint size that is text": (
        "UPDATE checkpoints SET tree_size = 'abc' WHERE tree_size = "
        "(SELECT min(tree_size) FROM checkpoints)",
        "checkpoints",
    ),
    "a checkpoint size int() would read": (
        "UPDATE checkpoints SET tree_size = '2_1' WHERE tree_size = "
        "(SELECT max(tree_size) FROM checkpoints)",
        "checkpoints",
    ),
    "a checkpoint root that is text": (
        "UPDATE checkpoints SET root_hash = 'abc' WHERE tree_size = "
        "(SELECT max(tree_size) FROM checkpoints)",
        "checkpoints",
    ),
    "a checkpoint root that is a huge integer": (
        "UPDATE checkpoints SET root_hash = 1099511627776 WHERE tree_size = "
        "(SELECT max(tree_size) FROM checkpoints)",
        "checkpoints",
    ),
    "a key's public key that is a huge integer": (
        "UPDATE signing_keys SET public_key = 1099511627776 WHERE log_index = "
        "(SELECT max(log_index) FROM signing_keys)",
        "signing_keys",
    ),
    "a node hash that is text": (
        "UPDATE merkle_nodes SET hash = 'abc' WHERE level = 0 AND idx = 2",
        "merkle_nodes",
    ),
    "a node hash that is a huge integer": (
        "UPDATE merkle_nodes SET hash = 1099511627776 WHERE level = 0 AND idx = 2",
        "merkle_nodes",
    ),
    "a leaf index that is text": ("UPDATE log_entries SET idx = 'zz' WHERE idx = 3", "log_entries"),
    "a leaf index that is text, its leaf hash changed too": (
        "UPDATE log_entries SET idx = 'zz', leaf_hash = zeroblob(32) WHERE idx = 3",
        "log_entries",
    ),
    "a leaf index between two others": (
        "UPDATE log_entries SET idx = 3.5 WHERE idx = 3",
        "log_entries",
    ),
    "an extra node between two indexes": (
        "INSERT INTO merkle_nodes (level, idx, hash) VALUES (0, 0.5, zeroblob(32))",
        "merkle_nodes",
    ),
}


@pytest.mark.parametrize("edit", sorted(_SQLITE_EDITS))
@pytest.mark.parametrize("structure_only", [False, True])
def test_any_value_sqlite_holds_is_a_finding_never_a_crash(
    ledger: Tampered, edit: str, structure_only: bool
):
    """SQLite keeps any type in any column, and text that is not UTF-8: a superuser's edit of
    one cell stopped the audit (a driver error, bytes(2**40), int('abc')) or passed. Each is
    a finding now, in the full and the structure-only audit where that audit reads the cell."""
    if not ledger.url.startswith("sqlite"):
        pytest.skip("Postgres keeps each column's type")
    sql, table = _SQLITE_EDITS[edit]
    if structure_only and table in ("records", "signing_keys"):
        pytest.skip("the structure-only audit reads no index table (docs/AUDIT.md)")
    ledger.su.execute([(sql, ())], [table])
    report = ledger.audit(signatures=not structure_only)
    assert not report.ok, (edit, dump(report))


def _erase_one_and_hold_another(ledger: Tampered) -> int:
    """Two v2 records, one erased and one held (the content check then reads the erased
    one's row apart from the stream); the erased one's leaf."""
    from ledger.record_v2 import commit_record
    from ledger.storage import erasures
    from tests.support.documents import record_body

    for rid in ("r-erased", "r-held"):
        body, disclosures = commit_record(record_body(ledger.built.fingerprint_id, request_id=rid))
        envelope = sign_envelope(RECORD_KIND, body, ledger.built.collector)
        ingest.ingest_records(ledger.db, [ingest.RecordItem(envelope.to_dict(), disclosures)])
    log_key = ledger.built.log_key
    erasures.place_hold(
        ledger.db, log_key, request_id="r-held", filter=None, reason="r", placed_by="t"
    )
    erasures.erase(ledger.db, log_key, "r-erased", reason="r", requested_by="t")
    checkpoints.sign_if_new(ledger.db, log_key, ORIGIN)
    assert ledger.audit().ok
    leaf: int = ledger.value("records", "log_index", "request_id = %s", ("r-erased",))
    return leaf


@pytest.mark.parametrize("value", ["garbage", 5])
def test_an_erased_records_receive_time_that_is_no_time_is_a_finding(ledger: Tampered, value: Any):
    """The content check reads the rows of erased records apart from the stream: a receive
    time there that is no time (SQLite) stopped the audit."""
    if not ledger.url.startswith("sqlite"):
        pytest.skip("Postgres keeps each column's type (infinity: the next test)")
    leaf = _erase_one_and_hold_another(ledger)
    ledger.update("records", "received_at", value, "request_id = %s", "r-erased")
    report = ledger.audit()
    assert named(report, leaf, "records", "received_at"), dump(report)


def test_an_erased_records_receive_time_of_infinity_is_a_finding(ledger: Tampered):
    if not ledger.url.startswith("postgresql"):
        pytest.skip("a Postgres time")
    leaf = _erase_one_and_hold_another(ledger)
    ledger.update("records", "received_at", "infinity", "request_id = %s", "r-erased")
    report = ledger.audit()
    assert named(report, leaf, "records", "received_at"), dump(report)


@pytest.mark.parametrize("structure_only", [False, True])
def test_a_record_appended_while_the_tree_shape_is_read_is_no_finding(
    ledger: Tampered, monkeypatch: pytest.MonkeyPatch, structure_only: bool
):
    """The log's size and its stored nodes are read from one snapshot: an append by the
    running ledger between the two reads is not an extra node."""
    from ledger.storage import audit_reader

    real, shape = (
        audit_reader.StorageAuditReader._log_size,
        audit_reader.StorageAuditReader.tree_shape,
    )
    appended: list[int] = []
    reading: list[bool] = []

    def reading_shape(self: Any) -> Any:
        reading.append(True)
        return shape(self)

    def then_append(self: Any, session: Any) -> int:
        size = real(self, session)
        if reading and not appended:  # the ledger appends right after the size was read
            envelope = record_envelope(
                ledger.built.collector, ledger.built.fingerprint_id, request_id="r-live"
            )
            done = ingest.ingest_records(ledger.db, [envelope.to_dict()])
            appended.extend(r.log_index for r in done)
        return size

    monkeypatch.setattr(audit_reader.StorageAuditReader, "_log_size", then_append)
    monkeypatch.setattr(audit_reader.StorageAuditReader, "tree_shape", reading_shape)
    report = ledger.audit(signatures=not structure_only)
    assert appended
    assert not [f for f in report.findings if f.check == "tree"], dump(report)


def test_a_clock_stepped_back_gives_no_leaf_a_time_before_the_last(
    ledger: Tampered, monkeypatch: pytest.MonkeyPatch
):
    """An NTP correction that steps the server's clock back 10 minutes: the ledger's time
    stands still until the clock catches up, so no leaf or checkpoint is dated before one
    logged ahead of it, and the audit of this honest log passes."""
    from datetime import UTC, datetime

    from ledger.storage import database

    step = [timedelta(0)]

    class SteppedClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
            return datetime.now(tz) + step[0]

    monkeypatch.setattr(database, "datetime", SteppedClock)
    before = _log_one_and_sign(ledger, "r-before")
    step[0] = -timedelta(minutes=10)
    after = _log_one_and_sign(ledger, "r-after")
    assert after.signed_at >= before.signed_at
    assert datetime.now(UTC) - after.signed_at < timedelta(minutes=1)  # not 10 minutes back
    assert ledger.audit(checkpoint_interval=3600).ok


def test_a_dropped_append_only_trigger_is_a_finding(ledger: Tampered):
    """On either database, a guard the migrations installed and a superuser removed is named
    (the Postgres catalog's other changes: tests/ledger/test_tamper.py)."""
    if ledger.su.postgres:
        with psycopg.connect(ledger.url) as conn:
            conn.execute("DROP TRIGGER records_append_only ON records")
    else:
        ledger.su.execute([("DROP TRIGGER records_no_update", ())], [])
    report = ledger.audit()
    (found,) = [f for f in report.findings if f.check == "database"]
    assert found.table == "records" and "records_" in found.message and "missing" in found.message


def test_a_guard_trigger_replaced_by_one_that_lets_edits_through_is_a_finding(
    ledger: Tampered,
):
    if ledger.su.postgres:
        pytest.skip("the Postgres catalog's cases: tests/ledger/test_tamper.py")
    ledger.su.execute(
        [
            ("DROP TRIGGER holds_no_update", ()),
            (
                "CREATE TRIGGER holds_no_update BEFORE UPDATE ON holds WHEN 0 BEGIN SELECT 1; END",
                (),
            ),
        ],
        [],
    )
    (found,) = [f for f in ledger.audit().findings if f.check == "database"]
    assert found.table == "holds" and "replaced" in found.message


# Readers: what the audit names is never what a route answers. Each field a reader serves is
# read from the leaf (or the signed note); a row that points elsewhere is IndexMismatch.

YEAR = timedelta(days=365)


def test_a_fingerprint_is_served_from_its_leaf_at_its_leaf_time(ledger: Tampered):
    fp = ledger.built.fingerprint_id
    honest = ingest.get_fingerprint(ledger.db, fp)
    older = ledger.shifted("fingerprints", "registered_at", -YEAR, "fingerprint_id = %s", fp)
    ledger.update("fingerprints", "registered_at", older, "fingerprint_id = %s", fp)
    assert ingest.get_fingerprint(ledger.db, fp) == honest
    for leaf in (ledger.leaf("req-plain"), 10**6):  # a record's leaf; past the log's end
        ledger.update("fingerprints", "log_index", leaf, "fingerprint_id = %s", fp)
        with pytest.raises(IndexMismatch) as edited:
            ingest.get_fingerprint(ledger.db, fp)
        assert edited.value.details["log_index"] == leaf


def test_verdict_and_certificate_times_are_their_leaves(ledger: Tampered):
    b = ledger.built
    verdict = verdicts.get_verdict(ledger.db, b.replay_id)
    certificate = verdicts.get_certificate(ledger.db, b.certificate_id)
    listed = verdicts.verdicts_of(ledger.db, "req-greedy")
    for table, column, key in (
        ("replays", "replay_id", b.replay_id),
        ("certificates", "certificate_id", b.certificate_id),
    ):
        earlier = ledger.shifted(table, "created_at", -YEAR, f"{column} = %s", key)
        ledger.update(table, "created_at", earlier, f"{column} = %s", key)
    assert verdicts.get_verdict(ledger.db, b.replay_id) == verdict
    assert verdicts.get_certificate(ledger.db, b.certificate_id) == certificate
    assert verdicts.verdicts_of(ledger.db, "req-greedy") == listed
    report = ledger.audit()
    assert named(report, b.replay_leaf, "replays", "created_at"), dump(report)
    assert named(report, b.certificate_leaf, "certificates", "created_at"), dump(report)


@pytest.mark.parametrize("column", ["tree_size", "root_hash", "signed_at"])
def test_a_checkpoint_row_unlike_its_note_is_never_served(ledger: Tampered, column: str):
    latest = checkpoints.latest(ledger.db)
    value = {
        "tree_size": latest.tree_size + 1000,
        "root_hash": bytes(32),
        "signed_at": ledger.shifted(
            "checkpoints", "signed_at", SECOND, "tree_size = %s", latest.tree_size
        ),
    }[column]
    ledger.update("checkpoints", column, value, "tree_size = %s", latest.tree_size)
    with pytest.raises(IndexMismatch):
        checkpoints.latest(ledger.db)
    if column == "tree_size":  # the size a bundle's proofs would be computed at
        with pytest.raises(IndexMismatch):
            proofs.evidence(ledger.db, ledger.built.log_key, ORIGIN, "req-plain")
    unlike = [cp for cp in checkpoints.history(ledger.db) if checkpoints.disagreement(cp)]
    assert len(unlike) == 1 and unlike[0].note == latest.note  # the console marks it invalid
    # a scrape still answers: the tree size, and no checkpoint figure
    gauges = LogGauges(ledger.db, ledger.built.log_key, 15.0, utcnow)
    names = {m.name for m in gauges.collect()}
    assert "ledger_log_tree_size" in names and "ledger_log_checkpoint_tree_size" not in names
    assert not ledger.audit().ok


def test_key_fields_are_their_registration_and_revocation_leaves(ledger: Tampered):
    b = ledger.built
    db, collector, revoked_id = ledger.db, b.collector.key_id, b.revoked_key_id
    honest, listed = keystore.get_key(db, collector), keystore.list_keys(db)
    revoked = keystore.get_key(db, revoked_id)
    assert revoked.revoked and revoked.revocation_reason == "rotated"
    other = ledger.value("signing_keys", "public_key", "key_id = %s", (revoked_id,))
    where = "key_id = %s"
    ledger.update("signing_keys", "name", "trusted-prod-collector", where, collector)
    ledger.update("signing_keys", "public_key", other, where, collector)
    moved = ledger.shifted("signing_keys", "registered_at", -YEAR, where, collector)
    ledger.update("signing_keys", "registered_at", moved, where, collector)
    moved = ledger.shifted("key_revocations", "revoked_at", -YEAR, where, revoked_id)
    ledger.update("key_revocations", "revoked_at", moved, where, revoked_id)
    assert keystore.get_key(db, collector) == honest
    assert keystore.get_key(db, revoked_id) == revoked
    assert keystore.list_keys(db) == listed
    ledger.update("key_revocations", "reason", "compromised", where, revoked_id)
    with pytest.raises(IndexMismatch):
        keystore.get_key(db, revoked_id)
    with pytest.raises(IndexMismatch):
        keystore.list_keys(db)


def test_a_revocation_row_the_log_does_not_back_is_never_answered(ledger: Tampered):
    collector = ledger.built.collector.key_id
    ledger.su.execute(
        [
            (
                "INSERT INTO key_revocations (key_id, reason, log_index, revoked_at) "
                "VALUES (%s, %s, %s, %s)",
                (collector, "compromised", 0, ledger.su.time(utcnow())),
            )
        ],
        ["key_revocations"],
    )
    with pytest.raises(IndexMismatch) as forged:
        keystore.get_key(ledger.db, collector)
    assert forged.value.details == {"log_index": 0, "key_id": collector}
    # what reads keys to check signatures (ingest, every worker listing and metrics scrape)
    # does not fail for every key: this one signs nothing, the others sign as before
    with ledger.db.read() as s:
        keys = keystore.load_keys(s, [collector, ledger.built.log_key.key_id])
    assert keys[collector].revoked and keys[collector].role == keystore.UNVERIFIED_ROLE
    assert keys[ledger.built.log_key.key_id].mismatch is None
    envelope = record_envelope(ledger.built.collector, ledger.built.fingerprint_id)
    with pytest.raises(VerificationError):
        keystore.check_signer(envelope, keys)


def test_a_bundles_signer_entries_are_their_registration_leaves(ledger: Tampered):
    """Key rows edited (name, role, public key) are not copied into a bundle, which stays
    VALID with the signed values; a key row pointing at another leaf is no bundle at all."""
    b, db = ledger.built, ledger.db
    honest = proofs.evidence(db, b.log_key, ORIGIN, "req-plain")
    other = ledger.value("signing_keys", "public_key", "key_id = %s", (b.revoked_key_id,))
    where = "key_id = %s"
    for column, value in (("name", "trusted"), ("role", "replayer"), ("public_key", other)):
        ledger.update("signing_keys", column, value, where, b.collector.key_id)
    bundle = proofs.evidence(db, b.log_key, ORIGIN, "req-plain")
    for member in ("collector", "fingerprint_signer"):
        assert bundle["keys"][member] == honest["keys"][member]
    verify_bundle(bundle, b.log_key.public_key)
    ledger.update("signing_keys", "log_index", 2, where, b.collector.key_id)  # a fingerprint
    with pytest.raises(IndexMismatch):
        proofs.evidence(db, b.log_key, ORIGIN, "req-plain")
