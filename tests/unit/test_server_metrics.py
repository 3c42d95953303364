"""The server's metrics: resources split as sinfo splits them (the store's part is in
tests/integration/test_server_metrics_store.py)."""

from __future__ import annotations

from shoal.model.snapshot import Partition
from shoal.server.metrics import node_use, partition_use

GPU = {"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100 80GB HBM3"}


def test_free_resources_are_idle_on_an_up_node_and_drained_on_a_drained_one():
    use = node_use([("a", "UP", 64, 1024, [GPU] * 4), ("b", "DRAIN", 64, 1024, [GPU] * 4)],
                   [("a", 8, 512, 3), ("b", 8, 256, 1), ("b", 2, 0, 0), ("gone", 1, 1, 1)])
    assert use["a"].split("gpus") == {"allocated": 3, "idle": 1}
    assert use["b"].split("gpus") == {"allocated": 1, "drained": 3}
    assert use["b"].split("cpus") == {"allocated": 10, "drained": 54}
    assert use["a"].split("memory") == {"allocated": 512 << 20, "idle": 512 << 20}
    assert use["a"].gpu_model == "NVIDIA H100 80GB HBM3"
    parts = partition_use(use, [Partition("all", ("a", "b")), Partition("small", ("b",))])
    assert parts["all"]["gpus"] == {"allocated": 4, "idle": 1, "drained": 3}
    assert parts["small"]["cpus"] == {"allocated": 10, "idle": 0, "drained": 54}
