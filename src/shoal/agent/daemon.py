"""The node agent: register, long-poll the node's desired state, reconcile, report.

One work loop (long-poll + reconcile), one reporter (heartbeats and exits, retried until
the server has them), and the step server for srun. No server, store or FastAPI imports.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.agent.gpus import GPUInventory
from shoal.agent.host import HostFacts
from shoal.agent.runtime import Run, Runtime
from shoal.agent.stepserver import StepServer
from shoal.cli.client import Client, ClientError

log = logging.getLogger("shoal.agent")


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


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.runtime = Runtime(cfg.name, cfg.workdir, self._on_exit)
        self.events: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.credential: str | None = None
        self.step_key: str = ""
        self.heartbeat_interval = 5.0
        self.kill_wait = 30.0
        self._report_now = threading.Event()
        self._applied_signals: dict[str, int] = {}  # epoch -> last signal seq applied
        self._server = Client(cfg.server, cfg.join_token, timeout=40)
        self._server.job_token = None
        self.step_server = StepServer((cfg.address, cfg.port), self)
        self._desired: set[str] = set()

    # ---------------------------------------------------------------- life cycle

    def register(self) -> None:
        inv, host = self.cfg.inventory, self.cfg.host
        body = {
            "name": self.name, "address": self.cfg.address, "port": self.step_server.server_address[1],
            "cpus": host.cpus, "memory_mb": host.memory_mb,
            "gpus": [g.__dict__ for g in inv.gpus], "labels": self.cfg.labels, "features": self.cfg.features,
            "boot_time": host.boot_time, "alive": self.runtime.alive_keys(),
        }
        self._server.token = self.cfg.join_token
        reply = self._server.post("/api/v1/agents/register", body)
        self.credential = reply["credential"]
        self.step_key = reply["step_key"]
        self.heartbeat_interval = float(reply["heartbeat_interval_s"])
        self.kill_wait = float(reply["kill_wait_s"])
        self._server.token = self.credential
        log.info("registered %s with %s (%d CPUs, %d MiB, %d GPUs)", self.name, self.cfg.server,
                 host.cpus, host.memory_mb, len(inv.gpus))

    def serve(self) -> None:
        """Run until stopped. Registration is retried until the server answers."""
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
        self._work_loop()

    def shutdown(self) -> None:
        self.stop.set()
        self._report_now.set()
        self.step_server.shutdown()

    # ---------------------------------------------------------------- work

    def _work_loop(self) -> None:
        epoch, gen = None, None
        failures = 0
        while not self.stop.is_set():
            try:
                params = {"wait": 25, "epoch": epoch, "gen": gen} if epoch is not None else {"wait": 0}
                work = self._server.get(f"/api/v1/agents/{self.name}/work", params, timeout=40)
                failures = 0
            except ClientError as e:
                failures += 1
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
            try:
                self.reconcile(work)
            except Exception:
                log.exception("reconcile failed")

    def reconcile(self, work: dict) -> None:
        now = time.time()
        desired = {r["key"] for r in work["runs"]}
        kill = {k["key"] for k in work["kill"]}
        self._desired = desired | kill
        for entry in work["runs"]:
            self.runtime.ensure(entry["key"], entry["job_id"], entry["run"])
            if "batch" in entry:
                self.runtime.start_batch(entry, {"SHOAL_SERVER": self.cfg.server})
        for k in work["kill"]:
            self.runtime.kill(k["key"], self.kill_wait, now)
        # Anything running here that the server does not list was ended or moved: stop it.
        with self.runtime.lock:
            strays = [k for k, r in self.runtime.runs.items() if k not in self._desired and r.alive()]
        for k in strays:
            log.warning("run %s is not listed by the server any more: killing it", k)
            self.runtime.kill(k, self.kill_wait, now)
        last = self._applied_signals.get(work["epoch"], 0)
        for sig in work.get("signals", ()):
            if sig["seq"] > last:
                self.runtime.signal(sig["key"], sig["signal"], sig["target"])
                last = sig["seq"]
        self._applied_signals = {work["epoch"]: last}
        self.runtime.forget_dead(self._desired)
        if kill or strays:
            self._report_now.set()

    # ---------------------------------------------------------------- reports

    def _on_exit(self, run: Run, exit_code: int, sig: int, when: float) -> None:
        self.events.put({"type": "exit", "key": run.key, "job_id": run.job_id, "run": run.run,
                         "exit_code": exit_code, "signal": sig, "time": when})
        self._report_now.set()

    def _reporter(self) -> None:
        pending: list[dict] = []
        while not self.stop.is_set():
            # While a kill is in progress look again soon, so KILL follows TERM on time and
            # the server hears promptly that the processes are gone.
            killing = any(r.killing_since is not None and r.alive() for r in list(self.runtime.runs.values()))
            self._report_now.wait(timeout=0.1 if killing else self.heartbeat_interval)
            self._report_now.clear()
            self._advance_kills()
            while True:
                try:
                    pending.append(self.events.get_nowait())
                except queue.Empty:
                    break
            try:
                self._server.post(f"/api/v1/agents/{self.name}/report",
                                  {"events": pending, "alive": self.runtime.alive_keys()}, timeout=10)
                pending = []
            except ClientError as e:
                log.warning("report failed (will retry): %s", e)
                self.stop.wait(0.5)
                self._report_now.set()

    def _advance_kills(self) -> None:
        now = time.time()
        with self.runtime.lock:
            keys = [k for k, r in self.runtime.runs.items() if r.killing_since is not None]
        for k in keys:
            self.runtime.kill(k, self.kill_wait, now)
