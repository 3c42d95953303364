"""The Slurm-compatible commands start fast: a guard on what importing them pulls in.

Users' scripts call sbatch, squeue and the rest in tight loops, so each command module
must import only cheap parts of the standard library. Each check runs a fresh
interpreter with ``-X importtime`` and fails when a heavy module appears, naming the
chain of imports that brought it in. The rest of the file checks the small stand-ins
that make this possible (URL splitting and percent-encoding instead of urllib.parse,
namedtuples and a slots class instead of dataclasses) against what they replace.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import threading
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal import api_client as client
from shoal.slurm.fmt import Field, Spec
from shoal.slurm.options import Option, SbatchRequest, SrunRequest, parse_srun
from shoal.cli.sacct import Column
from shoal.model.dependency import Dependency

COMMANDS = [*(f"shoal.cli.{c}" for c in ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol", "sacct", "sstat",
                                          "sprio", "sshare", "salloc", "sacctmgr", "sdiag", "sreport")),
            "shoal.slurm.options", "shoal.slurm.sacctmgr", "shoal.slurm.fmt", "shoal.api_client"]

FORBIDDEN = [
    "dataclasses", "inspect", "typing", "urllib.parse", "ipaddress", "http.client", "email",
    "yaml", "pydantic", "sqlalchemy", "fastapi", "shoal.server", "shoal.store", "shoal.sched",
]  # fmt: skip


def _imported(code: str) -> list[tuple[int, str]]:
    """(depth, module) for every module a fresh interpreter imports to run ``code``, in order."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}, check=True,
    ).stderr
    rows = []
    for line in out.splitlines():
        if not line.startswith("import time:") or line.rstrip().endswith("| imported package"):
            continue
        name = line.split("|")[-1]
        rows.append(((len(name) - len(name.lstrip(" "))) // 2, name.strip()))
    return rows


def _chain(rows: list[tuple[int, str]], index: int) -> str:
    """The imports that led to rows[index]: importtime lists a module after its children."""
    depth, name = rows[index]
    chain = [name]
    for d, n in rows[index + 1:]:
        if d < depth:
            chain.append(n)
            depth = d
    return " <- ".join(chain)


@pytest.fixture(scope="module")
def baseline() -> set[str]:
    """What the interpreter imports anyway (site, .pth files): not the commands' doing."""
    return {name for _, name in _imported("pass")}


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


@pytest.mark.parametrize("command", COMMANDS)
def test_command_imports_no_heavy_modules(command, baseline):
    rows = _imported(f"import {command}")
    assert any(name == command for _, name in rows)
    heavy = [_chain(rows, i) for i, (_, name) in enumerate(rows) if _forbidden(name) and name not in baseline]
    assert not heavy, f"importing {command} pulls in heavy modules:\n" + "\n".join(heavy)


def test_argument_parser_does_not_import_shutil(baseline):
    code = (
        "from shoal.slurm.fmt import argument_parser\n"
        "p = argument_parser('squeue', 'x')\n"
        "p.add_argument('-u', '--user', action='append')\n"
        "p.parse_args(['-u', 'alice'])\n"
    )
    names = {name for _, name in _imported(code)} - baseline
    assert "shutil" not in names and "argparse" in names


def test_argument_parser_help_wraps_at_columns(monkeypatch):
    from shoal.slurm.fmt import argument_parser

    monkeypatch.setenv("COLUMNS", "40")
    parser = argument_parser("squeue", "x")
    parser.add_argument("--format", help="word " * 30)
    assert max(len(line) for line in parser.format_help().splitlines()) <= 38


# The request path: an ASCII host goes to getaddrinfo as bytes, so no idna codec is loaded.


def _serve_once(sock: socket.socket) -> None:
    conn, _ = sock.accept()
    with conn:
        conn.recv(65536)
        body = b'{"ok": true}'
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_request_does_not_load_idna(host, baseline):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    thread = threading.Thread(target=_serve_once, args=(server,), daemon=True)
    thread.start()
    try:
        code = (
            "from shoal.api_client import Client\n"
            f"assert Client('http://{host}:{port}').get('/x', {{'a': 'b'}}) == {{'ok': True}}\n"
        )
        names = {name for _, name in _imported(code)} - baseline
    finally:
        thread.join(5)
        server.close()
    assert "encodings.idna" not in names
    assert not {n for n in names if _forbidden(n)}


def test_address_host():
    assert client._address_host("127.0.0.1") == b"127.0.0.1"
    assert client._address_host("::1") == b"::1"
    assert client._address_host("bücher.example") == "bücher.example"


# split_url against urllib.parse.urlsplit.

URLS = [
    "http://127.0.0.1:8080", "http://127.0.0.1:8080/", "https://shoal.example.org/api/",
    "http://localhost", "localhost:8000", "http://HOST.Example:80/Base/Path?x=1#frag",
    "http://user:pw@host:99/p", "http://user@[::1]:8080/x", "http://[::1]", "http://[::1]:0",
    "http://[fe80::1%25eTh0]:81/", "http://[FE80::A%Zone]:1/", "http://[v1.fe]/", "http://[vz.x]/",
    "http://[1.2.3.4]/", "http://[::1/", "http://::1]/", "http://[not-an-ip]:80/",
    "http://host:", "http://host:abc", "http://host:-1", "http://host:65536", "http://host:65535",
    "http://host:00080", "http://host:٣", "http://:80/", "http:///path", "http://host?q#f",
    "http://host#f?q", "  \t http://host:1/a\nb", "\x00http://h/", "HTTP://H/", "ht+tp.-x://h/",
    "1http://h/", "http:/h/", "http:h", "//h:5/p", "http://bücher.example/", "http://h/ä",
    "http://h\u2100/", "http://a@b@c:7/", "http://[::1]junk:8/", "http://h:8:9/",
]  # fmt: skip


def _expected(url: str):
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.scheme, parts.hostname, parts.port, parts.path
    except ValueError as e:
        return ValueError, str(e)


def _actual(url: str):
    try:
        return client.split_url(url)
    except ValueError as e:
        return ValueError, str(e)


@pytest.mark.parametrize("url", URLS)
def test_split_url_matches_urllib(url):
    assert _actual(url) == _expected(url)


_URL_CHARS = st.sampled_from(list("abcAZ09:/?#@[]%.-+_~ \t\n\x00é") + ["::1", "v1.", "http", "://", "8080"])


@settings(max_examples=500, deadline=None)
@given(st.lists(_URL_CHARS, max_size=20).map("".join))
def test_split_url_matches_urllib_on_random_text(url):
    assert _actual(url) == _expected(url)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["http", "https", "HTTPS", ""]),
    st.sampled_from(["", "user@", "u:p@"]),
    st.one_of(st.from_regex(r"\A[a-zA-Z0-9.-]{0,12}\Z"), st.ip_addresses().map(str),
              st.ip_addresses(v=6).map(lambda a: f"[{a}]")),
    st.one_of(st.just(""), st.integers(-5, 70000).map(lambda p: f":{p}")),
    st.from_regex(r"\A(/[a-zA-Z0-9._~-]*){0,3}\Z"),
)
def test_split_url_matches_urllib_on_server_urls(scheme, userinfo, host, port, path):
    url = f"{scheme}://{userinfo}{host}{port}{path}" if scheme else f"{userinfo}{host}{port}{path}"
    assert _actual(url) == _expected(url)


def test_client_reads_the_server_url():
    c = client.Client("https://Shoal.Example:8443/base/")
    assert (c.scheme, c.host, c.port, c.base) == ("https", "shoal.example", 8443, "/base")
    c = client.Client("localhost")
    assert (c.scheme, c.host, c.port, c.base) == ("http", "localhost", 80, "")
    c = client.Client("http://[::1]:7000")
    assert (c.host, c.port) == ("::1", 7000)
    with pytest.raises(ValueError):
        client.Client("http://host:port")


# Percent-encoding against urllib.parse.quote, quote_plus and urlencode(doseq=True).

_TEXT = st.one_of(st.text(), st.text(alphabet="a /+&=?%#~é\u2603"))


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_quote_matches_urllib(text):
    assert client.quote(text) == urllib.parse.quote(text)
    assert client.quote_plus(text) == urllib.parse.quote_plus(text)


@settings(max_examples=100, deadline=None)
@given(st.binary())
def test_quote_bytes_matches_urllib(data):
    assert client.quote(data) == urllib.parse.quote(data)
    assert client.quote_plus(data) == urllib.parse.quote_plus(data)


def test_quote_refuses_lone_surrogates_as_urllib_does():
    with pytest.raises(UnicodeEncodeError):
        urllib.parse.quote("a\udcff")
    with pytest.raises(UnicodeEncodeError):
        client.quote("a\udcff")


_SCALAR = st.one_of(_TEXT, st.integers(), st.booleans(), st.floats(allow_nan=False), st.binary(max_size=4))
_VALUE = st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3), st.tuples(_SCALAR, _SCALAR))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.one_of(_TEXT, st.integers(), st.binary(max_size=4)), _VALUE, max_size=5))
def test_urlencode_matches_urllib(params):
    assert client.urlencode(params) == urllib.parse.urlencode(params, doseq=True)


def test_urlencode_examples():
    params = {"job_id": "12", "user": ["alice", "bob b"], "all": "true", "n": 3, "empty": []}
    assert client.urlencode(params) == "job_id=12&user=alice&user=bob+b&all=true&n=3"


# Records that replaced dataclasses keep their fields, defaults, immutability and equality.


def test_dependency_is_an_immutable_hashable_value():
    a = Dependency("afterok", (1, 2))
    assert (a.kind, a.job_ids) == ("afterok", (1, 2))
    assert a == Dependency("afterok", (1, 2)) and hash(a) == hash(Dependency("afterok", (1, 2)))
    assert a != Dependency("afterok", (1,)) and a != Dependency("after", (1, 2))
    assert a != ("afterok", (1, 2))
    assert Dependency("singleton").job_ids == ()
    assert Dependency(kind="after", job_ids=(3,)) == Dependency("after", (3,))
    assert len({a, Dependency("afterok", (1, 2)), Dependency("singleton")}) == 2
    assert repr(a) == "Dependency(kind='afterok', job_ids=(1, 2))"
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(AttributeError):
        a.kind = "after"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        a.other = 1  # type: ignore[attr-defined]
    match a:
        case Dependency("afterok", ids):
            assert ids == (1, 2)
        case _:
            pytest.fail("Dependency does not match positionally")


def test_records_keep_their_fields_and_defaults():
    f = Field("JOBID", lambda row, now: row["job_id"])
    assert (f.header, f.cut, f.cut_header) == ("JOBID", True, True)
    assert Field("X", f.get, cut=False).cut is False
    s = Spec(None, text="|")
    assert (s.field, s.width, s.right, s.auto, s.text) == (None, 0, False, False, "|")
    assert Spec(f, 5) == Spec(f, 5, False, False, "")
    o = Option("nodes", "N", "required", lambda v, ctx: {})
    assert o.env is None and o.commands == frozenset({"sbatch", "srun"})
    r = SbatchRequest({"name": "x"})
    assert (r.parsable, r.test_only, r.wait) == (False, False, False)
    assert SrunRequest({}).command == [] and SrunRequest({}).command is not SrunRequest({}).command
    assert parse_srun(["hostname"], cwd="/tmp", environ={}).command == ["hostname"]
    c = Column("JobID", -12, lambda row, now: 1)
    assert (c.name, c.width) == ("JobID", -12)
    for record in (f, s, o, r, c):
        with pytest.raises(AttributeError):
            record.width = 3  # type: ignore[misc]
