"""The SPDY/3.1 framing kubectl port-forward speaks (server/kubeapi/spdy.py)."""

import hashlib
import struct

from shoal.server.kubeapi import spdy


def test_the_dictionary_is_the_specifications():
    assert len(spdy.DICTIONARY) == 1423
    assert hashlib.sha256(spdy.DICTIONARY).hexdigest() == \
        "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"


def syn_stream(client: spdy.Codec, stream: int, headers: dict) -> bytes:
    body = struct.pack(">IIBB", stream, 0, 0, 0) + client._block(headers)
    return struct.pack(">HHI", 0x8003, spdy.SYN_STREAM, len(body)) + body


def test_frames_parse_across_pieces_and_header_blocks_share_one_stream():
    client, server = spdy.Codec(), spdy.Codec()
    wire = (syn_stream(client, 1, {"streamtype": "error", "port": "8080", "requestid": "0"})
            + syn_stream(client, 3, {"streamtype": "data", "port": "8080", "requestid": "0"})
            + client.data(3, b"GET / HTTP/1.0\r\n\r\n", fin=True) + client.ping(7))
    frames = []
    for i in range(0, len(wire), 5):  # as the WebSocket may cut it
        frames += server.feed(wire[i:i + 5])
    assert [(f.type, f.stream) for f in frames[:2]] == [(spdy.SYN_STREAM, 1), (spdy.SYN_STREAM, 3)]
    assert frames[1].headers == {"streamtype": "data", "port": "8080", "requestid": "0"}
    assert not frames[2].control and frames[2].data == b"GET / HTTP/1.0\r\n\r\n" and frames[2].flags == spdy.FLAG_FIN
    assert frames[3].type == spdy.PING and frames[3].ping_id == 7
    # The server's replies decode on the client's side, header block after header block.
    replies = client.feed(server.syn_reply(1) + server.syn_reply(3, {"x": "y"}))
    assert [(f.type, f.stream, f.headers) for f in replies] == [(spdy.SYN_REPLY, 1, {}), (spdy.SYN_REPLY, 3, {"x": "y"})]
