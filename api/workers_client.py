"""Sending a signed replay order to a worker's collector and checking what comes back.

Used by replays and by certification probes. The order is signed by the log key (the
collector checks it against the ledger's public key); the answer must be a replay output
signed by the collector key the worker is bound to (the key that registered it), for this
worker, order and request. Network failures and refusals become
:class:`ledger.errors.Unreachable` (the worker did not give an answer) here, where they enter.

Every connection to a worker goes through :class:`GuardedBackend`: it resolves the host,
checks every address against the worker URL policy (``ledger.worker_url``, setting
``LEDGER_WORKER_NETWORKS``) and connects to a checked address, so a name that resolves
elsewhere than at registration is caught when the order is sent. The client uses no HTTP
proxy (a proxy would make the policy check the proxy, not the worker) and follows no redirect.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpcore
import httpx
from starlette.concurrency import run_in_threadpool

from api.settings import Settings
from ledger.errors import LedgerError, Unreachable, VerificationError
from ledger.replay import ORDER_KIND, OUTPUT_KIND, build_order, check_output
from ledger.signing import Envelope, SigningKey, sign_envelope
from ledger.storage import keystore
from ledger.storage.database import Database
from ledger.storage.workers import WorkerInfo
from ledger.worker_url import UrlPolicy, ip_literal, parse_worker_url

REPLAY_PATH = "/ledger/v1/replay"
_ERROR_CODE = re.compile(r"[a-z0-9_]{1,64}")
logger = logging.getLogger("ledger.api")


def new_replay_id() -> str:
    return "rpl-" + uuid.uuid4().hex


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """A network backend that connects only to addresses the worker URL policy allows."""

    def __init__(self, policy: Callable[[], UrlPolicy]) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        name = host.strip("[]")
        literal = ip_literal(name.split("%", 1)[0])
        if literal is not None:
            addresses = [name]
        else:
            try:
                infos = await anyio.getaddrinfo(name, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise httpcore.ConnectError(f"{name} does not resolve: {exc}") from exc
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        # InvalidInput url_not_allowed: not an httpx error, so it reaches the caller as it is.
        self._policy().check_addresses(f"{host}:{port}", addresses)
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over :class:`GuardedBackend` (httpx takes no backend argument, so
    the connection pool it builds is replaced by one with the same settings and the backend;
    tests/api/test_worker_binding.py fails if the guard is ever bypassed)."""

    def __init__(self, policy: Callable[[], UrlPolicy], limits: httpx.Limits) -> None:
        super().__init__(limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(policy),
        )


def new_client(settings: Settings) -> httpx.AsyncClient:
    """The client for replay orders and certification probes."""
    # Certification waves send up to 256 probes at once: the pool must not queue them.
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    return httpx.AsyncClient(
        timeout=httpx.Timeout(settings.replay_timeout, connect=10.0),
        # An explicit transport: httpx then uses no proxy from the environment.
        transport=GuardedTransport(lambda: UrlPolicy.parse(settings.worker_networks), limits),
        follow_redirects=False,
    )


@dataclass(frozen=True)
class WorkerAnswer:
    output: dict[str, Any]  # the signed replay output envelope, as a dict
    body: dict[str, Any]
    key_id: str  # the key that signed it: the worker's


async def run_order(
    http: httpx.AsyncClient,
    db: Database,
    log_key: SigningKey,
    worker: WorkerInfo,
    *,
    replay_id: str,
    request_id: str,
    endpoint: str,
    request_raw: bytes,
    deadline: float,
    max_bytes: int,
) -> WorkerAnswer:
    """Have ``worker`` run ``request_raw`` once, unrecorded; return its verified output."""
    if not worker.live:
        raise Unreachable(
            f"worker {worker.worker_id} is not live ({worker.problem or 'no recent heartbeat'})",
            code="worker_not_live",
        )
    parse_worker_url(worker.url)
    order = sign_envelope(
        ORDER_KIND,
        build_order(
            replay_id=replay_id,
            request_id=request_id,
            worker_id=worker.worker_id,
            endpoint=endpoint,
            request_raw=base64.b64encode(request_raw).decode("ascii"),
        ),
        log_key,
    )
    status, raw = await _post(http, worker, order.canonical, deadline, max_bytes)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if status != 200 or not isinstance(data, dict):
        # The worker's own words stay in the server's log: an engine's error may quote the
        # request, and a verdict's reason is a signed leaf no erasure removes. The verdict
        # names the status and the worker's error code only.
        error = data.get("error") if isinstance(data, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        named = f", code {code}" if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else ""
        logger.warning(
            "worker %s refused replay %s (HTTP %s): %.300r",
            worker.worker_id,
            replay_id,
            status,
            raw[:300],
        )
        raise Unreachable(
            f"worker {worker.worker_id} refused the replay (HTTP {status}{named}; its message "
            "is in the ledger's log)",
            code="worker_error",
            details={"status": status},
        )
    try:
        envelope = Envelope.from_dict(data)
        await run_in_threadpool(_verify, db, worker, envelope, replay_id, request_id)
    except LedgerError as exc:
        # What the checks say may quote the answer (its member names, its kind, its values:
        # a prompt, say), and a verdict's reason is a signed leaf no erasure removes: the
        # verdict says what was wrong in the ledger's words, the details go to the log.
        logger.warning(
            "worker %s answered replay %s with an output the ledger refuses (%s): %.300s",
            worker.worker_id,
            replay_id,
            exc.code,
            exc.message,
        )
        raise VerificationError(
            f"{_REFUSED.get(exc.code, 'the worker answered no valid replay output')} "
            "(the details are in the ledger's log)",
            code=exc.code,
        ) from None
    return WorkerAnswer(json.loads(envelope.canonical), envelope.body, envelope.key_id)


# A refused answer's reason, by the check that refused it, in the ledger's words only.
_REFUSED = {
    "wrong_signer": "the replay output is not signed by the key the worker is bound to",
    "wrong_order": "the replay output answers another order, request or worker",
    "invalid_replay_document": "the worker's answer is not a well-formed replay output",
    "schema_violation": "the worker's answer is not a signed document",
    "not_canonicalizable": "the worker's answer holds a value JSON cannot carry exactly",
    "bad_signature": "the replay output's signature does not verify",
    "unsupported_algorithm": "the replay output is not signed with Ed25519",
    "revoked_key": "the replay output is signed by a revoked key",
    "unknown_key": "the replay output is signed by a key the ledger does not hold",
    "key_role_not_allowed": "the replay output is signed by a key whose role may not sign it",
    "wrong_kind": "the worker answered a document of another kind, not a replay output",
}


async def _post(
    http: httpx.AsyncClient, worker: WorkerInfo, order: bytes, deadline: float, max_bytes: int
) -> tuple[int, bytes]:
    """POST the order and read the answer, within ``deadline`` seconds in all (a worker that
    trickles its answer is cut off, not waited for byte by byte) and ``max_bytes``."""
    try:
        with anyio.fail_after(deadline):
            async with http.stream(
                "POST",
                worker.url.rstrip("/") + REPLAY_PATH,
                content=order,
                headers={"content-type": "application/json"},
            ) as response:
                raw = bytearray()
                async for chunk in response.aiter_bytes():
                    raw += chunk
                    if len(raw) > max_bytes:
                        raise Unreachable(
                            f"worker {worker.worker_id} answered more than {max_bytes} bytes",
                            code="worker_error",
                            details={"status": response.status_code},
                        )
                return response.status_code, bytes(raw)
    except TimeoutError as exc:
        raise Unreachable(
            f"worker {worker.worker_id} did not answer within {deadline:g} s",
            code="worker_unreachable",
        ) from exc
    except httpx.HTTPError as exc:
        logger.warning("worker %s at %s does not answer: %r", worker.worker_id, worker.url, exc)
        raise Unreachable(
            f"worker {worker.worker_id} does not answer ({type(exc).__name__}; the details "
            "are in the ledger's log)",
            code="worker_unreachable",
        ) from exc


def _verify(
    db: Database, worker: WorkerInfo, env: Envelope, replay_id: str, request_id: str
) -> None:
    """The answer counts only as a replay output signed by the key bound to ``worker``
    (registered, unrevoked, role collector), for this worker, order and request."""
    if env.kind != OUTPUT_KIND:
        raise VerificationError(_REFUSED["wrong_kind"], code="wrong_kind")
    if env.key_id != worker.key_id:
        raise VerificationError(
            f"replay output signed by {env.key_id}, not by the key {worker.key_id} that "
            f"worker {worker.worker_id} is bound to",
            code="wrong_signer",
        )
    with db.read() as s:
        keystore.check_signer(env, keystore.load_keys(s, [env.key_id]))
    body = check_output(env.body)
    if body["replay_id"] != replay_id or body["request_id"] != request_id:
        raise VerificationError("the replay output answers another order", code="wrong_order")
    if body["worker_id"] != worker.worker_id:
        raise VerificationError(
            f"the replay output names worker {body['worker_id']!r}, not {worker.worker_id!r}",
            code="wrong_order",
        )
