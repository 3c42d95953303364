"""``shoal logs``: the server fetches a container's log from the node's agent and streams it.

The agent keeps logs on the node (as the kubelet does) and serves them on its step server;
the server signs each request with the node's step key (an HMAC over the query, with a
timestamp the agent checks), so nothing but the control plane can read them.
"""

from __future__ import annotations

import time
from urllib.parse import urlencode

import aiohttp

from shoal.server.auth import node_step_key, sign
from shoal.server.kube.objects import ObjectError


def log_query(secret: bytes, node: str, key: str, container: str, previous: bool, follow: bool,
              tail: int | None, now: float) -> str:
    params = {"key": key, "container": container, "previous": int(previous), "follow": int(follow),
              "t": f"{now:.0f}"}
    if tail is not None:
        params["tail"] = tail
    query = urlencode(params)
    return f"{query}&sig={sign(node_step_key(secret, node).encode(), query)}"


class PodLogs:
    def __init__(self, server) -> None:
        self.server = server

    async def stream(self, node: str, address: str, port: int, *, key: str, container: str, previous: bool,
                     follow: bool, tail: int | None):
        query = log_query(self.server.secret, node, key, container, previous, follow, tail, time.time())
        timeout = aiohttp.ClientTimeout(total=None if follow else 60, sock_connect=5)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(f"http://{address}:{port}/v1/pods/log?{query}") as resp:
                    if resp.status != 200:
                        text = await resp.text()
                        raise ObjectError(_detail(text) or f"the node's agent answered {resp.status}",
                                          400 if resp.status < 500 else 502)
                    yield b""  # headers are fine: the route may answer 200 now
                    async for chunk in resp.content.iter_any():
                        yield chunk
        except aiohttp.ClientError as e:
            raise ObjectError(f"cannot reach the agent of node {node} at {address}:{port}: {e}", 502) from None


def _detail(text: str) -> str:
    import json

    try:
        return json.loads(text).get("detail", "")
    except ValueError:
        return text.strip()
