"""Deployment and ReplicaSet control, as kube-controller-manager's controllers do it, as pure
functions: the server loop (and the simulator) read the objects, call :func:`plan_rollout`
and :func:`replicaset_pod_diff`, and carry out what they return.

One call is one sync of the Deployment controller: find the ReplicaSet whose pod template is
the Deployment's (or plan to create it), then either scale the new one up within
``maxSurge`` or the old ones down within ``maxUnavailable`` (RollingUpdate), or take every
old pod away before the new ones start (Recreate); prune old ReplicaSets beyond
``revisionHistoryLimit``; and compute the Deployment's status and its Available and
Progressing conditions. Level-triggered: calling it again with the same inputs plans the
same thing. Stdlib only.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

DEFAULT_MAX_SURGE = "25%"
DEFAULT_MAX_UNAVAILABLE = "25%"
HASH_LABEL = "pod-template-hash"
REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
DESIRED_ANNOTATION = "deployment.kubernetes.io/desired-replicas"
MAX_ANNOTATION = "deployment.kubernetes.io/max-replicas"
_NOT_COPIED = frozenset({REVISION_ANNOTATION, DESIRED_ANNOTATION, MAX_ANNOTATION,
                         "deployment.kubernetes.io/revision-history",
                         "kubectl.kubernetes.io/last-applied-configuration"})
_HASH_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' SafeEncodeString alphabet: no vowels, no 0/1/3

# Progressing condition reasons, as the deployment controller names them
NEW_RS_CREATED = "NewReplicaSetCreated"
FOUND_NEW_RS = "FoundNewReplicaSet"
RS_UPDATED = "ReplicaSetUpdated"
NEW_RS_AVAILABLE = "NewReplicaSetAvailable"
TIMED_OUT = "ProgressDeadlineExceeded"
PAUSED = "DeploymentPaused"
RESUMED = "DeploymentResumed"


@dataclass(frozen=True)
class RSView:
    """What the controller sees of one ReplicaSet the Deployment owns."""

    name: str
    revision: int  # deployment.kubernetes.io/revision
    template_hash: str  # its pod-template-hash label
    replicas: int  # spec.replicas
    ready: int = 0  # status.readyReplicas
    available: int = 0  # status.availableReplicas: ready for at least minReadySeconds
    created: float = 0.0
    current: int | None = None  # status.replicas: its pods that exist, terminating ones aside (None: = replicas)
    terminating: int = 0  # its pods still shutting down (Recreate waits for them)

    @property
    def pods(self) -> int:
        return self.replicas if self.current is None else self.current


@dataclass(frozen=True)
class NewReplicaSet:
    """A ReplicaSet to create for the Deployment's current template (see :func:`replicaset_manifest`)."""

    name: str
    template_hash: str
    revision: int
    replicas: int


@dataclass(frozen=True)
class RolloutPlan:
    new_replicaset: str | None  # the ReplicaSet running the current template (None: not created yet)
    create: NewReplicaSet | None
    replicas: Mapping[str, int]  # spec.replicas every ReplicaSet should have, the one to create included
    revisions: Mapping[str, int]  # ReplicaSets whose revision changes (an old template back in use: undo)
    delete: tuple[str, ...]  # old, empty ReplicaSets beyond revisionHistoryLimit
    revision: int  # the Deployment's deployment.kubernetes.io/revision
    status: Mapping[str, Any]  # the Deployment's new status

    def scaled(self, replicasets: Iterable[RSView]) -> dict[str, int]:
        """Only the existing ReplicaSets whose spec.replicas changes."""
        return {rs.name: self.replicas[rs.name] for rs in replicasets
                if rs.name in self.replicas and self.replicas[rs.name] != rs.replicas}


@dataclass(frozen=True)
class PodView:
    """What the ReplicaSet controller sees of one of its pods."""

    name: str
    created: float
    node: str | None = None  # None: not scheduled yet
    phase: str = "Pending"  # Pending, Running, Succeeded, Failed, Unknown
    ready: bool = False
    ready_since: float | None = None  # when its Ready condition last became True
    restarts: int = 0
    terminating: bool = False
    deletion_cost: int = 0  # controller.kubernetes.io/pod-deletion-cost


# -- pod templates and ReplicaSets -----------------------------------------------------------

def template_hash(template: Mapping) -> str:
    """A stable 10-character name for a pod template, in the alphabet of Kubernetes'
    pod-template-hash. A ``pod-template-hash`` label in the template is left out, so a
    ReplicaSet's template hashes like the Deployment template it came from. Hash defaulted
    templates: a default filled in changes the hash."""
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    labels.pop(HASH_LABEL, None)
    meta = {**(template.get("metadata") or {}), "labels": labels}
    canonical = json.dumps({**template, "metadata": meta}, sort_keys=True, separators=(",", ":"))
    number = int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:8], "big")
    chars = []
    for _ in range(10):
        number, digit = divmod(number, len(_HASH_ALPHABET))
        chars.append(_HASH_ALPHABET[digit])
    return "".join(chars)


def replicaset_manifest(deployment: Mapping, new: NewReplicaSet) -> dict:
    """The ReplicaSet object for ``new``: the Deployment's template and selector plus the
    pod-template-hash label, its annotations (change-cause and the like), the revision,
    and an owner reference to the Deployment."""
    meta, spec = deployment.get("metadata") or {}, deployment.get("spec") or {}
    template = copy.deepcopy(spec.get("template") or {})
    tmeta = template.setdefault("metadata", {})
    tmeta["labels"] = {**(tmeta.get("labels") or {}), HASH_LABEL: new.template_hash}
    selector = copy.deepcopy(spec.get("selector") or {})
    selector["matchLabels"] = {**(selector.get("matchLabels") or {}), HASH_LABEL: new.template_hash}
    desired = int(spec.get("replicas", 1))
    surge, _ = _fenceposts(spec, desired)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _NOT_COPIED}
    annotations.update({REVISION_ANNOTATION: str(new.revision), DESIRED_ANNOTATION: str(desired),
                        MAX_ANNOTATION: str(desired + surge)})
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": meta.get("name"),
             "controller": True, "blockOwnerDeletion": True}
    if meta.get("uid"):
        owner["uid"] = meta["uid"]
    return {
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": new.name, "namespace": meta.get("namespace", "default"),
                     "labels": dict(tmeta["labels"]), "annotations": annotations, "ownerReferences": [owner]},
        "spec": {"replicas": new.replicas, "minReadySeconds": int(spec.get("minReadySeconds", 0)),
                 "selector": selector, "template": template},
    }


def rollback_template(replicaset_template: Mapping) -> dict:
    """The Deployment template that brings an old ReplicaSet back (``rollout undo``): its
    template without the pod-template-hash label. Applying it makes :func:`plan_rollout`
    reuse that ReplicaSet under a new revision."""
    template = copy.deepcopy(dict(replicaset_template))
    labels = (template.get("metadata") or {}).get("labels")
    if labels:
        labels.pop(HASH_LABEL, None)
    return template


# -- maxSurge / maxUnavailable ---------------------------------------------------------------

def scaled_value(value: int | str, total: int, round_up: bool) -> int:
    """An int-or-percent against ``total``: ``"25%"`` of 10 is 3 rounded up, 2 rounded down."""
    if isinstance(value, int):
        return value
    text = value.strip()
    if not text.endswith("%") or not text[:-1].isdigit():
        raise ValueError(f"invalid value {value!r}: must be an integer or a percentage (e.g. '25%')")
    exact = int(text[:-1]) * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def resolve_fenceposts(max_surge: int | str, max_unavailable: int | str, desired: int) -> tuple[int, int]:
    """(surge, unavailable) in pods. Surge rounds up, unavailable down; when both come to 0,
    one pod may be unavailable, or the rollout could never move."""
    surge = scaled_value(max_surge, desired, True)
    unavailable = scaled_value(max_unavailable, desired, False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def _fenceposts(spec: Mapping, desired: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) in pods for this Deployment spec; (0, 0) for Recreate."""
    strategy = spec.get("strategy") or {}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return 0, 0
    ru = strategy.get("rollingUpdate") or {}
    surge, unavailable = resolve_fenceposts(ru.get("maxSurge", DEFAULT_MAX_SURGE),
                                            ru.get("maxUnavailable", DEFAULT_MAX_UNAVAILABLE), desired)
    return surge, (0 if desired == 0 else min(unavailable, desired))


# -- the Deployment controller ---------------------------------------------------------------

def plan_rollout(deployment: Mapping, replicasets: Sequence[RSView], now: float) -> RolloutPlan:
    """One sync of the Deployment controller over the ReplicaSets it owns (see module doc).
    ``deployment`` is the stored object: defaulted spec, ``metadata.generation`` and the
    last ``status`` (its conditions and counts are how progress is judged)."""
    meta, spec = deployment.get("metadata") or {}, deployment.get("spec") or {}
    name = meta.get("name", "")
    generation = int(meta.get("generation", 1))
    desired = int(spec.get("replicas", 1))
    recreate = (spec.get("strategy") or {}).get("type") == "Recreate"
    surge, max_unavailable = _fenceposts(spec, desired)
    deadline = spec.get("progressDeadlineSeconds", 600)
    history = spec.get("revisionHistoryLimit", 10)
    paused = bool(spec.get("paused", False))
    old_status = deployment.get("status") or {}
    conds = _Conditions(old_status.get("conditions") or (), now)

    if deadline is not None:  # checkPausedConditions: a pause must not count against the deadline
        cur = conds.get("Progressing")
        if not (cur and cur["reason"] == TIMED_OUT):  # a reported timeout is never overwritten
            was_paused = cur is not None and cur["reason"] == PAUSED
            if paused and not was_paused:
                conds.set("Progressing", "Unknown", PAUSED, "Deployment is paused")
            elif not paused and was_paused:
                conds.set("Progressing", "Unknown", RESUMED, "Deployment is resumed")

    h = template_hash(spec.get("template") or {})
    ordered = sorted(replicasets, key=lambda r: (r.created, r.name))
    new = next((r for r in ordered if r.template_hash == h), None)
    olds = [r for r in ordered if r is not new]
    want = {r.name: r.replicas for r in ordered}
    revisions: dict[str, int] = {}
    next_revision = max((r.revision for r in olds), default=0) + 1
    if new is not None:
        if new.revision < next_revision:
            revisions[new.name] = next_revision
            new = _replace(new, revision=next_revision)
        if deadline is not None and conds.get("Progressing") is None:
            conds.set("Progressing", "True", FOUND_NEW_RS, f'Found new replica set "{new.name}"')

    create: NewReplicaSet | None = None

    def create_new(replicas: int) -> RSView:
        nonlocal create
        create = NewReplicaSet(f"{name}-{h}", h, next_revision, replicas)
        want[create.name] = replicas
        if deadline is not None:
            conds.set("Progressing", "True", NEW_RS_CREATED, f'Created new replica set "{create.name}"')
        return RSView(create.name, next_revision, h, replicas, created=now, current=0)

    delete: tuple[str, ...] = ()
    progress = True
    if paused:
        _scale(new, olds, want, desired, surge, recreate, old_status)
        delete = _cleanup(olds, want, history)
        progress = False
    elif recreate:
        scaled = False
        for rs in olds:
            if want[rs.name] > 0:
                want[rs.name], scaled = 0, True
        if not scaled and not any(rs.pods + rs.terminating > 0 for rs in olds):
            if new is None:
                new = create_new(desired)
            want[new.name] = desired
            if _complete(desired, generation, old_status):
                delete = _cleanup(olds, want, history)
    else:
        if new is None:
            new = create_new(_new_rs_replicas(desired, surge, sum(want.values()), 0))
        if not _reconcile_new(new, want, desired, surge):
            all_rs = olds + [new]
            if not _reconcile_old(new, olds, all_rs, want, desired, max_unavailable):
                if _complete(desired, generation, old_status):
                    delete = _cleanup(olds, want, history)

    views = olds + ([new] if new is not None else [])
    status = _status(views, new, want, desired, max_unavailable, generation, conds)
    if progress:
        _progress(status, old_status, new, name, desired, generation, deadline, conds, now)
    status["conditions"] = conds.items
    revision = new.revision if new is not None else max((r.revision for r in olds), default=0)
    return RolloutPlan(new.name if new is not None else None, create, dict(want), revisions, delete,
                       revision, status)


def _replace(rs: RSView, **changes: Any) -> RSView:
    return RSView(**{**rs.__dict__, **changes})


def _new_rs_replicas(desired: int, surge: int, total: int, new_replicas: int) -> int:
    """NewRSNewReplicas: grow the new ReplicaSet while all pods stay within desired + surge."""
    max_total = desired + surge
    if total >= max_total:
        return new_replicas
    return new_replicas + max(0, min(max_total - total, desired - new_replicas))


def _reconcile_new(new: RSView, want: dict[str, int], desired: int, surge: int) -> bool:
    have = want[new.name]
    if have == desired:
        return False
    target = desired if have > desired else _new_rs_replicas(desired, surge, sum(want.values()), have)
    want[new.name] = target
    return target != have


def _reconcile_old(new: RSView, olds: list[RSView], all_rs: list[RSView], want: dict[str, int],
                   desired: int, max_unavailable: int) -> bool:
    """Scale old ReplicaSets down as far as availability allows: their unready pods first
    (they serve nobody), then available ones down to desired - maxUnavailable."""
    if sum(want[r.name] for r in olds) == 0:
        return False
    min_available = desired - max_unavailable
    new_unavailable = want[new.name] - new.available
    max_scaled_down = sum(want.values()) - min_available - new_unavailable
    if max_scaled_down <= 0:
        return False
    active = [r for r in olds if want[r.name] > 0]  # oldest first already
    cleaned = 0
    for rs in active:
        if cleaned >= max_scaled_down:
            break
        unhealthy = want[rs.name] - rs.available
        if unhealthy <= 0:
            continue
        n = min(max_scaled_down - cleaned, unhealthy)
        want[rs.name] -= n
        cleaned += n
    scaled = 0
    available = sum(r.available for r in all_rs)
    if available > min_available:
        budget = available - min_available
        for rs in active:
            if scaled >= budget:
                break
            if want[rs.name] == 0:
                continue
            n = min(want[rs.name], budget - scaled)
            want[rs.name] -= n
            scaled += n
    return cleaned + scaled > 0


def _scale(new: RSView | None, olds: list[RSView], want: dict[str, int], desired: int, surge: int,
           recreate: bool, old_status: Mapping) -> None:
    """A replica count change without a rollout (a paused Deployment): all of it to the one
    active ReplicaSet, else proportionally to each one's size (RollingUpdate only)."""
    everyone = ([new] if new is not None else []) + olds
    if not everyone:
        return
    active = [r for r in everyone if want[r.name] > 0]
    target = None
    if len(active) == 1:
        target = active[0]
    elif not active:
        target = new if new is not None else max(olds, key=lambda r: (r.created, r.name))
    if target is not None:
        want[target.name] = desired
        return
    if new is not None and want[new.name] == desired and new.available == desired:
        for rs in olds:
            want[rs.name] = 0
        return
    if recreate:
        return
    total = sum(want[r.name] for r in active)
    allowed = desired + surge if desired > 0 else 0
    to_add = allowed - total
    if to_add == 0:
        return
    # bigger first; ties: newer first when growing, older first when shrinking
    sign = -1 if to_add > 0 else 1
    active.sort(key=lambda r: (-want[r.name], sign * r.created, r.name))
    before = int(old_status.get("replicas") or 0)
    added = 0
    sizes = {}
    for rs in active:
        p = _proportion(want[rs.name], desired, surge, before, to_add, added)
        sizes[rs.name] = want[rs.name] + p
        added += p
    first = active[0].name
    sizes[first] = max(0, sizes[first] + to_add - added)
    want.update(sizes)


def _proportion(size: int, desired: int, surge: int, before: int, to_add: int, added: int) -> int:
    if size == 0 or to_add == 0 or to_add == added:
        return 0
    if desired == 0:
        fraction = -size
    elif before == 0:
        fraction = 0
    else:
        exact = size * (desired + surge) / before
        fraction = int(math.copysign(math.floor(abs(exact) + 0.5), exact)) - size
    allowed = to_add - added
    return min(fraction, allowed) if to_add > 0 else max(fraction, allowed)


def _cleanup(olds: list[RSView], want: Mapping[str, int], history: int | None) -> tuple[str, ...]:
    """Old ReplicaSets past revisionHistoryLimit, lowest revision first, never one with pods."""
    if history is None:
        return ()
    excess = len(olds) - int(history)
    if excess <= 0:
        return ()
    oldest = sorted(olds, key=lambda r: (r.revision, r.created))[:excess]
    return tuple(r.name for r in oldest if want[r.name] == 0 and r.pods == 0 and r.terminating == 0)


def _complete(desired: int, generation: int, status: Mapping) -> bool:
    return (status.get("updatedReplicas", 0) == desired and status.get("replicas", 0) == desired
            and status.get("availableReplicas", 0) == desired
            and status.get("observedGeneration", 0) >= generation)


def _status(views: list[RSView], new: RSView | None, want: Mapping[str, int], desired: int,
            max_unavailable: int, generation: int, conds: _Conditions) -> dict[str, Any]:
    available = sum(r.available for r in views)
    status = {
        "observedGeneration": generation,
        "replicas": sum(r.pods for r in views),
        "updatedReplicas": new.pods if new is not None else 0,
        "readyReplicas": sum(r.ready for r in views),
        "availableReplicas": available,
        "unavailableReplicas": max(0, sum(want[r.name] for r in views) - available),
    }
    if available >= desired - max_unavailable:
        conds.set("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.")
    else:
        conds.set("Available", "False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.")
    return status


def _progress(status: Mapping, old_status: Mapping, new: RSView | None, name: str, desired: int,
              generation: int, deadline: int | None, conds: _Conditions, now: float) -> None:
    """syncRolloutStatus: the Progressing condition, and whether progressDeadlineSeconds passed."""
    if deadline is None:
        conds.remove("Progressing")
        return
    cur = conds.get("Progressing")
    if status["replicas"] == status["updatedReplicas"] and cur is not None and cur["reason"] == NEW_RS_AVAILABLE:
        return  # a finished rollout: nothing to estimate
    what = f'ReplicaSet "{new.name}"' if new is not None else f'Deployment "{name}"'
    if _complete(desired, generation, status):
        conds.set("Progressing", "True", NEW_RS_AVAILABLE, f"{what} has successfully progressed.")
    elif _progressing(old_status, status):
        transition = cur["lastTransitionTime"] if cur is not None and cur["status"] == "True" else None
        conds.remove("Progressing")
        conds.set("Progressing", "True", RS_UPDATED, f"{what} is progressing.", transition=transition)
    elif _timed_out(conds.get("Progressing"), deadline, now):
        conds.set("Progressing", "False", TIMED_OUT, f"{what} has timed out progressing.")


def _progressing(old: Mapping, new: Mapping) -> bool:
    old_old = old.get("replicas", 0) - old.get("updatedReplicas", 0)
    new_old = new["replicas"] - new["updatedReplicas"]
    return (new["updatedReplicas"] > old.get("updatedReplicas", 0) or new_old < old_old
            or new["readyReplicas"] > old.get("readyReplicas", 0)
            or new["availableReplicas"] > old.get("availableReplicas", 0))


def _timed_out(cond: Mapping | None, deadline: int, now: float) -> bool:
    if cond is None or cond["reason"] == NEW_RS_AVAILABLE:
        return False
    if cond["reason"] == TIMED_OUT:
        return True
    return parse_time(cond.get("lastUpdateTime")) + deadline < now


class _Conditions:
    """A Deployment's conditions with SetDeploymentCondition's rules: the same status and
    reason change nothing; the same status keeps lastTransitionTime."""

    def __init__(self, conditions: Iterable[Mapping], now: float):
        self.items = [dict(c) for c in conditions]
        self.now = format_time(now)

    def get(self, kind: str) -> dict | None:
        return next((c for c in self.items if c.get("type") == kind), None)

    def remove(self, kind: str) -> None:
        self.items = [c for c in self.items if c.get("type") != kind]

    def set(self, kind: str, status: str, reason: str, message: str, transition: str | None = None) -> None:
        cur = self.get(kind)
        if cur is not None and cur.get("status") == status and cur.get("reason") == reason:
            return
        if transition is None:
            transition = cur["lastTransitionTime"] if cur is not None and cur.get("status") == status else self.now
        self.remove(kind)
        self.items.append({"type": kind, "status": status, "lastUpdateTime": self.now,
                           "lastTransitionTime": transition, "reason": reason, "message": message})


def format_time(epoch: float) -> str:
    """RFC 3339 in UTC to the second, as Kubernetes writes condition times."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def parse_time(value: str | float | int | None) -> float:
    if value is None:
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


# -- the ReplicaSet controller ---------------------------------------------------------------

def replicaset_status(pods: Iterable[PodView], min_ready_seconds: int, now: float) -> dict[str, int]:
    """A ReplicaSet's status counts from its pods: ``replicas`` (existing, not terminating),
    ``readyReplicas``, ``availableReplicas`` (ready for more than minReadySeconds) and
    ``terminatingReplicas``."""
    counts = {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0, "terminatingReplicas": 0}
    for p in pods:
        if p.phase in ("Succeeded", "Failed"):
            continue
        if p.terminating:
            counts["terminatingReplicas"] += 1
            continue
        counts["replicas"] += 1
        if p.ready:
            counts["readyReplicas"] += 1
            if min_ready_seconds == 0 or (p.ready_since is not None and p.ready_since + min_ready_seconds < now):
                counts["availableReplicas"] += 1
    return counts


_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def replicaset_pod_diff(rs_replicas: int, pods: Sequence[PodView]) -> tuple[int, list[PodView]]:
    """(pods to create, pods to delete) to bring a ReplicaSet to ``rs_replicas``. Terminating
    and finished pods do not count. Deleted first, as Kubernetes ranks them: unscheduled,
    then pending, not ready, lower deletion cost, doubled up on a node, ready more recently,
    restarted more, and newer."""
    active = [p for p in pods if not p.terminating and p.phase not in ("Succeeded", "Failed")]
    diff = len(active) - rs_replicas
    if diff <= 0:
        return -diff, []
    per_node: dict[str, int] = {}
    for p in active:
        if p.node is not None:
            per_node[p.node] = per_node.get(p.node, 0) + 1

    def rank(p: PodView) -> tuple:
        return (p.node is not None, _PHASE_RANK.get(p.phase, 2), p.ready, p.deletion_cost,
                -per_node.get(p.node, 0) if p.node is not None else 0,
                -(p.ready_since or 0.0) if p.ready else 0.0, -p.restarts, -p.created, p.name)

    return 0, sorted(active, key=rank)[:diff]
