"""sacctmgr's grammar and tables, and the accounting changes it asks for, as pure functions."""

from __future__ import annotations

import pytest

from shoal.model.accounting import QOS, Account, UserShare
from shoal.server import accounting
from shoal.server.jobs import JobError
from shoal.slurm.sacctmgr import SacctmgrError, parse, render, rows

BASE = accounting.configured((Account("physics", None, 2, (UserShare("alice"),)),), (QOS("high", 10),))


def doc(state: accounting.Accounting) -> dict:
    return state.public("c1")


def test_the_cluster_files_accounts_are_the_initial_state_and_stored_records_lie_over_them():
    state = accounting.current(BASE, {})
    assert state.tree.default_account == {"alice": "physics"}
    recs, _ = accounting.change(state, "add", "user", ["bob"], {}, {"account": "physics", "fairshare": "3"}, "c1")
    stored = {k: v for k, v in recs.items() if BASE.get(k) != v}
    later = accounting.current(BASE, stored)  # as a restarted server reads the store
    assert later.tree.association("bob", None) is not None
    recs, _ = accounting.change(later, "delete", "qos", ["high"], {}, {}, "c1")
    tomb = {**stored, ("qos", "high"): {"deleted": True}}
    assert "high" not in accounting.current(BASE, tomb).qos_table


def test_a_users_default_account_is_the_one_sacctmgr_set():
    state = accounting.current(BASE, {})
    recs, _ = accounting.change(state, "add", "account", ["chem"], {}, {}, "c1")
    recs, _ = accounting.change(accounting._state(recs), "add", "user", ["alice"], {}, {"account": "chem"}, "c1")
    recs, _ = accounting.change(accounting._state(recs), "modify", "user", ["alice"], {},
                                {"defaultaccount": "chem"}, "c1")
    assert accounting._state(recs).tree.default_account["alice"] == "chem"


@pytest.mark.parametrize("op, kind, names, values, message", [
    ("add", "user", ["bob"], {"account": "nowhere"}, "This account 'nowhere' has not been added."),
    ("add", "account", ["x"], {"parent": "nowhere"}, "Parent account 'nowhere' doesn't exist."),
    ("add", "qos", ["q"], {"maxtrespu": "cpu=4"}, "Shoal keeps gres/gpu limits only"),
    ("add", "qos", ["q"], {"maxwall": "soon"}, "Invalid value for MaxWall: soon"),
    ("delete", "account", ["root"], {}, "You can't delete the root account"),
    ("modify", "account", ["physics"], {"parent": "physics"}, "cannot be its own parent"),
])
def test_changes_sacctmgr_would_refuse_are_refused_in_its_words(op, kind, names, values, message):
    with pytest.raises(JobError, match=message):
        accounting.change(accounting.current(BASE, {}), op, kind, names, {}, values, "c1")


def test_show_renders_sacctmgrs_columns_cut_with_a_plus_and_parsable_forms():
    state = doc(accounting.current(BASE, {}))
    cmd = parse(["show", "account"])
    assert render(cmd, rows(cmd, state)) == (
        "   Account                Descr                  Org \n"
        "---------- -------------------- -------------------- \n"
        "   physics              physics              physics \n"
        "      root default root account                 root \n")
    cmd = parse(["-p", "-n", "list", "assoc", "format=account%-5,user,share"])
    assert render(cmd, rows(cmd, state)) == "root||1|\nphysics||2|\nphysics|alice|1|\n"
    cmd = parse(["show", "qos", "format=name%4"])
    assert render(cmd, rows(cmd, state)).splitlines()[2:] == ["high ", "nor+ "]


@pytest.mark.parametrize("argv, message", [
    (["frobnicate", "account"], "Invalid command entered: frobnicate"),
    (["show", "widgets"], "No valid entity in show command"),
    (["modify", "qos", "normal"], "You didn't give me anything to set"),
    (["delete", "account"], "No conditions given"),
])
def test_command_lines_sacctmgr_cannot_read(argv, message):
    with pytest.raises(SacctmgrError, match=message):
        parse(argv)


def test_users_with_their_associations_as_snakemakes_account_check_reads_them():
    state = doc(accounting.current(BASE, {}))
    cmd = parse(["-n", "-s", "list", "user", "alice", "format=account%256"])
    assert render(cmd, rows(cmd, state)) == " " * 249 + "physics \n"
    cmd = parse(["-P", "-s", "show", "user"])
    assert render(cmd, rows(cmd, state)).splitlines()[1].split("|")[:7] == [
        "alice", "physics", "None", "c1", "physics", "", "1"]
