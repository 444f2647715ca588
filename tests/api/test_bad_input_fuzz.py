"""No input gets a server error: random requests over every operation of the OpenAPI document,
on both backends, answer below 500 with the JSON error format.

The operations, their path and query parameters and their body schemas are read from the
served document, so a new route is fuzzed without a change here. Values are drawn to hit the
classes that have answered 500 before: date arithmetic at the ends of the calendar, integers
past Postgres' bigint and past JSON's safe range, lone surrogates and NUL, invalid UTF-8 in
paths and bodies, deep nesting, bodies that are not objects, members of the wrong type, and
signed records and fingerprints with one member replaced (so validation past the signature
is reached too), signed over the project's canonical bytes or the reference ``rfc8785``
package's. Whatever gets logged must then pass the audit (the last test).
LEDGER_FUZZ_EXAMPLES=5000 runs a longer hunt (default 300 per backend).
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

import rfc8785
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from ledger.fingerprint import FINGERPRINT_KIND
from ledger.signing import ALG, SigningKey, sign_envelope
from ledger.storage.audit import audit
from tests.support.documents import fingerprint_body, record_body
from tests.support.harness import Harness

_CACHE: dict[str, dict[str, Any]] = {}


def _setup(api: Harness) -> dict[str, Any]:
    """Per harness, once: the document's operations, a collector key and some real IDs."""
    if api.url not in _CACHE:
        spec = api.client(token=None).get("/openapi.json").json()
        ops = [
            (method.upper(), path, op)
            for path, item in spec["paths"].items()
            for method, op in item.items()
        ]
        key, fp = api.setup_collector()
        env = api.record(key, fp)
        assert api.post([env]).status_code == 201
        other = api.collector()  # a key the fuzz may revoke; it signs with ``key``
        real = [other.key_id, fp, env.body["request_id"], "p1", "strict"]
        _CACHE[api.url] = {
            "ops": ops,
            "key": key,
            "fp": fp,
            "real": real,
            "client": api.client(),
        }
    return _CACHE[api.url]


# ---- values -------------------------------------------------------------------------------

ANY_CHAR = st.characters(codec=None, exclude_categories=())  # lone surrogates included
TEXT = st.text(ANY_CHAR, max_size=40)
EDGE_STRINGS = st.sampled_from(
    [
        "",
        "\x00",
        "\ud800",
        "\udfff\ud800",
        "x" * 300,
        "..",
        "/",
        "%",
        "ed25519:" + "0" * 64,
        "sha256:" + "f" * 64,
        "ck1:sha256:" + "0" * 64,
        "0001-01-01T00:00:00+00:01",
        "9999-12-31T23:59:59-23:59",
        "0001-01-01T00:00:00",
        "2026-13-45T99:99:99Z",
        "9" * 60,
        "-1",
        "1e400",
        "NaN",
        "true",
    ]
)
BIG_INTS = st.one_of(
    st.integers(),
    st.integers(min_value=2**53 - 2, max_value=2**53 + 2),
    st.integers(min_value=2**63 - 2, max_value=2**64 + 2),
    st.integers(min_value=-(2**64), max_value=-(2**63) + 2),
    st.integers(min_value=10**30, max_value=10**40),
)
# integral floats RFC 8785 writes as integer digits beyond 2**53 (and their neighbours)
BIG_FLOATS = st.floats(min_value=2.0**52, max_value=1e22) | st.floats(-1e22, -(2.0**52))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    BIG_INTS,
    st.floats(allow_nan=False, allow_infinity=False),
    BIG_FLOATS,
    TEXT,
    EDGE_STRINGS,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
RAW_BODIES = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"[" * 50_000,
            b'{"a":' * 50_000,
            b"\xff\xfe\x00{",
            b'{"a": NaN}',
            b'{"a": 1, "a": 2}',
            b"1" * 5000,
            b'"\\ud800"',
            b'{"\xed\xa0\x80": 1}',
            b"",
            b"null",
        ]
    ),
)


def _segment(value: str) -> str:
    """A path segment, percent-encoded (lone surrogates as their raw UTF-8 bytes)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def _path_value(draw: st.DrawFn, real: list[str]) -> str:
    kind = draw(st.sampled_from(["text", "edge", "real", "raw"]))
    if kind == "raw":  # bytes that are no UTF-8 at all
        return draw(st.sampled_from(["%ff", "%c0%af", "%ed%a0%80", "%00", "%2e%2e", "a%2fb"]))
    value = {
        "text": lambda: draw(TEXT.filter(bool)),
        "edge": lambda: draw(EDGE_STRINGS.filter(bool)),
        "real": lambda: draw(st.sampled_from(real)),
    }[kind]()
    return _segment(value)


@st.composite
def _query_value(draw: st.DrawFn, schema: dict[str, Any]) -> str:
    kinds = {s.get("type") for s in schema.get("anyOf", [schema])}
    if "integer" in kinds and draw(st.booleans()):
        return str(draw(BIG_INTS))
    if schema.get("format") == "date-time" and draw(st.booleans()):
        stamp = draw(st.datetimes()).isoformat()
        zone = draw(st.sampled_from(["", "Z", "+00:01", "-23:59", "+14:00", "+24:00"]))
        return stamp + zone
    if "enum" in schema and draw(st.booleans()):
        return str(draw(st.sampled_from(schema["enum"])))
    return draw(st.one_of(TEXT, EDGE_STRINGS))


def _body_schema(op: dict[str, Any]) -> dict[str, Any] | None:
    body = op.get("requestBody", {}).get("content", {}).get("application/json")
    return None if body is None else body.get("schema", {})


OPENAI_NAMES = st.sampled_from(
    [
        "prompt",
        "messages",
        "temperature",
        "seed",
        "top_k",
        "top_p",
        "min_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "stop_token_ids",
        "n",
        "logprobs",
        "stream",
        "model",
    ]
)
WORDS = st.sampled_from(
    ["/v1/completions", "/v1/chat/completions", "collector", "replayer", "log", "p1", "strict"]
)


@st.composite
def _typed(draw: st.DrawFn, schema: dict[str, Any], real: list[str]) -> Any:
    """A value of the type ``schema`` names (and of another type, sometimes)."""
    if "anyOf" in schema:
        schema = draw(st.sampled_from(schema["anyOf"]))
    kind = schema.get("type")
    if kind is None or draw(st.integers(0, 7)) == 0:
        return draw(JSON_VALUES)
    if kind == "string":
        return draw(st.one_of(TEXT, EDGE_STRINGS, WORDS, st.sampled_from(real)))
    if kind == "integer":
        return draw(st.one_of(st.integers(-5, 300), BIG_INTS))
    if kind == "boolean":
        return draw(st.booleans())
    if kind == "array":
        return draw(st.lists(_typed(schema.get("items", {}), real), max_size=5))
    if kind == "object":
        return draw(st.dictionaries(st.one_of(OPENAI_NAMES, TEXT), JSON_VALUES, max_size=6))
    return None


@st.composite
def _shaped(draw: st.DrawFn, schema: dict[str, Any], real: list[str]) -> Any:
    """An object with the schema's members (some, maybe an extra one), mostly of their types."""
    props = schema.get("properties", {})
    out = {name: draw(_typed(props[name], real)) for name in props if draw(st.booleans())}
    if draw(st.integers(0, 5)) == 0:
        out[draw(TEXT)] = draw(JSON_VALUES)
    return out


def _mutate(draw: st.DrawFn, body: dict[str, Any]) -> dict[str, Any]:
    """Replace, drop or add one member somewhere in a valid document."""
    target: Any = body
    for _ in range(draw(st.integers(0, 2))):
        children = [k for k, v in target.items() if isinstance(v, dict | list) and v]
        if not children:
            break
        child = target[draw(st.sampled_from(sorted(children)))]
        target = child[0] if isinstance(child, list) else child
        if not isinstance(target, dict):
            break
    action = draw(st.sampled_from(["replace", "drop", "add"]))
    names = sorted(target)
    if action == "add" or not names:
        target[draw(TEXT)] = draw(JSON_VALUES)
    elif action == "drop":
        del target[draw(st.sampled_from(names))]
    else:
        target[draw(st.sampled_from(names))] = draw(JSON_VALUES)
    return body


def _sign(kind: str, body: dict[str, Any], key: SigningKey, reference: bool) -> dict[str, Any]:
    """An envelope signed over the project's canonical bytes, or over the reference
    ``rfc8785`` package's, as a collector built on another canonicalizer would sign it."""
    if not reference:
        return sign_envelope(kind, body, key).to_dict()
    sig = key.sign(rfc8785.dumps(body))
    return {"kind": kind, "body": body, "signature": {"alg": ALG, "key_id": key.key_id, "sig": sig}}


@st.composite
def _signed(draw: st.DrawFn, path: str, key: SigningKey, fp: str) -> bytes:
    reference = draw(st.booleans())
    if path == "/v1/records":
        env = _sign("inference_record", _mutate(draw, record_body(fp)), key, reference)
        try:
            return json.dumps({"envelopes": [env]}).encode()
        except ValueError:  # a value json cannot write: send the unsigned shape instead
            return b'{"envelopes": [{}]}'
    env = _sign(FINGERPRINT_KIND, _mutate(draw, fingerprint_body()), key, reference)
    return json.dumps(env).encode()


@st.composite
def _body(draw: st.DrawFn, path: str, op: dict[str, Any], setup: dict[str, Any]) -> bytes:
    schema = _body_schema(op)
    kinds = ["json", "raw"] + (["shaped", "shaped"] if schema else [])
    if path in ("/v1/records", "/v1/fingerprints"):
        kinds += ["signed"] * 3
    kind = draw(st.sampled_from(kinds))
    if kind == "raw":
        return draw(RAW_BODIES)
    if kind == "signed":
        try:
            return draw(_signed(path, setup["key"], setup["fp"]))
        except Exception as exc:  # the document could not be signed: not a request
            note(f"unsignable: {exc!r}")
            return b"{}"
    if kind == "shaped" and schema:
        value = draw(_shaped(schema, setup["real"]))
    else:
        value = draw(JSON_VALUES)
    return json.dumps(value).encode()  # ASCII: lone surrogates travel as \\ud800 escapes


# ---- the test -----------------------------------------------------------------------------


@settings(
    max_examples=int(os.environ.get("LEDGER_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_no_request_gets_a_server_error(api: Harness, data: st.DataObject):
    setup = _setup(api)
    method, template, op = data.draw(st.sampled_from(setup["ops"]), label="operation")
    path = template
    for param in op.get("parameters", []):
        if param["in"] == "path":
            value = data.draw(_path_value(setup["real"]), label=param["name"])
            path = path.replace("{" + param["name"] + "}", value)
    query = []
    for param in op.get("parameters", []):
        if param["in"] == "query" and data.draw(st.booleans()):
            value = data.draw(_query_value(param.get("schema", {})), label=param["name"])
            query.append((param["name"], value))
    url = path
    if query:
        url += "?" + "&".join(f"{k}={_segment(v)}" for k, v in query)
    content = data.draw(_body(path, op, setup)) if method == "POST" else None
    note(f"{method} {url} {content[:300] if content else ''!r}")
    headers = {"content-type": "application/json"}
    resp = setup["client"].request(method, url, content=content, headers=headers)
    assert resp.status_code < 500, resp.text
    code = ""
    if resp.status_code >= 400 and method != "HEAD":
        error = resp.json()["error"]
        assert isinstance(error["code"], str) and error["code"] and error["message"]
        code = error["code"]
    event(f"{method} {template}: {resp.status_code} {code}")  # --hypothesis-show-statistics


def test_what_the_fuzz_had_logged_passes_the_audit(api: Harness):
    """Whatever the requests above got logged is a valid entry: an accepted document the audit
    cannot read back (a number canonicalized to integer digits beyond 2**53) failed here."""
    report = audit(api.db, api.log_key.public_key)
    assert report.ok, [f.to_dict() for f in report.findings]
