"""The cluster file's scheduling sections, parsed once for the server and the simulator.

``partitions``, ``priority``, ``accounts``, ``qos`` and ``cluster_name`` mean the same to
``shoal server`` (server/config.py adds the server-only sections: scheduler, nodes,
topology, serving, containers, auth) and to ``shoal simulate`` (sim/cluster.py adds
``sim_nodes``). Both read them here, from the parsed YAML, without pydantic, so the
simulator stays free of the server. Names follow slurm.conf and sacctmgr (DefaultTime,
MaxTime, PriorityWeightAge, PriorityMaxAge, PriorityDecayHalfLife, PriorityJobFactor,
Fairshare, MaxWall, GrpJobs); times are slurm.conf time strings (``7-0``, ``1:00:00``) or
bare minutes. Errors name the field: ``partitions[0].max_time: ...``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Mapping

from shoal.model.accounting import DEFAULT_QOS, QOS, ROOT, Account, UserShare
from shoal.model.hostlist import HostlistError, expand
from shoal.model.snapshot import Partition
from shoal.model.timefmt import TimeFormatError, parse_time_limit
from shoal.sched.config import Multifactor, SchedConfigError
from shoal.sched.fairshare import AccountTree, AccountTreeError

SECTIONS = frozenset({"cluster_name", "partitions", "priority", "accounts", "qos"})

_PARTITION_KEYS = {"name", "nodes", "default", "default_time", "max_time", "max_nodes", "state",
                   "priority_job_factor"}
_PRIORITY_KEYS = {"type", "weight_age", "weight_fairshare", "weight_jobsize", "weight_partition",
                  "weight_qos", "max_age", "decay_half_life", "favor_small", "usage_tres"}
_ACCOUNT_KEYS = {"name", "parent", "shares", "users", "accounts"}
_USER_KEYS = {"name", "shares"}
_QOS_KEYS = {"name", "priority", "max_wall", "max_gpus_per_user", "max_jobs_per_user",
             "max_submit_per_user", "grp_gpus", "grp_jobs", "preempt", "preempt_mode"}
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")  # accounts, users, QOS (sacctmgr's names)
_PARTITION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ClusterFileError(ValueError):
    """A section of the cluster file is wrong; the message names the field."""


@dataclass(frozen=True)
class Priority(Multifactor):
    """The ``priority:`` section: PriorityType plus the multifactor weights and half-life."""

    type: str = "basic"  # PriorityType: basic or multifactor

    def multifactor(self) -> Multifactor:
        return Multifactor(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Multifactor)})


@dataclass(frozen=True)
class ClusterFile:
    """The sections the server and the simulator share, as the scheduler's snapshot holds them."""

    cluster_name: str
    partitions: tuple[Partition, ...]
    priority: Priority
    accounts: tuple[Account, ...]
    qos: tuple[QOS, ...]


def parse_cluster_file(data: Mapping[str, Any]) -> ClusterFile:
    """The shared sections of a parsed cluster file; other top-level keys are left to the caller."""
    if not isinstance(data, Mapping):
        raise ClusterFileError("expected a mapping at the top level")
    name = data.get("cluster_name", "shoal")
    if not isinstance(name, str):
        raise ClusterFileError(f"cluster_name: expected a string, got {name!r}")
    accounts = _accounts(data.get("accounts"), "accounts")
    try:
        AccountTree(accounts)
    except AccountTreeError as e:
        raise ClusterFileError(f"accounts: {e}") from None
    return ClusterFile(name, _partitions(data.get("partitions")), _priority(data.get("priority")),
                       accounts, _qos(data.get("qos")))


def _partitions(entries: Any) -> tuple[Partition, ...]:
    if not entries or not isinstance(entries, list):
        raise ClusterFileError("partitions: a list of at least one partition is required")
    parts: list[Partition] = []
    for at, entry in _named_entries(entries, "partitions", _PARTITION_KEYS):
        if "nodes" not in entry:
            raise ClusterFileError(f"{at}: 'name' and 'nodes' are required")
        try:
            nodes = tuple(expand(_string(entry["nodes"], f"{at}.nodes")))
        except HostlistError as e:
            raise ClusterFileError(f"{at}.nodes: invalid hostlist: {e}") from None
        max_nodes = entry.get("max_nodes")
        parts.append(Partition(
            name=_name(entry["name"], f"{at}.name", _PARTITION_NAME),
            nodes=nodes,
            default=_bool(entry.get("default", False), f"{at}.default"),
            default_time_s=_time(entry.get("default_time"), f"{at}.default_time"),
            max_time_s=_time(entry.get("max_time"), f"{at}.max_time"),
            max_nodes=None if max_nodes is None else _int(max_nodes, f"{at}.max_nodes", least=1),
            state=_string(entry.get("state", "UP"), f"{at}.state"),
            priority_job_factor=_int(entry.get("priority_job_factor", 1), f"{at}.priority_job_factor"),
        ))
    names = [p.name for p in parts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ClusterFileError(f"partitions: partition names must be unique: {', '.join(dup)}")
    if sum(p.default for p in parts) > 1:
        raise ClusterFileError("partitions: only one partition may have default: true")
    if not any(p.default for p in parts):  # Slurm: the first is the default when none is marked
        parts[0] = dataclasses.replace(parts[0], default=True)
    return tuple(parts)


def _priority(entry: Any) -> Priority:
    entry = _mapping(entry or {}, _PRIORITY_KEYS, "priority")
    kind = entry.get("type", "basic")
    if kind not in ("basic", "multifactor"):
        raise ClusterFileError(f"priority.type: expected basic or multifactor, not {kind!r}")
    weights = {k: _int(entry[k], f"priority.{k}") for k in ("weight_age", "weight_fairshare",
               "weight_jobsize", "weight_partition", "weight_qos") if k in entry}
    max_age = _time(entry.get("max_age", "7-0"), "priority.max_age")
    if not max_age:
        raise ClusterFileError("priority.max_age: must be a time greater than 0, e.g. 7-0 or 1:00:00")
    usage = entry.get("usage_tres", "gpu")
    if usage not in ("gpu", "cpu"):
        raise ClusterFileError(f"priority.usage_tres: expected gpu or cpu, not {usage!r}")
    try:
        return Priority(**weights, max_age_s=max_age,
                        decay_half_life_s=_time(entry.get("decay_half_life", "7-0"), "priority.decay_half_life") or 0,
                        favor_small=_bool(entry.get("favor_small", False), "priority.favor_small"),
                        usage_tres=usage, type=kind)
    except SchedConfigError as e:
        raise ClusterFileError(f"priority: {e}") from None


def _accounts(entries: Any, where: str, parent: str | None = None) -> tuple[Account, ...]:
    """The ``accounts:`` tree (``parent:`` or nested ``accounts:``), flattened."""
    out: list[Account] = []
    for at, entry in _named_entries(entries, where, _ACCOUNT_KEYS):
        name = _name(entry["name"], f"{at}.name")
        said = entry.get("parent")
        if parent is not None and said not in (None, parent):
            raise ClusterFileError(f"{at}: account {name} is nested under {parent} but says parent: {said}")
        if parent is None and name == ROOT and (said or entry.get("accounts")):
            raise ClusterFileError(f"{at}: account root is the top of the tree: give it only users")
        users = []
        for i, u in enumerate(entry.get("users") or ()):
            if isinstance(u, Mapping):
                u = _mapping(u, _USER_KEYS, f"{at}.users[{i}]")
                if "name" not in u:
                    raise ClusterFileError(f"{at}.users[{i}]: 'name' is required")
                users.append(UserShare(_name(u["name"], f"{at}.users[{i}].name"),
                                       _int(u.get("shares", 1), f"{at}.users[{i}].shares")))
            else:
                users.append(UserShare(_name(u, f"{at}.users[{i}]")))
        out.append(Account(name, parent or (None if said is None else _string(said, f"{at}.parent")),
                           _int(entry.get("shares", 1), f"{at}.shares"), tuple(users)))
        out.extend(_accounts(entry.get("accounts"), f"{at}.accounts", name))
    return tuple(out)


def _qos(entries: Any) -> tuple[QOS, ...]:
    out: list[QOS] = []
    for at, entry in _named_entries(entries, "qos", _QOS_KEYS):
        limits = {k: _int(entry[k], f"{at}.{k}") for k in ("max_gpus_per_user", "max_jobs_per_user",
                  "max_submit_per_user", "grp_gpus", "grp_jobs") if entry.get(k) is not None}
        mode = entry.get("preempt_mode", "cancel")
        if mode not in ("cancel", "requeue", "off"):
            raise ClusterFileError(f"{at}.preempt_mode: expected cancel, requeue or off, not {mode!r}")
        preempt = entry.get("preempt") or ()
        if not isinstance(preempt, (list, tuple)):
            raise ClusterFileError(f"{at}.preempt: expected a list of QOS names")
        out.append(QOS(name=_name(entry["name"], f"{at}.name"),
                       priority=_int(entry.get("priority", 0), f"{at}.priority"),
                       max_wall_s=_time(entry.get("max_wall"), f"{at}.max_wall"),
                       preempt=tuple(_string(q, f"{at}.preempt") for q in preempt),
                       preempt_mode=mode, **limits))
    names = [q.name for q in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ClusterFileError(f"qos: qos names must be unique: {', '.join(dup)}")
    known = set(names) | {DEFAULT_QOS}
    for q in out:
        unknown = [n for n in q.preempt if n not in known]
        if unknown:
            raise ClusterFileError(f"qos: qos {q.name}: preempt names unknown QOS {', '.join(unknown)}")
    return tuple(out)


def _named_entries(entries: Any, where: str, keys: set[str]) -> list[tuple[str, Mapping[str, Any]]]:
    """A list section's entries, each a mapping of known keys with a ``name``, and where each is."""
    if not entries:
        return []
    if not isinstance(entries, list):
        raise ClusterFileError(f"{where}: expected a list")
    out = []
    for i, entry in enumerate(entries):
        here = f"{where}[{i}]"
        entry = _mapping(entry, keys, here)
        if "name" not in entry:
            raise ClusterFileError(f"{here}: 'name' is required")
        out.append((here, entry))
    return out


def _mapping(entry: Any, keys: set[str], at: str) -> Mapping[str, Any]:
    if not isinstance(entry, Mapping):
        raise ClusterFileError(f"{at}: expected a mapping")
    unknown = set(entry) - keys
    if unknown:
        raise ClusterFileError(f"{at}: unknown keys {', '.join(f'{at}.{k}' for k in sorted(map(str, unknown)))}")
    return entry


def _time(value: Any, at: str) -> int | None:
    """Bare numbers are minutes (slurm.conf), strings are Slurm's time forms."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ClusterFileError(f"{at}: expected a time, got {value!r}")
    if isinstance(value, int):
        return value * 60
    try:
        return parse_time_limit(str(value))
    except TimeFormatError as e:
        raise ClusterFileError(f"{at}: {e}") from None


def _int(value: Any, at: str, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ClusterFileError(f"{at}: expected an integer >= {least}, got {value!r}")
    return value


def _bool(value: Any, at: str) -> bool:
    if not isinstance(value, bool):
        raise ClusterFileError(f"{at}: expected true or false, got {value!r}")
    return value


def _string(value: Any, at: str) -> str:
    if isinstance(value, (dict, list)) or value is None:
        raise ClusterFileError(f"{at}: expected a string, got {value!r}")
    return str(value)


def _name(value: Any, at: str, pattern: re.Pattern[str] = _NAME) -> str:
    name = _string(value, at)
    if not pattern.match(name):
        raise ClusterFileError(f"{at}: {name!r} is not a valid name (1 to 64 of {pattern.pattern[2:-7]})")
    return name
