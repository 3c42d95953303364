"""The per-run supervisor, in the spirit of slurmstepd and conmon: ``python -m shoal.agent.supervise JOBDIR``,
or its compiled twin ``shoal-stepd`` (``frontend/shoal-stepd.c``), which keeps the same files.

The agent starts one per batch script, in a session of its own, so it outlives the agent. It
reads the launch the agent prepared (``launch.json``: argv, environment, working directory,
output files, the user, the cgroups it joins first), starts the task through ``identity.spawn`` (the same launch as ever:
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
- The node's lease (``LEASE`` in the agent's work dir, the supervisor's third argument) says
  until when the server counts the node alive. Once a check period, the supervisor reads it;
  when it has run out, the supervisor fences its run itself, live agent or not: SIGCONT and
  SIGTERM to the task's group (and to the job's cgroups, ``CGROUPS``), SIGKILL after the
  lease's grace, and a status saying ``fenced``. See docs/FENCING.md.
- ``--step LEASE ARGV...`` (``step_main``) runs one srun task under a supervisor of its own,
  in the task's process group, fenced by the same lease.

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
import resource
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
BIN_MAGIC = "shoal-launch 2"  # launch.bin's first field (its format's version)
STEPD = "shoal-stepd"
LOCK = "supervisor.lock"
TASK = "task"
STATUS = "status.json"
LOG = "supervise.log"
LEASE = "lease"  # in the agent's work dir: the node's lease, as the supervisors read it
CGROUPS = "cgroups"  # in a run's directory: its cgroup directories, one a line (written with the cgroups)
CHECK_S = 1.0  # how often a supervisor reads the lease when the lease file says nothing

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
    fenced: bool = False  # the supervisor stopped it because the node's lease ran out


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
    # cgroup.procs files the supervisor joins before it forks the task (the run's step
    # cgroup), so the task and all it starts are inside; the agent has none of it to do.
    cgroups: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"key": self.key, "job_id": self.job_id, "run": self.run, "user": self.user, "argv": self.argv,
                "env": self.env, "cwd": self.cwd, "cwd_fallback": self.cwd_fallback,
                "files": [[f.fd, f.path, f.flags, f.same_as] for f in self.files],
                "identity": None if self.identity is None else {
                    "name": self.identity.name, "uid": self.identity.uid, "gid": self.identity.gid,
                    "groups": list(self.identity.groups), "home": self.identity.home},
                "cgroups": list(self.cgroups)}

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
        fields += [len(self.cgroups), *self.cgroups]
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
                                                                tuple(ident["groups"]), ident["home"]),
                   cgroups=tuple(d.get("cgroups", ())))


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
    return Status(int(d["exit_code"]), int(d["signal"]), float(d["end_time"]), d.get("reason"),
                  bool(d.get("fenced")))


@dataclass(frozen=True)
class Lease:
    """The node's lease as the supervisors see it: until when (``CLOCK_BOOTTIME`` seconds) the
    server counts the node alive, the fence's grace (TERM to KILL) and how often to look."""

    expires: float
    grace_s: float
    check_s: float


def boottime() -> float:
    """The lease's clock: never stepped (unlike the wall clock), and it counts a suspend
    (unlike CLOCK_MONOTONIC), so a lease cannot seem to last longer than it did."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def write_lease(path: Path, lease: Lease) -> None:
    """Write the lease for the supervisors, atomically: ``EXPIRES GRACE_S CHECK_S``, readable
    by all (step supervisors run as the job's user; it holds no secret)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"%.3f %.3f %.3f\n" % (lease.expires, lease.grace_s, lease.check_s))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_lease(path: Path) -> Lease | None:
    """The lease in ``path``; None when there is none (fencing is off, or no agent registered)."""
    try:
        expires, grace, check = (float(x) for x in path.read_bytes().split())
    except (OSError, ValueError):
        return None
    return Lease(expires, grace, check if check > 0 else CHECK_S)


def _holds(cgroup: Path, pid: int) -> bool:
    """Whether ``pid`` is in ``cgroup`` (unreadable: assume so, and kill pid by pid)."""
    try:
        return str(pid) in (cgroup / "cgroup.procs").read_text().split()
    except OSError:
        return True


def signal_cgroups(jobdir: Path, sig: int, rounds: int = 1, group: int | None = None) -> None:
    """Send ``sig`` to every process of the run's cgroups (``CGROUPS``): cgroup.kill where the
    kernel has it (v2) for SIGKILL and the cgroup does not hold this supervisor, else each pid in cgroup.procs but our own and those of
    process group ``group`` (signalled already: a TERM must not come twice, or a TERM trap's
    children die), again until none is left (``rounds`` at most: a fork may race the reading)."""
    try:
        dirs = [Path(line) for line in (jobdir / CGROUPS).read_text().splitlines() if line.startswith("/")]
    except OSError:
        return
    me = os.getpid()
    for d in dirs:
        # Not where this supervisor is itself (the run's own cgroup holds it): cgroup.kill
        # would end it before it wrote the run's status.
        if sig == signal.SIGKILL and (d / "cgroup.kill").exists() and not _holds(d, me):
            try:
                (d / "cgroup.kill").write_text("1")
                continue
            except OSError:
                pass
        for i in range(rounds):
            try:
                pids = [int(x) for x in (d / "cgroup.procs").read_text().split() if int(x) != me
                        and (group is None or _pgid(int(x)) != group)]
            except (OSError, ValueError):
                break
            if not pids:
                break
            for pid in pids:
                _kill(pid, sig)
            if i + 1 < rounds:
                time.sleep(0.01)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


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


def start(jobdir: Path, launch: Launch, lease: Path | None = None) -> subprocess.Popen:
    """Write the launch into ``jobdir`` and start its supervisor in a session of its own;
    it fences the run by the lease in ``lease`` (None: never).

    The lock is taken here and its open file handed to the supervisor, so the run has a
    live holder from this moment on, even if this agent dies before the child has run a line.
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
            return subprocess.Popen([*command, str(jobdir), str(lock), *([str(lease)] if lease else [])],
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


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _ended(pid: int) -> bool:
    """Whether the task has ended, leaving it unreaped (its pid, so its group, stays ours)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def wait_fencing(pid: int, lease_path: Path | None, jobdir: Path | None = None, group: int | None = None) -> bool:
    """Wait for the task ``pid`` to end (left unreaped), fencing it when the lease in
    ``lease_path`` runs out: SIGCONT and SIGTERM to its process ``group`` (its own by default)
    and the run's cgroups, SIGKILL after the lease's grace. Returns whether it was fenced.
    SIGCHLD must be blocked."""
    if lease_path is None:
        return False  # no fencing: the caller's wait blocks, never woken
    kill_at = None  # time.monotonic() when SIGKILL is due, once fenced
    group = pid if group is None else group
    while not _ended(pid):
        wait = CHECK_S
        if kill_at is None:
            lease = read_lease(lease_path)
            if lease is not None:
                wait = lease.check_s
                if boottime() >= lease.expires:
                    kill_at = time.monotonic() + lease.grace_s
                    print(f"fenced: the node's lease ran out {boottime() - lease.expires:.1f}s ago (no report "
                          f"reached the server): SIGTERM to the job, SIGKILL in {lease.grace_s:g}s",
                          file=sys.stderr, flush=True)
                    _signal_run(group, jobdir, signal.SIGCONT)
                    _signal_run(group, jobdir, signal.SIGTERM)
        if kill_at is not None:
            wait = kill_at - time.monotonic()
            if wait <= 0:  # and again each check while the task is not gone
                _signal_run(group, jobdir, signal.SIGKILL)
                wait = CHECK_S
        signal.sigtimedwait([signal.SIGCHLD], max(wait, 0.01))
    if kill_at is not None:  # what the job left behind goes too (the task, unreaped, keeps its group ours)
        _signal_run(group, jobdir, signal.SIGKILL)
    return kill_at is not None


def _signal_run(group: int, jobdir: Path | None, sig: int) -> None:
    killpg(group, sig)
    if jobdir is not None:
        signal_cgroups(jobdir, sig, rounds=100 if sig == signal.SIGKILL else 1, group=group)


def supervise(jobdir: Path, clock=time.time, lease: Path | None = None) -> int:
    """The supervisor's life: start the task, pass signals on, wait (fencing it when the
    node's lease in ``lease`` runs out), record the end. The run's lock is already held, on
    the open file inherited from the agent."""
    launch = read_launch(jobdir)
    if launch is None:
        write_json_atomic(jobdir / STATUS, {"exit_code": 1, "signal": 0, "end_time": clock(),
                                            "reason": "launch failed: unreadable launch file"})
        return 1
    try:
        join_cgroups(launch.cgroups)
    except OSError as e:
        write_json_atomic(jobdir / STATUS, {"exit_code": 1, "signal": 0, "end_time": clock(),
                                            "reason": f"launch failed: cannot join cgroup {e.filename}: {e.strerror}"})
        return 0
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
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])  # after the spawn: the task has none blocked
    task.append(proc.pid)
    write_json_atomic(jobdir / TASK, {"pid": proc.pid})
    for sig in pending:
        killpg(proc.pid, sig)
    fenced = wait_fencing(proc.pid, lease, jobdir)
    rc = proc.wait()
    exit_code, sig = (0, -rc) if rc < 0 else (rc, 0)
    write_json_atomic(jobdir / STATUS, {"exit_code": exit_code, "signal": sig, "end_time": clock(),
                                        **({"fenced": True} if fenced else {})})
    return 0


def join_cgroups(procs: Sequence[str]) -> None:
    """Move this process into each cgroup whose ``cgroup.procs`` is named (OSError naming the file)."""
    for path in procs:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        except OSError as e:
            raise OSError(e.errno, e.strerror, path) from None
        finally:
            os.close(fd)


def step_command(lease: Path) -> list[str]:
    """What an srun task's argv is prefixed with, so that its supervisor fences it by
    ``lease`` with no agent alive: shoal-stepd's step mode, or this module's."""
    binary = stepd()
    if binary is not None:
        return [binary, "--step", str(lease)]
    return [sys.executable, "-P", "-m", "shoal.agent.supervise", "--step", str(lease)]


def step_main(lease: Path, argv: list[str]) -> int:
    """One srun task under a supervisor sharing its process group: the agent signals the
    group, which reaches both (the supervisor survives the catchable signals), and the
    supervisor fences the group when the lease runs out. Exits as the task did."""
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: None)  # caught, not ignored: the task gets the default
    try:
        # The task's own pid in its environment, as Slurm gives it (env=None: exec takes the child's environ).
        proc = subprocess.Popen(argv, close_fds=False,
                                preexec_fn=lambda: os.environ.__setitem__("SLURM_TASK_PID", str(os.getpid())))
    except OSError as e:
        print(f"slurmstepd: error: execve(): {argv[0]}: {e.strerror}", file=sys.stderr, flush=True)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # our copies of the output pipes would hold them open after the task
        os.dup2(null, fd)
    wait_fencing(proc.pid, lease, group=os.getpgrp())
    rc = proc.wait()
    if rc >= 0:
        return rc
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(-rc, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.kill(os.getpid(), -rc)
    return 128 - rc


def read_task_pid(jobdir: Path) -> int | None:
    try:
        return int(json.loads((jobdir / TASK).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "--step":
        return step_main(Path(argv[1]), argv[2:])
    if len(argv) not in (2, 3):
        print("usage: python -m shoal.agent.supervise JOBDIR LOCK_FD [LEASE] (started by the agent)",
              file=sys.stderr)
        return 2
    # argv[1], the lock's file descriptor, is only kept open: closing it would say "ended".
    return supervise(Path(argv[0]), lease=Path(argv[2]) if len(argv) == 3 else None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
