"""The key registry: registration and revocation are log events signed by the ledger key."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import Row, Select, insert, select
from sqlalchemy.orm import Session, aliased

from ledger.clock import parse_rfc3339, rfc3339
from ledger.erasure import check_reason
from ledger.errors import (
    Conflict,
    IndexMismatch,
    InvalidInput,
    LedgerError,
    NotFound,
    VerificationError,
)
from ledger.key_scope import MEMBER as POOLS_MEMBER
from ledger.key_scope import out_of_scope, parse_pools, registered_pools
from ledger.names import MAX_NAME, is_name
from ledger.signing import (
    SIGNABLE_KINDS,
    Envelope,
    SigningKey,
    VerifyingKey,
    cached_verifying_key,
    is_key_id,
    key_id_for,
    key_id_of,
    load_public_key,
    public_key_raw,
    sign_envelope,
    verify_envelope,
)
from ledger.storage import log
from ledger.storage.database import Database, as_utc, utcnow
from ledger.storage.models import KeyRevocation, LogEntry
from ledger.storage.models import SigningKey as KeyRow
from ledger.storage.queries import mismatch, stored_bytes

REGISTRATION_KIND = "key_registration"
REVOCATION_KIND = "key_revocation"
LOG_ROLE = "log"
ROLES = ("collector", "replayer")


@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    name: str
    role: str
    public_key: str  # "ed25519:<base64 raw>"
    registered_at: datetime
    log_index: int
    revoked_at: datetime | None = None
    revocation_reason: str | None = None
    # The pools the key may sign records and heartbeats for (ledger.key_scope); None: any.
    pools: tuple[str, ...] | None = None
    # A revocation row its leaf does not back: the key signs nothing, and a reader answering
    # with the key raises this instead (``answerable``)
    mismatch: IndexMismatch | None = field(default=None, compare=False, repr=False)

    def answerable(self) -> KeyInfo:
        """This key as a route may answer it: IndexMismatch if its rows disagree with the log."""
        if self.mismatch is not None:
            raise self.mismatch
        return self

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def to_dict(self) -> dict[str, object]:
        return {
            "key_id": self.key_id,
            "name": self.name,
            "role": self.role,
            "public_key": self.public_key,
            "pools": list(self.pools) if self.pools is not None else None,
            "registered_at": rfc3339(self.registered_at),
            "log_index": self.log_index,
            "revoked": self.revoked,
            "revoked_at": rfc3339(self.revoked_at) if self.revoked_at else None,
            "revocation_reason": self.revocation_reason,
        }


def encode_public(raw: bytes) -> str:
    return "ed25519:" + base64.b64encode(raw).decode("ascii")


_Columns = tuple[
    str, str, bytes, datetime, int, datetime | None, str | None, bytes | None, int | None,
    bytes | None,
]  # fmt: skip
_REVOCATION_LEAF = aliased(LogEntry)
_COLUMNS = (
    KeyRow.key_id,
    KeyRow.name,
    KeyRow.public_key,
    KeyRow.registered_at,
    KeyRow.log_index,
    KeyRevocation.revoked_at,
    KeyRevocation.reason,
    LogEntry.envelope,
    KeyRevocation.log_index,
    _REVOCATION_LEAF.envelope,
)


@dataclass(frozen=True)
class _Registration:
    """What a key's registration leaf says: the answer for every field it holds."""

    role: str
    pools: tuple[str, ...] | None
    name: str | None = None
    public_key: bytes | None = None
    registered_at: datetime | None = None


# The log keys this process holds (the ledger's own, loaded from its key file): a key's scope
# is taken from a registration leaf only when one of them signed it.
_ANCHORS: dict[str, VerifyingKey] = {}
# Registration leaves verified under a held log key, by key ID and bytes: what each says.
_SCOPES: dict[tuple[str, bytes], _Registration] = {}
# The role of a key whose registration leaf is not its own valid registration: it signs nothing.
UNVERIFIED_ROLE = "unverified"
_UNVERIFIED = _Registration(UNVERIFIED_ROLE, ())


def trust_log_key(public_key: Ed25519PublicKey) -> None:
    """Accept registrations signed by this log key (the ledger's own key file's, held in
    memory: a database superuser cannot change it) as the source of keys' scopes."""
    anchor = VerifyingKey.of(public_key)
    _ANCHORS[anchor.key_id] = anchor


def _leaf(envelope: bytes, kind: str, key_id: str) -> Envelope | None:
    """The log key's ``kind`` leaf about ``key_id``; None if ``envelope`` is not one (or, once
    the process holds its log key, is not validly signed by it)."""
    try:
        leaf = Envelope.from_bytes(envelope)
        if leaf.kind != kind or leaf.body.get("key_id") != key_id:
            return None
        if _ANCHORS:
            anchor = _ANCHORS.get(leaf.key_id)
            if anchor is None:
                return None
            verify_envelope(leaf, anchor)
    except (ValueError, LedgerError):
        return None
    return leaf


def _logged(key_id: str, envelope: bytes | None) -> _Registration:
    """What the key's registration leaf holds (role, scope, name, public key, time), read
    from the leaf, never from the index columns. A leaf that is not this key's registration (an
    edited ``signing_keys.log_index``) or, once the process holds its log key, not validly
    signed by it (an edited ``log_entries.envelope``) gives the key no role and no pool, so it
    signs nothing. An edited ``signing_keys`` column changes nothing. The audit names every
    such edit."""
    data = stored_bytes(envelope)
    if data is None:  # no leaf, or one stored as another type than bytes (an edit)
        return _UNVERIFIED
    if (key_id, data) in _SCOPES:
        return _SCOPES[key_id, data]
    leaf = _leaf(data, REGISTRATION_KIND, key_id)
    if leaf is None:
        return _UNVERIFIED
    body = leaf.body
    role, name, public, at = (body.get(m) for m in ("role", "name", "public_key", "registered_at"))
    if not isinstance(role, str) or role not in SIGNABLE_KINDS:
        return _UNVERIFIED
    try:
        prefix, _, text = public.partition(":") if isinstance(public, str) else ("", "", "")
        raw = base64.b64decode(text, validate=True)
        registered_at = parse_rfc3339(at) if isinstance(at, str) else None
    except (ValueError, LedgerError):
        return _UNVERIFIED
    if prefix != "ed25519" or key_id_of(raw) != key_id:  # the leaf's key is the one its ID names
        return _UNVERIFIED
    logged = _Registration(
        role,
        registered_pools(body),
        name if isinstance(name, str) else None,
        raw,
        registered_at,
    )
    if _ANCHORS:
        if len(_SCOPES) >= 4096:
            _SCOPES.clear()
        _SCOPES[key_id, data] = logged
    return logged


def _revocation(
    key_id: str, registered: int, reason: str, log_index: int, envelope: object
) -> tuple[datetime, str] | IndexMismatch:
    """The time and reason of a key's revocation, from its leaf. A ``key_revocations`` row
    whose leaf is not the log key's revocation of this key, logged after its registration, is
    IndexMismatch: an inserted row is never answered "revoked" (nor a deleted one hidden, the
    audit names it)."""
    data = stored_bytes(envelope)
    leaf = _leaf(data, REVOCATION_KIND, key_id) if data is not None else None
    problem = "the leaf is not this key's revocation, logged after its registration"
    if envelope is None:
        problem = "the log holds no such leaf"
    elif leaf is not None and log_index > registered and leaf.body.get("reason") == reason:
        at = leaf.body.get("revoked_at")
        try:
            return parse_rfc3339(at), reason
        except (TypeError, ValueError, LedgerError):
            problem = "the leaf holds no revocation time"
    return mismatch(f"the revocation of key {key_id}", log_index, problem, key_id=key_id)


def _info(row: Row[*_Columns]) -> KeyInfo:
    key_id, name, public, registered_at, log_index, revoked_at, reason, envelope, rev, rev_env = row
    logged = _logged(key_id, envelope)
    problem = None
    if revoked_at is not None and rev is not None:
        found = _revocation(key_id, log_index, reason or "", rev, rev_env)
        if isinstance(found, IndexMismatch):  # revoked all the same: it signs nothing
            problem, logged = found, _UNVERIFIED
        else:
            revoked_at, reason = found
    return KeyInfo(
        key_id=key_id,
        name=logged.name if logged.name is not None else name,
        role=logged.role,
        public_key=encode_public(logged.public_key or public),
        registered_at=logged.registered_at or as_utc(registered_at),
        log_index=log_index,
        revoked_at=as_utc(revoked_at) if revoked_at else None,
        revocation_reason=reason,
        pools=logged.pools,
        mismatch=problem,
    )


def _with_revocations() -> Select[*_Columns]:
    # Columns, not ORM entities: every ingest batch reads its signers' keys.
    return (
        select(*_COLUMNS)
        .outerjoin(KeyRevocation, KeyRevocation.key_id == KeyRow.key_id)
        .outerjoin(LogEntry, LogEntry.idx == KeyRow.log_index)
        .outerjoin(_REVOCATION_LEAF, _REVOCATION_LEAF.idx == KeyRevocation.log_index)
    )


def load_keys(session: Session, key_ids: Iterable[str]) -> dict[str, KeyInfo]:
    ids = sorted(set(key_ids))
    if not ids:
        return {}
    rows = session.execute(_with_revocations().where(KeyRow.key_id.in_(ids))).all()
    return {row[0]: _info(row) for row in rows}


def check_key_id(key_id: str) -> None:
    if not is_key_id(key_id):
        raise InvalidInput(
            "a key ID is ed25519: and 64 lowercase hex digits", code="invalid_parameters"
        )


def get_key(db: Database, key_id: str) -> KeyInfo:
    check_key_id(key_id)
    with db.read() as s:
        found = load_keys(s, [key_id])
    if key_id not in found:
        raise NotFound(f"no key {key_id}", code="key_not_found")
    return found[key_id].answerable()


def list_keys(db: Database) -> list[KeyInfo]:
    with db.read() as s:
        rows = s.execute(_with_revocations().order_by(KeyRow.log_index)).all()
    return [_info(row).answerable() for row in rows]


def _register(
    s: Session,
    log_key: SigningKey,
    name: str,
    role: str,
    raw: bytes,
    key_id: str,
    pools: tuple[str, ...] | None = None,
) -> KeyInfo:
    at = utcnow()
    body: dict[str, object] = {
        "schema_version": 1,
        "key_id": key_id,
        "name": name,
        "role": role,
        "public_key": encode_public(raw),
        "registered_at": rfc3339(at),
    }
    if pools is not None:  # absent, not null: an unscoped key's registration is unchanged
        body[POOLS_MEMBER] = list(pools)
    (idx,) = log.append(s, [sign_envelope(REGISTRATION_KIND, body, log_key)], at)
    s.execute(
        insert(KeyRow),
        [
            {
                "key_id": key_id,
                "name": name,
                "role": role,
                "public_key": raw,
                "log_index": idx,
                "registered_at": at,
            }
        ],
    )
    return KeyInfo(key_id, name, role, encode_public(raw), at, idx, pools=pools)


def ensure_log_key(db: Database, log_key: SigningKey) -> KeyInfo:
    """Register the ledger's own key (self-signed) on first start; idempotent.

    A log has exactly one log key, registered by its first leaf. Starting with another key
    (a lost or swapped key file) is refused: it would fork the log's trust anchor.
    """
    trust_log_key(log_key.public_key)
    with db.write() as s:
        found = load_keys(s, [log_key.key_id])
        if log_key.key_id in found:
            return found[log_key.key_id]
        other = s.execute(select(KeyRow.key_id).where(KeyRow.role == LOG_ROLE)).scalar()
        if other is not None or log.log_size(s) > 0:
            raise Conflict(
                f"this database's log is signed by log key {other or '(unknown)'}, but the "
                f"configured key file holds {log_key.key_id}; point LEDGER_LOG_KEY_FILE at the "
                "original key (a log cannot change its key)",
                code="log_key_mismatch",
            )
        raw = public_key_raw(log_key.public_key)
        return _register(s, log_key, "ledger", LOG_ROLE, raw, log_key.key_id)


def register_key(
    db: Database,
    log_key: SigningKey,
    *,
    name: str,
    role: str,
    public_key: str,
    pools: list[str] | tuple[str, ...] | None = None,
) -> tuple[KeyInfo, bool]:
    """Register a public key; returns (info, created). Same key, same name, role and pools:
    no-op. ``pools`` scopes a collector key (ledger.key_scope); None: any pool."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {list(ROLES)}, got {role!r}", code="invalid_role")
    scope = parse_pools(pools)
    if scope is not None and role != "collector":
        raise InvalidInput(
            "pools scope a collector key; a replayer key names no pool", code="invalid_pools"
        )
    if not is_name(name):
        raise InvalidInput(
            f"key name must be 1-{MAX_NAME} characters of visible text (not only spaces), "
            "without control or invisible format characters",
            code="schema_violation",
        )
    pk = load_public_key(public_key)
    key_id = key_id_for(pk)
    with db.write() as s:
        existing = load_keys(s, [key_id]).get(key_id)
        if existing is not None:
            existing.answerable()
        if existing is not None and existing.role == UNVERIFIED_ROLE:  # a row no leaf backs
            raise mismatch(
                f"key {key_id}", existing.log_index, "the leaf is not this key's registration"
            )
        if existing is not None:
            if (existing.name, existing.role, existing.pools) != (name, role, scope):
                raise Conflict(
                    f"key {key_id} is already registered as {existing.name!r} ({existing.role}, "
                    f"{_scope_text(existing.pools)}); a key's registration cannot change",
                    code="key_conflict",
                    details={"key_id": key_id},
                )
            return existing, False
        return _register(s, log_key, name, role, public_key_raw(pk), key_id, scope), True


def _scope_text(pools: tuple[str, ...] | None) -> str:
    return "any pool" if pools is None else "pools " + ", ".join(pools)


def revoke_key(db: Database, log_key: SigningKey, key_id: str, reason: str) -> tuple[KeyInfo, bool]:
    """Revoke a key from now on; records it signed before stay valid. Returns (info, changed)."""
    check_key_id(key_id)
    reason = check_reason(reason)
    if key_id == log_key.key_id:
        raise InvalidInput("the ledger's own log key cannot be revoked here", code="invalid_role")
    with db.write() as s:
        existing = load_keys(s, [key_id]).get(key_id)
        if existing is None:
            raise NotFound(f"no key {key_id}", code="key_not_found")
        if existing.revoked:  # read through its leaf (load_keys): an inserted row is not
            return existing.answerable(), False
        at = utcnow()
        body = {
            "schema_version": 1,
            "key_id": key_id,
            "reason": reason,
            "revoked_at": rfc3339(at),
        }
        (idx,) = log.append(s, [sign_envelope(REVOCATION_KIND, body, log_key)], at)
        s.execute(
            insert(KeyRevocation),
            [{"key_id": key_id, "reason": reason, "log_index": idx, "revoked_at": at}],
        )
        info = load_keys(s, [key_id])[key_id]
    return info, True


def check_signer(
    envelope: Envelope, keys: dict[str, KeyInfo], *, signature_verified: bool = False
) -> KeyInfo:
    """Verify an envelope against the registry: known, not revoked, allowed, valid signature
    (``signature_verified``: checked before under the key's public key, the registry's checks
    only)."""
    info = keys.get(envelope.key_id)
    if info is None:
        raise VerificationError(
            f"envelope is signed by unknown key {envelope.key_id}",
            code="unknown_key",
            details={"key_id": envelope.key_id},
        )
    if info.revoked:
        raise VerificationError(
            f"envelope is signed by revoked key {envelope.key_id} ({info.name})",
            code="revoked_key",
            details={"key_id": envelope.key_id},
        )
    if info.role == UNVERIFIED_ROLE:
        raise VerificationError(
            f"key {envelope.key_id}'s registration in the log does not verify, so it may sign "
            "nothing (`ledger audit` names the edit)",
            code="key_role_not_allowed",
            details={"key_id": envelope.key_id},
        )
    if envelope.kind not in SIGNABLE_KINDS.get(info.role, ()):
        raise VerificationError(
            f"a {info.role!r} key may not sign {envelope.kind!r} documents",
            code="key_role_not_allowed",
            details={"key_id": envelope.key_id},
        )
    if not signature_verified:
        verify_envelope(envelope, cached_verifying_key(info.public_key))
    problem = out_of_scope(info.pools, envelope.kind, envelope.body)
    if problem is not None:
        raise VerificationError(
            problem,
            code="key_out_of_scope",
            details={"key_id": envelope.key_id, "pools": list(info.pools or ())},
        )
    return info


def revoked_among(session: Session, key_ids: Iterable[str]) -> set[str]:
    """Which of ``key_ids`` are revoked, read under the append lock (see require_unrevoked)."""
    ids = sorted(set(key_ids))
    if not ids:
        return set()
    return set(
        session.execute(select(KeyRevocation.key_id).where(KeyRevocation.key_id.in_(ids))).scalars()
    )


def require_unrevoked(session: Session, checked_key_ids: Iterable[str]) -> None:
    """Re-check, under the append lock, that keys verified earlier were not revoked since.

    Keys are never deleted (their registration is a log entry), so only revocations are read.
    """
    ids = sorted(set(checked_key_ids))
    revoked = session.execute(
        select(KeyRevocation.key_id).where(KeyRevocation.key_id.in_(ids)).limit(1)
    ).scalar()
    if revoked is not None:
        raise VerificationError(
            f"key {revoked} was revoked while the request was being processed",
            code="revoked_key",
            details={"key_id": revoked},
        )
