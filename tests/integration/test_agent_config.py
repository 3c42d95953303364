"""An administrator adds a node with an agent configuration file; its labels and features show up."""

import json
import subprocess
import sys
import time


def test_an_agent_joins_with_labels_and_features_from_its_config_file(cluster):
    conf = cluster.root / "agent.yaml"
    conf.write_text(
        f"server: {cluster.server}\n"
        f"join_token_file: {cluster.root / 'state' / 'join.token'}\n"
        "name: extra01\n"
        f"address: {cluster.address_base.rsplit('.', 1)[0]}.200\n"
        f"port: {cluster.agent_port}\n"
        f"workdir: {cluster.root / 'extra01'}\n"
        "fake_gpus: 2\n"
        "gpu_model: H100-SXM-80GB\n"
        "cpus: 16\n"
        "memory: 64G\n"
        "labels: {topology.kubernetes.io/zone: rack-7, team: vision}\n"
        "features: [ib, nvlink]\n"
    )
    agent = subprocess.Popen([sys.executable, "-m", "shoal", "agent", "--config", str(conf), "--label", "team=nlp"],
                             env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        node = None
        deadline = time.time() + 20
        while time.time() < deadline:
            node = next((n for n in cluster.nodes_json() if n["name"] == "extra01"), None)
            if node:
                break
            assert agent.poll() is None, agent.stdout.read().decode()
            time.sleep(0.1)
        assert node is not None, "the agent never registered"
        assert node["cpus"] == 16 and node["memory_mb"] == 64 * 1024
        assert [g["product"] for g in node["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
        labels = node["labels"]
        assert labels["topology.kubernetes.io/zone"] == "rack-7"
        assert labels["team"] == "nlp"  # the command line wins over the file
        assert labels["nvidia.com/gpu.count"] == "2"
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert {"ib", "nvlink", "h100"} <= set(node["features"])
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_a_bad_agent_config_is_one_clear_line(cluster, tmp_path):
    conf = tmp_path / "agent.yaml"
    conf.write_text(json.dumps({"server": cluster.server, "gpu_modle": "H100"}))
    out = subprocess.run([sys.executable, "-m", "shoal", "agent", "--config", str(conf)], env=cluster.env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "unknown key 'gpu_modle'" in out.stderr
    assert "Traceback" not in out.stderr


def test_shoal_up_drops_hosts_entries_left_by_a_dead_cluster(make_cluster, tmp_path):
    import os

    import pytest

    if os.geteuid() != 0:
        pytest.skip("only root's `shoal up` manages /etc/hosts")
    gone = tmp_path / "gone-cluster"
    stale = f"# BEGIN shoal local cluster {gone}\n127.0.99.2\tnode01\n# END shoal local cluster {gone}\n"
    with open("/etc/hosts", "a") as f:
        f.write(stale)
    try:
        cluster = make_cluster(nodes=1, gpus_per_node=0)
        hosts = open("/etc/hosts").read()
        assert f"shoal local cluster {gone}" not in hosts
        assert f"{cluster.address_base}\tnode01" in hosts
    finally:
        text = open("/etc/hosts").read()
        if stale in text:
            open("/etc/hosts", "w").write(text.replace(stale, ""))
