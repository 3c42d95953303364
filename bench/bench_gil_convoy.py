#!/usr/bin/env python3
"""What reading rows from SQLite costs a thread while another thread computes (a scheduling
pass, in the server): the sqlite3 module gives the GIL up around each row's step and waits for
it back, so a read of N rows waits N times behind the busy thread, while pure Python beside it
only shares the interpreter. This is why sinfo's, scontrol's and squeue's reads of the store
slow down in the rounds a pass overlaps (docs/SCALE.md, "squeue's first round"). Prints, for
ROWS rows, the read alone and beside a busy thread, ROUNDS times each (medians), with the
interpreter's switch interval as the server sets it.

    .venv/bin/python bench/bench_gil_convoy.py 5000 5    # ROWS ROUNDS
"""

import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from shoal.server import interpreter

ROWS, ROUNDS = int(sys.argv[1]), int(sys.argv[2])
interpreter.set_for_server()
with tempfile.TemporaryDirectory() as tmp:
    db = sqlite3.connect(Path(tmp) / "rows.db", check_same_thread=False)
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, b TEXT)")
    db.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, "x" * 20, "y" * 20) for i in range(ROWS)])
    db.commit()

    def read_ms() -> float:
        t = time.perf_counter()
        db.execute("SELECT * FROM t").fetchall()
        return 1000 * (time.perf_counter() - t)

    def python_ms() -> float:
        t = time.perf_counter()
        sum(range(ROWS * 200))
        return 1000 * (time.perf_counter() - t)

    alone = [read_ms() for _ in range(ROUNDS)], [python_ms() for _ in range(ROUNDS)]
    stop = threading.Event()

    def busy() -> None:
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i

    thread = threading.Thread(target=busy)
    thread.start()
    time.sleep(0.05)
    beside = [read_ms() for _ in range(ROUNDS)], [python_ms() for _ in range(ROUNDS)]
    stop.set()
    thread.join()
    db.close()
print(f"{ROWS} rows read from SQLite: alone {statistics.median(alone[0]):.1f} ms, beside a busy thread "
      f"{statistics.median(beside[0]):.1f} ms; pure Python of about the same length: alone "
      f"{statistics.median(alone[1]):.1f} ms, beside it {statistics.median(beside[1]):.1f} ms "
      f"(medians of {ROUNDS}; switch interval {sys.getswitchinterval() * 1000:g} ms)")
