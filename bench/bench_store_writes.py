#!/usr/bin/env python3
"""The store's write rate per node and per job, measured in PostgreSQL's own counters.

How much a site's store must write decides whether one PostgreSQL holds it (docs/SCALE.md,
"A large site's layout"). This starts a PostgreSQL (as the tests do: tests/integration/postgres.py),
one Shoal server on it with the default heartbeat interval and timeout, and one ``shoal agent
--hollow N`` process, and reads ``pg_stat_database`` (transactions committed, rows inserted,
updated, deleted) and ``pg_stat_wal`` (WAL records and bytes) of the server's database around:

1. idle: ``--window-s`` seconds of heartbeats and long-polls only;
2. busy: every GPU held by a long job (an array of N x 8 one-GPU tasks), then a window in
   which nothing starts or ends: what a full, steady cluster writes;
3. jobs: ``--jobs`` single-GPU jobs of 1 s submitted and run to their end on the idle
   cluster: the writes per job over its life (submit, start, end, accounting).

Hollow nodes send no GPU samples (they run nothing); a real agent's report on a busy node
carries them and each is one upsert of the run's ``job_gpu_usage`` row, stated beside the
measured figures. Counts, not times, so the machine's load does not change them.

    .venv/bin/python bench/bench_store_writes.py                 # 1,000 nodes
    .venv/bin/python bench/bench_store_writes.py --nodes 200 --window-s 30 --jobs 500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_foundation import load_average, machine_facts  # noqa: E402
from bench.bench_scale import GPUS, Hollow, _postgres  # noqa: E402
from tests.integration.cluster import wait_until  # noqa: E402

COUNTERS = ("xact_commit", "tup_inserted", "tup_updated", "tup_deleted", "wal_records", "wal_bytes")


def counters(pg, db: str) -> dict[str, int]:
    row = pg.psql("SELECT d.xact_commit, d.tup_inserted, d.tup_updated, d.tup_deleted, w.wal_records, w.wal_bytes "
                  f"FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = '{db}'")
    return dict(zip(COUNTERS, (int(x) for x in row.strip().split("|"))))


def delta(pg, db: str, before: dict[str, int]) -> dict[str, int]:
    pg.psql("SELECT pg_stat_force_next_flush()", database=db)  # the backends' counts are flushed lazily
    time.sleep(1.5)
    now = counters(pg, db)
    return {k: now[k] - before[k] for k in COUNTERS}


def live(h: Hollow) -> tuple[int, int]:
    jobs = h.admin.get("/shoal/v1/jobs", {"view": "queue"})["jobs"]
    return (sum(j["state"] == "PENDING" for j in jobs), sum(j["state"] == "RUNNING" for j in jobs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=2000)
    args = ap.parse_args()
    pg = _postgres()
    url = pg.create_database()
    db = url.rsplit("/", 1)[1]
    out: dict = {"nodes": args.nodes, "load_start": load_average()}
    with tempfile.TemporaryDirectory(prefix="store-writes-") as tmp:
        h = Hollow(Path(tmp), args.nodes, env=None, db=url)
        try:
            h.start()
            interval = h.fresh_stats(time.time()).get("heartbeat_interval_s") or 20.0
            out["heartbeat_interval_s"] = interval
            time.sleep(interval + 2)  # every node past its first heartbeat
            for phase in ("idle", "busy"):
                if phase == "busy":
                    h.admin.post("/shoal/v1/jobs", {"name": "fill", "script": "#!/bin/sh\nsleep 3600\n",
                                                    "workdir": tmp, "gpus_per_node": 1, "stdout": "/dev/null",
                                                    "array": f"0-{args.nodes * GPUS - 1}"})
                    wait_until(lambda: live(h) == (0, args.nodes * GPUS), 600, "every GPU to be held", interval=2)
                    time.sleep(interval + 2)
                before = counters(pg, db)
                time.sleep(args.window_s)
                d = delta(pg, db, before)
                out[phase] = {k: v / args.window_s for k, v in d.items()}
                print(phase, json.dumps(out[phase]), flush=True)
            h.admin.post("/shoal/v1/jobs/cancel", {"name": "fill"})  # scancel --name fill
            wait_until(lambda: live(h) == (0, 0), 600, "the cancelled fill to end", interval=2)
            time.sleep(interval + 2)
            before, t0 = counters(pg, db), time.time()
            for _ in range(args.jobs):
                h.admin.post("/shoal/v1/jobs", {"name": "w", "script": "#!/bin/sh\nsleep 1\n", "workdir": tmp,
                                                "gpus_per_node": 1, "stdout": "/dev/null"})
            wait_until(lambda: live(h) == (0, 0), 900, "the jobs to end", interval=1)
            d = delta(pg, db, before)
            span = time.time() - t0
            # The idle cluster's writes in the same span are the nodes', not the jobs'.
            out["jobs_span_s"] = span
            out["jobs"] = {k: (v - out["idle"][k] * span) / args.jobs for k, v in d.items()}
            print("per job", json.dumps(out["jobs"]), flush=True)
        except Exception:
            print((Path(tmp) / "server.log").read_text(errors="replace")[-6000:], file=sys.stderr)
            raise
        finally:
            h.stop()
            pg.stop()
    out["load_end"] = load_average()
    out["machine"] = machine_facts()
    print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
