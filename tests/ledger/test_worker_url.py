"""The worker URL policy (pure: a resolver is passed in) and the heartbeat document."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from api.settings import Settings
from ledger.errors import InvalidInput
from ledger.heartbeat import MAX_SKEW, batch_invariance, build_heartbeat, check_heartbeat
from ledger.worker_url import UrlPolicy, check_worker_url, parse_worker_url

FP = "sha256:" + "ab" * 32


def _resolver(*addresses: str):  # type: ignore[no-untyped-def]
    calls: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> list[str]:
        calls.append((host, port))
        return list(addresses)

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


def _code(fn, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidInput) as failed:
        fn(*args)
    return failed.value.code


def test_every_resolved_address_is_checked() -> None:
    policy = UrlPolicy()
    ok = _resolver("10.1.2.3", "127.0.0.1", "::1")
    assert check_worker_url("http://worker.internal:8100", policy, ok).port == 8100
    assert ok.calls == [("worker.internal", 8100)]  # type: ignore[attr-defined]
    # one bad address among good ones is enough to refuse
    mixed = _resolver("10.1.2.3", "169.254.169.254")
    assert _code(check_worker_url, "http://w.internal", policy, mixed) == "url_not_allowed"
    assert _code(check_worker_url, "http://w.internal", policy, _resolver()) == "invalid_url"
    # an IP literal is not resolved
    literal = _resolver("169.254.169.254")
    check_worker_url("http://10.0.0.1:1", policy, literal)
    assert literal.calls == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",
        "fe80::1",
        "fd00:ec2::254",
        "100.100.100.200",
        "0.0.0.0",
        "0.1.2.3",
        "::",
        "224.0.0.251",
        "ff02::fb",
        "255.255.255.255",
        "::ffff:169.254.169.254",
        "::ffff:0.0.0.0",
        "64:ff9b::a9fe:a9fe",
        "fe80::1%eth0",
    ],
)
def test_refused_address_classes(address: str) -> None:
    with pytest.raises(InvalidInput) as failed:
        UrlPolicy().check_address(address)
    assert failed.value.code == "url_not_allowed"


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "10.0.0.5", "192.168.1.2", "2001:db8::1"])
def test_ordinary_addresses_pass_by_default(address: str) -> None:
    UrlPolicy().check_address(address)


def test_configured_networks() -> None:
    policy = UrlPolicy.parse(" 10.0.0.0/8 , fd12::/16")
    policy.check_address("10.9.8.7")
    policy.check_address("fd12::1")
    for outside in ("127.0.0.1", "::1", "192.168.0.1"):
        with pytest.raises(InvalidInput, match="outside LEDGER_WORKER_NETWORKS"):
            policy.check_address(outside)
    # listing everything does not allow a refused range; listing (part of) it does
    everything = UrlPolicy.parse("0.0.0.0/0,::/0")
    for refused in ("169.254.169.254", "fe80::1", "0.0.0.0", "100.100.100.200"):
        with pytest.raises(InvalidInput):
            everything.check_address(refused)
    explicit = UrlPolicy.parse("169.254.169.0/24,fe80::/10")
    explicit.check_address("169.254.169.254")
    explicit.check_address("fe80::1")
    with pytest.raises(InvalidInput):
        explicit.check_address("169.254.1.1")
    assert UrlPolicy.parse("") == UrlPolicy.parse(None) == UrlPolicy()
    for bad in ("10.0.0.1/8", "nonsense", "10.0.0.0/33"):
        assert _code(UrlPolicy.parse, bad) == "invalid_setting"


def test_url_syntax() -> None:
    parsed = parse_worker_url("https://[::1]:8443/prefix")
    assert (parsed.scheme, parsed.host, parsed.port) == ("https", "::1", 8443)
    assert parse_worker_url("http://w").port == 80
    for bad in ("http://[::1", "http://[::1]x", "http://[zz]:1", "http://a@b", "ws://x", "", "x"):
        assert _code(parse_worker_url, bad) == "invalid_url", bad


def test_heartbeat_body() -> None:
    now = datetime.now(UTC)
    body = build_heartbeat(worker_id="w1", pool="p", url="http://h:1", fingerprint_id=FP)
    beat = check_heartbeat(body, now)
    assert beat.worker_id == "w1" and abs(beat.issued_at - now) < timedelta(seconds=5)
    late = build_heartbeat(
        worker_id="w1", pool="p", url="http://h:1", fingerprint_id=FP, issued_at=now - MAX_SKEW * 2
    )
    assert _code(check_heartbeat, late, now) == "stale_heartbeat"
    for change, code in (
        ({"schema_version": True}, "unsupported_schema_version"),
        ({"schema_version": 1.0}, "unsupported_schema_version"),
        ({"batch_invariance": "serial"}, "schema_violation"),
        ({"fingerprint_id": "sha256:nope"}, "schema_violation"),
        ({"url": "http://[::1"}, "invalid_url"),
        ({"issued_at": "2026-12-01T10:00:00+01:00"}, "schema_violation"),
    ):
        assert _code(check_heartbeat, {**body, **change}, now) == code, change
    assert _code(check_heartbeat, {k: v for k, v in body.items() if k != "url"}, now)


def test_batch_invariance_is_derived_from_the_engine_sections_flags() -> None:
    serial = {"max_num_seqs": 1, "enable_prefix_caching": False, "enable_chunked_prefill": False}
    assert batch_invariance({"engine": serial}) == "serial"
    assert batch_invariance({"engine": {"env": {"VLLM_BATCH_INVARIANT": " 2"}}}) == "kernel"
    # the section's own batch_invariance is the collector's claim, never read
    assert batch_invariance({"engine": {"batch_invariance": "serial"}}) == "none"
    assert batch_invariance({"engine": {"batch_invariance": "kernel"}}) == "none"
    assert batch_invariance({"engine": {**serial, "batch_invariance": "none"}}) == "serial"
    assert batch_invariance({"engine": {**serial, "max_num_seqs": 256}}) == "none"
    assert batch_invariance({"engine": "serial"}) == "none"
    assert batch_invariance({"model": {}}) == "none"


def test_the_setting_is_checked_at_start() -> None:
    assert Settings(worker_networks="10.0.0.0/8, ::1/128").worker_networks
    with pytest.raises(ValidationError, match="LEDGER_WORKER_NETWORKS"):
        Settings(worker_networks="10.0.0.0/8,not-a-network")


def _beat(**extra: object) -> dict[str, object]:
    body = build_heartbeat(
        worker_id="w-1",
        pool="p",
        url="http://worker:8100",
        fingerprint_id="sha256:" + "0" * 64,
    )
    return {**body, **extra}


def test_a_heartbeat_may_say_what_its_spool_holds():
    now = datetime.now(UTC)
    assert check_heartbeat(_beat(), now).spool_pending is None
    assert check_heartbeat(_beat(spool_pending=0), now).spool_pending == 0
    assert check_heartbeat(_beat(spool_pending=12_345), now).spool_pending == 12_345


@pytest.mark.parametrize("value", [True, -1, "3", 3.0, 2**60, None])
def test_a_spool_count_that_is_not_a_count_is_refused(value: object):
    body = _beat(spool_pending=value)
    if value is None:  # absent and null are the same: nothing said
        assert check_heartbeat(body, datetime.now(UTC)).spool_pending is None
        return
    with pytest.raises(InvalidInput, match="spool_pending"):
        check_heartbeat(body, datetime.now(UTC))
