"""The change feed between servers sharing a PostgreSQL store (LISTEN/NOTIFY).

Each server's long-poll hub and control loops are woken in memory by what that server
commits. With several servers, an agent may long-poll a follower while the leader plans
its work, and a job submitted to a follower must wake the leader's scheduler: so every
server publishes its wake-ups (nodes whose work changed, signals, "scheduler: look
again") on one channel and every other server applies them to its own hub. The feed only
wakes; the truth is in the tables, so a notification lost while a connection was down is
made good by waking everything once the listener is back (``{"resync": true}``).
It also carries the metric samples agents and the gateway report to a follower
(``{"metrics": ...}``: the leader's HPA reads them), revoked tokens (``{"revoked": [hash]}``) and node credentials
(``{"revoked_node": name}``), which every server drops from its caches of looked-up tokens and
node credential generations; after a resync each drops them all. And it carries, in each
commit's own transaction, the keys the commit wrote to the tables that servers keep views of
(``{"keys": {table: [key, ...] or "*"}}``, ``shoal.store.changes``): those notifications are
the truth's own order, so a server that applies them keeps what it holds in memory current
with every server's commits; after a resync it reads everything again.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from shoal.store.changes import ALL, Changed, Recorder
from shoal.store.lease import connect

log = logging.getLogger("shoal.store.feed")

CHANNEL = "shoal_changes"
MAX_PAYLOAD = 7000  # PostgreSQL's limit is 8000 bytes


class ChangeFeed:
    def __init__(self, engine: Engine, deliver: Callable[[dict], None]) -> None:
        self.engine = engine
        self.deliver = deliver
        self.origin = secrets.token_hex(4)  # our own notifications come back: skip them
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self.connected = threading.Event()
        self._recorder: Recorder | None = None

    def carry(self, recorder: Recorder) -> None:
        """Carry the keys of every commit of ``recorder``'s sessions to the other servers, and
        hand it the keys they send (and, after a listener's reconnection, every key)."""
        recorder.publish = self.publish_keys
        self._recorder = recorder

    def publish(self, event: dict) -> None:
        """Queue an event for the other servers (any thread; never blocks on the database)."""
        self._queue.put(event)

    def publish_with(self, session: Session, event: dict) -> None:
        """Send an event as part of the session's transaction: PostgreSQL delivers it when the
        transaction commits (never if it rolls back), so the others hear it before our caller
        can answer anyone. For what must not lag its commit, such as a revoked token."""
        for payload in self._payloads([event]):
            session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": payload})

    def publish_keys(self, session: Session, changed: Changed) -> None:
        """Send the keys the session's transaction wrote, as part of it (``Recorder.publish``):
        delivered at its commit, in commit order, never for a rollback; in as many
        notifications as they need."""
        conn = session.connection()
        for payload in self._payloads(key_events(changed)):
            conn.execute(_NOTIFY, {"channel": CHANNEL, "payload": payload})

    def start(self) -> None:
        threading.Thread(target=self._listen, name="feed-listen", daemon=True).start()
        threading.Thread(target=self._send, name="feed-send", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    # -------------------------------------------------------------- sending

    def _send(self) -> None:
        conn = None
        while not self._stop.is_set():
            try:
                events = [self._queue.get(timeout=0.5)]
            except queue.Empty:
                continue
            while True:  # everything queued meanwhile goes in the same notifications
                try:
                    events.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for attempt in range(2):
                try:
                    if conn is None or conn.closed:
                        conn = connect(self.engine)
                    for payload in self._payloads(events):
                        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
                    break
                except Exception as e:
                    log.warning("change feed: cannot notify the other servers (%s)", e)
                    conn = None
                    if attempt == 0:
                        self._stop.wait(0.2)

    def _payloads(self, events: list[dict]) -> list[str]:
        nodes: set[str] = set()
        rest: list[dict] = []
        for ev in events:
            if "bump" in ev:
                nodes.update(ev["bump"])
            elif ev not in rest:
                rest.append(ev)
        if nodes:
            rest.insert(0, {"bump": sorted(nodes)})
        out: list[str] = []
        batch: list[dict] = []
        for ev in rest:
            if "bump" in ev and len(json.dumps(ev)) > MAX_PAYLOAD:
                # Each half alone: given together, they were merged back into the whole again.
                for part in _halves(ev["bump"]):
                    out.extend(self._payloads([{"bump": part}]))
                continue
            if batch and len(json.dumps({"o": self.origin, "e": batch + [ev]})) > MAX_PAYLOAD:
                out.append(json.dumps({"o": self.origin, "e": batch}))
                batch = []
            batch.append(ev)
        if batch:
            out.append(json.dumps({"o": self.origin, "e": batch}))
        return out

    # -------------------------------------------------------------- listening

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                conn = connect(self.engine)
            except Exception as e:
                log.warning("change feed: cannot listen (%s); retrying", e)
                self._stop.wait(1.0)
                continue
            try:
                conn.execute(f"LISTEN {CHANNEL}")
                # What was sent while we were away (or before the first LISTEN, the views kept
                # by then included) is lost: wake everything, and read everything kept again.
                if self._recorder is not None:
                    self._recorder.resync()
                self.connected.set()  # listening, and what is kept marked for reading again
                self.deliver({"resync": True})
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=1.0):
                        self._heard(note.payload)
            except Exception as e:
                self.connected.clear()
                if not self._stop.is_set():
                    log.warning("change feed: listener connection lost (%s); reconnecting", e)
                    self._stop.wait(0.5)
            finally:
                try:
                    conn.close()
                except Exception:
                    pass

    def _heard(self, payload: str) -> None:
        try:
            doc = json.loads(payload)
        except ValueError:
            return
        if doc.get("o") == self.origin:
            return
        for ev in doc.get("e", ()):
            try:
                if "keys" in ev:
                    if self._recorder is not None:
                        self._recorder.heard(heard_keys(ev["keys"]))
                    continue
                self.deliver(ev)
            except Exception:
                log.exception("change feed: applying %r failed", ev)


_NOTIFY = text("SELECT pg_notify(:channel, :payload)")

KEYS_BYTES = 6000
"""At most this many bytes of keys in one event, so that each fits a notification
(MAX_PAYLOAD); a commit that wrote more (a storm's group commit) sends several."""


def key_events(changed: Changed) -> list[dict]:
    """A commit's keys by table as feed events: "*" for a table whose any row may have changed."""
    events: list[dict] = []
    for name, keys in changed.items():
        if ALL in keys:
            events.append({"keys": {name: "*"}})
            continue
        chunk: list = []
        size = 0
        for key in sorted(keys):
            length = len(json.dumps(key)) + 1
            if chunk and size + length > KEYS_BYTES:
                events.append({"keys": {name: chunk}})
                chunk, size = [], 0
            chunk.append(key)
            size += length
        if chunk:
            events.append({"keys": {name: chunk}})
    return events


def heard_keys(keys: dict) -> Changed:
    """A "keys" event's table -> keys, "*" as ALL."""
    return {name: {ALL} if got == "*" else set(got) for name, got in keys.items()}


def _halves(items: list[str]) -> list[list[str]]:
    mid = len(items) // 2
    return [items[:mid], items[mid:]]
