"""The key registry as the log builds it: one timeline of registrations and revocations.

Key events are log leaves signed by the log key, applied in log order by the audit's main
process (:meth:`KeyTimeline.apply`). Every other leaf is checked against the registry *as of
its index* (:func:`signer_finding`): a key counts for leaf ``i`` if its registration is an
earlier leaf and it was not revoked at an earlier leaf. That question needs only each key's
(registered at, revoked at) leaves, so a snapshot taken later answers it the same way, and
worker processes can check leaves while the main process reads on.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from ledger.audit.report import Finding
from ledger.audit.rows import Micros, as_time, micros
from ledger.errors import LedgerError, VerificationError
from ledger.key_scope import out_of_scope, registered_pools
from ledger.signing import (
    KEY_ID_PREFIX,
    SIGNABLE_KINDS,
    Envelope,
    VerifyingKey,
    key_id_of,
    verify_envelope,
)

# The same strings as ledger.storage.keystore's (a test holds them equal).
REGISTRATION_KIND = "key_registration"
REVOCATION_KIND = "key_revocation"
KEY_EVENTS = (REGISTRATION_KIND, REVOCATION_KIND)
LOG_ROLE = "log"


@dataclass(frozen=True)
class KeyEntry:
    """A registered key: what its registration leaf says, and when it stopped counting."""

    key_id: str
    raw: bytes  # the 32-byte Ed25519 public key
    role: str
    name: str
    registered_at: int  # leaf index of the registration
    appended_at: Micros | None = None  # that leaf's receive time
    revoked_at: int | None = None  # leaf index of the revocation, if any
    pools: tuple[str, ...] | None = None  # the pools it may sign for (None: any)


@dataclass(frozen=True)
class Revocation:
    key_id: str
    log_index: int
    reason: Any
    appended_at: Micros | None


def _raw_key(text: Any) -> bytes:
    """The raw bytes of an ``ed25519:<base64>`` public key as a registration body holds it."""
    if not isinstance(text, str) or not text.startswith(KEY_ID_PREFIX):
        raise VerificationError(f"public key {str(text)[:60]!r} is not ed25519:<base64>")
    try:
        raw = base64.b64decode(text[len(KEY_ID_PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise VerificationError("public key is not valid base64") from exc
    if len(raw) != 32:
        raise VerificationError("public key is not 32 bytes")
    return raw


def signed_time(body: dict[str, Any], member: str) -> Micros | None:
    """A key event body's own time (``registered_at`` / ``revoked_at``: the same instant the
    ledger stored as the leaf's receive time), or None when it is not one."""
    value = body.get(member)
    if not isinstance(value, str):
        return None
    try:
        return micros(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except (ValueError, OverflowError):
        return None


class KeyTimeline:
    """Registrations and revocations in log order; the first one registers the log key."""

    def __init__(self, pinned: bytes | None) -> None:
        self.pinned = pinned
        self.log_key_id: str | None = None
        self.keys: dict[str, KeyEntry] = {}
        self.revocations: dict[str, Revocation] = {}
        self.events = 0  # key events applied (a snapshot is stale once it grows)

    def seed_pinned(self) -> None:
        """Trust the pinned log key without its registration (structure-only audits)."""
        assert self.pinned is not None
        self.events += 1
        self.log_key_id = key_id_of(self.pinned)
        self.keys[self.log_key_id] = KeyEntry(self.log_key_id, self.pinned, LOG_ROLE, "ledger", 0)

    @property
    def log_key(self) -> bytes | None:
        entry = self.keys.get(self.log_key_id or "")
        return entry.raw if entry is not None else None

    def snapshot(self) -> dict[str, KeyEntry]:
        return dict(self.keys)

    def apply(self, env: Envelope, idx: int, appended_at: Micros | None) -> list[Finding]:
        """Check one key event (signed by the log key, the first one registering that key
        itself) and apply it. Returns its findings; an event that fails is not applied."""
        self.events += 1
        found: list[Finding] = []

        def fail(message: str) -> list[Finding]:
            found.append(Finding("signature", message, idx))
            return found

        body = env.body
        if self.log_key_id is None:  # the first key event registers the log key itself
            if env.kind != REGISTRATION_KIND or body.get("role") != LOG_ROLE:
                return fail("the log does not start with the log key's registration")
            try:
                anchor = _raw_key(body.get("public_key"))
            except LedgerError as exc:
                return fail(f"{env.kind}: {exc.message}")
            if self.pinned is not None and self.pinned != anchor:
                fail("the log's key is not the pinned log key")
            trusted = self.pinned or anchor
            self.log_key_id = key_id_of(trusted)
            self.keys[self.log_key_id] = KeyEntry(self.log_key_id, trusted, LOG_ROLE, "ledger", idx)
        if env.key_id != self.log_key_id:
            return fail(f"{env.kind} is not signed by the log key")
        log_key = self.keys[self.log_key_id]
        try:
            verify_envelope(env, VerifyingKey(log_key.raw, log_key.key_id))
        except LedgerError as exc:
            return fail(exc.message)
        stated = signed_time(
            body, "registered_at" if env.kind == REGISTRATION_KIND else "revoked_at"
        )
        if stated is not None and appended_at != stated:
            found.append(
                Finding(
                    "time",
                    f"appended at {as_time(appended_at)}, but the signed {env.kind} says "
                    f"{as_time(stated)}",
                    idx,
                    "log_entries",
                    "appended_at",
                )
            )
        if env.kind == REGISTRATION_KIND:
            key_id = str(body.get("key_id"))
            try:
                raw = _raw_key(body.get("public_key"))
            except LedgerError as exc:
                return fail(f"{env.kind}: {exc.message}")
            if key_id_of(raw) != key_id:
                return fail(f"registration of {key_id} carries another key")
            self.keys[key_id] = KeyEntry(
                key_id,
                raw,
                str(body.get("role")),
                str(body.get("name")),
                idx,
                appended_at,
                pools=registered_pools(body),
            )
        else:
            key_id = str(body.get("key_id"))
            if key_id in self.keys:
                self.keys[key_id] = replace(self.keys[key_id], revoked_at=idx)
            self.revocations[key_id] = Revocation(key_id, idx, body.get("reason"), appended_at)
        return found


def signer_finding(
    keys: Mapping[str, KeyEntry],
    env: Envelope,
    idx: int,
    verifiers: dict[str, VerifyingKey],
) -> Finding | None:
    """Whether ``env`` (not a key event) verifies under the registry as of leaf ``idx``."""
    entry = keys.get(env.key_id)
    if entry is None or entry.registered_at >= idx:
        return Finding("signature", f"signed by {env.key_id}, which the log never registered", idx)
    if entry.revoked_at is not None and entry.revoked_at < idx:
        return Finding(
            "signature", f"signed by {env.key_id}, revoked at leaf {entry.revoked_at}", idx
        )
    if env.kind not in SIGNABLE_KINDS.get(entry.role, ()):
        return Finding("signature", f"a {entry.role} key may not sign {env.kind}", idx)
    problem = out_of_scope(entry.pools, env.kind, env.body)
    if problem is not None:
        return Finding("signature", problem, idx)
    key = verifiers.get(env.key_id)
    if key is None:
        key = verifiers[env.key_id] = VerifyingKey(entry.raw, entry.key_id)
    try:
        verify_envelope(env, key)
    except LedgerError as exc:
        return Finding("signature", exc.message, idx)
    return None
