"""sacctmgr's accounts, users, associations and QOS, changed at run time over the cluster file's.

The cluster file gives the initial accounts (with their users' associations) and QOS; what an
administrator adds, modifies or deletes with sacctmgr is kept in the store (``AccountingRow``:
one whole record per account, user or QOS, or a tombstone) and laid over them, so it survives a
restart, every server sharing the store sees it, and the next scheduling pass uses it.
``current`` and ``change`` are pure: records in, records out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.model.accounting import DEFAULT_QOS, QOS, ROOT, Account, UserShare
from shoal.model.timefmt import TimeFormatError, parse_time_limit
from shoal.sched.fairshare import AccountTree, AccountTreeError
from shoal.sched.qos import qos_table
from shoal.server.jobs import JobError
from shoal.store.models import AccountingRow

KINDS = ("account", "user", "qos")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
ADMIN_LEVELS = {"none": "None", "operator": "Operator", "admin": "Administrator", "administrator": "Administrator"}
Records = dict[tuple[str, str], dict[str, Any]]  # (kind, name) -> record


@dataclass(frozen=True)
class Accounting:
    """The accounting state as it stands: the records, and what policy reads of them."""

    records: Records
    accounts: tuple[Account, ...]
    qos: tuple[QOS, ...]

    @cached_property
    def tree(self) -> AccountTree:
        return AccountTree(self.accounts)

    @cached_property
    def qos_table(self) -> dict[str, QOS]:
        return qos_table(self.qos)

    def public(self, cluster: str) -> dict[str, Any]:
        """GET /shoal/v1/accounting: every record by kind, in name order (as sacctmgr lists them)."""
        out: dict[str, Any] = {"cluster": cluster, "accounts": [], "users": [], "qos": []}
        for (kind, _), rec in sorted(self.records.items()):
            out["accounts" if kind == "account" else "users" if kind == "user" else "qos"].append(rec)
        return out


# ---------------------------------------------------------------------- records

def configured(accounts: tuple[Account, ...], qos: tuple[QOS, ...]) -> Records:
    """The cluster file's accounts, users and QOS as records (root and normal always exist)."""
    recs: Records = {("account", ROOT): _account_record(ROOT, None, 1, "default root account", ROOT)}
    for a in accounts:
        rec = recs.get(("account", a.name)) or _account_record(a.name, a.parent or ROOT, a.shares, a.name, a.name)
        rec["users"] = rec["users"] + [{"name": u.name, "shares": u.shares} for u in a.users]
        recs[("account", a.name)] = rec
    for a in accounts:
        for u in a.users:
            recs.setdefault(("user", u.name), {"name": u.name, "default_account": a.name, "admin_level": "None"})
    recs[("qos", DEFAULT_QOS)] = _qos_record(QOS(DEFAULT_QOS))
    for q in qos:
        recs[("qos", q.name)] = _qos_record(q)
    return recs


def _account_record(name: str, parent: str | None, shares: int, description: str, organization: str) -> dict:
    return {"name": name, "parent": parent, "shares": shares, "description": description,
            "organization": organization, "users": []}


def _qos_record(q: QOS) -> dict:
    return {"name": q.name, "priority": q.priority, "max_wall_s": q.max_wall_s,
            "max_gpus_per_user": q.max_gpus_per_user, "max_jobs_per_user": q.max_jobs_per_user,
            "max_submit_per_user": q.max_submit_per_user, "grp_gpus": q.grp_gpus, "grp_jobs": q.grp_jobs,
            "preempt": list(q.preempt), "preempt_mode": q.preempt_mode}


def current(base: Records, stored: Records) -> Accounting:
    """The cluster file's records with the stored ones over them (a tombstone deletes)."""
    recs = dict(base)
    for key, rec in stored.items():
        if rec.get("deleted"):
            recs.pop(key, None)
        else:
            recs[key] = rec
    return _state(recs)


def _state(recs: Records) -> Accounting:
    defaults = {name: rec.get("default_account") for (kind, name), rec in recs.items() if kind == "user"}
    accounts = []
    for (kind, name), rec in sorted(recs.items()):
        if kind != "account":
            continue
        users = tuple(UserShare(u["name"], u["shares"]) for u in rec["users"])
        # A user's default account comes first among its associations (AccountTree takes the first).
        accounts.append((0 if any(defaults.get(u.name) == name for u in users) else 1,
                         Account(name, None if name == ROOT else rec["parent"], rec["shares"], users)))
    accounts.sort(key=lambda pair: pair[0])
    qos = tuple(QOS(name=r["name"], priority=r["priority"], max_wall_s=r["max_wall_s"],
                    max_gpus_per_user=r["max_gpus_per_user"], max_jobs_per_user=r["max_jobs_per_user"],
                    max_submit_per_user=r["max_submit_per_user"], grp_gpus=r["grp_gpus"], grp_jobs=r["grp_jobs"],
                    preempt=tuple(r["preempt"]), preempt_mode=r["preempt_mode"])
                for (kind, _), r in sorted(recs.items()) if kind == "qos")
    return Accounting(recs, tuple(a for _, a in accounts), qos)


def load(session: Session, base: Records) -> Accounting:
    rows = session.scalars(select(AccountingRow).order_by(AccountingRow.updated)).all()
    return current(base, {(r.kind, r.name): r.record for r in rows})


def save(session: Session, before: Records, after: Records, now: float) -> None:
    """Store the records ``change`` changed (a tombstone for each one it removed)."""
    for key in set(before) | set(after):
        if before.get(key) == after.get(key):
            continue
        row = session.get(AccountingRow, key)
        if row is None:
            row = AccountingRow(kind=key[0], name=key[1], record={}, updated=now)
            session.add(row)
        row.record = after.get(key) or {"deleted": True}
        row.updated = now


# ---------------------------------------------------------------------- changes

def change(state: Accounting, op: str, kind: str, names: list[str], where: dict[str, str],
           values: dict[str, str], cluster: str) -> tuple[Records, list[str]]:
    """sacctmgr add/modify/delete of accounts, users (with their associations) or QOS: the new
    records and what sacctmgr prints of the change. Raises JobError in sacctmgr's words."""
    if kind not in KINDS:
        raise JobError(f"No valid entity in {op} command")
    recs = {k: _copy(v) for k, v in state.records.items()}
    handler = {("add", "account"): _add_account, ("add", "user"): _add_user, ("add", "qos"): _add_qos,
               ("modify", "account"): _modify_account, ("modify", "user"): _modify_user,
               ("modify", "qos"): _modify_qos, ("delete", "account"): _delete_account,
               ("delete", "user"): _delete_user, ("delete", "qos"): _delete_qos}.get((op, kind))
    if handler is None:
        raise JobError(f"Unknown option: {op}")
    lines = handler(recs, names, where, values, cluster)
    try:
        _state(recs).tree  # noqa: B018 (checks the tree: parents, cycles, shares)
    except AccountTreeError as e:
        raise JobError(str(e)) from None
    return recs, lines


def _copy(rec: dict) -> dict:
    return {k: ([dict(u) if isinstance(u, dict) else u for u in v] if isinstance(v, list) else v)
            for k, v in rec.items()}


def _unknown(values: dict[str, str], known: tuple[str, ...]) -> None:
    for key in values:
        if key not in known:
            raise JobError(f"Unknown option: {key}")


def _int(key: str, value: str, *, unlimited: bool = True) -> int | None:
    if unlimited and value in ("-1", "", "unlimited", "UNLIMITED"):
        return None
    try:
        n = int(value)
    except ValueError:
        raise JobError(f"Invalid value for {key}: {value}") from None
    if n < 0:
        raise JobError(f"Invalid value for {key}: {value}")
    return n


def _gpu_tres(key: str, value: str) -> int | None:
    """GrpTRES/MaxTRESPerUser: only gres/gpu is a limit Shoal keeps (gres/gpu=N, or -1 to clear)."""
    if value in ("-1", "", "gres/gpu=-1"):
        return None
    limits = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
    if set(limits) - {"gres/gpu"} or not limits:
        raise JobError(f"Invalid value for {key}: {value} (Shoal keeps gres/gpu limits only: {key}=gres/gpu=N)")
    return _int(key, limits["gres/gpu"])


def _names(names: list[str], where: dict[str, str], keys=("name", "names")) -> list[str]:
    out = list(names)
    for k in keys:
        if where.get(k):
            out += where[k].split(",")
    bad = [n for n in out if not _NAME.match(n)]
    if bad:
        raise JobError(f"Invalid name: {bad[0]!r} (letters, digits and _.@- only, at most 64)")
    return out


def apply(session: Session, state: Accounting, body: dict[str, Any], cluster: str, now: float) -> list[str]:
    """Make (or, with dry_run, only check) one sacctmgr change in the caller's transaction; what
    sacctmgr prints of it."""
    recs, lines = change(state, body["op"], body["kind"], body["names"], body["where"], body["set"], cluster)
    if not body.get("dry_run"):
        save(session, state.records, recs, now)
    return lines


def change_request(server, session: Session, body: dict[str, Any]) -> dict[str, list[str]]:
    """POST /shoal/v1/accounting: the change stored, then every server's accounting refreshed and
    the scheduler woken, so its next pass applies it."""
    with session.begin():
        lines = apply(session, server.accounting, body, server.config.cluster_name, server.clock())
    if not body.get("dry_run"):
        server.refresh_accounting()
        server.controller.wake()
    return {"lines": lines}


def _require(recs: Records, kind: str, names: list[str]) -> None:
    missing = [n for n in names if (kind, n) not in recs]
    if missing:
        raise JobError(f" Nothing modified\n  No such {kind}: {', '.join(missing)}")


def _add_account(recs: Records, names, where, values, cluster) -> list[str]:
    _unknown(values, ("parent", "description", "organization", "fairshare", "cluster", "name", "names"))
    names = _names(names, values)
    if not names:
        raise JobError("Need name of account to add.")
    parent = values.get("parent") or ROOT
    if ("account", parent) not in recs:
        raise JobError(f" Parent account '{parent}' doesn't exist.")
    new = [n for n in names if ("account", n) not in recs]
    if not new:
        raise JobError(" Nothing new added.")
    shares = _int("Fairshare", values.get("fairshare", "1"), unlimited=False)
    for n in new:
        recs[("account", n)] = _account_record(n, parent, shares or 0, values.get("description") or n,
                                               values.get("organization") or (n if parent == ROOT else
                                                                               recs[("account", parent)]["organization"]))
    lines = [" Adding Account(s)", *(f"  {n}" for n in new), " Settings",
             f"  Description     = {values.get('description') or 'Account Name'}",
             f"  Organization    = {values.get('organization') or 'Parent/Account Name'}",
             " Associations", *(f"  A = {n:<10.10} C = {cluster:<10.10}" for n in new), " Settings",
             f"  Parent        = {parent}"]
    return lines


def _add_user(recs: Records, names, where, values, cluster) -> list[str]:
    _unknown(values, ("account", "accounts", "defaultaccount", "fairshare", "adminlevel", "cluster", "name",
                      "names", "partition"))
    names = _names(names, values)
    if not names:
        raise JobError("Need name of user to add.")
    accounts = [a for a in (values.get("account") or values.get("accounts") or "").split(",") if a]
    default = values.get("defaultaccount") or (accounts[0] if accounts else None)
    if default and default not in accounts:
        accounts.insert(0, default)
    if not accounts:
        raise JobError(" Need a default account for these users to add.")
    for a in accounts:
        if ("account", a) not in recs:
            raise JobError(f" This account '{a}' has not been added.")
    shares = _int("Fairshare", values.get("fairshare", "1"), unlimited=False) or 0
    level = _admin_level(values.get("adminlevel", "none"))
    added_users, added_assocs = [], []
    for n in names:
        if ("user", n) not in recs:
            recs[("user", n)] = {"name": n, "default_account": default, "admin_level": level}
            added_users.append(n)
        for a in accounts:
            users = recs[("account", a)]["users"]
            if not any(u["name"] == n for u in users):
                users.append({"name": n, "shares": shares})
                added_assocs.append((n, a))
    if not added_users and not added_assocs:
        raise JobError(" Nothing new added.")
    lines = []
    if added_users:
        lines += [" Adding User(s)", *(f"  {n}" for n in added_users), " Settings",
                  f"  Default Account = {default}"]
    if added_assocs:
        lines += [" Associations ="]
        for n, a in added_assocs:
            lines.append(f"  U = {n:<9.9} A = {a:<10.10} C = {cluster:<10.10}")
    if values.get("fairshare"):
        lines += [" Non Default Settings", f"  Fairshare     = {shares}"]
    return lines


def _admin_level(value: str) -> str:
    level = ADMIN_LEVELS.get(value.lower())
    if level is None:
        raise JobError(f"Invalid AdminLevel: {value} (None, Operator or Administrator)")
    return level


QOS_KEYS = {"priority": "priority", "maxwall": "max_wall_s", "maxwalldurationperjob": "max_wall_s",
            "maxtrespu": "max_gpus_per_user", "maxtresperuser": "max_gpus_per_user",
            "maxjobspu": "max_jobs_per_user", "maxjobsperuser": "max_jobs_per_user",
            "maxsubmitjobspu": "max_submit_per_user", "maxsubmitpu": "max_submit_per_user",
            "maxsubmitjobsperuser": "max_submit_per_user", "grptres": "grp_gpus", "grpjobs": "grp_jobs",
            "preempt": "preempt", "preemptmode": "preempt_mode"}


def _qos_values(recs: Records, values: dict[str, str]) -> dict[str, Any]:
    _unknown(values, (*QOS_KEYS, "name", "names", "description"))
    out: dict[str, Any] = {}
    for key, value in values.items():
        field = QOS_KEYS.get(key)
        if field is None:
            continue
        if field == "max_wall_s":
            try:
                out[field] = None if value in ("-1", "") else parse_time_limit(value)
            except TimeFormatError:
                raise JobError(f"Invalid value for MaxWall: {value}") from None
        elif field in ("max_gpus_per_user", "grp_gpus"):
            out[field] = _gpu_tres(key, value)
        elif field == "preempt":
            listed = [q for q in value.lstrip("+-=").split(",") if q]
            missing = [q for q in listed if ("qos", q) not in recs]
            if missing:
                raise JobError(f"Invalid QOS name: {missing[0]}")
            out[field] = listed
        elif field == "preempt_mode":
            mode = value.lower()
            if mode not in ("cancel", "requeue", "off"):
                raise JobError(f"Invalid PreemptMode: {value} (Shoal acts on OFF, CANCEL and REQUEUE)")
            out[field] = mode
        else:
            out[field] = _int(key, value) or (0 if field == "priority" else None)
    return out


def _add_qos(recs: Records, names, where, values, cluster) -> list[str]:
    names = _names(names, values)
    if not names:
        raise JobError("Need name of qos to add.")
    settings = _qos_values(recs, values)
    new = [n for n in names if ("qos", n) not in recs]
    if not new:
        raise JobError(" Nothing new added.")
    for n in new:
        recs[("qos", n)] = {**_qos_record(QOS(n)), **settings}
    return [" Adding QOS(s)", *(f"  {n}" for n in new), " Settings", "  Description    = QOS Name",
            *(f"  {k:<15}= {v}" for k, v in values.items() if k not in ("name", "names"))]


def _modify_account(recs: Records, names, where, values, cluster) -> list[str]:
    _unknown(values, ("parent", "description", "organization", "fairshare"))
    names = _names(names, where)
    _require(recs, "account", names)
    if not values:
        raise JobError(" Nothing to modify: give set KEY=VALUE")
    for n in names:
        rec = recs[("account", n)]
        if "parent" in values:
            if ("account", values["parent"]) not in recs:
                raise JobError(f" Parent account '{values['parent']}' doesn't exist.")
            rec["parent"] = values["parent"]
        for key in ("description", "organization"):
            if key in values:
                rec[key] = values[key]
        if "fairshare" in values:
            rec["shares"] = _int("Fairshare", values["fairshare"], unlimited=False) or 0
    if set(values) - {"description", "organization"}:
        return [" Modified account associations...", *(f"  C = {cluster:<10.10} A = {n:<10.10}" for n in names)]
    return [" Modified accounts...", *(f"  {n}" for n in names)]


def _modify_user(recs: Records, names, where, values, cluster) -> list[str]:
    _unknown(values, ("defaultaccount", "adminlevel", "fairshare"))
    names = _names(names, where)
    _require(recs, "user", names)
    if not values:
        raise JobError(" Nothing to modify: give set KEY=VALUE")
    only = [a for a in (where.get("account") or where.get("accounts") or "").split(",") if a]
    lines: list[str] = []
    for n in names:
        user = recs[("user", n)]
        if "defaultaccount" in values:
            acct = values["defaultaccount"]
            if not any(u["name"] == n for u in recs.get(("account", acct), {}).get("users", [])):
                raise JobError(f" User {n} has no association with account {acct}: add it first")
            user["default_account"] = acct
        if "adminlevel" in values:
            user["admin_level"] = _admin_level(values["adminlevel"])
        if "fairshare" in values:
            shares = _int("Fairshare", values["fairshare"], unlimited=False) or 0
            for (kind, acct), rec in sorted(recs.items()):
                if kind == "account" and (not only or acct in only):
                    for u in rec["users"]:
                        if u["name"] == n:
                            u["shares"] = shares
                            lines.append(f"  C = {cluster:<10.10} A = {acct:<10.10} U = {n:<9.9}")
    if "fairshare" in values:
        return [" Modified user associations...", *lines]
    return [" Modified users...", *(f"  {n}" for n in names)]


def _modify_qos(recs: Records, names, where, values, cluster) -> list[str]:
    names = _names(names, where)
    _require(recs, "qos", names)
    if not values:
        raise JobError(" Nothing to modify: give set KEY=VALUE")
    settings = _qos_values(recs, values)
    for n in names:
        recs[("qos", n)].update(settings)
    return [" Modified qos...", *(f"  {n}" for n in names)]


def _delete_account(recs: Records, names, where, values, cluster) -> list[str]:
    names = _names(names, where)
    _require(recs, "account", names)
    if ROOT in names:
        raise JobError(" You can't delete the root account")
    for n in names:
        children = [a for (kind, a), rec in recs.items() if kind == "account" and rec["parent"] == n
                    and a not in names]
        if children:
            raise JobError(f" Error with request: Account {n} has child accounts ({', '.join(sorted(children))}): "
                           "delete or move them first")
    for n in names:
        del recs[("account", n)]
    for (kind, _), rec in recs.items():
        if kind == "user" and rec["default_account"] in names:
            rec["default_account"] = _first_account(recs, rec["name"])
    return [" Deleting accounts...", *(f"  {n}" for n in names)]


def _first_account(recs: Records, user: str) -> str | None:
    return next((a for (kind, a), rec in sorted(recs.items()) if kind == "account"
                 and any(u["name"] == user for u in rec["users"])), None)


def _delete_user(recs: Records, names, where, values, cluster) -> list[str]:
    names = _names(names, where)
    _require(recs, "user", names)
    only = [a for a in (where.get("account") or where.get("accounts") or "").split(",") if a]
    lines = []
    for (kind, acct), rec in sorted(recs.items()):
        if kind != "account" or (only and acct not in only):
            continue
        for n in names:
            if any(u["name"] == n for u in rec["users"]):
                rec["users"] = [u for u in rec["users"] if u["name"] != n]
                lines.append(f"  C = {cluster:<10.10} A = {acct:<10.10} U = {n:<9.9}")
    for n in names:
        left = _first_account(recs, n)
        if not only or left is None:
            del recs[("user", n)]
        elif recs[("user", n)]["default_account"] in only:
            recs[("user", n)]["default_account"] = left
    if only:
        return [" Deleting user associations...", *lines]
    return [" Deleting users...", *(f"  {n}" for n in names)]


def _delete_qos(recs: Records, names, where, values, cluster) -> list[str]:
    names = _names(names, where)
    _require(recs, "qos", names)
    if DEFAULT_QOS in names:
        raise JobError(f" You can't delete the default QOS ({DEFAULT_QOS})")
    for n in names:
        del recs[("qos", n)]
    for (kind, _), rec in recs.items():
        if kind == "qos":
            rec["preempt"] = [q for q in rec["preempt"] if q not in names]
    return [" Deleting QOS(s)...", *(f"  {n}" for n in names)]
