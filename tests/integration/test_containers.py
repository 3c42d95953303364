"""Batch containers for real, the Pyxis way: a local registry serves a busybox image under
nvcr.io's name through the cluster's mirror setting, and rootful podman runs job steps in it.

One cluster serves every story here (module fixture): podman's start-up is the slow part.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from shoal.agent import cgroups
from shoal.agent.stepcontainer import Settings
from tests.integration.cluster import LocalCluster, free_port, wait_until
from tests.integration.registry import Registry, build_image, missing_tools, podman, podman_env, push
from tests.integration.traffic import backends, pods

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(missing_tools()), reason=f"needs {missing_tools()} "
                                                   "(.ci/run installs them)")]

IMAGE = "nvcr.io/nvidia/pytorch:24.10-py3"
# The seed's full size (8 nodes x 8 GPUs, 64 tasks) is for a run by hand (SHOAL_CONTAINERS_FULL=1):
# 64 containers' tasks at once are too much for CI's two cores next to the rest of the suite.
NODES, GPUS = (8, 8) if os.environ.get("SHOAL_CONTAINERS_FULL") else (2, 2)
PRETTY = "Shoal PyTorch stand-in 24.10"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("containers")
    penv = podman_env(root)
    registry = Registry(root / "registry").start()
    private = Registry(root / "private-registry", login=("alice", "s3cret-pw-4711")).start()
    local = f"localhost/shoal-private-{private.port}:1"
    build_image(penv, root, local, "private image")
    push(penv, local, f"{private.address}/team/private:1", authfile=private.authfile())
    podman(penv, "rmi", local)
    local = f"localhost/shoal-test-{registry.port}:1"
    build_image(penv, root, local, PRETTY, files={"/opt/image-marker": "inside\n"})
    push(penv, local, f"{registry.address}/nvidia/pytorch:24.10-py3")
    podman(penv, "rmi", local)
    config = root / "cluster.yaml"
    config.write_text(json.dumps({
        "cluster_name": "containers", "partitions": [{"name": "gpu", "nodes": f"node[01-{NODES:02d}]", "default": True}],
        "nodes": {"heartbeat_interval_s": 1.0, "kill_wait_s": 2.0},
        "containers": {"registry_mirrors": {"nvcr.io": registry.address},
                       "insecure_registries": [registry.address, private.address]}}))
    gateway = free_port()
    cluster = LocalCluster(root / "cluster", nodes=NODES, gpus_per_node=GPUS, config=str(config),
                           extra=("--runtime", "podman", "--gateway", str(gateway)))
    cluster.gateway = f"http://127.0.0.1:{gateway}"
    cluster.env.update(penv)
    cluster.up()
    data, checkpoints = root / "data", root / "checkpoints"
    data.mkdir()
    checkpoints.mkdir()
    (data / "shard-0").write_text("tokens\n")
    yield {"cluster": cluster, "registry": registry, "private": private, "data": data, "checkpoints": checkpoints, "podman": penv,
           "root": root}
    cluster.down()
    # What the nodes' caches hold (images loaded from saved files too) goes with the test.
    held = {doc["id"] for index in (cluster.root / "state" / "nodes").glob("*/images/index.json")
            for doc in json.loads(index.read_text()).values()}
    if held:
        podman(penv, "rmi", "--force", *held, check=False)
    registry.stop()
    private.stop()
    podman(penv, "rmi", "--force", f"{registry.address}/nvidia/pytorch:24.10-py3",
           f"{private.address}/team/private:1", check=False)


def output(cluster: LocalCluster, job_id: int) -> str:
    return (cluster.workdir / f"slurm-{job_id}.out").read_text()


def test_seed_script_runs_its_tasks_inside_the_container(env):
    """The seed's script (2 nodes x 2 GPUs in CI): every task of srun runs in the image
    pulled through the mirror, sees /data and /checkpoints, its GPU and a rank of its own."""
    c, data, ckpt = env["cluster"], env["data"], env["checkpoints"]
    c.workdir.joinpath("train.sh").write_text(
        'echo "rank=$SLURM_PROCID gpus=$CUDA_VISIBLE_DEVICES node=$SLURMD_NODENAME '
        'os=$(grep PRETTY /etc/os-release) marker=$(cat /opt/image-marker) data=$(cat /data/shard-0) '
        'uid=$(id -u) master=$MASTER_ADDR"\n'
        'touch /checkpoints/rank-$SLURM_PROCID\n')
    job = c.sbatch(script=f"""#!/bin/bash
#SBATCH --job-name=llama-70b-pretrain
#SBATCH --nodes={NODES}
#SBATCH --ntasks-per-node={GPUS}
#SBATCH --gpus-per-node={GPUS}
#SBATCH --exclusive
#SBATCH --container-image={IMAGE}
#SBATCH --container-mounts={data}:/data,{ckpt}:/checkpoints
export MASTER_ADDR=$(scontrol show hostname $SLURM_NODELIST | head -1)
srun --gpus-per-task=1 sh train.sh
""")
    done = c.wait_for(job, timeout=600)
    text = output(c, job)
    assert done["state"] == "COMPLETED", text
    lines = sorted(line for line in text.splitlines() if line.startswith("rank="))
    assert sorted(int(line.split()[0][5:]) for line in lines) == list(range(NODES * GPUS)), text
    for line in lines:
        assert f'PRETTY_NAME="{PRETTY}"' in line and "marker=inside" in line and "data=tokens" in line, line
        assert "master=node01" in line and "uid=0" in line
    per_node = {}
    for line in lines:
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f and not f.startswith(("os", "NAME")))
        per_node.setdefault(fields["node"], []).append(fields["gpus"])
    gpus = sorted(str(g) for g in range(GPUS))
    assert {n: sorted(g) for n, g in per_node.items()} == {f"node{i:02d}": gpus for i in range(1, NODES + 1)}
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(f"rank-{r}" for r in range(NODES * GPUS))
    sacct = c.run(["sacct", "-j", str(job), "-n", "-X", "-o", "State"]).stdout
    assert "COMPLETED" in sacct


def test_named_container_keeps_its_files_between_steps(env):
    """--container-name: a file written in step 0 is there in step 1; the container goes at the job's end."""
    c = env["cluster"]
    job = c.sbatch(script=f"""#!/bin/bash
#SBATCH --nodes=1
srun --container-image={IMAGE} --container-name=work sh -c 'echo installed > /opt/pip-package'
srun --container-name=work cat /opt/pip-package
srun --container-image={IMAGE} sh -c 'test -e /opt/pip-package && echo leaked || echo fresh'
""")
    done = c.wait_for(job, timeout=90)
    text = output(c, job)
    assert done["state"] == "COMPLETED", text
    assert text.splitlines()[-2:] == ["installed", "fresh"], text

    def gone():
        names = podman(env["podman"], "ps", "--all", "--format", "{{.Names}}").stdout.split()
        return not any(n.startswith(f"pyxis_{job}_work_") for n in names)

    deadline = time.time() + 30
    while not gone():
        assert time.time() < deadline, "the named container outlived its job"
        time.sleep(0.5)


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are made by a root agent")
def test_container_steps_run_inside_their_jobs_cgroup_and_its_memory_limit(env):
    """The step's container is made below the step's cgroup (podman's --cgroup-parent): its
    processes are the job's, and --mem holds for them (the job ends OUT_OF_MEMORY)."""
    c = env["cluster"]
    job = c.sbatch("--mem=100M", script=f"""#!/bin/bash
#SBATCH --nodes=1
srun --container-image={IMAGE} cat /proc/self/cgroup
srun --container-image={IMAGE} sh -c 'x=$(head -c 300000000 /dev/zero | tr "\\0" x); echo survived ${{#x}}'
""")
    done = c.wait_for(job, states=("COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY"), timeout=120)
    text = output(c, job)
    memory = [line for line in text.splitlines() if line.split(":")[1:2] == ["memory"]]
    assert memory and f"/job_{job}.0/step_0/" in memory[0], text
    assert done["state"] == "OUT_OF_MEMORY" and "survived" not in text, (done["state"], text)


def test_readonly_mount_and_readonly_root(env):
    c, data = env["cluster"], env["data"]
    out = c.run(["srun", "-N1", f"--container-image={IMAGE}", f"--container-mounts={data}:/data:ro",
                 "--container-readonly", "sh", "-c",
                 "touch /data/x 2>/dev/null && echo data-writable; touch /opt/y 2>/dev/null && echo root-writable;"
                 " cat /data/shard-0"], timeout=90)
    assert out.stdout.strip() == "tokens", out.stdout + out.stderr


def test_missing_image_fails_fast_with_the_registrys_message(env):
    c = env["cluster"]
    t0 = time.time()
    out = c.run(["srun", "-N1", "--container-image=nvcr.io/nvidia/no-such-image:1", "true"], check=False, timeout=60)
    assert out.returncode != 0
    assert "pyxis: failed to start the container" in out.stderr and "manifest unknown" in out.stderr, out.stderr
    assert time.time() - t0 < 30
    job = max(j["job_id"] for j in c.jobs())
    sacct = c.run(["sacct", "-j", str(job), "-X", "-n", "-o", "State,Reason%40"]).stdout
    assert sacct.split() == ["FAILED", "ContainerError:", "manifest", "unknown"], sacct


def test_a_registry_that_refuses_fails_the_step_in_seconds(env):
    c = env["cluster"]
    t0 = time.time()
    out = c.run(["srun", "-N1", "--container-image=docker://127.0.0.1:1/nvidia/x:1", "true"], check=False, timeout=60)
    assert out.returncode != 0 and "connection refused" in out.stderr, out.stderr
    assert time.time() - t0 < 30


def test_missing_mount_source_fails_the_step_with_a_reason(env):
    c = env["cluster"]
    job = c.sbatch(script=f"""#!/bin/bash
#SBATCH --nodes=1
#SBATCH --container-image={IMAGE}
#SBATCH --container-mounts=/no/such/dir:/data
srun true
""")
    done = c.wait_for(job, timeout=60)
    assert done["state"] == "FAILED"
    assert "/no/such/dir: no such file or directory" in output(c, job)
    show = c.run(["scontrol", "show", "job", str(job)]).stdout
    assert "Reason=ContainerError: no such file or directory on node01" in show, show


def test_one_pull_for_concurrent_tasks_then_the_cache(env):
    """Four tasks of a step on one node start at once: the node pulls the image once (the
    registry serves its manifest once); the next step finds it in the node's cache."""
    c = env["cluster"]
    image = f"{env['registry'].address}/nvidia/pytorch:24.10-py3"
    podman(env["podman"], "rmi", "--force", image, check=False)
    index_file = c.root / "state" / "nodes" / "node01" / "images" / "index.json"
    index_file.unlink(missing_ok=True)

    def manifest_gets() -> int:
        log = (env["registry"].root / "registry.log").read_text()
        return log.count('"GET /v2/nvidia/pytorch/manifests/24.10-py3 HTTP/1.1" 200')

    before = manifest_gets()
    c.run(["srun", "-N1", "-n4", "-w", "node01", f"--container-image={IMAGE}", "true"], timeout=90)
    assert manifest_gets() == before + 1
    c.run(["srun", "-N1", "-n4", "-w", "node01", f"--container-image={IMAGE}", "true"], timeout=90)
    assert manifest_gets() == before + 1
    assert list(json.loads(index_file.read_text())) == [image]


def test_container_save_keeps_what_a_step_wrote_for_the_next(env):
    """--container-save as Pyxis' own test takes it: each step saves its container to the
    same relative path, the next starts from that file and adds to it; the file is the job
    user's, and a save where the user cannot write fails the step's node with Pyxis' words."""
    c = env["cluster"]
    saved = c.workdir / "modified.sqsh"
    saved.unlink(missing_ok=True)
    first = c.run(["srun", "-N1", f"--container-image={IMAGE}", "--container-save=./modified.sqsh",
                   "sh", "-c", "echo pyxis > /test"], timeout=120)
    assert "pyxis: exported container" in first.stderr and str(saved) in first.stderr, first.stderr
    assert saved.stat().st_size > 0
    c.run(["srun", "-N1", "--container-image=./modified.sqsh", "--container-save=./modified.sqsh",
           "sh", "-c", "echo slurm > /test2"], timeout=120)
    out = c.run(["srun", "-N1", "--container-image=./modified.sqsh", "sh", "-c",
                 "cat /test /test2; grep PRETTY /etc/os-release"], timeout=120)
    assert out.stdout.splitlines() == ["pyxis", "slurm", f'PRETTY_NAME="{PRETTY}"'], out.stdout + out.stderr
    failed = c.run(["srun", "-N1", f"--container-image={IMAGE}", "--container-save=/proc/no-such/x.sqsh", "true"],
                   check=False, timeout=120)
    assert "pyxis: failed to export container" in failed.stderr and "/proc/no-such/x.sqsh" in failed.stderr, \
        failed.stderr
    # The file's image is in the node's cache by the file's path (evicted under the size limit as a pulled one).
    index = json.loads((c.root / "state" / "nodes" / "node01" / "images" / "index.json").read_text())
    assert f"file:{saved}" in index, list(index)


def test_enroot_credentials_let_a_step_pull_from_a_registry_that_needs_a_login(env):
    """A registry that serves its image only to alice: refused without a login, pulled with
    the password in her Enroot credentials file ($ENROOT_CONFIG_PATH/.credentials, netrc's
    format), which no log or file left on the node shows."""
    c, registry = env["cluster"], env["private"]
    config = env["root"] / "enroot-config"
    config.mkdir(exist_ok=True)
    image = f"--container-image={registry.address}#team/private:1"
    refused = c.run(["srun", "-N1", image, "true"], check=False, timeout=90, env={"ENROOT_CONFIG_PATH": str(config)})
    assert refused.returncode != 0, refused.stdout
    assert "unauthorized" in refused.stderr or "authentication required" in refused.stderr, refused.stderr
    (config / ".credentials").write_text(f"# enroot\nmachine {registry.address} login alice password s3cret-pw-4711\n")
    out = c.run(["srun", "-N1", image, "grep", "PRETTY", "/etc/os-release"], timeout=90,
                env={"ENROOT_CONFIG_PATH": str(config)})
    assert out.stdout.strip() == 'PRETTY_NAME="private image"', out.stdout + out.stderr
    logs = "".join(p.read_text(errors="replace") for p in c.root.rglob("*.log"))
    assert "s3cret-pw-4711" not in logs
    assert not list((c.root / "state" / "nodes").rglob("auth.json"))  # the login's file went with the pull


def test_a_nodes_images_show_in_scontrol_and_as_the_kubernetes_nodes_status_images(env):
    """The agent reports its image cache: scontrol show node lists it (Images=), and the
    Node object carries it as kubelet's status.images (names, sizeBytes)."""
    c = env["cluster"]
    image = f"{env['registry'].address}/nvidia/pytorch:24.10-py3"
    c.run(["srun", "-N1", "-w", "node02", f"--container-image={IMAGE}", "true"], timeout=90)

    def shown():
        text = c.run(["scontrol", "show", "node", "node02"]).stdout
        return text if f"Images={image}" in text else None

    wait_until(shown, 30, "node02's image in scontrol show node")
    node = json.loads(c.run(["shoal", "get", "node", "node02", "-o", "json"]).stdout)
    held = {n: i["sizeBytes"] for i in node["status"]["images"] for n in i["names"]}
    assert held.get(image, 0) > 100_000, node["status"]["images"]  # busybox and more
    assert any(n.startswith("sha256:") for n in held), held


def test_a_container_sees_exactly_its_gpus(env):
    """The agent's CDI spec names its GPUs' (stand-in) device nodes: with GPU 0 taken by
    another job, a step given GPU 1 sees /dev/nvidia1 (char 195:1) and no other GPU, and
    CUDA numbers it 0 there."""
    c = env["cluster"]
    holder = c.sbatch("-w", "node02", "--gpus=1", "--wrap", "sleep 60")
    c.wait_for(holder, states=("RUNNING",), settled=False)
    try:
        out = c.run(["srun", "-w", "node02", "--gpus=1", f"--container-image={IMAGE}", "sh", "-c",
                     "ls /dev | grep nvidia | tr '\\n' ' '; echo; stat -c '%t:%T' /dev/nvidia1; "
                     "echo $CUDA_VISIBLE_DEVICES"], timeout=90)
    finally:
        c.run(["scancel", str(holder)])
    assert out.stdout.split("\n")[:3] == ["nvidia1 nvidiactl ", "c3:1", "0"], out.stdout + out.stderr


def test_tasks_enter_the_keeper_through_the_oci_runtime(env, tmp_path, monkeypatch):
    """The agent's side alone: a step's container from the node's cache, its tasks run by
    runc's own exec as the job's user with the image's PATH, output on their own pipes."""
    import subprocess

    from shoal.agent.stepcontainer import StepContainers

    monkeypatch.setenv("CONTAINERS_CONF", env["podman"]["CONTAINERS_CONF"])
    containers = StepContainers("podman", "nodeX", tmp_path)
    containers.configure(Settings.from_json({"registry_mirrors": {"nvcr.io": env["registry"].address},
                                             "insecure_registries": [env["registry"].address]}))
    sc = containers.start({"image": IMAGE, "mount_home": False}, job_id=9, step_id=0, user=(1000, 1000),
                          home=None, cwd=str(tmp_path), gpus=[])
    try:
        assert sc.oci is not None and sc.oci.binary.endswith("runc")
        argv, proc_env = sc.task_argv({"SLURM_PROCID": "secret-3", "PATH": "/host/only"}, str(tmp_path),
                                      ["sh", "-c", "echo $SLURM_PROCID $PATH; id -u; pwd"])
        assert "secret-3" not in " ".join(argv)  # values travel in a file, not on the command line
        out = subprocess.run(argv, env=proc_env, capture_output=True, text=True, timeout=30)
        assert out.stdout.split() == ["secret-3", "/bin", "1000", str(tmp_path)], out.stderr
    finally:
        containers.finish(sc)
    assert not sc.oci.files.exists()


def deployment(name: str, image: str, command: list[str], gpus: int = 0) -> dict:
    container = {"name": "app", "image": image, "command": command}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}}}}


def test_a_pod_runs_its_image_through_podman_and_a_missing_tag_backs_off(env):
    """A Deployment's image, as written (nvcr.io's name), runs through podman from the local
    registry via the mirror, with its GPU by CDI name; a tag the registry lacks shows
    ErrImagePull / ImagePullBackOff with kubelet's events."""
    c = env["cluster"]
    docs = [deployment("web", IMAGE, ["sh", "-c", "grep PRETTY /etc/os-release; ls /dev | grep nvidia | tr '\\n' ' ';"
                                                   " echo; echo cuda=$CUDA_VISIBLE_DEVICES; sleep 600"], gpus=1),
            deployment("missing-tag", "nvcr.io/nvidia/pytorch:99.99-py3", ["true"])]
    c.run(["shoal", "apply", "-f", "-"], input="\n---\n".join(json.dumps(d) for d in docs))
    try:
        def pod_of(app: str):
            items = json.loads(c.run(["shoal", "get", "pods", "-l", f"app={app}", "-o", "json"]).stdout)["items"]
            return items[0] if items else None

        def running():
            p = pod_of("web")
            return p if p and p["status"].get("phase") == "Running" else None

        name = wait_until(running, 60, "the web pod running")["metadata"]["name"]
        log = wait_until(lambda: (lambda t: t if "cuda=" in t else None)(c.run(["shoal", "logs", name]).stdout),
                         30, "the pod's output")
        lines = log.splitlines()
        lines = lines[lines.index(f'PRETTY_NAME="{PRETTY}"'):]  # after podman's own pull lines
        assert len(lines[1].split()) == 2 and lines[1].split()[1] == "nvidiactl", log  # one GPU and the control node
        assert lines[2] == "cuda=0", log

        def backing_off():
            p = pod_of("missing-tag")
            for cs in (p or {}).get("status", {}).get("containerStatuses") or ():
                w = cs.get("state", {}).get("waiting") or {}
                if w.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                    return p, w
            return None

        pod, waiting = wait_until(backing_off, 60, "the missing tag's pull error")
        # ErrImagePull carries the registry's message, ImagePullBackOff kubelet's back-off one;
        # the events keep the registry's either way.
        assert "manifest unknown" in waiting["message"] or waiting["reason"] == "ImagePullBackOff", waiting
        described = c.run(["shoal", "describe", "pod", pod["metadata"]["name"]]).stdout
        assert "Failed" in described and "pytorch:99.99-py3" in described, described
        assert "manifest unknown" in described, described
    finally:
        c.run(["shoal", "delete", "deployment", "web", "missing-tag"], check=False)


def test_a_podman_pod_runs_inside_its_cgroup_and_is_oom_killed_over_its_limit(env):
    """podman makes a pod's container inside the pod's cgroup (``--cgroup-parent``), not its
    own: a container over the pod's memory limit ends OOMKilled (the kill is seen in the pod's
    cgroup), and a detached process of a running pod's container is inside it too, so it goes
    with the pod."""
    c, penv = env["cluster"], env["podman"]
    hungry = deployment("hungry", IMAGE, ["sh", "-c", "dd if=/dev/zero of=/dev/null bs=200M count=1"])
    hungry["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "64Mi"}}
    hungry["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    detached = deployment("detached", IMAGE, ["sh", "-c", "setsid sleep 3600 & sleep 600"])
    c.run(["shoal", "apply", "-f", "-"], input="\n---\n".join(json.dumps(d) for d in (hungry, detached)))
    try:
        def oom_killed():
            for p in pods(c, "app=hungry"):
                for cs in p["status"].get("containerStatuses") or ():
                    last = cs.get("lastState", {}).get("terminated") or cs.get("state", {}).get("terminated")
                    if last:
                        return last
            return None

        ended = wait_until(oom_killed, 120, "the hungry container's end")
        assert ended["reason"] == "OOMKilled" and ended["exitCode"] == 137, ended

        def running():
            found = pods(c, "app=detached")
            return found[0] if found and found[0]["status"].get("phase") == "Running" else None

        pod = wait_until(running, 90, "the detached pod running")
        name = f"shoal-default-{pod['metadata']['name']}-app"

        def sleeper():
            host = podman(penv, "inspect", "--format", "{{.State.Pid}}", name, check=False).stdout.strip()
            kids = [p for p in Path("/proc").iterdir() if p.name.isdigit() and host.isdigit()
                    and _ppid(p) == int(host) and b"3600" in _read(p / "cmdline")]
            return (int(host), int(kids[0].name)) if kids else None

        main_pid, alone = wait_until(sleeper, 30, "the container's processes")
        node_dir = c.root / "state" / "nodes" / pod["spec"]["nodeName"]
        for pid in (main_pid, alone):
            memory = next(line for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                          if line.split(":")[1] in ("memory", ""))
            assert "/shoal/" in memory and "/container_app/" in memory, (pid, memory)
            assert cgroups.instance_name(pod["spec"]["nodeName"], node_dir) in memory, memory
        # The run's fence list names the engine's cgroups below the container's (v1 kills each
        # listed cgroup's processes, not those below it).
        def listed():
            runs = (node_dir / "pods").glob(f"*_{pod['metadata']['name']}_*/app/run.*/cgroups")
            return [line for f in runs for line in f.read_text().splitlines() if "/container_app/" in line]

        assert wait_until(listed, 30, "the container's cgroups listed for the fence")
        c.run(["shoal", "delete", "deployment", "detached"])
        wait_until(lambda: not Path(f"/proc/{alone}").exists(), 60, "the detached process to end with its pod")
    finally:
        c.run(["shoal", "delete", "deployment", "hungry", "detached"], check=False)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _ppid(proc: Path) -> int:
    stat = _read(proc / "stat").decode(errors="replace")
    return int(stat.rpartition(")")[2].split()[1]) if ")" in stat else 0


def web_server(port: int, tag: str) -> str:
    """A Deployment (one replica, one surge pod, so old and new sit on different nodes: pods
    use the node's network) and its Service of busybox's httpd from the image ``tag``,
    ready once it answers on its port."""
    container = {"name": "httpd", "image": f"nvcr.io/shoal/web:{tag}",
                 # Listening 2 s after the start: only the readiness probe keeps it out of the routes.
                 "command": ["sh", "-c", f"sleep 2; exec httpd -f -p $(POD_IP):{port} -h /www"],
                 "ports": [{"containerPort": port}],
                 "readinessProbe": {"httpGet": {"path": "/version", "port": port}, "periodSeconds": 1,
                                    "failureThreshold": 1}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web-image"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web-image"}},
                           "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1,
                                                                                   "maxUnavailable": 0}},
                           "template": {"metadata": {"labels": {"app": "web-image"}},
                                        "spec": {"containers": [container], "terminationGracePeriodSeconds": 3}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-image"},
               "spec": {"selector": {"app": "web-image"}, "ports": [{"port": 80, "targetPort": port}]}}
    return "\n---\n".join(json.dumps(d) for d in (deployment, service))


class Getter:
    """One client asking the gateway for /version, one request after another, until stopped."""

    def __init__(self, gateway: str) -> None:
        self.gateway, self.answers = gateway, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        while not self._stop.is_set():
            req = urllib.request.Request(f"{self.gateway}/version", headers={"Host": "web-image.default"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    self.answers.append((time.time(), r.status, r.read().decode().strip()))
            except urllib.error.HTTPError as e:
                self.answers.append((time.time(), e.code, e.read().decode(errors="replace")))
            except OSError as e:
                self.answers.append((time.time(), 0, str(e)))

    def failures(self) -> list:
        return [a for a in self.answers if a[1] != 200]


class RouteChecker(Getter):
    """Asks every pod the gateway may route to directly, bypassing the gateway's retries: a
    pod listed ready (and still listed after) that does not answer is a readiness failure."""

    def __init__(self, c: LocalCluster) -> None:
        super().__init__(c.gateway)
        self.c, self.unready = c, []

    def _listed(self) -> dict[str, str]:
        return {b["pod"]: f"http://{b['address']}:{b['port']}/version" for b in backends(self.c, "web-image")
                if b["ready"] and not b["terminating"]}

    def _run(self) -> None:
        while not self._stop.is_set():
            for pod, url in self._listed().items():
                try:
                    urllib.request.urlopen(url, timeout=2).read()
                except OSError as e:
                    if pod in self._listed():
                        self.unready.append((pod, str(e)))
            self._stop.wait(0.1)


def test_a_deployment_of_an_image_serves_through_the_gateway_and_rolls_to_a_new_tag(env):
    """An HTTP server inside an image from the (mirrored) registry answers through the
    gateway once ready; a new image tag rolls out under continuous requests, none failing,
    and the answers turn from v1 to v2."""
    c, penv, registry = env["cluster"], env["podman"], env["registry"]
    for tag in ("v1", "v2"):
        local = f"localhost/shoal-web-{registry.port}:{tag}"
        build_image(penv, env["root"], local, f"web {tag}", files={"/www/version": f"{tag}\n"})
        push(penv, local, f"{registry.address}/shoal/web:{tag}")
        podman(penv, "rmi", local)
    port = free_port()
    c.run(["shoal", "apply", "-f", "-"], input=web_server(port, "v1"))
    try:
        assert c.run(["shoal", "rollout", "status", "deployment/web-image", "--timeout", "90s"],
                     timeout=120).returncode == 0
        with Getter(c.gateway) as load, RouteChecker(c) as routes:
            wait_until(lambda: sum(a[2] == "v1" for a in load.answers) >= 10, 30, "v1 answering through the gateway")
            out = c.run(["shoal", "apply", "-f", "-"], input=web_server(port, "v2")).stdout
            assert "deployment.apps/web-image configured" in out, out
            status = c.run(["shoal", "rollout", "status", "deployment/web-image", "--timeout", "90s"],
                           check=False, timeout=120)
            assert status.returncode == 0, status.stdout + status.stderr
            rolled = time.time()
            wait_until(lambda: sum(a[2] == "v2" and a[0] > rolled for a in load.answers) >= 10, 30,
                       "v2 answering after the rollout")
        assert load.failures() == [], load.failures()[:5]
        assert routes.unready == [], routes.unready[:5]
        versions = [a[2] for a in load.answers]
        assert set(versions) == {"v1", "v2"}, set(versions)
        assert versions[-10:] == ["v2"] * 10, versions[-20:]
        images = [cs["image"] for p in json.loads(c.run(["shoal", "get", "pods", "-l", "app=web-image", "-o", "json"])
                                                   .stdout)["items"]
                  if p["status"].get("phase") == "Running" for cs in p["status"].get("containerStatuses") or ()]
        assert "nvcr.io/shoal/web:v2" in images, images
    finally:
        c.run(["shoal", "delete", "deployment", "web-image"], check=False)
        c.run(["shoal", "delete", "service", "web-image"], check=False)
        wait_until(lambda: not pods(c, "app=web-image"), 30, "the web pods gone")
        podman(penv, "rmi", "--force", *(f"{registry.address}/shoal/web:{t}" for t in ("v1", "v2")), check=False)


def test_a_pod_pulls_with_its_image_pull_secret_and_reads_a_secret_key(env):
    """A docker-registry Secret lets a pod pull from the registry that needs a login; the same
    pod without it backs off with the registry's refusal; an env secretKeyRef's value reaches
    the container, and neither the password nor the value is in a log or on a command line."""
    c, registry = env["cluster"], env["private"]
    config = {"auths": {registry.address: {"auth": base64.b64encode(b"alice:s3cret-pw-4711").decode()}}}
    docs = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred"},
             "type": "kubernetes.io/dockerconfigjson", "stringData": {".dockerconfigjson": json.dumps(config)}},
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf"}, "stringData": {"token": "hf_v4lue_9"}}]
    with_login = deployment("private", f"{registry.address}/team/private:1",
                            ["sh", "-c", "grep PRETTY /etc/os-release; echo token=$HF_TOKEN; sleep 600"])
    spec = with_login["spec"]["template"]["spec"]
    spec["imagePullSecrets"] = [{"name": "regcred"}]
    spec["containers"][0]["env"] = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    without = deployment("private-nologin", f"{registry.address}/team/private:1", ["true"])
    # Always: with the image on the node (the first pod's pull), IfNotPresent would start it
    # unasked, as kubelet does; Always asks the registry, which refuses.
    without["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    c.run(["shoal", "apply", "-f", "-"], input="\n---\n".join(json.dumps(d) for d in [*docs, with_login, without]))
    try:
        def said():
            items = json.loads(c.run(["shoal", "get", "pods", "-l", "app=private", "-o", "json"]).stdout)["items"]
            if not items:
                return None
            log = c.run(["shoal", "logs", items[0]["metadata"]["name"]], check=False).stdout
            return log if "token=" in log else None

        log = wait_until(said, 90, "the private image's pod output")
        assert 'PRETTY_NAME="private image"' in log and "token=hf_v4lue_9" in log, log

        def refused():
            items = json.loads(c.run(["shoal", "get", "pods", "-l", "app=private-nologin", "-o", "json"]).stdout)["items"]
            for cs in (items[0] if items else {}).get("status", {}).get("containerStatuses") or ():
                w = cs.get("state", {}).get("waiting") or {}
                if w.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                    return w
            return None

        wait_until(refused, 60, "the pull without a login refused")
        items = json.loads(c.run(["shoal", "get", "pods", "-l", "app=private-nologin", "-o", "json"]).stdout)["items"]
        described = c.run(["shoal", "describe", "pod", items[0]["metadata"]["name"]]).stdout
        assert "unauthorized" in described or "authentication required" in described, described
        ps = __import__("subprocess").run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert "hf_v4lue_9" not in ps and "s3cret-pw-4711" not in ps
        logs = "".join(p.read_text(errors="replace") for p in c.root.rglob("*.log"))
        assert "s3cret-pw-4711" not in logs
        listed = c.run(["shoal", "get", "secrets"]).stdout.split("\n")
        assert listed[0].split() == ["NAME", "TYPE", "DATA", "AGE"], listed
        assert [line.split()[:3] for line in listed[1:3]] == [["hf", "Opaque", "1"],
                                                              ["regcred", "kubernetes.io/dockerconfigjson", "1"]]
    finally:
        c.run(["shoal", "delete", "deployment", "private", "private-nologin"], check=False)
        c.run(["shoal", "delete", "secret", "regcred", "hf"], check=False)
    assert "No resources found" in c.run(["shoal", "get", "secrets"]).stderr + c.run(["shoal", "get", "secrets"]).stdout


def test_a_pod_and_a_batch_step_share_the_nodes_image_cache(env):
    """A pod's image comes through the node's cache (kubelet's Pulling/Pulled events): a batch
    step on that node then starts from it with no pull (the registry serves its manifest
    once), and imagePullPolicy Never finds it there."""
    c, penv, registry = env["cluster"], env["podman"], env["registry"]
    local = f"localhost/shoal-shared-{registry.port}:1"
    build_image(penv, env["root"], local, "shared image")
    push(penv, local, f"{registry.address}/shoal/shared:1")
    podman(penv, "rmi", local)

    def manifest_gets() -> int:
        log = (registry.root / "registry.log").read_text()
        return log.count('"GET /v2/shoal/shared/manifests/1 HTTP/1.1" 200')

    doc = deployment("shared", "nvcr.io/shoal/shared:1", ["sh", "-c", "grep PRETTY /etc/os-release; sleep 600"])
    c.run(["shoal", "apply", "-f", "-"], input=json.dumps(doc))
    try:
        def running():
            items = json.loads(c.run(["shoal", "get", "pods", "-l", "app=shared", "-o", "json"]).stdout)["items"]
            return items[0] if items and items[0]["status"].get("phase") == "Running" else None

        pod = wait_until(running, 90, "the shared-image pod running")
        node = pod["spec"]["nodeName"]
        index = json.loads((c.root / "state" / "nodes" / node / "images" / "index.json").read_text())
        assert f"{registry.address}/shoal/shared:1" in index, list(index)
        described = c.run(["shoal", "describe", "pod", pod["metadata"]["name"]]).stdout
        assert 'Successfully pulled image "nvcr.io/shoal/shared:1"' in described, described
        before = manifest_gets()
        out = c.run(["srun", "-w", node, "--container-image=nvcr.io/shoal/shared:1", "grep", "PRETTY",
                     "/etc/os-release"], timeout=90)
        assert out.stdout.strip() == 'PRETTY_NAME="shared image"', out.stdout + out.stderr
        assert manifest_gets() == before  # the step found it in the cache the pod filled
    finally:
        c.run(["shoal", "delete", "deployment", "shared"], check=False)


def test_a_pod_runs_as_its_security_contexts_user(env):
    """runAsUser from the pod's securityContext, runAsGroup from the container's: podman's --user."""
    c = env["cluster"]
    doc = deployment("run-as", IMAGE, ["sh", "-c", "echo user=$(id -u):$(id -g); sleep 600"])
    pod_spec = doc["spec"]["template"]["spec"]
    pod_spec["securityContext"] = {"runAsUser": 1234}
    pod_spec["containers"][0]["securityContext"] = {"runAsGroup": 4321}
    out = c.run(["shoal", "apply", "-f", "-"], input=json.dumps(doc))
    assert "Warning" not in out.stderr, out.stderr
    try:
        def said():
            items = json.loads(c.run(["shoal", "get", "pods", "-l", "app=run-as", "-o", "json"]).stdout)["items"]
            if not items:
                return None
            log = c.run(["shoal", "logs", items[0]["metadata"]["name"]], check=False).stdout
            return next((line for line in log.splitlines() if line.startswith("user=")), None)

        assert wait_until(said, 60, "the pod's user") == "user=1234:4321"
    finally:
        c.run(["shoal", "delete", "deployment", "run-as"], check=False)


def test_container_image_refused_where_no_node_has_a_runtime(tmp_path):
    cluster = LocalCluster(tmp_path / "cluster", nodes=1, gpus_per_node=0).up()
    try:
        out = cluster.run(["sbatch", f"--container-image={IMAGE}", "--wrap", "true"], check=False)
        assert out.returncode != 0
        assert "no node of this partition has a container runtime" in out.stderr, out.stderr
    finally:
        cluster.down()
