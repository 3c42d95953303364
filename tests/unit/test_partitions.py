"""Partition changes (scontrol update PartitionName=): laid over the cluster file, kept in the store."""

from __future__ import annotations

import pytest

from shoal.cli.scontrol import UsageError, parse_update
from shoal.model.snapshot import Partition
from shoal.server import partitions
from shoal.server.jobs import JobError
from shoal.store.engine import make_engine, migrate, session_factory

CONFIGURED = (Partition("gpu", ("n1", "n2"), default=True), Partition("cpu", ("n3",), max_time_s=3600))


def test_changes_lay_over_the_configured_partitions_and_the_newest_default_wins():
    parts = partitions.apply_changes(CONFIGURED, {"cpu": {"state": "DOWN", "max_time_s": None, "default": True},
                                                  "gpu": {"nodes": ["n1"], "priority_job_factor": 5}})
    gpu, cpu = parts
    assert (gpu.nodes, gpu.priority_job_factor, gpu.default, gpu.state) == (("n1",), 5, False, "UP")
    assert (cpu.state, cpu.max_time_s, cpu.default) == ("DOWN", None, True)
    assert partitions.apply_changes(CONFIGURED, {}) == CONFIGURED


def test_changes_are_kept_in_the_store_and_checked(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'state.db'}")
    migrate(engine)
    sessions = session_factory(engine)
    with sessions() as s, s.begin():
        partitions.update(s, CONFIGURED, "cpu", {"state": "DRAIN"}, {"n1", "n2", "n3"}, now=1.0)
        partitions.update(s, CONFIGURED, "cpu", {"max_time_s": 60}, {"n1", "n2", "n3"}, now=2.0)
    with session_factory(make_engine(f"sqlite:///{tmp_path / 'state.db'}"))() as s:  # as a restarted server
        cpu = partitions.load(s, CONFIGURED)[1]
    assert (cpu.state, cpu.max_time_s) == ("DRAIN", 60)
    with sessions() as s:
        for name, body, message in [
            ("nope", {"state": "UP"}, "Invalid partition name specified"),
            ("cpu", {"state": "SIDEWAYS"}, "Invalid input: State=SIDEWAYS"),
            ("cpu", {"nodes": "n[3-4]"}, "Invalid node name specified: n4"),
            ("cpu", {"default": False}, "Default=NO"),
        ]:
            with pytest.raises(JobError, match=message.replace("[", r"\[")):
                partitions.update(s, CONFIGURED, name, body, {"n1", "n2", "n3"}, now=3.0)


def test_scontrol_reads_partition_updates_in_slurms_keys_and_units():
    kind, name, body = parse_update(["PartitionName=gpu", "state=drain", "MaxTime=UNLIMITED", "DefaultTime=90",
                                     "MaxNodes=4", "Default=yes", "PriorityJobFactor=3", "Nodes=n[1-2]"])
    assert (kind, name) == ("partition", "gpu")
    assert body == {"state": "DRAIN", "max_time_s": None, "default_time_s": 5400, "max_nodes": 4, "default": True,
                    "priority_job_factor": 3, "nodes": "n[1-2]"}
    for args, message in [(["State=FOO"], "Invalid input: State=FOO"), (["MaxTime=bogus"], "Invalid input MaxTime"),
                          (["Bogus=1"], "Update of this parameter is not supported: bogus=1"),
                          ([], "No changes specified")]:
        with pytest.raises(UsageError, match=message):
            parse_update(["PartitionName=gpu", *args])
