"""QOS limits hold jobs back with the reason Slurm names, counting starts planned in the pass."""

from __future__ import annotations

import dataclasses

from sched_cluster import job, nodes, partition, running, snapshot, started

from shoal.model.accounting import QOS, Account, UserShare
from shoal.sched import schedule
from shoal.sched.qos import max_submit_error, qos_table

TEAMS = (Account("a", users=(UserShare("alice"), UserShare("carol"))), Account("b", users=(UserShare("bob"),)))


def plan_with(qos: QOS, pending, active=()):
    cluster = nodes("gpu", 2)
    snap = snapshot(cluster, [partition("gpu", cluster)], pending, active)
    return schedule(dataclasses.replace(snap, qos=(qos,), accounts=TEAMS))


def in_qos(j, name="limited"):
    return dataclasses.replace(j, qos=name)


def holding(id, user, gpus, *, qos="limited", completing=False):
    a = running(id, {"gpu2": (1, 1000, tuple(range(gpus)))}, user=user)
    return dataclasses.replace(a, qos=qos, completing=completing)


def test_gpus_per_user_counts_what_the_user_already_runs():
    plan = plan_with(QOS("limited", max_gpus_per_user=4),
                     [in_qos(job(1, gpus_per_node=4)), in_qos(job(2, gpus_per_node=2))],
                     [holding(9, "alice", 2)])
    assert plan.reasons == {1: "QOSMaxGRESPerUser"}
    assert started(plan) == [2]


def test_jobs_per_user_counts_a_start_planned_earlier_in_the_same_pass():
    plan = plan_with(QOS("limited", max_jobs_per_user=1),
                     [in_qos(job(1, gpus_per_node=1)), in_qos(job(2, gpus_per_node=1)),
                      in_qos(job(3, user="bob", gpus_per_node=1))])
    assert started(plan) == [1, 3]
    assert plan.reasons == {2: "QOSMaxJobsPerUserLimit"}


def test_group_gpus_are_per_account():
    plan = plan_with(QOS("limited", grp_gpus=4),
                     [in_qos(job(1, user="carol", gpus_per_node=1)), in_qos(job(2, user="bob", gpus_per_node=4))],
                     [holding(9, "alice", 4)])
    assert plan.reasons == {1: "AssocGrpGRES"}
    assert started(plan) == [2]


def test_group_jobs_are_per_account_and_completing_jobs_do_not_count():
    plan = plan_with(QOS("limited", grp_jobs=1),
                     [in_qos(job(1, user="carol")), in_qos(job(2, user="bob"))],
                     [holding(8, "alice", 1), holding(9, "bob", 1, completing=True)])
    assert plan.reasons == {1: "AssocGrpJobsLimit"}
    assert started(plan) == [2]


def test_limits_of_one_qos_ignore_jobs_in_another():
    plan = plan_with(QOS("limited", max_jobs_per_user=1),
                     [in_qos(job(1))], [holding(9, "alice", 1, qos="normal")])
    assert started(plan) == [1]


def test_max_wall_and_unknown_qos():
    plan = plan_with(QOS("limited", max_wall_s=3600),
                     [in_qos(job(1, time_limit_s=7200)), in_qos(job(2, time_limit_s=None)),
                      in_qos(job(3, time_limit_s=3600)), in_qos(job(4), "gone")])
    assert plan.reasons == {1: "QOSMaxWallDurationPerJobLimit", 2: "QOSMaxWallDurationPerJobLimit",
                            4: "InvalidQOS"}
    assert started(plan) == [3]


def test_a_held_job_says_held_before_any_qos_reason():
    plan = plan_with(QOS("limited", max_wall_s=60), [in_qos(job(1, held=True))])
    assert plan.reasons == {1: "JobHeldUser"}


def test_normal_always_exists_and_max_submit_names_the_limit():
    assert qos_table([]) == {"normal": QOS("normal")}
    q = QOS("debug", max_submit_per_user=3)
    assert max_submit_error(q, "alice", 2, 1) is None
    msg = max_submit_error(q, "alice", 2, 2)
    assert "QOS debug" in msg and "MaxSubmitJobsPerUser" in msg and "at most 3" in msg
