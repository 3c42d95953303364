"""What the kubectl-style commands print, as kubectl 1.30 prints it: pure functions over
Kubernetes-shaped object dicts (docs/SERVING.md), so the tests call them directly.

Tables and describe output go through ``tabwrite``, a copy of Go's text/tabwriter
algorithm: kubectl's column widths, its three-space gaps and the odd alignment blocks of
``kubectl describe`` all fall out of it. Everything here is stdlib-only and cheap to import.
"""

from __future__ import annotations

import json
import time
from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs start-up time
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

# ---------------------------------------------------------------- resource kinds


class Resource(namedtuple("Resource", "plural singular kind group short namespaced")):
    """A kind as kubectl names it: ``deployments``, ``deployment``, ``deploy``, ``Deployment``."""

    __slots__ = ()

    @property
    def qualified(self) -> str:
        """``deployment.apps``, ``pod``: how kubectl names one object's kind in its messages."""
        return f"{self.singular}.{self.group}" if self.group else self.singular

    @property
    def qualified_plural(self) -> str:
        """``deployments.apps``: the form of ``Error from server (NotFound)``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES = (
    Resource("pods", "pod", "Pod", "", ("po",), True),
    Resource("services", "service", "Service", "", ("svc",), True),
    Resource("deployments", "deployment", "Deployment", "apps", ("deploy",), True),
    Resource("replicasets", "replicaset", "ReplicaSet", "apps", ("rs",), True),
    Resource("horizontalpodautoscalers", "horizontalpodautoscaler", "HorizontalPodAutoscaler", "autoscaling",
             ("hpa",), True),
    Resource("namespaces", "namespace", "Namespace", "", ("ns",), False),
    Resource("priorityclasses", "priorityclass", "PriorityClass", "scheduling.k8s.io", ("pc",), False),
    Resource("events", "event", "Event", "", ("ev",), True),
    Resource("rolebindings", "rolebinding", "RoleBinding", "rbac.authorization.k8s.io", (), True),
    Resource("nodes", "node", "Node", "", ("no",), False),
    Resource("jobs", "job", "Job", "batch", (), True),
    Resource("secrets", "secret", "Secret", "", (), True),
)
BY_PLURAL = {r.plural: r for r in RESOURCES}
BY_KIND = {r.kind: r for r in RESOURCES}
_ALIASES = {}
for _r in RESOURCES:
    for _word in (_r.plural, _r.singular, _r.kind.lower(), *_r.short):
        _ALIASES[_word] = _r
        if _r.group:
            _ALIASES[f"{_word}.{_r.group}"] = _r
# `kubectl get all`: the "all" category, in kubectl's order.
ALL = tuple(BY_PLURAL[p] for p in ("pods", "services", "deployments", "replicasets", "horizontalpodautoscalers"))


class KindError(ValueError):
    """A resource type the server does not have; the message is kubectl's."""


def resolve_kind(word: str) -> Resource:
    """kubectl's names, short names, plurals and ``kind.group`` forms, case-insensitive."""
    r = _ALIASES.get(word.lower())
    if r is None:
        raise KindError(f'the server doesn\'t have a resource type "{word}"')
    return r


def resolve_kinds(text: str) -> list[Resource]:
    """``deploy,svc`` or ``all`` to kinds, in the order given, without repeats."""
    out: list[Resource] = []
    for word in text.split(","):
        if not word:
            continue
        for r in ALL if word.lower() == "all" else (resolve_kind(word),):
            if r not in out:
                out.append(r)
    if not out:
        raise KindError(f'the server doesn\'t have a resource type "{text}"')
    return out


def kind_of(obj: Mapping[str, Any]) -> Resource | None:
    return BY_KIND.get(obj.get("kind") or "")


def qualified_name(obj: Mapping[str, Any]) -> str:
    """``deployment.apps/vllm``: kubectl's ``-o name`` and ``apply`` form."""
    r = kind_of(obj)
    kind = r.qualified if r else str(obj.get("kind") or "").lower()
    return f"{kind}/{meta(obj).get('name', '')}"


def meta(obj: Mapping[str, Any]) -> dict:
    return obj.get("metadata") or {}


# ---------------------------------------------------------------- time


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery duration.HumanDuration: ``5s``, ``3m2s``, ``70m``, ``4h``, ``2d3h``, ``2y5d``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 60 * 2:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        sec = s % 60
        return f"{minutes}m" if sec == 0 else f"{minutes}m{sec}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def parse_time(value: Any) -> float | None:
    """An RFC 3339 timestamp (``2026-12-02T19:00:00Z``) or epoch seconds to epoch seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    from datetime import datetime, timezone

    try:
        dt = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def age(value: Any, now: float) -> str:
    """kubectl's translateTimestampSince: ``<unknown>`` without a timestamp."""
    t = parse_time(value)
    return "<unknown>" if t is None else human_duration(now - t)


def rfc1123z(value: Any) -> str:
    """Go's time.RFC1123Z in local time, as kubectl describe prints timestamps."""
    t = parse_time(value)
    if t is None:
        return "Mon, 01 Jan 0001 00:00:00 +0000"  # Go's zero time, as kubectl shows an unset one
    lt = time.localtime(t)
    days = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    months = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
    off = lt.tm_gmtoff // 60
    sign = "-" if off < 0 else "+"
    return (f"{days[lt.tm_wday]}, {lt.tm_mday:02d} {months[lt.tm_mon - 1]} {lt.tm_year} "
            f"{lt.tm_hour:02d}:{lt.tm_min:02d}:{lt.tm_sec:02d} {sign}{abs(off) // 60:02d}{abs(off) % 60:02d}")


def rfc3339_local(epoch: float) -> str:
    """Go's time.RFC3339 in local time (kubectl's restartedAt annotation)."""
    lt = time.localtime(epoch)
    off = lt.tm_gmtoff // 60
    zone = "Z" if off == 0 else f"{'-' if off < 0 else '+'}{abs(off) // 60:02d}:{abs(off) % 60:02d}"
    return time.strftime("%Y-%m-%dT%H:%M:%S", lt) + zone


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Go's time.ParseDuration (``5m``, ``1h30m``, ``300ms``, ``0``) to seconds, for --timeout."""
    s = text.strip()
    if s in ("0", "+0", "-0"):
        return 0.0
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    if not s:
        raise ValueError(f'time: invalid duration "{text}"')
    total, i = 0.0, 0
    while i < len(s):
        j = i
        while j < len(s) and (s[j].isdigit() or s[j] == "."):
            j += 1
        if j == i:
            raise ValueError(f'time: invalid duration "{text}"')
        number = s[i:j]
        k = j
        while k < len(s) and not (s[k].isdigit() or s[k] == "."):
            k += 1
        unit = s[j:k]
        if not unit:
            raise ValueError(f'time: missing unit in duration "{text}"')
        if unit not in _DURATION_UNITS:
            raise ValueError(f'time: unknown unit "{unit}" in duration "{text}"')
        try:
            total += float(number) * _DURATION_UNITS[unit]
        except ValueError:
            raise ValueError(f'time: invalid duration "{text}"') from None
        i = k
    return sign * total


# ---------------------------------------------------------------- quantities

_SUFFIXES = {
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50, "Ei": 2.0 ** 60,
}  # fmt: skip


def parse_quantity(value: Any) -> float:
    """A Kubernetes quantity (``500m``, ``200Gi``, ``1e3``, 4) as a number; bad text is 0."""
    if value is None:
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"):
        if text.endswith(suffix) and text[: -len(suffix)]:
            try:
                return float(text[: -len(suffix)]) * _SUFFIXES[suffix]
            except ValueError:
                return 0.0
    try:
        return float(text)
    except ValueError:
        return 0.0


def format_quantity(value: Any, binary: bool = False) -> str:
    """A number as Quantity.String() writes it: ``750m``, ``4``, ``1500``, ``2k``; ``binary``
    sizes (memory) in ``Ki``/``Mi``/``Gi`` when they divide evenly. Text passes through."""
    if isinstance(value, str):
        return value
    v = float(value or 0)
    if v == 0:
        return "0"
    if binary and v == int(v) and v >= 1024:
        n = int(v)
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            unit = int(_SUFFIXES[suffix])
            if n % unit == 0:
                return f"{n // unit}{suffix}"
        return str(n)
    milli = round(v * 1000)
    if milli % 1000:
        return f"{milli}m"
    n = milli // 1000
    for suffix, unit in (("E", 10 ** 18), ("P", 10 ** 15), ("T", 10 ** 12), ("G", 10 ** 9), ("M", 10 ** 6),
                         ("k", 10 ** 3)):
        if abs(n) >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def quantity_text(value: Any) -> str:
    """A quantity from a manifest or status as kubectl shows it."""
    if value is None:
        return "<unset>"
    if isinstance(value, bool):
        return str(value).lower()
    return format_quantity(value)


# ---------------------------------------------------------------- Go's text/tabwriter


def tabwrite(text: str, minwidth: int, padding: int, remembered: list[int] | None = None) -> str:
    """Align tab-separated cells as Go's text/tabwriter does (padchar ' ', no flags).

    A cell ends with a tab; the text after a line's last tab belongs to no column. A column
    is aligned over each run of consecutive lines that have a cell in it, so a line without
    tabs starts a new block. ``remembered`` (kubectl's RememberWidths fork) carries widths
    from one call to the next so that ``get -w`` rows line up with the header.
    """
    lines = [line.split("\t") for line in text.split("\n")]
    out: list[str] = []

    def write(widths: list[int], line0: int, line1: int) -> None:
        for i in range(line0, line1):
            cells = lines[i]
            for j, c in enumerate(cells):
                out.append(c.ljust(widths[j]) if j < len(widths) else c)
            if i + 1 < len(lines):
                out.append("\n")

    def fmt(widths: list[int], line0: int, line1: int) -> None:
        column = len(widths)
        this = line0
        while this < line1:
            if column >= len(lines[this]) - 1:
                this += 1
                continue
            write(widths, line0, this)
            line0 = this
            width = minwidth
            if remembered is not None and column < len(remembered):
                width = max(width, remembered[column])
            while this < line1 and column < len(lines[this]) - 1:
                width = max(width, len(lines[this][column]) + padding)
                this += 1
            if remembered is not None:
                if column < len(remembered):
                    remembered[column] = width
                else:
                    remembered.append(width)
            fmt([*widths, width], line0, this)
            line0 = this
        write(widths, line0, line1)

    fmt([], 0, len(lines))
    return "".join(out)


def table(rows: Iterable[Sequence[str]], remembered: list[int] | None = None) -> str:
    """kubectl get's table: left-aligned, at least 6 wide, three spaces between columns."""
    text = "".join("\t".join(row) + "\n" for row in rows)
    return tabwrite(text, 6, 3, remembered)


# ---------------------------------------------------------------- labels and selectors


def format_labels(labels: Mapping[str, str] | None) -> str:
    """labels.FormatLabels: ``a=1,b=2`` sorted, ``<none>`` when empty."""
    if not labels:
        return "<none>"
    return ",".join(f"{k}={labels[k]}" for k in sorted(labels))


def selector_text(selector: Mapping[str, Any] | None) -> str:
    """A LabelSelector as LabelSelectorAsSelector(...).String(): ``app=vllm,tier in (a,b)``."""
    if not selector:
        return ""
    reqs = [(k, f"{k}={v}") for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or ():
        key, op, values = e.get("key", ""), e.get("operator", ""), sorted(e.get("values") or ())
        if op == "In":
            reqs.append((key, f"{key} in ({','.join(values)})"))
        elif op == "NotIn":
            reqs.append((key, f"{key} notin ({','.join(values)})"))
        elif op == "Exists":
            reqs.append((key, key))
        elif op == "DoesNotExist":
            reqs.append((key, f"!{key}"))
    reqs.sort(key=lambda r: r[0])
    return ",".join(r[1] for r in reqs)


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels + matchExpressions) selects these labels."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or ():
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or ()
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# ---------------------------------------------------------------- pods


def _container_ready_running(cs: Mapping[str, Any]) -> bool:
    state = cs.get("state") or {}
    return bool(cs.get("ready")) and state.get("running") is not None


def _has_ready_condition(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    return _has_ready_condition(pod.get("status") or {})


def pod_status(pod: Mapping[str, Any], now: float) -> tuple[str, str, str]:
    """(READY, STATUS, RESTARTS) of ``kubectl get pods``, computed as kubectl's printPod does."""
    spec, status, md = pod.get("spec") or {}, pod.get("status") or {}, meta(pod)
    containers = spec.get("containers") or []
    init_specs = {c.get("name"): c for c in spec.get("initContainers") or ()}
    total = len(containers) + sum(1 for c in init_specs.values() if c.get("restartPolicy") == "Always")
    ready = restarts = sidecar_restarts = 0
    last_restart: float | None = None
    last_sidecar_restart: float | None = None
    phase = status.get("phase") or ""
    reason = status.get("reason") or phase
    for c in status.get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"

    def finished(cs: Mapping[str, Any]) -> float | None:
        term = (cs.get("lastState") or {}).get("terminated")
        return parse_time(term.get("finishedAt")) if term else None

    initializing = False
    init_statuses = status.get("initContainerStatuses") or []
    for i, cs in enumerate(init_statuses):
        restarts += int(cs.get("restartCount") or 0)
        t = finished(cs)
        if t is not None and (last_restart is None or t > last_restart):
            last_restart = t
        sidecar = (init_specs.get(cs.get("name")) or {}).get("restartPolicy") == "Always"
        if sidecar:
            sidecar_restarts += int(cs.get("restartCount") or 0)
            if t is not None and (last_sidecar_restart is None or t > last_sidecar_restart):
                last_sidecar_restart = t
        state = cs.get("state") or {}
        term, wait = state.get("terminated"), state.get("waiting")
        if term is not None and int(term.get("exitCode") or 0) == 0:
            continue
        if sidecar and cs.get("started"):
            if cs.get("ready"):
                ready += 1
            continue
        if term is not None:
            if not term.get("reason"):
                reason = (f"Init:Signal:{term['signal']}" if term.get("signal")
                          else f"Init:ExitCode:{int(term.get('exitCode') or 0)}")
            else:
                reason = "Init:" + term["reason"]
        elif wait is not None and wait.get("reason") and wait["reason"] != "PodInitializing":
            reason = "Init:" + wait["reason"]
        else:
            reason = f"Init:{i}/{len(init_specs)}"
        initializing = True
        break

    initialized = any(c.get("type") == "Initialized" and c.get("status") == "True"
                      for c in status.get("conditions") or ())
    if not initializing or initialized:
        restarts, last_restart = sidecar_restarts, last_sidecar_restart
        has_running = False
        for cs in reversed(status.get("containerStatuses") or []):
            restarts += int(cs.get("restartCount") or 0)
            t = finished(cs)
            if t is not None and (last_restart is None or t > last_restart):
                last_restart = t
            state = cs.get("state") or {}
            wait, term = state.get("waiting"), state.get("terminated")
            if wait is not None and wait.get("reason"):
                reason = wait["reason"]
            elif term is not None and term.get("reason"):
                reason = term["reason"]
            elif term is not None:
                reason = (f"Signal:{term['signal']}" if term.get("signal")
                          else f"ExitCode:{int(term.get('exitCode') or 0)}")
            elif _container_ready_running(cs):
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            reason = "Running" if _has_ready_condition(status) else "NotReady"

    if md.get("deletionTimestamp") and status.get("reason") == "NodeLost":
        reason = "Unknown"
    elif md.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"

    restarts_text = str(restarts)
    if restarts and last_restart is not None:
        restarts_text = f"{restarts} ({human_duration(now - last_restart)} ago)"
    return f"{ready}/{total}", reason, restarts_text


def pod_ip(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    ips = status.get("podIPs") or ()
    return (ips[0].get("ip") if ips else status.get("podIP")) or ""


# ---------------------------------------------------------------- get: one table per kind


def _containers_cells(template_spec: Mapping[str, Any]) -> tuple[str, str]:
    cs = template_spec.get("containers") or []
    return ",".join(c.get("name", "") for c in cs), ",".join(c.get("image", "") for c in cs)


def _template_spec(obj: Mapping[str, Any]) -> dict:
    return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}


def _service_ports(spec: Mapping[str, Any]) -> str:
    pieces = []
    for p in spec.get("ports") or ():
        proto = p.get("protocol") or "TCP"
        if p.get("nodePort"):
            pieces.append(f"{p.get('port')}:{p['nodePort']}/{proto}")
        else:
            pieces.append(f"{p.get('port')}/{proto}")
    return ",".join(pieces) or "<none>"


def _load_balancer_ips(svc: Mapping[str, Any], wide: bool) -> str:
    ingress = (((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress")) or ()
    text = ",".join(i.get("ip") or i.get("hostname") or "" for i in ingress if i.get("ip") or i.get("hostname"))
    if not wide and len(text) > 16:
        text = text[:13] + "..."
    return text


def service_external_ip(svc: Mapping[str, Any], wide: bool = False) -> str:
    spec = svc.get("spec") or {}
    kind = spec.get("type") or "ClusterIP"
    external = spec.get("externalIPs") or []
    if kind in ("ClusterIP", "NodePort"):
        return ",".join(external) if external else "<none>"
    if kind == "LoadBalancer":
        lb = _load_balancer_ips(svc, wide)
        if external:
            return ",".join([*(lb.split(",") if lb else []), *external])
        return lb or "<pending>"
    if kind == "ExternalName":
        return spec.get("externalName") or ""
    return "<unknown>"


def hpa_targets(hpa: Mapping[str, Any]) -> str:
    """formatHPAMetrics: ``45%/50%``, ``<unknown>/10``, ``12/10 (avg)``, ``a, b + 1 more...``."""
    specs = (hpa.get("spec") or {}).get("metrics") or []
    statuses = (hpa.get("status") or {}).get("currentMetrics") or []
    if not specs:
        return "<none>"
    items = []
    for i, m in enumerate(specs):
        cur = statuses[i] if i < len(statuses) else {}
        kind = m.get("type")
        if kind in ("External", "Object"):
            key = "external" if kind == "External" else "object"
            target = (m.get(key) or {}).get("target") or {}
            current = (cur.get(key) or {}).get("current") if cur.get(key) is not None else None
            if target.get("averageValue") is not None:
                c = "<unknown>" if not current or current.get("averageValue") is None else quantity_text(
                    current["averageValue"])
                items.append(f"{c}/{quantity_text(target['averageValue'])} (avg)")
            else:
                c = "<unknown>" if current is None else quantity_text(current.get("value"))
                items.append(f"{c}/{quantity_text(target.get('value'))}")
        elif kind == "Pods":
            target = (m.get("pods") or {}).get("target") or {}
            c = "<unknown>"
            if cur.get("pods") is not None:
                c = quantity_text(((cur["pods"].get("current") or {}).get("averageValue")))
            items.append(f"{c}/{quantity_text(target.get('averageValue'))}")
        elif kind in ("Resource", "ContainerResource"):
            key = "resource" if kind == "Resource" else "containerResource"
            target = (m.get(key) or {}).get("target") or {}
            current = ((cur.get(key) or {}).get("current") or {}) if cur.get(key) is not None else None
            if target.get("averageValue") is not None:
                c = "<unknown>" if current is None else quantity_text(current.get("averageValue"))
                items.append(f"{c}/{quantity_text(target['averageValue'])}")
            else:
                c = "<unknown>"
                if current is not None and current.get("averageUtilization") is not None:
                    c = f"{int(current['averageUtilization'])}%"
                t = "<auto>" if target.get("averageUtilization") is None else f"{int(target['averageUtilization'])}%"
                items.append(f"{c}/{t}")
        else:
            items.append("<unknown type>")
    if len(items) > 2:
        return f"{', '.join(items[:2])} + {len(items) - 2} more..."
    return ", ".join(items)


def node_roles(node: Mapping[str, Any]) -> list[str]:
    roles = set()
    for k, v in (meta(node).get("labels") or {}).items():
        if k.startswith("node-role.kubernetes.io/"):
            roles.add(k.partition("/")[2])
        elif k == "kubernetes.io/role" and v:
            roles.add(v)
    return sorted(r for r in roles if r)


def node_ready_text(node: Mapping[str, Any]) -> str:
    conds = {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or ()}
    ready = conds.get("Ready")
    text = "Ready" if ready == "True" else "NotReady" if ready == "False" else "Unknown"
    if (node.get("spec") or {}).get("unschedulable"):
        text += ",SchedulingDisabled"
    return text


def event_object(e: Mapping[str, Any]) -> str:
    io = e.get("involvedObject") or e.get("regarding") or {}
    kind = str(io.get("kind") or "").lower()
    return f"{kind}/{io['name']}" if io.get("name") else kind


def event_last_seen(e: Mapping[str, Any], now: float) -> str:
    series = e.get("series") or {}
    if series.get("lastObservedTime"):
        return age(series["lastObservedTime"], now)
    first = e.get("firstTimestamp") or e.get("eventTime")
    return age(e.get("lastTimestamp") or first, now)


def _pod_row(o, now, wide):
    ready, status, restarts = pod_status(o, now)
    row = [ready, status, restarts, age(meta(o).get("creationTimestamp"), now)]
    if wide:
        spec, st = o.get("spec") or {}, o.get("status") or {}
        gates = spec.get("readinessGates") or []
        gates_text = "<none>"
        if gates:
            conds = {c.get("type"): c.get("status") for c in st.get("conditions") or ()}
            gates_text = f"{sum(1 for g in gates if conds.get(g.get('conditionType')) == 'True')}/{len(gates)}"
        row += [pod_ip(o) or "<none>", spec.get("nodeName") or "<none>", st.get("nominatedNodeName") or "<none>",
                gates_text]
    return row


def _deployment_row(o, now, wide):
    spec, st = o.get("spec") or {}, o.get("status") or {}
    row = [f"{int(st.get('readyReplicas') or 0)}/{int(spec.get('replicas', 1) or 0)}",
           str(int(st.get("updatedReplicas") or 0)), str(int(st.get("availableReplicas") or 0)),
           age(meta(o).get("creationTimestamp"), now)]
    if wide:
        row += [*_containers_cells(_template_spec(o)), selector_text(spec.get("selector"))]
    return row


def _replicaset_row(o, now, wide):
    spec, st = o.get("spec") or {}, o.get("status") or {}
    row = [str(int(spec.get("replicas", 1) or 0)), str(int(st.get("replicas") or 0)),
           str(int(st.get("readyReplicas") or 0)), age(meta(o).get("creationTimestamp"), now)]
    if wide:
        row += [*_containers_cells(_template_spec(o)), selector_text(spec.get("selector"))]
    return row


def _service_row(o, now, wide):
    spec = o.get("spec") or {}
    ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    row = [spec.get("type") or "ClusterIP", ips[0] if ips else "<none>", service_external_ip(o, wide),
           _service_ports(spec), age(meta(o).get("creationTimestamp"), now)]
    if wide:
        row.append(format_labels(spec.get("selector")))
    return row


def _hpa_row(o, now, wide):
    spec, st = o.get("spec") or {}, o.get("status") or {}
    ref = spec.get("scaleTargetRef") or {}
    min_pods = "<unset>" if spec.get("minReplicas") is None else str(spec["minReplicas"])
    return [f"{ref.get('kind', '')}/{ref.get('name', '')}", hpa_targets(o), min_pods,
            str(int(spec.get("maxReplicas") or 0)), str(int(st.get("currentReplicas") or 0)),
            age(meta(o).get("creationTimestamp"), now)]


def _job_row(o, now, wide):
    spec, st = o.get("spec") or {}, o.get("status") or {}
    conds = {c.get("type") for c in st.get("conditions") or () if c.get("status") == "True"}
    status = next((t for t in ("Failed", "Complete", "Suspended", "FailureTarget", "SuccessCriteriaMet")
                   if t in conds), "Running")
    start, end = parse_time(st.get("startTime")), parse_time(st.get("completionTime"))
    row = [status, f"{int(st.get('succeeded') or 0)}/{spec.get('completions', 1)}",
           human_duration((end or now) - start) if start else "", age(meta(o).get("creationTimestamp"), now)]
    if wide:
        row += [*_containers_cells(_template_spec(o)), selector_text(spec.get("selector"))]
    return row


def _namespace_row(o, now, wide):
    return [(o.get("status") or {}).get("phase") or "Active", age(meta(o).get("creationTimestamp"), now)]


def _priorityclass_row(o, now, wide):
    return [str(int(o.get("value") or 0)), "true" if o.get("globalDefault") else "false",
            age(meta(o).get("creationTimestamp"), now), o.get("preemptionPolicy") or "PreemptLowerPriority"]


def _secret_row(o, now, wide):
    return [o.get("type") or "Opaque", str(len(o.get("data") or {})), age(meta(o).get("creationTimestamp"), now)]


def _rolebinding_row(o, now, wide):
    ref = o.get("roleRef") or {}
    row = [f"{ref.get('kind', 'ClusterRole')}/{ref.get('name', '')}", age(meta(o).get("creationTimestamp"), now)]
    if wide:
        subjects = o.get("subjects") or ()
        row += [", ".join(x["name"] for x in subjects if x.get("kind") == kind) for kind in ("User", "Group")] + [""]
    return row


def _event_row(o, now, wide):
    # kubectl prints NAME as the last wide column; the table adds the name first, so it moves.
    row = [event_last_seen(o, now), o.get("type") or "", o.get("reason") or "", event_object(o)]
    if wide:
        io = o.get("involvedObject") or {}
        src = o.get("source") or {}
        source = ", ".join(x for x in (src.get("component") or o.get("reportingComponent"), src.get("host")) if x)
        first = age(o.get("firstTimestamp") or o.get("eventTime"), now)
        count = int((o.get("series") or {}).get("count") or o.get("count") or 1)
        return row + [io.get("fieldPath") or "", source, (o.get("message") or "").strip(), first, str(count)]
    return row + [(o.get("message") or "").strip()]


def _node_row(o, now, wide):
    labels = meta(o).get("labels") or {}
    row = [node_ready_text(o), ",".join(node_roles(o)) or "<none>", age(meta(o).get("creationTimestamp"), now),
           ((o.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion") or "<unknown>"]
    if wide:
        st = o.get("status") or {}
        addrs = {a.get("type"): a.get("address") for a in st.get("addresses") or ()}
        cap = st.get("capacity") or {}
        gpus = int(parse_quantity(cap.get("nvidia.com/gpu")))
        used = int((st.get("shoal") or {}).get("gpusAllocated") or 0)
        row += [addrs.get("InternalIP") or "<none>", addrs.get("ExternalIP") or "<none>", f"{used}/{gpus}",
                labels.get("nvidia.com/gpu.product") or "<none>",
                ",".join((st.get("shoal") or {}).get("partitions") or ()) or "<none>"]
    return row


Printer = namedtuple("Printer", "columns wide_columns row")

PRINTERS = {
    "pods": Printer(["READY", "STATUS", "RESTARTS", "AGE"], ["IP", "NODE", "NOMINATED NODE", "READINESS GATES"],
                    _pod_row),
    "deployments": Printer(["READY", "UP-TO-DATE", "AVAILABLE", "AGE"], ["CONTAINERS", "IMAGES", "SELECTOR"],
                           _deployment_row),
    "replicasets": Printer(["DESIRED", "CURRENT", "READY", "AGE"], ["CONTAINERS", "IMAGES", "SELECTOR"],
                           _replicaset_row),
    "services": Printer(["TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"], ["SELECTOR"], _service_row),
    "horizontalpodautoscalers": Printer(["REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"], [],
                                        _hpa_row),
    "namespaces": Printer(["STATUS", "AGE"], [], _namespace_row),
    "jobs": Printer(["STATUS", "COMPLETIONS", "DURATION", "AGE"], ["CONTAINERS", "IMAGES", "SELECTOR"], _job_row),
    "priorityclasses": Printer(["VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"], [], _priorityclass_row),
    "rolebindings": Printer(["ROLE", "AGE"], ["USERS", "GROUPS", "SERVICEACCOUNTS"], _rolebinding_row),
    "secrets": Printer(["TYPE", "DATA", "AGE"], [], _secret_row),
    "events": Printer(["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
                      ["SUBOBJECT", "SOURCE", "MESSAGE", "FIRST SEEN", "COUNT"], _event_row),
    "nodes": Printer(["STATUS", "ROLES", "AGE", "VERSION"],
                     ["INTERNAL-IP", "EXTERNAL-IP", "GPUS", "GPU-PRODUCT", "PARTITIONS"], _node_row),
}


def table_header(r: Resource, wide: bool = False, with_namespace: bool = False,
                 show_labels: bool = False) -> list[str]:
    p = PRINTERS[r.plural]
    cols = list(p.columns)
    if wide and p.wide_columns:
        cols = cols[:-1] + p.wide_columns if r.plural == "events" else cols + p.wide_columns
    head = (["NAMESPACE"] if with_namespace else []) + ["NAME"] + cols
    if r.plural == "events":
        head.remove("NAME")
        if wide:
            head.append("NAME")
    return head + (["LABELS"] if show_labels else [])


def table_row(r: Resource, obj: Mapping[str, Any], now: float, wide: bool = False, with_namespace: bool = False,
              with_kind: bool = False, show_labels: bool = False) -> list[str]:
    md = meta(obj)
    name = f"{r.qualified}/{md.get('name', '')}" if with_kind else md.get("name", "")
    cells = PRINTERS[r.plural].row(obj, now, wide)
    if r.plural == "events":  # events have no NAME column (only a trailing one with -o wide)
        row = cells + ([name] if wide else [])
    else:
        row = [name] + cells
    if with_namespace:
        row.insert(0, md.get("namespace") or "")
    if show_labels:
        row.append(format_labels(md.get("labels")))
    return row


def render_table(r: Resource, items: Iterable[Mapping[str, Any]], now: float, *, wide: bool = False,
                 with_namespace: bool = False, with_kind: bool = False, show_labels: bool = False,
                 headers: bool = True, remembered: list[int] | None = None) -> str:
    """One kind's ``kubectl get`` table (header first unless ``headers`` is false)."""
    ns = with_namespace and r.namespaced
    rows = [table_header(r, wide, ns, show_labels)] if headers else []
    rows += [table_row(r, o, now, wide, ns, with_kind, show_labels) for o in items]
    return table(rows, remembered)


def as_list(items: list[dict]) -> dict:
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


def render_json(doc: Any) -> str:
    return json.dumps(doc, indent=4, ensure_ascii=False) + "\n"


def render_yaml(doc: Any) -> str:
    import yaml  # only for -o yaml

    return yaml.safe_dump(doc, default_flow_style=False, sort_keys=True, allow_unicode=True)


# ---------------------------------------------------------------- nodes from /shoal/v1/nodes


from shoal.kube.nodeview import node_object  # noqa: E402,F401 (get/describe nodes; the server shares it)


# ---------------------------------------------------------------- taints


class TaintError(ValueError):
    """A taint spec or change kubectl would refuse; the message is kubectl's."""


def taint_text(t: Mapping[str, Any]) -> str:
    """Taint.ToString: ``key=value:Effect``, ``key:Effect``, ``key``."""
    out = t.get("key", "")
    if t.get("value"):
        out += "=" + t["value"]
    if t.get("effect"):
        out += ":" + t["effect"]
    return out


def _qualified_name_errors(key: str) -> list[str]:
    import re

    name_re = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
    prefix, slash, name = key.rpartition("/")
    errs = []
    if not slash:
        prefix = ""
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    elif not re.fullmatch(name_re, name):
        errs.append("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                    f"with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                    f"validation is '{name_re}')")
    if slash:
        if not prefix:
            errs.append("prefix part must be non-empty")
        elif len(prefix) > 253 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                                                   prefix):
            errs.append("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                        "characters, '-' or '.', and must start and end with an alphanumeric character")
    return errs


def _label_value_errors(value: str) -> list[str]:
    import re

    if len(value) > 63:
        return ["must be no more than 63 characters"]
    if value and not re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value):
        return ["a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                "and must start and end with an alphanumeric character"]
    return []


_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _parse_taint(spec: str) -> dict:
    parts = spec.split(":")
    value = effect = ""
    if len(parts) == 1:
        key = parts[0]
    elif len(parts) == 2:
        effect = parts[1]
        if effect not in _EFFECTS:
            raise TaintError(f"invalid taint effect: {effect}, unsupported taint effect")
        kv = parts[0].split("=")
        if len(kv) > 2:
            raise TaintError(f"invalid taint spec: {spec}")
        key = kv[0]
        if len(kv) == 2:
            value = kv[1]
            errs = _label_value_errors(value)
            if errs:
                raise TaintError(f"invalid taint spec: {spec}, {'; '.join(errs)}")
    else:
        raise TaintError(f"invalid taint spec: {spec}")
    errs = _qualified_name_errors(key)
    if errs:
        raise TaintError(f"invalid taint spec: {spec}, {'; '.join(errs)}")
    return {"key": key, "value": value, "effect": effect}


def parse_taints(specs: Iterable[str]) -> tuple[list[dict], list[dict]]:
    """kubectl taint's ParseTaints: (taints to add, taints to remove), ``key-`` removes."""
    add: list[dict] = []
    remove: list[dict] = []
    seen: set[tuple[str, str]] = set()
    for spec in specs:
        if spec.endswith("-"):
            t = _parse_taint(spec[:-1])
            remove.append({"key": t["key"], "value": "", "effect": t["effect"]})
            continue
        t = _parse_taint(spec)
        if not t["effect"]:
            raise TaintError(f"invalid taint spec: {spec}")
        if (t["key"], t["effect"]) in seen:
            raise TaintError(f"duplicated taints with the same key and effect: {t}")
        seen.add((t["key"], t["effect"]))
        add.append(t)
    conflicts = [f'{{"{r["key"]}":"{r["effect"]}"}}' for a in add for r in remove
                 if a["key"] == r["key"] and (not r["effect"] or a["effect"] == r["effect"])]
    if conflicts:
        raise TaintError(f"can not both modify and remove the following taint(s) in the same command: "
                         f"{', '.join(conflicts)}")
    if not add and not remove:
        raise TaintError("at least one taint update is required")
    return add, remove


def apply_taints(node_name: str, old: Sequence[Mapping[str, Any]], add: list[dict], remove: list[dict],
                 overwrite: bool) -> tuple[str, list[dict]]:
    """kubectl taint's reorganizeTaints: (``tainted``|``untainted``|``modified``, new list)."""
    old = [{"key": t.get("key", ""), "value": t.get("value") or "", "effect": t.get("effect", "")} for t in old]
    if not overwrite:
        exists = [t["key"] for t in add for o in old if t["key"] == o["key"] and t["effect"] == o["effect"]]
        if exists:
            raise TaintError(f"node {node_name} already has {','.join(exists)} taint(s) with same effect(s) "
                             f"and --overwrite is false")
    new = [dict(t) for t in add]
    for o in old:
        if not any(t["key"] == o["key"] and t["effect"] == o["effect"] for t in new):
            new.append(o)
    added = len(old) != len(new)
    errors, deleted = [], False
    for r in remove:
        before = len(new)
        if r["effect"]:
            new = [t for t in new if not (t["key"] == r["key"] and t["effect"] == r["effect"])]
        else:
            new = [t for t in new if t["key"] != r["key"]]
        deleted = len(new) != before
        if not deleted:
            errors.append(f'taint "{taint_text(r)}" not found')
    if errors:
        raise TaintError(errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]")
    if (added and deleted) or overwrite:
        return "modified", new
    return ("tainted" if added else "untainted"), new


# ---------------------------------------------------------------- labels


def parse_label_changes(specs: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """kubectl label's ``k=v`` and ``k-`` arguments: (labels to set, keys to remove)."""
    add: dict[str, str] = {}
    remove: list[str] = []
    for spec in specs:
        if "=" in spec:
            key, _, value = spec.partition("=")
            if _qualified_name_errors(key) or _label_value_errors(value):
                raise TaintError(f"invalid label spec: {spec}")
            add[key] = value
        elif spec.endswith("-") and not _qualified_name_errors(spec[:-1]):
            remove.append(spec[:-1])
        else:
            raise TaintError(f"invalid label spec: {spec}")
    for key in remove:
        if key in add:
            raise TaintError(f"can not both modify and remove a label in the same command: {key}")
    return add, remove


# ---------------------------------------------------------------- rollout status


class RolloutError(Exception):
    """The rollout failed (or cannot be watched); the message is kubectl's, without ``error: ``."""


def deployment_revision(d: Mapping[str, Any]) -> int:
    try:
        return int((meta(d).get("annotations") or {}).get("deployment.kubernetes.io/revision") or 0)
    except ValueError:
        return 0


def rollout_status(d: Mapping[str, Any], revision: int = 0) -> tuple[str, bool]:
    """kubectl's DeploymentStatusViewer: (the line to print, whether the rollout is done)."""
    name = meta(d).get("name", "")
    if revision > 0:
        current = deployment_revision(d)
        if revision != current:
            raise RolloutError(f"desired revision ({revision}) is different from the running revision ({current})")
    spec, st = d.get("spec") or {}, d.get("status") or {}
    generation = int(meta(d).get("generation") or 0)
    if generation <= int(st.get("observedGeneration") or 0):
        for c in st.get("conditions") or ():
            if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
                raise RolloutError(f'deployment "{name}" exceeded its progress deadline')
        replicas = int(spec.get("replicas", 1) or 0)
        updated = int(st.get("updatedReplicas") or 0)
        total = int(st.get("replicas") or 0)
        available = int(st.get("availableReplicas") or 0)
        if updated < replicas:
            return (f'Waiting for deployment "{name}" rollout to finish: {updated} out of {replicas} new replicas '
                    f"have been updated...", False)
        if total > updated:
            return (f'Waiting for deployment "{name}" rollout to finish: {total - updated} old replicas are '
                    f"pending termination...", False)
        if available < updated:
            return (f'Waiting for deployment "{name}" rollout to finish: {available} of {updated} updated '
                    f"replicas are available...", False)
        return f'deployment "{name}" successfully rolled out', True
    return "Waiting for deployment spec update to be observed...", False


def rollout_lines(states: Iterable[Mapping[str, Any]], revision: int = 0) -> list[str]:
    """The lines ``rollout status`` prints for successive Deployment states (a repeat of the
    previous line is not printed again), up to and including the final one."""
    out: list[str] = []
    for d in states:
        line, done = rollout_status(d, revision)
        if not out or out[-1] != line:
            out.append(line)
        if done:
            break
    return out


def history_table(qualified: str, revisions: Sequence[Mapping[str, Any]]) -> str:
    """``rollout history``: the name line, then REVISION CHANGE-CAUSE, as kubectl prints them."""
    body = "REVISION\tCHANGE-CAUSE\n" + "".join(
        f"{r.get('revision')}\t{r.get('change_cause') or '<none>'}\n"
        for r in sorted(revisions, key=lambda r: int(r.get("revision") or 0)))
    return f"{qualified} \n{tabwrite(body, 0, 2)}\n"
