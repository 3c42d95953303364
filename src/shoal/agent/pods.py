"""Pod supervision on a node: containers through a runtime, probes, restarts, logs, status.

Each container has one supervisor thread that lives its life as kubelet would: run the
runtime's steps and the container process, decide on a restart (restartPolicy, kubelet's
back-off), sleep out the back-off, start again. While a container runs, one worker thread
per probe checks it. Every process starts in its own session, so TERM and KILL reach all
it forked. The PodStatus is computed from this bookkeeping on demand; a notifier thread
hands each change to ``on_change`` at once, so readiness reaches the gateway quickly.

The container process runs under a per-run supervisor (``agent/supervise.py``, as a batch
script does; conmon's role), in ``run.N`` beside the container's ``N.log``, and the pod's
run entry is kept in ``entry.json``: an agent that starts again re-adopts the pods it finds
there (``adopt``) instead of starting their containers again. The supervisor fences the
container by the node's lease, agent or no agent (docs/FENCING.md).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from shoal.agent import supervise
from shoal.agent.cgroups import (Cgroup, Containment, engine_parent, kernel_oom_kills, procs_files, read_cgroup_list,
                                 write_cgroup_list)
from shoal.agent.containers import (ContainerError, ContainerPaths, ContainerRuntime,
                                    CreateContainerConfigError, ImagePullError, Launch, RegistrySettings, Step,
                                    container_env, get_runtime, pull_policy)
from shoal.agent.identity import Identity, JobUsers, OpenAs, UnknownUser, output_flags
from shoal.agent.probes import (KINDS, Probe, ProbeConfigError, ProbeState, ProbeTarget, run_command,
                                run_probe)
from shoal.agent.runtime import Supervised, _killpg

TYPE_CHECKING = False
if TYPE_CHECKING:
    from shoal.agent.stepcontainer import ImageCache

log = logging.getLogger("shoal.agent")

OnChange = Callable[[str, dict, list], None]
_EVENTS_KEPT = 500  # pending events per pod; the oldest go first when nobody collects them
_TAIL_BYTES = 8192  # how much of a log's end is searched for a runtime's pull error
_ENTRY = "entry.json"  # a pod's run entry, in its directory: what a restarted agent adopts
# How long an adopted pod's status is held back for its first readiness probe, so a
# restarted agent does not report a serving pod unready only because it has not probed yet.
_ADOPT_HOLD_S = 5.0


class ContainerNotRunning(RuntimeError):
    """``shoal exec`` into a container that is waiting, ended or being stopped."""


@dataclass(frozen=True)
class ExecTarget:
    """A command to run inside a container: its argv, environment and working directory;
    ``procs`` holds its process while it runs, so the container's end kills it too."""

    argv: list[str]
    env: dict
    cwd: str | None
    procs: set
    identity: Identity | None = None  # the pod owner's, when the agent runs as root


class LogNotFound(LookupError):
    """No such log: an unknown pod or container, or no previous restart."""


def rfc3339(t: float) -> str:
    """A timestamp as Kubernetes writes it: ``2026-12-02T19:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def go_duration(seconds: float) -> str:
    """A duration as Go prints it, as kubelet's messages carry it: ``10s``, ``2m40s``, ``5m0s``, ``200ms``."""
    ms = round(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    secs = f"{rest / 1000:g}s"
    return f"{minutes}m{secs}" if minutes else secs


@dataclass
class Backoff:
    """kubelet's restart back-off, without its jitter: ``base_s`` doubling to ``max_s``."""

    base_s: float
    max_s: float
    current_s: float = 0.0  # 0: no failure remembered

    def next(self) -> float:
        """Advance to the next delay and return it."""
        self.current_s = self.base_s if self.current_s == 0 else min(self.current_s * 2, self.max_s)
        return self.current_s

    def reset(self) -> None:
        self.current_s = 0.0


@dataclass
class _Run:
    """One start of a container: its main process and how it ended."""

    number: int  # the restartCount it started as; names its log and its supervisor's directory
    launch: Launch
    log: Path
    popen: Supervised | None  # the container process under its supervisor
    started_at: float
    started_mono: float
    finished_at: float | None = None
    finished_mono: float | None = None
    exit_code: int | None = None
    signal: int = 0
    reason: str = ""
    message: str = ""
    kill_reason: str | None = None  # "liveness" | "startup" when a probe had it killed
    killed_hard: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    probe_procs: set = field(default_factory=set)
    identity: Identity | None = None  # whose process it is (None: the agent's)

    def finish(self, exit_code: int, sig: int, reason: str, message: str = "") -> None:
        self.finished_at, self.finished_mono = time.time(), time.monotonic()
        self.exit_code, self.signal, self.reason, self.message = exit_code, sig, reason, message
        self.done.set()

    def terminated(self) -> dict:
        t = {"exitCode": self.exit_code, "reason": self.reason,
             "startedAt": rfc3339(self.started_at), "finishedAt": rfc3339(self.finished_at or time.time())}
        if self.signal:
            t["signal"] = self.signal
        if self.message:
            t["message"] = self.message
        return t


@dataclass
class _Container:
    spec: dict
    crash: Backoff
    start_backoff: Backoff  # image pulls and CreateContainerError, as kubelet's image back-off
    runs_started: int = 0
    run: _Run | None = None  # the current or the last run
    last_state: dict = field(default_factory=dict)  # the run before ``run``
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    proc: subprocess.Popen | Supervised | None = None  # what runs now: a launch step or the main process
    started: bool = False
    ready: bool = False
    ended: bool = False  # will not start again
    thread: threading.Thread | None = None
    oom_kills: int = 0  # the kernel's OOM kills seen in its cgroup so far (they only grow)

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def restart_count(self) -> int:
        return max(self.runs_started - 1, 0)

    def running(self) -> bool:
        return self.run is not None and self.run.exit_code is None


@dataclass
class _Pod:
    key: str
    entry: dict
    dir: Path
    containers: list[_Container]
    start_time: float
    conditions: dict[str, tuple[bool, float]] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    stopping: bool = False
    kill_at: float | None = None  # monotonic: KILL whatever is left after this
    wake: threading.Event = field(default_factory=threading.Event)
    # Set once the server lists the pod: an adopted pod starts no container until then, as
    # it may have been deleted while no agent watched.
    listed: threading.Event = field(default_factory=threading.Event)
    held: set[str] = field(default_factory=set)  # adopted containers awaiting their first readiness probe
    cgroup: Cgroup | None = None  # every container's processes, under the pod's limits

    @property
    def pod(self) -> dict:
        return self.entry["pod"]

    @property
    def spec(self) -> dict:
        return self.pod.get("spec", {})

    @property
    def display(self) -> str:
        """The pod as kubelet names it in messages: ``name_namespace(uid)``."""
        return f"{self.pod['name']}_{self.pod['namespace']}({self.pod.get('uid', '')})"

    def grace_s(self) -> float:
        return float(self.spec.get("terminationGracePeriodSeconds", 30))


class PodManager:
    """Every pod run on this node. Thread-safe: the work loop, the reporter and the
    supervisors share it under one lock, never held while a process is waited for."""

    def __init__(self, node: str, workdir: Path, address: str, on_change: OnChange,
                 images: dict[str, list[str]] | None = None, default_runtime: str = "process", *,
                 backoff_base_s: float = 10.0, backoff_max_s: float = 300.0, users: JobUsers | None = None,
                 containment: Containment | None = None) -> None:
        self.node = node
        self.containment = containment or Containment(None)
        self.users = users or JobUsers()
        self.workdir = Path(workdir)
        self.address = address
        self.on_change = on_change
        self.images = dict(images or {})
        self.default_runtime = default_runtime
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.lock = threading.RLock()
        self.pods: dict[str, _Pod] = {}
        self._runtimes: dict[str, ContainerRuntime] = {}
        self.registry = RegistrySettings()  # the cluster's mirrors, plain-HTTP registries, the GPUs' CDI kind
        self.image_cache: ImageCache | None = None  # the node's (stepcontainer.py) when its engine is podman's
        self._dirty: set[str] = set()
        self._notify = threading.Event()
        self._closed = False
        self._sent: dict[str, dict] = {}
        self._notifier = threading.Thread(target=self._notify_loop, name="pod-status", daemon=True)
        self._notifier.start()

    # ---------------------------------------------------------------- the daemon's interface

    def ensure(self, entry: dict) -> None:
        """Start the pod of a run entry (one carrying "pod") unless this run key is known
        (an adopted pod is then let start containers again)."""
        with self.lock:
            if self._closed:
                return
            known = self.pods.get(entry["key"])
            if known is not None:
                known.listed.set()
                return
            pod = self._new_pod(entry)
            pod.cgroup = self.containment.pod(pod.key, pod.spec, entry.get("gpus", ()))
            pod.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(pod.dir / _ENTRY, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # env may hold secrets
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f)
            for c in pod.containers:
                c.runs_started = self._left_behind(pod.dir / c.name)
            self._begin(pod, {})

    def adopt(self) -> list[str]:
        """Take over the pods an earlier agent left on this node (its containers' supervisors
        live on, or have left their exit status): each container is watched and probed again,
        not started again. Returns their run keys. Call before the first ``ensure``."""
        adopted = []
        for path in sorted((self.workdir / "pods").glob(f"*/{_ENTRY}")):
            try:
                entry = json.loads(path.read_text())
                key = entry["key"]
                names = [str(c["name"]) for c in entry["pod"].get("spec", {}).get("containers", [])]
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            runs = {name: found for name in names if (found := _last_run(path.parent / name, key)) is not None}
            with self.lock:
                if not runs or self._closed or key in self.pods:
                    continue
                pod = self._new_pod(entry)
                pod.cgroup = self.containment.existing(pod.key)
                pod.listed.clear()
                watched = {}
                for c in pod.containers:
                    found = runs.get(c.name)
                    adopted_run = None if found is None else self._adopted_run(pod, c, *found)
                    if adopted_run is None:
                        c.runs_started = self._left_behind(pod.dir / c.name)
                    else:
                        watched[c.name] = adopted_run
                self._begin(pod, watched)
                if pod.held:
                    _timer(_ADOPT_HOLD_S, self._unhold, pod, None)
            adopted.append(key)
        return adopted

    def stop(self, key: str, grace_s: float | None = None) -> bool:
        """Begin (or continue) ending a pod: TERM at once, KILL after its grace period
        (``grace_s``, else terminationGracePeriodSeconds). True once everything is gone."""
        with self.lock:
            pod = self.pods.get(key)
            if pod is None:
                return True
            now = time.monotonic()
            grace = pod.grace_s() if grace_s is None else float(grace_s)
            if not pod.stopping:
                pod.stopping = True
                pod.wake.set()
                pod.listed.set()  # an adopted pod's containers stop waiting to be listed, and end
                for c in pod.containers:
                    if c.proc is not None and c.proc.poll() is None:
                        self._event(pod, "Normal", "Killing", f"Stopping container {c.name}")
                        _terminate(c.proc)
                self._changed(pod)
            if pod.kill_at is None or now + grace < pod.kill_at:
                pod.kill_at = now + grace
                _timer(grace, self._kill_left, pod)
            if now >= pod.kill_at:
                self._kill_left(pod)
            return self._gone(pod)

    def alive_keys(self) -> list[str]:
        """Pod runs that have not finished for good (a pod in back-off is alive)."""
        with self.lock:
            return [k for k, pod in self.pods.items() if not self._finished(pod)]

    def is_running(self, key: str, container: str) -> bool:
        """The container's current run has not ended (``kubectl attach`` follows it while so)."""
        with self.lock:
            pod = self.pods.get(key)
            c = next((c for c in pod.containers if c.name == container), None) if pod is not None else None
            return c is not None and c.running() and not pod.stopping

    def addresses_of(self, key: str) -> list[str]:
        """Where the pod's ports are reached from this node (``kubectl port-forward``), to try
        in turn: its IP, then the loopback (the kubelet dials localhost in the pod's network;
        a process pod's is the node's)."""
        with self.lock:
            pod = self.pods.get(key)
            if pod is None or self._finished(pod):
                raise LogNotFound(f"no pod run {key} on node {self.node}")
            return list(dict.fromkeys([pod.pod.get("env", {}).get("POD_IP") or "127.0.0.1", "127.0.0.1"]))

    def container_pids(self) -> dict[str, list[int]]:
        """The main process of each running container, by run key (for CPU accounting)."""
        with self.lock:
            running = {k: [c.run.popen.pid for c in pod.containers
                           if c.running() and c.run.popen is not None and c.run.popen.pid is not None]
                       for k, pod in self.pods.items()}
        return {k: pids for k, pids in running.items() if pids}

    def status(self, key: str) -> dict | None:
        """The pod's PodStatus, as docs/SERVING.md shows it; None once the pod is forgotten
        (``forget_dead`` may run between a caller's listing and this call), and while an
        adopted pod awaits its first readiness probe (the server keeps what it last heard)."""
        with self.lock:
            pod = self.pods.get(key)
            return None if pod is None or pod.held else self._status(pod)

    def log_path(self, pod: str | tuple[str, str], container: str, previous: bool = False) -> Path:
        """The log of a container's current (or, with ``previous``, prior) run, by run key or
        (namespace, name). Its stdout and stderr are interleaved in that one file."""
        with self.lock:
            found = self._find(pod)
            if found is not None:
                if container not in {c.name for c in found.containers}:
                    raise LogNotFound(f"container {container} is not valid for pod {found.pod['name']}")
                cdir, name = found.dir / container, found.pod["name"]
                current = next(c.restart_count for c in found.containers if c.name == container)
            else:
                if isinstance(pod, str):
                    raise LogNotFound(f"no pod run {pod} on node {self.node}")
                cdir, name = self._dir_on_disk(pod, container), pod[1]
                numbers = [int(f.stem) for f in cdir.glob("*.log") if f.stem.isdigit()]
                current = max(numbers, default=0)
        n = current - 1 if previous else current
        if n < 0:
            raise LogNotFound(f'previous terminated container "{container}" in pod "{name}" not found')
        return cdir / f"{n}.log"

    def exit_of(self, key: str) -> tuple[int, int] | None:
        """(exit code, signal) once the pod has finished for good, else None.

        That is when no container will start again: under restartPolicy Never, under
        OnFailure once all have exited 0, or after stop(). The pair is the first failed
        container's in spec order (a signal as the batch runtime reports one: (0, sig)),
        else (0, 0); a container stopped before it ever ran counts as ended by SIGTERM.
        """
        with self.lock:
            pod = self.pods.get(key)
            if pod is None or not self._finished(pod):
                return None
            for c in pod.containers:
                r = c.run
                if r is None:
                    return 0, int(signal.SIGTERM)
                if r.signal:
                    return 0, r.signal
                if r.exit_code:
                    return r.exit_code, 0
            return 0, 0

    def forget_dead(self, keep: set[str]) -> None:
        """Drop the bookkeeping of finished pods that the server no longer lists."""
        with self.lock:
            for k in [k for k, pod in self.pods.items() if k not in keep and self._finished(pod)
                      and self._gone(pod)]:
                pod = self.pods.pop(k)
                self._sent.pop(k, None)
                if pod.cgroup is not None:  # what its containers left, detached or not, goes with it
                    self.containment.release(k, pod.cgroup)
                (pod.dir / _ENTRY).unlink(missing_ok=True)  # no later agent is to adopt it

    def shutdown(self) -> None:
        """Kill every container at once (as Runtime.kill_all does) and stop the threads."""
        with self.lock:
            self._closed = True
            pods = list(self.pods.values())
        for pod in pods:
            self.stop(pod.key, grace_s=0)
        deadline = time.monotonic() + 5.0
        for pod in pods:
            for c in pod.containers:
                if c.thread is not None:
                    c.thread.join(max(0.0, deadline - time.monotonic()))
        for pod in pods:  # what left its container's process group (a setsid child) goes too
            if pod.cgroup is not None:
                self.containment.empty(pod.key, pod.cgroup)
        self._notify.set()
        self._notifier.join(1.0)

    # ---------------------------------------------------------------- one container's life

    def _supervise(self, pod: _Pod, c: _Container, adopted: _Run | None = None) -> None:
        next_start = 0.0
        backoff_shown_at: float | None = None  # when ErrImagePull turns into ImagePullBackOff
        launch: Launch | None = adopted.launch if adopted is not None else None
        try:
            while True:
                if adopted is not None:
                    outcome, adopted = self._follow(pod, c, adopted, None, {}), None
                else:
                    with self.lock:
                        if pod.stopping:
                            break
                        now = time.monotonic()
                        if backoff_shown_at is not None and now >= backoff_shown_at:
                            backoff_shown_at = None
                            self._pull_backoff(pod, c)
                        wake_at = min(next_start, backoff_shown_at or math.inf)
                    if not pod.listed.is_set():
                        pod.listed.wait()
                        continue
                    if now < wake_at:
                        pod.wake.wait(wake_at - now)
                        continue
                    if self._lease_ran_out():  # the server may run it elsewhere now: the agent's fence stops the pod
                        pod.wake.wait(0.2)
                        continue
                    outcome, launch = self._attempt(pod, c)
                with self.lock:
                    if outcome == "stopped" or pod.stopping:
                        break
                    now = time.monotonic()
                    if outcome == "start-failed":
                        delay = c.start_backoff.next()
                        next_start = now + delay
                        if c.waiting and c.waiting[0] == "ErrImagePull":
                            backoff_shown_at = now + min(1.0, delay / 2)
                        continue
                    if not self._restarts(pod, c):
                        break
                    delay = self._crash_delay(c)
                    if delay > 0:
                        c.waiting = ("CrashLoopBackOff", f"back-off {go_duration(delay)} restarting failed "
                                                         f"container={c.name} pod={pod.display}")
                        self._event(pod, "Warning", "BackOff",
                                    f"Back-off restarting failed container {c.name} in pod {pod.display}")
                        self._changed(pod)
                    next_start = now + delay
        except Exception:
            log.exception("pod %s: supervising container %s failed", pod.key, c.name)
        finally:
            if launch is not None and launch.cleanup:
                run_command(launch.cleanup, 30.0, env=launch.env)
            with self.lock:
                c.ended = True
                c.proc = None
                if c.waiting and c.waiting[0] == "CrashLoopBackOff":
                    c.waiting = None  # it will not be restarted: show how it ended
                self._changed(pod)

    def _attempt(self, pod: _Pod, c: _Container) -> tuple[str, Launch | None]:
        """Start the container once and wait for it to end: "exited", "start-failed" or "stopped"."""
        cdir = pod.dir / c.name
        try:
            rt = self._runtime(pod)
            ident = self._owner(pod)
            rt.check_available()
            probes = {k: Probe.from_spec(c.spec[f"{k}Probe"]) for k in KINDS if c.spec.get(f"{k}Probe")}
            env = container_env(pod.pod, c.spec)  # a missing Secret fails before any pull, as kubelet
            spec = self._pull_through_cache(pod, c, rt, ident)
            launch = rt.launch(pod.pod, spec, list(pod.entry.get("gpus", [])), env,
                               ContainerPaths(cdir, self.workdir / "images"))
        except ContainerError as e:
            self._start_failed(pod, c, e.reason, str(e))
            return "start-failed", None
        except ProbeConfigError as e:
            self._start_failed(pod, c, "CreateContainerConfigError", str(e))
            return "start-failed", None
        except ValueError as e:  # a resource quantity the runtime cannot pass on
            self._start_failed(pod, c, "CreateContainerError", str(e))
            return "start-failed", None
        number = c.runs_started
        path = cdir / f"{number}.log"
        with open(path, "ab") as out:
            if ident is not None:
                os.chown(path, ident.uid, ident.gid)  # the container's process opens it as the owner
            for step in launch.steps:
                failed = self._run_step(pod, c, step, out)
                if failed is not None:
                    return failed, launch
            if pod.cgroup is not None:
                engine_parent(rt.binary or "", pod.cgroup)  # asks the engine once, not under the lock
            with self.lock:
                if pod.stopping:
                    return "stopped", launch
                task, reason = self._start_supervised(pod, c, number, launch, ident, path)
            if task is not None and task.pid is None:
                # The supervisor starts the task in a moment; its pid is what probes, exec and kills use.
                while task.pid is None and task.popen.poll() is None:
                    time.sleep(0.005)
                if task.pid is None:
                    reason = task.wait().reason or "the container's supervisor ended before starting it"
            with self.lock:
                prev, prev_last = c.run, c.last_state
                run = _Run(number, launch, path, None if reason else task, time.time(), time.monotonic(),
                           identity=ident)
                c.runs_started = number + 1
                c.last_state = {"terminated": prev.terminated()} if prev is not None else {}
                c.run, c.waiting = run, None
                if reason is not None:
                    if task is not None:
                        shutil.rmtree(task.jobdir, ignore_errors=True)
                    out.write(f"shoal: {reason}\n".encode())
                    run.finish(128, 0, "StartError", reason)
                    self._event(pod, "Warning", "Failed", f"Error: {reason}")
                    self._changed(pod)
                    return "exited", launch
                c.proc = task
                c.start_backoff.reset()
                _write_pid(cdir / "pid", task.pid)
                self._event(pod, "Normal", "Created", f"Created container {c.name}")
                self._event(pod, "Normal", "Started", f"Started container {c.name}")
                self._start_probes(pod, c, run, probes)
                self._changed(pod)
                if pod.stopping:  # stop() came while the supervisor was starting it
                    _terminate(task)
        return self._follow(pod, c, run, prev, prev_last), launch

    def _start_supervised(self, pod: _Pod, c: _Container, number: int, launch: Launch, ident: Identity | None,
                          log_file: Path) -> tuple[Supervised | None, str | None]:
        """Start run ``number`` of the container under its own supervisor: (its handle, or
        None and why it could not start)."""
        jobdir = pod.dir / c.name / f"run.{number}"
        shutil.rmtree(jobdir, ignore_errors=True)
        try:
            jobdir.mkdir()
            inside = pod.cgroup.child(f"container_{c.name}") if pod.cgroup is not None else None
            if inside is not None and pod.cgroup is not None:
                # The container's own directories (v1: not the pod's cpuset and devices, which
                # other containers' supervisors share): its fence kills what it left, detached or not.
                write_cgroup_list(jobdir, [d for k, d in inside.dirs.items() if d != pod.cgroup.dirs[k]])
                # An engine's container (podman's, docker's) is made inside it too, not in the
                # engine's own cgroup: the pod's memory limit and its end hold for it.
                rt = self._runtime(pod)
                parent = engine_parent(rt.binary or "", inside)
                launch = rt.contained(launch, parent)
                if parent is not None:
                    # The engine's client stays out, as kubelet and containerd do: its memory
                    # is not the pod's. Its container's cgroups are listed for the fence once made.
                    inside = None
                    _timer(0.2, self._list_engine_cgroups, pod, c, jobdir, 0)
            spec = supervise.Launch(
                key=f"{pod.key}/{c.name}/{number}", job_id=int(pod.entry.get("job_id", 0)),
                run=int(pod.entry.get("run", 0)), user=pod.entry.get("user", ""), argv=list(launch.argv),
                env=_as(ident, launch.env), cwd=launch.cwd or os.getcwd(), cwd_fallback=None,
                files=[OpenAs(1, str(log_file), output_flags(append=True)), OpenAs(2, same_as=1)], identity=ident,
                cgroups=procs_files(inside))
            # Fenced by the node's lease as a batch script is: with the agent dead, the pod stops
            # before the server replaces it elsewhere (docs/FENCING.md).
            return Supervised(jobdir, supervise.start(jobdir, spec, self.workdir / supervise.LEASE)), None
        except (OSError, ValueError) as e:
            shutil.rmtree(jobdir, ignore_errors=True)
            return None, f"cannot start the container's supervisor: {getattr(e, 'strerror', None) or e}"

    def _list_engine_cgroups(self, pod: _Pod, c: _Container, jobdir: Path, tries: int) -> None:
        """Add the cgroups an engine made for run ``jobdir``'s container (its conmon's, its
        container's) below ``container_NAME`` to the run's list, so the fence, which kills
        each listed cgroup's processes, reaches them; tried again until they are there."""
        if pod.cgroup is None or not jobdir.is_dir():
            return
        own = pod.cgroup.sub(f"container_{c.name}")
        try:
            found = [d for top in [*own.paths, *own.engine_dirs()] if top.is_dir() for d in top.iterdir() if d.is_dir()]
            if found:
                write_cgroup_list(jobdir, [*read_cgroup_list(jobdir), *found])
                return
        except OSError as e:
            log.warning("pod %s: cannot list container %s's cgroups for the fence: %s", pod.key, c.name, e)
            return
        if tries < 300:
            _timer(0.2, self._list_engine_cgroups, pod, c, jobdir, tries + 1)

    def _engine_oom(self, pod: _Pod, c: _Container, run: _Run) -> bool:
        """v1 counts an OOM kill in the victim's own cgroup: an engine's container's, gone
        with it by now; the kernel's log says whether one was below the container's cgroup."""
        if pod.cgroup is None or pod.cgroup.version != 1:
            return False
        parent = engine_parent(self._runtime(pod).binary or "", pod.cgroup.sub(f"container_{c.name}"))
        return parent is not None and kernel_oom_kills(parent, run.started_mono) > 0

    def _follow(self, pod: _Pod, c: _Container, run: _Run, prev: _Run | None, prev_last: dict) -> str:
        """Wait for a started (or adopted) run to end and record how: "exited" or
        "start-failed" (the runtime could not pull the image or create the container)."""
        status = run.popen.wait()
        rc = -status.signal if status.signal else status.exit_code
        ooms = pod.cgroup.sub(f"container_{c.name}").usage().oom_kills if pod.cgroup is not None else c.oom_kills
        oom_killed, c.oom_kills = ooms > c.oom_kills or self._engine_oom(pod, c, run), ooms
        pull_error = engine_error = None
        if run.kill_reason is None and not status.reason:
            tail = _tail(run.log)
            pull_error = self._runtime(pod).pull_failure(rc, tail)
            engine_error = None if pull_error else self._runtime(pod).engine_failure(rc, tail)
        if status.reason:
            log.error("pod %s: container %s: %s", pod.key, c.name, status.reason)
        shutil.rmtree(run.popen.jobdir, ignore_errors=True)  # its end is read: no later agent adopts it
        with self.lock:
            c.proc = None
            if status.reason:
                run.finish(128, 0, "StartError" if status.reason.startswith("launch failed") else "Error",
                           status.reason)
            elif rc < 0:
                run.finish(128 - rc, -rc, "OOMKilled" if oom_killed else "Error")
            else:  # an OOM kill in its cgroup names the end, as containerd's does, whichever process it hit
                run.finish(rc, 0, "Completed" if rc == 0 else "OOMKilled" if oom_killed else "Error")
            _kill_all(run.probe_procs)
            c.started = c.ready = False
            pod.held.discard(c.name)
            if (pull_error or engine_error) and not pod.stopping:
                c.run, c.last_state, c.runs_started = prev, prev_last, run.number  # it never ran
                if pull_error:
                    self._start_failed(pod, c, "ErrImagePull", pull_error)
                else:
                    self._start_failed(pod, c, "CreateContainerError", engine_error)
                return "start-failed"
            self._changed(pod)
        return "exited"

    def _run_step(self, pod: _Pod, c: _Container, step: Step, out) -> str | None:
        """Run a launch step to completion; None when the container may go on."""
        image = c.spec.get("image", "")
        if step.output is not None and step.output.exists() and not step.always:
            with self.lock:
                self._event(pod, "Normal", "Pulled", f'Container image "{image}" already present on machine')
            return None
        with self.lock:
            if pod.stopping:
                return "stopped"
            if step.kind == "pull":
                self._event(pod, "Normal", "Pulling", f'Pulling image "{image}"')
            try:
                p = subprocess.Popen(step.argv, env=self._runtime(pod).base_env, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
            except OSError as e:
                p, error = None, e
            c.proc = p
        if p is None:
            if not step.check:
                return None
            reason = "ErrImagePull" if step.kind == "pull" else "CreateContainerError"
            self._start_failed(pod, c, reason, f"{step.argv[0]}: {error.strerror}")
            return "start-failed"
        rc = p.wait()
        with self.lock:
            c.proc = None
            if pod.stopping:
                return "stopped"
        if rc == 0 and step.output is not None and step.partial is not None:
            os.replace(step.partial, step.output)
        if rc == 0 or not step.check:
            if step.kind == "pull":
                with self.lock:
                    self._event(pod, "Normal", "Pulled", f'Successfully pulled image "{image}"')
            return None
        out.flush()
        lines = [line for line in _tail(Path(out.name)).splitlines() if line.strip()]
        message = lines[-1].strip() if lines else f"{step.argv[0]} {step.argv[1]} exited with {rc}"
        self._start_failed(pod, c, "ErrImagePull" if step.kind == "pull" else "CreateContainerError", message)
        return "start-failed"

    def _pull_through_cache(self, pod: _Pod, c: _Container, rt: ContainerRuntime, ident: Identity | None) -> dict:
        """Under podman, the image comes through the node's cache, as batch steps' do (one
        pull per node for both, one LRU size limit), by the container's imagePullPolicy, with
        kubelet's events; the container then starts with ``--pull=never``. Returns the spec
        to launch (the container's own where the cache is not used)."""
        from shoal.agent.stepcontainer import ContainerStartError

        if self.image_cache is None or rt.name != "podman" or not c.spec.get("image"):
            return c.spec
        image = c.spec["image"]
        ref, insecure = rt.registry.resolve(image) if (rt.registry.mirrors or rt.registry.insecure) \
            else (image, False)
        policy = pull_policy(c.spec)
        known = self.image_cache.lookup(ref)
        present = known is not None and self.image_cache.present(known)
        if policy == "Never" or (policy == "IfNotPresent" and present):
            if not present:
                raise ImagePullError(f'Container image "{image}" is not present with pull policy of Never')
            with self.lock:
                self._event(pod, "Normal", "Pulled", f'Container image "{image}" already present on machine')
        else:
            with self.lock:
                self._event(pod, "Normal", "Pulling", f'Pulling image "{image}"')
            login = _login_for(pod.pod.get("registry_auths") or {}, ref)
            t0 = time.monotonic()
            try:
                got = self.image_cache.get(ref, insecure, login=login, user=ident.uid if ident else None,
                                           refresh=policy == "Always")
            except ContainerStartError as e:
                raise ImagePullError(str(e).strip().splitlines()[-1] if str(e).strip() else "pull failed") from None
            took = time.monotonic() - t0
            with self.lock:
                self._event(pod, "Normal", "Pulled", f'Successfully pulled image "{image}" in {took:.3f}s '
                                                     f"({took:.3f}s including waiting). Image size: {got.size} bytes.")
        return {**c.spec, "imagePullPolicy": "Never"}

    def _start_failed(self, pod: _Pod, c: _Container, reason: str, message: str) -> None:
        with self.lock:
            c.waiting = (reason, message)
            if reason == "ErrImagePull":
                self._event(pod, "Warning", "Failed", f'Failed to pull image "{c.spec.get("image", "")}": {message}')
                self._event(pod, "Warning", "Failed", "Error: ErrImagePull")
            else:
                self._event(pod, "Warning", "Failed", f"Error: {message}")
            self._changed(pod)

    def _lease_ran_out(self) -> bool:
        """Whether the node's lease (as its supervisors read it) has run out: no container
        starts then, not even a restart of one its supervisor has just fenced."""
        lease = supervise.read_lease(self.workdir / supervise.LEASE)
        return lease is not None and supervise.boottime() >= lease.expires

    def _pull_backoff(self, pod: _Pod, c: _Container) -> None:
        message = f'Back-off pulling image "{c.spec.get("image", "")}"'
        c.waiting = ("ImagePullBackOff", message)
        self._event(pod, "Normal", "BackOff", message)
        self._event(pod, "Warning", "Failed", "Error: ImagePullBackOff")
        self._changed(pod)

    def _restarts(self, pod: _Pod, c: _Container) -> bool:
        """restartPolicy: whether a container that has just ended starts again."""
        policy = pod.spec.get("restartPolicy", "Always")
        if policy == "Always":
            return True
        if policy == "OnFailure":
            return c.run.exit_code != 0 or c.run.kill_reason is not None
        return False

    def _crash_delay(self, c: _Container) -> float:
        """kubelet's crash back-off: the first restart at once, then base, doubling to max;
        forgotten once a run has gone 2 x max (10 minutes) without failing."""
        run = c.run
        if run.finished_mono - run.started_mono >= 2 * self.backoff_max_s:
            c.crash.reset()
        delay = c.crash.current_s
        c.crash.next()
        return delay

    # ---------------------------------------------------------------- probes

    def _start_probes(self, pod: _Pod, c: _Container, run: _Run, probes: dict[str, Probe]) -> None:
        states = {k: ProbeState(p, k, run.started_mono) for k, p in probes.items()}
        c.started = "startup" not in states
        c.ready = c.started and "readiness" not in states
        first = ["startup"] if "startup" in states else [k for k in ("liveness", "readiness") if k in states]
        for k in first:
            self._probe_worker(pod, c, run, states[k], states)

    def _probe_worker(self, pod: _Pod, c: _Container, run: _Run, state: ProbeState, states: dict) -> None:
        threading.Thread(target=self._probe_loop, args=(pod, c, run, state, states), daemon=True,
                         name=f"probe-{pod.key}-{c.name}-{state.kind}").start()

    def _probe_loop(self, pod: _Pod, c: _Container, run: _Run, state: ProbeState, states: dict) -> None:
        ports = {p["name"]: int(p["containerPort"]) for p in c.spec.get("ports") or [] if p.get("name")}
        target = ProbeTarget(host=pod.pod.get("env", {}).get("POD_IP") or self.address, ports=ports,
                             exec=lambda argv, timeout: self._exec(pod, run, argv, timeout))
        kind = state.kind
        while True:
            if run.done.wait(max(0.0, state.next_due() - time.monotonic())):
                return
            result = run_probe(state.probe, target)
            with self.lock:
                if run.done.is_set() or run.kill_reason is not None or pod.stopping:
                    return
                flip = state.record(result.ok, time.monotonic())
                if kind == "readiness":
                    self._unhold(pod, c.name)
                if not result.ok:
                    self._event(pod, "Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {result.message}")
                if flip is None:
                    continue
                if kind == "readiness":
                    c.ready = flip
                    self._changed(pod)
                    continue
                if kind == "startup" and flip:
                    c.started = True
                    c.ready = "readiness" not in states
                    for k in ("liveness", "readiness"):
                        if k in states:
                            self._probe_worker(pod, c, run, states[k], states)
                    self._changed(pod)
                    return
                if flip is False:  # liveness or startup failed: kill, and restart as the policy says
                    run.kill_reason = kind
                    self._event(pod, "Normal", "Killing",
                                f"Container {c.name} failed {kind} probe, will be restarted")
                    grace = state.probe.termination_grace_s
                    self._kill_run(c, run, pod.grace_s() if grace is None else grace)
                    self._changed(pod)
                    return

    def _exec(self, pod: _Pod, run: _Run, argv: list[str], timeout_s: float) -> tuple[int | None, str]:
        if run.popen is None or run.popen.pid is None:
            return 1, "the container is not running"
        full = self._runtime(pod).exec_argv(run.launch, argv, run.popen.pid)
        return run_command(full, timeout_s, env=_as(run.identity, run.launch.env), cwd=run.launch.cwd,
                           procs=run.probe_procs, identity=run.identity)

    def exec_target(self, key: str, container: str, argv: list[str], *, stdin: bool = False,
                    tty: bool = False) -> ExecTarget:
        """How to run ``argv`` inside a running container (``shoal exec``): the same command
        line as an exec probe. Raises LogNotFound (no such pod or container) or
        ContainerNotRunning."""
        with self.lock:
            pod = self._find(key)
            if pod is None:
                raise LogNotFound(f"no pod run {key} on node {self.node}")
            c = next((c for c in pod.containers if c.name == container), None)
            if c is None:
                raise LogNotFound(f"container {container} is not valid for pod {pod.pod['name']}")
            run = c.run
            if run is None or run.popen is None or run.popen.pid is None or not c.running() or pod.stopping:
                raise ContainerNotRunning(f'container "{container}" in pod "{pod.pod["name"]}" is not running')
        full = self._runtime(pod).exec_argv(run.launch, argv, run.popen.pid, stdin=stdin, tty=tty)
        return ExecTarget(full, _as(run.identity, run.launch.env), run.launch.cwd, run.probe_procs, run.identity)

    # ---------------------------------------------------------------- killing

    def _kill_run(self, c: _Container, run: _Run, grace_s: float) -> None:
        p = run.popen
        if p is None or p.poll() is not None:
            return
        _terminate(p)

        def hard() -> None:
            with self.lock:
                if p.poll() is None:
                    p.send(signal.SIGKILL)
                    run.killed_hard = True

        _timer(grace_s, hard)

    def _kill_left(self, pod: _Pod) -> None:
        with self.lock:
            for c in pod.containers:
                if c.proc is not None and c.proc.poll() is None:
                    _send(c.proc, signal.SIGKILL)
                    if c.run is not None and c.run.popen is c.proc:
                        c.run.killed_hard = True
                if c.run is not None:
                    _kill_all(c.run.probe_procs)

    def _gone(self, pod: _Pod) -> bool:
        return all((c.thread is None or not c.thread.is_alive())
                   and (c.run is None or not c.run.probe_procs) for c in pod.containers)

    def _finished(self, pod: _Pod) -> bool:
        return all(c.ended and (c.proc is None or c.proc.poll() is not None) for c in pod.containers)

    # ---------------------------------------------------------------- status

    def _status(self, pod: _Pod) -> dict:
        containers = [self._container_status(pod, c) for c in pod.containers]
        if all(c.ended for c in pod.containers):
            ok = all(c.run is not None and c.run.exit_code == 0 for c in pod.containers)
            phase = "Succeeded" if ok else "Failed"
        elif any(c.runs_started == 0 for c in pod.containers):
            phase = "Pending"
        else:
            phase = "Running"
        conditions = []
        unready = [c.name for c in pod.containers if not c.ready]
        for kind in ("Ready", "ContainersReady", "Initialized", "PodScheduled"):
            value, since = pod.conditions[kind]
            cond = {"type": kind, "status": "True" if value else "False", "lastTransitionTime": rfc3339(since)}
            if not value:
                done = phase in ("Succeeded", "Failed")
                cond["reason"] = "PodCompleted" if done else "ContainersNotReady"
                if not done:
                    cond["message"] = f"containers with unready status: [{' '.join(unready)}]"
            conditions.append(cond)
        ip = pod.pod.get("env", {}).get("POD_IP") or self.address
        return {"phase": phase, "podIP": ip, "hostIP": self.address, "startTime": rfc3339(pod.start_time),
                "conditions": conditions, "containerStatuses": containers}

    def _container_status(self, pod: _Pod, c: _Container) -> dict:
        run = c.run
        if c.running():
            state, last = {"running": {"startedAt": rfc3339(run.started_at)}}, c.last_state
        elif c.waiting is not None:
            waiting = {"reason": c.waiting[0]}
            if c.waiting[1]:
                waiting["message"] = c.waiting[1]
            state, last = {"waiting": waiting}, ({"terminated": run.terminated()} if run else {})
        elif run is not None:
            state, last = {"terminated": run.terminated()}, c.last_state
        else:
            state, last = {"waiting": {"reason": "ContainerCreating"}}, {}
        status = {"name": c.name, "image": c.spec.get("image", ""), "ready": c.ready and c.running(),
                  "started": c.started and c.running(), "restartCount": c.restart_count,
                  "state": state, "lastState": last}
        if run is not None and run.popen is not None and run.popen.pid is not None:
            status["containerID"] = f"{run.launch.runtime}://{run.popen.pid}"
        return status

    def _changed(self, pod: _Pod) -> None:
        """Record condition transitions and have the notifier send the pod's status now."""
        now = time.time()
        ready = bool(pod.containers) and all(c.ready and c.running() for c in pod.containers)
        for kind, value in (("Ready", ready), ("ContainersReady", ready), ("Initialized", True),
                            ("PodScheduled", True)):
            if kind not in pod.conditions or pod.conditions[kind][0] != value:
                pod.conditions[kind] = (value, pod.start_time if kind in ("Initialized", "PodScheduled") else now)
        self._dirty.add(pod.key)
        self._notify.set()

    def _event(self, pod: _Pod, type_: str, reason: str, message: str) -> None:
        pod.events.append({"type": type_, "reason": reason, "message": message, "time": time.time()})
        del pod.events[:-_EVENTS_KEPT]
        (log.warning if type_ == "Warning" else log.info)("pod %s/%s: %s: %s", pod.pod["namespace"],
                                                          pod.pod["name"], reason, message)
        self._dirty.add(pod.key)
        self._notify.set()

    def _notify_loop(self) -> None:
        while True:
            if not self._closed:
                self._notify.wait()
            self._notify.clear()
            with self.lock:
                if self._closed and not self._dirty:
                    return
                batch = []
                for key in sorted(self._dirty):
                    pod = self.pods.get(key)
                    if pod is not None and not pod.held:  # a held pod is sent once released
                        batch.append((key, self._status(pod), pod.events))
                        pod.events = []
                self._dirty.clear()
            for key, status, events in batch:
                if status == self._sent.get(key) and not events:
                    continue
                self._sent[key] = status
                try:
                    self.on_change(key, status, events)
                except Exception:
                    log.exception("pod %s: reporting its status failed", key)

    # ---------------------------------------------------------------- helpers

    def _runtime(self, pod: _Pod) -> ContainerRuntime:
        name = pod.pod.get("runtime") or self.default_runtime
        with self.lock:
            rt = self._runtimes.get(name)
            if rt is None:
                rt = self._runtimes[name] = get_runtime(name, self.node, self.images)
            rt.registry = self.registry
            return rt

    def _owner(self, pod: _Pod) -> Identity | None:
        """Whose processes the pod's containers are: its owner's, when the agent runs as root."""
        user = pod.entry.get("user", "")
        try:
            return self.users.of(user)
        except UnknownUser:
            raise CreateContainerConfigError(f"user {user} is unknown on node {self.node}") from None

    def _find(self, pod: str | tuple[str, str]) -> _Pod | None:
        if isinstance(pod, str):
            return self.pods.get(pod)
        matches = [p for p in self.pods.values() if (p.pod["namespace"], p.pod["name"]) == tuple(pod)]
        return max(matches, key=lambda p: p.start_time, default=None)

    def _dir_on_disk(self, pod: tuple[str, str], container: str) -> Path:
        namespace, name = pod
        dirs = [d for d in (self.workdir / "pods").glob(f"{namespace}_{name}_*") if (d / container).is_dir()]
        if not dirs:
            raise LogNotFound(f'pod "{name}" in namespace "{namespace}" has no container {container} '
                              f"on node {self.node}")
        return max(dirs, key=lambda d: d.stat().st_mtime) / container

    def _left_behind(self, cdir: Path) -> int:
        """An earlier agent ran this container here and it was not adopted: kill what is left
        of it, and continue its restart numbering so its logs are kept. Returns the runs
        started so far."""
        cdir.mkdir(parents=True, exist_ok=True)
        for jobdir in cdir.glob("run.*"):
            pid = supervise.read_task_pid(jobdir)
            if pid is not None and supervise.supervisor_alive(jobdir):
                _killpg(pid, signal.SIGKILL)
            shutil.rmtree(jobdir, ignore_errors=True)
        pidfile = cdir / "pid"  # an agent from before supervisors ran it directly
        try:
            pid, created = pidfile.read_text().split()
            if abs(psutil.Process(int(pid)).create_time() - float(created)) < 0.01:
                _killpg(int(pid), signal.SIGKILL)
        except (OSError, ValueError, psutil.Error):
            pass
        numbers = [int(f.stem) for f in cdir.glob("*.log") if f.stem.isdigit()]
        return max(numbers) + 1 if numbers else 0

    def _new_pod(self, entry: dict) -> _Pod:
        p = entry["pod"]
        podir = self.workdir / "pods" / f"{p['namespace']}_{p['name']}_{p.get('uid', '')}"
        containers = [_Container(dict(spec), Backoff(self.backoff_base_s, self.backoff_max_s),
                                 Backoff(self.backoff_base_s, self.backoff_max_s))
                      for spec in p.get("spec", {}).get("containers", [])]
        pod = _Pod(entry["key"], entry, podir, containers, time.time())
        pod.listed.set()
        return pod

    def _begin(self, pod: _Pod, adopted: dict[str, _Run]) -> None:
        """Register the pod and start its containers' supervisor threads (under the lock)."""
        self.pods[pod.key] = pod
        for c in pod.containers:
            c.thread = threading.Thread(target=self._supervise, args=(pod, c, adopted.get(c.name)), daemon=True,
                                        name=f"pod-{pod.key}-{c.name}")
        self._changed(pod)
        for c in pod.containers:
            c.thread.start()

    def _adopted_run(self, pod: _Pod, c: _Container, number: int, jobdir: Path) -> _Run | None:
        """Take over run ``number`` of a container from an earlier agent, probes and all
        (under the lock); None when it cannot be (its launch no longer resolves here)."""
        try:
            ident = self._owner(pod)
            probes = {k: Probe.from_spec(c.spec[f"{k}Probe"]) for k in KINDS if c.spec.get(f"{k}Probe")}
            launch = self._runtime(pod).launch(pod.pod, c.spec, list(pod.entry.get("gpus", [])),
                                               container_env(pod.pod, c.spec),
                                               ContainerPaths(pod.dir / c.name, self.workdir / "images"))
            started_at = (jobdir / supervise.LAUNCH).stat().st_mtime
        except (ContainerError, ValueError, OSError) as e:
            log.warning("pod %s: container %s cannot be adopted (%s): starting it again", pod.key, c.name, e)
            return None
        task = Supervised(jobdir)
        run = _Run(number, launch, pod.dir / c.name / f"{number}.log", task, started_at,
                   time.monotonic() - max(0.0, time.time() - started_at), identity=ident)
        c.runs_started, c.run, c.waiting = number + 1, run, None
        if supervise.supervisor_alive(jobdir):
            c.proc = task
            log.warning("pod %s: container %s (pid %s) adopted from an earlier agent", pod.key, c.name, task.pid)
            if "readiness" in probes:
                pod.held.add(c.name)
            self._start_probes(pod, c, run, probes)
        else:
            log.warning("pod %s: container %s ended while no agent watched", pod.key, c.name)
        return run

    def _unhold(self, pod: _Pod, container: str | None) -> None:
        """An adopted container has its first readiness result (None: waited long enough):
        once none is awaited, the pod's status is reported again."""
        with self.lock:
            if not pod.held:
                return
            if container is None:
                pod.held.clear()
            else:
                pod.held.discard(container)
            if not pod.held:
                self._changed(pod)


def _login_for(auths: dict, ref: str) -> tuple[str, str] | None:
    """The imagePullSecrets' login for the registry ``ref`` is pulled from."""
    entry = auths.get(ref.partition("/")[0]) if "/" in ref else None
    if not entry or not entry.get("auth"):
        return None
    try:
        user, colon, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return (user, password) if colon else None


def _as(ident: Identity | None, env: dict) -> dict:
    """A container's host-side environment, with the owner's USER, LOGNAME and HOME."""
    return {**env, **ident.environment()} if ident is not None else dict(env)


def _send(p: subprocess.Popen | Supervised, sig: int) -> None:
    """Signal a process's group: a launch step's, or a container's (through its supervisor
    if the task has not started yet)."""
    if isinstance(p, Supervised):
        p.send(sig)
    else:
        _killpg(p.pid, sig)


def _terminate(p: subprocess.Popen | Supervised) -> None:
    _send(p, signal.SIGCONT)
    _send(p, signal.SIGTERM)


def _kill_all(procs: set) -> None:
    for p in list(procs):
        if p.poll() is None:
            _killpg(p.pid, signal.SIGKILL)


def _timer(delay_s: float, fn, *args) -> None:
    t = threading.Timer(max(0.0, delay_s), fn, args)
    t.daemon = True
    t.start()


def _last_run(cdir: Path, key: str) -> tuple[int, Path] | None:
    """The latest run of a container that an earlier agent started for run key ``key`` and
    whose end no agent has read: (its number, its supervisor's directory)."""
    runs = []
    for jobdir in cdir.glob("run.*"):
        launch = supervise.read_launch(jobdir)
        number = jobdir.name.removeprefix("run.")
        if launch is not None and number.isdigit() and launch.key == f"{key}/{cdir.name}/{number}":
            runs.append((int(number), jobdir))
    return max(runs, default=None)


def _write_pid(path: Path, pid: int) -> None:
    try:
        path.write_text(f"{pid} {psutil.Process(pid).create_time()}")
    except (OSError, psutil.Error):
        pass


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
