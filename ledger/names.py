"""Names people choose for keys and tokens: shown in tables, the console and evidence bundles,
and signed into the log, so each must read as what it is."""

from __future__ import annotations

import unicodedata

MAX_NAME = 100
# control characters, lone surrogates, private use, unassigned code points, invisible format
# characters (bidirectional overrides, zero-width joiners and spaces, tags) and line or
# paragraph separators
_HIDDEN = frozenset(("Cc", "Cs", "Co", "Cn", "Cf", "Zl", "Zp"))
# characters that are letters or symbols by category but show nothing (fillers, blanks)
_BLANK = frozenset("\u034f\u115f\u1160\u2800\u3164\uffa0")
_SEEN = ("L", "N", "P", "S")  # letters, numbers, punctuation, symbols


def is_name(value: object) -> bool:
    """1-100 characters with at least one that shows (a letter, digit, punctuation mark or
    symbol), none hidden; spaces and combining marks only beside visible ones."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        return False
    categories = [(c, unicodedata.category(c)) for c in value]
    if any(cat in _HIDDEN or c in _BLANK for c, cat in categories):
        return False
    return any(cat[0] in _SEEN for _, cat in categories)
