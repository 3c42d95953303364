"""Stories about containment: a job's memory limit is enforced by the kernel and the job ends
OUT_OF_MEMORY, a process that detached itself dies with its job, a job opens only its own
GPUs' device nodes, and a node without cgroups still runs jobs, with a warning.

One 1-node cluster with 2 fake GPUs (stand-in device nodes) serves the module; the
uncontained node is a second, small cluster. Needs root and cgroup v1 (this machine: hybrid)
or v2; the v2 story runs on a cgroup2 mount, with or without controllers.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from pathlib import Path

import pytest

from shoal.agent import cgroups
from tests.integration.cluster import LocalCluster, pid_alive, wait_until

NODE = "node01"  # shoal up names its nodes node01, node02...
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
V1, V2 = cgroups.parse_mounts(Path("/proc/self/mounts").read_text())

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are made by a root agent")
needs_v1 = pytest.mark.skipif("memory" not in V1, reason="no cgroup v1 memory controller on this machine")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    # As many CPUs as the machine has: a node advertising more gets no cpusets (docs/CGROUPS.md).
    c = LocalCluster(tmp_path_factory.mktemp("cgroups"), nodes=1, gpus_per_node=2, kill_wait=2.0,
                     cpus_per_node=len(os.sched_getaffinity(0)))
    c.up()
    yield c
    c.down()


def sacct(cluster, job_id: int) -> str:
    return cluster.run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,ExitCode"]).stdout.strip()


def jobdir(cluster, job_id: int) -> Path:
    return cluster.root / "state" / "nodes" / NODE / "jobs" / f"{job_id}.0"


@needs_v1
def test_agent_says_what_it_found(cluster):
    log = (cluster.root / "state" / "logs" / f"{NODE}.log").read_text()
    assert "cgroup v1 (controllers: freezer memory cpuset devices cpuacct)" in log, log


@needs_v1
def test_a_job_over_its_memory_ends_out_of_memory(cluster):
    # 400 MB of touched memory under --mem=100M: the kernel kills it, not the job's own exit.
    job_id = cluster.sbatch("--mem=100M", "--wrap",
                            "python3 -c \"b = b'x' * (400 * 1024 * 1024); print('survived')\"; exit 0")
    job = cluster.wait_for(job_id, states=ENDED, timeout=60)
    assert job["state"] == "OUT_OF_MEMORY", job
    assert sacct(cluster, job_id) == "OUT_OF_MEMORY|0:125"
    oom = cluster.run(["sacct", "-X", "-n", "-P", "-o", "JobID", "--state=OOM", "-S", "now-1hour"]).stdout.split()
    assert str(job_id) in oom, oom
    show = cluster.run(["scontrol", "show", "job", str(job_id)]).stdout
    assert "JobState=OUT_OF_MEMORY" in show and "ExitCode=0:125" in show, show
    squeue = cluster.run(["squeue", "-j", str(job_id), "-t", "all", "-h", "-o", "%T %t"]).stdout.strip()
    assert squeue in ("", "OUT_OF_MEMORY OOM"), squeue
    out = (cluster.workdir / f"slurm-{job_id}.out").read_text()
    assert "survived" not in out
    # Its cgroup is gone with it.
    assert not any((d / f"job_{job_id}.0").exists() for d in _bases(cluster))


@needs_v1
def test_a_job_within_its_memory_completes_and_its_processes_are_in_its_cgroup(cluster):
    marks = cluster.workdir / "inside.txt"
    job_id = cluster.sbatch("--mem=200M", "-c", "1", "--wrap",
                            f"cat /proc/self/cgroup > {marks}; grep Cpus_allowed_list /proc/self/status >> {marks}; "
                            f"cat $(grep memory /proc/self/cgroup | cut -d: -f3 | sed 's|^|/sys/fs/cgroup/memory|')"
                            f"/../memory.limit_in_bytes >> {marks}; python3 -c \"b = b'x' * (50 * 1024 * 1024)\"")
    job = cluster.wait_for(job_id, states=ENDED, timeout=30)
    assert job["state"] == "COMPLETED", job
    text = marks.read_text()
    name = cgroups.instance_name(NODE, cluster.root / "state" / "nodes" / NODE)
    assert f"shoal/{name}/job_{job_id}.0/step_batch" in text, text
    cpus = text.split("Cpus_allowed_list:")[1].split()[0]
    assert len(cgroups.parse_cpu_list(cpus)) == 1, f"one CPU asked, the job may run on {cpus}"
    assert str(200 * 1024 * 1024) in text.split(), text


def test_sacct_shows_what_the_batch_step_used(cluster):
    # ~200 MB touched and ~1 s of CPU burnt, read from the job's cgroup at its exit.
    burn = ("import time; b = bytearray(200 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); "
            "t = time.process_time()\nwhile time.process_time() - t < 1.2: pass")
    job_id = cluster.sbatch("--wrap", f"python3 -c \"{burn}\"")
    job = cluster.wait_for(job_id, states=ENDED, timeout=60)
    assert job["state"] == "COMPLETED", job
    out = cluster.run(["sacct", "-j", str(job_id), "-n", "-P", "-o",
                       "JobID,MaxRSS,TotalCPU,UserCPU,SystemCPU"]).stdout.split()
    lines = {line.split("|")[0]: line.split("|")[1:] for line in out}
    assert lines[str(job_id)][0] == "", f"a job line has no MaxRSS, as in Slurm: {out}"
    max_rss, total, user, system = lines[f"{job_id}.batch"]
    assert _kib(max_rss) >= 190 * 1024, out
    assert 0.8 <= _seconds(total) < 30, out
    assert _seconds(user) + _seconds(system) >= 0.7, out
    assert lines[str(job_id)][1] == total, "the job line's TotalCPU is its steps' sum"


def test_sacct_shows_what_each_srun_step_used_apart_from_the_batch_step(cluster):
    """Each srun step's line has its own MaxRSS (its cgroup's peak on its node, MaxRSSNode)
    and CPU times; the batch line is the script alone, as Slurm's batch step is, and the job
    line's TotalCPU is the sum of them all."""
    burn = ("import time; b = bytearray({mb} * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); "
            "t = time.process_time()\nwhile time.process_time() - t < {s}: pass")
    job_id = cluster.sbatch("-n2", script=f"""#!/bin/bash
srun -n1 python3 -c "{burn.format(mb=160, s=1.0)}"
srun -n2 python3 -c "{burn.format(mb=40, s=0.5)}"
""")
    job = cluster.wait_for(job_id, states=ENDED, timeout=90)
    assert job["state"] == "COMPLETED", job

    def lines():
        out = cluster.run(["sacct", "-j", str(job_id), "-n", "-P", "-o",
                           "JobID,MaxRSS,MaxRSSNode,TotalCPU,UserCPU,SystemCPU"]).stdout.split()
        got = {line.split("|")[0]: line.split("|")[1:] for line in out}
        return got if all(got.get(f"{job_id}.{s}", [""])[0] for s in ("batch", "0", "1")) else None

    got = wait_until(lines, 15, "every step's usage in sacct")
    batch, first, second = (got[f"{job_id}.{s}"] for s in ("batch", "0", "1"))
    assert _kib(first[0]) >= 150 * 1024 and first[1] == NODE, got
    assert 0.8 <= _seconds(first[2]) < 30 and _seconds(first[3]) + _seconds(first[4]) >= 0.7, got
    assert _kib(second[0]) >= 70 * 1024 and _seconds(second[2]) >= 0.8, f"two tasks' 40 MB and 0.5 s: {got}"
    assert _kib(batch[0]) < 150 * 1024, f"the batch step is the script alone, not its srun steps: {got}"
    total = sum(_seconds(got[f"{job_id}.{s}"][2]) for s in ("batch", "0", "1"))
    assert abs(_seconds(got[str(job_id)][2]) - total) < 0.01, got


def test_sstat_reads_a_running_steps_cgroups(cluster):
    # An srun step that holds ~150 MB and has burnt ~0.5 s of CPU, then waits to be read.
    hold = ("import time; b = bytearray(150 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); "
            "t = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(120)")
    job_id = cluster.sbatch("--wrap", f"srun python3 -c \"{hold}\"")

    def read():
        out = cluster.run(["sstat", "-j", str(job_id), "-n", "-P", "-o", "JobID,MaxRSS,AveCPU,NTasks,Nodelist"])
        line = out.stdout.strip()
        fields = line.split("|")
        done = line and _kib(fields[1] or "0") >= 140 * 1024 and _seconds(fields[2] or "00:00:00") >= 0.4
        return line if done else None

    try:
        line = wait_until(read, timeout=60, what=f"sstat never showed job {job_id}.0 holding 140M and 0.4 s of CPU")
        step, max_rss, ave_cpu, ntasks, nodes = line.split("|")
        assert (step, ntasks, nodes) == (f"{job_id}.0", "1", NODE), line
        assert _kib(max_rss) < 1024 * 1024 and _seconds(ave_cpu) < 30, line
        # -a adds the batch step; a step that is not running is named in Slurm's words.
        every = cluster.run(["sstat", "-a", "-j", str(job_id), "-n", "-P", "-o", "JobID"]).stdout.split()
        assert every == [f"{job_id}.batch", f"{job_id}.0"] or every == [f"{job_id}.0", f"{job_id}.batch"], every
        missing = cluster.run(["sstat", "-j", f"{job_id}.7", "-n", "-P"])
        assert missing.stdout == "" and missing.stderr == f"sstat: error: StepId={job_id}.7 not found running.\n"
        header = cluster.run(["sstat", "-j", f"{job_id}.batch", "-o", "JobID,MaxRSS"]).stdout.splitlines()
        assert header[:2] == ["JobID            MaxRSS ", "------------ ---------- "] and \
            header[2].startswith(f"{job_id}.batch"), header
    finally:
        cluster.run(["scancel", str(job_id)])
    cluster.wait_for(job_id, states=ENDED, timeout=30)
    gone = cluster.run(["sstat", "-j", str(job_id), "-n"])
    assert gone.stderr == f"sstat: error: No steps running for job {job_id}\n" and gone.returncode == 0, gone


def _kib(text: str) -> float:
    """sacct's ``1234K``, ``196M``, ``2.50G`` in KiB."""
    scale = {"K": 1, "M": 1024, "G": 1024 ** 2}
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text) / 1024


def _seconds(text: str) -> float:
    """sacct's ``MM:SS.mmm`` or ``[D-]HH:MM:SS`` in seconds."""
    days, _, rest = text.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    if "." in rest or len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (int(days or 0) * 24 + parts[0]) * 3600 + parts[1] * 60 + parts[2]


@needs_v1
def test_a_detached_process_dies_with_its_job(cluster):
    pidfile = cluster.workdir / "detached.pid"
    job_id = cluster.sbatch("--wrap", f"setsid nohup sleep 1000 > /dev/null 2>&1 < /dev/null & echo $! > {pidfile}; "
                                      "sleep 0.5")
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "the detached sleep's pid")
    pid = int(pidfile.read_text())
    listed = wait_until(lambda: cgroups.read_cgroup_list(jobdir(cluster, job_id)), 10, "JOBDIR/cgroups")
    assert all(p.is_dir() for p in listed), listed
    assert any(str(pid) in (p / "cgroup.procs").read_text().split() for p in listed)
    job = cluster.wait_for(job_id, states=ENDED, timeout=30)
    assert job["state"] == "COMPLETED", job
    assert not pid_alive(pid), "the detached sleep outlived its COMPLETED job"
    assert not any(p.exists() for p in listed), "the job's cgroups were not removed"


@needs_v1
def test_scancel_kills_a_detached_process_too(cluster):
    pidfile = cluster.workdir / "cancelled.pid"
    job_id = cluster.sbatch("--wrap", f"setsid nohup sleep 1000 > /dev/null 2>&1 < /dev/null & echo $! > {pidfile}; "
                                      "sleep 1000")
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "the detached sleep's pid")
    pid = int(pidfile.read_text())
    cluster.run(["scancel", str(job_id)])
    job = cluster.wait_for(job_id, states=ENDED, timeout=30)
    assert job["state"] == "CANCELLED", job
    assert not pid_alive(pid), "the detached sleep outlived its cancelled job"
    # The signals reached the script, not its supervisor: how it ended is still known.
    assert (job["exit_code"], job["signal"]) == (0, 15), job


@needs_v1
def test_a_job_opens_only_its_own_gpus_device_nodes(cluster):
    _only_its_own_gpus(cluster)


@pytest.mark.skipif(V2 is None, reason="no cgroup2 mount on this machine")
def test_on_cgroup_v2_a_job_opens_only_its_own_gpus_device_nodes(tmp_path):
    """v2 has no devices.deny: the agent attaches an eBPF device program to the job's cgroup
    (devbpf.py), and the stand-ins of the other job's GPU cannot be opened."""
    c = LocalCluster(tmp_path, nodes=1, gpus_per_node=2, kill_wait=2.0, extra=("--cgroups", "v2"))
    c.up()
    try:
        log = (c.root / "state" / "logs" / f"{NODE}.log").read_text()
        assert "cgroup v2" in log, log
        _only_its_own_gpus(c)
    finally:
        c.down()


@pytest.mark.skipif(V2 is None, reason="no cgroup2 mount on this machine")
def test_the_v2_device_program_denies_exactly_the_listed_devices(tmp_path):
    """devbpf's program on a real cgroup2 directory, several minors denied: a process inside
    gets EPERM for those, ENXIO (no driver) for the others of the major and for another
    major's stand-in; outside the cgroup, nothing is denied."""
    from shoal.agent.devbpf import deny_devices

    _, own = cgroups.parse_own(Path("/proc/self/cgroup").read_text())
    cg = V2 / own.lstrip("/") / f"shoal-devbpf-{os.getpid()}"
    cg.mkdir()
    try:
        for minor in (0, 1, 2, 3, 255):
            os.mknod(tmp_path / f"nvidia{minor}", 0o600 | 0o020000, os.makedev(cgroups.NVIDIA_MAJOR, minor))
        os.mknod(tmp_path / "other2", 0o600 | 0o020000, os.makedev(240, 2))
        deny_devices(cg, cgroups.NVIDIA_MAJOR, [3, 1])
        probe = ("import os, sys\nfor n in sys.argv[1:]:\n    try:\n        os.open(n, os.O_RDWR)\n"
                 "    except OSError as e:\n        print(os.path.basename(n), e.errno)\n")
        names = [str(tmp_path / n) for n in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidia255", "other2")]

        def opened(inside: bool) -> dict[str, int]:
            join = f"echo $$ > {cg}/cgroup.procs && " if inside else ""
            out = subprocess.run(["sh", "-c", f'{join}exec python3 -c "$0" "$@"', probe, *names], capture_output=True,
                                 text=True, check=True).stdout
            return {k: int(v) for k, v in (line.split() for line in out.splitlines())}

        enxio, eperm = errno.ENXIO, errno.EPERM  # no driver behind a stand-in; the program's refusal
        assert opened(True) == {"nvidia0": enxio, "nvidia1": eperm, "nvidia2": enxio, "nvidia3": eperm,
                                "nvidia255": enxio, "other2": enxio}
        assert set(opened(False).values()) == {enxio}
    finally:
        wait_until(lambda: not (cg / "cgroup.procs").read_text().split(), 10, "the probes to leave")
        cg.rmdir()


def _only_its_own_gpus(cluster) -> None:
    # GPU 0 goes to a first job; the second gets GPU 1 and may not open /dev/nvidia0's stand-in.
    holder = cluster.sbatch("--gres=gpu:1", "--wrap", "sleep 1000")
    cluster.wait_for(holder, states=("RUNNING",), timeout=30, settled=False)
    out = cluster.workdir / "devices.txt"
    job_id = cluster.sbatch("--gres=gpu:1", "--wrap", f"""
echo gpus=$SLURM_JOB_GPUS > {out}
for d in nvidia0 nvidia1 nvidiactl; do
  python3 -c "import os, sys
try:
    os.open(sys.argv[1], os.O_RDWR)
except OSError as e:
    print(sys.argv[2], os.strerror(e.errno))" $SHOAL_FAKE_DEVICE_DIR/$d $d >> {out}
done""")
    job = cluster.wait_for(job_id, states=ENDED, timeout=30)
    cluster.run(["scancel", str(holder)])
    assert job["state"] == "COMPLETED", job
    lines = dict(line.split(" ", 1) for line in out.read_text().splitlines()[1:])
    mine = out.read_text().splitlines()[0].split("=")[1]
    other = "0" if mine == "1" else "1"
    # The driver is absent: an allowed stand-in answers ENXIO, a denied one EPERM from the device cgroup.
    assert lines[f"nvidia{mine}"] == "No such device or address", lines
    assert lines[f"nvidia{other}"] == "Operation not permitted", lines
    assert lines["nvidiactl"] == "No such device or address", lines


@needs_v1
def test_srun_steps_run_in_their_own_cgroups(cluster):
    out = cluster.workdir / "steps.txt"
    job_id = cluster.sbatch("--wrap", f"srun grep -h freezer /proc/self/cgroup > {out}")
    job = cluster.wait_for(job_id, states=ENDED, timeout=30)
    assert job["state"] == "COMPLETED", job
    name = cgroups.instance_name(NODE, cluster.root / "state" / "nodes" / NODE)
    assert f"shoal/{name}/job_{job_id}.0/step_0" in out.read_text()


def test_a_node_without_cgroups_runs_jobs_with_a_warning(tmp_path):
    c = LocalCluster(tmp_path, nodes=1, gpus_per_node=0, extra=("--cgroups", "off"))
    c.up()
    try:
        marks = c.workdir / "uncontained.txt"
        job_id = c.sbatch("--mem=100M", "--wrap", f"grep freezer /proc/self/cgroup > {marks}")
        assert c.wait_for(job_id, states=ENDED, timeout=30)["state"] == "COMPLETED"
        assert "shoal" not in marks.read_text()
        log = (c.root / "state" / "logs" / f"{NODE}.log").read_text()
        assert f"WARNING agent[{NODE}]: no cgroups (--cgroups off): jobs run uncontained" in log, log
    finally:
        c.down()


@pytest.mark.skipif(V2 is None, reason="no cgroup2 mount on this machine")
def test_cgroup_v2_tracks_and_kills_every_process(tmp_path):
    """The v2 path on a real cgroup2 mount: made, joined before exec, cgroup.kill, removed.
    Limits need delegated controllers, which this machine's cgroup2 may not have (then the
    hierarchy says "process tracking only", and only tracking is checked)."""
    node = f"v2test{os.getpid()}"
    h = cgroups.detect("v2", node)
    assert h.version == 2 and h.describe().startswith("cgroup v2")
    containment = cgroups.Containment(h)
    cg = containment.job("7.0", 64, 1, ())
    step = cg.child("step_batch")
    fds = step.open_procs()
    try:
        p = subprocess.Popen(["bash", "-c", "setsid sleep 1000 & echo $!; exec sleep 1000"], stdout=subprocess.PIPE,
                             text=True, start_new_session=True, preexec_fn=lambda: os.write(fds[0], b"0"))
    finally:
        cgroups.close_all(fds)
    detached = int(p.stdout.readline())
    assert {p.pid, detached} <= cg.pids()
    assert cg.populated()
    if "memory" in h.controllers:
        assert (cg.paths[0] / "memory.max").read_text().strip() == str(64 * 1024 * 1024)
    usage = containment.release("7.0", cg)
    p.wait(timeout=5)
    assert p.returncode == -signal.SIGKILL
    assert not pid_alive(detached)
    assert usage.cpu_seconds >= 0 and not cg.paths[0].exists()
    for d in (h.base["unified"], h.base["unified"].parent):
        try:
            d.rmdir()
        except OSError:
            pass


def _bases(cluster) -> list[Path]:
    own, _ = cgroups.parse_own(Path("/proc/self/cgroup").read_text())
    name = cgroups.instance_name(NODE, cluster.root / "state" / "nodes" / NODE)
    return [V1[c] / own.get(c, "/").lstrip("/") / "shoal" / name for c in V1 if c in cgroups.V1_CONTROLLERS]


@needs_v1
def test_a_pod_over_its_memory_limit_is_oom_killed(cluster, tmp_path):
    from tests.integration.traffic import apply, pods

    apply(cluster, tmp_path / "pod.yaml", """
apiVersion: v1
kind: Pod
metadata: {name: hungry, labels: {app: hungry}}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: python
    command: [sh, -c, "python3 -c \\"b = b'x' * (400 * 1024 * 1024)\\""]
    resources: {limits: {memory: 100Mi, cpu: "1"}}
""")

    def terminated():
        found = pods(cluster, "app=hungry")
        state = found[0]["status"].get("containerStatuses", [{}])[0].get("state", {}) if found else {}
        return state.get("terminated")

    ended = wait_until(terminated, 60, "the pod's container to end")
    assert ended["reason"] == "OOMKilled" and ended["exitCode"] == 137, ended
    cluster.run(["shoal", "delete", "pod", "hungry"])


@needs_v1
def test_shoal_down_leaves_no_process_in_its_jobs_and_pods_cgroups(tmp_path):
    """A batch job and a pod each start a process that leaves its process group (setsid):
    ``shoal down`` stops the agents, and what the agents ran goes with them, the detached
    processes too, and the cgroups they were in are removed."""
    from tests.integration.traffic import apply

    c = LocalCluster(tmp_path / "c", nodes=1, gpus_per_node=2).up()
    try:
        job_pid, pod_pid = c.workdir / "job.pid", c.workdir / "pod.pid"
        c.sbatch("--wrap", f"setsid sleep 1000 > /dev/null 2>&1 < /dev/null & echo $! > {job_pid}; sleep 1000")
        apply(c, tmp_path / "pod.yaml", f"""
apiVersion: v1
kind: Pod
metadata: {{name: leaver}}
spec:
  containers:
  - name: main
    image: busybox
    command: [sh, -c, "setsid sleep 1000 > /dev/null 2>&1 < /dev/null & echo $$! > {pod_pid}; sleep 1000"]
""")
        pids = [int(wait_until(lambda f=f: f.exists() and f.read_text().strip(), 30, f"{f.name}")) for f in
                (job_pid, pod_pid)]
        held = {p: [Path("/sys/fs/cgroup", line.split(":")[1], line.split(":", 2)[2].lstrip("/"))
                    for line in Path(f"/proc/{p}/cgroup").read_text().splitlines()
                    if "/shoal/" in line and line.split(":")[1] in ("freezer", "cpuacct")] for p in pids}
        assert all(len(dirs) == 2 for dirs in held.values()), held
    finally:
        c.down()
    alive = [p for p in pids if pid_alive(p)]
    assert not alive, f"still running after shoal down: {alive} (in {[held[p] for p in alive]})"
    left = [d for dirs in held.values() for d in dirs if d.exists()]
    assert not left, f"cgroups left after shoal down: {left}"
