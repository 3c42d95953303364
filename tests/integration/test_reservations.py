"""An administrator's maintenance reservation on a real cluster: scontrol create, show and
delete reservation, a job that runs inside it with --reservation, and jobs kept out."""

from __future__ import annotations

import time

import pytest

from tests.integration.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    # alice and bob have tokens, not Unix accounts: their jobs run as the agent's user.
    c = LocalCluster(tmp_path_factory.mktemp("resv"), nodes=2, gpus_per_node=2, extra=("--run-jobs-as", "agent"))
    c.up()
    yield c
    c.down()


def token_env(cluster: LocalCluster, user: str) -> dict:
    return {"SHOAL_TOKEN": cluster.run(["shoal", "token", "create", "--user", user]).stdout.strip()}


def wait_reason(cluster: LocalCluster, job_id: int, reason: str, timeout: float = 15.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = cluster.job(job_id)
        if job["state"] == "PENDING" and job["reason"] == reason:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not wait with {reason!r}: {cluster.job(job_id)}")


def test_maintenance_reservation_from_create_to_delete(cluster):
    first, second = cluster.node_names()
    alice, bob = token_env(cluster, "alice"), token_env(cluster, "bob")

    out = cluster.run(["scontrol", "create", "reservation", "ReservationName=maint", "StartTime=now",
                       "Duration=1:00:00", f"Nodes={first}", "Users=alice", "Flags=MAINT"])
    assert out.stdout == "Reservation created: maint\n"
    shown = cluster.run(["scontrol", "show", "reservation"]).stdout
    assert shown.startswith("ReservationName=maint StartTime=")
    assert "Duration=01:00:00" in shown
    assert f"   Nodes={first} NodeCnt=1 CoreCnt=64 Features=(null) PartitionName=(null) Flags=MAINT\n" in shown
    assert "   Users=alice Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE" in shown
    states = {n["name"]: n["display_state"] for n in cluster.nodes_json()}
    assert states == {first: "maint", second: "idle"}

    # Only admins change reservations; the error says so.
    denied = cluster.run(["scontrol", "delete", "ReservationName=maint"], env=alice, check=False)
    assert denied.returncode != 0 and "admin" in denied.stderr
    bad = cluster.run(["scontrol", "create", "reservation", "ReservationName=x", "Duration=1:00:00",
                       f"Nodes={first}", "Users=alice", "Colour=red"], check=False)
    assert bad.returncode != 0 and "Invalid reservation parameter: Colour=red" in bad.stderr

    # alice's job names the reservation and runs on its node.
    inside = cluster.sbatch("--reservation=maint", "--wrap", "hostname", env=alice)
    job = cluster.wait_for(inside)
    assert (job["state"], job["nodelist"], job["reservation"]) == ("COMPLETED", first, "maint")
    assert "Reservation=maint" in cluster.run(["scontrol", "show", "job", str(inside)]).stdout

    # bob may not use it, and an unknown name is refused at submit as Slurm does.
    for env, name in ((bob, "maint"), (alice, "nope")):
        refused = cluster.run(["sbatch", f"--reservation={name}", "--wrap", "hostname"], env=env, check=False)
        assert refused.returncode != 0 and "Requested reservation is invalid" in refused.stderr

    # A job that needs the reserved node waits for the maintenance to end, then runs.
    outside = cluster.sbatch("-w", first, "--wrap", "hostname", env=alice)
    wait_reason(cluster, outside, "ReqNodeNotAvail, Reserved for maintenance")
    cluster.run(["scontrol", "delete", "ReservationName=maint"])
    assert cluster.wait_for(outside)["state"] == "COMPLETED"
    assert cluster.run(["scontrol", "show", "reservation"]).stdout == "No reservations in the system\n"
