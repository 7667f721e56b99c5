"""Tables of many rows drawn line by line: what rich's ``Table`` draws, without its per-cell layout.

Rich lays out every cell (markup parsed, measured, wrapped, cropped): about
60 µs a cell, so `plan` of a 2000-stage recipe spent over a second on its
table. When every cell fits its column and the table fits the console, that
layout is fixed (each column as wide as its widest cell), so the lines are
written here directly, in the same box, padding and justification, and
printed at once. A table that would need wrapping, or has few rows, goes to
rich as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

FAST_ROWS = 200  # fewer rows than this: rich's Table (a few ms)


@dataclass(frozen=True)
class Cell:
    """One cell: its plain text and the rich style it is shown in, if any."""

    text: str
    style: str | None = None


def _padded(cell: Cell, width: int, justify: str, left: int, right: int, *, header: bool = False) -> str:
    """The cell as rich draws it: its style over the column's width; a header's over its padding too."""
    gap = " " * (width - cell_len(cell.text))
    body = gap + escape(cell.text) if justify == "right" else escape(cell.text) + gap
    if not cell.style:
        return " " * left + body + " " * right
    pad = f"[{cell.style}] [/]" if header else " "
    return pad * left + f"[{cell.style}]{body}[/]" + pad * right


def print_table(console: Console, title: str | None, headers: Sequence[str], justify: Sequence[str],
                rows: Sequence[Sequence[Cell]]) -> None:
    """Print the table ``Table(title, box=SIMPLE_HEAD, pad_edge=False)`` of these columns and rows would be.

    ``title`` is markup (escape user text in it); cells are plain text.
    """
    widths = [max([cell_len(h), *(cell_len(row[i].text) for row in rows)]) for i, h in enumerate(headers)]
    last = len(headers) - 1
    pads = [(0 if i == 0 else 1, 0 if i == last else 1) for i in range(len(headers))]
    outer = [w + left + right for w, (left, right) in zip(widths, pads, strict=True)]
    shape = box.SIMPLE_HEAD
    total = sum(outer) + len(outer) + 1  # the cells, the dividers between them and both edges
    if len(rows) < FAST_ROWS or total > console.width or (title and cell_len(Text.from_markup(title).plain) > total):
        console.print(_rich_table(title, headers, justify, rows))
        return
    lines = []
    if title:
        lines.append(f"[table.title]{title}[/]")
    lines.append(escape(shape.get_top(outer).rstrip("\n")))
    head = [_padded(Cell(h, "table.header"), widths[i], justify[i], *pads[i], header=True) for i, h in enumerate(headers)]
    lines.append(shape.head_left + shape.head_vertical.join(head) + shape.head_right)
    lines.append(escape(shape.get_row(outer, "head", edge=True).rstrip("\n")))
    for n, row in enumerate(rows):
        left, divider, right = ((shape.foot_left, shape.foot_vertical, shape.foot_right) if n == len(rows) - 1
                                else (shape.mid_left, shape.mid_vertical, shape.mid_right))
        cells = [_padded(cell, widths[i], justify[i], *pads[i]) for i, cell in enumerate(row)]
        lines.append(left + divider.join(cells) + right)
    lines.append(escape(shape.get_bottom(outer).rstrip("\n")))
    console.print("\n".join(lines), highlight=False, soft_wrap=True)


def _rich_table(title: str | None, headers: Sequence[str], justify: Sequence[str],
                rows: Sequence[Sequence[Cell]]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for header, how in zip(headers, justify, strict=True):
        table.add_column(header, justify=how)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(Text(c.text, style=c.style or "") for c in row))
    return table
