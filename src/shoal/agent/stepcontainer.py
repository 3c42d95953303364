"""Job steps in containers, as Pyxis runs them through Enroot: one container per step on a
node (or one per ``--container-name``, kept for the job), the step's tasks started in it.

``Container`` is the one description of a container; each runtime turns it into argv
lists (``create``, ``task``, ``remove``) and never joins them into a shell string.
``ImageCache`` pulls an image once per node (one lock per image: eight tasks starting at
once pull once), keeps when each was last used, and evicts the least recently used ones
over the node's size limit; a registry login (the user's Enroot ``.credentials``) reaches
the runtime in a file only root reads, never on a command line. ``StepContainers`` is what
the step server calls; ``save`` carries out ``--container-save``.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.agent.cgroups import Cgroup
from shoal.model.container import ImageRef, Mount, image_ref, parse_credentials, registry_of, rewrite

log = logging.getLogger("shoal.agent")

PAUSE = "/.shoal/pause"  # where the keeper's pause process (catatonit -P) is mounted in a podman container
PULL_TIMEOUT_S = 600.0


class ContainerStartError(Exception):
    """The step's container cannot be had; the text is the runtime's own message."""


@dataclass(frozen=True)
class Container:
    """One container as every runtime needs it described.

    ``user`` is (uid, gid) inside the container (0, 0 with remap-root, when ``host_user``
    says whose files root's are on the host); ``gpus`` are the node's GPU indices, handed
    to the runtime by CDI name; ``network`` is always the host's, as Pyxis leaves it.
    """

    name: str
    image: str  # the runtime's reference: a registry reference, a local image or an image file
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None
    user: tuple[int, int] | None = None
    host_user: tuple[int, int] | None = None  # remap-root: container root is this user on the host
    gpus: tuple[int, ...] = ()
    cdi_kind: str = "nvidia.com/gpu"  # the CDI kind naming ``gpus`` (cdi.py)
    writable: bool = True
    entrypoint: tuple[str, ...] = ()  # the image's ENTRYPOINT, run before a task's command (--container-entrypoint)
    labels: dict[str, str] = field(default_factory=dict)
    insecure: bool = False  # the registry speaks plain HTTP
    cgroup_parent: str | None = None  # the job's (or step's) cgroup, so the container is inside it


class StepRuntime:
    """How one engine pulls, creates, enters and removes a container."""

    name = ""
    binary = ""

    def available(self) -> bool:
        return shutil.which(self.binary) is not None

    def cgroups(self) -> tuple[str, int] | None:
        """The engine's cgroup manager and cgroup version (``("cgroupfs", 1)``), when its
        containers can be made in a cgroup of ours; None for engines that make none."""
        return None

    def pull(self, ref: str, insecure: bool, dest: Path, auth: Path | None = None) -> list[str]:
        """The argv that pulls ``ref``; ``auth`` is a folder of login files (write_auth) for it."""
        raise NotImplementedError

    def pull_env(self, auth: Path | None) -> dict[str, str]:
        """Variables the pull needs besides the agent's own (where a runtime reads its login)."""
        return {}

    def save(self, c: Container, image: CachedImage | None, path: str) -> list[list[str]]:
        """The argvs that write the container's file system to the image file ``path``
        (``--container-save``), in order."""
        raise ContainerStartError(f"{self.name} cannot save a container (--container-save)")

    def save_cleanup(self, c: Container) -> list[str] | None:
        """The argv that removes what ``save`` left behind, run whether it succeeded or not."""
        return None

    def create(self, c: Container) -> list[str] | None:
        """The argv that starts the container for its tasks (None: each task starts its own)."""
        return None

    def task(self, c: Container, env_names: list[str], workdir: str, argv: list[str]) -> list[str]:
        """The argv that runs one task's ``argv`` in the container, its environment taken by
        name from the runtime process's own (no value is ever on a command line)."""
        raise NotImplementedError

    def remove(self, c: Container) -> list[str] | None:
        return None


class PodmanSteps(StepRuntime):
    """podman: a keeper container (``catatonit -P`` from the host, so any image works) on
    the host network, the step's tasks run in it by ``podman exec``, as Pyxis' tasks join
    one container."""

    name = "podman"
    binary = "podman"

    def pull(self, ref, insecure, dest, auth=None):
        return [self.binary, "pull", "--quiet", *(["--tls-verify=false"] if insecure else []),
                *(["--authfile", str(auth / "auth.json")] if auth else []), ref]

    def save(self, c, image, path):
        """An OCI archive (what ``--container-image=FILE`` loads) of the container as it is,
        with the image's own ENTRYPOINT back in place of the keeper's."""
        tag = f"localhost/pyxis-save/{c.name.lower()}:latest"
        entry = json.dumps(image.entrypoint if image is not None else [])
        return [[self.binary, "commit", "--quiet", "--change", f"ENTRYPOINT {entry}", c.name, tag],
                [self.binary, "save", "--quiet", "--format", "oci-archive", "--output", path, tag]]

    def save_cleanup(self, c):
        return [self.binary, "rmi", "--force", f"localhost/pyxis-save/{c.name.lower()}:latest"]

    _INFO = "{{.Host.CgroupManager}} {{.Host.CgroupsVersion}}"

    def cgroups(self):
        out = subprocess.run([self.binary, "info", "--format", self._INFO], capture_output=True, text=True,
                             timeout=60)
        manager, _, version = out.stdout.strip().partition(" ")
        return (manager, int(version.lstrip("v"))) if out.returncode == 0 and version.lstrip("v").isdigit() else None

    def create(self, c):
        argv = [self.binary, "run", "--detach", "--name", c.name, "--network", "host", "--pull", "never"]
        if c.cgroup_parent:
            argv += ["--cgroup-parent", c.cgroup_parent]
        for k, v in sorted(c.labels.items()):
            argv += ["--label", f"{k}={v}"]
        if c.host_user is not None:
            uid, gid = c.host_user
            argv += ["--uidmap", f"0:{uid}:1", "--gidmap", f"0:{gid}:1"]
        if c.user is not None:
            argv += ["--user", f"{c.user[0]}:{c.user[1]}"]
        if not c.writable:
            argv.append("--read-only")
        for m in c.mounts:
            argv += ["--mount", self.mount(m)]
        for g in c.gpus:
            argv += ["--device", f"{c.cdi_kind}={g}"]
        pause = shutil.which("catatonit") or "/usr/libexec/podman/catatonit"
        argv += ["--mount", f"type=bind,source={pause},destination={PAUSE},ro=true",
                 "--entrypoint", json.dumps([PAUSE, "-P"]), c.image]
        return argv

    @staticmethod
    def mount(m: Mount) -> str:
        if m.source == "tmpfs":
            return f"type=tmpfs,destination={m.target}"
        spec = f"type=bind,source={m.source},destination={m.target}"
        if m.readonly:
            spec += ",ro=true"
        propagation = [f for f in m.flags if f.endswith(("private", "shared", "slave"))]
        if propagation:
            spec += f",bind-propagation={propagation[-1]}"
        return spec

    def task(self, c, env_names, workdir, argv):
        out = [self.binary, "exec", "--workdir", workdir]
        if c.user is not None:
            out += ["--user", f"{c.user[0]}:{c.user[1]}"]
        for name in env_names:
            out += ["--env", name]
        return [*out, c.name, *c.entrypoint, *argv]

    def remove(self, c):
        return [self.binary, "rm", "--force", "--time", "0", "--ignore", c.name]


class DockerSteps(PodmanSteps):
    """docker: as podman, GPUs through the NVIDIA runtime's ``--gpus`` (its value carries
    double quotes, as docker reads it as CSV)."""

    name = "docker"
    binary = "docker"
    _INFO = "{{.CgroupDriver}} {{.CgroupVersion}}"

    def pull(self, ref, insecure, dest, auth=None):
        # Insecure registries are the daemon's setting; the login is config.json in --config's folder.
        return [self.binary, *(["--config", str(auth)] if auth else []), "pull", "--quiet", ref]

    def save(self, c, image, path):
        argv = super().save(c, image, path)
        argv[1] = [a for a in argv[1] if a not in ("--format", "oci-archive")]  # docker save: its own format
        return argv

    def create(self, c):
        argv = super().create(c)
        argv = [a for a in argv if a not in ("--pull", "never")]  # docker run has no --pull never
        devices = [i for i, a in enumerate(argv) if a == "--device"]
        for i in reversed(devices):
            del argv[i:i + 2]
        if c.gpus:
            at = argv.index("--entrypoint")
            argv[at:at] = ["--gpus", '"device=' + ",".join(str(g) for g in c.gpus) + '"']
        return argv

    def remove(self, c):
        return [self.binary, "rm", "--force", c.name]


class EnrootSteps(StepRuntime):
    """Enroot as Pyxis drives it: ``import`` into the node's cache (a squashfs), ``create``
    the container's root filesystem once, ``start`` each task in it."""

    name = "enroot"
    binary = "enroot"

    def pull(self, ref, insecure, dest, auth=None):
        registry, _, rest = ref.partition("/")
        return [self.binary, "import", "--output", str(dest), f"docker://{registry}#{rest}"]

    def pull_env(self, auth):
        return {"ENROOT_CONFIG_PATH": str(auth)} if auth else {}  # its .credentials

    def save(self, c, image, path):
        return [[self.binary, "export", "--force", "--output", path, c.name]]  # a squashfs, as Pyxis'

    def create(self, c):
        return [self.binary, "create", "--force", "--name", c.name, c.image]

    def task(self, c, env_names, workdir, argv):
        out = [self.binary, "start"]
        if c.host_user is not None:
            out.append("--root")
        if c.writable:
            out.append("--rw")
        for m in c.mounts:
            flags = ",".join(("rbind", *m.flags)) if m.source != "tmpfs" else "x-create=dir"
            out += ["--mount", f"{m.source}:{m.target}:none:{flags}" if m.source != "tmpfs"
                    else f"tmpfs:{m.target}:tmpfs:{flags}"]
        for name in env_names:
            out += ["--env", name]
        # No workdir flag: Enroot's rc enters $PWD, the directory the runtime process starts
        # in (StepContainer.cwd), as Pyxis' tasks start in theirs.
        return [*out, c.name, *c.entrypoint, *argv]

    def remove(self, c):
        return [self.binary, "remove", "--force", c.name]


class ApptainerSteps(StepRuntime):
    """apptainer: the image built once into the node's cache (a SIF), each task ``exec``'d
    in it; ``--nv`` binds the GPUs, CUDA_VISIBLE_DEVICES picks the task's."""

    name = "apptainer"
    binary = "apptainer"

    def pull(self, ref, insecure, dest, auth=None):
        return [self.binary, "pull", *(["--nohttps"] if insecure else []), str(dest), f"docker://{ref}"]

    def pull_env(self, auth):
        if not auth:
            return {}
        login, _, password = (auth / "login").read_text().partition("\n")
        return {"APPTAINER_DOCKER_USERNAME": login, "APPTAINER_DOCKER_PASSWORD": password}

    def task(self, c, env_names, workdir, argv):
        out = [self.binary, "exec", "--cleanenv", "--pwd", workdir]
        if c.gpus:
            out.append("--nv")
        if c.writable:
            out.append("--writable-tmpfs")
        if c.host_user is not None:
            out.append("--fakeroot")
        for m in c.mounts:
            out += ["--bind", f"{m.source}:{m.target}" + (":ro" if m.readonly else "")]
        # --cleanenv: only the task's variables, which apptainer takes as APPTAINERENV_<NAME>
        return [*out, c.image, *c.entrypoint, *argv]

    def remove(self, c):
        return None


STEP_RUNTIMES: dict[str, type[StepRuntime]] = {
    r.name: r for r in (PodmanSteps, DockerSteps, EnrootSteps, ApptainerSteps)
}


# ---------------------------------------------------------------- image cache


@dataclass
class CachedImage:
    ref: str
    id: str  # the engine's image id (a content digest) or the image file's path
    size: int
    env: dict[str, str]
    entrypoint: list[str]
    last_used: float


def _image_of(doc: dict) -> CachedImage:
    """An index entry as a CachedImage (less the entry's own keys: private, users, source)."""
    return CachedImage(**{k: v for k, v in doc.items() if k in CachedImage.__dataclass_fields__})


class ImageCache:
    """The node's images, pulled once each: ``index.json`` keeps, per reference, its id,
    size, environment, entrypoint and last use; ``locks/`` holds one lock per image, so
    concurrent tasks and steps wait for one pull instead of starting their own."""

    def __init__(self, runtime: StepRuntime, root: Path, limit_mb: int = 0, clock=time.time) -> None:
        self.runtime = runtime
        self.root = root
        self.limit = limit_mb * 1024 * 1024
        self.clock = clock
        (root / "locks").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # the index file, within this agent

    def _index(self) -> dict[str, dict]:
        try:
            return json.loads((self.root / "index.json").read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, index: dict) -> None:
        tmp = self.root / "index.json.tmp"
        tmp.write_text(json.dumps(index, indent=1))
        tmp.replace(self.root / "index.json")

    def images(self) -> list[CachedImage]:
        """What the node holds, most recently used first."""
        return sorted((_image_of(doc) for doc in self._index().values()), key=lambda i: -i.last_used)

    def get(self, ref: str, insecure: bool, login: tuple[str, str] | None = None,
            user: int | None = None, refresh: bool = False) -> CachedImage:
        """The image, pulled now unless the node has it; ContainerStartError with the
        runtime's message when it cannot be pulled.

        ``login`` is the requester's (user, password) for the image's registry. An image
        that needed one is private: a user it was not pulled or checked for pulls it again
        with their own login (layers the node has are not fetched again), so the shared
        cache never hands one user's private image to another whom the registry refuses.
        ``refresh`` pulls even what the node has (imagePullPolicy Always: a moved tag).
        """
        key = hashlib.sha256(ref.encode()).hexdigest()[:32]
        with open(self.root / "locks" / key, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with self._lock:
                doc = self._index().get(ref)
            private = doc is not None and doc.get("private")
            if refresh or doc is None or not self._present(doc) or (private and user not in doc.get("users", [])):
                users = doc.get("users", []) if doc is not None else []
                doc = self._pull(ref, insecure, key, login).__dict__
                if login is not None:
                    doc["private"], doc["users"] = True, sorted({*users, user})
            with self._lock:
                index = self._index()
                doc["last_used"] = self.clock()
                index[ref] = doc
                self._save(index)
        self.evict(keep=ref)
        return _image_of(doc)

    def lookup(self, key: str) -> dict | None:
        with self._lock:
            return self._index().get(key)

    def adopt(self, key: str, image: CachedImage, source: str) -> CachedImage:
        """An image that came from elsewhere (a file loaded into the engine) kept in the index
        under ``key`` like a pulled one, so the size limit evicts it too."""
        with self._lock:
            index = self._index()
            doc = {**image.__dict__, "ref": key, "last_used": self.clock(), "source": source}
            index[key] = doc
            self._save(index)
        self.evict(keep=key)
        return _image_of(doc)

    def present(self, doc: dict) -> bool:
        return self._present(doc)

    def _present(self, doc: dict) -> bool:
        if self.runtime.name in ("podman", "docker"):
            return subprocess.run([self.runtime.binary, "image", "exists" if self.runtime.name == "podman"
                                   else "inspect", doc["id"]], capture_output=True).returncode == 0
        return Path(doc["id"]).exists()

    def _pull(self, ref: str, insecure: bool, key: str, login: tuple[str, str] | None = None) -> CachedImage:
        dest = self.root / f"{key}.{'sif' if self.runtime.name == 'apptainer' else 'sqsh'}"
        with tempfile.TemporaryDirectory(prefix="auth-", dir=self.root) as tmp:
            auth = write_auth(Path(tmp), registry_of(ref), login) if login is not None else None
            argv = self.runtime.pull(ref, insecure, dest, auth)
            env = {**os.environ, **self.runtime.pull_env(auth)}
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=PULL_TIMEOUT_S, env=env)
            except subprocess.TimeoutExpired:
                raise ContainerStartError(f"pulling {ref} took over {PULL_TIMEOUT_S:.0f} s") from None
        if out.returncode != 0:
            raise ContainerStartError(_last_lines(out.stderr or out.stdout)
                                      or f"{argv[0]} exited {out.returncode} pulling {ref}")
        if self.runtime.name not in ("podman", "docker"):
            return CachedImage(ref, str(dest), dest.stat().st_size, {}, [], self.clock())
        image = inspect_image(self.runtime.binary, ref, self.clock())
        if image is None:
            raise ContainerStartError(f"{ref} was pulled but {self.runtime.binary} cannot inspect it")
        return image

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove the least recently used images while the cache is over its limit (never
        ``keep``, nor one that a container still uses: the engine refuses, and it stays)."""
        if not self.limit:
            return []
        removed = []
        with self._lock:
            index = self._index()
            total = sum(d["size"] for d in index.values())
            for ref, doc in sorted(index.items(), key=lambda kv: kv[1]["last_used"]):
                if total <= self.limit:
                    break
                if ref == keep:
                    continue
                if self.runtime.name in ("podman", "docker"):
                    gone = subprocess.run([self.runtime.binary, "rmi", doc["id"]], capture_output=True).returncode == 0
                else:
                    if not ref.startswith("file:"):  # the cache's own file, never a user's image file
                        Path(doc["id"]).unlink(missing_ok=True)
                    gone = True
                if gone:
                    total -= doc["size"]
                    del index[ref]
                    removed.append(ref)
            self._save(index)
        return removed


def write_auth(folder: Path, registry: str, login: tuple[str, str]) -> Path:
    """A registry login in each runtime's own file, in ``folder`` (root's alone): podman's
    auth.json, docker's config.json (the same document), Enroot's netrc ``.credentials``
    and a plain one for apptainer's variables."""
    folder.chmod(0o700)
    user, password = login
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    doc = json.dumps({"auths": {registry: {"auth": token}}})
    for name, text in (("auth.json", doc), ("config.json", doc),
                       (".credentials", f"machine {registry} login {user} password {password}\n"),
                       ("login", f"{user}\n{password}")):
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return folder


def read_user_credentials(env: dict[str, str], home: str | None, uid: int) -> dict[str, tuple[str, str]]:
    """The job user's Enroot credentials, ``$ENROOT_CONFIG_PATH/.credentials`` (Enroot's
    default: ``$XDG_CONFIG_HOME/enroot``, ``~/.config/enroot``). The agent runs as root: the
    file must be the user's own (a link to a file of root's is not followed, and one owned
    by another is not read), so no job can make the agent send a file it cannot read itself."""
    config = env.get("ENROOT_CONFIG_PATH") or (
        os.path.join(env["XDG_CONFIG_HOME"], "enroot") if env.get("XDG_CONFIG_HOME")
        else os.path.join(home, ".config", "enroot") if home else None)
    if not config:
        return {}
    try:
        fd = os.open(os.path.join(config, ".credentials"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != uid or not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
            return {}
        return parse_credentials(f.read().decode(errors="replace"))


def inspect_image(binary: str, ref: str, now: float) -> CachedImage | None:
    """What podman or docker knows of an image in its store (None: it has none by that name)."""
    out = subprocess.run([binary, "image", "inspect", ref], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    doc = json.loads(out.stdout)[0]
    config = doc.get("Config") or {}
    return CachedImage(ref, doc["Id"], int(doc.get("Size") or 0),
                       dict(v.split("=", 1) for v in config.get("Env") or [] if "=" in v),
                       list(config.get("Entrypoint") or []), now)


def _is_squashfs_or_sif(path: str) -> bool:
    """By the file's magic, not its name: ``--container-save=x.sqsh`` under podman writes an
    OCI archive, which podman then loads by that same name."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return head[:4] in (b"hsqs", b"sqsh") or b"SIF_MAGIC" in head


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-n:])


# ---------------------------------------------------------------- the agent's side


@dataclass(frozen=True)
class Settings:
    """The cluster's container settings (config.ContainersConfig), as the server hands them over."""

    registry_mirrors: dict[str, str] = field(default_factory=dict)
    insecure_registries: tuple[str, ...] = ()
    image_cache_mb: int = 0

    @classmethod
    def from_json(cls, doc: dict | None) -> Settings:
        doc = doc or {}
        return cls(dict(doc.get("registry_mirrors") or {}), tuple(doc.get("insecure_registries") or ()),
                   int(doc.get("image_cache_mb") or 0))


@dataclass(frozen=True)
class OCIHandle:
    """A podman container entered with its OCI runtime's own ``exec`` (runc, crun): the
    task's process (argv, environment, directory, user) in a file only root reads, so no
    value is on a command line; ``files`` is the step's folder of them."""

    binary: str
    root: str
    id: str
    files: Path

    def exec_argv(self, c: Container, env: dict[str, str], workdir: str, argv: list[str], seq: int) -> list[str]:
        uid, gid = c.user if c.user is not None else (0, 0)
        process = {"terminal": False, "user": {"uid": uid, "gid": gid}, "args": argv, "cwd": workdir,
                   "env": [f"{k}={v}" for k, v in env.items()], "noNewPrivileges": uid != 0}
        if uid == 0:  # root inside keeps what podman gives its own processes
            caps = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_NET_BIND_SERVICE",
                    "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT"]
            process["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
        self.files.mkdir(mode=0o700, exist_ok=True)
        path = self.files / f"task-{seq}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(process, f)
        return [self.binary, "--root", self.root, "exec", "--process", str(path), self.id]


@dataclass
class StepContainer:
    """A step's container on this node, ready for its tasks."""

    container: Container
    runtime: StepRuntime
    image_env: dict[str, str]
    keep_env: tuple[str, ...]  # --container-env: the host's value wins over the image's
    named: bool
    oci: OCIHandle | None = None  # enter through the OCI runtime itself (podman's exec costs 5x)
    image: CachedImage | None = None
    _seq: itertools.count = field(default_factory=itertools.count)

    def task_argv(self, env: dict[str, str], workdir: str, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        """A task's argv and the runtime process's environment: the job's variables, less
        those the image sets itself (Pyxis: the image's values win) unless --container-env
        names them."""
        mine = {k: v for k, v in env.items() if k not in self.image_env or k in self.keep_env}
        if "PYTORCH_VERSION" in self.image_env:
            # Pyxis' PyTorch set-up for images that say they hold PyTorch (NGC's do):
            # torch.distributed's env:// ranks from Slurm's.
            for theirs, torchs in (("SLURM_PROCID", "RANK"), ("SLURM_LOCALID", "LOCAL_RANK")):
                if theirs in env:
                    mine[torchs] = env[theirs]
        if self.container.gpus and mine.get("CUDA_VISIBLE_DEVICES"):
            # CDI hands the container only these GPUs, which CUDA numbers from 0 there.
            where = {str(g): str(i) for i, g in enumerate(self.container.gpus)}
            local = ",".join(where.get(g, g) for g in mine["CUDA_VISIBLE_DEVICES"].split(","))
            mine["CUDA_VISIBLE_DEVICES"] = mine["GPU_DEVICE_ORDINAL"] = local
        if self.oci is not None:
            return self.oci.exec_argv(self.container, {**self.image_env, **mine}, workdir,
                                      [*self.container.entrypoint, *argv], next(self._seq)), \
                {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        proc_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **mine}
        if self.runtime.name == "apptainer":
            proc_env.update({f"APPTAINERENV_{k}": v for k, v in mine.items()})
        return self.runtime.task(self.container, sorted(mine), workdir, argv), proc_env


class StepContainers:
    """The node's container runtime for job steps, its image cache and its settings."""

    def __init__(self, runtime: str, node: str, workdir: Path) -> None:
        self.node = node
        cls = STEP_RUNTIMES.get(runtime)
        self.runtime = cls() if cls is not None else None
        self.settings = Settings()
        self.cache = ImageCache(self.runtime, workdir / "images") if self.runtime is not None else None
        self.root = workdir / "containers"
        self.root.mkdir(parents=True, exist_ok=True)
        # Names unique on the host: test clusters share one podman store, and number jobs alike.
        self.tag = hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:8]
        self.cdi_kind: str | None = None  # set once the node's GPUs have a CDI specification (cdi.py)
        self._engine_cgroups: tuple[str, int] | None | bool = False  # the engine's, once asked (False: not yet)
        self._lock = threading.Lock()
        self._unnamed: dict[int, set[str]] = {}  # job id -> its steps' containers not yet removed

    def image_list(self) -> list[dict] | None:
        """The node's cached images as Kubernetes' node.status.images names them (reference,
        then the engine's id), most recently used first; None on a node with no runtime."""
        if self.cache is None:
            return None
        def digest(i: CachedImage) -> list[str]:
            hexid = i.id.removeprefix("sha256:")
            return [f"sha256:{hexid}"] if len(hexid) == 64 and all(c in "0123456789abcdef" for c in hexid) else []

        return [{"names": [i.ref, *digest(i)], "sizeBytes": i.size, "lastUsed": round(i.last_used, 3)}
                for i in self.cache.images()]

    def configure(self, settings: Settings) -> None:
        self.settings = settings
        if self.cache is not None:
            self.cache.limit = settings.image_cache_mb * 1024 * 1024

    def start(self, request: dict, *, job_id: int, step_id: int, user: tuple[int, int], home: str | None,
              cwd: str, gpus: list[int], env: dict[str, str] | None = None,
              cgroups: tuple[Cgroup | None, Cgroup | None] = (None, None)) -> StepContainer:
        """The step's container on this node, created (or, named, found) and running;
        ``env`` is the step's environment (where the user's Enroot credentials are). It is
        made inside the step's cgroup (a named one, kept for the job: the job's) of
        ``cgroups`` (job, step), so the job's memory limit and its end's kill hold for it too."""
        rt = self.runtime
        if rt is None:
            raise ContainerStartError(f"no container runtime on node {self.node} (its agent runs with --runtime "
                                      f"process); --container-image needs podman, enroot, apptainer or docker")
        if not rt.available():
            raise ContainerStartError(f"{rt.binary}: command not found on node {self.node}")
        name = (request.get("name") or "").partition(":")[0]  # Pyxis' :auto|create|exec flags: as auto
        cname = f"pyxis_{job_id}_{name}_{self.tag}" if name else f"shoal_{job_id}.{step_id}_{self.node}_{self.tag}"
        with open(self.root / f"{cname}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # steps sharing a named container create it once
            if name and self._running(cname):
                image = self._named_image(cname)
            else:
                image = self._image(request, read_user_credentials(env or {}, home, user[0]), user[0], cwd)
            image_env = image.env if image is not None else {}
            entry = tuple(image.entrypoint) if image is not None and request.get("entrypoint") else ()
            mounts = self._mounts(request, home, cwd)
            remap = bool(request.get("remap_root"))
            c = Container(
                name=cname, image=image.id if image is not None else "", mounts=tuple(mounts),
                user=(0, 0) if remap else user, host_user=user if remap and user != (0, 0) else None,
                gpus=tuple(gpus) if self.cdi_kind else (), cdi_kind=self.cdi_kind or "",
                writable=request.get("writable", True) is not False,
                entrypoint=entry, labels={"shoal.job": str(job_id)},
                cgroup_parent=self._parent(cgroups[0] if name else cgroups[1] or cgroups[0]),
            )
            if not (name and self._running(cname)):
                self._create(c)
                if name:
                    (self.root / f"{cname}.json").write_text(json.dumps({"image": image.__dict__}))
        if not name:
            with self._lock:
                self._unnamed.setdefault(job_id, set()).add(cname)
        files = self.root / f"{cname}.{step_id}.tasks"
        return StepContainer(c, rt, image_env, tuple(request.get("env") or ()), bool(name),
                             self._oci(cname, files), image=image)

    def _parent(self, cg: Cgroup | None) -> str | None:
        """``cg`` as the engine's --cgroup-parent; None (with a warning, once) when the engine
        cannot make its containers there: another cgroup manager (systemd takes slices, not
        paths) or version than the agent's."""
        if cg is None or self.runtime is None:
            return None
        if self._engine_cgroups is False:
            try:
                self._engine_cgroups = self.runtime.cgroups()
            except (OSError, subprocess.SubprocessError):
                self._engine_cgroups = None
            engine = self._engine_cgroups
            if self.runtime.name in ("podman", "docker") and (not isinstance(engine, tuple) or engine != (
                    "cgroupfs", cg.version)):
                log.warning("%s's cgroups (%s) are not the agent's (cgroupfs, v%d): container steps run outside "
                            "their job's cgroup", self.runtime.binary, engine or "unknown", cg.version)
        if self._engine_cgroups != ("cgroupfs", cg.version):
            return None
        return cg.engine_parent()

    def _image(self, request: dict, credentials: dict[str, tuple[str, str]], uid: int, cwd: str):
        ref = image_ref(request["image"])
        if ref.kind == "file" and not ref.ref.startswith("/"):
            ref = ImageRef("file", os.path.normpath(os.path.join(cwd, ref.ref)))  # the step's directory
        if ref.kind == "registry":
            pulled = rewrite(ref.ref, self.settings.registry_mirrors)
            registry = registry_of(pulled)
            # The login of the registry pulled from (a mirror's own, not the name it stands for).
            return self.cache.get(pulled, insecure=registry in self.settings.insecure_registries,
                                  login=credentials.get(registry), user=uid)
        return self._local(ref)

    def _local(self, ref: ImageRef) -> CachedImage:
        """An image file on the node, or one already in the engine's store (podman://, dockerd://)."""
        engine = self.runtime.name in ("podman", "docker")
        name = ref.ref
        if ref.kind == "file":
            if not os.path.exists(ref.ref):
                raise ContainerStartError(f"image file {ref.ref} does not exist on node {self.node}")
            if not engine:
                return CachedImage(ref.ref, ref.ref, os.path.getsize(ref.ref), {}, [], time.time())
            if _is_squashfs_or_sif(ref.ref):
                raise ContainerStartError(f"{ref.ref}: {self.runtime.name} cannot run a squashfs or SIF image "
                                          f"(an OCI or Docker archive, .tar, can)")
            st = os.stat(ref.ref)
            key, source = f"file:{ref.ref}", f"{st.st_mtime_ns}:{st.st_size}"
            known = self.cache.lookup(key)
            if known is not None and known.get("source") == source and self.cache.present(known):
                return self.cache.adopt(key, _image_of(known), source)  # loaded before, unchanged since
            out = subprocess.run([self.runtime.binary, "load", "--quiet", "--input", ref.ref],
                                 capture_output=True, text=True, timeout=PULL_TIMEOUT_S)
            if out.returncode != 0:
                raise ContainerStartError(_last_lines(out.stderr) or f"cannot load {ref.ref}")
            name = out.stdout.strip().rpartition("Loaded image: ")[2].split(",")[0].strip()
            loaded = inspect_image(self.runtime.binary, name, time.time())
            if loaded is None:
                raise ContainerStartError(f"{ref.ref} was loaded but {self.runtime.binary} cannot inspect it")
            # In the node's cache (its LRU eviction), by the file's path: the image's own name
            # (a saved container's) would be taken again by the next file saved from it.
            return self.cache.adopt(key, loaded, source)
        elif ref.kind != {"podman": "podman", "docker": "dockerd"}.get(self.runtime.name):
            raise ContainerStartError(f"{ref.kind}:// images are in another engine's store; "
                                      f"node {self.node} runs {self.runtime.name}")
        image = inspect_image(self.runtime.binary, name, time.time())
        if image is None:
            raise ContainerStartError(f"no image {name} in {self.runtime.name} on node {self.node}")
        return image

    def _named_image(self, cname: str):
        try:
            return CachedImage(**json.loads((self.root / f"{cname}.json").read_text())["image"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _mounts(self, request: dict, home: str | None, cwd: str) -> list[Mount]:
        """--container-mounts, then the user's home (unless --no-container-mount-home) and
        the task's directory (Shoal mounts it, as sites' Enroot mount files mount the
        shared file systems jobs are submitted from)."""
        mounts = []
        for doc in request.get("mounts") or []:
            m = Mount.from_json(doc)
            source = m.source if m.source in ("tmpfs", "umount") else os.path.normpath(os.path.join(cwd, m.source))
            target = os.path.normpath(os.path.join(cwd, m.target))
            if m.source not in ("tmpfs", "umount") and not os.path.exists(source):
                raise ContainerStartError(f"--container-mounts: {source}: no such file or directory on {self.node}")
            mounts.append(Mount(source, target, m.flags))
        taken = {m.target for m in mounts}
        if request.get("mount_home", True) and home and os.path.isdir(home) and home not in taken and home != "/":
            mounts.append(Mount(home, home))
            taken.add(home)
        if cwd and cwd != "/" and os.path.isdir(cwd) and cwd not in taken \
                and not (home and cwd.startswith(home.rstrip("/") + "/") and home in taken):
            mounts.append(Mount(cwd, cwd))
        return mounts

    def _running(self, cname: str) -> bool:
        if self.runtime.name not in ("podman", "docker"):
            return (self.root / f"{cname}.json").exists()
        out = subprocess.run([self.runtime.binary, "inspect", "--format", "{{.State.Running}}", cname],
                             capture_output=True, text=True)
        return out.returncode == 0 and out.stdout.strip() == "true"

    def _create(self, c: Container) -> None:
        argv = self.runtime.create(c)
        if argv is None:
            return
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        remove = self.runtime.remove(c)
        if out.returncode != 0 and remove and "already in use" in out.stderr:
            # One left by an agent that died mid-step (names are unique per job and step).
            subprocess.run(remove, capture_output=True)
            out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise ContainerStartError(_last_lines(out.stderr or out.stdout) or f"{argv[0]} exited {out.returncode}")

    def _oci(self, cname: str, step_files: Path) -> OCIHandle | None:
        """podman's container as its OCI runtime knows it (rootful podman keeps runc's and
        crun's state under /run/<runtime>); None where tasks go through ``podman exec``."""
        if self.runtime.name != "podman" or os.geteuid() != 0:
            return None
        out = subprocess.run([self.runtime.binary, "inspect", "--format", "{{.Id}} {{.OCIRuntime}}", cname],
                             capture_output=True, text=True)
        cid, _, oci = out.stdout.strip().partition(" ")
        binary = shutil.which(oci) if oci in ("runc", "crun") else None
        if out.returncode != 0 or binary is None or not os.path.isdir(f"/run/{oci}/{cid}"):
            return None
        return OCIHandle(binary, f"/run/{oci}", cid, step_files)

    def save(self, sc: StepContainer, path: str, cwd: str, user: tuple[int, int]) -> str:
        """``--container-save=PATH`` after the node's tasks have ended: the container's file
        system as an image file at PATH (relative to the step's directory, as Pyxis takes it),
        written as the job's user (who must be able to write there) by a rename, so a step
        reading it meanwhile sees the old file or the new one. Returns the path written."""
        target = os.path.normpath(path if path.startswith("/") else os.path.join(cwd, path))
        with tempfile.TemporaryDirectory(prefix="save-", dir=self.root) as tmp:
            made = os.path.join(tmp, "image")
            try:
                for argv in self.runtime.save(sc.container, sc.image, made):
                    out = subprocess.run(argv, capture_output=True, text=True, timeout=PULL_TIMEOUT_S)
                    if out.returncode != 0:
                        raise ContainerStartError(_last_lines(out.stderr or out.stdout)
                                                  or f"{argv[0]} exited {out.returncode}")
            finally:
                if (cleanup := self.runtime.save_cleanup(sc.container)) is not None:
                    subprocess.run(cleanup, capture_output=True, timeout=120)
            switch = os.geteuid() == 0 and user != (0, 0)
            partial = f"{target}.pyxis-save"
            with open(made, "rb") as image:  # the user's process gets the file itself, not its path
                for argv, stdin in ((["cp", "/dev/stdin", partial], image), (["mv", "-f", "--", partial, target], None)):
                    put = subprocess.run(argv, stdin=stdin, capture_output=True, timeout=PULL_TIMEOUT_S, cwd="/",
                                         user=user[0] if switch else None, group=user[1] if switch else None,
                                         extra_groups=[] if switch else None)
                    if put.returncode != 0:
                        raise ContainerStartError(_last_lines(put.stderr.decode(errors="replace"))
                                                  or f"cannot write {target}")
        return target

    def finish(self, sc: StepContainer) -> None:
        """After the step: its container goes, unless it is named (kept for the job)."""
        if sc.oci is not None:
            shutil.rmtree(sc.oci.files, ignore_errors=True)
        if not sc.named:
            self.remove(sc.container)
            (self.root / f"{sc.container.name}.lock").unlink(missing_ok=True)
            with self._lock:
                for names in self._unnamed.values():
                    names.discard(sc.container.name)

    def remove(self, c: Container) -> None:
        argv = self.runtime.remove(c) if self.runtime is not None else None
        if argv:
            subprocess.run(argv, capture_output=True, timeout=60)

    def has_named(self, job_id: int) -> bool:
        return any(self.root.glob(f"pyxis_{job_id}_*.json"))

    def has_job(self, job_id: int) -> bool:
        """Whether the job has a container here: named, or a step's not yet removed."""
        with self._lock:
            if self._unnamed.get(job_id):
                return True
        return self.has_named(job_id)

    def remove_job(self, job_id: int) -> None:
        """The job ended: its named containers go (Pyxis' container_scope=job), and any step's
        not yet removed. Before the job's cgroup is emptied: a container killed from under
        its engine (made inside the job's cgroup) can be left half-stopped."""
        if self.runtime is None:
            return
        with self._lock:
            unnamed = self._unnamed.pop(job_id, set())
        for cname in unnamed:
            self.remove(Container(cname, ""))
            (self.root / f"{cname}.lock").unlink(missing_ok=True)
        for meta in self.root.glob(f"pyxis_{job_id}_*.json"):
            cname = meta.name[:-len(".json")]
            self.remove(Container(cname, ""))
            meta.unlink(missing_ok=True)
            (self.root / f"{cname}.lock").unlink(missing_ok=True)
