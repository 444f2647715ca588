"""HTTP client for the ledger API, used by collectors, the CLI and the demo.

Errors are translated where they enter: an ``{"error": {...}}`` answer becomes the matching
:class:`ledger.errors.LedgerError` subclass with the server's code and message; a network
failure becomes :class:`ledger.errors.Pushback` (retryable): ``ledger_unreachable``, or
``ledger_too_slow`` for a request past the client's deadline.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from client.deadline import DeadlineTransport, within
from ledger.errors import (
    AuthenticationError,
    Conflict,
    InvalidInput,
    LedgerError,
    NotFound,
    PermissionDenied,
    Pushback,
    TooLarge,
)
from ledger.record_v2 import as_wire_item, wire_item
from ledger.records import is_request_id
from ledger.signing import Envelope, is_key_id
from ledger.small_file import read_small_text
from ledger.worker_url import parse_worker_url

# RFC 6750 b64token; a token file is a few dozen bytes.
_BEARER_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
_TOKEN_FILE_LIMIT = 64 * 1024
_SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?")  # Retry-After in seconds, ASCII

_BY_STATUS: dict[int, type[LedgerError]] = {
    400: InvalidInput,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: InvalidInput,
}


def check_token(token: str) -> str:
    """``token`` without surrounding whitespace (a token read from a file keeps its line's
    end), checked to be a bearer token. InvalidInput ``no_token`` names what is wrong and never
    quotes the token: sent as it is, a line break or NUL would have httpx refuse the header and
    quote it in the error, which a cache logs."""
    bare = token.strip() if isinstance(token, str) else ""
    if not _BEARER_TOKEN.fullmatch(bare):
        raise InvalidInput(
            "the token given is not a bearer token (it is not shown here): expected one line "
            "of letters, digits and - . _ ~ + / (as `ledger tokens create` writes)",
            code="no_token",
        )
    return bare


def read_token_file(path: Path) -> str:
    """The bearer token in ``path``: one line of the characters a bearer token may hold
    (RFC 6750), surrounding white space ignored."""
    try:
        token = read_small_text(path, "token file", limit=_TOKEN_FILE_LIMIT).strip()
    except InvalidInput as exc:
        raise InvalidInput(exc.message, code="no_token", details=exc.details) from exc
    if not token:
        raise InvalidInput(f"token file {path} is empty", code="no_token")
    if not _BEARER_TOKEN.fullmatch(token):
        raise InvalidInput(
            f"token file {path} does not hold a bearer token: expected one line of letters, "
            "digits and - . _ ~ + / (as `ledger tokens create` writes)",
            code="no_token",
        )
    return token


def segment(value: str) -> str:
    """``value`` as one path segment: every reserved character encoded, so an ID is never read
    as a path (``bad id/../x`` stays one segment); ``.``, ``..`` and empty ones are refused,
    as HTTP clients resolve them away."""
    if value in ("", ".", ".."):
        raise InvalidInput(f"{value!r} is not an ID the ledger can have", code="invalid_id")
    return quote(value, safe="")


def request_id_segment(value: str) -> str:
    """A request ID as a path segment; what cannot name a record is refused here, before a
    server could read it as another path."""
    if not is_request_id(value):
        raise InvalidInput(
            f"{value!r} is not a request ID (1-200 of A-Za-z0-9 . _ : -)",
            code="invalid_request_id",
        )
    return segment(value)


class LedgerClient:
    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        deadline: float | None = None,
    ) -> None:
        """``timeout`` bounds each network operation (connecting, one read, one write);
        ``deadline`` (seconds; None: none) bounds each request in all, however slowly the
        ledger or a proxy in front of it answers: past it the request is abandoned, its
        connection closed, and it fails with :class:`Pushback` ``ledger_too_slow``. A client
        with a deadline takes no proxy from the environment (``client.deadline``)."""
        headers = {"Authorization": f"Bearer {check_token(token)}"} if token else {}
        # http(s), a host, no userinfo (httpx would send it as Basic credentials beside the
        # token), no query or fragment: refused here with invalid_url, not at the first request
        # as "unreachable".
        parse_worker_url(base_url, "ledger URL")
        self.base_url = base_url.rstrip("/")
        self.deadline = deadline
        try:
            self._http = httpx.Client(
                base_url=self.base_url,
                headers=headers,
                timeout=timeout,
                transport=None if deadline is None else DeadlineTransport(),
            )
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise InvalidInput(
                f"{base_url!r} is not a usable ledger URL: {exc}", code="invalid_url"
            ) from exc

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        started = time.monotonic()
        try:
            with within(self.deadline):
                resp = self._http.request(method, path, **kw)
        except httpx.InvalidURL as exc:
            raise InvalidInput(
                f"{self.base_url!r} is not a usable ledger URL: {exc}", code="invalid_url"
            ) from exc
        except httpx.HTTPError as exc:
            late = self.deadline is not None and time.monotonic() - started >= self.deadline
            if late and isinstance(exc, httpx.TimeoutException):
                raise Pushback(
                    f"the ledger at {self.base_url} did not answer {method} {path} within "
                    f"{self.deadline:g} s; the request was abandoned",
                    code="ledger_too_slow",
                ) from exc
            raise Pushback(
                f"cannot reach the ledger at {self.base_url}: {exc}", code="ledger_unreachable"
            ) from exc
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                code, message, details = err["code"], err["message"], err.get("details")
            except (ValueError, KeyError, TypeError):
                code, message, details = f"http_{resp.status_code}", resp.text[:200], None
            text = f"{message} (HTTP {resp.status_code})"
            if resp.status_code == 503:
                retry = resp.headers.get("retry-after", "1")
                after = float(retry) if _SECONDS.fullmatch(retry) else 1.0  # not "²", not a date
                raise Pushback(text, code=code, details=details, retry_after=after)
            cls = _BY_STATUS.get(resp.status_code, LedgerError)
            raise cls(text, code=code, details=details)
        if resp.status_code >= 300:  # a redirect (not followed) is no answer of the API
            raise LedgerError(
                f"{self.base_url} answered HTTP {resp.status_code} ({path}), not the API's answer",
                code="unexpected_answer",
            )
        try:
            return resp.json()
        except ValueError as exc:  # a proxy's page, a truncated body, another service
            raise LedgerError(
                f"{self.base_url} answered HTTP {resp.status_code} with a body that is not JSON",
                code="unexpected_answer",
            ) from exc

    def register_key(
        self, name: str, role: str, public_key_pem: str, pools: list[str] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "role": role, "public_key": public_key_pem}
        if pools is not None:
            body["pools"] = pools
        result: dict[str, Any] = self._request("POST", "/v1/keys", json=body)
        return result

    def revoke_key(self, key_id: str, reason: str) -> dict[str, Any]:
        if not is_key_id(key_id):  # a path such as ../x would otherwise reach another route
            raise InvalidInput(
                f"{key_id!r} is not a key ID (ed25519: and 64 hex digits; `ledger keys list` "
                "shows them)",
                code="invalid_key_id",
            )
        result: dict[str, Any] = self._request(
            "POST", f"/v1/keys/{segment(key_id)}/revoke", json={"reason": reason}
        )
        return result

    def list_keys(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", "/v1/keys")["items"]
        return result

    def register_fingerprint(self, envelope: Envelope) -> dict[str, Any]:
        return self.post_fingerprint(envelope.canonical)

    def post_fingerprint(self, canonical: bytes) -> dict[str, Any]:
        result: dict[str, Any] = self._request(
            "POST", "/v1/fingerprints", content=canonical, headers=_JSON
        )
        return result

    def get_fingerprint(self, fingerprint_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/v1/fingerprints/{segment(fingerprint_id)}")
        return result

    def post_records(
        self, envelopes: list[Envelope], disclosures: list[list[str]] | None = None
    ) -> dict[str, Any]:
        """Post records (a v2 record with its disclosures, in the same order)."""
        lists = disclosures if disclosures is not None else [[] for _ in envelopes]
        return self.post_canonical(
            [wire_item(e.canonical, d) for e, d in zip(envelopes, lists, strict=True)]
        )

    def post_canonical(self, items: list[bytes]) -> dict[str, Any]:
        """Post a batch of spooled items unchanged: ``{"disclosures", "envelope"}`` objects
        (``ledger.record_v2.wire_item``), or bare canonical envelopes, which are wrapped."""
        body = b'{"records":[' + b",".join(as_wire_item(i) for i in items) + b"]}"
        result = self._request("POST", "/v1/records", content=body, headers=_JSON)
        # What the shipper deletes from its spool on: one result per record sent, each
        # created or a duplicate. Anything else (a proxy's {"status": "ok"}) acknowledges
        # nothing, and is retried.
        answered = result.get("results") if isinstance(result, dict) else None
        if (
            not isinstance(answered, list)
            or len(answered) != len(items)
            or not all(
                isinstance(r, dict) and r.get("status") in ("created", "duplicate")
                for r in answered
            )
        ):
            raise LedgerError(
                f"{self.base_url} answered the batch of {len(items)} records without a result "
                "for each",
                code="unexpected_answer",
            )
        ok: dict[str, Any] = result
        return ok

    def get_record(self, request_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request(
            "GET", f"/v1/records/{request_id_segment(request_id)}"
        )
        return result

    def evidence(self, request_id: str, redact: list[str] | None = None) -> dict[str, Any]:
        """A record's evidence bundle, leaving out the members ``redact`` names."""
        params = {"redact": ",".join(redact)} if redact else None
        result = self._request(
            "GET", f"/v1/records/{request_id_segment(request_id)}/evidence", params=params
        )
        proof = result.get("inclusion_proof") if isinstance(result, dict) else None
        if (
            not isinstance(proof, dict)
            or type(result.get("leaf_index")) is not int
            or type(proof.get("tree_size")) is not int
            or not isinstance(result.get("fingerprint", {}), dict)
        ):
            raise LedgerError(
                f"{self.base_url} answered something that is not an evidence bundle",
                code="unexpected_answer",
            )
        bundle: dict[str, Any] = result
        return bundle

    def erase(self, request_id: str, reason: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request(
            "POST",
            f"/v1/records/{request_id_segment(request_id)}/erasure",
            json={"reason": reason},
        )
        return result

    def erase_matching(self, flt: dict[str, Any], reason: str, *, dry_run: bool) -> dict[str, Any]:
        result: dict[str, Any] = self._request(
            "POST",
            "/v1/erasures",
            json={"filter": flt, "reason": reason, "dry_run": dry_run},
        )
        return result

    def sign_checkpoint(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", "/v1/log/checkpoint")
        return result

    def token_self(self) -> dict[str, Any]:
        """What the ledger makes of this client's token: its ID, name, scopes and expiry."""
        result: dict[str, Any] = self._request("GET", "/v1/tokens/self")
        return result

    def log_key(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", "/v1/log/key")
        return result

    def heartbeat(self, envelope: Envelope) -> dict[str, Any]:
        """Register the worker or keep it live: a ``worker_heartbeat`` signed by its key."""
        result: dict[str, Any] = self._request(
            "POST", "/v1/workers", content=envelope.canonical, headers=_JSON
        )
        return result

    def pools(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._request("GET", "/v1/pools")["items"]
        return result

    def replay(self, request_id: str, pool: str | None, force: bool) -> dict[str, Any]:
        payload = {"request_id": request_id, "pool": pool, "force": force}
        result: dict[str, Any] = self._request("POST", "/v1/replays", json=payload)
        return result

    def get_replay(self, replay_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/v1/replays/{segment(replay_id)}")
        return result

    def certify(self, payload: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", "/v1/certifications", json=payload)
        return result

    def certification(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/v1/certifications/{segment(job_id)}")
        return result

    def cache_key(self, payload: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._request("POST", "/v1/cache/key", json=payload)
        return result

    def cache_lookup(self, key: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", f"/v1/cache/{segment(key)}")
        return result

    def search_records(self, **params: Any) -> dict[str, Any]:
        clean = {k: v for k, v in params.items() if v is not None}
        result: dict[str, Any] = self._request("GET", "/v1/records", params=clean)
        return result


_JSON = {"content-type": "application/json"}
