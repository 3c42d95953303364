"""``pods/exec`` and ``pods/attach`` as kubectl 1.31+ speaks them: a WebSocket with the
``v5.channel.k8s.io`` subprotocol (``v4`` taken too), each binary message one channel byte
then data (0 stdin, 1 stdout, 2 stderr, 3 the outcome as a ``Status``, 4 terminal size,
255 "this channel is done"). The server relays each to the pod's node agent over one framed
connection (``agent/podstreams.py``), so the command runs in the pod's process context there.

kubectl falls back to SPDY only when the WebSocket upgrade is refused: Shoal refuses it with
the reason as a ``Status`` (NotFound, Forbidden...), and answers the SPDY request the same
way, so kubectl prints the server's message either way.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import WebSocket
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from shoal.model import frames
from shoal.server.auth import AuthError, Principal
from shoal.server.kube import api as shoal_kube_api
from shoal.server.kube.objects import ObjectError
from shoal.server.kubeapi import spdy
from shoal.server.kubeapi.printing import status

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
TUNNEL = "SPDY/3.1+portforward.k8s.io"  # kubectl port-forward: SPDY in a WebSocket
CHANNELS = "v4.channel.k8s.io"  # the Python client's port-forward: two channels per port


SUCCESS = {"metadata": {}, "status": "Success"}


def outcome(doc: dict, argv: list[str]) -> dict:
    """The agent's last frame (``{"exit": n}`` or ``{"error": text}``) as the Status the
    kubelet sends: kubectl exits with a non-zero exit code's value."""
    if "error" in doc:
        return {"metadata": {}, "status": "Failure", "reason": "InternalError", "code": 500,
                "message": f"Internal error occurred: error executing command in container: {doc['error']}"}
    code = doc.get("exit")
    if code == 0:
        return SUCCESS
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: error executing command {argv}, "
                       f"exit code {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def stream_fields(server, p: Principal, namespace: str, name: str, query, mode: str):
    """The agent and the request for it: checks the caller may ``create pods/<mode>`` and the
    pod runs there. Raises ObjectError."""
    argv = query.getlist("command")
    if mode == "exec" and not argv:
        raise ObjectError("you must specify at least one command for the container", 400, "BadRequest")
    agent, key, cname = shoal_kube_api.locate(server, p, namespace, name, query.get("container"), "create",
                                              any_container=mode == "portforward", subresource=f"pods/{mode}")
    tty = query.get("tty") in ("1", "true", "True")
    fields = {"mode": mode, "key": key, "container": cname, "argv": argv, "tty": tty,
              "stdin": query.get("stdin") in ("1", "true", "True")}
    return agent, fields


async def serve(ws: WebSocket, server, namespace: str, name: str, mode: str) -> None:
    """One ``kubectl exec``/``attach``/``port-forward``: refuse the upgrade with a Status, or
    relay until the command ends (its exit as the last message) or kubectl goes away (the
    command is killed)."""
    offered = ws.scope.get("subprotocols") or []
    wanted = (TUNNEL, CHANNELS) if mode == "portforward" else PROTOCOLS
    protocol = next((x for x in wanted if x in offered), None)
    try:
        if protocol is None:
            raise ObjectError(f"the WebSocket subprotocol must be one of {', '.join(wanted)} "
                              f"(offered: {', '.join(offered) or 'none'})", 400, "BadRequest")
        p = await run_in_threadpool(server.auth.resolve, ws.headers.get("authorization"), None, None)
        agent, fields = await run_in_threadpool(stream_fields, server, p, namespace, name, ws.query_params, mode)
        ports = forwarded_ports(ws.query_params) if protocol == CHANNELS and mode == "portforward" else []
        if mode != "portforward":
            reader, writer = await server.logs.open_stream(agent, fields)
    except (AuthError, ObjectError) as e:
        await ws.send_denial_response(refusal(e))
        return
    await ws.accept(subprotocol=protocol)
    if mode == "portforward":
        def dial(port: int):
            return server.logs.open_stream(agent, {**fields, "port": port})

        await (PortForward(ws, dial).run() if protocol == TUNNEL else channel_forward(ws, dial, ports))
        return
    keep = {frames.STDOUT, frames.STDERR} if ws.query_params.get("stderr") not in ("0", "false") \
        else {frames.STDOUT}
    await relay(ws, reader, writer, keep, fields["argv"])


def refusal(e: Exception) -> JSONResponse:
    if isinstance(e, AuthError):
        reason = "Unauthorized" if e.status == 401 else "Forbidden"
        return JSONResponse(status(e.message, e.status, reason), status_code=e.status)
    assert isinstance(e, ObjectError)
    return JSONResponse(status(e.message, e.status, e.reason), status_code=e.status)


async def relay(ws: WebSocket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: set[int],
                argv: list[str]) -> None:
    async def upstream() -> None:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            data = msg.get("bytes") or (msg.get("text") or "").encode()
            if data and data[0] in (frames.STDIN, frames.RESIZE, frames.CLOSE):
                writer.write(frames.frame(data[0], data[1:]))
                await writer.drain()

    up = asyncio.create_task(upstream())
    result: dict | None = None
    try:
        while result is None:
            channel, length = frames.parse_header(await reader.readexactly(frames.HEADER.size))
            data = await reader.readexactly(length)
            if channel == frames.ERROR:
                result = outcome(json.loads(data), argv)
            elif channel in keep:
                await ws.send_bytes(bytes([channel]) + data)
    except (asyncio.IncompleteReadError, OSError, ValueError):
        result = status("the node's agent ended the stream before the command's exit", 500, "InternalError")
    except (WebSocketDisconnect, RuntimeError):  # kubectl went away: closing the agent's stream kills the command
        result = None
    finally:
        up.cancel()
        writer.close()
    if result is None:
        return
    try:
        await ws.send_bytes(bytes([frames.ERROR]) + json.dumps(result).encode())
        await ws.close(1000)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass


class PortForward:
    """``kubectl port-forward``'s SPDY connection (tunnelled in the WebSocket): each forwarded
    local connection is a pair of SPDY streams (error and data, one ``requestid``), relayed to
    the pod's port through one agent stream of its own."""

    def __init__(self, ws: WebSocket, open_stream) -> None:
        self.ws, self.open_stream = ws, open_stream
        self.codec = spdy.Codec()
        self.lock = asyncio.Lock()  # one writer at a time; header blocks in the order compressed
        self.pairs: dict[str, dict] = {}
        self.by_stream: dict[int, dict] = {}
        self.tasks: set[asyncio.Task] = set()

    async def send(self, make) -> None:
        async with self.lock:
            await self.ws.send_bytes(make())

    async def run(self) -> None:
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                for f in self.codec.feed(msg.get("bytes") or b""):
                    if f.control and f.type == spdy.GOAWAY:
                        return
                    await self.handle(f)
        except (spdy.ProtocolError, WebSocketDisconnect, RuntimeError, OSError):
            return
        finally:
            for t in self.tasks:
                t.cancel()

    async def handle(self, f: spdy.Frame) -> None:
        if f.control and f.type == spdy.SYN_STREAM:
            await self.send(lambda: self.codec.syn_reply(f.stream))
            pair = self.pairs.setdefault(f.headers.get("requestid", ""), {"port": f.headers.get("port", "")})
            pair[f.headers.get("streamtype", "")] = f.stream
            self.by_stream[f.stream] = pair
            if "data" in pair and "error" in pair and "queue" not in pair:
                pair["queue"] = asyncio.Queue()
                task = asyncio.create_task(self.forward(pair))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        elif f.control and f.type == spdy.PING:
            await self.send(lambda: self.codec.ping(f.ping_id))
        elif f.control and f.type == spdy.RST_STREAM:
            reset = self.by_stream.pop(f.stream, None)
            if reset is not None and "queue" in reset:
                reset["queue"].put_nowait(None)
        elif not f.control:
            target = self.by_stream.get(f.stream)
            if target is not None and target.get("data") == f.stream and "queue" in target:
                target["queue"].put_nowait((f.data, bool(f.flags & spdy.FLAG_FIN)))

    async def forward(self, pair: dict) -> None:
        data_id, error_id, queue = pair["data"], pair["error"], pair["queue"]
        error = None
        try:
            reader, writer = await self.open_stream(int(pair["port"]))
        except ValueError:
            error = f"invalid port {pair['port']!r}"
        except ObjectError as e:
            error = e.message
        if error is None:
            error = await self._relay(reader, writer, queue, data_id)
        if error:
            await self.send(lambda: self.codec.data(error_id, error.encode()))
        await self.send(lambda: self.codec.data(data_id, fin=True))
        await self.send(lambda: self.codec.data(error_id, fin=True))

    async def _relay(self, reader, writer, queue: asyncio.Queue, data_id: int) -> str | None:
        async def upstream() -> None:
            while (item := await queue.get()) is not None:
                data, fin = item
                if data:
                    writer.write(frames.frame(frames.STDIN, data))
                if fin:
                    writer.write(frames.frame(frames.CLOSE, bytes([frames.STDIN])))
                await writer.drain()
                if fin:
                    return
            writer.close()

        up = asyncio.create_task(upstream())
        try:
            while True:
                channel, length = frames.parse_header(await reader.readexactly(frames.HEADER.size))
                data = await reader.readexactly(length)
                if channel == frames.STDOUT:
                    await self.send(lambda: self.codec.data(data_id, data))
                elif channel == frames.ERROR:
                    return json.loads(data).get("error")
        except (asyncio.IncompleteReadError, OSError, ValueError):
            return "the node's agent ended the stream"
        finally:
            up.cancel()
            writer.close()


def forwarded_ports(query) -> list[int]:
    """The ``ports`` of a channel port-forward (``ports=8080,9090`` or repeated)."""
    try:
        ports = [int(x) for v in query.getlist("ports") for x in v.split(",") if x.strip()]
    except ValueError:
        ports = []
    if not ports or any(not 0 < x < 65536 for x in ports) or len(set(ports)) != len(ports):
        raise ObjectError("ports: Required value: one or more distinct ports between 1 and 65535", 400, "BadRequest")
    return ports


async def channel_forward(ws: WebSocket, dial, ports: list[int]) -> None:
    """The WebSocket port-forward protocol (the Python client's): port i's data on channel
    2i and its errors on 2i+1, each channel's first message the port (two bytes, little-endian);
    one connection to each port, the WebSocket closed when all have ended."""
    lock = asyncio.Lock()

    async def send(data: bytes) -> None:
        async with lock:
            await ws.send_bytes(data)

    streams: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
    refused: dict[int, str] = {}

    async def one(i: int) -> None:
        reader, writer = streams[i]
        try:
            while True:
                channel, length = frames.parse_header(await reader.readexactly(frames.HEADER.size))
                data = await reader.readexactly(length)
                if channel == frames.STDOUT:
                    await send(bytes([2 * i]) + data)
                elif channel == frames.ERROR:
                    if error := json.loads(data).get("error"):
                        await send(bytes([2 * i + 1]) + error.encode())
                    return
        except (asyncio.IncompleteReadError, OSError, ValueError):
            return
        finally:
            writer.close()

    async def upstream() -> None:
        while (msg := await ws.receive())["type"] != "websocket.disconnect":
            data = msg.get("bytes") or b""
            found = streams.get(data[0] // 2) if data and data[0] % 2 == 0 else None
            if found is not None and len(data) > 1:
                found[1].write(frames.frame(frames.STDIN, data[1:]))
                await found[1].drain()
        for _, writer in streams.values():  # the client went away: so do the agent's streams
            writer.close()

    try:
        for i, port in enumerate(ports):  # each port dialled before its data may come
            try:
                streams[i] = await dial(port)
            except ObjectError as e:
                refused[i] = e.message
        for i, port in enumerate(ports):
            head = port.to_bytes(2, "little")
            await send(bytes([2 * i]) + head)
            await send(bytes([2 * i + 1]) + head)
            if i in refused:
                await send(bytes([2 * i + 1]) + refused[i].encode())
        up = asyncio.create_task(upstream())
        try:
            await asyncio.gather(*(one(i) for i in streams))
        finally:
            up.cancel()
        await ws.close(1000)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass


async def spdy_refusal(server, request, namespace: str, name: str, mode: str) -> JSONResponse:
    """kubectl's SPDY fallback (after a refused upgrade): the same refusal as a Status."""
    try:
        p = await run_in_threadpool(server.auth.resolve, request.headers.get("authorization"), None, None)
        await run_in_threadpool(stream_fields, server, p, namespace, name, request.query_params, mode)
    except (AuthError, ObjectError) as e:
        return refusal(e)
    return JSONResponse(status(f"pods/{mode} is served over WebSockets (v5.channel.k8s.io, kubectl 1.31 and "
                               f"later), not SPDY", 400, "BadRequest"), status_code=400)
