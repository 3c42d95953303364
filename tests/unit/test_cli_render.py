"""Golden-output tests of the Slurm-compatible commands' renderers, and their error path."""

from __future__ import annotations

import pytest

from shoal.cli import sacct, scontrol, sinfo
from shoal.cli import scancel as scancel_shell
from shoal.cli import squeue as squeue_shell
from shoal.slurm import fmt, scancel, squeue

NOW = 1764688000.0


def job(**kw):
    base = dict(job_id=1, array_job_id=None, array_task_id=None, array_throttle=None, name="train",
                user="alice", partition="gpu", state="PENDING", completing=False, reason="Resources",
                submit_time=NOW - 4000, eligible_time=NOW - 4000, start_time=None, end_time=None,
                time_limit_s=3600, nodes=1, ntasks=1, ntasks_per_node=None, cpus_per_task=1, cpus=1,
                mem_per_node_mb=0, gpus_per_node=0, gpu_type=None, nodelist="", batch_host=None,
                exit_code=None, signal=None, workdir="/home/alice/run", stdout="/home/alice/run/slurm-1.out",
                stderr="/home/alice/run/slurm-1.out", command="/home/alice/run/job.sh", priority=100, steps=[])
    base.update(kw)
    return base


PENDING = job(job_id=12)
RUNNING = job(job_id=13, state="RUNNING", reason="None", start_time=NOW - 3723, nodes=2, ntasks=16,
              cpus_per_task=12, cpus=192, gpus_per_node=8, nodelist="node[01-02]", batch_host="node01",
              name="averyverylongname",
              steps=[dict(step_id="batch", name="batch", state="RUNNING", start_time=NOW - 3723, end_time=None,
                          exit_code=None, signal=None, ntasks=1, nodelist="node01")])
ARRAY = [job(job_id=20 + t, array_job_id=20, array_task_id=t, array_throttle=2, name="sweep") for t in range(3, 10)]
ARRAY_RUNNING = job(job_id=30, array_job_id=20, array_task_id=2, state="RUNNING", reason="None",
                    start_time=NOW - 5, nodelist="node03", name="sweep")
COMPLETING = job(job_id=31, state="COMPLETED", completing=True, reason="None", start_time=NOW - 50,
                 end_time=NOW - 1, nodelist="node04")
FAILED = job(job_id=14, state="FAILED", reason="NonZeroExitCode", start_time=NOW - 60, end_time=NOW - 30,
             nodelist="node03", exit_code=3, signal=0,
             steps=[dict(step_id="batch", name="batch", state="FAILED", start_time=NOW - 60, end_time=NOW - 30,
                         exit_code=3, signal=0, ntasks=1, nodelist="node03")])
QUEUE = [PENDING, RUNNING, *ARRAY, ARRAY_RUNNING, COMPLETING, FAILED]


def squeue_out(*args, jobs=QUEUE):
    return squeue.render_jobs(jobs, squeue.parse_args(list(args)), NOW)


# ── squeue ─────────────────────────────────────────────────────────────────────


def test_squeue_default_shows_the_queue_as_slurm_does():
    assert squeue_out() == (
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n"
        "                12       gpu    train    alice PD       0:00      1 (Resources)\n"
        "                13       gpu averyver    alice  R    1:02:03      2 node[01-02]\n"
        "        20_[3-9%2]       gpu    sweep    alice PD       0:00      1 (Resources)\n"
        "              20_2       gpu    sweep    alice  R       0:05      1 node03\n"
        "                31       gpu    train    alice CG       0:49      1 node04\n"
    )


def test_squeue_array_flag_lists_each_pending_task():
    lines = squeue_out("-r", "-h", "-o", "%i %t").splitlines()
    assert lines[2:9] == [f"20_{t} PD" for t in range(3, 10)]


def test_squeue_states_filter_accepts_codes_and_names():
    assert squeue_out("-h", "-t", "F,completing", "-o", "%i %T") == "31 COMPLETING\n14 FAILED\n"
    assert squeue_out("-h", "-t", "all", "-o", "%i", jobs=[FAILED]) == "14\n"
    with pytest.raises(squeue.StateError, match="Invalid job state specified: XX"):
        squeue_out("-t", "XX")


def test_squeue_start_view_uses_slurms_format():
    assert squeue_out("--start", jobs=[PENDING, RUNNING]) == (
        "             JOBID PARTITION     NAME     USER ST          START_TIME  NODES SCHEDNODES"
        "           NODELIST(REASON)\n"
        "                12       gpu    train    alice PD                 N/A      1 (null)"
        "               (Resources)\n"
    )


def test_squeue_long_header_cuts_time_limit_like_slurm():
    out = squeue_out("-l", jobs=[RUNNING]).splitlines()
    assert out[1] == ("             JOBID PARTITION     NAME     USER    STATE       TIME TIME_LIMI  NODES"
                      " NODELIST(REASON)")
    assert out[2].endswith(" RUNNING    1:02:03   1:00:00      2 node[01-02]")


def test_format_strings_justify_pad_and_cut():
    assert squeue_out("-o", "%.10i|%5j|%%|%j|%b|%C", jobs=[RUNNING]) == (
        "     JOBID|NAME |%|NAME|TRES_PER_NODE|CPUS\n"
        "        13|avery|%|averyverylongname|gres/gpu:8|192\n"
    )
    assert squeue_out("-h", "-o", "%.3i", jobs=[job(job_id=123456)]) == "123\n"
    with pytest.raises(fmt.FormatError, match="Invalid job format specification: -"):
        squeue_out("-o", "%-5j")


def test_squeue_long_format_option():
    assert squeue_out("-h", "-O", "jobid:6,statecompact:.4", jobs=[PENDING]) == "12      PD\n"


def test_squeue_json_keeps_slurm_key_names():
    import json

    doc = json.loads(squeue.render_json([RUNNING], squeue.parse_args([]), NOW))
    assert doc["jobs"][0]["job_id"] == 13
    assert doc["jobs"][0]["user_name"] == "alice"
    assert doc["jobs"][0]["job_state"] == "RUNNING"
    assert doc["jobs"][0]["nodes"] == "node[01-02]"


# ── sinfo ──────────────────────────────────────────────────────────────────────


def node(name, ds, **kw):
    state = {"down": "DOWN", "drain": "DRAIN", "drng": "DRAIN"}.get(ds, "UP")
    base = dict(name=name, address="10.0.0.1", port=6901, state=state, display_state=ds, reason=None, cpus=128,
                cpus_alloc={"mix": 16, "alloc": 128}.get(ds, 0), memory_mb=2097152, memory_alloc_mb=0,
                gres="gpu:h100:8", features=["h100"], partitions=["gpu"], jobs=[], gpus=[], gpus_alloc=0)
    base.update(kw)
    return base


NODES = [node("node01", "alloc"), node("node02", "alloc"), node("node03", "mix"), node("node04", "idle"),
         node("node05", "idle"), node("node06", "drain", reason="bad gpu", reason_user="root"),
         node("node07", "down", reason="Not responding")]
PARTS = [dict(name="gpu", nodes="node[01-07]", node_names=[n["name"] for n in NODES], default=True,
              default_time_s=None, max_time_s=2 * 86400, max_nodes=None, state="UP"),
         dict(name="debug", nodes="node[04-05]", node_names=["node04", "node05"], default=False,
              default_time_s=1800, max_time_s=3600, max_nodes=2, state="UP")]


def sinfo_out(*args):
    return sinfo.render_sinfo(NODES, PARTS, sinfo.parse_args(list(args)), NOW)


def test_sinfo_groups_nodes_by_partition_and_state():
    assert sinfo_out() == (
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n"
        "gpu*         up 2-00:00:00      2  alloc node[01-02]\n"
        "gpu*         up 2-00:00:00      1    mix node03\n"
        "gpu*         up 2-00:00:00      2   idle node[04-05]\n"
        "gpu*         up 2-00:00:00      1  drain node06\n"
        "gpu*         up 2-00:00:00      1  down* node07\n"
        "debug        up    1:00:00      2   idle node[04-05]\n"
    )


def test_sinfo_node_view_and_filters():
    out = sinfo.render_sinfo(NODES, PARTS, sinfo.parse_args(["-N", "-t", "idle", "-p", "debug"]), NOW)
    assert out == "NODELIST   NODES PARTITION STATE \nnode04         1 debug     idle  \nnode05         1 debug     idle  \n"


def test_sinfo_list_reasons_and_cpu_counts():
    assert sinfo_out("-R", "-h") == (
        "bad gpu              root      Unknown             node06\n"
        "Not responding       Unknown   Unknown             node07\n"
    )
    assert sinfo_out("-h", "-p", "gpu", "-o", "%C %T").splitlines()[:2] == [
        "256/0/0/256 allocated", "16/112/0/128 mixed"]


# ── sacct ──────────────────────────────────────────────────────────────────────


def sacct_out(*args, jobs=(PENDING, RUNNING, FAILED)):
    return sacct.render_sacct(list(jobs), sacct.parse_args(["-a", *args]), NOW)


def test_sacct_default_columns_with_steps():
    assert sacct_out() == (
        "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode \n"
        "------------ ---------- ---------- ---------- ---------- ---------- -------- \n"
        "12                train        gpu                     0    PENDING      0:0 \n"
        "13           averyvery+        gpu                   192    RUNNING      0:0 \n"
        "13.batch          batch                               12    RUNNING      0:0 \n"
        "14                train        gpu                     1     FAILED      3:0 \n"
        "14.batch          batch                                1     FAILED      3:0 \n"
    )


def test_sacct_parsable_state_exit_code_as_scripts_read_it():
    assert sacct_out("-X", "-n", "-P", "-o", "State,ExitCode") == "PENDING|0:0\nRUNNING|0:0\nFAILED|3:0\n"
    assert sacct_out("-X", "-p", "-o", "jobid,elapsed", jobs=[FAILED]) == "JobID|Elapsed|\n14|00:00:30|\n"


def test_sacct_rejects_unknown_fields():
    with pytest.raises(fmt.FormatError, match='Invalid field requested: "Bogus"'):
        sacct_out("-o", "JobID,Bogus")


# ── scontrol / scancel ─────────────────────────────────────────────────────────


def test_scontrol_show_job_layout():
    out = scontrol.render_job(RUNNING, NOW).splitlines()
    assert out[0] == "JobId=13 JobName=averyverylongname"
    assert "   JobState=RUNNING Reason=None Dependency=(null)" in out
    assert "   RunTime=01:02:03 TimeLimit=01:00:00 TimeMin=N/A" in out
    assert "   NumNodes=2 NumCPUs=192 NumTasks=16 CPUs/Task=12" in out
    assert "   TRES=cpu=192,node=2,billing=192,gres/gpu=16" in out
    assert scontrol.render_job(RUNNING, NOW, oneliner=True).count("\n") == 1


def test_scontrol_hostnames_and_hostlist_without_a_server(monkeypatch, capsys):
    monkeypatch.setenv("SHOAL_SERVER", "http://127.0.0.1:1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-03]")
    assert scontrol.main(["show", "hostnames"]) == 0
    assert capsys.readouterr().out == "gpu01\ngpu02\ngpu03\n"
    assert scontrol.main(["show", "hostlist", "gpu01,gpu02,gpu03,gpu05"]) == 0
    assert capsys.readouterr().out == "gpu[01-03,05]\n"


def test_scontrol_update_validation():
    assert scontrol.parse_update(["NodeName=n[1-2]", "State=drain", "Reason=bad gpu"]) == (
        "node", "n[1-2]", {"state": "DRAIN", "reason": "bad gpu"})
    with pytest.raises(scontrol.UsageError, match="must specify a reason"):
        scontrol.parse_update(["NodeName=n1", "State=DOWN"])
    with pytest.raises(scontrol.UsageError, match="not supported: bogus"):
        scontrol.parse_update(["JobId=12", "Bogus=1"])


def test_scancel_ids_and_signals():
    assert scancel.expand_job_ids(["12", "12_3", "12_[1-3]"]) == ["12", "12_3", "12_1", "12_2", "12_3"]
    assert scancel.parse_signal("SIGUSR1") == "USR1" and scancel.parse_signal("9") == 9
    with pytest.raises(scancel.UsageError):
        scancel.parse_signal("NOPE")


# ── every command against a server that is not there ─────────────────────────


@pytest.mark.parametrize("module,argv", [
    (squeue_shell, []), (sinfo, []), (sacct, []), (scontrol, ["show", "job"]),
    (scontrol, ["update", "JobId=1", "TimeLimit=10"]), (scancel_shell, ["12"]),
])
def test_unreachable_server_is_one_line_and_exit_1(module, argv, monkeypatch, capsys):
    monkeypatch.setenv("SHOAL_SERVER", "http://127.0.0.1:1")
    monkeypatch.setenv("SHOAL_CONFIG", "/nonexistent/shoal.yaml")
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: cannot reach the Shoal server" in err
    assert "Traceback" not in err


def test_sacct_sizes_and_cpu_times_read_as_slurms():
    # convert_num_unit with CONVERT_NUM_UNIT_EXACT: divide while a half unit is still exact.
    assert [sacct.size_text(k) for k in (0, 1234, 200704, 2621440, 1562528)] == ["0", "1234K", "196M", "2.50G", "1562528K"]
    assert sacct.size_text(None) is None
    # _elapsed_time: milliseconds only under an hour and only when there are some.
    assert [sacct.cpu_time_text(s) for s in (0, 1.234, 61, 3725.5, 90000)] == \
        ["00:00:00", "00:01.234", "00:01:01", "01:02:05", "1-01:00:00"]


def test_sstat_picks_steps_and_renders_them_as_slurms():
    from types import SimpleNamespace

    from shoal.cli import sstat

    usage = {"steps": [{"step_id": "batch", "nodelist": "n1", "nodes": []},
                       {"step_id": "3", "nodelist": "n[1-2]", "nodes": [
                           {"node": "n1", "max_rss_kb": 2048, "cpu_s": 3.0, "tasks": 2},
                           {"node": "n2", "max_rss_kb": 4096, "cpu_s": 1.5, "tasks": 1}]},
                       {"step_id": "1", "nodelist": "n1", "nodes": []}]}
    # No step asked: the first srun step, never the batch step (Slurm skips its special steps).
    assert [s["step_id"] for s in sstat.pick_steps(usage, None, False)] == ["1"]
    assert [s["step_id"] for s in sstat.pick_steps(usage, "batch", False)] == ["batch"]
    assert len(sstat.pick_steps(usage, None, True)) == 3 and sstat.pick_steps(usage, "9", False) == []
    assert sstat.not_running(5, None) == "No steps running for job 5"
    assert sstat.not_running(5, "9") == "StepId=5.9 not found running."
    options = SimpleNamespace(format="jobid,maxrss,maxrssnode,averss,mincpu,mincpunode,avecpu,ntasks,nodelist,"
                              "maxvmsize,tresusageinmaxn", parsable=False, parsable2=True, noheader=False,
                              delimiter="|")
    out = sstat.render_sstat([{"job_id": 5, "step": usage["steps"][1]}], options).splitlines()
    assert out == ["JobID|MaxRSS|MaxRSSNode|AveRSS|MinCPU|MinCPUNode|AveCPU|NTasks|Nodelist|MaxVMSize|"
                   "TRESUsageInMaxNode",
                   "5.3|4M|n2|2M|00:01.500|n2|00:01.500|3|n[1-2]||cpu=n1,mem=n2"]
    with pytest.raises(fmt.FormatError, match="Bad job/step specified: 5.x"):
        sstat.parse_steps(["5.x"])
    assert sstat.parse_steps(["5", "6.batch", "7.2"]) == [(5, None), (6, "batch"), (7, "2")]
    # The default fields are Slurm's 47, each one a known column.
    assert len(sstat.parse_fields(sstat.DEFAULT_FIELDS, sstat.COLUMNS)) == 47


def test_sacct_jobs_with_a_step_show_that_step_alone_as_snakemake_asks_for_failure_reasons():
    # (the server answers with the jobs named: here, the records given)
    assert sacct_out("-j", "14.batch", "-n", "-P", "-o", "JobID,State", jobs=[FAILED]) == "14.batch|FAILED\n"
    assert sacct_out("-j", "14.0", "-n", "-P", "-o", "JobID", jobs=[FAILED]) == ""  # no such step: nothing, no error
    assert sacct_out("-j", "13,14.batch", "-n", "-P", "-o", "JobID", jobs=[RUNNING, FAILED]) == "13\n13.batch\n14.batch\n"
    assert sacct.query(sacct.parse_args(["-j", "13,14.batch"]), NOW)["job_id"] == ["13", "14"]
