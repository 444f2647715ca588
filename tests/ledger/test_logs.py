import json
import logging
import logging.config

import pytest

from ledger.logs import REQUEST_ID, logging_config


@pytest.fixture
def lines(capsys):
    def configure(fmt: str) -> logging.Logger:
        logging.config.dictConfig(logging_config(fmt, "info"))  # type: ignore[arg-type]
        return logging.getLogger("ledger.test")

    yield configure
    for name in ("ledger", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def test_a_json_line_is_one_object_with_the_request_id(lines, capsys):
    log = lines("json")
    token = REQUEST_ID.set("req-7")
    try:
        log.warning("refused %s", "a batch")
    finally:
        REQUEST_ID.reset(token)
    log.info("outside a request")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    first, second, third = (json.loads(x) for x in capsys.readouterr().err.splitlines())
    assert first["message"] == "refused a batch" and first["request_id"] == "req-7"
    assert first["level"] == "warning" and first["logger"] == "ledger.test"
    assert first["time"].endswith("Z")
    assert second["request_id"] is None
    assert "ValueError: boom" in third["exception"]


def test_a_text_line_names_the_request(lines, capsys):
    log = lines("text")
    token = REQUEST_ID.set("req-8")
    try:
        log.warning("slow")
    finally:
        REQUEST_ID.reset(token)
    log.warning("idle")
    named, unnamed = capsys.readouterr().err.splitlines()
    assert named.endswith("WARNING ledger.test [req-8] slow")
    assert unnamed.endswith("WARNING ledger.test [-] idle")


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="log format"):
        logging_config("xml")  # type: ignore[arg-type]
