"""``shoal logs`` and ``shoal exec``: the server asks the node's agent and streams the answer.

The agent keeps logs on the node (as the kubelet does), serves them on its step server and
runs exec commands there; the server signs each request with the node's step key (an HMAC
over the query or the request body, with a timestamp the agent checks), so nothing but the
control plane can read logs or run commands in containers. An agent that serves HTTPS is
verified against the cluster CA, its node name being the host name its certificate names.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from urllib.parse import urlencode

import aiohttp

from shoal.server.auth import node_step_key, sign
from shoal.server.kube.objects import ObjectError
from shoal.store.models import NodeRow


@dataclass(frozen=True)
class AgentEndpoint:
    """Where and how the server reaches a node's agent, and the step key generation it signs with."""
    node: str
    address: str
    port: int
    tls: bool = False
    generation: int = 0

    @classmethod
    def of(cls, row: NodeRow) -> AgentEndpoint:
        return cls(row.name, row.address, row.port, bool(row.tls), row.credential_gen or 0)

    def url(self, path: str) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}:{self.port}{path}"


def log_query(secret: bytes, agent: AgentEndpoint, key: str, container: str, previous: bool, follow: bool,
              tail: int | None, now: float) -> str:
    params = {"key": key, "container": container, "previous": int(previous), "follow": int(follow),
              "t": f"{now:.0f}"}
    if tail is not None:
        params["tail"] = tail
    query = urlencode(params)
    return f"{query}&sig={sign(_step_key(secret, agent), query)}"


def exec_request(secret: bytes, agent: AgentEndpoint, key: str, container: str, argv: list[str], stdin: str,
                 now: float) -> dict:
    req = {"key": key, "container": container, "argv": argv, "stdin": stdin, "t": f"{now:.0f}"}
    return {**req, "sig": sign(_step_key(secret, agent), json.dumps(req, sort_keys=True))}


def stream_request(secret: bytes, agent: AgentEndpoint, fields: dict, now: float) -> dict:
    req = {**fields, "t": f"{now:.0f}"}
    return {**req, "sig": sign(_step_key(secret, agent), json.dumps(req, sort_keys=True))}


def _step_key(secret: bytes, agent: AgentEndpoint) -> bytes:
    return node_step_key(secret, agent.node, agent.generation).encode()


class PodLogs:
    def __init__(self, server) -> None:
        self.server = server

    def stream(self, agent: AgentEndpoint, *, key: str, container: str, previous: bool,
               follow: bool, tail: int | None):
        """The log's bytes as the agent sends them (the first chunk is empty: the agent said yes)."""
        query = log_query(self.server.secret, agent, key, container, previous, follow, tail, time.time())
        return self._from_agent(agent, "GET", f"/v1/pods/log?{query}", None, 60 if not follow else None)

    def job_output(self, agent: AgentEndpoint, *, path: str, user: str, size: int):
        """The last ``size`` bytes of a batch job's output file on its batch host (the console)."""
        # "/" left as is: the HTTP client would unquote %2F, and the agent checks the bytes signed.
        query = urlencode({"path": path, "user": user, "bytes": size, "t": f"{time.time():.0f}"}, safe="/")
        query = f"{query}&sig={sign(_step_key(self.server.secret, agent), query)}"
        return self._from_agent(agent, "GET", f"/v1/jobs/output?{query}", None, 10)

    def job_usage(self, agent: AgentEndpoint, *, key: str):
        """What the run's steps have used on this node so far, from their cgroups (sstat)."""
        query = urlencode({"key": key, "t": f"{time.time():.0f}"})
        query = f"{query}&sig={sign(_step_key(self.server.secret, agent), query)}"
        return self._from_agent(agent, "GET", f"/v1/jobs/usage?{query}", None, 10)

    def exec(self, agent: AgentEndpoint, *, key: str, container: str, argv: list[str], stdin: str):
        """The command's NDJSON output lines as srun reads them (the first chunk is empty)."""
        body = exec_request(self.server.secret, agent, key, container, argv, stdin, time.time())
        return self._from_agent(agent, "POST", "/v1/pods/exec", body, None)

    async def open_stream(self, agent: AgentEndpoint, fields: dict):
        """A duplex stream to the agent (``kubectl exec``/``attach``/``port-forward``): the
        (reader, writer) of a connection on which the agent said yes, frames from here on
        (``model.frames``). Raises ObjectError with the agent's reason."""
        body = json.dumps(stream_request(self.server.secret, agent, fields, time.time())).encode()
        tls = {"ssl": self.server.ca.client_context(), "server_hostname": agent.node} if agent.tls else {}
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(agent.address, agent.port, **tls), 10)
        except (OSError, asyncio.TimeoutError) as e:
            raise ObjectError(f"cannot reach the agent of node {agent.node} at {agent.address}:{agent.port}: "
                              f"{e or 'timed out'}", 502) from None
        try:
            writer.write(b"POST /v1/pods/stream HTTP/1.0\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            code = int(head.split(b" ", 2)[1])
            if code != 200:
                text = (await asyncio.wait_for(reader.read(65536), 10)).decode("utf-8", "replace")
                raise ObjectError(_detail(text) or f"the node's agent answered {code}", 400 if code < 500 else 502)
        except (OSError, ValueError, IndexError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            writer.close()
            raise ObjectError(f"the agent of node {agent.node} broke off the stream: {e}", 502) from None
        except ObjectError:
            writer.close()
            raise
        return reader, writer

    def _from_agent(self, agent: AgentEndpoint, method: str, path: str, body: dict | None, total: float | None):
        tls = {"ssl": self.server.ca.client_context(), "server_hostname": agent.node} if agent.tls else {}
        return _from_agent(agent, method, path, body, total, tls)


async def _from_agent(agent: AgentEndpoint, method: str, path: str, body: dict | None, total: float | None,
                      tls: dict):
    timeout = aiohttp.ClientTimeout(total=total, sock_connect=5)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.request(method, agent.url(path), json=body, **tls) as resp:
                if resp.status != 200:
                    text = await resp.text()
                    raise ObjectError(_detail(text) or f"the node's agent answered {resp.status}",
                                      400 if resp.status < 500 else 502)
                yield b""  # headers are fine: the route may answer 200 now
                async for chunk in resp.content.iter_any():
                    yield chunk
    except aiohttp.ClientError as e:
        raise ObjectError(f"cannot reach the agent of node {agent.node} at {agent.address}:{agent.port}: {e}",
                          502) from None


def _detail(text: str) -> str:
    try:
        return json.loads(text).get("detail", "")
    except ValueError:
        return text.strip()
