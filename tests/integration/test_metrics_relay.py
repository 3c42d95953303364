"""HA: the HPA runs on the leader, but an agent or the gateway may report its metric samples
to a follower. The follower applies them and passes them on through the change feed, in
pieces a PostgreSQL notification can carry; the leader applies what it hears."""

from __future__ import annotations

from shoal.server.config import parse_cluster_config
from shoal.server.core import Server, _pieces

CONFIG = {"partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}]}


class Feed:
    """The change feed's publishing side, as the other servers would receive it."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def publish(self, event: dict) -> None:
        self.sent.append(event)


class Follower:
    is_leader = False


class Leader:
    is_leader = True


def server(tmp_path, name: str) -> Server:
    return Server(f"sqlite:///{tmp_path / name}.db", parse_cluster_config(CONFIG), tmp_path / name)


def test_a_followers_samples_reach_the_leaders_metrics(tmp_path):
    follower, leader = server(tmp_path, "follower"), server(tmp_path, "leader")
    try:
        follower.feed, follower.leader = Feed(), Follower()
        pod_cpu = {f"{job}.0": 0.5 for job in range(100)}  # more than one notification's worth
        follower.record_metrics({"agent": "node01"}, {"gpu_util": {"0": 87.0}, "pod_cpu": pod_cpu}, 100.0)
        follower.record_metrics({"gateway": True}, {"pods": {"default/chat-1": {"rps": 3.0, "inflight": 2.0}},
                                                    "held": {"default/chat": 4}}, 100.0)
        assert len(follower.feed.sent) > 2  # pod_cpu went in pieces
        for event in follower.feed.sent:
            leader._heard(event)
        for s in (follower, leader):  # the follower kept its own copy too
            metrics = s.kube.metrics
            assert metrics._gpu[("node01", 0)] == (87.0, 100.0)
            assert {k: v for k, (v, _t) in metrics._cpu.items()} == pod_cpu
            assert metrics._pods["default/chat-1"][:2] == (3.0, 2.0)
            assert metrics.held("default", ["chat"], now=100.5) == 4
    finally:
        follower.engine.dispose()
        leader.engine.dispose()


def test_the_leader_keeps_its_samples_to_itself(tmp_path):
    leader = server(tmp_path, "leader")
    try:
        leader.feed, leader.leader = Feed(), Leader()
        leader.record_metrics({"agent": "node02"}, {"gpu_util": {"1": 10.0}, "pod_cpu": {}}, 5.0)
        assert leader.feed.sent == [] and leader.kube.metrics._gpu[("node02", 1)] == (10.0, 5.0)
    finally:
        leader.engine.dispose()


def test_pieces_cut_every_map_and_lose_nothing():
    sample = {"pods": {f"p{i}": {"rps": i} for i in range(70)}, "held": {"a": 1}, "gpu_util": {}}
    pieces = _pieces(sample, per_piece=32)
    assert [len(next(iter(p.values()))) for p in pieces] == [32, 32, 6, 1]
    merged: dict = {}
    for p in pieces:
        for k, v in p.items():
            merged.setdefault(k, {}).update(v)
    assert merged == {"pods": sample["pods"], "held": {"a": 1}}
