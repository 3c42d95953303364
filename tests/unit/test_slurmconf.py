"""A site's slurm.conf as a cluster file: what is taken, what is warned about, what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.server.config import parse_cluster_config
from shoal.server.slurmconf import SlurmConfError, convert, import_files, to_yaml

SITE = """\
ClusterName=site
SlurmctldHost=head   # the controller: Shoal's server instead
SchedulerType=sched/backfill
SchedulerParameters=bf_window=60,bf_continue,bf_busy_nodes
PriorityType=priority/multifactor
PriorityWeightFairshare=100
KillWait=10
FirstJobId=1000
NodeName=DEFAULT CPUs=64 RealMemory=512000 \\
    Gres=gpu:a100:4
NodeName=gpu[01-04] Feature=a100
NodeName=cpu01 CPUs=32 RealMemory=128000 CpuSpecList=0
PartitionName=DEFAULT MaxTime=1-00:00:00
PartitionName=gpu Nodes=gpu[01-04] Default=YES DefaultTime=1:00:00
PartitionName=all Nodes=ALL MaxTime=INFINITE OverSubscribe=NO
"""


def test_partitions_nodes_and_policy_are_taken_and_every_unused_key_named():
    imported = convert(SITE)
    config = parse_cluster_config(imported.config)
    assert [(p.name, p.nodes, p.default, p.max_time_s, p.default_time_s) for p in config.partition_list()] == [
        ("gpu", ("gpu01", "gpu02", "gpu03", "gpu04"), True, 86400, 3600),
        ("all", ("cpu01", "gpu01", "gpu02", "gpu03", "gpu04"), False, None, None)]
    assert config.cluster_name == "site" and config.scheduler.bf_window_s == 3600
    assert config.priority.type == "multifactor" and config.priority.weight_fairshare == 100
    assert config.nodes.kill_wait_s == 10
    gpu01 = next(n for n in imported.nodes if n.name == "gpu01")
    assert (gpu01.cpus, gpu01.memory_mb, gpu01.gpus, gpu01.gpu_type, gpu01.features) == (64, 512000, 4, "a100",
                                                                                         ["a100"])
    assert imported.warnings == [
        "line 4: SchedulerParameters bf_busy_nodes not used by Shoal (ignored)",
        "line 8: firstjobid not used by Shoal (ignored)",
        "line 12: NodeName=cpu01: cpuspeclist not used by Shoal (ignored)",
        "line 15: PartitionName=all: oversubscribe not used by Shoal (ignored)",
        "not used by Shoal, which has its own daemons, plugins and paths (ignored): slurmctldhost"]


@pytest.mark.parametrize("text, message", [
    ("NodeName=a CPUs=4\n", "no PartitionName line"),
    ("PartitionName=p Nodes=ALL\n", "Nodes=ALL but no NodeName line"),
    ("NodeName=a CPUs=four\nPartitionName=p Nodes=a\n", "line 1: 'four' is not a number"),
    ("just words\n", "line 1: 'just' is not Key=Value"),
])
def test_what_cannot_become_a_cluster_file_is_refused_with_its_line(text, message):
    with pytest.raises(SlurmConfError, match=message):
        convert(text)


def test_the_superpod_example_with_its_gres_and_topology_files():
    example = Path(__file__).resolve().parents[2] / "examples" / "slurm-superpod" / "slurm.conf"
    imported = import_files(example)
    config = parse_cluster_config(imported.config)
    assert [p.name for p in config.partition_list()] == ["gpu-train", "gpu-finetune", "gpu-eval"]
    assert config.topology is not None and config.topology.tree(None).leaf_of["dgx127"] == "su4"
    assert {(n.gpus, n.gpu_type) for n in imported.nodes} == {(8, "h100")}
    assert "#   dgx[001-127]: shoal agent --name NODE --cpus 224 --memory 2000000M --feature h100 --feature ib" \
           in to_yaml(imported, "slurm.conf")
