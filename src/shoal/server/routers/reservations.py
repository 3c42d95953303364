"""/shoal/v1/reservations: scontrol create/update/delete/show reservation."""

from __future__ import annotations

from fastapi import APIRouter

from shoal.server import reservations as resvsvc
from shoal.server.deps import Caller, Operator, ServerDep, SessionDep
from shoal.server.schemas import ReservationCreate, ReservationUpdate

router = APIRouter(prefix="/shoal/v1/reservations")


@router.get("")
def list_reservations(p: Caller, server: ServerDep, s: SessionDep):
    return {"reservations": resvsvc.list_json(s, server.clock())}


@router.get("/{name}")
def get_reservation(name: str, p: Caller, server: ServerDep, s: SessionDep):
    return resvsvc.get_json(s, name, server.clock())


@router.post("", status_code=201)
def create_reservation(body: ReservationCreate, p: Operator, server: ServerDep, s: SessionDep):
    return resvsvc.create_reservation(server, s, body, p.user)


@router.patch("/{name}")
def update_reservation(name: str, body: ReservationUpdate, p: Operator, server: ServerDep, s: SessionDep):
    return resvsvc.update_reservation(server, s, name, body)


@router.delete("/{name}")
def delete_reservation(name: str, p: Operator, server: ServerDep, s: SessionDep):
    return resvsvc.delete_reservation(server, s, name)
