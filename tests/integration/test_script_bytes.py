"""The script a job runs is the file its user submitted, byte for byte, and every refusal of
a submission names its cause.

A real cluster runs scripts holding what editors and generators leave in them (a CR inside
a string, trailing spaces, tabs, no final newline, UTF-8 and bytes that are not UTF-8, 4 MiB
of them); each job prints the SHA-256 of the file it runs, which must be the submitted
file's and that of ``scontrol write batch_script``, whichever way sbatch read it: a file
through the Python command or the compiled front end, or standard input.
"""

from __future__ import annotations

import hashlib
import re
import subprocess

import pytest

from shoal.api_client import Client, ClientError
from tests.integration.cluster import BIN, LocalCluster, python_command

DOS_ERROR = ("sbatch: error: Batch script contains DOS line breaks (\\r\\n) instead of expected UNIX line "
             "breaks (\\n).\n")

# `sha256sum "$0"`: the digest of the very file the job's shell runs.
PRINT_DIGEST = b'sha256sum "$0"'
SCRIPTS = {
    "lone_cr": b"#!/bin/sh\nX='a\rb'\n[ ${#X} -eq 3 ] || echo 'the CR was lost'\n" + PRINT_DIGEST + b"\n",
    "trailing_spaces_and_tabs": b"#!/bin/sh   \n\tY=1  \t\n" + PRINT_DIGEST + b" \t \n",
    "no_final_newline": b"#!/bin/sh\n" + PRINT_DIGEST,
    "utf8": "#!/bin/sh\n# Grüße, 日本語, emoji 🐟\n".encode() + PRINT_DIGEST + b"\n",
    "not_utf8": b"#!/bin/sh\n# latin-1: \xe9\xe8 and a stray \xff\xfe\n" + PRINT_DIGEST + b"\n",
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("scripts"), nodes=1, gpus_per_node=1).up()
    yield c
    c.down()


def _submit(c: LocalCluster, how: str, path, env: dict | None = None) -> subprocess.CompletedProcess:
    if how == "python":
        argv = python_command("sbatch", "--parsable", str(path))
        return subprocess.run(argv, env={**c.env, **(env or {})}, cwd=c.workdir, capture_output=True)
    if how == "frontend":
        argv = [str(BIN / "sbatch"), "--parsable", str(path)]
        return subprocess.run(argv, env={**c.env, "SHOAL_FRONTEND": "native", **(env or {})}, cwd=c.workdir,
                              capture_output=True)
    return subprocess.run(python_command("sbatch", "--parsable"), env={**c.env, **(env or {})}, cwd=c.workdir,
                          capture_output=True, input=path.read_bytes())


def _check_runs_as_submitted(c: LocalCluster, how: str, name: str, data: bytes) -> None:
    path = c.workdir / f"{name}-{how}.sh"
    path.write_bytes(data)
    out = _submit(c, how, path)
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout)
    job = c.wait_for(job_id, timeout=60)
    printed = (c.workdir / f"slurm-{job_id}.out").read_bytes()
    assert job["state"] == "COMPLETED", (job, printed)
    assert b"lost" not in printed
    ran = printed.split()[0].decode()
    written = subprocess.run(python_command("scontrol", "write", "batch_script", str(job_id), "-"),
                             env=c.env, capture_output=True)
    assert written.returncode == 0, written.stderr
    assert (ran, _sha(written.stdout)) == (_sha(data), _sha(data)), f"{name} through {how}"


@pytest.mark.parametrize("how", ["python", "frontend", "stdin"])
def test_a_job_runs_the_bytes_its_user_submitted(cluster, how):
    for name, data in SCRIPTS.items():
        _check_runs_as_submitted(cluster, how, name, data)


@pytest.mark.slow
def test_a_4_mib_script_runs_byte_for_byte(cluster):
    head = b"#!/bin/sh\n" + PRINT_DIGEST + b"\nexit 0\n"
    data = head + b"#" * (4 * 1024 * 1024 - len(head) - 1) + b"\n"
    assert len(data) == 4 * 1024 * 1024  # slurmctld's default max_script_size, still accepted
    _check_runs_as_submitted(cluster, "python", "big", data)


def test_scontrol_write_batch_script_writes_slurm_jobid_sh_by_default(cluster):
    data = SCRIPTS["lone_cr"]
    job_id = cluster.sbatch("--hold", script=data.decode())
    out = cluster.run(python_command("scontrol", "write", "batch_script", str(job_id)))
    assert out.stdout == f"batch script for job {job_id} written to slurm-{job_id}.sh\n"
    assert (cluster.workdir / f"slurm-{job_id}.sh").read_bytes() == data
    missing = cluster.run(python_command("scontrol", "write", "batch_script", "999999"), check=False)
    assert missing.returncode == 1
    assert missing.stderr.startswith("job script retrieval failed: Invalid job id specified")
    cluster.run(["scancel", str(job_id)])


@pytest.mark.parametrize("how", ["python", "frontend", "stdin"])
def test_dos_line_breaks_are_refused_in_slurms_words_on_every_path(cluster, how):
    path = cluster.workdir / f"dos-{how}.sh"
    path.write_bytes(b"#!/bin/sh\r\nhostname\r\n")
    out = _submit(cluster, how, path)
    assert (out.returncode, out.stderr.decode()) == (1, DOS_ERROR)


def test_the_server_refuses_a_script_that_is_not_the_one_read(cluster):
    """A digest that does not match the script (as if the bytes changed after sbatch read
    them) is refused by the server, naming why; nothing is submitted."""
    data = SCRIPTS["utf8"]
    with pytest.raises(ClientError) as e:
        cluster.api("POST", "/shoal/v1/jobs", {"script": data.decode(), "script_sha256": _sha(b"other"),
                                               "workdir": str(cluster.workdir)})
    assert e.value.status == 422
    assert "changed on the way" in str(e.value)


def test_a_script_over_the_limit_is_refused_naming_the_limit(cluster):
    """50 MB: sbatch refuses before sending, in slurmctld's words plus the sizes; a request
    body over the API's limit is answered 413, and the client reads that answer although the
    server closed before taking the whole body."""
    path = cluster.workdir / "huge.sh"
    path.write_bytes(b"#!/bin/sh\n" + b"#" * (50 * 1000 * 1000) + b"\n")
    for how in ("python", "frontend-fallback"):
        argv = [str(BIN / "sbatch"), str(path)] if how != "python" else python_command("sbatch", str(path))
        out = subprocess.run(argv, env=cluster.env, cwd=cluster.workdir, capture_output=True, text=True)
        assert out.returncode == 1
        assert re.fullmatch(r"sbatch: error: Batch job submission failed: Pathname of a file, directory or other "
                            r"parameter too long \(the batch script is 50000011 bytes; at most 4194304 are "
                            r"accepted\)\n", out.stderr), out.stderr
    # The compiled front end sends every file argument that may be the script (up to 1 MiB
    # each): seventeen of them pass the API's limit, and its 413 must reach the user.
    args = []
    for i in range(17):
        (cluster.workdir / f"part{i}.sh").write_bytes(b"#!/bin/sh\n" + b"#" * (1024 * 1024 - 20) + b"\n")
        args.append(f"part{i}.sh")
    out = subprocess.run([str(BIN / "sbatch"), *args], env={**cluster.env, "SHOAL_FRONTEND": "native"},
                         cwd=cluster.workdir, capture_output=True, text=True)
    assert (out.returncode, out.stderr) == (1, "sbatch: error: Batch job submission failed: request body too large: "
                                               "the API accepts at most 16777216 bytes (16 MiB)\n")
    client = Client(cluster.server, cluster.admin_token)
    with pytest.raises(ClientError) as e:
        client.post("/shoal/v1/jobs", {"script": "#!/bin/sh\n" + "#" * (20 * 1024 * 1024), "workdir": "/tmp"})
    assert e.value.status == 413
    assert "request body too large: the API accepts at most 16777216 bytes" in str(e.value)


def test_the_agent_refuses_to_run_a_script_changed_after_it_was_stored(cluster):
    """The bytes the agent was given do not match the submitted SHA-256 (here: changed in
    the store behind the server's back): the job fails naming why, and never runs them."""
    import sqlite3

    marker = cluster.workdir / "changed-script-ran"
    job_id = cluster.sbatch("--hold", script="#!/bin/sh\ntrue\n")
    db = sqlite3.connect(cluster.root / "state" / "server" / "shoal.db")
    with db:
        db.execute("UPDATE jobs SET spec = json_set(spec, '$.script', ?) WHERE id = ?",
                   (f"#!/bin/sh\ntouch {marker}\n", job_id))
    db.close()
    cluster.run(python_command("scontrol", "release", str(job_id)))
    job = cluster.wait_for(job_id, timeout=60)
    assert (job["state"], job["reason"]) == ("FAILED", "launch failed: batch script differs from the one submitted")
    assert not marker.exists()


def test_a_field_the_server_refuses_is_named_through_both_front_ends(cluster):
    (cluster.workdir / "ok.sh").write_text("#!/bin/sh\ntrue\n")
    comment = "x" * 5000
    for argv, env in ((python_command("sbatch", f"--comment={comment}", "ok.sh"), {}),
                      ([str(BIN / "sbatch"), f"--comment={comment}", "ok.sh"], {"SHOAL_FRONTEND": "native"})):
        out = subprocess.run(argv, env={**cluster.env, **env}, cwd=cluster.workdir, capture_output=True, text=True)
        assert (out.returncode, out.stderr) == (1, "sbatch: error: Batch job submission failed: comment: String "
                                                   "should have at most 4096 characters\n")
