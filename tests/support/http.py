from __future__ import annotations

from typing import Any

import httpx


def assert_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is the JSON error format with this status and stable code."""
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert err["code"] == code, err
    assert err["message"]
    return err
