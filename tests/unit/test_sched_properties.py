"""Invariants of a scheduling pass over random clusters and queues (hypothesis)."""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_cluster import A100, H100, gpu_node, running

from shoal.model.job import JobState
from shoal.model.node import NodeState
from shoal.model.resources import ResourceRequest
from shoal.model.snapshot import ActiveJob, Dependency, JobRecord, Partition, PendingJob, PodTerms, Snapshot
from shoal.sched import SchedConfig, check_feasible, place, queue_order, schedule
from shoal.sched.placement import ClusterState, Demand, PlacementCache, feature_matches, gpu_type_matches
from shoal.sched.schedule import waits_behind, waits_settled

FEATURES = ("ib", "nvlink")
NOW = 1000.0
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw, all_up: bool = False):
    count = draw(st.integers(1, 6))
    out = []
    for i in range(1, count + 1):
        state = NodeState.UP if all_up else draw(
            st.sampled_from([NodeState.UP] * 4 + [NodeState.DOWN, NodeState.DRAIN]))
        out.append(gpu_node(
            f"n{i}", gpus=draw(st.integers(0, 4)), cpus=draw(st.integers(1, 8)),
            memory_mb=draw(st.sampled_from([1000, 2000, 4000])),
            product=draw(st.sampled_from([H100, A100])), state=state,
            features=tuple(draw(st.sets(st.sampled_from(FEATURES))))))
    return tuple(out)


@st.composite
def actives(draw, cluster, busy: bool = False):
    """Per node, maybe one job holding part of it (or all of it, exclusively)."""
    out = []
    for i, node in enumerate(cluster):
        if not draw(st.booleans()) and not (busy and draw(st.booleans())):
            continue
        exclusive = draw(st.integers(0, 4)) == 0
        if exclusive:
            hold = (node.cpus, node.memory_mb, tuple(g.index for g in node.gpus))
        else:
            gpus = draw(st.sets(st.sampled_from([g.index for g in node.gpus]))) if node.gpus else set()
            hold = (draw(st.integers(0, node.cpus)), draw(st.integers(0, node.memory_mb)),
                    tuple(sorted(gpus)))
        out.append(running(
            900 + i, {node.name: hold}, exclusive=exclusive,
            start_time=draw(st.sampled_from([0.0, 500.0, 900.0])),
            time_limit_s=draw(st.sampled_from([200, 1000, 5000] + ([] if busy else [None]))),
            array_job_id=draw(st.sampled_from([None, 70]))))
    return out


@st.composite
def requests(draw, names):
    return ResourceRequest(
        nodes=draw(st.integers(1, 3)),
        ntasks=draw(st.integers(1, 4)),
        cpus_per_task=draw(st.integers(1, 2)),
        mem_per_node_mb=draw(st.sampled_from([0, 500, 1500])),
        gpus_per_node=draw(st.integers(0, 4)),
        gpu_type=draw(st.sampled_from([None, "h100", "a100"])),
        exclusive=draw(st.integers(0, 5)) == 0,
        features=tuple(draw(st.sets(st.sampled_from(FEATURES), max_size=1))),
        nodelist=tuple(draw(st.sets(st.sampled_from(names), max_size=1))),
        exclude=tuple(draw(st.sets(st.sampled_from(names), max_size=1))),
    )


@st.composite
def queues(draw, cluster, partitions, plain: bool = False, min_size: int = 1):
    names = [n.name for n in cluster]
    count = draw(st.integers(min_size, 10))
    out = []
    for job_id in range(1, count + 1):
        deps: tuple[Dependency, ...] = ()
        if not plain and draw(st.integers(0, 3)) == 0:
            kind = draw(st.sampled_from(["after", "afterany", "afterok", "afternotok", "singleton"]))
            target = () if kind == "singleton" else (draw(st.sampled_from([1, 2, 50, 51, 404])),)
            deps = (Dependency(kind, target),)
        array = None if plain else draw(st.sampled_from([None, None, 70, 71]))
        out.append(PendingJob(
            id=job_id, user=draw(st.sampled_from(["alice", "bob"])),
            name=draw(st.sampled_from(["train", "eval"])),
            partition=draw(st.sampled_from([p.name for p in partitions])),
            request=draw(requests(names)), submit_time=float(draw(st.integers(0, 5))),
            time_limit_s=draw(st.sampled_from([None, 100, 600, 3600])),
            priority=draw(st.integers(0, 2)),
            held=False if plain else draw(st.integers(0, 6)) == 0,
            begin_time=None if plain else draw(st.sampled_from([None, None, 500.0, 5000.0])),
            dependencies=deps, dependency_any=draw(st.booleans()),
            array_job_id=array, array_throttle=None if array is None else draw(st.integers(1, 2)),
        ))
    return out


JOB_RECORDS = {
    50: JobRecord(50, JobState.COMPLETED), 51: JobRecord(51, JobState.FAILED),
}


@st.composite
def scenarios(draw):
    cluster = draw(clusters())
    names = [n.name for n in cluster]
    partitions = [Partition("p0", tuple(names))]
    if draw(st.booleans()):
        partitions.append(Partition("p1", tuple(draw(st.sets(st.sampled_from(names), min_size=1))),
                                    max_nodes=draw(st.sampled_from([None, 1, 2])),
                                    max_time_s=draw(st.sampled_from([None, 600]))))
    snap = Snapshot(NOW, cluster, tuple(partitions), tuple(draw(queues(cluster, partitions))),
                    tuple(draw(actives(cluster))), dict(JOB_RECORDS))
    config = SchedConfig(policy=draw(st.sampled_from(["fifo", "backfill"])),
                         kill_invalid_depend=draw(st.booleans()),
                         backfill=draw(st.sampled_from(["easy", "conservative"])))
    return snap, config


def expected_share(node, request: ResourceRequest):
    if request.exclusive:
        return node.cpus, node.memory_mb, len(node.gpus)
    return request.cpus_per_node, request.mem_per_node_mb or node.memory_mb, request.gpus_per_node


@given(scenarios())
@SETTINGS
def test_no_resource_is_ever_oversubscribed(scenario):
    snap, config = scenario
    plan = schedule(snap, config)
    nodes = {n.name: n for n in snap.nodes}
    cpus, mem, jobs_on = defaultdict(int), defaultdict(int), defaultdict(int)
    gpus: dict[str, list[int]] = defaultdict(list)
    exclusive_on = defaultdict(int)
    for allocation in [a.allocation for a in snap.active] + [s.allocation for s in plan.starts]:
        for name, a in allocation.nodes:
            cpus[name] += a.cpus
            mem[name] += a.memory_mb
            gpus[name].extend(a.gpus)
            jobs_on[name] += 1
            exclusive_on[name] += allocation.exclusive
    for name, node in nodes.items():
        assert cpus[name] <= node.cpus
        assert mem[name] <= node.memory_mb
        assert len(gpus[name]) == len(set(gpus[name])), f"GPU given twice on {name}"
        assert set(gpus[name]) <= {g.index for g in node.gpus}
        if exclusive_on[name]:
            assert jobs_on[name] == 1, f"{name} is held exclusively but shared"


@given(scenarios())
@SETTINGS
def test_each_start_is_a_whole_gang_that_honours_the_request(scenario):
    snap, config = scenario
    plan = schedule(snap, config)
    nodes = {n.name: n for n in snap.nodes}
    pending = {j.id: j for j in snap.pending}
    parts = {p.name: p for p in snap.partitions}
    for start in plan.starts:
        job = pending[start.job_id]
        request, d = job.request, Demand.of(job.request)
        names = start.allocation.node_names
        assert len(names) == len(set(names)) == d.nodes
        assert set(request.nodelist) <= set(names)
        assert start.allocation.exclusive == request.exclusive
        for name, a in start.allocation.nodes:
            node = nodes[name]
            assert node.state is NodeState.UP
            assert name in parts[job.partition].nodes
            assert name not in request.exclude
            assert all(feature_matches(f, node.features) for f in request.features)
            want_cpus, want_mem, want_gpus = expected_share(node, request)
            assert (a.cpus, a.memory_mb, len(a.gpus)) == (want_cpus, want_mem, want_gpus)
            if request.gpu_type and request.gpus_per_node and not request.exclusive:
                products = {g.index: g.product for g in node.gpus}
                assert all(gpu_type_matches(products[i], request.gpu_type) for i in a.gpus)


@given(scenarios())
@SETTINGS
def test_every_pending_job_is_started_or_given_exactly_one_reason(scenario):
    snap, config = scenario
    plan = schedule(snap, config)
    started = [s.job_id for s in plan.starts]
    assert len(started) == len(set(started))
    for job in snap.pending:
        places = (job.id in started) + (job.id in plan.reasons) + (job.id in plan.never)
        assert places == 1, f"job {job.id} is in {places} of starts/reasons/never"
        if job.id in plan.reasons:
            assert plan.reasons[job.id]
    assert set(plan.reasons) | set(plan.never) | set(started) == {j.id for j in snap.pending}


@given(st.data())
@SETTINGS
def test_a_job_that_fits_an_empty_cluster_starts_on_one(data):
    cluster = data.draw(clusters(all_up=True))
    part = Partition("p0", tuple(n.name for n in cluster))
    job = data.draw(queues(cluster, [part], plain=True))[0]
    snap = Snapshot(NOW, cluster, (part,), (job,), ())
    plan = schedule(snap, data.draw(st.sampled_from([SchedConfig("fifo"), SchedConfig()])))
    feasible = check_feasible(job.request, part, cluster, time_limit_s=job.time_limit_s) is None
    assert feasible == bool(plan.starts), (check_feasible(job.request, part, cluster), plan)


@given(st.data())
@settings(SETTINGS, max_examples=200)
def test_backfill_never_delays_the_reserved_job(data):
    """The job waiting with Resources fits at the earliest time it would have fitted had
    nothing backfilled; with no such time, nothing started on the nodes it could use."""
    cluster = data.draw(clusters())
    part = Partition("p0", tuple(n.name for n in cluster))
    active = data.draw(actives(cluster, busy=True))
    queue = data.draw(queues(cluster, [part], plain=True, min_size=3))
    snap = Snapshot(NOW, cluster, (part,), tuple(queue), tuple(active))
    plan = schedule(snap, SchedConfig("backfill"))
    waiting = [j for j in queue if plan.reasons.get(j.id) == "Resources"]
    assert len(waiting) <= 1
    if not waiting:
        return
    reserved = waiting[0]
    by_id = {j.id: j for j in queue}
    rank = {j.id: i for i, j in enumerate(queue_order(queue))}
    ahead = [s for s in plan.starts if rank[s.job_id] < rank[reserved.id]]
    behind = [s for s in plan.starts if rank[s.job_id] > rank[reserved.id]]

    def ends(start, limit):
        return None if limit is None else max(NOW, start + limit)

    # Jobs ahead of it in the queue may take what they like; those behind must not delay it.
    before = [(a.allocation, ends(a.start_time, a.time_limit_s)) for a in active] + [
        (s.allocation, ends(NOW, by_id[s.job_id].time_limit_s)) for s in ahead]
    after = before + [(s.allocation, ends(NOW, by_id[s.job_id].time_limit_s)) for s in behind]

    def fits_at(holders, t):
        state = ClusterState(cluster, [a for a, end in holders if end is None or end > t])
        return place(reserved.request, state, partition=part).ok

    times = sorted({end for _, end in before if end is not None})
    shadow = next((t for t in times if fits_at(before, t)), None)
    if shadow is not None:
        assert fits_at(after, shadow), f"reserved job {reserved.id} delayed past {shadow}"
    else:
        d = Demand.of(reserved.request)
        state = ClusterState(cluster)
        usable = {state.nodes[r].info.name for r in state.candidates(d, part, "now")}
        for s in behind:
            assert not usable & set(s.allocation.node_names)


@given(st.data())
@SETTINGS
def test_a_pass_with_a_kept_cache_plans_what_a_cold_pass_plans(data):
    """The caller's PlacementCache is speed only: passes after one another over one node tuple,
    each with other running jobs and queue, plan exactly what a pass built afresh plans."""
    cluster = data.draw(clusters())
    names = [n.name for n in cluster]
    partitions = (Partition("p0", tuple(names)),)
    config = SchedConfig(policy="backfill", backfill=data.draw(st.sampled_from(["easy", "conservative"])))
    pool = data.draw(actives(cluster))  # at most one job a node: any subset is a valid cluster
    cache = PlacementCache()
    for _ in range(data.draw(st.integers(2, 5))):
        # The same job objects from pass to pass, a few started or ended in between, as the
        # simulator hands them (the cache is then brought up to date, not rebuilt).
        held = [job for job in pool if data.draw(st.integers(0, 3))]
        snap = Snapshot(NOW, cluster, partitions, tuple(data.draw(queues(cluster, partitions))),
                        tuple(held), dict(JOB_RECORDS))
        warm, cold = schedule(snap, config, cache), schedule(snap, config)
        assert (warm.starts, warm.reasons, warm.estimates) == (cold.starts, cold.reasons, cold.estimates)


def gpu_cluster(data, node_limit: bool) -> tuple[tuple, list[Partition]]:
    """2 to 5 GPU nodes of 4 GPUs that every shape of these tests fits; a partition of them
    all, and maybe one of some of them with a time limit (and with ``node_limit`` a node limit)."""
    cluster = tuple(gpu_node(f"n{i}", gpus=4, cpus=8, memory_mb=4000)
                    for i in range(1, data.draw(st.integers(2, 5)) + 1))
    names = [n.name for n in cluster]
    partitions = [Partition("p0", tuple(names))]
    if data.draw(st.booleans()):
        limit = {"max_nodes": data.draw(st.sampled_from([None, 1]))} if node_limit else {}
        partitions.append(Partition("p1", tuple(data.draw(st.sets(st.sampled_from(names), min_size=1))),
                                    max_time_s=data.draw(st.sampled_from([None, 300])), **limit))
    return cluster, partitions


@given(st.data())
@settings(SETTINGS, max_examples=200)
def test_jobs_sharing_one_request_are_planned_as_jobs_with_copies_of_it(data):
    """An array's tasks share one request object, and a pass settles a task behind an EASY
    reservation as it settled the one before it (``_Pass.settled``, which a usual job finds
    before its gates are judged): the plan is the one made when every job has its own copy of
    the request, so nothing is settled ahead. A busy cluster of GPU nodes that every shape
    fits, and a queue longer than it holds, some of whose jobs are gated by something of their
    own (a hold, a begin time, a reservation, an array throttle) or by their partition's limits,
    and a pass that may test only a few."""
    cluster, partitions = gpu_cluster(data, node_limit=True)
    shapes = [ResourceRequest(nodes=data.draw(st.integers(1, 2)), ntasks=1, mem_per_node_mb=500,
                              gpus_per_node=data.draw(st.integers(1, 4)))
              for _ in range(data.draw(st.integers(1, 3)))]
    queue = [PendingJob(id=i, user="alice", name="task", partition=data.draw(st.sampled_from([p.name for p in partitions])),
                        request=shapes[0], submit_time=float(i), priority=data.draw(st.integers(0, 1)),
                        time_limit_s=data.draw(st.sampled_from([None, 100, 600])),
                        **data.draw(st.sampled_from([{}] * 6 + [
                            {"held": True}, {"begin_time": NOW + 50}, {"reservation": "gone"},
                            {"array_job_id": 70, "array_throttle": 1}])))
             for i in range(1, data.draw(st.integers(2, 30)) + 1)]
    which = [data.draw(st.integers(0, len(shapes) - 1)) for _ in queue]
    shared = tuple(dataclasses.replace(job, request=shapes[k]) for job, k in zip(queue, which))
    copies = tuple(dataclasses.replace(job, request=copy.copy(shapes[k])) for job, k in zip(queue, which))
    active = tuple(data.draw(actives(cluster, busy=True)))
    config = SchedConfig(policy="backfill", backfill=data.draw(st.sampled_from(["easy", "conservative"])),
                         bf_max_job_test=data.draw(st.sampled_from([None, None, 3, 8])))
    one, other = (schedule(Snapshot(NOW, cluster, tuple(partitions), pending, active, dict(JOB_RECORDS)), config)
                  for pending in (shared, copies))
    assert (one.starts, one.reasons, one.estimates, one.preemptions, one.tested) == \
        (other.starts, other.reasons, other.estimates, other.preemptions, other.tested)


def started_by(plan, queue: tuple[PendingJob, ...], active: tuple[ActiveJob, ...]) -> tuple[tuple, tuple]:
    """The running jobs and the queue once ``plan``'s starts are applied, nothing ended."""
    started = {st_.job_id: st_.allocation for st_ in plan.starts}
    by_id = {job.id: job for job in queue}
    active += tuple(ActiveJob(id=jid, user=by_id[jid].user, name="j", partition=by_id[jid].partition,
                              allocation=allocation, start_time=NOW, time_limit_s=by_id[jid].time_limit_s)
                    for jid, allocation in started.items())
    return active, tuple(job for job in queue if job.id not in started)


@given(st.data())
@settings(SETTINGS, max_examples=200)
def test_a_job_queued_like_one_a_pass_settled_changes_nothing_the_next_pass_plans(data):
    """The server skips the pass a submission would cost when the job cannot start: after a
    full EASY pass with its starts applied and nothing ended, a job with the request,
    partition, time limit and rank of one that waited behind a reservation
    (``Plan.settled``, ``waits_settled``) is planned to wait, whatever its own gates, and
    the jobs queued before it are planned as without it, under either priority. A busy
    cluster of GPU nodes, a queue of a few shapes from several users, some with a nice or a
    priority of their own."""
    cluster, partitions = gpu_cluster(data, node_limit=False)
    shapes = [ResourceRequest(nodes=data.draw(st.integers(1, 2)), ntasks=1, mem_per_node_mb=500,
                              gpus_per_node=data.draw(st.integers(1, 4)))
              for _ in range(data.draw(st.integers(1, 3)))]
    ranks = st.fixed_dictionaries({"user": st.sampled_from(["alice", "bob"]), "nice": st.sampled_from([0, 0, 100]),
                                   "priority": st.sampled_from([0, 0, 1]), "qos": st.sampled_from([None, "high"])})
    queue = tuple(PendingJob(id=i, name="j", partition=data.draw(st.sampled_from([p.name for p in partitions])),
                             request=data.draw(st.sampled_from(shapes)), submit_time=float(i),
                             time_limit_s=data.draw(st.sampled_from([None, 100, 600])), **data.draw(ranks))
                  for i in range(1, data.draw(st.integers(2, 30)) + 1))
    config = SchedConfig(policy="backfill", backfill="easy", priority=data.draw(st.sampled_from(["basic", "multifactor"])),
                         bf_max_job_test=data.draw(st.sampled_from([None, None, 3, 8])))
    active = tuple(data.draw(actives(cluster, busy=True)))
    first = schedule(Snapshot(NOW, cluster, tuple(partitions), queue, active, dict(JOB_RECORDS)), config)
    if not first.settled:
        return
    active, waiting = started_by(first, queue, active)
    keys = sorted(first.settled.items(), key=repr)
    fresh = []
    for i in range(data.draw(st.integers(1, 5))):
        (request, partition, limit), (user, account, qos, nice, priority) = data.draw(st.sampled_from(keys))
        fresh.append(PendingJob(id=100 + i, user=user, name="fresh", partition=partition, request=request,
                                submit_time=NOW, time_limit_s=limit, account=account, qos=qos, nice=nice,
                                priority=priority, **data.draw(st.sampled_from([{}] * 4 + [
                                    {"held": True}, {"begin_time": NOW + 50},
                                    {"dependencies": (Dependency("afterok", (1,)),)}]))))
    assert all(waits_settled(first.settled, job) for job in fresh)
    later = NOW + data.draw(st.sampled_from([0.0, 5.0]))
    before, after = (schedule(Snapshot(later, cluster, tuple(partitions), pending, active, dict(JOB_RECORDS)), config)
                     for pending in (waiting, waiting + tuple(fresh)))
    assert after.starts == before.starts and not after.preemptions
    assert all(job.id in after.reasons for job in fresh)
    assert {jid: r for jid, r in after.reasons.items() if jid < 100} == before.reasons



@given(st.data())
@settings(SETTINGS, max_examples=200)
def test_a_job_queued_behind_where_a_partial_pass_stopped_changes_nothing_the_next_one_plans(data):
    """Between full backfill passes the server skips the pass a submission would cost when
    the job comes after the job where the last partial quick pass stopped (``Plan.stopped``,
    ``waits_behind``): with that pass's starts applied and nothing ended, the next partial
    pass starts nothing more and plans the jobs queued before as without it. A busy cluster
    of GPU nodes, a queue of a few shapes and priorities, new jobs of any shape, partition,
    priority and gate queued later."""
    cluster, partitions = gpu_cluster(data, node_limit=False)
    shapes = [ResourceRequest(nodes=data.draw(st.integers(1, 2)), ntasks=1, mem_per_node_mb=500,
                              gpus_per_node=data.draw(st.integers(1, 4)))
              for _ in range(data.draw(st.integers(1, 3)))]
    names = [p.name for p in partitions]
    queue = tuple(PendingJob(id=i, user="alice", name="j", partition=data.draw(st.sampled_from(names)),
                             request=data.draw(st.sampled_from(shapes)), submit_time=float(i),
                             time_limit_s=data.draw(st.sampled_from([None, 100, 600])),
                             priority=data.draw(st.sampled_from([0, 0, 1])))
                  for i in range(1, data.draw(st.integers(2, 30)) + 1))
    config = SchedConfig(bf_interval_s=30).quick()
    active = tuple(data.draw(actives(cluster, busy=True)))
    first = schedule(Snapshot(NOW, cluster, tuple(partitions), queue, active, dict(JOB_RECORDS)), config)
    if first.stopped is None:
        return
    active, waiting = started_by(first, queue, active)
    fresh = [PendingJob(id=100 + i, user="bob", name="fresh", partition=data.draw(st.sampled_from(names)),
                        request=ResourceRequest(nodes=1, ntasks=1, mem_per_node_mb=500,
                                                gpus_per_node=data.draw(st.integers(0, 1))),
                        submit_time=NOW, time_limit_s=data.draw(st.sampled_from([None, 10])),
                        priority=data.draw(st.integers(-1, 1)))
             for i in range(data.draw(st.integers(1, 5)))]
    fresh = [job for job in fresh if waits_behind(first.stopped, job)]
    assert all(-job.priority >= first.stopped[0] for job in fresh)
    before, after = (schedule(Snapshot(NOW, cluster, tuple(partitions), pending, active, dict(JOB_RECORDS)), config)
                     for pending in (waiting, waiting + tuple(fresh)))
    assert after.starts == before.starts == [] and not after.preemptions
    assert after.reasons == before.reasons and after.stopped == before.stopped == first.stopped

@given(st.lists(st.tuples(st.integers(1, 60), st.sampled_from([0.0, 1.0, 2.5, 7.0]), st.integers(-2, 2)),
                unique_by=lambda t: t[0], max_size=40),
       st.booleans(), st.dictionaries(st.integers(1, 60), st.integers(-3, 3)))
@SETTINGS
def test_the_queue_order_is_priority_then_submit_time_then_id_whatever_order_the_jobs_come_in(
        specs, multifactor, priorities):
    """queue_order sorts by one number at a time (server/snapshot.py hands it the queue in id
    order); the result must be the order of the whole key, for any order and priorities."""
    from sched_cluster import job

    jobs = [job(jid, submit_time=submit, priority=prio) for jid, submit, prio in specs]
    given = priorities if multifactor else None
    want = sorted(jobs, key=lambda j: (-(given.get(j.id, j.priority) if given is not None else j.priority),
                                       j.submit_time, j.id))
    assert [j.id for j in queue_order(jobs, given)] == [j.id for j in want]


@given(scenarios(), st.booleans())
@SETTINGS
def test_a_partial_quick_pass_plans_what_the_whole_one_plans_and_leaves_only_the_rest_unsaid(scenario, gangs):
    """The quick pass stops once every node is held back (``SchedConfig.partial``): what it
    starts and preempts is what the same pass over the whole queue does, each reason it gives
    and each job it cancels (kill_invalid_depend) that pass's; the jobs it leaves unsaid come
    after all those it said."""
    snap, config = scenario
    if gangs:  # a gang whose members may start in part, so the pass runs again without it
        snap = dataclasses.replace(snap, pending=tuple(dataclasses.replace(j, gang="g") if j.id % 2 else j
                                                       for j in snap.pending))
    quick = config.quick()
    partial, whole = schedule(snap, quick), schedule(snap, dataclasses.replace(quick, partial=False))
    assert partial.starts == whole.starts
    assert partial.preemptions == whole.preemptions
    assert partial.never.items() <= whole.never.items()  # kill_invalid_depend: the next pass to reach it
    assert partial.reasons.items() <= whole.reasons.items()
    unsaid = (set(whole.reasons) | set(whole.never)) - set(partial.reasons) - set(partial.never)
    if unsaid:
        order = [j.id for j in queue_order(snap.pending)]
        said = set(partial.reasons) | set(partial.never) | {s.job_id for s in partial.starts}
        assert max(map(order.index, said)) < min(map(order.index, unsaid))


@given(scenarios())
@SETTINGS
def test_a_queue_given_in_order_is_planned_as_the_pass_orders_it_itself(scenario):
    """The server's snapshot hands its pending jobs in the queue's order (``in_queue_order``),
    and a pass with priority/basic takes them as they come: the plan is the one made from
    the same jobs in any order."""
    snap, config = scenario
    given_order = dataclasses.replace(snap, pending=tuple(queue_order(snap.pending)), in_queue_order=True)
    shuffled = dataclasses.replace(snap, pending=tuple(reversed(snap.pending)))
    for other in (given_order, shuffled):
        a, b = schedule(snap, config), schedule(other, config)
        assert (a.starts, a.reasons, a.never, a.estimates, a.preemptions) == \
            (b.starts, b.reasons, b.never, b.estimates, b.preemptions)


@given(scenarios(), st.sets(st.sampled_from(["pod", "gang", "preemptor"])), st.data())
@SETTINGS
def test_a_snapshot_that_names_its_pending_kinds_is_planned_as_one_whose_jobs_are_asked(scenario, kinds, data):
    """The server's snapshot says which of pods, gang members and preemptors its pending jobs
    include (``pending_kinds``, kept by the row cache), so a pass need not ask every job: the
    plan is the one made by asking them, with some of each kind among the jobs or none."""
    snap, config = scenario
    made = {"pod": dict(pod=PodTerms("default", ports=(8000,))), "gang": dict(gang="g"),
            "preemptor": dict(preemptor=True)}
    pending = list(snap.pending)
    for kind in kinds:
        for i in data.draw(st.sets(st.integers(0, len(pending) - 1), min_size=1), label=kind):
            pending[i] = dataclasses.replace(pending[i], **made[kind])
    asked = dataclasses.replace(snap, pending=tuple(pending))
    named = dataclasses.replace(asked, pending_kinds=frozenset(kinds))
    a, b = schedule(asked, config), schedule(named, config)
    assert (a.starts, a.reasons, a.never, a.estimates, a.preemptions) == \
        (b.starts, b.reasons, b.never, b.estimates, b.preemptions)
