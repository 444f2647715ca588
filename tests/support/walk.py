"""Every path into a JSON document (for tests that edit each member of a bundle in turn)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of ``node`` itself, then of every member and item below it, depth first."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, (*prefix, i))
