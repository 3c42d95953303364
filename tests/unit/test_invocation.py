"""The compiled front end's wire format (server.commands.decode_invocation) and the
environment checks every submission passes (server.schemas.check_environment)."""

from __future__ import annotations

import pytest

from shoal.server.commands import InvocationError, decode_invocation
from shoal.server.schemas import MAX_ARG, check_environment


def item(key: str, value: bytes) -> bytes:
    return f"{key} {len(value)}\n".encode() + value


def test_an_invocation_decodes_as_python_decodes_argv_and_environ():
    raw = b"".join([item("arg", b"sbatch"), item("arg", b"--wrap=caf\xc3\xa9"), item("arg", b"bad\xff"),
                    item("cwd", b"/home/a"), item("user", b"alice"), item("env", b"PATH=/bin"),
                    item("env", b"EMPTY="), item("env", b"A=b=c"), item("env", b"RAW=\xfe"),
                    item("file 3", b"#!/bin/sh\n\x00binary")])
    inv = decode_invocation(raw)
    assert inv.argv == ["sbatch", "--wrap=café", "bad\udcff"]
    assert (inv.cwd, inv.user) == ("/home/a", "alice")
    assert inv.environ == {"PATH": "/bin", "EMPTY": "", "A": "b=c", "RAW": "\udcfe"}
    assert inv.files == {3: b"#!/bin/sh\n\x00binary"}


@pytest.mark.parametrize("raw", [
    item("arg", b"sbatch")[:-2],                      # the value cut short
    b"arg 6\nsbatch" + b"cwd -1\n/",                  # a negative size
    b"arg six\nsbatch",                               # no size
    b"arg 6",                                         # no newline
    item("arg", b"sbatch") + b"cwd \xff\n",           # a key that is not ASCII
    item("arg", b"sbatch"),                           # no cwd
])
def test_a_malformed_invocation_is_refused(raw):
    with pytest.raises(InvocationError):
        decode_invocation(raw)


def test_an_environment_execve_can_take_passes_as_it_is():
    env = {"PATH": "/bin", "LANG": "fr_FR.UTF-8", "GREETING": "café ☕", "RAW": "\udcfe", "EMPTY": ""}
    assert check_environment(env) is env


@pytest.mark.parametrize("env, message", [
    ({"A": "x\x00y"}, "variable A contains a NUL"),
    ({"A=B": "x"}, "invalid variable name 'A=B'"),
    ({"": "x"}, "invalid variable name ''"),
    ({"N\x00": "x"}, "invalid variable name"),
    ({"A": "\ud800"}, "variable A is not valid UTF-8 text"),
    ({"\ud800": "x"}, "invalid variable name"),
    ({"A": "x" * (MAX_ARG + 1)}, f"variable A is longer than {MAX_ARG} characters"),
    ({"A": "é" * (MAX_ARG + 1)}, f"variable A is longer than {MAX_ARG} characters"),
])
def test_an_environment_execve_cannot_take_is_refused_naming_the_variable(env, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check_environment(env)
