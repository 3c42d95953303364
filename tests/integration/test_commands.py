"""The Slurm commands end to end, as an administrator uses them on a real cluster."""

from __future__ import annotations

import gzip
import json
import urllib.request

import pytest

from shoal.slurm import squeue

from tests.integration.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("commands"), nodes=2, gpus_per_node=4)
    c.up()
    yield c
    c.down()


def sacct_state(cluster, job_id: int) -> str:
    return cluster.run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,ExitCode"]).stdout.strip()


def test_squeue_sacct_and_sinfo_follow_a_job_through_its_life(cluster):
    names = cluster.node_names()
    assert cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split() == [names[0], "idle", names[1], "idle"]
    running = cluster.sbatch("--job-name=long", "--gpus=1", "--time=10", "--wrap", "sleep 300")
    cluster.wait_for(running, states=("RUNNING",), timeout=15)
    pending = cluster.sbatch("--job-name=later", "--hold", "--nodes=2", "--wrap", "true")
    fmt = "%i %j %u %T %r %P %D %N %M %l"
    lines = {line.split()[0]: line.split() for line in
             cluster.run(["squeue", "-h", "-o", fmt]).stdout.splitlines()}
    run_line = lines[str(running)]
    assert run_line[:7] == [str(running), "long", "root", "RUNNING", "None", "gpu-a100", "1"], run_line
    assert run_line[7] in names and run_line[9] == "10:00"
    pend_line = lines[str(pending)]
    assert pend_line[:7] == [str(pending), "later", "root", "PENDING", "JobHeldUser", "gpu-a100", "2"], pend_line
    assert pend_line[7:] == ["0:00", "UNLIMITED"], f"a pending job has no nodes (empty %N): {pend_line}"
    assert sacct_state(cluster, pending) == "PENDING|0:0"
    assert sacct_state(cluster, running) == "RUNNING|0:0"
    states = dict(zip(*[iter(cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split())] * 2))
    assert sorted(states.values()) == ["idle", "mix"], states
    whole = cluster.sbatch("--exclusive", "--wrap", "sleep 300")
    cluster.wait_for(whole, states=("RUNNING",), timeout=15)
    states = dict(zip(*[iter(cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split())] * 2))
    assert sorted(states.values()) == ["alloc", "mix"], states
    show = cluster.run(["scontrol", "show", "job", str(running)]).stdout
    for key in ("JobId=", "JobName=long", "UserId=root", "JobState=RUNNING", "Partition=gpu-a100",
                "NodeList=", "TimeLimit=00:10:00", "NumNodes=1"):
        assert key in show, f"{key} missing from scontrol show job:\n{show}"
    cluster.run(["scancel", str(running), str(pending), str(whole)])
    failing = cluster.sbatch("--wrap", "exit 3")
    cluster.wait_for(failing)
    assert sacct_state(cluster, failing) == "FAILED|3:0"
    # Snakemake's slurm executor polls so, and hangs if it is refused.
    polled = cluster.run(["sacct", "-X", "-P", "-n", "--clusters", "all", "-o", "JobIdRaw,State", "-j", str(failing)])
    assert polled.stdout == f"{failing}|FAILED\n"


def test_squeue_gets_the_queue_as_rows_gzipped_when_it_asks_and_plain_json_otherwise(cluster):
    array = cluster.sbatch("--hold", "--array=0-5", "--job-name=sweep", "--wrap", "true")
    single = cluster.sbatch("--hold", "--job-name=single", "--wrap", "true")
    path = "/shoal/v1/jobs?view=queue&form=packed&collapse=true"

    def get(path: str, *encodings: str) -> tuple[str | None, bytes]:
        headers = {"Authorization": f"Bearer {cluster.admin_token}"}
        if encodings:
            headers["Accept-Encoding"] = ", ".join(encodings)
        with urllib.request.urlopen(urllib.request.Request(cluster.server + path, headers=headers)) as answer:
            return answer.headers.get("Content-Encoding"), answer.read()

    def ours(body: bytes) -> list[tuple]:
        jobs = squeue.listed_jobs(json.loads(body))
        return [(j["job_id"], j["array_tasks"]) for j in jobs if j["name"] in ("sweep", "single")]

    encoding, plain = get(path)  # a client that does not ask gets plain JSON
    assert encoding is None and ours(plain) == [(array, "0-5"), (single, None)]
    assert get(path, "br", "gzip;q=0") == (None, plain)
    encoding, squeezed = get(path, "gzip")
    assert encoding == "gzip" and gzip.decompress(squeezed) == plain and len(squeezed) < len(plain)
    rows = get(path.replace("form=packed", "form=rows"))[1]  # the same jobs as plain rows
    assert squeue.listed_jobs(json.loads(rows)) == squeue.listed_jobs(json.loads(plain))
    encoding, whole = get("/shoal/v1/jobs?view=queue")
    assert encoding is None and {j["job_id"] for j in json.loads(whole)["jobs"] if j["name"] == "sweep"} == \
        set(range(array, array + 6))
    lines = cluster.run(["squeue", "-h", "-o", "%i %j"]).stdout.splitlines()  # whole jobs, merged here
    assert f"{array}_[0-5] sweep" in lines and f"{single} single" in lines
    table = cluster.run(["squeue"]).stdout  # rows, merged there: the same table
    assert [f"{array}_[0-5]", "gpu-a100", "sweep", "root", "PD", "0:00", "1", "(JobHeldUser)"] in \
        [line.split() for line in table.splitlines()], table
    assert len([x for x in cluster.run(["squeue", "-r", "-h"]).stdout.splitlines() if "sweep" in x]) == 6
    cluster.run(["scancel", str(single)])
    encoding, squeezed = get(path, "gzip")  # the kept answer is made again after the change
    assert encoding == "gzip" and ours(gzip.decompress(squeezed)) == [(array, "0-5")]
    cluster.run(["scancel", str(array)])


def test_scontrol_show_hostname_expands_a_hostlist(cluster):
    assert cluster.run(["scontrol", "show", "hostname", "node[01-02]"]).stdout.split("\n")[:2] == ["node01", "node02"]


def test_bad_submissions_are_one_line_errors(cluster):
    bad = cluster.workdir / "bad.sh"
    bad.write_text("#!/bin/bash\n#SBATCH --nodes=two\ntrue\n")
    out = cluster.run(["sbatch", str(bad)], check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "--nodes" in out.stderr and "2" in out.stderr, out.stderr
    out = cluster.run(["sbatch", "--gpus-per-node=16", "--wrap", "true"], check=False)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "Requested node configuration is not available" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_submit_options_shape_the_job(cluster):
    sub = cluster.workdir / "sub"
    sub.mkdir()
    job = cluster.sbatch("--mem=0", "--chdir", str(sub), "--job-name=opts", "--output=%x-%j.out",
                         "--export=NONE", "--wrap", "pwd; echo mem=$SLURM_MEM_PER_NODE; echo home=${MYVAR:-unset}",
                         env={"MYVAR": "leaked"})
    assert cluster.wait_for(job)["state"] == "COMPLETED"
    out = (sub / f"opts-{job}.out").read_text().split()
    assert out[0] == str(sub)
    assert out[1] == f"mem={512 * 1024}", out
    assert out[2] == "home=unset", "--export=NONE must not pass the submitter's environment"


def test_srun_outside_a_job_runs_on_both_nodes(cluster):
    out = cluster.run(["srun", "-N2", "hostname"], timeout=60)
    assert sorted(out.stdout.split()) == cluster.node_names()


VERSION_COMMANDS = ["sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol", "sacct", "sprio", "sshare"]


@pytest.mark.parametrize("command", VERSION_COMMANDS)
def test_every_command_prints_its_version_and_exits_as_slurms_do(cluster, command):
    from shoal import __version__

    before = len(cluster.jobs())
    for flag in ("-V", "--version"):
        # With other options too: sbatch --version --wrap true prints the version, submits nothing.
        extra = {"sbatch": ["--wrap", "true"], "srun": ["hostname"]}.get(command, [])
        out = cluster.run([command, flag, *extra])
        assert (out.returncode, out.stdout, out.stderr) == (0, f"slurm 22.05.8 (shoal {__version__})\n", "")
    assert len(cluster.jobs()) == before
    if command == "scontrol":
        assert cluster.run(["scontrol", "version"]).stdout == f"slurm 22.05.8 (shoal {__version__})\n"


def test_version_is_refused_in_a_directive(cluster):
    out = cluster.run(["sbatch"], check=False, input="#!/bin/sh\n#SBATCH --version\ntrue\n")
    assert out.returncode == 1
    assert out.stderr.strip() == "sbatch: error: line 2: --version is only valid on the command line"
