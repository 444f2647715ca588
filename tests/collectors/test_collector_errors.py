"""The collector's one error table: every error class the core raises has one status, and
every answer the collector makes up itself has OpenAI's error shape."""

from __future__ import annotations

import json

import pytest

from collectors.errors import STATUS, error_response, status_for
from ledger import errors
from ledger.errors import LedgerError


def _subclasses(cls: type[LedgerError]) -> list[type[LedgerError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (errors.InvalidInput("x"), 400),
        (errors.TooLarge("x"), 413),
        (errors.VerificationError("x"), 403),
        (errors.NotFound("x"), 404),
        (errors.Conflict("x"), 409),
        (errors.Unreachable("x"), 502),
        (errors.Pushback("x"), 503),
        (errors.StorageError("x"), 503),
        (errors.IndexMismatch("x"), 500),
        (LedgerError("x"), 500),
    ],
)
def test_each_error_class_has_one_status(exc: LedgerError, status: int):
    assert status_for(exc) == status


def test_the_table_lists_a_subclass_before_its_parent():
    """Most specific first: a subclass placed after its parent would never be reached."""
    for i, (cls, _) in enumerate(STATUS):
        for later, _ in STATUS[i + 1 :]:
            assert not issubclass(later, cls), f"{later.__name__} is shadowed by {cls.__name__}"


def test_every_core_error_class_is_answered_below_or_at_500():
    for cls in _subclasses(LedgerError):
        assert 400 <= status_for(cls("x")) <= 503, cls


@pytest.mark.parametrize(
    ("exc", "request_id", "kind"),
    [
        (errors.InvalidInput("bad", code="invalid_tier"), "req-1", "invalid_request_error"),
        (errors.StorageError("down", code="not_recorded"), None, "server_error"),
        (errors.Unreachable("gone", code="engine_unreachable"), "r", "server_error"),
    ],
)
def test_an_answer_has_openais_error_shape_and_the_request_id(
    exc: LedgerError, request_id: str | None, kind: str
):
    exc.details["field"] = "x"
    response = error_response(exc, request_id)
    body = json.loads(response.body)
    assert body == {
        "error": {"message": exc.message, "type": kind, "code": exc.code, "details": {"field": "x"}}
    }
    assert response.status_code == status_for(exc)
    assert response.headers.get("x-request-id") == request_id
