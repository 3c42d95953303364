"""Jobs run as the user who submitted them, as slurmd runs them, when the agent is root.

Two real Unix accounts are made for the test (and removed after it); each submits with their
own API token. Their jobs run with their uid, gid and supplementary groups, write output
files they own, and cannot write through ``--output`` where they could not write themselves.
A token whose user has no account on the node gets a failed job with a reason, never a job
run as root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd: the agent switches users only when it runs as root")

TAG = f"{os.getpid() % 100000}"
GROUP = f"shoal-g{TAG}"
USERS = (f"shoal-a{TAG}", f"shoal-b{TAG}")
GHOST = f"shoal-ghost{TAG}"  # has a token, has no account


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def accounts():
    _sh("groupadd", GROUP)
    made = []
    try:
        for user in USERS:
            _sh("useradd", "--create-home", "--user-group", "--groups", GROUP, "--shell", "/bin/sh", user)
            made.append(user)
            Path(pwd.getpwnam(user).pw_dir).chmod(0o755)  # readable by others, writable by the owner alone
        yield {u: pwd.getpwnam(u) for u in USERS}
    finally:
        for user in made:
            subprocess.run(["userdel", "--remove", user], capture_output=True, timeout=30)
        subprocess.run(["groupdel", GROUP], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def cluster(accounts):
    # pytest's temporary directories are 0700; the users must reach the agent's job scripts.
    base = Path(tempfile.mkdtemp(prefix="shoal-users-"))
    base.chmod(0o755)
    c = LocalCluster(base / "cluster", nodes=1, gpus_per_node=2)
    try:
        c.up()
        c.tokens = {u: c.api("POST", "/shoal/v1/tokens", {"user": u, "role": "user"})["token"]
                    for u in (*USERS, GHOST)}
        yield c
    finally:
        c.down()
        shutil.rmtree(base, ignore_errors=True)


def submit(cluster, user: str, *args: str, cwd: str) -> int:
    out = cluster.run(["sbatch", "--parsable", *args], env={"SHOAL_TOKEN": cluster.tokens[user]}, cwd=Path(cwd))
    return int(out.stdout.strip())


def test_each_users_job_runs_with_their_identity_and_owns_its_output(cluster, accounts):
    group_gid = __import__("grp").getgrnam(GROUP).gr_gid
    jobs = {}
    for user, pw in accounts.items():
        jobs[user] = submit(cluster, user, "--wrap",
                            'echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"; echo "home=$HOME user=$USER '
                            'logname=$LOGNAME"; pwd; echo err >&2', cwd=pw.pw_dir)
    for user, pw in accounts.items():
        job = cluster.wait_for(jobs[user], timeout=60)
        assert job["state"] == "COMPLETED", job
        assert job["user"] == user
        out = Path(pw.pw_dir) / f"slurm-{jobs[user]}.out"
        st = out.stat()
        assert (st.st_uid, st.st_gid) == (pw.pw_uid, pw.pw_gid), f"{out} is not owned by {user}"
        lines = out.read_text().splitlines()
        ident = dict(kv.split("=", 1) for kv in lines[0].split(" ", 2)[:2])
        assert ident == {"uid": str(pw.pw_uid), "gid": str(pw.pw_gid)}, lines
        assert str(group_gid) in lines[0].partition("groups=")[2].split(), f"supplementary group missing: {lines}"
        assert lines[1] == f"home={pw.pw_dir} user={user} logname={user}"
        assert lines[2] == pw.pw_dir
        assert lines[3] == "err"


def test_srun_tasks_run_as_the_user(cluster, accounts):
    user = USERS[1]
    pw = accounts[user]
    out = cluster.run(["srun", "-N1", "sh", "-c", "id -u; pwd"], env={"SHOAL_TOKEN": cluster.tokens[user]},
                      cwd=Path(pw.pw_dir), timeout=90)
    assert out.stdout.split() == [str(pw.pw_uid), pw.pw_dir], out


def reason_of(cluster, job_id: int) -> tuple[str, str]:
    line = cluster.run(["sacct", "-n", "-P", "-X", "-o", "State,Reason", "-j", str(job_id)]).stdout.splitlines()[0]
    state, _, reason = line.partition("|")
    return state, reason


@pytest.mark.parametrize("where", ["/etc/cron.d/shoal-{tag}", "{other_home}/planted-{tag}", "{precious}"])
def test_output_cannot_go_where_the_user_could_not_write(cluster, accounts, where, tmp_path_factory):
    user, other = USERS
    precious = Path(tempfile.mkdtemp(prefix="shoal-precious-")) / "root-owned"
    precious.parent.chmod(0o777)
    precious.write_text("keep me\n")
    precious.chmod(0o644)
    target = where.format(tag=TAG, other_home=accounts[other].pw_dir, precious=precious)
    existed = Path(target).exists()
    try:
        job_id = submit(cluster, user, f"--output={target}", "--wrap", "echo written", cwd=accounts[user].pw_dir)
        job = cluster.wait_for(job_id, timeout=60)
        assert job["state"] == "FAILED", job
        state, reason = reason_of(cluster, job_id)
        assert state == "FAILED"
        assert reason == f"launch failed: Permission denied: {target}"[:64], reason
        if existed:
            assert Path(target).read_text() == "keep me\n", "the root-owned file was truncated"
        else:
            assert not Path(target).exists(), f"{target} was created on {user}'s behalf"
    finally:
        shutil.rmtree(precious.parent, ignore_errors=True)


def test_a_user_unknown_on_the_node_gets_a_failed_job_with_a_reason(cluster):
    job_id = submit(cluster, GHOST, "--wrap", "touch /tmp/shoal-ghost-ran-" + TAG, cwd="/tmp")
    job = cluster.wait_for(job_id, timeout=60)
    node = cluster.node_names()[0]
    want = f"launch failed: no user {GHOST} on {node}"
    assert (job["state"], job["reason"]) == ("FAILED", want), job
    assert reason_of(cluster, job_id) == ("FAILED", want)
    line = cluster.run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T|%r"]).stdout.strip()
    assert line == f"FAILED|{want}", line
    assert not Path(f"/tmp/shoal-ghost-ran-{TAG}").exists(), "the job ran anyway"
    assert not Path(f"/tmp/slurm-{job_id}.out").exists()
