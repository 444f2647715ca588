"""Names people choose for keys and tokens: shown in tables, the console and evidence bundles,
and signed into the log, so each must read as what it is."""

from __future__ import annotations

import unicodedata

MAX_NAME = 100
# control characters, lone surrogates, invisible format characters (bidirectional overrides,
# zero-width spaces) and line or paragraph separators
_HIDDEN = frozenset(("Cc", "Cs", "Cf", "Zl", "Zp"))


def is_name(value: object) -> bool:
    """1-100 characters, not all spaces, each one visible or a plain space."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_NAME
        and bool(value.strip())
        and not any(unicodedata.category(c) in _HIDDEN for c in value)
    )
