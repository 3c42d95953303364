"""Process supervision on a node: batch scripts and step tasks, grouped by job run.

Every process starts in its own session (process group), so a signal or a kill reaches
everything it forked. A run's processes are killed as Slurm does: SIGCONT + SIGTERM,
then SIGKILL after KillWait.

A batch script runs under its own supervisor (``agent/supervise.py``), which outlives the
agent and keeps the exit status; an agent that starts again re-adopts the runs it finds in
its ``jobs/`` directory (``adopt``) instead of losing them.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from shoal.agent import supervise
from shoal.agent.cgroups import (CGROUPS_FILE, Cgroup, CgroupError, Containment, Usage, procs_files,
                                 read_cgroup_list, write_cgroup_list)
from shoal.agent.identity import JobUsers, OpenAs, UnknownUser, output_flags
from shoal.agent.supervise import killpg as _killpg
from shoal.model.filename import expand_pattern
from shoal.model.job import script_sha256

log = logging.getLogger("shoal.agent")


class Supervised:
    """The agent's handle on a batch script under its supervisor, started by this agent
    (``popen``: the supervisor, our child) or adopted from an earlier one (``popen`` None)."""

    def __init__(self, jobdir: Path, popen: subprocess.Popen | None = None) -> None:
        self.jobdir = jobdir
        self.popen = popen
        self.status: supervise.Status | None = None  # set once the end is known
        self._pid: int | None = None

    @property
    def pid(self) -> int | None:
        """The task's pid (its process group), once the supervisor has started it."""
        if self._pid is None:
            self._pid = supervise.read_task_pid(self.jobdir)
        return self._pid

    def poll(self) -> int | None:
        return None if self.status is None else 0

    def send(self, sig: int, group: bool = True) -> None:
        """Signal the task (its process group, or the shell alone), or, before it has started,
        the supervisor, which passes the signal on once it has."""
        if self.status is not None:
            return
        pid = self.pid
        if pid is not None:
            if group:
                _killpg(pid, sig)
            else:
                _kill(pid, sig)
        elif self.popen is not None and self.popen.poll() is None and sig in (*supervise.FORWARDED, signal.SIGKILL):
            self.popen.send_signal(sig)

    def wait(self, poll_s: float = 0.2) -> supervise.Status:
        """Block until the run has ended; how it ended (a supervisor gone without saying: failed)."""
        if self.popen is not None:
            self.popen.wait()
        else:
            # Not our child: watch its lock, which it holds until it has written the status.
            while not (self.jobdir / supervise.STATUS).exists() and supervise.supervisor_alive(self.jobdir):
                time.sleep(poll_s)
        status = supervise.read_status(self.jobdir)
        if status is None:
            status = supervise.Status(1, 0, time.time(), "supervisor lost: exit status unknown")
        self.status = status
        return status


@dataclass
class Proc:
    popen: subprocess.Popen | Supervised
    kind: str  # "batch" | "step"
    step_id: int | None = None
    fences_itself: bool = False  # under a supervisor that reads the node's lease
    termed: bool = False  # has had its SIGTERM (srun's abort, or the run's kill): never a second

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: int, group: bool = True) -> None:
        """Signal the process's group (or the process alone)."""
        if isinstance(self.popen, Supervised):
            self.popen.send(sig, group)
        elif group:
            _killpg(self.popen.pid, sig)
        else:
            _kill(self.popen.pid, sig)


@dataclass
class Run:
    key: str
    job_id: int
    run: int
    user: str = ""  # whose job it is: its steps run as this user
    procs: list[Proc] = field(default_factory=list)
    batch_started: bool = False
    killing_since: float | None = None
    killed_hard: bool = False
    cgroup: Cgroup | None = None  # while it exists, the run is alive until it is empty
    watched: bool = False  # its batch script's end is awaited, or not yet reported

    def alive(self) -> bool:
        # Alive until the end is queued for the server: the run's cleanup must not go before its exit.
        return self.watched or any(p.alive for p in self.procs) or \
            (self.cgroup is not None and self.cgroup.populated())


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def batch_usage(cg: Cgroup) -> Usage:
    """What the batch step used (sacct's ID.batch line): the script's own cgroup, not the
    job's, where srun steps count too (Slurm's batch step is the script alone); the OOM kills
    are the job's, any step's making the job OUT_OF_MEMORY."""
    job = cg.usage()
    step = cg.sub("step_batch")
    if not step.made_below(cg):
        return job  # no step directory (a run adopted from an agent that made none)
    return replace(step.usage(), oom_kills=job.oom_kills)


def set_gpu_env(env: dict[str, str], gpus: list[int]) -> None:
    """CUDA_VISIBLE_DEVICES lists the GPUs' NVML indices (no device cgroup renumbers them here)."""
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        env["GPU_DEVICE_ORDINAL"] = env["CUDA_VISIBLE_DEVICES"]
    else:
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.pop("GPU_DEVICE_ORDINAL", None)


class Runtime:
    """All runs on this node. Thread-safe: the work loop, step server and reaper share it."""

    def __init__(self, node: str, workdir: Path, on_exit, users: JobUsers | None = None,
                 containment: Containment | None = None) -> None:
        self.node = node
        self.workdir = workdir
        self.on_exit = on_exit  # callback(run: Run, exit_code, signal, when, reason=None, fenced=False, usage=None)
        self.users = users or JobUsers()
        self.containment = containment or Containment(None)
        self.device_dir: Path | None = None  # fake GPUs' stand-in device nodes, named to jobs
        self.runs: dict[str, Run] = {}
        self.lock = threading.RLock()
        # Called with a job id before its run's cgroup is emptied: the step containers made
        # inside it are removed through their engine first (daemon: StepContainers.remove_job).
        self.before_empty: Callable[[int], None] | None = None

    def get(self, key: str) -> Run | None:
        with self.lock:
            return self.runs.get(key)

    def ensure(self, key: str, job_id: int, run: int, user: str = "", entry: dict | None = None) -> Run:
        """The run, made on first sight; with its work ``entry``, in its own cgroup."""
        with self.lock:
            r = self.runs.get(key)
            if r is None:
                r = self.runs[key] = Run(key, job_id, run, user)
                if entry is not None:
                    r.cgroup = self.containment.job(key, entry.get("memory_mb"), entry.get("cpus", 1),
                                                    entry.get("gpus", ()))
            return r

    def step_cgroup(self, run: Run, name: str, jobdir: Path | None = None) -> Cgroup | None:
        """Make the cgroup of the run's step ``name`` (listed in ``jobdir``'s cgroups file);
        None when the run is uncontained."""
        if run.cgroup is None:
            return None
        try:
            step = run.cgroup.child(name)
            if jobdir is not None:  # the batch step: the list starts with the job's directories
                write_cgroup_list(jobdir, [*run.cgroup.paths, *step.paths])
            else:
                self._list_cgroups(run, step.paths)
            return step
        except (CgroupError, OSError) as e:
            log.error("run %s: cannot make step %s's cgroup, it runs uncontained: %s", run.key, name, e)
            return None

    def _list_cgroups(self, run: Run, paths: list[Path]) -> None:
        """Add ``paths`` to the run's cgroups file (the batch node's), for its supervisor's fence."""
        listed = self.workdir / "jobs" / run.key / CGROUPS_FILE
        with self.lock:
            if listed.exists():
                known = read_cgroup_list(listed.parent)
                write_cgroup_list(listed.parent, [*known, *(p for p in paths if p not in known)])

    def list_engine_cgroups(self, run: Run, cg: Cgroup) -> None:
        """A container engine has made its container's cgroups below ``cg`` (a step's, or the
        job's): list them too, so a fence with no agent kills what runs in the container."""
        try:
            found = [d for top in [*cg.paths, *cg.engine_dirs()] if top.is_dir() for d in top.iterdir()
                     if d.is_dir() and not d.name.startswith("step_")]
            self._list_cgroups(run, found)
        except OSError as e:
            log.warning("run %s: cannot list its containers' cgroups for the fence: %s", run.key, e)

    def alive_keys(self) -> list[str]:
        with self.lock:
            return [k for k, r in self.runs.items() if r.alive()]

    # ---------------------------------------------------------------- batch

    def start_batch(self, entry: dict, extra_env: dict[str, str]) -> None:
        run = self.ensure(entry["key"], entry["job_id"], entry["run"], entry["user"])
        with self.lock:
            if run.batch_started or run.killing_since is not None:
                return
            run.batch_started = True
        b = entry["batch"]
        jobdir = self.workdir / "jobs" / entry["key"]
        if (jobdir / supervise.LAUNCH).exists():  # an earlier agent launched it: never launch twice
            self._adopt(run, jobdir)
            return
        if (jobdir / "pid").exists():
            self._launched_before(run, jobdir / "pid")
            return
        try:
            ident = self.users.of(entry["user"])
        except UnknownUser:
            log.error("job %s: user %s is unknown on this node: not running it", entry["key"], entry["user"])
            self.on_exit(run, 1, 0, time.time(), f"launch failed: no user {entry['user']} on {self.node}")
            return
        # The bytes the user submitted (non-UTF-8 ones came as surrogates), checked against
        # the SHA-256 sbatch took of what it read: a script changed on the way never runs.
        data = b["script"].encode("utf-8", "surrogateescape")
        digest = script_sha256(data)
        if b.get("script_sha256") and digest != b["script_sha256"]:
            log.error("job %s: its script's SHA-256 is %s, not the submitted %s: not running it",
                      entry["key"], digest, b["script_sha256"])
            self.on_exit(run, 1, 0, time.time(), "launch failed: batch script differs from the one submitted")
            return
        jobdir.mkdir(parents=True, exist_ok=True)
        jobdir.parent.chmod(0o711)  # the job's user reaches their script, and lists nobody's
        jobdir.chmod(0o711)
        script = jobdir / "script"
        script.write_bytes(data)
        script.chmod(0o700)
        if ident is not None:
            os.chown(script, ident.uid, ident.gid)
        env = dict(b["environment"])
        env.update(b["slurm_env"])
        if b.get("container"):
            # Pyxis' options reach the job's steps as the variables its srun reads (docs/CONTAINERS.md).
            from shoal.model.container import request_to_env

            env.update(request_to_env(b["container"]))
        env.update(extra_env)
        env.update({
            "SLURMD_NODENAME": self.node,
            "SLURM_NODEID": "0",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_TOPOLOGY_ADDR": self.node,
            "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
            "SLURM_PRIO_PROCESS": "0",
            "SLURM_CPUS_ON_NODE": str(entry["cpus"]),
            "ENVIRONMENT": "BATCH",
        })
        if entry["gpus"]:  # as Slurm: only a job with GPUs sees these
            env["SLURM_GPUS_ON_NODE"] = str(len(entry["gpus"]))
            env["SLURM_JOB_GPUS"] = ",".join(str(g) for g in entry["gpus"])
        if ident is not None:
            env.update(ident.environment())
        uid, gid = (ident.uid, ident.gid) if ident is not None else (os.getuid(), os.getgid())  # None: runs as us
        env.update({"SLURM_JOB_UID": str(uid), "SLURM_JOB_GID": str(gid)})
        set_gpu_env(env, entry["gpus"])
        if self.device_dir is not None:
            env["SHOAL_FAKE_DEVICE_DIR"] = str(self.device_dir)
        names = dict(job_id=entry["job_id"], job_name=b["job_name"], user=entry["user"], node=self.node,
                     array_job_id=b.get("array_job_id"), array_task_id=b.get("array_task_id"))
        # Relative output paths are taken from the submit directory, even when the job
        # cannot chdir there and starts in /tmp (as slurmstepd does).
        cwd = b["workdir"]
        flags = output_flags(b.get("open_mode") == "append")
        out_path = self._path(b["stdout"], cwd, names)
        files = [OpenAs(1, out_path, flags)]
        err_path = self._path(b["stderr"], cwd, names) if b.get("stderr") else out_path
        files.append(OpenAs(2, err_path, flags) if err_path != out_path else OpenAs(2, same_as=1))
        if b.get("stdin"):
            files.append(OpenAs(0, self._path(b["stdin"], cwd, names), os.O_RDONLY))
        # The supervisor joins the step's cgroup before it forks: the task and all it starts are in.
        launch = supervise.Launch(key=entry["key"], job_id=entry["job_id"], run=entry["run"], user=entry["user"],
                                  argv=[str(script), *b.get("argv", [])], env=env, cwd=cwd, cwd_fallback="/tmp",
                                  files=files, identity=ident,
                                  cgroups=procs_files(self.step_cgroup(run, "step_batch", jobdir)))
        try:
            popen = supervise.start(jobdir, launch, self.workdir / supervise.LEASE)
        except OSError as e:
            log.error("job %s: cannot start its supervisor: %s", entry["key"], e)
            self.on_exit(run, 1, 0, time.time(), f"launch failed: supervisor: {e.strerror}")
            return
        self._watch(run, Supervised(jobdir, popen))

    def adopt(self) -> list[str]:
        """Take over the batch runs an earlier agent launched here (their supervisors live on,
        or have left their exit status); each is watched, and reported when it ends. Returns
        their keys."""
        adopted = []
        for jobdir in sorted((self.workdir / "jobs").glob("*/" + supervise.LAUNCH)):
            launch = supervise.read_launch(jobdir.parent)
            if launch is None or self.get(launch.key) is not None:
                continue
            run = self.ensure(launch.key, launch.job_id, launch.run, launch.user)
            self._adopt(run, jobdir.parent)
            adopted.append(launch.key)
        return adopted

    def _adopt(self, run: Run, jobdir: Path) -> None:
        with self.lock:
            if any(p.kind == "batch" for p in run.procs):
                return
            run.batch_started = True
            if run.cgroup is None:
                run.cgroup = self.containment.existing(run.key)
        if supervise.supervisor_alive(jobdir):
            log.warning("run %s: adopted from an earlier agent; its supervisor still runs it", run.key)
            self._watch(run, Supervised(jobdir))
            return
        log.warning("run %s: adopted from an earlier agent; it ended while no agent watched", run.key)
        task = Supervised(jobdir)
        with self.lock:
            run.procs.append(Proc(task, "batch", fences_itself=True))
        self._wait_batch(run, task)  # at once: its exit goes with the registration that follows

    def _watch(self, run: Run, task: Supervised) -> None:
        with self.lock:
            run.procs.append(Proc(task, "batch", fences_itself=True))
        threading.Thread(target=self._wait_batch, args=(run, task), daemon=True, name=f"batch-{run.key}").start()

    def _launched_before(self, run: Run, pidfile: Path) -> None:
        """An agent from before supervisors launched this run, and its exit status died with it.

        Never launch a batch script twice: stop what is left of it and report it failed.
        """
        try:
            pid = int(pidfile.read_text())
            with open(f"/proc/{pid}/cmdline", "rb") as f:  # the pid may have been reused
                still_ours = str(pidfile.parent / "script").encode() in f.read()
            if still_ours:
                _killpg(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
        log.error("run %s was launched by an earlier agent; its exit status is lost: reporting it failed", run.key)
        self.on_exit(run, 1, 0, time.time())

    def _path(self, pattern: str, cwd: str, names: dict) -> str:
        p = expand_pattern(pattern, **names)
        return p if p.startswith("/") else os.path.join(cwd, p)

    def _wait_batch(self, run: Run, task: Supervised) -> None:
        run.watched = True
        try:
            status = task.wait()
            if status.reason:
                log.error("job %s: %s (supervisor's log: %s)", run.key, status.reason, task.jobdir / supervise.LOG)
            cg = run.cgroup
            usage = batch_usage(cg) if cg is not None else None  # before the kill
            self.on_exit(run, status.exit_code, status.signal, status.end_time, status.reason, fenced=status.fenced,
                         usage=usage)
            # The batch script's end is the job's (proctrack/cgroup): what it left, detached or not, is
            # killed, after the exit is queued (not on the report's path). The run stays alive (watched,
            # then its cgroup populated) and so its cleanup row held until the cgroup is empty.
            if cg is not None:
                self._before_empty(run)
                self.containment.empty(run.key, cg)
                run.cgroup = None
        finally:
            run.watched = False

    def release_cgroup(self, run: Run) -> Usage | None:
        """Empty and remove the run's cgroup (blocks until it is empty); its usage, or None."""
        cg = run.cgroup
        if cg is None:
            return None
        self._before_empty(run)
        usage = self.containment.release(run.key, cg)
        run.cgroup = None
        return usage

    def _before_empty(self, run: Run) -> None:
        if self.before_empty is not None:
            try:
                self.before_empty(run.job_id)
            except Exception:  # a container left: the cgroup's kill still ends it
                log.exception("run %s: removing its containers failed", run.key)

    # ---------------------------------------------------------------- steps

    def add_step_proc(self, run: Run, popen: subprocess.Popen, step_id: int, fences_itself: bool = False) -> None:
        with self.lock:
            run.procs.append(Proc(popen, "step", step_id, fences_itself))

    # ---------------------------------------------------------------- kill / signal

    def kill(self, key: str, kill_wait: float, now: float, fence: bool = False) -> None:
        """Begin (or continue) ending a run: TERM at once, KILL after kill_wait. A ``fence``
        leaves the TERM of supervised processes to their supervisors, which read the same lease."""
        with self.lock:
            run = self.runs.get(key)
            if run is None:
                return
            if run.killing_since is None:
                run.killing_since = now
                for p in run.procs:
                    if p.alive and not p.termed and not (fence and p.fences_itself):
                        p.termed = True
                        p.send(signal.SIGCONT)
                        p.send(signal.SIGTERM)
                if run.cgroup is not None and not fence:  # and every process it tracks, detached ones too
                    self._signal_cgroup(run, signal.SIGCONT)
                    self._signal_cgroup(run, signal.SIGTERM)
            elif not run.killed_hard and now - run.killing_since >= kill_wait:
                run.killed_hard = True
                for p in run.procs:
                    if p.alive:
                        p.send(signal.SIGKILL)
                if run.cgroup is not None:
                    self._signal_cgroup(run, signal.SIGKILL)

    def terminate_step(self, run: Run, step_id: int, kill_wait: float) -> None:
        """End one srun step as srun asks when it is itself signalled: SIGCONT and SIGTERM to
        its tasks' groups, SIGKILL after ``kill_wait``. Nothing when the whole run is being
        killed already: that kill TERMs and KILLs them, and a task gets one TERM."""
        with self.lock:
            if run.killing_since is not None:
                return
            procs = [p for p in run.procs if p.kind == "step" and p.step_id == step_id and p.alive and not p.termed]
            for p in procs:
                p.termed = True
                p.send(signal.SIGCONT)
                p.send(signal.SIGTERM)

        def hard() -> None:
            for p in procs:
                if p.alive:
                    p.send(signal.SIGKILL)

        timer = threading.Timer(kill_wait, hard)
        timer.daemon = True
        timer.start()

    def signal_step(self, run: Run, step_id: int, signum: int) -> None:
        """Pass a signal srun got (a Ctrl-C) on to one step's tasks."""
        with self.lock:
            procs = [p for p in run.procs if p.kind == "step" and p.step_id == step_id and p.alive]
        for p in procs:
            p.send(signum)

    def _signal_cgroup(self, run: Run, sig: int) -> None:
        """Signal the processes in the run's cgroup that its process groups' signals missed
        (detached ones). Spared: the groups' members, signalled once already (a TERM trap's
        children must not get a second), and the batch supervisor, which must live to record
        how the script ended (what it leaves goes when the script's end is read)."""
        cg = run.cgroup
        if cg is None:
            return
        groups = {pid for p in run.procs if (pid := p.popen.pid) is not None}
        marker = os.fsencode(self.workdir / "jobs" / run.key)  # a supervisor's argv names its run's dir
        spare = set()
        for pid in cg.pids():
            try:
                if os.getpgid(pid) in groups:
                    spare.add(pid)
                    continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker in f.read().split(b"\0"):
                        spare.add(pid)
            except OSError:
                continue
        cg.signal(sig, spare)

    def signal(self, key: str, signum: int, target: str) -> None:
        with self.lock:
            run = self.runs.get(key)
            procs = list(run.procs) if run else []
        for p in procs:
            if not p.alive:
                continue
            if target == "batch_shell" and p.kind == "batch":
                p.send(signum, group=False)
            elif (target == "batch" and p.kind == "batch") or (target == "steps" and p.kind == "step") \
                    or target == "full":
                p.send(signum)

    def forget_dead(self, keep: set[str]) -> list[Run]:
        """Drop bookkeeping of runs that have no live process and that the server no longer
        lists; returns them."""
        with self.lock:
            gone = [self.runs.pop(k) for k, r in list(self.runs.items()) if k not in keep and not r.alive()]
        for run in gone:
            self.release_cgroup(run)  # empty by now: only its directories are left
            for p in run.procs:
                if isinstance(p.popen, Supervised):
                    # Its exit has been read; the server lists it no more, so no later agent
                    # needs its directory to re-adopt it.
                    shutil.rmtree(p.popen.jobdir, ignore_errors=True)
        return gone

    def kill_all(self) -> None:
        with self.lock:
            for run in self.runs.values():
                for p in run.procs:
                    if p.alive:
                        p.send(signal.SIGKILL)
                if run.cgroup is not None:
                    self._signal_cgroup(run, signal.SIGKILL)
