"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool

from api import certifier, errors, ui
from api.cache_fast import CacheFastPath
from api.gate import Gate
from api.head import HeadAsGet
from api.metrics import LogGauges, Metrics, MetricsMiddleware, utc_now
from api.openapi_doc import install as document_openapi
from api.request_ids import RequestIds
from api.routes import (
    cache,
    certifications,
    erasure,
    fingerprints,
    health,
    keys,
    log,
    records,
    replays,
    tokens,
    workers,
)
from api.settings import Settings
from api.state import AppState, InflightLimit, TokenCache
from ledger import __version__
from ledger.errors import LedgerError
from ledger.signing import SigningKey
from ledger.storage import checkpoints, erasures, keystore
from ledger.storage.cache_lookup import HotAnswers
from ledger.storage.database import Database

logger = logging.getLogger("ledger.api")


async def _checkpointer(state: AppState, interval: float) -> None:
    """Sign a checkpoint every ``interval`` seconds while the log grows."""
    while True:
        await asyncio.sleep(interval)
        try:
            await run_in_threadpool(checkpoints.sign_if_new, state.db, state.log_key, state.origin)
        except LedgerError as exc:  # the database may be briefly away; try again next tick
            logger.warning("checkpoint not signed: %s", exc.message)
        except Exception:  # never let the signer die silently
            logger.exception("checkpoint signer failed; retrying next tick")


async def _retention(state: AppState, days: int, interval: float) -> None:
    """Erase content older than ``days`` now and every ``interval`` seconds (one purge per
    tick; each purge erases 500 records per transaction, counted as it goes)."""
    metrics = state.metrics
    while True:
        try:
            result = await run_in_threadpool(
                lambda: state.hot_answers.after_erasure(
                    lambda: erasures.purge_expired(
                        state.db,
                        state.log_key,
                        days,
                        progress=metrics.erasures.labels("retention").inc,
                    ),
                    lambda done: set(done.erased),
                )
            )
            metrics.retention_held.inc(len(result.held))
            metrics.retention_runs.labels("done").inc()
            if result.erased:
                logger.info(
                    "retention: erased the content of %d record(s) older than %d days (%d held)",
                    len(result.erased),
                    days,
                    len(result.held),
                )
        except Exception:  # never let the purge die silently; try again next tick
            metrics.retention_runs.labels("failed").inc()
            logger.exception("retention purge failed; retrying next tick")
        await asyncio.sleep(interval)


def create_app(settings: Settings, db: Database, log_key: SigningKey) -> FastAPI:
    """Build the app around an already migrated database and the ledger's key."""
    keystore.trust_log_key(log_key.public_key)  # each worker process's own (ledger serve)
    metrics = Metrics(LogGauges(db, log_key, settings.worker_ttl, utc_now))
    metrics.cache_kept_limit.set(settings.cache_memory_bytes)
    state = AppState(
        settings=settings,
        db=db,
        log_key=log_key,
        metrics=metrics,
        origin=settings.log_origin or checkpoints.default_origin(log_key),
        token_cache=TokenCache(settings.token_cache_seconds),
        ingest_limit=InflightLimit(settings.max_inflight_batches, settings.max_inflight_bytes),
        hot_answers=HotAnswers(settings.cache_memory_bytes, on_change=metrics.cache_kept),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(certifier.sweep, state)
        task = None
        if settings.checkpoint_interval > 0:
            task = asyncio.create_task(_checkpointer(state, settings.checkpoint_interval))
        purge = None
        if settings.content_retention_days is not None:
            purge = asyncio.create_task(
                _retention(state, settings.content_retention_days, settings.retention_interval)
            )
        yield
        if purge is not None:
            purge.cancel()
            with suppress(asyncio.CancelledError):
                await purge
        await certifier.shutdown(state)
        if state.cache_rows is not None:
            await state.cache_rows.aclose()
        if state.http is not None:
            await state.http.aclose()
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    # Swagger UI and ReDoc at /docs and /redoc from assets in the package (no CDN).
    app = FastAPIOffline(
        title="inference-ledger",
        version=__version__,
        description=(
            "Fingerprint and audit-trail ledger for self-hosted LLM inference. "
            'Errors are JSON: {"error": {"code", "message", "details"?}}.'
        ),
        lifespan=lifespan,
        # /v1/keys/ is not /v1/keys: a JSON 404, not an empty 307 to a URL built from Host
        redirect_slashes=False,
    )
    app.state.ledger = state
    # The gate (token, scope, body size and time) runs before the router reads any body; the
    # metrics around it count its refusals too.
    app.add_middleware(CacheFastPath, state=state)  # inside the gate: see api/cache_fast.py
    app.add_middleware(
        Gate,
        routes=app.router.routes,
        state=state,
        console_headers=ui.routes.SECURITY_HEADERS,
    )
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    errors.install(app, pages=ui.routes.error_page, page_headers=ui.routes.SECURITY_HEADERS)
    app.add_middleware(errors.UnexpectedErrors, handler=app.state.unexpected_error)
    app.add_middleware(HeadAsGet)  # HEAD as GET, its body dropped: before anything matches
    app.add_middleware(RequestIds)  # outermost: every log line of a request names it
    for module in (
        health,
        keys,
        fingerprints,
        records,
        log,
        workers,
        replays,
        cache,
        certifications,
        erasure,
        tokens,
    ):
        app.include_router(module.router)
    ui.install(app, settings, log_key)
    document_openapi(app, settings)
    return app
