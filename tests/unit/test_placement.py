"""Placement stories: where one job's gang lands, and why it cannot."""

from __future__ import annotations

from sched_cluster import A100, H100, gpu_node, nodes, partition, running, snapshot

from shoal.model.node import NodeState
from shoal.model.resources import ResourceRequest
from shoal.sched.placement import (
    ClusterState,
    PlacementCache,
    check_feasible,
    gpu_type_matches,
    headroom,
    natural_key,
    place,
)


def held_by(placement):
    return {n: (a.cpus, a.memory_mb, a.gpus) for n, a in placement.allocation.nodes}


def test_natural_order_puts_node2_before_node10():
    assert sorted(["node10", "node2", "node1"], key=natural_key) == ["node1", "node2", "node10"]


def test_gpu_type_matches_product_words_case_insensitively():
    assert gpu_type_matches(H100, "h100")
    assert gpu_type_matches(A100, "a100")
    assert gpu_type_matches(A100, "A100 80GB")
    assert not gpu_type_matches(A100, "a10")  # an A10 is not an A100
    assert not gpu_type_matches(A100, "h100")


def test_best_fit_packs_a_one_gpu_job_onto_the_partly_used_node():
    cluster = nodes("gpu", 3)
    state = ClusterState(cluster, [running(9, {"gpu2": (4, 1000, (0, 1, 2))}).allocation])
    got = place(ResourceRequest(gpus_per_node=1, mem_per_node_mb=100), state)
    assert held_by(got) == {"gpu2": (1, 100, (3,))}


def test_ties_go_to_the_lowest_node_in_natural_order():
    cluster = (gpu_node("gpu10"), gpu_node("gpu2"), gpu_node("gpu9"))
    got = place(ResourceRequest(nodes=2, gpus_per_node=8, mem_per_node_mb=1), ClusterState(cluster))
    assert list(held_by(got)) == ["gpu2", "gpu9"]


def test_cpu_job_prefers_a_node_without_free_gpus():
    cluster = (gpu_node("gpu1"), gpu_node("cpu1", gpus=0))
    got = place(ResourceRequest(ntasks=4, mem_per_node_mb=10), ClusterState(cluster))
    assert held_by(got) == {"cpu1": (4, 10, ())}


def test_gang_is_all_or_nothing():
    cluster = nodes("gpu", 8)
    busy = running(9, {"gpu1": (1, 1, (0, 1, 2, 3))}).allocation  # 60 of 64 GPUs free
    got = place(ResourceRequest(nodes=8, gpus_per_node=8, mem_per_node_mb=1),
                ClusterState(cluster, [busy]))
    assert not got.ok and got.reason == "Resources"


def test_gpu_type_filter_only_uses_matching_gpus():
    cluster = (gpu_node("a1", product=A100), gpu_node("h1", product=H100))
    got = place(ResourceRequest(gpus_per_node=2, gpu_type="h100", mem_per_node_mb=1),
                ClusterState(cluster))
    assert held_by(got) == {"h1": (1, 1, (0, 1))}


def test_features_are_all_required():
    cluster = (gpu_node("gpu1", features=("ib",)), gpu_node("gpu2", features=("ib", "nvlink")))
    got = place(ResourceRequest(features=("nvlink", "ib"), mem_per_node_mb=1), ClusterState(cluster))
    assert list(held_by(got)) == ["gpu2"]
    none = place(ResourceRequest(features=("nvlink", "rail")), ClusterState(cluster))
    assert not none.ok


def test_nodelist_nodes_are_included_and_excluded_nodes_never_used():
    cluster = nodes("gpu", 4)
    got = place(ResourceRequest(nodes=2, nodelist=("gpu4",), exclude=("gpu1",), mem_per_node_mb=1),
                ClusterState(cluster))
    assert list(held_by(got)) == ["gpu2", "gpu4"]


def test_nodelist_longer_than_nodes_raises_the_gang_size():
    got = place(ResourceRequest(nodes=1, nodelist=("gpu1", "gpu3"), mem_per_node_mb=1),
                ClusterState(nodes("gpu", 3)))
    assert list(held_by(got)) == ["gpu1", "gpu3"]


def test_down_and_drained_nodes_take_no_new_work():
    cluster = (gpu_node("gpu1", state=NodeState.DOWN), gpu_node("gpu2", state=NodeState.DRAIN),
               gpu_node("gpu3"))
    got = place(ResourceRequest(nodes=1, mem_per_node_mb=1), ClusterState(cluster))
    assert list(held_by(got)) == ["gpu3"]
    assert not place(ResourceRequest(nodes=2, mem_per_node_mb=1), ClusterState(cluster)).ok


def test_only_nodes_of_the_partition_are_used():
    cluster = nodes("gpu", 3)
    part = partition("small", ["gpu3"])
    got = place(ResourceRequest(mem_per_node_mb=1), ClusterState(cluster), partition=part)
    assert list(held_by(got)) == ["gpu3"]


def test_exclusive_takes_the_whole_node_and_needs_an_empty_one():
    cluster = nodes("gpu", 2, gpus=4, cpus=32, memory_mb=1000)
    state = ClusterState(cluster, [running(9, {"gpu1": (1, 10, ())}).allocation])
    got = place(ResourceRequest(exclusive=True, gpus_per_node=1), state)
    assert held_by(got) == {"gpu2": (32, 1000, (0, 1, 2, 3))}
    assert got.allocation.exclusive
    state.commit(got.allocation)
    # gpu1 already runs a job, but the exclusively held gpu2 takes nothing else.
    small = place(ResourceRequest(mem_per_node_mb=1), state)
    assert list(held_by(small)) == ["gpu1"]


def test_exclusive_holder_blocks_even_tiny_jobs():
    cluster = nodes("gpu", 1, cpus=32)
    # Recorded exclusive allocations might not list every CPU; the flag alone closes the node.
    state = ClusterState(cluster, [running(9, {"gpu1": (1, 1, ())}, exclusive=True).allocation])
    assert not place(ResourceRequest(mem_per_node_mb=1), state).ok


def test_mem_zero_takes_all_memory_and_needs_nobody_else_holding_memory():
    cluster = nodes("gpu", 2, memory_mb=1000)
    state = ClusterState(cluster, [running(9, {"gpu1": (1, 1, ())}).allocation])
    got = place(ResourceRequest(mem_per_node_mb=0), state)
    assert held_by(got) == {"gpu2": (1, 1000, ())}
    state.commit(got.allocation)
    assert not place(ResourceRequest(mem_per_node_mb=0), state).ok
    assert not place(ResourceRequest(mem_per_node_mb=1), ClusterState(cluster[1:], [got.allocation])).ok


def test_ever_mode_ignores_current_load():
    cluster = nodes("gpu", 1)
    busy = ClusterState(cluster, [running(9, {"gpu1": (64, 512_000, tuple(range(8)))}).allocation])
    req = ResourceRequest(gpus_per_node=8, mem_per_node_mb=1)
    assert not place(req, busy).ok
    assert place(req, busy, "ever").ok


def test_check_feasible_names_the_shortfall():
    cluster = nodes("a100-", 4, product=A100)
    part = partition("gpu-a100", cluster, max_nodes=4, max_time_s=86400)
    assert check_feasible(ResourceRequest(gpus_per_node=16), part, cluster) == (
        "requested 16 GPUs per node but the largest node in partition gpu-a100 has 8")
    assert check_feasible(ResourceRequest(ntasks=128), part, cluster) == (
        "requested 128 CPUs per node but the largest node in partition gpu-a100 has 64")
    assert check_feasible(ResourceRequest(mem_per_node_mb=10**7), part, cluster) == (
        "requested 10000000 MiB of memory per node but the largest node in partition gpu-a100 "
        "has 512000 MiB")
    assert check_feasible(ResourceRequest(gpus_per_node=1, gpu_type="h100"), part, cluster) == (
        "no node in partition gpu-a100 has GPUs of type h100")
    assert check_feasible(ResourceRequest(features=("nvlink",)), part, cluster) == (
        "no node in partition gpu-a100 has feature nvlink (with the other constraints asked for)")
    assert check_feasible(ResourceRequest(nodes=5), part, cluster) == (
        "requested 5 nodes but partition gpu-a100 allows at most 4 (MaxNodes)")
    assert check_feasible(ResourceRequest(), part, cluster, time_limit_s=2 * 86400) == (
        "requested time limit 2-00:00:00 exceeds partition gpu-a100's MaxTime 1-00:00:00")
    assert check_feasible(ResourceRequest(nodelist=("gpu9",)), part, cluster) == (
        "requested node gpu9 is not an available node of partition gpu-a100")
    assert check_feasible(ResourceRequest(nodes=4, gpus_per_node=8, gpu_type="a100"), part,
                          cluster, time_limit_s=3600) is None


def test_check_feasible_counts_drained_but_not_down_nodes():
    cluster = (gpu_node("gpu1", state=NodeState.DRAIN), gpu_node("gpu2", state=NodeState.DOWN))
    part = partition("gpu", cluster)
    assert check_feasible(ResourceRequest(nodes=1), part, cluster) is None
    assert check_feasible(ResourceRequest(nodes=2), part, cluster) == (
        "requested 2 nodes but only 1 in partition gpu can hold one node's share of the job")


def test_check_feasible_refuses_a_closed_partition():
    cluster = nodes("gpu", 1)
    part = partition("gpu", cluster, state="INACTIVE")
    assert check_feasible(ResourceRequest(), part, cluster) == (
        "partition gpu is not accepting jobs (State=INACTIVE)")


def test_snapshot_state_subtracts_active_jobs():
    cluster = nodes("gpu", 1, gpus=2)
    snap = snapshot(cluster, [partition("gpu", cluster)],
                    active=[running(9, {"gpu1": (1, 1, (0,))})])
    got = place(ResourceRequest(gpus_per_node=1, mem_per_node_mb=1), ClusterState.from_snapshot(snap))
    assert held_by(got) == {"gpu1": (1, 1, (1,))}


def test_a_state_brought_up_to_date_between_passes_equals_one_built_afresh():
    """The simulator's passes share a node tuple: the state is kept and updated by the jobs
    that started and ended since, and must say exactly what a fresh one says."""
    import dataclasses

    cluster = tuple(nodes("gpu", 4, gpus=4))
    parts = (partition("gpu", cluster),)
    jobs = [running(1, {"gpu1": (2, 10, (0, 1))}), running(2, {"gpu2": (1, 5, (3,))}),
            running(3, {"gpu3": (4, 20, (0, 1, 2, 3)), "gpu4": (4, 20, (0, 1, 2, 3))}, exclusive=True)]
    moved = dataclasses.replace(jobs[1], allocation=running(2, {"gpu1": (1, 5, (2,))}).allocation)
    cache = PlacementCache()
    for active in ([jobs[0], jobs[1]], [jobs[0], jobs[1], jobs[2]], [jobs[2]], [moved, jobs[2]], []):
        kept = ClusterState.from_snapshot(snapshot(cluster, parts, active=active), cache)
        fresh = ClusterState(list(cluster), [job.allocation for job in active])
        seen = [(nf.info.name, nf.cpus_free, nf.mem_free, nf.gpus_free, nf.jobs, nf.exclusive_held)
                for state in (kept, fresh) for nf in state.nodes]
        assert seen[:4] == seen[4:]
        assert [nf.info.name for nf in kept.in_score_order(0, 0)] == \
            [nf.info.name for nf in fresh.in_score_order(0, 0)]


def test_running_ends_and_backfill_plans_kept_between_passes_equal_fresh_ones():
    """The running jobs' ends are kept with the free state; a backfill pass over the kept
    ones must plan exactly what a pass that builds everything afresh plans."""
    import dataclasses

    from sched_cluster import job

    from shoal.sched import SchedConfig, schedule
    from shoal.sched.placement import PlacementCache, running_ends

    cluster = nodes("gpu", 4, gpus=4)
    parts = (partition("gpu", cluster),)
    a = running(1, {"gpu1": (2, 10, (0, 1))}, start_time=0.0, time_limit_s=600)
    b = running(2, {"gpu2": (1, 5, (3,))}, start_time=100.0, time_limit_s=3600)
    c = running(3, {"gpu3": (4, 20, (0, 1, 2, 3)), "gpu4": (4, 20, (0, 1, 2, 3))},
                start_time=200.0, time_limit_s=1800, exclusive=True)
    forever = running(4, {"gpu1": (1, 5, (2,))}, time_limit_s=None)
    rebuilt = dataclasses.replace(b)  # equal, another object: what a server's snapshot holds
    moved = dataclasses.replace(b, allocation=running(2, {"gpu2": (1, 5, (0,))}).allocation)
    pending = [job(10, gpus_per_node=4, nodes=2, time_limit_s=3600),
               job(11, gpus_per_node=1, time_limit_s=300), job(12, gpus_per_node=2, time_limit_s=7200)]
    passes = [([a, b], 1000.0), ([a, b, c], 1000.0), ([a, rebuilt, c, forever], 1500.0),
              ([moved, c], 2500.0), ([c], 4000.0), ([], 4000.0)]
    config = SchedConfig(policy="backfill")
    cache = PlacementCache()
    kept = []  # one pass after another over one node tuple: each brings the last up to date
    for active, now in passes:
        snap = snapshot(cluster, parts, pending=pending, active=active, now=now)
        plan = schedule(snap, config, cache)
        kept.append((list(running_ends(snap, cache)), plan.starts, plan.reasons, plan.estimates))
        assert cache.free is not None and cache.free.snapshot is snap
    for (active, now), (ends, starts, reasons, estimates) in zip(passes, kept):
        plan = schedule(snapshot(cluster, parts, pending=pending, active=active, now=now), config)  # no cache
        assert ends == sorted((j.start_time + j.time_limit_s, j.id, j.allocation)
                              for j in active if j.time_limit_s is not None)
        assert (starts, reasons, estimates) == (plan.starts, plan.reasons, plan.estimates)
    assert any(estimates for _, _, _, estimates in kept)  # some pass reserved (looked ahead)


def test_headroom_is_the_most_any_taking_node_has_free_after_the_plan():
    cluster = (*nodes("gpu", 2, cpus=16), gpu_node("gpu3", state=NodeState.DRAIN))
    busy = running(9, {"gpu1": (16, 1000, (0, 1, 2, 3, 4, 5, 6, 7)), "gpu2": (4, 1000, (0, 1, 2, 3, 4, 5))})
    snap = snapshot(cluster, (partition("gpu", cluster),), active=(busy,))
    room = headroom(snap)
    assert (room.gpus, room.cpus) == (2, 12)  # gpu2's; the drained gpu3 takes no work
    assert room.may_fit(ResourceRequest(gpus_per_node=2, ntasks=12))
    assert not room.may_fit(ResourceRequest(gpus_per_node=3))
    assert not room.may_fit(ResourceRequest(ntasks=13))
    # A start the pass planned holds its share too.
    later = running(10, {"gpu2": (1, 10, (6, 7))}).allocation
    assert headroom(snap, [later]).gpus == 0
