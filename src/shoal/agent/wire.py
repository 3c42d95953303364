"""The agent's side of the wire protocol: the paths, query and bodies of registration, the
work long-poll and reports, and the exit event. The node agent (``daemon``) and the hollow
agents (``hollow``) both build their requests here, so a hollow node sends the server
exactly what a real one does."""

from __future__ import annotations

REGISTER = "/shoal/v1/agents/register"
# How long a work long-poll waits for a change (the server allows up to 60): each renewal is
# an answer built for nothing, 200 a second from 5,000 nodes at 25 s; under 60 s, so proxies'
# usual idle timeouts never cut one (docs/SCALE.md).
WORK_WAIT_S = 55
WORK_TIMEOUT_S = 70  # the long-poll's socket timeout: the wait plus a loaded server's answer
REPORT_TIMEOUT_S = 10


def work_path(node: str) -> str:
    return f"/shoal/v1/agents/{node}/work"


def report_path(node: str) -> str:
    return f"/shoal/v1/agents/{node}/report"


def work_params(epoch: str | None, gen: int | None) -> dict:
    """The long-poll's query: wait for a change past (epoch, gen), or answer at once the
    first time (no epoch yet)."""
    return {"wait": WORK_WAIT_S, "epoch": epoch, "gen": gen} if epoch is not None else {"wait": 0}


def register_body(*, name: str, address: str, port: int, cpus: int, memory_mb: int, gpus: list[dict],
                  labels: dict[str, str], features: list[str], boot_time: float | None, alive: list[str],
                  taints: list[dict], fenced: list[str] | None = None, events: list[dict] | None = None,
                  csr: str | None = None) -> dict:
    """POST REGISTER's body (the server's schemas.AgentRegister)."""
    body = {"name": name, "address": address, "port": port, "cpus": cpus, "memory_mb": memory_mb,
            "gpus": gpus, "labels": labels, "features": features, "boot_time": boot_time, "alive": alive,
            "taints": taints}
    if fenced:
        body["fenced"] = fenced
    if events:
        body["events"] = events
    if csr is not None:
        body["csr"] = csr
    return body


def report_body(events: list[dict], alive: list[str], pods: list[dict], gpu_health: list[dict],
                usage: dict, images: list[dict] | None = None) -> dict:
    """POST report_path's body (schemas.AgentReport): exits not yet accepted, the runs alive
    here, pods' status, GPU problems, once per heartbeat the usage sample, and the node's
    image cache when it changed (None: unchanged, left out)."""
    return {"events": events, "alive": alive, "pods": pods, "gpu_health": gpu_health, **usage,
            **({"images": images} if images is not None else {})}


def exit_event(key: str, job_id: int, run: int, exit_code: int, signal: int, when: float) -> dict:
    """A run's end as reports carry it (schemas.AgentEvent; callers add what they know more)."""
    return {"type": "exit", "key": key, "job_id": job_id, "run": run, "exit_code": exit_code, "signal": signal,
            "time": when}
