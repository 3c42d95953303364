"""/shoal/v1/partitions: sinfo's partitions and scontrol update partition."""

from __future__ import annotations

from fastapi import APIRouter

from shoal.server import partitions as partsvc
from shoal.server.deps import Admin, Caller, ServerDep, SessionDep
from shoal.server.schemas import PartitionUpdate

router = APIRouter(prefix="/shoal/v1/partitions")


@router.get("")
def list_partitions(p: Caller, server: ServerDep):
    return partsvc.list_json(server.partitions)


@router.patch("/{name}")
def update_partition(name: str, body: PartitionUpdate, p: Admin, server: ServerDep, s: SessionDep):
    return partsvc.change(server, s, name, body)
