"""The simulator carries out preemption and feeds fair-share usage to multifactor priority."""

from __future__ import annotations

import pytest

from shoal.model.job import JobState
from shoal.sched import SchedConfig
from shoal.sched.config import Multifactor
from shoal.sim import TraceJob, build_report, parse_sim_cluster, simulate
from shoal.sim.cli import main
from shoal.sim.cluster import SimClusterError

QOS = [
    {"name": "scavenger", "preempt_mode": "requeue"},
    {"name": "high", "priority": 100, "preempt": ["scavenger"]},
]


def cluster(nodes: int = 2, **extra):
    """``nodes`` 8-GPU nodes in one partition ``gpu``, with the QOS above."""
    return parse_sim_cluster({
        "partitions": [{"name": "gpu", "nodes": f"n[1-{nodes}]"}],
        "sim_nodes": [{"names": f"n[1-{nodes}]", "cpus": 64, "memory": "512G", "gpus": 8}],
        "qos": QOS, **extra,
    })


def job(id, submit, duration, account, **kw) -> TraceJob:
    return TraceJob(id=id, submit=submit, duration=duration, gpus=8, nodes=1, user=account,
                    account=account, name=f"j{id}", **kw)


def by_id(result):
    return {j.id: j for j in result.jobs}


# Two scavenger jobs fill both nodes; a high-QOS job arrives at 100.
PREEMPT_STORY = [job(1, 0, 1000, "low"), job(2, 0, 1000, "low"), job(3, 100, 50, "hi")]
QOS_MAP = {"low": "scavenger", "hi": "high"}


def test_the_preemptor_starts_at_once_and_the_requeued_victim_runs_again_in_full():
    result = simulate(cluster(), PREEMPT_STORY, SchedConfig(policy="backfill"), qos_map=QOS_MAP)
    jobs = by_id(result)
    # Equal work lost: the youngest (highest id) is the victim; no --signal, so no grace.
    assert (jobs[3].start, jobs[3].end) == (100, 150)
    assert (jobs[2].first_start, jobs[2].start, jobs[2].end) == (0, 150, 1150)
    assert (jobs[2].requeues, jobs[2].preempted, jobs[2].state) == (1, 1, JobState.COMPLETED)
    assert (jobs[1].start, jobs[1].end, jobs[1].preempted) == (0, 1000, 0)
    assert [(r.job_id, r.start, r.end) for r in result.runs if r.job_id == 2] == [(2, 0, 100), (2, 150, 1150)]
    assert build_report(result).preemptions == 1


def test_without_preemption_the_high_job_waits_for_a_node():
    jobs = by_id(simulate(cluster(), PREEMPT_STORY, SchedConfig(policy="backfill", preemption=False),
                          qos_map=QOS_MAP))
    assert jobs[3].start == 1000
    assert (jobs[2].requeues, jobs[2].preempted) == (0, 0)


def test_a_victim_signalled_runs_its_grace_capped_by_preempt_grace():
    jobs = by_id(simulate(cluster(), PREEMPT_STORY, SchedConfig(policy="fifo"), qos_map=QOS_MAP,
                          signal_s=30))
    assert (jobs[3].start, jobs[3].end, jobs[2].start) == (130, 180, 180)
    capped = cluster(scheduler={"preempt_grace_s": 10})
    jobs = by_id(simulate(capped, PREEMPT_STORY, SchedConfig(policy="fifo"), qos_map=QOS_MAP,
                          signal_s=30))
    assert jobs[3].start == 110


def test_a_cancel_mode_victim_ends_preempted():
    c = parse_sim_cluster({
        "partitions": [{"name": "gpu", "nodes": "n[1-2]"}],
        "sim_nodes": [{"names": "n[1-2]", "cpus": 64, "memory": "512G", "gpus": 8}],
        "qos": [{"name": "scavenger"}, {"name": "high", "preempt": ["scavenger"]}],
    })
    jobs = by_id(simulate(c, PREEMPT_STORY, SchedConfig(), qos_map=QOS_MAP))
    assert (jobs[2].state, jobs[2].end, jobs[2].requeues) == (JobState.PREEMPTED, 100, 0)
    assert jobs[3].start == 100


# One node. The heavy user's first job holds it for 1000 s; the heavy user's second job is
# submitted before the light user's only one.
FAIR_STORY = [job(1, 0, 1000, "heavy"), job(2, 10, 100, "heavy"), job(3, 20, 100, "light")]
WEIGHTS = Multifactor(weight_fairshare=1000, decay_half_life_s=86400)


def test_fifo_keeps_submit_order():
    jobs = by_id(simulate(cluster(1), FAIR_STORY, SchedConfig(policy="fifo")))
    assert (jobs[2].start, jobs[3].start) == (1000, 1100)


@pytest.mark.parametrize("policy", ["fifo", "backfill"])
def test_multifactor_fairshare_starts_the_light_users_later_job_first(policy):
    config = SchedConfig(policy=policy, priority="multifactor", multifactor=WEIGHTS)
    jobs = by_id(simulate(cluster(1), FAIR_STORY, config))
    assert (jobs[3].start, jobs[2].start) == (1000, 1100)


@pytest.mark.parametrize("half_life, first", [(1, 2), (0, 3)])
def test_fairshare_usage_decays_in_virtual_time(half_life, first):
    # By 3000 s the heavy user's usage has decayed to nothing with a 1 s half-life (both
    # factors 1: submit order decides); without decay (0) it still counts and light goes first.
    story = [job(1, 0, 1000, "heavy"), job(2, 3000, 100, "heavy"), job(3, 3000, 100, "light"),
             job(4, 3000, 100, "other")]
    config = SchedConfig(policy="fifo", priority="multifactor",
                         multifactor=Multifactor(weight_fairshare=1000, decay_half_life_s=half_life))
    jobs = by_id(simulate(cluster(1), story, config))
    assert min((2, 3), key=lambda i: jobs[i].start) == first


def test_the_cluster_files_priority_accounts_and_qos_sections():
    c = cluster(1, priority={"type": "multifactor", "weight_fairshare": 1000, "decay_half_life": "1-0"},
                accounts=[{"name": "org", "accounts": [{"name": "heavy", "users": ["heavy"]},
                                                       {"name": "light", "users": [{"name": "light", "shares": 2}]}]}])
    assert c.multifactor == WEIGHTS
    assert [(a.name, a.parent) for a in c.accounts] == [("org", None), ("heavy", "org"), ("light", "org")]
    assert [q.name for q in c.qos] == ["scavenger", "high"] and c.qos[1].preempt == ("scavenger",)
    jobs = by_id(simulate(c, FAIR_STORY, SchedConfig(policy="fifo", priority="multifactor",
                                                     multifactor=c.multifactor)))
    assert (jobs[3].start, jobs[2].start) == (1000, 1100)
    with pytest.raises(SimClusterError, match="preempt names unknown QOS"):
        cluster(1, qos=[{"name": "a", "preempt": ["nope"]}])
    with pytest.raises(SimClusterError, match="priority: unknown keys"):
        cluster(1, priority={"weight_bogus": 1})


def test_cli_qos_map_counts_preemptions_per_policy(tmp_path, capsys):
    import json

    import yaml

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "partitions": [{"name": "gpu", "nodes": "n[1-2]"}],
        "sim_nodes": [{"names": "n[1-2]", "cpus": 64, "memory": "512G", "gpus": 8}],
        "qos": QOS,
    }))
    rows = ["job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,duration",
            "a,low,low,8,8,1,COMPLETED,0,1000", "b,low,low,8,8,1,COMPLETED,0,1000",
            "c,hi,hi,8,8,1,COMPLETED,100,50"]
    (tmp_path / "cluster_log.csv").write_text("\n".join(rows) + "\n")
    assert main(["--cluster", str(tmp_path / "c.yaml"), "--trace", str(tmp_path / "cluster_log.csv"),
                 "--policy", "backfill,backfill:preemption=false", "--json",
                 "--qos-map", "low=scavenger", "hi=high"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["preemptions"] for p in out["policies"]] == [1, 0]
    assert main(["--cluster", str(tmp_path / "c.yaml"), "--trace", str(tmp_path / "cluster_log.csv"),
                 "--qos-map", "low=gold"]) == 2
