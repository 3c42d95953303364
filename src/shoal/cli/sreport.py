"""sreport: usage over a period, as Slurm's sreport reports it: ``cluster utilization``,
``user top`` and ``cluster AccountUtilizationByUser`` (the common reports).

``render_report(kind, doc, options)`` is pure; ``main`` fetches GET /shoal/v1/usage (and, for
the account tree, /shoal/v1/accounting). The period is yesterday unless ``start=``/``end=`` say.
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

REPORTS = {("cluster", "utilization"): "utilization", ("user", "top"): "top", ("user", "topusage"): "top",
           ("cluster", "accountutilizationbyuser"): "accounts", ("account", "utilizationbyuser"): "accounts"}
UNITS = {"seconds": ("Seconds", 1), "minutes": ("Minutes", 60), "hours": ("Hours", 3600)}
RULE = "-" * 80


class Options:
    def __init__(self) -> None:
        self.parsable = self.noheader = False
        self.end_bar = ""
        self.units = "minutes"
        self.percent = False
        self.tres = "cpu"
        self.start: float | None = None
        self.end: float | None = None
        self.top = 10
        self.users: set[str] = set()
        self.accounts: set[str] = set()


def parse(argv: list[str], now: float) -> tuple[str, Options]:
    from shoal.model.timefmt import parse_begin_time

    o = Options()
    words = []
    args = iter(argv)
    for arg in args:
        if arg in ("-P", "--parsable2"):
            o.parsable = True
        elif arg in ("-p", "--parsable"):
            o.parsable, o.end_bar = True, "|"
        elif arg in ("-n", "--noheader"):
            o.noheader = True
        elif arg == "-t" or arg.startswith("-t"):
            value = (arg[2:] or next(args, "")).lower()
            if value.startswith("percent"):
                o.percent = True
            elif value in UNITS:
                o.units = value
            else:
                raise ValueError(f"Invalid time format: {value} (Seconds, Minutes, Hours or Percent)")
        elif arg == "-T" or arg.startswith("--tres"):
            value = arg.partition("=")[2] or next(args, "")
            if value not in ("cpu", "gres/gpu"):
                raise ValueError(f"Invalid TRES: {value} (Shoal reports cpu and gres/gpu)")
            o.tres = value
        elif "=" in arg:
            key, _, value = arg.partition("=")
            key = key.lower()
            if key in ("start", "end"):
                try:
                    setattr(o, key, parse_begin_time(value, now))
                except ValueError as e:
                    raise ValueError(f"Invalid {key} time: {value}: {e}") from None
            elif key == "topcount":
                o.top = int(value)
            elif key in ("users", "user"):
                o.users = set(value.split(","))
            elif key in ("accounts", "account"):
                o.accounts = set(value.split(","))
            else:
                raise ValueError(f"Unknown condition: {arg}")
        else:
            words.append(arg.lower())
    kind = REPORTS.get(tuple(words[:2]))  # type: ignore[arg-type]
    if kind is None:
        raise ValueError(f"Not valid report: {' '.join(words) or '(none)'}; Shoal's are: cluster utilization, "
                         "user top, cluster AccountUtilizationByUser")
    if o.start is None or o.end is None:
        midnight = time.mktime(time.localtime(now)[:3] + (0, 0, 0, 0, 0, -1))
        o.start = o.start if o.start is not None else midnight - 86400
        o.end = o.end if o.end is not None else midnight
    return kind, o


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def _amount(seconds: float, total: float, o: Options) -> str:
    if o.percent:
        return f"{100 * seconds / total:.2f}%" if total else "0.00%"
    return str(int(seconds // UNITS[o.units][1]))


def _table(cols: list[tuple[str, int, bool]], rows: list[list[str]], o: Options) -> list[str]:
    if o.parsable:
        head = ["|".join(c[0] for c in cols) + o.end_bar]
        return ([] if o.noheader else head) + ["|".join(r) + o.end_bar for r in rows]
    def cell(v: str, w: int, right: bool) -> str:
        v = v if len(v) <= w else v[:w - 1] + "+"
        return v.rjust(w) if right else v.ljust(w)
    out = [] if o.noheader else ["".join(cell(c[0], c[1], True) + " " for c in cols),
                                 "".join("-" * c[1] + " " for c in cols)]
    return out + ["".join(cell(v, c[1], c[2]) + " " for v, c in zip(r, cols)) for r in rows]


def render_report(kind: str, doc: dict[str, Any], accounts: list[dict], cluster: str, o: Options) -> str:
    tres, period = o.tres, int(doc["end"] - doc["start"])
    reported = doc["reported"].get(tres, 0.0)
    unit = "Percentage of Total" if o.percent else f"{'CPU' if tres == 'cpu' else 'TRES'} {UNITS[o.units][0]}"
    span = f"{_stamp(doc['start'])} - {_stamp(doc['end'] - 1)}"
    head = [] if o.noheader or o.parsable else [RULE]
    if kind == "utilization":
        head += [] if o.noheader or o.parsable else [f"Cluster Utilization {span}", f"Usage reported in {unit}", RULE]
        used = doc["allocated"].get(tres, 0.0)
        cols = [("Cluster", 9, False), ("Allocated", 10, True), ("Down", 8, True), ("PLND Down", 9, True),
                ("Idle", 10, True), ("Reserved", 9, True), ("Reported", 10, True)]
        row = [cluster, _amount(used, reported, o), _amount(0, reported, o), _amount(0, reported, o),
               _amount(max(reported - used, 0), reported, o), _amount(0, reported, o),
               _amount(reported, reported, o) if not o.percent else "100.00%"]
        lines = head + _table(cols, [row], o)
    elif kind == "top":
        head += [] if o.noheader or o.parsable else [
            f"Top {o.top} Users {span} ({period} secs)", f"Usage reported in {unit}", RULE]
        by_user: dict[tuple[str, str], float] = {}
        for u in doc["users"]:
            if (o.users and u["user"] not in o.users) or (o.accounts and u["account"] not in o.accounts):
                continue
            by_user[(u["user"], u["account"])] = by_user.get((u["user"], u["account"]), 0.0) + u[tres]
        top = sorted(((k, v) for k, v in by_user.items() if v > 0), key=lambda kv: (-kv[1], kv[0]))[:o.top]
        cols = [("Cluster", 9, False), ("Login", 9, False), ("Proper Name", 15, False), ("Account", 15, False),
                ("Used", 8, True), ("Energy", 8, True)]
        lines = head + _table(cols, [[cluster, user, user, account, _amount(used, reported, o), "0"]
                                     for (user, account), used in top], o)
    else:
        head += [] if o.noheader or o.parsable else [
            f"Cluster/Account/User Utilization {span} ({period} secs)", f"Usage reported in {unit}", RULE]
        lines = head + _table([("Cluster", 9, False), ("Account", 15, False), ("Login", 9, False),
                               ("Proper Name", 15, False), ("Used", 8, True), ("Energy", 8, True)],
                              _account_rows(doc, accounts, cluster, o), o)
    return "".join(line + "\n" for line in lines)


def _account_rows(doc: dict, accounts: list[dict], cluster: str, o: Options) -> list[list[str]]:
    """Each account (down the tree from root, a space per level when not parsable) with its total,
    then its users' lines, as AccountUtilizationByUser lists them."""
    tres, reported = o.tres, doc["reported"].get(o.tres, 0.0)
    children: dict[str, list[str]] = {}
    for a in accounts:
        if a["name"] != "root":
            children.setdefault(a["parent"] or "root", []).append(a["name"])
    used: dict[str, dict[str, float]] = {}
    for u in doc["users"]:
        used.setdefault(u["account"] or "root", {})[u["user"]] = u[tres]

    def total(name: str) -> float:
        return sum(used.get(name, {}).values()) + sum(total(c) for c in children.get(name, ()))

    rows: list[list[str]] = []

    def walk(name: str, depth: int) -> None:
        if o.accounts and name not in o.accounts and name != "root":
            return
        label = name if o.parsable else " " * depth + name
        rows.append([cluster, label, "", "", _amount(total(name), reported, o), "0"])
        for user, seconds in sorted(used.get(name, {}).items()):
            if not o.users or user in o.users:
                rows.append([cluster, label, user, user, _amount(seconds, reported, o), "0"])
        for child in sorted(children.get(name, ())):
            walk(child, depth + 1)

    walk("root", 0)
    return rows


def main(argv: list[str] | None = None) -> int:
    from shoal.api_client import Client, ClientError, fail
    from shoal.slurm.fmt import emit

    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-V", "--version") for a in argv):
        from shoal.slurm import version_line

        print(version_line())
        return 0
    if not argv or any(a in ("-h", "--help", "--usage") for a in argv):
        print("Usage: sreport [-P|-p] [-n] [-t Minutes|Hours|Seconds|Percent] [-T cpu|gres/gpu] REPORT "
              "[start=TIME] [end=TIME] [users=...] [accounts=...] [TopCount=N]\n"
              "  reports: cluster utilization, user top, cluster AccountUtilizationByUser")
        return 0
    try:
        kind, options = parse(argv, time.time())
        client = Client.from_config()
        doc = client.get("/shoal/v1/usage", {"start": str(options.start), "end": str(options.end)})
        acct = client.get("/shoal/v1/accounting")
        emit(render_report(kind, doc, acct["accounts"], acct["cluster"], options))
    except ValueError as e:
        fail(str(e))
    except ClientError as e:
        fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
