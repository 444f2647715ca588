"""The ledger's exception tree.

Every error raised by the core roots at :class:`LedgerError`, which carries a stable
machine-readable ``code`` and a human message. The HTTP layer maps the classes to status
codes in one place (``api/errors.py``); the CLI prints ``message`` and exits non-zero.

    LedgerError
    ├── InvalidInput          the request or document is malformed or violates the schema
    │   └── TooLarge          a body or batch exceeds a configured limit
    ├── VerificationError     a signature, key or proof does not verify (possible tampering)
    ├── AuthenticationError   no credentials, or credentials that are not valid
    ├── PermissionDenied      valid credentials without the needed scope
    ├── NotFound              the named object does not exist
    ├── Conflict              the request contradicts what the ledger already holds
    ├── Gone                  the content asked for was erased (a logged erasure event)
    ├── Pushback              the ledger is overloaded; retry later
    ├── Unreachable           a service the caller needs (an engine) does not answer
    ├── StorageError          the database failed (translated from SQLAlchemy/psycopg)
    └── IndexMismatch         an index row disagrees with the log entry it points to (500:
                              the database was edited; run ``ledger audit``)
"""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    """Root of every error the ledger raises on purpose."""

    code: str = "ledger_error"

    def __init__(
        self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details: dict[str, Any] = dict(details or {})

    def with_details(self, **details: Any) -> LedgerError:
        """Add context (an item index, a field) and return self, for re-raising."""
        self.details.update(details)
        return self

    def to_dict(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            err["details"] = self.details
        return err


class InvalidInput(LedgerError):
    code = "invalid_input"


class TooLarge(InvalidInput):
    code = "too_large"


class VerificationError(LedgerError):
    code = "verification_failed"


class AuthenticationError(LedgerError):
    code = "unauthenticated"


class PermissionDenied(LedgerError):
    code = "forbidden"


class NotFound(LedgerError):
    code = "not_found"


class Conflict(LedgerError):
    code = "conflict"


class Gone(LedgerError):
    """The content asked for existed and was erased by a logged erasure event."""

    code = "content_erased"


class Pushback(LedgerError):
    code = "pushback"

    def __init__(self, message: str, *, retry_after: float = 1.0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class Unreachable(LedgerError):
    """A service the caller depends on (an inference engine, say) cannot be reached."""

    code = "unreachable"


class StorageError(LedgerError):
    code = "storage_error"


class IndexMismatch(LedgerError):
    """An index row (records, cache keys, fingerprints) names a log entry that does not hold
    what the row says: never answered, always reported (the HTTP layer answers 500)."""

    code = "index_mismatch"
