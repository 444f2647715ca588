"""Ed25519 keys and signed envelopes.

An envelope is ``{"kind", "body", "signature": {"alg": "ed25519", "key_id", "sig"}}``; the
signature covers ``canonicalize(body)``. A key's ID is ``ed25519:`` + hex SHA-256 of its raw
32-byte public key, so a verifier never guesses what produced it. Verification raises
:class:`VerificationError`; it never returns a boolean.

Keys are generated, stored and used for signing with ``cryptography`` (OpenSSL). Signatures are
verified by libsodium (PyNaCl), in one place (:func:`verify_signature`): on a 23 KiB record it
verifies in about 130 µs where OpenSSL takes 175 µs (docs/PERFORMANCE.md). A signature made
by a real key verifies under both; libsodium also refuses small-order and non-canonical points,
which OpenSSL accepts (tests/ledger/test_signing.py).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nacl.bindings
import nacl.exceptions
import orjson
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ledger.canonical import canonicalize, sha256_digest
from ledger.errors import InvalidInput, VerificationError
from ledger.lazy import lazy
from ledger.secretfile import PUBLIC_MODE, stage_secret_file
from ledger.small_file import read_small_file

ALG = "ed25519"
KEY_ID_PREFIX = "ed25519:"
SIGNATURE_SIZE = 64
# What a registered key's role may sign (the log key signs key events and checkpoints).
SIGNABLE_KINDS: dict[str, tuple[str, ...]] = {
    "collector": ("fingerprint", "inference_record", "replay_output", "worker_heartbeat"),
    "replayer": ("replay_verdict",),
    # The ledger's own key signs key events (checked apart), replay verdicts, certificates.
    "log": ("replay_verdict", "pool_certificate", "erasure", "legal_hold", "hold_release"),
}


_KEY_ID = re.compile(r"ed25519:[0-9a-f]{64}")


def is_key_id(value: str) -> bool:
    """Whether ``value`` has a key ID's form: ``ed25519:`` and 64 lower-case hex digits."""
    return isinstance(value, str) and _KEY_ID.fullmatch(value) is not None


def key_id_for(public_key: Ed25519PublicKey) -> str:
    return key_id_of(public_key_raw(public_key))


def key_id_of(raw: bytes) -> str:
    """The key ID of a raw 32-byte Ed25519 public key."""
    return KEY_ID_PREFIX + hashlib.sha256(raw).hexdigest()


def public_key_raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes_raw()


def public_key_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def load_public_key(text: str | bytes) -> Ed25519PublicKey:
    """Load an Ed25519 public key from PEM or from ``ed25519:<base64 raw 32 bytes>``.

    Refuses (InvalidInput) what is not a canonical encoding of a curve point
    (``invalid_public_key``) and the small-order points (``weak_public_key``, see
    :func:`check_public_key`).
    """
    try:
        data = text.encode() if isinstance(text, str) else text
        stripped = data.strip()
        if stripped.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(stripped)
        else:
            raw = stripped[len(KEY_ID_PREFIX) :] if stripped.startswith(b"ed25519:") else stripped
            key = Ed25519PublicKey.from_public_bytes(base64.b64decode(raw, validate=True))
    except (ValueError, TypeError, binascii.Error, UnsupportedAlgorithm) as exc:
        raise InvalidInput(f"not an Ed25519 public key: {exc}", code="invalid_public_key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise InvalidInput("public key is not Ed25519", code="invalid_public_key")
    check_public_key(public_key_raw(key))
    return key


# Edwards25519 (RFC 8032, 5.1): -x^2 + y^2 = 1 + d x^2 y^2 over GF(p).
_P = 2**255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z


def _point_add(a: _Point, b: _Point) -> _Point:
    """RFC 8032's complete addition formula (also right for doubling)."""
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa, bb = (y1 - x1) * (y2 - x2) % _P, (y1 + x1) * (y2 + x2) % _P
    cc, dd = 2 * t1 * t2 * _D % _P, 2 * z1 * z2 % _P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def check_public_key(raw: bytes) -> None:
    """Refuse a raw Ed25519 public key that no honest key generator produces.

    - ``weak_public_key``: a point of small order, i.e. [8]P is the identity: the 8 points of
      the torsion subgroup (the all-zero encoding among them), in any encoding, canonical or
      not (y >= p, or the sign bit set on x = 0). A signature under such a key says nothing
      about who made it: anyone can produce one that some verifiers accept.
    - ``invalid_public_key``: 32 bytes that encode no curve point, or a non-canonical encoding
      (y >= p, or x = 0 with the sign bit set; RFC 8032, 5.1.3) of a point.
    """
    if len(raw) != 32:
        raise InvalidInput(f"an Ed25519 key is 32 bytes, not {len(raw)}", code="invalid_public_key")
    n = int.from_bytes(raw, "little")
    sign, y_bits = n >> 255, n & ((1 << 255) - 1)
    y = y_bits % _P
    # RFC 8032, 5.1.3: x^2 = (y^2 - 1) / (d y^2 + 1)
    u, v = (y * y - 1) % _P, (_D * y * y + 1) % _P
    x = (u * pow(v, 3, _P)) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P) % _P
    if (v * x * x - u) % _P:
        x = x * _SQRT_M1 % _P
    if (v * x * x - u) % _P:
        raise InvalidInput("the public key is not a point on Ed25519", code="invalid_public_key")
    point = (x, y, 1, x * y % _P)  # the order of P does not depend on the sign of x
    for _ in range(3):
        point = _point_add(point, point)
    if point[0] == 0 and point[1] == point[2]:
        raise InvalidInput(
            "the public key is a small-order Ed25519 point (all-zero or another of the 8 "
            "torsion points): it binds no signer",
            code="weak_public_key",
        )
    if y_bits >= _P or (x == 0 and sign):
        raise InvalidInput(
            "the public key is a non-canonical encoding of its point", code="invalid_public_key"
        )


@dataclass(frozen=True)
class VerifyingKey:
    """A public key as verification uses it: its raw bytes and key ID, derived once.

    ``cryptography``'s key objects are unhashable and derive both on every call (about 2 µs a
    time); a verifier that meets the same key thousands of times (bundles of one export, a
    registry's rows) holds this instead.
    """

    raw: bytes
    key_id: str

    @classmethod
    def of(cls, public_key: Ed25519PublicKey | VerifyingKey) -> VerifyingKey:
        if isinstance(public_key, VerifyingKey):
            return public_key
        raw = public_key_raw(public_key)
        return cls(raw, key_id_of(raw))


@functools.lru_cache(maxsize=1024)
def cached_verifying_key(text: str) -> VerifyingKey:
    """:func:`load_public_key` for a key text met again and again (registry rows, bundles of
    one export): parsed once per process. Failures raise and are not cached."""
    return VerifyingKey.of(load_public_key(text))


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key with its derived key ID."""

    private_key: Ed25519PrivateKey
    key_id: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_id", key_id_for(self.private_key.public_key()))

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, data: bytes) -> SigningKey:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise InvalidInput(f"not a PEM private key: {exc}", code="invalid_private_key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise InvalidInput("private key is not Ed25519", code="invalid_private_key")
        return cls(key)

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        return cls.from_pem(read_small_file(path, "key"))

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    def private_pem(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(
        self, private_path: Path, public_path: Path | None = None, *, overwrite: bool = False
    ) -> None:
        """Write the private key (mode 0600) and optionally the public key (0644), each
        atomically and never through a symlink (``ledger.secretfile``). A name already taken
        is refused (``SecretFileExists``) unless ``overwrite``; both names are checked before
        either file appears."""
        staged = [stage_secret_file(private_path, self.private_pem(), overwrite=overwrite)]
        try:
            if public_path is not None:
                pem = public_key_pem(self.public_key)
                staged.append(
                    stage_secret_file(public_path, pem, overwrite=overwrite, mode=PUBLIC_MODE)
                )
            for item in staged:
                item.publish()
        except BaseException:
            for item in staged:
                item.discard()
            raise

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self.private_key.sign(data)).decode("ascii")


# the envelope's canonical bytes between "kind" and "key_id" (JCS member order)
_SIGNATURE_ALG = b',"signature":{"alg":' + canonicalize(ALG) + b',"key_id":'


@dataclass(frozen=True)
class Envelope:
    """A signed document. ``body_bytes`` and ``canonical`` are derived, never set by callers."""

    kind: str
    body: dict[str, Any]
    key_id: str
    sig: str
    body_bytes: bytes = field(init=False, repr=False)
    canonical: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        body_bytes = canonicalize(self.body)
        object.__setattr__(self, "body_bytes", body_bytes)
        # JCS sorts members ("body" < "kind" < "signature") and nests canonical forms, so
        # the envelope's canonical bytes are assembled around the body's without re-encoding it.
        canonical = b"".join(
            (
                b'{"body":',
                body_bytes,
                b',"kind":',
                canonicalize(self.kind),
                _SIGNATURE_ALG,
                canonicalize(self.key_id),
                b',"sig":',
                canonicalize(self.sig),
                b"}}",
            )
        )
        object.__setattr__(self, "canonical", canonical)

    @property
    def signature(self) -> dict[str, str]:
        return {"alg": ALG, "key_id": self.key_id, "sig": self.sig}

    @lazy
    def body_digest(self) -> str:
        """``sha256:`` digest of the canonical body: the content identity of the document
        (computed on first use, once: an envelope parsed once is compared in many bundles)."""
        return sha256_digest(self.body_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "body": self.body, "signature": self.signature}

    @classmethod
    def from_bytes(cls, data: bytes) -> Envelope:
        """Parse stored envelope bytes; raises ValueError for bytes that are not JSON (or
        nest too deeply to parse), and InvalidInput as :meth:`from_dict` does.

        ``orjson`` parses the common case, and whatever it refuses (lone surrogates, ``NaN``,
        deep nesting, other encodings) is parsed by ``json``, so the values are those
        ``json.loads`` gives, with one exception: an integer literal beyond 64 bits, which
        orjson reads as a float. Such a text is never an envelope's canonical form (canonical
        integers lie within 2**53), and its canonical bytes and body digest differ from the
        stored ones, which every caller compares or verifies.
        """
        return cls.from_dict(_read_json(data))

    def body_read_back(self) -> dict[str, Any]:
        """The body as its canonical bytes read back: the values every reader of the logged
        envelope sees (the audit, ``ledger verify``, the browser's verifier), where the body
        as sent may differ in type only (``7.0`` and ``-0.0`` are written ``7`` and ``0``)."""
        try:
            body: dict[str, Any] = _read_json(self.body_bytes)
        except ValueError as exc:  # deeper than the parsers go
            raise InvalidInput(str(exc), code="schema_violation") from exc
        return body

    @classmethod
    def from_dict(cls, data: Any) -> Envelope:
        """Parse the outer envelope shape; raises InvalidInput with the exact problem."""
        if not isinstance(data, dict):
            raise InvalidInput("envelope must be a JSON object", code="schema_violation")
        extra = set(data) - {"kind", "body", "signature"}
        if extra:
            raise InvalidInput(
                f"envelope has unknown members: {sorted(extra)}", code="schema_violation"
            )
        kind, body, sig = data.get("kind"), data.get("body"), data.get("signature")
        if not isinstance(kind, str) or not kind:
            raise InvalidInput("envelope.kind must be a non-empty string", code="schema_violation")
        if not isinstance(body, dict):
            raise InvalidInput("envelope.body must be a JSON object", code="schema_violation")
        if not isinstance(sig, dict) or set(sig) != {"alg", "key_id", "sig"}:
            raise InvalidInput(
                'envelope.signature must be {"alg", "key_id", "sig"}', code="schema_violation"
            )
        if sig["alg"] != ALG:
            raise InvalidInput(
                f"unsupported signature algorithm {sig['alg']!r}; only {ALG!r}",
                code="unsupported_algorithm",
            )
        if not isinstance(sig["key_id"], str) or not isinstance(sig["sig"], str):
            raise InvalidInput("signature key_id and sig must be strings", code="schema_violation")
        return cls(kind=kind, body=body, key_id=sig["key_id"], sig=sig["sig"])


def _read_json(data: bytes) -> Any:
    """``orjson`` for the common case; what it refuses (lone surrogates, ``NaN``, deep
    nesting, other encodings) is parsed by ``json``. ValueError for what neither reads."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            return json.loads(data)
        except RecursionError as exc:
            raise ValueError("the envelope is nested too deeply to parse") from exc


def sign_envelope(kind: str, body: dict[str, Any], key: SigningKey) -> Envelope:
    """Sign ``canonicalize(body)`` and return the envelope."""
    return Envelope(kind=kind, body=body, key_id=key.key_id, sig=key.sign(canonicalize(body)))


def verify_envelope(envelope: Envelope, public_key: Ed25519PublicKey | VerifyingKey) -> None:
    """Raise VerificationError unless the envelope's signature verifies under the key."""
    key = VerifyingKey.of(public_key)
    if key.key_id != envelope.key_id:
        raise VerificationError(
            "signature key_id does not match the verifying key", code="key_mismatch"
        )
    try:
        sig = binascii.a2b_base64(envelope.sig, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise VerificationError("signature is not valid base64", code="bad_signature") from exc
    try:
        verify_signature(key, sig, envelope.body_bytes)
    except VerificationError as exc:
        raise VerificationError(
            f"signature does not verify under key {envelope.key_id}", code="bad_signature"
        ) from exc


def verify_signature(
    public_key: Ed25519PublicKey | VerifyingKey, signature: bytes, message: bytes
) -> None:
    """Raise VerificationError unless ``signature`` is an Ed25519 signature of ``message``."""
    if len(signature) != SIGNATURE_SIZE:  # combined mode would read the rest from the message
        raise VerificationError(
            f"a signature is {SIGNATURE_SIZE} bytes, not {len(signature)}", code="bad_signature"
        )
    try:
        nacl.bindings.crypto_sign_open(signature + message, VerifyingKey.of(public_key).raw)
    except (nacl.exceptions.CryptoError, ValueError, TypeError) as exc:
        raise VerificationError("the signature does not verify", code="bad_signature") from exc
