"""What the node agents ask of the server: to join (register), their work (long-polled) and
their reports (heartbeats with runs' ends, GPU health, pods' states and metrics)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.model.job import JobState, LateExit, run_end
from shoal.model.node import NodeState
from shoal.model.resources import Allocation
from shoal.server import fastpath, gpuacct
from shoal.server import jobs as jobsvc
from shoal.server import nodes as nodesvc
from shoal.server.auth import AuthError, agent_credential, node_step_key
from shoal.server.retry import retry_on_conflict
from shoal.server.kube.backends import ROUTES_KEY
from shoal.server.kube import service as kubesvc
from shoal.server.schemas import AgentRegister, AgentReport
from shoal.server.work import node_work
from shoal.store.models import CleanupRow, JobRow, NodeRow

if TYPE_CHECKING:
    from shoal.server.core import Server


@retry_on_conflict
def register(server: Server, s: Session, body: AgentRegister, authorization: str | None) -> dict:
    """A node joins with the cluster's join token: its row written, the runs it reports
    ended settled, and its credential, step key (and certificate, for a CSR) answered."""
    p = server.auth.resolve(authorization, None, None)
    if p.role != "join":
        raise AuthError(403, "registering a node needs the cluster's join token")
    try:
        certificate = server.ca.issue_agent(body.name, body.address, body.csr) if body.csr else None
    except ValueError as e:  # tls.TLSError: not a valid CSR
        raise jobsvc.JobError(str(e), 400) from None
    now = server.clock()
    with s.begin():
        row = _registered(s, body, now)
        row.tls = certificate is not None
        exits = _exits(server, s, body.name, body.events, now)
        generation = row.credential_gen or 0
        fenced = nodesvc.fail_fenced_runs(s, server.controller, body.name, body.fenced, now) \
            if body.fenced else set()
    server.forget_address(body.name)
    server.hub.bump([body.name, *fenced, *exits])
    server.controller.wake()
    if fenced:
        server.kube.wake()
    fence = server.config.nodes.fence
    return {
        "credential": agent_credential(server.secret, body.name, generation),
        "step_key": node_step_key(server.secret, body.name, generation),
        **({"certificate": certificate, "ca": server.ca.pem()} if certificate else {}),
        "epoch": server.hub.epoch,
        "heartbeat_interval_s": server.config.nodes.heartbeat_interval_s,
        # The agent's lease: silent this long, its supervisors stop its work themselves
        # (fencing), TERM then KILL after fence_grace_s, all before the heartbeat timeout
        # ends and the server restarts that work elsewhere; null: never (docs/FENCING.md).
        "lease_s": fence.lease_s if server.config.nodes.fencing else None,
        "fence_grace_s": fence.grace_s,
        "fence_check_s": fence.check_s,
        "kill_wait_s": server.config.nodes.kill_wait_s,
        "containers": server.config.containers.model_dump(),
    }


def _registered(s: Session, body: AgentRegister, now: float) -> NodeRow:
    """The node's row as its agent describes it (new, or back from not responding)."""
    row = s.get(NodeRow, body.name)
    if row is None:
        row = NodeRow(name=body.name, state=NodeState.UP.value, registered_at=now,
                      taints=[t.model_dump() for t in body.taints])
        s.add(row)
    elif row.state == NodeState.DOWN.value and row.reason == "Not responding":
        row.state, row.reason, row.reason_time = NodeState.UP.value, None, None
    row.address, row.port, row.cpus, row.memory_mb = body.address, body.port, body.cpus, body.memory_mb
    row.gpus, row.labels, row.features = [g.model_dump() for g in body.gpus], body.labels, body.features
    row.boot_time, row.last_heartbeat = body.boot_time, now
    return row


async def work(server: Server, node: str, epoch: str | None, gen: int | None, wait: float,
               authorization: str | None) -> bytes:
    """The node's work (runs, pods, cleanups) as JSON, once its generation passes ``gen``
    or ``wait`` seconds have gone by."""
    server.auth.verify_agent(authorization, node)
    if wait:
        await server.hub.wait(node, epoch, gen, wait)
    current = server.hub.generation(node)
    if (kept := server.kept_work.get(node, current)) is not None:  # a renewal with nothing new
        return kept

    def build():
        with server.sessions() as s:
            answer = node_work(s, server, node, current)
        server.kept_work.keep(node, current, answer)
        return answer

    return await fastpath.in_thread(build)


def _has_news(body: AgentReport) -> bool:
    """Whether a report carries anything to store besides its time."""
    return bool(body.events or body.pods or body.gpu_health or body.gpu_usage or body.images is not None)


async def report(server: Server, node: str, body: AgentReport, authorization: str | None) -> dict:
    """A heartbeat. One that carries nothing to store (server/heartbeats.py) is answered here,
    on the event loop, from what is kept in memory: a worker thread and a session cost more
    than the heartbeat itself (5,000 nodes: hundreds a second). Anything else, or a node whose
    credential or state is not in memory, is taken in a worker thread (``report_in``)."""
    if not _has_news(body) and _taken_quietly(server, node, body.alive, body.gpu_util, body.pod_cpu, authorization):
        return {"ok": True}

    def in_session() -> dict:
        with server.sessions() as s:
            return report_in(server, s, node, body, authorization)

    return await fastpath.in_thread(in_session)


def _taken_quietly(server: Server, node: str, alive: list[str], gpu_util: dict, pod_cpu: dict,
                   authorization: str | None) -> bool:
    """A report with nothing to store, taken on the event loop when the node's credential and
    state are in memory (server/heartbeats.py); False: the caller takes it in a worker thread."""
    if not (server.auth.knows(node) and (server.feed is None or server.leader.is_leader)
            and server.heartbeats.known(node, alive, False)):
        return False
    server.auth.verify_agent(authorization, node)  # its generation kept: no read
    _noted(server, node, gpu_util, pod_cpu, server.clock())
    return True


def _noted(server: Server, node: str, gpu_util: dict, pod_cpu: dict, now: float) -> None:
    """A report with nothing to store: its time kept, its metric samples taken (as floats)."""
    server.heartbeats.seen(node, now)
    if gpu_util or pod_cpu:
        server.record_metrics({"agent": node}, {"gpu_util": gpu_util, "pod_cpu": pod_cpu}, now)


_NEWS = ("events", "pods", "gpu_usage", "gpu_health")  # AgentReport's lists of things to store
_QUIET_KEYS = frozenset(("alive", "gpu_util", "pod_cpu", "images", *_NEWS))
_OK = b'{"ok": true}'


def quiet_report(server: Server, path: dict[str, str], headers: dict[str, str], body: bytes) -> fastpath.Answer | None:
    """The heartbeat of an idle node, answered before the report's route reads it: the body
    taken with ``json.loads`` and the few checks below in place of the report's validation and
    its route's arguments, which cost a heartbeat that arrives alone (250 a second at 5,000
    nodes, each waking the event loop) about half its server CPU (BENCHMARKS.md, Heartbeats).
    Only a report that the declared route would take as only a heartbeat is answered here
    (the same checks as ``report``'s, the same answer); anything else (news, a value of another
    type, an unknown field, a node not in memory) gives None, and the route answers."""
    try:
        doc = json.loads(body)
    except ValueError:  # not JSON, or not UTF-8
        return None
    if type(doc) is not dict or not doc.keys() <= _QUIET_KEYS or doc.get("images") is not None \
            or any(doc.get(k, []) != [] for k in _NEWS):
        return None
    alive, gpu_util, pod_cpu = doc.get("alive", []), doc.get("gpu_util", {}), doc.get("pod_cpu", {})
    if type(alive) is not list or not all(type(a) is str for a in alive) \
            or not (_samples(gpu_util) and _samples(pod_cpu)):
        return None
    # An AuthError is answered as the route's.
    if not _taken_quietly(server, path["node"], alive, gpu_util, pod_cpu, headers.get("authorization")):
        return None
    return 200, fastpath.JSON, _OK


def _samples(values) -> bool:
    """A metric map as AgentReport takes it without converting anything: names to numbers."""
    return type(values) is dict and all(type(v) is float or type(v) is int for v in values.values())


@retry_on_conflict
def report_in(server: Server, s: Session, node: str, body: AgentReport, authorization: str | None) -> dict:
    """A heartbeat: runs that ended, GPU health, pods' states, cleanups done, metrics."""
    server.auth.verify_agent(authorization, node)
    now = server.clock()
    if server.heartbeats.only_a_heartbeat(node, body.alive, _has_news(body)):  # read, not written
        _noted(server, node, body.gpu_util, body.pod_cpu, now)
        return {"ok": True}
    # Stored in a transaction shared with the other reports that arrive meanwhile (group
    # commit): with 1,000 nodes ending short runs, a transaction per report queued hundreds of
    # writers on SQLite's single lock, and reports timed out (their heartbeats with them).
    touched, routes_changed = server.reports.run(lambda ws: _store_report(server, ws, node, body, now))
    if body.gpu_util or body.pod_cpu:
        server.record_metrics({"agent": node}, {"gpu_util": body.gpu_util, "pod_cpu": body.pod_cpu}, now)
    if touched:
        server.hub.bump(touched)
        server.controller.wake()
    if routes_changed or body.pods:  # batch jobs' ends are the scheduler's alone
        server.kube.wake()
    if routes_changed or touched:
        server.hub.bump([ROUTES_KEY])
    return {"ok": True}


def _store_report(server: Server, s: Session, node: str, body: AgentReport, now: float) -> tuple[set[str], bool]:
    """Write what a report carries (in the caller's transaction); the nodes whose work it
    changed, and whether a Service's routes changed."""
    row = s.get(NodeRow, node)
    if row is None:
        raise jobsvc.JobError(f"node {node} is not registered", 404)
    server.heartbeats.seen(node, now)
    if row.state == NodeState.DOWN.value and row.reason == "Not responding":
        row.state, row.reason, row.reason_time = NodeState.UP.value, None, None
        row.last_heartbeat = now  # with its state: another server's leader must not find it silent
    touched = _exits(server, s, node, body.events, now)
    touched |= nodesvc.apply_gpu_health(s, server.controller, row, [g.model_dump() for g in body.gpu_health], now)
    if body.images is not None:
        nodesvc.apply_images(row, [i.model_dump(exclude_none=True) for i in body.images])
    routes_changed = kubesvc.pod_reports(s, node, body.pods, now)
    gpuacct.record(s, node, body.gpu_usage, now)
    alive = set(body.alive)
    for c in list(s.scalars(select(CleanupRow).where(CleanupRow.node == node))):
        if jobsvc.job_run_key(c.job_id, c.run) not in alive:
            s.delete(c)
            touched.add(node)
    return touched, routes_changed


def _exits(server: Server, s: Session, node: str, events, now: float) -> set[str]:
    """Settle the runs an agent reports ended; the nodes whose work changed."""
    if not events:
        return set()
    # The jobs read in one query, not one (and a flush of the last one's end) each.
    ended = {r.id: r for r in s.scalars(select(JobRow).where(JobRow.id.in_({ev.job_id for ev in events})))}
    touched: set[str] = set()
    for ev in events:
        touched |= _exit(server, s, ended.get(ev.job_id), node, ev, now)
    return touched


def _exit(server: Server, s: Session, row: JobRow | None, node: str, ev, now: float) -> set[str]:
    if row is None:
        return set()
    if ev.type == "step":  # not an end of the run: what one of its steps used on this node
        jobsvc.record_step_usage(s, row, node, ev)
        return set()
    if row.lost_run is not None:  # its node fell silent and came back: how did the run end?
        outcome = nodesvc.late_exit_of_lost_run(row, node, ev.run, ev.exit_code or 0, ev.signal or 0,
                                                ev.time or now, not (ev.fenced or ev.killed))
        if outcome is not LateExit.IGNORE:
            return {node}
    if row.restart_count != ev.run or row.batch_host != node:
        return set()  # a report about an old run: already handled
    if ev.max_rss_kb is not None:  # what the run used, whichever way it ended
        row.usage = {"run": ev.run, "max_rss_kb": ev.max_rss_kb, "cpu_s": ev.cpu_s,
                     "user_cpu_s": ev.user_cpu_s, "system_cpu_s": ev.system_cpu_s}
    names = set(Allocation.from_json(row.allocation).node_names) if row.allocation else set()
    if ev.fenced and row.state == JobState.RUNNING.value:  # stopped at its lease's end, as on a node failure
        return server.controller.fail_node_jobs(s, node, now, only=lambda r: r.id == row.id) | names
    if row.state != JobState.RUNNING.value:
        if row.exit_code is None:
            row.exit_code, row.signal = ev.exit_code or 0, ev.signal or 0
        return names
    if row.preempted_at is not None:  # it exited in its grace (checkpointed, say): still preempted
        jobsvc.end_preempted(s, row, ev.time or now, server.qos_table,
                             exit_code=ev.exit_code or 0, signal=ev.signal or 0)
        return names
    state, exit_code, sig = run_end(ev.exit_code or 0, ev.signal or 0, ev.oom_kills)
    # A step's own reason (a container that could not start) says more than the exit code.
    plain = row.reason in (None, "None")
    jobsvc.finish(s, row, state, ev.time or now, exit_code=exit_code, signal=sig,
                  reason=ev.reason[:64] if ev.reason else  # the reason column's width
                  "NonZeroExitCode" if state is JobState.FAILED and exit_code and not sig and plain else None)
    return names
