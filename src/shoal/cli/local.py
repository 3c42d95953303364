"""`shoal up` / `shoal down`: a whole cluster on one machine.

A server and N agent processes, each agent a separate node with its own name, its own
127.0.0.x address, its own work directory and its own fake GPUs. As root, each agent runs
in its own UTS namespace with the node's hostname, and /etc/hosts maps the node names to
their addresses, so `hostname` and `MASTER_ADDR=$(scontrol show hostname ... | head -1)`
behave as on a real cluster. The nodes share this machine's filesystem, as a cluster with
a shared filesystem does.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from shoal.api_client import Client, ClientError, config_path, write_config, write_private_json
from shoal.model.hostlist import numbered

HOSTS_FILE = "/etc/hosts"


def state_dir(arg: str | None) -> Path:
    base = arg or os.environ.get("SHOAL_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "shoal", "local")
    return Path(base).resolve()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def _read_state(sdir: Path) -> dict | None:
    try:
        return json.loads((sdir / "cluster.json").read_text())
    except (OSError, ValueError):
        return None


def default_config(names: list[str], partition: str, args) -> dict:
    from shoal.model.hostlist import compress

    timeout = args.heartbeat_timeout or 30.0
    # A short timeout (tests) needs heartbeats often enough that a lease holds several.
    nodes = {"heartbeat_interval_s": min(2.0, timeout / 5),
             "heartbeat_timeout_s": timeout,
             "kill_wait_s": args.kill_wait if args.kill_wait is not None else 5.0}
    return {"cluster_name": "local",
            "partitions": [{"name": partition, "nodes": compress(names), "default": True}],
            "nodes": nodes}


def up(args) -> int:
    from shoal.agent.gpus import gpu_model
    from shoal.agent.labels import gpu_type

    sdir = state_dir(args.state_dir)
    current = _read_state(sdir)
    if current and _alive(current["pids"]["server"]):
        print(f"shoal up: a local cluster is already running (server {current['server']}, "
              f"{len(current['pids']['agents'])} nodes, state in {sdir}); run 'shoal down' first",
              file=sys.stderr)
        return 1
    hollow = getattr(args, "hollow", None)
    if hollow is not None:
        if hollow < 1:
            print("shoal up: --hollow must be at least 1", file=sys.stderr)
            return 2
        args.nodes = hollow
    if args.nodes < 1:
        print("shoal up: --nodes must be at least 1", file=sys.stderr)
        return 2
    try:
        model = gpu_model(args.gpu_model) if args.gpus_per_node else None
        base = ipaddress.IPv4Address(args.address_base)
    except ValueError as e:
        print(f"shoal up: {e}", file=sys.stderr)
        return 2
    try:
        sdir.mkdir(parents=True, exist_ok=True)
        (sdir / "logs").mkdir(exist_ok=True)
        if not os.access(sdir, os.W_OK):  # root too: access() says EROFS for a read-only mount
            raise OSError(errno.EROFS, "not writable (a read-only file system?)", str(sdir))
    except OSError as e:
        print(f"shoal up: error: cannot use the state dir {sdir}: {e.strerror}", file=sys.stderr)
        return 1
    names = numbered(args.name_prefix, args.nodes)
    addresses = [str(base + i) for i in range(args.nodes)]
    if not all(ipaddress.IPv4Address(a).is_loopback for a in addresses):
        print("shoal up: node addresses must stay in 127.0.0.0/8", file=sys.stderr)
        return 2
    config_file = args.config
    slurm_conf = getattr(args, "slurm_conf", None)
    if not config_file and not slurm_conf:
        partition = f"gpu-{gpu_type(model.product)}" if model else "cpu"
        config_file = str(sdir / "cluster.yaml")
        # JSON is YAML: no YAML writer needed, and the file stays readable.
        Path(config_file).write_text(json.dumps(default_config(names, partition, args), indent=2) + "\n")
    tls = getattr(args, "tls", "off") == "on"
    server_url = f"{'https' if tls else 'http'}://127.0.0.1:{args.port}"
    ca_file = str(sdir / "server" / "ca.crt") if tls else None
    join_file = sdir / "join.token"
    if not join_file.exists():
        import secrets

        fd = os.open(join_file, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, f"join_{secrets.token_urlsafe(24)}".encode())
        os.close(fd)
    py = sys.executable
    pids: dict = {"server": None, "agents": {}}
    server_cmd = [py, "-m", "shoal", "server", "--listen", f"127.0.0.1:{args.port}",
                  *(["--slurm-conf", os.path.abspath(slurm_conf)] if slurm_conf else ["--config", config_file]),
                  "--state-dir", str(sdir / "server"), "--join-token-file", str(join_file)]
    if args.db:
        server_cmd += ["--db", args.db]
    server_cmd += ["--tls", "on" if tls else "off"]
    pids["server"] = _spawn(server_cmd, sdir / "logs" / "server.log")
    state = {"server": server_url, "pids": pids, "started": time.time(), "hosts": False,
             "client_config": config_path(), "nodes": dict(zip(names, addresses))}
    _write_state(sdir, state)
    admin_file = sdir / "server" / "admin.token"
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        if not _alive(pids["server"]):
            return _failed(sdir, "the server exited during start-up", "server.log")
        if admin_file.exists() and (not tls or os.path.exists(ca_file)) and _healthy(server_url, ca_file=ca_file):
            break
        time.sleep(0.05)
    else:
        return _failed(sdir, f"the server did not come up within {args.timeout:g}s", "server.log")
    token = admin_file.read_text().strip()
    use_uts = os.geteuid() == 0 and shutil.which("unshare") is not None
    if os.geteuid() == 0:
        state["hosts"] = _hosts_add(sdir, names, addresses)
    if hollow is not None:
        cmd = [py, "-m", "shoal", "agent", "--hollow", str(hollow), "--name", args.name_prefix,
               "--server", server_url, "--join-token-file", str(join_file), "--address", addresses[0],
               "--port", str(args.agent_port), "--cpus", str(args.cpus_per_node), "--memory", args.memory_per_node]
        if ca_file:
            cmd += ["--ca-file", ca_file]
        if args.gpus_per_node:
            cmd += ["--fake-gpus", str(args.gpus_per_node), "--gpu-model", args.gpu_model]
        for label in args.label:
            cmd += ["--label", label]
        cmd += ["--hollow-stats", str(sdir / "hollow-stats.json"), "--hollow-silence", str(sdir / "hollow-silence")]
        pids["hollow"] = _spawn(cmd, sdir / "logs" / "hollow.log")
    for name, address in zip(names, addresses) if hollow is None else ():
        cmd = [py, "-m", "shoal", "agent", "--server", server_url, "--join-token-file", str(join_file),
               "--name", name, "--address", address, "--port", str(args.agent_port),
               "--workdir", str(sdir / "nodes" / name), "--cpus", str(args.cpus_per_node),
               "--memory", args.memory_per_node]
        if ca_file:
            cmd += ["--ca-file", ca_file, "--tls", "on"]
        if args.gpus_per_node:
            cmd += ["--fake-gpus", str(args.gpus_per_node), "--gpu-model", args.gpu_model]
        for label in args.label:
            cmd += ["--label", label]
        for taint in getattr(args, "taint", None) or ():
            cmd += ["--taint", taint]
        for image in getattr(args, "image", None) or ():
            cmd += ["--image", image]
        if getattr(args, "runtime", None):
            cmd += ["--runtime", args.runtime]
        if getattr(args, "run_jobs_as", None):
            cmd += ["--run-jobs-as", args.run_jobs_as]
        if getattr(args, "cgroups", None):
            cmd += ["--cgroups", args.cgroups]
        if use_uts:
            cmd = ["unshare", "--uts", "--", *cmd, "--hostname"]
        pids["agents"][name] = _spawn(cmd, sdir / "logs" / f"{name}.log")
    _write_state(sdir, state)
    client = Client(server_url, token, ca_file=ca_file)
    while time.time() < deadline:
        dead = [n for n, pid in pids["agents"].items() if not _alive(pid)]
        if dead:
            return _failed(sdir, f"agent {dead[0]} exited during start-up", f"{dead[0]}.log")
        if pids.get("hollow") and not _alive(pids["hollow"]):
            return _failed(sdir, "the hollow agents exited during start-up", "hollow.log")
        try:
            nodes = client.get("/shoal/v1/nodes")["nodes"]
        except ClientError:
            nodes = []
        ready = {n["name"] for n in nodes if n["state"] == "UP"}
        if set(names) <= ready:
            break
        time.sleep(0.05 if args.nodes < 100 else 0.5)  # listing a thousand nodes is not free
    else:
        return _failed(sdir, f"not every node registered within {args.timeout:g}s", None)
    write_config(config_path(), server_url, token, client.ca_pem())
    kubeconfig_file = None
    if tls:  # kubectl sends its token only over HTTPS
        from shoal.cli import kubeconfig

        kubeconfig_file = str(sdir / "kubeconfig")
        write_private_json(kubeconfig_file, kubeconfig.kubeconfig(server_url, token, client.ca_pem(), "admin",
                                                                  cluster="shoal-local"))
    if getattr(args, "gateway", None):
        pids["gateway"] = _spawn([py, "-m", "shoal", "gateway", "--server", server_url, "--token-file",
                                  str(admin_file), "--listen", f"127.0.0.1:{args.gateway}"],
                                 sdir / "logs" / "gateway.log", env={"SHOAL_CA": ca_file} if ca_file else None)
        state["gateway"] = f"http://127.0.0.1:{args.gateway}"
        _write_state(sdir, state)
        while time.time() < deadline and not _healthy(state["gateway"], "/gateway/healthz"):
            if not _alive(pids["gateway"]):
                return _failed(sdir, "the gateway exited during start-up", "gateway.log")
            time.sleep(0.05)
    if getattr(args, "prometheus", None):
        from shoal.cli import prometheus

        config = prometheus.scrape_config(server_url, admin_file, [f"{a}:{args.agent_port}" for a in addresses],
                                          gateway=state.get("gateway"), ca_file=ca_file)
        try:
            pids["prometheus"], state["prometheus"] = prometheus.start(sdir, args.prometheus, config, _spawn, _alive)
        except prometheus.PrometheusError as e:
            _write_state(sdir, state)
            return _failed(sdir, str(e), "prometheus.log")
        _write_state(sdir, state)
    gpus = f"{args.gpus_per_node} x {model.product}" if model else "no GPUs"
    print(f"Shoal local cluster is up: {args.nodes} {'hollow ' if hollow else ''}nodes ({names[0]}..{names[-1]}), "
          f"{gpus} each, "
          f"{args.cpus_per_node} CPUs, {args.memory_per_node} memory")
    print(f"  server   {server_url}  (logs and state in {sdir})")
    print(f"  config   {config_path()}  (sbatch, squeue, sinfo... use it)")
    print(f"  console  {server_url}/console  (log in with the token on the token: line of {config_path()})")
    if not use_uts:
        print("  note     not root: nodes share this machine's hostname, and node names resolve only if "
              "/etc/hosts lists them")
    if state.get("gateway"):
        print(f"  gateway  {state['gateway']}  (Host: NAME.NAMESPACE, or /shoal/v1/namespaces/NS/services/NAME/proxy/)")
    if state.get("prometheus"):
        print(f"  metrics  {state['prometheus']}  (Prometheus scraping the server and the agents; "
              "dashboards in examples/grafana/)")
    if kubeconfig_file:
        print(f"  kubectl  export KUBECONFIG={kubeconfig_file}")
    else:
        print("  kubectl  needs HTTPS: start with 'shoal up --tls on' for a kubeconfig")
    print("  try      sinfo; sbatch --wrap hostname; squeue; shoal apply -f app.yaml; shoal down")
    return 0


def _spawn(cmd: list[str], log: Path, env: dict | None = None) -> int:
    with open(log, "ab") as out:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, close_fds=True, env={**os.environ, **env} if env else None)
    return p.pid


def _healthy(url: str, path: str = "/healthz", ca_file: str | None = None) -> bool:
    try:
        Client(url, ca_file=ca_file).get(path, timeout=1)
        return True
    except ClientError:
        return False


def _write_state(sdir: Path, state: dict) -> None:
    tmp = sdir / "cluster.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(sdir / "cluster.json")


def _failed(sdir: Path, why: str, log: str | None) -> int:
    """Report a failed start-up: the process's own one-line error when it printed one, else
    the last lines of its log."""
    tail = []
    if log:
        path = sdir / "logs" / log
        try:
            tail = path.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            tail = []
    said = next((line.partition(": error: ")[2] for line in reversed(tail)
                 if line.startswith(("shoal server: error: ", "shoal agent: error: "))), None)
    print(f"shoal up: {why}: {said}" if said else f"shoal up: {why}", file=sys.stderr)
    if log and not said:
        if tail:
            print(f"--- last lines of {path}:", file=sys.stderr)
            print("\n".join(tail), file=sys.stderr)
    _stop(sdir, quiet=True)
    return 1


def _marker(sdir: Path) -> tuple[str, str]:
    return f"# BEGIN shoal local cluster {sdir}", f"# END shoal local cluster {sdir}"


def edit_hosts(change) -> None:
    """Rewrite /etc/hosts as ``change(text)`` says, holding an exclusive lock on it meanwhile:
    clusters started and stopped at once (tests in parallel) each read what the last wrote.
    Without the lock a reader could find the file truncated by another's write and write back
    what it read, the ``localhost`` line lost. Written in place (not renamed over): in a
    container /etc/hosts is a bind mount, which a rename cannot replace."""
    with open(HOSTS_FILE, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = change(f.read())
        f.seek(0)
        f.write(text)
        f.truncate()


def _hosts_add(sdir: Path, names: list[str], addresses: list[str]) -> bool:
    begin, end = _marker(sdir)

    def add(text: str) -> str:
        text = _hosts_strip(text, begin, end)
        # Names resolve to the first match: drop blocks left by clusters that are gone
        # (killed without `shoal down`), or they would shadow this cluster's nodes.
        for line in text.splitlines():
            if line.startswith("# BEGIN shoal local cluster "):
                other = Path(line.removeprefix("# BEGIN shoal local cluster "))
                state = _read_state(other)
                if state is None or not _alive(state["pids"]["server"]):
                    text = _hosts_strip(text, *_marker(other))
        block = [begin] + [f"{a}\t{n}" for n, a in zip(names, addresses)] + [end]
        return text.rstrip("\n") + "\n" + "\n".join(block) + "\n"

    try:
        edit_hosts(add)
        return True
    except OSError:
        return False


def _hosts_strip(text: str, begin: str, end: str) -> str:
    out, skip = [], False
    for line in text.splitlines():
        if line == begin:
            skip = True
        elif line == end:
            skip = False
        elif not skip:
            out.append(line)
    return "\n".join(out) + "\n"


def down(args) -> int:
    sdir = state_dir(args.state_dir)
    if _read_state(sdir) is None:
        print(f"shoal down: no local cluster is running (nothing in {sdir})", file=sys.stderr)
        return 1
    _stop(sdir, quiet=False)
    return 0


def _stop(sdir: Path, quiet: bool) -> None:
    state = _read_state(sdir)
    if state is None:
        return
    pids = state["pids"]
    agents = [p for p in [*pids["agents"].values(), pids.get("hollow")] if p]
    _terminate([pids[p] for p in ("gateway", "prometheus") if pids.get(p)])
    _terminate(agents)
    _terminate([pids["server"]] if pids["server"] else [])
    if state.get("hosts"):
        begin, end = _marker(sdir)
        try:
            edit_hosts(lambda text: _hosts_strip(text, begin, end))
        except OSError:
            pass
    try:
        conf = json.loads(Path(state["client_config"]).read_text())
        if conf.get("server") == state["server"]:
            os.unlink(state["client_config"])
    except (OSError, ValueError, KeyError):
        pass
    (sdir / "cluster.json").unlink(missing_ok=True)
    if not quiet:
        print(f"Shoal local cluster stopped ({len(agents)} agents and the server).")


def _terminate(pids: list[int], wait: float = 10.0) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.time() + wait
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    # Reap if they are our children (shoal up's failure path); elsewhere init reaps them.
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
