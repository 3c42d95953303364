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
    Resource("nodes", "node", "Node", "", ("no",), False),
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


def _namespace_row(o, now, wide):
    return [(o.get("status") or {}).get("phase") or "Active", age(meta(o).get("creationTimestamp"), now)]


def _priorityclass_row(o, now, wide):
    return [str(int(o.get("value") or 0)), "true" if o.get("globalDefault") else "false",
            age(meta(o).get("creationTimestamp"), now), o.get("preemptionPolicy") or "PreemptLowerPriority"]


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
    "priorityclasses": Printer(["VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"], [], _priorityclass_row),
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


# ---------------------------------------------------------------- nodes from /api/v1/nodes


def node_object(n: Mapping[str, Any], version: str) -> dict:
    """A Shoal node (docs/API.md) as a Kubernetes Node, so that get/describe treat it alike."""
    state = n.get("state") or ""
    heartbeat = n.get("last_heartbeat")
    ready = {"UP": "True", "DRAIN": "True", "DOWN": "False"}.get(state, "Unknown")
    message = ("shoal agent is posting ready status" if ready == "True"
               else n.get("reason") or "Agent stopped posting node status.")
    cond = {"type": "Ready", "status": ready,
            "lastHeartbeatTime": _iso(heartbeat), "lastTransitionTime": _iso(n.get("reason_time") or heartbeat),
            "reason": "KubeletReady" if ready == "True" else "NodeStatusUnknown", "message": message}
    gpus = len(n.get("gpus") or ())
    capacity = {"cpu": str(n.get("cpus") or 0), "memory": f"{int(n.get('memory_mb') or 0) * 1024}Ki",
                "nvidia.com/gpu": str(gpus), "pods": "110"}
    addresses = [{"type": "InternalIP", "address": n.get("address") or ""}, {"type": "Hostname", "address": n["name"]}]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n["name"], "labels": dict(n.get("labels") or {}),
                     "annotations": {"shoal.io/state": n.get("display_state") or state.lower()},
                     "creationTimestamp": _iso(n.get("registered_at") or n.get("boot_time"))},
        "spec": {"taints": [dict(t) for t in n.get("taints") or ()], "unschedulable": state == "DRAIN"},
        "status": {
            "conditions": [cond], "addresses": addresses, "capacity": capacity, "allocatable": dict(capacity),
            "nodeInfo": {"kubeletVersion": n.get("version") or version, "containerRuntimeVersion": "shoal"},
            "shoal": {"gpusAllocated": n.get("gpus_alloc") or 0, "partitions": n.get("partitions") or [],
                      "gpus": n.get("gpus") or []},
        },
    }


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


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


# ---------------------------------------------------------------- describe


class Describer:
    """kubectl's PrefixWriter over a tabwriter(0, 8, 2): two spaces per level; ``flush``
    ends an alignment block (as kubectl flushes before the Events table)."""

    def __init__(self) -> None:
        self.blocks: list[list[str]] = [[]]

    def w(self, level: int, text: str) -> None:
        self.blocks[-1].append("  " * level + text)

    def flush(self) -> None:
        self.blocks.append([])

    def text(self) -> str:
        return "".join(tabwrite("".join(b), 0, 2) for b in self.blocks)

    def labels(self, title: str, labels: Mapping[str, str] | None) -> None:
        """printLabelsMultiline: sorted ``k=v``, one a line, ``<none>`` when empty."""
        if not labels:
            self.w(0, f"{title}:\t<none>\n")
            return
        for i, k in enumerate(sorted(labels)):
            self.w(0, f"{title}:\t{k}={labels[k]}\n" if i == 0 else f"\t{k}={labels[k]}\n")

    def annotations(self, title: str, annotations: Mapping[str, str] | None) -> None:
        """printAnnotationsMultiline: ``k: v``; a long or multi-line value goes under its key,
        each line cut at 138 characters."""
        if not annotations:
            self.w(0, f"{title}:\t<none>\n")
            return
        for i, k in enumerate(sorted(annotations)):
            lead = f"{title}:\t" if i == 0 else "\t"
            v = str(annotations[k]).removesuffix("\n")
            if len(v) + len(k) + 2 > 140 or "\n" in v:
                self.w(0, f"{lead}{k}:\n")
                for line in v.split("\n"):
                    self.w(0, f"\t  {line[:138] + '...' if len(line) > 138 else line}\n")
            else:
                self.w(0, f"{lead}{k}: {v}\n")

    def tolerations(self, title: str, tolerations: Sequence[Mapping[str, Any]] | None) -> None:
        if not tolerations:
            self.w(0, f"{title}:\t<none>\n")
            return
        for i, t in enumerate(sorted(tolerations, key=lambda t: t.get("key") or "")):
            text = t.get("key") or ""
            if t.get("value"):
                text += "=" + t["value"]
            if t.get("effect"):
                text += ":" + t["effect"]
            if t.get("operator") == "Exists" and not t.get("value"):
                text += " op=Exists" if (t.get("key") or t.get("effect")) else "op=Exists"
            if t.get("tolerationSeconds") is not None:
                text += f" for {int(t['tolerationSeconds'])}s"
            self.w(0, f"{title}:\t{text}\n" if i == 0 else f"\t{text}\n")

    def taints(self, title: str, taints: Sequence[Mapping[str, Any]] | None) -> None:
        if not taints:
            self.w(0, f"{title}:\t<none>\n")
            return
        for i, t in enumerate(sorted(taints, key=lambda t: f"{t.get('effect', '')},{t.get('key', '')}")):
            self.w(0, f"{title}:\t{taint_text(t)}\n" if i == 0 else f"\t{taint_text(t)}\n")

    def events(self, events: Sequence[Mapping[str, Any]] | None, now: float) -> None:
        """DescribeEvents: ``<none>``, or the Type/Reason/Age/From/Message table, oldest first."""
        if events is None:
            return
        if not events:
            self.w(0, "Events:\t<none>\n")
            return
        self.flush()
        self.w(0, "Events:\n  Type\tReason\tAge\tFrom\tMessage\n")
        self.w(1, "----\t------\t----\t----\t-------\n")
        for e in sorted(events, key=lambda e: parse_time(e.get("lastTimestamp") or e.get("eventTime")) or 0):
            first = age(e.get("eventTime") or e.get("firstTimestamp"), now)
            series = e.get("series") or {}
            count = int(e.get("count") or 0)
            if series:
                interval = f"{age(series.get('lastObservedTime'), now)} (x{series.get('count')} over {first})"
            elif count > 1:
                interval = f"{age(e.get('lastTimestamp'), now)} (x{count} over {first})"
            else:
                interval = first
            source = (e.get("source") or {}).get("component") or e.get("reportingComponent") or ""
            self.w(1, f"{e.get('type', '')}\t{e.get('reason', '')}\t{interval}\t{source}\t"
                      f"{(e.get('message') or '').strip()}\n")


def events_about(events: Iterable[Mapping[str, Any]], kind: str, name: str, namespace: str | None) -> list[dict]:
    """The events whose involvedObject is this object (kubectl asks with a field selector)."""
    out = []
    for e in events:
        io = e.get("involvedObject") or e.get("regarding") or {}
        if io.get("kind") == kind and io.get("name") == name and (
                namespace is None or (io.get("namespace") or meta(e).get("namespace") or namespace) == namespace):
            out.append(dict(e))
    return out


def probe_text(p: Mapping[str, Any]) -> str:
    """DescribeProbe: ``http-get http://:8000/health delay=0s timeout=1s period=10s #success=1 #failure=3``."""
    attrs = (f"delay={int(p.get('initialDelaySeconds') or 0)}s timeout={int(p.get('timeoutSeconds') or 1)}s "
             f"period={int(p.get('periodSeconds') or 10)}s #success={int(p.get('successThreshold') or 1)} "
             f"#failure={int(p.get('failureThreshold') or 3)}")
    if p.get("exec") is not None:
        return f"exec [{' '.join(p['exec'].get('command') or ())}] {attrs}"
    if p.get("httpGet") is not None:
        h = p["httpGet"]
        scheme = str(h.get("scheme") or "HTTP").lower()
        host, port = h.get("host") or "", str(h.get("port", ""))
        hostport = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}") if port else host
        return f"http-get {scheme}://{hostport}{h.get('path') or ''} {attrs}"
    if p.get("tcpSocket") is not None:
        t = p["tcpSocket"]
        return f"tcp-socket {t.get('host') or ''}:{t.get('port', '')} {attrs}"
    if p.get("grpc") is not None:
        g = p["grpc"]
        return f"grpc <pod>:{g.get('port')} {g.get('service') or ''} {attrs}"
    return f"unknown {attrs}"


def _state_lines(d: Describer, title: str, state: Mapping[str, Any]) -> None:
    if state.get("running") is not None:
        d.w(2, f"{title}:\tRunning\n")
        d.w(3, f"Started:\t{rfc1123z(state['running'].get('startedAt'))}\n")
    elif state.get("waiting") is not None:
        d.w(2, f"{title}:\tWaiting\n")
        if state["waiting"].get("reason"):
            d.w(3, f"Reason:\t{state['waiting']['reason']}\n")
    elif state.get("terminated") is not None:
        t = state["terminated"]
        d.w(2, f"{title}:\tTerminated\n")
        if t.get("reason"):
            d.w(3, f"Reason:\t{t['reason']}\n")
        if t.get("message"):
            d.w(3, f"Message:\t{t['message']}\n")
        d.w(3, f"Exit Code:\t{int(t.get('exitCode') or 0)}\n")
        if int(t.get("signal") or 0) > 0:
            d.w(3, f"Signal:\t{int(t['signal'])}\n")
        d.w(3, f"Started:\t{rfc1123z(t.get('startedAt'))}\n")
        d.w(3, f"Finished:\t{rfc1123z(t.get('finishedAt'))}\n")
    else:
        d.w(2, f"{title}:\tWaiting\n")


def _resources(value: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    return [(k, quantity_text(value[k])) for k in sorted(value or {})]


def _containers(d: Describer, label: str, containers: Sequence[Mapping[str, Any]],
                statuses: Sequence[Mapping[str, Any]] | None, space: str) -> None:
    by_name = {s.get("name"): s for s in statuses or ()}
    d.w(0, f"{space}{label}:{'' if containers else ' <none>'}\n")
    for c in containers:
        st = by_name.get(c.get("name"))
        d.w(1, f"{' ' if space else ''}{c.get('name', '')}:\n")
        if st is not None:
            d.w(2, f"Container ID:\t{st.get('containerID') or ''}\n")
        d.w(2, f"Image:\t{c.get('image') or ''}\n")
        if st is not None:
            d.w(2, f"Image ID:\t{st.get('imageID') or ''}\n")
        ports = c.get("ports") or []
        port_text = ", ".join(f"{p.get('containerPort')}/{p.get('protocol') or 'TCP'}" for p in ports)
        host_text = ", ".join(f"{p.get('hostPort') or 0}/{p.get('protocol') or 'TCP'}" for p in ports)
        d.w(2, f"Ports:\t{port_text}\n" if "," in port_text else f"Port:\t{port_text or '<none>'}\n")
        d.w(2, f"Host Ports:\t{host_text}\n" if "," in host_text else f"Host Port:\t{host_text or '<none>'}\n")
        if c.get("restartPolicy"):
            d.w(2, f"Restart Policy:\t{c['restartPolicy']}\n")
        for key, title in (("command", "Command"), ("args", "Args")):
            if c.get(key):
                d.w(2, f"{title}:\n")
                for arg in c[key]:
                    for line in str(arg).split("\n"):
                        d.w(3, f"{line}\n")
        if st is not None:
            _state_lines(d, "State", st.get("state") or {})
            if ((st.get("lastState") or {}).get("terminated")) is not None:
                _state_lines(d, "Last State", st["lastState"])
            d.w(2, f"Ready:\t{'True' if st.get('ready') else 'False'}\n")
            d.w(2, f"Restart Count:\t{int(st.get('restartCount') or 0)}\n")
        res = c.get("resources") or {}
        for key, title in (("limits", "Limits"), ("requests", "Requests")):
            if res.get(key):
                d.w(2, f"{title}:\n")
                for name, q in _resources(res[key]):
                    d.w(3, f"{name}:\t{q}\n")
        for key, title in (("livenessProbe", "Liveness"), ("readinessProbe", "Readiness"),
                           ("startupProbe", "Startup")):
            if c.get(key) is not None:
                d.w(2, f"{title}:\t{probe_text(c[key])}\n")
        env = c.get("env") or []
        d.w(2, "Environment:\n" if env else "Environment:\t<none>\n")
        for e in env:
            if e.get("valueFrom") is None:
                for i, line in enumerate(str(e.get("value") or "").split("\n")):
                    d.w(3, f"{e.get('name')}:\t{line}\n" if i == 0 else f"\t{line}\n")
            else:
                ref = e["valueFrom"].get("fieldRef") or {}
                d.w(3, f"{e.get('name')}:\t ({ref.get('apiVersion', 'v1')}:{ref.get('fieldPath', '')})\n")
        mounts = c.get("volumeMounts") or []
        d.w(2, "Mounts:\n" if mounts else "Mounts:\t<none>\n")
        for m in sorted(mounts, key=lambda m: m.get("mountPath") or ""):
            d.w(3, f"{m.get('mountPath')} from {m.get('name')} ({'ro' if m.get('readOnly') else 'rw'})\n")


def _volumes(d: Describer, volumes: Sequence[Mapping[str, Any]] | None, space: str) -> None:
    if not volumes:
        d.w(0, f"{space}Volumes:\t<none>\n")
        return
    d.w(0, f"{space}Volumes:\n")
    for v in volumes:
        d.w(1, f"{' ' if space else ''}{v.get('name')}:\n")
        kinds = [k for k in v if k != "name"]
        d.w(2, f"Type:\t{kinds[0] if kinds else '<unknown>'} (not mounted by Shoal)\n")


def _controller(obj: Mapping[str, Any]) -> str:
    for ref in meta(obj).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") and ref.get("name"):
            return f"{ref['kind']}/{ref['name']}"
    return ""


def pod_qos(pod: Mapping[str, Any]) -> str:
    """qos.GetPodQOS over cpu and memory: Guaranteed, Burstable or BestEffort."""
    spec = pod.get("spec") or {}
    requests: dict[str, float] = {}
    limits: dict[str, float] = {}
    guaranteed = True
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        res = c.get("resources") or {}
        lim = {k: parse_quantity(v) for k, v in (res.get("limits") or {}).items() if k in ("cpu", "memory")}
        req = {k: parse_quantity(v) for k, v in (res.get("requests") or {}).items() if k in ("cpu", "memory")}
        req = {**{k: v for k, v in lim.items() if k not in req}, **req}  # requests default to limits
        for k, v in req.items():
            if v:
                requests[k] = requests.get(k, 0.0) + v
        found = set()
        for k, v in lim.items():
            if v:
                limits[k] = limits.get(k, 0.0) + v
                found.add(k)
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and all(abs(requests.get(k, 0.0) - limits.get(k, 0.0)) < 1e-9 for k in ("cpu", "memory")):
        return "Guaranteed"
    return "Burstable"


def describe_pod(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]] | None, now: float) -> str:
    md, spec, st = meta(pod), pod.get("spec") or {}, pod.get("status") or {}
    d = Describer()
    d.w(0, f"Name:\t{md.get('name', '')}\n")
    d.w(0, f"Namespace:\t{md.get('namespace', '')}\n")
    if spec.get("priority") is not None:
        d.w(0, f"Priority:\t{spec['priority']}\n")
    if spec.get("priorityClassName"):
        d.w(0, f"Priority Class Name:\t{spec['priorityClassName']}\n")
    if spec.get("runtimeClassName"):
        d.w(0, f"Runtime Class Name:\t{spec['runtimeClassName']}\n")
    if spec.get("serviceAccountName"):
        d.w(0, f"Service Account:\t{spec['serviceAccountName']}\n")
    d.w(0, f"Node:\t{spec['nodeName']}/{st.get('hostIP') or ''}\n" if spec.get("nodeName") else "Node:\t<none>\n")
    if st.get("startTime"):
        d.w(0, f"Start Time:\t{rfc1123z(st['startTime'])}\n")
    d.labels("Labels", md.get("labels"))
    d.annotations("Annotations", md.get("annotations"))
    if md.get("deletionTimestamp") and st.get("phase") not in ("Failed", "Succeeded"):
        d.w(0, f"Status:\tTerminating (lasts {age(md['deletionTimestamp'], now)})\n")
        d.w(0, f"Termination Grace Period:\t{int(md.get('deletionGracePeriodSeconds') or 0)}s\n")
    else:
        d.w(0, f"Status:\t{st.get('phase') or ''}\n")
    if st.get("reason"):
        d.w(0, f"Reason:\t{st['reason']}\n")
    if st.get("message"):
        d.w(0, f"Message:\t{st['message']}\n")
    d.w(0, f"IP:\t{st.get('podIP') or ''}\n")
    ips = st.get("podIPs") or ([{"ip": st["podIP"]}] if st.get("podIP") else [])
    if ips:
        d.w(0, "IPs:\n")
        for ip in ips:
            d.w(1, f"IP:\t{ip.get('ip')}\n")
    else:
        d.w(0, "IPs:\t<none>\n")
    if _controller(pod):
        d.w(0, f"Controlled By:\t{_controller(pod)}\n")
    if st.get("nominatedNodeName"):
        d.w(0, f"NominatedNodeName:\t{st['nominatedNodeName']}\n")
    if spec.get("initContainers"):
        _containers(d, "Init Containers", spec["initContainers"], st.get("initContainerStatuses"), "")
    _containers(d, "Containers", spec.get("containers") or [], st.get("containerStatuses"), "")
    if st.get("conditions"):
        d.w(0, "Conditions:\n  Type\tStatus\n")
        for c in st["conditions"]:
            d.w(1, f"{c.get('type')} \t{c.get('status')} \n")
    _volumes(d, spec.get("volumes"), "")
    d.w(0, f"QoS Class:\t{pod_qos(pod)}\n")
    d.labels("Node-Selectors", spec.get("nodeSelector"))
    d.tolerations("Tolerations", spec.get("tolerations"))
    d.events(events, now)
    return d.text()


def _pod_template(d: Describer, template: Mapping[str, Any] | None) -> None:
    d.w(0, "Pod Template:\n")
    if template is None:
        d.w(1, "<unset>")
        return
    tmd, spec = template.get("metadata") or {}, template.get("spec") or {}
    d.labels("  Labels", tmd.get("labels"))
    if tmd.get("annotations"):
        d.annotations("  Annotations", tmd["annotations"])
    if spec.get("serviceAccountName"):
        d.w(1, f"Service Account:\t{spec['serviceAccountName']}\n")
    if spec.get("initContainers"):
        _containers(d, "Init Containers", spec["initContainers"], None, "  ")
    _containers(d, "Containers", spec.get("containers") or [], None, "  ")
    _volumes(d, spec.get("volumes"), "  ")
    if spec.get("priorityClassName"):
        d.w(1, f"Priority Class Name:\t{spec['priorityClassName']}\n")
    d.labels("  Node-Selectors", spec.get("nodeSelector"))
    d.tolerations("  Tolerations", spec.get("tolerations"))


def pod_template_text(template: Mapping[str, Any] | None) -> str:
    """The Pod Template section alone (``rollout history --revision N``)."""
    d = Describer()
    _pod_template(d, template)
    return d.text()


def _without_hash(template: Mapping[str, Any] | None) -> dict:
    t = json.loads(json.dumps(template or {}))
    (t.get("metadata") or {}).get("labels", {}).pop("pod-template-hash", None)
    return t


def split_replicasets(deployment: Mapping[str, Any], replicasets: Iterable[Mapping[str, Any]]
                      ) -> tuple[list[dict], dict | None]:
    """(old ReplicaSets that still have replicas, the new one) of a Deployment, as
    deploymentutil.GetAllReplicaSets finds them: owned by it, new when the template matches."""
    uid = meta(deployment).get("uid")
    owned = [dict(rs) for rs in replicasets
             if any(ref.get("uid") == uid for ref in meta(rs).get("ownerReferences") or ())]
    owned.sort(key=lambda rs: parse_time(meta(rs).get("creationTimestamp")) or 0)
    template = _without_hash((deployment.get("spec") or {}).get("template"))
    new = next((rs for rs in owned if _without_hash((rs.get("spec") or {}).get("template")) == template), None)
    if new is None:
        rev = deployment_revision(deployment)
        new = next((rs for rs in owned if rev and deployment_revision(rs) == rev), None)
    old = [rs for rs in owned if rs is not new and int((rs.get("spec") or {}).get("replicas", 1) or 0) != 0]
    return old, new


def _rs_list(replicasets: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{meta(rs).get('name')} ({int((rs.get('status') or {}).get('replicas') or 0)}/"
                     f"{int((rs.get('spec') or {}).get('replicas', 1) or 0)} replicas created)"
                     for rs in replicasets) or "<none>"


def _int_or_percent(value: Any, default: str) -> str:
    return default if value is None else str(value)


def describe_deployment(dep: Mapping[str, Any], replicasets: Sequence[Mapping[str, Any]],
                        events: Sequence[Mapping[str, Any]] | None, now: float) -> str:
    md, spec, st = meta(dep), dep.get("spec") or {}, dep.get("status") or {}
    strategy = spec.get("strategy") or {}
    kind = strategy.get("type") or "RollingUpdate"
    d = Describer()
    d.w(0, f"Name:\t{md.get('name', '')}\n")
    d.w(0, f"Namespace:\t{md.get('namespace', '')}\n")
    d.w(0, f"CreationTimestamp:\t{rfc1123z(md.get('creationTimestamp'))}\n")
    d.labels("Labels", md.get("labels"))
    d.annotations("Annotations", md.get("annotations"))
    d.w(0, f"Selector:\t{selector_text(spec.get('selector'))}\n")
    d.w(0, f"Replicas:\t{int(spec.get('replicas', 1) or 0)} desired | {int(st.get('updatedReplicas') or 0)} updated"
           f" | {int(st.get('replicas') or 0)} total | {int(st.get('availableReplicas') or 0)} available"
           f" | {int(st.get('unavailableReplicas') or 0)} unavailable\n")
    d.w(0, f"StrategyType:\t{kind}\n")
    d.w(0, f"MinReadySeconds:\t{int(spec.get('minReadySeconds') or 0)}\n")
    if kind == "RollingUpdate":
        ru = strategy.get("rollingUpdate") or {}
        d.w(0, f"RollingUpdateStrategy:\t{_int_or_percent(ru.get('maxUnavailable'), '25%')} max unavailable, "
               f"{_int_or_percent(ru.get('maxSurge'), '25%')} max surge\n")
    _pod_template(d, spec.get("template"))
    if st.get("conditions"):
        d.w(0, "Conditions:\n  Type\tStatus\tReason\n")
        d.w(1, "----\t------\t------\n")
        for c in st["conditions"]:
            d.w(1, f"{c.get('type')} \t{c.get('status')}\t{c.get('reason') or ''}\n")
    old, new = split_replicasets(dep, replicasets)
    d.w(0, f"OldReplicaSets:\t{_rs_list(old)}\n")
    d.w(0, f"NewReplicaSet:\t{_rs_list([new] if new else [])}\n")
    d.events(events, now)
    return d.text()


def describe_replicaset(rs: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                        events: Sequence[Mapping[str, Any]] | None, now: float) -> str:
    md, spec, st = meta(rs), rs.get("spec") or {}, rs.get("status") or {}
    phases = [(p.get("status") or {}).get("phase") for p in pods]
    d = Describer()
    d.w(0, f"Name:\t{md.get('name', '')}\n")
    d.w(0, f"Namespace:\t{md.get('namespace', '')}\n")
    d.w(0, f"Selector:\t{selector_text(spec.get('selector')) or '<none>'}\n")
    d.labels("Labels", md.get("labels"))
    d.annotations("Annotations", md.get("annotations"))
    if _controller(rs):
        d.w(0, f"Controlled By:\t{_controller(rs)}\n")
    d.w(0, f"Replicas:\t{int(st.get('replicas') or 0)} current / {int(spec.get('replicas', 1) or 0)} desired\n")
    d.w(0, f"Pods Status:\t{phases.count('Running')} Running / {phases.count('Pending')} Waiting / "
           f"{phases.count('Succeeded')} Succeeded / {phases.count('Failed')} Failed\n")
    _pod_template(d, spec.get("template"))
    if st.get("conditions"):
        d.w(0, "Conditions:\n  Type\tStatus\tReason\n")
        d.w(1, "----\t------\t------\n")
        for c in st["conditions"]:
            d.w(1, f"{c.get('type')} \t{c.get('status')}\t{c.get('reason') or ''}\n")
    d.events(events, now)
    return d.text()


def service_endpoints(svc: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], port: Mapping[str, Any]) -> str:
    """formatEndpoints for one port: the ready pods' ``ip:targetPort``, three then ``+ N more...``."""
    spec = svc.get("spec") or {}
    if not spec.get("selector"):
        return "<none>"
    target = port.get("targetPort", port.get("port"))
    addrs = []
    for p in pods:
        if meta(p).get("deletionTimestamp") or not pod_is_ready(p) or not pod_ip(p):
            continue
        if not selector_matches({"matchLabels": spec["selector"]}, meta(p).get("labels") or {}):
            continue
        number = target
        if isinstance(target, str) and not target.isdigit():
            number = next((cp.get("containerPort") for c in (p.get("spec") or {}).get("containers") or ()
                           for cp in c.get("ports") or () if cp.get("name") == target), None)
            if number is None:
                continue
        ip = pod_ip(p)
        addrs.append(f"[{ip}]:{number}" if ":" in ip else f"{ip}:{number}")
    if not addrs:
        return "<none>"
    if len(addrs) > 3:
        return f"{','.join(addrs[:3])} + {len(addrs) - 3} more..."
    return ",".join(addrs)


def describe_service(svc: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                     events: Sequence[Mapping[str, Any]] | None, now: float) -> str:
    md, spec = meta(svc), svc.get("spec") or {}
    d = Describer()
    d.w(0, f"Name:\t{md.get('name', '')}\n")
    d.w(0, f"Namespace:\t{md.get('namespace', '')}\n")
    d.labels("Labels", md.get("labels"))
    d.annotations("Annotations", md.get("annotations"))
    d.w(0, f"Selector:\t{format_labels(spec.get('selector'))}\n")
    d.w(0, f"Type:\t{spec.get('type') or 'ClusterIP'}\n")
    if spec.get("ipFamilyPolicy"):
        d.w(0, f"IP Family Policy:\t{spec['ipFamilyPolicy']}\n")
    if spec.get("ipFamilies"):
        d.w(0, f"IP Families:\t{','.join(spec['ipFamilies'])}\n")
    d.w(0, f"IP:\t{spec.get('clusterIP') or ''}\n")
    if spec.get("clusterIPs"):
        d.w(0, f"IPs:\t{','.join(spec['clusterIPs'])}\n")
    if spec.get("externalIPs"):
        d.w(0, f"External IPs:\t{','.join(spec['externalIPs'])}\n")
    if spec.get("externalName"):
        d.w(0, f"External Name:\t{spec['externalName']}\n")
    for p in spec.get("ports") or ():
        name = p.get("name") or "<unset>"
        proto = p.get("protocol") or "TCP"
        target = p.get("targetPort", p.get("port"))
        d.w(0, f"Port:\t{name}\t{p.get('port')}/{proto}\n")
        d.w(0, f"TargetPort:\t{target}/{proto}\n")
        if p.get("nodePort"):
            d.w(0, f"NodePort:\t{name}\t{p['nodePort']}/{proto}\n")
        d.w(0, f"Endpoints:\t{service_endpoints(svc, pods, p)}\n")
    d.w(0, f"Session Affinity:\t{spec.get('sessionAffinity') or 'None'}\n")
    if spec.get("internalTrafficPolicy"):
        d.w(0, f"Internal Traffic Policy:\t{spec['internalTrafficPolicy']}\n")
    d.events(events, now)
    return d.text()


def _behavior(d: Describer, direction: str, rules: Mapping[str, Any] | None) -> None:
    if rules is None:
        return
    d.w(1, f"{direction}:\n")
    if rules.get("stabilizationWindowSeconds") is not None:
        d.w(2, f"Stabilization Window: {int(rules['stabilizationWindowSeconds'])} seconds\n")
    if rules.get("policies"):
        d.w(2, f"Select Policy: {rules.get('selectPolicy') or 'Max'}\n")
        d.w(2, "Policies:\n")
        for p in rules["policies"]:
            d.w(3, f"- Type: {p.get('type')}\tValue: {p.get('value')}\tPeriod: {p.get('periodSeconds')} seconds\n")


def describe_hpa(hpa: Mapping[str, Any], events: Sequence[Mapping[str, Any]] | None, now: float) -> str:
    md, spec, st = meta(hpa), hpa.get("spec") or {}, hpa.get("status") or {}
    ref = spec.get("scaleTargetRef") or {}
    current = st.get("currentMetrics") or []
    d = Describer()
    d.w(0, f"Name:\t{md.get('name', '')}\n")
    d.w(0, f"Namespace:\t{md.get('namespace', '')}\n")
    d.labels("Labels", md.get("labels"))
    d.annotations("Annotations", md.get("annotations"))
    d.w(0, f"CreationTimestamp:\t{rfc1123z(md.get('creationTimestamp'))}\n")
    d.w(0, f"Reference:\t{ref.get('kind', '')}/{ref.get('name', '')}\n")
    d.w(0, "Metrics:\t( current / target )\n")
    for i, m in enumerate(spec.get("metrics") or ()):
        cur = current[i] if i < len(current) else {}
        kind = m.get("type")
        if kind == "Pods":
            src = m.get("pods") or {}
            c = "<unknown>" if cur.get("pods") is None else quantity_text(
                (cur["pods"].get("current") or {}).get("averageValue"))
            d.w(1, f'"{(src.get("metric") or {}).get("name", "")}" on pods:\t{c} / '
                   f'{quantity_text((src.get("target") or {}).get("averageValue"))}\n')
        elif kind in ("External", "Object"):
            key = kind.lower()
            src = m.get(key) or {}
            target = src.get("target") or {}
            cur_src = (cur.get(key) or {}).get("current") if cur.get(key) is not None else None
            name = (src.get("metric") or {}).get("name", "")
            if kind == "Object":
                obj = src.get("describedObject") or {}
                d.w(1, f'"{name}" on {obj.get("kind", "")}/{obj.get("name", "")} ')
            else:
                d.w(1, f'"{name}" ')
            if target.get("averageValue") is not None:
                c = "<unknown>" if not cur_src else quantity_text(cur_src.get("averageValue"))
                d.w(0, f"(target average value):\t{c} / {quantity_text(target['averageValue'])}\n")
            else:
                c = "<unknown>" if not cur_src else quantity_text(cur_src.get("value"))
                d.w(0, f"(target value):\t{c} / {quantity_text(target.get('value'))}\n")
        elif kind in ("Resource", "ContainerResource"):
            key = "resource" if kind == "Resource" else "containerResource"
            src = m.get(key) or {}
            target = src.get("target") or {}
            cur_src = (cur.get(key) or {}).get("current") if cur.get(key) is not None else None
            where = f" of container \"{src.get('container')}\"" if kind == "ContainerResource" else ""
            d.w(1, f"resource {src.get('name', '')}{where} on pods")
            if target.get("averageValue") is not None:
                c = "<unknown>" if not cur_src else quantity_text(cur_src.get("averageValue"))
                d.w(0, f":\t{c} / {quantity_text(target['averageValue'])}\n")
            else:
                c = "<unknown>"
                if cur_src and cur_src.get("averageUtilization") is not None:
                    c = f"{int(cur_src['averageUtilization'])}% ({quantity_text(cur_src.get('averageValue') or 0)})"
                t = "<auto>" if target.get("averageUtilization") is None else f"{int(target['averageUtilization'])}%"
                d.w(1, f"(as a percentage of request):\t{c} / {t}\n")
        else:
            d.w(1, f'<unknown metric type "{kind}">\n')
    d.w(0, f"Min replicas:\t{'<unset>' if spec.get('minReplicas') is None else spec['minReplicas']}\n")
    d.w(0, f"Max replicas:\t{int(spec.get('maxReplicas') or 0)}\n")
    if spec.get("behavior") is not None:
        d.w(0, "Behavior:\n")
        _behavior(d, "Scale Up", spec["behavior"].get("scaleUp"))
        _behavior(d, "Scale Down", spec["behavior"].get("scaleDown"))
    d.w(0, f"{ref.get('kind', '')} pods:\t{int(st.get('currentReplicas') or 0)} current / "
           f"{int(st.get('desiredReplicas') or 0)} desired\n")
    if st.get("conditions"):
        d.w(0, "Conditions:\n")
        d.w(1, "Type\tStatus\tReason\tMessage\n")
        d.w(1, "----\t------\t------\t-------\n")
        for c in st["conditions"]:
            d.w(1, f"{c.get('type')}\t{c.get('status')}\t{c.get('reason') or ''}\t{c.get('message') or ''}\n")
    d.events(events, now)
    return d.text()


def describe_namespace(ns: Mapping[str, Any]) -> str:
    md = meta(ns)
    d = Describer()
    d.w(0, f"Name:\t{md.get('name', '')}\n")
    d.labels("Labels", md.get("labels") or {"kubernetes.io/metadata.name": md.get("name", "")})
    d.annotations("Annotations", md.get("annotations"))
    d.w(0, f"Status:\t{(ns.get('status') or {}).get('phase') or 'Active'}\n")
    d.w(0, "\nNo resource quota.\n")
    d.w(0, "\nNo LimitRange resource.\n")
    return d.text()


def describe_priorityclass(pc: Mapping[str, Any], events: Sequence[Mapping[str, Any]] | None, now: float) -> str:
    md = meta(pc)
    d = Describer()
    d.w(0, f"Name:\t{md.get('name', '')}\n")
    d.w(0, f"Value:\t{int(pc.get('value') or 0)}\n")
    d.w(0, f"GlobalDefault:\t{'true' if pc.get('globalDefault') else 'false'}\n")
    d.w(0, f"PreemptionPolicy:\t{pc.get('preemptionPolicy') or 'PreemptLowerPriority'}\n")
    d.w(0, f"Description:\t{pc.get('description') or ''}\n")
    d.w(0, f"Annotations:\t{format_labels(md.get('annotations')) if md.get('annotations') else ''}\n")
    d.events(events, now)
    return d.text()


def _pod_resources(pod: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """PodRequestsAndLimits: container sums (requests default to limits), raised by init containers."""
    req: dict[str, float] = {}
    lim: dict[str, float] = {}
    spec = pod.get("spec") or {}
    for c in spec.get("containers") or ():
        res = c.get("resources") or {}
        limits = {k: parse_quantity(v) for k, v in (res.get("limits") or {}).items()}
        requests = {**limits, **{k: parse_quantity(v) for k, v in (res.get("requests") or {}).items()}}
        for k, v in requests.items():
            req[k] = req.get(k, 0.0) + v
        for k, v in limits.items():
            lim[k] = lim.get(k, 0.0) + v
    for c in spec.get("initContainers") or ():
        res = c.get("resources") or {}
        limits = {k: parse_quantity(v) for k, v in (res.get("limits") or {}).items()}
        requests = {**limits, **{k: parse_quantity(v) for k, v in (res.get("requests") or {}).items()}}
        for k, v in requests.items():
            req[k] = max(req.get(k, 0.0), v)
        for k, v in limits.items():
            lim[k] = max(lim.get(k, 0.0), v)
    return req, lim


def _pct(value: float, total: float) -> int:
    return int(value / total * 100) if total else 0


def describe_node(node: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                  events: Sequence[Mapping[str, Any]] | None, now: float) -> str:
    md, spec, st = meta(node), node.get("spec") or {}, node.get("status") or {}
    d = Describer()
    d.w(0, f"Name:\t{md.get('name', '')}\n")
    d.w(0, f"Roles:\t{','.join(node_roles(node)) or '<none>'}\n")
    d.labels("Labels", md.get("labels"))
    d.annotations("Annotations", md.get("annotations"))
    d.w(0, f"CreationTimestamp:\t{rfc1123z(md.get('creationTimestamp'))}\n")
    d.taints("Taints", spec.get("taints"))
    d.w(0, f"Unschedulable:\t{'true' if spec.get('unschedulable') else 'false'}\n")
    if st.get("conditions"):
        d.w(0, "Conditions:\n  Type\tStatus\tLastHeartbeatTime\tLastTransitionTime\tReason\tMessage\n")
        d.w(1, "----\t------\t-----------------\t------------------\t------\t-------\n")
        for c in st["conditions"]:
            d.w(1, f"{c.get('type')} \t{c.get('status')} \t{rfc1123z(c.get('lastHeartbeatTime'))} \t"
                   f"{rfc1123z(c.get('lastTransitionTime'))} \t{c.get('reason') or ''} \t{c.get('message') or ''}\n")
    d.w(0, "Addresses:\n")
    for a in st.get("addresses") or ():
        d.w(1, f"{a.get('type')}:\t{a.get('address')}\n")
    for title, key in (("Capacity", "capacity"), ("Allocatable", "allocatable")):
        if st.get(key):
            d.w(0, f"{title}:\n")
            for name in sorted(st[key]):
                d.w(0, f"  {name}:\t{st[key][name]}\n")
    gpus = (st.get("shoal") or {}).get("gpus") or []
    if gpus:
        d.w(0, "GPUs:\n")
        for g in gpus:
            d.w(1, f"{g.get('index')}:\t{g.get('product', '')} ({g.get('uuid', '')})\n")
    alloc = st.get("allocatable") or st.get("capacity") or {}
    cpu_total, mem_total = parse_quantity(alloc.get("cpu")), parse_quantity(alloc.get("memory"))
    active = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    d.w(0, f"Non-terminated Pods:\t({len(active)} in total)\n")
    d.w(1, "Namespace\tName\t\tCPU Requests\tCPU Limits\tMemory Requests\tMemory Limits\tAge\n")
    d.w(1, "---------\t----\t\t------------\t----------\t---------------\t-------------\t---\n")
    total_req: dict[str, float] = {}
    total_lim: dict[str, float] = {}
    for p in active:
        req, lim = _pod_resources(p)
        for k, v in req.items():
            total_req[k] = total_req.get(k, 0.0) + v
        for k, v in lim.items():
            total_lim[k] = total_lim.get(k, 0.0) + v
        cells = [f"{format_quantity(req.get('cpu', 0))} ({_pct(req.get('cpu', 0), cpu_total)}%)",
                 f"{format_quantity(lim.get('cpu', 0))} ({_pct(lim.get('cpu', 0), cpu_total)}%)",
                 f"{format_quantity(req.get('memory', 0), True)} ({_pct(req.get('memory', 0), mem_total)}%)",
                 f"{format_quantity(lim.get('memory', 0), True)} ({_pct(lim.get('memory', 0), mem_total)}%)"]
        d.w(1, f"{meta(p).get('namespace', '')}\t{meta(p).get('name', '')}\t\t{chr(9).join(cells)}\t"
               f"{age(meta(p).get('creationTimestamp'), now)}\n")
    d.w(0, "Allocated resources:\n  (Total limits may be over 100 percent, i.e., overcommitted.)\n")
    d.w(1, "Resource\tRequests\tLimits\n")
    d.w(1, "--------\t--------\t------\n")
    for name, total, binary in (("cpu", cpu_total, False), ("memory", mem_total, True)):
        r, li = total_req.get(name, 0.0), total_lim.get(name, 0.0)
        d.w(1, f"{name}\t{format_quantity(r, binary)} ({_pct(r, total)}%)\t"
               f"{format_quantity(li, binary)} ({_pct(li, total)}%)\n")
    for name in sorted(k for k in alloc if k not in ("cpu", "memory", "pods", "ephemeral-storage")):
        d.w(1, f"{name}\t{format_quantity(total_req.get(name, 0.0))}\t{format_quantity(total_lim.get(name, 0.0))}\n")
    d.events(events, now)
    return d.text()
