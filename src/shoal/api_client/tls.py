"""TLS rules the server, the agents and the commands share (stdlib only, imported only where
TLS is in play): when a listener serves HTTPS, and the client context that trusts the cluster CA."""

from __future__ import annotations

import ipaddress
import socket
import ssl

WILDCARDS = ("", "0.0.0.0", "::", "[::]")
MODES = ("auto", "on", "off")


def serves_tls(mode: str, host: str) -> bool:
    """``--tls``: on, off, or auto (on unless the listen address is loopback)."""
    if mode in ("on", "off"):
        return mode == "on"
    if host in WILDCARDS:
        return True
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: loopback only if every address it has is
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return True
        return not all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def cluster_context(ca_file: str | None = None, ca_data: str | None = None) -> ssl.SSLContext:
    """A client context that verifies peers against the cluster CA (PEM file or text; neither:
    the system's CAs). Raises OSError or ssl.SSLError when the CA cannot be loaded."""
    return ssl.create_default_context(cafile=ca_file, cadata=ca_data)
