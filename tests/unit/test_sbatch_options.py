"""sbatch and srun command lines and #SBATCH scripts as users write them."""

import base64
import hashlib
from datetime import datetime

import pytest
from hypothesis import given, strategies as st

from shoal.slurm.options import (
    NOT_A_BATCH_SCRIPT,
    OPTIONS,
    OptionError,
    parse_sbatch,
    parse_srun,
    script_source,
)

ENV = {"HOME": "/home/alice", "PATH": "/usr/bin:/bin", "SLURM_CONF": "/etc/slurm.conf", "LANG": "C"}
NOW = datetime(2026, 3, 10, 14, 30).timestamp()
SCRIPT = "#!/bin/bash\nsrun hostname\n"


def sbatch(argv, script=SCRIPT, environ=ENV):
    return parse_sbatch(argv, script, cwd="/home/alice/run", environ=environ, now=NOW)


def body(argv, script=SCRIPT, environ=ENV):
    return sbatch(argv, script, environ).body


def error(argv, script=SCRIPT, environ=ENV) -> str:
    with pytest.raises(OptionError) as info:
        sbatch(argv, script, environ)
    return str(info.value)


def test_a_plain_submission_names_the_job_after_the_script_and_passes_its_arguments():
    b = body(["train.sh", "--lr", "0.1"])
    assert b == {
        "name": "train.sh",
        "script": SCRIPT,
        "script_sha256": hashlib.sha256(SCRIPT.encode()).hexdigest(),
        "argv": ["--lr", "0.1"],
        "workdir": "/home/alice/run",
        "environment": ENV,
    }


def test_a_script_from_standard_input_is_called_sbatch():
    assert body([])["name"] == "sbatch"


def test_a_training_job_across_two_gpu_nodes():
    b = body(["-N2", "--ntasks-per-node=8", "-c12", "--gpus-per-node=a100:8", "-t", "1-00:00:00",
              "-J", "llm", "-p", "gpu-a100", "--exclusive", "train.sh"])
    assert {k: b[k] for k in ("nodes", "ntasks_per_node", "cpus_per_task", "gpus_per_node", "gpu_type",
                              "time_limit_s", "name", "partition", "exclusive")} == {
        "nodes": 2, "ntasks_per_node": 8, "cpus_per_task": 12, "gpus_per_node": 8, "gpu_type": "a100",
        "time_limit_s": 86400, "name": "llm", "partition": "gpu-a100", "exclusive": True,
    }


def test_long_options_take_their_value_after_an_equals_sign_or_as_the_next_word():
    assert body(["--ntasks=16", "x.sh"])["ntasks"] == 16
    assert body(["--ntasks", "16", "x.sh"])["ntasks"] == 16
    assert body(["-n16", "x.sh"])["ntasks"] == 16
    assert body(["-n", "16", "x.sh"])["ntasks"] == 16


def test_an_unambiguous_prefix_of_a_long_option_works_as_in_getopt():
    assert body(["--part=debug", "x.sh"])["partition"] == "debug"
    assert "ambiguous" in error(["--gpus-per=2", "x.sh"])


def test_clustered_short_flags():
    b = body(["-HW", "x.sh"])
    assert b["hold"] is True
    assert sbatch(["-HW", "x.sh"]).wait is True


def test_node_range_sets_the_minimum_and_maximum():
    b = body(["--nodes=2-4", "x.sh"])
    assert (b["nodes"], b["nodes_max"]) == (2, 4)
    assert "nodes_max" not in body(["-N", "3", "x.sh"])


@pytest.mark.parametrize(
    "gres, expected",
    [
        ("gpu", {"gpus_per_node": 1}),
        ("gpu:4", {"gpus_per_node": 4}),
        ("gpu:h100:8", {"gpus_per_node": 8, "gpu_type": "h100"}),
        ("gpu:a100", {"gpus_per_node": 1, "gpu_type": "a100"}),
    ],
)
def test_gres_gpu_forms(gres, expected):
    b = body([f"--gres={gres}", "x.sh"])
    assert {k: b[k] for k in ("gpus_per_node", "gpu_type") if k in b} == expected


def test_other_gres_are_refused_by_name():
    assert error(["--gres=gpu:2,nic:1", "x.sh"]) == (
        "invalid --gres value 'gpu:2,nic:1': gres 'nic' is not available: Shoal schedules only "
        "gpu gres (gpu, gpu:N or gpu:type:N)"
    )


def test_total_and_per_task_gpus():
    assert body(["-G", "16", "x.sh"])["gpus"] == 16
    b = body(["--gpus=a100:4", "--gpus-per-task=1", "x.sh"])
    assert (b["gpus"], b["gpu_type"], b["gpus_per_task"]) == (4, "a100", 1)


@pytest.mark.parametrize(
    "mem, mb", [("4096", 4096), ("500M", 500), ("16G", 16384), ("2t", 2097152), ("1536K", 2), ("0", 0)]
)
def test_memory_units_default_to_megabytes_and_zero_means_all(mem, mb):
    assert body([f"--mem={mem}", "x.sh"])["mem_per_node_mb"] == mb


def test_mem_and_mem_per_cpu_exclude_each_other_in_one_place():
    assert error(["--mem=1G", "--mem-per-cpu=2G", "x.sh"]) == "--mem and --mem-per-cpu are mutually exclusive"
    script = "#!/bin/sh\n#SBATCH --mem=1G\n#SBATCH --mem-per-cpu=1G\n"
    assert "mutually exclusive" in error(["x.sh"], script)


def test_mem_per_cpu_on_the_command_line_replaces_mem_in_the_script():
    b = body(["--mem-per-cpu=2G", "x.sh"], "#!/bin/sh\n#SBATCH --mem=64G\n")
    assert b["mem_per_cpu_mb"] == 2048 and "mem_per_node_mb" not in b


def test_bad_time_says_which_forms_are_accepted():
    assert error(["--time=7x", "x.sh"]) == (
        "Invalid --time specification '7x': expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
    )


def test_unlimited_time_is_sent_as_minus_one():
    assert body(["-t", "UNLIMITED", "x.sh"])["time_limit_s"] == -1  # UNLIMITED on the wire


def test_hold_requeue_and_their_opposites():
    assert body(["-H", "--requeue", "x.sh"])["requeue"] is True
    assert body(["--requeue", "--no-requeue", "x.sh"])["requeue"] is False


def test_array_dependency_and_begin_are_normalised():
    b = body(["--array=0-15:4%2", "-d", "afterok:12:13_2", "--begin=now+1hour", "x.sh"])
    assert b["array"] == "0,4,8,12%2"
    assert b["dependency"] == "afterok:12:13"
    assert b["begin_time"] == NOW + 3600


def test_hostlists_are_checked_and_compressed():
    b = body(["-w", "node03,node01,node02", "-x", "gpu[1-2]", "x.sh"])
    assert (b["nodelist"], b["exclude"]) == ("node[01-03]", "gpu[1-2]")
    assert "unclosed '['" in error(["--nodelist=node[1-2", "x.sh"])


def test_constraint_account_qos_comment():
    b = body(["-C", "a100&ib", "-A", "proj1", "-q", "high", "--comment", "ablation 3", "x.sh"])
    assert (b["constraint"], b["account"], b["qos"], b["comment"]) == ("a100&ib", "proj1", "high", "ablation 3")


def test_mail_options_are_accepted_and_ignored():
    b = body(["--mail-type=END,FAIL", "--mail-user=a@b.c", "x.sh"])
    assert not any(k.startswith("mail") for k in b)


@pytest.mark.parametrize(
    "signal, normal",
    [("B:USR1@60", "B:USR1@60"), ("USR2", "USR2@60"), ("sigterm@120", "TERM@120"), ("10@5", "10@5"),
     ("R:INT", "R:INT@60")],
)
def test_signal_forms(signal, normal):
    assert body([f"--signal={signal}", "x.sh"])["signal"] == normal


def test_bad_signal():
    assert "expected [{R|B}:]<signal>[@seconds]" in error(["--signal=X:USR1", "x.sh"])
    assert "1 to 64" in error(["--signal=99", "x.sh"])


def test_output_error_input_and_open_mode():
    b = body(["-o", "logs/%x-%j.out", "-e", "logs/%x-%j.err", "-i", "in.txt", "--open-mode=append", "x.sh"])
    assert (b["stdout"], b["stderr"], b["stdin"], b["open_mode"]) == (
        "logs/%x-%j.out", "logs/%x-%j.err", "in.txt", "append")
    assert "append or truncate" in error(["--open-mode=sometimes", "x.sh"])


def test_chdir_is_resolved_against_the_current_directory():
    assert body(["-D", "../data", "x.sh"])["workdir"] == "/home/alice/data"
    assert body(["--chdir=/scratch/a", "x.sh"])["workdir"] == "/scratch/a"


def test_export_none_keeps_only_slurm_variables():
    assert body(["--export=NONE", "x.sh"])["environment"] == {"SLURM_CONF": "/etc/slurm.conf"}


def test_export_all_with_additions():
    env = body(["--export=ALL,OMP_NUM_THREADS=4", "x.sh"])["environment"]
    assert env == {**ENV, "OMP_NUM_THREADS": "4"}


def test_export_named_variables_only():
    env = body(["--export=LANG,MODE=fast,MISSING", "x.sh"])["environment"]
    assert env == {"SLURM_CONF": "/etc/slurm.conf", "LANG": "C", "MODE": "fast"}
    assert "not an environment variable name" in error(["--export=1BAD", "x.sh"])


def test_wrap_makes_a_shell_script_named_wrap():
    b = body(["--wrap", "python train.py --epochs 3"], script=None)
    assert b["name"] == "wrap"
    assert b["script"] == "#!/bin/sh\n# This script was created by sbatch --wrap.\n\npython train.py --epochs 3\n"
    assert b["argv"] == []


def test_wrap_refuses_a_script_argument():
    assert "not permitted with --wrap" in error(["--wrap=ls", "x.sh"], script=None)


def test_parsable_test_only_and_wait_are_reported_not_sent():
    req = sbatch(["--parsable", "--test-only", "--wait", "x.sh"])
    assert (req.parsable, req.test_only, req.wait) == (True, True, True)
    assert not any(k.startswith("_") for k in req.body)


def test_unknown_option_suggests_the_close_one():
    assert error(["--gpu-per-node=2", "x.sh"]) == (
        "unrecognized option '--gpu-per-node' (did you mean '--gpus-per-node'?)"
    )
    assert error(["-Z", "x.sh"]) == "unrecognized option '-Z'"


def test_a_missing_value_and_a_value_on_a_flag():
    assert body(["x.sh", "-t"])["argv"] == ["-t"]  # after the script, -t belongs to the script
    assert error(["-t"]) == "option '-t' needs a value"
    assert error(["--hold=yes", "x.sh"]) == "option '--hold' takes no value"


def test_the_first_non_option_ends_sbatch_options():
    b = body(["-N1", "x.sh", "-N", "5"])
    assert b["nodes"] == 1 and b["argv"] == ["-N", "5"]


TRAIN = """#!/bin/bash
# A training job
#SBATCH --job-name=bert
#SBATCH -N 2 --ntasks-per-node=4   # two nodes
#SBATCH --gres=gpu:4
##SBATCH --time=5
#SBATCH --time=2:00:00
#SBATCH --output="logs/%x %j.out"

srun python train.py
#SBATCH --partition=ignored-after-the-first-command
"""


def test_directives_are_read_up_to_the_first_command():
    b = body(["train.sh"], TRAIN)
    assert {k: b[k] for k in ("name", "nodes", "ntasks_per_node", "gpus_per_node", "time_limit_s", "stdout")} == {
        "name": "bert", "nodes": 2, "ntasks_per_node": 4, "gpus_per_node": 4, "time_limit_s": 7200,
        "stdout": "logs/%x %j.out",
    }
    assert "partition" not in b


def test_the_command_line_overrides_directives():
    b = body(["-t", "30", "-J", "bert-short", "train.sh"], TRAIN)
    assert (b["time_limit_s"], b["name"], b["nodes"]) == (1800, "bert-short", 2)


def test_input_environment_variables_sit_between_directives_and_the_command_line():
    env = {**ENV, "SBATCH_PARTITION": "debug", "SBATCH_TIMELIMIT": "10"}
    b = body(["train.sh"], TRAIN, environ=env)
    assert (b["partition"], b["time_limit_s"]) == ("debug", 600)
    assert body(["-t", "5", "train.sh"], TRAIN, environ=env)["time_limit_s"] == 300
    assert error(["x.sh"], environ={**ENV, "SBATCH_TIMELIMIT": "soon"}).startswith(
        "invalid SBATCH_TIMELIMIT value 'soon': expected minutes")


def test_a_misspelt_directive_names_its_line():
    script = "#!/bin/bash\n\n# resources\n#SBATCH --gpu-per-node=2\n"
    assert error(["x.sh"], script) == (
        "line 4: unrecognized option '--gpu-per-node' in #SBATCH directive (did you mean '--gpus-per-node'?)"
    )


def test_a_bad_directive_value_names_its_line_and_option():
    script = "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --time=7x\n"
    assert error(["x.sh"], script) == (
        "line 3: Invalid --time specification '7x': expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
    )


def test_a_stray_word_in_a_directive_and_an_unclosed_quote():
    assert error(["x.sh"], "#!/bin/sh\n#SBATCH -N 2 oops\n") == (
        "line 2: unexpected argument 'oops' in #SBATCH directive")
    assert "line 2: unclosed \" quote" in error(["x.sh"], '#!/bin/sh\n#SBATCH -J "a b\n')


def test_a_script_without_a_shebang_is_not_a_batch_script():
    assert error(["x.sh"], "srun hostname\n") == NOT_A_BATCH_SCRIPT
    assert "This does not look like a batch script" in NOT_A_BATCH_SCRIPT


def test_empty_and_dos_scripts_are_refused_in_slurms_words():
    assert error(["x.sh"], "") == "Batch script is empty!"
    assert error(["x.sh"], "   \n") == "Batch script contains only whitespace!"
    assert error(["x.sh"], "#!/bin/sh\r\nhostname\r\n") == (
        "Batch script contains DOS line breaks (\\r\\n) instead of expected UNIX line breaks (\\n).")
    assert "NULL character" in error(["x.sh"], "#!/bin/sh\n\0")
    assert "no batch script" in error(["x.sh"], script=None)


def test_a_lone_cr_is_kept_and_dos_breaks_in_wrap_pass_as_in_slurm():
    script = "#!/bin/sh\necho 'a\rb'\n"
    assert body(["x.sh"], script)["script"] == script
    assert body(["--wrap", "echo a\r\nb"])["script"].endswith("echo a\r\nb\n")  # Slurm checks files only


def test_the_digest_is_that_of_the_bytes_read_and_bytes_not_utf8_travel_as_base64():
    data = b"#!/bin/sh\n# \xff\xfe not UTF-8, \xc3\xa9 is\n"
    b = body(["x.sh"], data.decode("utf-8", "surrogateescape"))
    assert "script" not in b
    assert base64.b64decode(b["script_base64"]) == data
    assert b["script_sha256"] == hashlib.sha256(data).hexdigest()


def test_a_script_over_max_script_size_is_refused_before_it_is_sent():
    big = "#!/bin/sh\n" + "#" * (4 * 1024 * 1024)
    assert error(["x.sh"], big) == (
        "Batch job submission failed: Pathname of a file, directory or other parameter too long "
        f"(the batch script is {len(big)} bytes; at most 4194304 are accepted)")


def test_script_source_tells_the_cli_what_to_read():
    assert script_source(["-N2", "job.sh", "-x"]) == "job.sh"
    assert script_source(["-N2"]) == "-"
    assert script_source(["--wrap=hostname"]) is None


def test_srun_options_and_the_command_after_them():
    req = parse_srun(["-N2", "-n", "16", "-l", "-u", "--mpi=pmix", "-K", "--overlap", "--exact",
                      "--gpu-bind=closest", "--cpu-bind=cores", "python", "-u", "train.py"],
                     cwd="/home/alice", environ=ENV)
    assert req.command == ["python", "-u", "train.py"]
    assert req.options == {
        "workdir": "/home/alice", "environment": ENV, "nodes": 2, "ntasks": 16, "label": True,
        "unbuffered": True, "mpi": "pmix", "kill_on_bad_exit": True, "overlap": True, "exact": True,
        "gpu_bind": "closest", "cpu_bind": "cores",
    }


def test_srun_double_dash_ends_options_and_kill_on_bad_exit_takes_an_optional_value():
    req = parse_srun(["--kill-on-bad-exit=0", "--", "-weird-program"], cwd="/", environ={})
    assert req.command == ["-weird-program"] and req.options["kill_on_bad_exit"] is False


def test_srun_refuses_sbatch_only_options_and_needs_a_command():
    with pytest.raises(OptionError, match="unrecognized option '--array'"):
        parse_srun(["--array=1-3", "hostname"], cwd="/", environ={})
    with pytest.raises(OptionError, match="no command given"):
        parse_srun(["-N2"], cwd="/", environ={})


def test_one_option_table_serves_both_commands():
    longs = [o.long for o in OPTIONS]
    assert len(longs) == len(set(longs))
    shorts = [o.short for o in OPTIONS if o.short]
    assert len(shorts) == len(set(shorts))


_words = st.lists(st.sampled_from([
    "-N", "2", "--time", "7x", "--gres=gpu:x:y", "-t1:00", "--mem=3Q", "--array=5-1", "--",
    "-d", "afterok:", "--export=", "--nodelist=n[", "-", "x.sh", "--signal=@", "-HW", "--wrap",
]) | st.text(max_size=8), max_size=8)


@given(_words, st.text(max_size=60))
def test_sbatch_raises_only_option_error_on_random_input(argv, text):
    try:
        parse_sbatch(argv, "#!/bin/sh\n#SBATCH " + text, cwd="/tmp", environ={}, now=NOW)
    except OptionError:
        pass


@given(_words)
def test_srun_raises_only_option_error_on_random_input(argv):
    try:
        parse_srun(argv, cwd="/tmp", environ={})
    except OptionError:
        pass


def test_options_slurm_takes_and_shoal_does_not_use_are_recorded_not_refused():
    # submitit writes `#SBATCH --wckey=submitit` on every job; Slurm 22.05 takes all of these.
    script = "#!/bin/sh\n#SBATCH --wckey=submitit\n#SBATCH --mail-type=END,FAIL\ntrue\n"
    got = body(["--mail-user=a@example.org", "--profile=none", "--mincpus=2", "--tmp=0", "-O", "x.sh"], script)
    assert got["recorded_options"] == {"wckey": "submitit", "mail-type": "END,FAIL", "mail-user": "a@example.org",
                                       "profile": "none", "mincpus": "2", "tmp": "0", "overcommit": ""}
    assert "recorded_options" not in body(["x.sh"])


def test_open_mode_takes_slurms_first_letter_and_node_counts_its_k_suffix():
    assert body(["--open-mode=t", "x.sh"])["open_mode"] == "truncate"
    assert body(["--open-mode=a", "x.sh"])["open_mode"] == "append"
    assert body(["-N2k", "x.sh"])["nodes"] == 2048
    assert error(["-Nabc", "x.sh"]) == '"abc" is not a valid node count'  # Slurm 22.05's words


def test_help_and_usage_start_as_slurms_and_list_every_option():
    from shoal.slurm.options import SBATCH, SRUN, help_text

    assert help_text(SBATCH).startswith("Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]\n")
    assert help_text(SBATCH, usage=True).startswith("Usage: sbatch [-N nnodes] [-n ntasks]")
    assert "  -O, --overcommit\n" in help_text(SRUN) and "--wrap=value" not in help_text(SRUN)


def test_srun_reads_its_input_variables_outside_an_allocation_below_the_command_line():
    from shoal.slurm.options import parse_srun

    def opts(argv, env):
        return {k: v for k, v in parse_srun([*argv, "hostname"], cwd="/", environ=env).options.items()
                if k not in ("workdir", "environment")}

    assert opts([], {"SLURM_NPROCS": "3"}) == {"ntasks": 3}
    assert opts(["-n2"], {"SLURM_NTASKS": "3", "SLURM_NNODES": "2"}) == {"ntasks": 2, "nodes": 2}
    assert opts([], {"SLURM_NTASKS": "3", "SLURM_JOB_ID": "7"}) == {}  # inside a job: the job's own layout


@pytest.mark.parametrize("argv, script, code", [
    (["--bogus", "--wrap", "true"], None, 255),  # an unknown option on the command line: Slurm's exit(-1)
    (["-Nabc", "--wrap", "true"], None, 255),  # a value sbatch cannot parse
    (["job.sh"], "#!/bin/sh\n#SBATCH --bogus\n", 1),  # a directive's error is the script's: 1
    (["job.sh"], "echo no interpreter\n", 1),
])
def test_option_errors_on_the_command_line_exit_255_and_script_errors_1(argv, script, code):
    with pytest.raises(OptionError) as info:
        sbatch(argv, script)
    assert info.value.exit_code == code
    with pytest.raises(OptionError) as info:
        parse_srun(["--bogus", "true"], cwd="/", environ=ENV)
    assert info.value.exit_code == 255
