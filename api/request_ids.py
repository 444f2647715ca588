"""Every API request has an ID: the client's ``X-Request-ID`` when it is one (1-200 of
``A-Za-z0-9._:-``), else a new one. It is answered in ``X-Request-ID`` and put on every log
line written while the request is served (``ledger.logs.REQUEST_ID``)."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledger.logs import REQUEST_ID
from ledger.records import is_request_id

HEADER = b"x-request-id"


class RequestIds:
    """Plain ASGI middleware, outermost, so every line of a request carries its ID."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == HEADER), b"").decode("latin-1")
        request_id = given if is_request_id(given) else f"api-{uuid.uuid4().hex}"
        token = REQUEST_ID.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
