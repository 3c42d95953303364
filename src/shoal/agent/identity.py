"""Whose identity a job's processes take on this node, and how a process is started as that user.

As slurmd does, an agent running as root starts a job's batch script, srun tasks and pod
processes as the user who submitted it: the user's uid, primary gid and supplementary
groups, found on this node with ``pwd``/``grp``. A user unknown here fails the launch; it
never falls back to root. An agent that is not root runs everything as its own user.

Everything a launch does on the user's behalf in the file system -- changing to the working
directory, creating or truncating ``--output``/``--error``, opening ``--input`` -- happens in
the child after it has become the user and before it execs, so the agent never creates a
file as root where the user could not.
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class UnknownUser(LookupError):
    """The job's user has no account on this node."""


class LaunchError(OSError):
    """The child could not prepare its launch as the user: ``filename`` (the working
    directory or an output file) and ``strerror`` say which path and why."""


@dataclass(frozen=True)
class Identity:
    """A Unix user as this node knows them."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def environment(self) -> dict[str, str]:
        """USER, LOGNAME and HOME of the job's user (the submitter's exported values may be another's)."""
        return {"USER": self.name, "LOGNAME": self.name, "HOME": self.home}


def lookup(name: str) -> Identity:
    """The node's account of ``name``; UnknownUser when there is none."""
    try:
        pw = pwd.getpwnam(name)
    except (KeyError, ValueError):  # ValueError: an embedded NUL
        raise UnknownUser(f"user {name} is unknown on this node") from None
    try:
        groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
    except OSError:
        groups = [pw.pw_gid] + [g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem]
    return Identity(pw.pw_name, pw.pw_uid, pw.pw_gid, tuple(sorted(set(groups))), pw.pw_dir)


class JobUsers:
    """Decides whose identity a job's processes take: ``switch`` is on when the agent is root.

    ``of(user)`` is None when no switch is needed (the agent is not root, or the job's user
    is the agent's own), else the user's Identity; UnknownUser when the node has no such user.
    """

    def __init__(self, switch: bool | None = None) -> None:
        self.switch = os.geteuid() == 0 if switch is None else switch

    def of(self, user: str) -> Identity | None:
        if not self.switch:
            return None
        ident = lookup(user)
        return None if ident.uid == os.geteuid() else ident


@dataclass(frozen=True)
class OpenAs:
    """A file the child opens on one of its standard descriptors (0, 1, 2) as the job's user,
    or, with ``same_as``, a copy of an earlier one (stderr into the stdout file)."""

    fd: int
    path: str = ""
    flags: int = 0
    same_as: int | None = None


def output_flags(append: bool) -> int:
    return os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)


def join_cgroups(fds: Sequence[int]) -> None:
    """Move the calling process into the cgroups whose ``cgroup.procs`` are open as ``fds``.
    Runs in a child between fork and exec (a ``preexec_fn``): plain system calls only."""
    for fd in fds:
        os.write(fd, b"0")


def spawn(argv: Sequence[str], *, identity: Identity | None, env: Mapping[str, str], cwd: str | None = None,
          cwd_fallback: str | None = None, files: Sequence[OpenAs] = (), note_fd: int = 1,
          stdin=subprocess.DEVNULL, stdout=None, stderr=None, cgroup_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``argv`` in its own session, as ``identity`` (None: as the agent).

    With an identity, or with ``files`` to open, the child changes directory and opens the
    files itself, after becoming the user. When ``cwd`` cannot be entered and ``cwd_fallback``
    is given, the child goes there instead and writes slurmstepd's note to ``note_fd``.
    ``cgroup_fds``: open ``cgroup.procs`` files the child joins before anything else.
    Raises LaunchError (the message says which path and why) or OSError from exec.
    """
    if identity is None and not files:
        return subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=stdin, stdout=stdout, stderr=stderr,
                                start_new_session=True, close_fds=True,
                                preexec_fn=(lambda: join_cgroups(cgroup_fds)) if cgroup_fds else None)
    why_r, why_w = os.pipe()  # the child's reason for giving up (close_fds shuts it before exec)
    plan = [(f.fd, os.fsencode(f.path), f.flags, f.same_as) for f in files]
    wd = os.fsencode(cwd) if cwd else None
    fallback = os.fsencode(cwd_fallback) if cwd_fallback else None

    def prepare() -> None:
        # Runs in the child after setgroups/setgid/setuid: only plain system calls here.
        note = b""
        where = wd
        join_cgroups(cgroup_fds)  # the fds were opened by the agent, so the write is allowed after setuid
        try:
            if wd is not None:
                try:
                    os.chdir(wd)
                except OSError as e:
                    if fallback is None:
                        raise
                    note = (b"slurmstepd: error: couldn't chdir to `" + wd + b"': "
                            + os.strerror(e.errno).encode() + b": going to /tmp instead\n")
                    os.chdir(fallback)
            for fd, path, flags, same_as in plan:
                if same_as is not None:
                    os.dup2(same_as, fd)
                    continue
                where = path
                new = os.open(path, flags, 0o644)
                if new != fd:
                    os.dup2(new, fd)
                    os.close(new)
            if note:
                os.write(note_fd, note)
        except OSError as e:
            os.write(why_w, str(e.errno).encode() + b"\0" + (where or b""))
            raise

    kw = {}
    if identity is not None:
        kw = {"user": identity.uid, "group": identity.gid, "extra_groups": list(identity.groups)}
    try:
        p = subprocess.Popen(list(argv), env=dict(env), stdin=stdin, stdout=stdout, stderr=stderr,
                             start_new_session=True, close_fds=True, preexec_fn=prepare, **kw)
    except subprocess.SubprocessError:
        os.close(why_w)
        code, _, path = _read_all(why_r).partition(b"\0")
        errno = int(code) if code.isdigit() else 0
        raise LaunchError(errno, os.strerror(errno) if errno else "the launch failed before exec",
                          os.fsdecode(path) or None) from None
    except BaseException:
        os.close(why_w)
        os.close(why_r)
        raise
    os.close(why_w)
    os.close(why_r)
    return p


def _read_all(fd: int) -> bytes:
    data = b""
    try:
        while chunk := os.read(fd, 4096):
            data += chunk
    finally:
        os.close(fd)
    return data
