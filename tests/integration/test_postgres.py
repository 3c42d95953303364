"""A whole local cluster on PostgreSQL (`shoal up --db postgresql+psycopg://...`).

The administrator's story: the same commands, the same results, and the rows really are
in PostgreSQL, not in an SQLite file the server fell back to.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, func, select

from shoal.store.models import JobRow, StepRow

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_cluster(make_cluster, postgres_url):
    cluster = make_cluster(extra=("--db", postgres_url))
    cluster.db_url = postgres_url
    return cluster


def rows_in_postgres(url: str, model, *where) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(model).where(*where)))
    finally:
        engine.dispose()


def test_a_two_node_srun_job_completes_and_is_stored_in_postgres(pg_cluster):
    c = pg_cluster
    job_id = c.sbatch("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=2", "--job-name=pg-gang",
                      "--output=pg-gang.out", "--wrap", "srun bash -c 'echo $(hostname) $SLURM_PROCID'")
    job = c.wait_for(job_id, timeout=60)
    assert job["state"] == "COMPLETED", job
    assert job["exit_code"] == 0 and job["nodes"] == 2
    lines = sorted((c.workdir / "pg-gang.out").read_text().split("\n")[:2])
    assert [line.split()[1] for line in lines] == ["0", "1"]
    assert {line.split()[0] for line in lines} == set(c.node_names())

    [row] = rows_in_postgres(c.db_url, JobRow, JobRow.id == job_id)
    assert row.state == "COMPLETED" and row.name == "pg-gang"
    assert row.allocation["nodes"][0]["gpus"] and len(row.allocation["nodes"]) == 2
    steps = rows_in_postgres(c.db_url, StepRow, StepRow.job_id == job_id)
    assert [(s.step_id, s.state, s.ntasks) for s in steps] == [(0, "COMPLETED", 2)]


def test_a_burst_of_twenty_jobs_all_complete(pg_cluster):
    """The scheduler, 2 agents and 20 submissions write at once: no conflict may lose a job."""
    c = pg_cluster
    ids = [c.sbatch(f"--job-name=burst{i}", "--gpus=1", "--output=/dev/null", "--wrap", f"echo {i}")
           for i in range(20)]
    assert len(set(ids)) == 20
    for job_id in ids:
        job = c.wait_for(job_id, timeout=90)
        assert job["state"] == "COMPLETED", job
    engine = create_engine(c.db_url)
    try:
        with engine.connect() as conn:
            done = conn.scalar(select(func.count()).select_from(JobRow).where(
                JobRow.id.in_(ids), JobRow.state == "COMPLETED"))
    finally:
        engine.dispose()
    assert done == 20


def test_sacct_reports_jobs_and_steps_from_postgres(pg_cluster):
    c = pg_cluster
    ok = c.sbatch("--job-name=pg-ok", "--output=/dev/null", "--wrap", "srun true")
    failing = c.sbatch("--job-name=pg-fail", "--output=/dev/null", "--wrap", "exit 3")
    c.wait_for(ok, timeout=60)
    c.wait_for(failing, timeout=60)
    out = c.run(["sacct", "-j", f"{ok},{failing}", "-n", "-P", "-o", "JobID,JobName,State,ExitCode"]).stdout
    rows = [line.split("|") for line in out.strip().splitlines()]
    assert [str(ok), "pg-ok", "COMPLETED", "0:0"] in rows, out
    assert [f"{ok}.batch", "batch", "COMPLETED", "0:0"] in rows, out
    assert [f"{ok}.0", "true", "COMPLETED", "0:0"] in rows, out
    assert [str(failing), "pg-fail", "FAILED", "3:0"] in rows, out


def test_parallel_sruns_in_one_job_each_get_their_own_step(pg_cluster):
    """`srun a & srun b & wait`: PostgreSQL runs the two step creations truly at once."""
    c = pg_cluster
    script = "#!/bin/bash\n" + "srun --nodes=1 --ntasks=1 true &\n" * 8 + (
        "fail=0; for p in $(jobs -p); do wait $p || fail=1; done; exit $fail\n")
    ids = [c.sbatch("--nodes=1", "--output=steps-%j.out", script=script) for _ in range(3)]
    for job_id in ids:
        job = c.wait_for(job_id, timeout=60)
        assert job["state"] == "COMPLETED", (job, (c.workdir / f"steps-{job_id}.out").read_text())
        steps = sorted(int(s["step_id"]) for s in job["steps"] if s["step_id"] != "batch")
        assert steps == list(range(8))


def test_what_postgres_cannot_store_is_refused_with_a_reason(pg_cluster):
    """SQLite stores anything; PostgreSQL enforces types, so the API edge must say no first (422, not 500)."""
    from shoal.api_client import ClientError

    c = pg_cluster
    body = {"script": "#!/bin/sh\ntrue\n", "workdir": str(c.workdir)}
    for bad, field in [({"comment": "a\x00b"}, "NUL"), ({"time_limit_s": 2**31}, "2147483647")]:
        with pytest.raises(ClientError) as e:
            c.api("POST", "/shoal/v1/jobs", {**body, **bad})
        assert e.value.status == 422 and field in str(e.value), e.value
    with pytest.raises(ClientError) as e:
        c.api("POST", "/shoal/v1/tokens", {"user": "bob", "description": "x" * 201})
    assert e.value.status == 422, e.value
    out = c.run(["sbatch", "--time=100000000", "--wrap", "true"], check=False)
    assert out.returncode != 0 and "Internal Server Error" not in out.stderr, out.stderr
