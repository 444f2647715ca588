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
    """Sets each column's width before rich lays the table out, and clears it after. Each cell
    is measured once, here, from its text: rich measures no cell of a column of a set width."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.columns:
            yield from super().__rich_console__(console, options)
            return
        wide = options.update_width(_UNBOUNDED)
        lows, highs = zip(*(_bounds(console, wide, self, c) for c in self.columns), strict=True)
        try:
            for column, width in zip(self.columns, highs, strict=True):
                column.width = width
            natural = Measurement.get(console, wide, self).maximum
            if not console.is_terminal:
                yield from super().__rich_console__(console, options.update_width(natural))
                return
            overhead = natural - sum(highs)  # borders and padding
            room = max(options.max_width - overhead, sum(lows))
            if sum(highs) > room:
                for column, width in zip(self.columns, _fit(lows, highs, room), strict=True):
                    column.width = width
            yield from super().__rich_console__(console, options.update_width(room + overhead))
        finally:
            for column in self.columns:
                column.width = None


def _bounds(
    console: Console, wide: ConsoleOptions, owner: Table, column: Column
) -> tuple[int, int]:
    """A column's narrowest and natural widths (its content's, without padding): the longest
    word of its header and of its cells (of its cells' lines where it does not wrap), and its
    longest line; its header and footer counted where the table shows them."""
    header = [_spans(console, wide, column.header)] if owner.show_header else []
    cells = [_spans(console, wide, cell) for cell in column.cells]
    if owner.show_footer:
        cells.append(_spans(console, wide, column.footer))
    low = max([0, *(word for word, _ in header)])
    low = max([low, *(line if column.no_wrap else word for word, line in cells)])
    high = max([0, *(line for _, line in header + cells)])
    return low, high


def _spans(console: Console, wide: ConsoleOptions, cell: RenderableType) -> tuple[int, int]:
    """The widths of a cell's longest word and of its longest line."""
    if isinstance(cell, str):
        if cell.isascii() and cell.isprintable() and "[" not in cell and ":" not in cell:
            return _ascii_spans(cell)  # most cells (an ID, a number, a word): their own text
        # As the table renders its cells: markup and emoji codes read, no highlighting (rich's
        # highlighter is quadratic on a long run of hex digits).
        cell = console.render_str(cell, markup=wide.markup, highlight=False)
    if not isinstance(cell, Text):  # another renderable: as rich measures it
        measured = Measurement.get(console, wide, cell)
        return measured.minimum, measured.maximum
    plain = cell.plain
    if plain.isascii() and plain.isprintable():
        return _ascii_spans(plain)
    return (
        max(map(cell_len, plain.split()), default=0),
        max(map(cell_len, plain.splitlines()), default=0),
    )


def _ascii_spans(plain: str) -> tuple[int, int]:
    """:func:`_spans` of printable ASCII: one line, one terminal cell a character."""
    return max(map(len, plain.split()), default=0), len(plain)


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
