"""Console sessions: an API token exchanged for a signed, expiring session cookie, and CSRF.

Signing in posts an API token once; the console checks it as the API does and answers with a
cookie that names the token by its display ID, never the secret::

    ledger_session = <token_id>.<expires unix seconds>.<nonce>.<mac>

``mac`` is HMAC-SHA256 over the first three fields under a key derived (HKDF-SHA256, its own
``info``) from the ledger's log key, so every worker process of one ledger accepts the cookies
of the others and nothing else can mint one. The cookie is HttpOnly, SameSite=Strict, Secure
when the console is reached over HTTPS, and expires after ``LEDGER_UI_SESSION_SECONDS``. Each
page view looks the token up again: revoking or expiring the token ends its sessions at once.

Every state-changing form carries a CSRF token, HMAC of the session's nonce under the same key
(a synchronizer token that needs no storage); the sign-in form, before any session exists,
pairs a short-lived ``ledger_signin`` cookie with its HMAC the same way. POSTs whose
``Origin`` names another site are refused as well.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ledger.errors import AuthenticationError, PermissionDenied
from ledger.signing import SigningKey

_DIGITS = re.compile(r"[0-9]{1,20}")  # ASCII only: str.isdigit takes '²', which int() refuses

SESSION_COOKIE = "ledger_session"
SIGNIN_COOKIE = "ledger_signin"
SIGNIN_SECONDS = 900  # how long a sign-in form stays valid
_INFO = b"inference-ledger console session v1"


def _same(sent: str, expected: str) -> bool:
    """A constant-time comparison of a value a client sent with the expected one. Compared as
    UTF-8 bytes: ``hmac.compare_digest`` raises TypeError on non-ASCII text, which a client
    chooses (a cookie or form field with an "é" in it)."""
    return hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), expected.encode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def session_key(log_key: SigningKey) -> bytes:
    """The console's MAC key: HKDF of the log key's private bytes, for this use only."""
    raw = log_key.private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(raw)


@dataclass(frozen=True)
class Session:
    token_id: str
    expires: int  # unix seconds
    nonce: str


class Sessions:
    """Issues and checks session cookies and CSRF tokens under one key."""

    def __init__(self, key: bytes, lifetime: float) -> None:
        self._key = key
        self.lifetime = int(lifetime)

    def _mac(self, purpose: str, text: str) -> str:
        data = f"{purpose}\n{text}".encode()
        return _b64(hmac.new(self._key, data, hashlib.sha256).digest())

    def issue(self, token_id: str, now: float | None = None) -> tuple[str, Session]:
        expires = int(now if now is not None else time.time()) + self.lifetime
        session = Session(token_id, expires, secrets.token_urlsafe(16))
        text = f"{token_id}.{expires}.{session.nonce}"
        return f"{text}.{self._mac('session', text)}", session

    def check(self, cookie: str | None, now: float | None = None) -> Session:
        """The session a cookie holds; AuthenticationError when missing, forged or expired."""
        if not cookie:
            raise AuthenticationError("sign in to use the console", code="missing_session")
        parts = cookie.split(".")
        if len(parts) != 4 or not _DIGITS.fullmatch(parts[1]) or len(cookie) > 300:
            raise AuthenticationError("the session cookie is malformed", code="invalid_session")
        token_id, expires, nonce, mac = parts
        if not _same(mac, self._mac("session", f"{token_id}.{expires}.{nonce}")):
            raise AuthenticationError("the session cookie is not valid", code="invalid_session")
        if int(expires) <= int(now if now is not None else time.time()):
            raise AuthenticationError("the session has expired", code="session_expired")
        return Session(token_id, int(expires), nonce)

    def csrf(self, session: Session) -> str:
        return self._mac("csrf", session.nonce)

    def check_csrf(self, session: Session, sent: str | None) -> None:
        if not sent or not _same(sent, self.csrf(session)):
            raise PermissionDenied(
                "the form's CSRF token is missing or wrong; reload the page and try again",
                code="csrf_failed",
            )

    def signin_pair(self) -> tuple[str, str]:
        """A sign-in nonce (for the ``ledger_signin`` cookie) and its form token."""
        nonce = f"{int(time.time()) + SIGNIN_SECONDS}.{secrets.token_urlsafe(16)}"
        return nonce, self._mac("signin", nonce)

    def check_signin(self, cookie: str | None, sent: str | None) -> None:
        expires, _, _ = (cookie or "").partition(".")
        if (
            not cookie
            or not sent
            or not _DIGITS.fullmatch(expires)
            or int(expires) <= time.time()
            or not _same(sent, self._mac("signin", cookie))
        ):
            raise PermissionDenied(
                "the sign-in form expired or did not come from this console; reload it and "
                "try again",
                code="csrf_failed",
            )
