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
