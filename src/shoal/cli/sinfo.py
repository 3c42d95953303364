"""sinfo: partitions and nodes, printed the way Slurm's sinfo prints them.

The partition view has one line per (partition, node state) with the nodes in that state
as a compressed hostlist; -N has one line per (node, partition); -R one line per reason.
``render_sinfo(nodes, partitions, options, now)`` is pure; ``main`` fetches and prints.
"""

from __future__ import annotations

import json
import os
import sys
import time

from shoal.api_client import Client, ClientError, fail
from shoal.slurm.fmt import Field, FormatError, argument_parser, emit, parse_format, render, split_list
from shoal.model.hostlist import HostlistError, compress, expand, sort_key
from shoal.model.timefmt import format_duration, format_timestamp

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs the command's start-up time
    from collections.abc import Mapping
    from typing import Any

DEFAULT_FORMAT = "%#P %.5a %.10l %.6D %.6t %N"
LONG_FORMAT = "%#P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
NODE_FORMAT = "%#N %.6D %#P %6t"
NODE_LONG_FORMAT = "%#N %.6D %.9P %.11T %4c %.8z %.6m %.8d %.6w %.8f %20E"
SUMMARIZE_FORMAT = "%#P %.5a %.10l %.16F %N"  # sinfo -s: one line per partition
REASON_FORMAT = "%20E %9u %19H %N"
REASON_LONG_FORMAT = "%20E %12U %19H %6t %N"

# The Node object's display_state (sinfo's compact word) and the long word %T prints.
LONG_STATE = {"idle": "idle", "mix": "mixed", "alloc": "allocated", "drain": "drained",
              "drng": "draining", "down": "down", "maint": "maint"}
_STATE_ALIASES = {**{v: k for k, v in LONG_STATE.items()}, **{k: k for k in LONG_STATE},
                  "allocated": "alloc", "mixed": "mix"}
_UNUSABLE = frozenset({"drain", "drng", "down"})


class StateError(ValueError):
    """A --states value that names no node state."""


def parse_states(values: list[str]) -> set[str]:
    """``-t idle,drain`` to compact words; ``drain`` covers draining nodes too, as in Slurm."""
    states: set[str] = set()
    for value in values:
        word = _STATE_ALIASES.get(value.lower())
        if word is None:
            raise StateError(
                f"Invalid node state specified: {value} (expected one of "
                f"{', '.join(sorted(_STATE_ALIASES))})"
            )
        states.add(word)
        if word == "drain":
            states.add("drng")
    return states


def responding(node: Mapping[str, Any]) -> bool:
    """Whether the node answers; Slurm marks one that does not with ``*`` (``down*``)."""
    if node.get("responding") is False:
        return False
    return not (node.get("state") == "DOWN" and (node.get("reason") or "").startswith("Not responding"))


def _state_word(row: Mapping[str, Any], long: bool) -> str:
    if not row["nodes"]:
        return "n/a"
    word = row["state"]
    word = LONG_STATE.get(word, word) if long else word
    return word if all(responding(n) for n in row["nodes"]) else word + "*"


def _min_plus(values: list[int], exact: bool = False) -> str:
    """Slurm's ``250+``: the smallest value, with ``+`` when the group's values differ."""
    if not values:
        return "0"
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi or exact else f"{lo}+"


def _cpus_aiot(row: Mapping[str, Any], now: float) -> str:
    alloc = idle = other = total = 0
    for node in row["nodes"]:
        used = node.get("cpus_alloc") or 0
        total += node.get("cpus") or 0
        alloc += used
        if node.get("display_state") in _UNUSABLE or not responding(node):
            other += (node.get("cpus") or 0) - used
        else:
            idle += (node.get("cpus") or 0) - used
    return f"{alloc}/{idle}/{other}/{total}"


def _nodes_aiot(row: Mapping[str, Any], now: float) -> str:
    counts = {"alloc": 0, "idle": 0, "other": 0}
    for node in row["nodes"]:
        state = node.get("display_state")
        counts["other" if state in _UNUSABLE else "idle" if state == "idle" else "alloc"] += 1
    return f"{counts['alloc']}/{counts['idle']}/{counts['other']}/{len(row['nodes'])}"


def _partition(row: Mapping[str, Any], now: float) -> str:
    part = row.get("partition")
    if part is None:
        return "n/a"
    return part["name"] + ("*" if part.get("default") else "")


def _part_attr(fn):
    return lambda row, now: "n/a" if row.get("partition") is None else fn(row["partition"])


def _time_limit(key: str):
    def get(part: Mapping[str, Any]) -> str:
        value = part.get(key)
        return "infinite" if value is None else format_duration(value)
    return _part_attr(get)


def _job_size(part: Mapping[str, Any]) -> str:
    return f"1-{part['max_nodes']}" if part.get("max_nodes") else "1-infinite"


def _first(key: str):
    """A per-node attribute of a group (nodes in a group share it unless -e split them)."""
    return lambda row, now: row["nodes"][0].get(key) if row["nodes"] else None


def _sct(row: Mapping[str, Any], now: float) -> str:
    if not row["nodes"]:
        return "0:0:0"
    node = row["nodes"][0]
    sockets = node.get("sockets") or 1
    threads = node.get("threads_per_core") or 1
    cores = node.get("cores_per_socket") or (node.get("cpus") or 0) // (sockets * threads)
    return f"{sockets}:{cores}:{threads}"


FIELDS: dict[str, Field] = {
    "A": Field("NODES(A/I)", lambda r, now: "/".join(_nodes_aiot(r, now).split("/")[:2])),
    "a": Field("AVAIL", _part_attr(lambda p: (p.get("state") or "UP").lower())),
    "C": Field("CPUS(A/I/O/T)", _cpus_aiot),
    "c": Field("CPUS", lambda r, now: _min_plus([n.get("cpus") or 0 for n in r["nodes"]], r["exact"])),
    "D": Field("NODES", lambda r, now: len(r["nodes"])),
    "d": Field("TMP_DISK", lambda r, now: 0),
    "E": Field("REASON", lambda r, now: (r["nodes"][0].get("reason") if r["nodes"] else None) or "none"),
    "e": Field("FREE_MEM", lambda r, now: _min_plus(
        [(n.get("memory_mb") or 0) - (n.get("memory_alloc_mb") or 0) for n in r["nodes"]], r["exact"])),
    "F": Field("NODES(A/I/O/T)", _nodes_aiot),
    "f": Field("AVAIL_FEATURES", lambda r, now: ",".join(r["nodes"][0].get("features") or ())
               if r["nodes"] and r["nodes"][0].get("features") else "(null)"),
    "G": Field("GRES", lambda r, now: (r["nodes"][0].get("gres") if r["nodes"] else None) or "(null)"),
    "g": Field("GROUPS", _part_attr(lambda p: "all")),
    "H": Field("TIMESTAMP", lambda r, now: format_timestamp(r["nodes"][0].get("reason_time"))
               if r["nodes"] else "Unknown"),
    "h": Field("OVERSUBSCRIBE", _part_attr(lambda p: "NO")),
    "L": Field("DEFAULTTIME", _part_attr(
        lambda p: "n/a" if p.get("default_time_s") is None else format_duration(p["default_time_s"]))),
    "l": Field("TIMELIMIT", _time_limit("max_time_s")),
    "m": Field("MEMORY", lambda r, now: _min_plus([n.get("memory_mb") or 0 for n in r["nodes"]], r["exact"])),
    "N": Field("NODELIST", lambda r, now: compress(n["name"] for n in r["nodes"]), cut_header=False),
    "n": Field("HOSTNAMES", lambda r, now: compress(n["name"] for n in r["nodes"]), cut_header=False),
    "O": Field("CPU_LOAD", lambda r, now: "N/A"),
    "o": Field("NODE_ADDR", lambda r, now: ",".join(n.get("address") or n["name"] for n in r["nodes"])),
    "P": Field("PARTITION", _partition),
    "R": Field("PARTITION", _part_attr(lambda p: p["name"])),
    "r": Field("ROOT", _part_attr(lambda p: "no")),
    "s": Field("JOB_SIZE", _part_attr(_job_size)),
    "T": Field("STATE", lambda r, now: _state_word(r, long=True)),
    "t": Field("STATE", lambda r, now: _state_word(r, long=False)),
    "U": Field("USER", lambda r, now: (r["nodes"][0].get("reason_user") if r["nodes"] else None) or "Unknown"),
    "u": Field("USER", lambda r, now: (r["nodes"][0].get("reason_user") if r["nodes"] else None) or "Unknown"),
    "w": Field("WEIGHT", lambda r, now: 1),
    "z": Field("S:C:T", _sct),
}


def default_format(options) -> str:
    if options.format or os.environ.get("SINFO_FORMAT"):  # -o, or Slurm's input variable
        return options.format or os.environ["SINFO_FORMAT"]
    if options.list_reasons:
        return REASON_LONG_FORMAT if options.long else REASON_FORMAT
    if options.Node:
        return NODE_LONG_FORMAT if options.long else NODE_FORMAT
    if options.summarize:
        return SUMMARIZE_FORMAT
    return LONG_FORMAT if options.long else DEFAULT_FORMAT


def select_nodes(nodes: list[dict], options) -> list[dict]:
    states = parse_states(split_list(options.states)) if options.states else None
    wanted: set[str] = set()
    for item in options.nodes or ():
        wanted.update(expand(item))
    out = []
    for node in nodes:
        if states is not None and node.get("display_state") not in states:
            continue
        if wanted and node["name"] not in wanted:
            continue
        if options.dead and responding(node) and node.get("display_state") != "down":
            continue
        if options.list_reasons and node.get("display_state") not in _UNUSABLE:
            continue
        out.append(node)
    return sorted(out, key=lambda n: sort_key(n["name"]))


def rows_for(nodes: list[dict], partitions: list[dict], options) -> list[dict]:
    """The groups the view prints, each ``{partition, nodes, state, exact}``."""
    nodes = select_nodes(nodes, options)
    exact = bool(options.exact)
    wanted_parts = set(split_list(options.partition))
    parts = [p for p in partitions if not wanted_parts or p["name"] in wanted_parts]
    if options.list_reasons:
        groups: dict[tuple, list[dict]] = {}
        for node in nodes:
            key = (node.get("reason") or "none", node.get("reason_user"), node.get("reason_time"),
                   node.get("display_state") if options.long else None)
            groups.setdefault(key, []).append(node)
        return [{"partition": None, "nodes": g, "state": g[0].get("display_state"), "exact": exact}
                for g in groups.values()]
    if options.Node:
        rows = []
        for node in nodes:
            member = [p for p in parts if node["name"] in _part_nodes(p)]
            if not member and not wanted_parts:
                member = [None]
            for part in member:
                rows.append({"partition": part, "nodes": [node], "state": node.get("display_state"),
                             "exact": exact})
        return rows
    rows = []
    for part in parts:
        members = _part_nodes(part)
        groups = {}
        for node in nodes:
            if node["name"] in members:
                key = (None if options.summarize else node.get("display_state"),)
                if exact:
                    key += (node.get("cpus"), node.get("memory_mb"), node.get("gres"),
                            tuple(node.get("features") or ()))
                groups.setdefault(key, []).append(node)
        if not groups and not options.states and not options.nodes and not options.dead:
            rows.append({"partition": part, "nodes": [], "state": None, "exact": exact})
        for key, group in groups.items():
            rows.append({"partition": part, "nodes": group, "state": key[0], "exact": exact})
    return rows


def _part_nodes(part: Mapping[str, Any]) -> set[str]:
    if part.get("node_names") is not None:
        return set(part["node_names"])
    return set(expand(part.get("nodes") or ""))


def render_sinfo(nodes: list[dict], partitions: list[dict], options, now: float) -> str:
    """sinfo's table for these nodes and partitions (already fetched), as of ``now``."""
    specs = parse_format(default_format(options), FIELDS, kind="node")
    out = render(specs, rows_for(nodes, partitions, options), now, header=not options.noheader)
    if options.long and not options.noheader:
        out = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)) + "\n" + out
    return out


def render_json(nodes: list[dict], partitions: list[dict], options, now: float) -> str:
    """sinfo --json: ``nodes`` and ``partitions`` lists with Slurm's key names."""
    doc = {
        "nodes": [
            {
                "name": n["name"], "hostname": n["name"], "address": n.get("address"),
                "state": n.get("state"), "display_state": n.get("display_state"),
                "reason": n.get("reason") or "", "cpus": n.get("cpus"),
                "alloc_cpus": n.get("cpus_alloc"), "real_memory": n.get("memory_mb"),
                "alloc_memory": n.get("memory_alloc_mb"), "gres": n.get("gres") or "",
                "features": ",".join(n.get("features") or ()), "partitions": n.get("partitions") or [],
            }
            for n in select_nodes(nodes, options)
        ],
        "partitions": [
            {
                "name": p["name"], "nodes": p.get("nodes") or "", "default": bool(p.get("default")),
                "state": p.get("state"), "max_time": None if p.get("max_time_s") is None else p["max_time_s"] // 60,
                "default_time": None if p.get("default_time_s") is None else p["default_time_s"] // 60,
                "max_nodes": p.get("max_nodes"),
            }
            for p in partitions
            if not options.partition or p["name"] in split_list(options.partition)
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def parse_args(argv: list[str] | None):
    p = argument_parser("sinfo", "View nodes and partitions, as Slurm's sinfo.")
    p.add_argument("-N", "--Node", action="store_true", help="one line per node")
    p.add_argument("-l", "--long", action="store_true", help="long report")
    p.add_argument("-p", "--partition", action="append", help="comma list of partitions")
    p.add_argument("-t", "--states", action="append", help="comma list of node states")
    p.add_argument("-n", "--nodes", action="append", help="hostlist of nodes")
    p.add_argument("-h", "--noheader", action="store_true", help="no header line")
    p.add_argument("-o", "--format", help="output format, e.g. '%%P %%a %%D %%t %%N'")
    p.add_argument("-e", "--exact", action="store_true", help="group only identical nodes")
    p.add_argument("-s", "--summarize", action="store_true", help="one line per partition, node counts by state")
    p.add_argument("-R", "--list-reasons", action="store_true", help="why nodes are down or drained")
    p.add_argument("-d", "--dead", action="store_true", help="only non-responding or down nodes")
    p.add_argument("-i", "--iterate", type=float, metavar="SECONDS", help="repeat every N seconds")
    p.add_argument("--json", action="store_true", help="JSON output")
    p.add_argument("-a", "--all", action="store_true", help="accepted for compatibility")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("--help", action="help", help="show this help and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(argv)
        parse_format(default_format(options), FIELDS, kind="node")
        if options.states:
            parse_states(split_list(options.states))
        client = Client.from_config()
        while True:
            nodes = client.get("/shoal/v1/nodes", {"view": "sinfo"})["nodes"]  # only the keys it reads
            partitions = client.get("/shoal/v1/partitions")["partitions"]
            now = time.time()
            if options.json:
                emit(render_json(nodes, partitions, options, now))
            else:
                emit(render_sinfo(nodes, partitions, options, now) + ("\n" if options.iterate else ""))
            if not options.iterate:
                return 0
            time.sleep(options.iterate)
    except (ClientError, FormatError, StateError, HostlistError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
