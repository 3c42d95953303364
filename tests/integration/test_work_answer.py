"""An agent's work answer (its long-poll) kept by its node's generation (server.work.KeptWork):
a renewal with nothing changed is answered with the same bytes, without a session; any change
to the node's runs, clean-ups or signals gives a new answer. Here the test is the node's agent:
the cluster's own agent is killed and the test registers its node with the join token and
long-polls as an agent does (``shoal.agent.wire``)."""

from __future__ import annotations

import json
import os
import signal

from shoal.agent import wire
from shoal.agent.hollow import node_specs
from shoal.api_client import Client
from tests.integration.cluster import LocalCluster, wait_until


def test_a_renewal_with_nothing_changed_gets_the_same_answer_and_every_change_a_new_one(make_cluster):
    cluster: LocalCluster = make_cluster(nodes=1, gpus_per_node=2)
    node = cluster.node_names()[0]
    os.kill(cluster.agent_pid(node), signal.SIGKILL)
    spec = node_specs([node], gpus=2, gpu_model="A100-SXM4-80GB", cpus=64, memory_mb=512 * 1024,
                      address="127.0.0.1", port=1, labels={}, features=[])[0]
    joiner = Client(cluster.server, (cluster.root / "state" / "join.token").read_text().strip(), timeout=10)
    joiner.job_token = None
    reply = joiner.post(wire.REGISTER, wire.register_body(
        name=node, address=spec.address, port=spec.port, cpus=spec.cpus, memory_mb=spec.memory_mb, gpus=spec.gpus,
        labels=spec.labels, features=spec.features, boot_time=None, alive=[], taints=[]))
    agent = Client(cluster.server, reply["credential"], timeout=30, keep_alive=True)
    agent.job_token = None

    def answer(wait: float = 0, after: dict | None = None) -> bytes:
        params = wire.work_params(after["epoch"], after["gen"]) if after else wire.work_params(None, None)
        if after:
            params["wait"] = wait
        return agent.get_bytes(wire.work_path(node) + "?" + "&".join(f"{k}={v}" for k, v in params.items()))

    first = answer()
    doc = json.loads(first)
    assert doc["runs"] == [] and doc["kill"] == [], doc
    assert answer(wait=0.5, after=doc) == first, "a renewal with nothing changed answers the same bytes"

    job_id = cluster.sbatch("-w", node, "--gres=gpu:1", "--wrap", "sleep 300")
    started = json.loads(wait_until(lambda: (a := answer(wait=2, after=doc)) != first and json.loads(a)["runs"] and a,
                                    20, "the job in the node's answer"))
    assert [r["job_id"] for r in started["runs"]] == [job_id] and started["gen"] > doc["gen"], started
    kept = answer(wait=0.5, after=started)
    assert json.loads(kept) == started, "renewed with nothing changed: the same runs and generation"
    agent.post(wire.report_path(node), wire.report_body([], [r["key"] for r in started["runs"]], [], [], {}))
    assert answer(wait=0.5, after=started) == kept, "a heartbeat that changes nothing leaves the answer as it was"

    cluster.run(["scancel", str(job_id)])
    cancelled = json.loads(wait_until(lambda: (a := answer(wait=2, after=started)) != kept and json.loads(a)["kill"] and a,
                                      20, "the cancel in the node's answer"))
    assert [k["job_id"] for k in cancelled["kill"]] == [job_id] and cancelled["gen"] > started["gen"], cancelled
