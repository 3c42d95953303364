"""API tokens, under /shoal/v1/tokens (routes: server/routers/tokens.py): create (admin),
list and revoke.

A token's value is shown once, when it is made; afterwards it is named by its public id
(``auth.token_id``: the first characters of its hash). Admins list and revoke every token,
the cluster's join token included; anyone else lists and revokes only their own. A revoked
token's row is deleted, and every server drops it from its cache (``Authenticator.forget``):
this one before answering, the others when they hear the change feed's notification, which
PostgreSQL sends as the deletion commits; ``auth.CACHE_S`` bounds it should the feed be down.

A node's credential (and step key) is revoked by bumping its generation
(``POST /shoal/v1/tokens/nodes/NODE/revoke``, admin): its agent is refused from its next
request on, on every server alike, until it joins again with a join token.
"""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from shoal.server.auth import ID_CHARS, ROLES, AuthError, Principal, hash_token, token_id
from shoal.server.schemas import TokenCreate
from shoal.store.models import NodeRow, TokenRow

HEX = "0123456789abcdef"


class TokenError(AuthError):
    """A token that cannot be revoked: unknown (404), ambiguous or the last admin's (409)."""


def public(row: TokenRow) -> dict:
    """A token as listed: everything but the secret."""
    return {"id": token_id(row.token_hash), "user": row.user, "role": row.role, "groups": list(row.groups or ()),
            "description": row.description, "created": row.created, "created_by": row.created_by,
            "expires": row.expires}


def need_person(p: Principal) -> Principal:
    """Tokens are listed and revoked with a person's token (a role), not a credential."""
    if p.role not in ROLES:
        raise AuthError(403, "Access/permission denied: tokens are listed and revoked with a person's "
                             "token, not a job, node or join credential")
    return p


def create(server, s: Session, body: TokenCreate, creator: str) -> dict:
    """A new token; its value is in this answer only."""
    expires = server.clock() + body.expires_in_s if body.expires_in_s else None
    with s.begin():
        token = server.auth.create_token(s, body.user, body.role, body.description, body.groups,
                                         created_by=creator, expires=expires)
    return {"id": token_id(hash_token(token)), "user": body.user, "role": body.role,
            "groups": body.groups, "expires": expires, "token": token}


def list_json(server, s: Session, p: Principal) -> dict:
    """Admins: every token; anyone else: their own."""
    q = select(TokenRow).order_by(TokenRow.created, TokenRow.id)
    if not p.is_admin:
        q = q.where(TokenRow.user == p.user)
    return {"tokens": [public(row) for row in s.scalars(q).all()], "now": server.clock()}


def revoke(server, s: Session, tid: str, p: Principal) -> dict:
    """Delete the token whose id starts with ``tid``; every server forgets it."""
    prefix = tid.lower()
    if not (ID_CHARS <= len(prefix) <= 64 and all(c in HEX for c in prefix)):
        raise TokenError(404, f"no token with id {tid!r}: an id is {ID_CHARS} or more hex digits "
                              "(see shoal token list)")
    with s.begin():
        rows = s.scalars(select(TokenRow).where(TokenRow.token_hash.startswith(prefix)).limit(2)).all()
        if not rows:
            raise TokenError(404, f"no token with id {tid} (see shoal token list)")
        if len(rows) > 1:
            raise TokenError(409, f"id {tid} names more than one token: give more of its hash")
        row = rows[0]
        if not p.is_admin and row.user != p.user:
            raise AuthError(403, f"Access/permission denied: token {tid} belongs to another user; "
                                 "only an admin may revoke it")
        if row.role == "admin" and s.scalar(
                select(func.count()).select_from(TokenRow).where(TokenRow.role == "admin")) == 1:
            raise TokenError(409, f"token {tid} is the last admin token: create another admin token "
                                  "before revoking it")
        out = {**public(row), "revoked": True}
        s.delete(row)
        if server.feed is not None:  # the other servers hear it as the deletion commits
            server.feed.publish_with(s, {"revoked": [row.token_hash]})
    server.auth.forget([row.token_hash])
    return out


def revoke_node(server, s: Session, node: str) -> dict:
    """A node's agent credential and step key: refused from the agent's next request on."""
    with s.begin():
        # One UPDATE, version included: a report writing the row meanwhile retries.
        done = s.execute(update(NodeRow).where(NodeRow.name == node).values(
            credential_gen=NodeRow.credential_gen + 1, version=NodeRow.version + 1))
        if done.rowcount != 1:  # type: ignore[attr-defined]
            raise TokenError(404, f"no node {node} (see sinfo -N)")
        gen = s.scalar(select(NodeRow.credential_gen).where(NodeRow.name == node))
        if server.feed is not None:
            server.feed.publish_with(s, {"revoked_node": node})
    server.auth.forget_node(node)
    return {"node": node, "generation": gen, "revoked": True}
