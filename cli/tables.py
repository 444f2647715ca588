"""Tables for people: an ID, a digest, a time, a number or a word is never split.

Piped or written to a file, a table is as wide as its content, so ``grep`` finds every value
whole on one line. On a terminal too narrow for it, the prose columns (named by ``wrap``) and
the headers wrap between words, the widest first; no column is narrower than its longest
token, nor a value column than its longest value, so a table that cannot fit is printed wider
than the terminal (which wraps its lines) rather than cut.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

_UNBOUNDED = sys.maxsize  # a width no table reaches: to measure one at its natural width


def table(
    *headers: str, wrap: Collection[str] = (), title: str | None = None, **options: Any
) -> Table:
    """A table whose columns named in ``wrap`` hold prose (a reason, a message, a list) and
    wrap between words; every other column holds one value per cell (an ID, a name, a time, a
    number) and never wraps. A header may wrap between its words in any column."""
    unknown = set(wrap).difference(headers)
    if unknown:
        raise ValueError(f"wrap names no column of this table: {sorted(unknown)}")
    out = _WholeTokenTable(title=title, **options)
    for header in headers:
        out.add_column(Text(header, no_wrap=False), no_wrap=header not in wrap, overflow="fold")
    return out


class _WholeTokenTable(Table):
    """Sets each column's width before rich lays the table out, and clears it after."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = options.update_width(_UNBOUNDED)
        natural = Measurement.get(console, wide, self).maximum
        if not console.is_terminal or not self.columns:
            yield from super().__rich_console__(console, options.update_width(natural))
            return
        lows, highs = zip(*(_bounds(console, wide, c) for c in self.columns), strict=True)
        overhead = natural - sum(highs)  # borders and padding
        room = max(options.max_width - overhead, sum(lows))
        if sum(highs) > room:
            for column, width in zip(self.columns, _fit(lows, highs, room), strict=True):
                column.width = width
        try:
            yield from super().__rich_console__(console, options.update_width(room + overhead))
        finally:
            for column in self.columns:
                column.width = None


def _bounds(console: Console, wide: ConsoleOptions, column: Column) -> tuple[int, int]:
    """A column's narrowest and natural widths (its content's, without padding): the longest
    word of its header and of its cells (of its cells' lines where it does not wrap), and its
    longest line."""
    header_word, header_line = _spans(console, wide, column.header)
    cells = [_spans(console, wide, cell) for cell in column.cells]
    low = max([header_word, *(line if column.no_wrap else word for word, line in cells)])
    high = max([header_line, *(line for _, line in cells)])
    return low, high


def _spans(console: Console, wide: ConsoleOptions, cell: RenderableType) -> tuple[int, int]:
    """The widths of a cell's longest word and of its longest line."""
    # As the table renders its cells: markup read, no highlighting (rich's highlighter is
    # quadratic on a long run of hex digits).
    text = console.render_str(cell, highlight=False) if isinstance(cell, str) else cell
    if not isinstance(text, Text):  # another renderable: as rich measures it
        measured = Measurement.get(console, wide, text)
        return measured.minimum, measured.maximum
    plain = text.plain
    return (
        max(map(cell_len, plain.split()), default=0),
        max(map(cell_len, plain.splitlines()), default=0),
    )


def _fit(lows: Sequence[int], highs: Sequence[int], room: int) -> list[int]:
    """Widths between ``lows`` and ``highs`` that fill ``room`` (at least the lows' sum, less
    than the highs'): the widest columns are narrowed first, to one level."""

    def at(level: int) -> list[int]:
        return [min(hi, max(lo, level)) for lo, hi in zip(lows, highs, strict=True)]

    level = max(highs)
    while sum(at(level)) > room:
        level -= 1
    widths = at(level)
    spare = room - sum(widths)
    for i, (width, hi) in enumerate(zip(widths, highs, strict=True)):
        if spare and width == level and width < hi:
            widths[i] += 1
            spare -= 1
    return widths
