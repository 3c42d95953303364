"""A real two-node PyTorch DDP job (CPU, gloo) through sbatch, srun and real torchrun.

examples/ddp/ddp.sbatch starts one torchrun per node, two workers each; the four ranks
all-reduce their gradients and must finish with the same parameters.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, free_port

DDP = Path(__file__).resolve().parents[2] / "examples" / "ddp"
RANK_LINE = re.compile(r"^rank=(\d+) world=4 node=(\d+) host=(\S+) .* checksum=(\S+) ranks agree$", re.M)

pytestmark = [
    pytest.mark.slow,  # six Python processes import torch: about 40 s on two cores
    pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                       reason="PyTorch is not installed (pip install torch) - the DDP example runs real torchrun"),
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="needs root: the nodes' hostnames resolve (via /etc/hosts) only as root, and "
                              "torchrun's MASTER_ADDR is the first node's name"),
]


def test_two_node_ddp_job_trains_to_the_same_weights_on_all_four_ranks(make_cluster):
    cluster = make_cluster(nodes=2, gpus_per_node=0, cpus_per_node=4, memory="16G")
    for name in ("ddp.sbatch", "train_ddp.py"):
        shutil.copy(DDP / name, cluster.workdir / name)
    # A port of its own: a fixed 29500 taken by anything else on the machine would stall the rendezvous.
    job_id = cluster.sbatch("ddp.sbatch", env={"MASTER_PORT": str(free_port())})
    job = cluster.wait_for(job_id, timeout=180)
    out = (cluster.workdir / f"slurm-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED", out

    ranks = {int(m[0]): m for m in RANK_LINE.findall(out)}
    assert sorted(ranks) == [0, 1, 2, 3], out
    names = [n["name"] for n in job["allocation"]["nodes"]]
    for rank, (_, node, host, _) in ranks.items():
        assert int(node) == rank // 2 and host == names[rank // 2]
    assert len({checksum for *_, checksum in ranks.values()}) == 1


@pytest.mark.skipif(bool(__import__("tests.integration.registry", fromlist=["missing_tools"]).missing_tools()),
                    reason="needs podman, runc, docker-registry, catatonit (.ci/run installs them)")
def test_two_node_ddp_inside_a_container_image_agrees(tmp_path):
    """examples/ddp/ddp-container.sbatch: an image holding this Python and PyTorch (built
    from the local files, kept in podman's store by its torch version for the next run), two
    nodes x two tasks, each rank in its node's container; gloo's rendezvous crosses nodes
    over MASTER_ADDR on the host network, and the four ranks end with the same weights."""
    import torch

    from tests.integration.registry import build_python_image, podman, podman_env

    penv = podman_env(tmp_path)
    image = f"localhost/shoal-python-torch:{torch.__version__.replace('+', '-')}"
    if podman(penv, "image", "exists", image, check=False).returncode != 0:
        build_python_image(penv, tmp_path, image, ("torch",), {"PYTORCH_VERSION": torch.__version__})
    cluster = LocalCluster(tmp_path / "cluster", nodes=2, gpus_per_node=0, cpus_per_node=4, memory="16G",
                           extra=("--runtime", "podman"))
    cluster.env.update(penv)  # the agents' podman settings (runc, no default ulimits)
    cluster.up()
    try:
        shutil.copy(DDP / "train_ddp.py", cluster.workdir / "train_ddp.py")
        script = (DDP / "ddp-container.sbatch").read_text()  # and first: where do the tasks run?
        script = script.replace("\nsrun ", "\nsrun --ntasks-per-node=1 grep PRETTY_NAME /etc/os-release\nsrun ", 1)
        (cluster.workdir / "ddp-container.sbatch").write_text(script)
        job_id = cluster.sbatch(f"--container-image=podman://{image}", "ddp-container.sbatch",
                                env={"MASTER_PORT": str(free_port())})
        job = cluster.wait_for(job_id, timeout=300)
        out = (cluster.workdir / f"slurm-{job_id}.out").read_text()
    finally:
        cluster.down()
    assert job["state"] == "COMPLETED", out
    assert out.count('PRETTY_NAME="python image') == 2, out  # the image's, not the host's
    ranks = {int(m[0]): m for m in RANK_LINE.findall(out)}
    assert sorted(ranks) == [0, 1, 2, 3], out
    names = [n["name"] for n in job["allocation"]["nodes"]]
    for rank, (_, node, host, _) in ranks.items():
        assert int(node) == rank // 2 and host == names[rank // 2], out
    assert len({checksum for *_, checksum in ranks.values()}) == 1
