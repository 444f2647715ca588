"""The fingerprint facts a verifier prints are the signed body's, and a fact the body does not
hold is None: never a string that a body could also hold."""

from ledger.fingerprint_facts import FingerprintFacts


def _gpus(*devices: object) -> tuple[str | None, ...]:
    body = {"gpu": {"gpus": list(devices)}}
    return FingerprintFacts.of(body, "sha256:" + "0" * 64, 1, "ed25519:k").gpus


def test_a_gpu_without_a_recorded_name_is_not_a_gpu_named_none() -> None:
    assert _gpus({"index": 0, "name": None}, {"index": 1}) == (None, None)
    assert _gpus({"index": 0, "name": "None"}) == ("None",)
    assert _gpus({"index": 0, "name": "NVIDIA H200"}, "A100") == ("NVIDIA H200", "A100")
    assert _gpus({"index": 0, "name": 7}) == ("7",)  # not a string: its canonical JSON
