"""The frames of an interactive stream between the server and a node's agent (``kubectl
exec``, ``attach`` and ``port-forward``): one byte of channel, four of length (big-endian),
then the data. The channels are those of Kubernetes' remote command protocol, so the server
relays them to kubectl's WebSocket with no translation but the framing.
"""

from __future__ import annotations

import struct

STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4
CLOSE = 255  # data: the channel whose writer is done (stdin: end of input), as v5.channel.k8s.io
HEADER = struct.Struct(">BI")
MAX_FRAME = 1 << 20


def frame(channel: int, data: bytes = b"") -> bytes:
    return HEADER.pack(channel, len(data)) + data


def parse_header(header: bytes) -> tuple[int, int]:
    """(channel, length) of a frame's header; ValueError when the length is not believable."""
    channel, length = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ValueError(f"a stream frame of {length} bytes (at most {MAX_FRAME})")
    return channel, length


def read_frame(read) -> tuple[int, bytes] | None:
    """The next frame from ``read(n)`` (a blocking file's read); None at the end of the stream."""
    header = _exactly(read, HEADER.size)
    if header is None:
        return None
    channel, length = parse_header(header)
    data = _exactly(read, length) if length else b""
    return None if data is None else (channel, data)


def _exactly(read, n: int) -> bytes | None:
    out = b""
    while len(out) < n:
        chunk = read(n - len(out))
        if not chunk:
            return None
        out += chunk
    return out
