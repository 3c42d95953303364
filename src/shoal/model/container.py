"""Pyxis' container options as data: image references, mounts, and a job's container request.

Pure functions shared by sbatch/srun (parsing), the server (checks at submit) and the
agent (what it hands a runtime). The wire form of a request is a plain dict
(``ContainerRequest.to_json``): ``{"image": ..., "mounts": [...], "workdir": ..., ...}``,
with ``None`` for an option left to the site's default, as Pyxis' ``-1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The request's keys and their types: the wire form is checked against this.
FIELDS = {
    "image": str, "mounts": list, "workdir": str, "name": str, "save": str, "mount_home": bool,
    "remap_root": bool, "entrypoint": bool, "writable": bool, "env": list,
}
# Pyxis reads these variables as defaults under the command line (pyxis_args_check_environment_variables).
ENV_VARS = {
    "image": "PYXIS_CONTAINER_IMAGE", "mounts": "PYXIS_CONTAINER_MOUNTS", "workdir": "PYXIS_CONTAINER_WORKDIR",
    "name": "PYXIS_CONTAINER_NAME", "save": "PYXIS_CONTAINER_SAVE", "mount_home": "PYXIS_CONTAINER_MOUNT_HOME",
    "remap_root": "PYXIS_CONTAINER_REMAP_ROOT", "entrypoint": "PYXIS_CONTAINER_ENTRYPOINT",
    "writable": "PYXIS_CONTAINER_WRITABLE", "env": "PYXIS_CONTAINER_ENV",
}
MOUNT_FLAGS = {"ro", "rw", "private", "rprivate", "shared", "rshared", "slave", "rslave", "bind", "rbind",
               "nosuid", "nodev", "noexec", "x-create=dir", "x-create=file", "x-create=auto"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
RUNTIME_LABEL = "shoal.io/container-runtime"  # a node's label: the runtime its agent runs containers with
_FILE_SUFFIXES = (".sqsh", ".squashfs", ".sqfs", ".tar", ".tar.gz", ".tgz", ".oci", ".sif")


class ContainerOptionError(ValueError):
    """A container option Pyxis would refuse; the text is Pyxis' reason."""


@dataclass(frozen=True)
class Mount:
    """One ``--container-mounts`` entry: ``source`` is a path (absolute, or relative to the
    task's directory) or ``tmpfs``; ``flags`` are Enroot's mount flags (``ro``, ``rprivate``...)."""

    source: str
    target: str
    flags: tuple[str, ...] = ()

    @property
    def readonly(self) -> bool:
        return "ro" in self.flags

    def to_json(self) -> dict:
        return {"source": self.source, "target": self.target, "flags": list(self.flags)}

    @classmethod
    def from_json(cls, doc: dict) -> Mount:
        return cls(str(doc["source"]), str(doc["target"]), tuple(str(f) for f in doc.get("flags") or ()))


@dataclass(frozen=True)
class ImageRef:
    """Where an image comes from: ``kind`` is ``registry`` (``ref`` in Docker's
    ``registry/repository:tag`` form), ``file`` (a squashfs, OCI or Docker archive on the
    node), ``podman`` or ``dockerd`` (an image already in that engine's local store)."""

    kind: str
    ref: str


def parse_mounts(text: str) -> list[Mount]:
    """``SRC[:DST[:FLAGS]][,SRC:DST...]`` as Pyxis reads it: flags joined by ``+``, a
    missing DST is SRC, sources are paths, ``tmpfs`` or ``umount``."""
    mounts: list[Mount] = []
    for item in text.split(","):
        if not item:
            continue
        src, _, rest = item.partition(":")
        dst, _, flags = rest.partition(":") if rest else (src, "", "")
        if not src or not dst:
            raise ContainerOptionError(f"invalid format: {item}")
        if not src.startswith(("/", ".")) and src not in ("tmpfs", "umount"):
            raise ContainerOptionError('mount source must be a relative path, an absolute path, "tmpfs" or "umount"')
        if not dst.startswith(("/", ".")):
            raise ContainerOptionError("mount target must be a relative path or an absolute path")
        words = tuple(f for f in flags.split("+") if f)
        unknown = [f for f in words if f not in MOUNT_FLAGS]
        if unknown:
            raise ContainerOptionError(f"unknown mount flag {unknown[0]} in {item} "
                                       f"(known: {', '.join(sorted(MOUNT_FLAGS))})")
        mount = Mount(src, dst, words)
        if mount not in mounts:  # Pyxis drops an entry given twice
            mounts.append(mount)
    return mounts


def parse_bool(text: str) -> bool:
    """Pyxis' parse_bool for its PYXIS_CONTAINER_* variables."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", "y"):
        return True
    if word in ("0", "false", "no", "n"):
        return False
    raise ContainerOptionError(f"expected a boolean (1/0, true/false, yes/no), not {text!r}")


def image_ref(image: str) -> ImageRef:
    """Pyxis' ``[USER@][REGISTRY#]IMAGE[:TAG]|PATH`` and Docker's ``REGISTRY/IMAGE:TAG``,
    ``docker://``, ``podman://``, ``dockerd://`` as one ImageRef.

    Enroot names the registry with ``#``; without one, a first component that looks like
    a host (a dot, a port, ``localhost``) is the registry, as Docker reads it, and
    anything else is Docker Hub's.
    """
    text = image.strip()
    if not text:
        raise ContainerOptionError("argument required")
    for scheme, kind in (("podman://", "podman"), ("dockerd://", "dockerd")):
        if text.startswith(scheme):
            return ImageRef(kind, text[len(scheme):])
    if text.startswith("docker://"):
        text = text[len("docker://"):]
    elif text.startswith(("/", "./", "../")) or text.endswith(_FILE_SUFFIXES):
        return ImageRef("file", text)
    if "@" in text.partition("#")[0] and "#" in text:
        text = text.split("@", 1)[1]  # USER@ is a credential name for enroot; the agent's login is used
    registry, hash_, rest = text.partition("#")
    if hash_:
        if not registry or not rest:
            raise ContainerOptionError(f"invalid image reference {image}")
        return ImageRef("registry", f"{registry}/{_qualified(rest, hub=False)}")
    first, slash, _ = text.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return ImageRef("registry", _tagged(text))
    return ImageRef("registry", "docker.io/" + _qualified(text, hub=True))


def _qualified(repo: str, hub: bool) -> str:
    """Docker Hub's one-word names live under ``library/``; every name gets a tag."""
    if hub and "/" not in repo:
        repo = "library/" + repo
    return _tagged(repo)


def _tagged(ref: str) -> str:
    last = ref.rsplit("/", 1)[-1]
    return ref if ":" in last or "@" in last else ref + ":latest"


def rewrite(ref: str, mirrors: dict[str, str]) -> str:
    """A registry reference with its registry replaced by the site's mirror for it
    (``nvcr.io/nvidia/pytorch:24.10-py3`` -> ``mirror:5000/nvidia/pytorch:24.10-py3``)."""
    registry, _, rest = ref.partition("/")
    mirror = mirrors.get(registry)
    return f"{mirror.rstrip('/')}/{rest}" if mirror else ref


def check_request(doc: dict) -> dict:
    """A container request from the wire, checked: known keys, their types, an image,
    mounts that parse. Returns it normalised (mounts as dicts)."""
    if not isinstance(doc, dict):
        raise ContainerOptionError("the container request must be an object")
    for key, value in doc.items():
        want = FIELDS.get(key)
        if want is None:
            raise ContainerOptionError(f"unknown container option {key}")
        if value is not None and not isinstance(value, want):
            raise ContainerOptionError(f"container option {key} must be a {want.__name__}")
    if not doc.get("image") and not doc.get("name"):
        raise ContainerOptionError("--container-image (or --container-name of an existing container) is required "
                                   "with the other --container-* options")
    if doc.get("image"):
        image_ref(doc["image"])
    mounts = []
    for m in doc.get("mounts") or []:
        if isinstance(m, str):
            mounts += [x.to_json() for x in parse_mounts(m)]
        elif isinstance(m, dict) and {"source", "target"} <= set(m):
            mounts.append(Mount.from_json(m).to_json())
        else:
            raise ContainerOptionError("container mounts must be SRC:DST[:FLAGS] entries")
    name = doc.get("name")
    if name is not None:
        base, _, flag = name.partition(":")
        if not _NAME.fullmatch(base) or flag not in ("", "auto", "create", "exec", "no_exec"):
            raise ContainerOptionError(f"--container-name: invalid name {name!r} (letters, digits, _ . -; "
                                       f'a flag after ":" must be "auto", "create", "exec" or "no_exec")')
    for name in doc.get("env") or []:
        if not isinstance(name, str) or not name or "=" in name:
            raise ContainerOptionError(f"--container-env takes variable names, not {name!r}")
    out = {k: v for k, v in doc.items() if v is not None}
    if "mounts" in out:
        out["mounts"] = mounts
    return out


def request_from_env(environ: dict[str, str]) -> dict:
    """The PYXIS_CONTAINER_* variables as a request's options (Pyxis' defaults under the
    command line; a batch job exports its own so its steps inherit them)."""
    out: dict = {}
    for key, var in ENV_VARS.items():
        value = environ.get(var)
        if value is None or value == "":
            continue
        if FIELDS[key] is bool:
            out[key] = parse_bool(value)
        elif key == "mounts":
            out[key] = [m.to_json() for m in parse_mounts(value)]
        elif key == "env":
            out[key] = [n for n in value.split(",") if n]
        else:
            out[key] = value
    return out


def request_to_env(doc: dict) -> dict[str, str]:
    """A request as the PYXIS_CONTAINER_* variables request_from_env reads back."""
    env: dict[str, str] = {}
    for key, var in ENV_VARS.items():
        value = doc.get(key)
        if value is None or value == []:
            continue
        if isinstance(value, bool):
            env[var] = "1" if value else "0"
        elif key == "mounts":
            env[var] = ",".join(f"{m['source']}:{m['target']}" + (":" + "+".join(m["flags"]) if m.get("flags") else "")
                                for m in value)
        elif key == "env":
            env[var] = ",".join(value)
        else:
            env[var] = str(value)
    return env


def parse_credentials(text: str) -> dict[str, tuple[str, str]]:
    """Enroot's ``$ENROOT_CONFIG_PATH/.credentials``, netrc's format: ``machine HOST login
    USER password SECRET`` entries (on one line or several; ``#`` starts a comment line),
    as registry host -> (login, password). ``default`` entries and macros are netrc's, not
    Enroot's, and are skipped."""
    words = [w for line in text.splitlines() if not line.lstrip().startswith("#") for w in line.split()]
    out: dict[str, tuple[str, str]] = {}
    host: str | None = None
    login = password = ""
    i = 0
    while i < len(words):
        word = words[i]
        value = words[i + 1] if i + 1 < len(words) else ""
        if word in ("machine", "default"):
            if host and login:
                out.setdefault(host, (login, password))
            host, login, password = (value if word == "machine" else None), "", ""
            i += 2 if word == "machine" else 1
        elif word in ("login", "password", "account"):
            if word == "login":
                login = value
            elif word == "password":
                password = value
            i += 2
        else:
            i += 1
    if host and login:
        out.setdefault(host, (login, password))
    return out


def registry_of(ref: str) -> str:
    """The registry host of a Docker-form reference (``host[:port]/repo:tag``)."""
    return ref.partition("/")[0]
