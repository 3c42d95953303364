"""Container runtimes: how one container of a pod becomes the argv lists the agent runs.

A runtime is a small class with one job: turn (pod entry, container spec, GPU indices,
container environment, paths) into a ``Launch`` -- the exact argv of the process to
supervise, the argv of the steps to run before it (image import, stale-container
removal), its host-side environment, and how to run an exec probe inside it. Nothing is
ever joined into a shell string.

Runtimes, by the names agent.yaml's ``runtime:`` and a pod's ``runtimeClassName`` use:
``process`` (a plain process on the node), ``podman``, ``docker``, ``enroot`` and
``apptainer``. docs/SERVING.md ("Node side") lists their command lines.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from shoal.agent.runtime import set_gpu_env
from shoal.model.quantity import parse_cpu, parse_memory_mb

_PULL_FLAGS = {"Always": "always", "IfNotPresent": "missing", "Never": "never"}


class ContainerError(Exception):
    """A container cannot be started; ``reason`` is the waiting reason kubelet would show."""

    reason = "CreateContainerError"


class CreateContainerError(ContainerError):
    """The runtime cannot make the container (no command, no runtime binary, bad options)."""

    reason = "CreateContainerError"


class CreateContainerConfigError(ContainerError):
    """The container's configuration cannot be resolved (an env source Shoal does not have)."""

    reason = "CreateContainerConfigError"


class ImagePullError(ContainerError):
    """The image cannot be had: it failed to pull, or is absent under imagePullPolicy Never."""

    reason = "ErrImagePull"


@dataclass(frozen=True)
class ContainerPaths:
    """Where a container keeps its files: its own directory (logs, pid) and the node's image cache."""

    dir: Path
    images: Path


@dataclass(frozen=True)
class Step:
    """A command run to completion before the container process (``kind`` pull or prepare).

    A step with ``output`` is skipped when that file exists (unless ``always``); it writes
    ``partial`` first, which is renamed to ``output`` once it succeeds, so a half-written
    image is never taken for a whole one. ``check=False`` steps may fail harmlessly.
    """

    argv: list[str]
    kind: str = "prepare"  # "pull" (a failure is ErrImagePull) | "prepare" (CreateContainerError)
    output: Path | None = None
    partial: Path | None = None
    always: bool = False
    check: bool = True


@dataclass(frozen=True)
class Launch:
    """Everything needed to start, probe and clean up one container."""

    runtime: str
    name: str  # the runtime's container name: shoal-<namespace>-<pod>-<container>
    argv: list[str]
    env: dict[str, str]  # the environment of the process the agent starts (host side)
    container_env: dict[str, str]  # what the container's process sees
    cwd: str | None = None
    steps: list[Step] = field(default_factory=list)
    cleanup: list[str] | None = None  # run once the container has ended; the runtime may keep it
    exec_prefix: list[str] = field(default_factory=list)  # an exec probe's argv goes after this


# ---------------------------------------------------------------- environment


_VAR_REF = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")
_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` is a ``$``,
    and a reference to an undefined variable is left as written."""

    def one(m: re.Match) -> str:
        if m.group(1) == "$":
            return "$"
        name = m.group(2)
        return env[name] if name in env else m.group(0)

    return _VAR_REF.sub(one, text)


def field_ref(pod: dict, path: str) -> str:
    """The value of a downward-API ``fieldRef`` (``metadata.name``, ``status.podIP``, …)."""
    penv = pod.get("env", {})
    values = {
        "metadata.name": penv.get("POD_NAME", pod.get("name", "")),
        "metadata.namespace": penv.get("POD_NAMESPACE", pod.get("namespace", "")),
        "metadata.uid": pod.get("uid", ""),
        "status.podIP": penv.get("POD_IP", ""),
        "status.hostIP": penv.get("HOST_IP", penv.get("POD_IP", "")),
        "spec.nodeName": penv.get("NODE_NAME", ""),
    }
    if path in values:
        return values[path]
    m = _LABEL_REF.fullmatch(path)
    if m:
        return str(pod.get(m.group(1), {}).get(m.group(2), ""))
    raise CreateContainerConfigError(f'unsupported fieldRef fieldPath "{path}" (Shoal resolves '
                                     f'{", ".join(values)}, metadata.labels and metadata.annotations)')


def container_env(pod: dict, container: dict) -> dict[str, str]:
    """A container's environment before GPU variables: the pod's (POD_NAME, POD_NAMESPACE,
    POD_IP, NODE_NAME), then PORT (the container's first containerPort, a convenience for
    servers that read $PORT), then the container's own ``env`` list, which wins."""
    env = {k: str(v) for k, v in pod.get("env", {}).items()}
    ports = container.get("ports") or []
    if ports:
        env["PORT"] = str(ports[0]["containerPort"])
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item or "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_ref(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            value = secret_ref(pod, source["secretKeyRef"])
            if value is not None:
                env[name] = value
        else:
            kind = next(iter(source), "valueFrom")
            raise CreateContainerConfigError(f'env {name}: {kind} is not supported on Shoal '
                                             f'(use value, valueFrom.fieldRef or valueFrom.secretKeyRef)')
    return env


def secret_ref(pod: dict, ref: dict) -> str | None:
    """An ``env[].valueFrom.secretKeyRef``'s value, from the Secrets the server sent with the
    pod; None for an optional one that is missing; kubelet's CreateContainerConfigError
    messages otherwise."""
    secrets = pod.get("secrets") or {}
    name, key = ref["name"], ref["key"]
    if name not in secrets:
        if ref.get("optional"):
            return None
        raise CreateContainerConfigError(f'secret "{name}" not found')
    if key not in secrets[name]:
        if ref.get("optional"):
            return None
        raise CreateContainerConfigError(f"couldn't find key {key} in Secret {pod['namespace']}/{name}")
    return secrets[name][key]


def secret_env_names(container: dict) -> set[str]:
    """The variables whose values come from Secrets: given to the runtime by name only."""
    return {item["name"] for item in container.get("env") or () if "secretKeyRef" in (item.get("valueFrom") or {})}


def write_authfile(path: Path, auths: Mapping[str, dict]) -> Path:
    """A pod's imagePullSecrets as the runtime's auth file (root's alone)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"auths": dict(auths)}, f)
    return path


# ---------------------------------------------------------------- helpers


def container_name(pod: dict, container: dict) -> str:
    """The name the runtime knows the container by: ``shoal-<namespace>-<pod>-<container>``."""
    return f"shoal-{pod['namespace']}-{pod['name']}-{container['name']}"


def pull_policy(container: dict) -> str:
    """imagePullPolicy, defaulted as Kubernetes does: Always for ``:latest`` or no tag."""
    policy = container.get("imagePullPolicy")
    if policy:
        return policy
    image = container.get("image", "")
    tag = image.rsplit("/", 1)[-1].partition("@")[0]
    return "Always" if ":" not in tag or tag.endswith(":latest") else "IfNotPresent"


def _limits(container: dict) -> dict:
    return (container.get("resources") or {}).get("limits") or {}


def run_as(pod: dict, container: dict) -> str | None:
    """``--user`` for the container's ``securityContext`` over the pod's (Kubernetes' order):
    ``UID[:GID]``; None keeps the image's user. A group alone keeps the image's user too."""
    pod_sc = (pod.get("spec") or {}).get("securityContext") or {}
    own = container.get("securityContext") or {}
    uid = own.get("runAsUser", pod_sc.get("runAsUser"))
    gid = own.get("runAsGroup", pod_sc.get("runAsGroup"))
    if uid is None:
        return None
    return f"{uid}:{gid}" if gid is not None else str(uid)


def _entry_and_rest(container: dict, env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """``command`` and ``args`` with ``$(VAR)`` expanded against the container's environment."""
    return ([expand(str(a), env) for a in container.get("command") or []],
            [expand(str(a), env) for a in container.get("args") or []])


def _lines(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.strip()]


# ---------------------------------------------------------------- runtimes


@dataclass(frozen=True)
class RegistrySettings:
    """Where images come from: the cluster's registry mirrors and plain-HTTP registries
    (config ``containers:``), and the CDI kind that names this node's GPUs (agent/cdi.py)."""

    mirrors: Mapping[str, str] = field(default_factory=dict)
    insecure: tuple[str, ...] = ()
    cdi_kind: str = "nvidia.com/gpu"

    def resolve(self, image: str) -> tuple[str, bool]:
        """The reference to pull (a registry image fully qualified and sent to its mirror)
        and whether its registry speaks plain HTTP; other references as given."""
        from shoal.model.container import ContainerOptionError, image_ref, rewrite

        try:
            ref = image_ref(image)
        except ContainerOptionError:
            return image, False
        if ref.kind != "registry":
            return image, False
        pulled = rewrite(ref.ref, dict(self.mirrors))
        return pulled, pulled.partition("/")[0] in self.insecure


class ContainerRuntime:
    """The base of the runtimes: one binary, one ``launch`` method, pull-failure detection."""

    name = ""
    binary: str | None = None
    registry = RegistrySettings()

    def __init__(self, node: str, images: Mapping[str, list[str]] | None = None,
                 base_env: Mapping[str, str] | None = None) -> None:
        self.node = node
        self.images = dict(images or {})
        self.base_env = dict(os.environ if base_env is None else base_env)

    def check_available(self) -> None:
        """Raise CreateContainerError when the runtime's binary is not on this node's PATH."""
        if self.binary and shutil.which(self.binary, path=self.base_env.get("PATH")) is None:
            raise CreateContainerError(f"{self.binary} not found on node {self.node}")

    def launch(self, pod: dict, container: dict, gpus: list[int], env: dict[str, str],
               paths: ContainerPaths) -> Launch:
        raise NotImplementedError

    def exec_argv(self, launch: Launch, argv: list[str], pid: int, *, stdin: bool = False,
                  tty: bool = False) -> list[str]:
        """The argv that runs an exec probe's (or ``kubectl exec``'s) command inside the running
        container; ``stdin``/``tty``: kubectl's ``-i``/``-t``, for runtimes that must be told."""
        return [*launch.exec_prefix, *argv]

    def contained(self, launch: Launch, cgroup_parent: str | None) -> Launch:
        """``launch`` with its container made inside ``cgroup_parent`` (an engine's
        ``--cgroup-parent``, cgroups.engine_parent), for engines that make a cgroup of their own;
        the others' container is the supervised process, already in the pod's cgroup."""
        return launch

    def pull_failure(self, exit_code: int, output: str) -> str | None:
        """The pull error in a container process's early output, or None if it is no pull failure."""
        return None

    def engine_failure(self, exit_code: int, output: str) -> str | None:
        """The runtime's own failure to create the container (its daemon unreachable, say),
        or None: the container ran, or was never this runtime's to create."""
        return None


class ProcessRuntime(ContainerRuntime):
    """A plain process on the node: ``command + args``, in the agent's environment.

    CUDA_VISIBLE_DEVICES lists the GPUs' NVML indices, as for batch jobs. Without a
    ``command`` the image is looked up in the agent's ``images:`` map (glob -> argv); the
    mapped argv stands for the image's ENTRYPOINT, so ``args`` are appended to it.
    """

    name = "process"

    def launch(self, pod, container, gpus, env, paths):
        cmd, args = _entry_and_rest(container, env)
        if not cmd:
            cmd = self._mapped(container.get("image", ""))
        penv = {**self.base_env, **env}
        set_gpu_env(penv, gpus)
        cenv = dict(env)
        set_gpu_env(cenv, gpus)
        return Launch(self.name, container_name(pod, container), [*cmd, *args], penv, cenv,
                      cwd=container.get("workingDir") or None)

    def _mapped(self, image: str) -> list[str]:
        for pattern, argv in self.images.items():
            if fnmatch.fnmatchcase(image, pattern):
                return [str(a) for a in argv]
        raise CreateContainerError(f"the process runtime needs a command for image {image} "
                                   f"(set command, or map the image in the agent's images:)")


class PodmanRuntime(ContainerRuntime):
    """``podman run`` in the foreground (its output is the container's), host network, GPUs
    by CDI name. Inside, CDI exposes only the pod's GPUs, renumbered from 0, so
    CUDA_VISIBLE_DEVICES is ``0..n-1``."""

    name = "podman"
    binary = "podman"
    _PULL_ERRORS = ("initializing source", "image not known", "unable to pull", "pull access denied",
                    "manifest unknown", "reading manifest", "short-name", "access to the resource is denied")

    def exec_argv(self, launch, argv, pid, *, stdin=False, tty=False):
        """``podman exec [-i] [-t] NAME CMD``: without -i the command gets no standard input."""
        prefix = launch.exec_prefix
        return [*prefix[:2], *(["-i"] if stdin else []), *(["-t"] if tty else []), *prefix[2:], *argv]

    def launch(self, pod, container, gpus, env, paths):
        name = container_name(pod, container)
        cenv = dict(env)
        if gpus:
            set_gpu_env(cenv, list(range(len(gpus))))
        else:
            set_gpu_env(cenv, [])
            cenv["NVIDIA_VISIBLE_DEVICES"] = "void"  # images that say "all" get none
        argv = [self.binary, "run", "--rm", "--name", name, "--network", "host",
                f"--pull={_PULL_FLAGS.get(pull_policy(container), 'missing')}"]
        argv += self._gpu_flags(gpus)
        limits = _limits(container)
        if "memory" in limits:
            argv += ["--memory", f"{parse_memory_mb(limits['memory'])}m"]
        if "cpu" in limits:
            argv += ["--cpus", f"{parse_cpu(limits['cpu']):g}"]
        if container.get("workingDir"):
            argv += ["-w", container["workingDir"]]
        if (user := run_as(pod, container)) is not None:
            argv += ["--user", user]
        hidden = secret_env_names(container)
        penv = dict(self.base_env)
        for k, v in cenv.items():
            if k in hidden:  # a Secret's value travels in the runtime's environment, not on its command line
                argv += ["-e", k]
                penv[k] = v
            else:
                argv += ["-e", f"{k}={v}"]
        cmd, args = _entry_and_rest(container, env)
        if cmd:
            argv += ["--entrypoint", cmd[0]]
        image, insecure = self._image(container["image"])
        if insecure:
            argv.append("--tls-verify=false")
        argv += self._auth_flags(pod, paths)
        argv += [image, *cmd[1:], *args]
        # A container left by a SIGKILLed `run` (conmon keeps it) would block the name.
        remove = self._remove(name)
        return Launch(self.name, name, argv, penv, cenv, steps=[Step(remove, check=False)],
                      cleanup=remove, exec_prefix=[self.binary, "exec", name])

    def contained(self, launch, cgroup_parent):
        """``--cgroup-parent`` right after ``run`` (docker's ``--config`` comes before it)."""
        if not cgroup_parent:
            return launch
        at = launch.argv.index("run") + 1
        return replace(launch, argv=[*launch.argv[:at], "--cgroup-parent", cgroup_parent, *launch.argv[at:]])

    def _auth_flags(self, pod: dict, paths: ContainerPaths) -> list[str]:
        """The pod's imagePullSecrets as ``--authfile`` (in the container's own folder)."""
        auths = pod.get("registry_auths")
        return ["--authfile", str(write_authfile(paths.dir / "auth.json", auths))] if auths else []

    def _remove(self, name: str) -> list[str]:
        return [self.binary, "rm", "--force", "--ignore", name]

    def _image(self, image: str) -> tuple[str, bool]:
        """Through the cluster's mirrors only when it has some: without, the image is
        given to podman as written, its own registries.conf resolving it."""
        if not self.registry.mirrors and not self.registry.insecure:
            return image, False
        return self.registry.resolve(image)

    def _gpu_flags(self, gpus: list[int]) -> list[str]:
        flags: list[str] = []
        for g in gpus:
            flags += ["--device", f"{self.registry.cdi_kind}={g}"]
        return flags

    _ENGINE_ERRORS = ("Cannot connect to Podman", "cannot connect to Podman", "Cannot connect to the Docker daemon",
                      "permission denied while trying to connect to the Docker daemon",
                      "could not find a working container runtime")

    def pull_failure(self, exit_code, output):
        if exit_code != 125:
            return None
        for line in _lines(output):
            if line.startswith("Error:") and any(p in line for p in self._PULL_ERRORS):
                return line
        return None

    def engine_failure(self, exit_code, output):
        """Exit 125 is the engine's own error (126/127: the command in the image); only
        the engine's messages about itself count, not a pull error."""
        if exit_code != 125:
            return None
        hits = [line for line in _lines(output) if any(p in line for p in self._ENGINE_ERRORS)]
        return f"{self.binary}: {hits[-1].removeprefix('Error: ').removeprefix(self.binary + ': ')}" if hits else None


class DockerRuntime(PodmanRuntime):
    """``docker run`` as podman, GPUs through the NVIDIA runtime's ``--gpus '"device=…"'``
    (the value carries its double quotes: docker reads it as CSV). Inside, the GPUs are
    renumbered from 0, so CUDA_VISIBLE_DEVICES is ``0..n-1``."""

    name = "docker"
    binary = "docker"
    _PULL_ERRORS = ("Unable to find image", "pull access denied", "manifest unknown", "No such image",
                    "repository does not exist", "failed to resolve reference")

    def _remove(self, name):
        return [self.binary, "rm", "--force", name]  # fails harmlessly when there is none

    def _image(self, image):
        return super()._image(image)[0], False  # plain-HTTP registries are the docker daemon's setting

    def _auth_flags(self, pod, paths):
        return []  # docker run takes no login file: the client's --config folder does (launch)

    def launch(self, pod, container, gpus, env, paths):
        """As podman's; the pod's imagePullSecrets as the config.json of docker's ``--config``."""
        launch = super().launch(pod, container, gpus, env, paths)
        auths = pod.get("registry_auths")
        if not auths:
            return launch
        folder = write_authfile(paths.dir / "docker-config" / "config.json", auths).parent
        return replace(launch, argv=[launch.argv[0], "--config", str(folder), *launch.argv[1:]])

    def _gpu_flags(self, gpus):
        return ["--gpus", '"device=' + ",".join(str(g) for g in gpus) + '"'] if gpus else []

    def pull_failure(self, exit_code, output):
        if exit_code != 125:
            return None
        hits = [line for line in _lines(output) if any(p in line for p in self._PULL_ERRORS)]
        if not hits:
            return None
        errors = [line for line in hits if "Error" in line]
        return (errors or hits)[-1]


class EnrootRuntime(ContainerRuntime):
    """Enroot as Pyxis drives it: import the image once into the node's cache (a squashfs),
    create the container's root filesystem, start it writable.

    The NVIDIA hook mounts the GPUs named by NVIDIA_VISIBLE_DEVICES, but /dev is the host's,
    so CUDA would see every GPU: CUDA_VISIBLE_DEVICES lists the NVML indices, as for batch
    jobs. Enroot has no --entrypoint: ``command + args`` go to the image's /etc/rc, which
    runs an image ENTRYPOINT with them as arguments.
    """

    name = "enroot"
    binary = "enroot"

    def launch(self, pod, container, gpus, env, paths):
        name = container_name(pod, container)
        image = container["image"]
        sqsh = paths.images / (re.sub(r"[^A-Za-z0-9_.-]", "+", image) + ".sqsh")
        policy = pull_policy(container)
        if policy == "Never" and not sqsh.exists():
            raise ImagePullError(f'Container image "{image}" is not present with pull policy of Never')
        cenv = dict(env)
        set_gpu_env(cenv, gpus)
        cenv["NVIDIA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus) if gpus else "void"
        if gpus:
            cenv.setdefault("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")
        partial = paths.dir / "image.sqsh.partial"
        steps = []
        if policy != "Never":
            steps.append(Step([self.binary, "import", "--output", str(partial), self.uri(image)], kind="pull",
                              output=sqsh, partial=partial, always=policy == "Always"))
        steps.append(Step([self.binary, "create", "--force", "--name", name, str(sqsh)]))
        argv = [self.binary, "start", "--rw"]
        for k, v in cenv.items():
            argv += ["-e", f"{k}={v}"]
        cmd, args = _entry_and_rest(container, env)
        argv += [name, *cmd, *args]
        return Launch(self.name, name, argv, dict(self.base_env), cenv, steps=steps,
                      cleanup=[self.binary, "remove", "--force", name], exec_prefix=[self.binary, "exec"])

    def exec_argv(self, launch, argv, pid, *, stdin=False, tty=False):
        return [*launch.exec_prefix, str(pid), *argv]

    @staticmethod
    def uri(image: str) -> str:
        """Enroot's docker URI: the registry is separated by ``#`` (``docker://nvcr.io#nvidia/pytorch:24.01``)."""
        first, sep, rest = image.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost"):
            return f"docker://{first}#{rest}"
        return f"docker://{image}"


class ApptainerRuntime(ContainerRuntime):
    """``apptainer exec`` of the docker image when a ``command`` is given, ``apptainer run``
    (the image's runscript: ENTRYPOINT + args) otherwise; ``--nv`` only with GPUs.

    ``--nv`` binds every GPU, so CUDA_VISIBLE_DEVICES lists the NVML indices. Values with
    a comma (the GPU lists among them) travel as APPTAINERENV_<NAME> in apptainer's own
    environment, because ``--env`` splits its value at commas.
    """

    name = "apptainer"
    binary = "apptainer"

    def launch(self, pod, container, gpus, env, paths):
        cenv = dict(env)
        set_gpu_env(cenv, gpus)
        host_env = dict(self.base_env)
        cmd, args = _entry_and_rest(container, env)
        argv = [self.binary, "exec" if cmd else "run"]
        if gpus:
            argv.append("--nv")
        argv.append("--cleanenv")
        for k, v in cenv.items():
            if "," in v:
                host_env[f"APPTAINERENV_{k}"] = v
            else:
                argv += ["--env", f"{k}={v}"]
        if container.get("workingDir"):
            argv += ["--pwd", container["workingDir"]]
        uri = f"docker://{container['image']}"
        options = argv[2:]
        argv += [uri, *cmd, *args]
        return Launch(self.name, container_name(pod, container), argv, host_env, cenv,
                      exec_prefix=[self.binary, "exec", *options, uri])

    def pull_failure(self, exit_code, output):
        if exit_code != 255:
            return None
        for line in _lines(output):
            if line.startswith("FATAL:") and ("docker://" in line or "image" in line):
                return line
        return None


RUNTIMES: dict[str, type[ContainerRuntime]] = {
    r.name: r for r in (ProcessRuntime, PodmanRuntime, DockerRuntime, EnrootRuntime, ApptainerRuntime)
}


def get_runtime(name: str, node: str, images: Mapping[str, list[str]] | None = None,
                base_env: Mapping[str, str] | None = None) -> ContainerRuntime:
    """The runtime called ``name`` (agent.yaml's ``runtime:``, a pod's runtimeClassName)."""
    try:
        cls = RUNTIMES[name]
    except KeyError:
        raise CreateContainerError(f'unknown container runtime "{name}" on node {node} '
                                   f'(known: {", ".join(RUNTIMES)})') from None
    return cls(node, images, base_env)
