"""How deep a document may nest (ledger.nesting): the limit holds whatever the containers
hold beside the nested one, scalars of every JSON type, and subclasses of dict and list."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest

from ledger.errors import InvalidInput
from ledger.nesting import check_depth

SCALARS: list[Any] = [1, -2.5, "x", True, None, 10**30]


class Listish(list):  # type: ignore[type-arg]
    pass


# Each wraps a document in one more level of containers.
WRAPS: dict[str, Callable[[Any], Any]] = {
    "list, nested last": lambda inner: [*SCALARS, inner],
    "list, nested first": lambda inner: [inner, *SCALARS],
    "dict": lambda inner: {"a": 1, "b": "s", "c": inner, "d": None},
    "OrderedDict": lambda inner: OrderedDict(a=1, c=inner),
    "list subclass": lambda inner: Listish([1, 2, inner]),
    "beside a flat dict": lambda inner: [{"k": 1}, 0.5, inner],
}


def _levels(n: int, wrap: Callable[[Any], Any]) -> Any:
    doc: Any = list(SCALARS)  # level 1
    for _ in range(n - 1):
        doc = wrap(doc)
    return doc


@pytest.mark.parametrize("wrap", WRAPS.values(), ids=WRAPS.keys())
def test_depth_at_the_limit_passes_and_one_more_is_refused(wrap: Callable[[Any], Any]) -> None:
    check_depth(_levels(12, wrap), "doc", 12)
    with pytest.raises(InvalidInput) as exc:
        check_depth(_levels(13, wrap), "doc", 12)
    assert exc.value.code == "schema_violation"
    assert "nests deeper than 12 levels" in str(exc.value)


def test_flat_containers_of_scalars_are_one_level() -> None:
    check_depth(list(range(100_000)), "doc", 1)
    check_depth({str(i): i for i in range(1000)}, "doc", 1)
    with pytest.raises(InvalidInput):
        check_depth([*range(100_000), []], "doc", 1)
    with pytest.raises(InvalidInput):
        check_depth({**{str(i): i for i in range(1000)}, "z": {}}, "doc", 1)
