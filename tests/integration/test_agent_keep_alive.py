"""A real agent keeps its connections to the server (api_client ``keep_alive``): its heartbeats
go on one connection that lasts, beside its long-poll's, instead of a new connection (and TLS
handshake) per heartbeat (docs/SCALE.md)."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.integration.cluster import LocalCluster, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("keepalive"), nodes=1, gpus_per_node=1, heartbeat_timeout=5)
    c.up()
    yield c
    c.down()


def _ports(agent: psutil.Process, server_port: int) -> set[int]:
    """The agent's own ports of its established connections to the server."""
    return {c.laddr.port for c in agent.net_connections("tcp")
            if c.raddr and c.raddr.port == server_port and c.status == psutil.CONN_ESTABLISHED}


def test_an_agent_heartbeats_on_one_kept_connection(cluster):
    agent = psutil.Process(cluster.agent_pid(cluster.node_names()[0]))
    wait_until(lambda: len(_ports(agent, cluster.port)) == 2, 10, "the agent's two connections")
    seen: list[set[int]] = []
    end = time.monotonic() + 3.5  # heartbeats every second (shoal up: min(2 s, timeout / 5))
    while time.monotonic() < end:
        seen.append(_ports(agent, cluster.port))
        time.sleep(0.05)
    always = set.intersection(*seen)
    # The long-poll's connection and the heartbeats' stay the same through several heartbeats;
    # with a connection per request only the long-poll's would.
    assert len(always) == 2, seen
    assert set.union(*seen) == always, seen
    nodes = cluster.nodes_json()
    assert [n["state"] for n in nodes] == ["UP"]
