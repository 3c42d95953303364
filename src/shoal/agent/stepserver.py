"""The agent's own HTTP endpoint: srun connects here to launch a step's tasks on this node,
and the server fetches pod logs and runs ``shoal exec`` commands here.

As with srun and slurmd, the client talks to each node directly; the server only signs the
launch (an HMAC with this node's step key), so output streams node-to-client without
passing through the control plane. The reply is NDJSON, one object per output chunk:
``{"t": procid, "o": text}`` (stdout) or ``{"t": procid, "e": text}`` (stderr), then
``{"exit": {procid: [exit_code, signal]}}``.

A launch that names ``"stdin": [procids]`` (srun's --input: task 0 by default) is followed, on
the same connection, by srun's standard input in frames (a 4-byte big-endian length, then the
bytes; length 0 is the end of input), written to those tasks' standard input; the end of the
connection after that, as without stdin, means srun has gone.

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
import selectors
import socket
import ssl
import stat
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from shoal.agent import supervise
from shoal.agent.cgroups import close_all
from shoal.agent.identity import UnknownUser, spawn
from shoal.agent.pods import ContainerNotRunning, LogNotFound
from shoal.agent.runtime import Runtime, _killpg, set_gpu_env

log = logging.getLogger("shoal.agent.steps")
OUTPUT_BYTES = 64 * 1024  # the most of a job's output file the console is sent at once

MAX_BODY = 8 * 1024 * 1024


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
        if self.path not in ("/v1/steps", "/v1/pods/exec"):
            return self._json(404, {"detail": "not found"})
        what = "step" if self.path == "/v1/steps" else "exec"
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
        agent = self.server.agent
        err = _check(agent, req)
        if err:
            return self._json(403, {"detail": err})
        run = agent.runtime.get(req["key"])
        if run is None or run.killing_since is not None:
            return self._json(409, {"detail": f"job {req['job_id']} is not running on {agent.name}"})
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        _run_step(agent.runtime, run, req, self.connection, self.wfile, agent.name, agent.containers, self.rfile)

    def _pod_exec(self, req: dict) -> None:
        """``shoal exec``: run a command inside a pod's container and stream its output as a
        step's (one task, procid 0). The server signs the request as it signs log queries."""
        agent = self.server.agent
        sig = str(req.pop("sig", ""))
        err = _check_signed(agent, json.dumps(req, sort_keys=True), sig, req.get("t", 0), "exec")
        if err:
            return self._json(403, {"detail": err})
        try:
            target = agent.pods.exec_target(str(req["key"]), str(req["container"]), [str(a) for a in req["argv"]])
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
        if not any(d.is_dir() for c, d in cg.dirs.items() if d != run.cgroup.dirs[c]):
            continue  # uncontained, or a v1 node without memory and cpuacct
        u = cg.usage()
        out[step] = {"max_rss_kb": u.max_rss_bytes // 1024, "cpu_s": round(u.cpu_seconds, 3),
                     "user_cpu_s": round(u.user_seconds, 3), "system_cpu_s": round(u.system_seconds, 3),
                     "tasks": tasks[step]}
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


def _check(agent, req: dict) -> str | None:
    try:
        msg = f"{req['job_id']}.{req['run']}.{req['step_id']}"
        want = hmac.new(agent.step_key.encode(), msg.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, str(req["credential"])):
            return "invalid step credential"
    except (KeyError, TypeError, AttributeError):
        return "malformed step request"
    return None


def _client_gone(conn: socket.socket) -> bool:
    """The client's end is readable: has it gone away? Over TLS (which cannot peek) the record
    is read: the end of the stream, or the client's close_notify."""
    try:
        if isinstance(conn, ssl.SSLSocket):
            conn.settimeout(1.0)
            try:
                return conn.recv(1) == b""
            finally:
                conn.settimeout(None)
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _run_step(runtime: Runtime, run, req: dict, conn: socket.socket, wfile, node: str, containers=None,
              rfile=None) -> None:
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
    step_container = None
    if req.get("container") and req["tasks"]:
        step_container = _start_container(containers, req, run, ident, emit, exits)
        if step_container is None:
            req = {**req, "tasks": []}
    cwd = req.get("cwd") or "/"
    step = runtime.step_cgroup(run, f"step_{req['step_id']}") if req["tasks"] else None
    fds = step.open_procs() if step is not None else []  # each task joins them between fork and exec
    stdin_to = set(req.get("stdin") or ()) if rfile is not None and step_container is None else set()
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
        try:
            p = spawn([*prefix, *argv], identity=who, env=env, cwd=cwd, cwd_fallback="/tmp", note_fd=2,
                      stdin=subprocess.PIPE if task["procid"] in stdin_to else subprocess.DEVNULL,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, cgroup_fds=fds)
        except OSError as e:
            emit({"t": task["procid"], "e": f"slurmstepd: error: execve(): {argv[0]}: {e.strerror}\n"})
            exits[task["procid"]] = [2, 0]
            continue
        runtime.add_step_proc(run, p, req["step_id"], fences_itself=bool(prefix))
        procs[task["procid"]] = p
    close_all(fds)
    inputs = [p.stdin for p in procs.values() if p.stdin is not None]
    gone = _relay_stdin(rfile, inputs) if "stdin" in req and rfile is not None else None
    try:
        _stream_tasks(procs, conn, emit, exits, gone)
        if gone is not None:  # the relay's read ends here, so closing the handler's rfile does not wait on it
            try:
                socket.socket.shutdown(conn, socket.SHUT_RD)  # the TCP socket's, under any TLS
            except OSError:
                pass
    finally:
        if step_container is not None:
            # The tasks have ended and said so: srun need not wait for the container's removal.
            threading.Thread(target=containers.finish, args=(step_container,), daemon=True).start()


def _start_container(containers, req: dict, run, ident, emit, exits: dict[int, list[int]]):
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
                                home=home, cwd=req.get("cwd") or "/", gpus=gpus)
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


def _relay_stdin(rfile, inputs: list) -> int:
    """Copy srun's framed standard input to ``inputs`` (the tasks' stdin pipes) in a thread;
    the read end of a pipe that becomes readable when srun's connection ends."""
    gone_r, gone_w = os.pipe()

    def relay() -> None:
        try:
            while True:
                head = rfile.read(4)
                size = int.from_bytes(head, "big") if len(head) == 4 else 0
                data = rfile.read(size) if size else b""
                if not data:
                    break
                for pipe in list(inputs):
                    try:
                        pipe.write(data)
                        pipe.flush()
                    except (OSError, ValueError):  # the task has ended or closed its input
                        inputs.remove(pipe)
            for pipe in inputs:
                try:
                    pipe.close()
                except OSError:
                    pass
            if len(head) == 4:  # the end of input, not of the connection: wait for that
                while rfile.read(65536):
                    pass
        except (OSError, ValueError):
            pass
        finally:
            os.close(gone_w)

    threading.Thread(target=relay, daemon=True, name="step-stdin").start()
    return gone_r


def _stream_tasks(procs: dict[int, subprocess.Popen], conn: socket.socket, emit, exits: dict[int, list[int]],
                  gone: int | None = None) -> None:
    """Forward the tasks' stdout and stderr as NDJSON lines, and each task's exit as it ends
    (srun says at once which task failed, and --kill-on-bad-exit acts on it); ``exits`` may
    already hold tasks that never started. A client that goes away kills them: its connection
    ends, or (when its stdin is relayed, which reads the connection) ``gone`` becomes readable."""
    sel = selectors.DefaultSelector()
    pipes = {procid: 2 for procid in procs}  # open pipes per task: reaped once both are closed
    for procid, p in procs.items():
        os.set_blocking(p.stdout.fileno(), False)
        os.set_blocking(p.stderr.fileno(), False)
        sel.register(p.stdout, selectors.EVENT_READ, (procid, "o"))
        sel.register(p.stderr, selectors.EVENT_READ, (procid, "e"))
    # A chunk may end inside a multi-byte character: decode each stream incrementally.
    decoders = {(t, k): codecs.getincrementaldecoder("utf-8")("replace") for t in procs for k in "oe"}
    sel.register(gone if gone is not None else conn, selectors.EVENT_READ, None)  # readable = the client went away
    client_gone = False
    if exits:  # tasks that never started
        emit({"exit": {str(k): v for k, v in sorted(exits.items())}})
    running = set(procs)
    while running:
        # A task whose pipes are closed but that has not exited yet (it closed them itself) is
        # polled; otherwise the pipes' end wakes the loop.
        closed = [t for t in running if not pipes[t]]
        for key, _ in sel.select(timeout=0.2 if closed else 1.0):
            if key.data is None:
                if gone is not None or _client_gone(conn):
                    client_gone = True
                    sel.unregister(key.fileobj)
                    for p in procs.values():
                        _killpg(p.pid, 9)
                continue
            procid, stream = key.data
            try:
                data = os.read(key.fileobj.fileno(), 65536)
            except BlockingIOError:
                continue
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
    if gone is not None:
        os.close(gone)
