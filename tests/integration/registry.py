"""A real OCI registry and small real images for container tests, with no internet.

``Registry`` starts Distribution's registry (Debian's ``docker-registry``) on 127.0.0.1;
``build_image`` makes a busybox image (Debian's busybox-static) with its own
/etc/os-release, imports it into podman and pushes it under any name. ``podman_env``
is the environment rootful podman needs on these machines: runc, and no default
ulimits (crun fails on the hybrid cgroup layout).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.integration.cluster import free_port

CONTAINERS_CONF = """[containers]
default_ulimits = []

[engine]
runtime = "runc"
"""
BUSYBOX = "/usr/bin/busybox"
APPLETS = ("sh", "cat", "ls", "echo", "id", "env", "grep", "sleep", "touch", "test", "head", "wc", "pwd", "true",
           "false", "mkdir", "stat", "printf", "hostname", "sort", "tr", "cut", "seq", "httpd", "dd")


def missing_tools() -> list[str]:
    """The programs these tests need that this machine lacks (.ci/run installs them)."""
    return [t for t in ("podman", "runc", "docker-registry", "catatonit", "htpasswd") if shutil.which(t) is None] \
        + ([] if os.path.exists(BUSYBOX) else ["busybox"])


def podman_env(root: Path) -> dict[str, str]:
    conf = root / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {"CONTAINERS_CONF": str(conf)}


def podman(env: dict[str, str], *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    out = subprocess.run(["podman", *args], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {out.returncode}: {out.stderr}")
    return out


class Registry:
    """Distribution's registry serving plain HTTP on 127.0.0.1 from a temporary directory;
    with ``login`` (user, password), only to that user (htpasswd, bcrypt as it requires)."""

    def __init__(self, root: Path, login: tuple[str, str] | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.login = login
        root.mkdir(parents=True, exist_ok=True)
        auth = ""
        if login is not None:
            line = subprocess.run(["htpasswd", "-niB", login[0]], input=login[1], capture_output=True, text=True,
                                  check=True).stdout
            (root / "htpasswd").write_text(line)
            auth = f"auth:\n  htpasswd:\n    realm: shoal-test\n    path: {root / 'htpasswd'}\n"
        (root / "config.yml").write_text(
            f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
            f"  delete:\n    enabled: true\nhttp:\n  addr: {self.address}\n{auth}")
        self.proc: subprocess.Popen | None = None

    def authfile(self) -> Path:
        """podman's auth.json of this registry's login (for pushing to it; not on a command line)."""
        import base64
        import json

        token = base64.b64encode(f"{self.login[0]}:{self.login[1]}".encode()).decode()
        path = self.root / "auth.json"
        path.write_text(json.dumps({"auths": {self.address: {"auth": token}}}))
        return path

    def start(self) -> Registry:
        log = open(self.root / "registry.log", "w")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(self.root / "config.yml")],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1).read()
                return self
            except urllib.error.HTTPError as e:
                if e.code == 401:  # up, and asking for its login
                    return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"the registry did not start: {(self.root / 'registry.log').read_text()}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


def build_image(env: dict[str, str], root: Path, tag: str, pretty_name: str, files: dict[str, str] | None = None) -> str:
    """A busybox image (its /etc/os-release says ``pretty_name``; ``files`` adds more) in
    podman's store as ``tag``; returns the tag."""
    rootfs = root / f"rootfs-{abs(hash(tag))}"
    shutil.rmtree(rootfs, ignore_errors=True)
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (rootfs / "tmp").mkdir()
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    (rootfs / "etc" / "os-release").write_text(f'NAME="{pretty_name}"\nID=shoaltest\nPRETTY_NAME="{pretty_name}"\n')
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    for path, text in (files or {}).items():
        (rootfs / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (rootfs / path.lstrip("/")).write_text(text)
    archive = root / f"{rootfs.name}.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(rootfs, arcname=".")
    podman(env, "import", "--change", "ENV=PATH=/bin", str(archive), tag)
    return tag


def push(env: dict[str, str], local: str, remote: str, authfile: Path | None = None) -> None:
    podman(env, "push", "--quiet", "--tls-verify=false", *(["--authfile", str(authfile)] if authfile else []),
           local, remote)


def python_image_files(packages: tuple[str, ...]) -> tuple[str, list[str]]:
    """This test process' Python (its interpreter and standard library, at their own paths)
    and ``packages`` with everything they require, installed in its environment: the python
    binary's path and the files an image needs for them, shared libraries included (ldd's)."""
    import importlib.metadata as md
    import re
    import sys
    import sysconfig

    from packaging.requirements import Requirement

    base = Path(sys.base_prefix)
    python = Path(sys.executable).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: set[str] = {str(python)}
    for path in stdlib.rglob("*"):
        rel = path.relative_to(stdlib).parts
        if path.is_file() and rel[0] not in ("test", "site-packages", "dist-packages", "idlelib", "tkinter",
                                             "ensurepip", "lib2to3", "turtledemo"):
            files.add(str(path))
    files.update(str(p) for p in (base / "lib").glob("libpython*.so*"))
    seen: set[str] = set()
    todo = list(packages)
    site = None
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen.add(key)
        site = Path(str(dist.locate_file("")))
        files.update(str(dist.locate_file(f)) for f in dist.files or () if not str(f).startswith(".."))
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    libs: set[str] = set()
    for f in [f for f in files if f.endswith(".so") or ".so." in f or f == str(python)]:
        out = subprocess.run(["ldd", f], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(/\S+) \(0x", line)
            if m:
                libs.add(m.group(1))
    for lib in libs:
        # The link chain as written (/lib64/ld-linux... -> /lib/x86_64-linux-gnu/...), each
        # step at its own path: the image has no merged /usr's directory links.
        for _ in range(8):
            files.add(lib)
            if not os.path.islink(lib):
                break
            lib = os.path.normpath(os.path.join(os.path.dirname(lib), os.readlink(lib)))
    return str(python), sorted(files | ({str(site)} if site else set()))


def build_python_image(env: dict[str, str], root: Path, tag: str, packages: tuple[str, ...],
                       image_env: dict[str, str]) -> str:
    """A busybox image holding this process' Python and ``packages`` (its site-packages on
    PYTHONPATH, ``python`` on PATH), in podman's store as ``tag``."""
    import sys

    python, files = python_image_files(packages)
    archive = root / f"python-{abs(hash(tag))}.tar"
    site = next(p for p in (Path(s) for s in sys.path) if p.name == "site-packages" and p.is_dir()
                and str(p) in files)
    with tarfile.open(archive, "w") as tar:
        def add_dir(name: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)

        for d in ("bin", "etc", "tmp", "usr", "usr/local", "usr/local/bin"):
            add_dir(d)
        tar.add(BUSYBOX, arcname="bin/busybox")
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for name, target in (("usr/local/bin/python", python), ("usr/local/bin/python3", python)):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tar.addfile(link)
        for text, name in ((f'NAME="python image"\nPRETTY_NAME="python image {sys.version.split()[0]}"\n',
                            "etc/os-release"), ("root:x:0:0:root:/root:/bin/sh\n", "etc/passwd")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
        for f in files:
            if os.path.isdir(f) and not os.path.islink(f):
                continue
            tar.add(f, arcname=f.lstrip("/"), recursive=False)
    changes = [f"ENV={k}={v}" for k, v in {"PATH": "/usr/local/bin:/bin", "PYTHONPATH": str(site),
                                               **image_env}.items()]
    podman(env, "import", *[a for c in changes for a in ("--change", c)], str(archive), tag, timeout=600)
    archive.unlink()
    return tag
