"""A step that reaches a node before the run it belongs to waits for it (stepserver.known_run):
srun sees its job RUNNING once the scheduling pass has committed, the node's agent only once
the pass's wake-up reaches its long-poll."""

from __future__ import annotations

import threading
import time

from shoal.agent.runtime import Runtime
from shoal.agent.stepserver import known_run


def test_a_step_waits_for_a_run_the_agent_hears_of_a_moment_later_and_gives_up_on_one_it_never_does(tmp_path):
    runtime = Runtime("node01", tmp_path, on_exit=lambda *a, **k: None)
    threading.Timer(0.3, runtime.ensure, args=("7.0", 7, 0)).start()
    t0 = time.monotonic()
    run = known_run(runtime, "7.0", 5.0)
    assert run is not None and run.job_id == 7 and time.monotonic() - t0 >= 0.25
    t0 = time.monotonic()
    assert known_run(runtime, "8.0", 0.3) is None and time.monotonic() - t0 >= 0.3
