"""The compiled sbatch/squeue/scancel front end prints exactly what the Python commands print.

Each invocation runs twice on one cluster: through the compiled front end (which hands the
invocation to POST /shoal/v1/commands/<command>) and as the Python command the front end
execs when it is not installed. Standard output, standard error and the exit code must be
the same bytes, including the errors for bad options and #SBATCH directives; submitted jobs
must be stored alike, environment included. Invocations the front end leaves to Python
(standard input, --wait, --help) are checked to be handed over.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess

import pytest

from tests.integration.cluster import BIN, LocalCluster, python_command

NATIVE_REFUSED = 125  # SHOAL_FRONTEND=native: the front end would have handed over to Python

SCRIPT = "#!/bin/sh\n#SBATCH -J scripted\n#SBATCH --time=5\n#SBATCH -o out-%j.log\necho hi\n"
BAD_DIRECTIVE = "#!/bin/sh\n#SBATCH -J bad\n#SBATCH --bogus\necho hi\n"
BAD_VALUE = "#!/bin/sh\n#SBATCH --time=soon\necho hi\n"
NO_SHEBANG = "echo no interpreter line\n"
DOS = "#!/bin/sh\r\n#SBATCH -J dos\r\necho hi\r\n"

SBATCH_CASES = [
    ["-H", "--wrap", "true"],
    ["-H", "--parsable", "-J", "named", "-o", "out-%j.log", "--wrap", "echo hi"],
    ["-H", "script.sh", "arg1", "arg 2"],
    ["-H", "-o", "existing.log", "-e", "script.sh", "script.sh"],  # option values that are files too
    ["-H", "--chdir=sub", "./script.sh"],
    ["-H", "dos.sh"],
    ["-H", "-N2", "--ntasks-per-node=2", "--gpus-per-node=2", "--mem=1G", "-t", "1-00:00", "--wrap", "true"],
    ["-H", "--array=0-9%2", "--wrap", "true"],
    ["bad.sh"],
    ["badvalue.sh"],
    ["--bogus"],
    ["-H", "--wra", "true"],  # an unambiguous prefix
    ["-H", "--wrap", "true", "extra"],
    ["-H", "--gres=tpu:1", "--wrap", "true"],
    ["-H", "-p", "nosuch", "--wrap", "true"],
    ["-H", "-N", "99", "--wrap", "true"],
    ["-H", "--ntasks=1", "--nodes=2", "--wrap", "true"],
    ["-H", "--mem=1G", "--mem-per-cpu=1G", "--wrap", "true"],
    ["-H", "--dependency=afterok:99999", "--wrap", "true"],
    ["--nodes"],
]
SQUEUE_CASES = [
    [], ["-h"], ["-t", "all"], ["-r"], ["--me"], ["-u", "nobody"], ["-p", "gpu-a100"], ["-n", "named,wrap"],
    ["-o", "%.18i %j %T %Q %z %b %m %c"], ["-O", "jobid,name:10,state"], ["--start"], ["--json"],
    ["-j", "99999"], ["--bogus"], ["-t", "XX"], ["-o", "%!"], ["-o", "%"], ["-O", "nosuch"], ["-i", "x"],
]
SCANCEL_CASES = [
    ["99999"], ["abc"], [], ["-s", "NOPE", "1"], ["--bogus"], ["12_[x]"],
    ["{job}"], ["{job}", "-v"], ["--name", "nosuchname"], ["-s", "USR1", "{job}"],
]
HANDED_TO_PYTHON = [
    ("sbatch", ["--help"], None), ("sbatch", ["-H"], SCRIPT), ("sbatch", ["-H", "nonexistent.sh"], None),
    ("sbatch", ["-W", "--wrap", "true"], None), ("sbatch", ["noshebang.sh"], None), ("squeue", ["--help"], None),
    ("squeue", ["-i", "1"], None),
    ("sbatch", ["--version"], None), ("sbatch", ["-V", "--wrap", "true"], None), ("squeue", ["-V"], None),
    ("scancel", ["--version"], None),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not (BIN / "sbatch").read_bytes().startswith(b"\x7fELF"):
        pytest.skip("the compiled front end is not installed (no C compiler when `make` ran)")
    c = LocalCluster(tmp_path_factory.mktemp("frontend"), nodes=2, gpus_per_node=4).up()
    for name, text in (("script.sh", SCRIPT), ("bad.sh", BAD_DIRECTIVE), ("badvalue.sh", BAD_VALUE),
                       ("noshebang.sh", NO_SHEBANG), ("dos.sh", DOS), ("existing.log", "old output\n")):
        (c.workdir / name).write_text(text)
    (c.workdir / "sub").mkdir()
    yield c
    c.down()


def run(c: LocalCluster, command: str, argv: list[str], compiled: bool, stdin: str | None = None,
        native: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The command as the compiled front end runs it (SHOAL_FRONTEND=native: never handing
    over), or as the Python command runs without it (what the front end execs)."""
    env = dict(env or {})
    if compiled:
        env.update({"SHOAL_FRONTEND": "native"} if native else {})
        cmd = [str(BIN / command), *argv]
    else:
        cmd = python_command(command, *argv)
    base = {k: v for k, v in c.env.items() if k != "SHOAL_FRONTEND"}
    return subprocess.run(cmd, env={**base, **env}, cwd=c.workdir, input=stdin, capture_output=True, text=True,
                          timeout=60)


def submitted(out: str) -> int | None:
    m = re.match(r"(?:Submitted batch job )?(\d+)(?:;\S+)?\n", out)
    return int(m.group(1)) if m else None


def stored_spec(c: LocalCluster, job_id: int) -> dict:
    """What the store holds for a job, less what differs between any two submissions."""
    db = sqlite3.connect(f"file:{c.root / 'state' / 'server' / 'shoal.db'}?mode=ro", uri=True)
    try:
        db.row_factory = sqlite3.Row
        row = dict(db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())
    finally:
        db.close()
    for key in ("id", "submit_time", "version", "array_job_id", "priority", "reason", "expected_start"):
        row.pop(key, None)
    row["spec"] = json.loads(row["spec"])
    row["spec"]["environment"].pop("SHOAL_FRONTEND", None)  # how the test ran it
    return row


@pytest.mark.parametrize("argv", SBATCH_CASES, ids=" ".join)
def test_sbatch_prints_and_stores_the_same_both_ways(cluster, argv):
    native, python = run(cluster, "sbatch", argv, True), run(cluster, "sbatch", argv, False)
    native_id, python_id = submitted(native.stdout), submitted(python.stdout)
    assert native.returncode != NATIVE_REFUSED, native.stderr
    assert (native.returncode, native.stderr) == (python.returncode, python.stderr)
    if native_id is None:
        assert native.stdout == python.stdout
        return
    assert python_id is not None and native.stdout.replace(str(native_id), "ID") == python.stdout.replace(
        str(python_id), "ID")
    assert stored_spec(cluster, native_id) == stored_spec(cluster, python_id)


@pytest.mark.parametrize("argv", SQUEUE_CASES, ids=" ".join)
def test_squeue_prints_the_same_both_ways(cluster, argv):
    if not cluster.jobs():
        for args in (["-J", "named"], ["--array=1-5%2"], ["-p", "gpu-a100", "-N2"]):
            cluster.sbatch("-H", *args, "--wrap", "true")
    native, python = run(cluster, "squeue", argv, True), run(cluster, "squeue", argv, False)
    assert native.returncode != NATIVE_REFUSED, native.stderr
    assert (native.returncode, native.stdout, native.stderr) == (python.returncode, python.stdout, python.stderr)


@pytest.mark.parametrize("argv", SCANCEL_CASES, ids=" ".join)
def test_scancel_prints_the_same_both_ways(cluster, argv):
    def invoke(compiled: bool) -> tuple[int, str, str]:
        job = cluster.sbatch("-H", "--wrap", "true") if "{job}" in " ".join(argv) else None
        done = run(cluster, "scancel", [a.replace("{job}", str(job)) for a in argv], compiled)
        assert done.returncode != NATIVE_REFUSED, done.stderr
        mask = (lambda s: s.replace(str(job), "JOB")) if job else (lambda s: s)
        return done.returncode, mask(done.stdout), mask(done.stderr)

    assert invoke(True) == invoke(False)


def test_a_cancelled_job_is_cancelled_again_the_same_way(cluster):
    jobs = [cluster.sbatch("-H", "--wrap", "true") for _ in range(2)]
    for job in jobs:
        cluster.run(["scancel", str(job)])
    native, python = run(cluster, "scancel", [str(jobs[0])], True), run(cluster, "scancel", [str(jobs[1])], False)
    assert native.returncode == python.returncode == 0
    assert native.stderr.replace(str(jobs[0]), "JOB") == python.stderr.replace(str(jobs[1]), "JOB")
    assert "already completing or completed" in native.stderr


@pytest.mark.parametrize("command,argv,stdin", HANDED_TO_PYTHON, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_what_needs_its_own_process_is_handed_to_python(cluster, command, argv, stdin):
    assert run(cluster, command, argv, True, stdin=stdin).returncode == NATIVE_REFUSED


def test_handing_over_to_python_gives_the_python_answer(cluster):
    native = run(cluster, "sbatch", ["-H", "--parsable"], True, stdin=SCRIPT, native=False)
    python = run(cluster, "sbatch", ["-H", "--parsable"], False, stdin=SCRIPT)
    assert native.returncode == python.returncode == 0
    assert stored_spec(cluster, submitted(native.stdout)) == stored_spec(cluster, submitted(python.stdout))
    for cmd in ("sbatch", "squeue"):
        assert run(cluster, cmd, ["--help"], True, native=False).stdout == run(cluster, cmd, ["--help"], False).stdout
    for cmd in ("sbatch", "squeue", "scancel"):
        version = run(cluster, cmd, ["--version"], True, native=False)
        assert (version.returncode, version.stdout) == (0, run(cluster, cmd, ["--version"], False).stdout)
        assert version.stdout.startswith("slurm 22.05.8 (shoal ")


def test_a_server_without_the_endpoint_gets_the_python_command(cluster, tmp_path):
    """An older server answers 404: the front end runs the Python command against it."""
    import http.server
    import threading

    class Old(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    old = http.server.HTTPServer(("127.0.0.1", 0), Old)
    threading.Thread(target=old.serve_forever, daemon=True).start()
    try:
        env = {"SHOAL_SERVER": f"http://127.0.0.1:{old.server_port}", "SHOAL_FRONTEND": "native"}
        out = subprocess.run([str(BIN / "squeue")], env={**cluster.env, **env}, capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == NATIVE_REFUSED, out.stderr
    finally:
        old.shutdown()


def test_several_servers_the_front_end_takes_the_next_when_one_is_down(cluster):
    """Servers sharing a store, comma-separated (as the Python client takes them)."""
    env = {"SHOAL_SERVER": f"http://127.0.0.1:1, {cluster.server}"}
    native = run(cluster, "squeue", ["-h", "-o", "%i"], True, env=env)
    assert native.returncode == 0, native.stderr
    assert native.stdout == run(cluster, "squeue", ["-h", "-o", "%i"], False, env=env).stdout
