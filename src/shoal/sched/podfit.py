"""Where a serving pod may go: kube-scheduler's filters, as node exclusions for placement.

A pod (``PendingJob.pod``) is placed like any one-node job, on the nodes these filters
leave it; batch jobs are untouched (they ignore taints: partitions fence training).

Static filters, evaluated once per distinct set of terms in a pass:

* ``nodeSelector``: every label must be on the node with that value;
* ``affinity.nodeAffinity`` required terms (ORed terms of ANDed expressions);
* taints: a node with a ``NoSchedule`` or ``NoExecute`` taint the pod does not tolerate.

Dynamic filters, against the pods running and those started earlier in the same pass:

* ports: pods use the node's network, so two pods with a common containerPort never share a
  node (as Kubernetes treats hostPorts);
* ``podAntiAffinity`` required terms: not in a topology domain (``topologyKey``, e.g.
  ``kubernetes.io/hostname``) holding a pod of the same namespace that the term selects, nor
  where a running pod's own anti-affinity selects this pod (the symmetric check);
* ``podAffinity`` required terms: only in a domain that holds a selected pod (a pod that
  selects itself may start the first domain, as in Kubernetes).

Preferences (preferred node affinity weights, minus preferred anti-affinity weights, minus
PreferNoSchedule taints) are not filters: ``preferred_tiers`` orders nodes by score, and the
pass tries the best tier first, then widens.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from shoal.model.selectors import LabelSelector, node_affinity_matches, preferred_score, untolerated
from shoal.model.snapshot import NodeInfo, PodTerms, Snapshot

HOSTNAME = "kubernetes.io/hostname"


def _domain(node: NodeInfo, key: str) -> str | None:
    if key == HOSTNAME:
        return node.labels.get(HOSTNAME, node.name)
    return node.labels.get(key)


def _terms(affinity: Mapping, kind: str, required: bool) -> list[Mapping]:
    block = (affinity or {}).get(kind) or {}
    if required:
        return list(block.get("requiredDuringSchedulingIgnoredDuringExecution") or ())
    return [dict(p.get("podAffinityTerm") or {}, weight=p.get("weight", 0))
            for p in block.get("preferredDuringSchedulingIgnoredDuringExecution") or ()]


def _selects(term: Mapping, owner_ns: str, other: PodTerms) -> bool:
    namespaces = term.get("namespaces") or [owner_ns]
    if other.namespace not in namespaces:
        return False
    selector = term.get("labelSelector")
    if selector is None:
        return False
    return LabelSelector.from_dict(selector).matches(other.labels)


def static_fit(node: NodeInfo, pod: PodTerms) -> str | None:
    """Why ``node`` can never take ``pod`` as labelled and tainted now (None: it can)."""
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return "didn't match Pod's node affinity/selector"
    if not node_affinity_matches(pod.affinity, node.labels, node.name):
        return "didn't match Pod's node affinity/selector"
    bad = untolerated(node.taints, pod.tolerations)
    if bad:
        return f"had untolerated taint {{{bad[0].key}: {bad[0].value}}}" if bad[0].value \
            else f"had untolerated taint {{{bad[0].key}}}"
    return None


class PodFit:
    """The pod filters of one pass, with the pods placed so far."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.placed: list[tuple[str, PodTerms]] = []  # (node, pod) of every pod holding a node
        # Pods still stopping count too, as terminating pods do for kube-scheduler: they hold
        # their ports (and anti-affinity) until their processes are gone.
        for job in snapshot.active:
            if job.pod is not None:
                for name, _ in job.allocation.nodes:
                    self.placed.append((name, job.pod))
        self._static: dict[str, frozenset[str]] = {}

    def static_excluded(self, pod: PodTerms) -> frozenset[str]:
        found = self._static.get(pod.key)
        if found is None:
            found = self._static[pod.key] = frozenset(
                name for name, node in self.nodes.items() if static_fit(node, pod) is not None)
        return found

    def excluded(self, pod: PodTerms) -> frozenset[str]:
        """Every node this pod may not use now."""
        out = set(self.static_excluded(pod))
        if pod.ports:
            wanted = set(pod.ports)
            out.update(name for name, other in self.placed if wanted.intersection(other.ports))
        for term in _terms(pod.affinity, "podAntiAffinity", True):
            key = term.get("topologyKey") or HOSTNAME
            taken = {_domain(self.nodes[name], key) for name, other in self.placed
                     if name in self.nodes and _selects(term, pod.namespace, other)}
            taken.discard(None)
            out.update(name for name, node in self.nodes.items() if _domain(node, key) in taken)
        for name, other in self.placed:  # their anti-affinity against this pod
            for term in _terms(other.affinity, "podAntiAffinity", True):
                if name in self.nodes and _selects(term, other.namespace, pod):
                    key = term.get("topologyKey") or HOSTNAME
                    dom = _domain(self.nodes[name], key)
                    out.update(n for n, node in self.nodes.items() if dom is not None and _domain(node, key) == dom)
        for term in _terms(pod.affinity, "podAffinity", True):
            key = term.get("topologyKey") or HOSTNAME
            held = {_domain(self.nodes[name], key) for name, other in self.placed
                    if name in self.nodes and _selects(term, pod.namespace, other)}
            held.discard(None)
            if not held and _selects(term, pod.namespace, pod):
                continue  # the first of its kind: any domain will do
            out.update(name for name, node in self.nodes.items() if _domain(node, key) not in held)
        return frozenset(out)

    def score(self, node: NodeInfo, pod: PodTerms) -> int:
        s = preferred_score(pod.affinity, node.labels, node.name)
        for term in _terms(pod.affinity, "podAntiAffinity", False):
            key = term.get("topologyKey") or HOSTNAME
            dom = _domain(node, key)
            if dom is not None and any(_domain(self.nodes[n], key) == dom and _selects(term, pod.namespace, o)
                                       for n, o in self.placed if n in self.nodes):
                s -= int(term.get("weight", 0))
        for term in _terms(pod.affinity, "podAffinity", False):
            key = term.get("topologyKey") or HOSTNAME
            dom = _domain(node, key)
            if dom is not None and any(_domain(self.nodes[n], key) == dom and _selects(term, pod.namespace, o)
                                       for n, o in self.placed if n in self.nodes):
                s += int(term.get("weight", 0))
        if untolerated(node.taints, pod.tolerations, ("PreferNoSchedule",)):
            s -= 1
        return s

    def has_preferences(self, pod: PodTerms) -> bool:
        a = pod.affinity or {}
        return bool(((a.get("nodeAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution"))
                    or _terms(a, "podAntiAffinity", False) or _terms(a, "podAffinity", False)
                    or any(t[2] == "PreferNoSchedule" for n in self.nodes.values() for t in n.taints))

    def preferred_tiers(self, pod: PodTerms, allowed: Iterable[str]) -> list[frozenset[str]]:
        """Nodes to keep out, tier by tier: first everything below the best score, then below
        the second best, ..., last nothing. Placement tries each until one fits."""
        scores: dict[str, int] = {n: self.score(self.nodes[n], pod) for n in allowed if n in self.nodes}
        levels = sorted(set(scores.values()), reverse=True)
        return [frozenset(n for n, s in scores.items() if s < level) for level in levels[:-1]] + [frozenset()]

    def started(self, node: str, pod: PodTerms) -> None:
        self.placed.append((node, pod))
