"""`shoal server`: API, scheduler and controllers in one process."""

from __future__ import annotations

import logging
import os
import sys


def _slurm_conf_config(path: str):
    """The cluster configuration from a site's slurm.conf; each warning logged (docs/SLURM-CONF.md)."""
    from pathlib import Path

    from shoal.server.config import ConfigError, parse_cluster_config
    from shoal.server.slurmconf import SlurmConfError, import_files

    try:
        imported = import_files(path)
    except SlurmConfError as e:
        raise ConfigError(f"{path}: {e}") from None
    for warning in imported.warnings:
        logging.getLogger("shoal.server").warning("%s: %s", path, warning)
    config = parse_cluster_config(imported.config, path)
    config._base_dir = Path(path).resolve().parent
    return config


def import_slurm_conf(args) -> int:
    """`shoal import-slurm-conf`: the cluster file (to -o or standard output), warnings on stderr."""
    from shoal.server.config import ConfigError, parse_cluster_config
    from shoal.server.slurmconf import SlurmConfError, import_files, to_yaml

    try:
        imported = import_files(args.slurm_conf)
        parse_cluster_config(imported.config, args.slurm_conf)  # what the server would refuse, refused here
    except (SlurmConfError, ConfigError) as e:
        print(f"shoal import-slurm-conf: error: {e}", file=sys.stderr)
        return 2
    for warning in imported.warnings:
        print(f"shoal import-slurm-conf: warning: {warning}", file=sys.stderr)
    text = to_yaml(imported, args.slurm_conf)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def run(args) -> int:
    import uvicorn

    from shoal.server.app import create_app
    from shoal.server.config import ConfigError, load_cluster_config
    from shoal.api_client import raise_open_files_limit
    from shoal.server import interpreter, stalls, tls
    from shoal.server.protocol import serving
    from shoal.server.core import Server
    from sqlalchemy.exc import SQLAlchemyError

    logging.basicConfig(level=os.environ.get("SHOAL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = _slurm_conf_config(args.slurm_conf) if args.slurm_conf else load_cluster_config(args.config)
    except ConfigError as e:
        print(f"shoal server: error: {e}", file=sys.stderr)
        return 2
    state_dir = os.path.abspath(args.state_dir)
    db = args.db or f"sqlite:///{os.path.join(state_dir, 'shoal.db')}"
    host, _, port = args.listen.rpartition(":")
    use_tls = tls.serves_tls(args.tls, host)
    url = args.advertise_url or f"{'https' if use_tls else 'http'}://{_advertised_host(host)}:{port}"
    try:
        join = None
        if args.join_token_file:
            with open(args.join_token_file, encoding="utf-8") as f:
                join = f.read().strip()
        _check_listen(host or "127.0.0.1", port)
        server = Server(db, config, state_dir, join_token=join, url=url)
    except StartupError as e:
        print(f"shoal server: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"shoal server: error: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}",
              file=sys.stderr)
        return 1
    except SQLAlchemyError as e:
        # A bad --db URL, a database that cannot be reached or written: the driver's own words.
        said = str(getattr(e, "orig", None) or e).strip().partition("\n")[0]
        print(f"shoal server: error: cannot open the state store {_redacted(db)}: {said}", file=sys.stderr)
        return 1
    ssl_files = {}
    if use_tls:
        from shoal.api_client import split_url

        files = tls.prepare(server.sessions, server.state_dir,
                            tls.subject_names(host, split_url(args.advertise_url)[1] if args.advertise_url else None))
        ssl_files = {"ssl_certfile": str(files.cert), "ssl_keyfile": str(files.key)}
        logging.getLogger("shoal.server").info("serving HTTPS at %s; agents and clients need the cluster CA %s",
                                               url, files.ca)
    app = create_app(server)
    interpreter.set_for_server()
    stalls.started(args.stall_log, args.stall_ms / 1000)
    raise_open_files_limit()  # an agent holds two connections: 10,000 at 5,000 nodes
    # wsproto: the websockets package refuses kubectl port-forward's subprotocol (docs/KUBERNETES-API.md).
    # Idle connections are kept past the agents' heartbeat interval: each agent keeps one open
    # for its heartbeats (api_client's keep_alive) instead of a new one (and TLS handshake) each.
    keep_alive_s = max(30.0, server.config.nodes.heartbeat_interval_s + 15)
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning", access_log=False,
                timeout_keep_alive=keep_alive_s, timeout_graceful_shutdown=2, ws="wsproto",
                http=serving(app), **ssl_files)
    return 0


class StartupError(Exception):
    """A start-up failure whose message says it all."""


def _check_listen(host: str, port: str) -> None:
    """Fail now, in one line, if the listen address is taken (uvicorn would say so only
    after the scheduler and controllers started)."""
    import socket

    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError) as e:
        raise StartupError(f"cannot listen on {host}:{port}: {e}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(address)
        except OSError as e:
            raise StartupError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def _redacted(db: str) -> str:
    """A database URL without its password."""
    scheme, sep, rest = db.partition("://")
    auth, at, where = rest.rpartition("@")
    if not at or ":" not in auth:
        return db
    return f"{scheme}{sep}{auth.partition(':')[0]}:***@{where}"


def _advertised_host(host: str) -> str:
    """The host other machines reach a listen address by (a wildcard gives the host's name)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        import socket

        return socket.getfqdn()
    return host
