"""sacctmgr's grammar and tables: ``sacctmgr [options] command entity [names] [where ...] [set ...]``.

``parse`` reads a command line into a Command; ``render`` prints the accounting records
(GET /shoal/v1/accounting) as sacctmgr shows them: right-aligned columns of sacctmgr's widths,
each followed by a space, a value too long cut to width-1 and a ``+``; ``-P``/``-p`` join with
``|``; ``format=Name%20`` sets a width (negative: left-aligned). Both are pure.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

COMMANDS = {"add": "add", "create": "add", "modify": "modify", "update": "modify", "delete": "delete",
            "remove": "delete", "show": "show", "list": "show"}
ENTITIES = {"account": "account", "accounts": "account", "user": "user", "users": "user", "qos": "qos",
            "association": "assoc", "associations": "assoc", "assoc": "assoc", "assocs": "assoc",
            "cluster": "cluster", "clusters": "cluster"}
# sacctmgr's spellings of a key, to the one the server takes.
KEYS = {"fairshare": "fairshare", "share": "fairshare", "shares": "fairshare", "defaultaccount": "defaultaccount",
        "defaultacct": "defaultaccount", "accounts": "account", "users": "user", "descr": "description",
        "org": "organization", "parentname": "parent", "names": "name", "qoslevel": "qos"}
USAGE = "Usage: sacctmgr [options] command entity [names] [where spec...] [set spec...]"


class SacctmgrError(ValueError):
    """A command line sacctmgr cannot read; the message is its words."""


class Command:
    """One sacctmgr command: what to do to which records, and how to print."""

    def __init__(self) -> None:
        self.op = ""
        self.entity = ""
        self.names: list[str] = []
        self.where: dict[str, str] = {}
        self.set: dict[str, str] = {}
        self.format: list[str] = []
        self.immediate = self.noheader = self.quiet = self.tree = False
        self.associations = False  # -s: users shown with each of their associations
        self.parsable = ""  # "|" with -p (a trailing bar), "" otherwise
        self.parsable2 = False


def parse(argv: list[str]) -> Command:
    cmd = Command()
    words: list[str] = []
    for arg in argv:
        if arg in ("-i", "--immediate"):
            cmd.immediate = True
        elif arg in ("-n", "--noheader"):
            cmd.noheader = True
        elif arg in ("-P", "--parsable2"):
            cmd.parsable2 = True
        elif arg in ("-p", "--parsable"):
            cmd.parsable, cmd.parsable2 = "|", True
        elif arg in ("-Q", "--quiet"):
            cmd.quiet = True
        elif arg in ("-s", "--associations"):
            cmd.associations = True
        elif arg.startswith("-") and len(words) < 2:
            raise SacctmgrError(f"unrecognized option '{arg}'\n{USAGE}")
        else:
            words.append(arg)
    if not words:
        raise SacctmgrError(f"no command given\n{USAGE}")
    cmd.op = COMMANDS.get(words[0].lower(), "")
    if not cmd.op:
        raise SacctmgrError(f"Invalid command entered: {words[0]}")
    if len(words) < 2 or words[1].lower() not in ENTITIES:
        raise SacctmgrError(f"No valid entity in {words[0]} command\nInput line must include "
                            '"Account", "Association", "QOS", "User" or "Cluster"')
    cmd.entity = ENTITIES[words[1].lower()]
    into = cmd.set if cmd.op == "add" else cmd.where
    for word in words[2:]:
        low = word.lower()
        if low == "where":
            into = cmd.where
        elif low == "set":
            if cmd.op != "modify":
                raise SacctmgrError(f"Unknown option: {word}")
            into = cmd.set
        elif low in ("tree", "withassoc", "withdeleted", "withcoordinator"):
            cmd.tree = cmd.tree or low == "tree"
        elif "=" in word:
            key, _, value = word.partition("=")
            key = key.lower().rstrip("+-")
            if key == "format":
                cmd.format += [f for f in value.split(",") if f]
                continue
            into[KEYS.get(key, key)] = value
        else:
            cmd.names += [n for n in word.split(",") if n]
    if cmd.op in ("modify", "delete") and not (cmd.names or cmd.where):
        raise SacctmgrError(f" No conditions given: {cmd.op} needs names or a where clause")
    if cmd.op == "modify" and not cmd.set:
        raise SacctmgrError(" You didn't give me anything to set")
    return cmd


# ---------------------------------------------------------------------- tables

def _tres(gpus: int | None) -> str:
    return "" if gpus is None else f"gres/gpu={gpus}"


def _n(value: int | None) -> str:
    return "" if value is None else str(value)


def _wall(seconds: int | None) -> str:
    from shoal.model.timefmt import format_hms

    return format_hms(seconds, unlimited="")


def _blank(record: Mapping[str, Any]) -> str:
    """A column sacctmgr has and Shoal keeps nothing for (no such limit): empty, as unset."""
    return ""


# entity -> {key: (header, width, getter)}; each entity's DEFAULT is sacctmgr 22.05's.
FIELDS: dict[str, dict[str, tuple]] = {
    "account": {
        "account": ("Account", 10, lambda r: r["name"]),
        "description": ("Descr", 20, lambda r: r["description"]),
        "descr": ("Descr", 20, lambda r: r["description"]),
        "organization": ("Org", 20, lambda r: r["organization"]),
        "org": ("Org", 20, lambda r: r["organization"]),
        "parentname": ("Par Name", 10, lambda r: r["parent"] or ""),
        "share": ("Share", 9, lambda r: str(r["shares"])),
        "fairshare": ("Share", 9, lambda r: str(r["shares"])),
    },
    "user": {
        "user": ("User", 10, lambda r: r["name"]),
        "defaultaccount": ("Def Acct", 10, lambda r: r["default_account"] or ""),
        "adminlevel": ("Admin", 9, lambda r: r["admin_level"]),
        "admin": ("Admin", 9, lambda r: r["admin_level"]),
        # with -s, each association's (blank without it)
        "cluster": ("Cluster", 10, lambda r: r.get("cluster", "")),
        "account": ("Account", 10, lambda r: r.get("account", "")),
        "partition": ("Partition", 10, _blank),
        "share": ("Share", 9, lambda r: str(r.get("shares", ""))),
        "maxjobs": ("MaxJobs", 7, _blank),
        "maxnodes": ("MaxNodes", 8, _blank),
        "maxcpus": ("MaxCPUs", 8, _blank),
        "maxsubmit": ("MaxSubmit", 9, _blank),
        "maxwall": ("MaxWall", 11, _blank),
        "maxcpumins": ("MaxCPUMins", 11, _blank),
        "qos": ("QOS", 20, lambda r: r.get("qos", "")),
        "defaultqos": ("Def QOS", 9, _blank),
    },
    "assoc": {
        "cluster": ("Cluster", 10, lambda r: r["cluster"]),
        "account": ("Account", 10, lambda r: r["account"]),
        "user": ("User", 10, lambda r: r["user"]),
        "partition": ("Partition", 10, _blank),
        "share": ("Share", 9, lambda r: str(r["shares"])),
        "fairshare": ("Share", 9, lambda r: str(r["shares"])),
        "priority": ("Priority", 10, _blank),
        "grpjobs": ("GrpJobs", 7, _blank),
        "grptres": ("GrpTRES", 13, _blank),
        "grpsubmit": ("GrpSubmit", 9, _blank),
        "grpwall": ("GrpWall", 11, _blank),
        "grptresmins": ("GrpTRESMins", 13, _blank),
        "maxjobs": ("MaxJobs", 7, _blank),
        "maxtres": ("MaxTRES", 13, _blank),
        "maxtrespernode": ("MaxTRESPerNode", 14, _blank),
        "maxsubmit": ("MaxSubmit", 9, _blank),
        "maxwall": ("MaxWall", 11, _blank),
        "maxtresmins": ("MaxTRESMins", 13, _blank),
        "qos": ("QOS", 20, lambda r: r["qos"]),
        "defaultqos": ("Def QOS", 9, _blank),
        "grptresrunmins": ("GrpTRESRunMins", 13, _blank),
        "parentname": ("Par Name", 10, lambda r: r["parent"]),
    },
    "qos": {
        "name": ("Name", 10, lambda r: r["name"]),
        "priority": ("Priority", 10, lambda r: str(r["priority"])),
        "gracetime": ("GraceTime", 10, lambda r: "00:00:00"),
        "preempt": ("Preempt", 10, lambda r: ",".join(r["preempt"])),
        "preemptexempttime": ("PreemptExemptTime", 19, _blank),
        "preemptmode": ("PreemptMode", 11, lambda r: r["preempt_mode"]),
        "flags": ("Flags", 10, _blank),
        "usagethres": ("UsageThres", 10, _blank),
        "usagefactor": ("UsageFactor", 11, lambda r: "1.000000"),
        "grptres": ("GrpTRES", 13, lambda r: _tres(r["grp_gpus"])),
        "grptresmins": ("GrpTRESMins", 13, _blank),
        "grptresrunmins": ("GrpTRESRunMins", 13, _blank),
        "grpjobs": ("GrpJobs", 7, lambda r: _n(r["grp_jobs"])),
        "grpsubmit": ("GrpSubmit", 9, _blank),
        "grpwall": ("GrpWall", 11, _blank),
        "maxtres": ("MaxTRES", 13, _blank),
        "maxtrespernode": ("MaxTRESPerNode", 14, _blank),
        "maxtresmins": ("MaxTRESMins", 13, _blank),
        "maxwall": ("MaxWall", 11, lambda r: _wall(r["max_wall_s"])),
        "maxtrespu": ("MaxTRESPU", 13, lambda r: _tres(r["max_gpus_per_user"])),
        "maxjobspu": ("MaxJobsPU", 9, lambda r: _n(r["max_jobs_per_user"])),
        "maxsubmitpu": ("MaxSubmitPU", 11, lambda r: _n(r["max_submit_per_user"])),
        "maxtrespa": ("MaxTRESPA", 13, _blank),
        "maxjobspa": ("MaxJobsPA", 9, _blank),
        "maxsubmitpa": ("MaxSubmitPA", 11, _blank),
        "mintres": ("MinTRES", 13, _blank),
    },
    "cluster": {
        "cluster": ("Cluster", 10, lambda r: r["cluster"]),
        "controlhost": ("ControlHost", 15, _blank),
        "controlport": ("ControlPort", 12, _blank),
        "rpc": ("RPC", 5, lambda r: "9728"),
        "share": ("Share", 9, lambda r: "1"),
        "qos": ("QOS", 20, lambda r: "normal"),
    },
}
DEFAULT = {
    "account": ("account", "descr", "org"),
    "user": ("user", "defaultaccount", "admin"),
    "assoc": ("cluster", "account", "user", "partition", "share", "priority", "grpjobs", "grptres", "grpsubmit",
              "grpwall", "grptresmins", "maxjobs", "maxtres", "maxtrespernode", "maxsubmit", "maxwall",
              "maxtresmins", "qos", "defaultqos", "grptresrunmins"),
    "qos": ("name", "priority", "gracetime", "preempt", "preemptexempttime", "preemptmode", "flags", "usagethres",
            "usagefactor", "grptres", "grptresmins", "grptresrunmins", "grpjobs", "grpsubmit", "grpwall", "maxtres",
            "maxtrespernode", "maxtresmins", "maxwall", "maxtrespu", "maxjobspu", "maxsubmitpu", "maxtrespa",
            "maxjobspa", "maxsubmitpa", "mintres"),
    "cluster": ("cluster", "controlhost", "controlport", "rpc", "share", "qos"),
}
ALIASES = {"name": {"account": "account", "user": "user", "cluster": "cluster"},
           "descr": {"account": "descr"}}


def rows(cmd: Command, doc: Mapping[str, Any]) -> list[dict]:
    """The records ``cmd`` shows, filtered by its names and where clause."""
    cluster = doc.get("cluster", "")
    if cmd.entity == "account":
        out = list(doc["accounts"])
    elif cmd.entity == "user" and cmd.associations:
        users = {u["name"]: u for u in doc["users"]}
        out = [{**users[a["user"]], **a} for a in associations(doc) if a["user"] in users]
    elif cmd.entity == "user":
        out = list(doc["users"])
    elif cmd.entity == "qos":
        out = list(doc["qos"])
    elif cmd.entity == "cluster":
        out = [{"name": cluster, "cluster": cluster}]
    else:
        out = associations(doc, cmd.tree)
    names = set(cmd.names) | set(_list(cmd.where.get("name")))
    if names:
        key = "account" if cmd.entity == "assoc" else "name"
        out = [r for r in out if r[key] in names]
    for key in ("account", "user"):
        wanted = set(_list(cmd.where.get(key)))
        if wanted and cmd.entity == "assoc":
            out = [r for r in out if r[key] in wanted]
        elif wanted and cmd.entity == "user" and key == "account":
            out = [r for r in out if r["default_account"] in wanted]
    return out


def _list(value: str | None) -> list[str]:
    return [v for v in (value or "").split(",") if v]


def associations(doc: Mapping[str, Any], tree: bool = False) -> list[dict]:
    """sacctmgr's association lines: each account (root first, then down the tree) and then
    its users, as ``show assoc`` lists them; with ``tree`` the account names indented by depth."""
    cluster = doc.get("cluster", "")
    qos = ",".join(sorted(q["name"] for q in doc["qos"]))
    by_parent: dict[str | None, list[dict]] = {}
    for a in doc["accounts"]:
        by_parent.setdefault(a["parent"] if a["name"] != "root" else None, []).append(a)
    out: list[dict] = []

    def walk(account: dict, depth: int) -> None:
        name = (" " * depth + account["name"]) if tree else account["name"]
        out.append({"cluster": cluster, "account": name, "user": "", "shares": account["shares"],
                    "qos": qos, "parent": account["parent"] or ""})
        for u in sorted(account["users"], key=lambda u: u["name"]):
            out.append({"cluster": cluster, "account": name, "user": u["name"], "shares": u["shares"], "qos": qos,
                        "parent": account["parent"] or ""})
        for child in sorted(by_parent.get(account["name"], []), key=lambda a: a["name"]):
            walk(child, depth + 1)

    for top in by_parent.get(None, []):
        walk(top, 0)
    return out


WITH_ASSOCIATIONS = ("user", "defaultaccount", "admin", "cluster", "account", "partition", "share", "maxjobs",
                     "maxnodes", "maxcpus", "maxsubmit", "maxwall", "maxcpumins", "qos", "defaultqos")


def render(cmd: Command, records: list[dict]) -> str:
    fields = FIELDS[cmd.entity]
    specs = []
    default = WITH_ASSOCIATIONS if cmd.entity == "user" and cmd.associations else DEFAULT[cmd.entity]
    for item in cmd.format or default:
        name, _, width = item.partition("%")
        key = name.lower()
        key = ALIASES.get(key, {}).get(cmd.entity, key)
        if key not in fields:
            raise SacctmgrError(f"Unknown field '{name}'")
        header, default_width, get = fields[key]
        try:
            w = int(width) if width else default_width
        except ValueError:
            raise SacctmgrError(f"Invalid width in format: {item}") from None
        specs.append((header, w, get))
    lines = []
    if cmd.parsable2:
        end = cmd.parsable
        if not cmd.noheader:
            lines.append("|".join(h for h, _, _ in specs) + end)
        lines += ["|".join(get(r) for _, _, get in specs) + end for r in records]
    else:
        if not cmd.noheader:
            lines.append("".join(_cell(h, w) + " " for h, w, _ in specs))
            lines.append("".join("-" * abs(w) + " " for _, w, _ in specs))
        lines += ["".join(_cell(get(r), w) + " " for _, w, get in specs) for r in records]
    return "".join(line + "\n" for line in lines)


def _cell(value: str, width: int) -> str:
    """sacctmgr's print_fields_str: right-aligned (left with a negative width), cut to width-1 and '+'."""
    size = abs(width)
    if len(value) > size:
        value = value[:size - 1] + "+"
    return value.ljust(size) if width < 0 else value.rjust(size)
