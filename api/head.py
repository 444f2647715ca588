"""HEAD answered as GET without its body (RFC 9110, section 9.3.2).

A load balancer's ``HEAD /healthz``, or ``curl -I``, gets the status and headers GET would
get (the token checked alike), never a 405. FastAPI's routes serve GET only; this plain ASGI
middleware hands the app a GET and drops the body it answers.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)
