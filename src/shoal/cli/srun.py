"""srun: run a parallel step, inside a job's allocation or (outside one) in a new allocation.

Inside a batch job, srun asks the server to lay the step out over the job's nodes, then
connects to each node's agent directly to launch the tasks and stream their output, as
srun talks to slurmd (over TLS where the agent serves it, checked against the cluster CA
with the node name as the host name). It returns the highest exit code of its tasks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time

STEP_KEYS = ("nodes", "ntasks", "ntasks_per_node", "cpus_per_task", "gpus_per_task", "gpus_per_node",
             "nodelist", "exclude")


def main(argv: list[str] | None = None) -> int:
    from shoal.api_client import Client, ClientError, fail
    from shoal.slurm.options import SRUN, OptionError, asks_help, asks_version, parse_srun

    argv = sys.argv[1:] if argv is None else argv
    try:
        if asks_help(argv, SRUN):
            from shoal.slurm.fmt import emit
            from shoal.slurm.options import help_text

            emit(help_text(SRUN, usage="--usage" in argv))
            return 0
        if asks_version(argv, SRUN):
            from shoal.slurm import version_line

            print(version_line())
            return 0
        req = parse_srun(argv, cwd=os.getcwd(), environ=os.environ)
    except OptionError as e:
        fail(str(e), e.exit_code)
    opts = req.options
    try:
        client = Client.from_config() if not os.environ.get("SHOAL_JOB_TOKEN") else _job_client()
    except ClientError as e:
        fail(str(e))
    job_id = os.environ.get("SLURM_JOB_ID")
    own_allocation = None
    try:
        if job_id is None:  # in salloc's shell, SLURM_JOB_ID is the allocation, stepped into with the user's token
            own_allocation = _allocate(client, opts, req.command)
            job_id = str(own_allocation)
        step = client.post(f"/shoal/v1/jobs/{job_id}/steps", _step_body(opts, req.command))
    except ClientError as e:
        if own_allocation is not None:
            _complete(client, own_allocation, 1, 0)
        fail(str(e))
    env = step_environment(dict(opts.get("environment") or os.environ), step["env"], own_allocation is not None)
    env["SLURM_JOB_ID"] = str(job_id)
    try:
        tls = client.tls_context() if any(n.get("tls") for n in step["nodes"]) else None
    except ClientError as e:
        fail(str(e))
    launcher = Launcher(step, req.command, opts, env, tls)
    with raw_terminal(bool(opts.get("pty"))):
        rc, sig = launcher.run()
    why = {"reason": launcher.reason} if launcher.reason else {}
    try:
        client.post(f"/shoal/v1/jobs/{job_id}/steps/{step['step_id']}/complete", {"exit_code": rc, "signal": sig, **why})
        if own_allocation is not None:
            _complete(client, own_allocation, rc, sig, launcher.reason)
    except ClientError as e:
        print(f"srun: error: could not record the step's end: {e}", file=sys.stderr)
    return rc if not sig else 128 + sig


# What a step sets over the environment srun inherits inside an allocation (the batch script's
# or salloc's): its own layout. The job's variables (SLURM_JOB_*) stay as the allocation gave them.
STEP_VARIABLES = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE", "SLURM_CPUS_PER_TASK", "SLURM_NNODES")


def step_environment(inherited: dict[str, str], step_env: dict[str, str], new_allocation: bool) -> dict[str, str]:
    """The tasks' environment: srun's own, with the step's variables over it (all of the server's
    with an allocation of srun's own). The batch task's own ids (SLURM_PROCID, SLURM_TASK_PID...)
    are each task's: the node and its supervisor set them."""
    if new_allocation:
        return {**inherited, **step_env}
    env = {k: v for k, v in inherited.items() if k != "SLURM_TASK_PID"}
    env.update({k: v for k, v in step_env.items() if k.startswith("SLURM_STEP") or k in STEP_VARIABLES})
    return env


@contextlib.contextmanager
def raw_terminal(pty: bool):
    """srun --pty: srun's terminal in raw mode while the step runs (every key, ^C included, goes
    to task 0's terminal), as it was afterwards."""
    if not pty or not os.isatty(0):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(0)
    tty.setraw(0)
    try:
        yield
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)


def window_size() -> dict[str, int]:
    """srun's terminal's size, as the node sets task 0's terminal's (24x80 without one)."""
    for fd in (0, 1, 2):
        try:
            size = os.get_terminal_size(fd)
            return {"Height": size.lines, "Width": size.columns}
        except OSError:
            continue
    return {"Height": 24, "Width": 80}


def _job_client():
    from shoal.api_client import Client, load_config

    server = os.environ.get("SHOAL_SERVER")
    if server:
        return Client(server, None)
    conf = load_config()
    return Client(conf["server"], conf.get("token"))


def _step_body(opts: dict, command: list[str]) -> dict:
    body = {k: opts[k] for k in STEP_KEYS if opts.get(k) is not None}
    body["argv"] = command
    body["name"] = opts.get("name") or os.path.basename(command[0])
    return body


def _allocate(client, opts: dict, command: list[str], prog: str = "srun") -> int:
    """srun (or salloc) outside a job: get an allocation first, and wait for it (srun: job N queued...)."""
    body = {k: v for k, v in opts.items() if k not in ("label", "unbuffered", "mpi", "kill_on_bad_exit",
                                                       "overlap", "exact", "gpu_bind", "cpu_bind", "pty")}
    body["interactive"] = True
    body.setdefault("name", os.path.basename(command[0]))
    body.pop("script", None)
    out = client.post("/shoal/v1/jobs", body)
    job_id = out["job_id"]
    announced = False
    delay = 0.01
    t0 = time.time()

    def cancel(signum, frame):
        try:
            client.post(f"/shoal/v1/jobs/{job_id}/cancel", {})
        finally:
            print(f"{prog}: Job allocation {job_id} has been revoked", file=sys.stderr)
            raise SystemExit(1)

    old = signal.signal(signal.SIGINT, cancel)
    try:
        while True:
            job = client.get(f"/shoal/v1/jobs/{job_id}")
            if job["state"] == "RUNNING":
                break
            if job["state"] not in ("PENDING",):
                raise SystemExit(f"{prog}: error: Job allocation {job_id} ended: {job['state']}")
            if not announced and time.time() - t0 > 1.0:
                print(f"{prog}: job {job_id} queued and waiting for resources", file=sys.stderr)
                announced = True
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
    finally:
        signal.signal(signal.SIGINT, old)
    if announced:
        print(f"{prog}: job {job_id} has been allocated resources", file=sys.stderr)
    return job_id


def _complete(client, job_id: int, rc: int, sig: int, reason: str | None = None) -> None:
    client.post(f"/shoal/v1/jobs/{job_id}/complete",
                {"exit_code": rc, "signal": sig, **({"reason": reason} if reason else {})})


class Launcher:
    """Connects to every node of the step at once and relays the tasks' output."""

    def __init__(self, step: dict, command: list[str], opts: dict, env: dict[str, str], tls=None) -> None:
        self.step = step
        self.tls = tls  # an ssl.SSLContext trusting the cluster CA, for agents that serve HTTPS
        self.command = command
        # --pty: task 0 runs on a terminal, its input srun's; the other tasks' output is discarded.
        self.pty = bool(opts.get("pty"))
        self.label = bool(opts.get("label")) and not self.pty
        # As Slurm's srun, whole lines per task unless --unbuffered (implied by --pty), so tasks
        # never interleave mid-line.
        self.unbuffered = (bool(opts.get("unbuffered")) or self.pty) and not self.label
        self.env = env
        self.cwd = opts.get("workdir") or os.getcwd()
        self.container = opts.get("container")  # Pyxis' options: the tasks run in this container
        self.exits: dict[int, tuple[int, int]] = {}
        self.lock = threading.Lock()
        self.partial: dict[tuple[int, str], str] = {}
        self.socks: list[socket.socket] = []
        self.launched: list[socket.socket] = []  # those whose launch request has been sent
        self.failed: list[str] = []
        self.reason: str | None = None
        self.kill_on_bad_exit = bool(opts.get("kill_on_bad_exit"))
        self.terminated = False  # --kill-on-bad-exit has stopped the step
        self.last_interrupt = 0.0  # when the last Ctrl-C came (a second within 1 s passes it on)
        self.forcing = False  # srun, signalled, has asked the nodes to end the step
        self.abort_deadline: float | None = None  # once a node said how long its KillWait is
        procids = [t["procid"] for n in step["nodes"] for t in n["tasks"]]
        self.stdin_to, self.stdin_source = _stdin_plan(opts.get("stdin") or ("0" if self.pty else None), procids)
        self.stdin_nodes = sum(1 for n in step["nodes"] if any(t["procid"] in self.stdin_to for t in n["tasks"]))
        self.stdin_socks: list[socket.socket] = []
        self.stdin_heard: set[str] = set()  # the feeding nodes launched or failed
        self.send_lock = threading.Lock()  # one request line at a time on each node's connection

    def run(self) -> tuple[int, int]:
        threads = [threading.Thread(target=self._node, args=(n,), daemon=True) for n in self.step["nodes"]]
        handlers = {signal.SIGINT: self._interrupt, signal.SIGTERM: self._force, signal.SIGHUP: self._force,
                    signal.SIGQUIT: self._force}
        if self.pty:  # srun's terminal resized: so is task 0's
            handlers[signal.SIGWINCH] = lambda signum, frame: self._tell({"winsize": window_size()})
        old = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
                    if self.abort_deadline is not None and time.monotonic() > self.abort_deadline:
                        print("srun: error: Timed out waiting for job step to complete", file=sys.stderr)
                        self._hang_up()
                        self.abort_deadline = None
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        self._flush_partial()
        total = sum(len(n["tasks"]) for n in self.step["nodes"])
        heard = dict(self.exits)
        if self.terminated:  # the tasks --kill-on-bad-exit stopped were killed (SIGKILL), as Slurm's are
            for node in self.step["nodes"]:
                killed = {t["procid"]: (0, int(signal.SIGKILL)) for t in node["tasks"] if t["procid"] not in heard}
                if node["name"] not in self.failed and killed:
                    self.exits.update(killed)
                    _report_exits(node["name"], killed)
            # srun's exit code is the failed task's, not the kill it caused (Slurm keeps the first).
            total = len(heard)
        if len(heard) < total:
            return (heard and max(rc for rc, _ in heard.values()) or 0) or 1, 0
        return max(rc for rc, _ in heard.values()), max(sig for _, sig in heard.values())

    def _exited(self, node: dict, exits: dict[int, tuple[int, int]]) -> None:
        """A node's tasks have ended: say which failed, as srun does when it hears, and with
        --kill-on-bad-exit stop the step's other tasks (their nodes kill them when srun hangs up)."""
        with self.lock:
            self.exits.update(exits)
            _report_exits(node["name"], exits)
            bad = any(rc or sig for rc, sig in exits.values())
            if not (bad and self.kill_on_bad_exit) or self.terminated:
                return
            self.terminated = True
            print(f"srun: launch/slurm: _step_signal: Terminating StepId={self.step['job_id']}.{self.step['step_id']}",
                  file=sys.stderr)
            for s in self.socks:
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def _interrupt(self, signum, frame):
        """Ctrl-C, as Slurm's srun: the tasks' status; a second within a second passes SIGINT on
        to the tasks and ends the step (SIGTERM, SIGKILL after KillWait)."""
        now = time.monotonic()
        if now - self.last_interrupt < 1.0:
            print(f"srun: sending Ctrl-C to {self._step_name()}", file=sys.stderr)
            self._tell({"signal": int(signal.SIGINT)})
            self._force(signum, frame)
            return
        self.last_interrupt = now
        print("srun: interrupt (one more within 1 sec to abort)", file=sys.stderr)
        with self.lock:
            running = [t["procid"] for n in self.step["nodes"] for t in n["tasks"] if t["procid"] not in self.exits]
        if running:
            from shoal.model.hostlist import compress_numbers

            tasks = f"task {running[0]}" if len(running) == 1 else f"tasks {compress_numbers(running)}"
            print(f"srun: {self._step_name()} {tasks}: running", file=sys.stderr)

    def _force(self, signum, frame):
        """SIGTERM, SIGHUP, SIGQUIT (or a second Ctrl-C): ask every node to end the step, its
        tasks getting SIGTERM and, after KillWait, SIGKILL; wait for them to end."""
        if signum == signal.SIGQUIT:
            print("srun: Quit", file=sys.stderr)
        print("srun: forcing job termination", file=sys.stderr)
        with self.lock:
            first, self.forcing = not self.forcing, True
        if first:
            self._tell({"terminate": True})

    def _aborting(self, kill_wait: float) -> None:
        """A node has begun ending the step: say how long srun waits, as Slurm's srun does."""
        with self.lock:
            if self.abort_deadline is not None:
                return
            wait = int(kill_wait) + 2  # Slurm's KillWait + STEP_ABORT_TIME
            self.abort_deadline = time.monotonic() + wait
        print(f"srun: Job step aborted: Waiting up to {wait} seconds for job step to finish.", file=sys.stderr)

    def _tell(self, doc: dict) -> None:
        line = json.dumps(doc).encode() + b"\n"
        with self.lock:
            socks = list(self.launched)
        for s in socks:
            try:
                with self.send_lock:
                    s.sendall(line)
            except OSError:
                pass

    def _hang_up(self) -> None:
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _step_name(self) -> str:
        return f"StepId={self.step['job_id']}.{self.step['step_id']}"

    def _node(self, node: dict) -> None:
        try:
            sock = socket.create_connection((node["address"], node["port"]), timeout=30)
            if node.get("tls"):
                sock = self.tls.wrap_socket(sock, server_hostname=node["name"])
        except OSError as e:  # ssl.SSLError too: an agent whose certificate the cluster CA did not issue
            hint = " (is $SHOAL_CA the cluster's CA certificate?)" if "CERTIFICATE_VERIFY_FAILED" in str(e) else ""
            self._fail(node, f"cannot connect to {node['name']} ({node['address']}:{node['port']}): {e}{hint}")
            return
        with self.lock:
            if self.terminated:  # --kill-on-bad-exit stopped the step before this node's tasks started
                sock.close()
                return
            self.socks.append(sock)
        sock.settimeout(None)
        # The address the node sees this srun at, as Slurm tells its tasks.
        here = sock.getsockname()[0]
        env = {**self.env, "SLURM_LAUNCH_NODE_IPADDR": here, "SLURM_SRUN_COMM_HOST": here}
        size = window_size() if self.pty else None
        if size:  # every task's, as Slurm's srun puts them in the step's environment
            env.update({"SLURM_PTY_WIN_ROW": str(size["Height"]), "SLURM_PTY_WIN_COL": str(size["Width"])})
        feeds = [t["procid"] for t in node["tasks"] if t["procid"] in self.stdin_to]
        body = json.dumps({
            "key": f"{self.step['job_id']}.{self.step['run']}", "job_id": self.step["job_id"],
            "run": self.step["run"], "step_id": self.step["step_id"], "credential": node["credential"],
            "argv": self.command, "cwd": self.cwd, "env": env, "nodeid": node["nodeid"],
            "tasks": node["tasks"], **({"container": self.container} if self.container else {}),
            **({"stdin": feeds} if feeds else {}),
            **({"pty": size if any(t["procid"] == 0 for t in node["tasks"]) else {}} if size else {}),
        }).encode()
        head = (f"POST /v1/steps HTTP/1.0\r\nHost: {node['address']}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        try:
            sock.sendall(head + body)
            with self.lock:  # from now on srun's requests may follow the launch
                self.launched.append(sock)
                forcing = self.forcing
            if forcing:  # srun was signalled while this node's launch was on its way
                sock.sendall(json.dumps({"terminate": True}).encode() + b"\n")
            f = sock.makefile("rb")
            status = f.readline().split()
            while f.readline() not in (b"\r\n", b"\n", b""):
                pass
            if len(status) < 2 or status[1] != b"200":
                detail = f.read().decode(errors="replace")
                try:
                    detail = json.loads(detail)["detail"]
                except (ValueError, KeyError, TypeError):
                    pass
                self._fail(node, f"{node['name']} refused the step: {detail}")
                return
            if feeds:  # after the answer's head: the node has read the launch, so input cannot join it
                self._stdin_node(node["name"], sock)
            for line in f:
                doc = json.loads(line)
                if "reason" in doc:  # the node could not start the tasks (their container, say)
                    self.reason = str(doc["reason"])
                elif "aborting" in doc:
                    self._aborting(float(doc["aborting"]))
                elif "exit" in doc:
                    self._exited(node, {int(k): (v[0], v[1]) for k, v in doc["exit"].items()})
                elif "o" in doc:
                    self._write(doc["t"], "o", doc["o"])
                elif "e" in doc:
                    self._write(doc["t"], "e", doc["e"])
        except (OSError, ValueError) as e:
            self._fail(node, f"lost the connection to {node['name']}: {e}")
        finally:
            sock.close()

    def _fail(self, node: dict, message: str) -> None:
        with self.lock:
            self.failed.append(node["name"])
        print(f"srun: error: {message}", file=sys.stderr)
        if any(t["procid"] in self.stdin_to for t in node["tasks"]):
            self._stdin_node(node["name"], None)

    def _stdin_node(self, name: str, sock: socket.socket | None) -> None:
        """A node that takes standard input has its launch (or has failed); once all have,
        the input is read and sent to them, as srun sends its stdin to the tasks' nodes."""
        with self.lock:
            if name in self.stdin_heard:
                return
            self.stdin_heard.add(name)
            if sock is not None:
                self.stdin_socks.append(sock)
            self.stdin_nodes -= 1
            if self.stdin_nodes or not self.stdin_socks:
                return
        threading.Thread(target=self._pump_stdin, daemon=True, name="srun-stdin").start()

    def _pump_stdin(self) -> None:
        """Standard input to each feeding node, as requests: ``{"stdin": base64}``, then
        ``{"stdin": null}`` at its end."""
        import binascii

        fd = self.stdin_source if self.stdin_source is not None else 0
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:  # no standard input at all: its end
                data = b""
            text = binascii.b2a_base64(data, newline=False).decode("ascii") if data else None
            line = json.dumps({"stdin": text}).encode() + b"\n"
            for sock in list(self.stdin_socks):
                try:
                    with self.send_lock:
                        sock.sendall(line)
                except OSError:
                    self.stdin_socks.remove(sock)
            if not data or not self.stdin_socks:
                return

    def _write(self, procid: int, stream: str, text: str) -> None:
        out = sys.stdout if stream == "o" else sys.stderr
        with self.lock:
            if self.unbuffered:
                out.write(text)
                out.flush()
                return
            buf = self.partial.pop((procid, stream), "") + text
            lines = buf.split("\n")
            rest = lines.pop()
            if rest:
                self.partial[(procid, stream)] = rest
            prefix = f"{procid}: " if self.label else ""
            if lines:
                out.write("".join(f"{prefix}{line}\n" for line in lines))
                out.flush()

    def _flush_partial(self) -> None:
        """A task's last line without a newline: printed as is, after a label if any."""
        for (procid, stream), rest in self.partial.items():
            out = sys.stdout if stream == "o" else sys.stderr
            out.write(f"{procid}: {rest}\n" if self.label else rest)
        sys.stdout.flush()
        sys.stderr.flush()


def _stdin_plan(mode: str | None, procids: list[int]) -> tuple[set[int], int | None]:
    """srun's -i/--input: the tasks that get its standard input, and an open file to read it from
    (None: srun's own stdin). By default and with ``all``, every task (as Slurm 22.05's srun);
    a task number, that one; ``none``, none; a file name: every task reads that file."""
    from shoal.api_client import fail

    if mode is None and _stdin_is_null():
        return set(), None  # the tasks' own /dev/null is the same input, without a relay
    if mode is None or mode == "all":
        return set(procids), None
    if mode == "none":
        return set(), None
    if mode.isdigit():
        if int(mode) not in procids:
            fail(f"--input={mode}: the step has no task {mode} (its tasks are 0-{max(procids)})")
        return {int(mode)}, None
    try:
        return set(procids), os.open(mode, os.O_RDONLY)
    except OSError as e:
        fail(f"Could not open stdin file: {mode}: {e.strerror}")


def _stdin_is_null() -> bool:
    """srun's standard input is /dev/null (a batch script's background srun) or closed."""
    try:
        st, null = os.fstat(0), os.stat(os.devnull)
    except OSError:
        return True
    return (st.st_rdev, st.st_ino, st.st_dev) == (null.st_rdev, null.st_ino, null.st_dev)


def _report_exits(node: str, exits: dict[int, tuple[int, int]]) -> None:
    """srun's line per node and outcome for the tasks that failed: "node02: tasks 1-3: Killed"."""
    from shoal.model.hostlist import compress_numbers

    outcomes: dict[str, list[int]] = {}
    for procid, (rc, sig) in sorted(exits.items()):
        if sig:
            outcomes.setdefault(signal.strsignal(sig) or f"Signal {sig}", []).append(procid)
        elif rc:
            outcomes.setdefault(f"Exited with exit code {rc}", []).append(procid)
    for what, procids in outcomes.items():
        tasks = f"task {procids[0]}" if len(procids) == 1 else f"tasks {compress_numbers(procids)}"
        print(f"srun: error: {node}: {tasks}: {what}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
