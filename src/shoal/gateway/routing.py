"""The routing table, which Service a request addresses, and which backend serves it. Pure.

The server sends the table as JSON (docs/SERVING.md, "Gateway"). ``RoutingTable.from_json``
turns one version of it into frozen objects once, so a request costs a parse of its Host
header or path and a few dictionary look-ups. ``Balancer`` holds the little state that
backend choice needs (weighted round-robin counters, tie-break turns); the outstanding
request counts are the proxy's and are passed in.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

PROXY_PREFIX = "/shoal/v1/namespaces/"
CLUSTER_SUFFIXES = ((), ("svc",), ("svc", "cluster", "local"))


class RoutesError(ValueError):
    """A routes document that is not shaped as docs/SERVING.md says; the last good table stays."""


class ServiceNotFound(LookupError):
    """The request names no Service the table knows (HTTP 404); the message says which one it asked for."""


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One entry of a Service's ``ports``: clients ask for ``port`` (or ``name``); pods listen on ``target_port``."""

    port: int
    name: str = ""
    target_port: int | str | None = None
    index: int = 0  # place in the Service's list: the backends' own ``port`` is the first one's


@dataclass(frozen=True, slots=True)
class Backend:
    """One pod behind a Service, as the server last reported it."""

    namespace: str
    pod: str
    deployment: str
    address: str
    port: int
    ready: bool = True
    terminating: bool = False
    # Per Service port (by name, or by number as text): the pod's port, for multi-port Services.
    named_ports: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    @property
    def serving(self) -> bool:
        """Takes new requests: ready and not being deleted."""
        return self.ready and not self.terminating

    def target(self, port: ServicePort | None) -> tuple[str, int]:
        """``(address, port)`` to connect to for a request to ``port`` of the Service.

        The backend's ``port`` is the pod's port for the Service's first port (the server
        resolves named targetPorts); for a further port of a multi-port Service, the
        backend's ``ports`` entry for it, else its numeric targetPort."""
        if port is not None and port.index > 0:
            for key, value in self.named_ports:
                if key == port.name or key == str(port.port):
                    return self.address, value
            if isinstance(port.target_port, int):
                return self.address, port.target_port
        return self.address, self.port


@dataclass(frozen=True, slots=True)
class Group:
    """Backends that share one traffic-split weight: a Deployment's pods, or all of them without a split."""

    name: str
    weight: int
    backends: tuple[Backend, ...]  # serving ones only


@dataclass(frozen=True, slots=True)
class Service:
    namespace: str
    name: str
    ports: tuple[ServicePort, ...] = ()
    scale_to_zero: bool = False
    split: tuple[tuple[str, int], ...] = ()
    backends: tuple[Backend, ...] = ()
    groups: tuple[Group, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def serving(self) -> bool:
        """Some group with a weight has a backend that takes new requests."""
        return any(g.weight > 0 and g.backends for g in self.groups)

    def port(self, wanted: str | None, strict: bool = True) -> ServicePort | None:
        """The port asked for by name or number; the first when none is asked for.

        With ``strict`` a port the Service lacks raises ServiceNotFound; without it (the
        Host header's port, which is usually the gateway's own) the first port is used."""
        if not self.ports:
            if wanted and strict:
                raise ServiceNotFound(f"service {self.key} has no port {wanted}")
            return None
        if not wanted:
            return self.ports[0]
        for p in self.ports:
            if p.name == wanted or (wanted.isdigit() and p.port == int(wanted)):
                return p
        if strict:
            names = ", ".join(p.name or str(p.port) for p in self.ports)
            raise ServiceNotFound(f"service {self.key} has no port {wanted!r} (it has: {names})")
        return self.ports[0]


@dataclass(frozen=True, slots=True)
class Address:
    """What a request asks for: a Service, maybe a port, and the path (with query) to forward."""

    namespace: str
    name: str
    port: str | None
    path: str
    by_proxy_path: bool


@dataclass(frozen=True, slots=True)
class Route:
    service: Service
    port: ServicePort | None
    path: str  # path and query string to send to the backend


def parse_address(host: str | None, target: str) -> Address | None:
    """The Service a request addresses, from its request target or its Host header.

    ``target`` is the raw request target (path and query). The API-server proxy path
    ``/shoal/v1/namespaces/NS/services/[SCHEME:]NAME[:PORT]/proxy/REST`` wins and forwards
    ``/REST``; otherwise the Host header ``NAME.NAMESPACE[.svc[.cluster.local]][:PORT]``
    names the Service and the target is forwarded as it is. None when neither does.
    """
    if target.startswith(PROXY_PREFIX):
        path, sep, query = target.partition("?")
        parts = path.split("/", 8)  # "", api, v1, namespaces, NS, services, ID, proxy, REST
        if len(parts) >= 8 and parts[5] == "services" and parts[7] == "proxy" and parts[4] and parts[6]:
            ids = parts[6].split(":")
            if len(ids) <= 3:
                # As Kubernetes splits it: NAME, NAME:PORT, SCHEME:NAME:PORT.
                name = ids[0] if len(ids) < 3 else ids[1]
                port = (ids[1] if len(ids) == 2 else ids[2] if len(ids) == 3 else "") or None
                rest = "/" + (parts[8] if len(parts) > 8 else "")
                return Address(parts[4], name, port, rest + sep + query, True)
    if not host:
        return None
    name_part, port = _split_host(host)
    labels = name_part.rstrip(".").lower().split(".")
    if len(labels) >= 2 and tuple(labels[2:]) in CLUSTER_SUFFIXES and labels[0] and labels[1]:
        return Address(labels[1], labels[0], port, target, False)
    return None


def _split_host(host: str) -> tuple[str, str | None]:
    if host.startswith("["):  # an IPv6 literal never names a Service
        return "", None
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit():
        return name, port
    return host, None


@dataclass(frozen=True)
class RoutingTable:
    """One version of the routes: Services by (namespace, name)."""

    version: Any = None
    services: Mapping[tuple[str, str], Service] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # services left out because their entry was malformed

    @classmethod
    def from_json(cls, doc: Any) -> RoutingTable:
        """Parse a routes document; a malformed Service is left out (and named in ``problems``)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("services", []), list):
            raise RoutesError("routes must be an object with a 'services' list")
        services: dict[tuple[str, str], Service] = {}
        problems: list[str] = []
        for i, entry in enumerate(doc.get("services", [])):
            try:
                svc = _service(entry)
            except (KeyError, TypeError, ValueError) as e:
                label = entry.get("name", f"#{i}") if isinstance(entry, dict) else f"#{i}"
                problems.append(f"service {label}: {e}")
                continue
            services[(svc.namespace, svc.name)] = svc
        return cls(doc.get("version"), services, tuple(problems))

    def lookup(self, host: str | None, target: str) -> Route:
        """The Route for a request; ServiceNotFound when it addresses no known Service."""
        addr = parse_address(host, target)
        if addr is None:
            raise ServiceNotFound(
                "no Service addressed: use Host NAME.NAMESPACE[.svc.cluster.local] or the path "
                "/shoal/v1/namespaces/NS/services/NAME[:PORT]/proxy/...")
        svc = self.services.get((addr.namespace, addr.name))
        if svc is None:
            raise ServiceNotFound(f"service {addr.namespace}/{addr.name} not found")
        return Route(svc, svc.port(addr.port, strict=addr.by_proxy_path), addr.path)


def _service(entry: dict) -> Service:
    namespace = str(entry.get("namespace") or "default")
    name = str(entry["name"])
    ports = tuple(
        ServicePort(int(p["port"]), str(p.get("name") or ""), _target_port(p.get("targetPort")), i)
        for i, p in enumerate(entry.get("ports") or ())
    )
    split_doc = entry.get("split") or {}
    if not isinstance(split_doc, dict):
        raise TypeError("split must map Deployment names to weights")
    split = tuple(sorted((str(k), _weight(v)) for k, v in split_doc.items()))
    backends = tuple(_backend(namespace, b) for b in entry.get("backends") or ())
    serving = [b for b in backends if b.serving]
    if split:
        groups = tuple(Group(d, w, tuple(b for b in serving if b.deployment == d)) for d, w in split)
    else:
        groups = (Group("", 1, tuple(serving)),)
    return Service(namespace, name, ports, bool(entry.get("scale_to_zero")), split, backends, groups)


def _backend(namespace: str, b: dict) -> Backend:
    named = b.get("ports") or {}
    return Backend(
        namespace=str(b.get("namespace") or namespace),
        pod=str(b["pod"]),
        deployment=str(b.get("deployment") or ""),
        address=str(b["address"]),
        port=int(b["port"]),
        ready=bool(b.get("ready", True)),
        terminating=bool(b.get("terminating", False)),
        named_ports=tuple(sorted((str(k), int(v)) for k, v in named.items())),
    )


def _target_port(value: Any) -> int | str | None:
    if value is None or value == "":
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    return str(value)


def _weight(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
        raise ValueError(f"split weight {value!r} is not a whole number >= 0")
    return int(value)


class Balancer:
    """Chooses the backend for each request of a Service.

    First the group: smooth weighted round-robin over the split's groups (nginx's
    algorithm: over any run of requests, each group's share is within one request of its
    weight's share, and the groups interleave). Groups with no backend left to try are
    skipped and their share goes to the others. Then, within the group, the backend with
    the fewest outstanding requests; ties go round-robin, so idle backends share the load.
    """

    def __init__(self) -> None:
        self._current: dict[str, dict[str, int]] = {}
        self._turn: dict[str, int] = {}

    def pick(self, service: Service, outstanding: Mapping[str, int],
             exclude: Collection[str] = ()) -> Backend | None:
        """A serving backend of ``service`` whose key is not in ``exclude``; None when none is left."""
        choices = []
        for g in service.groups:
            if g.weight <= 0:
                continue
            candidates = [b for b in g.backends if b.key not in exclude] if exclude else g.backends
            if candidates:
                choices.append((g, candidates))
        if not choices:
            return None
        if len(choices) == 1:
            candidates = choices[0][1]
        else:
            candidates = self._weighted(service, choices)
        return self._least_outstanding(service.key, candidates, outstanding)

    def _weighted(self, service: Service, choices: list) -> Collection[Backend]:
        current = self._current.setdefault(service.key, {})
        if len(current) > len(service.groups):  # a new split dropped a group: forget it
            names = {g.name for g in service.groups}
            for name in [n for n in current if n not in names]:
                del current[name]
        total = 0
        best = None
        for g, candidates in choices:
            total += g.weight
            current[g.name] = current.get(g.name, 0) + g.weight
            if best is None or current[g.name] > current[best[0].name]:
                best = (g, candidates)
        current[best[0].name] -= total
        return best[1]

    def _least_outstanding(self, key: str, candidates, outstanding: Mapping[str, int]) -> Backend:
        if len(candidates) == 1:
            return candidates[0]
        least = min(outstanding.get(b.key, 0) for b in candidates)
        tied = [b for b in candidates if outstanding.get(b.key, 0) == least]
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        return tied[turn % len(tied)]
