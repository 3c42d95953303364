"""`shoal gateway`: serve the proxy, fed by the server (long-poll) or by a static routes file."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys

from shoal.api_client import Client, ClientError, fail, load_config, split_url
from shoal.gateway.proxy import Gateway, GatewayConfig, serve
from shoal.gateway.routing import RoutesError
from shoal.gateway.sync import RoutesFile, ServerLink

log = logging.getLogger("shoal.gateway")


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT``, or ``:PORT`` for every interface) to ``(host, port)``."""
    try:
        _, host, port, _ = split_url("//" + text)
    except ValueError as e:
        raise ValueError(f"--listen {text!r}: {e}") from None
    if port is None:
        raise ValueError(f"--listen {text!r}: give HOST:PORT, e.g. 127.0.0.1:8080")
    return host or "0.0.0.0", port


def run(args) -> int:
    """The `shoal gateway` command (its arguments are parsed by the `shoal` command shell)."""
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s shoal-gateway %(levelname)s %(message)s", stream=sys.stderr)
    try:
        host, port = parse_listen(args.listen)
    except ValueError as e:
        fail(str(e))
    config = GatewayConfig(hold_s=args.hold_timeout, connect_timeout_s=args.connect_timeout, retries=args.retries)
    server = token = context = None
    if not args.routes:
        server, token, context = _server_and_token(args)
    try:
        return asyncio.run(_serve(config, host, port, server, token, args.routes, args.metrics_interval, context))
    except RoutesError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot listen on {args.listen}: {e.strerror or e}")
    return 1


def _server_and_token(args) -> tuple[str, str | None, ssl.SSLContext | None]:
    """The server URL(s), the token, and for https the TLS context trusting the cluster CA
    (the client configuration's ca_file/ca_data, or $SHOAL_CA), as the commands use them."""
    token = None
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            fail(f"cannot read --token-file {args.token_file}: {e.strerror}")
    token = token or os.environ.get("SHOAL_TOKEN") or None
    server = args.server
    conf: dict = {}
    if not server or token is None:
        try:
            conf = load_config()
        except ClientError as e:
            if not server:
                fail(f"{e} (or give --server URL, or --routes FILE to run without a server)")
        server = server or conf["server"]
        token = token or conf.get("token")
    if not any(u.strip().startswith("https:") for u in server.split(",")):
        return server, token, None
    try:
        pem = Client(server, token, ca_file=conf.get("ca_file"), ca_data=conf.get("ca_data")).ca_pem()
        return server, token, ssl.create_default_context(cadata=pem) if pem else ssl.create_default_context()
    except ClientError as e:
        fail(str(e))
    except ssl.SSLError as e:
        fail(f"cannot use the cluster CA certificate: {e}")


async def _serve(config: GatewayConfig, host: str, port: int, server: str | None, token: str | None,
                 routes: str | None, metrics_interval: float, context: ssl.SSLContext | None = None) -> int:
    gateway = Gateway(config)
    if routes:
        source = RoutesFile(gateway, routes)
        source.load()  # a bad file at start is the operator's to fix: say so and stop
        task = source.run()
        where = f"routes file {routes}"
    else:
        link = ServerLink(gateway, server, token, report_every_s=metrics_interval, ssl_context=context)
        task = link.run()
        where = f"server {server}"
    runner, bound = await serve(gateway, host, port)
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    print(f"shoal gateway: listening on http://{shown}:{bound[1]} (routes from {where})", file=sys.stderr,
          flush=True)
    background = asyncio.ensure_future(task)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    done_first = asyncio.ensure_future(stop.wait())
    await asyncio.wait({done_first, background}, return_when=asyncio.FIRST_COMPLETED)
    if background.done() and not background.cancelled() and background.exception():
        log.error("routes source stopped: %r", background.exception())
    background.cancel()
    done_first.cancel()
    # Stop accepting, let in-flight requests finish (up to the runner's shutdown timeout).
    await runner.cleanup()
    await gateway.close()
    return 0
