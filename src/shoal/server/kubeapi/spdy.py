"""The part of SPDY/3.1 that ``kubectl port-forward`` speaks: kubectl 1.31+ tunnels it in a
WebSocket (subprotocol ``SPDY/3.1+portforward.k8s.io``), each binary message a piece of the
SPDY byte stream. Its client (spdystream) opens two streams per forwarded connection (an
error stream and a data stream, by ``streamtype``, ``port`` and ``requestid`` headers),
waits for each one's SYN_REPLY, sends PINGs to be echoed and does no flow control.

Frames (draft-mbelshe-httpbis-spdy-00): a control frame is ``1|version(15)|type(16)``,
``flags(8)|length(24)``, then its fields; a data frame ``0|stream(31)``,
``flags(8)|length(24)``, then data. Header blocks are zlib streams, one per direction for the
whole connection, with the specification's dictionary, flushed after each block.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
MAX_DATA = (1 << 24) - 1

# The header compression dictionary of SPDY/3 (section 2.6.10.1): length-prefixed words, then a tail.
_WORDS = (
    "options head post put delete trace accept accept-charset accept-encoding accept-language accept-ranges "
    "age allow authorization cache-control connection content-base content-encoding content-language "
    "content-length content-location content-md5 content-range content-type date etag expect expires from "
    "host if-match if-modified-since if-none-match if-range if-unmodified-since last-modified location "
    "max-forwards pragma proxy-authenticate proxy-authorization range referer retry-after server te trailer "
    "transfer-encoding upgrade user-agent vary via warning www-authenticate method get status").split() + [
    "200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin"]
_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
    "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.")
DICTIONARY = b"".join(struct.pack(">I", len(w)) + w.encode() for w in _WORDS) + _TAIL.encode()


@dataclass
class Frame:
    control: bool
    type: int  # a control frame's type; 0 for data
    flags: int
    stream: int  # the stream id (0 for PING, SETTINGS, GOAWAY)
    data: bytes = b""  # a data frame's data
    headers: dict[str, str] = field(default_factory=dict)  # SYN_STREAM's, SYN_REPLY's, HEADERS'
    ping_id: int = 0
    status: int = 0  # RST_STREAM's, GOAWAY's


class ProtocolError(Exception):
    pass


class Codec:
    """One side of a SPDY connection: frames parsed from bytes as they come, frames to send."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.inflate = zlib.decompressobj(zdict=DICTIONARY)
        self.deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)

    def feed(self, data: bytes) -> list[Frame]:
        """The whole frames ``data`` completes (the rest waits for more)."""
        self.buffer += data
        out = []
        while len(self.buffer) >= 8:
            first, second = struct.unpack_from(">II", self.buffer)
            length = second & 0xFFFFFF
            if len(self.buffer) < 8 + length:
                break
            body = bytes(self.buffer[8:8 + length])
            del self.buffer[:8 + length]
            flags = second >> 24
            if first & 0x80000000:
                out.append(self._control((first >> 16) & 0x7FFF, first & 0xFFFF, flags, body))
            else:
                out.append(Frame(False, 0, flags, first & 0x7FFFFFFF, data=body))
        return out

    def _control(self, version: int, kind: int, flags: int, body: bytes) -> Frame:
        if version != VERSION:
            raise ProtocolError(f"SPDY version {version} (this server speaks 3.1)")
        if kind == SYN_STREAM:
            stream = struct.unpack_from(">I", body)[0] & 0x7FFFFFFF
            return Frame(True, kind, flags, stream, headers=self._headers(body[10:]))
        if kind in (SYN_REPLY, HEADERS):
            stream = struct.unpack_from(">I", body)[0] & 0x7FFFFFFF
            return Frame(True, kind, flags, stream, headers=self._headers(body[4:]))
        if kind == RST_STREAM:
            stream, code = struct.unpack_from(">II", body)
            return Frame(True, kind, flags, stream & 0x7FFFFFFF, status=code)
        if kind == PING:
            return Frame(True, kind, flags, 0, ping_id=struct.unpack_from(">I", body)[0])
        if kind == GOAWAY:
            return Frame(True, kind, flags, struct.unpack_from(">I", body)[0] & 0x7FFFFFFF)
        return Frame(True, kind, flags, 0)  # SETTINGS, WINDOW_UPDATE and others: nothing to do

    def _headers(self, block: bytes) -> dict[str, str]:
        raw = self.inflate.decompress(block)
        try:
            (count,), pos, out = struct.unpack_from(">I", raw), 4, {}
            for _ in range(count):
                (n,) = struct.unpack_from(">I", raw, pos)
                name = raw[pos + 4:pos + 4 + n].decode().lower()
                pos += 4 + n
                (n,) = struct.unpack_from(">I", raw, pos)
                out[name] = raw[pos + 4:pos + 4 + n].decode().split("\x00")[0]
                pos += 4 + n
        except (struct.error, UnicodeDecodeError) as e:
            raise ProtocolError(f"a malformed SPDY header block: {e}") from None
        return out

    # -- frames to send

    def syn_reply(self, stream: int, headers: dict[str, str] | None = None) -> bytes:
        return self._control_frame(SYN_REPLY, 0, struct.pack(">I", stream) + self._block(headers or {}))

    def data(self, stream: int, data: bytes = b"", fin: bool = False) -> bytes:
        return struct.pack(">II", stream & 0x7FFFFFFF, ((FLAG_FIN if fin else 0) << 24) | len(data)) + data

    def ping(self, ping_id: int) -> bytes:
        return self._control_frame(PING, 0, struct.pack(">I", ping_id))

    def rst_stream(self, stream: int, code: int = 5) -> bytes:  # 5: CANCEL
        return self._control_frame(RST_STREAM, 0, struct.pack(">II", stream, code))

    def _control_frame(self, kind: int, flags: int, body: bytes) -> bytes:
        return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(body)) + body

    def _block(self, headers: dict[str, str]) -> bytes:
        raw = struct.pack(">I", len(headers))
        for k, v in headers.items():
            raw += struct.pack(">I", len(k)) + k.lower().encode() + struct.pack(">I", len(v)) + v.encode()
        return self.deflate.compress(raw) + self.deflate.flush(zlib.Z_SYNC_FLUSH)
