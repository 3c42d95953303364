"""The Kubernetes protobuf encoding, read for the objects kubectl's imperative commands send
in it (``kubectl create namespace``, ``kubectl create secret ...``: client-go's typed
clients write protobuf for built-in kinds). Only reading, of only those kinds; answers stay
JSON, which kubectl accepts too.

A body is the envelope ``k8s\\x00`` + ``runtime.Unknown`` (typeMeta, raw bytes of the
object's own message); each message is protobuf's wire format, decoded here by field
number as generated.proto of k8s.io/api numbers them.
"""

from __future__ import annotations

import base64

MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    """A body Shoal cannot read as Kubernetes protobuf."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, i
        shift += 7
        if shift > 63:
            raise ProtobufError("varint too long")


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """A message's (field number, value) pairs in order: an int for varints, bytes for
    length-delimited values (fixed-width values are skipped: none of these kinds has any)."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((number, value))
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > len(buf):
                raise ProtobufError("truncated field")
            out.append((number, buf[i:i + size]))
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
    return out


def _text(value) -> str:
    if not isinstance(value, bytes):
        raise ProtobufError("expected a string")
    return value.decode()


def _entry(value) -> tuple[str, bytes]:
    """A map entry: key (1), value (2)."""
    key, val = "", b""
    for n, v in fields(value):
        if n == 1:
            key = _text(v)
        elif n == 2 and isinstance(v, bytes):
            val = v
    return key, val


def object_meta(buf: bytes) -> dict:
    meta: dict = {}
    names = {1: "name", 2: "generateName", 3: "namespace"}
    for n, v in fields(buf):
        if n in names:
            meta[names[n]] = _text(v)
        elif n in (11, 12):
            k, val = _entry(v)
            meta.setdefault("labels" if n == 11 else "annotations", {})[k] = val.decode()
    return meta


def _secret(buf: bytes) -> dict:
    out: dict = {}
    for n, v in fields(buf):
        if n == 1 and isinstance(v, bytes):
            out["metadata"] = object_meta(v)
        elif n == 2:
            k, val = _entry(v)
            out.setdefault("data", {})[k] = base64.b64encode(val).decode()
        elif n == 3:
            out["type"] = _text(v)
        elif n == 4:
            k, val = _entry(v)
            out.setdefault("stringData", {})[k] = val.decode()
        elif n == 5:
            out["immutable"] = bool(v)
    return out


def _namespace(buf: bytes) -> dict:
    metas = [object_meta(v) for n, v in fields(buf) if n == 1 and isinstance(v, bytes)]
    return {"metadata": metas[-1]} if metas else {}


DECODERS = {("v1", "Secret"): _secret, ("v1", "Namespace"): _namespace}


def decode(body: bytes) -> dict:
    """A protobuf request body as the JSON object it stands for."""
    if not body.startswith(MAGIC):
        raise ProtobufError("not a Kubernetes protobuf body")
    type_meta, raw = b"", b""
    for n, v in fields(body[len(MAGIC):]):
        if n == 1 and isinstance(v, bytes):
            type_meta = v
        elif n == 2 and isinstance(v, bytes):
            raw = v
    tm = {n: _text(v) for n, v in fields(type_meta)}
    api_version, kind = tm.get(1, ""), tm.get(2, "")
    decoder = DECODERS.get((api_version, kind))
    if decoder is None:
        raise ProtobufError(f"{api_version} {kind} is accepted as JSON only")
    return {"apiVersion": api_version, "kind": kind, **decoder(raw)}
