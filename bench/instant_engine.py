"""An instant engine for benchmarks: real vLLM answers, replayed with no compute.

A benchmark tool only (tests use real vLLM). Two modes:

- ``capture``: a recording proxy in front of a real vLLM server. Every GET it forwards (the
  collector's ``/v1/models``, ``/version``, ``/metrics`` at start) and every generation request
  is saved, keyed by its endpoint, ``stream`` and ``max_tokens``: the exact bytes vLLM sent
  back (for a stream, the whole event stream). ``save`` writes them as JSON.
- ``serve``: a minimal HTTP/1.1 server (keep-alive, ``Content-Length`` or chunked answers)
  that answers each request with the captured answer of its key, at once, so that what
  sits in front of it (the collector) is all a benchmark measures. It parses no more of a
  request body than the key needs.

``bench/collector_speed.py`` drives both; ``bench/data/vllm-responses.json`` holds a capture
from vLLM 0.32 CPU on the fixture model.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

Key = tuple[str, bool, int]  # endpoint, stream, max_tokens
_STREAM = re.compile(rb'"stream"\s*:\s*true')
_MAX_TOKENS = re.compile(rb'"max_tokens"\s*:\s*([0-9]+)')


def key_of(path: str, body: bytes) -> Key:
    found = _MAX_TOKENS.search(body)
    return path, bool(_STREAM.search(body)), int(found[1]) if found else 0


def _name(key: Key) -> str:
    return f"{key[0]} stream={str(key[1]).lower()} max_tokens={key[2]}"


class Capture:
    """A recording proxy in front of ``upstream`` (an aiohttp app; run it with AppRunner)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.gets: dict[str, dict[str, Any]] = {}
        self.posts: dict[str, dict[str, Any]] = {}
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self._forward)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + request.path_qs,
                data=body or None,
                headers={"content-type": request.headers.get("content-type", "")} if body else None,
            ) as answer,
        ):
            raw = await answer.read()
            saved = {
                "status": answer.status,
                "content_type": answer.headers.get("content-type", ""),
                "body": raw.decode("utf-8"),
            }
        if request.method == "GET":
            self.gets[request.path] = saved
        else:
            self.posts[_name(key_of(request.path, body))] = saved
        return web.Response(
            status=saved["status"], body=raw, headers={"content-type": saved["content_type"]}
        )

    def save(self, path: Path, about: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**about, "get": self.gets, "post": self.posts}
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _answer(saved: dict[str, Any], stream: bool) -> bytes:
    body = saved["body"].encode("utf-8")
    status = saved["status"]
    head = f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
    head += f"content-type: {saved['content_type']}\r\n"
    if stream:  # as vLLM sends a stream: chunked (here in one chunk, at once)
        return (
            (head + "transfer-encoding: chunked\r\n\r\n").encode()
            + f"{len(body):x}\r\n".encode()
            + body
            + b"\r\n0\r\n\r\n"
        )
    return (head + f"content-length: {len(body)}\r\n\r\n").encode() + body


class Replay:
    """Answers captured bytes by key, over keep-alive HTTP/1.1."""

    def __init__(self, capture_file: Path) -> None:
        data = json.loads(capture_file.read_text())
        self.gets = {path: _answer(saved, False) for path, saved in data["get"].items()}
        self.posts: dict[Key, bytes] = {}
        for name, saved in data["post"].items():
            path, stream, tokens = name.split(" ")
            key = (path, stream == "stream=true", int(tokens.split("=")[1]))
            self.posts[key] = _answer(saved, key[1])
        self.missing = (
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2"
            b"\r\n\r\n{}"
        )
        self.served = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, _, rest = head.partition(b"\r\n")
                method, path, _ = line.split(b" ", 2)
                length = 0
                for header in rest.split(b"\r\n"):
                    name, _, value = header.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                text = path.decode().split("?")[0]
                if method == b"GET":
                    answer = self.gets.get(text, self.missing)
                else:
                    answer = self.posts.get(key_of(text, body), self.missing)
                writer.write(answer)
                self.served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def serve(capture_file: Path, host: str, port: int) -> None:
    replay = Replay(capture_file)
    server = await asyncio.start_server(replay.handle, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":  # python bench/instant_engine.py CAPTURE_FILE PORT
    import sys

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(Path(sys.argv[1]), "127.0.0.1", int(sys.argv[2])))
