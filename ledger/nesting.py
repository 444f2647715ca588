"""How deep a signed document may nest when the ledger logs it.

Every verifier of a bundle (``ledger verify``, the browser's verify.js, which refuses JSON
nested deeper than 900 levels) must read what the ledger logs, so documents are checked
breadth first, without recursion, against :data:`MAX_DEPTH` at ingest. Documents logged before
a limit applied are read and verified as before.
"""

from __future__ import annotations

from typing import Any

from ledger.errors import InvalidInput

MAX_DEPTH = 128

# What JSON parses scalars to. A container whose members are all of these exact types (token
# IDs, most of a record) is passed over at C speed; anything else, a subclass included, is
# looked at one member at a time.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def check_depth(document: Any, what: str, limit: int = MAX_DEPTH) -> None:
    """InvalidInput ``schema_violation`` when ``document`` nests deeper than ``limit`` levels
    (the document's own container is level 1)."""
    level: list[Any] = [document]
    for _ in range(limit):
        inner: list[Any] = []
        for value in level:
            members = value.values() if isinstance(value, dict) else value
            if _SCALARS.issuperset(map(type, members)):
                continue
            inner.extend(v for v in members if isinstance(v, dict | list))
        if not inner:
            return
        level = inner
    raise InvalidInput(f"the {what} nests deeper than {limit} levels", code="schema_violation")
