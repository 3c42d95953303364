"""The controller's row cache keeps its pending jobs in the queue's order as they come, change
and go (``server.snapshot._ById`` with a key), so that a pass need not sort 90,000 of them:
whatever happens, its values are what ``queue_order`` makes of them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shoal.model.resources import ResourceRequest
from shoal.model.snapshot import PendingJob
from shoal.sched.queue import order_key, queue_order
from shoal.server.snapshot import _ById

REQUEST = ResourceRequest(nodes=1, ntasks=1)
STEPS = st.lists(st.tuples(st.sampled_from(["new", "new", "new", "change", "drop", "requeue", "read"]),
                           st.integers(0, 2), st.sampled_from([0.0, 1.0, 5.0]), st.integers(0, 40)),
                 max_size=60)


def _job(jid: int, priority: int, submit: float) -> PendingJob:
    return PendingJob(id=jid, user="alice", name="j", partition="gpu", request=REQUEST, submit_time=submit,
                      priority=priority)


@given(STEPS)
def test_the_pending_jobs_are_kept_in_the_queue_s_order_whatever_comes_changes_and_goes(steps):
    kept = _ById(order_key, queue_order)
    jobs: dict[int, PendingJob] = {}
    gone: dict[int, PendingJob] = {}  # started: a requeue brings them back, their old submit time kept
    next_id, clock = 1, 0.0
    for what, priority, later, pick in steps:
        if what == "new":  # mostly later and of the same priority: appended in order
            clock += later
            jobs[next_id] = _job(next_id, priority, clock)
            kept.put(next_id, jobs[next_id])
            next_id += 1
        elif what == "change" and jobs:  # scontrol update priority, or a requeue with its old submit time
            jid = sorted(jobs)[pick % len(jobs)]
            jobs[jid] = _job(jid, priority, jobs[jid].submit_time)
            kept.put(jid, jobs[jid])
        elif what == "drop" and jobs:
            jid = sorted(jobs)[pick % len(jobs)]
            gone[jid] = jobs.pop(jid)
            kept.drop(jid)
        elif what == "requeue" and gone:
            jid = sorted(gone)[pick % len(gone)]
            jobs[jid] = gone.pop(jid)
            kept.put(jid, jobs[jid])
        else:
            assert list(kept.values()) == queue_order(jobs.values())
    assert list(kept.values()) == queue_order(jobs.values())


def test_without_a_key_the_values_are_kept_in_id_order():
    kept = _ById()
    for jid in (3, 5, 1, 4):
        kept.put(jid, jid * 10)
    assert kept.values() == (10, 30, 40, 50)
