"""Topology-aware placement stories (Slurm's topology/tree) and the topology.conf parser."""

from __future__ import annotations

import pytest
from sched_cluster import alloc_of, job, nodes, partition, running, snapshot

from shoal.model.topology import Switch, Topology, TopologyError, parse_topology_conf
from shoal.sched import place, schedule
from shoal.sched.placement import ClusterState

TOPOLOGY_CONF = """\
# two racks of four under one spine
SwitchName=s0 Nodes=node[1-4]
SwitchName=s1 Nodes=node[5-8]   LinkSpeed=100
switchname=top switches=s[0-1]
"""


def two_racks():
    cluster = nodes("node", 8)
    return cluster, parse_topology_conf(TOPOLOGY_CONF)


def with_topology(snap, topology):
    from dataclasses import replace

    return replace(snap, topology=topology)


def test_topology_conf_nested_switches_and_hostlists():
    topo = parse_topology_conf(TOPOLOGY_CONF)
    assert topo.leaf_of == {**{f"node{i}": "s0" for i in range(1, 5)},
                            **{f"node{i}": "s1" for i in range(5, 9)}}
    assert topo.parent_of == {"s0": "top", "s1": "top"}
    assert topo.path("s1") == ("s1", "top")


def test_topology_conf_three_levels():
    topo = parse_topology_conf("SwitchName=l0 Nodes=a[1-2]\nSwitchName=l1 Nodes=b[1-2]\n"
                               "SwitchName=l2 Nodes=c1\nSwitchName=mid Switches=l[0-1]\n"
                               "SwitchName=core Switches=mid,l2\n")
    assert topo.path("l0") == ("l0", "mid", "core")
    assert topo.path("l2") == ("l2", "core")


@pytest.mark.parametrize("text, message", [
    ("SwitchName=s0 Nodes=n1\nSwitchName=s1 Nodes=n1\n", "node n1 is under both switch s0 and s1"),
    ("SwitchName=top Switches=s9\n", "unknown switch s9"),
    ("SwitchName=s0\n", "neither Nodes= nor Switches="),
    ("SwitchName=s0 Nodes=n[1-\n", "line 1"),
    ("SwitchName=s0 Nodez=n1\n", "unknown key nodez"),
    ("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", "inside itself"),
])
def test_topology_conf_errors_name_the_problem(text, message):
    with pytest.raises(TopologyError, match=message):
        parse_topology_conf(text)


def test_topology_puts_a_4_node_job_under_one_switch_when_it_can():
    cluster, topo = two_racks()
    busy = running(9, {"node2": (1, 1000, tuple(range(8)))})  # one node of s0 is busy
    snap = with_topology(snapshot(cluster, [partition("gpu", cluster)],
                                  [job(1, nodes=4, gpus_per_node=4)], [busy]), topo)
    plan = schedule(snap)
    assert alloc_of(plan, 1) == {f"node{i}": (1, 1000, (0, 1, 2, 3)) for i in range(5, 9)}


def test_without_topology_the_same_job_straddles_both_switches():
    cluster, _ = two_racks()
    busy = running(9, {"node2": (1, 1000, tuple(range(8)))})
    plan = schedule(snapshot(cluster, [partition("gpu", cluster)],
                             [job(1, nodes=4, gpus_per_node=4)], [busy]))
    assert set(alloc_of(plan, 1)) == {"node1", "node3", "node4", "node5"}


def test_best_fit_among_switches_prefers_the_partly_used_one():
    cluster, topo = two_racks()
    busy = running(9, {"node6": (1, 1000, (0,))})  # both switches have 4 nodes that fit
    plan = schedule(with_topology(snapshot(cluster, [partition("gpu", cluster)],
                                           [job(1, nodes=4, gpus_per_node=4)], [busy]), topo))
    assert set(alloc_of(plan, 1)) == {"node5", "node6", "node7", "node8"}


def test_fewest_switches_when_no_single_switch_fits():
    # Three leaves of 2, 3 and 4 free nodes; a 6-node job takes the 4 and then the 2,
    # the smallest leaf that fills what is left, rather than spreading over all three.
    cluster = nodes("n", 9)
    topo = Topology.of([Switch("a", ("n1", "n2")), Switch("b", ("n3", "n4", "n5")),
                        Switch("c", ("n6", "n7", "n8", "n9")), Switch("top", switches=("a", "b", "c"))])
    plan = schedule(with_topology(snapshot(cluster, [partition("gpu", cluster)],
                                           [job(1, nodes=6, gpus_per_node=8)]), topo))
    assert sorted(alloc_of(plan, 1)) == ["n1", "n2", "n6", "n7", "n8", "n9"]


def test_the_lowest_common_switch_wins_over_a_wider_one():
    # pod p0 = leaves a, b (2 nodes each); pod p1 = leaves c, d (3 nodes each); a 4-node
    # job fits p0 exactly and p1 with room to spare: both are one level up, p0 fits best.
    cluster = nodes("n", 10)
    topo = Topology.of([Switch("a", ("n1", "n2")), Switch("b", ("n3", "n4")),
                        Switch("c", ("n5", "n6", "n7")), Switch("d", ("n8", "n9", "n10")),
                        Switch("p0", switches=("a", "b")), Switch("p1", switches=("c", "d")),
                        Switch("core", switches=("p0", "p1"))])
    state = ClusterState(cluster)
    got = place(job(1, nodes=4, gpus_per_node=8).request, state, topology=topo)
    assert sorted(got.allocation.node_names) == ["n1", "n2", "n3", "n4"]


def test_a_job_that_does_not_fit_anywhere_still_waits_for_resources():
    cluster, topo = two_racks()
    busy = running(9, {f"node{i}": (1, 1000, (0,)) for i in range(1, 8)})
    plan = schedule(with_topology(snapshot(cluster, [partition("gpu", cluster)],
                                           [job(1, nodes=2, gpus_per_node=8)], [busy]), topo))
    assert plan.reasons == {1: "Resources"}


def test_single_node_jobs_keep_best_fit():
    cluster, topo = two_racks()
    busy = running(9, {"node6": (1, 1000, (0,))})
    plan = schedule(with_topology(snapshot(cluster, [partition("gpu", cluster)],
                                           [job(1, gpus_per_node=1)], [busy]), topo))
    assert alloc_of(plan, 1) == {"node6": (1, 1000, (1,))}


def test_cluster_config_reads_topology_conf_next_to_it_or_inline(tmp_path):
    from shoal.server.config import ConfigError, load_cluster_config, parse_cluster_config

    (tmp_path / "topology.conf").write_text(TOPOLOGY_CONF)
    (tmp_path / "cluster.yaml").write_text(
        "partitions: [{name: gpu, nodes: 'node[1-8]'}]\ntopology: {file: topology.conf}\n")
    assert load_cluster_config(tmp_path / "cluster.yaml").topology_tree() == parse_topology_conf(TOPOLOGY_CONF)

    inline = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "node[1-8]"}], "topology": {
        "switches": [{"name": "s0", "nodes": "node[1-4]"}, {"name": "s1", "nodes": "node[5-8]"},
                     {"name": "top", "switches": "s[0-1]"}]}})
    assert inline.topology_tree() == parse_topology_conf(TOPOLOGY_CONF)
    assert parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "n1"}]}).topology_tree() is None

    with pytest.raises(ConfigError, match="topology: .*node n1 is under both switch a and b"):
        parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "n1"}], "topology": {
            "switches": [{"name": "a", "nodes": "n1"}, {"name": "b", "nodes": "n1"}]}})
    (tmp_path / "missing.yaml").write_text(
        "partitions: [{name: gpu, nodes: n1}]\ntopology: {file: nowhere.conf}\n")
    with pytest.raises(ConfigError, match="cannot read topology file"):
        load_cluster_config(tmp_path / "missing.yaml")
