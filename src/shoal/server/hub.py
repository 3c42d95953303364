"""Long-poll hub: agents wait here for their node's desired state to change.

Each node has a generation counter that bumps whenever its work may have changed; an
agent passes the (epoch, generation) it last saw and returns at once if it differs. The
epoch changes with every server start, so an agent never waits on a stale counter.
Signals (scancel --signal, --signal=SIG@secs) are edge events kept in a short queue.

The console's live pages wait on one more counter, ``changes``: every bump and every
``touch`` (a submission, a cancel: anything that wakes the scheduler) advances it.

Servers sharing a store tell each other their bumps and signals through ``relay`` (the
change feed); ``heard`` applies another server's, so an agent long-polling a follower wakes
when the leader plans its work.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
from collections import defaultdict, deque
from collections.abc import Callable


class WorkHub:
    def __init__(self) -> None:
        self.epoch = secrets.token_hex(4)
        self._gens: dict[str, int] = defaultdict(int)
        self._waiters: dict[str, list[asyncio.Future]] = defaultdict(list)
        self._signals: dict[str, deque] = defaultdict(lambda: deque(maxlen=256))
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.relay: Callable[[dict], None] | None = None
        self.changes = 0  # advanced by every bump and touch (the console's live pages)
        self._watchers: list[asyncio.Future] = []

    def generation(self, node: str) -> int:
        return self._gens[node]

    def bump(self, nodes) -> None:
        """Called from any thread after a commit that changes these nodes' work."""
        nodes = list(nodes)
        self._bump(nodes)
        if self.relay is not None and nodes:
            self.relay({"bump": nodes})

    def _bump(self, nodes: list[str]) -> None:
        with self._lock:
            for n in nodes:
                self._gens[n] += 1
            self.changes += 1
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._wake, nodes)

    def touch(self) -> None:
        """Something a page shows changed without changing any node's work (a pending job)."""
        with self._lock:
            self.changes += 1
        if self.loop is not None and self._watchers:  # no page open: no wake-up to pay for
            self.loop.call_soon_threadsafe(self._wake, ())

    async def changed(self, seen: int, timeout: float) -> int:
        """Wait until ``changes`` passes ``seen`` (or the timeout); the current count."""
        if self.changes == seen:
            fut = asyncio.get_running_loop().create_future()
            self._watchers.append(fut)
            try:
                await asyncio.wait_for(fut, timeout)
            except asyncio.TimeoutError:
                pass
            finally:
                if fut in self._watchers:
                    self._watchers.remove(fut)
        return self.changes

    def signal(self, node: str, key: str, signum: int, target: str) -> None:
        """target: 'steps' (scancel -s), 'batch' (scancel -b: the batch shell and its children),
        'batch_shell' (--signal=B:..., the shell alone) or 'full' (scancel -f: everything)."""
        entry = self._signal(node, {"key": key, "signal": signum, "target": target})
        if self.relay is not None:
            self.relay({"signal": node, "entry": entry})

    def _signal(self, node: str, entry: dict) -> dict:
        with self._lock:
            seq = next(self._seq)
            # ``id`` names the signal across servers (an agent that changes server skips it).
            entry = {**entry, "seq": seq, "id": entry.get("id") or f"{self.epoch}.{seq}"}
            self._signals[node].append(entry)
        self._bump([node])
        return entry

    def heard(self, event: dict) -> None:
        """Apply another server's bump or signal here, without relaying it again."""
        if event.get("resync"):
            with self._lock:
                nodes = list(set(self._gens) | set(self._waiters))
            self._bump(nodes)
        elif "bump" in event:
            self._bump(list(event["bump"]))
        elif "signal" in event:
            entry = event["entry"]
            self._signal(event["signal"], {k: entry[k] for k in ("key", "signal", "target", "id")})

    def signals(self, node: str) -> list[dict]:
        with self._lock:
            return list(self._signals[node])

    def _wake(self, nodes) -> None:
        watchers, self._watchers = self._watchers, []
        for fut in watchers:
            if not fut.done():
                fut.set_result(None)
        for n in nodes:
            for fut in self._waiters.pop(n, ()):
                if not fut.done():
                    fut.set_result(None)

    async def wait(self, node: str, epoch: str | None, gen: int | None, timeout: float) -> None:
        if epoch != self.epoch or gen != self._gens[node]:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters[node].append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if fut in self._waiters.get(node, ()):
                self._waiters[node].remove(fut)
