"""squeue's filters are defined once (joblist.JobFilter): read from the store as SQL and from
the queue view kept in memory, they pick the same jobs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from shoal.server import jobs as jobsvc
from shoal.server.auth import Principal
from shoal.server.joblist import JobFilter
from shoal.store.engine import make_engine, session_factory
from shoal.store.models import Base, JobRow

USERS, PARTS, NAMES = ["alice", "bob", "carol"], ["gpu", "cpu"], ["train", "eval", "x,y"]
STATES = ["PENDING", "RUNNING", "COMPLETED", "FAILED"]

jobs = st.lists(st.tuples(st.sampled_from(USERS), st.sampled_from(PARTS), st.sampled_from(STATES),
                          st.sampled_from(NAMES[:2]), st.one_of(st.none(), st.floats(0, 100))),
                min_size=0, max_size=25)
subset = st.one_of(st.none(), st.lists(st.sampled_from(USERS + PARTS + NAMES + STATES), min_size=1, max_size=3))
filters = st.builds(
    JobFilter.of, user=subset.map(lambda v: ",".join(v) if v else None),
    partition=subset.map(lambda v: ",".join(v) if v else None),
    state=st.lists(st.sampled_from(STATES + ["pending", "r"]), max_size=2),
    name=st.one_of(st.none(), st.sampled_from(NAMES)), since=st.one_of(st.none(), st.floats(0, 100)),
    owner=st.one_of(st.none(), st.builds(Principal, user=st.sampled_from(USERS), role=st.just("user")),
                    st.builds(Principal, user=st.sampled_from(USERS), role=st.just("job"),
                              job_id=st.integers(1, 25))))


@settings(max_examples=150, deadline=None)
@given(jobs, filters)
def test_the_store_and_the_queue_view_pick_the_same_jobs(rows, wanted):
    engine = make_engine("sqlite://")
    Base.metadata.create_all(engine)
    sessions = session_factory(engine)
    with sessions() as s, s.begin():
        for i, (user, part, state, name, end) in enumerate(rows, start=1):
            s.add(JobRow(id=i, name=name, user=user, partition=part, state=state, submit_time=0.0, end_time=end,
                         request={}, spec={}, workdir="/"))
    with sessions() as s:
        in_memory = jobsvc.queue_view(s, list(s.execute(select(*jobsvc.QUEUE_VIEW.values())).all()))
        from_store = list(s.scalars(select(JobRow.id).where(*wanted.conditions()).order_by(JobRow.id)))
    assert [j["job_id"] for j in wanted.select(in_memory)] == from_store
