"""Pyxis' container options, the step runtimes' exact command lines, and the node's image cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoal.agent.stepcontainer import (ApptainerSteps, Container, ContainerStartError, DockerSteps, EnrootSteps,
                                       ImageCache, PodmanSteps, StepRuntime)
from shoal.slurm.options import OptionError, parse_sbatch, parse_srun
from shoal.model.container import (ContainerOptionError, Mount, check_request, image_ref, parse_mounts,
                                   request_from_env, request_to_env, rewrite)

C = Container(name="pyxis_7_work", image="sha256:abc", mounts=(Mount("/data", "/data"), Mount("/ck", "/ck", ("ro",))),
              user=(1000, 1000), gpus=(2, 3), writable=False, labels={"shoal.job": "7"})


@pytest.mark.parametrize("given, kind, ref", [
    ("nvcr.io/nvidia/pytorch:24.10-py3", "registry", "nvcr.io/nvidia/pytorch:24.10-py3"),
    ("nvcr.io#nvidia/pytorch:24.10-py3", "registry", "nvcr.io/nvidia/pytorch:24.10-py3"),
    ("alice@nvcr.io#nvidia/pytorch", "registry", "nvcr.io/nvidia/pytorch:latest"),
    ("ubuntu:22.04", "registry", "docker.io/library/ubuntu:22.04"),
    ("docker://localhost:5000/x", "registry", "localhost:5000/x:latest"),
    ("podman://localhost/mine:1", "podman", "localhost/mine:1"),
    ("dockerd://mine:1", "dockerd", "mine:1"),
    ("/images/pytorch.sqsh", "file", "/images/pytorch.sqsh"),
])
def test_image_references_in_enroot_and_docker_forms(given, kind, ref):
    assert image_ref(given).kind == kind and image_ref(given).ref == ref


def test_a_mirror_replaces_the_registry_only():
    mirrors = {"nvcr.io": "127.0.0.1:5000"}
    assert rewrite("nvcr.io/nvidia/pytorch:24.10-py3", mirrors) == "127.0.0.1:5000/nvidia/pytorch:24.10-py3"
    assert rewrite("docker.io/library/ubuntu:22.04", mirrors) == "docker.io/library/ubuntu:22.04"


def test_mounts_as_pyxis_reads_them():
    assert parse_mounts("/data:/data,/ck:/ck:ro+rprivate,/scratch") == [
        Mount("/data", "/data"), Mount("/ck", "/ck", ("ro", "rprivate")), Mount("/scratch", "/scratch")]
    with pytest.raises(ContainerOptionError, match="mount source must be"):
        parse_mounts("data:/data")
    with pytest.raises(ContainerOptionError, match="unknown mount flag bogus"):
        parse_mounts("/a:/b:bogus")


def test_a_request_travels_as_pyxis_variables_and_back():
    req = check_request({"image": "nvcr.io#nvidia/pytorch:24.10-py3", "mounts": ["/a:/b:ro"], "writable": False,
                         "env": ["NCCL_DEBUG"], "name": "work"})
    env = request_to_env(req)
    assert env == {"PYXIS_CONTAINER_IMAGE": "nvcr.io#nvidia/pytorch:24.10-py3", "PYXIS_CONTAINER_MOUNTS": "/a:/b:ro",
                   "PYXIS_CONTAINER_NAME": "work", "PYXIS_CONTAINER_WRITABLE": "0", "PYXIS_CONTAINER_ENV": "NCCL_DEBUG"}
    assert request_from_env(env) == req


def test_sbatch_directives_and_the_command_line():
    script = ("#!/bin/bash\n#SBATCH --container-image nvcr.io\\#nvidia/pytorch:24.10-py3\n"
              "#SBATCH --container-mounts=/data:/data\n#SBATCH --no-container-mount-home\nsrun true\n")
    req = parse_sbatch(["--container-writable", "-"], script, cwd="/home/a", environ={}, now=0)
    assert req.body["container"] == {"image": "nvcr.io#nvidia/pytorch:24.10-py3", "mount_home": False,
                                     "mounts": [{"source": "/data", "target": "/data", "flags": []}],
                                     "writable": True}
    assert not any(k.startswith("container_") for k in req.body)


def test_srun_takes_the_jobs_options_from_the_environment_under_its_own():
    env = {"PYXIS_CONTAINER_IMAGE": "ubuntu:22.04", "PYXIS_CONTAINER_REMAP_ROOT": "1"}
    opts = parse_srun(["--container-image=alpine", "id"], cwd="/", environ=env).options
    assert opts["container"] == {"image": "alpine", "remap_root": True}
    assert "container" not in parse_srun(["id"], cwd="/", environ={}).options


def test_bad_container_options_are_refused_in_slurms_words():
    with pytest.raises(OptionError, match="line 2: invalid --container-mounts value 'data:/d'"):
        parse_sbatch(["-"], "#!/bin/sh\n#SBATCH --container-mounts=data:/d\n", cwd="/", environ={}, now=0)
    with pytest.raises(OptionError, match="--container-image is required"):
        parse_srun(["--container-workdir=/w", "id"], cwd="/", environ={})


def test_podman_keeper_and_task_command_lines():
    argv = PodmanSteps().create(C)
    pause = argv[argv.index("--entrypoint") - 1]
    assert argv[:argv.index("--entrypoint") - 2] == [
        "podman", "run", "--detach", "--name", "pyxis_7_work", "--network", "host", "--pull", "never",
        "--label", "shoal.job=7", "--user", "1000:1000", "--read-only",
        "--mount", "type=bind,source=/data,destination=/data",
        "--mount", "type=bind,source=/ck,destination=/ck,ro=true",
        "--device", "nvidia.com/gpu=2", "--device", "nvidia.com/gpu=3"]
    assert pause.endswith("destination=/.shoal/pause,ro=true")
    assert argv[-3:] == ["--entrypoint", '["/.shoal/pause", "-P"]', "sha256:abc"]
    assert PodmanSteps().task(C, ["SLURM_PROCID"], "/w", ["python", "train.py"]) == [
        "podman", "exec", "--workdir", "/w", "--user", "1000:1000", "--env", "SLURM_PROCID",
        "pyxis_7_work", "python", "train.py"]
    remapped = Container("c", "img", user=(0, 0), host_user=(1000, 100))
    assert "--uidmap" in PodmanSteps().create(remapped) and "0:1000:1" in PodmanSteps().create(remapped)


def test_docker_takes_gpus_by_its_own_flag():
    argv = DockerSteps().create(C)
    assert argv[0] == "docker" and "--device" not in argv and "never" not in argv
    assert argv[argv.index("--gpus") + 1] == '"device=2,3"'
    assert DockerSteps().remove(C) == ["docker", "rm", "--force", "pyxis_7_work"]


def test_enroot_as_pyxis_drives_it(tmp_path):
    rt = EnrootSteps()
    assert rt.pull("nvcr.io/nvidia/pytorch:24.10-py3", False, tmp_path / "x.sqsh") == [
        "enroot", "import", "--output", str(tmp_path / "x.sqsh"), "docker://nvcr.io#nvidia/pytorch:24.10-py3"]
    c = Container("pyxis_7_work", "/cache/x.sqsh", mounts=(Mount("/ck", "/ck", ("ro",)),), writable=True)
    assert rt.create(c) == ["enroot", "create", "--force", "--name", "pyxis_7_work", "/cache/x.sqsh"]
    assert rt.task(c, ["A"], "/w", ["id"]) == [
        "enroot", "start", "--rw", "--mount", "/ck:/ck:none:rbind,ro", "--env", "A", "pyxis_7_work", "id"]
    assert rt.remove(c) == ["enroot", "remove", "--force", "pyxis_7_work"]


def test_apptainer_execs_each_task_in_the_cached_sif(tmp_path):
    rt = ApptainerSteps()
    assert rt.pull("r:5000/x:1", True, tmp_path / "x.sif") == [
        "apptainer", "pull", "--nohttps", str(tmp_path / "x.sif"), "docker://r:5000/x:1"]
    c = Container("c", "/cache/x.sif", mounts=(Mount("/ck", "/ck", ("ro",)),), gpus=(0,), writable=False)
    assert rt.task(c, ["A"], "/w", ["id"]) == [
        "apptainer", "exec", "--cleanenv", "--pwd", "/w", "--nv", "--bind", "/ck:/ck:ro", "/cache/x.sif", "id"]
    assert rt.create(c) is None


class CopySteps(StepRuntime):
    """A runtime whose 'registry' is a folder: a pull is a real cp, a missing image cp's error."""

    name = "copy"
    binary = "cp"

    def __init__(self, source: Path) -> None:
        self.source = source

    def pull(self, ref, insecure, dest, auth=None):
        return ["cp", str(self.source / ref), str(dest)]


def test_the_cache_pulls_once_and_evicts_the_least_recently_used(tmp_path):
    source = tmp_path / "registry"
    source.mkdir()
    for name, size in (("a", 600_000), ("b", 600_000), ("c", 600_000)):
        (source / name).write_bytes(b"x" * size)
    now = [100.0]
    cache = ImageCache(CopySteps(source), tmp_path / "images", limit_mb=1, clock=lambda: now[0])
    first = cache.get("a", False)
    now[0] = 101
    assert cache.get("a", False).id == first.id  # no second pull: the file is the one pulled
    now[0] = 102
    cache.get("b", False)  # over 1 MiB: a, the least recently used, goes
    assert [i.ref for i in cache.images()] == ["b"]
    assert not Path(first.id).exists()
    with pytest.raises(ContainerStartError, match="No such file"):
        cache.get("missing", False)
    assert json.loads((tmp_path / "images" / "index.json").read_text()).keys() == {"b"}


def test_the_cache_reads_its_index_back(tmp_path):
    source = tmp_path / "registry"
    source.mkdir()
    (source / "a").write_bytes(b"x")
    ImageCache(CopySteps(source), tmp_path / "images").get("a", False)
    assert [i.ref for i in ImageCache(CopySteps(source), tmp_path / "images").images()] == ["a"]


def test_the_cdi_spec_names_each_gpu_and_the_common_nodes(tmp_path):
    from shoal.agent.cdi import gpu_spec, write_node_spec

    spec = gpu_spec("nvidia.com/gpu", {0: "/dev/nvidia0", 1: "/dev/nvidia1"}, {"/dev/nvidiactl": "/dev/nvidiactl"},
                    libs=["/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"])
    assert [d["name"] for d in spec["devices"]] == ["0", "1", "all"]
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"}]
    assert spec["containerEdits"]["mounts"][0]["containerPath"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    kind, path = write_node_spec([0, 1], fake=True, workdir=tmp_path, tag="abc", spec_dir=tmp_path / "cdi")
    written = json.loads(path.read_text())
    assert kind == written["kind"] == "fake-abc.shoal.io/gpu"
    assert written["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == str(tmp_path / "dev" / "nvidia0")
    assert (tmp_path / "dev" / "nvidia1").is_char_device()


def test_cuda_numbers_a_tasks_gpus_within_its_container():
    from shoal.agent.stepcontainer import StepContainer

    sc = StepContainer(Container("c", "img", gpus=(2, 5)), PodmanSteps(), {"PATH": "/bin"}, (), False)
    argv, env = sc.task_argv({"CUDA_VISIBLE_DEVICES": "5", "PATH": "/host/bin", "SLURM_PROCID": "1"}, "/w", ["id"])
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "PATH" not in argv[argv.index("--env"):] and env["PATH"] != "/host/bin"  # the image's PATH wins


def test_a_node_without_the_runtimes_binary_fails_the_step_at_once(tmp_path, monkeypatch):
    from shoal.agent.stepcontainer import StepContainers

    monkeypatch.setenv("PATH", str(tmp_path))  # no podman on it
    containers = StepContainers("podman", "node07", tmp_path)
    with pytest.raises(ContainerStartError, match="podman: command not found on node node07"):
        containers.start({"image": "ubuntu"}, job_id=1, step_id=0, user=(0, 0), home=None, cwd="/", gpus=[])
    with pytest.raises(ContainerStartError, match="no container runtime on node node07"):
        StepContainers("process", "node07", tmp_path).start({"image": "ubuntu"}, job_id=1, step_id=0, user=(0, 0),
                                                            home=None, cwd="/", gpus=[])


def test_container_names_as_pyxis_takes_them():
    assert parse_srun(["--container-name=work:exec", "id"], cwd="/", environ={}).options["container"]["name"] \
        == "work:exec"
    with pytest.raises(OptionError, match="--container-name: invalid name 'my work'"):
        parse_srun(["--container-name=my work", "id"], cwd="/", environ={})
    with pytest.raises(OptionError, match="must be \"auto\""):
        parse_srun(["--container-name=work:later", "id"], cwd="/", environ={})


def test_enroot_credentials_in_netrcs_format():
    from shoal.model.container import parse_credentials

    text = ("# NGC\nmachine nvcr.io login $oauthtoken password abc123\n"
            "machine r.local:5000\n  login alice\n  password pw\ndefault login anon password x\n")
    assert parse_credentials(text) == {"nvcr.io": ("$oauthtoken", "abc123"), "r.local:5000": ("alice", "pw")}


def test_a_login_reaches_each_runtime_in_its_own_file_never_on_the_command_line(tmp_path):
    from shoal.agent.stepcontainer import write_auth

    auth = write_auth(tmp_path, "r:5000", ("alice", "pw-123"))
    assert json.loads((auth / "auth.json").read_text())["auths"]["r:5000"]["auth"] == "YWxpY2U6cHctMTIz"
    assert (auth / ".credentials").read_text() == "machine r:5000 login alice password pw-123\n"
    assert oct((auth / "auth.json").stat().st_mode & 0o777) == "0o600"
    assert PodmanSteps().pull("r:5000/x:1", True, tmp_path / "x", auth) == [
        "podman", "pull", "--quiet", "--tls-verify=false", "--authfile", str(auth / "auth.json"), "r:5000/x:1"]
    assert DockerSteps().pull("r:5000/x:1", False, tmp_path / "x", auth)[:3] == ["docker", "--config", str(auth)]
    assert EnrootSteps().pull_env(auth) == {"ENROOT_CONFIG_PATH": str(auth)}
    assert ApptainerSteps().pull_env(auth) == {"APPTAINER_DOCKER_USERNAME": "alice",
                                               "APPTAINER_DOCKER_PASSWORD": "pw-123"}
    for rt in (PodmanSteps(), DockerSteps(), EnrootSteps(), ApptainerSteps()):
        assert "pw-123" not in " ".join(rt.pull("r:5000/x:1", False, tmp_path / "x", auth))


def test_the_agent_reads_only_the_users_own_credentials_file(tmp_path):
    import os

    from shoal.agent.stepcontainer import read_user_credentials

    config = tmp_path / "enroot"
    config.mkdir()
    (config / ".credentials").write_text("machine r login u password p\n")
    me = os.getuid()
    assert read_user_credentials({"ENROOT_CONFIG_PATH": str(config)}, None, me) == {"r": ("u", "p")}
    assert read_user_credentials({"XDG_CONFIG_HOME": str(tmp_path)}, None, me) == {"r": ("u", "p")}
    assert read_user_credentials({}, str(tmp_path / "home"), me) == {}  # ~/.config/enroot: none there
    assert read_user_credentials({"ENROOT_CONFIG_PATH": str(config)}, None, me + 1) == {}  # not that user's
    secret = tmp_path / "root-only"
    secret.write_text("machine evil login root password shadow\n")
    (config / ".credentials").unlink()
    (config / ".credentials").symlink_to(secret)
    assert read_user_credentials({"ENROOT_CONFIG_PATH": str(config)}, None, me) == {}  # a link is not followed


class LoginSteps(CopySteps):
    """A 'registry' folder that hands out an image only with alice's login."""

    def pull(self, ref, insecure, dest, auth=None):
        login = (auth / "login").read_text() if auth else ""
        return ["sh", "-c", 'test "$0" = "alice\npw" || { echo "unauthorized: authentication required" >&2; '
                'exit 1; }; cp "$1" "$2"', login, str(self.source / ref), str(dest)]


def test_a_private_image_in_the_cache_is_pulled_again_for_another_user(tmp_path):
    source = tmp_path / "registry"
    source.mkdir()
    (source / "private").write_bytes(b"x")
    cache = ImageCache(LoginSteps(source), tmp_path / "images")
    with pytest.raises(ContainerStartError, match="unauthorized"):
        cache.get("private", False, user=1000)
    cache.get("private", False, login=("alice", "pw"), user=1000)
    cache.get("private", False, user=1000)  # alice again: the node has it for her
    with pytest.raises(ContainerStartError, match="unauthorized"):
        cache.get("private", False, user=2000)  # bob without the login is not handed alice's copy
    cache.get("private", False, login=("alice", "pw"), user=2000)  # with it, he is
    assert json.loads((tmp_path / "images" / "index.json").read_text())["private"]["users"] == [1000, 2000]


def test_container_save_command_lines():
    from shoal.agent.stepcontainer import CachedImage

    image = CachedImage("r/x:1", "sha256:abc", 1, {}, ["/init"], 0.0)
    commit, save = PodmanSteps().save(C, image, "/out/x.sqsh")
    rmi = PodmanSteps().save_cleanup(C)
    assert commit == ["podman", "commit", "--quiet", "--change", 'ENTRYPOINT ["/init"]', "pyxis_7_work",
                      "localhost/pyxis-save/pyxis_7_work:latest"]
    assert save == ["podman", "save", "--quiet", "--format", "oci-archive", "--output", "/out/x.sqsh",
                    "localhost/pyxis-save/pyxis_7_work:latest"]
    assert rmi == ["podman", "rmi", "--force", "localhost/pyxis-save/pyxis_7_work:latest"]
    assert EnrootSteps().save(C, None, "/out/x.sqsh") == [
        ["enroot", "export", "--force", "--output", "/out/x.sqsh", "pyxis_7_work"]]
    with pytest.raises(ContainerStartError, match="apptainer cannot save"):
        ApptainerSteps().save(C, None, "/out/x.sif")


class EchoSaves(StepRuntime):
    name, binary = "echo", "sh"

    def save(self, c, image, path):
        return [["sh", "-c", 'echo "rootfs of $1" > "$0"', path, c.name]]


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="switches to another user, as the agent does")
def test_a_save_is_written_as_the_jobs_user_where_they_may_write(tmp_path):
    import os

    from shoal.agent.stepcontainer import StepContainer, StepContainers

    containers = StepContainers("podman", "n1", tmp_path / "agent")
    containers.runtime = EchoSaves()
    sc = StepContainer(Container("c1", "img"), containers.runtime, {}, (), False)
    import tempfile

    theirs = Path(tempfile.mkdtemp(prefix="shoal-save-", dir="/tmp"))  # a folder the user can reach
    os.chown(theirs, 65534, 65534)
    assert containers.save(sc, "./out.sqsh", str(theirs), (65534, 65534)) == str(theirs / "out.sqsh")
    assert (theirs / "out.sqsh").read_text() == "rootfs of c1\n" and (theirs / "out.sqsh").stat().st_uid == 65534
    with pytest.raises(ContainerStartError, match="Permission denied"):
        containers.save(sc, str(tmp_path / "out.sqsh"), "/", (65534, 65534))  # root's folder: not theirs
    assert not list((tmp_path / "agent" / "containers").glob("save-*"))
    __import__("shutil").rmtree(theirs)


def test_an_image_loaded_from_a_file_is_kept_in_the_cache_and_evicted_like_a_pulled_one(tmp_path):
    from shoal.agent.stepcontainer import CachedImage

    source = tmp_path / "registry"
    source.mkdir()
    (source / "a").write_bytes(b"x" * 600_000)
    now = [1.0]
    cache = ImageCache(CopySteps(source), tmp_path / "images", limit_mb=1, clock=lambda: now[0])
    loaded = tmp_path / "saved.img"
    loaded.write_bytes(b"y" * 600_000)
    image = cache.adopt(f"file:{loaded}", CachedImage("x", str(loaded), 600_000, {"A": "1"}, [], 0.0), "1:600000")
    assert image.ref == f"file:{loaded}" and image.env == {"A": "1"}
    assert cache.lookup(f"file:{loaded}")["source"] == "1:600000"
    now[0] = 2.0
    cache.get("a", False)  # over the limit: the file's image, least recently used, goes
    assert [i.ref for i in cache.images()] == ["a"]
    assert loaded.exists()  # out of the index; a user's file is never the cache's to delete
