"""`shoal server`: API, scheduler and controllers in one process."""

from __future__ import annotations

import logging
import os
import sys


def run(args) -> int:
    import uvicorn

    from shoal.server.app import create_app
    from shoal.server.config import ConfigError, load_cluster_config
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
    url = args.advertise_url or f"http://{_advertised_host(host)}:{port}"
    server = Server(db, config, state_dir, join_token=join, url=url)
    app = create_app(server)
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning", access_log=False,
                timeout_keep_alive=30, timeout_graceful_shutdown=2)
    return 0


def _advertised_host(host: str) -> str:
    """The host other machines reach a listen address by (a wildcard gives the host's name)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        import socket

        return socket.getfqdn()
    return host
