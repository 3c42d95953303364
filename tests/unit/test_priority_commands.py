"""sprio and sshare render the server's answers as Slurm's commands do; the config feeds them."""

from __future__ import annotations

import pytest

from shoal.cli import sprio, sshare
from shoal.server.config import ConfigError, parse_cluster_config

WEIGHTS = {"type": "multifactor", "site": 0, "age": 1000, "fairshare": 10000, "jobsize": 100,
           "partition": 1000, "qos": 2000}
JOB = {"job_id": 12, "array_job_id": None, "array_task_id": None, "user": "alice", "account": "team-a",
       "qos": "high", "partition": "gpu", "priority": 13025, "site": 0, "age": 500.0,
       "fairshare": 10000.0, "jobsize": 25.0, "partition_priority": 500.0, "qos_priority": 2000.4,
       "nice": 0, "factors": {"age": 0.5, "fairshare": 1.0, "jobsize": 0.25, "partition": 0.5, "qos": 1.0}}


def test_sprio_default_columns_and_weights_line():
    doc = {"weights": WEIGHTS, "jobs": [JOB]}
    out = sprio.render_priorities(doc, sprio.parse_args([]))
    assert out.splitlines() == [
        "          JOBID PARTITION     USER   PRIORITY       SITE        AGE  FAIRSHARE    JOBSIZE  PARTITION        QOS",
        "             12 gpu          alice      13025          0        500      10000         25        500       2000",
    ]
    weights = sprio.render_priorities(doc, sprio.parse_args(["-w", "-h"]))
    assert weights.split() == ["Weights", "1", "1000", "10000", "100", "1000", "2000"]


def test_sprio_long_and_normalised():
    doc = {"weights": WEIGHTS, "jobs": [JOB]}
    assert sprio.render_priorities(doc, sprio.parse_args(["-l", "-h"])).split() == [
        "12", "gpu", "alice", "team-a", "13025", "0", "500", "10000", "25", "500", "high", "2000", "0"]
    assert sprio.render_priorities(doc, sprio.parse_args(["-n", "-h"])).split()[4:] == [
        "0", "0.5000000", "1.0000000", "0.2500000", "0.5000000", "1.0000000"]


SHARES = {"user": "bob", "shares": [
    {"account": "root", "user": None, "depth": 0, "raw_shares": None, "norm_shares": 1.0, "raw_usage": 3600.4,
     "norm_usage": 1.0, "effective_usage": 1.0, "fairshare": None},
    {"account": "team-a", "user": None, "depth": 1, "raw_shares": 1, "norm_shares": 0.5, "raw_usage": 3600.4,
     "norm_usage": 1.0, "effective_usage": 1.0, "fairshare": None},
    {"account": "team-a", "user": "alice", "depth": 2, "raw_shares": 1, "norm_shares": 0.5,
     "raw_usage": 3600.4, "norm_usage": 1.0, "effective_usage": 1.0, "fairshare": 0.25},
    {"account": "team-b", "user": None, "depth": 1, "raw_shares": 1, "norm_shares": 0.5, "raw_usage": 0,
     "norm_usage": 0.0, "effective_usage": 0.0, "fairshare": None},
    {"account": "team-b", "user": "bob", "depth": 2, "raw_shares": 1, "norm_shares": 0.5, "raw_usage": 0,
     "norm_usage": 0.0, "effective_usage": 0.0, "fairshare": 1.0},
]}


def test_sshare_shows_accounts_and_only_the_callers_associations_unless_asked():
    out = sshare.render_shares(SHARES, sshare.parse_args([]), "bob").splitlines()
    assert out[0] == ("             Account       User  RawShares  NormShares    RawUsage  EffectvUsage  FairShare ")
    assert out[1] == "-------------------- ---------- ---------- ----------- ----------- ------------- ---------- "
    assert out[2].split() == ["root", "1.000000", "3600", "1.000000"]
    assert [line.split()[:2] for line in out[3:]] == [["team-a", "1"], ["team-b", "1"], ["team-b", "bob"]]
    assert out[5].split() == ["team-b", "bob", "1", "0.500000", "0", "0.000000", "1.000000"]
    everyone = sshare.render_shares(SHARES, sshare.parse_args(["-a", "-P", "-n"]), "bob").splitlines()
    assert everyone[2] == "  team-a|alice|1|0.500000|3600|1.000000|0.250000"
    assert len(sshare.render_shares(SHARES, sshare.parse_args(["-u", "alice", "-n"]), "bob").splitlines()) == 4


def test_default_configuration_keeps_basic_priority_and_only_normal_qos():
    c = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "n1"}]})
    assert c.priority.type == "basic" and c.account_list() == () and c.qos_list() == ()
    assert c.partition_list()[0].priority_job_factor == 1


def test_nested_accounts_get_their_parent_and_typos_are_refused():
    c = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "n1"}], "accounts": [
        {"name": "org", "shares": 2, "accounts": [{"name": "a", "users": ["alice", {"name": "bob", "shares": 3}]}]}]})
    org, a = c.account_list()
    assert (org.parent, a.parent, [(u.name, u.shares) for u in a.users]) == (None, "org", [("alice", 1), ("bob", 3)])
    with pytest.raises(ConfigError, match="priority.weight_agee"):
        parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "n1"}], "priority": {"weight_agee": 1}})
    with pytest.raises(ConfigError, match="qos names must be unique"):
        parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "n1"}], "qos": [{"name": "x"}, {"name": "x"}]})
