"""The serving controllers' loop: Deployments -> ReplicaSets -> pods, HPAs, drains, evictions.

Level-triggered like the scheduling loop: each round reads the store and decides with the
pure functions of ``shoal.kube`` (rollout, HPA, Jobs). The cluster-wide work (drains,
evictions) is one transaction; then each HPA, Deployment, ReplicaSet and Job is reconciled
in a transaction of its own, as Kubernetes' controllers take one key at a time
from a work queue: an object whose reconcile fails (or loses an optimistic-concurrency race)
is retried after a per-key back-off (``BackOff``), and the others go on. A round runs on every
change that may matter (apply, scale, pod readiness, pod exit) and every ``interval_s``.
"""

from __future__ import annotations
import functools
import logging
import time
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm.exc import StaleDataError

from shoal.kube import hpa as hpalib
from shoal.kube import jobs as jobslib
from shoal.kube import rollout
from shoal.kube.manifest import pod_resources
from shoal.model.job import JobState
from shoal.model.selectors import eviction_delay
from shoal.server import jobs as jobsvc
from shoal.server.kube import objects as objs
from shoal.server.kube import pods as podsvc
from shoal.server.kube.backends import ROUTES_KEY
from shoal.server.kube.metrics import Metrics
from shoal.server.loop import KickedLoop
from shoal.store.lease import NotLeader
from shoal.store.models import JobRow, NodeRow, ObjectRow

log = logging.getLogger("shoal.server")

Reconcile = Callable[..., tuple[bool, bool]]  # (session, object row, now) -> (pods created, pods deleted)


class BackOff:
    """Per-key retry delays after failures, as client-go's rate-limited work queue keeps them:
    ``base_s * 2**(failures - 1)``, at most ``max_s``; a success forgets the key."""

    def __init__(self, base_s: float = 0.005, max_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_s, self.max_s, self.clock = base_s, max_s, clock
        self._failures: dict[str, int] = {}
        self._not_before: dict[str, float] = {}

    def due(self, key: str) -> bool:
        return self.clock() >= self._not_before.get(key, float("-inf"))

    def failed(self, key: str) -> float:
        """Record a failure of ``key``; the delay before it is tried again."""
        n = self._failures[key] = self._failures.get(key, 0) + 1
        delay = min(self.max_s, self.base_s * 2 ** (n - 1))
        self._not_before[key] = self.clock() + delay
        return delay

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)
        self._not_before.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)


class KubeController(KickedLoop):
    name = "kube-controllers"

    def __init__(self, server) -> None:
        super().__init__()
        self.server = server
        self.metrics = Metrics(server.config.nodes.heartbeat_interval_s)
        self.hpa_state: dict[str, hpalib.HPAState] = {}  # HPA uid -> recommendations and scale events
        self._last_hpa = float("-inf")
        self.rounds = 0
        self.backoff = BackOff()  # per object uid

    def interval_s(self) -> float:
        return self.server.config.serving.interval_s

    def active(self) -> bool:
        return self.server.leader.is_leader

    def step(self) -> None:
        for attempt in range(3):  # the cluster-wide part lost an optimistic-concurrency race: again
            try:
                self.run_round()
                return
            except StaleDataError:
                if attempt == 2:
                    raise

    def run_round(self) -> None:
        s = self.server
        now = s.clock()
        with s.sessions() as session, session.begin():
            s.leader.fence(session)
            nodes, routes = self._drain(session, now)
            routes |= self._evict(session, now)
        hpa_due = now - self._last_hpa >= s.config.serving.hpa_sync_s
        if hpa_due:
            self._last_hpa = now
        sched = False
        # HPAs first: a Deployment they rescale is rolled out in the same round.
        for kind, reconcile in (("HorizontalPodAutoscaler", functools.partial(self._hpa, due=hpa_due)),
                                ("Deployment", self._deployment), ("ReplicaSet", self._replicaset),
                                ("Job", self._job)):
            with s.sessions() as session:
                keys = [(r.uid, f"{kind} {r.namespace}/{r.name}") for r in objs.list_rows(session, kind)]
            for uid, key in keys:
                created, deleted = self._reconcile(uid, key, reconcile, now)
                sched |= created
                routes |= deleted
        self.rounds += 1
        if sched:
            s.controller.wake()
        if nodes:
            s.hub.bump(nodes)
        if routes or nodes:
            s.hub.bump([ROUTES_KEY])

    def _reconcile(self, uid: str, key: str, reconcile: Reconcile, now: float) -> tuple[bool, bool]:
        """One object in a transaction of its own; (pods created, pods deleted). A failure is
        logged and the object retried after its back-off; the round goes on with the others."""
        if not self.backoff.due(uid):
            return False, False
        try:
            with self.server.sessions() as session, session.begin():
                self.server.leader.fence(session)
                row = session.get(ObjectRow, uid)
                if row is None:  # deleted since the round listed it
                    return False, False
                out = reconcile(session, row, now)
        except NotLeader:
            raise
        except StaleDataError:  # another writer got there first: the next round sees its write
            self.backoff.failed(uid)
            return False, False
        except Exception:
            delay = self.backoff.failed(uid)
            log.exception("kube-controllers: reconciling %s failed (%d in a row); retrying in %.3g s",
                          key, self.backoff.failures(uid), delay)
            return False, False
        self.backoff.forget(uid)
        return out

    # -------------------------------------------------------------- pods going away

    def _drain(self, session, now: float) -> tuple[set[str], bool]:
        """Pods whose drain is over are cancelled: their agents stop the containers."""
        nodes: set[str] = set()
        for row in podsvc.drain_over(session, now, self.server.config.serving.drain_s):
            jobsvc.finish(session, row, JobState.CANCELLED, now, reason="None")
            nodes.update(n["name"] for n in (row.allocation or {}).get("nodes", ()))
        return nodes, bool(nodes)

    def _evict(self, session, now: float) -> bool:
        """NoExecute taints evict the running pods that do not tolerate them (after their
        tolerationSeconds), as the taint manager does; their ReplicaSet replaces them."""
        running = [r for r in podsvc.live(session) if r.state == JobState.RUNNING.value]
        if not running:
            return False
        # The pods' nodes' taints alone: whole node rows (their GPUs' and labels' JSON), every
        # round, were most of an idle thousand-node server's controller time.
        hosts = {r.batch_host for r in running}
        tainted = {name: taints for name, taints in session.execute(
            select(NodeRow.name, NodeRow.taints).where(NodeRow.name.in_(hosts)))
            if any(t.get("effect") == "NoExecute" for t in taints or ())}
        if not tainted:
            return False
        evicted = False
        for row in running:
            if row.batch_host not in tainted:
                continue
            delay = eviction_delay(tainted[row.batch_host], row.spec["pod"]["spec"].get("tolerations") or ())
            if delay is not None and now - (row.start_time or now) >= delay:
                objs.record_event(session, row.namespace, "Pod", row.name, "Normal", "TaintManagerEviction",
                                  f"Marking for deletion Pod {row.namespace}/{row.name}", now, "taint-controller")
                podsvc.delete(session, row, now)
                evicted = True
        return evicted

    # -------------------------------------------------------------- ReplicaSets

    def _replicaset(self, session, rs: ObjectRow, now: float) -> tuple[bool, bool]:
        spec = rs.body.get("spec") or {}
        want = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        tmeta = template.get("metadata") or {}
        # Ended pods (a node failed, the pod was preempted or exited) are replaced: clear them away.
        deleted = False
        for row in podsvc.visible(session, rs.namespace):
            if row.owner_uid == rs.uid and JobState(row.state).terminal and row.deleting_at is None:
                row.deleting_at = now
        live = podsvc.live(session, owner_uid=rs.uid)
        created = False
        to_create, to_delete = rollout.replicaset_pod_diff(want, _pod_views(live))
        if to_create:
            owner = (rs.body.get("metadata") or {}).get("annotations", {}).get("shoal.io/owner") or "root"
            deployment = ((rs.body.get("metadata") or {}).get("labels") or {}).get("shoal.io/deployment")
            for _ in range(to_create):
                name = podsvc.new_name(rs.name)
                podsvc.create(session, self.server, namespace=rs.namespace, name=name,
                              labels=dict(tmeta.get("labels") or {}),
                              annotations=dict(tmeta.get("annotations") or {}), spec=template.get("spec") or {},
                              owner_uid=rs.uid, owner_name=rs.name, user=owner, now=now, uid=objs.new_uid(),
                              deployment=deployment)
                objs.record_event(session, rs.namespace, "ReplicaSet", rs.name, "Normal", "SuccessfulCreate",
                                  f"Created pod: {name}", now, "replicaset-controller")
            created = True
        elif to_delete:
            for view in to_delete:
                pod = next(p for p in live if p.name == view.name)
                podsvc.delete(session, pod, now)
                objs.record_event(session, rs.namespace, "ReplicaSet", rs.name, "Normal", "SuccessfulDelete",
                                  f"Deleted pod: {pod.name}", now, "replicaset-controller")
            deleted = True
            live = podsvc.live(session, owner_uid=rs.uid)
        counts = rollout.replicaset_status(_pod_views(live), int(spec.get("minReadySeconds") or 0), now)
        objs.set_status(rs, {"replicas": counts["replicas"], "fullyLabeledReplicas": counts["replicas"],
                             "readyReplicas": counts["readyReplicas"], "availableReplicas": counts["availableReplicas"],
                             "observedGeneration": rs.generation})
        return created, deleted

    # -------------------------------------------------------------- Jobs

    def _job(self, session, job: ObjectRow, now: float) -> tuple[bool, bool]:
        """One sync of a batch/v1 Job (``kube.jobs.plan_job``); (pods created, pods deleted)."""
        spec = job.body.get("spec") or {}
        plan = jobslib.plan_job(spec, [_job_pod(r) for r in podsvc.owned(session, job.uid)], job.status or {},
                                objs.rfc3339(now))
        owner = (job.body.get("metadata") or {}).get("annotations", {}).get("shoal.io/owner") or "root"
        for index in plan.create:
            gang = jobslib.QUEUE_LABEL in ((job.body.get("metadata") or {}).get("labels") or {})
            labels, annotations, pod_spec = jobslib.pod_template(spec.get("template") or {}, job.name, job.uid,
                                                                 index, gang=gang)
            name = podsvc.new_name(job.name if index is None else f"{job.name}-{index}")
            podsvc.create(session, self.server, namespace=job.namespace, name=name, labels=labels,
                          annotations=annotations, spec=pod_spec, owner_uid=job.uid, owner_name=job.name,
                          owner_kind="Job", user=owner, now=now, uid=objs.new_uid())
            objs.record_event(session, job.namespace, "Job", job.name, "Normal", "SuccessfulCreate",
                              f"Created pod: {name}", now, "job-controller")
        live = {r.name: r for r in podsvc.live(session, owner_uid=job.uid)}
        for name in plan.delete:
            if name in live:
                podsvc.delete(session, live[name], now)
                objs.record_event(session, job.namespace, "Job", job.name, "Normal", "SuccessfulDelete",
                                  f"Deleted pod: {name}", now, "job-controller")
        for type_, reason, message in plan.events:
            objs.record_event(session, job.namespace, "Job", job.name, type_, reason, message, now,
                              "job-controller")
        objs.set_status(job, plan.status)
        if plan.delete_job:  # ttlSecondsAfterFinished has passed: the Job goes, and its pods with it
            for pod in podsvc.owned(session, job.uid):
                podsvc.delete(session, pod, now)
            session.delete(job)
        return bool(plan.create), bool(plan.delete or plan.delete_job)

    # -------------------------------------------------------------- Deployments

    def _deployment(self, session, dep: ObjectRow, now: float) -> tuple[bool, bool]:
        sets = objs.owned(session, "ReplicaSet", dep.uid)
        views = [_rs_view(rs, session, now) for rs in sets]
        dep_json = objs.to_json(dep)
        plan = rollout.plan_rollout(dep_json, views, now)
        by_name = {rs.name: rs for rs in sets}
        if plan.create is not None:
            rs_doc = rollout.replicaset_manifest(dep_json, plan.create)
            meta = rs_doc["metadata"]
            ann = meta.setdefault("annotations", {})
            ann["shoal.io/owner"] = (dep.body["metadata"].get("annotations") or {}).get("shoal.io/owner", "root")
            meta.setdefault("labels", {})["shoal.io/deployment"] = dep.name
            row = ObjectRow(uid=objs.new_uid(), kind="ReplicaSet", namespace=dep.namespace, name=meta["name"],
                            body=rs_doc, status={}, owner_uid=dep.uid, generation=1, created=now)
            session.add(row)
            session.flush()
            by_name[row.name] = row
            objs.record_event(session, dep.namespace, "Deployment", dep.name, "Normal", "ScalingReplicaSet",
                              f"Scaled up replica set {row.name} to {rs_doc['spec'].get('replicas', 0)}", now,
                              "deployment-controller")
        for name, revision in plan.revisions.items():
            rs = by_name.get(name)
            if rs is not None:
                meta = dict(rs.body.get("metadata") or {})
                ann = dict(meta.get("annotations") or {})
                if ann.get("deployment.kubernetes.io/revision") != str(revision):
                    ann["deployment.kubernetes.io/revision"] = str(revision)
                    cause = ((dep.body.get("metadata") or {}).get("annotations") or {}).get("kubernetes.io/change-cause")
                    if cause:
                        ann["kubernetes.io/change-cause"] = cause
                    meta["annotations"] = ann
                    rs.body = {**rs.body, "metadata": meta}
        for name, replicas in plan.scaled(views).items():
            rs = by_name.get(name)
            if rs is None:
                continue
            old = int((rs.body.get("spec") or {}).get("replicas", 0))
            if old != replicas and objs.set_spec_field(rs, "replicas", replicas):
                verb = "up" if replicas > old else "down"
                objs.record_event(session, dep.namespace, "Deployment", dep.name, "Normal", "ScalingReplicaSet",
                                  f"Scaled {verb} replica set {name} from {old} to {replicas}", now,
                                  "deployment-controller")
        for name in plan.delete:
            rs = by_name.get(name)
            if rs is not None and not podsvc.live(session, owner_uid=rs.uid):
                session.delete(rs)
        objs.set_status(dep, plan.status)
        return False, False  # its ReplicaSets create and delete the pods

    # -------------------------------------------------------------- HPAs

    def _hpa(self, session, h: ObjectRow, now: float, due: bool) -> tuple[bool, bool]:
        """One HPA: scale from zero at once when a request waits; else, when ``due`` (every
        ``hpa_sync_s``), the replicas ``kube.hpa`` decides. It creates and deletes no pods itself."""
        self._autoscale(session, h, now, due)
        return False, False

    def _autoscale(self, session, h: ObjectRow, now: float, due: bool) -> None:
        spec = h.body.get("spec") or {}
        ref = spec.get("scaleTargetRef") or {}
        dep = objs.get(session, "Deployment", h.namespace, ref.get("name", "")) \
            if ref.get("kind") == "Deployment" else None
        if dep is None:
            objs.set_status(h, {**(h.status or {}), "conditions": [{
                "type": "AbleToScale", "status": "False", "reason": "FailedGetScale",
                "message": f"the HPA controller was unable to get the target's current scale: "
                           f"{ref.get('kind')} {ref.get('name')!r} not found"}]})
            return
        current = int((dep.body.get("spec") or {}).get("replicas", 1))
        pods = podsvc.live(session, namespace=h.namespace)
        selector = ((dep.body.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        mine = [p for p in pods if all((p.spec["pod"].get("labels") or {}).get(k) == v
                                       for k, v in selector.items())]
        held = self.metrics.held(h.namespace, self._services_of(session, h.namespace, selector))
        if current == 0 and held:
            # Scale from zero (opt-in beyond Kubernetes): a request is waiting at the gateway.
            objs.set_spec_field(dep, "replicas", max(1, int(spec.get("minReplicas", 1) or 1)))
            objs.record_event(session, h.namespace, "HorizontalPodAutoscaler", h.name, "Normal",
                              "SuccessfulRescale", "New size: 1; reason: a request is waiting at the gateway",
                              now, "horizontal-pod-autoscaler")
            return
        if not due:
            return
        ready = [p for p in mine if podsvc.is_ready(p)]
        values = self.metrics.for_pods(self.server, ready, now)
        requests = [pod_resources(p.spec["pod"]["spec"])["cpus"] for p in ready]
        # As Kubernetes: no utilisation without a cpu request on every pod ("missing request for cpu").
        values["cpu"] = [None if v is None or min(requests) <= 0 else 100.0 * v / r
                         for v, r in zip(values["cpu"], requests)]
        state = self.hpa_state.get(h.uid, hpalib.HPAState())
        result = hpalib.desired_replicas(spec, current, values, state, now, ready_pods=len(ready),
                                         unready_pods=len(mine) - len(ready))
        self.hpa_state[h.uid] = result.state
        self.server.metrics.hpa_decided(h.namespace, h.name, current, result.replicas)
        status = {"currentReplicas": current, "desiredReplicas": result.replicas,
                  "currentMetrics": list(result.current_metrics),
                  "conditions": hpalib.stamp_conditions((h.status or {}).get("conditions") or (),
                                                        result.conditions, objs.rfc3339(now))}
        if result.rescale:
            objs.set_spec_field(dep, "replicas", result.replicas)
            status["lastScaleTime"] = objs.rfc3339(now)
            objs.record_event(session, h.namespace, "HorizontalPodAutoscaler", h.name, "Normal",
                              "SuccessfulRescale", f"New size: {result.replicas}; reason: {result.reason}",
                              now, "horizontal-pod-autoscaler")
        elif (h.status or {}).get("lastScaleTime"):
            status["lastScaleTime"] = h.status["lastScaleTime"]
        objs.set_status(h, status)

    def _services_of(self, session, namespace: str, selector: dict) -> list[str]:
        out = []
        for svc in objs.list_rows(session, "Service", namespace):
            sel = (svc.body.get("spec") or {}).get("selector") or {}
            if sel and all(selector.get(k) == v for k, v in sel.items()):
                out.append(svc.name)
        return out


_JOB_POD_PHASES = {JobState.COMPLETED.value: "Succeeded", JobState.FAILED.value: "Failed",
                   JobState.TIMEOUT.value: "Failed"}  # other ends (preempted, node lost, deleted): retried


def _job_pod(row: JobRow) -> jobslib.JobPod:
    index = (row.spec["pod"].get("annotations") or {}).get(jobslib.INDEX_ANNOTATION)
    if JobState(row.state).terminal:
        phase = _JOB_POD_PHASES.get(row.state, "Disrupted")
    else:
        phase = "Active" if row.deleting_at is None else "Disrupted"
    # The container that failed, for podFailurePolicy's onExitCodes: the first with a non-zero exit.
    container, code = "", row.exit_code
    for cs in (row.pod_status or {}).get("containerStatuses") or ():
        ended = (cs.get("state") or {}).get("terminated") or {}
        if ended.get("exitCode"):
            container, code = cs.get("name", ""), int(ended["exitCode"])
            break
    if not container:
        container = next((c.get("name", "") for c in row.spec["pod"]["spec"].get("containers") or ()), "")
    return jobslib.JobPod(row.name, phase, int(index) if index is not None else None, exit_code=code,
                          container=container, namespace=row.namespace or "default")


def _pod_views(rows: list[JobRow]) -> list[rollout.PodView]:
    out = []
    for r in rows:
        statuses = (r.pod_status or {}).get("containerStatuses") or ()
        cost = ((r.spec["pod"].get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost") or "0")
        out.append(rollout.PodView(
            name=r.name, created=r.submit_time, node=r.batch_host,
            phase=(r.pod_status or {}).get("phase") or ("Running" if r.state == JobState.RUNNING.value else "Pending"),
            ready=podsvc.is_ready(r), ready_since=podsvc.ready_since(r),
            restarts=sum(int(c.get("restartCount", 0)) for c in statuses),
            terminating=r.deleting_at is not None, deletion_cost=int(cost) if str(cost).lstrip("-").isdigit() else 0))
    return out


def _rs_view(rs: ObjectRow, session, now: float) -> rollout.RSView:
    spec = rs.body.get("spec") or {}
    ann = (rs.body.get("metadata") or {}).get("annotations") or {}
    labels = (rs.body.get("metadata") or {}).get("labels") or {}
    live = podsvc.live(session, owner_uid=rs.uid)
    cleaning = _cleaning(session, rs.uid)
    going = [p for p in podsvc.visible(session, rs.namespace) if p.owner_uid == rs.uid and p.deleting_at is not None
             and (not JobState(p.state).terminal or p.id in cleaning)]
    return rollout.RSView(
        name=rs.name, revision=int(ann.get("deployment.kubernetes.io/revision", 0)),
        template_hash=labels.get("pod-template-hash", ""), replicas=int(spec.get("replicas", 0)),
        ready=int((rs.status or {}).get("readyReplicas", 0)),
        available=int((rs.status or {}).get("availableReplicas", 0)), created=rs.created,
        current=len(live), terminating=len(going))


def _cleaning(session, owner_uid: str) -> set[int]:
    """Pods of this owner whose processes are still being stopped (cleanup rows)."""
    from sqlalchemy import select

    from shoal.store.models import CleanupRow

    return set(session.scalars(select(CleanupRow.job_id).join(JobRow, JobRow.id == CleanupRow.job_id)
                               .where(JobRow.owner_uid == owner_uid)))
