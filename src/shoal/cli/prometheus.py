"""`shoal up --prometheus PORT`: a real Prometheus (Debian's ``prometheus``) scraping the local cluster.

Its configuration names three jobs, as a site's would: ``shoal-server`` (the server's
``/metrics``, read with the cluster's admin token from the state dir), ``shoal-agents``
(each node's DCGM-style GPU series) and ``shoal-gateway`` when one runs. Its data lives in
the cluster's state dir, so ``shoal down`` leaves nothing behind but that directory.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

SCRAPE_INTERVAL_S = 2  # as often as the local cluster's heartbeats: a laptop's demo sees changes at once


class PrometheusError(Exception):
    """Prometheus is not installed, or did not start."""


def binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise PrometheusError("no 'prometheus' on PATH (Debian and Ubuntu: apt-get install prometheus)")
    return path


def scrape_config(server_url: str, token_file: Path, agents: list[str], *, gateway: str | None = None,
                  ca_file: str | None = None, interval_s: float = SCRAPE_INTERVAL_S) -> dict:
    """prometheus.yml as a dict (JSON is YAML): ``agents`` are the step servers' host:port."""
    scheme = server_url.split("://", 1)[0]
    tls = {"tls_config": {"ca_file": ca_file}} if ca_file else {}
    jobs = [
        {"job_name": "shoal-server", "scheme": scheme, "metrics_path": "/metrics",
         "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
         "static_configs": [{"targets": [server_url.split("://", 1)[1]]}], **tls},
        {"job_name": "shoal-agents", "scheme": scheme, "metrics_path": "/metrics",
         "static_configs": [{"targets": agents}], **tls},
    ]
    if gateway:
        jobs.append({"job_name": "shoal-gateway", "metrics_path": "/gateway/metrics",
                     "static_configs": [{"targets": [gateway.split("://", 1)[1]]}]})
    return {"global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
            "scrape_configs": jobs}


def start(sdir: Path, port: int, config: dict, spawn, alive) -> tuple[int, str]:
    """Write the configuration, start Prometheus with ``spawn(cmd, log) -> pid`` and wait until
    it is ready (or ``alive(pid)`` says it exited). Returns its pid and URL."""
    prom = binary()
    home = sdir / "prometheus"
    (home / "data").mkdir(parents=True, exist_ok=True)
    conf = home / "prometheus.yml"
    conf.write_text(json.dumps(config, indent=2) + "\n")
    url = f"http://127.0.0.1:{port}"
    pid = spawn([prom, f"--config.file={conf}", f"--storage.tsdb.path={home / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=7d"],
                sdir / "logs" / "prometheus.log")
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return pid, url
        except (urllib.error.URLError, OSError):
            pass
        if not alive(pid):
            break
        time.sleep(0.1)
    raise PrometheusError(f"Prometheus did not become ready at {url} (see {sdir / 'logs' / 'prometheus.log'})")
