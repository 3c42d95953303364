"""The per-run supervisor, in the spirit of slurmstepd and conmon: ``python -m shoal.agent.supervise JOBDIR``,
or its compiled twin ``shoal-stepd`` (``frontend/shoal-stepd.c``), which keeps the same files.

The agent starts one per batch script, in a session of its own, so it outlives the agent. It
reads the launch the agent prepared (``launch.json``: argv, environment, working directory,
output files, the user), starts the task through ``identity.spawn`` (the same launch as ever:
the child becomes the user, then enters the directory and opens the files), waits for it,
writes how it ended to ``status.json`` (atomically: a reader sees all of it or nothing) and
exits. A restarted agent finds the run by its directory and re-adopts it:

- ``supervisor.lock`` is held (``flock``) by the supervisor for its whole life. The agent
  locks it before starting the supervisor and hands the open file over, so a run is never
  seen without a live holder between its start and its end. Unlike a pid, a lock cannot be
  mistaken for a reused process.
- ``task`` holds the task's pid, which is its process group: the agent signals the group
  directly (TERM, KILL, ``scancel -s``), so a supervisor never stands between a kill and the
  job. Signals the supervisor itself gets before the task has started are passed on to it.

Stdlib only (plus ``identity``, itself stdlib): it starts in a few tens of milliseconds. That
is still most of a short job's CPU on a node, so ``start`` runs ``shoal-stepd`` instead when
it is installed next to the Python interpreter (``make`` compiles it), unless the agent's
environment says ``SHOAL_STEPD=python``. It reads ``launch.bin`` (``Launch.to_bin``), as C
reads more easily than JSON.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shoal.agent.identity import Identity, LaunchError, OpenAs, spawn

LAUNCH = "launch.json"
LAUNCH_BIN = "launch.bin"  # the same launch for shoal-stepd
BIN_MAGIC = "shoal-launch 1"  # launch.bin's first field (its format's version)
STEPD = "shoal-stepd"
LOCK = "supervisor.lock"
TASK = "task"
STATUS = "status.json"
LOG = "supervise.log"

# What the supervisor passes on to its task when the agent signals it before the task's pid is known.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGALRM, signal.SIGCONT)


@dataclass(frozen=True)
class Status:
    """How a supervised task ended: Slurm's exit code and signal, when, and why it never ran."""

    exit_code: int
    signal: int
    end_time: float
    reason: str | None = None


@dataclass(frozen=True)
class Launch:
    """What the supervisor starts, and which run it belongs to (for a restarted agent)."""

    key: str
    job_id: int
    run: int
    user: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    cwd_fallback: str | None
    files: list[OpenAs]
    identity: Identity | None

    def to_json(self) -> dict:
        return {"key": self.key, "job_id": self.job_id, "run": self.run, "user": self.user, "argv": self.argv,
                "env": self.env, "cwd": self.cwd, "cwd_fallback": self.cwd_fallback,
                "files": [[f.fd, f.path, f.flags, f.same_as] for f in self.files],
                "identity": None if self.identity is None else {
                    "name": self.identity.name, "uid": self.identity.uid, "gid": self.identity.gid,
                    "groups": list(self.identity.groups), "home": self.identity.home}}

    def to_bin(self) -> bytes:
        """The launch as shoal-stepd reads it: NUL-terminated fields, each list led by its
        length. ValueError when a string holds a NUL (it would shift every later field)."""
        fields: list[str | int] = [BIN_MAGIC, len(self.argv), *self.argv, len(self.env),
                                   *(f"{k}={v}" for k, v in self.env.items()),
                                   self.cwd or "", self.cwd_fallback or "", len(self.files)]
        for f in self.files:
            fields += [f.fd, f.flags, -1 if f.same_as is None else f.same_as, f.path]
        if self.identity is None:
            fields.append(0)
        else:
            ident = self.identity
            fields += [1, ident.uid, ident.gid, len(ident.groups), *ident.groups]
        encoded = [os.fsencode(f) if isinstance(f, str) else b"%d" % f for f in fields]
        if any(b"\0" in f for f in encoded):
            raise ValueError("a NUL in the launch")
        return b"\0".join(encoded) + b"\0"

    @classmethod
    def from_json(cls, d: dict) -> Launch:
        ident = d.get("identity")
        return cls(key=d["key"], job_id=int(d["job_id"]), run=int(d["run"]), user=d["user"], argv=list(d["argv"]),
                   env=dict(d["env"]), cwd=d["cwd"], cwd_fallback=d.get("cwd_fallback"),
                   files=[OpenAs(fd, path, flags, same_as) for fd, path, flags, same_as in d["files"]],
                   identity=None if ident is None else Identity(ident["name"], ident["uid"], ident["gid"],
                                                                tuple(ident["groups"]), ident["home"]))


def write_json_atomic(path: Path, doc: dict) -> None:
    """Write ``doc`` so that ``path`` holds either its old content or all of the new (temp file,
    rename), never a part.

    No fsync: the file only has to outlive the agent process, which the page cache does; a
    machine crash ends the task as well, and its run is then reported lost either way.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_private(tmp, json.dumps(doc).encode())
    os.replace(tmp, path)


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` readable by the agent's user alone (a launch holds the job's token)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_status(jobdir: Path) -> Status | None:
    try:
        d = json.loads((jobdir / STATUS).read_text())
    except (OSError, ValueError):
        return None
    return Status(int(d["exit_code"]), int(d["signal"]), float(d["end_time"]), d.get("reason"))


def read_launch(jobdir: Path) -> Launch | None:
    try:
        return Launch.from_json(json.loads((jobdir / LAUNCH).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def supervisor_alive(jobdir: Path) -> bool:
    """Whether a supervisor holds the run's lock (it is running, or about to start its task)."""
    try:
        fd = os.open(jobdir / LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def stepd() -> str | None:
    """The compiled supervisor when it is installed next to this Python and the agent's
    environment does not ask for the Python one (``SHOAL_STEPD=python``)."""
    if os.environ.get("SHOAL_STEPD") == "python":
        return None
    path = Path(sys.executable).parent / STEPD
    return str(path) if os.access(path, os.X_OK) else None


def start(jobdir: Path, launch: Launch, wrapper: Sequence[str] = ()) -> subprocess.Popen:
    """Write the launch into ``jobdir`` and start its supervisor in a session of its own.

    The lock is taken here and its open file handed to the supervisor, so the run has a
    live holder from this moment on, even if this agent dies before the child has run a line.
    ``wrapper`` prefixes the supervisor's argv (the agent's: join the run's cgroup, then exec).
    """
    command = [sys.executable, "-P", "-m", "shoal.agent.supervise"]
    binary = stepd()
    if binary is not None:
        command = [binary]
        try:
            write_private(jobdir / LAUNCH_BIN, launch.to_bin())
        except ValueError:
            pass  # no launch.bin: shoal-stepd fails the run as "unreadable launch file", never half-read
    write_private(jobdir / LAUNCH, json.dumps(launch.to_json()).encode())  # last: it says "launched"
    lock = os.open(jobdir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    # Blocked until the supervisor has its handlers: a kill sent at once is passed on, not lost.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(jobdir / LOG, "ab") as log:
            return subprocess.Popen([*wrapper, *command, str(jobdir), str(lock)],
                                    cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                    start_new_session=True, close_fds=True, pass_fds=(lock,))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(lock)


def killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(jobdir: Path, clock=time.time) -> int:
    """The supervisor's life: start the task, pass signals on, wait, record the end. The
    run's lock is already held, on the open file inherited from the agent."""
    launch = read_launch(jobdir)
    if launch is None:
        write_json_atomic(jobdir / STATUS, {"exit_code": 1, "signal": 0, "end_time": clock(),
                                            "reason": "launch failed: unreadable launch file"})
        return 1
    task: list[int] = []  # the task's pid once started
    pending: list[int] = []

    def forward(signum, frame) -> None:
        if task:
            killpg(task[0], signum)
        else:
            pending.append(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # the task starts with none blocked
    reason = None
    try:
        proc = spawn(launch.argv, identity=launch.identity, env=launch.env, cwd=launch.cwd,
                     cwd_fallback=launch.cwd_fallback, files=launch.files)
    except LaunchError as e:
        reason = f"launch failed: {e.strerror}: {e.filename}"
    except OSError as e:
        reason = f"launch failed: execve(): {e.strerror}"
    if reason is not None:
        write_json_atomic(jobdir / STATUS, {"exit_code": 1, "signal": 0, "end_time": clock(), "reason": reason})
        return 0
    task.append(proc.pid)
    write_json_atomic(jobdir / TASK, {"pid": proc.pid})
    for sig in pending:
        killpg(proc.pid, sig)
    rc = proc.wait()
    exit_code, sig = (0, -rc) if rc < 0 else (rc, 0)
    write_json_atomic(jobdir / STATUS, {"exit_code": exit_code, "signal": sig, "end_time": clock()})
    return 0


def read_task_pid(jobdir: Path) -> int | None:
    try:
        return int(json.loads((jobdir / TASK).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m shoal.agent.supervise JOBDIR LOCK_FD (started by the agent)", file=sys.stderr)
        return 2
    # argv[1], the lock's file descriptor, is only kept open: closing it would say "ended".
    return supervise(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
