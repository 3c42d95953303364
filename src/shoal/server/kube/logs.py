"""``shoal logs`` and ``shoal exec``: the server asks the node's agent and streams the answer.

The agent keeps logs on the node (as the kubelet does), serves them on its step server and
runs exec commands there; the server signs each request with the node's step key (an HMAC
over the query or the request body, with a timestamp the agent checks), so nothing but the
control plane can read logs or run commands in containers.
"""

from __future__ import annotations

import json
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


def exec_request(secret: bytes, node: str, key: str, container: str, argv: list[str], stdin: str,
                 now: float) -> dict:
    req = {"key": key, "container": container, "argv": argv, "stdin": stdin, "t": f"{now:.0f}"}
    return {**req, "sig": sign(node_step_key(secret, node).encode(), json.dumps(req, sort_keys=True))}


class PodLogs:
    def __init__(self, server) -> None:
        self.server = server

    def stream(self, node: str, address: str, port: int, *, key: str, container: str, previous: bool,
               follow: bool, tail: int | None):
        """The log's bytes as the agent sends them (the first chunk is empty: the agent said yes)."""
        query = log_query(self.server.secret, node, key, container, previous, follow, tail, time.time())
        return _from_agent(node, address, port, "GET", f"/v1/pods/log?{query}", None, 60 if not follow else None)

    def exec(self, node: str, address: str, port: int, *, key: str, container: str, argv: list[str],
             stdin: str):
        """The command's NDJSON output lines as srun reads them (the first chunk is empty)."""
        body = exec_request(self.server.secret, node, key, container, argv, stdin, time.time())
        return _from_agent(node, address, port, "POST", "/v1/pods/exec", body, None)


async def _from_agent(node: str, address: str, port: int, method: str, path: str, body: dict | None,
                      total: float | None):
    timeout = aiohttp.ClientTimeout(total=total, sock_connect=5)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.request(method, f"http://{address}:{port}{path}", json=body) as resp:
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
    try:
        return json.loads(text).get("detail", "")
    except ValueError:
        return text.strip()
