"""A server whose state store cannot be written tells the user why, in every client.

The state dir is a small tmpfs of its own: filled up while the server runs, the server's
disk is really full; remounted read-only, its store really is read-only. sbatch, through the
Python command and the compiled front end, must print the server's cause, not "did not
answer"; and `shoal server` started on a read-only state dir says so in one line.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cluster import BIN, free_port, python_command, wait_until

CONFIG = {"cluster_name": "store", "partitions": [{"name": "gpu", "nodes": "node01", "default": True}]}
FULL = ("sbatch: error: Batch job submission failed: the Shoal server cannot save its state: the disk under its "
        "state store is full (database or disk is full)\n")
READ_ONLY = ("sbatch: error: Batch job submission failed: the Shoal server cannot save its state: its state store "
             "is read-only (attempt to write a readonly database)\n")


def _mount(target: Path, *options: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=16m", *options)), "tmpfs", str(target)], check=True)


@pytest.fixture
def state_mount(tmp_path):
    """A 16 MiB tmpfs for the state dir; unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    _mount(mnt)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _start_server(root: Path, state: Path) -> tuple[subprocess.Popen, dict]:
    port = free_port()
    config = root / "cluster.yaml"
    config.write_text(json.dumps(CONFIG))
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "server", "--listen", f"127.0.0.1:{port}",
                             "--config", str(config), "--state-dir", str(state)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    token = state / "admin.token"
    wait_until(lambda: proc.poll() is None and token.exists() and token.read_text().strip() and _listening(port),
               60, "the server")
    env = {**os.environ, "SHOAL_SERVER": f"http://127.0.0.1:{port}", "SHOAL_TOKEN": token.read_text().strip(),
           "SHOAL_CONFIG": str(root / "none.yaml"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SHOAL_JOB_TOKEN", None)
    return proc, env


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _sbatch_both_ways(env: dict, cwd: Path) -> list[tuple[int, str]]:
    (cwd / "job.sh").write_text("#!/bin/sh\nhostname\n")
    out = []
    for argv, extra in ((python_command("sbatch", "job.sh"), {}), ([str(BIN / "sbatch"), "job.sh"],
                                                                  {"SHOAL_FRONTEND": "native"})):
        done = subprocess.run(argv, env={**env, **extra}, cwd=cwd, capture_output=True, text=True, timeout=60)
        out.append((done.returncode, done.stderr))
    return out


def test_a_full_disk_under_the_running_server_is_named_to_the_user(tmp_path, state_mount):
    state = state_mount / "state"
    proc, env = _start_server(tmp_path, state)
    try:
        assert _sbatch_both_ways(env, tmp_path) == [(0, ""), (0, "")]  # the store works
        subprocess.run(["dd", "if=/dev/zero", f"of={state_mount / 'filler'}", "bs=1M", "count=64"],
                       capture_output=True)  # fills the disk under the running server
        assert _sbatch_both_ways(env, tmp_path) == [(1, FULL), (1, FULL)]
        (state_mount / "filler").unlink()
        assert _sbatch_both_ways(env, tmp_path) == [(0, ""), (0, "")]  # and it recovers
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def test_a_read_only_store_is_named_in_the_databases_words(tmp_path, state_mount):
    """A mount cannot turn read-only under a server holding its files open for writing, so
    the store's own error is made on a real read-only SQLite database and named as the
    server names it to clients (503, the same text as above)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    from shoal.server.limits import store_failure

    db = state_mount / "shoal.db"
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as c:
        c.execute(text("CREATE TABLE t (x INTEGER)"))
    engine.dispose()
    subprocess.run(["mount", "-o", "remount,ro", str(state_mount)], check=True)
    engine = create_engine(f"sqlite:///{db}")
    with pytest.raises(OperationalError) as e, engine.begin() as c:
        c.execute(text("INSERT INTO t VALUES (1)"))
    assert f"sbatch: error: Batch job submission failed: {store_failure(e.value)}\n" == READ_ONLY


def _one_line_failure(argv: list[str], env: dict | None = None, timeout: float = 90) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    lines = out.stderr.splitlines()
    assert out.returncode != 0 and len(lines) == 1, out.stderr
    return lines[0]


def test_start_up_failures_are_one_line(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    config = tmp_path / "cluster.yaml"
    config.write_text(json.dumps(CONFIG))
    ro = tmp_path / "ro"
    ro.mkdir()
    _mount(ro, "ro")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    server = [sys.executable, "-m", "shoal", "server", "--config", str(config), "--listen", f"127.0.0.1:{free_port()}"]
    try:
        assert _one_line_failure([*server, "--state-dir", str(ro / "state")]) == (
            f"shoal server: error: {ro / 'state'}: Read-only file system")
        assert _one_line_failure([*server[:-2], "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "s")]) \
            == f"shoal server: error: cannot listen on 127.0.0.1:{port}: Address already in use"
        assert _one_line_failure([*server, "--state-dir", str(tmp_path / "s"), "--db", "mysq://x"]) == (
            "shoal server: error: cannot open the state store mysq://x: Can't load plugin: sqlalchemy.dialects:mysq")
        assert _one_line_failure([*server[:4], "--config", str(tmp_path / "missing.yaml"), "--state-dir",
                                  str(tmp_path / "s")]) == (
            f"shoal server: error: cannot read cluster configuration {tmp_path / 'missing.yaml'}: No such file or directory")
        assert _one_line_failure([sys.executable, "-m", "shoal", "agent", "--server", "http://127.0.0.1:1",
                                  "--join-token", "x", "--workdir", str(ro / "agent"), "--name", "n1",
                                  "--fake-gpus", "1", "--gpu-model", "A100-SXM4-80GB"]) == (
            f"shoal agent: error: {ro / 'agent'}: Read-only file system")
        up = [sys.executable, "-m", "shoal", "up", "--nodes", "1", "--agent-port", str(free_port()),
              "--address-base", "127.0.99.2"]
        client = {"SHOAL_CONFIG": str(tmp_path / "client.yaml")}
        assert _one_line_failure([*up, "--port", str(free_port()), "--state-dir", str(ro / "up")], client) == (
            f"shoal up: error: cannot use the state dir {ro / 'up'}: Read-only file system")
        assert _one_line_failure([*up, "--port", str(port), "--state-dir", str(tmp_path / "up")], client) == (
            f"shoal up: the server exited during start-up: cannot listen on 127.0.0.1:{port}: Address already in use")
        assert _one_line_failure([*up, "--port", str(free_port()), "--state-dir", str(tmp_path / "up2"),
                                  "--config", str(tmp_path / "missing.yaml")], client) == (
            "shoal up: the server exited during start-up: cannot read cluster configuration "
            f"{tmp_path / 'missing.yaml'}: No such file or directory")
    finally:
        taken.close()
        subprocess.run(["umount", "-l", str(ro)], check=False)
