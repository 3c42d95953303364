"""Fair-share as an administrator reads it in sshare: decayed usage and classic factors, exactly."""

from __future__ import annotations

import math

import pytest

from shoal.model.accounting import Account, UsageRecord, UserShare
from shoal.sched.fairshare import (
    AccountTree,
    AccountTreeError,
    Usage,
    charged,
    decayed_usage,
    fairshare_factors,
    share_view,
)

NOW = 10_000.0
LN2 = math.log(2)


def users(*names: str) -> tuple[UserShare, ...]:
    return tuple(UserShare(n) for n in names)


def test_usage_without_decay_is_resource_seconds():
    got = decayed_usage([UsageRecord("alice", "a", gpus=2, cpus=16, start=NOW - 100, end=NOW)], NOW, 0)
    assert got == {("a", "alice"): Usage(200.0, 1600.0)}


def test_a_run_that_ended_one_half_life_ago_counts_half_as_much_as_one_ending_now():
    recent = UsageRecord("alice", "a", gpus=1, cpus=1, start=NOW - 100, end=NOW)
    old = UsageRecord("bob", "b", gpus=1, cpus=1, start=NOW - 200, end=NOW - 100)
    got = decayed_usage([recent, old], NOW, half_life_s=100)
    # integral of 2^-(age/100) over ages [0, 100] is 100/ln2 * (1 - 1/2); over [100, 200] half that
    assert got[("a", "alice")].gpu_seconds == pytest.approx(50 / LN2)
    assert got[("b", "bob")].gpu_seconds == pytest.approx(25 / LN2)


def test_a_running_job_counts_up_to_now_and_a_future_one_not_at_all():
    got = decayed_usage([UsageRecord("alice", None, gpus=0, cpus=8, start=NOW - 50, end=None),
                         UsageRecord("bob", None, gpus=4, cpus=8, start=NOW + 10, end=None)], NOW, 0)
    assert got[(None, "alice")] == Usage(0.0, 400.0)
    assert got[(None, "bob")] == Usage(0.0, 0.0)


def test_two_teams_the_one_that_used_everything_gets_a_quarter():
    tree = AccountTree([Account("a", users=users("alice")), Account("b", users=users("bob"))])
    # alice: S = 1/2, UE = U = 1 -> 2^-(1/0.5); bob: no usage -> 1
    assert fairshare_factors(tree, {("a", "alice"): 100.0}) == {("a", "alice"): 0.25, ("b", "bob"): 1.0}


def test_an_idle_member_of_a_busy_account_inherits_part_of_its_usage():
    tree = AccountTree([Account("a", users=users("alice", "carol")), Account("b", users=users("bob"))])
    f = fairshare_factors(tree, {("a", "alice"): 100.0})
    # carol: S = 1/4, UE = 0 + (1 - 0) * 1/2 = 0.5 -> 2^-2; alice: UE = 1 -> 2^-4
    assert f == {("a", "alice"): 0.0625, ("a", "carol"): 0.25, ("b", "bob"): 1.0}


def test_three_level_tree_follows_the_classic_formulas():
    tree = AccountTree([
        Account("org"), Account("teamA", parent="org", users=users("alice")),
        Account("teamB", parent="org", shares=3, users=users("bob")),
        Account("other", users=users("dave")),
    ])
    usage = {("teamA", "alice"): 30.0, ("teamB", "bob"): 10.0, ("other", "dave"): 60.0}
    rows = {(r.account, r.user): r for r in share_view(tree, usage)}
    # org: S = .5, U = UE = .4. teamA: S = .125, UE = .3 + (.4 - .3) * 1/4 = .325.
    # teamB: S = .375, UE = .1 + (.4 - .1) * 3/4 = .325. dave: S = .5, UE = .6.
    assert rows[("org", None)].norm_shares == 0.5
    assert rows[("org", None)].effective_usage == pytest.approx(0.4)
    assert rows[("teamA", None)].norm_shares == 0.125
    assert rows[("teamA", None)].effective_usage == pytest.approx(0.325)
    assert rows[("teamB", None)].effective_usage == pytest.approx(0.325)
    assert rows[("teamA", "alice")].fairshare == pytest.approx(2 ** -2.6)
    assert rows[("teamB", "bob")].fairshare == pytest.approx(2 ** (-0.325 / 0.375))
    assert rows[("other", "dave")].fairshare == pytest.approx(2 ** -1.2)
    assert rows[("root", None)].raw_usage == 100.0
    assert [(r.account, r.user, r.depth) for r in share_view(tree, usage)] == [
        ("root", None, 0), ("org", None, 1), ("teamA", None, 2), ("teamA", "alice", 3),
        ("teamB", None, 2), ("teamB", "bob", 3), ("other", None, 1), ("other", "dave", 2)]


def test_no_usage_anywhere_gives_everyone_one_and_no_shares_gives_zero():
    tree = AccountTree([Account("a", users=(UserShare("alice"), UserShare("idle", shares=0)))])
    assert fairshare_factors(tree, {}) == {("a", "alice"): 1.0, ("a", "idle"): 0.0}


def test_jobs_without_an_account_charge_the_users_default_and_strangers_count_nowhere():
    tree = AccountTree([Account("a", users=users("alice")), Account("b", users=users("alice"))])
    usage = {(None, "alice"): Usage(5.0, 50.0), ("b", "alice"): Usage(1.0, 10.0),
             (None, "mallory"): Usage(99.0, 99.0)}
    assert charged(tree, usage, "gpu") == {("a", "alice"): 5.0, ("b", "alice"): 1.0}
    assert charged(tree, usage, "cpu") == {("a", "alice"): 50.0, ("b", "alice"): 10.0}


@pytest.mark.parametrize("accounts, message", [
    ([Account("a"), Account("a")], "account a is defined twice"),
    ([Account("a", parent="nope")], "parent account nope is not defined"),
    ([Account("a", parent="b"), Account("b", parent="a")], "form a cycle"),
    ([Account("a", users=users("x", "x"))], "lists user x twice"),
])
def test_a_broken_tree_is_refused_naming_the_account(accounts, message):
    with pytest.raises(AccountTreeError, match=message):
        AccountTree(accounts)
