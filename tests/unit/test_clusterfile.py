"""One parser for the cluster file's shared sections: the server and the simulator read the
same partitions, priority, accounts and QOS, and refuse the same mistakes in the same words."""

import re
from pathlib import Path

import pytest
import yaml

from shoal.server.config import ConfigError, parse_cluster_config
from shoal.sim.cluster import SimClusterError, parse_sim_cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "cluster-sim.yaml"
SIM_NODES = [{"names": "n[1-2]", "cpus": 8, "memory": "64G", "gpus": 2}]


def both(data: dict):
    server = parse_cluster_config({k: v for k, v in data.items() if k != "sim_nodes"})
    sim = parse_sim_cluster({"sim_nodes": SIM_NODES, **data})
    return server, sim


def test_server_and_simulator_read_the_example_cluster_file_alike():
    data = yaml.safe_load(EXAMPLE.read_text())
    server = parse_cluster_config({k: v for k, v in data.items() if k != "sim_nodes"})
    sim = parse_sim_cluster(data)
    assert server.partition_list() == sim.partitions and server.qos_list() == sim.qos
    assert server.account_list() == sim.accounts and server.cluster_name == sim.name
    assert server.priority.multifactor() == sim.multifactor and sim.qos[0].preempt == ("scavenger",)


def test_defaults_nesting_and_times_are_the_same_for_both():
    server, sim = both({"partitions": [{"name": "a", "nodes": "n1", "max_time": 90},
                                       {"name": "b", "nodes": "n2", "default_time": "1:00:00"}],
                        "priority": {"weight_age": 5, "max_age": "1-0", "decay_half_life": 0},
                        "accounts": [{"name": "org", "accounts": [{"name": "t", "users": [{"name": "u", "shares": 3}]}]}]})
    parts = server.partition_list()
    assert parts == sim.partitions and [p.default for p in parts] == [True, False]
    assert (parts[0].max_time_s, parts[1].default_time_s) == (5400, 3600)
    assert server.priority.type == "basic" and server.priority.weight_age == 5
    assert (sim.multifactor.max_age_s, sim.multifactor.decay_half_life_s) == (86400, 0)
    assert [(a.name, a.parent, a.users) for a in sim.accounts] == [(a.name, a.parent, a.users) for a in server.account_list()]
    assert sim.accounts[1].parent == "org" and sim.accounts[1].users[0].shares == 3


@pytest.mark.parametrize("section, message", [
    ({"partitions": [{"name": "a b", "nodes": "n1"}]}, "partitions[0].name: 'a b' is not a valid name"),
    ({"partitions": [{"name": "a", "nodes": "n[1-"}]}, "partitions[0].nodes: invalid hostlist"),
    ({"partitions": [{"name": "a", "nodes": "n1", "max_time": "soon"}]}, "partitions[0].max_time"),
    ({"partitions": [{"name": "a", "nodes": "n1"}, {"name": "a", "nodes": "n2"}]}, "partition names must be unique: a"),
    ({"priority": {"type": "fancy"}}, "priority.type: expected basic or multifactor"),
    ({"priority": {"max_age": 0}}, "priority.max_age: must be a time greater than 0"),
    ({"priority": {"weight_agee": 1}}, "priority: unknown keys priority.weight_agee"),
    ({"accounts": [{"name": "a", "parent": "nowhere"}]}, "accounts: "),
    ({"accounts": [{"name": "root", "accounts": [{"name": "x"}]}]}, "account root is the top of the tree"),
    ({"qos": [{"name": "q", "preempt": ["nope"]}]}, "qos q: preempt names unknown QOS nope"),
    ({"qos": [{"name": "q", "preempt_mode": "suspend"}]}, "qos[0].preempt_mode: expected cancel, requeue or off"),
    ({"qos": [{"name": "q", "max_jobs_per_user": -1}]}, "qos[0].max_jobs_per_user: expected an integer >= 0"),
])
def test_both_refuse_the_same_mistakes_in_the_same_words(section, message):
    data = {"partitions": [{"name": "gpu", "nodes": "n1"}], **section}
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_cluster_config(data)
    with pytest.raises(SimClusterError, match=re.escape(message)):
        parse_sim_cluster({"sim_nodes": SIM_NODES, **data})


def test_the_server_keeps_its_own_sections_and_checks_the_serving_partition():
    with pytest.raises(ConfigError, match="serving.partition: no partition named cpu"):
        parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "n1"}], "serving": {"partition": "cpu"}})
    with pytest.raises(ConfigError, match="scheduler.policy"):
        parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "n1"}], "scheduler": {"policy": "lottery"}})
    with pytest.raises(ConfigError, match="partitions: a list of at least one partition is required"):
        parse_cluster_config({"cluster_name": "x"})
