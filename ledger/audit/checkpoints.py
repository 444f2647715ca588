"""Checkpoints: the stored ones and those an auditor saw earlier, against the rebuilt log.

Before the scan (once the log key is known) every note is verified and its row compared with
it, including ``signed_at`` with the note's signed time; the verified ones bound the receive
times (``ledger.audit.times``). After the scan each verified checkpoint's root is compared
with the root rebuilt from the leaves and with the root the stored nodes give, and each is
proven consistent with the previous one (RFC 9162, from the stored nodes, verified). A
trusted checkpoint (``--checkpoint``) must be one the log still holds: same size or smaller,
same root.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger import merkle
from ledger.audit.report import Finding
from ledger.audit.rows import CheckpointRow, Micros, as_time, micros
from ledger.checkpoint import Checkpoint, parse_checkpoint, previous_size, verify_checkpoint
from ledger.errors import LedgerError


@dataclass(frozen=True)
class Verified:
    """A checkpoint whose note verified under the log key."""

    tree_size: int
    root_hash: bytes
    signed_at: Micros | None  # the note's signed time (None: a note without one)


@dataclass
class Checkpoints:
    """The stored and trusted checkpoints of one audit, and what was found about them."""

    rows: list[CheckpointRow]
    trusted: list[tuple[str, Checkpoint]]
    found: list[Finding]
    stored: list[Verified | None] | None = None  # per row, once verified (None: it failed)
    trusted_ok: list[Verified | None] | None = None

    @classmethod
    def read(cls, rows: list[CheckpointRow], notes: Sequence[str]) -> Checkpoints:
        found: list[Finding] = []
        sized = []
        for row in rows:  # as stored: SQLite keeps any value in any column
            if type(row.tree_size) is int and row.tree_size >= 0:
                sized.append(row)
                continue
            found.append(
                Finding(
                    "checkpoint",
                    f"a checkpoints row holds tree_size {row.tree_size!r}, which is no tree size",
                    table="checkpoints",
                    column="tree_size",
                )
            )
        rows = sized
        trusted = []
        for note in notes:
            try:
                trusted.append((note, parse_checkpoint(note)[0]))
            except LedgerError as exc:
                found.append(
                    Finding(
                        "trusted_checkpoint", f"cannot read a trusted checkpoint: {exc.message}"
                    )
                )
        return cls(rows, trusted, found)

    @property
    def sizes(self) -> set[int]:
        """Tree sizes whose roots the rebuild must keep."""
        return {row.tree_size for row in self.rows} | {cp.tree_size for _, cp in self.trusted}

    def verify(self, log_key: bytes | None) -> None:
        """Verify every note under the log key and compare each stored row with its note."""
        key = Ed25519PublicKey.from_public_bytes(log_key) if log_key is not None else None
        self.stored = []
        previous: Micros | None = None
        for n, row in enumerate(self.rows):
            where = f"checkpoint of size {row.tree_size}"
            prior = self.rows[n - 1].tree_size if n else None
            if key is None:
                self._find("checkpoint", f"{where}: no log key to verify it with")
                self.stored.append(None)
                continue
            try:
                cp = verify_checkpoint(row.note, key)
            except LedgerError as exc:
                self._find(
                    "checkpoint", f"{where}: {exc.message}", table="checkpoints", column="note"
                )
                self.stored.append(None)
                continue
            if (cp.tree_size, cp.root_hash) != (row.tree_size, row.root_hash):
                self._find(
                    "checkpoint",
                    f"{where}: the row does not match its signed note (note says size "
                    f"{cp.tree_size})",
                    table="checkpoints",
                )
            signed = micros(cp.signed_at) if cp.signed_at is not None else None
            if signed is not None and row.signed_at != signed:
                self._find(
                    "checkpoint",
                    f"{where}: checkpoints.signed_at is {as_time(row.signed_at)}; its signed "
                    f"note says {as_time(signed)}",
                    table="checkpoints",
                    column="signed_at",
                )
            at = signed if signed is not None else row.signed_at
            if previous is not None and at is not None and at < previous:
                self._find("checkpoint", f"{where}: signed before a smaller checkpoint")
            previous = at if at is not None else previous
            self._check_chain(cp, prior)
            self.stored.append(Verified(cp.tree_size, cp.root_hash, signed))
        self.trusted_ok = []
        for note, cp in self.trusted:
            where = f"trusted checkpoint of size {cp.tree_size}"
            if key is None:
                self._find("trusted_checkpoint", f"{where}: no log key to verify it with")
                self.trusted_ok.append(None)
                continue
            try:
                verify_checkpoint(note, key)
            except LedgerError as exc:
                self._find("trusted_checkpoint", f"{where}: {exc.message}")
                self.trusted_ok.append(None)
                continue
            signed = micros(cp.signed_at) if cp.signed_at is not None else None
            self.trusted_ok.append(Verified(cp.tree_size, cp.root_hash, signed))

    def _check_chain(self, cp: Checkpoint, prior: int | None) -> None:
        """A note that names the checkpoint signed before it (``Previous:``) must follow that
        checkpoint's row: otherwise the rows of the checkpoints between were deleted, and
        with them the time bounds they gave the leaves around them."""
        where = f"checkpoint of size {cp.tree_size}"
        try:
            named = previous_size(cp)
        except LedgerError as exc:
            self._find("checkpoint", f"{where}: {exc.message}")
            return
        if named is None or named == prior:
            return
        if prior is None or prior < named:
            self._find(
                "checkpoint",
                f"{where}: its note names the checkpoint of size {named} as the one signed "
                "before it, and the database no longer holds it (deleted, with the time bounds "
                "it gave)",
                named - 1,
                "checkpoints",
            )
        else:
            self._find(
                "checkpoint",
                f"{where}: its note names the checkpoint of size {named} as the one signed "
                f"before it, but the database holds one of size {prior} between them",
                prior - 1,
                "checkpoints",
            )

    def verified(self) -> list[Verified]:
        return [v for v in (self.stored or []) + (self.trusted_ok or []) if v is not None]

    def timed(self) -> list[tuple[int, Micros]]:
        return [(v.tree_size, v.signed_at) for v in self.verified() if v.signed_at is not None]

    def covered(self) -> int:
        """Leaves below this size are covered by a verified checkpoint."""
        return max((v.tree_size for v in self.verified()), default=0)

    def check_roots(self, size: int, roots: dict[int, bytes], read_nodes: merkle.ReadNodes) -> None:
        """After the scan: roots rebuilt, roots from the stored nodes, consistency."""
        previous: Verified | None = None
        for cp in self.stored or []:
            if cp is None:
                continue
            where = f"checkpoint of size {cp.tree_size}"
            if cp.tree_size > size:
                self._find("checkpoint", f"{where}: the log holds only {size} leaves")
                continue
            if roots.get(cp.tree_size) != cp.root_hash:
                self._find(
                    "checkpoint",
                    f"{where}: signed root differs from the root rebuilt from the leaves",
                    cp.tree_size - 1,
                )
            try:
                if merkle.root(cp.tree_size, read_nodes) != cp.root_hash:
                    self._find("checkpoint", f"{where}: stored Merkle nodes give another root")
                if previous is not None:
                    proof = merkle.consistency_proof(previous.tree_size, cp.tree_size, read_nodes)
                    merkle.verify_consistency(
                        previous.tree_size, cp.tree_size, previous.root_hash, cp.root_hash, proof
                    )
            except LedgerError as exc:
                self._find("checkpoint", f"{where}: {exc.message}")
            previous = cp
        for (_, note_cp), cp in zip(self.trusted, self.trusted_ok or [], strict=False):
            if cp is None:
                continue
            where = f"trusted checkpoint of size {note_cp.tree_size}"
            if cp.tree_size > size:
                self._find(
                    "trusted_checkpoint",
                    f"{where}: the log holds only {size} leaves: leaves {size}.."
                    f"{cp.tree_size - 1} were removed (or the log was rolled back)",
                    size,
                )
            elif roots.get(cp.tree_size) != cp.root_hash:
                self._find(
                    "trusted_checkpoint",
                    f"{where}: the log's leaves no longer give its root",
                    cp.tree_size - 1,
                )

    def _find(
        self,
        check: str,
        message: str,
        index: int | None = None,
        table: str | None = None,
        column: str | None = None,
    ) -> None:
        self.found.append(Finding(check, message, index, table, column))
