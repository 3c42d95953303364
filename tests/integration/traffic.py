"""Serving test helpers: a Deployment of the example model server, requests through the
gateway, bounded background load, and what the routes API says is ready."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from tests.integration.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
MODEL_SERVER = ROOT / "examples" / "serving" / "model_server.py"


def model_deployment(name: str, *, replicas: int, port: int, version: str = "v1", env: dict | None = None,
                     readiness_path: str | None = "/health", period_s: int = 1, liveness: dict | None = None,
                     spec: dict | None = None, pod_spec: dict | None = None) -> str:
    """A Deployment (and its Service, port 80 -> ``port``) of the example model server as JSON
    documents, which ``shoal apply -f`` reads as YAML. It answers with MODEL_VERSION = ``version``."""
    container = {"name": "model", "image": f"shoal/model-server:{version}",
                 "command": ["python3", str(MODEL_SERVER)],
                 "env": [{"name": k, "value": str(v)} for k, v in {"MODEL_VERSION": version, **(env or {})}.items()],
                 "ports": [{"containerPort": port}],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
    if readiness_path:
        container["readinessProbe"] = {"httpGet": {"path": readiness_path, "port": port},
                                       "periodSeconds": period_s, "failureThreshold": 1}
    if liveness:
        container["livenessProbe"] = liveness
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [container], "terminationGracePeriodSeconds": 5,
                                       **(pod_spec or {})}},
                 **(spec or {})}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
               "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": port}]}}
    return "\n---\n".join(json.dumps(d) for d in (deployment, service)) + "\n"


def apply(c: LocalCluster, path: Path, text: str) -> str:
    path.write_text(text)
    return c.run(["shoal", "apply", "-f", str(path)]).stdout


def ask(gateway: str, service: str, timeout: float = 10, max_tokens: int = 2) -> tuple[int, dict]:
    """One completion through the gateway: (status, JSON answer or {"error": text}). The
    model server takes about 2 ms a token."""
    req = urllib.request.Request(f"{gateway}/v1/completions", method="POST",
                                 data=json.dumps({"prompt": "the gateway", "max_tokens": max_tokens}).encode(),
                                 headers={"Host": f"{service}.default", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode(errors="replace")}
    except OSError as e:
        return 0, {"error": str(e)}


@dataclass
class Answer:
    sent: float  # time.time() when the request left
    status: int
    version: str
    pod: str
    error: str = ""


@dataclass
class Load:
    """``workers`` clients asking one after another through the gateway until stopped."""

    gateway: str
    service: str
    workers: int = 2
    max_tokens: int = 2
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Self:
        for _ in range(self.workers):
            t = threading.Thread(target=self._client, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)

    def _client(self) -> None:
        while not self._stop.is_set():
            sent = time.time()
            status, body = ask(self.gateway, self.service, max_tokens=self.max_tokens)
            self.answers.append(Answer(sent, status, body.get("version", ""), body.get("pod", ""),
                                       body.get("error", "")))

    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]


def backends(c: LocalCluster, service: str) -> list[dict]:
    """The Service's pods as the gateway's routes table lists them."""
    table = c.api("GET", "/shoal/v1/kube/routes")
    return next((s["backends"] for s in table["services"] if s["name"] == service), [])


def serving(c: LocalCluster, service: str) -> list[str]:
    """Pods the gateway may send new requests to: ready and not terminating."""
    return [b["pod"] for b in backends(c, service) if b["ready"] and not b["terminating"]]


def pods(c: LocalCluster, selector: str | None = None) -> list[dict]:
    argv = ["shoal", "get", "pods", "-o", "json"] + (["-l", selector] if selector else [])
    return json.loads(c.run(argv).stdout)["items"]
