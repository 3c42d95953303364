"""sacctmgr: an administrator adds accounts, users and QOS at run time; the next submissions and
scheduling passes honour them (kept in the store: tests/unit/test_sacctmgr.py), and users may only look."""

from __future__ import annotations

from tests.integration.cluster import wait_until


def test_an_administrator_adds_an_account_and_a_qos_and_the_next_pass_honours_them(cluster):
    sacctmgr = lambda *args, **kw: cluster.run(["sacctmgr", *args], **kw)  # noqa: E731
    out = sacctmgr("-i", "add", "account", "physics", "Description=particle physics", "Organization=science")
    assert out.stdout.splitlines()[:2] == [" Adding Account(s)", "  physics"]
    sacctmgr("-i", "add", "user", "root", "account=physics", "fairshare=10")
    sacctmgr("-i", "add", "qos", "small", "MaxTRESPU=gres/gpu=4", "Priority=10")
    assert sacctmgr("show", "account", "-P", "-n", "format=account,descr,org").stdout == (
        "physics|particle physics|science\nroot|default root account|root\n")
    assert sacctmgr("-P", "-n", "show", "user", "root").stdout == "root|physics|None\n"
    assert sacctmgr("-P", "-n", "show", "assoc", "format=account,user,share").stdout == (
        "root||1\nphysics||1\nphysics|root|10\n")
    assert sacctmgr("-n", "show", "qos", "small", "format=name,priority,maxtrespu%20").stdout == (
        "     small         10           gres/gpu=4 \n")
    # The account is now the user's default, and one it does not belong to is refused.
    first = cluster.sbatch("--qos=small", "--gpus=4", "--wrap", "sleep 60")
    assert cluster.job(first)["account"] == "physics"
    refused = cluster.run(["sbatch", "-A", "chemistry", "--wrap", "true"], check=False)
    assert refused.returncode == 1 and "is not in account chemistry" in refused.stderr
    # The QOS holds a second 4-GPU job back while the first runs; raising its limit lets it start.
    cluster.wait_for(first, states=("RUNNING",))
    second = cluster.sbatch("--qos=small", "--gpus=4", "--wrap", "sleep 60")
    wait_until(lambda: cluster.job(second)["reason"] == "QOSMaxGRESPerUser", 20, "the QOS limit's reason")
    out = sacctmgr("-i", "modify", "qos", "where", "name=small", "set", "MaxTRESPU=gres/gpu=8")
    assert out.stdout == " Modified qos...\n  small\n"
    cluster.wait_for(second, states=("RUNNING",))
    # Without -i sacctmgr asks; no answer keeps nothing.
    out = sacctmgr("delete", "qos", "small", input="n\n")
    assert out.stdout.endswith("(N/y):  Changes Discarded\n")
    assert "small" in sacctmgr("-P", "-n", "show", "qos", "format=name").stdout.split()
    cluster.run(["scancel", str(first), str(second)])


def test_users_may_look_but_only_operators_change_and_errors_read_as_sacctmgrs(cluster):
    alice = cluster.api("POST", "/shoal/v1/tokens", {"user": "alice", "role": "user"})["token"]
    as_alice = {"SHOAL_TOKEN": alice}
    assert cluster.run(["sacctmgr", "-P", "show", "qos", "format=name"], env=as_alice).stdout == "Name\nnormal\n"
    out = cluster.run(["sacctmgr", "-i", "add", "account", "x"], env=as_alice, check=False)
    assert out.returncode == 1 and "permission denied" in out.stderr.lower()
    out = cluster.run(["sacctmgr", "-i", "add", "user", "bob", "account=nowhere"], check=False)
    assert (out.returncode, out.stderr) == (1, " This account 'nowhere' has not been added.\n")
    out = cluster.run(["sacctmgr", "frobnicate", "account"], check=False)
    assert (out.returncode, out.stderr) == (1, "sacctmgr: error: Invalid command entered: frobnicate\n")
    out = cluster.run(["sacctmgr", "-i", "delete", "account", "root"], check=False)
    assert out.returncode == 1 and "can't delete the root account" in out.stderr
