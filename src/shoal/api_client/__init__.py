"""The client library of Shoal's API: where the server is, who we are, a small HTTP/1.1 client and
its errors (``tls``: the cluster's TLS rules). The commands, the agent and the gateway use it; it
imports none of them.

The Slurm-compatible commands are run in tight loops by users' scripts, so this module
imports only the standard library's cheapest parts: ``http.client`` alone costs ~30 ms
(it pulls in the email package), so requests are written on a plain socket instead, and
``urllib.parse`` (~6 ms with the ``ipaddress`` it imports) gives way to the few lines of
URL splitting and percent-encoding below, which behave as urllib.parse does.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, NoReturn

DEFAULT_CONFIG = "~/.config/shoal/config.yaml"


class ClientError(Exception):
    """A request the server refused, or a server that could not be reached. Carries the message to print."""

    def __init__(self, message: str, status: int | None = None, body: Any = None):
        super().__init__(message)
        self.status = status
        self.body = body  # the decoded JSON answer, for callers that read structured errors


def config_path() -> str:
    return os.path.expanduser(os.environ.get("SHOAL_CONFIG") or DEFAULT_CONFIG)


def load_config() -> dict:
    """Read the client configuration: $SHOAL_CONFIG or ~/.config/shoal/config.yaml.

    `shoal up` writes it as JSON (a subset of YAML, so it stays a valid .yaml file and
    reads without importing a YAML parser); a hand-written YAML file also works.
    Environment variables SHOAL_SERVER and SHOAL_TOKEN override the file.
    """
    conf: dict = {}
    path = config_path()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    except OSError as e:
        raise ClientError(f"cannot read client configuration {path}: {e.strerror}") from None
    if text.strip():
        try:
            conf = json.loads(text)
        except ValueError:
            import yaml  # only for hand-written files

            try:
                conf = yaml.safe_load(text) or {}
            except yaml.YAMLError as e:
                raise ClientError(f"client configuration {path} is not valid YAML: {e}") from None
        if not isinstance(conf, dict):
            raise ClientError(f"client configuration {path} must be a mapping with 'server' and 'token'")
    if isinstance(conf.get("server"), list):  # several servers sharing a store, as a YAML list
        conf["server"] = ",".join(str(u) for u in conf["server"])
    if os.environ.get("SHOAL_SERVER"):
        conf["server"] = os.environ["SHOAL_SERVER"]
    if os.environ.get("SHOAL_TOKEN"):
        conf["token"] = os.environ["SHOAL_TOKEN"]
    if os.environ.get("SHOAL_CA"):
        conf["ca_file"] = os.environ["SHOAL_CA"]
        conf.pop("ca_data", None)
    if not conf.get("server"):
        raise ClientError(
            f"no Shoal server configured: start a local cluster with 'shoal up', "
            f"or write 'server' and 'token' to {path} (or set SHOAL_SERVER and SHOAL_TOKEN)"
        )
    return conf


def write_config(path: str, server: str, token: str, ca_pem: str | None = None) -> None:
    """Write a client configuration (0600): the server URLs, the token and, for HTTPS, the
    cluster CA certificate itself (``ca_data``), so the file alone is enough on any machine."""
    conf = {"server": server, "token": token}
    if ca_pem:
        conf["ca_data"] = ca_pem
    write_private_json(path, conf)


def write_private_json(path: str, doc: dict) -> None:
    """Write ``doc`` as JSON (also valid YAML) to ``path``, readable by its owner only: it
    holds a token."""
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


class Client:
    """JSON over HTTP to the Shoal server, authenticated with a bearer token.

    ``server`` may name several servers, comma-separated (servers sharing one store): a
    request goes to the one that last answered, and to the next when it cannot be reached.
    An ``https://`` server's certificate is checked against the cluster CA: ``ca_file`` (default
    $SHOAL_CA) or ``ca_data`` (PEM text), else the system's trusted CAs.

    A command makes a request or two and exits: each goes on a connection of its own
    (``Connection: close``). ``keep_alive`` (the node agents: a heartbeat every few seconds and
    a long-poll, for days) keeps connections open between requests, as kubelet keeps its
    connection to the API server: a new TCP connection (and TLS handshake) per heartbeat was
    most of what a heartbeat cost the server (docs/SCALE.md). A request on a kept connection
    that the server had closed meanwhile (its keep-alive timeout) is sent again on a new one,
    once, when not a byte of an answer came back: such a request was never read. Only
    requests that may be repeated (the agents' are) belong on a keep-alive client.
    """

    def __init__(self, server: str, token: str | None = None, timeout: float = 30.0, *,
                 ca_file: str | None = None, ca_data: str | None = None, keep_alive: bool = False):
        self.servers = [u.strip() for u in server.split(",") if u.strip()] or [server]
        self.keep_alive = keep_alive
        self._idle: list[tuple[str, socket.socket]] = []  # kept connections, by the server they reach
        self._lock = threading.Lock() if keep_alive else None
        self._use(self.servers[0])
        self.token = token
        self.timeout = timeout
        self.ca_file = ca_file or os.environ.get("SHOAL_CA") or None
        self.ca_data = ca_data
        # A job's own credential lets srun create steps inside its allocation.
        self.job_token = os.environ.get("SHOAL_JOB_TOKEN")

    @classmethod
    def from_config(cls) -> "Client":
        conf = load_config()
        return cls(conf["server"], conf.get("token"), ca_file=conf.get("ca_file"), ca_data=conf.get("ca_data"))

    def ca_pem(self) -> str | None:
        """The cluster CA certificate this client trusts, as PEM text (None: the system's)."""
        if self.ca_data:
            return self.ca_data
        if self.ca_file:
            try:
                with open(self.ca_file, encoding="ascii") as f:
                    return f.read()
            except OSError as e:
                raise ClientError(f"cannot read the cluster CA certificate {self.ca_file}: {e.strerror}") from None
        return None

    def get(self, path: str, params: dict | None = None, timeout: float | None = None):
        if params:
            clean = {k: v for k, v in params.items() if v is not None}
            if clean:
                path = f"{path}?{urlencode(clean)}"
        return self.request("GET", path, timeout=timeout)

    def get_bytes(self, path: str) -> bytes:
        """GET an answer that is not JSON (a batch script), as the bytes the server sent."""
        status, data = self._roundtrip(lambda: self._message("GET", path, None, gzip=True), self.timeout)
        if status >= 400:
            raise _status_error(status, _json_or_none(data), data)
        return data

    def post(self, path: str, body: dict | None = None, timeout: float | None = None):
        return self.request("POST", path, body if body is not None else {}, timeout=timeout)

    def patch(self, path: str, body: dict):
        return self.request("PATCH", path, body)

    def delete(self, path: str):
        return self.request("DELETE", path)

    def _use(self, server: str) -> None:
        scheme, hostname, port, path = split_url(server if "://" in server else "http://" + server)
        self.scheme = scheme
        self.host = hostname or "127.0.0.1"
        self.port = port or (443 if scheme == "https" else 80)
        self.base = path.rstrip("/")
        self.server = server

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        status, data = self._roundtrip(lambda: self._message(method, path, body, gzip=True),
                                       timeout or self.timeout)
        doc = _json_or_none(data)
        if status >= 400:
            raise _status_error(status, doc, data)
        return doc

    def stream(self, path: str, params: dict | None = None, read_timeout: float | None = None,
               method: str = "GET", body: dict | None = None):
        """Send the request and yield the answer's bytes as they arrive (``logs -f``, ``exec``):
        chunked or not.

        ``read_timeout`` bounds each wait for data; None waits as long as the server keeps
        the answer open. An error status raises ClientError as ``request`` does.
        """
        if params:
            clean = {k: v for k, v in params.items() if v is not None}
            if clean:
                path = f"{path}?{urlencode(clean)}"
        sock = self._connect(self.timeout)
        try:
            try:
                sock.sendall(self._message(method, path, body))
                sock.settimeout(read_timeout)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                if b"\r\n\r\n" not in buf:
                    raise ClientError("the server sent a malformed HTTP response")
                head, _, rest = buf.partition(b"\r\n\r\n")
                status, _ = _parse_head(head)
                chunked = b"transfer-encoding: chunked" in head.lower()
                if status >= 400:
                    while True:
                        chunk = sock.recv(65536)
                        if not chunk:
                            break
                        rest += chunk
                    try:
                        data = _dechunk(rest) if chunked else rest
                    except ClientError:
                        data = rest
                    try:
                        doc = json.loads(data) if data else None
                    except ValueError:
                        doc = None
                    raise _status_error(status, doc, data)
                yield from (_dechunk_stream(sock, rest) if chunked else _raw_stream(sock, rest))
            except socket.timeout:
                raise ClientError(f"the Shoal server at {self.server} sent nothing for {read_timeout:g}s") from None
            except OSError as e:
                raise ClientError(f"connection to the Shoal server at {self.server} failed: {e}") from None
        finally:
            sock.close()

    def _message(self, method: str, path: str, body: dict | None, gzip: bool = False) -> bytes:
        """The request's bytes; ``gzip``: the answer may come gzipped (whole answers only, which
        ``_parse_response`` decodes: a long listing is a twentieth of its size so)."""
        payload = b"" if body is None else json.dumps(body).encode()
        headers = [
            f"{method} {self.base}{path} HTTP/1.1",
            f"Host: {f'[{self.host}]' if ':' in self.host else self.host}:{self.port}",
            "Connection: keep-alive" if self.keep_alive else "Connection: close",
            "Accept: application/json",
            f"User-Agent: shoal-cli/{os.path.basename(sys.argv[0] or 'shoal')}",
        ]
        if gzip:
            headers.append("Accept-Encoding: gzip")
        if self.token:
            headers.append(f"Authorization: Bearer {self.token}")
        if self.job_token:
            headers.append(f"X-Shoal-Job-Token: {self.job_token}")
        user = _login_name()
        if user:
            headers.append(f"X-Shoal-User: {quote(user)}")
        if body is not None:
            headers.append("Content-Type: application/json")
        headers.append(f"Content-Length: {len(payload)}")
        return ("\r\n".join(headers) + "\r\n\r\n").encode() + payload

    def _connect(self, timeout: float) -> socket.socket:
        first = self.servers.index(self.server) if self.server in self.servers else 0
        for i in range(len(self.servers)):
            if i:  # nothing was sent to the last one: trying the next is safe for any request
                self._use(self.servers[(first + i) % len(self.servers)])
            try:
                sock = socket.create_connection((_address_host(self.host), self.port), timeout=timeout)
                break
            except OSError as e:
                error = e
        else:
            where = f"at {self.server}" if len(self.servers) == 1 else f"at any of {', '.join(self.servers)}"
            raise ClientError(
                f"cannot reach the Shoal server {where}: {error.strerror or error} "
                f"(is the cluster up? try 'shoal up')"
            ) from None
        if self.scheme == "https":
            sock = self._tls(sock)
        return sock

    def tls_context(self):
        """An ``ssl.SSLContext`` that trusts the cluster CA: for the server, and for srun the agents."""
        import ssl  # only for https: it costs start-up time

        from shoal.api_client.tls import cluster_context

        try:
            return cluster_context(self.ca_file, self.ca_data)
        except (OSError, ssl.SSLError) as e:
            raise ClientError(f"cannot load the cluster CA certificate {self.ca_file or '(ca_data)'}: "
                              f"{getattr(e, 'strerror', None) or e}") from None

    def _tls(self, sock: socket.socket) -> socket.socket:
        import ssl

        try:
            context = self.tls_context()
        except ClientError:
            sock.close()
            raise
        try:
            return context.wrap_socket(sock, server_hostname=self.host)
        except ssl.SSLCertVerificationError as e:
            sock.close()
            raise ClientError(
                f"the Shoal server at {self.server} has a TLS certificate this client does not trust "
                f"({e.verify_message}): give the cluster's CA certificate (ca.crt in the server's state dir) "
                f"as 'ca_file' in {config_path()}, or set $SHOAL_CA to its path") from None
        except (ssl.SSLError, OSError) as e:
            sock.close()
            raise ClientError(f"TLS handshake with the Shoal server at {self.server} failed: {e}") from None

    def close(self) -> None:
        """Close the kept connections (a keep-alive client)."""
        if self._lock is not None:
            with self._lock:
                idle, self._idle = self._idle, []
            for _, sock in idle:
                sock.close()

    def _roundtrip(self, message: Callable[[], bytes], timeout: float) -> tuple[int, bytes]:
        if self.keep_alive:
            return self._kept_roundtrip(message, timeout)
        sock = self._connect(timeout)
        try:
            try:
                sock.sendall(message())  # built for the server connected to (Host, base path)
            except (BrokenPipeError, ConnectionResetError):
                # A server that refuses a request early (413: too large) answers and closes
                # before reading it all: its answer, when it reached us, says why.
                pass
            chunks: list[bytes] = []
            while True:
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    if not chunks:
                        raise
                    break  # the reset of a server that closed with our request unread: its answer is in
                if not chunk:
                    break
                chunks.append(chunk)
        except socket.timeout:
            raise ClientError(f"the Shoal server at {self.server} did not answer within {timeout:g}s") from None
        except OSError as e:
            raise ClientError(f"connection to the Shoal server at {self.server} failed: {e}") from None
        finally:
            sock.close()
        if not chunks and self.scheme == "http":
            raise ClientError(f"the Shoal server at {self.server} closed the connection without answering "
                              f"(if it serves HTTPS, use an https:// URL)")
        return _parse_response(b"".join(chunks))


    def _kept_roundtrip(self, message: Callable[[], bytes], timeout: float) -> tuple[int, bytes]:
        """A request on a kept connection (or a new one), which stays open for the next when
        the answer allows it."""
        for attempt in (0, 1):
            sock, reused = self._checkout(timeout)
            keep = False
            try:
                sock.settimeout(timeout)
                try:
                    sock.sendall(message())
                except (BrokenPipeError, ConnectionResetError):
                    if reused and not attempt:
                        continue  # closed by the server while it was idle: a new connection
                    # else as a closed connection's: the server's early answer (413), if any, is in
                status, body, keep = _read_answer(sock)
            except _NoAnswer:
                if reused and not attempt:
                    continue
                raise ClientError(f"the Shoal server at {self.server} closed the connection without answering "
                                  f"(if it serves HTTPS, use an https:// URL)") from None
            except socket.timeout:
                raise ClientError(f"the Shoal server at {self.server} did not answer within {timeout:g}s") from None
            except OSError as e:
                raise ClientError(f"connection to the Shoal server at {self.server} failed: {e}") from None
            finally:
                if keep:
                    with self._lock:  # type: ignore[union-attr]
                        self._idle.append((self.server, sock))
                else:
                    sock.close()
            return status, body
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _checkout(self, timeout: float) -> tuple[socket.socket, bool]:
        """A kept connection to the current server that the server has not closed, else a new
        one; and whether it was kept."""
        while True:
            with self._lock:  # type: ignore[union-attr]
                if not self._idle:
                    break
                server, sock = self._idle.pop()
            if server == self.server and not _closed(sock):
                return sock, True
            sock.close()
        return self._connect(timeout), False


def raise_open_files_limit() -> None:
    """The soft limit on open files raised to the hard one, as servers do (Go's runtime does it
    by itself), for a process holding many connections: the server, the hollow agents. Every
    node agent keeps two (its long-poll and its heartbeats'), 10,000 at 5,000 nodes, past the
    usual soft limit of 1,024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # as it was: a smaller cluster needs no more


class _NoAnswer(Exception):
    """The connection closed before a byte of the answer came."""


def _closed(sock: socket.socket) -> bool:
    """Whether an idle kept connection was closed by the server (it is readable: EOF; an idle
    HTTP connection has nothing else to say). poll, not select: select refuses descriptors
    past 1,024, and a process of many connections (the hollow agents) has them."""
    import select

    try:
        poll = select.poll()
        poll.register(sock, select.POLLIN)
        return bool(poll.poll(0))
    except (OSError, ValueError):
        return True


def _read_answer(sock: socket.socket) -> tuple[int, bytes, bool]:
    """One whole HTTP answer from a connection that may carry more: its status, its body,
    and whether the connection may be used again. Reads no further than the answer."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            if buf:
                raise ClientError(_CUT)
            raise _NoAnswer()
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    status, headers = _parse_head(head)
    keep = headers.get(b"connection", b"").lower() != b"close"
    body, keep = _framed_body(sock, headers, body, keep)
    if headers.get(b"content-encoding", b"").lower() == b"gzip":
        body = _gunzip(body)
    return status, body, keep


def _framed_body(sock: socket.socket, headers: dict[bytes, bytes], body: bytes, keep: bool) -> tuple[bytes, bool]:
    """The answer's body as its headers frame it, read from ``sock`` past what came with
    them (``body``), and whether the connection may carry another answer."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        data = bytearray(body)
        while True:
            if data.endswith(b"0\r\n\r\n"):
                try:
                    return _dechunk(bytes(data)), keep
                except ClientError:
                    pass  # "0\r\n\r\n" inside a chunk's data: more to come
            chunk = sock.recv(65536)
            if not chunk:
                raise ClientError(_CUT)
            data += chunk
    if b"content-length" in headers:
        length = int(headers[b"content-length"])
        parts, have = [body], len(body)
        while have < length:
            chunk = sock.recv(max(65536, length - have))
            if not chunk:
                raise ClientError(_CUT)
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts)[:length], keep
    rest = [body]  # neither: the answer ends with the connection
    while chunk := sock.recv(65536):
        rest.append(chunk)
    return b"".join(rest), False


_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.")
_C0_CONTROL_OR_SPACE = "".join(map(chr, range(33)))


def split_url(url: str) -> tuple[str, str | None, int | None, str]:
    """``(scheme, hostname, port, path)`` of a URL, as urllib.parse.urlsplit gives them.

    The same rules: leading C0 controls and spaces are stripped and tabs and line breaks
    removed; the hostname loses its user info and ``[]`` and is lower-cased (an IPv6 zone
    keeps its case); a bad port or bracket raises the same ValueError. Only netlocs that
    are not ASCII (rare, and needing Unicode normalisation checks) go to urllib.parse.
    """
    original = url
    url = url.lstrip(_C0_CONTROL_OR_SPACE).replace("\t", "").replace("\r", "").replace("\n", "")
    scheme = netloc = ""
    i = url.find(":")
    if i > 0 and url[0].isascii() and url[0].isalpha() and _SCHEME_CHARS.issuperset(url[:i]):
        scheme, url = url[:i].lower(), url[i + 1:]
    if url[:2] == "//":
        end = len(url)
        for c in "/?#":
            at = url.find(c, 2)
            if at >= 0:
                end = min(end, at)
        netloc, url = url[2:end], url[end:]
        if not netloc.isascii():
            from urllib.parse import urlsplit

            parts = urlsplit(original)
            return parts.scheme, parts.hostname, parts.port, parts.path
        if ("[" in netloc) != ("]" in netloc):
            raise ValueError("Invalid IPv6 URL")
        if "[" in netloc:
            _check_bracketed_host(netloc.partition("[")[2].partition("]")[0])
    path = url.partition("#")[0].partition("?")[0]
    hostinfo = netloc.rpartition("@")[2]
    _, bracket, bracketed = hostinfo.partition("[")
    if bracket:
        hostname, _, port_text = bracketed.partition("]")
        port_text = port_text.partition(":")[2]
    else:
        hostname, _, port_text = hostinfo.partition(":")
    host, percent, zone = hostname.partition("%")
    port = None
    if port_text:
        if not (port_text.isdigit() and port_text.isascii()):
            raise ValueError(f"Port could not be cast to integer value as {port_text!r}")
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError("Port out of range 0-65535")
    return scheme, (host.lower() + percent + zone) or None, port, path


def _check_bracketed_host(hostname: str) -> None:
    """urllib.parse's check of a ``[...]`` host: an IPv6 address or an IPvFuture ``v1.x``."""
    if hostname.startswith("v"):
        import re

        if not re.match(r"\Av[a-fA-F0-9]+\..+\Z", hostname):
            raise ValueError("IPvFuture address is invalid")
    else:
        import ipaddress  # only for IPv6 literals: it costs start-up time

        if isinstance(ipaddress.ip_address(hostname), ipaddress.IPv4Address):
            raise ValueError("An IPv4 address cannot be in brackets")


_ALWAYS_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_QUOTE = tuple(chr(b) if b in _ALWAYS_SAFE else f"%{b:02X}" for b in range(256))
_QUOTE_PATH = _QUOTE[:47] + ("/",) + _QUOTE[48:]  # quote()'s default safe="/"
_QUOTE_PLUS = _QUOTE[:32] + ("+",) + _QUOTE[33:]


def quote(text: str | bytes) -> str:
    """urllib.parse.quote(text): UTF-8 percent-encoding, keeping letters, digits, ``_.-~/``."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return "".join([_QUOTE_PATH[b] for b in data])


def quote_plus(text: str | bytes) -> str:
    """urllib.parse.quote_plus(text): as quote, but spaces become ``+`` and ``/`` is encoded."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return "".join([_QUOTE_PLUS[b] for b in data])


def urlencode(params: Mapping[Any, Any]) -> str:
    """urllib.parse.urlencode(params, doseq=True): ``k=v&...``, a sequence value repeats its key."""
    out = []
    for k, v in params.items():
        key = quote_plus(k if isinstance(k, bytes) else str(k))
        if isinstance(v, (str, bytes)):
            out.append(f"{key}={quote_plus(v)}")
            continue
        try:
            len(v)
        except TypeError:
            out.append(f"{key}={quote_plus(str(v))}")
            continue
        for item in v:
            out.append(f"{key}={quote_plus(item if isinstance(item, (str, bytes)) else str(item))}")
    return "&".join(out)


def _address_host(host: str) -> str | bytes:
    """The host for getaddrinfo: ASCII names and addresses as bytes, so that a str does
    not make the socket module import the ``idna`` codec (and unicodedata) to encode it."""
    return host.encode("ascii") if host.isascii() else host


_CUT = "the Shoal server closed the connection before its answer was complete (did it stop?)"


def _parse_response(data: bytes) -> tuple[int, bytes]:
    """The status and body of a whole HTTP answer; ClientError when it was cut short (a server
    killed while answering), so a half-read answer is never taken for an empty one."""
    head, sep, body = data.partition(b"\r\n\r\n")
    status, headers = _parse_head(head)
    if not sep:
        raise ClientError(_CUT)
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = _dechunk(body)
    elif b"content-length" in headers:
        length = int(headers[b"content-length"])
        if len(body) < length:
            raise ClientError(_CUT)
        body = body[:length]
    if headers.get(b"content-encoding", b"").lower() == b"gzip":
        body = _gunzip(body)
    return status, body


def _gunzip(body: bytes) -> bytes:
    import zlib  # only for a gzipped answer (a long listing)

    # The output buffer made once at the size gzip's trailer gives (its last 4 bytes, modulo
    # 2**32; bounded, as a hint only): grown from 16 KiB, the 1.5 MB of squeue's answer over a
    # storm's queue cost a new process's first request 0.6 ms more, a third of the gunzip.
    size = min(int.from_bytes(body[-4:], "little"), 1 << 28) if len(body) >= 18 else 0
    try:
        return zlib.decompress(body, 16 + zlib.MAX_WBITS, size or zlib.DEF_BUF_SIZE)  # gzip's header and trailer
    except zlib.error:
        raise ClientError("the server sent a malformed gzipped answer") from None


def _parse_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise ClientError("the server sent a malformed HTTP response") from None
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


def _dechunk(body: bytes) -> bytes:
    out = []
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            raise ClientError("the server sent a malformed HTTP response") from None
        if size == 0:
            return b"".join(out)
        if len(rest) < size:
            break
        out.append(rest[:size])
        body = rest[size + 2 :]
    raise ClientError(_CUT)  # no last (empty) chunk: the answer was cut short


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


def _status_error(status: int, doc: Any, data: bytes) -> ClientError:
    detail = doc.get("detail") if isinstance(doc, dict) else None
    if isinstance(detail, list):  # validation errors: name the field
        detail = "; ".join(field_error(d) for d in detail)
    return ClientError(str(detail or data.decode(errors="replace") or f"HTTP {status}"), status, doc)


def _raw_stream(sock: socket.socket, rest: bytes):
    if rest:
        yield rest
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return
        yield chunk


def _dechunk_stream(sock: socket.socket, buf: bytes):
    """Chunked transfer-coding decoded as the chunks arrive."""

    def fill(need: int) -> bool:
        nonlocal buf
        while len(buf) < need:
            chunk = sock.recv(65536)
            if not chunk:
                return False
            buf += chunk
        return True

    while True:
        while b"\r\n" not in buf:
            if not fill(len(buf) + 1):
                return
        size_line, _, buf = buf.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            raise ClientError("the server sent a malformed chunked response") from None
        if size == 0:
            return
        if not fill(size + 2):
            if buf:
                yield buf[:size]
            return
        yield buf[:size]
        buf = buf[size + 2:]


def field_error(d: dict) -> str:
    loc = ".".join(str(p) for p in d.get("loc", ()) if p not in ("body",))
    return f"{loc}: {d.get('msg')}" if loc else str(d.get("msg"))


def _login_name() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        return os.environ.get("USER", "")


class RunLocally(Exception):
    """An invocation the server will not run for a thin front end: it needs the command's own
    process (standard input, a terminal, waiting for a job, help sized to the terminal)."""


def program_name() -> str:
    """The name this process was started as (``sbatch``), for its error messages."""
    return os.path.basename(sys.argv[0]) or "shoal"


def print_error(stream, prog: str, message: str) -> int:
    """Write a command's error the way Slurm's commands do; the exit code to return (1)."""
    print(f"{prog}: error: {message}", file=stream)
    return 1


def fail(message: str, code: int = 1) -> NoReturn:
    """Print a command's error the way Slurm's commands do, and exit."""
    print_error(sys.stderr, program_name(), message)
    raise SystemExit(code)
