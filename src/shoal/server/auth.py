"""Who is calling: user tokens (stored hashed), agent credentials and job credentials;
and what each cluster role may do.

Cluster roles, held by a token (Slurm's AdminLevel plus a read-only level):

| role | may |
|---|---|
| admin | everything, tokens included; act for another user (``X-Shoal-User``) |
| operator | manage nodes (drain, resume, down), reservations and any user's jobs; see every serving object; not tokens or role bindings |
| user | submit and change their own jobs; serving objects where a role binding (or the open ``default`` namespace) lets them |
| read-only | see what a user sees, plus every serving object; change nothing |

User tokens are looked up by their hash and cached per server for ``CACHE_S`` at most:
revoking one (``forget``) drops it from this server's cache at once and, through the change
feed, from the other servers' within milliseconds; the bound holds even if the feed is down.

Agent and job credentials are HMACs of the cluster secret, so the server verifies them
without storing them: an agent's credential is bound to its node name and the node's
credential generation (``NodeRow.credential_gen``, bumped by ``shoal token revoke-node``,
cached per server and dropped through the change feed like a revoked token), a job's to the
job id and its run (restart count), so a requeued run's credential stops working for the old one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import unquote

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.model.timefmt import format_timestamp
from shoal.store.models import NodeRow, TokenRow


class AuthError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


ROLES = ("admin", "operator", "user", "read-only")  # the roles a person's token may hold
REVOKED = "credential revoked"  # how a refusal of a revoked node credential begins (the agent looks for it)
CACHE_S = 1.0  # how long a server trusts a token it looked up (a revocation's worst case)
ID_CHARS = 8  # a token's public id: this many hex characters of its hash


@dataclass(frozen=True)
class Principal:
    user: str
    role: str  # admin | operator | user | read-only | agent | job | join
    node: str | None = None  # agents: the one node they may speak for
    job_id: int | None = None  # job credentials: the one job they may act in
    groups: tuple[str, ...] = ()  # the token's groups, which role bindings may name

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def is_operator(self) -> bool:
        """Manages the cluster: nodes, reservations, any user's jobs (admins too)."""
        return self.role in ("admin", "operator")

    @property
    def may_change(self) -> bool:
        """A person's token that may submit and change things (not read-only, not a daemon's)."""
        return self.role in ("admin", "operator", "user")

    @property
    def sees_everything(self) -> bool:
        """Reads every serving object, whoever applied it (a cluster-wide ``view``)."""
        return self.role in ("admin", "operator", "read-only")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_id(token_hash: str) -> str:
    """The public id of a token: listed, and given to revoke it. Its holder can work it out too."""
    return token_hash[:ID_CHARS]


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


def sign(secret: bytes, message: str) -> str:
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def _node_message(what: str, node: str, generation: int) -> str:
    # Generation 0 signs as before generations existed: agents joined then keep working.
    return f"{what}:{node}:{generation}" if generation else f"{what}:{node}"


def agent_credential(secret: bytes, node: str, generation: int = 0) -> str:
    return "node_" + sign(secret, _node_message("node", node, generation))


def job_credential(secret: bytes, job_id: int, run: int) -> str:
    return f"job_{job_id}.{run}.{sign(secret, f'job:{job_id}:{run}')}"


def node_step_key(secret: bytes, node: str, generation: int = 0) -> str:
    """The key an agent uses to check srun's step credentials and the server's signed log and
    exec requests (it learns it at registration; revoking the node's credential changes it)."""
    return sign(secret, _node_message("stepkey", node, generation))


def step_credential(secret: bytes, node: str, job_id: int, run: int, step_id: int, generation: int = 0) -> str:
    return sign(node_step_key(secret, node, generation).encode(), f"{job_id}.{run}.{step_id}")


class Authenticator:
    """Resolves the headers of a request to a Principal. Caches token lookups in memory, briefly."""

    def __init__(self, sessions, secret: bytes, clock=time.time):
        self.sessions = sessions
        self.secret = secret
        self.clock = clock
        # token hash -> (principal, expires or None, monotonic time it was looked up)
        self._cache: dict[str, tuple[Principal, float | None, float]] = {}
        self._forgotten = 0  # bumped by forget: a lookup that raced a revocation is not cached
        self._generations: dict[str, int] = {}  # node -> its credential generation (see verify_agent)
        self._credentials: dict[tuple[str, int], str] = {}  # (node, generation) -> its credential, made once

    def create_token(self, session: Session, user: str, role: str, description: str | None = None,
                     groups: list[str] | tuple[str, ...] = (), created_by: str | None = None,
                     expires: float | None = None) -> str:
        token = new_token("shoal" if role != "join" else "join")
        session.add(TokenRow(user=user, role=role, token_hash=hash_token(token), created=self.clock(),
                             description=description, groups=list(groups), created_by=created_by,
                             expires=expires))
        return token

    def forget(self, token_hashes: list[str] | tuple[str, ...]) -> None:
        """Revoked tokens: look them up again (and find them gone) on their next use."""
        self._forgotten += 1
        for h in token_hashes:
            self._cache.pop(h, None)

    def forget_all(self) -> None:
        """The change feed lost notifications: any cached token may have been revoked meanwhile."""
        self._forgotten += 1
        self._cache.clear()
        self._generations.clear()

    def forget_node(self, node: str) -> None:
        """The node's credential was revoked: read its generation again on its next request."""
        self._forgotten += 1
        self._generations.pop(node, None)

    def knows(self, node: str) -> bool:
        """Whether the node's credential generation is kept (verify_agent reads nothing)."""
        return node in self._generations

    def node_generation(self, node: str) -> int:
        """The node's credential generation: read once, then kept until a revocation drops it."""
        gen = self._generations.get(node)
        if gen is not None:
            return gen
        forgotten = self._forgotten
        with self.sessions() as s:
            gen = s.scalar(select(NodeRow.credential_gen).where(NodeRow.name == node))
        if gen is None:
            return 0  # not registered (yet): nothing to cache
        if forgotten == self._forgotten:
            self._generations[node] = gen
        return gen

    def resolve(self, authorization: str | None, job_token: str | None, acting_user: str | None) -> Principal:
        if job_token:
            p = self._job(job_token)
            if p is not None:
                return p
            raise AuthError(401, "invalid job credential (SHOAL_JOB_TOKEN)")
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthError(401, "authentication required: send 'Authorization: Bearer <token>' "
                                 "(the CLI reads it from your Shoal config or $SHOAL_TOKEN)")
        token = authorization[7:].strip()
        if token.startswith("node_"):
            raise AuthError(403, "a node credential may only be used on that node's agent endpoints")
        p, expires = self._lookup(hash_token(token))
        if expires is not None and self.clock() >= expires:
            raise AuthError(401, f"token expired at {format_timestamp(expires)}"
                                 "; ask an administrator for a new one (shoal token create)")
        if p.is_admin and acting_user:
            return Principal(user=unquote(acting_user), role="admin")
        return p

    def _lookup(self, token_hash: str) -> tuple[Principal, float | None]:
        hit = self._cache.get(token_hash)
        if hit is not None and time.monotonic() - hit[2] < CACHE_S:
            return hit[0], hit[1]
        forgotten = self._forgotten
        with self.sessions() as s:
            row = s.scalar(select(TokenRow).where(TokenRow.token_hash == token_hash))
        if row is None:
            self._cache.pop(token_hash, None)
            raise AuthError(401, "invalid token (unknown, or revoked)")
        p = Principal(user=row.user, role=row.role, groups=tuple(row.groups or ()))
        if forgotten == self._forgotten:
            self._cache[token_hash] = (p, row.expires, time.monotonic())
        return p, row.expires

    def verify_agent(self, authorization: str | None, node: str) -> Principal:
        """Agent endpoints: the credential must be the one issued to the node named in the path."""
        token = (authorization or "")[7:].strip()
        gen = self.node_generation(node)
        if (expected := self._credentials.get((node, gen))) is None:  # an HMAC per heartbeat otherwise
            expected = self._credentials[(node, gen)] = agent_credential(self.secret, node, gen)
        if not hmac.compare_digest(token, expected):
            if any(hmac.compare_digest(token, agent_credential(self.secret, node, g)) for g in range(gen)):
                raise AuthError(403, f"{REVOKED}: node {node}'s credential was revoked by an administrator "
                                     "(shoal token revoke-node); start its agent again with a join token to rejoin")
            raise AuthError(403, f"this credential does not belong to node {node}")
        return Principal(user="agent", role="agent", node=node)

    def _job(self, token: str) -> Principal | None:
        try:
            head, _, mac = token[4:].rpartition(".")
            job_s, _, run_s = head.partition(".")
            job_id, run = int(job_s), int(run_s)
        except ValueError:
            return None
        if not token.startswith("job_") or not hmac.compare_digest(token, job_credential(self.secret, job_id, run)):
            return None
        return Principal(user="", role="job", job_id=job_id)
