"""`shoal`: run the server, an agent or the gateway, start and stop a local cluster, manage tokens."""

from __future__ import annotations

import argparse
import sys

from shoal import __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal", description="Shoal GPU cluster manager")
    p.add_argument("--version", action="version", version=f"shoal {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("server", help="run the control plane (API + scheduler)")
    s.add_argument("--listen", default="127.0.0.1:6817", help="host:port to serve on (default %(default)s)")
    s.add_argument("--db", help="SQLAlchemy URL (default: SQLite in the state dir; "
                                "postgresql+psycopg://user@host/db for PostgreSQL)")
    s.add_argument("--config", help="cluster configuration (YAML): partitions, timeouts")
    s.add_argument("--slurm-conf", metavar="PATH", help="instead of --config: an existing site's slurm.conf (with "
                   "gres.conf and topology.conf beside it), read as `shoal import-slurm-conf` reads it")
    s.add_argument("--state-dir", default="/var/lib/shoal/server", help="secrets and the default SQLite file")
    s.add_argument("--join-token-file", help="accept agents that present this token (else one is generated)")
    s.add_argument("--advertise-url", help="the URL clients reach this server by, as /shoal/v1/leader and scontrol "
                   "ping name it (default: http://HOST:PORT of --listen, https with TLS)")
    s.add_argument("--tls", choices=("on", "off", "auto"), default="auto",
                   help="serve HTTPS with a certificate from the cluster CA made at first start (STATE_DIR/ca.crt "
                        "is what agents and clients need); auto: on unless --listen is a loopback address")
    s.add_argument("--stall-log", metavar="FILE", help="write every thread's stack to FILE whenever the server's "
                   "interpreter is held for over --stall-ms, and a line for each such stall (docs/SCALE.md)")
    s.add_argument("--stall-ms", type=float, default=100.0, metavar="MS",
                   help="with --stall-log: the shortest stall written (default %(default)g)")

    i = sub.add_parser("import-slurm-conf", help="write a cluster file from an existing slurm.conf (and the "
                       "gres.conf and topology.conf beside it), warning about every line it does not use")
    i.add_argument("slurm_conf", metavar="SLURM_CONF")
    i.add_argument("-o", "--output", help="write the cluster file here (default: standard output)")

    a = sub.add_parser("agent", help="run a node agent")
    a.add_argument("--config", help="agent configuration (YAML): any of the options below, plus "
                                    "labels: {key: value} and features: [...]; command-line flags win")
    a.add_argument("--server", help="server URL, e.g. http://10.0.0.1:6817; several, comma-separated, "
                                    "for servers sharing a PostgreSQL store (the next is tried when one is down)")
    a.add_argument("--join-token")
    a.add_argument("--ca-file", help="the cluster CA certificate (the server's STATE_DIR/ca.crt), to verify an "
                                     "https:// server; jobs get it as $SHOAL_CA")
    a.add_argument("--join-token-file")
    a.add_argument("--name", help="node name (default: short hostname)")
    a.add_argument("--address", help="address to serve srun launches on and to advertise (default 0.0.0.0)")
    a.add_argument("--tls", choices=("on", "off", "auto"),
                   help="serve srun, logs, exec and /metrics over HTTPS with a certificate the cluster CA issues "
                        "at registration; auto (default): on unless --address is a loopback address")
    a.add_argument("--port", type=int, help="default 6818")
    a.add_argument("--workdir", help="agent state (default /var/lib/shoal/NAME)")
    a.add_argument("--fake-gpus", type=int, metavar="N", help="pretend to have N GPUs (no NVIDIA driver needed); "
                   "faults appended to WORKDIR/fake-gpu-faults ('xid GPU XID', 'ecc GPU [N]', 'lost GPU', "
                   "'reset GPU') break them while the agent runs")
    a.add_argument("--gpu-model", help="model of the fake GPUs (default A100-SXM4-80GB)")
    a.add_argument("--fake-gpus-file", help="YAML list of fake GPUs")
    a.add_argument("--cpus", type=int, help="CPUs to advertise (default: what psutil finds)")
    a.add_argument("--memory", help="memory to advertise, e.g. 2T or 512G (default: what psutil finds)")
    a.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    a.add_argument("--feature", action="append", default=[], help="node feature for --constraint")
    a.add_argument("--hostname", action="store_true", help="set the UTS hostname to the node name")
    a.add_argument("--taint", action="append", default=[], metavar="KEY[=VALUE]:EFFECT",
                   help="taint the node when it first registers (pods must tolerate it)")
    a.add_argument("--runtime", help="default container runtime for pods: process (default), podman, docker, "
                                     "enroot or apptainer")
    a.add_argument("--image", action="append", default=[], metavar="GLOB=COMMAND",
                   help="process runtime: run COMMAND for pods whose image matches GLOB and has no command")
    a.add_argument("--run-jobs-as", choices=("submitter", "agent"),
                   help="whose uid jobs and pods run with: the submitting user's (the default when the agent "
                        "is root, as slurmd) or the agent's own (the only choice when it is not root)")
    a.add_argument("--cgroups", choices=("auto", "v1", "v2", "off"),
                   help="contain each job in a cgroup (memory, CPUs, GPU devices, every process): auto (default) "
                        "uses what the node mounts, v1 or v2 insist, off runs jobs uncontained")
    a.add_argument("--hollow", type=int, metavar="N",
                   help="run N hollow nodes in this process (as kubemark's hollow nodes): fake GPUs, real "
                        "registrations, heartbeats and long-polls, runs that only wait out their script's sleeps; "
                        "--name is their names' prefix (default hollow)")
    a.add_argument("--hollow-runtime", type=float, metavar="SECONDS",
                   help="how long a hollow run lasts when its script has no sleep (default 1)")
    a.add_argument("--hollow-stats", metavar="FILE",
                   help="write the hollow nodes' counts and report round trips to FILE (JSON) every second")
    a.add_argument("--hollow-silence", metavar="FILE",
                   help="silence the hollow nodes FILE names (a hostlist, read again when it changes): they stop "
                        "heartbeating and long-polling, as nodes that hang, until the file no longer names them")

    u = sub.add_parser("up", help="start a local cluster (server + N agents) in the background")
    u.add_argument("--nodes", type=int, default=4)
    u.add_argument("--gpus-per-node", type=int, default=8)
    u.add_argument("--gpu-model", default="A100-SXM4-80GB")
    u.add_argument("--cpus-per-node", type=int, default=128)
    u.add_argument("--memory-per-node", default="2T")
    u.add_argument("--name-prefix", default="node")
    u.add_argument("--address-base", default="127.0.0.2", help="first node's address; each node gets the next")
    u.add_argument("--port", type=int, default=6817, help="server port")
    u.add_argument("--agent-port", type=int, default=6818)
    u.add_argument("--config", help="cluster configuration (default: one partition named after the GPU model)")
    u.add_argument("--slurm-conf", metavar="PATH", help="instead of --config: a site's slurm.conf (shoal server "
                   "--slurm-conf); name the nodes after its NodeName lines with --name-prefix")
    u.add_argument("--db", help="SQLAlchemy URL (default: SQLite in the state dir)")
    u.add_argument("--tls", choices=("on", "off"), default="off",
                   help="serve HTTPS, the server and the agents (the nodes and the client configuration get the "
                        "cluster CA); default off: "
                        "a local cluster listens on loopback only")
    u.add_argument("--state-dir", help="default: $SHOAL_STATE_DIR or ~/.local/state/shoal/local")
    u.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="label for every node")
    u.add_argument("--taint", action="append", default=[], metavar="KEY[=VALUE]:EFFECT",
                   help="taint every node (pods must tolerate it; batch jobs ignore taints)")
    u.add_argument("--runtime", help="pods' container runtime on every node (default: process)")
    u.add_argument("--image", action="append", default=[], metavar="GLOB=COMMAND",
                   help="process runtime: what to run for an image without a command")
    u.add_argument("--run-jobs-as", choices=("submitter", "agent"),
                   help="every agent's --run-jobs-as (default: submitter when run as root)")
    u.add_argument("--cgroups", choices=("auto", "v1", "v2", "off"), help="every agent's --cgroups")
    u.add_argument("--gateway", type=int, metavar="PORT",
                   help="also start a gateway on 127.0.0.1:PORT routing to Services' ready pods")
    u.add_argument("--prometheus", type=int, metavar="PORT",
                   help="also start Prometheus (Debian's prometheus package) on 127.0.0.1:PORT, scraping the "
                        "server and the agents (docs/METRICS.md)")
    u.add_argument("--heartbeat-timeout", type=float, help="seconds before a silent node is DOWN")
    u.add_argument("--kill-wait", type=float, help="seconds between SIGTERM and SIGKILL")
    u.add_argument("--hollow", type=int, metavar="N",
                   help="N hollow nodes (one `shoal agent --hollow N` process: fake nodes that only heartbeat "
                        "and wait out their jobs' sleeps) instead of --nodes real agents")
    u.add_argument("--timeout", type=float, default=60.0, help="give up if the nodes are not ready in time")

    d = sub.add_parser("down", help="stop the local cluster")
    d.add_argument("--state-dir")

    from shoal.cli import tokens

    tokens.add_parser(sub)  # token create, list, revoke

    from shoal.cli import kubeconfig

    kubeconfig.add_parser(sub)

    g = sub.add_parser("gateway", help="route HTTP requests to Services' ready pods")
    g.add_argument("--listen", default="127.0.0.1:8080", help="host:port to serve on (default %(default)s)")
    source = g.add_mutually_exclusive_group()
    source.add_argument("--server", help="server URL to long-poll for routes (default: the client configuration's)")
    source.add_argument("--routes", metavar="FILE", help="static routes JSON, shaped as GET /shoal/v1/kube/routes "
                                                         "answers, re-read when it changes (no server needed)")
    g.add_argument("--token-file", help="file with the API token (default: $SHOAL_TOKEN or the client configuration)")
    g.add_argument("--hold-timeout", type=float, default=60.0, metavar="S",
                   help="how long to hold a request for a scale-to-zero Service (default %(default)g)")
    g.add_argument("--connect-timeout", type=float, default=5.0, metavar="S", help="default %(default)g")
    g.add_argument("--retries", type=int, default=2, help="other pods to try when a connection fails "
                                                          "(default %(default)s)")
    g.add_argument("--metrics-interval", type=float, default=1.0, metavar="S",
                   help="seconds between load reports to the server (default %(default)g)")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    from shoal.cli import kubectl

    kubectl.add_parsers(sub)  # apply, get, describe, delete, scale, rollout, logs, taint, label, exec

    # Listed for --help only: main() hands `simulate ...` to shoal.sim.cli, imported lazily.
    sub.add_parser("simulate", help="replay a job trace on a simulated cluster, policies side by side",
                   add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:
        from shoal.sim.cli import main as simulate

        return simulate(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "kubectl", None):
        return args.kubectl(args)
    if args.command == "server":
        from shoal.server.main import run

        if not args.config and not args.slurm_conf:
            parser.error("shoal server needs --config or --slurm-conf")
        return run(args)
    if args.command == "import-slurm-conf":
        from shoal.server.main import import_slurm_conf

        return import_slurm_conf(args)
    if args.command == "agent":
        from shoal.agent.main import run

        return run(args)
    if args.command == "gateway":
        from shoal.gateway.main import run

        return run(args)
    if args.command in ("up", "down"):
        from shoal.cli import local

        return local.up(args) if args.command == "up" else local.down(args)
    if args.command == "token":
        return args.token_command(args)
    if args.command == "kubeconfig":
        from shoal.cli import kubeconfig

        return kubeconfig.run(args)
    parser.print_help()
    return 1


if __name__ == "__main__":
    sys.exit(main())
