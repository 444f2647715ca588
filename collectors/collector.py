"""The collector beside one vLLM worker: snapshot, spool, shipper, engine watcher, proxy.

On start it snapshots the environment and queues the signed fingerprint for registration
(the shipper registers fingerprints before the records made under them). A watcher polls the
engine; when the engine comes back after being away, or its process changed, it snapshots
again and, if the fingerprint changed, records from then on carry the new ID.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from client.ledger_client import LedgerClient
from collectors.artifacts import check_model_dir
from collectors.digest_cache import DigestCache
from collectors.engine import CUSTOM_FINGERPRINT, engine_port
from collectors.metrics import CollectorMetrics
from collectors.procinfo import ProcessUnreadable, find_pid_by_port
from collectors.shipper import DEADLINE, LINGER, Shipper
from collectors.snapshot import Snapshot, is_local, take_snapshot
from collectors.spool import Spool
from collectors.tokens import TokenRenderer
from collectors.worker_state import WorkerState
from ledger.errors import AuthenticationError, LedgerError, NotFound, PermissionDenied, Pushback
from ledger.heartbeat import HEARTBEAT_KIND, build_heartbeat, check_name
from ledger.signing import Envelope, SigningKey, load_public_key, sign_envelope
from ledger.tokens import Principal
from ledger.worker_url import parse_worker_url

logger = logging.getLogger("ledger.collector")


@dataclass(frozen=True)
class CollectorConfig:
    engine_url: str
    ledger_url: str
    ledger_token: str
    key: SigningKey
    pool: str
    worker_id: str
    model_dir: Path
    spool_path: Path
    default_tier: int = 0
    engine_python: str | None = None
    engine_pid: int | None = None
    digest_cache: Path | None = None
    watch_interval: float = 2.0
    # Where the ledger reaches this collector (for replays); None: the worker never registers.
    advertise_url: str | None = None
    heartbeat_interval: float = 5.0
    # Seconds the shipper waits for more records before posting a partial batch.
    ship_linger: float = LINGER
    # Seconds a request to the ledger may take in all before it is abandoned and retried.
    ship_deadline: float = DEADLINE
    # The ledger's log key, pinned; None: fetched from the ledger (GET /v1/log/key) at start.
    log_public_key: Ed25519PublicKey | None = None
    # Delete spooled records and dead letters older than this (LEDGER_CONTENT_RETENTION_DAYS).
    content_retention_days: int | None = None


def expected_system_fingerprint(snapshot: Snapshot) -> str | None:
    """What the engine's responses should carry: the fingerprint ID when the engine runs with
    ``--fingerprint-mode custom`` (operators set ``--fingerprint-value`` to it), else what it
    answered when it was fingerprinted; None when that is unknown."""
    answered = snapshot.body["engine"].get("system_fingerprint")
    if answered == CUSTOM_FINGERPRINT:
        return snapshot.fingerprint_id
    return answered if isinstance(answered, str) else None


WRITE_SCOPE = "records:write"
# The ledger's own answers to a token it refuses (a proxy's 401 in front of it is not one).
_REFUSED = ("invalid_token", "token_expired", "missing_token")


def check_token(config: CollectorConfig) -> None:
    """Refuse to start with a token the ledger refuses, or one that may not write records
    (``GET /v1/tokens/self``, within 5 s). A ledger that cannot be reached now is no reason
    not to start: records wait in the spool, and the token is used at the first heartbeat.
    Nor is an answer that is not the ledger's (a proxy's 401, an older ledger's 404): that is
    a warning, and the token is not checked."""
    with LedgerClient(config.ledger_url, config.ledger_token, timeout=5, deadline=5) as client:
        try:
            token = client.token_self()
        except AuthenticationError as exc:
            if exc.code not in _REFUSED:
                logger.warning("the token was not checked at start: %s", exc.message)
                return
            raise AuthenticationError(
                f"the ledger at {client.base_url} refuses this collector's token: {exc.message}",
                code=exc.code,
                details=exc.details,
            ) from exc
        except NotFound:
            logger.warning(
                "the token was not checked at start: %s answers 404 to GET /v1/tokens/self "
                "(a ledger before that route, or a wrong path in the URL)",
                client.base_url,
            )
            return
        except Pushback as exc:  # away or too slow now: the heartbeat says so at once
            logger.info("the token was not checked at start: %s", exc.message)
            return
        except LedgerError as exc:
            logger.warning("the token was not checked at start: %s", exc.message)
            return
    scopes = token.get("scopes") if isinstance(token, dict) else None
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        logger.warning("the token was not checked at start: the answer names no scopes")
        return
    if not Principal("", "", tuple(scopes)).allows(WRITE_SCOPE):
        raise PermissionDenied(
            f"this collector's token ({token.get('name')!r}) lacks the {WRITE_SCOPE!r} scope "
            f"(it has {scopes}): the ledger would refuse every record it ships",
            code="insufficient_scope",
            details={"required": WRITE_SCOPE},
        )


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


class Collector:
    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        # What can be checked at once is, before the spool is created or the model hashed:
        # what the ledger would refuse in every heartbeat, too.
        parse_worker_url(config.engine_url, "engine url")
        check_name("--pool", config.pool, "invalid_parameters")
        check_name("--worker-id", config.worker_id, "invalid_parameters")
        if config.advertise_url is not None:
            parse_worker_url(config.advertise_url, "--advertise-url")
        check_model_dir(config.model_dir)
        check_token(config)
        self.client = LedgerClient(
            config.ledger_url, config.ledger_token, deadline=config.ship_deadline
        )
        # The heartbeat thread has a client of its own: a ship batch never delays a beat.
        # A beat that cannot be delivered within 30 s is stale anyway: the next one replaces it.
        self._beat_client = LedgerClient(
            config.ledger_url, config.ledger_token, timeout=10, deadline=30
        )
        self.metrics = CollectorMetrics()
        self.cache = DigestCache(config.digest_cache)
        if self.cache.error:
            logger.warning("%s", self.cache.error)
        self.snapshot = self._snapshot()  # an engine away, or no model here: no spool made
        self.spool = Spool(config.spool_path)
        self.state = WorkerState(
            engine_url=config.engine_url.rstrip("/"),
            worker_id=config.worker_id,
            pool=config.pool,
            default_tier=config.default_tier,
            key=config.key,
            spool=self.spool,
            fingerprint_id=self.snapshot.fingerprint_id,
            batch_invariance=self.snapshot.body["engine"]["batch_invariance"],
            expected_system_fingerprint=expected_system_fingerprint(self.snapshot),
            log_public_key=config.log_public_key,
            metrics=self.metrics,
            renderer=TokenRenderer.from_model_dir(config.model_dir),
        )
        self._queue_fingerprint(self.snapshot)
        self.shipper = Shipper(
            self.spool,
            self.client,
            linger=config.ship_linger,
            on_shipped=self.metrics.shipped.inc,
            on_failure=lambda code: self.metrics.ship_failures.labels(
                self.metrics.code_label(code)
            ).inc(),
            content_retention_days=config.content_retention_days,
            on_expired=self._expired,
        )
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="engine-watch", daemon=True)
        self._heart = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        self.registered = threading.Event()
        self._last_failure: str | None = None  # the last re-snapshot's failure, said once
        self._engine_pid = self._find_pid()
        self._gone: int | None = None  # an engine process seen gone and snapshotted as such

    def _expired(self, pending: int, dead: int) -> None:
        self.metrics.retention_deleted.labels("pending").inc(pending)
        self.metrics.retention_deleted.labels("dead_letter").inc(dead)

    def _snapshot(self) -> Snapshot:
        c = self.config
        return take_snapshot(
            c.model_dir,
            engine_url=c.engine_url,
            engine_pid=c.engine_pid,
            engine_python=c.engine_python,
            cache=self.cache,
        )

    def _queue_fingerprint(self, snapshot: Snapshot) -> None:
        envelope = snapshot.envelope(self.config.key)
        self.spool.add_fingerprint(snapshot.fingerprint_id, envelope.canonical)

    def _find_pid(self) -> int | None:
        if self.config.engine_pid is not None:
            return self.config.engine_pid
        try:
            host, port = engine_port(self.config.engine_url)
            return find_pid_by_port(port) if is_local(host) else None
        except (ProcessUnreadable, ValueError):
            return None

    def start(self) -> Collector:
        self.shipper.start()
        self._watcher.start()
        self._heart.start()
        return self

    def _heartbeat(self) -> None:
        """Learn the log key, then register this worker and keep it live with heartbeats."""
        wait = 0.0
        last_failure = None
        while not self._stop.wait(wait):
            wait = 0.5  # quick retries until registered (the fingerprint may be in flight)
            try:
                if self.state.log_public_key is None:
                    self.state.log_public_key = load_public_key(self.client.log_key()["public_key"])
                if self.config.advertise_url is None:
                    return
                if self.state.fingerprint_unsure is not None:
                    continue  # not offered for replays while the engine is not fingerprinted
                self._beat_client.heartbeat(self.heartbeat_envelope())
            except LedgerError as exc:
                self.metrics.heartbeat_failures.labels(self.metrics.code_label(exc.code)).inc()
                # Said once per kind of failure (a refused URL or a worker ID owned by another
                # key would otherwise stay silent until registered).
                if self.registered.is_set() or (
                    exc.code != last_failure and exc.code != "unknown_fingerprint"
                ):
                    logger.warning("heartbeat failed: %s", exc.message)
                last_failure = exc.code
                continue
            last_failure = None
            self.registered.set()
            wait = self.config.heartbeat_interval

    def heartbeat_envelope(self) -> Envelope:
        """A heartbeat signed by this collector's key, issued now (ledger.heartbeat): it binds
        the worker ID to the key and says where the ledger reaches the worker. Invariance is
        not claimed: the ledger derives it from the fingerprint."""
        assert self.config.advertise_url is not None
        body = build_heartbeat(
            worker_id=self.config.worker_id,
            pool=self.config.pool,
            url=self.config.advertise_url,
            fingerprint_id=self.state.fingerprint_id,
            spool_pending=self.spool.pending(),
        )
        return sign_envelope(HEARTBEAT_KIND, body, self.config.key)

    def _watch(self) -> None:
        # One client for the watcher's life: a new one per poll would build a TLS context
        # (tens of milliseconds of CPU) every few seconds, beside the engine.
        with httpx.Client(timeout=5) as http:
            self._watch_with(http)

    def _watch_with(self, http: httpx.Client) -> None:
        away = False
        while not self._stop.wait(self.config.watch_interval):
            try:
                away = self._poll(http, away)
            except Exception:  # a bug: logged; the watcher must live on
                logger.exception("the engine watcher's poll failed")

    def _poll(self, http: httpx.Client, away: bool) -> bool:
        """One poll of the engine; whether it is away now."""
        try:
            up = http.get(f"{self.state.engine_url}/v1/models").status_code == 200
        except httpx.HTTPError:
            up = False
        if not up:
            if not away:
                logger.warning("engine at %s is not answering", self.state.engine_url)
            return True
        if away or not self._same_process():
            before = self._engine_pid
            alive = before is not None and _alive(before)
            # Finding a process by port scans /proc: only when the engine came back.
            now = self._engine_pid = self._find_pid()
            if not (away and alive and before is not None and now == before):
                # Not merely unreachable for a while (the same process, alive): from here
                # until a snapshot holds, what the engine runs is unknown, and nothing is
                # recorded under the fingerprint of the engine that was.
                self.state.fingerprint_unsure = "the engine restarted and is being fingerprinted"
            self.resnapshot()
            if now is not None and not _alive(now):
                self._gone = now  # a named --engine-pid that is gone: snapshotted as such, once
        elif self.state.fingerprint_unsure is not None:
            self.resnapshot()  # the last one failed: again, at every poll, until one holds
        return False

    def _same_process(self) -> bool:
        """Cheap check that the engine process we know still runs (or is the one known gone)."""
        pid = self._engine_pid
        return pid is None or pid == self._gone or _alive(pid)

    def resnapshot(self) -> None:
        """Snapshot again (the engine restarted); switch to the new fingerprint if it changed.

        Until a snapshot holds, what the engine runs is unknown: the proxy refuses the
        requests it would record, and replays (503 ``fingerprint_unsure``), rather than sign
        them under the fingerprint of the engine that was; heartbeats stop; the watcher tries
        again at every poll. The flag is cleared last, once every field is the new
        engine's."""
        try:
            snapshot = self._snapshot()
            if snapshot.fingerprint_id != self.state.fingerprint_id:
                logger.warning(
                    "engine fingerprint changed: %s -> %s",
                    self.state.fingerprint_id,
                    snapshot.fingerprint_id,
                )
                self._queue_fingerprint(snapshot)
                self.state.fingerprint_id = snapshot.fingerprint_id
                self.state.batch_invariance = snapshot.body["engine"]["batch_invariance"]
                self.metrics.fingerprint_changes.inc()
                self.registered.clear()  # the next heartbeat re-registers under the new ID
            self.state.expected_system_fingerprint = expected_system_fingerprint(snapshot)
            self.snapshot = snapshot
        except Exception as exc:  # whatever it is, the watcher must live on
            why = exc.message if isinstance(exc, LedgerError) else f"{type(exc).__name__}: {exc}"
            if why != self._last_failure:
                if isinstance(exc, LedgerError):
                    logger.error("re-snapshot failed (retried at each poll): %s", why)
                else:
                    logger.exception("re-snapshot failed (retried at each poll)")
            self._last_failure = why
            self.state.fingerprint_unsure = why
            self.metrics.snapshot_failures.inc()
            return
        if self._last_failure is not None:
            logger.warning("re-snapshot succeeded: recording again")
        self._last_failure = None
        self.state.fingerprint_unsure = None

    def close(self, drain_timeout: float = 5.0) -> None:
        self._stop.set()
        self.shipper.stop(drain_timeout)
        if self._heart.is_alive():
            self._heart.join(timeout=15)  # at most one ledger call in flight (10 s timeout)
        self._beat_client.close()
        self.client.close()
        self.spool.close()
        self.cache.close()
