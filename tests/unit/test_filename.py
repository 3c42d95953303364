"""Output file names from Slurm's filename patterns."""

from shoal.model.filename import NO_VAL, expand_pattern

JOB = dict(job_id=1234, job_name="train", user="alice", node="gpu07.cluster")


def test_the_default_output_name():
    assert expand_pattern("slurm-%j.out", **JOB) == "slurm-1234.out"


def test_an_array_task_writes_to_its_own_file():
    assert expand_pattern("slurm-%A_%a.out", **JOB, array_job_id=1200, array_task_id=34) == "slurm-1200_34.out"


def test_outside_an_array_percent_A_is_the_job_and_percent_a_is_slurms_no_val():
    assert expand_pattern("%A_%a", **JOB) == f"1234_{NO_VAL}"
    assert NO_VAL == 4294967294


def test_user_name_node_and_short_hostname():
    assert expand_pattern("%u/%x-%N.log", **JOB) == "alice/train-gpu07.log"


def test_step_task_and_node_index():
    assert expand_pattern("%J-%s-%t-%n", **JOB, step_id=2, task_id=5, node_index=1) == "1234.2-2-5-1"
    assert expand_pattern("%J-%s-%t-%n", **JOB) == "1234-batch-0-0"


def test_a_width_zero_pads_numbers_and_is_ignored_for_text():
    assert expand_pattern("%8j %3a %4u %4N", **JOB, array_job_id=1, array_task_id=7) == "00001234 007 alice gpu07"


def test_widths_above_ten_are_capped_at_ten():
    assert expand_pattern("%15j", **JOB) == "0000001234"
    assert expand_pattern("%005j", **JOB) == "01234"


def test_double_percent_is_a_literal_percent():
    assert expand_pattern("100%%-%j", **JOB) == "100%-1234"


def test_unknown_fields_and_a_trailing_percent_stay_as_written():
    assert expand_pattern("%q-%j-%", **JOB) == "%q-1234-%"


def test_array_task_modulo_ten():
    assert expand_pattern("%b", **JOB, array_job_id=1, array_task_id=37) == "7"


def test_a_backslash_turns_substitution_off():
    assert expand_pattern("out\\%j", **JOB) == "out%j"
