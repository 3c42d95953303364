"""/shoal/v1/partitions: sinfo's partitions and scontrol update partition."""

from __future__ import annotations

from fastapi.responses import Response

from shoal.server import partitions as partsvc
from shoal.server.endpoints import Table
from shoal.server.deps import Admin, Caller, ServerDep, SessionDep
from shoal.server.schemas import PartitionUpdate

table = Table(prefix="/shoal/v1/partitions")
router = table.router


@table.get("", fast=True)
def list_partitions(p: Caller, server: ServerDep):
    return Response(partsvc.list_encoded(server.partitions), media_type="application/json")


@table.patch("/{name}")
def update_partition(name: str, body: PartitionUpdate, p: Admin, server: ServerDep, s: SessionDep):
    return partsvc.change(server, s, name, body)
