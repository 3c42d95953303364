"""A real local cluster for tests: `shoal up` in a temporary state dir, the real commands on PATH.

Each cluster gets its own ports, its own 127.0.N.x addresses, its own client config and
state dir, so a test never sees another's cluster and `shoal down` stops exactly its own.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
# What the compiled front end (frontend/shoal-cmd.c) execs to hand a call to the Python command.
PYTHON_COMMAND = "import sys;sys.argv.pop(0);from shoal.cli.{0} import main;sys.exit(main())"


def python_command(command: str, *args: str) -> list[str]:
    """argv that runs ``command`` as the Python command, as without the compiled front end."""
    return [str(BIN / "python"), "-P", "-c", PYTHON_COMMAND.format(command), str(BIN / command), *args]
_counter = itertools.count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(self, root: Path, nodes: int = 2, gpus_per_node: int = 4, *, gpu_model: str = "A100-SXM4-80GB",
                 cpus_per_node: int = 64, memory: str = "512G", config: str | None = None,
                 extra: tuple[str, ...] = (), heartbeat_timeout: float | None = None,
                 kill_wait: float | None = 2.0) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.workdir = root / "work"
        self.workdir.mkdir(exist_ok=True)
        self.nodes = nodes
        self.port = free_port()
        self.agent_port = free_port()
        n = (os.getpid() + next(_counter)) % 250 + 2
        self.address_base = f"127.0.{n}.2"
        self.env = dict(os.environ)
        self.env.update({
            "SHOAL_CONFIG": str(root / "client.yaml"),
            "SHOAL_STATE_DIR": str(root / "state"),
            "PATH": f"{BIN}{os.pathsep}{self.env.get('PATH', '')}",
            "SHOAL_LOG_LEVEL": "INFO",
        })
        for k in ("SLURM_JOB_ID", "SHOAL_JOB_TOKEN", "SHOAL_SERVER", "SHOAL_TOKEN"):
            self.env.pop(k, None)
        self.args = ["--nodes", str(nodes), "--gpus-per-node", str(gpus_per_node), "--gpu-model", gpu_model,
                     "--cpus-per-node", str(cpus_per_node), "--memory-per-node", memory,
                     "--port", str(self.port), "--agent-port", str(self.agent_port),
                     "--address-base", self.address_base, *extra]
        if config:
            self.args += ["--config", config]
        if heartbeat_timeout is not None:
            self.args += ["--heartbeat-timeout", str(heartbeat_timeout)]
        if kill_wait is not None:
            self.args += ["--kill-wait", str(kill_wait)]

    # ------------------------------------------------------------------ life cycle

    def up(self) -> "LocalCluster":
        out = self.run(["shoal", "up", *self.args], check=False, timeout=90)
        if out.returncode != 0:
            raise AssertionError(f"shoal up failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        self.up_output = out.stdout
        self.state = json.loads((self.root / "state" / "cluster.json").read_text())
        self.admin_token = json.loads((self.root / "client.yaml").read_text())["token"]
        return self

    def down(self) -> None:
        self.run(["shoal", "down"], check=False, timeout=60)

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ commands

    def run(self, cmd: list[str], *, check: bool = True, timeout: float = 60, env: dict | None = None,
            cwd: Path | None = None, input: str | None = None) -> subprocess.CompletedProcess:
        out = subprocess.run(cmd, env={**self.env, **(env or {})}, cwd=cwd or self.workdir, capture_output=True,
                             text=True, timeout=timeout, input=input)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        return out

    def sbatch(self, *args: str, script: str | None = None, env: dict | None = None) -> int:
        """Submit (a script text, written to a file in the work dir, or --wrap args); return the job id."""
        argv = ["sbatch", "--parsable", *args]
        if script is not None:
            path = self.workdir / f"job-{time.time_ns()}.sh"
            path.write_text(script)
            argv.append(str(path))
        out = self.run(argv, env=env)
        return int(out.stdout.strip().split(";")[0])

    def api(self, method: str, path: str, body: dict | None = None, token: str | None = None):
        from shoal.api_client import Client

        c = Client(self.server, token or self.admin_token)
        c.job_token = None
        return c.request(method, path, body)

    def job(self, job_id: int | str) -> dict:
        return self.api("GET", f"/shoal/v1/jobs/{job_id}")

    def jobs(self, **params) -> list[dict]:
        from urllib.parse import urlencode

        q = urlencode({"all": "true", **params}, doseq=True)
        return self.api("GET", f"/shoal/v1/jobs?{q}")["jobs"]

    def wait_for(self, job_id: int, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"),
                 timeout: float = 30.0, settled: bool = True) -> dict:
        """Wait until the job is in one of ``states`` (and, for ended jobs, no longer completing)."""
        deadline = time.time() + timeout
        job = None
        while time.time() < deadline:
            job = self.job(job_id)
            if job["state"] in states and not (settled and job["completing"]):
                return job
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} did not reach {states} within {timeout}s: {job}\n{self.diagnostics(job)}")

    def diagnostics(self, job: dict | None) -> str:
        """The tails of a job's output and of the cluster's logs: what a timed-out wait shows."""
        parts = []
        for path in ([Path(job["stdout"])] if job and job.get("stdout") else []) + sorted(
                (self.root / "state" / "logs").glob("*.log")):
            try:
                text = path.read_text(errors="replace")
            except OSError as e:
                text = f"({e})"
            parts.append(f"--- {path} (last 3000 characters)\n{text[-3000:]}")
        return "\n".join(parts)

    def nodes_json(self) -> list[dict]:
        return self.api("GET", "/shoal/v1/nodes")["nodes"]

    def agent_pid(self, node: str) -> int:
        return self.state["pids"]["agents"][node]

    def node_names(self) -> list[str]:
        return list(self.state["pids"]["agents"])


def agent_argv(pid: int) -> list[str]:
    """The command line of a running agent, to start it again after killing it. ``shoal up``
    runs its agents as root under ``unshare --uts`` with ``--hostname``; the agent refuses that
    flag outside a UTS namespace of its own (it would rename the machine), so the restart goes
    through ``unshare --uts`` too."""
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
    assert argv, f"process {pid} has no command line (it has exited)"
    return ["unshare", "--uts", "--", *argv] if "--hostname" in argv else argv


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it has ended, unreaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns something true (and return that), or fail saying what."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
