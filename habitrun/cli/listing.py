"""`habitrun --help`: the command listing, drawn as typer draws it, without typer's help module.

typer's ``rich_utils`` imports rich's Markdown and Traceback renderers (markdown-it,
pygments, the pretty printer) whatever it draws; for the top-level listing that is
most of what `habitrun --help` costs. This draws the same panels with the few rich
parts they use; tests/cli/test_lazy_commands.py checks it against typer's own output,
colours included. A command's own ``--help`` is still typer's.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable

import typer.core
from rich.align import Align
from rich.columns import Columns
from rich.console import Console, Group, RenderableType
from rich.highlighter import RegexHighlighter
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.theme import Theme

# typer.rich_utils' styles and settings, as it reads them.
_THEME = {
    "option": "bold cyan", "switch": "bold green", "negative_option": "bold magenta",
    "negative_switch": "bold red", "types": "bold yellow", "types_sep": "dim", "usage": "yellow",
}
_COMMAND_STYLE = "bold cyan"


class _OptionHighlighter(RegexHighlighter):
    highlights = [
        r"(^|\W)(?P<switch>\-\w+)(?![a-zA-Z0-9])",
        r"(^|\W)(?P<option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
        r"(?P<types>\<[^\>]+\>)",
        r"(?P<usage>Usage: )",
    ]


class _NegativeHighlighter(RegexHighlighter):
    highlights = [
        r"(^|\W)(?P<negative_switch>\-\w+)(?![a-zA-Z0-9])",
        r"(^|\W)(?P<negative_option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
    ]


class _TypesHighlighter(RegexHighlighter):
    highlights = [
        r"^(?P<types_sep>(\[|<))",
        r"(?P<types_sep>\|)",
        r"(?P<types_sep>(\]|>))(\.\.\.)?$",
    ]


_highlight = _OptionHighlighter()
_negative = _NegativeHighlighter()
_types = _TypesHighlighter()


def _console() -> Console:
    width = os.getenv("TERMINAL_WIDTH")
    force = True if os.getenv("GITHUB_ACTIONS") or os.getenv("FORCE_COLOR") or os.getenv("PY_COLORS") else None
    if os.getenv("_TYPER_FORCE_DISABLE_TERMINAL"):
        force = False
    return Console(theme=Theme(_THEME), highlighter=_highlight, color_system="auto", force_terminal=force,
                   width=int(width) if width else None)


def _text(markup: str, style: str = "") -> Text:
    return _highlight(Text.from_markup(inspect.cleandoc(markup), style=style))


def _plain_table(**columns: object) -> Table:
    return Table(show_header=False, expand=True, box=None, show_lines=False, leading=0, border_style=None,
                 row_styles=None, pad_edge=False, padding=(0, 1), **columns)  # type: ignore[arg-type]


def _options_panel(group: typer.core.TyperGroup, ctx: typer.Context) -> Panel | None:
    table = _plain_table(highlight=True)
    for param in group.get_params(ctx):
        if getattr(param, "hidden", False) or not isinstance(param, typer.core.TyperOption):
            continue
        longs = [o for o in param.opts if "--" in o]
        shorts = [o for o in param.opts if "--" not in o]
        types = Text(style="bold yellow", overflow="fold")
        shown = param.display_type_rich(ctx=ctx)
        if shown is not None:
            types.append(shown)
        helps: list[RenderableType] = [_text(param.help.replace("\n", " ").strip())] if param.help else []
        table.add_row(_highlight(",".join(longs)), _highlight(",".join(shorts)),
                      _negative(",".join(o for o in param.secondary_opts if "--" in o)),
                      _negative(",".join(o for o in param.secondary_opts if "--" not in o)),
                      _types(types), Columns(helps))
    return Panel(table, border_style="dim", title="Options", title_align="left") if table.row_count else None


def _commands_panel(commands: Iterable[typer.core.TyperCommand]) -> Panel:
    listed = list(commands)
    table = _plain_table(highlight=False)
    table.add_column(style=_COMMAND_STYLE, no_wrap=True, width=max((len(c.name or "") for c in listed), default=0))
    table.add_column("Description", justify="left", no_wrap=False, ratio=10)
    for command in listed:
        summary = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
        table.add_row(Text(command.name or ""), _text(summary.strip()))
    return Panel(table, border_style="dim", title="Commands", title_align="left")


def print_listing(group: typer.core.TyperGroup, ctx: typer.Context,
                  commands: Iterable[typer.core.TyperCommand]) -> None:
    """Usage, the app's help, its options and every command with its one line, as `typer` prints them."""
    console = _console()
    console.print(Padding(_highlight(group.get_usage(ctx)), 1), style="bold")
    if group.help:
        first = inspect.cleandoc(group.help).partition("\f")[0].split("\n\n")[0].replace("\n", " ")
        console.print(Padding(Align(Group(_text(first.strip())), pad=False), (0, 1, 1, 1)))
    options = _options_panel(group, ctx)
    if options is not None:
        console.print(options)
    console.print(_commands_panel(commands))
