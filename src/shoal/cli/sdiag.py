"""sdiag: the scheduler's statistics since the server started, in Slurm's sdiag layout.

``render_diag(doc)`` is pure; ``main`` fetches GET /shoal/v1/diag. Shoal's quick passes are
Slurm's main scheduler, its full passes (which plan start times) its backfill.
"""

from __future__ import annotations

import sys
import time


def _when(epoch: float) -> str:
    return f"{time.strftime('%a %b %d %H:%M:%S %Y', time.localtime(epoch))} ({int(epoch)})"


def _us(seconds: float) -> int:
    return int(seconds * 1_000_000)


def _all_passes(quick: dict, full: dict) -> dict:
    """Every pass tries starts in queue order, as Slurm's main scheduler does: both kinds' figures."""
    main = {k: quick[k] + full[k] for k in ("count", "started", "sum_s", "depth_sum", "queue_sum")}
    main["max_s"] = max(quick["max_s"], full["max_s"])
    latest = full if (full["last_when"] or 0) > (quick["last_when"] or 0) else quick
    main.update(last_s=latest["last_s"], last_queue=latest["last_queue"])
    return main


def render_diag(doc: dict, latency_us: int = 0) -> str:
    main, bf = _all_passes(doc["cycles"]["quick"], doc["cycles"]["full"]), doc["cycles"]["full"]
    elapsed = doc["now"] - doc["since"]
    lines = [
        "*******************************************************",
        f"sdiag output at {_when(doc['now'])}",
        f"Data since      {_when(doc['since'])}",
        "*******************************************************",
        "Server thread count:  1", "Agent queue size:     0", "Agent count:          0",
        "Agent thread count:   0", "DBD Agent queue size: 0", "",
        f"Jobs submitted: {doc['submitted']}", f"Jobs started:   {doc['started']}",
        f"Jobs completed: {doc['completed']}", f"Jobs canceled:  {doc['canceled']}",
        f"Jobs failed:    {doc['failed']}", "",
        f"Job states ts:  {_when(doc['now'])}", f"Jobs pending:   {doc['pending']}",
        f"Jobs running:   {doc['running']}", "",
        "Main schedule statistics (microseconds):",
        f"\tLast cycle:   {_us(main['last_s'])}", f"\tMax cycle:    {_us(main['max_s'])}",
        f"\tTotal cycles: {main['count']}",
    ]
    if main["count"]:
        lines += [f"\tMean cycle:   {_us(main['sum_s'] / main['count'])}",
                  f"\tMean depth cycle:  {main['depth_sum'] // main['count']}"]
    if elapsed > 60:
        lines.append(f"\tCycles per minute: {int(main['count'] / (elapsed / 60))}")
    lines += [f"\tLast queue length: {main['last_queue']}", "",
              "Backfilling stats",
              f"\tTotal backfilled jobs (since last slurm start): {bf['started']}",
              f"\tTotal backfilled jobs (since last stats cycle start): {bf['started']}",
              "\tTotal backfilled heterogeneous job components: 0",
              f"\tTotal cycles: {bf['count']}",
              f"\tLast cycle when: {_when(bf['last_when']) if bf['last_when'] else 'N/A'}",
              f"\tLast cycle: {_us(bf['last_s'])}", f"\tMax cycle:  {_us(bf['max_s'])}"]
    if bf["count"]:
        lines.append(f"\tMean cycle: {_us(bf['sum_s'] / bf['count'])}")
    lines += [f"\tLast depth cycle: {bf['last_depth']}", f"\tLast depth cycle (try sched): {bf['last_depth']}"]
    if bf["count"]:
        lines += [f"\tDepth Mean: {bf['depth_sum'] // bf['count']}",
                  f"\tDepth Mean (try depth): {bf['depth_sum'] // bf['count']}"]
    lines.append(f"\tLast queue length: {bf['last_queue']}")
    if bf["count"]:
        lines.append(f"\tQueue length mean: {bf['queue_sum'] // bf['count']}")
    lines += ["\tLast table size: 0"]
    if bf["count"]:
        lines.append("\tMean table size: 0")
    lines += ["", f"Latency for 1000 calls to gettimeofday(): {latency_us} microseconds", "",
              "Remote Procedure Call statistics by message type"]
    for r in doc.get("requests", ()):
        lines.append(f"\t{r['route']:<40}( {0:4d}) count:{r['count']:<6d} ave_time:{r['mean_us']:<6d} "
                     f"total_time:{r['total_us']}")
    return "".join(line + "\n" for line in lines)


def _latency_us() -> int:
    t0 = time.perf_counter()
    for _ in range(1000):
        time.time()
    return int((time.perf_counter() - t0) * 1_000_000)


def main(argv: list[str] | None = None) -> int:
    from shoal.api_client import Client, ClientError, fail
    from shoal.slurm.fmt import argument_parser, emit

    p = argument_parser("sdiag", "Scheduling statistics, as Slurm's sdiag.")
    p.add_argument("-a", "--all", action="store_true", help="all statistics (the default)")
    p.add_argument("-r", "--reset", action="store_true", help="reset the counters (not kept: refused)")
    p.add_argument("--help", action="help", help="show this help and exit")
    options = p.parse_args(sys.argv[1:] if argv is None else argv)
    if options.reset:
        fail("--reset: the statistics run from the server's start and are not reset")
    try:
        emit(render_diag(Client.from_config().get("/shoal/v1/diag"), _latency_us()))
    except ClientError as e:
        fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
