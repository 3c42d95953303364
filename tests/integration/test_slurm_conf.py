"""A site migrates: `shoal up --slurm-conf` (the server's --slurm-conf) starts from its slurm.conf,
and sinfo shows its partitions with their limits; `shoal import-slurm-conf` writes the same as a
cluster file and names what it leaves out."""

from __future__ import annotations

from tests.integration.cluster import LocalCluster

SLURM_CONF = """\
ClusterName=site
SlurmctldHost=head
NodeName=DEFAULT CPUs=64 RealMemory=512000 Gres=gpu:a100:4
NodeName=node[01-02]
PartitionName=train Nodes=node01 Default=YES MaxTime=2-00:00:00
PartitionName=debug Nodes=node[01-02] MaxTime=30:00 MaxNodes=1
"""


def test_a_sites_slurm_conf_starts_the_cluster_and_sinfo_shows_its_partitions(tmp_path):
    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text(SLURM_CONF)
    cluster = LocalCluster(tmp_path / "c", extra=("--slurm-conf", str(conf)))
    try:
        cluster.up()
        out = cluster.run(["sinfo", "-h", "-o", "%P %l %D %N"]).stdout
        assert out.splitlines() == ["train* 2-00:00:00 1 node01", "debug 30:00 2 node[01-02]"]
        assert "ClusterName             = site" in cluster.run(["scontrol", "show", "config"]).stdout
        refused = cluster.run(["sbatch", "-p", "debug", "-N2", "--wrap", "true"], check=False)
        assert refused.returncode == 1 and "Batch job submission failed" in refused.stderr
        out = cluster.run(["shoal", "import-slurm-conf", str(conf)])
        assert out.stdout.splitlines()[1:3] == [
            "# warning: not used by Shoal, which has its own daemons, plugins and paths (ignored): slurmctldhost",
            "# Nodes join by running an agent each; to advertise what slurm.conf declares:"]
        assert "warning: not used by Shoal" in out.stderr
    finally:
        cluster.down()
