"""Tables that read in an 80-column terminal and in a pipe (where rich assumes 80 columns).

rich fits a table that is too wide by shrinking its columns and cutting their text with an ellipsis: a header
becomes "TFLO…", a name "mkld…", and a narrow enough column nothing at all. Here a table is fitted by rule,
so that no column and no character is lost:

1. as it is, where it fits;
2. else with the folding columns (names, shapes, notes) narrowed, their text wrapped onto more lines, the
   numbers left whole;
3. else as 1 and 2 with each column's short header (every Column may name one: "TFLOP/s" -> "TF/s");
4. else as 1 to 3 without the box: one space between columns, a rule under the headers;
5. else split in parts that each fit, every part repeating the first column (what a row is about).
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

FOLD_MIN = 10   # the narrowest a folding column becomes (its text then takes more lines)
WORD_MAX = 30   # a folding column keeps its longest word whole (a path:line) up to this width


@dataclass(frozen=True)
class Column:
    header: str
    short: str | None = None       # the header where the whole one does not fit
    justify: str = "right"
    fold: bool = False             # long text that may wrap onto more lines (names, shapes, notes)
    style: str | None = None


@dataclass
class Row:
    cells: list[str]               # rich markup
    style: str | None = None
    end_section: bool = False


def _width(markup: str) -> int:
    """The widest line of a cell, as the terminal shows it (markup removed)."""
    return max((Text.from_markup(line).cell_len for line in markup.split("\n")), default=0)


BOXED: dict = {}                                                        # rich's default: borders, padding
COMPACT = {"box": box.SIMPLE_HEAD, "show_edge": False, "padding": 0}    # one space between columns


def _longest_word(cells) -> int:
    """The widest word of the cells, as the terminal shows it (markup removed)."""
    words = (word for cell in cells for word in Text.from_markup(cell).plain.split())
    return max((Text(word).cell_len for word in words), default=0)


@functools.cache
def _overhead(columns: int, compact: bool) -> int:
    """The width a table's borders and padding take beside its columns' text, as rich draws them."""
    t = Table(**(COMPACT if compact else BOXED))
    for _ in range(columns):
        t.add_column("x", width=1, no_wrap=True)
    t.add_row(*["x"] * columns)
    out = Console(file=io.StringIO(), width=1000)
    out.print(t)
    return max(Text.from_ansi(line).cell_len for line in out.file.getvalue().splitlines()) - columns


def _plan(columns: list[Column], rows: list[Row], width: int) -> tuple[list[str], list[int | None], bool] | None:
    """(headers, widths: None where rich may size the column to its text, compact) that fit `width`, or None if
    nothing does; in the order of the module's rules."""
    cells = [[_width(r.cells[i]) for r in rows] for i in range(len(columns))]
    folding = [i for i, c in enumerate(columns) if c.fold]
    for compact in (False, True):
        room = width - _overhead(len(columns), compact)
        for headers in ([c.header for c in columns], [c.short or c.header for c in columns]):
            natural = [max([_width(h), *col]) for h, col in zip(headers, cells)]
            if sum(natural) <= room:
                return headers, [None] * len(columns), compact
            fixed = sum(w for i, w in enumerate(natural) if i not in folding)
            least = {i: min(natural[i], max([FOLD_MIN, *(_width(word) for word in headers[i].split()),
                                             min(_longest_word(r.cells[i] for r in rows), WORD_MAX)]))
                     for i in folding}
            if folding and fixed + sum(least.values()) <= room:
                return headers, _share(natural, least, room - fixed), compact
    return None


def _share(natural: list[int], least: dict[int, int], room: int) -> list[int | None]:
    """Widths for the folding columns (the keys of `least`) that sum to at most `room`: each starts at its least,
    and the room left raises the narrowest one at a time (water-filling), none past its natural width."""
    widths: list[int | None] = [None] * len(natural)
    for i, w in least.items():
        widths[i] = w
    extra = room - sum(least.values())
    while extra > 0:
        below = [i for i in least if widths[i] < natural[i]]
        if not below:
            break
        widths[min(below, key=lambda i: widths[i])] += 1
        extra -= 1
    return widths


def _table(title: str | None, columns: list[Column], rows: list[Row], headers: list[str],
           widths: list[int | None], compact: bool, **options) -> Table:
    t = Table(title=title, title_justify="left", **{**options, **(COMPACT if compact else BOXED)})
    for c, header, w in zip(columns, headers, widths):
        t.add_column(header, justify=c.justify, style=c.style, width=w, overflow="fold", no_wrap=not c.fold)
    for r in rows:
        t.add_row(*r.cells, style=r.style, end_section=r.end_section)
    return t


def fit(title: str | None, columns: list[Column], rows: list[Row], width: int, **options) -> list[Table]:
    """The table, or its parts, fitted to `width` columns (see the module's rules). options: rich Table's."""
    plan = _plan(columns, rows, width)
    if plan is not None or len(columns) == 1:   # one column too wide for the width: rich folds it as it can
        return [_table(title, columns, rows, *(plan or ([c.short or c.header for c in columns], [None], True)),
                       **options)]
    # Split: the first column, then as many of the others as fit beside it, part after part.
    parts, start = [], 1
    while start < len(columns):
        end = start + 1
        while end < len(columns) and _plan([columns[0], *columns[start:end + 1]],
                                           [Row([r.cells[0], *r.cells[start:end + 1]]) for r in rows], width):
            end += 1
        parts.append((start, end))
        start = end
    tables = []
    for k, (start, end) in enumerate(parts, 1):
        cols = [columns[0], *columns[start:end]]
        part_rows = [Row([r.cells[0], *r.cells[start:end]], r.style, r.end_section) for r in rows]
        plan = _plan(cols, part_rows, width) or ([c.short or c.header for c in cols], [None] * len(cols), True)
        tables.append(_table(f"{title or ''} ({k}/{len(parts)})".strip(), cols, part_rows, *plan, **options))
    return tables


def show(console: Console, title: str | None, columns: list[Column], rows: list[Row], **options) -> None:
    """Print the table fitted to the console's width."""
    for t in fit(title, columns, rows, console.width, **options):
        console.print(t)
