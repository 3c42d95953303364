"""What ``shoal describe`` prints, as ``kubectl describe`` 1.30 prints it: pure functions over
Kubernetes-shaped object dicts, one per kind, written through kubectl's PrefixWriter over a
tabwriter (``Describer``). Stdlib-only and cheap to import, like ``shoal.kube.fmt``.
"""

from __future__ import annotations

import json

from shoal.kube.fmt import (
    age,
    deployment_revision,
    format_labels,
    format_quantity,
    meta,
    node_roles,
    parse_quantity,
    parse_time,
    pod_ip,
    pod_is_ready,
    quantity_text,
    rfc1123z,
    selector_matches,
    selector_text,
    tabwrite,
    taint_text,

)

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs start-up time
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

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

    def conditions(self, conditions: Sequence[Mapping[str, Any]] | None) -> None:
        """A workload's Type/Status/Reason table (Deployments, ReplicaSets); nothing when none."""
        if not conditions:
            return
        self.w(0, "Conditions:\n  Type\tStatus\tReason\n")
        self.w(1, "----\t------\t------\n")
        for c in conditions:
            self.w(1, f"{c.get('type')} \t{c.get('status')}\t{c.get('reason') or ''}\n")

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
    d.conditions(st.get("conditions"))
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
    d.conditions(st.get("conditions"))
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
