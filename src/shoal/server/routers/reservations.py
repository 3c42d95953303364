"""/shoal/v1/reservations: scontrol create/update/delete/show reservation."""

from __future__ import annotations

from shoal.server import reservations as resvsvc
from shoal.server.endpoints import Table
from shoal.server.deps import Caller, Operator, ServerDep, SessionDep
from shoal.server.schemas import ReservationCreate, ReservationUpdate

table = Table(prefix="/shoal/v1/reservations")
router = table.router


@table.get("")
def list_reservations(p: Caller, server: ServerDep, s: SessionDep):
    return {"reservations": resvsvc.list_json(s, server.clock())}


@table.get("/{name}")
def get_reservation(name: str, p: Caller, server: ServerDep, s: SessionDep):
    return resvsvc.get_json(s, name, server.clock())


@table.post("", status_code=201)
def create_reservation(body: ReservationCreate, p: Operator, server: ServerDep, s: SessionDep):
    return resvsvc.create_reservation(server, s, body, p.user)


@table.patch("/{name}")
def update_reservation(name: str, body: ReservationUpdate, p: Operator, server: ServerDep, s: SessionDep):
    return resvsvc.update_reservation(server, s, name, body)


@table.delete("/{name}")
def delete_reservation(name: str, p: Operator, server: ServerDep, s: SessionDep):
    return resvsvc.delete_reservation(server, s, name)
