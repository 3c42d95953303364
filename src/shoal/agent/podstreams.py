"""Interactive streams into a pod on this node, for the Kubernetes API's ``pods/exec``,
``pods/attach`` and ``pods/portforward`` (kubectl exec -it, attach, port-forward).

The server opens one connection per stream to the step server (``POST /v1/pods/stream``,
signed with the node's step key as log queries are), and after the 200 both sides exchange
frames (``model.frames``) on it: stdin, a terminal's size and the end of input from the
server; stdout, stderr and then the command's exit from here. An exec runs in the pod's
process context (the container's exec prefix, the pod's environment, working directory and
user), under a pseudo-terminal when asked; its process is the container's to kill when
the container ends, and the stream's end (the client gone) kills it too.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import selectors
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

from shoal.agent.identity import spawn
from shoal.agent.pods import ContainerNotRunning, ExecTarget, LogNotFound
from shoal.model import frames

log = logging.getLogger("shoal.agent.streams")
CHUNK = 32 * 1024
# Run in the new session spawn makes: its standard input (the pseudo-terminal) becomes the
# session's controlling terminal, then the command replaces this process.
TAKE_TERMINAL = "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execvp(sys.argv[1], sys.argv[1:])"


class StreamRefused(Exception):
    """The stream cannot start: ``status`` and the message the server passes on."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Channel:
    """The server's end: frames read from ``rfile``, written (thread-safe) to ``wfile``."""

    def __init__(self, rfile, wfile) -> None:
        self.rfile, self.wfile = rfile, wfile
        self.lock = threading.Lock()
        self.open = True

    def send(self, channel: int, data: bytes = b"") -> bool:
        try:
            with self.lock:
                self.wfile.write(frames.frame(channel, data))
                self.wfile.flush()
            return True
        except (OSError, ValueError):
            self.open = False
            return False

    def receive(self) -> tuple[int, bytes] | None:
        try:
            return frames.read_frame(self.rfile.read)
        except (OSError, ValueError):
            return None

    def finish(self, exit_code: int | None, error: str | None = None) -> None:
        self.send(frames.ERROR, json.dumps({"exit": exit_code} if error is None else {"error": error}).encode())


def prepare(agent, req: dict):
    """What the request asks to run, checked before the 200: a callable serving the stream on a
    Channel. Raises StreamRefused."""
    try:
        mode, key, container = str(req["mode"]), str(req["key"]), str(req.get("container") or "")
        if mode == "exec":
            tty, stdin = bool(req.get("tty")), bool(req.get("stdin"))
            target = agent.pods.exec_target(key, container, [str(a) for a in req["argv"]], stdin=stdin, tty=tty)
            command = str(req["argv"][0])
            return lambda ch: run_exec(target, command, ch, tty=tty, stdin=stdin, size=req.get("size"))
        if mode == "attach":
            path = agent.pods.log_path(key, container)
            if not agent.pods.is_running(key, container):
                raise ContainerNotRunning(f'container "{container}" is not running')
            return lambda ch: run_attach(agent, key, container, path, ch)
        if mode == "portforward":
            hosts, port = agent.pods.addresses_of(key), int(req["port"])
            return lambda ch: run_forward(hosts, port, ch)
    except (KeyError, TypeError, ValueError):
        raise StreamRefused(400, "malformed stream request") from None
    except LogNotFound as e:
        raise StreamRefused(404, str(e)) from None
    except ContainerNotRunning as e:
        raise StreamRefused(409, str(e)) from None
    raise StreamRefused(400, f"unknown stream mode {mode!r}")


# ---------------------------------------------------------------- exec


def run_exec(target: ExecTarget, command: str, ch: Channel, *, tty: bool, stdin: bool, size: dict | None) -> None:
    master = slave = None
    try:
        if tty:
            master, slave = pty.openpty()
            if size:
                set_size(master, size)
            # The terminal becomes the session's controlling one, so ^C and ^Z reach its foreground job.
            p = spawn([sys.executable, "-c", TAKE_TERMINAL, *target.argv], identity=target.identity, cwd=target.cwd,
                      env={**target.env, "TERM": "xterm"}, stdin=slave, stdout=slave, stderr=slave)
        else:
            p = spawn(target.argv, identity=target.identity, cwd=target.cwd, env=target.env,
                      stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:  # kubelet's (runc's) words for a command the container cannot run
        ch.finish(None, f'exec: "{command}": {e.strerror}')
        return
    finally:
        if slave is not None:
            os.close(slave)
    target.procs.add(p)
    try:
        sink: int | None
        if master is not None:
            outputs = {master: frames.STDOUT}
            sink = master
        else:
            assert p.stdout is not None and p.stderr is not None
            outputs = {p.stdout.fileno(): frames.STDOUT, p.stderr.fileno(): frames.STDERR}
            sink = p.stdin.fileno() if p.stdin is not None else None
        threading.Thread(target=_input, args=(ch, p, sink, tty, master), daemon=True).start()
        _pump(outputs, p, ch)
        code = p.wait()
        ch.finish(128 - code if code < 0 else code)  # a signal as the shell reports it (128+n)
    finally:
        target.procs.discard(p)
        if master is not None:
            os.close(master)


def _input(ch: Channel, p: subprocess.Popen, sink: int | None, tty: bool, master: int | None) -> None:
    """The server's frames: stdin to the command, resizes to the terminal, the end of input.
    The stream's end before the command's kills it (the client went away)."""
    while True:
        got = ch.receive()
        if got is None:
            if p.poll() is None:
                _kill(p)
            return
        channel, data = got
        if channel == frames.STDIN and sink is not None:
            try:
                os.write(sink, data)
            except OSError:
                sink = None
        elif channel == frames.RESIZE and master is not None:
            try:
                set_size(master, json.loads(data))
            except (ValueError, OSError):
                pass
        elif channel == frames.CLOSE and data[:1] == bytes([frames.STDIN]) and sink is not None:
            if tty:  # the terminal's end of file: ^D at the start of a line
                os.write(sink, b"\x04")
            else:
                os.close(sink)
                if p.stdin is not None:
                    p.stdin = None  # closed above; Popen must not close it again
            sink = None


def _pump(outputs: dict[int, int], p: subprocess.Popen, ch: Channel) -> None:
    """Forward what the command writes until its outputs close, or it has exited and they
    stay quiet (a background child may hold a pipe or the terminal open)."""
    sel = selectors.DefaultSelector()
    for fd in outputs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, outputs[fd])
    quiet_since = None
    while sel.get_map():
        ready = sel.select(timeout=0.2)
        for key, _ in ready:
            try:
                data = os.read(key.fd, CHUNK)
            except BlockingIOError:
                continue
            except OSError:  # EIO: the terminal's last writer closed it
                data = b""
            if not data:
                sel.unregister(key.fd)
                continue
            if ch.open and not ch.send(key.data, data):
                _kill(p)
        if ready:
            quiet_since = None
        elif p.poll() is not None:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 0.5:
                break
    sel.close()


def set_size(fd: int, size: dict) -> None:
    """A terminal's size, as kubectl sends it (``{"Width": 80, "Height": 24}``)."""
    rows, cols = int(size.get("Height") or 0), int(size.get("Width") or 0)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # spawn starts each command in a session of its own
    except OSError:
        pass


# ---------------------------------------------------------------- attach


def run_attach(agent, key: str, container: str, path, ch: Channel) -> None:
    """What the container writes from now on, until it ends or the client goes away (its
    standard input is not the agent's to give: containers start with none)."""
    gone = threading.Event()

    def drain() -> None:
        while ch.receive() is not None:
            pass
        gone.set()

    threading.Thread(target=drain, daemon=True).start()
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        while not gone.is_set():
            chunk = f.read(CHUNK)
            if chunk:
                if not ch.send(frames.STDOUT, chunk):
                    return
                continue
            if not agent.pods.is_running(key, container):
                rest = f.read()
                if rest:
                    ch.send(frames.STDOUT, rest)
                break
            gone.wait(0.1)
    ch.finish(0)


# ---------------------------------------------------------------- port-forward


def run_forward(hosts: list[str], port: int, ch: Channel) -> None:
    """Bytes both ways between the stream and the pod's port (as the kubelet's port-forward
    does inside the pod's network namespace; a process pod's is the node's)."""
    conn = None
    for host in hosts:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError as e:
            why = f"dial tcp {host}:{port}: connect: {(e.strerror or str(e)).lower()}"
    if conn is None:
        ch.finish(None, f"error forwarding port {port} to pod: {why}")
        return
    conn.settimeout(None)

    def upstream() -> None:
        while (got := ch.receive()) is not None:
            channel, data = got
            if channel == frames.STDIN:
                try:
                    conn.sendall(data)
                except OSError:
                    break
            elif channel == frames.CLOSE:
                break
        try:
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=upstream, daemon=True).start()
    try:
        while data := conn.recv(CHUNK):
            if not ch.send(frames.STDOUT, data):
                break
    except OSError:
        pass
    finally:
        conn.close()
    ch.finish(0)
