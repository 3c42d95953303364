"""Administrator stories about fair-share and QOS, told on a real local cluster.

Each cluster has one node with all the GPUs, so jobs that each want all of them run one
after another and the order they start in is the queue's priority order.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.cluster import LocalCluster, wait_until

TEAMS = [
    {"name": "research", "shares": 1, "accounts": [
        {"name": "team-a", "users": ["alice", "carol"]},
        {"name": "team-b", "users": ["bob"]},
    ]},
]


def start(tmp_path, gpus: int, **config) -> LocalCluster:
    doc = {"cluster_name": "story", "partitions": [{"name": "gpu", "nodes": "node01", "default": True}],
           "nodes": {"heartbeat_interval_s": 2.0, "heartbeat_timeout_s": 30.0, "kill_wait_s": 2.0},
           "accounts": TEAMS, **config}
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(doc))
    # alice, bob and carol have tokens but no Unix accounts: their jobs run as the agent's user.
    return LocalCluster(tmp_path / "cluster", nodes=1, gpus_per_node=gpus, config=str(path),
                        extra=("--run-jobs-as", "agent"))


@pytest.fixture
def story(tmp_path):
    started: list[LocalCluster] = []

    def make(gpus: int = 4, **config) -> tuple[LocalCluster, dict[str, dict]]:
        c = start(tmp_path, gpus, **config).up()
        started.append(c)
        tokens = {u: c.api("POST", "/shoal/v1/tokens", {"user": u, "role": "user"})["token"]
                  for u in ("alice", "bob", "carol")}
        return c, {u: {"SHOAL_TOKEN": t} for u, t in tokens.items()}

    yield make
    for c in started:
        c.down()


def fair_share(**priority) -> dict:
    return {"priority": {"type": "multifactor", "weight_fairshare": 10000, **priority}}


def sprio(cluster) -> dict[str, int]:
    """user -> priority of their pending job, from sprio."""
    out = cluster.run(["sprio", "-h", "-o", "%u %Y"]).stdout.split()
    return {user: int(prio) for user, prio in zip(out[::2], out[1::2])}


def reasons(cluster) -> dict[int, str]:
    out = cluster.run(["squeue", "-h", "-t", "PD", "-o", "%i %r"]).stdout.split()
    return {int(i): r for i, r in zip(out[::2], out[1::2])}


def test_the_team_that_used_the_cluster_waits_behind_the_one_that_did_not(story):
    cluster, as_ = story(**fair_share())
    hog = cluster.sbatch("--gpus=4", "--wrap", "sleep 300", env=as_["alice"])
    cluster.wait_for(hog, states=("RUNNING",), timeout=15)
    first = cluster.sbatch("--gpus=4", "--wrap", "sleep 1", env=as_["alice"])
    second = cluster.sbatch("--gpus=4", "--wrap", "sleep 1", env=as_["bob"])
    prio = wait_until(lambda: (p := sprio(cluster)) and len(p) == 2 and p, 30, "sprio listing both jobs")
    assert prio["bob"] > prio["alice"], prio
    shares = {line.split("|")[1]: line.split("|") for line in
              cluster.run(["sshare", "-a", "-P", "-n"]).stdout.splitlines() if line.split("|")[1]}
    # Classic fair-share: research did all the using, so team-b inherits half its effective
    # usage (UE = 0 + (1 - 0) * 1/2): bob 2^-(0.5/0.5), alice 2^-(1/0.25).
    assert (shares["bob"][6], shares["alice"][6], shares["carol"][6]) == ("0.500000", "0.062500", "0.250000")
    cluster.run(["scancel", str(hog)])
    a = cluster.wait_for(first, timeout=30)
    b = cluster.wait_for(second, timeout=30)
    assert b["start_time"] < a["start_time"], "bob's job was submitted later but should start first"


def test_as_old_usage_decays_the_queue_order_comes_back(story):
    cluster, as_ = story(**fair_share(decay_half_life="0:05"))
    earlier = cluster.sbatch("--gpus=4", "--wrap", "sleep 4", env=as_["alice"])
    cluster.wait_for(earlier, timeout=30)
    hog = cluster.sbatch("--gpus=4", "--wrap", "sleep 300", env=as_["bob"])
    cluster.wait_for(hog, states=("RUNNING",), timeout=15)
    first = cluster.sbatch("--gpus=4", "--wrap", "sleep 1", env=as_["alice"])
    second = cluster.sbatch("--gpus=4", "--wrap", "sleep 1", env=as_["bob"])
    # Just after alice's run, team a has used more than team b...
    prio = sprio(cluster)
    assert prio["bob"] > prio["alice"], prio
    # ...but with a five-second half-life bob's running job soon outweighs it.
    wait_until(lambda: (p := sprio(cluster))["alice"] > p["bob"], 30, "alice overtaking bob")
    cluster.run(["scancel", str(hog)])
    a = cluster.wait_for(first, timeout=30)
    b = cluster.wait_for(second, timeout=30)
    assert a["start_time"] < b["start_time"], "alice's older usage has decayed: her job goes first"


QOS = [
    {"name": "small", "max_gpus_per_user": 2, "max_wall": "10:00"},
    {"name": "one", "max_jobs_per_user": 1, "max_submit_per_user": 2},
    {"name": "team", "grp_gpus": 1},
]


def test_qos_limits_hold_jobs_with_slurms_reasons(story):
    cluster, as_ = story(gpus=8, qos=QOS)
    alice = as_["alice"]
    running = [cluster.sbatch("--qos=small", "--gpus=2", "--time=5", "--wrap", "sleep 300", env=alice),
               cluster.sbatch("--qos=one", "--wrap", "sleep 300", env=alice),
               cluster.sbatch("--qos=team", "--gpus=1", "--wrap", "sleep 300", env=alice)]
    for job in running:
        cluster.wait_for(job, states=("RUNNING",), timeout=15)
    held = {
        cluster.sbatch("--qos=small", "--gpus=1", "--time=5", "--wrap", "true", env=alice): "QOSMaxGRESPerUser",
        cluster.sbatch("--qos=small", "--gpus=1", "--time=20", "--wrap", "true", env=as_["bob"]):
            "QOSMaxWallDurationPerJobLimit",
        cluster.sbatch("--qos=one", "--wrap", "true", env=alice): "QOSMaxJobsPerUserLimit",
        cluster.sbatch("--qos=team", "--gpus=1", "--wrap", "true", env=as_["carol"]): "AssocGrpGRES",
    }
    other_team = cluster.sbatch("--qos=team", "--gpus=1", "--wrap", "sleep 300", env=as_["bob"])
    cluster.wait_for(other_team, states=("RUNNING",), timeout=15)
    wait_until(lambda: reasons(cluster) == held, 30, f"squeue reasons {held}")
    refused = cluster.run(["sbatch", "--qos=one", "--wrap", "true"], env=alice, check=False)
    assert refused.returncode != 0
    assert "QOS one" in refused.stderr and "MaxSubmitJobsPerUser" in refused.stderr, refused.stderr
    unknown = cluster.run(["sbatch", "--qos=gold", "--wrap", "true"], env=alice, check=False)
    assert unknown.returncode != 0 and "Invalid qos specification: gold" in unknown.stderr, unknown.stderr
    stranger = cluster.run(["sbatch", "--wrap", "true"], check=False)  # root is in no account
    assert stranger.returncode != 0 and "Invalid account" in stranger.stderr, stranger.stderr
