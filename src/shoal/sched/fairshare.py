"""Fair-share: decayed usage over an account tree, and Slurm's *classic* fair-share factor.

Which algorithm: Slurm's classic one (``PriorityFlags=NO_FAIR_TREE``, documented in
slurm.schedmd.com/classic_fair_share.html), not Fair Tree. For an association (a user in
an account, or an account):

* normalised shares ``S = (S_self / S_siblings) * (S_parent / S_parent_siblings) * ...``,
  where the siblings of a node are every user *and* sub-account of its parent account;
* normalised usage ``U = raw usage / raw usage of root`` (an account's raw usage is the sum
  over everything below it);
* effective usage ``UE = U`` directly under root, else
  ``UE = U + (UE_parent - U) * S_self / S_siblings`` (raw shares at that level), so an
  account's history is shared out to its members in proportion to their shares;
* factor ``F = 2^(-UE / S)``; 0 for an association with no shares; 1 with no usage at all.

Usage is charged in GPU-seconds or CPU-seconds (``Multifactor.usage_tres``) and decays
continuously with PriorityDecayHalfLife ``h``: a run holding ``R`` of the resource from
``s`` to ``e`` counts ``R * integral of 2^(-(now - t) / h) dt`` over ``[s, e]`` (Slurm decays
in PriorityCalcPeriod steps; this is the limit of that). ``h == 0``: no decay.

Usage charged to an association the tree does not have (a user or account since removed
from the configuration) counts nowhere, not even in root's total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from shoal.model.accounting import ROOT, Account, UsageRecord, UserShare

Association = tuple[str, str]  # (account, user)


class AccountTreeError(ValueError):
    """An account tree that cannot be used: the message names the account."""


@dataclass(frozen=True)
class Usage:
    """Decayed usage of one association, in resource-seconds."""

    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0

    def of(self, tres: str) -> float:
        return self.gpu_seconds if tres == "gpu" else self.cpu_seconds


@dataclass(frozen=True)
class ShareRow:
    """One line of sshare: an account (``user`` None) or a user's association with it."""

    account: str
    user: str | None
    depth: int  # root is 0
    raw_shares: int | None  # None for root
    norm_shares: float
    raw_usage: float
    norm_usage: float
    effective_usage: float
    fairshare: float | None  # users only: the factor their jobs get


class AccountTree:
    """The account hierarchy under ``root``, checked once: unique names, known parents, no cycles.

    An account named ``root`` in the input contributes users directly under root (its
    shares and parent are ignored). A user's default account is the first account, in the
    order given, that lists the user.
    """

    def __init__(self, accounts: Iterable[Account]) -> None:
        accounts = list(accounts)
        self.accounts: dict[str, Account] = {}
        self.root_users: tuple[UserShare, ...] = ()
        for acct in accounts:
            if acct.name == ROOT:
                self.root_users += acct.users
                continue
            if acct.name in self.accounts:
                raise AccountTreeError(f"account {acct.name} is defined twice")
            if acct.shares < 0:
                raise AccountTreeError(f"account {acct.name}: shares must be 0 or more")
            self.accounts[acct.name] = acct
        self.children: dict[str, list[str]] = {ROOT: []}
        for acct in self.accounts.values():
            self.children.setdefault(acct.name, [])
        for acct in self.accounts.values():
            parent = acct.parent or ROOT
            if parent not in self.children:
                raise AccountTreeError(f"account {acct.name}: parent account {parent} is not defined")
            if parent == acct.name:
                raise AccountTreeError(f"account {acct.name} cannot be its own parent")
            self.children[parent].append(acct.name)
        reached = self._walk_names()
        stranded = sorted(set(self.accounts) - reached)
        if stranded:
            raise AccountTreeError(f"accounts {', '.join(stranded)} form a cycle: none of them "
                                   f"leads up to root")
        self.default_account: dict[str, str] = {}
        for acct in accounts:
            seen: set[str] = set()
            for u in acct.users:
                if u.name in seen:
                    raise AccountTreeError(f"account {acct.name} lists user {u.name} twice")
                if u.shares < 0:
                    raise AccountTreeError(f"account {acct.name}: user {u.name}'s shares must be 0 or more")
                seen.add(u.name)
                self.default_account.setdefault(u.name, acct.name)

    @classmethod
    def flat(cls, users: Iterable[str]) -> "AccountTree":
        """Every user directly under root with one share: fair-share without a configured tree."""
        return cls([Account(ROOT, users=tuple(UserShare(u) for u in sorted(set(users))))])

    def _walk_names(self) -> set[str]:
        reached: set[str] = set()
        stack = [ROOT]
        while stack:
            name = stack.pop()
            for child in self.children.get(name, ()):
                if child not in reached:
                    reached.add(child)
                    stack.append(child)
        return reached

    def users_of(self, account: str) -> tuple[UserShare, ...]:
        return self.root_users if account == ROOT else self.accounts[account].users

    def has(self, account: str, user: str) -> bool:
        if account != ROOT and account not in self.accounts:
            return False
        return any(u.name == user for u in self.users_of(account))

    def association(self, user: str, account: str | None) -> Association | None:
        """The (account, user) a job charges: its account, else the user's default; None if unknown."""
        if account is None:
            account = self.default_account.get(user)
            if account is None:
                return None
        return (account, user) if self.has(account, user) else None

    @property
    def empty(self) -> bool:
        return not self.accounts and not self.root_users


def _decayed(amount: int, start: float, end: float, now: float, half_life_s: float) -> float:
    end = min(end, now)
    if amount <= 0 or end <= start:
        return 0.0
    if half_life_s <= 0:
        return amount * (end - start)
    k = math.log(2) / half_life_s
    return amount * (math.exp(-k * (now - end)) - math.exp(-k * (now - start))) / k


def decayed_usage(records: Iterable[UsageRecord], now: float,
                  half_life_s: float) -> dict[tuple[str | None, str], Usage]:
    """Usage per (account, user) as of ``now``, each second weighted ``2^(-age / half_life)``.

    A record still running (``end`` None) counts up to ``now``. ``half_life_s`` 0: no decay.
    The account is the record's own (None: the user's default, resolved by the tree).
    """
    gpu: dict[tuple[str | None, str], float] = {}
    cpu: dict[tuple[str | None, str], float] = {}
    for r in records:
        key = (r.account, r.user)
        end = now if r.end is None else r.end
        gpu[key] = gpu.get(key, 0.0) + _decayed(r.gpus, r.start, end, now, half_life_s)
        cpu[key] = cpu.get(key, 0.0) + _decayed(r.cpus, r.start, end, now, half_life_s)
    return {key: Usage(gpu[key], cpu[key]) for key in gpu}


def charged(tree: AccountTree, usage: Mapping[tuple[str | None, str], Usage],
            tres: str = "gpu") -> dict[Association, float]:
    """The usage each association of ``tree`` is charged, in ``tres``-seconds."""
    out: dict[Association, float] = {}
    for (account, user), u in usage.items():
        assoc = tree.association(user, account)
        if assoc is not None:
            out[assoc] = out.get(assoc, 0.0) + u.of(tres)
    return out


def share_view(tree: AccountTree, usage: Mapping[Association, float]) -> list[ShareRow]:
    """sshare's rows, depth first from root (an account's users before its sub-accounts)."""
    account_usage: dict[str, float] = {}

    def total(account: str) -> float:
        raw = sum(usage.get((account, u.name), 0.0) for u in tree.users_of(account))
        raw += sum(total(child) for child in tree.children[account])
        account_usage[account] = raw
        return raw

    root_raw = total(ROOT)
    norm = (lambda raw: raw / root_raw) if root_raw > 0 else (lambda raw: 0.0)
    rows = [ShareRow(ROOT, None, 0, None, 1.0, root_raw, norm(root_raw),
                     1.0 if root_raw > 0 else 0.0, None)]

    def visit(account: str, depth: int, norm_shares: float, effective: float) -> None:
        users = tree.users_of(account)
        subs = [tree.accounts[c] for c in tree.children[account]]
        level = sum(u.shares for u in users) + sum(a.shares for a in subs)

        def child(raw_shares: int, raw: float) -> tuple[float, float, float]:
            s = norm_shares * raw_shares / level if level else 0.0
            u = norm(raw)
            if depth == 0:
                ue = u
            else:
                ue = u + (effective - u) * (raw_shares / level if level else 0.0)
            return s, u, ue

        for user in users:
            raw = usage.get((account, user.name), 0.0)
            s, u, ue = child(user.shares, raw)
            factor = 2.0 ** (-ue / s) if s > 0 else 0.0
            rows.append(ShareRow(account, user.name, depth + 1, user.shares, s, raw, u, ue, factor))
        for sub in subs:
            raw = account_usage[sub.name]
            s, u, ue = child(sub.shares, raw)
            rows.append(ShareRow(sub.name, None, depth + 1, sub.shares, s, raw, u, ue, None))
            visit(sub.name, depth + 1, s, ue)

    visit(ROOT, 0, 1.0, rows[0].effective_usage)
    return rows


def fairshare_factors(tree: AccountTree, usage: Mapping[Association, float]) -> dict[Association, float]:
    """The classic fair-share factor of every (account, user) association of ``tree``."""
    return {(r.account, r.user): r.fairshare for r in share_view(tree, usage)
            if r.user is not None and r.fairshare is not None}
