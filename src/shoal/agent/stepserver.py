"""The agent's own HTTP endpoint: srun connects here to launch a step's tasks on this node,
and the server fetches pod logs and runs ``shoal exec`` commands here.

As with srun and slurmd, the client talks to each node directly; the server only signs the
launch (an HMAC with this node's step key), so output streams node-to-client without
passing through the control plane. The reply is NDJSON, one object per output chunk:
``{"t": procid, "o": text}`` (stdout) or ``{"t": procid, "e": text}`` (stderr), then
``{"exit": {procid: [exit_code, signal]}}``. A launch that names ``"stdin": [procids]`` (srun's
--input: every task by default) is followed by srun's standard input as requests on the same
connection (StdinRelay).

Off loopback (``--tls``) it serves HTTPS only, with the certificate the cluster CA issued the
agent (``agent.certs``): a plain HTTP request is answered 400, and nothing is served until
the agent holds a certificate.
"""

from __future__ import annotations

import codecs
import hashlib
import hmac
import json
import logging
import os
import pty
import selectors
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from shoal.agent import podstreams, supervise
from shoal.agent.cgroups import close_all
from shoal.agent.identity import UnknownUser, spawn
from shoal.agent.pods import ContainerNotRunning, LogNotFound
from shoal.agent.runtime import Runtime, _killpg, set_gpu_env

log = logging.getLogger("shoal.agent.steps")
OUTPUT_BYTES = 64 * 1024  # the most of a job's output file the console is sent at once

MAX_BODY = 8 * 1024 * 1024
STEP_WAIT_S = 5.0  # how long a step waits for its run to reach this agent (known_run)


PLAIN_REFUSED = json.dumps({"detail": "this agent serves HTTPS only: connect with https:// and the cluster CA"})


class StepServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], agent, tls_only: bool = False) -> None:
        self.agent = agent
        self.tls_only = tls_only
        self.tls: ssl.SSLContext | None = None  # the agent's certificate, once it has one
        super().__init__(address, _Handler)

    def finish_request(self, request, client_address) -> None:
        if not self.tls_only:
            return super().finish_request(request, client_address)
        conn = self._handshake(request)
        if conn is None:
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            try:
                conn.settimeout(1.0)
                conn.unwrap()  # close_notify: the answer ended here, it was not cut
            except (OSError, ValueError):
                pass
            conn.close()

    def _handshake(self, sock: socket.socket) -> ssl.SSLSocket | None:
        """The connection's TLS side; None when it was a plain HTTP request (answered 400),
        a failed handshake, or the agent has no certificate yet."""
        sock.settimeout(10)
        try:
            first = sock.recv(1, socket.MSG_PEEK)
            if first and first != b"\x16":  # not a TLS handshake record
                sock.recv(65536)  # the request: unread, closing would reset the answer
                body = PLAIN_REFUSED.encode()
                sock.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                return None
            if self.tls is None:
                return None
            conn = self.tls.wrap_socket(sock, server_side=True)
        except OSError as e:  # ssl.SSLError included: the client does not trust us, or is no TLS client
            log.debug("TLS connection refused: %s", e)
            return None
        conn.settimeout(None)
        return conn


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server: StepServer

    def log_message(self, fmt, *args):  # quiet: the agent log says what matters
        log.debug(fmt, *args)

    def do_GET(self):
        if self.path == "/healthz":
            self._json(200, {"ok": True, "node": self.server.agent.name})
        elif self.path == "/metrics":
            self._text(200, self.server.agent.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path.startswith("/v1/pods/log?"):
            self._pod_log(self.path.partition("?")[2])
        elif self.path.startswith("/v1/jobs/output?"):
            self._job_output(self.path.partition("?")[2])
        elif self.path.startswith("/v1/jobs/usage?"):
            self._job_usage(self.path.partition("?")[2])
        else:
            self._json(404, {"detail": "not found"})

    def _signed_query(self, query: str, what: str) -> dict | None:
        """The query's fields if the server signed it; else None, the 403 already answered."""
        body, _, sig = query.rpartition("&sig=")
        q = {k: v[0] for k, v in parse_qs(body).items()}
        err = _check_signed(self.server.agent, body, sig, q.get("t", 0), what)
        if err:
            self._json(403, {"detail": err})
            return None
        return q

    def _pod_log(self, query: str) -> None:
        """A container's log, for ``shoal logs`` (the server signs the query with the step key)."""
        agent = self.server.agent
        q = self._signed_query(query, "log")
        if q is None:
            return
        key, container = q.get("key", ""), q.get("container", "")
        try:
            path = agent.pods.log_path(key, container, previous=q.get("previous") == "1")
        except LogNotFound as e:
            return self._json(404, {"detail": str(e)})
        if not path.exists():
            what = "previous terminated container" if q.get("previous") == "1" else "container"
            return self._json(400, {"detail": f'{what} "{container}" has no log yet'})
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        tail = int(q["tail"]) if q.get("tail") else None

        def alive() -> bool:
            try:
                return key in agent.pods.alive_keys() and path == agent.pods.log_path(key, container)
            except LogNotFound:
                return False

        _send_log(path, self.wfile, tail, follow=q.get("follow") == "1", alive=alive)

    def _job_output(self, query: str) -> None:
        """The end of a batch job's output file, for the console (the server signs the query).
        Read only if the job's user owns it, so an --output naming another's file shows nothing."""
        agent = self.server.agent
        q = self._signed_query(query, "output")
        if q is None:
            return
        path, limit = q.get("path", ""), min(int(q.get("bytes") or OUTPUT_BYTES), OUTPUT_BYTES)
        try:
            ident = agent.runtime.users.of(q.get("user", ""))
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except UnknownUser as e:
            return self._json(404, {"detail": str(e)})
        except OSError as e:
            return self._json(404, {"detail": f"no output file {path} on {agent.name}: {e.strerror}"})
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != (os.geteuid() if ident is None else ident.uid):
                return self._json(403, {"detail": f"{path} is not a file of the job's user"})
            f.seek(max(0, st.st_size - limit))
            data = f.read(limit)
        self._text(200, data.decode("utf-8", "replace"), "text/plain; charset=utf-8")

    def _job_usage(self, query: str) -> None:
        """What each step of a running job has used on this node so far, from its cgroups
        (sstat; the server signs the query)."""
        q = self._signed_query(query, "usage")
        if q is None:
            return
        run = self.server.agent.runtime.get(q.get("key", ""))
        if run is None or run.cgroup is None:
            return self._json(404, {"detail": f"no running job {q.get('key', '')} on {self.server.agent.name}"})
        self._json(200, {"node": self.server.agent.name, "steps": step_usage(run)})

    def do_POST(self):
        if self.path not in ("/v1/steps", "/v1/pods/exec", "/v1/pods/stream"):
            return self._json(404, {"detail": "not found"})
        what = {"/v1/steps": "step", "/v1/pods/exec": "exec"}.get(self.path, "stream")
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self._json(413, {"detail": f"{what} request too large"})
        try:
            req = json.loads(self.rfile.read(length))
        except ValueError:
            return self._json(400, {"detail": f"{what} request is not JSON"})
        if not isinstance(req, dict):
            return self._json(400, {"detail": f"{what} request is not a JSON object"})
        if what == "exec":
            return self._pod_exec(req)
        if what == "stream":
            return self._pod_stream(req)
        agent = self.server.agent
        err = _check(agent, req)
        if err:
            return self._json(403, {"detail": err})
        run = known_run(agent.runtime, req["key"], STEP_WAIT_S)
        if run is None or run.killing_since is not None:
            return self._json(409, {"detail": f"job {req['job_id']} is not running on {agent.name}"})
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        _run_step(agent.runtime, run, req, self.connection, self.wfile, agent.name, agent.containers,
                  agent.kill_wait, agent.step_ended)

    def _signed_body(self, req: dict, what: str) -> bool:
        """The request (less its ``sig``) was signed by the server; else False, the 403 answered."""
        sig = str(req.pop("sig", ""))
        err = _check_signed(self.server.agent, json.dumps(req, sort_keys=True), sig, req.get("t", 0), what)
        if err:
            self._json(403, {"detail": err})
        return err is None

    def _pod_exec(self, req: dict) -> None:
        """``shoal exec``: run a command inside a pod's container and stream its output as a
        step's (one task, procid 0). The server signs the request as it signs log queries."""
        agent = self.server.agent
        if not self._signed_body(req, "exec"):
            return
        try:
            target = agent.pods.exec_target(str(req["key"]), str(req["container"]), [str(a) for a in req["argv"]],
                                            stdin=bool(req.get("stdin")))
        except (KeyError, TypeError):
            return self._json(400, {"detail": "malformed exec request"})
        except LogNotFound as e:
            return self._json(404, {"detail": str(e)})
        except ContainerNotRunning as e:
            return self._json(409, {"detail": str(e)})
        stdin = str(req.get("stdin") or "").encode()
        try:
            p = spawn(target.argv, identity=target.identity, cwd=target.cwd, env=target.env,
                      stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as e:
            # kubectl's wording for a command the container cannot run.
            return self._json(400, {"detail": f'exec: "{req["argv"][0]}": {e.strerror}'})
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        target.procs.add(p)
        try:
            if stdin:
                threading.Thread(target=_feed, args=(p, stdin), daemon=True).start()
            _stream_tasks({0: p}, self.connection, _emitter(self.wfile), {})
        finally:
            target.procs.discard(p)

    def _pod_stream(self, req: dict) -> None:
        """``kubectl exec``/``attach``/``port-forward``: after the 200, frames both ways on this
        connection (agent/podstreams.py). The server signs the request as it signs exec's."""
        if not self._signed_body(req, "stream"):
            return
        try:
            serve = podstreams.prepare(self.server.agent, req)
        except podstreams.StreamRefused as e:
            return self._json(e.status, {"detail": e.message})
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        self.wfile.flush()
        serve(podstreams.Channel(self.rfile, self.wfile))

    def _json(self, status: int, doc: dict) -> None:
        self._text(status, json.dumps(doc), "application/json")

    def _text(self, status: int, text: str, content_type: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _send_log(path, wfile, tail: int | None, follow: bool, alive) -> None:
    """Write the log (its last ``tail`` lines), then, when following, what the container
    appends, until it exits (or restarts into a new log file) or the client goes away."""
    with open(path, "rb") as f:
        if tail is not None:
            lines = f.read().splitlines(keepends=True)
            data = b"".join(lines[-tail:]) if tail else b""
        else:
            data = f.read()
        try:
            wfile.write(data)
            wfile.flush()
            idle = 0.0
            while follow:
                chunk = f.read(65536)
                if chunk:
                    wfile.write(chunk)
                    wfile.flush()
                    idle = 0.0
                    continue
                if not alive():
                    wfile.write(f.read())
                    break
                time.sleep(0.1)
                idle += 0.1
                if idle >= 5.0:  # a keep-alive probe: a write to a gone client fails
                    wfile.write(b"")
                    wfile.flush()
                    idle = 0.0
        except OSError:
            pass


def step_usage(run) -> dict[str, dict]:
    """Each step's cgroup usage on this node (``batch``, ``0``...) and its live tasks here."""
    tasks: dict[str, int] = {}
    for proc in list(run.procs):
        if proc.alive:
            step = "batch" if proc.kind == "batch" else str(proc.step_id)
            tasks[step] = tasks.get(step, 0) + 1
    out = {}
    for step in tasks:
        cg = run.cgroup.sub(f"step_{step}")
        if not cg.made_below(run.cgroup):
            continue
        u = cg.usage()
        out[step] = {**u.report(), "tasks": tasks[step]}
    return out


def _check_signed(agent, text: str, sig: str, t, what: str) -> str | None:
    """Why a request the server signed with this node's step key is refused, or None."""
    want = hmac.new(agent.step_key.encode(), text.encode(), hashlib.sha256).hexdigest()
    if not sig or not hmac.compare_digest(want, sig):
        return f"invalid {what} request signature"
    try:
        if abs(time.time() - float(t)) <= 300:
            return None
    except (TypeError, ValueError):
        pass
    return f"expired {what} request"


def _feed(p: subprocess.Popen, data: bytes) -> None:
    try:
        p.stdin.write(data)
    except OSError:
        pass
    finally:
        try:
            p.stdin.close()
        except OSError:
            pass


def _emitter(wfile):
    """A thread-safe writer of NDJSON lines to the client; False once the client is gone."""
    lock = threading.Lock()

    def emit(doc: dict) -> bool:
        try:
            with lock:
                wfile.write(json.dumps(doc).encode() + b"\n")
                wfile.flush()
            return True
        except OSError:
            return False

    return emit


def known_run(runtime, key: str, wait_s: float):
    """The run ``key`` once this agent has it, or None after ``wait_s``. A step the server
    signed for a run may reach the node before the long-poll answer that starts the run there:
    srun sees its job RUNNING once the pass has committed, the agent once the pass's wake-up
    reaches it, later on a busy server."""
    deadline = time.monotonic() + wait_s
    while (run := runtime.get(key)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return run


def _check(agent, req: dict) -> str | None:
    try:
        msg = f"{req['job_id']}.{req['run']}.{req['step_id']}"
        want = hmac.new(agent.step_key.encode(), msg.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, str(req["credential"])):
            return "invalid step credential"
    except (KeyError, TypeError, AttributeError):
        return "malformed step request"
    return None


def _from_client(conn: socket.socket, partial: bytearray) -> list[dict] | None:
    """The client's end is readable: srun's requests (NDJSON lines: ``{"signal": N}`` to
    pass a signal on, ``{"terminate": true}`` to end the step), or None once it has gone away."""
    try:
        if isinstance(conn, ssl.SSLSocket):
            conn.settimeout(1.0)
            try:
                data = conn.recv(4096)
            finally:
                conn.settimeout(None)
        else:
            data = conn.recv(4096)
    except OSError:
        return None
    if not data:
        return None
    partial += data
    *lines, rest = bytes(partial).split(b"\n")
    partial[:] = rest
    docs = []
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def _run_step(runtime: Runtime, run, req: dict, conn: socket.socket, wfile, node: str, containers=None,
              kill_wait: float = 30.0, on_end=None) -> None:
    """Run one srun step's tasks on this node and stream them to srun; at their end, what the
    step's cgroup here says they used goes to ``on_end(run, step_id, usage)``."""
    procs: dict[int, subprocess.Popen] = {}
    exits: dict[int, list[int]] = {}
    emit = _emitter(wfile)
    try:
        ident = runtime.users.of(run.user)
    except UnknownUser:
        ident = None
        for task in req["tasks"]:
            emit({"t": task["procid"], "e": f"slurmstepd: error: user {run.user} is unknown on {node}\n"})
            exits[task["procid"]] = [1, 0]
        req = {**req, "tasks": []}
    # Each task under a supervisor of its own that fences it by the node's lease, as a batch
    # script's does, even with no agent alive (docs/FENCING.md); none when fencing is off.
    lease = runtime.workdir / supervise.LEASE
    prefix = supervise.step_command(lease) if lease.exists() else []
    step = runtime.step_cgroup(run, f"step_{req['step_id']}") if req["tasks"] else None
    step_container = None
    if req.get("container") and req["tasks"]:
        step_container = _start_container(containers, req, run, ident, emit, exits, step)
        if step_container is None:
            req = {**req, "tasks": []}
        elif step_container.container.cgroup_parent:
            cg = run.cgroup if step_container.named else step
            if cg is not None:
                runtime.list_engine_cgroups(run, cg)
    cwd = req.get("cwd") or "/"
    fds = step.open_procs() if step is not None else []  # each task joins them between fork and exec
    stdin_to = set(req.get("stdin") or ()) if step_container is None else set()
    # srun --pty: task 0 on a terminal of srun's terminal's size, the others' output to /dev/null.
    pty_size = req.get("pty") if step_container is None and isinstance(req.get("pty"), dict) else None
    terminal: int | None = None  # the terminal's master end, task 0's output and input
    for task in req["tasks"]:
        env = dict(req["env"])
        env.update({
            "SLURM_PROCID": str(task["procid"]),
            "SLURM_LOCALID": str(task["localid"]),
            "SLURM_NODEID": str(req["nodeid"]),
            "SLURMD_NODENAME": node,
            "SLURM_TOPOLOGY_ADDR": node,
            "SLURM_GPUS_ON_NODE": str(len(task["gpus"])),
            "PMI_RANK": str(task["procid"]),
            "PMI_SIZE": env.get("SLURM_NTASKS", "1"),
        })
        if ident is not None:
            env.update(ident.environment())
        set_gpu_env(env, task["gpus"])
        argv, who = req["argv"], ident
        if step_container is not None:
            # The runtime runs as root and enters the container as the job's user.
            argv, env = step_container.task_argv(env, req.get("container", {}).get("workdir") or cwd, argv)
            who = None
        slave = None
        try:
            if pty_size is not None and task["procid"] == 0:
                terminal, slave = pty.openpty()
                podstreams.set_size(terminal, pty_size)
                # The terminal becomes the session's controlling one (taken before the supervisor
                # is exec'd, as the session's leader), so ^C reaches the task's foreground job.
                p = spawn([sys.executable, "-c", podstreams.TAKE_TERMINAL, *prefix, *argv], identity=who, env=env,
                          cwd=cwd, cwd_fallback="/tmp", note_fd=2, stdin=slave, stdout=slave, stderr=slave,
                          cgroup_fds=fds)
                p.stdin, p.stdout = PtyInput(os.dup(terminal)), os.fdopen(terminal, "rb", buffering=0)
            else:
                out = subprocess.DEVNULL if pty_size is not None else subprocess.PIPE
                p = spawn([*prefix, *argv], identity=who, env=env, cwd=cwd, cwd_fallback="/tmp", note_fd=2,
                          stdin=subprocess.PIPE if task["procid"] in stdin_to else subprocess.DEVNULL,
                          stdout=out, stderr=out, cgroup_fds=fds)
        except OSError as e:
            emit({"t": task["procid"], "e": f"slurmstepd: error: execve(): {argv[0]}: {e.strerror}\n"})
            exits[task["procid"]] = [2, 0]
            continue
        finally:
            if slave is not None:
                os.close(slave)
        runtime.add_step_proc(run, p, req["step_id"], fences_itself=bool(prefix))
        procs[task["procid"]] = p
    close_all(fds)

    stdin = StdinRelay([p.stdin for p in procs.values() if p.stdin is not None])

    def on_request(doc: dict) -> None:
        """srun, itself signalled, asks for its step's end (with KillWait) or passes a signal on;
        or sends its standard input on."""
        if "stdin" in doc:
            stdin.put(doc["stdin"])
        elif isinstance(doc.get("winsize"), dict) and terminal is not None:
            try:  # srun's terminal was resized: so is the task's (its foreground job gets SIGWINCH)
                podstreams.set_size(terminal, doc["winsize"])
            except (OSError, ValueError, TypeError):
                pass
        elif doc.get("terminate"):
            runtime.terminate_step(run, req["step_id"], kill_wait)
            emit({"aborting": kill_wait})
        elif isinstance(doc.get("signal"), int):
            runtime.signal_step(run, req["step_id"], doc["signal"])

    try:
        _stream_tasks(procs, conn, emit, exits, on_request)
        if terminal is not None:
            for p in procs.values():
                if isinstance(p.stdin, PtyInput):
                    p.stdin.release()
        if step is not None and procs and on_end is not None:
            on_end(run, req["step_id"], step.usage())
        if step_container is not None and req["container"].get("save"):
            _save_container(containers, step_container, req, ident, emit)
    finally:
        if step_container is not None:
            # The tasks have ended and said so: srun need not wait for the container's removal.
            threading.Thread(target=containers.finish, args=(step_container,), daemon=True).start()


def _start_container(containers, req: dict, run, ident, emit, exits: dict[int, list[int]], step=None):
    """The step's container (pulled, created) or None, every task then failed with the
    runtime's message, as Pyxis fails the step's tasks (the job's error output has it)."""
    from shoal.agent.stepcontainer import ContainerStartError
    from shoal.model.container import ContainerOptionError

    uid, gid = (ident.uid, ident.gid) if ident is not None else (os.getuid(), os.getgid())
    home = ident.home if ident is not None else os.environ.get("HOME")
    gpus = sorted({g for t in req["tasks"] for g in t["gpus"]})
    try:
        if containers is None:
            raise ContainerStartError("this agent runs no containers")
        return containers.start(req["container"], job_id=req["job_id"], step_id=req["step_id"], user=(uid, gid),
                                home=home, cwd=req.get("cwd") or "/", gpus=gpus, env=req.get("env") or {},
                                cgroups=(run.cgroup, step))
    except (ContainerStartError, ContainerOptionError, OSError, subprocess.SubprocessError) as e:
        first = req["tasks"][0]["procid"]
        image = req["container"].get("image") or req["container"].get("name")
        emit({"t": first, "e": f"pyxis: failed to start the container ({image}):\n"
                               + "".join(f"pyxis:     {line}\n" for line in str(e).splitlines())})
        for task in req["tasks"]:
            exits[task["procid"]] = [1, 0]
        # srun hands this on with the step's end: sacct's and scontrol's Reason for the job.
        last = (str(e).strip().splitlines() or ["failed"])[-1]
        emit({"reason": f"ContainerError: {last.rsplit(': ', 1)[-1]}"[:64]})
        return None


class PtyInput:
    """srun's input to a --pty task: written to the terminal; its end is the terminal's end of
    file (^D), the terminal itself staying open for the task's output."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.write(self.fd, b"\x04")
            finally:
                self.release()

    def release(self) -> None:
        """The task has ended: no more input, and no end of file to write."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class StdinRelay:
    """srun's standard input (``{"stdin": base64}`` requests, ``{"stdin": null}`` at its end) to
    the tasks' stdin pipes, from a thread of its own: a task that does not read its input must not
    stall the output of the others."""

    def __init__(self, pipes: list) -> None:
        import queue

        self.pipes = pipes
        self.chunks: queue.SimpleQueue = queue.SimpleQueue()
        if pipes:
            threading.Thread(target=self._run, daemon=True, name="step-stdin").start()

    def put(self, text: str | None) -> None:
        if self.pipes:
            import binascii

            try:
                self.chunks.put(binascii.a2b_base64(text) if text else None)
            except (binascii.Error, TypeError):
                self.chunks.put(None)

    def _run(self) -> None:
        while True:
            data = self.chunks.get()
            for pipe in list(self.pipes):
                try:
                    if data is None:
                        pipe.close()
                    else:
                        pipe.write(data)
                        pipe.flush()
                except (OSError, ValueError):  # the task has ended or closed its input
                    self.pipes.remove(pipe)
            if data is None:
                return


def _save_container(containers, sc, req: dict, ident, emit) -> None:
    """--container-save, once the node's tasks have all ended (Pyxis: the last task to exit
    exports), before srun hears the node is done, so its next step can run the file."""
    from shoal.agent.stepcontainer import ContainerStartError

    first = req["tasks"][0]["procid"]
    path = req["container"]["save"]
    user = (ident.uid, ident.gid) if ident is not None else (os.getuid(), os.getgid())
    try:
        where = containers.save(sc, path, req.get("cwd") or "/", user)
    except (ContainerStartError, OSError, subprocess.SubprocessError) as e:
        emit({"t": first, "e": f"pyxis: failed to export container {sc.container.name} to {path}\n"
                               + "".join(f"pyxis:     {line}\n" for line in str(e).splitlines())})
        return
    emit({"t": first, "e": f"pyxis: exported container {sc.container.name} to {where}\n"})


def _stream_tasks(procs: dict[int, subprocess.Popen], conn: socket.socket, emit, exits: dict[int, list[int]],
                  on_request=None) -> None:
    """Forward the tasks' stdout and stderr as NDJSON lines, and each task's exit as it ends
    (srun says at once which task failed, and --kill-on-bad-exit acts on it); ``exits`` may
    already hold tasks that never started. What the client sends goes to ``on_request``; a
    client that goes away kills the tasks."""
    sel = selectors.DefaultSelector()
    pipes = {procid: 0 for procid in procs}  # open pipes per task: reaped once all are closed
    for procid, p in procs.items():
        for f, stream in ((p.stdout, "o"), (p.stderr, "e")):
            if f is not None:  # none: the output goes to /dev/null (srun --pty's other tasks)
                os.set_blocking(f.fileno(), False)
                sel.register(f, selectors.EVENT_READ, (procid, stream))
                pipes[procid] += 1
    # A chunk may end inside a multi-byte character: decode each stream incrementally.
    decoders = {(t, k): codecs.getincrementaldecoder("utf-8")("replace") for t in procs for k in "oe"}
    sel.register(conn, selectors.EVENT_READ, None)  # readable = the client went away
    client_gone = False
    partial = bytearray()
    if exits:  # tasks that never started
        emit({"exit": {str(k): v for k, v in sorted(exits.items())}})
    running = set(procs)
    while running:
        # A task whose pipes are closed but that has not exited yet (it closed them itself) is
        # polled; otherwise the pipes' end wakes the loop.
        closed = [t for t in running if not pipes[t]]
        for key, _ in sel.select(timeout=0.2 if closed else 1.0):
            if key.data is None:
                requests = _from_client(conn, partial)
                if requests is None:
                    client_gone = True
                    sel.unregister(conn)
                    for p in procs.values():
                        _killpg(p.pid, 9)
                elif on_request is not None:
                    for doc in requests:
                        on_request(doc)
                continue
            procid, stream = key.data
            try:
                data = os.read(key.fileobj.fileno(), 65536)
            except BlockingIOError:
                continue
            except OSError:  # EIO: a terminal whose last writer has closed it
                data = b""
            if not data:
                tail = decoders[(procid, stream)].decode(b"", final=True)
                if tail and not client_gone:
                    emit({"t": procid, stream: tail})
                sel.unregister(key.fileobj)
                key.fileobj.close()
                pipes[procid] -= 1
                continue
            if not client_gone:
                text = decoders[(procid, stream)].decode(data)
                if text:
                    emit({"t": procid, stream: text})
        ended = {}
        for procid in [t for t in running if not pipes[t]]:
            rc = procs[procid].poll()
            if rc is not None:
                running.discard(procid)
                exits[procid] = ended[str(procid)] = [0, -rc] if rc < 0 else [rc, 0]
        if ended and not client_gone:
            emit({"exit": dict(sorted(ended.items()))})
    sel.close()
