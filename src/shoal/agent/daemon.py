"""The node agent: register, long-poll the node's desired state, reconcile, report.

One work loop (long-poll + reconcile), one reporter (heartbeats and exits, retried until
the server has them), a GPU health watch, a lease watch, and the step server for srun.
No server, store or FastAPI imports.

Fencing (docs/FENCING.md): the server marks a node DOWN when it has been silent for its
heartbeat timeout and restarts the node's work elsewhere. The agent's lease, learned at
registration, is shorter by the fence's grace, check period and clock skew, and is counted
from when the last report the server took was *sent*. Each accepted report renews it in the
``lease`` file, which the runs' supervisors read: when it runs out they stop their runs
themselves (TERM, KILL after the grace), whether this agent is alive, killed or stopped; so
do srun tasks' step supervisors. The agent does the same for what it runs without one (pods,
tasks started before it had a lease), never reports those runs again,
and registers anew, naming them, once it reaches the server; it then runs only what the
server gives it.

Revocation: an administrator may revoke the node's credential (``shoal token revoke-node``).
The agent then stops talking to the server (it does not register again on its own: that
would undo the revocation), fences its work when its lease runs out, and waits to be started
again with a join token.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.agent import supervise, wire
from shoal.agent.certs import AgentCertificate
from shoal.agent.cgroups import CgroupError, Containment, Usage, detect, fake_device_nodes, instance_name
from shoal.agent.gpus import (
    FakeNVML,
    GPUDiscoveryError,
    GPUHealthEvent,
    GPUInventory,
    check_health,
    open_nvml,
    watch_xids,
)
from shoal.agent.host import HostFacts
from shoal.agent.identity import JobUsers
from shoal.agent.containers import RegistrySettings
from shoal.agent.pods import PodManager
from shoal.agent.runtime import Run, Runtime
from shoal.agent.stepcontainer import Settings, StepContainers
from shoal.agent.stepserver import StepServer
from shoal.agent.usage import UsageSampler, holder_labels, prometheus_text
from shoal.api_client import Client, ClientError

log = logging.getLogger("shoal.agent")
REVOKED = "credential revoked"  # how the server's refusal of a revoked node credential begins (server.auth)


@dataclass
class AgentConfig:
    name: str
    server: str
    join_token: str
    address: str
    port: int
    workdir: Path
    host: HostFacts
    inventory: GPUInventory
    labels: dict[str, str] = field(default_factory=dict)
    features: list[str] = field(default_factory=list)
    taints: list[dict] = field(default_factory=list)  # applied when the node first registers
    runtime: str = "process"  # pods' default container runtime
    images: dict[str, list[str]] = field(default_factory=dict)  # process runtime: image glob -> argv
    fake_nvml: FakeNVML | None = None  # the fake driver behind ``inventory``, if it is fake
    run_as_submitter: bool | None = None  # jobs run as their users; None: when the agent is root
    ca_file: str | None = None  # the cluster CA, to verify an https:// server (jobs get it as $SHOAL_CA)
    tls: bool = False  # serve the step server over HTTPS with a certificate the cluster CA issues
    cgroups: str = "auto"  # job containment: auto (what the node has), v1, v2 or off (docs/CGROUPS.md)


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        users = JobUsers(cfg.run_as_submitter)
        containment = self._containment()
        self.runtime = Runtime(cfg.name, cfg.workdir, self._on_exit, users, containment)
        if cfg.fake_nvml is not None and self.runtime.containment.hierarchy is not None:
            self.runtime.device_dir = fake_device_nodes(cfg.workdir / "dev", (g.index for g in cfg.inventory.gpus))
        self.containers = StepContainers(cfg.runtime, cfg.name, cfg.workdir)
        self.runtime.before_empty = self._remove_containers
        self._images_sent: list[dict] | None = None  # what the server last heard of the image cache
        self.pods = PodManager(cfg.name, cfg.workdir, cfg.address, self._on_pod_change, images=cfg.images,
                               default_runtime=cfg.runtime, users=users, containment=containment)
        self._pod_ids: dict[str, tuple[int, int]] = {}  # run key -> (job id, run)
        self._pod_updates: dict[str, list[dict]] = {}  # run key -> events not yet reported
        self._pod_exits_sent: set[str] = set()
        self._pod_lock = threading.Lock()
        self.events: queue.Queue = queue.Queue()
        self._pending: list[dict] = []  # events taken from ``events``, not yet accepted by the server
        self._events_lock = threading.Lock()
        self.stop = threading.Event()
        self.credential: str | None = None
        self.step_key: str = ""
        self.heartbeat_interval = 5.0
        self.kill_wait = 30.0
        self._report_now = threading.Event()
        self._applied_signals: dict[str, int] = {}  # epoch -> last signal seq applied
        # Signals' ids (they stay the same on every server sharing a store): a signal applied
        # through one server is not applied again through another after a failover.
        self._signal_ids: collections.deque = collections.deque(maxlen=1024)
        self._server = Client(cfg.server, cfg.join_token, timeout=40, ca_file=cfg.ca_file, keep_alive=True)
        self._server.job_token = None
        self.step_server = StepServer((cfg.address, cfg.port), self, tls_only=cfg.tls)
        self.certificate = AgentCertificate(cfg.workdir, cfg.name) if cfg.tls else None
        if self.certificate is not None:
            self.step_server.tls = self.certificate.context()  # the last one issued, until registration
        self.revoked = threading.Event()  # an administrator revoked this node's credential
        self._desired: set[str] = set()
        self.usage = UsageSampler(self._open_nvml(), cfg.inventory.gpus)
        self._pod_names: dict[str, tuple[str, str]] = {}  # run key -> (namespace, pod), for /metrics
        self._gpu_holders: dict[int, dict[str, str]] = {}  # GPU index -> its holder's labels, for /metrics
        self._gpu_runs: dict[int, tuple[int, int]] = {}  # GPU index -> (job id, run) holding it, for accounting
        self.health_interval = 1.0  # NVML health polls (HealthCheckInterval)
        self._health_lock = threading.Lock()
        self._gpu_problems: list[dict] = []  # lasting GPU problems found by the last poll
        self._xids: list[dict] = []  # XIDs not yet reported
        self.lease_s: float | None = None  # learned at registration; None: no fencing
        self.fence_grace_s = 0.0  # TERM to KILL when fenced
        self.fence_check_s = supervise.CHECK_S
        self._renewed = supervise.boottime()  # when the last report the server took was sent
        self._fence_lock = threading.Lock()
        self._fenced: set[str] = set()  # runs a fence stopped: never reported again
        self._unannounced: list[str] | None = None  # fenced runs the server has yet to hear of; None: not fenced

    def _containment(self) -> Containment:
        """Find the node's cgroups and say in one line what jobs will be contained by."""
        try:
            hierarchy = detect(self.cfg.cgroups, instance_name(self.cfg.name, self.cfg.workdir))
        except CgroupError as e:
            log.warning("no cgroups (%s): jobs run uncontained", e.strerror)
            hierarchy = None
        if hierarchy is not None:
            log.info("%s", hierarchy.describe())
        elif self.cfg.cgroups == "off":
            log.warning("no cgroups (--cgroups off): jobs run uncontained")
        else:
            log.warning("no cgroups (none mounted, or not root): jobs run uncontained")
        containment = Containment(hierarchy, (g.index for g in self.cfg.inventory.gpus), self.cfg.host.cpus)
        if hierarchy is not None and "cpuset" in hierarchy.controllers and not containment.constrain_cores:
            log.info("no cpusets: this node advertises %d CPUs, more than the machine's %d", self.cfg.host.cpus,
                     len(hierarchy.online_cpus))
        return containment

    def _open_nvml(self):
        """NVML kept open for utilisation samples; None without GPUs or when it fails."""
        if not self.cfg.inventory.gpus:
            return None
        try:
            return open_nvml(self.cfg.fake_nvml)
        except GPUDiscoveryError as e:
            log.warning("GPU utilisation will not be reported: %s", e)
            return None

    # ---------------------------------------------------------------- life cycle

    def register(self) -> None:
        inv, host = self.cfg.inventory, self.cfg.host
        fenced = self._unannounced
        with self._events_lock:
            self._drain_events()
            sending = list(self._pending)
        body = wire.register_body(
            name=self.name, address=self.cfg.address, port=self.step_server.server_address[1], cpus=host.cpus,
            memory_mb=host.memory_mb, gpus=[g.__dict__ for g in inv.gpus], labels=self.cfg.labels,
            features=self.cfg.features, boot_time=host.boot_time, alive=self.alive_keys(), taints=self.cfg.taints,
            fenced=fenced, events=sending, csr=self.certificate.request() if self.certificate is not None else None)
        self._server.token = self.cfg.join_token
        sent = supervise.boottime()
        reply = self._server.post(wire.REGISTER, body)
        if self.certificate is not None:
            if not reply.get("certificate"):
                raise ClientError("the server issued no certificate for this agent's HTTPS (is it older than "
                                  "the agent?); start the agent with --tls off to serve plain HTTP")
            self.step_server.tls = self.certificate.accept(reply["certificate"], reply["ca"])
        self._accepted(sending)
        self.revoked.clear()
        self.credential = reply["credential"]
        self.step_key = reply["step_key"]
        self.heartbeat_interval = float(reply["heartbeat_interval_s"])
        self.kill_wait = float(reply["kill_wait_s"])
        settings = Settings.from_json(reply.get("containers"))
        self.containers.configure(settings)
        self.pods.registry = RegistrySettings(settings.registry_mirrors, settings.insecure_registries,
                                              self.containers.cdi_kind or "nvidia.com/gpu")
        if self.containers.runtime is not None and self.containers.runtime.name == "podman":
            self.pods.image_cache = self.containers.cache  # pods' podman pulls through the steps' cache
        self._server.token = self.credential
        log.info("registered %s with %s (%d CPUs, %d MiB, %d GPUs)", self.name, self.cfg.server,
                 host.cpus, host.memory_mb, len(inv.gpus))
        with self._fence_lock:
            lease = reply.get("lease_s")
            self.lease_s = float(lease) if lease else None
            self.fence_grace_s = float(reply.get("fence_grace_s") or 0.0)
            self.fence_check_s = float(reply.get("fence_check_s") or supervise.CHECK_S)
            if fenced is not None and self._unannounced is fenced:
                self._unannounced = None
                log.warning("back in touch with the server: registered again after the fence; "
                            "running only the work it gives now")
            self._renew(sent)

    def serve(self) -> None:
        """Run until stopped. Registration is retried until the server answers."""
        adopted = self.runtime.adopt()  # before registering: they are alive here
        if adopted:
            log.warning("re-adopted %d run(s) an earlier agent launched here: %s", len(adopted), " ".join(adopted))
        adopted = self.pods.adopt()  # they run on; the first work says which the server still lists
        if adopted:
            log.warning("re-adopted %d pod(s) an earlier agent started here: %s", len(adopted), " ".join(adopted))
        threading.Thread(target=self.step_server.serve_forever, name="steps", daemon=True).start()
        delay = 0.2
        while not self.stop.is_set():
            try:
                self.register()
                break
            except ClientError as e:
                if e.status in (401, 403, 422):
                    raise
                log.warning("cannot register yet: %s", e)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)
        threading.Thread(target=self._reporter, name="reporter", daemon=True).start()
        threading.Thread(target=self._watch_lease, name="lease", daemon=True).start()
        if self.cfg.inventory.gpus:
            threading.Thread(target=self._watch_health, name="gpu-health", daemon=True).start()
        self._work_loop()

    def alive_keys(self) -> list[str]:
        return sorted(set(self.runtime.alive_keys()) | set(self.pods.alive_keys()))

    def shutdown(self) -> None:
        self.runtime.containment.close()
        self.stop.set()
        self._report_now.set()
        self.step_server.shutdown()

    # ---------------------------------------------------------------- work

    def _work_loop(self) -> None:
        epoch, gen = None, None
        failures = 0
        while not self.stop.is_set():
            try:
                work = self._server.get(wire.work_path(self.name), wire.work_params(epoch, gen),
                                        timeout=wire.WORK_TIMEOUT_S)
                failures = 0
            except ClientError as e:
                failures += 1
                if self._refused_as_revoked(e):
                    self.stop.wait()  # until the process ends: see the module's docstring
                    continue
                if e.status in (401, 403, 404):
                    log.warning("server does not know this node any more (%s): registering again", e)
                    try:
                        self.register()
                    except ClientError:
                        pass
                self.stop.wait(min(0.2 * 2 ** failures, 5.0))
                epoch = None
                continue
            epoch, gen = work["epoch"], work["gen"]
            self.kill_wait = float(work.get("kill_wait_s", self.kill_wait))
            with self._fence_lock:
                if self._unannounced is not None:
                    # Fenced: this work may predate the fence; the reporter registers again
                    # and the next long-poll brings what the server wants now.
                    epoch = None
                    self.stop.wait(0.5)
                    continue
                try:
                    self.reconcile(work)
                except Exception:
                    log.exception("reconcile failed")

    def reconcile(self, work: dict) -> None:
        now = time.time()
        desired = {r["key"] for r in work["runs"]}
        pods = [(r["key"], r["gpus"], (r["pod"]["namespace"], r["pod"]["name"])) for r in work["runs"] if "pod" in r]
        self._pod_names = {key: name for key, _, name in pods}
        self._gpu_holders = {g: holder_labels(r) for r in work["runs"] for g in r["gpus"]}
        self._gpu_runs = {g: (r["job_id"], r["run"]) for r in work["runs"] for g in r["gpus"]}
        kill = {k["key"] for k in work["kill"]}
        self._desired = desired | kill
        for entry in work["runs"]:
            if entry["key"] in self._fenced:
                continue  # work from before the fence, arriving late: a run key is never reused
            if "pod" in entry:
                with self._pod_lock:
                    self._pod_ids[entry["key"]] = (entry["job_id"], entry["run"])
                self.pods.ensure(entry)
                continue
            self.runtime.ensure(entry["key"], entry["job_id"], entry["run"], entry.get("user", ""), entry)
            if "batch" in entry:
                ca = self.cfg.ca_file or (str(self.certificate.ca_file) if self.certificate is not None else None)
                self.runtime.start_batch(entry, {"SHOAL_SERVER": self.cfg.server, **({"SHOAL_CA": ca} if ca else {})})
        pod_keys = set(self.pods.alive_keys())
        for k in work["kill"]:
            if k["key"] in pod_keys:
                self.pods.stop(k["key"])
            else:
                self.runtime.kill(k["key"], self.kill_wait, now)
        # Anything running here that the server does not list was ended or moved: stop it.
        with self.runtime.lock:
            strays = [k for k, r in self.runtime.runs.items() if k not in self._desired and r.alive()]
        for k in strays:
            log.warning("run %s is not listed by the server any more: killing it", k)
            self.runtime.kill(k, self.kill_wait, now)
        for k in pod_keys - self._desired:
            log.warning("pod %s is not listed by the server any more: stopping it", k)
            self.pods.stop(k)
            strays.append(k)
        last = self._applied_signals.get(work["epoch"], 0)
        for sig in work.get("signals", ()):
            if sig["seq"] > last:
                if sig.get("id") is None or sig["id"] not in self._signal_ids:
                    self.runtime.signal(sig["key"], sig["signal"], sig["target"])
                    self._signal_ids.append(sig.get("id"))
                last = sig["seq"]
        self._applied_signals = {work["epoch"]: last}
        for run in self.runtime.forget_dead(self._desired):
            if self.containers.has_named(run.job_id):
                threading.Thread(target=self.containers.remove_job, args=(run.job_id,), daemon=True).start()
        self.pods.forget_dead(self._desired)
        if kill or strays:
            self._report_now.set()

    def _remove_containers(self, job_id: int) -> None:
        if self.containers.has_job(job_id):
            self.containers.remove_job(job_id)

    # ---------------------------------------------------------------- reports

    def _on_pod_change(self, key: str, status: dict, events: list[dict]) -> None:
        with self._pod_lock:
            self._pod_updates.setdefault(key, []).extend(events)
        self._report_now.set()

    def _pod_reports(self, everything: bool) -> list[dict]:
        """The pods whose status changed (all of them with a heartbeat), and finished pods'
        exits, which are reported once like a batch script's."""
        with self._pod_lock:
            updates, self._pod_updates = self._pod_updates, {}
            ids = dict(self._pod_ids)
        keys = set(updates) | (set(self.pods.alive_keys()) & set(ids) if everything else set())
        out = []
        for key in sorted(keys):
            if key not in ids or key in self._fenced:
                continue
            status = self.pods.status(key)
            if status is None:
                continue
            job_id, run = ids[key]
            out.append({"key": key, "job_id": job_id, "run": run, "status": status,
                        "events": updates.get(key, [])})
            ended = self.pods.exit_of(key)
            if ended is not None and key not in self._pod_exits_sent:
                self._pod_exits_sent.add(key)
                code, sig = ended
                self.events.put(wire.exit_event(key, job_id, run, code, sig, time.time()))
        return out

    def metrics_text(self) -> str:
        """The last usage sample as Prometheus text (the step server's ``GET /metrics``)."""
        return prometheus_text(self.usage.last, self.usage.gpus, self.name, self._gpu_holders, self._pod_names)

    def _on_exit(self, run: Run, exit_code: int, sig: int, when: float, reason: str | None = None,
                 fenced: bool = False, usage: Usage | None = None) -> None:
        if run.key in self._fenced:
            return  # killed by this agent's fence: named at its next registration instead
        event = wire.exit_event(run.key, run.job_id, run.run, exit_code, sig, when)
        if reason:
            event["reason"] = reason  # why it never ran (squeue's and sacct's REASON)
        if usage is not None:  # from the batch step's cgroup (OOM kills: the job's)
            event.update(oom_kills=usage.oom_kills, **usage.report())
            if usage.oom_kills:
                log.warning("job %s: %d OOM kill(s) in its cgroup: it ends OUT_OF_MEMORY", run.key, usage.oom_kills)
        # Whether it ended by itself: the server corrects a run it gave up only with such an end.
        if fenced:
            event["fenced"] = True  # its supervisor's fence, with no agent (or an earlier one) alive
        elif run.killing_since is not None:
            event["killed"] = True
        self.events.put(event)
        self._report_now.set()

    def step_ended(self, run: Run, step_id: int, usage: Usage) -> None:
        """An srun step's tasks have ended here: what its cgroup says they used goes to the
        server with the next report (sacct's step line, summed over the step's nodes there)."""
        if run.key in self._fenced:
            return
        self.events.put({"type": "step", "key": run.key, "job_id": run.job_id, "run": run.run, "step_id": step_id,
                         "time": time.time(), **usage.report()})
        self._report_now.set()

    def _drain_events(self) -> None:
        """Move queued events to the pending list (under _events_lock)."""
        while True:
            try:
                self._pending.append(self.events.get_nowait())
            except queue.Empty:
                return

    def _accepted(self, sent: list[dict]) -> None:
        """The server has these events: drop them (the registration and the reporter may both send some)."""
        ids = {id(e) for e in sent}
        with self._events_lock:
            self._pending = [e for e in self._pending if id(e) not in ids]

    def _reporter(self) -> None:
        unsent: dict[str, dict] = {}  # pod reports a failed post did not deliver, by run key
        sampled = float("-inf")
        while not self.stop.is_set():
            # While a kill is in progress look again soon, so KILL follows TERM on time and
            # the server hears promptly that the processes are gone.
            killing = any(r.killing_since is not None and r.alive() for r in list(self.runtime.runs.values()))
            woken = self._report_now.wait(timeout=0.1 if killing else self.heartbeat_interval)
            self._report_now.clear()
            if self.revoked.is_set():
                self._advance_kills()  # the fence's kills still finish
                continue
            if self._unannounced is not None:
                try:
                    self.register()
                except ClientError as e:
                    log.warning("fenced, and the server is still out of reach: %s", e)
                    self.stop.wait(0.5)
                    self._report_now.set()
                    continue
            try:
                self._advance_kills()
                for rp in self._pod_reports(everything=not woken):
                    old = unsent.get(rp["key"])
                    unsent[rp["key"]] = {**rp, "events": (old["events"] if old else []) + rp["events"]}
            except Exception:  # a bug here must never stop the heartbeats: the node would go DOWN
                log.exception("collecting kills and pod reports failed; the heartbeat goes on")
            with self._events_lock:
                self._drain_events()
                pending = list(self._pending)
            usage = {}
            if time.monotonic() - sampled >= self.heartbeat_interval * 0.9:
                # Once per heartbeat, however often pod changes wake the reporter.
                sampled = time.monotonic()
                try:
                    usage = self.usage.sample(self.pods.container_pids()).report(self._gpu_runs)
                except Exception:  # a figure missed must never stop the heartbeats
                    log.exception("sampling GPU and pod usage failed")
            with self._health_lock:
                xids = list(self._xids)
                gpu_health = xids + self._gpu_problems  # the event first: it says what happened
            sent = supervise.boottime()
            images = self._images()
            try:
                self._server.post(wire.report_path(self.name),
                                  wire.report_body(pending, self.alive_keys(), list(unsent.values()), gpu_health,
                                                   usage, images if images != self._images_sent else None),
                                  timeout=wire.REPORT_TIMEOUT_S)
                self._images_sent = images
                self._accepted(pending)
                unsent = {}
                with self._fence_lock:
                    self._renew(sent)
                with self._health_lock:
                    del self._xids[:len(xids)]
                self._renew_certificate()
            except ClientError as e:
                if self._refused_as_revoked(e):
                    continue
                log.warning("report failed (will retry): %s", e)
                self.stop.wait(0.5)
                self._report_now.set()
            except Exception:  # as above: log, keep what was not sent, and go on
                log.exception("report failed unexpectedly (will retry)")
                self.stop.wait(0.5)
                self._report_now.set()

    def _images(self) -> list[dict] | None:
        """The node's cached images as the report carries them (None: no cache to tell of)."""
        try:
            return self.containers.image_list()
        except Exception:  # a cache that cannot be read must never stop the heartbeats
            log.exception("reading the image cache's index failed")
            return self._images_sent

    def _renew_certificate(self) -> None:
        """Register again for a new serving certificate when this one has a month left."""
        if self.certificate is None or not self.certificate.renewal_due(time.time()):
            return
        log.info("this agent's certificate ends within a month: registering again for a new one")
        try:
            self.register()
        except ClientError as e:
            log.warning("renewing the agent's certificate failed (will retry): %s", e)

    def _refused_as_revoked(self, e: ClientError) -> bool:
        """Whether the server refused this node's credential as revoked (said once in the log)."""
        if e.status != 403 or REVOKED not in str(e):
            return False
        if not self.revoked.is_set():
            self.revoked.set()
            log.error("%s; this agent stops reporting (its work is fenced when its lease runs out) "
                      "until it is started again", e)
        return True

    def _advance_kills(self) -> None:
        now = time.time()
        with self.runtime.lock:
            keys = [k for k, r in self.runtime.runs.items() if r.killing_since is not None]
        for k in keys:
            self.runtime.kill(k, self.kill_wait, now)

    # ---------------------------------------------------------------- fencing

    def _renew(self, sent: float) -> None:
        """A report sent at ``sent`` reached the server: the lease runs on from then, in the
        lease file too (for the supervisors), once per accepted report. Under _fence_lock."""
        self._renewed = max(self._renewed, sent)
        path = self.cfg.workdir / supervise.LEASE
        try:
            if self.lease_s is None:
                path.unlink(missing_ok=True)  # fencing is off: supervisors never fence
            elif self._unannounced is None:  # fenced: no lease until registered again
                supervise.write_lease(path, supervise.Lease(self._renewed + self.lease_s, self.fence_grace_s,
                                                            self.fence_check_s))
        except OSError as e:
            log.error("cannot write the node's lease file %s (its runs are fenced when the last one written "
                      "runs out): %s", path, e)

    def _watch_lease(self) -> None:
        while not self.stop.wait(0.2):
            self._check_lease()
            self._advance_fence()

    def _advance_fence(self) -> None:
        """KILL what the fence's TERM left running once its grace is over (here, not in the
        reporter, which may be stuck reaching the server)."""
        if not self._fenced:
            return
        now = time.time()
        for key in self.runtime.alive_keys():
            if key in self._fenced:
                self.runtime.kill(key, self.fence_grace_s, now)

    def _check_lease(self) -> None:
        """Fence when the lease has run out: see the module's docstring."""
        with self._fence_lock:
            if self._unannounced is not None or not self.lease_s:
                return
            silent = supervise.boottime() - self._renewed
            if silent <= self.lease_s:
                return
            runs = self.runtime.alive_keys()
            pods = self.pods.alive_keys()
            log.error("fencing: no report reached the server for %.1fs, past this node's %.0fs lease, so "
                      "the server has restarted its work elsewhere; killing %d run(s) and %d pod(s) here: %s",
                      silent, self.lease_s, len(runs), len(pods),
                      " ".join(sorted(runs) + ["/".join(self._pod_names.get(k, (k,))) for k in sorted(pods)]) or "-")
            self._fenced.update(runs + pods)
            self._unannounced = sorted(runs + pods)
            now = time.time()
            for key in runs:  # marks it ending too: srun starts no new step in it
                self.runtime.kill(key, self.fence_grace_s, now, fence=True)
            for key in pods:
                self.pods.stop(key, grace_s=0)
        self._report_now.set()

    # ---------------------------------------------------------------- GPU health

    def _watch_health(self) -> None:
        """Poll NVML's health signals (critical XIDs, uncorrected ECC, lost GPUs); a change is
        reported at once, and the server drains the node."""
        try:
            nvml = open_nvml(self.cfg.fake_nvml)
        except GPUDiscoveryError as e:
            log.warning("GPU health will not be watched: %s", e)
            return
        xids = watch_xids(nvml)
        while not self.stop.wait(self.health_interval):
            try:
                found = check_health(nvml, xids)
            except Exception:  # a failed poll must not end the watch
                log.exception("GPU health check failed")
                continue
            self._note_health(found)

    def _note_health(self, found: list[GPUHealthEvent]) -> None:
        lasting = [_problem(e) for e in found if e.lasting]
        xids = [_problem(e) for e in found if not e.lasting]
        with self._health_lock:
            new = xids + [p for p in lasting if p not in self._gpu_problems]
            healed = self._gpu_problems and not lasting
            changed = bool(new) or lasting != self._gpu_problems
            self._gpu_problems = lasting
            self._xids.extend(xids)
        for p in new:
            log.error("GPU health: %s", p["reason"])
        if healed:
            log.warning("GPU health: NVML reports no lasting GPU problem any more")
        if changed:
            self._report_now.set()


def _problem(e: GPUHealthEvent) -> dict:
    """A health event as the report carries it (the server's GPUProblem)."""
    return {"index": e.index, "uuid": e.uuid, "kind": e.kind.value, "xid": e.xid, "reason": e.describe()[:200]}
