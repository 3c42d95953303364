"""A private Slurm cluster on one host for benchmarks: Debian's slurm-wlm, munge, fake GPUs.

Everything lives in one temporary dir: slurm.conf and gres.conf (from the templates next to
this file), munged's socket, the controller's state, each node's spool and the logs. The
daemons run in the foreground as children of this process; ``down()`` stops exactly those
PIDs and nothing else on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template

HERE = Path(__file__).resolve().parent
SBIN = Path("/usr/sbin")
USR_BIN = Path("/usr/bin")
PACKAGES = ("slurm-wlm", "munge")
MUNGE_KEY = Path("/etc/munge/munge.key")


class SlurmSetupError(RuntimeError):
    """Slurm or munge could not be installed, configured or started; the message says which log to read."""


@dataclass(frozen=True)
class Profile:
    """A Slurm configuration to measure: extra slurm.conf lines plus daemon settings."""

    name: str
    conf_file: str  # in bench/slurm/, appended to slurm.conf
    controller_ports: int  # the HTC guide: have slurmctld listen on 2-10 ports
    munge_threads: int  # the HTC guide: munged --num-threads 10 (munged's default is 2)


DEFAULT = Profile("default", "default.conf", controller_ports=1, munge_threads=2)
HTC = Profile("HTC-tuned", "htc.conf", controller_ports=4, munge_threads=10)
PROFILES = (DEFAULT, HTC)


# ---------------------------------------------------------------------- installation


def ensure_installed() -> str:
    """Install Debian's slurm-wlm and munge if any daemon is missing; return what was done."""
    wanted = [SBIN / "slurmctld", SBIN / "slurmd", SBIN / "munged", USR_BIN / "sbatch"]
    if all(p.exists() for p in wanted):
        return "already installed"
    if os.geteuid() != 0:
        raise SlurmSetupError("Slurm is not installed and installing it needs root: "
                              "apt-get install -y slurm-wlm munge")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *PACKAGES]):
        out = subprocess.run(argv, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SlurmSetupError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return "installed by this run (apt-get install slurm-wlm munge)"


def package_version(package: str) -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def slurm_version() -> str:
    out = subprocess.run([str(SBIN / "slurmctld"), "-V"], capture_output=True, text=True)  # sinfo -V needs a config
    return out.stdout.strip() or "unknown"


def multiple_slurmd_supported() -> bool:
    """Several slurmd on one host need a build with --enable-multiple-slurmd, which adds ``-N node``."""
    out = subprocess.run([str(SBIN / "slurmd"), "-h"], capture_output=True, text=True)
    return any(line.strip().startswith("-N ") for line in (out.stdout + out.stderr).splitlines())


def ensure_munge_key() -> None:
    """The Debian package makes a key on install; make one if it is missing (no systemd here)."""
    if MUNGE_KEY.exists():
        return
    MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
    if (SBIN / "mungekey").exists():
        subprocess.run([str(SBIN / "mungekey"), "--create", f"--keyfile={MUNGE_KEY}"], check=True)
    else:
        MUNGE_KEY.write_bytes(os.urandom(1024))
    shutil.chown(MUNGE_KEY, "munge", "munge")
    MUNGE_KEY.chmod(0o400)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive TCP ports free on every address (SlurmctldPort=a-b
    needs a range). slurmctld and slurmd bind the wildcard address, which fails when any
    local address holds the port (a test's agent on 127.0.180.2, say), so the ports are tried
    as they will bind, not on 127.0.0.1 alone; nothing listens on them meanwhile."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SlurmSetupError(f"no {count} consecutive free ports found")


# ---------------------------------------------------------------------- cluster


class SlurmCluster:
    """slurmctld, one slurmd per node (or one node where the build allows only one) and munged."""

    def __init__(self, root: Path, profile: Profile, *, nodes: int, gpus_per_node: int, cpus_per_node: int,
                 memory_mb: int) -> None:
        self.root = root
        self.profile = profile
        self.multiple_slurmd = multiple_slurmd_supported()
        self.nodes = nodes if self.multiple_slurmd else 1
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        self.memory_mb = memory_mb
        self.node_names = [f"node{i:02d}" for i in range(1, self.nodes + 1)]
        self.workdir = root / "work"
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket.2"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SHOAL_"))}
        self.env.update({"SLURM_CONF": str(self.conf),
                         "PATH": f"{USR_BIN}{os.pathsep}{SBIN}{os.pathsep}{self.env.get('PATH', '')}"})
        self.up_s = 0.0

    def bin(self, command: str) -> str:
        """The absolute path of a Slurm command, so a Shoal ``sbatch`` earlier on PATH is never run."""
        return str(USR_BIN / command)

    # ------------------------------------------------------------------ configuration

    def write_config(self) -> None:
        host = socket.gethostname().split(".")[0]
        ctld = free_ports(self.profile.controller_ports)
        ctld_port = str(ctld) if self.profile.controller_ports == 1 else f"{ctld}-{ctld + self.profile.controller_ports - 1}"
        slurmd_base = free_ports(self.nodes)
        # A machine named like one of the nodes (node02) would have two nodes of one host name.
        node_host = "localhost" if host in self.node_names else host
        node_lines = [
            f"NodeName={name} NodeHostname={node_host} NodeAddr=127.0.0.1 Port={slurmd_base + i} "
            f"CPUs={self.cpus_per_node} RealMemory={self.memory_mb} Gres=gpu:{self.gpus_per_node} State=UNKNOWN"
            for i, name in enumerate(self.node_names)
        ]
        gres_lines = [f"NodeName={name} Name=gpu Count={self.gpus_per_node} "
                      f"File={self.fake_gpu_files(name)}/nvidia[0-{self.gpus_per_node - 1}]"
                      for name in self.node_names]
        tuning = (HERE / self.profile.conf_file).read_text()
        fields = {"host": host, "ctld_port": ctld_port, "munge_socket": str(self.munge_socket),
                  "root": str(self.root), "nodes": "\n".join(node_lines), "tuning": tuning}
        self.conf.write_text(Template((HERE / "slurm.conf.in").read_text()).substitute(fields))
        (self.root / "gres.conf").write_text(
            Template((HERE / "gres.conf.in").read_text()).substitute(nodes="\n".join(gres_lines)))
        for d in ("state", "log", "work", *(f"spool/{n}" for n in self.node_names)):
            (self.root / d).mkdir(parents=True, exist_ok=True)

    def fake_gpu_files(self, node: str) -> Path:
        """Stand-ins for /dev/nvidiaN: Slurm 22.05's gres/gpu drops gres.conf lines without File=.

        Each is a character device with /dev/null's numbers (so slurmd's device check passes and
        nothing can be done to a GPU through it); where mknod is refused, an empty plain file,
        which slurmd accepts with an error line in its log.
        """
        d = self.root / "fake-gpus" / node
        d.mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus_per_node):
            path = d / f"nvidia{i}"
            if path.exists():
                continue
            try:
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            except OSError:
                path.touch()
        return d

    # ------------------------------------------------------------------ life cycle

    def _start(self, key: str, argv: list[str], **kw) -> subprocess.Popen:
        log = open(self.root / "log" / f"{key}.stdout", "ab")
        p = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, **kw)
        log.close()
        self.procs[key] = p
        return p

    def _check_alive(self) -> None:
        for key, p in self.procs.items():
            if p.poll() is not None:
                tail = ""
                for f in (self.root / "log" / f"{key}.stdout", self.root / "log" / f"{key}.log"):
                    if f.exists():
                        tail += f.read_text(errors="replace")[-1500:]
                raise SlurmSetupError(f"{key} exited {p.returncode} during start-up (logs in {self.root / 'log'}):\n"
                                      f"{tail}")

    def start_munge(self) -> None:
        ensure_munge_key()
        d = self.munge_socket.parent
        d.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged runs as munge and checks every dir on its paths
        shutil.chown(d, "munge", "munge")
        d.chmod(0o755)
        self._start("munged", [str(SBIN / "munged"), "--foreground", f"--socket={self.munge_socket}",
                               f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'munged.log'}",
                               f"--seed-file={d / 'munged.seed'}", f"--num-threads={self.profile.munge_threads}"],
                    user="munge", group="munge")
        deadline = time.time() + 15
        while not self.munge_socket.exists():
            self._check_alive()
            if time.time() > deadline:
                raise SlurmSetupError(f"munged made no socket at {self.munge_socket} in 15 s")
            time.sleep(0.05)

    def up(self, timeout: float = 60) -> "SlurmCluster":
        t0 = time.perf_counter()
        self.write_config()
        try:
            self.start_munge()
            self._start("slurmctld", [str(SBIN / "slurmctld"), "-D", "-i"])
            for name in self.node_names:
                argv = [str(SBIN / "slurmd"), "-D"] + (["-N", name] if self.multiple_slurmd else [])
                self._start(f"slurmd-{name}", argv)
            deadline = time.time() + timeout
            while self.idle_nodes() < self.nodes:
                self._check_alive()
                if time.time() > deadline:
                    raise SlurmSetupError(f"only {self.idle_nodes()} of {self.nodes} Slurm nodes idle after "
                                          f"{timeout:g} s (logs in {self.root / 'log'})")
                time.sleep(0.2)
        except BaseException:
            self.down()
            raise
        self.up_s = time.perf_counter() - t0
        return self

    def idle_nodes(self) -> int:
        out = subprocess.run([self.bin("sinfo"), "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True,
                             text=True)
        return sum(1 for line in out.stdout.splitlines() if line.split()[-1:] == ["idle"])

    def down(self, timeout: float = 20) -> None:
        """Cancel what is left, then stop exactly the daemons this object started (slurmd first, munged last)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run([self.bin("scancel"), "--user=root"], env=self.env, capture_output=True)
            deadline = time.time() + timeout
            while self.active() and time.time() < deadline:
                time.sleep(0.2)
        order = [k for k in self.procs if k.startswith("slurmd-")] + ["slurmctld", "munged"]
        for group in (order[:-2], order[-2:-1], order[-1:]):
            live = [self.procs[k] for k in group if k in self.procs and self.procs[k].poll() is None]
            for p in live:
                p.send_signal(signal.SIGTERM)
            for p in live:
                try:
                    p.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    # ------------------------------------------------------------------ queries

    def active(self, name: str | None = None) -> int:
        """Jobs pending, running or completing (squeue's default states), optionally of one name."""
        argv = [self.bin("squeue"), "-h", "-o", "%i"] + (["-n", name] if name else [])
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SlurmSetupError(f"squeue exited {out.returncode}: {out.stderr.strip()}")
        return len(out.stdout.splitlines())

    def cancel(self, name: str) -> None:
        subprocess.run([self.bin("scancel"), "-n", name], env=self.env, capture_output=True)
