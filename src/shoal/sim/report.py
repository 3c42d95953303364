"""What a replay achieved: completion time, queueing delay, utilisation, fair share.

* Job completion time (JCT) is ``end - submit`` of jobs that ended; queueing delay is
  ``first start - submit`` of jobs that started. Percentiles are nearest-rank.
* Makespan is the last end (virtual time starts at the first submit, 0).
* Utilisation is resource-seconds held by runs (killed runs included) over capacity x
  makespan, for GPUs and CPUs; the series averages it over equal time bins.
* Fair share, per account (vc, SWF group, or user): the account's share of the
  resource-seconds submitted (GPUs x min(run time, limit)) against its share of those
  delivered while jobs were still arriving (``0..last submit``), when a queue makes
  policies differ; ``ratio`` 1.0 is fair. ``jain`` is Jain's index of the ratios.
  The resource is GPUs when the cluster and trace have any, else CPUs.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from shoal.model.timefmt import format_duration
from shoal.sim.engine import Run, SimResult


@dataclass(frozen=True)
class Stats:
    count: int
    mean: float
    median: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> "Stats":
        if not values:
            return cls(0, 0.0, 0.0, 0.0, 0.0)
        xs = sorted(values)
        return cls(len(xs), sum(xs) / len(xs), percentile(xs, 50), percentile(xs, 99), xs[-1])


@dataclass(frozen=True)
class AccountShare:
    account: str
    jobs: int
    submitted: float  # resource-seconds asked for
    received: float  # resource-seconds delivered in 0..last submit
    submitted_share: float
    received_share: float
    ratio: float
    mean_wait_s: float


@dataclass
class PolicyReport:
    label: str
    policy: str
    jobs: int
    states: dict[str, int]
    rejected: int
    never_started: int
    jct: Stats
    wait: Stats
    makespan_s: float
    gpu_utilisation: float
    cpu_utilisation: float
    share_resource: str
    shares: list[AccountShare]
    jain: float
    passes: int
    wall_s: float
    preemptions: int = 0  # runs stopped by preemption (requeued or ended PREEMPTED)
    series_t: list[float] = field(default_factory=list)  # bin starts, seconds
    series_gpu: list[float] = field(default_factory=list)  # utilisation per bin, 0..1
    series_cpu: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)  # every queueing delay, for CDFs
    adjusted: dict[str, int] = field(default_factory=dict)

    def to_json(self, with_series: bool = True) -> dict:
        out = asdict(self)
        out.pop("waits")
        if not with_series:
            for key in ("series_t", "series_gpu", "series_cpu"):
                out.pop(key)
        return out


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def build_report(result: SimResult, bins: int = 200) -> PolicyReport:
    jobs = result.jobs
    ended = [j for j in jobs if j.end is not None and j.state is not None]
    started = [j for j in jobs if j.first_start is not None]
    waits = [j.first_start - j.submit for j in started]  # type: ignore[operator]
    makespan = max((j.end for j in ended), default=0.0)  # type: ignore[type-var]
    makespan = max(makespan, max((r.end for r in result.runs), default=0.0))
    gpus, cpus = result.cluster.total_gpus, result.cluster.total_cpus
    gpu_s = sum((r.end - r.start) * r.gpus for r in result.runs)
    cpu_s = sum((r.end - r.start) * r.cpus for r in result.runs)
    use_gpus = gpus > 0 and any(j.gpus for j in jobs)
    series_t, series_gpu = utilisation_series(result.runs, gpus, makespan, bins, "gpus")
    _, series_cpu = utilisation_series(result.runs, cpus, makespan, bins, "cpus")
    shares = fair_shares(result, "gpus" if use_gpus else "cpus")
    ratios = [s.ratio for s in shares if s.submitted > 0]
    jain = (sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios))) if any(ratios) else 1.0
    return PolicyReport(
        label=result.label,
        policy=result.config.policy,
        jobs=len(jobs),
        states=dict(sorted(Counter(j.state.value for j in ended).items())),
        rejected=sum(1 for j in jobs if j.reason and j.reason.startswith("rejected")),
        never_started=sum(1 for j in jobs if j.state is None and j.first_start is None
                          and not (j.reason or "").startswith("rejected")),
        jct=Stats.of([j.end - j.submit for j in ended]),  # type: ignore[operator]
        wait=Stats.of(waits),
        makespan_s=makespan,
        gpu_utilisation=gpu_s / (gpus * makespan) if gpus and makespan else 0.0,
        cpu_utilisation=cpu_s / (cpus * makespan) if cpus and makespan else 0.0,
        share_resource="gpu" if use_gpus else "cpu",
        shares=shares,
        jain=jain,
        passes=result.passes,
        wall_s=result.wall_s,
        preemptions=sum(j.preempted for j in jobs),
        series_t=series_t,
        series_gpu=series_gpu,
        series_cpu=series_cpu,
        waits=waits,
        adjusted=result.adjusted,
    )


def utilisation_series(runs: list[Run], capacity: int, horizon: float, bins: int,
                       what: str) -> tuple[list[float], list[float]]:
    """Mean utilisation in each of ``bins`` equal bins of 0..horizon (exact integrals)."""
    if not capacity or horizon <= 0 or bins <= 0:
        return [], []
    steps: list[tuple[float, int]] = []
    for r in runs:
        amount = getattr(r, what)
        if amount and r.end > r.start:
            steps.append((r.start, amount))
            steps.append((r.end, -amount))
    steps.sort()
    width = horizon / bins
    edges = [k * width for k in range(bins + 1)]
    area = [0.0] * bins
    level, last, k = 0, 0.0, 0
    for t, delta in steps + [(horizon, 0)]:
        while k < bins and edges[k + 1] <= t:  # close the bins that end before t
            area[k] += level * (edges[k + 1] - max(last, edges[k]))
            last = edges[k + 1]
            k += 1
        if k < bins:
            area[k] += level * (t - max(last, edges[k]))
        last, level = t, level + delta
    return edges[:-1], [a / (capacity * width) for a in area]


def fair_shares(result: SimResult, what: str) -> list[AccountShare]:
    window = result.last_submit
    submitted: dict[str, float] = defaultdict(float)
    received: dict[str, float] = defaultdict(float)
    counts: Counter = Counter()
    waits: dict[str, list[float]] = defaultdict(list)
    account_of = {}
    for j in result.jobs:
        account = j.account or j.user
        account_of[j.id] = account
        counts[account] += 1
        if j.reason and j.reason.startswith("rejected"):
            continue
        run = min(j.duration, j.time_limit_s) if j.time_limit_s is not None else j.duration
        submitted[account] += run * (j.gpus if what == "gpus" else j.cpus)
        if j.first_start is not None:
            waits[account].append(j.first_start - j.submit)
    for r in result.runs:
        overlap = min(r.end, window) - r.start
        if overlap > 0:
            received[account_of[r.job_id]] += overlap * getattr(r, what)
    total_sub = sum(submitted.values()) or 1.0
    total_rec = sum(received.values()) or 1.0
    out = []
    for account in sorted(counts, key=lambda a: (-submitted[a], a)):
        sub_share = submitted[account] / total_sub
        rec_share = received[account] / total_rec
        w = waits[account]
        out.append(AccountShare(
            account=account, jobs=counts[account], submitted=submitted[account],
            received=received[account], submitted_share=sub_share, received_share=rec_share,
            ratio=rec_share / sub_share if sub_share else 0.0,
            mean_wait_s=sum(w) / len(w) if w else 0.0,
        ))
    return out


def text_table(reports: list[PolicyReport], accounts: int = 8) -> str:
    """Policies side by side, then the fair-share outcome of the biggest accounts."""
    def dur(x: float) -> str:
        return format_duration(x) if x >= 1 or x == 0 else f"{x:.2f}s"

    rows: list[tuple[str, list[str]]] = [
        ("jobs", [str(r.jobs) for r in reports]),
        ("ended (by state)", [" ".join(f"{k}={v}" for k, v in r.states.items()) or "-" for r in reports]),
        ("rejected at submit", [str(r.rejected) for r in reports]),
        ("never started", [str(r.never_started) for r in reports]),
        ("preemptions", [str(r.preemptions) for r in reports]),
        ("JCT mean", [dur(r.jct.mean) for r in reports]),
        ("JCT median", [dur(r.jct.median) for r in reports]),
        ("JCT p99", [dur(r.jct.p99) for r in reports]),
        ("wait mean", [dur(r.wait.mean) for r in reports]),
        ("wait median", [dur(r.wait.median) for r in reports]),
        ("wait p99", [dur(r.wait.p99) for r in reports]),
        ("makespan", [dur(r.makespan_s) for r in reports]),
        ("GPU utilisation", [f"{100 * r.gpu_utilisation:.1f}%" for r in reports]),
        ("CPU utilisation", [f"{100 * r.cpu_utilisation:.1f}%" for r in reports]),
        ("fair share (Jain)", [f"{r.jain:.3f}" for r in reports]),
        ("scheduling passes", [str(r.passes) for r in reports]),
        ("replay wall time", [f"{r.wall_s:.2f}s" for r in reports]),
    ]
    lines = _grid(["metric"] + [r.label for r in reports], [[name, *vals] for name, vals in rows])
    if reports and reports[0].shares:
        res = reports[0].share_resource.upper()
        top = [s.account for s in reports[0].shares[:accounts]]
        head = ["account", "jobs", f"submitted {res}-s"] + [f"{r.label} recv/ratio" for r in reports]
        body = []
        for account in top:
            first = next(s for s in reports[0].shares if s.account == account)
            cells = [account, str(first.jobs), f"{100 * first.submitted_share:.1f}%"]
            for r in reports:
                s = next((x for x in r.shares if x.account == account), None)
                cells.append(f"{100 * s.received_share:.1f}% / {s.ratio:.2f}" if s else "-")
            body.append(cells)
        lines += ["", f"Fair share ({res}-seconds received while jobs arrived vs submitted; "
                      f"ratio 1.00 is fair), top {len(top)} accounts:"]
        lines += _grid(head, body)
    return "\n".join(lines)


def _grid(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda cells: "  ".join(  # noqa: E731
        (c.ljust(w) if i == 0 else c.rjust(w)) for i, (c, w) in enumerate(zip(cells, widths)))
    return [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]
