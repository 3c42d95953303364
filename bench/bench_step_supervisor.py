#!/usr/bin/env python3
"""What an srun task's step supervisor adds to its start (docs/FENCING.md): the step server's
spawn of `/bin/true` and its end, plain and under the supervisor, interleaved call by call.

    .venv/bin/python bench/bench_step_supervisor.py                     # shoal-stepd --step
    SHOAL_STEPD=python .venv/bin/python bench/bench_step_supervisor.py  # the Python one
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from shoal.agent import supervise
from shoal.agent.identity import spawn


def main(n: int = 200) -> None:
    lease = Path(tempfile.mkdtemp()) / supervise.LEASE
    supervise.write_lease(lease, supervise.Lease(supervise.boottime() + 3600, 1.0, 1.0))
    env = {"PATH": os.environ["PATH"]}
    step = supervise.step_command(lease)
    kinds = {"plain": [], f"under {'shoal-stepd' if supervise.stepd() else 'the Python'} step supervisor": step}
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, float] = dict.fromkeys(kinds, 0.0)
    for _ in range(n):
        for name, prefix in kinds.items():
            before, t = os.times(), time.perf_counter()
            p = spawn([*prefix, "/bin/true"], identity=None, env=env, cwd="/",
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            p.communicate()
            wall[name].append(time.perf_counter() - t)
            after = os.times()
            cpu[name] += after.children_user + after.children_system - before.children_user - before.children_system
    for name in kinds:
        print(f"{name:40s} median {statistics.median(wall[name]) * 1000:6.2f} ms a task, "
              f"its processes' CPU {cpu[name] / n * 1000:6.2f} ms")


if __name__ == "__main__":
    main()
