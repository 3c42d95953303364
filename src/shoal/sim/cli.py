"""``shoal simulate``: replay a trace on a cluster file under several policies, side by side.

    shoal simulate --cluster cluster.yaml --trace cluster_log.csv --policy fifo,backfill \\
        --out sim-out --fail dgx007@6h+2h

A policy is a SchedConfig: ``NAME[:FIELD=VALUE...]`` (``backfill:max_jobs_per_pass=100``);
``--sched FIELD=VALUE`` sets a field for every policy. Prints a text table (or, with
``--json``, the JSON report) and writes report.json, report.txt, one jobs-POLICY.csv per
policy and the PNG plots to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from shoal.model.accounting import DEFAULT_QOS
from shoal.model.hostlist import HostlistError, expand
from shoal.model import timefmt
from shoal.model.timefmt import TimeFormatError
from shoal.sched import SchedConfig, SchedConfigError
from shoal.sim.cluster import SimCluster, SimClusterError, parse_sim_cluster
from shoal.sim.engine import Failure, SimResult, Simulator
from shoal.sim.report import PolicyReport, build_report, text_table
from shoal.sim.trace import FORMATS, TraceError, read_trace

class UsageError(ValueError):
    """A command-line value that cannot be used; the message says which and why."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shoal simulate",
        description="Replay a job trace on a simulated cluster with the server's own scheduler.",
    )
    p.add_argument("--cluster", required=True,
                   help="cluster file: the server's partitions plus sim_nodes (docs/SIMULATOR.md)")
    p.add_argument("--trace", required=True, help="job trace file")
    p.add_argument("--format", default="auto", choices=("auto", *FORMATS),
                   help="trace format (default: from the extension and header)")
    p.add_argument("--policy", default=None,
                   help="comma-separated policies, each NAME[:FIELD=VALUE...] "
                        "(default: fifo,backfill)")
    p.add_argument("--sched", action="append", default=[], metavar="FIELD=VALUE",
                   help="a SchedConfig field for every policy, e.g. max_jobs_per_pass=100")
    p.add_argument("--out", type=Path, help="directory for report.json, report.txt, CSVs and PNGs")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    p.add_argument("--limit", type=int, metavar="N", help="replay only the first N jobs")
    p.add_argument("--fail", action="extend", nargs="+", default=[], metavar="NODE@TIME[+DOWN]",
                   help="nodes (a hostlist) that go DOWN at TIME, for DOWN (default: for good); "
                        "times are seconds, 30m, 6h, 2d or Slurm's D-HH:MM:SS")
    p.add_argument("--requeue", action="store_true",
                   help="requeue jobs killed by a node failure (default: they end NODE_FAIL)")
    p.add_argument("--exact-limits", action="store_true",
                   help="jobs without a recorded time limit get their run time as limit "
                        "(default: the partition's DefaultTime/MaxTime)")
    p.add_argument("--qos-map", action="extend", nargs="+", default=[], metavar="NAME=QOS",
                   help="the QOS of a trace account's (vc, SWF group) or user's jobs; "
                        "NAME * for every other job (default: the default QOS)")
    p.add_argument("--signal", type=parse_duration, default=None, metavar="SECS",
                   help="every job as if submitted with --signal=@SECS: a preemption "
                        "victim's grace, at most scheduler.preempt_grace_s (default: none, 0)")
    p.add_argument("--progress", action="store_true",
                   help="show a progress bar even when stderr is not a terminal")
    p.add_argument("--no-plots", action="store_true", help="do not write PNGs to --out")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``shoal simulate ARGS``; returns the exit status."""
    args = parser().parse_args(argv)
    try:
        return _run(args)
    except (UsageError, SimClusterError, TraceError, SchedConfigError) as e:
        print(f"shoal simulate: error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    cluster = load_sim_cluster(args.cluster)
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    trace = read_trace(args.trace, args.format, args.limit)
    if not trace.jobs:
        raise UsageError(f"{args.trace}: no job in the trace can be replayed "
                         f"(skipped: {dict(trace.skipped) or 'none'})")
    failures = [parse_failure(spec) for spec in args.fail]
    qos_map = parse_qos_map(args.qos_map, {q.name for q in cluster.qos} | {DEFAULT_QOS})
    common = dict(parse_field(item) for item in args.sched)
    # The cluster file's priority: section gives every policy its multifactor weights.
    common.setdefault("multifactor", cluster.multifactor)
    policies = [parse_policy(spec, common)
                for spec in (args.policy or "fifo,backfill").split(",") if spec.strip()]
    show = args.progress or sys.stderr.isatty()
    results: list[SimResult] = []
    with _progress(show) as bar:
        for label, config in policies:
            task = bar.add(label, len(trace.jobs))
            results.append(Simulator(
                cluster, trace.jobs, config, label=label, failures=failures,
                requeue=args.requeue, exact_limits=args.exact_limits,
                progress=task, progress_every=500, qos_map=qos_map, signal_s=args.signal,
            ).run())
    reports = [build_report(r) for r in results]
    meta = {
        "cluster": {"name": cluster.name, "nodes": len(cluster.nodes), "gpus": cluster.total_gpus,
                    "cpus": cluster.total_cpus,
                    "partitions": [p.name for p in cluster.partitions]},
        "trace": {"file": str(args.trace), "format": trace.format, "jobs": len(trace.jobs),
                  "skipped": dict(trace.skipped)},
        "failures": [dataclasses.asdict(f) for f in failures],
        "requeue": args.requeue,
        "qos_map": qos_map,
    }
    title = f"{Path(args.trace).name} on {cluster.name} ({cluster.total_gpus} GPUs)"
    table = _header(meta) + "\n\n" + text_table(reports)
    payload = {**meta, "policies": [r.to_json(with_series=args.out is not None) for r in reports]}
    if args.out is not None:
        _write_out(args.out, payload, table, results, reports, title, plots=not args.no_plots)
    if args.json:
        json.dump(payload, sys.stdout, indent=2)
        print()
    else:
        print(table)
        if args.out is not None:
            print(f"\nwrote {args.out}/report.json, report.txt, jobs-*.csv"
                  + ("" if args.no_plots else ", utilisation.png, wait_cdf.png"))
    return 0


def load_sim_cluster(path: str | Path) -> SimCluster:
    """Read a cluster file (YAML, or JSON) and build the simulated cluster."""
    import yaml  # the CLI's only YAML need; pyyaml is a core dependency

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SimClusterError(f"cannot read cluster file {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise SimClusterError(f"{path} is not valid YAML: {e}") from None
    return parse_sim_cluster(data, str(path))


def parse_duration(text: str) -> float:
    """Seconds: ``90``, ``30m``, ``6h``, ``2d``, or Slurm's ``HH:MM:SS`` / ``D-HH:MM:SS``."""
    try:
        return timefmt.parse_duration(text)
    except TimeFormatError as e:
        raise UsageError(str(e)) from None


def parse_qos_map(items: Sequence[str], known: set[str]) -> dict[str, str]:
    """``--qos-map NAME=QOS ...``: the QOS per trace account or user (``*``: the rest)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, qos = item.partition("=")
        if not sep or not name.strip() or not qos.strip():
            raise UsageError(f"invalid --qos-map {item!r}: expected NAME=QOS (NAME an account, a user or *)")
        if qos.strip() not in known:
            raise UsageError(f"--qos-map {item!r}: the cluster file defines no QOS {qos.strip()!r}")
        out[name.strip()] = qos.strip()
    return out


def parse_failure(spec: str) -> Failure:
    """``dgx[001-004]@6h+30m``: those nodes go DOWN at 6 h for 30 min (no ``+``: for good)."""
    nodes, sep, when = spec.partition("@")
    if not sep or not nodes or not when:
        raise UsageError(f"invalid --fail {spec!r}: expected NODE@TIME or NODE@TIME+DOWNTIME")
    at, plus, down = when.partition("+")
    try:
        names = tuple(expand(nodes))
    except HostlistError as e:
        raise UsageError(f"invalid --fail {spec!r}: {e}") from None
    return Failure(names, parse_duration(at), parse_duration(down) if plus else None)


def parse_field(item: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` for a SchedConfig field, typed by the field's default."""
    name, sep, raw = item.partition("=")
    name = name.strip().replace("-", "_")
    fields = {f.name: f for f in dataclasses.fields(SchedConfig)}
    if not sep or name not in fields:
        raise UsageError(f"invalid scheduler setting {item!r}: expected FIELD=VALUE with FIELD one "
                         f"of {', '.join(fields)}")
    default = fields[name].default
    raw = raw.strip()
    if raw.lower() in ("none", "null", "unlimited"):
        return name, None
    if isinstance(default, bool):
        if raw.lower() not in ("true", "false", "yes", "no", "1", "0"):
            raise UsageError(f"{name} takes true or false, not {raw!r}")
        return name, raw.lower() in ("true", "yes", "1")
    if isinstance(default, (int, float)) or (default is None and re.fullmatch(r"-?\d+", raw)):
        try:
            return name, int(raw)
        except ValueError:
            try:
                return name, float(raw)
            except ValueError:
                raise UsageError(f"{name} takes a number, not {raw!r}") from None
    return name, raw


def parse_policy(spec: str, common: dict[str, Any]) -> tuple[str, SchedConfig]:
    """``backfill:max_jobs_per_pass=100`` -> (that label, its SchedConfig)."""
    label = spec.strip()
    name, *settings = label.split(":")
    values = {**common, "policy": name.strip()}
    values.update(parse_field(s) for s in settings)
    try:
        return label, SchedConfig(**values)
    except TypeError as e:
        raise UsageError(f"policy {label!r}: {e}") from None


def _header(meta: dict) -> str:
    c, t = meta["cluster"], meta["trace"]
    skipped = ", ".join(f"{v} {k}" for k, v in t["skipped"].items())
    lines = [f"Cluster {c['name']}: {c['nodes']} nodes, {c['gpus']} GPUs, {c['cpus']} CPUs; "
             f"partitions {', '.join(c['partitions'])}",
             f"Trace {t['file']} ({t['format']}): {t['jobs']} jobs"
             + (f" (skipped: {skipped})" if skipped else "")]
    for f in meta["failures"]:
        down = "for good" if f["down_for"] is None else f"for {f['down_for']:.0f}s"
        lines.append(f"Failure: {len(f['nodes'])} node(s) DOWN at {f['at']:.0f}s {down}"
                     + (" (jobs requeued)" if meta["requeue"] else ""))
    return "\n".join(lines)


def _write_out(out: Path, payload: dict, table: str, results: Sequence[SimResult],
               reports: Sequence[PolicyReport], title: str, plots: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    (out / "report.txt").write_text(table + "\n", encoding="utf-8")
    for result in results:
        safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", result.label)
        with open(out / f"jobs-{safe}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["id", "name", "user", "account", "partition", "gpus", "cpus", "submit",
                        "start", "end", "state", "requeues", "reason"])
            for j in result.jobs:
                w.writerow([j.id, j.name, j.user, j.account, j.partition, j.gpus, j.cpus, j.submit,
                            j.first_start, j.end, j.state.value if j.state else "", j.requeues,
                            j.reason or ""])
    if plots:
        from shoal.sim.plots import write_plots

        write_plots(list(reports), out, title)


class _progress:
    """A rich progress bar on stderr (one line per policy), or nothing at all."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self.bar = None

    def __enter__(self) -> "_progress":
        if self.show:
            try:
                from rich.console import Console
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                           TimeElapsedColumn)
            except ImportError:
                return self
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("jobs ended  virtual {task.fields[vt]}"),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=False)
            self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def add(self, label: str, total: int):
        if self.bar is None:
            return None
        bar = self.bar
        task = bar.add_task(label, total=total, vt="0.0h")

        def update(now: float, finished: int, _total: int) -> None:
            bar.update(task, completed=finished, vt=f"{now / 3600:.1f}h")

        return update
