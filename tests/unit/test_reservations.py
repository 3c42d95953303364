"""Advance-reservation stories: maintenance windows and team reservations, exact plans."""

from __future__ import annotations

from dataclasses import replace

from sched_cluster import alloc_of, job, nodes, partition, running, snapshot, started

from shoal.model.reservation import AdvanceReservation
from shoal.sched import schedule

NOW = 1000.0
HOUR = 3600
ALL8 = tuple(range(8))


def with_reservations(snap, *reservations):
    return replace(snap, reservations=tuple(reservations))


def maintenance(start: float, hours: int = 2, nodes=("gpu1", "gpu2")) -> AdvanceReservation:
    return AdvanceReservation("maint", start, start + hours * HOUR, tuple(nodes),
                              users=frozenset({"root"}), flags=frozenset({"MAINT", "IGNORE_JOBS"}))


def test_future_maintenance_window_lets_short_jobs_in_and_keeps_long_ones_out():
    cluster = nodes("gpu", 2)
    window = maintenance(NOW + 2 * HOUR)
    snap = with_reservations(snapshot(cluster, [partition("gpu", cluster)], [
        job(1, gpus_per_node=8, time_limit_s=HOUR),        # done an hour before the window
        job(2, gpus_per_node=8, time_limit_s=3 * HOUR),    # would run into it
        job(3, gpus_per_node=8, time_limit_s=None),        # no limit: could never end in time
        job(4, gpus_per_node=8, time_limit_s=2 * HOUR),    # ends exactly as it starts
    ], now=NOW), window)
    plan = schedule(snap)
    assert alloc_of(plan, 1) == {"gpu1": (1, 1000, ALL8)}
    assert alloc_of(plan, 4) == {"gpu2": (1, 1000, ALL8)}
    assert plan.reasons == {2: "ReqNodeNotAvail, Reserved for maintenance",
                            3: "ReqNodeNotAvail, Reserved for maintenance"}


def test_during_maintenance_nothing_starts_on_its_nodes():
    cluster = nodes("gpu", 3)
    window = maintenance(NOW - 60)
    snap = with_reservations(snapshot(cluster, [partition("gpu", cluster)], [
        job(1, gpus_per_node=8, time_limit_s=60), job(2, gpus_per_node=8), job(3, nodes=2, gpus_per_node=1),
    ], now=NOW), window)
    plan = schedule(snap)
    assert alloc_of(plan, 1) == {"gpu3": (1, 1000, ALL8)}
    # Both would start now on the idle nodes under maintenance: that is why they wait.
    assert plan.reasons == {2: "ReqNodeNotAvail, Reserved for maintenance",
                            3: "ReqNodeNotAvail, Reserved for maintenance"}


def test_a_job_short_of_nodes_anyway_waits_for_resources_during_maintenance():
    cluster = nodes("gpu", 3)
    window = maintenance(NOW - 60, nodes=("gpu1",))
    busy = running(9, {"gpu2": (1, 1000, ALL8), "gpu3": (1, 1000, ALL8)})
    snap = with_reservations(snapshot(cluster, [partition("gpu", cluster)], [
        job(1, nodes=2, gpus_per_node=8)], [busy], now=NOW), window)
    assert schedule(snap).reasons == {1: "Resources"}


def test_active_team_reservation_runs_only_its_users_jobs_that_name_it():
    cluster = nodes("gpu", 2)
    team = AdvanceReservation("team", NOW - 60, NOW + 4 * HOUR, ("gpu1",),
                              users=frozenset({"alice", "bob"}))
    snap = with_reservations(snapshot(cluster, [partition("gpu", cluster)], [
        replace(job(1, gpus_per_node=4, user="alice"), reservation="team"),
        job(2, gpus_per_node=8, user="carol"),
        job(3, gpus_per_node=8, user="dave"),
        replace(job(4, gpus_per_node=4, user="bob"), reservation="team"),
        replace(job(5, gpus_per_node=1, user="bob"), reservation="team"),
    ], now=NOW), team)
    plan = schedule(snap)
    assert alloc_of(plan, 1) == {"gpu1": (1, 1000, (0, 1, 2, 3))}
    assert alloc_of(plan, 2) == {"gpu2": (1, 1000, ALL8)}
    assert alloc_of(plan, 4) == {"gpu1": (1, 1000, (4, 5, 6, 7))}
    # dave may not use gpu1's free CPUs and memory; bob's third job finds gpu1 full.
    assert plan.reasons == {3: "Resources", 5: "Resources"}


def test_a_job_in_a_reservation_never_leaves_its_nodes():
    cluster = nodes("gpu", 2)
    team = AdvanceReservation("team", NOW - 60, NOW + HOUR, ("gpu1",), users=frozenset({"alice"}))
    busy = running(9, {"gpu1": (1, 1000, ALL8)}, user="alice")
    snap = with_reservations(snapshot(cluster, [partition("gpu", cluster)], [
        replace(job(1, gpus_per_node=8), reservation="team")], [busy], now=NOW), team)
    plan = schedule(snap)
    assert started(plan) == []
    assert plan.reasons == {1: "Resources"}


def test_a_job_waits_for_its_reservation_to_start_and_for_one_that_is_gone():
    cluster = nodes("gpu", 2)
    later = AdvanceReservation("later", NOW + HOUR, NOW + 2 * HOUR, ("gpu1",), users=frozenset({"alice"}))
    over = AdvanceReservation("over", NOW - 2 * HOUR, NOW - HOUR, ("gpu2",), users=frozenset({"alice"}))
    snap = with_reservations(snapshot(cluster, [partition("gpu", cluster)], [
        replace(job(1, gpus_per_node=1), reservation="later"),
        replace(job(2, gpus_per_node=1), reservation="over"),
        replace(job(3, gpus_per_node=1), reservation="never-made"),
        job(4, gpus_per_node=8, time_limit_s=None),
    ], now=NOW), later, over)
    plan = schedule(snap)
    # An ended reservation holds nothing: job 4 (no time limit) may take gpu2, not gpu1.
    assert alloc_of(plan, 4) == {"gpu2": (1, 1000, ALL8)}
    assert plan.reasons == {1: "Reservation", 2: "ReservationDeleted", 3: "ReservationDeleted"}


def test_without_reservations_the_plan_is_unchanged():
    cluster = nodes("gpu", 2)
    pending = [job(1, gpus_per_node=8), job(2, gpus_per_node=8), job(3, gpus_per_node=8)]
    snap = snapshot(cluster, [partition("gpu", cluster)], pending, now=NOW)
    window = maintenance(NOW + 10 * HOUR)
    assert schedule(snap) == schedule(with_reservations(snap, window))


def test_scontrol_reservation_keys_as_slurm_spells_them():
    import pytest

    from shoal.cli.scontrol import UsageError, parse_reservation

    name, body = parse_reservation(
        ["reservation", "ReservationName=maint", "starttime=now+1hour", "Duration=2:00:00",
         "Nodes=node[01-02]", "Users=alice,bob", "Flags=MAINT,IGNORE_JOBS", "PartitionName=gpu"], NOW)
    assert (name, body) == ("maint", {"start_time": NOW + HOUR, "duration_s": 2 * HOUR,
                                      "nodes": "node[01-02]", "users": ["alice", "bob"],
                                      "flags": ["MAINT", "IGNORE_JOBS"], "partition": "gpu"})
    with pytest.raises(UsageError, match="Invalid reservation parameter: NodeCount2"):
        parse_reservation(["ReservationName=x", "NodeCount2"], NOW)
    with pytest.raises(UsageError, match="Invalid Duration=soon"):
        parse_reservation(["ReservationName=x", "Duration=soon"], NOW)
    with pytest.raises(UsageError, match="needs ReservationName=NAME"):
        parse_reservation(["NodeCnt=2"], NOW)
