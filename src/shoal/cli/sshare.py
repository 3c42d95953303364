"""sshare: the account tree's shares, decayed usage and fair-share factors, as Slurm's sshare.

Fetching (GET /shoal/v1/shares) is kept apart from rendering: ``render_shares(doc, options,
user)`` is a pure function the tests call directly.
"""

from __future__ import annotations

import sys

from shoal.api_client import Client, ClientError, fail
from shoal.slurm.fmt import argument_parser, emit, pad, split_list

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs the command's start-up time
    from collections.abc import Mapping
    from typing import Any


def _f(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


# name -> (header, width, right-justified, getter): Slurm's default columns and widths.
COLUMNS: dict[str, tuple] = {
    "account": ("Account", 20, False, lambda r: " " * r["depth"] + r["account"]),
    "user": ("User", 10, True, lambda r: r["user"] or ""),
    "rawshares": ("RawShares", 10, True, lambda r: "" if r["raw_shares"] is None else str(r["raw_shares"])),
    "normshares": ("NormShares", 11, True, lambda r: _f(r["norm_shares"])),
    "rawusage": ("RawUsage", 11, True, lambda r: str(round(r["raw_usage"]))),
    "normusage": ("NormUsage", 11, True, lambda r: _f(r["norm_usage"])),
    "effectvusage": ("EffectvUsage", 13, True, lambda r: _f(r["effective_usage"])),
    "fairshare": ("FairShare", 10, True, lambda r: _f(r["fairshare"])),
}
DEFAULT = ("account", "user", "rawshares", "normshares", "rawusage", "effectvusage", "fairshare")
LONG = ("account", "user", "rawshares", "normshares", "rawusage", "normusage", "effectvusage", "fairshare")


def select_rows(rows: list[dict], options, me: str) -> list[dict]:
    """Accounts always; users: all with -a, those of -u, else only the caller."""
    users = set(split_list(options.users))
    accounts = set(split_list(options.accounts))
    out = []
    for r in rows:
        if accounts and r["account"] not in accounts and r["account"] != "root":
            continue
        if r["user"] is not None and not options.all and r["user"] not in (users or {me}):
            continue
        out.append(r)
    return out


def columns(options) -> list[tuple]:
    """The columns: -o/--format's (``Account%256``: a width), else -l's or the default."""
    if not options.format:
        return [COLUMNS[c] for c in (LONG if options.long else DEFAULT)]
    cols = []
    for item in split_list(options.format):
        name, _, width = item.partition("%")
        col = COLUMNS.get(name.lower())
        if col is None:
            raise ValueError(f"Invalid field requested: \"{name}\"")
        cols.append((col[0], int(width) if width.isdigit() else col[1], *col[2:]))
    return cols


def render_shares(doc: Mapping[str, Any], options, me: str) -> str:
    cols = columns(options)
    rows = select_rows(doc["shares"], options, me)
    if options.users_only:  # -U: the users' associations, not the accounts' lines
        rows = [r for r in rows if r["user"] is not None]
    lines = []
    if options.parsable2 or options.parsable:
        end = "|" if options.parsable else ""
        if not options.noheader:
            lines.append("|".join(c[0] for c in cols) + end)
        lines += ["|".join(c[3](r).strip() if c[0] != "Account" else c[3](r) for c in cols) + end
                  for r in rows]
    else:
        if not options.noheader:
            # Slurm right-justifies every header, even over the left-justified Account column.
            lines.append(" ".join(pad(c[0], c[1], True, True) for c in cols) + " ")
            lines.append(" ".join("-" * c[1] for c in cols) + " ")
        lines += [" ".join(pad(c[3](r), c[1], c[2], True) for c in cols) + " " for r in rows]
    return "".join(line + "\n" for line in lines)


def parse_args(argv: list[str] | None):
    p = argument_parser("sshare", "View accounts' shares, usage and fair-share factors, as Slurm's sshare.")
    p.add_argument("-a", "--all", action="store_true", help="every user's associations")
    p.add_argument("-u", "--users", action="append", help="comma list of users")
    p.add_argument("-A", "--accounts", action="append", help="comma list of accounts")
    p.add_argument("-l", "--long", action="store_true", help="also the normalised usage")
    p.add_argument("-U", "--Users", dest="users_only", action="store_true", help="only the users' lines")
    p.add_argument("-o", "--format", action="append", help="comma list of columns (Account%%256: a width)")
    p.add_argument("-n", "--noheader", action="store_true", help="no header lines")
    p.add_argument("-p", "--parsable", action="store_true", help="'|' delimited, with a trailing '|'")
    p.add_argument("-P", "--parsable2", action="store_true", help="'|' delimited")
    p.add_argument("--help", action="help", help="show this help and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(argv)
        doc = Client.from_config().get("/shoal/v1/shares")
        emit(render_shares(doc, options, doc.get("user") or ""))
    except (ClientError, ValueError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
