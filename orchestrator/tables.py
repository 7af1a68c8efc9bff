"""Tables of the CLI (`ps`, `snapshot --list`). On a terminal a Rich table fits the width by
wrapping, then leaving out, the other columns: the first column (ids, names: what is pasted
into `down`, `exec`, `--rm`) is never cut. In a pipe every column is shown at full width.
Outside the CLI's package, and Rich loaded for a terminal only, so that `ps` in a pipe (a
script's, a harness's) loads neither Typer nor Rich (quickcli.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from orchestrator.spec.published import PublishedPort


def echo(text: str, *, err: bool = False) -> None:
    """A line on stdout (stderr with `err`), written at once, as Click's echo writes it:
    nowhere when the stream is closed (`>&-`), and in UTF-8 where the stream's own encoding
    (ASCII, under LC_ALL=C or PYTHONIOENCODING) cannot hold a character of it."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    line = text + "\n"
    try:
        stream.write(line)  # (encoded whole before any of it is written)
    except UnicodeEncodeError:
        stream.flush()
        stream.buffer.write(line.encode("utf-8", "backslashreplace"))
    stream.flush()


def printable_lines(text: str) -> str:
    """Text of several lines (an error) with each line `printable`: only its newlines
    break it (what an engine, a label or a file put in it cannot move the cursor)."""
    return "\n".join(printable(line) for line in text.split("\n"))


def cell_len(text: str) -> int:
    """Columns `text` takes on a terminal: by the standard library's Unicode tables (two for
    a wide or full-width character, none for a combining mark or a format character, one
    for any other), so that `ps` in a pipe loads no Rich whatever names it lists (Rich's
    own count, from the same tables, was loaded for any text not in ASCII)."""
    if text.isascii():
        return len(text)
    import unicodedata

    width = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Me", "Mn", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("F", "W") else 1
    return width


def _piped() -> bool:
    """Stdout is no terminal, as Rich's Console would say (which is asked otherwise): not a
    tty, and neither TTY_COMPATIBLE nor FORCE_COLOR set."""
    if "TTY_COMPATIBLE" in os.environ or "FORCE_COLOR" in os.environ:
        return False
    try:
        return sys.stdout is None or not sys.stdout.isatty()
    except ValueError:  # closed
        return True


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], shown: list[int]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    key = max((cell_len(row[0]) for row in rows), default=0)
    for i in shown:
        if i == 0:  # whole, on one line, or the table does not fit
            table.add_column(headers[i], no_wrap=True, min_width=max(key, cell_len(headers[0])))
        else:
            table.add_column(headers[i], overflow="fold")
    for row in rows:
        table.add_row(*(Text(row[i]) for i in shown))  # never read as markup
    return table


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, drop: Sequence[str] = ()
) -> None:
    """Print `rows` under `headers` on stdout. On a terminal too narrow for all of them, the
    columns named in `drop` are left out in that order (empty ones first), saying so on
    stderr; if the first column alone does not fit, it is printed one value a line (the
    terminal wraps it, nothing is cut)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    console = None
    if not _piped():
        from rich.console import Console

        console = Console()
    shown = list(range(len(headers)))
    if console is None or not console.is_terminal:  # a pipe: every column, each row on one line
        widths = [
            max(cell_len(c) for c in (h, *(row[i] for row in rows))) for i, h in enumerate(headers)
        ]
        for line in (headers, *rows):
            echo(
                "  ".join(
                    c + " " * (w - cell_len(c)) for c, w in zip(line, widths, strict=True)
                ).rstrip()
            )
        return
    empty = [h for i, h in enumerate(headers) if i and not any(row[i] for row in rows)]
    left_out = []
    for name in [*empty, *(h for h in drop if h not in empty)]:
        if _fits(console, headers, rows, shown):
            break
        shown.remove(headers.index(name))
        left_out.append(name)
    if not _fits(console, headers, rows, shown):
        echo(headers[0])
        for row in rows:
            echo(row[0])
        left_out = list(headers[1:])
    else:
        console.print(_table(headers, rows, shown))
    said = [h for h in left_out if h not in empty]
    if said:
        echo(f"({', '.join(said)} left out to fit {console.width} columns)", err=True)


def _fits(
    console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]], shown: list[int]
) -> bool:
    """The shown columns fit the terminal: the first whole, the others wrapped at spaces
    (each as wide as its longest word), two spaces between columns."""
    need = 2 * (len(shown) - 1)
    for i in shown:
        cells = [headers[i], *(row[i] for row in rows)]
        words = cells if i == 0 else [w for cell in cells for w in cell.split()]
        need += max((cell_len(w) for w in words), default=0)
    return need <= console.width


def printable(cell: str) -> str:
    """A cell as text that cannot move the cursor, start an escape sequence or end the row
    (fields come from labels and records that anyone with access may have written)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in cell)


def ports_text(ports: Iterable[PublishedPort]) -> str:
    return ", ".join(str(p) for p in ports)


def size_text(n: int) -> str:
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def egress_text(allowed: int | None, denied: int | None, complete: bool) -> str:
    """allowed/denied requests, "+" after a count the gateway's log lost lines of (at least
    that many); "-" with no gateway (`allowed` None)."""
    if allowed is None:
        return "-"
    return f"{allowed}/{denied}" + ("" if complete else "+")
