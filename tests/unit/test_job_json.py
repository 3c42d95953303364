"""The API's Job objects (joblist.jobs_json): a job that has run lists its steps and its
clean-up, even pending again after a requeue; one pending since its submission has none to
look for."""

from __future__ import annotations

import time

from sqlalchemy import event

from shoal.model.resources import ResourceRequest
from shoal.server.jobs import request_to_json
from shoal.server.joblist import jobs_json
from shoal.store.engine import make_engine, session_factory
from shoal.store.models import Base, CleanupRow, JobRow, StepRow


def _job(name: str, **kw) -> JobRow:
    fields = dict(name=name, user="alice", partition="gpu", state="PENDING", submit_time=time.time(),
                  request=request_to_json(ResourceRequest(nodes=1, ntasks=1)), spec={"script": "#!/bin/sh\ntrue\n"}, workdir="/tmp")
    return JobRow(**{**fields, **kw})


def _step(job_id: int, run: int) -> StepRow:
    return StepRow(job_id=job_id, step_id=0, run=run, name="python", state="COMPLETED", ntasks=1,
                   nodelist="node01", start_time=1.0, end_time=2.0, exit_code=0)


def test_steps_and_clean_ups_are_listed_for_jobs_that_ran_and_looked_for_only_there():
    engine = make_engine("sqlite://")
    Base.metadata.create_all(engine)
    sessions = session_factory(engine)
    with sessions() as s, s.begin():
        fresh, requeued, running = _job("fresh"), _job("requeued", restart_count=1), _job("running")
        running.state, running.start_time, running.batch_host = "RUNNING", 5.0, "node01"
        s.add_all([fresh, requeued, running])
        s.flush()
        s.add_all([_step(requeued.id, run=0), _step(running.id, run=0),
                   CleanupRow(job_id=requeued.id, run=0, node="node01", cpus=1, memory_mb=1, since=1.0)])
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with sessions() as s:
        rows = sorted(s.query(JobRow).all(), key=lambda r: r.id)
        statements.clear()
        by_name = {j["name"]: j for j in jobs_json(s, rows)}
        assert [st["step_id"] for st in by_name["requeued"]["steps"]] == ["0"], "a requeued job keeps its steps"
        assert by_name["requeued"]["completing"] is True
        assert [st["step_id"] for st in by_name["running"]["steps"]] == ["batch", "0"]
        assert by_name["fresh"]["steps"] == [] and by_name["fresh"]["completing"] is False
        statements.clear()
        assert jobs_json(s, [r for r in rows if r.name == "fresh"])[0]["steps"] == []
        assert not statements, "a job pending since its submission: no query for its steps or clean-ups"
