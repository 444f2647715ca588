"""The compliance console at ``/ui/``: server-rendered pages over the same core as the API.

Pages read records, verdicts, fingerprints, pools and checkpoints through the storage layer,
as the API does; the record page then proves what it shows in the browser, from the evidence
bundle (``static/verify.js``). Sign-in exchanges an API token for a session cookie
(``api.ui.session``); the token's scopes decide what each page offers. Errors are the API's
(``api.errors.status_for``) rendered as a page; a missing or expired session sends the browser
to the sign-in page.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, unquote, urlencode

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from api.auth import check_scope
from api.state import AppState, StateDep
from api.ui import views
from api.ui.session import SESSION_COOKIE, SIGNIN_COOKIE, SIGNIN_SECONDS, Session, Sessions
from ledger import record_export
from ledger.checkpoint import verifier_key, verify_checkpoint
from ledger.compare import VERDICTS
from ledger.errors import (
    AuthenticationError,
    InvalidInput,
    LedgerError,
    PermissionDenied,
    TooLarge,
)
from ledger.fingerprint_facts import FingerprintFacts
from ledger.signing import Envelope, public_key_pem
from ledger.storage import (
    checkpoints,
    erasures,
    ingest,
    log,
    proofs,
    queries,
    record_search,
    tokenstore,
    verdicts,
    workers,
)
from ledger.storage.record_search import CONTENT_STATES, NO_VERDICT, SearchFilter
from ledger.tokens import Principal

logger = logging.getLogger("ledger.ui")
HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(directory=HERE / "templates")
# Bidirectional controls in signed text would show it other than it is ("\u202egnp.exe" reads
# "exe.png"): every value a page prints shows them as their code points instead.
BIDI_CONTROLS = {c: f"[U+{c:04X}]" for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                                             *range(0x2066, 0x206A))}  # fmt: skip


def _visible_controls(value: Any) -> Any:
    return value.translate(BIDI_CONTROLS) if type(value) is str else value


TEMPLATES.env.finalize = _visible_controls
router = APIRouter(prefix="/ui", include_in_schema=False)
PAGE_SIZE = 50
EXPORT_PAGE = 500
# Every console page, redirect and download (not the static assets): nothing loads from
# elsewhere, nothing frames it, nothing is cached.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; object-src 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # "no-referrer" makes a form's Origin "null"
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the session's token, its scopes, and the form token for this session."""

    principal: Principal
    session: Session
    csrf: str

    def can(self, scope: str) -> bool:
        return self.principal.allows(scope)


def sessions_of(request: Request) -> Sessions:
    found: Sessions = request.app.state.ui_sessions
    return found


async def viewer(request: Request, state: StateDep) -> Viewer:
    """The signed-in viewer (401, which the console answers with the sign-in page, otherwise);
    every page needs ``records:read``."""
    sessions = sessions_of(request)
    session = sessions.check(request.cookies.get(SESSION_COOKIE))
    principal = await run_in_threadpool(tokenstore.principal_by_id, state.db, session.token_id)
    check_scope(principal, "records:read")
    return Viewer(principal, session, sessions.csrf(session))


ViewerDep = Annotated[Viewer, Depends(viewer)]


def render(
    request: Request,
    template: str,
    context: dict[str, Any],
    status: int = 200,
    who: Viewer | None = None,
) -> HTMLResponse:
    response = TEMPLATES.TemplateResponse(
        request, template, {"viewer": who, **context}, status_code=status
    )
    response.headers.update(SECURITY_HEADERS)
    return response


def error_page(request: Request, status: int, code: str, message: str) -> Response:
    """The console's answer to an error (``api.errors`` maps the status): the sign-in page for
    a missing or expired session, an error page otherwise."""
    if status == 401 and request.method == "GET":
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        response: Response = RedirectResponse(
            f"/ui/signin?next={quote(target, safe='')}", status_code=303
        )
        response.headers.update(SECURITY_HEADERS)
        return response
    return render(
        request, "error.html", {"status": status, "code": code, "message": message}, status
    )


def _same_origin(request: Request) -> None:
    """Refuse a form posted from another site (the CSRF token is checked as well)."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        raise PermissionDenied("the form was posted from another site", code="csrf_failed")


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (first value of each); 415 for any other body."""
    _same_origin(request)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise InvalidInput(
            "the console's forms are sent as application/x-www-form-urlencoded",
            code="form_expected",
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > FORM_LIMIT:
        raise _form_too_large()
    raw = bytearray()
    async for chunk in request.stream():  # a console form is a few hundred bytes
        raw += chunk
        if len(raw) > FORM_LIMIT:
            raise _form_too_large()
    try:
        fields = parse_qs(
            raw.decode("utf-8"),
            keep_blank_values=True,
            max_num_fields=FORM_FIELDS,
            errors="strict",  # a reason is signed into the log: never with U+FFFD put in
        )
    except UnicodeDecodeError as exc:
        raise InvalidInput("a console form's fields are UTF-8 text", code="form_expected") from exc
    except ValueError as exc:  # more fields than any console form has
        raise InvalidInput(
            f"a console form has at most {FORM_FIELDS} fields", code="form_expected"
        ) from exc
    return {k: v[0] for k, v in fields.items()}


# The console's forms (sign-in, erase, hold, sign-out) hold a token, a reason of at most 1,000
# characters and a few hidden fields: nothing larger is read, whatever LEDGER_MAX_BODY_BYTES
# allows the API, so a form posted before any sign-in costs the server little.
FORM_LIMIT = 64 * 1024
FORM_FIELDS = 16


def _form_too_large() -> TooLarge:
    return TooLarge(
        f"a console form is at most {FORM_LIMIT} bytes",
        code="body_too_large",
        details={"limit": FORM_LIMIT},
    )


def _next_path(value: str | None) -> str:
    """Where to go after signing in: a console path only (never another site)."""
    if (
        value
        and value.startswith("/ui/")
        and "\\" not in value
        # no dot segment, not even percent-encoded: a browser resolves "/ui/../x" to "/x"
        and not any(part in (".", "..") for part in unquote(value.split("?")[0]).split("/"))
    ):
        return value
    return "/ui/records"


def _redirect(url: str) -> RedirectResponse:
    response = RedirectResponse(url, status_code=303)
    response.headers.update(SECURITY_HEADERS)
    return response


# --- sign-in ---------------------------------------------------------------------------------


@router.get("", include_in_schema=False)
@router.get("/", include_in_schema=False)
async def home() -> RedirectResponse:
    return _redirect("/ui/records")


def _signin_form(request: Request, next_path: str, error: str | None, status: int) -> Response:
    nonce, form_token = sessions_of(request).signin_pair()
    response = render(
        request,
        "signin.html",
        {"next": next_path, "form_token": form_token, "error": error},
        status,
    )
    response.set_cookie(
        SIGNIN_COOKIE,
        nonce,
        max_age=SIGNIN_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/ui/",
    )
    return response


@router.get("/signin")
async def signin_page(request: Request, next: str | None = None) -> Response:
    return _signin_form(request, _next_path(next), None, 200)


@router.post("/signin")
async def signin(request: Request, state: StateDep) -> Response:
    form = await read_form(request)
    sessions = sessions_of(request)
    sessions.check_signin(request.cookies.get(SIGNIN_COOKIE), form.get("form_token"))
    next_path = _next_path(form.get("next"))
    secret = form.get("token", "").strip()
    try:
        if not secret:
            raise AuthenticationError("enter an API token", code="missing_token")
        principal = await run_in_threadpool(tokenstore.authenticate, state.db, secret)
        check_scope(principal, "records:read")
    except (AuthenticationError, PermissionDenied) as exc:
        logger.info("console: sign-in refused (%s)", exc.code)
        status = 401 if isinstance(exc, AuthenticationError) else 403
        return _signin_form(request, next_path, exc.message, status)
    cookie, _ = sessions.issue(principal.token_id)
    logger.info("console: %s (token %s) signed in", principal.name, principal.token_id)
    response = _redirect(next_path)
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=sessions.lifetime,  # each view checks the token too
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/ui/",
    )
    response.delete_cookie(SIGNIN_COOKIE, path="/ui/")
    return response


@router.post("/signout")
async def signout(request: Request, who: ViewerDep) -> Response:
    form = await read_form(request)
    sessions_of(request).check_csrf(who.session, form.get("csrf"))
    logger.info("console: %s (token %s) signed out", who.principal.name, who.principal.token_id)
    response = _redirect("/ui/signin")
    response.delete_cookie(SESSION_COOKIE, path="/ui/")
    return response


# --- search and export -----------------------------------------------------------------------

_FILTER_FIELDS = (
    "since",
    "until",
    "model",
    "pool",
    "worker_id",
    "tier",
    "fingerprint_id",
    "verdict",
    "aborted",
    "content",
    "held",
)


def _flag(value: str | None, name: str) -> bool | None:
    if value in (None, ""):
        return None
    if value in ("true", "false"):
        return value == "true"
    raise InvalidInput(f"{name} must be true or false", code="invalid_parameters")


def search_filter(params: dict[str, str]) -> SearchFilter:
    """The console's search form as a filter (empty fields mean "any"); InvalidInput for a
    malformed value."""
    given = {k: v.strip() for k, v in params.items() if k in _FILTER_FIELDS and v.strip()}
    tier = given.get("tier")
    if tier is not None and tier not in ("0", "1", "2"):
        raise InvalidInput("tier must be 0, 1 or 2", code="invalid_parameters")
    content = given.get("content")
    if content is not None and content not in CONTENT_STATES:
        raise InvalidInput(
            f"content must be one of {list(CONTENT_STATES)}", code="invalid_parameters"
        )
    flt = SearchFilter(
        records=queries.RecordFilter(
            since=queries.parse_time(given.get("since"), "since"),
            until=queries.parse_time(given.get("until"), "until"),
            model=given.get("model"),
            fingerprint_id=given.get("fingerprint_id"),
            tier=int(tier) if tier is not None else None,
            pool=given.get("pool"),
        ),
        worker_id=given.get("worker_id"),
        aborted=_flag(given.get("aborted"), "aborted"),
        verdict=given.get("verdict"),
        content=content,  # type: ignore[arg-type]
        held=_flag(given.get("held"), "held"),
    )
    flt.check()
    return flt


def _query(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.query_params.items()}


@router.get("/records")
async def records_page(request: Request, state: StateDep, who: ViewerDep) -> Response:
    params = _query(request)
    flt = search_filter(params)
    cursor = params.get("cursor") or None
    page = await run_in_threadpool(
        record_search.search, state.db, flt, limit=PAGE_SIZE, cursor=cursor, newest_first=True
    )
    kept = {k: v for k, v in params.items() if k in _FILTER_FIELDS and v.strip()}
    return render(
        request,
        "records.html",
        {
            "params": params,
            "rows": [views.search_row(h) for h in page.items],
            "next_url": (
                f"/ui/records?{urlencode({**kept, 'cursor': page.next_cursor})}"
                if page.next_cursor
                else None
            ),
            "export_query": urlencode(kept),
            "verdicts": [*VERDICTS, NO_VERDICT],
            "content_states": CONTENT_STATES,
            "first_page": cursor is None,
        },
        who=who,
    )


def _all_hits(state: AppState, flt: SearchFilter) -> Iterator[list[record_search.Hit]]:
    cursor = None
    while True:
        page = record_search.search(state.db, flt, limit=EXPORT_PAGE, cursor=cursor)
        yield page.items
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


async def _export(
    state: AppState, flt: SearchFilter, line: Any, head: bytes = b""
) -> AsyncIterator[bytes]:
    """The export's body. Its first page is read before the answer starts, so an error there
    (an index row the log disagrees with) is answered with its status; one on a later page
    cuts the connection before the body's end (a chunked body without its last chunk, which
    clients and browsers report as a failed download, never a complete file)."""
    pages = _all_hits(state, flt)
    first = await run_in_threadpool(next, pages, None)

    async def body() -> AsyncIterator[bytes]:
        if head:
            yield head
        items = first
        while items is not None:
            yield b"".join(line(hit.meta()) for hit in items)
            try:
                items = await run_in_threadpool(next, pages, None)
            except LedgerError as exc:
                logger.error("console export cut off after its first pages: %s", exc.message)
                raise

    return body()


def _csv_line(meta: dict[str, Any]) -> bytes:
    return record_export.csv_line(meta).encode()


def _ndjson_line(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, separators=(",", ":")).encode() + b"\n"


@router.get("/records.csv")
async def export_csv(request: Request, state: StateDep, who: ViewerDep) -> Response:
    flt = search_filter(_query(request))
    logger.info(
        "console: %s (token %s) exported a search as CSV",
        who.principal.name,
        who.principal.token_id,
    )

    body = await _export(state, flt, _csv_line, record_export.csv_header().encode())
    return _download(StreamingResponse(body, media_type="text/csv"), "records.csv")


@router.get("/records.ndjson")
async def export_ndjson(request: Request, state: StateDep, who: ViewerDep) -> Response:
    flt = search_filter(_query(request))
    logger.info(
        "console: %s (token %s) exported a search as NDJSON",
        who.principal.name,
        who.principal.token_id,
    )
    body = await _export(state, flt, _ndjson_line)
    response = StreamingResponse(body, media_type="application/x-ndjson")
    return _download(response, "records.ndjson")


def _download(response: Response, name: str) -> Response:
    response.headers.update(SECURITY_HEADERS)
    response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


# --- one record ------------------------------------------------------------------------------


def _record_context(state: AppState, request_id: str) -> dict[str, Any]:
    hit = record_search.hit_of(state.db, request_id)
    stored = hit.record
    bodies = []
    for summary in verdicts.verdicts_of(state.db, request_id):
        env = json.loads(verdicts.get_verdict(state.db, summary["replay_id"]).envelope)
        if env["body"].get("request_id") == request_id:  # the logged verdict, not the index
            bodies.append(env["body"])
    # the erasure event as its leaf logs it, read with the record (``hit_of`` answers
    # index_mismatch for an ``erasures`` row naming any other leaf)
    erasure = stored.erasure.body if stored.erasure is not None else None
    page = views.record_page(stored, hit, bodies, erasure)
    page["fingerprint"] = _fingerprint(state, stored.fingerprint_id)[0].to_dict()
    return page


@router.get("/records/{request_id}")
async def record_page(
    request_id: str, request: Request, state: StateDep, who: ViewerDep
) -> Response:
    page = await run_in_threadpool(_record_context, state, request_id)
    logger.info(
        "console: %s (token %s) viewed record %s",
        who.principal.name,
        who.principal.token_id,
        request_id,
    )
    return render(
        request,
        "record.html",
        {
            **page,
            "request_id": request_id,
            "quoted_id": quote(request_id, safe=""),
            "can_erase": who.can("erasure") and page["schema_version"] >= 2,
            "can_hold": who.can("holds"),
            "redact_groups": ("prompt", "output", "token_ids", "text", "logprobs"),
            "notice": _notice(request.query_params.get("done")),
        },
        who=who,
    )


@router.get("/records/{request_id}/evidence.json")
async def evidence(request_id: str, request: Request, state: StateDep, who: ViewerDep) -> Response:
    queries.check_request_id(request_id)
    names = [
        n.strip()
        for value in request.query_params.getlist("redact")
        for n in value.split(",")
        if n.strip()
    ]
    bundle = await run_in_threadpool(
        proofs.evidence, state.db, state.log_key, state.origin, request_id, names
    )
    logger.info(
        "console: %s (token %s) fetched the evidence of record %s",
        who.principal.name,
        who.principal.token_id,
        request_id,
    )
    response = Response(json.dumps(bundle).encode(), media_type="application/json")
    response.headers.update(SECURITY_HEADERS)
    if request.query_params.get("download"):
        suffix = "-redacted" if names else ""
        response.headers["Content-Disposition"] = (
            f'attachment; filename="evidence-{quote(request_id, safe="")}{suffix}.json"'
        )
    return response


@router.post("/records/{request_id}/erase")
async def erase(request_id: str, request: Request, state: StateDep, who: ViewerDep) -> Response:
    form = await read_form(request)
    sessions_of(request).check_csrf(who.session, form.get("csrf"))
    check_scope(who.principal, "erasure")
    queries.check_request_id(request_id)
    result = await run_in_threadpool(
        lambda: state.hot_answers.after_erasure(
            lambda: erasures.erase(
                state.db,
                state.log_key,
                request_id,
                reason=form.get("reason", ""),
                requested_by=who.principal.name,
            ),
            lambda _: {request_id},  # its cache answers hold the content: forgotten at once
        )
    )
    if result.status == "erased":
        state.metrics.erasures.labels("request").inc()
    logger.info(
        "console: %s (token %s) erased the content of record %s",
        who.principal.name,
        who.principal.token_id,
        request_id,
    )
    return _redirect(f"/ui/records/{quote(request_id, safe='')}?done={result.status}")


@router.post("/records/{request_id}/hold")
async def hold(request_id: str, request: Request, state: StateDep, who: ViewerDep) -> Response:
    form = await read_form(request)
    sessions_of(request).check_csrf(who.session, form.get("csrf"))
    check_scope(who.principal, "holds")
    await run_in_threadpool(queries.get_record, state.db, request_id)  # NotFound first
    await run_in_threadpool(
        lambda: erasures.place_hold(
            state.db,
            state.log_key,
            request_id=request_id,
            filter=None,
            reason=form.get("reason", ""),
            placed_by=who.principal.name,
        )
    )
    logger.info(
        "console: %s (token %s) placed a hold on record %s",
        who.principal.name,
        who.principal.token_id,
        request_id,
    )
    return _redirect(f"/ui/records/{quote(request_id, safe='')}?done=held")


# --- fingerprints, pools, log ----------------------------------------------------------------


def _fingerprint(state: AppState, fingerprint_id: str) -> tuple[FingerprintFacts, dict[str, Any]]:
    if not queries.FINGERPRINT_ID.fullmatch(fingerprint_id):
        raise InvalidInput(
            "a fingerprint ID is sha256: and 64 lowercase hex digits", code="invalid_parameters"
        )
    fp = ingest.get_fingerprint(state.db, fingerprint_id)
    env = Envelope.from_bytes(fp.envelope)
    if env.body_digest != fingerprint_id:  # the index row must name this very body
        raise queries.mismatch(f"fingerprint {fingerprint_id}", fp.log_index, "another body")
    return FingerprintFacts.of(env.body, env.body_digest, fp.log_index, env.key_id), env.body


@router.get("/fingerprints/{fingerprint_id}")
async def fingerprint_page(
    fingerprint_id: str, request: Request, state: StateDep, who: ViewerDep
) -> Response:
    facts, body = await run_in_threadpool(_fingerprint, state, fingerprint_id)
    return render(request, "fingerprint.html", views.fingerprint_page(facts, body), who=who)


@router.get("/diff")
async def diff_page(request: Request, state: StateDep, who: ViewerDep) -> Response:
    a_id = request.query_params.get("a", "").strip()
    b_id = request.query_params.get("b", "").strip()
    rows = None
    if a_id and b_id:
        _, a = await run_in_threadpool(_fingerprint, state, a_id)
        _, b = await run_in_threadpool(_fingerprint, state, b_id)
        rows = views.diff_page(a, b)
    return render(request, "diff.html", {"a": a_id, "b": b_id, "rows": rows}, who=who)


def _pools(state: AppState) -> list[dict[str, Any]]:
    out = []
    for pool in workers.pools(state.db, state.settings.worker_ttl):
        body = verdicts.latest_certificate(state.db, pool.name)
        cert = None
        if body is not None:
            cert = {
                "certificate_id": body.get("certificate_id"),
                "fingerprint_id": body.get("fingerprint_id"),
                "invariant_observed": body.get("invariant_observed"),
                "issued_at": body.get("issued_at"),
                "matrix": views.certificate_matrix(body),
            }
        out.append({**pool.to_dict(), "certificate": cert})
    return out


@router.get("/pools")
async def pools_page(request: Request, state: StateDep, who: ViewerDep) -> Response:
    items = await run_in_threadpool(_pools, state)
    return render(request, "pools.html", {"pools": items}, who=who)


def _log(state: AppState) -> dict[str, Any]:
    with state.db.read() as s:
        size = log.log_size(s)
    history = []
    for cp in checkpoints.history(state.db, 20):
        try:
            verify_checkpoint(cp.note, state.log_key.public_key)
            signed = checkpoints.disagreement(cp) is None  # the row is the note's
        except LedgerError:
            signed = False
        history.append(
            {
                "tree_size": cp.tree_size,
                "signed_at": cp.signed_at.strftime("%Y-%m-%d %H:%M:%SZ"),
                "note": cp.note,
                "valid": signed,
            }
        )
    return {
        "tree_size": size,
        "origin": state.origin,
        "checkpoints": history,
        "pem": public_key_pem(state.log_key.public_key),
        "vkey": verifier_key(state.origin, state.log_key.public_key),
        "key_id": state.log_key.key_id,
    }


@router.get("/log")
async def log_page(request: Request, state: StateDep, who: ViewerDep) -> Response:
    return render(request, "log.html", await run_in_threadpool(_log, state), who=who)


# What the erase and hold forms redirect with: the page shows these words only, never text
# a link could put in front of an officer.
NOTICES = {"erased": "erased", "already_erased": "already erased", "held": "held"}


def _notice(done: str | None) -> str | None:
    return NOTICES.get(done or "")
