"""What an agent is told: the desired state of its node (runs to keep, runs to kill, signals).

The agent reconciles against this: it launches batch scripts it has not started, kills
processes of runs listed under ``kill`` (TERM, then KILL after KillWait), and kills any
local process whose run is in neither list (so a node that was cut off and came back
stops work that was already ended or restarted elsewhere).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.model.hostlist import compress
from shoal.model.job import JobState
from shoal.server.auth import job_credential
from shoal.server.jobs import job_run_key
from shoal.server.kube.secrets import pod_secrets
from shoal.store.models import CleanupRow, JobRow

_BATCH = 500  # ids per IN (...) when reading runs to encode


def tasks_per_node_text(counts: list[int]) -> str:
    """SLURM_TASKS_PER_NODE's compact form: [8, 8, 8] -> '8(x3)', [2, 1] -> '2,1'."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        run = j - i + 1
        out.append(f"{counts[i]}(x{run})" if run > 1 else str(counts[i]))
        i = j + 1
    return ",".join(out)


def task_layout(ntasks: int, nodes: int, per_node: int | None) -> list[int]:
    """How many tasks each node runs (Slurm's block distribution)."""
    if per_node is not None:
        counts = [min(per_node, max(0, ntasks - i * per_node)) for i in range(nodes)]
        return [c for c in counts if c > 0] or [0]
    base, extra = divmod(ntasks, nodes)
    return [base + (1 if i < extra else 0) for i in range(nodes)]


def slurm_environment(row: JobRow, cluster_name: str, submit_host: str, secret: bytes) -> dict[str, str]:
    """The SLURM_* variables a batch script sees (per-node ones are added by the agent)."""
    req = row.request
    alloc = row.allocation["nodes"]
    names = [n["name"] for n in alloc]
    nodelist = compress(names)
    counts = task_layout(req["ntasks"], len(names), req.get("ntasks_per_node"))
    env = {
        "SLURM_JOB_ID": str(row.id),
        "SLURM_JOBID": str(row.id),
        "SLURM_JOB_NAME": row.name,
        "SLURM_JOB_USER": row.user,
        "SLURM_JOB_PARTITION": row.partition,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(len(names)),
        "SLURM_NNODES": str(len(names)),
        "SLURM_NTASKS": str(req["ntasks"]),
        "SLURM_NPROCS": str(req["ntasks"]),
        "SLURM_TASKS_PER_NODE": tasks_per_node_text(counts),
        "SLURM_JOB_CPUS_PER_NODE": tasks_per_node_text([n["cpus"] for n in alloc]),
        "SLURM_SUBMIT_DIR": row.workdir,
        "SLURM_SUBMIT_HOST": submit_host,
        "SLURM_CLUSTER_NAME": cluster_name,
        "SLURM_RESTART_COUNT": str(row.restart_count),
        "SLURM_JOB_QOS": row.spec.get("qos") or "normal",
        "SLURM_MEM_PER_NODE": str(alloc[0]["memory_mb"]),
        "SLURM_GTIDS": "0",
        "SHOAL_JOB_TOKEN": job_credential(secret, row.id, row.restart_count),
    }
    if row.spec.get("account"):  # as Slurm: set only when the job has one
        env["SLURM_JOB_ACCOUNT"] = row.spec["account"]
    if req.get("ntasks_per_node") is not None:
        env["SLURM_NTASKS_PER_NODE"] = str(req["ntasks_per_node"])
    if req.get("cpus_per_task"):
        env["SLURM_CPUS_PER_TASK"] = str(req["cpus_per_task"])
    if req.get("gpus_per_node"):
        gpn = str(req["gpus_per_node"])
        env["SLURM_GPUS_PER_NODE"] = f"{req['gpu_type']}:{gpn}" if req.get("gpu_type") else gpn
    if row.array_job_id is not None:
        env["SLURM_ARRAY_JOB_ID"] = str(row.array_job_id)
        env["SLURM_ARRAY_TASK_ID"] = str(row.array_task_id)
        env.update(row.spec.get("array_env") or {})
    if row.time_limit_s:
        env["SLURM_JOB_END_TIME"] = str(int((row.start_time or 0) + row.time_limit_s))
    env["SLURM_JOB_START_TIME"] = str(int(row.start_time or 0))
    return env


def pod_entry(row: JobRow, node: str, server, session: Session | None = None) -> dict:
    """What the agent needs to run a pod (docs/SERVING.md, "Pod run entry"), with what it
    needs of the namespace's Secrets (only the node running the pod is told them)."""
    pod = row.spec["pod"]
    address = server.node_address(node)
    entry = {
        "namespace": pod["namespace"], "name": pod["name"], "uid": pod["uid"],
        "labels": pod.get("labels") or {}, "spec": pod["spec"],
        "runtime": pod["spec"].get("runtimeClassName"),
        "env": {"POD_NAME": pod["name"], "POD_NAMESPACE": pod["namespace"], "POD_IP": address,
                "NODE_NAME": node, "SHOAL_JOB_ID": str(row.id)},
    }
    if session is not None:
        entry.update(pod_secrets(session, pod["namespace"], pod["spec"]))
    return entry


class RunEntries:
    """The running batch jobs' run entries, encoded, kept by (job id, row version).

    An agent long-polls again after every change to its node's work, and every answer
    lists all of the node's runs, so a pass that starts a few hundred jobs and their ends
    would have each job's row read, its environment signed and its entry encoded once per
    answer. An entry is a function of its row alone (and of the server's constants), and
    every ORM update bumps the row's version, so an entry kept for the version a query
    returns is the one that row would give now. Pods are built afresh: their entries name
    the node's current address. Safe from any thread; a job not running any more is
    dropped when the running jobs' index sees it end (``drop``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _kept
        self._build = threading.Lock()  # held while new runs' entries are read and encoded
        self._kept: dict[int, tuple[int, dict[str, str]]] = {}  # job id -> (version, node -> entry JSON)

    def __len__(self) -> int:
        return len(self._kept)

    def for_node(self, session: Session, server, node: str, running: list[tuple[int, int]],
                 everyone: Callable[[], Iterable[tuple[int, int]]] = tuple) -> list[str]:
        """The encoded entries of ``node``'s batch runs ``running`` ((id, version) each), in job
        id order. ``everyone``: every node's batch runs as last known, built along with the node's."""
        versions = dict(running)
        kept = self._current(versions)
        if len(kept) < len(versions):
            # A pass that starts jobs on every node wakes every agent at once: the first of their
            # answers reads and encodes the new runs of every node, the others wait for it and
            # find theirs kept. Each reading its own node's alone under the lock made a thousand
            # answers one after another, a store round trip each (PostgreSQL: past the agents'
            # 70 s timeout).
            with self._build:
                kept = self._current(versions)
                mine = [jid for jid in versions if jid not in kept]
                if mine:
                    known = dict(everyone())
                    others = self._current(known)
                    stale = sorted(set(mine) | {jid for jid in known if jid not in others})
                    fresh: dict[int, tuple[int, dict[str, str]]] = {}
                    for i in range(0, len(stale), _BATCH):
                        # Still running: the rows may have moved on since ``running`` was read.
                        fresh.update((row.id, (row.version, _entries_by_node(row, server))) for row in session.scalars(
                            select(JobRow).where(JobRow.id.in_(stale[i:i + _BATCH]),
                                                 JobRow.state == JobState.RUNNING.value)))
                    kept.update((jid, fresh[jid]) for jid in mine if jid in fresh)
                    with self._lock:
                        self._kept.update(fresh)
        return [e for jid in sorted(versions) if (k := kept.get(jid)) is not None and (e := k[1].get(node))]

    def drop(self, ended: Iterable[int]) -> None:
        """Forget the entries of jobs that stopped running (``running.RunningJobs`` tells)."""
        with self._lock:
            for jid in ended:
                self._kept.pop(jid, None)

    def _current(self, versions: dict[int, int]) -> dict[int, tuple[int, dict[str, str]]]:
        """The kept entries of these runs at these versions."""
        with self._lock:
            return {jid: k for jid, version in versions.items()
                    if (k := self._kept.get(jid)) is not None and k[0] == version}


def _entries_by_node(row: JobRow, server, session: Session | None = None) -> dict[str, str]:
    nodes = (row.allocation or {"nodes": []})["nodes"]
    return {n["name"]: json.dumps(run_entry(row, n, i, server, session)) for i, n in enumerate(nodes)}


def run_entry(row: JobRow, mine: dict, nodeid: int, server, session: Session | None = None) -> dict:
    """What the agent of the node ``mine`` (the allocation's ``nodeid``-th) needs of a run."""
    node = mine["name"]
    entry = {
        "key": job_run_key(row.id, row.restart_count), "job_id": row.id, "run": row.restart_count,
        "user": row.user, "gpus": mine["gpus"], "cpus": mine["cpus"], "nodeid": nodeid,
        "memory_mb": mine.get("memory_mb"),  # the run's cgroup memory limit on this node
    }
    if row.kind == "pod":  # a draining pod keeps running until the controller cancels it
        entry["pod"] = pod_entry(row, node, server, session)
    elif row.batch_host == node and not row.interactive:
        spec = row.spec
        entry["batch"] = {
            "script": spec["script"],
            "script_sha256": spec.get("script_sha256"),
            "argv": spec.get("argv", []),
            "workdir": row.workdir,
            "environment": spec.get("environment", {}),
            "slurm_env": slurm_environment(row, server.config.cluster_name, server.submit_host, server.secret),
            "stdout": spec.get("stdout"),
            "stderr": spec.get("stderr"),
            "stdin": spec.get("stdin"),
            "open_mode": spec.get("open_mode", "truncate"),
            "job_name": row.name,
            "array_job_id": row.array_job_id,
            "array_task_id": row.array_task_id,
        }
        if spec.get("container"):
            entry["batch"]["container"] = spec["container"]
    return entry


class KeptWork:
    """Each node's last work answer, kept by the generation it was built at.

    An idle node's agent renews its long-poll every ``WORK_WAIT_S`` with nothing changed
    (5,000 nodes: ~90 a second), and building the answer (a worker thread, a session, three
    queries) cost three times a heartbeat. The answer is a function of the node's generation:
    every change to its runs, clean-ups and signals bumps it (that is what wakes the
    long-poll), and the rest (the epoch, kill_wait_s, the heartbeat interval, a pod's node
    address, which register bumps) holds for the server's life. So a request that finds the
    generation its node's answer was built at gets those bytes. Answers over ``LIMIT`` bytes
    (a busy node's runs, their scripts and environments) are not kept: 5,000 nodes hold at
    most 80 MiB. Safe from any thread (one dict operation each)."""

    LIMIT = 16 * 1024

    def __init__(self) -> None:
        self._kept: dict[str, tuple[int, bytes]] = {}

    def get(self, node: str, gen: int) -> bytes | None:
        kept = self._kept.get(node)
        return kept[1] if kept is not None and kept[0] == gen else None

    def keep(self, node: str, gen: int, answer: bytes) -> None:
        """Keep ``answer``, built at ``gen``, unless one built later is kept already."""
        kept = self._kept.get(node)
        if kept is not None and kept[0] > gen:
            return
        if len(answer) <= self.LIMIT:
            self._kept[node] = (gen, answer)
        else:
            self._kept.pop(node, None)


def node_work(session: Session, server, node: str, gen: int) -> bytes:
    """The agent's answer, encoded: its node's runs (``server.run_entries`` keeps batch jobs'
    entries), the runs to kill and the signals to send."""
    running = server.running.on_node(session, node)  # server/running.py: O(the node's jobs)
    batch = [(j.id, j.version) for j in running if j.kind != "pod"]
    runs = server.run_entries.for_node(session, server, node, batch, lambda: [
        (j.id, j.version) for j in server.running.known() if j.kind != "pod"])
    pods = [j.id for j in running if j.kind == "pod"]
    if pods:
        for row in session.scalars(select(JobRow).where(JobRow.id.in_(pods)).order_by(JobRow.id)):
            if (entry := _entries_by_node(row, server, session).get(node)) is not None:
                runs.append(entry)
    kills = [
        {"key": job_run_key(c.job_id, c.run), "job_id": c.job_id, "run": c.run, "signal": c.signal}
        for c in session.scalars(select(CleanupRow).where(CleanupRow.node == node))
    ]
    rest = json.dumps({
        "epoch": server.hub.epoch,
        "gen": gen,
        "kill": kills,
        "signals": server.hub.signals(node),
        "kill_wait_s": server.config.nodes.kill_wait_s,
        "heartbeat_interval_s": server.config.nodes.heartbeat_interval_s,
    })
    return ('{"runs": [' + ", ".join(runs) + "], " + rest[1:]).encode()
