"""The key facts of a fingerprint body, for people: which model, engine and GPUs (pure).

What ``ledger verify`` prints about the fingerprint an evidence bundle carries. Values are
taken as the signed body states them (docs/FINGERPRINT.md); a fact the body does not hold is
``None``, never guessed. A value that is not a string is shown as its canonical JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.canonical import canonicalize


def shown(value: Any) -> str | None:
    """A signed value as text: strings as they are, ``None`` as ``None``, others as JSON."""
    if value is None or isinstance(value, str):
        return value
    return canonicalize(value).decode()


def _section(body: dict[str, Any], name: str) -> dict[str, Any]:
    value = body.get(name)
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class FingerprintFacts:
    fingerprint_id: str
    leaf_index: int
    signer_key_id: str
    model_digest: str | None
    engine_name: str | None
    engine_version: str | None
    gpus: tuple[str | None, ...]  # one name per device (None: not recorded); empty: none
    gpus_unknown: str | None  # the body's reason when it reports no GPU
    driver_version: str | None
    batch_invariance: str | None

    @classmethod
    def of(
        cls, body: dict[str, Any], fingerprint_id: str, leaf_index: int, signer_key_id: str
    ) -> FingerprintFacts:
        """The facts of a body whose ID (``digest_of(body)``) the caller has verified."""
        model, engine, gpu = (_section(body, s) for s in ("model", "engine", "gpu"))
        devices = gpu.get("gpus")
        unknown = gpu.get("unknown")
        return cls(
            fingerprint_id=fingerprint_id,
            leaf_index=leaf_index,
            signer_key_id=signer_key_id,
            model_digest=shown(model.get("digest")),
            engine_name=shown(engine.get("name")),
            engine_version=shown(engine.get("version")),
            gpus=tuple(
                shown(d.get("name") if isinstance(d, dict) else d)
                for d in (devices if isinstance(devices, list) else [])
            ),
            gpus_unknown=shown(unknown.get("gpus")) if isinstance(unknown, dict) else None,
            driver_version=shown(gpu.get("driver_version")),
            batch_invariance=shown(engine.get("batch_invariance")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint_id": self.fingerprint_id,
            "leaf_index": self.leaf_index,
            "signer_key_id": self.signer_key_id,
            "model_digest": self.model_digest,
            "engine_name": self.engine_name,
            "engine_version": self.engine_version,
            "gpus": list(self.gpus),
            "gpus_unknown": self.gpus_unknown,
            "driver_version": self.driver_version,
            "batch_invariance": self.batch_invariance,
        }
