"""What the console's pages show that no API route answers, as pure functions over rows read
by the routes: the GPU grid, partitions' GPU totals, GPU-hours per account and user."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_ACCOUNT = "(default account)"  # a job that named none, on a cluster without an account tree

# A GPU's holder as the grid colours it (docs/CONSOLE.md).
TRAINING, SERVING, COMPLETING, IDLE, DRAINED, DOWN = "training", "serving", "completing", "idle", "drained", "down"


@dataclass(frozen=True)
class Holder:
    """Who holds GPUs: a running job or pod (``kind`` batch | pod), or a finished run's clean-up."""
    job_id: int
    kind: str
    name: str
    user: str
    namespace: str | None
    allocation: dict | None
    completing: bool = False


def gpu_grid(nodes: list[dict], holders: Iterable[Holder], utilisation: dict[tuple[str, int], float],
             visible) -> list[dict]:
    """Each node with one cell per GPU: its holder (shown as ``visible(holder)`` allows: under
    PrivateData=jobs another user's job is only "training"), model and utilisation."""
    held: dict[tuple[str, int], Holder] = {}
    for h in holders:
        for n in (h.allocation or {}).get("nodes", ()):
            for index in n["gpus"]:
                # A running job wins over a clean-up of the same GPU (the clean-up is ending).
                if not h.completing or (n["name"], index) not in held:
                    held[(n["name"], index)] = h
    out = []
    for node in nodes:
        cells = []
        for g in sorted(node["gpus"], key=lambda g: g["index"]):
            h = held.get((node["name"], g["index"]))
            cells.append({"index": g["index"], "model": g["product"], "memory_mb": g["memory_mb"],
                          "holder": _cell_holder(node, h, visible),
                          "job": _job_of(h) if h is not None and visible(h) else None,
                          "utilisation": utilisation.get((node["name"], g["index"])),
                          "healthy": _healthy(node, g["index"])})
        out.append({"name": node["name"], "state": node["display_state"], "reason": node["reason"],
                    "partitions": node["partitions"], "gpus": cells})
    return out


def _cell_holder(node: dict, h: Holder | None, visible) -> str:
    if h is not None:
        return COMPLETING if h.completing else SERVING if h.kind == "pod" else TRAINING
    if node["state"] == "DOWN":
        return DOWN
    if node["state"] == "DRAIN":
        return DRAINED
    return IDLE


def _job_of(h: Holder) -> dict:
    return {"job_id": h.job_id, "name": h.name, "user": h.user, "namespace": h.namespace, "kind": h.kind}


def _healthy(node: dict, index: int) -> bool:
    """No lasting problem (ECC, lost) reported for this GPU (the node's ``gpu_health``)."""
    return not any(x.get("index") == index for x in node.get("gpu_health") or ())


def partition_totals(grid: list[dict]) -> list[dict]:
    """GPUs per partition by holder (a node in two partitions counts in both, as sinfo's rows)."""
    totals: dict[str, dict] = {}
    for node in grid:
        for part in node["partitions"] or ["(none)"]:
            t = totals.setdefault(part, {"partition": part, "nodes": 0, "gpus": 0, TRAINING: 0, SERVING: 0,
                                         COMPLETING: 0, IDLE: 0, DRAINED: 0, DOWN: 0})
            t["nodes"] += 1
            t["gpus"] += len(node["gpus"])
            for cell in node["gpus"]:
                t[cell["holder"]] += 1
    return sorted(totals.values(), key=lambda t: t["partition"])


def gpu_hours(rows: Iterable[tuple[str, str | None, float | None, float | None, dict | None]],
              now: float, busy: dict[tuple[str, str], float] | None = None) -> dict:
    """GPU-hours of (user, account, start, end, allocation) rows: total per account, per user;
    with ``busy`` ((account, user) -> utilisation-weighted GPU-hours), those too."""
    accounts: dict[str, float] = {}
    users: dict[tuple[str, str], float] = {}
    for user, account, start, end, allocation in rows:
        if start is None or not allocation:
            continue
        gpus = sum(len(n["gpus"]) for n in allocation["nodes"])
        hours = gpus * max(0.0, (end if end is not None else now) - start) / 3600
        if not hours:
            continue
        acct = account or DEFAULT_ACCOUNT
        accounts[acct] = accounts.get(acct, 0.0) + hours
        users[(acct, user)] = users.get((acct, user), 0.0) + hours
    busy = busy or {}
    busy_accounts: dict[str, float] = {}
    for (a, _), h in busy.items():
        busy_accounts[a] = busy_accounts.get(a, 0.0) + h
    return {"accounts": [{"account": a, "gpu_hours": round(h, 3), "busy_gpu_hours": round(busy_accounts.get(a, 0.0), 3)}
                         for a, h in sorted(accounts.items())],
            "users": [{"account": a, "user": u, "gpu_hours": round(h, 3), "busy_gpu_hours": round(busy.get((a, u), 0.0), 3)}
                      for (a, u), h in sorted(users.items())]}


# Bucket sizes for GPU-hours over time, smallest first: the first that fits the span in
# MAX_BUCKETS bars is used, so a demo of a few minutes and a year of accounting both read well.
BUCKETS_S = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
MAX_BUCKETS = 48


def gpu_hours_over_time(rows: Iterable[tuple[str, str | None, float | None, float | None, dict | None]],
                        now: float) -> dict:
    """GPU-hours of (user, account, start, end, allocation) rows in time buckets, per account
    and per user: each run's GPUs times its overlap with each bucket. ``start`` is the first
    bucket's start (a multiple of ``bucket_s``); each series has one figure per bucket."""
    runs = []
    for user, account, start, end, allocation in rows:
        if start is None or not allocation:
            continue
        gpus = sum(len(n["gpus"]) for n in allocation["nodes"])
        if gpus:
            runs.append((user, account or DEFAULT_ACCOUNT, start, end if end is not None else now, gpus))
    if not runs:
        return {"bucket_s": BUCKETS_S[0], "start": now, "buckets": 0, "accounts": {}, "users": {}}
    first = min(r[2] for r in runs)
    bucket = next((b for b in BUCKETS_S if (now - (first // b) * b) / b <= MAX_BUCKETS), BUCKETS_S[-1])
    t0 = (first // bucket) * bucket
    n = int((now - t0) // bucket) + 1
    accounts: dict[str, list[float]] = {}
    users: dict[str, list[float]] = {}
    for user, acct, start, end, gpus in runs:
        a, u = accounts.setdefault(acct, [0.0] * n), users.setdefault(user, [0.0] * n)
        i = int((start - t0) // bucket)
        while i < n and t0 + i * bucket < end:
            lo, hi = max(start, t0 + i * bucket), min(end, t0 + (i + 1) * bucket)
            if hi > lo:
                a[i] += gpus * (hi - lo) / 3600
                u[i] += gpus * (hi - lo) / 3600
            i += 1

    def rounded(series: dict[str, list[float]]) -> dict[str, list[float]]:
        return {k: [round(h, 4) for h in v] for k, v in sorted(series.items())}

    return {"bucket_s": bucket, "start": t0, "buckets": n, "accounts": rounded(accounts), "users": rounded(users)}
