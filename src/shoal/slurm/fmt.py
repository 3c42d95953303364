"""Slurm's output-format engine: ``%[.][width]X`` strings for squeue/sinfo -o, squeue -O.

A format is literal text and field specifications. ``%.10i`` right-justifies the job id
in ten columns, ``%10i`` left-justifies it, ``%i`` prints it as it is, ``%#P`` sizes the
column to its widest value. Padding and cutting follow Slurm's ``_print_str``: with a
width, a left-justified value is always cut to the width; a right-justified one is cut
only for fields that Slurm cuts (not node lists, not durations). ``%%`` is a literal
``%``. Rendering is pure: fields are (header, getter) pairs over plain dicts.
"""

from __future__ import annotations

from shoal.model.timefmt import format_hms  # noqa: F401  (sacct and scontrol use it from here)

from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs the commands start-up time
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    Getter = Callable[[Mapping[str, Any], float], Any]

AUTO_MIN_WIDTH = 9
"""The narrowest a ``%#X`` column gets, as sinfo's MIN_PART_FIELD_SIZE/MIN_NODE_FIELD_SIZE."""

LONG_FORMAT_WIDTH = 20
"""The width of a ``-O/--Format`` field given without ``:size``, as in Slurm."""


class FormatError(ValueError):
    """A format string naming a field the command does not have."""


# Immutable records as namedtuples, not dataclasses: dataclasses imports inspect (and
# with it ast, dis, tokenize), about 30 ms of every command's start-up.
class Field(namedtuple("Field", "header get cut cut_header", defaults=(True, True))):
    """One column a command can print: its header and how to read its value from a row.

    ``header: str``, ``get: Getter`` (row, now -> value). ``cut`` says whether a
    right-justified value is cut to the width (Slurm cuts most fields, never node lists
    or times); ``cut_header`` the same for the header.
    """

    __slots__ = ()


class Spec(namedtuple("Spec", "field width right auto text", defaults=(0, False, False, ""))):
    """One field of a parsed format (``field: Field``), or literal ``text`` when ``field`` is None."""

    __slots__ = ()


def parse_format(fmt: str, fields: Mapping[str, Field], kind: str = "job") -> list[Spec]:
    """Split ``%.18i %.9P`` into specs; an unknown letter raises FormatError naming it."""
    specs: list[Spec] = []
    literal: list[str] = []
    i, n = 0, len(fmt)
    while i < n:
        c = fmt[i]
        if c != "%":
            literal.append(c)
            i += 1
            continue
        if i + 1 < n and fmt[i + 1] == "%":
            literal.append("%")
            i += 2
            continue
        if literal:
            specs.append(Spec(None, text="".join(literal)))
            literal = []
        i += 1
        right = auto = False
        if i < n and fmt[i] == ".":
            right = True
            i += 1
        if i < n and fmt[i] == "#":
            auto = True
            i += 1
        start = i
        while i < n and fmt[i].isdigit():
            i += 1
        width = int(fmt[start:i]) if i > start else 0
        if i >= n:
            raise FormatError(f"Invalid {kind} format specification: '%' at the end of '{fmt}' names no field")
        letter = fmt[i]
        i += 1
        if letter not in fields:
            raise FormatError(
                f"Invalid {kind} format specification: {letter} "
                f"(valid field letters: {''.join(sorted(fields))})"
            )
        specs.append(Spec(fields[letter], width, right, auto))
    if literal:
        specs.append(Spec(None, text="".join(literal)))
    return specs


def parse_long_format(fmt: str, fields: Mapping[str, Field], kind: str = "job") -> list[Spec]:
    """squeue -O ``name[:[.]size][suffix],...``: default width 20, left-justified."""
    specs: list[Spec] = []
    for item in fmt.split(","):
        item = item.strip()
        if not item:
            continue
        name, colon, rest = item.partition(":")
        field = fields.get(name.lower())
        if field is None:
            raise FormatError(
                f"Invalid {kind} format specification: {name} "
                f"(valid names: {', '.join(sorted(fields))})"
            )
        width, right, suffix = LONG_FORMAT_WIDTH, False, ""
        if colon:
            if rest.startswith("."):
                right, rest = True, rest[1:]
            digits = len(rest) - len(rest.lstrip("0123456789"))
            width = int(rest[:digits]) if digits else 0
            suffix = rest[digits:]
        specs.append(Spec(field, width, right))
        if suffix:
            specs.append(Spec(None, text=suffix))
    return specs


def pad(value: str, width: int, right: bool, cut: bool) -> str:
    """Slurm's _print_str: ``%{width}s`` (cut when ``cut``) or ``%.{width}s`` then spaces."""
    if not width:
        return value
    if right:
        text = value.rjust(width)
        return text[:width] if cut else text
    return value[:width].ljust(width)


def text(value: Any) -> str:
    """A value as Slurm's printf would show it: None is ``(null)``."""
    if value is None:
        return "(null)"
    return str(value)


def render(specs: Sequence[Spec], rows: Iterable[Mapping[str, Any]], now: float,
           header: bool = True) -> str:
    """The table: an optional header line, then one line per row, each ending in a newline."""
    rows = list(rows)
    fields = [(k, s.field.get) for k, s in enumerate(specs) if s.field]
    values = []
    for row in rows:  # squeue renders thousands of rows: the plain loop is the fast one
        v = [s.text for s in specs]
        for k, get in fields:
            value = get(row, now)
            v[k] = "(null)" if value is None else str(value)  # as text()
        values.append(v)
    widths = []
    for k, s in enumerate(specs):
        if s.auto:
            widths.append(max([AUTO_MIN_WIDTH, *(len(v[k]) for v in values)]))
        else:
            widths.append(s.width)
    lines = []
    if header:
        lines.append("".join(
            pad(s.field.header, widths[k], s.right, s.field.cut_header) if s.field else s.text
            for k, s in enumerate(specs)
        ))
    padded = [(k, widths[k], s.right, s.field.cut) for k, s in enumerate(specs) if s.field and widths[k]]
    for v in values:
        for k, width, right, cut in padded:
            v[k] = pad(v[k], width, right, cut)
        lines.append("".join(v))
    return "".join(line + "\n" for line in lines)


def split_list(values: Iterable[str] | None) -> list[str]:
    """``-u a,b -u c`` to ``[a, b, c]``: Slurm's comma lists, repeatable options merged."""
    out: list[str] = []
    for value in values or ():
        out.extend(p.strip() for p in value.split(",") if p.strip())
    return out


def emit(output: str, out=None) -> None:
    """Write a command's output; a reader that went away (``| head -1``) is not an error."""
    import sys

    if out is not None and out is not sys.stdout:
        out.write(output)
        return
    try:
        sys.stdout.write(output)
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        # Python would complain again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class UsageError(ValueError):
    """Arguments a command cannot accept, from a parser made with ``remote=True``."""


def argument_parser(prog: str, description: str, remote: bool = False):
    """An argparse parser whose errors read ``<prog>: error: ...`` and exit 1, as Slurm's do.

    It has no -h: Slurm's commands use -h for --noheader, and add --help themselves. It has
    -V/--version, as every Slurm command does. A ``remote`` parser (the server running a
    command for the compiled front end) raises UsageError instead of exiting, and RunLocally
    for help, which is sized to the terminal, and for the version, which is the command's own.
    """
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str):  # type: ignore[override]
            if remote:
                raise UsageError(message)
            from shoal.api_client import fail

            fail(message)

        def _print_message(self, message, file=None):
            if remote:
                from shoal.api_client import RunLocally

                raise RunLocally("help is printed by the command itself")
            super()._print_message(message, file)

    class _Formatter(argparse.HelpFormatter):
        # argparse builds a formatter for every add_argument; without a width it imports
        # shutil (and with it bz2, lzma, zlib: ~4 ms) just to ask for the terminal size.
        def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                     width: int | None = None):
            if width is None:
                width = _terminal_columns() - 2
            super().__init__(prog, indent_increment, max_help_position, width)

    from shoal.slurm import version_line

    p = _Parser(prog=prog, description=description, add_help=False, formatter_class=_Formatter)
    p.add_argument("-V", "--version", action="version", version=version_line(), help="print the version and exit")
    return p


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else the terminal's width, else 80."""
    import os
    import sys

    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80
