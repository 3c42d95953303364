"""Hollow nodes (``shoal up --hollow N``): fifty fake nodes in one agent process hold a real
server's attention as fifty agents would: they register, stay UP on their heartbeats, and
run a stream of jobs through the ordinary scheduling, long-poll and report paths, each job
exactly once."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.cluster import LocalCluster, wait_until

NODES = 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("hollow"), nodes=NODES, gpus_per_node=8, extra=("--hollow", str(NODES)),
                     heartbeat_timeout=20)
    c.up()
    yield c
    c.down()


def _metric(cluster: LocalCluster, name: str) -> float:
    from shoal.api_client import Client

    text = Client(cluster.server, cluster.admin_token).get_bytes("/metrics").decode()
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


def _states(cluster: LocalCluster, job_ids: list[int]) -> dict[int, dict]:
    wanted = set(job_ids)
    return {j["job_id"]: j for j in cluster.jobs() if j["job_id"] in wanted}


def test_fifty_hollow_nodes_register_and_stay_up_on_their_heartbeats(cluster):
    assert f"{NODES} hollow nodes" in cluster.up_output
    out = cluster.run(["sinfo", "-h", "-o", "%D %t"]).stdout.split()
    assert out == [str(NODES), "idle"], out
    nodes = cluster.nodes_json()
    assert len(nodes) == NODES and all(len(n["gpus"]) == 8 for n in nodes)
    first = {n["name"]: n["last_heartbeat"] for n in nodes}
    # Heartbeats every 2 s (the local cluster's interval under a 20 s timeout): each node's moves on.
    wait_until(lambda: all(n["last_heartbeat"] > first[n["name"]] for n in cluster.nodes_json()), 30,
               "every hollow node to heartbeat again")
    assert {n["state"] for n in cluster.nodes_json()} == {"UP"}


def test_a_stream_of_jobs_runs_through_the_hollow_nodes_each_exactly_once(cluster):
    array = cluster.sbatch("--array=0-299", "--gpus=1", "--wrap", "sleep 0.3")
    wide = [cluster.sbatch("-N", "10", "--gpus-per-node=8", "--exclusive", "--wrap", "sleep 1") for _ in range(3)]
    failing = cluster.sbatch("--wrap", "sleep 0.2; exit 3")
    tasks = [j["job_id"] for j in cluster.jobs(job_id=str(array))]
    assert len(tasks) == 300
    ids = tasks + wide + [failing]

    def ended():
        jobs = _states(cluster, ids)
        return jobs if all(j["state"] not in ("PENDING", "RUNNING") and not j["completing"]
                           for j in jobs.values()) and len(jobs) == len(ids) else None

    jobs = wait_until(ended, 120, "the 304 jobs to end on the hollow nodes", interval=0.5)
    assert {j["state"] for jid, j in jobs.items() if jid != failing} == {"COMPLETED"}
    assert (jobs[failing]["state"], jobs[failing]["exit_code"]) == ("FAILED", 3)
    assert all(j["restart_count"] == 0 for j in jobs.values()), "a job was started twice"
    assert all(jobs[w]["nodes"] == 10 for w in wide), [jobs[w]["nodelist"] for w in wide]
    # Hollow runs last as long as their scripts' sleeps.
    for w in wide:
        assert jobs[w]["end_time"] - jobs[w]["start_time"] >= 0.9, jobs[w]
    # The runs' ends reach the store in transactions that several nodes' reports share.
    stored, commits = (_metric(cluster, name) for name in ("shoal_agent_reports_stored_total",
                                                          "shoal_agent_report_commits_total"))
    assert stored >= 50 and commits < stored, (stored, commits)
    stats = wait_until(lambda: (st := _stats(cluster)) and st["runs_ended"] >= len(ids) and st, 10,
                       "the hollow agents' statistics (written every second) to count the runs")
    assert stats["report_errors"] == 0, stats


def test_scancel_ends_a_hollow_run_and_frees_its_node(cluster):
    job = cluster.sbatch("-N", "2", "--exclusive", "--wrap", "sleep 600")
    running = cluster.wait_for(job, ("RUNNING",), timeout=30)
    cluster.run(["scancel", str(job)])
    done = cluster.wait_for(job, timeout=30)
    assert done["state"] == "CANCELLED", done
    names = {n["name"] for n in running["allocation"]["nodes"]}
    assert len(names) == 2
    wait_until(lambda: all(n["state"] == "UP" and not n["jobs"] for n in cluster.nodes_json()
                           if n["name"] in names), 20, "the cancelled job's nodes to be free")


def _stats(cluster: LocalCluster) -> dict | None:
    path = cluster.root / "state" / "hollow-stats.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_no_hollow_node_went_down(cluster):
    time.sleep(1)
    assert {n["state"] for n in cluster.nodes_json()} == {"UP"}


def test_a_wave_of_silent_nodes_requeues_or_fails_their_jobs_and_leaves_the_rest_alone(cluster):
    """Four nodes hang at once (three holding jobs, one idle): within two heartbeat timeouts
    each is DOWN, its --requeue jobs are back in the queue and the others ended NODE_FAIL,
    while every other node stays UP and every other job keeps running its first run."""
    requeue = [cluster.sbatch("-N1", "--exclusive", "--requeue", "--wrap", "sleep 600") for _ in range(3)]
    plain = [cluster.sbatch("-N1", "--exclusive", "--no-requeue", "--wrap", "sleep 600") for _ in range(3)]
    running = {j: cluster.wait_for(j, ("RUNNING",), timeout=30) for j in requeue + plain}
    node_of = {j: r["allocation"]["nodes"][0]["name"] for j, r in running.items()}
    hit = [requeue[0], requeue[1], plain[0]]
    busy = set(node_of.values())
    idle = next(n["name"] for n in cluster.nodes_json() if n["name"] not in busy)
    silent = {node_of[j] for j in hit} | {idle}
    t0 = time.time()
    (cluster.root / "state" / "hollow-silence").write_text(",".join(sorted(silent)))
    try:
        seen: dict = {}

        def settled():
            # The nodes first: a node is marked DOWN in the commit that requeues its jobs, so
            # jobs read after it never show one still running there (read before, they may).
            down = {n["name"] for n in cluster.nodes_json() if n["state"] == "DOWN"}
            jobs = _states(cluster, requeue + plain)
            seen.update(down=down, jobs={j: (jobs[j]["state"], jobs[j]["restart_count"]) for j in jobs})
            return (jobs, down) if down == silent and all(jobs[j]["restart_count"] >= 1 for j in hit[:2]) \
                and jobs[plain[0]]["state"] == "NODE_FAIL" else None

        try:
            jobs, down = wait_until(settled, 60, "the silent nodes to go DOWN and their jobs to be requeued or "
                                    "failed", interval=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}; silenced {sorted(silent)}, hit {hit}, last seen {seen}") from None
        timeout = 20  # the cluster's heartbeat timeout
        assert time.time() - t0 < 2 * timeout, f"took {time.time() - t0:.0f}s"
        assert all(n["reason"] == "Not responding" for n in cluster.nodes_json() if n["name"] in silent)
        # Back in the queue (a job may have been started again on a silent node not yet found
        # silent, and requeued once more), and now never on a silent node.
        for j in hit[:2]:
            assert jobs[j]["state"] in ("PENDING", "RUNNING"), jobs[j]
            if jobs[j]["state"] == "RUNNING":
                assert jobs[j]["allocation"]["nodes"][0]["name"] not in silent, jobs[j]
        untouched = [requeue[2], plain[1], plain[2]]
        assert all(jobs[j]["state"] == "RUNNING" and jobs[j]["restart_count"] == 0 for j in untouched), \
            [jobs[j] for j in untouched]
    finally:
        (cluster.root / "state" / "hollow-silence").write_text("")
    # Heard again, the nodes come back UP (the hung runs they still hold are killed there).
    wait_until(lambda: {n["state"] for n in cluster.nodes_json()} == {"UP"}, 30, "the silent nodes to come back UP")
    cluster.run(["scancel", *map(str, requeue + plain)])
    wait_until(lambda: all(j["state"] not in ("PENDING", "RUNNING") and not j["completing"]
                           for j in _states(cluster, requeue + plain).values()), 30, "the jobs to end")
