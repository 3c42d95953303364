"""The pure parts of job containment: what the node mounts, where the agent's own cgroup is,
which CPUs a job gets, what its limits are, and how an OOM kill ends a run."""

from __future__ import annotations

from pathlib import Path

from shoal.agent.cgroups import (favors_dynmods, job_limits, oom_kill_below, parse_cpu_list, parse_mounts, parse_own,
                                 pick_cpus)
from shoal.model.job import JobState, exit_code_text, run_end

HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/devices cgroup rw,relatime,devices 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
UNIFIED_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"


def test_a_hybrid_node_has_v1_controllers_and_a_cgroup2_mount():
    v1, v2 = parse_mounts(HYBRID_MOUNTS)
    assert v1["memory"] == Path("/sys/fs/cgroup/memory") and v1["freezer"] == Path("/sys/fs/cgroup/freezer")
    assert "cpu" not in v1 and "systemd" not in v1  # neither limits nor tracks a job here
    assert v2 == Path("/sys/fs/cgroup/unified")


def test_a_unified_node_has_only_cgroup2():
    v1, v2 = parse_mounts(UNIFIED_MOUNTS)
    assert v1 == {} and v2 == Path("/sys/fs/cgroup")


def test_favordynmods_on_any_cgroup_mount_is_seen_and_its_absence_too():
    assert not favors_dynmods(HYBRID_MOUNTS) and not favors_dynmods(UNIFIED_MOUNTS)
    assert favors_dynmods(HYBRID_MOUNTS.replace("cgroup2 rw,relatime", "cgroup2 rw,relatime,favordynmods"))
    assert favors_dynmods(UNIFIED_MOUNTS.replace("nsdelegate", "nsdelegate,favordynmods"))
    assert not favors_dynmods("tmpfs /favordynmods tmpfs rw,favordynmods 0 0\n")  # not a cgroup mount


def test_the_agents_own_cgroup_per_hierarchy():
    own_v1, own_v2 = parse_own("4:memory:/process_api/abc\n3:cpuset:/\n2:cpu,cpuacct:/x\n0::/system.slice/shoal.service\n")
    assert own_v1["memory"] == "/process_api/abc" and own_v1["cpuacct"] == "/x" and own_v1["cpuset"] == "/"
    assert own_v2 == "/system.slice/shoal.service"


def test_a_job_gets_the_least_used_cpus():
    assert pick_cpus([0, 1, 2, 3], {}, 2) == (0, 1)
    assert pick_cpus([0, 1, 2, 3], {0: 1, 1: 1}, 2) == (2, 3)
    assert pick_cpus([0, 1, 2, 3], {0: 2, 1: 1, 2: 1, 3: 1}, 1) == (1,)
    # More CPUs than the node has (a fake node advertising 64 on a 2-core machine): all of them.
    assert pick_cpus([0, 1], {0: 5}, 64) == (0, 1)


def test_cpu_lists_read_as_the_kernel_writes_them():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("") == []


def test_limits_deny_the_gpus_the_job_was_not_given():
    limits = job_limits(100, (1,), gpus=[1], node_gpus=[0, 1, 2, 3])
    assert limits.memory_bytes == 100 * 1024 * 1024
    assert limits.denied_gpus == (0, 2, 3)
    assert job_limits(None, None, [], []).memory_bytes is None


def test_an_oom_kill_ends_the_run_out_of_memory_with_slurms_exit_code():
    assert run_end(0, 0, oom_kills=1) == (JobState.OUT_OF_MEMORY, 0, 125)
    assert run_end(137, 0, oom_kills=2)[0] is JobState.OUT_OF_MEMORY
    state, code, sig = run_end(0, 0, oom_kills=1)
    assert exit_code_text(code, sig) == "0:125"
    assert run_end(0, 0) == (JobState.COMPLETED, 0, 0)
    assert run_end(3, 0) == (JobState.FAILED, 3, 0)
    assert run_end(0, 9) == (JobState.FAILED, 0, 9)


def test_v2_paths_controllers_and_limits_on_a_stand_in_hierarchy(tmp_path):
    """The v2 logic against a directory laid out as cgroupfs would be (the kernel's own files
    stand in as plain files): where the agent's hierarchy goes, which controllers it hands
    down, and what a job's limits write. The real cgroup2 story is in tests/integration."""
    from shoal.agent.cgroups import Limits, detect

    own = tmp_path / "system.slice" / "shoal.service"
    job = own / "shoal" / "node01-tag" / "job_7.0"
    job.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for d in (own, own / "shoal", own / "shoal" / "node01-tag", job):
        (d / "cgroup.subtree_control").write_text("")
    for name in ("memory.max", "memory.swap.max", "cpuset.cpus"):
        (job / name).write_text("")
    (own / "shoal" / "node01-tag" / "cpuset.cpus.effective").write_text("0-3\n")
    h = detect("v2", "node01-tag", mounts=f"cgroup2 {tmp_path} cgroup2 rw 0 0\n",
               self_cgroup="0::/system.slice/shoal.service\n")
    assert h.version == 2 and h.base == {"unified": own / "shoal" / "node01-tag"}
    assert h.controllers == ("memory", "cpuset", "cpu", "pids")  # io is not one Shoal limits
    assert h.online_cpus == [0, 1, 2, 3]
    cg = h.job("job_7.0", Limits(memory_bytes=100 << 20, cpus=(2,)))
    assert cg.paths == [job]
    assert (job / "memory.max").read_text() == str(100 << 20)
    assert (job / "memory.swap.max").read_text() == "0"
    assert (job / "cpuset.cpus").read_text() == "2"
    assert cg.sub("step_batch").paths == [job / "step_batch"]  # v2: steps have their own directory


def test_no_cgroup_mounted_means_uncontained_and_v1_asked_for_says_why(tmp_path):
    import pytest

    from shoal.agent.cgroups import CgroupError, detect

    assert detect("auto", "n", mounts="proc /proc proc rw 0 0\n", self_cgroup="") is None
    assert detect("off", "n") is None
    with pytest.raises(CgroupError, match="memory and freezer controllers are not mounted"):
        detect("v1", "n", mounts=UNIFIED_MOUNTS, self_cgroup="0::/\n")


KMSG_OOM = ("6,5123,24997677574,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=libpod-eb4f,"
            "mems_allowed=0,oom_memcg=/a/shoal/n1-1a2b3c4d/job_4.0,"
            "task_memcg=/a/shoal/n1-1a2b3c4d/job_4.0/container_app/libpod-eb4f,task=dd,pid=22164,uid=0\n")


def test_an_oom_kill_of_an_engines_container_is_found_in_the_kernel_log_below_its_cgroup():
    # v1 counts the kill in the engine's own cgroup, gone with the container: the kernel's log names it.
    below = "/a/shoal/n1-1a2b3c4d/job_4.0/container_app/"
    assert oom_kill_below(KMSG_OOM, below, 24997000000)
    assert not oom_kill_below(KMSG_OOM, below, 24998000000)  # before the run started: an earlier run's
    assert not oom_kill_below(KMSG_OOM, "/a/shoal/n1-1a2b3c4d/job_4.0/container_web/", 0)  # another container
    assert not oom_kill_below(KMSG_OOM, "/a/shoal/n1-1a2b3c4d/job_4.0/container_ap/", 0)  # not a prefix of a name
    assert not oom_kill_below("6,5122,24997677570,-;dd invoked oom-killer: gfp_mask=0xcc0\n", below, 0)
