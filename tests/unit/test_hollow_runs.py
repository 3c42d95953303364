"""How long a hollow node's run lasts, read from its batch entry (shoal.agent.hollow)."""

from shoal.agent.hollow import run_length


def test_a_wrapped_sleep_lasts_its_seconds_and_exits_zero():
    assert run_length({"script": "#!/bin/sh\n# This script was created by sbatch --wrap\nsleep 30\n"}, 1.0) == (30.0, 0)


def test_sleeps_add_up_with_their_units_and_the_last_exit_gives_the_code():
    assert run_length({"script": "#!/bin/bash\nsleep 1m\necho hi; sleep 0.5\nexit 4\n"}, 1.0) == (60.5, 4)


def test_the_environment_names_a_trace_runtime_and_no_sleep_takes_the_default():
    assert run_length({"script": "sleep 9", "environment": {"SHOAL_HOLLOW_RUNTIME": "120"}}, 1.0) == (120.0, 0)
    assert run_length({"script": "#!/bin/sh\nhostname\n"}, 2.5) == (2.5, 0)
    assert run_length({"script": "python train.py --sleep 5"}, 2.5) == (2.5, 0)  # an option's word, not a command


def test_a_new_window_of_round_trips_asked_for_while_the_stats_are_being_read_does_not_hang():
    """The benchmarks' SIGUSR1 runs its handler in the main thread, which writes the stats
    file once a second holding the stats' lock: the handler must not wait for that lock."""
    import os
    import signal

    from shoal.agent.hollow import HollowStats

    stats = HollowStats()
    stats.latencies.extend([0.1, 0.2])

    def hung(signum, frame):
        raise AssertionError("the handler waited for the lock its own thread holds")

    before = signal.signal(signal.SIGUSR1, lambda signum, frame: stats.reset_latencies())
    alarm = signal.signal(signal.SIGALRM, hung)  # a lock's wait is interrupted by a handler that raises
    try:
        signal.setitimer(signal.ITIMER_REAL, 5)
        with stats.lock:  # as as_json holds it
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs here, in this thread
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert stats.as_json()["report_latency_s"]["n"] == 0
        stats.latencies.append(0.3)
        assert stats.as_json()["report_latency_s"] == {"n": 1, "p50": 0.3, "p99": 0.3, "max": 0.3}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGUSR1, before)
        signal.signal(signal.SIGALRM, alarm)
