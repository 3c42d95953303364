"""Job containment with Linux cgroups, as Slurm's proctrack/cgroup and task/cgroup do.

Every run (job) gets a cgroup under the agent's own, ``shoal/<node>-<instance>/job_<id>.<run>``,
and each of its steps one below it (``step_batch``, ``step_<N>``); ``instance`` comes from the
agent's work dir, so neither several agents of one cluster nor several local clusters sharing
a machine ever meet. The job's cgroup carries its limits: memory (and memory+swap, so it really runs
out) from the allocation, a cpuset of the allocation's size, and on cgroup v1 a device list
that denies the GPUs the job was not given. A process joins its step's cgroup itself before
it starts anything (a supervisor, ``procs_files``; an srun task between fork and exec,
``identity.join_cgroups``), so nothing it starts is ever outside; at the job's end the cgroup
is frozen, killed and thawed (v1) or ``cgroup.kill``-ed (v2), emptied and removed, and its
usage (peak memory, CPU time) and the kernel's OOM kills are read first.

cgroup v1 (one hierarchy per controller) and v2 (one unified hierarchy) are both handled,
chosen by what the node mounts; see docs/CGROUPS.md.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from shoal.agent.devbpf import deny_devices

log = logging.getLogger("shoal.agent")

# pids is left out: no limit is set on it, and every hierarchy joined costs each launch a migration.
V1_CONTROLLERS = ("freezer", "memory", "cpuset", "devices", "cpuacct")
# Where a step gets a directory of its own (tracking, usage); in the others its processes join
# the job's directory, whose limits it shares anyway: fewer directories to make and remove.
V1_STEP_CONTROLLERS = ("freezer", "memory", "cpuacct")
V2_CONTROLLERS = ("memory", "cpuset", "cpu", "pids")
CGROUPS_FILE = "cgroups"  # in the run's directory: its cgroup directories, one a line (for the supervisors' fence)
NVIDIA_MAJOR = 195  # NVIDIA's character devices: /dev/nvidiaN is 195:N, /dev/nvidiactl 195:255


class CgroupError(OSError):
    """A cgroup could not be made or filled; the message names the file."""


@dataclass(frozen=True)
class Limits:
    """What a job's cgroup allows: memory in bytes (None: unlimited), its CPUs (None: all of the
    node's) and the GPU minors (``/dev/nvidiaN``) it may not open."""

    memory_bytes: int | None = None
    cpus: tuple[int, ...] | None = None
    denied_gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Usage:
    """What a job used, from its cgroup: peak memory (bytes), CPU time (seconds; its user and
    system parts, which sacct's UserCPU and SystemCPU show), OOM kills."""

    max_rss_bytes: int = 0
    cpu_seconds: float = 0.0
    oom_kills: int = 0
    user_seconds: float = 0.0
    system_seconds: float = 0.0

    def report(self) -> dict:
        """The figures as agents send them (sacct's MaxRSS, TotalCPU, UserCPU, SystemCPU)."""
        return {"max_rss_kb": self.max_rss_bytes // 1024, "cpu_s": round(self.cpu_seconds, 3),
                "user_cpu_s": round(self.user_seconds, 3), "system_cpu_s": round(self.system_seconds, 3)}


# --------------------------------------------------------------------------- policy


def pick_cpus(online: Sequence[int], busy: dict[int, int], count: int) -> tuple[int, ...]:
    """The ``count`` CPUs of ``online`` least used by other jobs (``busy``: CPU -> jobs on it),
    lowest ids first among equals: the allocation names counts, not CPU ids, so the cpuset is
    chosen here. Asked for more than the node has, the job gets all of them."""
    if count >= len(online):
        return tuple(online)
    return tuple(sorted(sorted(online, key=lambda c: (busy.get(c, 0), c))[:max(count, 1)]))


def job_limits(memory_mb: int | None, cpus: tuple[int, ...] | None, gpus: Iterable[int],
               node_gpus: Iterable[int]) -> Limits:
    """A run's limits from its allocation on this node."""
    mine = set(gpus)
    return Limits(memory_bytes=memory_mb * 1024 * 1024 if memory_mb else None, cpus=cpus,
                  denied_gpus=tuple(sorted(set(node_gpus) - mine)))


def pod_limits(spec: dict, gpus: Iterable[int]) -> tuple[int | None, int]:
    """A pod's memory limit (MiB; None when a container has none, as a Kubernetes pod then has
    no pod-level limit) and how many CPUs its cpuset holds (the sum of its containers'
    ``limits.cpu`` rounded up, else of their requests, at least 1), from its spec."""
    from math import ceil

    from shoal.model.quantity import parse_cpu, parse_memory_mb

    memory, cpus = 0, 0.0
    containers = spec.get("containers") or []
    for c in containers:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        if memory is not None:
            memory = memory + parse_memory_mb(limits["memory"]) if "memory" in limits else None
        cpus += parse_cpu(limits.get("cpu", requests.get("cpu", 0)))
    return (memory or None) if containers else None, max(ceil(cpus), 1)


def cpu_list_text(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in cpus)


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,8`` -> [0, 1, 2, 3, 8] (cpuset's list format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def parse_mounts(mounts: str) -> tuple[dict[str, Path], Path | None]:
    """From /proc/self/mounts: each v1 controller's mount point, and the cgroup2 mount (or None)."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        where, kind, options = fields[1], fields[2], fields[3].split(",")
        if kind == "cgroup2" and v2 is None:
            v2 = Path(where)
        elif kind == "cgroup":
            for opt in options:
                if opt in V1_CONTROLLERS and opt not in v1:
                    v1[opt] = Path(where)
    return v1, v2


def _mounts() -> tuple[dict[str, Path], Path | None, tuple[Path, ...]]:
    """This machine's cgroup mounts (read once): :func:`parse_mounts`' two, and every v1
    hierarchy's mount point (those the agent uses and the rest, where engines make cgroups too)."""
    global _MOUNTS
    if _MOUNTS is None:
        text = _read(Path("/proc/self/mounts"))
        v1, v2 = parse_mounts(text)
        every = tuple(dict.fromkeys(Path(f[1]) for line in text.splitlines()
                                    if len(f := line.split()) >= 3 and f[2] == "cgroup"))
        _MOUNTS = (v1, v2, every)
    return _MOUNTS


_MOUNTS: tuple[dict[str, Path], Path | None, tuple[Path, ...]] | None = None


def favors_dynmods(mounts: str) -> bool:
    """Whether a cgroup hierarchy in /proc/self/mounts has ``favordynmods``. Without it every
    cgroup migration (a job's supervisor joining its cgroup) takes the kernel's global
    threadgroup lock for writing, which waits an RCU grace period (10-20 ms measured) and
    holds up every fork on the node meanwhile."""
    return any(len(f := line.split()) >= 4 and f[2] in ("cgroup", "cgroup2") and "favordynmods" in f[3].split(",")
               for line in mounts.splitlines())


def parse_own(self_cgroup: str) -> tuple[dict[str, str], str]:
    """From /proc/self/cgroup: this process's cgroup per v1 controller, and its v2 cgroup."""
    v1: dict[str, str] = {}
    v2 = "/"
    for line in self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = path
        for c in controllers.split(","):
            v1[c] = path
    return v1, v2


# --------------------------------------------------------------------------- mechanism


def _write(path: Path, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise CgroupError(e.errno, f"cannot write {text!r} to {path}: {e.strerror}") from None


def _read(path: Path, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def _keyed(text: str, key: str) -> int:
    """The value of ``key`` in a ``key value`` file (memory.events, cpu.stat, memory.oom_control)."""
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            try:
                return int(v)
            except ValueError:
                return 0
    return 0


class Cgroup:
    """One job's (or step's) cgroup: its directory in each hierarchy used (v1: one per
    controller; v2: one)."""

    def __init__(self, version: int, dirs: dict[str, Path]) -> None:
        self.version = version
        self.dirs = dirs  # controller (v2: "unified") -> directory

    @property
    def paths(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    def sub(self, name: str) -> Cgroup:
        """A sub-cgroup (a step, a container), made or not; on v1 only where steps have their own."""
        return Cgroup(self.version, {c: d / name if self.version == 2 or c in V1_STEP_CONTROLLERS else d
                                     for c, d in self.dirs.items()})

    def made_below(self, parent: Cgroup) -> bool:
        """Whether this sub-cgroup of ``parent`` has a directory of its own (a step's usage is
        read there; without one it is uncontained, or a v1 node without memory and cpuacct)."""
        return any(d.is_dir() for c, d in self.dirs.items() if d != parent.dirs[c])

    def child(self, name: str) -> Cgroup:
        """A sub-cgroup, made now."""
        sub = self.sub(name)
        for c, d in sub.dirs.items():
            if d != self.dirs[c]:
                _mkdir(d)
        return sub

    def engine_parent(self) -> str | None:
        """This cgroup as a container engine's cgroupfs ``--cgroup-parent`` names it: its path
        below the hierarchy's mount (v1: the memory hierarchy's, where the limit is; the engine
        makes the same path in every hierarchy), so the container is inside it."""
        v1, v2, _ = _mounts()
        c = "unified" if self.version == 2 else "memory" if "memory" in self.dirs else "freezer"
        d, mount = self.dirs.get(c), v2 if self.version == 2 else v1.get(c)
        if d is None or mount is None:
            return None
        try:
            return "/" + str(d.relative_to(mount))
        except ValueError:
            return None

    def _split(self) -> bool:
        """v1, with the freezer and memory directories at different paths below their mounts."""
        if self.version != 1 or "memory" not in self.dirs or "freezer" not in self.dirs:
            return False
        v1 = _mounts()[0]
        try:
            return self.dirs["memory"].relative_to(v1["memory"]) != self.dirs["freezer"].relative_to(v1["freezer"])
        except (KeyError, ValueError):
            return False

    def engine_dirs(self) -> list[Path]:
        """Where an engine mirrors :meth:`engine_parent` in each v1 hierarchy (the directories
        that are not this cgroup's own: an agent whose cgroup differs between hierarchies)."""
        rel = self.engine_parent() if self.version == 1 else None
        if rel is None:
            return []
        own = set(self.paths)
        return [d for m in _mounts()[2] if (d := m / rel.lstrip("/")) not in own]

    def open_procs(self) -> list[int]:
        """Open ``cgroup.procs`` of each directory for :func:`identity.join_cgroups` in a child before exec."""
        fds = []
        try:
            for d in self.paths:
                fds.append(os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except OSError as e:
            close_all(fds)
            raise CgroupError(e.errno, f"cannot open {d / 'cgroup.procs'}: {e.strerror}") from None
        return fds

    def pids(self) -> set[int]:
        """Every process in this cgroup and below (from the process-tracking hierarchy)."""
        out: set[int] = set()
        top = self.dirs.get("freezer") or self.paths[0]
        # A container an engine made below us (engine_parent) is in our memory directory, and
        # in our freezer one only where both sit at one path below their mounts.
        for t in (top, self.dirs["memory"]) if self._split() else (top,):
            for root, _, _ in os.walk(t):
                for line in _read(Path(root) / "cgroup.procs").split():
                    out.add(int(line))
        return out

    def populated(self) -> bool:
        if self.version == 2:
            return _keyed(_read(self.paths[0] / "cgroup.events"), "populated") == 1 if \
                (self.paths[0] / "cgroup.events").exists() else False
        return bool(self.pids())

    def signal(self, sig: int, spare: Iterable[int] = ()) -> None:
        """Send ``sig`` to every process in it but ``spare`` (scancel's TERM reaches detached ones too)."""
        _kill_each(self.pids() - set(spare), sig)

    def kill(self, timeout: float = 10.0) -> bool:
        """Kill every process in it, detached or not, and wait until it is empty (True) or
        ``timeout`` has passed (False). v1 freezes first, so nothing forks between the read of
        the pids and the kill; v2 has ``cgroup.kill`` for that."""
        if not self.populated():  # the common end: the script was the last of them
            return True
        if self.version == 2:
            kill_file = self.paths[0] / "cgroup.kill"
            if kill_file.exists():
                try:
                    _write(kill_file, "1")
                except CgroupError:
                    pass
            else:
                _kill_each(self.pids())
        else:
            freezer = self.dirs.get("freezer")
            frozen = freezer is not None and _freeze(freezer, "FROZEN")
            _kill_each(self.pids())
            if frozen:
                _freeze(freezer, "THAWED")  # the kill is delivered when they thaw
        deadline = time.monotonic() + timeout
        while self.populated():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
            _kill_each(self.pids())  # one forked between the read and the freeze (v1 without freezer)
        return True

    def usage(self) -> Usage:
        """Peak memory, CPU time and the kernel's OOM kills in this cgroup and below."""
        if self.version == 2:
            d = self.paths[0]
            peak = _read(d / "memory.peak").strip()
            stat = _read(d / "cpu.stat")
            ooms = _keyed(_read(d / "memory.events"), "oom_kill")
            return Usage(int(peak) if peak.isdigit() else 0, _keyed(stat, "usage_usec") / 1e6, ooms,
                         _keyed(stat, "user_usec") / 1e6, _keyed(stat, "system_usec") / 1e6)
        mem = self.dirs.get("memory")
        acct = self.dirs.get("cpuacct")
        peak = _read(mem / "memory.max_usage_in_bytes").strip() if mem else ""
        cpu = _read(acct / "cpuacct.usage").strip() if acct else ""
        split = _read(acct / "cpuacct.stat") if acct else ""  # in USER_HZ ticks
        hz = os.sysconf("SC_CLK_TCK")
        # v1 counts an OOM kill in the victim's own cgroup (a step's), not in its parents'.
        ooms = sum(_keyed(_read(Path(root) / "memory.oom_control"), "oom_kill")
                   for root, _, _ in os.walk(mem)) if mem else 0
        return Usage(int(peak) if peak.isdigit() else 0, int(cpu) / 1e9 if cpu.isdigit() else 0.0, ooms,
                     _keyed(split, "user") / hz, _keyed(split, "system") / hz)

    def remove(self) -> None:
        """Remove its directories, deepest first (an empty cgroup only; a busy one stays), and
        those an engine made for containers below it in the other v1 hierarchies."""
        for d in [*self.paths, *(d for d in self.engine_dirs() if d.is_dir())]:
            for root, _, _ in sorted(os.walk(d), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(root)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        log.warning("cannot remove cgroup %s: %s", root, e.strerror)


_ENGINE_INFO = {"podman": "{{.Host.CgroupManager}} {{.Host.CgroupsVersion}}",
                "docker": "{{.CgroupDriver}} {{.CgroupVersion}}"}
_engines: dict[str, tuple[str, int] | None] = {}  # engine binary -> (cgroup manager, version), once asked


def engine_parent(engine: str, cg: Cgroup | None) -> str | None:
    """``cg`` as container engine ``engine`` (podman, docker)'s ``--cgroup-parent``, so its
    container is inside it; None (and a warning, once) where the engine cannot make it there:
    another cgroup manager (systemd takes slices, not paths) or version than the agent's."""
    import subprocess

    if cg is None or engine not in _ENGINE_INFO:
        return None
    if engine not in _engines:
        try:
            out = subprocess.run([engine, "info", "--format", _ENGINE_INFO[engine]], capture_output=True, text=True,
                                 timeout=60)
            manager, _, version = out.stdout.strip().partition(" ")
            found = (manager, int(version.lstrip("v"))) if out.returncode == 0 and version.lstrip("v").isdigit() \
                else None
        except (OSError, subprocess.SubprocessError):
            found = None
        _engines[engine] = found
        if found != ("cgroupfs", cg.version):
            log.warning("%s's cgroups (%s) are not the agent's (cgroupfs, v%d): its containers run outside their "
                        "jobs' and pods' cgroups", engine, found or "unknown", cg.version)
    return cg.engine_parent() if _engines[engine] == ("cgroupfs", cg.version) else None


def kernel_oom_kills(engine_parent: str, since_mono: float) -> int:
    """The kernel's OOM kills of processes in cgroups below ``engine_parent`` (a cgroup's path
    as :meth:`Cgroup.engine_parent` names it) since ``since_mono`` (time.monotonic), from its
    log (``/dev/kmsg``, as kubelet's OOM watcher reads it). For an engine's container on v1,
    whose kill the kernel counts in the container's own cgroup, which the engine removes with
    the container before the agent could read it; 0 where the log cannot be read."""
    since_us, below = int(since_mono * 1e6), engine_parent.rstrip("/") + "/"
    kills = 0
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while we read: go on from the next
                    continue
                break
            if not record:
                break
            kills += oom_kill_below(record, below, since_us)
    finally:
        os.close(fd)
    return kills


def oom_kill_below(record: str, below: str, since_us: int) -> bool:
    """Whether a ``/dev/kmsg`` record (``PRI,SEQ,USEC,FLAGS;TEXT``) is the kernel's
    ``oom-kill:`` line for a process whose cgroup (``task_memcg``) is below ``below`` (ending
    in ``/``), logged at ``since_us`` (CLOCK_MONOTONIC microseconds) or later."""
    head, _, text = record.partition(";")
    fields = head.split(",")
    if not text.startswith("oom-kill:") or len(fields) < 3 or not fields[2].isdigit() or int(fields[2]) < since_us:
        return False
    memcg = next((f.removeprefix("task_memcg=") for f in text.strip().split(",") if f.startswith("task_memcg=")), "")
    return memcg.startswith(below)


def write_cgroup_list(jobdir: Path, paths: Iterable[Path]) -> None:
    """``JOBDIR/cgroups``: the run's cgroup directories, one a line (atomically), so whatever
    fences the run without the agent can kill every process in them."""
    tmp = jobdir / f".{CGROUPS_FILE}.tmp"
    tmp.write_text("".join(f"{d}\n" for d in dict.fromkeys(paths)))
    os.replace(tmp, jobdir / CGROUPS_FILE)


def read_cgroup_list(jobdir: Path) -> list[Path]:
    return [Path(p) for p in _read(jobdir / CGROUPS_FILE).split("\n") if p]


def procs_files(cg: Cgroup | None) -> tuple[str, ...]:
    """The ``cgroup.procs`` files a supervisor writes itself into to start its task inside ``cg``
    (``Launch.cgroups``; none when None): joined before the fork, so the task is inside before
    it runs a line, and without a process of its own (a shell cost each launch ~1-10 ms)."""
    return () if cg is None else tuple(str(d / "cgroup.procs") for d in cg.paths)


def close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _mkdir(d: Path) -> None:
    try:
        d.mkdir(exist_ok=True)
    except OSError as e:
        raise CgroupError(e.errno, f"cannot make cgroup {d}: {e.strerror}") from None


def _inherit_cpuset(d: Path) -> None:
    """A new v1 cpuset has no CPUs and no memory nodes (no task may join it): copy the parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        if not _read(d / name).strip():
            _write(d / name, _read(d.parent / name).strip() or "0")


def _freeze(freezer: Path, state: str) -> bool:
    try:
        _write(freezer / "freezer.state", state)
    except CgroupError:
        return False
    if state == "FROZEN":
        for _ in range(200):  # FREEZING until every task has stopped
            if _read(freezer / "freezer.state").strip() == "FROZEN":
                break
            time.sleep(0.001)
    return True


def _kill_each(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Hierarchy:
    """Where this node's job cgroups live and what they can limit (``detect`` finds it)."""

    def __init__(self, version: int, base: dict[str, Path], controllers: tuple[str, ...],
                 dynmods: bool = True) -> None:
        self.version = version
        self.base = base  # controller (v2: "unified") -> shoal/<node> directory
        self.controllers = controllers
        self.dynmods = dynmods  # a hierarchy is mounted with favordynmods (see favors_dynmods)
        self.online_cpus = self._online_cpus()

    def describe(self) -> str:
        where = next(iter(self.base.values()))
        slow = "" if self.dynmods else ("; no cgroup mounted with favordynmods: each job start waits ~10-20 ms "
                                        "for its cgroup migration (docs/CGROUPS.md, \"Cost\")")
        if self.version == 1:
            where = self.base.get("memory", where)
            return (f"cgroup v1 (controllers: {' '.join(self.controllers)}): jobs contained under {where} "
                    f"and its twins{slow}")
        limits = " ".join(self.controllers) or "none delegated: process tracking only"
        return f"cgroup v2 (controllers: {limits}): jobs contained under {where}{slow}"

    def _online_cpus(self) -> list[int]:
        d = self.base.get("cpuset") if self.version == 1 else self.base.get("unified")
        name = "cpuset.cpus" if self.version == 1 else "cpuset.cpus.effective"
        text = _read(d / name) if d is not None else ""
        return parse_cpu_list(text) or list(range(os.cpu_count() or 1))

    def job(self, name: str, limits: Limits) -> Cgroup:
        """Make (or find again) the job's cgroup and set its limits. On v1 only the hierarchies
        with something to limit are used: each one a process joins costs its launch a migration."""
        needed = {"cpuset": limits.cpus is not None, "devices": bool(limits.denied_gpus)}
        cg = Cgroup(self.version, {c: d / name for c, d in self.base.items() if needed.get(c, True)})
        for d in cg.dirs.values():
            _mkdir(d)
        if self.version == 1:
            self._limit_v1(cg, limits)
        else:
            self._limit_v2(cg, limits)
        return cg

    def existing(self, name: str) -> Cgroup:
        """The job's cgroup as found: its directories that exist."""
        return Cgroup(self.version, {c: d / name for c, d in self.base.items() if (d / name).is_dir()})

    def _limit_v1(self, cg: Cgroup, limits: Limits) -> None:
        d = cg.dirs
        if "cpuset" in d:
            _write(d["cpuset"] / "cpuset.cpus", cpu_list_text(limits.cpus) if limits.cpus
                   else _read(d["cpuset"].parent / "cpuset.cpus").strip())
            _write(d["cpuset"] / "cpuset.mems", _read(d["cpuset"].parent / "cpuset.mems").strip() or "0")
        if "memory" in d and limits.memory_bytes:
            _write(d["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes))
            if (d["memory"] / "memory.memsw.limit_in_bytes").exists():  # swap accounting on
                _write(d["memory"] / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if "devices" in d:
            for minor in limits.denied_gpus:
                _write(d["devices"] / "devices.deny", f"c {NVIDIA_MAJOR}:{minor} rwm")

    def _limit_v2(self, cg: Cgroup, limits: Limits) -> None:
        d = cg.dirs["unified"]
        if limits.denied_gpus:  # v2 has no devices.deny: an eBPF device program, as runc's and systemd's
            try:
                deny_devices(d, NVIDIA_MAJOR, limits.denied_gpus)
            except OSError as e:
                raise CgroupError(e.errno, f"{d}: {e.strerror}") from None
        if "cpuset" in self.controllers and limits.cpus:
            _write(d / "cpuset.cpus", cpu_list_text(limits.cpus))
        if "memory" in self.controllers and limits.memory_bytes:
            _write(d / "memory.max", str(limits.memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
        if "memory" in self.controllers or "cpuset" in self.controllers or "pids" in self.controllers:
            enable = " ".join(f"+{c}" for c in self.controllers)
            try:  # steps below it get the same controllers (their usage is read per step)
                _write(d / "cgroup.subtree_control", enable)
            except CgroupError:
                pass


def instance_name(node: str, workdir: Path) -> str:
    """The agent's directory under ``shoal/``: its node's name and a tag of its work dir."""
    import hashlib

    return f"{node}-{hashlib.sha1(str(workdir).encode()).hexdigest()[:8]}"


def detect(mode: str, node: str, mounts: str | None = None, self_cgroup: str | None = None) -> Hierarchy | None:
    """This node's job hierarchy: ``auto`` takes cgroup v1 when its memory controller is
    mounted (hybrid machines), else v2; ``v1``/``v2`` insist; ``off`` (or nothing usable): None.
    Makes ``shoal/<node>`` (an :func:`instance_name`) under the agent's own cgroup in each hierarchy.
    Raises CgroupError when the version asked for is not there."""
    if mode == "off":
        return None
    mounts = _read(Path("/proc/self/mounts")) if mounts is None else mounts
    self_cgroup = _read(Path("/proc/self/cgroup")) if self_cgroup is None else self_cgroup
    v1, v2 = parse_mounts(mounts)
    own_v1, own_v2 = parse_own(self_cgroup)
    if mode in ("auto", "v1") and "memory" in v1 and "freezer" in v1:
        base = {c: where / own_v1.get(c, "/").lstrip("/") / "shoal" / node for c, where in v1.items()}
        for c, d in base.items():
            _makedirs(d, inherit_cpuset=c == "cpuset")
        return Hierarchy(1, base, tuple(c for c in V1_CONTROLLERS if c in base), favors_dynmods(mounts))
    if mode == "v1":
        raise CgroupError(errno.ENOENT, "cgroup v1's memory and freezer controllers are not mounted")
    if v2 is None:
        if mode == "v2":
            raise CgroupError(errno.ENOENT, "no cgroup2 hierarchy is mounted")
        return None
    own = v2 / own_v2.lstrip("/")
    shoal = own / "shoal"
    _makedirs(shoal / node)
    available = set(_read(own / "cgroup.controllers").split())
    wanted = [c for c in V2_CONTROLLERS if c in available]
    enabled = []
    for d in (own, shoal):  # each level hands the controllers down (the agent's own may hold processes)
        for c in wanted:
            try:
                _write(d / "cgroup.subtree_control", f"+{c}")
                if d == shoal:
                    enabled.append(c)
            except CgroupError:
                continue
    try:
        for c in enabled:
            _write(shoal / node / "cgroup.subtree_control", f"+{c}")
    except CgroupError:
        enabled = []
    return Hierarchy(2, {"unified": shoal / node}, tuple(enabled), favors_dynmods(mounts))


def _makedirs(d: Path, inherit_cpuset: bool = False) -> None:
    missing = []
    p = d
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        _mkdir(p)
        if inherit_cpuset:
            _inherit_cpuset(p)


# --------------------------------------------------------------------------- stand-in GPU device nodes


def fake_device_nodes(directory: Path, indices: Iterable[int]) -> Path | None:
    """Stand-ins for fake GPUs' device nodes: ``nvidiaN`` (char 195:N) and ``nvidiactl``
    (195:255) in ``directory``. The NVIDIA driver is absent, so opening an allowed one fails
    with ENXIO, and a denied one with EPERM from the device cgroup: the isolation is real.
    Returns the directory, or None when device nodes cannot be made here (not root)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for index in [*indices, 255]:
            path = directory / ("nvidiactl" if index == 255 else f"nvidia{index}")
            if not path.exists():
                os.mknod(path, 0o666 | 0o020000, os.makedev(NVIDIA_MAJOR, index))
            os.chmod(path, 0o666)
    except OSError as e:
        log.warning("no stand-in GPU device nodes in %s: %s", directory, e.strerror)
        return None
    return directory


# --------------------------------------------------------------------------- the agent's view


class Containment:
    """The agent's cgroups: one per run (``job_<id>.<run>``), limits from its allocation.
    ``hierarchy`` None: jobs run uncontained (said once at start-up)."""

    def __init__(self, hierarchy: Hierarchy | None, node_gpus: Iterable[int] = (), node_cpus: int = 0) -> None:
        self.hierarchy = hierarchy
        self.node_gpus = tuple(node_gpus)
        # A node advertising more CPUs than the machine has (fake nodes sharing one machine)
        # gets no cpusets: its CPUs are fictitious, and pinning by count would only pack real
        # work onto fewer real CPUs than the node's share.
        self.constrain_cores = hierarchy is not None and "cpuset" in hierarchy.controllers and \
            0 < node_cpus <= len(hierarchy.online_cpus)
        self._cpus: dict[str, tuple[int, ...]] = {}  # run key -> its cpuset, while it lives

    def job(self, key: str, memory_mb: int | None, cpus: int, gpus: Iterable[int]) -> Cgroup | None:
        """Make the run's cgroup with its limits; None when uncontained or when it cannot be
        made (logged: the job runs uncontained rather than not at all)."""
        h = self.hierarchy
        if h is None:
            return None
        cpuset = None
        if self.constrain_cores:
            cpuset = pick_cpus(h.online_cpus, _count(self._cpus.values()), cpus)
        try:
            cg = h.job(f"job_{key}", job_limits(memory_mb, cpuset, gpus, self.node_gpus))
        except CgroupError as e:
            log.error("run %s: cannot make its cgroup, it runs uncontained: %s", key, e.strerror)
            return None
        if cpuset is not None:
            self._cpus[key] = cpuset
        return cg

    def pod(self, key: str, spec: dict, gpus: Iterable[int]) -> Cgroup | None:
        """A pod's cgroup, limited by its containers' ``resources.limits`` and its GPUs."""
        gpus = list(gpus)
        memory_mb, cpus = pod_limits(spec, gpus)
        return self.job(key, memory_mb, cpus, gpus)

    def close(self, wait_s: float = 1.0) -> None:
        """Remove this agent's empty cgroups, waiting up to ``wait_s`` for processes just
        killed to go (a busy one, a run left to a later agent, stays)."""
        if self.hierarchy is None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            for d in self.hierarchy.base.values():
                for root, _, _ in sorted(os.walk(d), key=lambda w: -len(w[0])):
                    try:
                        os.rmdir(root)
                    except OSError:
                        pass
            if not any(d.exists() for d in self.hierarchy.base.values()) or time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def existing(self, key: str) -> Cgroup | None:
        """The cgroup an earlier agent made for this run, if it is still there."""
        if self.hierarchy is None:
            return None
        cg = self.hierarchy.existing(f"job_{key}")
        return cg if cg.dirs else None

    def release(self, key: str, cg: Cgroup) -> Usage:
        """Kill what is left in the run's cgroup, wait until it is empty, read its usage and
        remove it."""
        usage = cg.usage()
        self.empty(key, cg)
        return usage

    def empty(self, key: str, cg: Cgroup) -> None:
        """Kill what is left in the run's cgroup, wait until it is empty and remove it."""
        if not cg.kill():
            log.error("run %s: processes still in its cgroup after SIGKILL: %s", key, sorted(cg.pids()))
        cg.remove()
        self._cpus.pop(key, None)


def _count(cpusets: Iterable[tuple[int, ...]]) -> dict[int, int]:
    busy: dict[int, int] = {}
    for s in cpusets:
        for c in s:
            busy[c] = busy.get(c, 0) + 1
    return busy
