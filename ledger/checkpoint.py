"""C2SP ``tlog-checkpoint`` signed notes (pure).

A checkpoint body is three lines: the log's origin, the tree size in decimal, and the
base64 root hash, then optional extension lines (C2SP: opaque, non-empty). It is wrapped in a
C2SP ``signed-note``: the body, a blank line, and one signature line per signer,
``— <key name> <base64(4-byte key hash || signature)>``, where for Ed25519 the key hash is the
first four bytes of SHA-256(key name || "\\n" || 0x01 || public key) and the signature covers
the body text (every line, extension lines included, each ending in a newline).

The ledger writes the time it signed the checkpoint as an extension line::

    Timestamp: <Unix time in nanoseconds, ASCII decimal>

(the form Rekor's checkpoints use). It is signed with the rest, so a checkpoint commits to
its tree *and* to a time: every leaf it covers was appended no later than that, every leaf
after it no earlier (``ledger audit`` checks both). Notes without the line (signed before it
existed) still parse and verify, with ``signed_at`` ``None``: they bound no time.

Every checkpoint but a log's first also names the tree size of the checkpoint the log signed
before it::

    Previous: <tree size, ASCII decimal>

so the signed checkpoints form a chain, and one deleted from storage is named by the next
(``ledger audit``): the time bounds of the leaves between stay as signed. Notes without the line
(a log's first, or signed before it existed) are not chained to anything.

Extension lines other than the timestamp are kept, in order, in ``extensions`` (the previous
size is read from them by :func:`previous_size`); others are ignored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger.errors import InvalidInput, VerificationError
from ledger.signing import SigningKey, public_key_raw, verify_signature

SIG_PREFIX = "\u2014 "  # em dash, space
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
ED25519_TYPE = b"\x01"
TIMESTAMP_PREFIX = "Timestamp: "
PREVIOUS_PREFIX = "Previous: "
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def note_key_hash(name: str, public_key: Ed25519PublicKey) -> bytes:
    data = name.encode() + b"\n" + ED25519_TYPE + public_key_raw(public_key)
    return hashlib.sha256(data).digest()[:4]


def verifier_key(name: str, public_key: Ed25519PublicKey) -> str:
    """The C2SP vkey string: ``<name>+<hex key hash>+<base64(0x01 || public key)>``."""
    raw = base64.b64encode(ED25519_TYPE + public_key_raw(public_key)).decode()
    return f"{name}+{note_key_hash(name, public_key).hex()}+{raw}"


def timestamp_line(at: datetime) -> str:
    """The ``Timestamp:`` extension line for an aware time (microsecond precision)."""
    if at.tzinfo is None:
        raise InvalidInput("a checkpoint time must carry a time zone", code="invalid_time")
    micros = (at - _EPOCH) // timedelta(microseconds=1)
    if micros < 0:
        raise InvalidInput("a checkpoint time must be after 1970", code="invalid_time")
    return f"{TIMESTAMP_PREFIX}{micros * 1000}"


def previous_line(tree_size: int) -> str:
    """The ``Previous:`` extension line naming the checkpoint signed before this one."""
    if tree_size < 1:
        raise InvalidInput(
            "a previous checkpoint covers at least one leaf", code="invalid_checkpoint"
        )
    return f"{PREVIOUS_PREFIX}{tree_size}"


def previous_size(cp: Checkpoint) -> int | None:
    """The tree size of the checkpoint signed before ``cp`` (its ``Previous:`` line); None
    when it names none. A malformed or repeated line is a :class:`VerificationError`."""
    found = [line for line in cp.extensions if line.startswith(PREVIOUS_PREFIX)]
    if not found:
        return None
    text = found[0][len(PREVIOUS_PREFIX) :]
    if len(found) > 1 or not _DECIMAL.fullmatch(text) or len(text) > 19 or text == "0":
        raise _fail(f"checkpoint's previous-checkpoint line {found[-1][:40]!r} is malformed")
    size = int(text)
    if size >= cp.tree_size:
        raise _fail(f"checkpoint of size {cp.tree_size} names a previous one of size {size}")
    return size


def _parse_timestamp(text: str) -> datetime:
    if not _DECIMAL.fullmatch(text) or len(text) > 19:
        raise _fail(f"checkpoint timestamp {text[:40]!r} is not a decimal number of nanoseconds")
    return _EPOCH + timedelta(microseconds=int(text) // 1000)


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    tree_size: int
    root_hash: bytes
    # when the log signed it (the ``Timestamp:`` extension line); None in notes without one
    signed_at: datetime | None = None
    extensions: tuple[str, ...] = ()  # any other extension lines, as signed

    def body(self) -> str:
        """The note text to sign: the three C2SP lines, the timestamp line (when
        ``signed_at`` is set), then the other extension lines."""
        root = base64.b64encode(self.root_hash).decode()
        lines = [self.origin, str(self.tree_size), root]
        if self.signed_at is not None:
            lines.append(timestamp_line(self.signed_at))
        lines.extend(self.extensions)
        return "\n".join(lines) + "\n"


def sign_checkpoint(cp: Checkpoint, key: SigningKey, name: str | None = None) -> str:
    """The signed note text for a checkpoint, signed under key name ``name`` (origin)."""
    if not cp.origin or any(c.isspace() for c in cp.origin) or "+" in cp.origin:
        raise InvalidInput(
            f"checkpoint origin {cp.origin!r} must be one token without spaces or '+'",
            code="invalid_origin",
        )
    if any(not line or "\n" in line for line in cp.extensions):
        raise InvalidInput(
            "checkpoint extension lines must be non-empty single lines", code="invalid_checkpoint"
        )
    name = name or cp.origin
    body = cp.body()
    sig = key.private_key.sign(body.encode())
    blob = base64.b64encode(note_key_hash(name, key.public_key) + sig).decode()
    return f"{body}\n{SIG_PREFIX}{name} {blob}\n"


def _fail(message: str) -> VerificationError:
    return VerificationError(message, code="bad_checkpoint")


def parse_checkpoint(note: str) -> tuple[Checkpoint, list[tuple[str, bytes]]]:
    """Split a signed note into its checkpoint and its (key name, signature blob) lines."""
    try:
        note.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which JSON can escape: no note is signed so
        raise _fail("checkpoint note is not UTF-8 text") from None
    body, sep, sigs = note.partition("\n\n")
    if not sep or not note.endswith("\n"):
        raise _fail("checkpoint note has no signature block")
    lines = body.split("\n")
    if len(lines) < 3:
        raise _fail("checkpoint body must have origin, tree size and root hash lines")
    origin, size_text, root_text = lines[:3]
    if not _DECIMAL.fullmatch(size_text) or len(size_text) > 19:
        raise _fail(f"checkpoint tree size {size_text!r} is not a decimal number")
    try:
        root = base64.b64decode(root_text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _fail("checkpoint root hash is not base64") from exc
    if len(root) != 32:
        raise _fail("checkpoint root hash is not 32 bytes")
    signed_at: datetime | None = None
    extensions: list[str] = []
    for line in lines[3:]:
        if not line:
            raise _fail("checkpoint extension lines must be non-empty")
        if line.startswith(TIMESTAMP_PREFIX):
            if signed_at is not None:
                raise _fail("checkpoint carries two timestamp lines")
            signed_at = _parse_timestamp(line[len(TIMESTAMP_PREFIX) :])
        else:
            extensions.append(line)
    signatures = []
    for line in sigs.rstrip("\n").split("\n"):
        if not line.startswith(SIG_PREFIX):
            raise _fail(f"malformed signature line {line[:40]!r}")
        name, _, blob = line[len(SIG_PREFIX) :].rpartition(" ")
        try:
            raw = base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _fail("signature line is not base64") from exc
        signatures.append((name, raw))
    checkpoint = Checkpoint(origin, int(size_text), root, signed_at, tuple(extensions))
    return checkpoint, signatures


def verify_checkpoint(
    note: str, public_key: Ed25519PublicKey, name: str | None = None
) -> Checkpoint:
    """Verify that ``public_key`` (under key name ``name``, default the origin) signed the note."""
    cp, signatures = parse_checkpoint(note)
    name = name or cp.origin
    want = note_key_hash(name, public_key)
    body = note.partition("\n\n")[0] + "\n"
    for sig_name, raw in signatures:
        if sig_name != name or raw[:4] != want:
            continue
        try:
            verify_signature(public_key, raw[4:], body.encode())
        except VerificationError as exc:
            raise VerificationError(
                "checkpoint signature does not verify under the log key",
                code="bad_checkpoint_signature",
            ) from exc
        return cp
    raise VerificationError(
        f"checkpoint carries no signature by the log key {name!r}",
        code="bad_checkpoint_signature",
    )
