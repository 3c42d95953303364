"""The server object: store, configuration, secrets, hub and controller wired together."""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import time
from pathlib import Path

from sqlalchemy import select

from shoal.model.accounting import QOS, Account
from shoal.model.snapshot import Partition, Snapshot
from shoal.sched.config import SchedConfig
from shoal.sched.fairshare import AccountTree
from shoal.server import accounting as acctsvc
from shoal.server.auth import Authenticator
from shoal.server.config import ClusterConfig
from shoal.server.controller import Controller
from shoal.server.follower import Follower
from shoal.server.groupcommit import GroupCommit
from shoal.server.heartbeats import Heartbeats
from shoal.server.hub import WorkHub
from shoal.server.jobs import JobError
from shoal.server.nodelist import NodeListing
from shoal.server.kube.controller import KubeController
from shoal.server.kube.logs import PodLogs
from shoal.server.leader import Leadership
from shoal.server.metrics import ServerMetrics
from shoal.server.queueview import QueueView
from shoal.server.running import RunningJobs
from shoal.server.work import KeptWork, RunEntries
from shoal.store.engine import make_engine, migrate, session_factory
from shoal.store.changes import ChangeCount, recorder_of
from shoal.store.feed import ChangeFeed
from shoal.store.lease import lease_for, shared_secret
from shoal.store.models import AccountingRow, CleanupRow, JobRow, NodeRow, PartitionRow, ReservationRow, TokenRow

log = logging.getLogger("shoal.server")

ADMIN_TOKEN_FILE = "admin.token"
JOIN_TOKEN_FILE = "join.token"
SECRET_FILE = "cluster.key"
PARTITIONS_TTL_S = 1.0  # how stale a server's view of partition changes made elsewhere may be


class Server:
    def __init__(self, db_url: str, config: ClusterConfig, state_dir: str | Path, clock=time.time,
                 join_token: str | None = None, url: str = "") -> None:
        self.config = config
        self.url = url  # where clients reach this server (what /shoal/v1/leader names)
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.engine = make_engine(db_url)
        migrate(self.engine)
        self.sessions = session_factory(self.engine)
        # Prometheus metrics (GET /metrics); transactions find them in their session's info.
        self.metrics = ServerMetrics(self)
        self.metrics.watch_commits(self.sessions)
        self.sessions.configure(info={"server_metrics": self.metrics})
        # The cluster file's partitions, and them with the changes stored by scontrol update
        # (server/partitions.py), read again at most once a second: other servers may change them.
        self.configured_partitions: tuple[Partition, ...] = config.partition_list()
        self._partitions, self._partitions_read = self.refresh_partitions(), time.monotonic()
        self.sched_config = SchedConfig(policy=config.scheduler.policy, priority=config.priority.type,
                                        multifactor=config.priority.multifactor(),
                                        preemption=config.scheduler.preemption,
                                        backfill=config.scheduler.backfill,
                                        bf_max_job_test=config.scheduler.bf_max_job_test,
                                        bf_window_s=config.scheduler.bf_window_s,
                                        bf_resolution_s=config.scheduler.bf_resolution_s,
                                        bf_interval_s=config.scheduler.bf_interval_s)
        # The cluster file's accounts, users and QOS, with sacctmgr's changes in the store over them
        # (server/accounting.py), read again at most once a second as the partitions are.
        self.configured_accounting = acctsvc.configured(config.account_list(), config.qos_list())
        self._accounting, self._accounting_read = self.refresh_accounting(), time.monotonic()
        self.topology = config.topology_tree()
        self.secret = self._load_secret()
        self.auth = Authenticator(self.sessions, self.secret, clock)
        self.hub = WorkHub()
        self.run_entries = RunEntries()  # agents' work answers (shoal.server.work)
        self.kept_work = KeptWork()  # and each node's last answer, by its generation
        self.controller = Controller(self)
        default = next(p for p in self.partitions if p.default)
        self.serving_partition = config.serving.partition or default.name
        self.kube = KubeController(self)
        # Several servers may share a PostgreSQL store: one leads (schedules, runs the
        # controllers), all serve the API, and the change feed carries wake-ups between them.
        self.leader = Leadership(lease_for(self.engine), url, clock, on_elected=self._elected)
        self.feed = ChangeFeed(self.engine, self._heard) if self.leader.shared else None
        # Which jobs each commit changed (a job or its clean-up), for squeue's view kept in
        # memory. With several servers on the store, each commit's keys go to the others on
        # the change feed, in its transaction (shoal.store.changes), so every server's counts
        # follow every commit.
        if self.feed is not None:
            self.feed.carry(recorder_of(self.sessions))
        self.job_changes = ChangeCount(self.sessions, {JobRow: "id", CleanupRow: "job_id"})
        self.queue = QueueView(self.sessions, self.job_changes)
        # Agents' reports that store something (runs' ends) share transactions, as submissions
        # do (server/agents.py): one writer and one disk flush for the ends of many runs.
        self.reports = GroupCommit(self.sessions, refusals=(JobError,))
        self.node_changes = ChangeCount(self.sessions, {NodeRow: "name"})
        # The running jobs by node (agents' work answers, sinfo), from the job rows' changes.
        self.running = RunningJobs(self.sessions, ChangeCount(self.sessions, {JobRow: "id"}), self.run_entries.drop)
        self.follower = Follower([self.queue.sync, self.running.sync])
        self.controller.watch_rows(ChangeCount(self.sessions, {JobRow: "id"}))
        self.controller.watch_inputs(ChangeCount(self.sessions, {JobRow: "id", CleanupRow: "job_id", NodeRow: "name",
                                                                 ReservationRow: "name", PartitionRow: "name",
                                                                 AccountingRow: "name"}))
        self.node_listing = NodeListing(self, ChangeCount(self.sessions, {CleanupRow: "job_id", ReservationRow: "name"}))  # sinfo's
        nodes = config.nodes
        self.heartbeats = Heartbeats(self.sessions, min(nodes.heartbeat_interval_s, nodes.heartbeat_timeout_s / 4),
                                     self.node_changes, self.job_changes)
        if self.feed is not None:
            self.hub.relay = self.feed.publish
            self.controller.relay = self.kube.relay = lambda name: self.feed.publish({"wake": name})
        self.logs = PodLogs(self)
        self._addresses: dict[str, str] = {}
        self.submit_host = socket.gethostname()
        self._bootstrap_tokens(join_token)

    @property
    def accounting(self) -> acctsvc.Accounting:
        if time.monotonic() - self._accounting_read > PARTITIONS_TTL_S:
            self._accounting, self._accounting_read = self.refresh_accounting(), time.monotonic()
        return self._accounting

    def refresh_accounting(self) -> acctsvc.Accounting:
        with self.sessions() as s:
            self._accounting = acctsvc.load(s, self.configured_accounting)
        return self._accounting

    @property
    def account_tree(self) -> AccountTree:
        return self.accounting.tree

    @property
    def qos_table(self) -> dict[str, QOS]:
        return self.accounting.qos_table

    @property
    def accounts(self) -> tuple[Account, ...]:
        return self.accounting.accounts

    @property
    def qos(self) -> tuple[QOS, ...]:
        return self.accounting.qos

    @property
    def partitions(self) -> tuple[Partition, ...]:
        if time.monotonic() - self._partitions_read > PARTITIONS_TTL_S:
            self._partitions, self._partitions_read = self.refresh_partitions(), time.monotonic()
        return self._partitions

    def refresh_partitions(self) -> tuple[Partition, ...]:
        from shoal.server import partitions

        with self.sessions() as s:
            self._partitions = partitions.load(s, self.configured_partitions)
        return self._partitions

    def _load_secret(self) -> bytes:
        """The cluster secret signs agent and job credentials. Kept in the state dir (0600) and
        in the store, whose copy wins: servers sharing a store sign alike."""
        path = self.state_dir / SECRET_FILE
        local = path.read_bytes() if path.exists() else None
        with self.sessions() as s, s.begin():
            key = shared_secret(s, SECRET_FILE, local or secrets.token_bytes(32))
        if key != local:
            write_private(path, key)
        return key

    def _bootstrap_tokens(self, join_token: str | None) -> None:
        """At first start: an admin token and a join token, written to the state dir for `shoal up`."""
        with self.sessions() as s, s.begin():
            have_admin = s.scalar(select(TokenRow).where(TokenRow.role == "admin").limit(1)) is not None
            if not have_admin:
                token = self.auth.create_token(s, "root", "admin", "created at first start")
                write_private(self.state_dir / ADMIN_TOKEN_FILE, token.encode())
                log.info("admin token written to %s", self.state_dir / ADMIN_TOKEN_FILE)
            if join_token:
                from shoal.server.auth import hash_token

                if s.scalar(select(TokenRow).where(TokenRow.token_hash == hash_token(join_token))) is None:
                    s.add(TokenRow(user="join", role="join", token_hash=hash_token(join_token),
                                   created=time.time(), description="agent join token"))
            elif s.scalar(select(TokenRow).where(TokenRow.role == "join").limit(1)) is None:
                token = self.auth.create_token(s, "join", "join", "agent join token")
                write_private(self.state_dir / JOIN_TOKEN_FILE, token.encode())

    def snapshot(self, session, now: float, *, usage: bool | None = None, cache=None, nodes=None) -> Snapshot:
        """The scheduler's view of the store; fair-share usage is read only when policy needs it
        (``usage`` None: when the priority type is multifactor). ``cache``: the controller's
        ``snapshot.JobRowCache``; ``nodes``: its nodes, when it keeps them (else read)."""
        from shoal.server import snapshot

        if usage is None:
            usage = self.sched_config.priority == "multifactor"
        return snapshot.build(session, self.partitions, now, accounts=self.accounts, qos=self.qos,
                              usage_half_life_s=self.sched_config.multifactor.decay_half_life_s
                              if usage else None, topology=self.topology, cache=cache, nodes=nodes)

    def node_address(self, node: str) -> str:
        """A node's advertised address (cached; registration updates it)."""
        address = self._addresses.get(node)
        if address is None:
            with self.sessions() as s:
                row = s.get(NodeRow, node)
                address = row.address if row is not None else ""
            self._addresses[node] = address
        return address

    def forget_address(self, node: str) -> None:
        self._addresses.pop(node, None)

    @functools.cached_property
    def ca(self):
        """The cluster CA (``server.tls.ClusterCA``), for agents' certificates; read at first use."""
        from shoal.server.tls import ClusterCA

        return ClusterCA(self.sessions)

    def start(self) -> None:
        self.heartbeats.start()
        self.follower.start()
        self.controller.start()
        self.kube.start()
        if self.feed is not None:
            self.feed.start()
        self.leader.start()

    def stop(self) -> None:
        if self.feed is not None:
            self.feed.stop()
        self.kube.stop()
        self.controller.stop()
        self.heartbeats.stop()
        self.follower.stop()
        self.leader.stop()
        self.engine.dispose()

    def record_metrics(self, source: dict, sample: dict, now: float) -> None:
        """Metric samples an agent (``{"agent": node}``: gpu_util, pod_cpu) or the gateway
        (``{"gateway": True}``: pods, held) reported to this server. The HPA runs on the
        leader, so a follower passes them on through the change feed, in pieces the feed can
        carry."""
        self._apply_metrics(source, sample, now)
        if self.feed is not None and not self.leader.is_leader:
            for piece in _pieces(sample):
                self.feed.publish({"metrics": {"source": source, "sample": piece, "time": now}})

    def _apply_metrics(self, source: dict, sample: dict, now: float) -> None:
        metrics = self.kube.metrics
        if "agent" in source:
            metrics.agent_report(source["agent"], sample.get("gpu_util") or {}, sample.get("pod_cpu") or {}, now)
        else:
            metrics.gateway_report(sample.get("pods") or {}, sample.get("held") or {}, now)
            if sample.get("held"):
                self.kube.wake()  # a request held for a scaled-to-zero Deployment

    def _elected(self) -> None:
        """This server leads now. The last leader told the others of its commits' work after
        each commit (the feed sends them apart): killed between the two, what it last planned
        reached no agent waiting on another server, and those runs stayed RUNNING with no
        agent running them. So every node's long-poll, here and on the other servers,
        answers again from the store."""
        self.hub.heard({"resync": True})
        if self.feed is not None:
            self.feed.publish({"resync": True})
        self._wake_loops()

    def _wake_loops(self) -> None:
        self.controller.wake()
        self.kube.wake()

    def _heard(self, event: dict) -> None:
        """A wake-up another server published (``shoal.store.feed``)."""
        if event.get("resync"):
            self.hub.heard({"resync": True})
            self.auth.forget_all()
            self._wake_loops()
        elif "metrics" in event:
            m = event["metrics"]
            self._apply_metrics(m["source"], m["sample"], m["time"])
        elif "revoked" in event:
            self.auth.forget(event["revoked"])
        elif "revoked_node" in event:
            self.auth.forget_node(event["revoked_node"])
        elif "wake" in event:
            loop = {self.controller.name: self.controller, self.kube.name: self.kube}.get(event["wake"])
            if loop is not None and self.leader.is_leader:
                loop.kick.set()
        else:
            self.hub.heard(event)


def _pieces(sample: dict, per_piece: int = 32) -> list[dict]:
    """``sample``'s maps cut into pieces of at most ``per_piece`` entries each (a change-feed
    notification carries 7,000 bytes)."""
    pieces: list[dict] = []
    for key, value in sample.items():
        items = list(value.items()) if isinstance(value, dict) else []
        for i in range(0, len(items), per_piece):
            pieces.append({key: dict(items[i:i + per_piece])})
    return pieces


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


