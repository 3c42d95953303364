"""`shoal agent`: discover the node, join the cluster, run its work."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from pathlib import Path

from shoal.model.units import parse_size_mb


def parse_labels(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"invalid --label {item!r}: expected key=value")
        out[key] = value
    return out


AGENT_DEFAULTS = {"address": "0.0.0.0", "port": 6818, "gpu_model": "A100-SXM4-80GB", "tls": "auto",
                  "cgroups": "auto"}
_CONFIG_KEYS = {"server", "join_token", "join_token_file", "ca_file", "name", "address", "tls", "port", "workdir",
                "fake_gpus",
                "gpu_model", "fake_gpus_file", "cpus", "memory", "labels", "features", "taints", "runtime",
                "images", "run_jobs_as", "cgroups"}
RUNTIMES = ("process", "podman", "docker", "enroot", "apptainer")
CGROUP_MODES = ("auto", "v1", "v2", "off")  # --cgroups: see agent/cgroups.detect


def parse_taint_text(item) -> dict:
    """``key=value:Effect`` or ``key:Effect`` (or a {key, value, effect} mapping) -> a taint dict."""
    from shoal.model.selectors import SelectorError, Taint

    try:
        if isinstance(item, dict):
            return Taint.from_dict(item).to_dict()
        head, sep, effect = str(item).rpartition(":")
        if not sep:
            raise ValueError
        key, _, value = head.partition("=")
        return Taint(key, value, effect).to_dict()
    except SelectorError as e:
        raise ValueError(f"invalid taint {item!r}: {e}") from None
    except ValueError:
        raise ValueError(f"invalid taint {item!r}: expected key=value:Effect or key:Effect "
                         "(Effect: NoSchedule, PreferNoSchedule or NoExecute)") from None


def parse_images(items) -> dict[str, list[str]]:
    """The process runtime's image map: {glob: argv} from the config, or IMAGE=COMMAND flags."""
    import shlex

    out: dict[str, list[str]] = {}
    if isinstance(items, dict):
        for glob, argv in items.items():
            out[str(glob)] = shlex.split(argv) if isinstance(argv, str) else [str(a) for a in argv]
        return out
    for item in items or ():
        glob, sep, command = str(item).partition("=")
        if not sep or not glob or not command.strip():
            raise ValueError(f"invalid --image {item!r}: expected IMAGE_GLOB=COMMAND")
        out[glob] = shlex.split(command)
    return out


def apply_config_file(args) -> None:
    """Fill options not given on the command line from --config, then from the defaults."""
    conf: dict = {}
    if args.config:
        import yaml

        try:
            with open(args.config, encoding="utf-8") as f:
                conf = yaml.safe_load(f) or {}
        except OSError as e:
            raise ValueError(f"cannot read agent configuration {args.config}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ValueError(f"agent configuration {args.config} is not valid YAML: {e}") from None
        if not isinstance(conf, dict):
            raise ValueError(f"agent configuration {args.config} must be a mapping")
        unknown = sorted(set(conf) - _CONFIG_KEYS)
        if unknown:
            raise ValueError(f"agent configuration {args.config}: unknown key {unknown[0]!r} "
                             f"(known: {', '.join(sorted(_CONFIG_KEYS))})")
    for key in _CONFIG_KEYS - {"labels", "features", "taints", "images"}:
        if getattr(args, key, None) is None:
            setattr(args, key, conf.get(key, AGENT_DEFAULTS.get(key)))
    labels = conf.get("labels") or {}
    if not isinstance(labels, dict):
        raise ValueError(f"agent configuration {args.config}: labels must be a mapping of key: value")
    args.label = [f"{k}={v}" for k, v in labels.items()] + list(args.label)
    features = conf.get("features") or []
    if not isinstance(features, list):
        raise ValueError(f"agent configuration {args.config}: features must be a list")
    args.feature = [str(f) for f in features] + list(args.feature)
    taints = conf.get("taints") or []
    if not isinstance(taints, list):
        raise ValueError(f"agent configuration {args.config}: taints must be a list")
    args.taint = [parse_taint_text(t) for t in taints] + [parse_taint_text(t) for t in args.taint or ()]
    images = conf.get("images") or {}
    if not isinstance(images, dict):
        raise ValueError(f"agent configuration {args.config}: images must be a mapping of image glob: command")
    args.images = {**parse_images(images), **parse_images(args.image or ())}
    args.runtime = args.runtime or "process"
    if args.runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {args.runtime!r} (one of {', '.join(RUNTIMES)})")
    if not args.server:
        raise ValueError("the server URL is required: --server or 'server:' in --config")
    if args.tls not in ("auto", "on", "off"):
        raise ValueError(f"tls must be auto, on or off, not {args.tls!r}")
    if args.cgroups not in CGROUP_MODES:
        raise ValueError(f"cgroups must be one of {', '.join(CGROUP_MODES)}, not {args.cgroups!r}")
    if args.run_jobs_as not in (None, "submitter", "agent"):
        raise ValueError(f"run_jobs_as must be submitter or agent, not {args.run_jobs_as!r}")
    if args.run_jobs_as == "submitter" and os.geteuid() != 0:
        raise ValueError("--run-jobs-as submitter needs an agent running as root")


def run(args) -> int:
    if getattr(args, "hollow", None) is not None:
        return run_hollow(args)
    from shoal.agent.daemon import Agent, AgentConfig
    from shoal.agent.gpus import (FAKE_FAULTS_FILE, FakeGPUConfigError, GPUDiscoveryError, discover_gpus_or_none,
                                  fake_nvml_from_file, fake_nvml_from_flags)
    from shoal.agent.host import discover_host
    from shoal.api_client.tls import serves_tls
    from shoal.agent.labels import LabelError, gpu_labels, merge_labels
    from shoal.agent.gpus import GPUInventory

    try:
        apply_config_file(args)
    except ValueError as e:
        print(f"shoal agent: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("SHOAL_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s %(levelname)s agent[{args.name or '-'}]: %(message)s")
    name = args.name or socket.gethostname().split(".")[0]
    workdir = Path(args.workdir or f"/var/lib/shoal/{name}").resolve()
    try:
        if args.hostname:
            if not in_own_uts_namespace():
                print("shoal agent: error: --hostname would rename this machine itself: run the agent in a UTS "
                      "namespace of its own (unshare --uts, as shoal up does)", file=sys.stderr)
                return 2
            socket.sethostname(name)
        fake = None
        if args.fake_gpus_file:
            fake = fake_nvml_from_file(args.fake_gpus_file, seed=name)
        elif args.fake_gpus is not None:
            fake = fake_nvml_from_flags(args.fake_gpus, args.gpu_model, seed=name)
        if fake is not None:
            fake.follow_faults(workdir / FAKE_FAULTS_FILE)  # tests break fake GPUs through this file
        inventory = discover_gpus_or_none(fake) or GPUInventory()
        memory = parse_size_mb(args.memory) if args.memory else None
        host = discover_host(cpus=args.cpus, memory_mb=memory)
        labels = gpu_labels(inventory.gpus, inventory.driver_version, inventory.cuda_version,
                            compute_capability=inventory.compute_capabilities[0] if inventory.compute_capabilities else None) \
            if inventory.gpus else {}
        labels = merge_labels(labels, parse_labels(args.label))
        labels = merge_labels(labels, _runtime_label(args.runtime))
        join = args.join_token
        if args.join_token_file:
            join = Path(args.join_token_file).read_text(encoding="utf-8").strip()
        if not join:
            raise ValueError("a join token is required: --join-token or --join-token-file")
        ca_file = os.path.abspath(args.ca_file) if args.ca_file else None
        if ca_file:
            Path(ca_file).read_bytes()  # unreadable: say so now, not at the first request
        workdir.mkdir(parents=True, exist_ok=True)
        if not os.access(workdir, os.W_OK):  # root too: access() says EROFS for a read-only mount
            raise OSError(f"the work dir {workdir} is not writable (a read-only file system?)")
    except OSError as e:
        print(f"shoal agent: error: {e.filename}: {e.strerror}" if e.filename and e.strerror else
              f"shoal agent: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FakeGPUConfigError, GPUDiscoveryError, LabelError) as e:
        print(f"shoal agent: error: {e}", file=sys.stderr)
        return 2
    features = sorted(set(args.feature or []) | _gpu_features(inventory.gpus))
    cfg = AgentConfig(name=name, server=args.server, join_token=join, address=args.address, port=args.port,
                      workdir=workdir, host=host, inventory=inventory, labels=labels, features=features,
                      taints=args.taint, runtime=args.runtime, images=args.images,
                      fake_nvml=fake, ca_file=ca_file, tls=serves_tls(args.tls, args.address),
                      run_as_submitter=None if args.run_jobs_as is None
                      else args.run_jobs_as == "submitter", cgroups=args.cgroups)
    try:
        agent = Agent(cfg)
    except OSError as e:
        print(f"shoal agent: error: cannot listen on {args.address}:{args.port}: {e.strerror}", file=sys.stderr)
        return 2

    cdi = None
    if args.runtime == "podman" and inventory.gpus:
        from shoal.agent.cdi import write_node_spec

        cdi = write_node_spec([g.index for g in inventory.gpus], fake is not None, workdir, agent.containers.tag)
        if cdi is not None:
            agent.containers.cdi_kind = cdi[0]

    def _term(signum, frame):
        if cdi is not None:
            cdi[1].unlink(missing_ok=True)
        agent.runtime.kill_all()
        agent.pods.shutdown()
        agent.shutdown()
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    agent.serve()
    return 0


def _runtime_label(runtime: str) -> dict[str, str]:
    """shoal.io/container-runtime: the runtime this node's steps can run containers with,
    when its binary is here (sbatch --container-image is refused where no node has one)."""
    from shoal.agent.stepcontainer import STEP_RUNTIMES
    from shoal.model.container import RUNTIME_LABEL

    cls = STEP_RUNTIMES.get(runtime)
    return {RUNTIME_LABEL: runtime} if cls is not None and cls().available() else {}


def _gpu_features(gpus) -> set[str]:
    """A node's GPU type is also a feature, so `--constraint=h100` works as on Slurm sites."""
    from shoal.agent.labels import gpu_type

    return {gpu_type(g.product) for g in gpus}


def in_own_uts_namespace() -> bool:
    """Whether this process has a UTS namespace (host name) apart from the machine's: only there
    may ``--hostname`` set the node's name without renaming the machine. The machine's is the
    kernel's initial namespace (PROC_UTS_INIT_INO) or, in a container, init's."""
    try:
        own = os.readlink("/proc/self/ns/uts")
    except OSError:  # no /proc: assume the machine's
        return False
    if own == f"uts:[{0xEFFFFFFE}]":
        return False
    try:
        return own != os.readlink("/proc/1/ns/uts")
    except OSError:  # init's hidden from us (another PID namespace, or a locked-down init)
        return True


class _SilenceFile:
    """``--hollow-silence FILE``: the hollow nodes it names (a hostlist) silenced, read again
    whenever the file changes; no file, or an empty one: none silenced."""

    def __init__(self, path: str, fleet) -> None:
        self.path, self.fleet = path, fleet
        self.seen: float | None = None

    def check(self) -> None:
        from shoal.model.hostlist import HostlistError, expand

        try:
            mtime: float | None = os.stat(self.path).st_mtime
        except FileNotFoundError:
            mtime = None
        if mtime == self.seen:
            return
        try:
            text = Path(self.path).read_text(encoding="utf-8").strip() if mtime is not None else ""
        except OSError:
            return  # gone or replaced meanwhile: read at the next check
        self.seen = mtime
        try:
            names = set(expand(text)) if text else set()
        except HostlistError as e:
            logging.getLogger("shoal.hollow").error("--hollow-silence %s: %s", self.path, e)
            return
        self.fleet.silence(names)
        logging.getLogger("shoal.hollow").info("%d hollow nodes silenced", len(names))


def run_hollow(args) -> int:
    """``shoal agent --hollow N``: N fake nodes in this process (shoal.agent.hollow)."""
    import json
    import threading
    import time

    from shoal.agent import hollow
    from shoal.api_client import raise_open_files_limit
    from shoal.agent.gpus import FakeGPUConfigError
    from shoal.model.hostlist import numbered

    if args.hollow < 1:
        print("shoal agent: error: --hollow must be at least 1", file=sys.stderr)
        return 2
    try:
        apply_config_file(args)
        join = args.join_token
        if args.join_token_file:
            join = Path(args.join_token_file).read_text(encoding="utf-8").strip()
        if not join:
            raise ValueError("a join token is required: --join-token or --join-token-file")
        specs = hollow.node_specs(numbered(args.name or "hollow", args.hollow), gpus=args.fake_gpus or 0,
                                  gpu_model=args.gpu_model, cpus=args.cpus or 128,
                                  memory_mb=parse_size_mb(args.memory or "2T"),
                                  address="127.0.0.1" if args.address == "0.0.0.0" else args.address,
                                  port=args.port, labels=parse_labels(args.label), features=list(args.feature))
    except OSError as e:
        print(f"shoal agent: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FakeGPUConfigError) as e:
        print(f"shoal agent: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("SHOAL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s hollow: %(message)s")
    raise_open_files_limit()  # two connections a node
    fleet = hollow.HollowFleet(args.server, join, specs, ca_file=os.path.abspath(args.ca_file) if args.ca_file else None,
                               default_runtime_s=args.hollow_runtime if args.hollow_runtime is not None
                               else hollow.DEFAULT_RUNTIME_S)
    done = threading.Event()

    def _term(signum, frame):
        done.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    signal.signal(signal.SIGUSR1, lambda signum, frame: fleet.stats.reset_latencies())  # a benchmark's new window
    fleet.start()
    logging.getLogger("shoal.hollow").info("%d hollow nodes (%s..%s) against %s", len(specs), specs[0].name,
                                           specs[-1].name, args.server)
    silence = _SilenceFile(args.hollow_silence, fleet) if args.hollow_silence else None
    while not done.wait(1.0):
        if silence is not None:
            silence.check()
        if args.hollow_stats:
            tmp = f"{args.hollow_stats}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({**fleet.stats.as_json(), "time": time.time(), "nodes": len(specs),
                           "heartbeat_interval_s": fleet.nodes[0].heartbeat_interval}, f)
            os.replace(tmp, args.hollow_stats)
    fleet.shutdown()
    return 0
