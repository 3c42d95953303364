"""`shoal server`: API, scheduler and controllers in one process."""

from __future__ import annotations

import logging
import os
import sys


def run(args) -> int:
    import uvicorn

    from shoal.server.app import create_app
    from shoal.server.config import ConfigError, load_cluster_config
    from shoal.server import tls
    from shoal.server.core import Server

    logging.basicConfig(level=os.environ.get("SHOAL_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_cluster_config(args.config)
    except ConfigError as e:
        print(f"shoal server: {e}", file=sys.stderr)
        return 2
    state_dir = os.path.abspath(args.state_dir)
    db = args.db or f"sqlite:///{os.path.join(state_dir, 'shoal.db')}"
    join = None
    if args.join_token_file:
        with open(args.join_token_file, encoding="utf-8") as f:
            join = f.read().strip()
    host, _, port = args.listen.rpartition(":")
    use_tls = tls.serves_tls(args.tls, host)
    url = args.advertise_url or f"{'https' if use_tls else 'http'}://{_advertised_host(host)}:{port}"
    server = Server(db, config, state_dir, join_token=join, url=url)
    ssl_files = {}
    if use_tls:
        from shoal.cli.client import split_url

        files = tls.prepare(server.sessions, server.state_dir,
                            tls.subject_names(host, split_url(args.advertise_url)[1] if args.advertise_url else None))
        ssl_files = {"ssl_certfile": str(files.cert), "ssl_keyfile": str(files.key)}
        logging.getLogger("shoal.server").info("serving HTTPS at %s; agents and clients need the cluster CA %s",
                                               url, files.ca)
    app = create_app(server)
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning", access_log=False,
                timeout_keep_alive=30, timeout_graceful_shutdown=2, **ssl_files)
    return 0


def _advertised_host(host: str) -> str:
    """The host other machines reach a listen address by (a wildcard gives the host's name)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        import socket

        return socket.getfqdn()
    return host
