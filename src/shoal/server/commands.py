"""sbatch, squeue and scancel run inside the server for the compiled front end (frontend/shoal-cmd.c).

The front end sends a command's raw invocation (argv, working directory, environment,
login name, the script file it found) in one request; the server runs the command's own
``run`` function (shoal.slurm.sbatch/squeue/scancel: the one option table, the one squeue
formatter) against the routes of this process instead of HTTP, and answers with what the
command prints and its exit code. So a thin front end costs a C process start instead of
a Python one, and squeue renders from the store without shipping every job as JSON.

Wire format, request (``application/x-shoal-invocation``): items ``<key> <length>\\n<bytes>``
one after another; keys ``arg`` (argv, argv[0] first), ``env`` (``NAME=value``), ``cwd``,
``user`` and ``file <argv index>`` (a file named on the command line, as read). Answer:
status 200, ``X-Shoal-Exit: <code>``, ``X-Shoal-Stdout: <bytes>``, and a body of stdout
then stderr; or ``X-Shoal-Exit: local`` and nothing run, when the command must run in its
own process (standard input, --wait, --iterate, --help, a time zone unlike the server's).
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections import namedtuple
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm.exc import StaleDataError

from shoal.slurm import sbatch, scancel, squeue
from shoal.api_client import ClientError, RunLocally, field_error
from shoal.slurm.options import OptionError, asks_version, script_index, script_source
from shoal.server.auth import AuthError, Principal
from shoal.server.fastpath import in_thread
from shoal.server.jobs import JobError
from shoal.server.limits import store_failure

if TYPE_CHECKING:
    from shoal.server.endpoints import LocalApi

MEDIA_TYPE = "application/x-shoal-invocation"
COMMANDS = ("sbatch", "squeue", "scancel")


class Invocation(namedtuple("Invocation", "argv cwd environ user files")):
    """``argv: list[str]`` (argv[0] first), ``cwd: str``, ``environ: dict[str, str]``,
    ``user: str``, ``files: dict[int, bytes]`` by argv index."""

    __slots__ = ()

    @property
    def prog(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv and self.argv[0] else "shoal"


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
"""How os.fsdecode decodes (called directly: an invocation holds a hundred items)."""


class InvocationError(ValueError):
    """A request body that is not an invocation."""


def decode_invocation(data: bytes) -> Invocation:
    """Read the wire format above; text decodes as Python decodes argv and environ."""
    argv: list[str] = []
    environ: dict[str, str] = {}
    files: dict[int, bytes] = {}
    cwd = user = ""
    pos, end = 0, len(data)
    index, rfind = data.index, data.rfind
    try:
        while pos < end:
            nl = index(b"\n", pos)
            sp = rfind(b" ", pos, nl)
            size = data[sp + 1:nl]
            if sp < 0 or not size.isdigit():
                raise InvocationError(f"bad item header {data[pos:nl][:64]!r}")
            key = data[pos:sp]
            start = nl + 1
            pos = start + int(size)
            if pos > end:
                raise InvocationError("truncated item")
            if key == b"env":
                name, _, text = data[start:pos].decode(_FS_ENCODING, _FS_ERRORS).partition("=")
                environ[name] = text
            elif key == b"arg":
                argv.append(data[start:pos].decode(_FS_ENCODING, _FS_ERRORS))
            elif key == b"cwd":
                cwd = data[start:pos].decode(_FS_ENCODING, _FS_ERRORS)
            elif key == b"user":
                user = data[start:pos].decode(_FS_ENCODING, _FS_ERRORS)
            elif key.startswith(b"file "):
                files[int(key[5:])] = data[start:pos]
    except (ValueError, UnicodeDecodeError) as e:
        raise InvocationError(f"malformed invocation: {e}") from None
    if not argv or not cwd:
        raise InvocationError("an invocation needs argv and cwd")
    return Invocation(argv, cwd, environ, user, files)


class InProcessApi:
    """The Client interface (get/post) answered by this process's routes: no HTTP, no JSON.

    Failures become the ClientError the HTTP path would raise, with the same message and
    status, so the commands print the same words either way.
    """

    def __init__(self, local: LocalApi, resolve: Callable[[], Principal]):
        self.local = local
        self._resolve = resolve
        self._principal: Principal | None = None

    def get(self, path: str, params: dict | None = None, timeout: float | None = None):
        if self.local.find("GET", path) is None:
            raise RunLocally(f"GET {path}")
        return self._call(lambda p: self.local.call("GET", path, p, query=params))

    def post(self, path: str, body: dict | None = None, timeout: float | None = None):
        if self.local.find("POST", path) is None:
            raise RunLocally(f"POST {path}")
        return self._call(lambda p: self.local.call("POST", path, p, body=body or {}))

    def _call(self, route: Callable[[Principal], dict]):
        # The same exception handlers as the HTTP app's (errors.py), as ClientErrors.
        try:
            if self._principal is None:
                self._principal = self._resolve()
            return route(self._principal)
        except AuthError as e:
            raise ClientError(e.message, e.status, {"detail": e.message}) from None
        except ValidationError as e:
            message = "; ".join(field_error(d) for d in e.errors())
            raise ClientError(message, 422) from None
        except StaleDataError:
            message = "the object was changed concurrently; retry the request"
            raise ClientError(message, 409, {"detail": message}) from None
        except JobError as e:
            raise ClientError(e.message, e.status, {"detail": e.message}) from None
        except OperationalError as e:
            message = store_failure(e)
            raise ClientError(message, 503, {"detail": message}) from None


def run_command(name: str, inv: Invocation, api: InProcessApi) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one command; RunLocally when it needs its own process."""
    if inv.environ.get("TZ") != os.environ.get("TZ"):
        raise RunLocally("times print in the caller's time zone")
    if name == "squeue" and ("SQUEUE_FORMAT" in inv.environ or "SQUEUE_FORMAT2" in inv.environ):
        raise RunLocally("the caller's SQUEUE_FORMAT(2) sets the columns")
    out, err = io.StringIO(), io.StringIO()
    argv = inv.argv[1:]
    if name == "sbatch":
        rc = _sbatch(argv, inv, api, out, err)
    elif name == "squeue":
        rc = squeue.run(argv, connect=lambda: api, out=out, err=err, prog=inv.prog, user=inv.user, remote=True)
    else:
        rc = scancel.run(argv, connect=lambda: api, err=err, prog=inv.prog, user=inv.user, remote=True)
    return rc, out.getvalue(), err.getvalue()


def _sbatch(argv: list[str], inv: Invocation, api: InProcessApi, out: io.StringIO, err: io.StringIO) -> int:
    """The sbatch shell's reading of the script, from the files the front end sent."""
    if argv and argv[0] in ("-h", "--help", "--usage"):
        raise RunLocally("help")
    script = source = None
    try:
        if asks_version(argv):
            raise RunLocally("the version is the command's own")
        index = script_index(argv)
        wrapped_or_stdin = script_source(argv)
    except OptionError:
        index = wrapped_or_stdin = None  # sbatch.run reports it, as the shell does
    if index is not None:
        data = inv.files.get(index + 1)  # +1: the front end counts argv[0]
        if data is None:
            raise RunLocally("the script was not sent")  # unreadable: the command says why
        script = sbatch.read_script(data)  # as the shell reads it
        source = argv[index]
    elif wrapped_or_stdin == "-":
        raise RunLocally("the script comes from standard input")
    return sbatch.run(argv, script, source, cwd=inv.cwd, environ=inv.environ, now=time.time(),
                      connect=lambda: api, out=out, err=err, prog=inv.prog, may_wait=False)


async def answer(local: LocalApi, resolve: Callable[[str | None, str | None, str | None], Principal],
                 name: str, body: bytes, headers: dict[str, str | None]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One command run for the front end: (status, headers, body), as the route answers it.
    ``headers`` by lower-case name; the server's fast path calls this directly."""
    if name not in COMMANDS:
        return 404, [], f"no command {name}; commands: {', '.join(COMMANDS)}".encode()
    try:
        inv = decode_invocation(body)
    except InvocationError as e:
        return 400, [], str(e).encode()
    api = InProcessApi(local, lambda: resolve(headers.get("authorization"), headers.get("x-shoal-job-token"),
                                              headers.get("x-shoal-user")))
    try:
        rc, out, err = await in_thread(run_command, name, inv, api)
    except RunLocally:
        return 200, [(b"x-shoal-exit", b"local")], b""
    stdout = out.encode("utf-8", "surrogateescape")
    return 200, [(b"content-type", b"application/octet-stream"), (b"x-shoal-exit", str(rc).encode()),
                 (b"x-shoal-stdout", str(len(stdout)).encode())], stdout + err.encode("utf-8", "surrogateescape")
